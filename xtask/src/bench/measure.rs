//! One timed run of one client, and the figures over rounds: medians, and ratios to the
//! limit paired by round.

use std::{sync::Arc, time::Duration};

use tokio::time::Instant;

use super::{
    clients::{BenchClient, Kind},
    server::{Listener, ServerProcess, Stats},
};

/// One run of one client.
#[derive(Clone, Debug, Default)]
pub(crate) struct Run {
    pub(crate) rps: f64,
    pub(crate) p50_ms: f64,
    pub(crate) p95_ms: f64,
    pub(crate) p99_ms: f64,
    /// Connections the server accepted during the run.
    pub(crate) conns: u64,
    pub(crate) ok: u64,
    pub(crate) errors: u64,
    pub(crate) first_error: Option<String>,
    /// CPU time (user + system) of this process — the clients', the server runs in its
    /// own — per successful request, in µs.
    pub(crate) cpu_us: f64,
}

/// CPU time (user + system) this process has used so far, every thread included (ended
/// ones too): `getrusage(RUSAGE_SELF)`.
pub(crate) fn process_cpu() -> Duration {
    use nix::sys::resource::{getrusage, UsageWho};
    getrusage(UsageWho::RUSAGE_SELF).map_or(Duration::ZERO, |u| {
        let us = |t: nix::sys::time::TimeVal| {
            let micros = t.tv_sec() * 1_000_000 + t.tv_usec();
            Duration::from_micros(u64::try_from(micros).unwrap_or(0))
        };
        us(u.user_time()) + us(u.system_time())
    })
}

/// How long the bench waits for a dropped client's connections to close.
const SETTLE: Duration = Duration::from_secs(10);

/// Runs `client` with `callers` concurrent callers for `secs` seconds, caller `c` sending
/// its `k`-th request to target `c + k × callers`; the connections are those `server`
/// accepted on `listener` since `before` (taken before the client was built: hyper's h2
/// client connects as it is built).
pub(crate) async fn load(
    client: BenchClient,
    callers: usize,
    secs: f64,
    (server, listener, before): (&mut ServerProcess, Listener, Stats),
) -> Result<Run, String> {
    let client = Arc::new(client);
    let cpu_before = process_cpu();
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(secs);
    let mut tasks = Vec::with_capacity(callers);
    for caller in 0..callers {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::with_capacity(1024);
            let (mut errors, mut first_error) = (0u64, None);
            let mut target = caller;
            while Instant::now() < deadline {
                let t = Instant::now();
                match client.get(target).await {
                    Ok(_) => latencies.push(t.elapsed()),
                    Err(e) => {
                        errors += 1;
                        first_error.get_or_insert(e);
                    }
                }
                target += callers;
            }
            (latencies, errors, first_error)
        }));
    }
    let mut latencies = Vec::new();
    let (mut errors, mut first_error) = (0u64, None);
    for task in tasks {
        let (l, e, f) = task
            .await
            .map_err(|e| format!("bench: a caller task failed: {e}"))?;
        latencies.extend(l);
        errors += e;
        if first_error.is_none() {
            first_error = f;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = process_cpu().saturating_sub(cpu_before);
    drop(client);
    let after = server.stats().await?;
    // The next client starts once this one's connections are gone (see `settle`).
    let open = server.settle(SETTLE).await?;
    if open > 0 {
        eprintln!(
            "bench: {open} connections still open {} s after the client was dropped",
            SETTLE.as_secs()
        );
    }
    latencies.sort_unstable();
    let ok = latencies.len() as u64;
    Ok(Run {
        rps: ok as f64 / elapsed,
        p50_ms: percentile_ms(&latencies, 50.0),
        p95_ms: percentile_ms(&latencies, 95.0),
        p99_ms: percentile_ms(&latencies, 99.0),
        conns: after.conns(listener) - before.conns(listener),
        ok,
        errors,
        first_error,
        cpu_us: if ok == 0 {
            0.0
        } else {
            cpu.as_secs_f64() * 1e6 / ok as f64
        },
    })
}

/// The `p`-th percentile of sorted latencies, in milliseconds (nearest rank); 0 when empty.
pub(crate) fn percentile_ms(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    let i = rank.clamp(1, sorted.len()) - 1;
    sorted[i].as_secs_f64() * 1e3
}

/// The `q`-quantile of `values` (0 ≤ q ≤ 1), linear between the closest ranks; 0 when empty.
pub(crate) fn quantile(values: &[f64], q: f64) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let pos = q.clamp(0.0, 1.0) * (v.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
}

/// A figure over rounds: the median and the interquartile range.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Spread {
    pub(crate) median: f64,
    pub(crate) q1: f64,
    pub(crate) q3: f64,
}

impl Spread {
    pub(crate) fn of(values: &[f64]) -> Self {
        Self {
            median: quantile(values, 0.5),
            q1: quantile(values, 0.25),
            q3: quantile(values, 0.75),
        }
    }
}

/// Ratios of one client to the limit, paired by round: per round `client / limit` of the
/// same round, then the spread of those.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Ratios {
    pub(crate) rps: Spread,
    pub(crate) p99: Spread,
    pub(crate) cpu: Spread,
}

impl Ratios {
    /// `runs[r]` against `limit[r]` for each round both have.
    pub(crate) fn paired(runs: &[Run], limit: &[Run]) -> Self {
        let per_round = |f: fn(&Run) -> f64| -> Vec<f64> {
            runs.iter()
                .zip(limit)
                .filter(|(_, l)| f(l) > 0.0)
                .map(|(r, l)| f(r) / f(l))
                .collect()
        };
        Self {
            rps: Spread::of(&per_round(|r| r.rps)),
            p99: Spread::of(&per_round(|r| r.p99_ms)),
            cpu: Spread::of(&per_round(|r| r.cpu_us)),
        }
    }
}

/// One client in one scenario: medians over the rounds, and the ratios to the limit.
#[derive(Clone, Debug)]
pub(crate) struct Summary {
    pub(crate) kind: Kind,
    pub(crate) rps: Spread,
    pub(crate) p50_ms: f64,
    pub(crate) p95_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) cpu_us: Spread,
    pub(crate) conns: f64,
    pub(crate) ok: u64,
    pub(crate) errors: u64,
    pub(crate) first_error: Option<String>,
    /// Against the limit (`None` for the limit itself, or when it did not run).
    pub(crate) vs_limit: Option<Ratios>,
}

impl Summary {
    pub(crate) fn of(kind: Kind, runs: &[Run], limit: Option<&[Run]>) -> Self {
        let all = |f: fn(&Run) -> f64| -> Vec<f64> { runs.iter().map(f).collect() };
        let median = |f: fn(&Run) -> f64| quantile(&all(f), 0.5);
        Self {
            kind,
            rps: Spread::of(&all(|r| r.rps)),
            p50_ms: median(|r| r.p50_ms),
            p95_ms: median(|r| r.p95_ms),
            p99_ms: median(|r| r.p99_ms),
            cpu_us: Spread::of(&all(|r| r.cpu_us)),
            conns: median(|r| r.conns as f64),
            ok: runs.iter().map(|r| r.ok).sum(),
            errors: runs.iter().map(|r| r.errors).sum(),
            first_error: runs.iter().find_map(|r| r.first_error.clone()),
            vs_limit: limit
                .filter(|_| !kind.is_limit())
                .map(|l| Ratios::paired(runs, l)),
        }
    }
}

/// Two clients of one scenario compared beside the limit, paired by round: `client` over
/// `against`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Beside {
    pub(crate) client: Kind,
    pub(crate) against: Kind,
    pub(crate) ratios: Ratios,
}

/// The comparisons beside the limit among `clients` (whose runs are `runs`, in the same
/// order): soulbase-net over HTTP/3 against itself over HTTP/2 with TLS, when both ran.
pub(crate) fn beside(clients: &[Kind], runs: &[Vec<Run>]) -> Vec<Beside> {
    let of = |kind| clients.iter().position(|k| *k == kind);
    let pairs = [(Kind::SoulbaseH3, Kind::SoulbaseH2)];
    pairs
        .into_iter()
        .filter_map(|(client, against)| {
            let (c, a) = (of(client)?, of(against)?);
            Some(Beside {
                client,
                against,
                ratios: Ratios::paired(runs.get(c)?, runs.get(a)?),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_quantiles() {
        let ms: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile_ms(&ms, 50.0), 50.0);
        assert_eq!(percentile_ms(&ms, 99.0), 99.0);
        assert_eq!(percentile_ms(&[], 99.0), 0.0);
        assert_eq!(quantile(&[3.0, 1.0, 2.0], 0.5), 2.0);
        assert_eq!(quantile(&[4.0, 1.0, 2.0, 3.0], 0.5), 2.5);
        assert_eq!(quantile(&[1.0, 2.0, 3.0, 4.0, 5.0], 0.25), 2.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }

    /// A round where the whole machine was slow slows both clients: the paired ratio stays,
    /// where a ratio of the two medians would not.
    #[test]
    fn ratios_pair_rounds() {
        let run = |rps: f64| Run {
            rps,
            p99_ms: 1.0,
            cpu_us: 10.0,
            ..Run::default()
        };
        let limit: Vec<Run> = [100.0, 50.0, 100.0].map(run).to_vec();
        let client: Vec<Run> = [90.0, 45.0, 90.0].map(run).to_vec();
        let r = Ratios::paired(&client, &limit);
        assert!((r.rps.median - 0.9).abs() < 1e-9, "{r:?}");
        assert!((r.rps.q3 - r.rps.q1).abs() < 1e-9, "{r:?}");
        assert_eq!(r.p99.median, 1.0);
        let s = Summary::of(Kind::SoulbaseFull, &client, Some(&limit));
        assert_eq!(s.rps.median, 90.0);
        assert!(Summary::of(Kind::Hyper, &limit, Some(&limit))
            .vs_limit
            .is_none());
    }

    #[test]
    fn http3_is_set_beside_http2_when_both_ran() {
        let run = |rps: f64, cpu_us: f64| Run {
            rps,
            p99_ms: 1.0,
            cpu_us,
            ..Run::default()
        };
        let clients = [Kind::H3Raw, Kind::SoulbaseH2, Kind::SoulbaseH3];
        let runs = vec![
            vec![run(100.0, 10.0)],
            vec![run(200.0, 8.0), run(100.0, 8.0)],
            vec![run(100.0, 16.0), run(50.0, 16.0)],
        ];
        let b = beside(&clients, &runs);
        assert_eq!(b.len(), 1, "{b:?}");
        assert_eq!(
            (b[0].client, b[0].against),
            (Kind::SoulbaseH3, Kind::SoulbaseH2)
        );
        assert!((b[0].ratios.rps.median - 0.5).abs() < 1e-9, "{b:?}");
        assert!((b[0].ratios.cpu.median - 2.0).abs() < 1e-9, "{b:?}");
        assert!(beside(&clients[..2], &runs[..2]).is_empty());
        let s = Summary::of(Kind::H3Raw, &runs[0], Some(&runs[0]));
        assert!(s.vs_limit.is_none());
    }

    #[test]
    fn cpu_time_grows_with_work() {
        let before = process_cpu();
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        assert!(process_cpu() > before, "{x}");
    }
}
