//! Results, the target ratios (research/benchmarks.md, "Against the
//! targets"), and their presentation (a table, or JSON with `--json`).

use super::BenchOptions;
use serde::Serialize;
use std::fmt::Write as _;
use std::time::Duration;

/// The name of the runtime's own cost per round trip in the report (µs).
pub const RUNTIME_COST: &str =
    "runtime cost per round trip = roundtrip p50 − HTTP floor p50 − stdio p50 (µs)";

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Latencies {
    /// Median.
    pub p50_us: f64,
    /// 90th percentile.
    pub p90_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// Slowest.
    pub max_us: f64,
}

impl Latencies {
    /// Percentiles of `samples` (sorted in place); `None` when empty.
    pub fn of(samples: &mut [Duration]) -> Option<Self> {
        if samples.is_empty() {
            return None;
        }
        samples.sort_unstable();
        let at = |q: f64| {
            let index = ((samples.len() as f64 - 1.0) * q).round() as usize;
            samples[index.min(samples.len() - 1)].as_secs_f64() * 1e6
        };
        Some(Self {
            p50_us: at(0.50),
            p90_us: at(0.90),
            p99_us: at(0.99),
            max_us: at(1.0),
        })
    }
}

/// What one scenario measured.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioResult {
    /// Scenario and variant, e.g. `roundtrip (16 connections)`.
    pub name: String,
    /// Requests (or events) completed.
    pub count: u64,
    /// Wall time of the measured part, in seconds.
    pub seconds: f64,
    /// Requests per second, for request scenarios.
    pub requests_per_sec: Option<f64>,
    /// Events per second, for streaming scenarios.
    pub events_per_sec: Option<f64>,
    /// Latency percentiles, for request scenarios.
    pub latency: Option<Latencies>,
    /// Failed requests or missing events.
    pub errors: u64,
    /// Server RSS before, in bytes (local servers only).
    pub rss_before: Option<u64>,
    /// Server RSS after, in bytes (local servers only).
    pub rss_after: Option<u64>,
    /// RSS growth per connection, in bytes.
    pub per_connection_bytes: Option<u64>,
    /// How the numbers were taken.
    pub notes: Vec<String>,
}

impl ScenarioResult {
    /// A request scenario: `latencies` are per request.
    pub fn timed(name: &str, elapsed: Duration, mut latencies: Vec<Duration>, errors: u64) -> Self {
        let count = latencies.len() as u64;
        Self {
            name: name.to_owned(),
            count,
            seconds: elapsed.as_secs_f64(),
            requests_per_sec: Some(count as f64 / elapsed.as_secs_f64().max(1e-9)),
            events_per_sec: None,
            latency: Latencies::of(&mut latencies),
            errors,
            rss_before: None,
            rss_after: None,
            per_connection_bytes: None,
            notes: Vec::new(),
        }
    }

    /// A streaming scenario: `events` arrived within `elapsed`.
    pub fn events(name: &str, elapsed: Duration, events: u64, errors: u64) -> Self {
        Self {
            name: name.to_owned(),
            count: events,
            seconds: elapsed.as_secs_f64(),
            requests_per_sec: None,
            events_per_sec: Some(events as f64 / elapsed.as_secs_f64().max(1e-9)),
            latency: None,
            errors,
            rss_before: None,
            rss_after: None,
            per_connection_bytes: None,
            notes: Vec::new(),
        }
    }

    /// Adds a note.
    pub fn note(&mut self, note: String) {
        self.notes.push(note);
    }
}

/// One target and whether this run met it.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// What is compared.
    pub name: String,
    /// The measured value (a ratio or an absolute number).
    pub value: f64,
    /// The bound, e.g. `<= 1.3`.
    pub target: String,
    /// Whether the bound holds.
    pub pass: bool,
}

impl Check {
    /// `value` must be at most `limit`; the target reads `<= limit`.
    fn at_most(name: &str, value: f64, limit: f64) -> Check {
        Check {
            name: name.to_owned(),
            value,
            target: format!("<= {limit}"),
            pass: value <= limit,
        }
    }

    /// `value` must be at least `limit`; the target reads `>= limit`.
    fn at_least(name: &str, value: f64, limit: f64) -> Check {
        Check {
            name: name.to_owned(),
            value,
            target: format!(">= {limit}"),
            pass: value >= limit,
        }
    }
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// What ran.
    pub scenarios: Vec<String>,
    /// Whether the server was started by the bench.
    pub embedded: bool,
    /// Measured results, in order.
    pub results: Vec<ScenarioResult>,
    /// Scenarios that could not run, with why.
    pub failures: Vec<String>,
}

impl Report {
    /// An empty report for `options`.
    pub fn new(options: &BenchOptions, embedded: bool) -> Self {
        Self {
            scenarios: options
                .scenarios
                .iter()
                .map(|s| format!("{s:?}").to_lowercase())
                .collect(),
            embedded,
            results: Vec::new(),
            failures: Vec::new(),
        }
    }

    fn find(&self, prefix: &str) -> Option<&ScenarioResult> {
        self.results.iter().find(|r| r.name.starts_with(prefix))
    }

    /// The targets, for the results present.
    pub fn checks(&self) -> Vec<Check> {
        let mut checks = Vec::new();
        let p50 = |r: &ScenarioResult| r.latency.map(|l| l.p50_us);
        if let (Some(http), Some(stdio)) = (
            self.find("roundtrip (1 ").and_then(p50),
            self.find("stdio (1 ").and_then(p50),
        ) {
            checks.push(Check::at_most(
                "roundtrip p50 / stdio p50 (1 in flight)",
                http / stdio,
                1.3,
            ));
        }
        // What the runtime itself adds to a round trip, beyond HTTP alone
        // (the floor: `GET /v2/health` on the same connection) and the agent
        // alone (stdio): medians of one run, so noise can make it negative.
        if let (Some(http), Some(floor), Some(stdio)) = (
            self.find("roundtrip (1 ").and_then(p50),
            self.find("http floor").and_then(p50),
            self.find("stdio (1 ").and_then(p50),
        ) {
            checks.push(Check::at_most(RUNTIME_COST, http - floor - stdio, 30.0));
        }
        // The extension layer: one listing through `_sandboxagent/session/list`
        // against the same service answered as `session/list`
        // (research/benchmarks.md, "The extension table").
        if let (Some(ext), Some(plain)) = (
            self.find("ext: _sandboxagent/session/list").and_then(p50),
            self.find("ext: session/list").and_then(p50),
        ) {
            checks.push(Check::at_most(
                "ext: _sandboxagent/session/list p50 / session/list p50",
                ext / plain,
                1.1,
            ));
        }
        let rps = |r: &ScenarioResult| r.requests_per_sec;
        if let (Some(http), Some(stdio)) = (
            self.results
                .iter()
                .find(|r| r.name.starts_with("roundtrip (") && !r.name.starts_with("roundtrip (1 "))
                .and_then(rps),
            self.find("stdio (16").and_then(rps),
        ) {
            checks.push(Check::at_least(
                "roundtrip throughput (N conns) / stdio pipelined",
                http / stdio,
                0.6,
            ));
        }
        // The WebSocket against a relay that only copies bytes (socat), the
        // floor of any server between a client and an agent; against stdio
        // only when the run has no relay (research/benchmarks.md, "A relay's
        // floor under the WebSocket ratio").
        if let (Some(ws), Some(relay)) = (
            self.find("websocket (1 ").and_then(p50),
            self.find("relay (1 ").and_then(p50),
        ) {
            checks.push(Check::at_most(
                "websocket / relay p50 (1 in flight)",
                ws / relay,
                1.15,
            ));
        } else if let (Some(ws), Some(stdio)) = (
            self.find("websocket (1 ").and_then(p50),
            self.find("stdio (1 ").and_then(p50),
        ) {
            checks.push(Check::at_most(
                "websocket p50 / stdio p50 (1 in flight)",
                ws / stdio,
                1.3,
            ));
        }
        if let (Some(ws), Some(relay)) = (
            self.find("websocket (16").and_then(rps),
            self.find("relay (16").and_then(rps),
        ) {
            checks.push(Check::at_least(
                "websocket / relay pipelined msgs/s",
                ws / relay,
                0.9,
            ));
        } else if let (Some(ws), Some(stdio)) = (
            self.find("websocket (16").and_then(rps),
            self.find("stdio (16").and_then(rps),
        ) {
            checks.push(Check::at_least(
                "websocket pipelined msgs/s / stdio pipelined",
                ws / stdio,
                0.6,
            ));
        }
        let eps = |r: &ScenarioResult| r.events_per_sec;
        if let Some(sse) = self.find("stream (SSE)").and_then(eps) {
            if let Some(stdio) = self.find("stream (stdio)").and_then(eps) {
                checks.push(Check::at_least(
                    "stream updates/s SSE / stdio",
                    sse / stdio,
                    0.8,
                ));
            }
            checks.push(Check::at_least("stream updates/s over SSE", sse, 100_000.0));
        }
        // The durable store (research/contract.md, "Durable sessions").
        if let (Some(sqlite), Some(memory)) = (
            self.find("store: stream SSE (sqlite)").and_then(eps),
            self.find("store: stream SSE (memory)").and_then(eps),
        ) {
            checks.push(Check::at_least(
                "store: SSE updates/s sqlite / memory",
                sqlite / memory,
                0.8,
            ));
        }
        if let (Some(sqlite), Some(memory)) = (
            self.find("store: prompts, 16 connections (sqlite)")
                .and_then(rps),
            self.find("store: prompts, 16 connections (memory)")
                .and_then(rps),
        ) {
            checks.push(Check::at_least(
                "store: prompts/s (16 conns) sqlite / memory",
                sqlite / memory,
                0.8,
            ));
        }
        if let Some(startup) = self.find("store: startup, seeded").and_then(p50) {
            checks.push(Check::at_most(
                "store: startup on 10k sessions / 1M events, p50 (ms)",
                startup / 1e3,
                1000.0,
            ));
        }
        if let Some(page) = self.find("store: events page").and_then(p50) {
            checks.push(Check::at_most(
                "store: events page of 1000 from the store, p50 (ms)",
                page / 1e3,
                20.0,
            ));
        }
        // A runtime that ended many sessions pages like a fresh one
        // (research/benchmarks.md, "The inventory of a busy server").
        for ended in self
            .results
            .iter()
            .filter(|r| r.name.starts_with("sessions: first page of"))
        {
            if let Some(page) = p50(ended) {
                checks.push(Check::at_most(
                    &format!("{}, p50 (ms)", ended.name),
                    page / 1e3,
                    10.0,
                ));
            }
        }
        if let Some(replay) = self.find("replay").and_then(|r| r.latency) {
            checks.push(Check::at_most("replay p50 (ms)", replay.p50_us / 1e3, 10.0));
        }
        if let Some(rss) = self.find("startup").and_then(|r| r.rss_after) {
            // The target is 15 MB (10^6 bytes), checked in bytes; shown in
            // MiB like the table, rounded.
            checks.push(Check {
                name: "idle server RSS (MiB)".to_owned(),
                value: rss as f64 / 1048576.0,
                target: "<= 14.3".to_owned(),
                pass: rss <= 15_000_000,
            });
        }
        if let Some(bytes) = self
            .find("connections")
            .and_then(|r| r.per_connection_bytes)
        {
            checks.push(Check::at_most(
                "RSS per idle connection with a stream (KiB)",
                bytes as f64 / 1024.0,
                64.0,
            ));
        }
        // The fs scenario (research/benchmarks.md): each transfer against
        // the tool on the same disk, as a ratio of wall times.
        let seconds = |name: &str| self.find(name).map(|r| r.seconds);
        for (name, ours, tool) in [
            ("fs GET / cat throughput", "fs GET", "fs cat"),
            ("fs PUT / dd throughput", "fs PUT", "fs dd"),
            (
                "fs upload-batch / tar -x throughput",
                "fs upload-batch",
                "fs tar -x",
            ),
        ] {
            if let (Some(ours), Some(tool)) = (seconds(ours), seconds(tool)) {
                checks.push(Check::at_least(name, tool / ours.max(1e-9), 0.7));
            }
        }
        for transfer in ["fs GET", "fs PUT"] {
            if let Some((before, peak)) = self
                .find(transfer)
                .and_then(|r| Some((r.rss_before?, r.rss_after?)))
            {
                checks.push(Check::at_most(
                    &format!("{transfer} server RSS growth (MiB)"),
                    peak.saturating_sub(before) as f64 / 1048576.0,
                    32.0,
                ));
            }
        }
        // The process API (research/benchmarks.md, "Issue 24").
        if let (Some(run), Some(local)) = (
            self.find("processes: run /bin/true").and_then(p50),
            self.find("processes: spawn+wait").and_then(p50),
        ) {
            checks.push(Check::at_most(
                "processes: run /bin/true p50 / local spawn+wait p50",
                run / local,
                10.0,
            ));
        }
        if let Some(echo) = self.find("processes: terminal echo").and_then(p50) {
            checks.push(Check::at_most(
                "processes: terminal echo p50 (ms)",
                echo / 1e3,
                1.0,
            ));
        }
        if let Some(local) = self.find("processes: yes | head | cat").and_then(eps) {
            for follower in ["processes: follow (SSE)", "processes: follow (SDK)"] {
                if let Some(follow) = self.find(follower).and_then(eps) {
                    checks.push(Check::at_least(
                        &format!("{follower} bytes/s / local pipeline"),
                        follow / local,
                        0.2,
                    ));
                }
            }
        }
        for follower in ["processes: follow (SSE)", "processes: follow (SDK)"] {
            if let Some((before, peak)) = self
                .find(follower)
                .and_then(|r| Some((r.rss_before?, r.rss_after?)))
            {
                checks.push(Check::at_most(
                    &format!("{follower} server RSS growth (MiB)"),
                    peak.saturating_sub(before) as f64 / 1048576.0,
                    8.0,
                ));
            }
        }
        if let Some(startup) = self.find("startup").and_then(|r| r.latency) {
            checks.push(Check::at_most(
                "startup p50 (ms)",
                startup.p50_us / 1e3,
                30.0,
            ));
        }
        self.operating_checks(&mut checks);
        checks
    }

    /// What metrics and traces cost (`--scenario metrics`;
    /// research/contract.md, "Metrics"): each ratio is the baseline's
    /// performance over the other's, so 1.0 is free.
    fn operating_checks(&self, checks: &mut Vec<Check>) {
        let p50 = |name: &str| self.find(name).and_then(|r| r.latency).map(|l| l.p50_us);
        let eps = |name: &str| self.find(name).and_then(|r| r.events_per_sec);
        let off = "metrics: roundtrip, metrics off";
        for (other, label, limit) in [
            ("metrics: roundtrip, metrics on", "metrics on", 0.97),
            ("metrics: roundtrip, traces on", "traces on", 0.9),
        ] {
            if let (Some(base), Some(with)) = (p50(off), p50(other)) {
                checks.push(Check::at_least(
                    &format!("roundtrip p50 speed, {label} / metrics off"),
                    base / with.max(1e-9),
                    limit,
                ));
            }
        }
        let off = "metrics: stream (SSE), metrics off";
        for (other, label, limit) in [
            ("metrics: stream (SSE), metrics on", "metrics on", 0.97),
            ("metrics: stream (SSE), traces on", "traces on", 0.9),
        ] {
            if let (Some(base), Some(with)) = (eps(off), eps(other)) {
                checks.push(Check::at_least(
                    &format!("stream updates/s, {label} / metrics off"),
                    with / base.max(1e-9),
                    limit,
                ));
            }
        }
        let at_scale = format!(
            "metrics: scrape, {} sessions",
            super::options::SCRAPE_SESSIONS
        );
        if let Some(scale) = p50(&at_scale) {
            checks.push(Check::at_most(
                &format!("{at_scale} p50 (ms)"),
                scale / 1e3,
                10.0,
            ));
            if let Some(few) = p50("metrics: scrape, few sessions") {
                checks.push(Check::at_most(
                    "scrape p50, 10,000 sessions / few",
                    scale / few.max(1e-9),
                    1.5,
                ));
            }
        }
    }

    /// The human-readable table and the checks.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // The name column fits the longest name.
        let width = self
            .results
            .iter()
            .map(|r| r.name.chars().count())
            .max()
            .unwrap_or(0)
            .max(28);
        let _ = writeln!(
            out,
            "{:<width$} {:>9} {:>11} {:>11} {:>9} {:>9} {:>9} {:>9} {:>6} {:>10} {:>10}",
            "scenario",
            "count",
            "req/s",
            "events/s",
            "p50 µs",
            "p90 µs",
            "p99 µs",
            "max µs",
            "errors",
            "RSS before",
            "RSS after"
        );
        let number = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.0}"));
        let mib = |v: Option<u64>| {
            v.map_or_else(
                || "-".to_owned(),
                |v| format!("{:.1} MiB", v as f64 / 1048576.0),
            )
        };
        for r in &self.results {
            let _ = writeln!(
                out,
                "{:<width$} {:>9} {:>11} {:>11} {:>9} {:>9} {:>9} {:>9} {:>6} {:>10} {:>10}",
                r.name,
                r.count,
                number(r.requests_per_sec),
                number(r.events_per_sec),
                number(r.latency.map(|l| l.p50_us)),
                number(r.latency.map(|l| l.p90_us)),
                number(r.latency.map(|l| l.p99_us)),
                number(r.latency.map(|l| l.max_us)),
                r.errors,
                mib(r.rss_before),
                mib(r.rss_after),
            );
        }
        for r in &self.results {
            for note in &r.notes {
                let _ = writeln!(out, "  {}: {note}", r.name);
            }
            if let Some(bytes) = r.per_connection_bytes {
                let _ = writeln!(
                    out,
                    "  {}: {:.1} KiB per connection",
                    r.name,
                    bytes as f64 / 1024.0
                );
            }
        }
        let checks = self.checks();
        if checks.is_empty() {
            let _ = writeln!(
                out,
                "\ntargets: none for these scenarios (ratios need both sides, e.g. --scenario roundtrip,stdio)"
            );
        } else {
            let _ = writeln!(out, "\ntargets:");
        }
        let name_width = checks
            .iter()
            .map(|check| check.name.chars().count())
            .max()
            .unwrap_or(0)
            .max(50);
        for check in checks {
            let _ = writeln!(
                out,
                "  {:<name_width$} {:>12.3} {:<10} {}",
                check.name,
                check.value,
                check.target,
                if check.pass { "PASS" } else { "FAIL" }
            );
        }
        for failure in &self.failures {
            let _ = writeln!(out, "  failed: {failure}");
        }
        out
    }
}
