//! What one `cargo xtask bench` measured: Markdown tables, JSON and a chart.

use std::fmt::Write as _;

use serde_json::{json, Value};

use super::{
    clients::Kind,
    failing::{Fleet, OffOn, FAILING_REQUESTS, FLEET_LEASE},
    measure::{Beside, Spread, Summary},
    scenario::Scenario,
};

/// One load scenario's figures, per client.
#[derive(Clone, Debug)]
pub(crate) struct ScenarioResult {
    pub(crate) scenario: Scenario,
    pub(crate) clients: Vec<Summary>,
    /// Clients compared with each other beside the limit (`bench --h3`: HTTP/3 against
    /// HTTP/2 with TLS).
    pub(crate) beside: Vec<Beside>,
}

/// Everything one run of the bench measured.
#[derive(Debug)]
pub(crate) struct Report {
    secs: f64,
    rounds: usize,
    profile: &'static str,
    pub(crate) scenarios: Vec<ScenarioResult>,
    pub(crate) breaker: Option<OffOn>,
    pub(crate) budget: Option<OffOn>,
    pub(crate) fleet: Option<Fleet>,
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// `0.912 (0.90–0.93)`: a ratio's median and interquartile range.
fn ratio_cell(s: Spread) -> String {
    format!("{:.3} ({:.2}–{:.2})", s.median, s.q1, s.q3)
}

fn spread_json(s: Spread, round: fn(f64) -> f64) -> Value {
    json!({ "median": round(s.median), "q1": round(s.q1), "q3": round(s.q3) })
}

impl Report {
    pub(crate) fn new(secs: f64, rounds: usize, profile: &'static str) -> Self {
        Self {
            secs,
            rounds,
            profile,
            scenarios: Vec::new(),
            breaker: None,
            budget: None,
            fleet: None,
        }
    }

    /// A Markdown table per scenario, then the failing upstream and the fleet.
    pub(crate) fn tables(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "\n{} rounds × {} s per client, {} build; medians over rounds, (q1–q3) the \
             interquartile range; \"× limit\" = client / limit paired by round",
            self.rounds, self.secs, self.profile
        );
        for r in &self.scenarios {
            let _ = writeln!(out, "\n### {}: {}\n", r.scenario.name, r.scenario.title);
            let _ = writeln!(
                out,
                "| client | req/s (q1–q3) | p50 ms | p95 ms | p99 ms | client CPU µs/req | \
                 conns | errors | req/s × limit | p99 × limit | CPU × limit |"
            );
            let _ = writeln!(
                out,
                "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
            );
            for s in &r.clients {
                // No ratios: the limit itself (1), or a scenario without the limit (`--h3`).
                let none = if s.kind.is_limit() { "1" } else { "—" };
                let cells = s.vs_limit.map_or_else(
                    || [none.to_owned(), none.to_owned(), none.to_owned()],
                    |v| [ratio_cell(v.rps), ratio_cell(v.p99), ratio_cell(v.cpu)],
                );
                let _ = writeln!(
                    out,
                    "| {} | {:.0} ({:.0}–{:.0}) | {:.2} | {:.2} | {:.2} | {:.1} | {:.0} | {} | {} | {} | {} |",
                    s.kind.label(),
                    s.rps.median,
                    s.rps.q1,
                    s.rps.q3,
                    s.p50_ms,
                    s.p95_ms,
                    s.p99_ms,
                    s.cpu_us.median,
                    s.conns,
                    s.errors,
                    cells[0],
                    cells[1],
                    cells[2],
                );
            }
            for b in &r.beside {
                let _ = writeln!(
                    out,
                    "\n{} against {}, paired by round: req/s {} ×, p99 {} ×, CPU per request {} ×",
                    b.client.label(),
                    b.against.label(),
                    ratio_cell(b.ratios.rps),
                    ratio_cell(b.ratios.p99),
                    ratio_cell(b.ratios.cpu),
                );
            }
            for s in r.clients.iter().filter(|s| s.errors > 0) {
                let _ = writeln!(
                    out,
                    "\n{}: {} errors of {}, first: {}",
                    s.kind.label(),
                    s.errors,
                    s.ok + s.errors,
                    s.first_error.as_deref().unwrap_or("?")
                );
            }
        }
        self.extras(&mut out);
        out
    }

    fn extras(&self, out: &mut String) {
        if let (Some(b), Some(r)) = (self.breaker, self.budget) {
            let _ = writeln!(
                out,
                "\nbreaker: {FAILING_REQUESTS} GETs to a failing upstream reached it {} times with \
                 the breaker off, {} with it on: {:.1} % fewer",
                b.off,
                b.on,
                b.reduction() * 100.0
            );
            let _ = writeln!(
                out,
                "retry budget: {FAILING_REQUESTS} GETs with 3 attempts each sent {} attempts \
                 without the budget ({:.2} per request), {} with it ({:.2} per request)",
                r.off,
                OffOn::amplification(r.off),
                r.on,
                OffOn::amplification(r.on)
            );
        }
        if let Some(f) = &self.fleet {
            let (local, shared) = fleet_summaries(f);
            let ratio = shared.vs_limit.map_or(0.0, |v| v.rps.median);
            let _ = writeln!(
                out,
                "fleet: full policy {:.0} req/s (p99 {:.2} ms); + a shared limit on Redis, lease \
                 {FLEET_LEASE}: {:.0} req/s (p99 {:.2} ms), {ratio:.3} × paired, {:.3} Redis calls \
                 per request",
                local.rps.median,
                local.p99_ms,
                shared.rps.median,
                shared.p99_ms,
                f.redis_calls_per_request
            );
        }
    }

    pub(crate) fn json(&self) -> Value {
        let mut scenarios = serde_json::Map::new();
        for r in &self.scenarios {
            let mut clients = serde_json::Map::new();
            for s in &r.clients {
                clients.insert(s.kind.key().to_owned(), summary_json(s));
            }
            scenarios.insert(
                r.scenario.name.to_owned(),
                json!({
                    "title": r.scenario.title,
                    "callers": r.scenario.callers,
                    "hosts": r.scenario.hosts,
                    "path": r.scenario.path,
                    "clients": clients,
                    "beside": r.beside.iter().map(beside_json).collect::<Vec<_>>(),
                }),
            );
        }
        json!({
            "secs": self.secs,
            "rounds": self.rounds,
            "profile": self.profile,
            "scenarios": scenarios,
            "breaker": self.breaker.map(|b| json!({
                "requests": FAILING_REQUESTS,
                "attempts_off": b.off,
                "attempts_on": b.on,
                "reduction": round3(b.reduction()),
            })),
            "retry_budget": self.budget.map(|r| json!({
                "requests": FAILING_REQUESTS,
                "attempts_off": r.off,
                "attempts_on": r.on,
                "amplification_off": round3(OffOn::amplification(r.off)),
                "amplification_on": round3(OffOn::amplification(r.on)),
            })),
            "fleet": self.fleet.as_ref().map(|f| {
                let (local, shared) = fleet_summaries(f);
                json!({
                    "lease": FLEET_LEASE,
                    "local": summary_json(&local),
                    "shared": summary_json(&shared),
                    "redis_calls_per_request": round3(f.redis_calls_per_request),
                })
            }),
        })
    }

    /// Bars of each client's req/s and CPU per request relative to the limit (paired
    /// medians), one group per scenario: the chart written beside the JSON.
    pub(crate) fn svg(&self) -> String {
        const W: f64 = 760.0;
        const BAR: f64 = 16.0;
        const LEFT: f64 = 260.0;
        type Panel = (&'static str, fn(&Summary) -> Option<f64>, &'static str);
        let panels: [Panel; 2] = [
            (
                "req/s relative to the limit (higher is better)",
                |s| s.vs_limit.map(|v| v.rps.median),
                "#3b7dd8",
            ),
            (
                "client CPU per request relative to the limit (lower is better)",
                |s| s.vs_limit.map(|v| v.cpu.median),
                "#5a9e4b",
            ),
        ];
        let rows: usize = self.scenarios.iter().map(|r| r.clients.len() + 1).sum();
        let panel_h = 30.0 + rows as f64 * (BAR + 4.0);
        let height = 40.0 + panel_h * panels.len() as f64;
        let mut out = String::new();
        let _ = writeln!(
            out,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(
            out,
            r#"<text x="10" y="24" font-size="15" font-weight="bold">soulbase-net bench: paired medians of {} rounds ({}), the limit = 1</text>"#,
            self.rounds, self.profile
        );
        let scale = (W - LEFT - 60.0) / 1.5;
        for (p, (title, value, colour)) in panels.iter().enumerate() {
            let mut y = 40.0 + p as f64 * panel_h;
            let _ = writeln!(
                out,
                r#"<text x="10" y="{}" font-weight="bold">{title}</text>"#,
                y + 16.0
            );
            y += 24.0;
            for r in &self.scenarios {
                let _ = writeln!(
                    out,
                    r#"<text x="10" y="{}" font-style="italic">{}</text>"#,
                    y + 12.0,
                    r.scenario.name
                );
                y += BAR + 4.0;
                for s in &r.clients {
                    let v = value(s).unwrap_or(1.0);
                    let w = scale * v.min(1.5);
                    let _ = writeln!(
                        out,
                        r#"<text x="24" y="{}">{}</text><rect x="{LEFT}" y="{y}" width="{w:.1}" height="{BAR}" fill="{colour}"/><text x="{:.1}" y="{}">{v:.3}</text>"#,
                        y + 12.0,
                        s.kind.label(),
                        LEFT + w + 4.0,
                        y + 12.0
                    );
                    y += BAR + 4.0;
                }
            }
        }
        out.push_str("</svg>\n");
        out
    }
}

/// The fleet row's two settings as summaries, the shared one paired with the local one.
fn fleet_summaries(f: &Fleet) -> (Summary, Summary) {
    let local = Summary::of(Kind::SoulbaseFull, &f.local, None);
    let shared = Summary::of(Kind::SoulbaseFull, &f.shared, Some(&f.local));
    (local, shared)
}

/// `{"client", "against", "rps", "p99", "cpu"}`: one comparison beside the limit.
fn beside_json(b: &Beside) -> Value {
    json!({
        "client": b.client.key(),
        "against": b.against.key(),
        "rps": spread_json(b.ratios.rps, round3),
        "p99": spread_json(b.ratios.p99, round3),
        "cpu": spread_json(b.ratios.cpu, round3),
    })
}

fn summary_json(s: &Summary) -> Value {
    json!({
        "rps": spread_json(s.rps, round2),
        "p50_ms": round2(s.p50_ms),
        "p95_ms": round2(s.p95_ms),
        "p99_ms": round2(s.p99_ms),
        "cpu_us_per_req": spread_json(s.cpu_us, round2),
        "conns": s.conns,
        "ok": s.ok,
        "errors": s.errors,
        "vs_limit": s.vs_limit.map(|v| json!({
            "rps": spread_json(v.rps, round3),
            "p99": spread_json(v.p99, round3),
            "cpu": spread_json(v.cpu, round3),
        })),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::measure::{Ratios, Run};

    /// `bench --h3`: the raw client is the limit (ratio 1), ours is against it, and HTTP/3
    /// is set beside HTTP/2 with TLS in the table and the JSON.
    #[test]
    fn the_h3_scenario_shows_its_limit_and_http3_beside_http2() {
        let run = |cpu_us: f64| Run {
            rps: 1000.0,
            p99_ms: 1.0,
            cpu_us,
            ..Run::default()
        };
        let raw = [run(10.0)];
        let ours = [run(11.0)];
        let h2 = [run(5.5)];
        let mut report = Report::new(1.0, 3, "test");
        report.scenarios.push(ScenarioResult {
            scenario: super::super::scenario::h3(),
            clients: vec![
                Summary::of(Kind::H3Raw, &raw, Some(&raw)),
                Summary::of(Kind::SoulbaseH3, &ours, Some(&raw)),
            ],
            beside: vec![Beside {
                client: Kind::SoulbaseH3,
                against: Kind::SoulbaseH2,
                ratios: Ratios::paired(&ours, &h2),
            }],
        });
        let tables = report.tables();
        assert!(
            tables.contains("| h3 + h3-quinn (the limit) | 1000 (1000–1000) |"),
            "{tables}"
        );
        assert!(tables.contains("| 1.100 (1.10–1.10) |\n"), "{tables}");
        assert!(
            tables.contains(
                "soulbase-net HTTP/3 against soulbase-net HTTP/2+TLS, paired by round: req/s \
                 1.000 (1.00–1.00) ×, p99 1.000 (1.00–1.00) ×, CPU per request 2.000 \
                 (2.00–2.00) ×"
            ),
            "{tables}"
        );
        let json = report.json();
        let beside = &json["scenarios"]["h3-64"]["beside"][0];
        assert_eq!(beside["client"], "soulbase_h3");
        assert_eq!(beside["against"], "soulbase_h2");
        assert_eq!(beside["cpu"]["median"], 2.0);
        let raw = &json["scenarios"]["h3-64"]["clients"]["h3raw"];
        assert!(raw["vs_limit"].is_null(), "{json}");
    }
}
