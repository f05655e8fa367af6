//! The DNS probe: a name looked up for each record type a task asks for (A, AAAA, MX, NS,
//! TXT), through hickory-resolver with EDNS on and its TCP fallback when an answer is
//! truncated; hickory's cache is off, so each probe asks the name servers. The resolver is
//! set up by the runtime ([`hickory_resolver()`]), as its own `DnsResolver`'s is.
//!
//! Why hickory directly and not the runtime's `DnsResolver`: that one answers addresses only
//! (A and AAAA, for dialling) and caches them, while a probe must see every record type and a
//! fresh answer.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use hickory_resolver::proto::rr::{RData, RecordType};
use hickory_resolver::TokioResolver;
use serde_json::{json, Value};
use soulbase_net_core::NetError;
use soulbase_net_policy::DnsPolicy;
use soulbase_net_runtime::{hickory_resolver, HickoryOptions};
use tokio::time::Instant;

use super::{millis, ProbeResult};
use crate::protocol::{DnsRecordType, Observation};

/// Hickory's own timeout of one exchange: past any task's, which bounds the lookup.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(60);

/// The DNS probe's resolver.
#[derive(Clone)]
pub(super) struct DnsProbe {
    resolver: TokioResolver,
}

impl fmt::Debug for DnsProbe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DnsProbe").finish_non_exhaustive()
    }
}

impl DnsProbe {
    /// A resolver asking `servers` (UDP, then TCP on the same address), or the system's
    /// configured ones when `servers` is empty: the runtime's set-up ([`hickory_resolver()`]),
    /// with EDNS on and each exchange bounded by the task's timeout rather than a policy's.
    pub(super) fn new(servers: &[SocketAddr]) -> Result<Self, NetError> {
        let mut policy = DnsPolicy::default();
        policy.nameservers = servers.to_vec();
        // One exchange per lookup, bounded by the task's own timeout (hickory's is set past
        // any task's): a probe reports what the network did, a lost answer included, rather
        // than hiding it behind a resend.
        policy.timeout = EXCHANGE_TIMEOUT;
        let resolver = hickory_resolver(&policy, HickoryOptions::default().edns0(true))?;
        Ok(Self { resolver })
    }

    /// Looks `name` up for each of `types`, all within `timeout`. Observations per type
    /// (`a`, `aaaa`, `mx`, `ns`, `txt`): the records (addresses, `{preference, exchange}`,
    /// names, texts; an empty list when the name has none of that type), `<type>_ttl_s`
    /// (s, the smallest TTL) and `<type>_ms` (ms); `rcode` `NXDOMAIN` when the name does not
    /// exist, `<type>_error` when a lookup failed otherwise. The probe is an error when the
    /// name does not exist or any lookup failed.
    pub(super) async fn probe(
        &self,
        name: &str,
        types: &[DnsRecordType],
        timeout: Duration,
    ) -> ProbeResult {
        let deadline = Instant::now() + timeout;
        let mut observations = Vec::new();
        let mut failures = Vec::new();
        for rtype in types {
            let key = rtype.as_str().to_ascii_lowercase();
            let start = Instant::now();
            let answer =
                tokio::time::timeout_at(deadline, self.resolver.lookup(name, record_type(*rtype)))
                    .await;
            let took = start.elapsed();
            match answer {
                Ok(Ok(lookup)) => {
                    let records: Vec<Value> = lookup
                        .answers()
                        .iter()
                        .filter_map(|r| record_value(&r.data))
                        .collect();
                    let ttl = lookup.answers().iter().map(|r| r.ttl).min();
                    observations.push(Observation::new(key.clone(), records));
                    if let Some(ttl) = ttl {
                        observations.push(Observation::with_unit(format!("{key}_ttl_s"), ttl, "s"));
                    }
                    observations.push(Observation::with_unit(
                        format!("{key}_ms"),
                        millis(took),
                        "ms",
                    ));
                }
                Ok(Err(e)) if e.is_no_records_found() && !e.is_nx_domain() => {
                    observations.push(Observation::new(key.clone(), Vec::<Value>::new()));
                    observations.push(Observation::with_unit(
                        format!("{key}_ms"),
                        millis(took),
                        "ms",
                    ));
                }
                Ok(Err(e)) if e.is_nx_domain() => {
                    observations.push(Observation::new("rcode", "NXDOMAIN"));
                    observations.push(Observation::with_unit(
                        format!("{key}_ms"),
                        millis(took),
                        "ms",
                    ));
                    return ProbeResult::error(observations, format!("no such name {name}"));
                }
                Ok(Err(e)) => {
                    observations.push(Observation::new(format!("{key}_error"), e.to_string()));
                    failures.push(format!("{}: {e}", rtype.as_str()));
                }
                Err(_) => {
                    observations.push(Observation::new(format!("{key}_error"), "timeout"));
                    failures.push(format!("{}: no answer within {timeout:?}", rtype.as_str()));
                    break;
                }
            }
        }
        if failures.is_empty() {
            ProbeResult::ok(observations)
        } else {
            ProbeResult::error(observations, failures.join("; "))
        }
    }
}

fn record_type(t: DnsRecordType) -> RecordType {
    match t {
        DnsRecordType::A => RecordType::A,
        DnsRecordType::Aaaa => RecordType::AAAA,
        DnsRecordType::Mx => RecordType::MX,
        DnsRecordType::Ns => RecordType::NS,
        DnsRecordType::Txt => RecordType::TXT,
    }
}

/// A record's data as an observation's value; `None` for records of other types (a CNAME
/// on the way).
fn record_value(data: &RData) -> Option<Value> {
    Some(match data {
        RData::A(a) => json!(a.0.to_string()),
        RData::AAAA(a) => json!(a.0.to_string()),
        RData::MX(mx) => json!({"preference": mx.preference, "exchange": mx.exchange.to_string()}),
        RData::NS(ns) => json!(ns.0.to_string()),
        RData::TXT(txt) => json!(txt
            .txt_data
            .iter()
            .map(|part| String::from_utf8_lossy(part).into_owned())
            .collect::<String>()),
        _ => return None,
    })
}
