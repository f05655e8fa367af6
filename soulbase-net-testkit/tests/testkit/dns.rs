//! MockDns driven by hickory-resolver pointed at it (never at the system configuration).

use std::net::IpAddr;
use std::time::Duration;

use hickory_resolver::config::{
    ConnectionConfig, LookupIpStrategy, NameServerConfig, ResolveHosts, ResolverConfig,
};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::op::ResponseCode;
use hickory_resolver::proto::rr::{RData, RecordType};
use hickory_resolver::Resolver;
use soulbase_net_testkit::MockDns;
use tokio::time::Instant;

fn resolver(
    dns: &MockDns,
    strategy: LookupIpStrategy,
    timeout: Duration,
) -> Resolver<TokioRuntimeProvider> {
    let mut udp = ConnectionConfig::udp();
    udp.port = dns.addr().port();
    let mut tcp = ConnectionConfig::tcp();
    tcp.port = dns.addr().port();
    let ns = NameServerConfig::new(dns.addr().ip(), true, vec![udp, tcp]);
    let mut b = Resolver::builder_with_config(
        ResolverConfig::from_name_servers(vec![ns]),
        TokioRuntimeProvider::default(),
    );
    let o = b.options_mut();
    o.timeout = timeout;
    o.attempts = 1;
    o.cache_size = 0;
    o.use_hosts_file = ResolveHosts::Never;
    o.ip_strategy = strategy;
    b.build().unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

async fn ips(r: &Resolver<TokioRuntimeProvider>, name: &str) -> Vec<IpAddr> {
    r.lookup_ip(name).await.unwrap().iter().collect()
}

const T: Duration = Duration::from_secs(2);

#[tokio::test]
async fn answers_changes_and_logs() {
    let dns = MockDns::start().await.unwrap();
    dns.set_ips("api.example.test", &[ip("127.0.0.1")], 0);
    let r = resolver(&dns, LookupIpStrategy::Ipv4Only, T);
    assert_eq!(ips(&r, "api.example.test.").await, [ip("127.0.0.1")]);
    dns.set_ips("api.example.test", &[ip("127.0.0.2"), ip("127.0.0.3")], 0);
    let mut got = ips(&r, "api.example.test.").await;
    got.sort();
    assert_eq!(got, [ip("127.0.0.2"), ip("127.0.0.3")]);
    assert_eq!(dns.query_count("api.example.test"), 2);
    let q = &dns.queries()[0];
    assert_eq!(
        (q.name.as_str(), q.qtype.as_str(), q.tcp),
        ("api.example.test.", "A", false)
    );
    assert!(dns.queries()[1].at >= q.at);

    // TTLs are served as set
    dns.set_ips("ttl.example.test", &[ip("127.0.0.1")], 300);
    let l = r.lookup_ip("ttl.example.test.").await.unwrap();
    let ttl = l.valid_until() - Instant::now().into_std();
    assert!(
        ttl > Duration::from_secs(250) && ttl <= Duration::from_secs(300),
        "{ttl:?}"
    );
}

#[tokio::test]
async fn mixed_poisoned_and_cname_answers() {
    let dns = MockDns::start().await.unwrap();
    dns.set_ips(
        "mixed.example.test",
        &[ip("127.0.0.1"), ip("::1"), ip("10.0.0.7")],
        60,
    );
    dns.set_ips("public.example.test", &[ip("10.0.0.1")], 60); // poisoned: public name, private address
    dns.set_cname("www.example.test", "mixed.example.test", 60);
    let r = resolver(&dns, LookupIpStrategy::Ipv4AndIpv6, T);
    let mut got = ips(&r, "mixed.example.test.").await;
    got.sort();
    assert_eq!(got, [ip("10.0.0.7"), ip("127.0.0.1"), ip("::1")]);
    assert_eq!(ips(&r, "public.example.test.").await, [ip("10.0.0.1")]);
    let mut got = ips(&r, "www.example.test.").await;
    got.sort();
    assert_eq!(got, [ip("10.0.0.7"), ip("127.0.0.1"), ip("::1")]);
    let types: Vec<String> = dns.queries().iter().map(|q| q.qtype.clone()).collect();
    assert!(types.contains(&"A".to_owned()) && types.contains(&"AAAA".to_owned()));
}

#[tokio::test]
async fn rebinding_name_changes_after_the_first_answer() {
    let dns = MockDns::start().await.unwrap();
    dns.rebind("rebind.example.test", ip("93.184.216.34"), ip("127.0.0.1"));
    let r = resolver(&dns, LookupIpStrategy::Ipv4Only, T);
    let first = r.lookup_ip("rebind.example.test.").await.unwrap();
    assert_eq!(first.iter().collect::<Vec<_>>(), [ip("93.184.216.34")]);
    assert!(
        first.valid_until() <= Instant::now().into_std() + Duration::from_secs(1),
        "TTL 0"
    );
    assert_eq!(ips(&r, "rebind.example.test.").await, [ip("127.0.0.1")]);
    assert_eq!(ips(&r, "rebind.example.test.").await, [ip("127.0.0.1")]);
}

#[tokio::test]
async fn a_rebinding_names_first_lookup_sees_first_whatever_the_order_of_its_queries() {
    let dns = MockDns::start().await.unwrap();
    let name = "rebind2.example.test.";
    dns.rebind(name, ip("93.184.216.34"), ip("127.0.0.1"));
    let r = resolver(&dns, LookupIpStrategy::Ipv4Only, T);
    // The first lookup asks AAAA before A (a resolver asks both at once, in any order).
    let v6 = r.lookup(name, RecordType::AAAA).await;
    assert!(v6.map_or(true, |l| l.answers().is_empty()));
    let a = |l: hickory_resolver::lookup::Lookup| -> Vec<IpAddr> {
        l.answers()
            .iter()
            .filter_map(|r| match &r.data {
                RData::A(a) => Some(IpAddr::V4(a.0)),
                _ => None,
            })
            .collect()
    };
    let first = r.lookup(name, RecordType::A).await.unwrap();
    assert_eq!(
        a(first),
        [ip("93.184.216.34")],
        "the first lookup is public"
    );
    let second = r.lookup(name, RecordType::A).await.unwrap();
    assert_eq!(a(second), [ip("127.0.0.1")], "the next one rebinds");
}

#[tokio::test]
async fn nxdomain_and_servfail() {
    let dns = MockDns::start().await.unwrap();
    let r = resolver(&dns, LookupIpStrategy::Ipv4Only, T);
    let e = r.lookup_ip("unknown.example.test.").await.unwrap_err();
    assert!(e.is_nx_domain(), "{e:?}");
    dns.set_ips("gone.example.test", &[ip("127.0.0.1")], 0);
    dns.nxdomain("gone.example.test");
    assert!(r
        .lookup_ip("gone.example.test.")
        .await
        .unwrap_err()
        .is_nx_domain());
    dns.servfail("broken.example.test");
    let e = r.lookup_ip("broken.example.test.").await.unwrap_err();
    assert!(!e.is_nx_domain());
    assert!(
        format!("{e:?}").contains(&format!("{:?}", ResponseCode::ServFail)),
        "{e:?}"
    );
    assert!(dns.query_count("broken.example.test") >= 1);
}

#[tokio::test]
async fn truncated_udp_answer_falls_back_to_tcp() {
    let dns = MockDns::start().await.unwrap();
    dns.set_ips("big.example.test", &[ip("127.0.0.9")], 60);
    dns.truncate_udp("big.example.test", true);
    let r = resolver(&dns, LookupIpStrategy::Ipv4Only, T);
    assert_eq!(ips(&r, "big.example.test.").await, [ip("127.0.0.9")]);
    let transports: Vec<bool> = dns.queries().iter().map(|q| q.tcp).collect();
    assert_eq!(transports, [false, true], "UDP first, then TCP");
}

#[tokio::test]
async fn slow_answers() {
    let dns = MockDns::start().await.unwrap();
    dns.set_ips("slow.example.test", &[ip("127.0.0.1")], 0);
    dns.delay("slow.example.test", Duration::from_millis(300));
    let impatient = resolver(&dns, LookupIpStrategy::Ipv4Only, Duration::from_millis(100));
    let e = impatient.lookup_ip("slow.example.test.").await.unwrap_err();
    assert!(
        matches!(e, hickory_resolver::net::NetError::Timeout),
        "{e:?}"
    );
    let patient = resolver(&dns, LookupIpStrategy::Ipv4Only, T);
    let t0 = Instant::now();
    assert_eq!(ips(&patient, "slow.example.test.").await, [ip("127.0.0.1")]);
    assert!(t0.elapsed() >= Duration::from_millis(300));
}
