//! `sandbox-agent bench`: measures the runtime against the raw stdio limit of
//! the mock agent, in the style of `redis-benchmark`.
//!
//! - [`client`]: the load generator's HTTP client, SSE counter and stdio driver.
//! - [`scenarios`]: one function per scenario.
//! - [`report`]: the table, the ratios against the targets, `--json`.
//!
//! Every scenario runs against one server: a local one the bench starts
//! (`--embedded`, the default) or `--url`. Ratios are taken within one run,
//! because this kind of machine is shared and noisy.

pub mod client;
pub mod fs;
pub mod inventory;
pub mod metrics;
pub mod processes;
pub mod report;
pub mod scenarios;
pub mod store;
pub mod transports;

use acp_runtime::config;
use clap::Args;
use client::BenchError;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, Command};

/// The scenarios, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scenario {
    /// `_mock/echo` through `/v2/rpc` at 1 and N connections.
    Roundtrip,
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

/// `sandbox-agent bench`.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Measure a running server (host:port or http://host:port) instead of starting one.
    #[arg(long, value_name = "URL", conflicts_with = "embedded")]
    pub url: Option<String>,
    /// Start a local server for the run (the default).
    #[arg(long)]
    pub embedded: bool,
    /// Bearer token for --url.
    #[arg(long, env = "SANDBOX_AGENT_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Connections of the concurrent roundtrip run.
    #[arg(long, default_value_t = 16)]
    pub connections: usize,
    /// Seconds each timed loop runs.
    #[arg(long, default_value_t = 3.0)]
    pub duration: f64,
    /// Scenarios to run (comma-separated); all by default.
    #[arg(long, value_delimiter = ',', value_enum)]
    pub scenario: Vec<Scenario>,
    /// Updates the stream scenario's prompt emits.
    #[arg(long, default_value_t = 100_000)]
    pub stream_updates: u64,
    /// Bytes of text per streamed update.
    #[arg(long, default_value_t = 16)]
    pub stream_bytes: usize,
    /// Events in the ring for the replay scenario.
    // By default a full ring of a server started with default settings.
    #[arg(long, default_value_t = config::DEFAULT_REPLAY_BUFFER_EVENTS as u64)]
    pub replay_events: u64,
    /// Connections (each with an open stream) of the connections scenario.
    #[arg(long, default_value_t = 1000)]
    pub idle_connections: usize,
    /// Server starts measured by the startup scenario.
    #[arg(long, default_value_t = 10)]
    pub startup_runs: usize,
    /// Bytes of output the processes scenario's writer prints (`yes | head
    /// -c N`; 1 GiB by default, less for CI).
    #[arg(long, default_value_t = 1 << 30)]
    pub process_bytes: u64,
    /// Print the results as JSON.
    #[arg(long)]
    pub json: bool,
}

impl BenchArgs {
    /// Validates the arguments.
    ///
    /// # Errors
    /// A message for the user.
    pub fn into_options(self) -> Result<BenchOptions, String> {
        let url = match &self.url {
            None => None,
            Some(url) => {
                let host = url
                    .trim_start_matches("http://")
                    .trim_end_matches('/')
                    .trim_end_matches("/v2/rpc");
                let address = std::net::ToSocketAddrs::to_socket_addrs(host)
                    .map_err(|e| format!("cannot resolve {url}: {e}"))?
                    .next()
                    .ok_or_else(|| format!("cannot resolve {url}"))?;
                Some(address)
            }
        };
        if !(self.duration > 0.0 && self.duration.is_finite()) {
            return Err("--duration must be a positive number of seconds".to_owned());
        }
        Ok(BenchOptions {
            url,
            token: self.token,
            connections: self.connections.max(1),
            duration: Duration::from_secs_f64(self.duration),
            scenarios: if self.scenario.is_empty() {
                Scenario::defaults()
            } else {
                self.scenario
            },
            stream_updates: self.stream_updates.max(1),
            stream_bytes: self.stream_bytes.max(1),
            replay_events: self.replay_events.max(1),
            idle_connections: self.idle_connections.max(1),
            startup_runs: self.startup_runs.max(1),
            process_bytes: self.process_bytes.max(1),
            program: std::env::current_exe()
                .map_err(|e| format!("cannot locate this executable: {e}"))?,
        })
    }
}

/// A server under test: its address and, when local, its pid.
#[derive(Debug)]
pub struct Target {
    /// Where it listens.
    pub address: SocketAddr,
    /// Its pid, when the bench started it (for RSS).
    pub pid: Option<u32>,
    /// Bearer token.
    pub token: Option<String>,
    child: Option<Child>,
}

impl Target {
    /// Starts `program server` on a free loopback port and waits for its
    /// listening line.
    ///
    /// # Errors
    /// When it does not start.
    pub async fn start(program: &std::path::Path, extra: &[&str]) -> Result<Self, BenchError> {
        Self::start_with_env(program, extra, &[]).await
    }

    /// [`Target::start`] with `env` added to the server's environment.
    ///
    /// # Errors
    /// When it does not start.
    pub async fn start_with_env(
        program: &std::path::Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Self, BenchError> {
        let mut child = Command::new(program)
            .args(["server", "--host", "127.0.0.1", "--port", "0", "--no-token"])
            .args(extra)
            .env("RUST_LOG", "warn")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| BenchError::Unexpected("server stdout not piped".into()))?;
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .map_err(|_| BenchError::Unexpected("server did not start within 20 s".into()))??
            .ok_or_else(|| BenchError::Unexpected("server exited before listening".into()))?;
        let address = line
            .rsplit("http://")
            .next()
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| BenchError::Unexpected(format!("unexpected start line {line:?}")))?;
        Ok(Self {
            address,
            pid: child.id(),
            token: None,
            child: Some(child),
        })
    }

    /// A server started elsewhere.
    pub fn remote(address: SocketAddr, token: Option<String>) -> Self {
        Self {
            address,
            pid: None,
            token,
            child: None,
        }
    }

    /// Resident set size of the server in bytes, when it is local.
    pub fn rss(&self) -> Option<u64> {
        rss_bytes(self.pid?)
    }

    /// Stops a server the bench started (SIGTERM, then waits).
    pub async fn stop(mut self) {
        if let (Some(mut child), Some(pid)) = (self.child.take(), self.pid) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap_or(0)),
                nix::sys::signal::Signal::SIGTERM,
            );
            if tokio::time::timeout(Duration::from_secs(10), child.wait())
                .await
                .is_err()
            {
                let _ = child.kill().await;
            }
        }
    }
}

/// `VmRSS` of a process, in bytes (Linux `/proc/<pid>/status`).
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Runs `sandbox-agent bench`: measures, then prints the report (a table,
/// or `--json`).
///
/// # Errors
/// Invalid arguments, or a server that cannot be started or reached.
pub async fn run(args: BenchArgs) -> Result<(), String> {
    let json = args.json;
    let options = args.into_options()?;
    let report = measure(options)
        .await
        .map_err(|e| format!("bench failed: {e}"))?;
    if json {
        let checks = report.checks();
        let value = serde_json::json!({ "report": report, "checks": checks });
        println!(
            "{}",
            serde_json::to_string_pretty(&value).unwrap_or_default()
        );
    } else {
        print!("{}", report.render());
    }
    Ok(())
}

/// Runs the chosen scenarios and returns the report.
///
/// # Errors
/// When the server cannot be started or reached.
pub async fn measure(options: BenchOptions) -> Result<report::Report, BenchError> {
    // The embedded server keeps its sessions (the default SQLite store) in
    // a data dir of its own: benchmark sessions stay out of the user's.
    let data_dir = std::env::temp_dir().join(format!("sandbox-agent-bench-{}", std::process::id()));
    let target = match options.url {
        Some(address) => Target::remote(address, options.token.clone()),
        None => {
            let dir = data_dir.to_string_lossy().into_owned();
            Target::start(&options.program, &["--data-dir", &dir]).await?
        }
    };
    let mut report = report::Report::new(&options, target.pid.is_some());
    for scenario in &options.scenarios {
        let outcome = match scenario {
            Scenario::Roundtrip => scenarios::roundtrip(&target, &options).await,
            Scenario::Stdio => scenarios::stdio(&options).await,
            Scenario::Relay => scenarios::relay(&options).await,
            Scenario::Stream => scenarios::stream(&target, &options).await,
            Scenario::Replay => scenarios::replay(&target, &options).await,
            Scenario::Connections => scenarios::connections(&target, &options).await,
            Scenario::Startup => scenarios::startup(&options).await,
            Scenario::Websocket => transports::websocket(&target, &options).await,
            Scenario::Http2 => transports::http2(&target, &options).await,
            Scenario::Fs => fs::fs(&target, &options).await,
            Scenario::Store => store::store(&options).await,
            Scenario::Sessions => inventory::sessions(&options).await,
            Scenario::Processes => processes::processes(&target, &options).await,
            Scenario::Metrics => metrics::metrics(&options).await,
        };
        match outcome {
            Ok(results) => report.results.extend(results),
            Err(error) => report.failures.push(format!("{scenario:?}: {error}")),
        }
    }
    target.stop().await;
    let _ = std::fs::remove_dir_all(&data_dir);
    Ok(report)
}
