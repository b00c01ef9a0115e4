//! The server's metrics (research/contract.md, "Metrics"; DESIGN.md §15):
//! one [`Metrics`] of counter, gauge and histogram handles, shared by `Arc`
//! with the modules where each event happens, so recording one costs an
//! atomic add. The HTTP series every request records are found by index
//! (route template, method, status); other labelled families add a read
//! lock and a hash of their labels (turns, installs: not per request).
//! `GET /metrics` encodes them (`http::scrape`).
//!
//! Labels stay bounded: a route template, an HTTP method and status, a
//! configured agent id, a stop reason from ACP's enum, a fixed state or
//! transport name. Never a session or connection id.
//!
//! Values the server counts already (agent processes and restarts, the
//! process API's table, the store's queue and drops) are read at scrape
//! time instead ([`Scraped`]), each in constant time per configured agent.

use crate::route_template::Template;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The prefix of every metric name.
pub const PREFIX: &str = "sandbox_agent";

/// `http_requests_total`'s labels.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HttpLabels {
    route: &'static str,
    method: &'static str,
    status: u16,
}

/// A route template alone.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteLabel {
    route: &'static str,
}

/// A configured agent id alone.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AgentLabel {
    agent: Arc<str>,
}

/// `prompt_turns_total`'s labels.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TurnLabels {
    agent: Arc<str>,
    stop_reason: &'static str,
}

/// `agent_installs_total`'s labels.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InstallLabels {
    agent: Arc<str>,
    outcome: &'static str,
}

/// One fixed label (`state`, `transport`, `direction`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TransportLabel {
    transport: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DirectionLabel {
    direction: &'static str,
}

/// The `method` label of each HTTP method with a series of its own; any
/// other method is `other` (research/contract.md, "Metrics").
const HTTP_METHODS: [&str; 8] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "other",
];

/// The index in [`HTTP_METHODS`] of `method`'s label.
fn http_method_index(method: &http::Method) -> usize {
    match *method {
        http::Method::GET => 0,
        http::Method::HEAD => 1,
        http::Method::POST => 2,
        http::Method::PUT => 3,
        http::Method::DELETE => 4,
        http::Method::OPTIONS => 5,
        http::Method::PATCH => 6,
        _ => 7,
    }
}

/// The statuses of the answers every request path ends in (a JSON answer,
/// a 202, a 204, a WebSocket's 101): their `http_requests_total` series are
/// found by index ([`HttpSeries`]); any other status (errors, ranges) takes
/// the family's lookup.
const INDEXED_STATUSES: [u16; 4] = [200, 202, 204, 101];

/// Handles of the HTTP series every request records, found by index
/// instead of the family's lookup (a read lock and a hash of the labels per
/// request): the request counter of each route template × method ×
/// [`INDEXED_STATUSES`], the duration histogram of each template. Each is
/// taken from its family at its first request, so a series still appears
/// with its first request, and a scrape reads the family as before.
#[derive(Debug)]
struct HttpSeries {
    /// By `(template × method) × status` index ([`HttpSeries::counter`]).
    counters: Box<[OnceLock<Counter>]>,
    /// By template index.
    durations: [OnceLock<Histogram>; Template::COUNT],
}

impl Default for HttpSeries {
    fn default() -> Self {
        let counters = Template::COUNT * HTTP_METHODS.len() * INDEXED_STATUSES.len();
        Self {
            counters: (0..counters).map(|_| OnceLock::new()).collect(),
            durations: std::array::from_fn(|_| OnceLock::new()),
        }
    }
}

impl HttpSeries {
    /// The slot of the counter of `route`, method `method` (an index in
    /// [`HTTP_METHODS`]) and status `status`; `None` for a status not in
    /// [`INDEXED_STATUSES`].
    fn counter(&self, route: Template, method: usize, status: u16) -> Option<&OnceLock<Counter>> {
        let status = INDEXED_STATUSES.iter().position(|s| *s == status)?;
        let at = (route.index() * HTTP_METHODS.len() + method) * INDEXED_STATUSES.len() + status;
        self.counters.get(at)
    }
}

/// A histogram family whose members share one bucket layout.
type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// HTTP requests last microseconds (health) to seconds (a long POST):
/// 50 µs × 4ⁿ up to about 13 s.
fn http_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.000_05, 4.0, 10))
}

/// Prompt turns last seconds to hours.
fn turn_buckets() -> Histogram {
    Histogram::new([
        0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
        7200.0, 14400.0,
    ])
}

/// The first update of a turn comes in milliseconds to minutes.
fn first_update_buckets() -> Histogram {
    Histogram::new([
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
    ])
}

/// A store write (one batch) lasts microseconds (SQLite) to seconds (a
/// PostgreSQL server far away): 50 µs × 4ⁿ up to about 13 s.
pub fn store_write_buckets() -> Histogram {
    http_buckets()
}

/// How a client's connection reaches the server (`acp_connections`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// `/v2/rpc`: POST and an SSE stream.
    V2Sse,
    /// `/acp` over Streamable HTTP.
    AcpHttp,
    /// `/acp` over a WebSocket.
    AcpWs,
}

impl Transport {
    const ALL: [Self; 3] = [Self::V2Sse, Self::AcpHttp, Self::AcpWs];

    fn label(self) -> &'static str {
        match self {
            Self::V2Sse => "v2_sse",
            Self::AcpHttp => "acp_http",
            Self::AcpWs => "acp_ws",
        }
    }
}

/// The state a session is listed in (`sessions`: what `GET /v2/sessions`
/// lists, memory's entries and the store's alike; research/contract.md,
/// "Metrics").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionState {
    /// Hosted by a running agent process.
    Live,
    /// Restored from the store, not loaded into a process.
    Dormant,
    /// Ended; kept for listing and replay.
    Ended,
}

impl SessionState {
    const ALL: [Self; 3] = [Self::Live, Self::Dormant, Self::Ended];

    fn label(self) -> &'static str {
        match self {
            Self::Live => "live",
            Self::Dormant => "dormant",
            Self::Ended => "ended",
        }
    }
}

/// The stop reasons of ACP's `StopReason` enum; anything else counts as
/// `other`, and an error answer to `session/prompt` as `error`.
pub fn stop_reason_label(reason: Option<&str>) -> &'static str {
    match reason {
        Some("end_turn") => "end_turn",
        Some("max_tokens") => "max_tokens",
        Some("max_turn_requests") => "max_turn_requests",
        Some("refusal") => "refusal",
        Some("cancelled") => "cancelled",
        Some(_) => "other",
        None => "error",
    }
}

/// Every metric the server records as things happen.
#[derive(Debug)]
pub struct Metrics {
    /// Whether anything is recorded ([`Metrics::off`]).
    on: bool,
    http_requests: Family<HttpLabels, Counter>,
    http_duration: Histograms<RouteLabel>,
    /// The handles of `http_requests` and `http_duration` each request
    /// records, by index.
    http: HttpSeries,
    /// Open connections, by [`Transport`] (index of `Transport::ALL`).
    connections: [Gauge; 3],
    connections_family: Family<TransportLabel, Gauge>,
    /// Sessions listed, by [`SessionState`] (index of `SessionState::ALL`).
    sessions: [Gauge; 3],
    sessions_family: Family<StateLabel, Gauge>,
    prompt_turns: Family<TurnLabels, Counter>,
    turn_duration: Histograms<AgentLabel>,
    first_update: Histograms<AgentLabel>,
    permission_requests_pending: Gauge,
    agent_installs: Family<InstallLabels, Counter>,
    events_replayed: Counter,
    stream_gaps: Counter,
    fs_bytes: Family<DirectionLabel, Counter>,
    fs_read: Counter,
    fs_written: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        let connections_family = Family::<TransportLabel, Gauge>::default();
        let connections = Transport::ALL.map(|t| {
            connections_family
                .get_or_create(&TransportLabel {
                    transport: t.label(),
                })
                .clone()
        });
        let sessions_family = Family::<StateLabel, Gauge>::default();
        let sessions = SessionState::ALL.map(|s| {
            sessions_family
                .get_or_create(&StateLabel { state: s.label() })
                .clone()
        });
        let fs_bytes = Family::<DirectionLabel, Counter>::default();
        let fs_read = fs_bytes
            .get_or_create(&DirectionLabel { direction: "read" })
            .clone();
        let fs_written = fs_bytes
            .get_or_create(&DirectionLabel { direction: "write" })
            .clone();
        Self {
            on: true,
            http_requests: Family::default(),
            http_duration: Family::new_with_constructor(http_buckets),
            http: HttpSeries::default(),
            connections,
            connections_family,
            sessions,
            sessions_family,
            prompt_turns: Family::default(),
            turn_duration: Family::new_with_constructor(turn_buckets),
            first_update: Family::new_with_constructor(first_update_buckets),
            permission_requests_pending: Gauge::default(),
            agent_installs: Family::default(),
            events_replayed: Counter::default(),
            stream_gaps: Counter::default(),
            fs_bytes,
            fs_read,
            fs_written,
        }
    }
}

impl Metrics {
    /// Metrics that record nothing (`--no-metrics`): every recording method
    /// returns at once. The gauges the caller holds handles of (connections,
    /// sessions) are left unregistered by the runtime instead.
    pub fn off() -> Self {
        Self {
            on: false,
            ..Self::default()
        }
    }

    /// Whether this records anything.
    pub fn is_on(&self) -> bool {
        self.on
    }

    /// Registers every handle (clones share the same atomics) in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "http_requests",
            "HTTP requests answered, by route template, method and status",
            self.http_requests.clone(),
        );
        registry.register(
            "http_request_duration_seconds",
            "Time from a request's arrival to its answer's head, by route template",
            self.http_duration.clone(),
        );
        registry.register(
            "acp_connections",
            "Open client connections, by transport",
            self.connections_family.clone(),
        );
        registry.register(
            "sessions",
            "Sessions the control plane lists (GET /v2/sessions), by state",
            self.sessions_family.clone(),
        );
        registry.register(
            "prompt_turns",
            "Prompt turns answered, by agent and stop reason",
            self.prompt_turns.clone(),
        );
        registry.register(
            "prompt_turn_duration_seconds",
            "Time from a session/prompt request to its answer, by agent",
            self.turn_duration.clone(),
        );
        registry.register(
            "prompt_time_to_first_update_seconds",
            "Time from a session/prompt request to the turn's first session/update, by agent",
            self.first_update.clone(),
        );
        registry.register(
            "permission_requests_pending",
            "Permission requests from agents no client has answered yet",
            self.permission_requests_pending.clone(),
        );
        registry.register(
            "agent_installs",
            "Agent installs finished, by agent and outcome",
            self.agent_installs.clone(),
        );
        registry.register(
            "events_replayed",
            "Events sent again to a client from a replay ring or an event log",
            self.events_replayed.clone(),
        );
        registry.register(
            "stream_gaps",
            "Stream gap notices sent (events evicted before a client read them)",
            self.stream_gaps.clone(),
        );
        registry.register(
            "fs_bytes",
            "Bytes read from and written to the host file system through the API",
            self.fs_bytes.clone(),
        );
    }

    /// Creates the per-agent histograms of every configured agent, so each
    /// is scraped (at zero) before its first turn.
    pub fn for_agents<'a>(&self, agents: impl IntoIterator<Item = &'a str>) {
        for agent in agents {
            let label = AgentLabel {
                agent: agent.into(),
            };
            drop(self.turn_duration.get_or_create(&label));
            drop(self.first_update.get_or_create(&label));
        }
    }

    /// Records one answered HTTP request: route template `route`, the
    /// answer's `status`, `took` from its arrival to the answer's head.
    pub fn http_request(
        &self,
        route: Template,
        method: &http::Method,
        status: u16,
        took: Duration,
    ) {
        if !self.on {
            return;
        }
        let method = http_method_index(method);
        let labels = || HttpLabels {
            route: route.as_str(),
            method: HTTP_METHODS[method],
            status,
        };
        match self.http.counter(route, method, status) {
            Some(slot) => {
                slot.get_or_init(|| self.http_requests.get_or_create(&labels()).clone())
                    .inc();
            }
            None => {
                self.http_requests.get_or_create(&labels()).inc();
            }
        }
        self.http.durations[route.index()]
            .get_or_init(|| {
                self.http_duration
                    .get_or_create(&RouteLabel {
                        route: route.as_str(),
                    })
                    .clone()
            })
            .observe(took.as_secs_f64());
    }

    /// The gauge of open connections on `transport`.
    pub fn connections(&self, transport: Transport) -> &Gauge {
        &self.connections[transport as usize]
    }

    /// The gauge of the sessions listed in `state` (see [`SessionState`]).
    pub fn sessions(&self, state: SessionState) -> &Gauge {
        &self.sessions[state as usize]
    }

    /// Records a prompt turn of `agent` answered after `took`, with
    /// `stop_reason` (see [`stop_reason_label`]).
    pub fn prompt_turn(&self, agent: &Arc<str>, stop_reason: &'static str, took: Duration) {
        if !self.on {
            return;
        }
        self.prompt_turns
            .get_or_create(&TurnLabels {
                agent: agent.clone(),
                stop_reason,
            })
            .inc();
        self.turn_duration
            .get_or_create(&AgentLabel {
                agent: agent.clone(),
            })
            .observe(took.as_secs_f64());
    }

    /// Records the first `session/update` of a turn of `agent`, `took`
    /// after its request.
    pub fn first_update(&self, agent: &Arc<str>, took: Duration) {
        if !self.on {
            return;
        }
        self.first_update
            .get_or_create(&AgentLabel {
                agent: agent.clone(),
            })
            .observe(took.as_secs_f64());
    }

    /// The gauge of permission requests no client has answered.
    pub fn permission_requests_pending(&self) -> &Gauge {
        &self.permission_requests_pending
    }

    /// Records a finished install of `agent`: `installed`, `failed`.
    pub fn agent_install(&self, agent: &str, outcome: &'static str) {
        if !self.on {
            return;
        }
        self.agent_installs
            .get_or_create(&InstallLabels {
                agent: agent.into(),
                outcome,
            })
            .inc();
    }

    /// Counts `count` events replayed to a client.
    pub fn events_replayed(&self, count: u64) {
        if !self.on {
            return;
        }
        if count > 0 {
            self.events_replayed.inc_by(count);
        }
    }

    /// Counts one stream gap notice.
    pub fn stream_gap(&self) {
        if !self.on {
            return;
        }
        self.stream_gaps.inc();
    }

    /// Counts `bytes` read from the host file system.
    pub fn fs_read(&self, bytes: u64) {
        if !self.on {
            return;
        }
        self.fs_read.inc_by(bytes);
    }

    /// Counts `bytes` written to the host file system.
    pub fn fs_written(&self, bytes: u64) {
        if !self.on {
            return;
        }
        self.fs_written.inc_by(bytes);
    }
}

/// A gauge raised while this guard lives: dropped on every exit path, it
/// lowers the gauge again.
#[derive(Debug)]
pub struct GaugeGuard(Gauge);

impl GaugeGuard {
    /// Raises `gauge` by one until the guard is dropped.
    pub fn new(gauge: &Gauge) -> Self {
        gauge.inc();
        Self(gauge.clone())
    }
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The start of a session's current prompt turn, until its first
/// `session/update` takes it: one atomic, nanoseconds since a process-wide
/// base plus one (0: no turn waiting for its first update).
#[derive(Debug, Default)]
pub struct TurnClock(AtomicU64);

/// The base [`TurnClock`] counts from.
fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

impl TurnClock {
    /// A turn starts now.
    pub fn start(&self) {
        let since = u64::try_from(base().elapsed().as_nanos()).unwrap_or(u64::MAX - 1);
        self.0.store(since + 1, Ordering::Relaxed);
    }

    /// An update arrived: the time since the turn started when it is the
    /// turn's first, else `None`.
    pub fn first_update(&self) -> Option<Duration> {
        if self.0.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let started = self.0.swap(0, Ordering::Relaxed).checked_sub(1)?;
        let now = base().elapsed();
        Some(now.saturating_sub(Duration::from_nanos(started)))
    }
}

/// Where a scrape reads the values counted elsewhere.
pub trait ScrapeSource: std::fmt::Debug + Send + Sync + 'static {
    /// Per configured agent: its id, whether a process runs, processes
    /// started after the first.
    fn agent_processes(&self) -> Vec<(Arc<str>, bool, u64)>;
    /// The process API's processes: running, exited and kept.
    fn processes(&self) -> (u64, u64);
    /// The store's queue: writes waiting, events dropped so far.
    fn store(&self) -> (u64, u64);
}

/// The metrics read at scrape time from a [`ScrapeSource`].
#[derive(Debug)]
pub struct Scraped<S>(pub S);

impl<S: ScrapeSource> Collector for Scraped<S> {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let agents = self.0.agent_processes();
        {
            let mut family = encoder.encode_descriptor(
                "agent_processes",
                "Running agent processes, by agent.",
                None,
                MetricType::Gauge,
            )?;
            for (agent, running, _) in &agents {
                let labels = AgentLabel {
                    agent: agent.clone(),
                };
                ConstGauge::new(i64::from(*running)).encode(family.encode_family(&labels)?)?;
            }
        }
        {
            let mut family = encoder.encode_descriptor(
                "agent_restarts",
                "Agent processes started after the first, by agent.",
                None,
                MetricType::Counter,
            )?;
            for (agent, _, restarts) in &agents {
                let labels = AgentLabel {
                    agent: agent.clone(),
                };
                ConstCounter::new(*restarts).encode(family.encode_family(&labels)?)?;
            }
        }
        let (running, exited) = self.0.processes();
        {
            let mut family = encoder.encode_descriptor(
                "processes",
                "Process API processes, by state (exited ones are those still kept).",
                None,
                MetricType::Gauge,
            )?;
            for (state, count) in [("running", running), ("exited", exited)] {
                ConstGauge::new(i64::try_from(count).unwrap_or(i64::MAX))
                    .encode(family.encode_family(&StateLabel { state })?)?;
            }
        }
        let (waiting, dropped) = self.0.store();
        ConstGauge::new(i64::try_from(waiting).unwrap_or(i64::MAX)).encode(
            encoder.encode_descriptor(
                "store_queue_writes",
                "Writes queued for the session store.",
                None,
                MetricType::Gauge,
            )?,
        )?;
        ConstCounter::new(dropped).encode(encoder.encode_descriptor(
            "store_dropped_events",
            "Events the store's writer dropped (queue full while the store was down).",
            None,
            MetricType::Counter,
        )?)?;
        Ok(())
    }
}

/// Prometheus's text format (version 0.0.4) from OpenMetrics text as
/// `prometheus_client` writes it: counters are named with their `_total`
/// suffix in `HELP` and `TYPE`, and `UNIT` and `EOF` lines go (the two
/// formats agree on everything else this server writes).
pub fn prometheus_text(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    let mut help: Option<&str> = None;
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if line.starts_with("# HELP ") {
            help = Some(line);
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let counter = rest.strip_suffix(" counter");
            if let Some(help) = help.take() {
                match counter {
                    Some(name) => {
                        let text = help.strip_prefix("# HELP ").unwrap_or(help);
                        let text = text.strip_prefix(name).unwrap_or(text);
                        out.push_str(&format!("# HELP {name}_total{text}\n"));
                    }
                    None => {
                        out.push_str(help);
                        out.push('\n');
                    }
                }
            }
            match counter {
                Some(name) => out.push_str(&format!("# TYPE {name}_total counter\n")),
                None => {
                    out.push_str(line);
                    out.push('\n');
                }
            }
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_text_names_counters_with_total() {
        let open = "# HELP x_events Events.\n# TYPE x_events counter\nx_events_total 3\n# HELP x_up Up.\n# TYPE x_up gauge\n# UNIT x_up seconds\nx_up 1\n# EOF\n";
        assert_eq!(
            prometheus_text(open),
            "# HELP x_events_total Events.\n# TYPE x_events_total counter\nx_events_total 3\n# HELP x_up Up.\n# TYPE x_up gauge\nx_up 1\n"
        );
    }

    #[test]
    fn stop_reasons_are_bounded() {
        assert_eq!(stop_reason_label(Some("end_turn")), "end_turn");
        assert_eq!(stop_reason_label(Some("x".repeat(99).as_str())), "other");
        assert_eq!(stop_reason_label(None), "error");
    }

    #[test]
    fn turn_clock_times_only_the_first_update() {
        let clock = TurnClock::default();
        assert!(clock.first_update().is_none());
        clock.start();
        assert!(clock.first_update().is_some());
        assert!(clock.first_update().is_none());
    }
}
