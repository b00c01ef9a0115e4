//! `bench --scenario metrics`: what operating the server costs
//! (research/contract.md, "Metrics" and "Traces"), as ratios within one run.
//!
//! 1. Three servers with `--store memory`, each in its own data dir: one
//!    with `--no-metrics` (the baseline), one as started by default
//!    (metrics on), one with metrics on and traces exported over OTLP/HTTP
//!    to a local receiver the bench runs (it reads and drops every
//!    request). [`ROUNDS`] rounds, interleaved (each starting with the
//!    next server), each measure on every server: `_mock/echo` round trips on one connection, and a prompt of M
//!    updates read over SSE. Round-trip latencies of all rounds are pooled;
//!    the stream's rate is the median of the rounds.
//! 2. `GET /metrics` on the metrics server, [`SCRAPES`] times with a handful
//!    of sessions, then again after [`SCRAPE_SESSIONS`](super::options::SCRAPE_SESSIONS) sessions exist
//!    (`session/new` from 16 connections): the scrape's cost must not grow
//!    with the inventory.

use super::client::{BenchError, HttpClient};
use super::options::SCRAPE_SESSIONS;
use super::report::ScenarioResult;
use super::scenarios::{echo_loop, open};
use super::{BenchOptions, Target};
use bytes::Bytes;
use http_body_util::BodyExt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

/// Interleaved rounds on the three servers.
const ROUNDS: usize = 5;
/// Scrapes timed at each inventory size.
const SCRAPES: usize = 200;

/// The servers compared, in the order each round visits them.
const SERVERS: [(&str, Server); 3] = [
    ("metrics off", Server::NoMetrics),
    ("metrics on", Server::Metrics),
    ("traces on", Server::Traces),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Server {
    NoMetrics,
    Metrics,
    Traces,
}

/// Runs the metrics scenario (see the module documentation). Uses its own
/// servers and temp dir, whatever `--url` says.
///
/// # Errors
/// A server that does not start or answer.
pub async fn metrics(options: &BenchOptions) -> Result<Vec<ScenarioResult>, BenchError> {
    let root = std::env::temp_dir().join(format!(
        "sandbox-agent-bench-metrics-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&root);
    let outcome = run(options, &root).await;
    let _ = std::fs::remove_dir_all(&root);
    outcome
}

async fn run(options: &BenchOptions, root: &Path) -> Result<Vec<ScenarioResult>, BenchError> {
    let receiver = Receiver::start().await?;
    let mut targets = Vec::new();
    for (label, server) in SERVERS {
        let dir = root.join(label.replace(' ', "-"));
        std::fs::create_dir_all(&dir)?;
        let dir = dir.to_string_lossy().into_owned();
        let mut extra = vec!["--data-dir", dir.as_str(), "--store", "memory"];
        if server == Server::NoMetrics {
            extra.push("--no-metrics");
        }
        let endpoint = format!("http://{}", receiver.address);
        let env: &[(&str, &str)] = match server {
            Server::Traces => &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ],
            _ => &[],
        };
        targets.push(Target::start_with_env(&options.program, &extra, env).await?);
    }

    let mut latencies = vec![Vec::new(); SERVERS.len()];
    let mut rates = vec![Vec::new(); SERVERS.len()];
    let mut seconds = vec![Duration::ZERO; SERVERS.len()];
    for round in 0..ROUNDS {
        // Each round starts with another server, so none is always first
        // (after a pause) or last.
        for offset in 0..targets.len() {
            let index = (round + offset) % targets.len();
            let target = &targets[index];
            let started = Instant::now();
            roundtrips(target, options, &mut latencies[index]).await?;
            seconds[index] += started.elapsed();
            rates[index].push(stream(target, options).await?);
        }
    }
    let mut results = Vec::new();
    for (index, (label, _)) in SERVERS.iter().enumerate() {
        let mut result = ScenarioResult::timed(
            &format!("metrics: roundtrip, {label}"),
            seconds[index],
            std::mem::take(&mut latencies[index]),
            0,
        );
        result.note(format!(
            "_mock/echo on one connection, {ROUNDS} interleaved rounds pooled"
        ));
        results.push(result);
    }
    for (index, (label, _)) in SERVERS.iter().enumerate() {
        let round_rates = &mut rates[index];
        round_rates.sort_by(f64::total_cmp);
        let median = round_rates[round_rates.len() / 2];
        let m = options.stream_updates;
        let mut result = ScenarioResult::events(
            &format!("metrics: stream (SSE), {label}"),
            Duration::from_secs_f64(m as f64 / median.max(1e-9)),
            m,
            0,
        );
        result.note(format!(
            "median of {ROUNDS} rounds; updates/s per round: {}",
            round_rates
                .iter()
                .map(|r| format!("{r:.0}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        results.push(result);
    }

    let metrics_target = &targets[1];
    results.push(scrapes(metrics_target, "metrics: scrape, few sessions").await?);
    super::inventory::seed(metrics_target, SCRAPE_SESSIONS).await?;
    let mut at_scale = scrapes(
        metrics_target,
        &format!("metrics: scrape, {SCRAPE_SESSIONS} sessions"),
    )
    .await?;
    at_scale.rss_after = metrics_target.rss();
    results.push(at_scale);
    // Stopping flushes the traces-on server's last spans (SIGTERM).
    for target in targets {
        target.stop().await;
    }
    let mut exported = ScenarioResult::events(
        "metrics: OTLP requests received",
        Duration::ZERO,
        receiver.requests(),
        0,
    );
    exported.events_per_sec = None;
    exported.note(format!(
        "POSTs to the local receiver from the traces-on server ({} bytes)",
        receiver.bytes()
    ));
    results.push(exported);
    Ok(results)
}

/// `_mock/echo` back to back on a fresh connection for `options.duration`.
async fn roundtrips(
    target: &Target,
    options: &BenchOptions,
    latencies: &mut Vec<Duration>,
) -> Result<(), BenchError> {
    let (mut client, connection) = open(target).await?;
    // Warm the connection and the agent before timing.
    let mut warm = Vec::new();
    echo_loop(
        &mut client,
        &connection,
        Instant::now() + Duration::from_millis(200),
        &mut warm,
    )
    .await?;
    let errors = echo_loop(
        &mut client,
        &connection,
        Instant::now() + options.duration,
        latencies,
    )
    .await?;
    if errors > 0 {
        return Err(BenchError::Unexpected(format!(
            "{errors} echo requests failed"
        )));
    }
    Ok(())
}

/// One prompt of `options.stream_updates` updates read over SSE: updates
/// per second.
async fn stream(target: &Target, options: &BenchOptions) -> Result<f64, BenchError> {
    let m = options.stream_updates;
    let (elapsed, events, status) = super::store::stream_once(target, options).await?;
    if status != http::StatusCode::OK || events < m {
        return Err(BenchError::Unexpected(format!(
            "stream: {status}, {events} of {m} updates"
        )));
    }
    Ok(events as f64 / elapsed.as_secs_f64().max(1e-9))
}

/// [`SCRAPES`] `GET /metrics` on one connection.
async fn scrapes(target: &Target, name: &str) -> Result<ScenarioResult, BenchError> {
    let mut client = HttpClient::connect(target.address, target.token.as_deref()).await?;
    let mut latencies = Vec::with_capacity(SCRAPES);
    let mut size = 0;
    let started = Instant::now();
    for _ in 0..SCRAPES {
        let sent = Instant::now();
        let (status, body) = client.get("/metrics").await?;
        latencies.push(sent.elapsed());
        if status != http::StatusCode::OK {
            return Err(BenchError::Unexpected(format!("GET /metrics: {status}")));
        }
        size = body.len();
    }
    let mut result = ScenarioResult::timed(name, started.elapsed(), latencies, 0);
    result.note(format!("GET /metrics on one connection, {size} bytes"));
    Ok(result)
}

/// An OTLP/HTTP receiver that reads every request and answers 200 with an
/// empty body: the exporter's peer, so the traces-on server pays for
/// encoding and sending, and nothing more.
struct Receiver {
    address: SocketAddr,
    requests: std::sync::Arc<std::sync::atomic::AtomicU64>,
    bytes: std::sync::Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Receiver {
    async fn start() -> Result<Self, BenchError> {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicU64, Ordering};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let requests = Arc::new(AtomicU64::new(0));
        let bytes = Arc::new(AtomicU64::new(0));
        let (counted, sized) = (requests.clone(), bytes.clone());
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (counted, sized) = (counted.clone(), sized.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(
                        move |request: http::Request<hyper::body::Incoming>| {
                            let (counted, sized) = (counted.clone(), sized.clone());
                            async move {
                                let body = request.into_body().collect().await?.to_bytes();
                                counted.fetch_add(1, Ordering::Relaxed);
                                sized.fetch_add(body.len() as u64, Ordering::Relaxed);
                                Ok::<_, hyper::Error>(http::Response::new(http_body_util::Empty::<
                                    Bytes,
                                >::new(
                                )))
                            }
                        },
                    );
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self {
            address,
            requests,
            bytes,
            task,
        })
    }

    fn requests(&self) -> u64 {
        self.requests.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn bytes(&self) -> u64 {
        self.bytes.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}
