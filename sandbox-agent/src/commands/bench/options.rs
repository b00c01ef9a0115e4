//! What `bench` runs and how hard: the scenarios and their sizes.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The scenarios, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scenario {
    /// `_mock/echo` through `/v2/rpc` at 1 and N connections.
    Roundtrip,
    /// `_sandboxagent/session/list` of 10 sessions against `session/list`,
    /// `_sandboxagent/session/get` and a plain `session/prompt`, each back
    /// to back on one connection (not in the default run).
    Ext,
    /// The same requests straight to a mock agent over stdio.
    Stdio,
    /// The same requests over TCP through `socat` to a mock agent: what a
    /// relay that only copies lines adds to stdio, the floor under the
    /// websocket and roundtrip ratios (needs `socat`; in the default run
    /// when `socat` is on `PATH`).
    Relay,
    /// One prompt emitting M updates: SSE versus raw stdio.
    Stream,
    /// Resume with `Last-Event-ID` against a full ring.
    Replay,
    /// N idle connections with open streams: memory and liveness.
    Connections,
    /// Process start to `/v2/health` answering 200.
    Startup,
    /// `_mock/echo` over a WebSocket on `/acp/mock`, 1 and 16 in flight.
    Websocket,
    /// `_mock/echo` POSTs from 32 streams of one HTTP/2 connection.
    Http2,
    /// 1 GiB file GET / PUT and a 1000-file upload-batch against cat, dd
    /// and tar -x (writes 3 GiB to the temp dir; not in the default run).
    Fs,
    /// The session store: SSE and 16-connection prompts with SQLite against
    /// `--store memory`, start-up on 10,000 stored sessions and a million
    /// events, event pages read from the store (about two minutes and
    /// 1 GB in the temp dir; not in the default run).
    Store,
    /// The inventory at scale: start-up, pages of 100 and RSS at 1,000 and
    /// at 100,000 stored sessions (seeds 100,000 sessions through a server;
    /// minutes; not in the default run).
    Sessions,
    /// The process API: `run` of `/bin/true` against a local spawn and
    /// wait, `--process-bytes` of output followed over SSE against
    /// `yes | head -c N | cat`, the server's RSS meanwhile (not in the
    /// default run).
    Processes,
    /// What metrics and traces cost: round trips and an SSE stream with
    /// `--no-metrics`, with metrics, and with traces exported to a local
    /// OTLP receiver; `GET /metrics` with a few and with 10,000 sessions
    /// (not in the default run).
    Metrics,
}

impl Scenario {
    /// The default run: the quick scenarios (not [`Scenario::Fs`], minutes
    /// of disk traffic, nor the other long ones; ask for them with
    /// `--scenario`), and [`Scenario::Relay`] after stdio when `socat` is
    /// on `PATH` ([`Scenario::defaults`]).
    pub const ALL: [Scenario; 8] = [
        Scenario::Roundtrip,
        Scenario::Stdio,
        Scenario::Websocket,
        Scenario::Http2,
        Scenario::Stream,
        Scenario::Replay,
        Scenario::Connections,
        Scenario::Startup,
    ];

    /// The default run: [`Scenario::ALL`], with [`Scenario::Relay`] after
    /// [`Scenario::Stdio`] when `socat` is on `PATH` (the websocket's
    /// targets are ratios to the relay, research/benchmarks.md).
    pub fn defaults() -> Vec<Scenario> {
        let mut scenarios = Self::ALL.to_vec();
        if on_path("socat") {
            let at = scenarios
                .iter()
                .position(|s| *s == Scenario::Stdio)
                .map_or(0, |at| at + 1);
            scenarios.insert(at, Scenario::Relay);
        }
        scenarios
    }
}

/// Whether an executable file `name` is in one of `PATH`'s directories.
fn on_path(name: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| {
            std::fs::metadata(dir.join(name))
                .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        })
    })
}

/// What to run and how hard.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Server to measure; `None`: start one (embedded).
    pub url: Option<SocketAddr>,
    /// Bearer token for `url`.
    pub token: Option<String>,
    /// Connections of the concurrent roundtrip scenario.
    pub connections: usize,
    /// How long each timed loop runs.
    pub duration: Duration,
    /// Which scenarios.
    pub scenarios: Vec<Scenario>,
    /// Updates the stream scenario's prompt emits.
    pub stream_updates: u64,
    /// Bytes of text per update.
    pub stream_bytes: usize,
    /// Events in the ring for the replay scenario.
    pub replay_events: u64,
    /// Connections of the connections scenario.
    pub idle_connections: usize,
    /// Server starts measured by the startup scenario.
    pub startup_runs: usize,
    /// Bytes of output the processes scenario's writer prints.
    pub process_bytes: u64,
    /// The `sandbox-agent` executable (for the embedded server, stdio, startup).
    pub program: PathBuf,
}

/// Sessions in the inventory for the metrics scenario's second set of
/// scrapes.
pub const SCRAPE_SESSIONS: usize = 10_000;
