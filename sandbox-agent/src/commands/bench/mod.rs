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
pub mod ext;
pub mod fs;
pub mod inventory;
pub mod metrics;
pub mod options;
pub mod processes;
pub mod report;
pub mod scenarios;
pub mod store;
pub mod target;
pub mod transports;

use acp_runtime::config;
use clap::Args;
use client::BenchError;
pub use options::{BenchOptions, Scenario};
use std::time::Duration;
pub use target::{Target, rss_bytes};

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
            Scenario::Ext => ext::ext(&target, &options).await,
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
