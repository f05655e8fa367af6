//! `soulbase-net policy explain`: the effective policy of one request, field by field with the
//! layer each value comes from; the addresses its host resolves to and the guard's verdict on
//! each; and whether its deadline closes.

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use http::Uri;
use soulbase_net_core::TimeoutCfg;
use soulbase_net_policy::{
    AddressGuard, Explanation, NetPolicy, PolicyDocument, PolicyLayer, ProxyResolve,
    SnapshotResolver,
};
use soulbase_net_runtime::DnsResolver;

/// What `explain` was asked.
#[derive(Debug, Default)]
pub(super) struct Options {
    pub(super) policy: String,
    pub(super) tenant: Option<String>,
    pub(super) key: Option<String>,
    pub(super) timeouts: TimeoutCfg,
    pub(super) dns: Option<SocketAddr>,
    pub(super) changed_only: bool,
    /// The request's method and whether the caller marked it idempotent (`--method`,
    /// `--idempotent`): the notes then say whether retries can apply to it.
    pub(super) method: Option<http::Method>,
    pub(super) idempotent: bool,
    pub(super) url: String,
}

impl Options {
    pub(super) fn parse(args: &[String]) -> Result<Self, String> {
        let mut o = Options::default();
        let mut url = None;
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let mut value = || {
                it.next()
                    .cloned()
                    .ok_or_else(|| format!("{arg} needs a value"))
            };
            match arg.as_str() {
                "--policy" => o.policy = value()?,
                "--tenant" => o.tenant = Some(value()?),
                "--key" => o.key = Some(value()?),
                "--timeout" => o.timeouts = timeouts(&value()?)?,
                "--dns" => o.dns = Some(dns_addr(&value()?)?),
                "--changed" => o.changed_only = true,
                "--idempotent" => o.idempotent = true,
                "--method" => {
                    let m = value()?;
                    o.method = Some(
                        http::Method::from_bytes(m.as_bytes())
                            .map_err(|_| format!("--method: `{m}` is not an HTTP method"))?,
                    );
                }
                flag if flag.starts_with("--") => return Err(format!("unknown option `{flag}`")),
                _ if url.is_none() => url = Some(arg.clone()),
                extra => return Err(format!("one URL only, `{extra}` is a second")),
            }
        }
        if o.policy.is_empty() {
            return Err("policy explain needs --policy FILE".to_owned());
        }
        o.url = url.ok_or("policy explain needs a URL")?;
        Ok(o)
    }
}

/// `connect=1s,total=5s` → the request's own timeouts.
fn timeouts(spec: &str) -> Result<TimeoutCfg, String> {
    let mut t = TimeoutCfg::default();
    for part in spec.split(',').filter(|p| !p.trim().is_empty()) {
        let (name, value) = part
            .split_once('=')
            .ok_or_else(|| format!("--timeout: `{part}` is not NAME=DURATION"))?;
        let d = parse_duration(value.trim())
            .ok_or_else(|| format!("--timeout: `{value}` is not a duration (250ms, 2s, 1m)"))?;
        match name.trim() {
            "connect" => t.connect = Some(d),
            "ttfb" => t.ttfb = Some(d),
            "read" => t.read = Some(d),
            "write" => t.write = Some(d),
            "total" => t.total = Some(d),
            other => {
                return Err(format!(
                    "--timeout: `{other}` is not one of connect, ttfb, read, write, total"
                ))
            }
        }
    }
    Ok(t)
}

/// `250ms`, `2s`, `1m`: what a request's timeout is usually written as.
fn parse_duration(s: &str) -> Option<Duration> {
    let split = s.find(|c: char| !c.is_ascii_digit())?;
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().ok()?;
    match unit {
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" => Some(Duration::from_secs(n.checked_mul(60)?)),
        _ => None,
    }
}

/// `127.0.0.1:5353`, or an address alone for port 53.
fn dns_addr(s: &str) -> Result<SocketAddr, String> {
    s.parse::<SocketAddr>()
        .or_else(|_| s.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 53)))
        .map_err(|_| format!("--dns: `{s}` is not an address (127.0.0.1:5353)"))
}

/// The whole report.
pub(super) fn run(o: &Options) -> Result<String, String> {
    let resolver = PolicyDocument::from_path(&o.policy)
        .and_then(SnapshotResolver::new)
        .map_err(|e| format!("{}:\n{e}", o.policy))?;
    let uri: Uri = o
        .url
        .parse()
        .map_err(|e| format!("`{}` is not a URL: {e}", o.url))?;
    let host = uri
        .host()
        .ok_or_else(|| format!("`{}` has no host", o.url))?;
    let snapshot = resolver.snapshot();
    let mut why = snapshot
        .explain(o.tenant.as_deref(), host, o.key.as_deref())
        .map_err(|e| e.to_string())?
        .with_request_timeouts(&o.timeouts);
    if let Some(method) = &o.method {
        why = why.for_request(method, o.idempotent);
    }

    let mut out = String::new();
    let _ = writeln!(
        out,
        "policy    {} ({} combinations of layers checked)",
        o.policy,
        snapshot.combinations()
    );
    let _ = writeln!(
        out,
        "request   {}{}  tenant {}  key {}",
        o.method
            .as_ref()
            .map(|m| format!("{m} "))
            .unwrap_or_default(),
        o.url,
        o.tenant.as_deref().unwrap_or("-"),
        o.key.as_deref().unwrap_or("-")
    );
    layers(&mut out, &why);
    fields(&mut out, &why, o.changed_only);
    let policy = why.policy();
    addresses(&mut out, policy, host, o.dns)?;
    deadline(&mut out, policy, o.timeouts != TimeoutCfg::default());
    Ok(out)
}

fn layers(out: &mut String, why: &Explanation) {
    let _ = writeln!(out, "\nlayers, applied in this order");
    for layer in why.layers() {
        let _ = match layer {
            PolicyLayer::BuiltIn | PolicyLayer::Default => writeln!(out, "  {}", layer.kind()),
            _ => writeln!(out, "  {:<14} {layer}", layer.kind()),
        };
    }
}

fn fields(out: &mut String, why: &Explanation, changed_only: bool) {
    let shown: Vec<_> = why
        .fields()
        .iter()
        .filter(|f| !changed_only || f.layer != PolicyLayer::BuiltIn)
        .collect();
    let width = shown.iter().map(|f| f.path.len()).max().unwrap_or(0);
    let value_width = shown
        .iter()
        .map(|f| f.value.to_string().len().min(24))
        .max()
        .unwrap_or(0);
    let _ = writeln!(out, "\neffective policy ({} fields)", shown.len());
    for f in shown {
        let mut from = f.layer.to_string();
        if !f.overrides.is_empty() {
            let over: Vec<String> = f.overrides.iter().map(ToString::to_string).collect();
            let _ = write!(from, " (over {})", over.join(", "));
        }
        let _ = writeln!(
            out,
            "  {:<width$}  {:<value_width$}  {from}",
            f.path,
            f.value.to_string()
        );
        for note in &f.notes {
            let _ = writeln!(out, "  {:<width$}  note: {note}", "");
        }
    }
}

/// The addresses `host` resolves to on `dns` (or is, or is set to) and the guard on each.
fn addresses(
    out: &mut String,
    policy: &NetPolicy,
    host: &str,
    dns: Option<SocketAddr>,
) -> Result<(), String> {
    let _ = writeln!(out, "\naddresses");
    if let Some(proxy) = &policy.proxy {
        let how = match proxy.resolve {
            ProxyResolve::Proxy => "the proxy resolves names and the guard never sees their addresses (proxy.resolve = \"proxy\"); below is what the client would dial directly",
            _ => "the client resolves names and guards the answer, then has the proxy connect to the checked address (proxy.resolve = \"local\")",
        };
        let _ = writeln!(
            out,
            "  through a proxy unless proxy.no_proxy matches: {how}"
        );
    }
    let guard = AddressGuard::new(&policy.security).map_err(|e| e.to_string())?;
    if let Err(denied) = guard.check_host(host) {
        let _ = writeln!(out, "  refused before any lookup: {denied}");
        return Ok(());
    }
    let (addrs, source) = match lookup(policy, host, dns)? {
        Some(found) => found,
        None => {
            let _ = writeln!(
                out,
                "  not resolved: pass --dns ADDR to ask a name server (the system resolver is never used)"
            );
            return Ok(());
        }
    };
    let _ = writeln!(out, "  {source}");
    let width = addrs.iter().map(|a| a.to_string().len()).max().unwrap_or(0);
    for ip in &addrs {
        let verdict = match guard.check_addr(host, *ip) {
            Ok(()) => "allowed".to_owned(),
            Err(denied) => format!("denied ({}): {denied}", denied.rule.as_str()),
        };
        let _ = writeln!(out, "  {:<width$}  {verdict}", ip.to_string());
    }
    let _ = match guard.filter_addrs(host, &addrs) {
        Ok(kept) => {
            let kept: Vec<String> = kept.iter().map(ToString::to_string).collect();
            writeln!(out, "  verdict: the client may dial {}", kept.join(", "))
        }
        Err(denied) => writeln!(
            out,
            "  verdict: refused (Blocked, AUTH.FORBIDDEN): {denied}"
        ),
    };
    Ok(())
}

/// The addresses of `host` and where they came from, or `None` when only a name server could
/// say and none was given.
fn lookup(
    policy: &NetPolicy,
    host: &str,
    dns: Option<SocketAddr>,
) -> Result<Option<(Vec<IpAddr>, String)>, String> {
    let literal = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = literal.parse::<IpAddr>() {
        return Ok(Some((vec![ip], "an IP literal: no lookup".to_owned())));
    }
    let name = host.trim_end_matches('.').to_ascii_lowercase();
    if let Some(ips) = policy.dns.static_hosts.get(&name) {
        let source = format!("dns.static_hosts.\"{name}\": no lookup");
        return Ok(Some((ips.clone(), source)));
    }
    let Some(server) = dns else {
        return Ok(None);
    };
    // The policy's resolver settings, asking `server` alone: no persistence, no prefetch,
    // no shuffling (the order shown is the order tried).
    let mut cfg = policy.dns.clone();
    cfg.nameservers = vec![server];
    cfg.persist_file = None;
    cfg.prefetch.clear();
    cfg.shuffle = false;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let answer = rt.block_on(async {
        let resolver = DnsResolver::new(&cfg)?;
        resolver.resolve(host).await
    });
    match answer {
        Ok(res) => {
            let source = format!(
                "asked {server}: {} in {} ms (tried in this order)",
                res.addrs.len(),
                res.elapsed.as_millis()
            );
            Ok(Some((res.addrs.to_vec(), source)))
        }
        Err(e) => Err(format!(
            "{host} did not resolve on {server}: {e} ({})",
            e.code()
        )),
    }
}

/// Whether the call can keep its deadline: one attempt's phases against `attempt`, and the
/// closure `attempts × attempt + Σ backoff ≤ total − margin`.
fn deadline(out: &mut String, policy: &NetPolicy, request_timeouts: bool) {
    let (t, r) = (&policy.timeout, &policy.retry);
    let _ = writeln!(out, "\ndeadline");
    let phases = t.connect.saturating_add(t.ttfb);
    let bound = if phases > t.attempt {
        "the attempt limit ends a slow connect + first byte first"
    } else {
        "within the attempt limit"
    };
    let _ = writeln!(
        out,
        "  one attempt  connect {} + ttfb {} = {} vs attempt {}: {bound}",
        human(t.connect),
        human(t.ttfb),
        human(phases),
        human(t.attempt)
    );
    let worst = t.worst_case_latency(r);
    let budget = t.budget();
    let verdict = match (worst <= budget, request_timeouts) {
        (true, _) => "closes".to_owned(),
        (false, true) => "does not close: the client clamps the call to total (no attempt starts that cannot finish in time) and reports DeadlineClamped".to_owned(),
        (false, false) => "does not close (a document like this is refused when loaded)".to_owned(),
    };
    let _ = writeln!(
        out,
        "  worst case   {} attempts × {} + {} backoff = {} vs total {} − margin {} = {}: {verdict}",
        r.effective_attempts(),
        human(t.attempt),
        human(r.worst_case_backoff()),
        human(worst),
        human(t.total),
        human(t.margin),
        human(budget)
    );
    let _ = writeln!(
        out,
        "  (retries are for idempotent requests: GET, HEAD, OPTIONS, or marked idempotent)"
    );
}

/// `300ms`, `9s`, `27.3s`.
fn human(d: Duration) -> String {
    if d == Duration::MAX {
        return "forever".to_owned();
    }
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let s = format!("{}.{:03}", ms / 1000, ms % 1000);
    format!("{}s", s.trim_end_matches('0').trim_end_matches('.'))
}
