//! MX, NS and TXT answers, from a small responder of this test's own on loopback: the
//! testkit's MockDns serves A, AAAA and CNAME records only.

use std::net::SocketAddr;

use hickory_resolver::proto::op::Message;
use hickory_resolver::proto::rr::rdata::{MX, NS, TXT};
use hickory_resolver::proto::rr::{Name, RData, Record, RecordType};
use serde_json::json;
use soulbase_net_agent::protocol::{DnsRecordType, ReportStatus, TaskSpec};
use soulbase_net_agent::workers::Probes;
use soulbase_net_policy::NetPolicy;
use tokio::net::UdpSocket;

/// Answers every query for `mail.test.`: MX 10 `mx1.mail.test.`, NS `ns1.mail.test.`, TXT
/// `v=spf1 -all`; counts nothing else. Stops when the test's runtime does.
async fn responder() -> SocketAddr {
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = sock.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        loop {
            let Ok((n, peer)) = sock.recv_from(&mut buf).await else {
                return;
            };
            let Ok(request) = Message::from_vec(&buf[..n]) else {
                continue;
            };
            let mut response = request.clone().into_response();
            response.answers.clear();
            for q in &request.queries {
                let owner = q.name().clone();
                let rdata = match q.query_type() {
                    RecordType::MX => {
                        RData::MX(MX::new(10, Name::from_ascii("mx1.mail.test.").unwrap()))
                    }
                    RecordType::NS => RData::NS(NS(Name::from_ascii("ns1.mail.test.").unwrap())),
                    RecordType::TXT => RData::TXT(TXT::new(vec!["v=spf1 -all".to_owned()])),
                    _ => continue,
                };
                response.answers.push(Record::from_rdata(owner, 120, rdata));
            }
            if let Ok(bytes) = response.to_vec() {
                let _ = sock.send_to(&bytes, peer).await;
            }
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mx_ns_and_txt_records_are_observed() {
    let server = responder().await;
    let probes = Probes::new(&NetPolicy::default(), &[server]).unwrap();
    let spec = TaskSpec::Dns {
        name: "mail.test".into(),
        record_types: vec![DnsRecordType::Mx, DnsRecordType::Ns, DnsRecordType::Txt],
        timeout_ms: Some(3000),
    };
    let r = probes.run(&spec).await;
    assert_eq!(r.status, ReportStatus::Ok, "{r:?}");
    let value = |name: &str| {
        r.observations
            .iter()
            .find(|o| o.name == name)
            .unwrap_or_else(|| panic!("no {name} in {r:?}"))
            .value
            .clone()
    };
    assert_eq!(
        value("mx"),
        json!([{"preference": 10, "exchange": "mx1.mail.test."}])
    );
    assert_eq!(value("ns"), json!(["ns1.mail.test."]));
    assert_eq!(value("txt"), json!(["v=spf1 -all"]));
    assert_eq!(value("mx_ttl_s"), json!(120));
}
