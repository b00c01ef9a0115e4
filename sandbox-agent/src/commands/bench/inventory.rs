//! `bench --scenario sessions`: the inventory at scale (research/contract.md,
//! "Control plane"), the same measurements at 1,000 and at 100,000 stored
//! sessions, as ratios within one run.
//!
//! 1. Seed a SQLite store through a real server (`session/new` from 16
//!    connections) to 1,000 sessions; SIGTERM.
//! 2. Start-up on it (process start to `/v2/health` 200), then on a server
//!    started on it: pages of 100 (`GET /v2/sessions?limit=100`, the first
//!    page and pages deep in the inventory by cursor), then RSS after a
//!    walk over the whole inventory.
//! 3. Seed on to 100,000 and measure again.
//! 4. Sessions ended in the running server (a fleet's runtime that has
//!    served many): on a fresh store, `session/new` then
//!    `_sandboxagent/session/terminate` from 16 connections to 20,000
//!    sessions; the first page of 100 right after the last terminate,
//!    after [`IDLE_SECONDS`] idle, and on a server restarted on the same
//!    store; then on to 100,000 in that server and the same again.

use super::client::{BenchError, HttpClient};
use super::report::ScenarioResult;
use super::scenarios::{open, start_to_healthy};
use super::{BenchOptions, Target};
use std::path::Path;
use std::time::{Duration, Instant};

/// Stored sessions of the small and the large measurement.
const SIZES: [usize; 2] = [1_000, 100_000];
/// Workers (connections) that seed in parallel.
const SEED_WORKERS: usize = 16;
/// Page reads measured per size.
const PAGE_READS: usize = 200;
/// Entries per page read.
const PAGE: usize = 100;
/// Start-ups measured per size.
const STARTUP_RUNS: usize = 3;
/// Sessions created and terminated in the running server (step 4).
const ENDED_SIZES: [usize; 2] = [20_000, 100_000];
/// How long the server is left idle before the second measurement of step 4.
const IDLE_SECONDS: u64 = 8;

/// Runs the sessions scenario (see the module documentation). Uses its own
/// servers and temp dir, whatever `--url` says.
///
/// # Errors
/// A server that does not start or answer.
pub async fn sessions(options: &BenchOptions) -> Result<Vec<ScenarioResult>, BenchError> {
    let root = std::env::temp_dir().join(format!(
        "sandbox-agent-bench-sessions-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root)?;
    let outcome = run(options, &root).await;
    let _ = std::fs::remove_dir_all(&root);
    outcome
}

async fn run(options: &BenchOptions, root: &Path) -> Result<Vec<ScenarioResult>, BenchError> {
    let store = format!("sqlite:{}", root.join("sessions.db").display());
    let dir = root.to_string_lossy().into_owned();
    let extra = [
        "--data-dir",
        &dir,
        "--store",
        &store,
        "--ended-sessions",
        "1000000",
    ];
    let mut results = Vec::new();
    let mut seeded = 0;
    for size in SIZES {
        let target = Target::start(&options.program, &extra).await?;
        let started = Instant::now();
        seed(&target, size - seeded).await?;
        caught_up(&target).await?;
        let mut seeding = ScenarioResult::timed(
            &format!("sessions: seeding to {size}"),
            started.elapsed(),
            Vec::new(),
            0,
        );
        seeding.count = (size - seeded) as u64;
        seeding.note(format!(
            "session/new from {SEED_WORKERS} connections, until the store caught up"
        ));
        results.push(seeding);
        seeded = size;
        target.stop().await;

        let mut latencies = Vec::new();
        let mut idle = None;
        for _ in 0..STARTUP_RUNS {
            let (latency, rss) = start_to_healthy(options, &extra, Duration::from_secs(60)).await?;
            latencies.push(latency);
            idle = rss;
        }
        let mut startup = ScenarioResult::timed(
            &format!("sessions: startup, {size} stored"),
            latencies.iter().sum(),
            latencies,
            0,
        );
        startup.rss_after = idle;
        startup.note("process start to /v2/health 200; RSS 200 ms after".to_owned());
        results.push(startup);

        let target = Target::start(&options.program, &extra).await?;
        results.push(pages(&target, size).await?);
        target.stop().await;
    }
    ended_in_server(options, &root.join("ended"), &mut results).await?;
    Ok(results)
}

/// Step 4 (see the module documentation): sessions created and
/// terminated in the running server, its first page right after, idle,
/// and after a restart.
async fn ended_in_server(
    options: &BenchOptions,
    root: &Path,
    results: &mut Vec<ScenarioResult>,
) -> Result<(), BenchError> {
    std::fs::create_dir_all(root)?;
    let store = format!("sqlite:{}", root.join("sessions.db").display());
    let dir = root.to_string_lossy().into_owned();
    let extra = [
        "--data-dir",
        &dir,
        "--store",
        &store,
        "--ended-sessions",
        "1000000",
    ];
    let mut target = Target::start(&options.program, &extra).await?;
    let mut ended = 0;
    for size in ENDED_SIZES {
        let started = Instant::now();
        seed_ended(&target, size - ended).await?;
        ended = size;
        let mut seeding = ScenarioResult::timed(
            &format!("sessions: created and terminated to {size}"),
            started.elapsed(),
            Vec::new(),
            0,
        );
        seeding.count = size as u64;
        seeding.note(format!(
            "session/new then _sandboxagent/session/terminate from {SEED_WORKERS} connections"
        ));
        results.push(seeding);
        results.push(
            first_pages(
                &target,
                &format!("{size} ended, right after the last terminate"),
            )
            .await?,
        );
        tokio::time::sleep(Duration::from_secs(IDLE_SECONDS)).await;
        results.push(
            first_pages(
                &target,
                &format!("{size} ended, after {IDLE_SECONDS} s idle"),
            )
            .await?,
        );
        caught_up(&target).await?;
        target.stop().await;
        target = Target::start(&options.program, &extra).await?;
        results.push(first_pages(&target, &format!("{size} ended, after a restart")).await?);
    }
    target.stop().await;
    Ok(())
}

/// `count` sessions each made with `session/new` and ended with
/// `_sandboxagent/session/terminate` on the same connection, from
/// [`SEED_WORKERS`] connections.
async fn seed_ended(target: &Target, count: usize) -> Result<(), BenchError> {
    let mut tasks = Vec::new();
    for worker in 0..SEED_WORKERS {
        let (mut client, connection) = open(target).await?;
        let share = count / SEED_WORKERS + usize::from(worker < count % SEED_WORKERS);
        tasks.push(tokio::spawn(async move {
            for _ in 0..share {
                let session = client
                    .new_session(&connection, super::scenarios::AGENT)
                    .await?;
                let terminate = serde_json::json!({
                    "jsonrpc": "2.0", "id": 1, "method": "_sandboxagent/session/terminate",
                    "params": {"sessionId": session}
                });
                let (status, _, body) = client
                    .post(Some(&connection), terminate.to_string().into())
                    .await?;
                let answer: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                if status != http::StatusCode::OK || answer["result"]["alreadyEnded"] != false {
                    return Err(BenchError::Unexpected(format!(
                        "terminate answered {status}: {}",
                        String::from_utf8_lossy(&body)
                    )));
                }
            }
            Ok::<_, BenchError>(())
        }));
    }
    for task in tasks {
        task.await
            .map_err(|e| BenchError::Unexpected(format!("seeder panicked: {e}")))??;
    }
    Ok(())
}

/// [`PAGE_READS`] reads of the first page (`GET /v2/sessions?limit=100`),
/// each checked to hold a full page of ended sessions.
async fn first_pages(target: &Target, what: &str) -> Result<ScenarioResult, BenchError> {
    let mut client = HttpClient::connect(target.address, target.token.as_deref()).await?;
    let path = format!("/v2/sessions?limit={PAGE}");
    let mut latencies = Vec::with_capacity(PAGE_READS);
    let started = Instant::now();
    for _ in 0..PAGE_READS {
        let sent = Instant::now();
        let (status, body) = client.get(&path).await?;
        latencies.push(sent.elapsed());
        let page: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        let sessions = page["sessions"].as_array().map_or(&[][..], Vec::as_slice);
        if status != http::StatusCode::OK
            || sessions.len() != PAGE
            || sessions
                .iter()
                .any(|s| s["_meta"]["sandboxagent.dev"]["ended"] != true)
        {
            return Err(BenchError::Unexpected(format!(
                "GET {path}: {status}, {} sessions, not all ended",
                sessions.len()
            )));
        }
    }
    let mut result = ScenarioResult::timed(
        &format!("sessions: first page of {PAGE}, {what}"),
        started.elapsed(),
        latencies,
        0,
    );
    result.rss_after = target.pid.and_then(super::rss_bytes);
    result.note(format!(
        "GET {path}, {PAGE_READS} times back to back; RSS after"
    ));
    Ok(result)
}

/// `count` sessions through `session/new`, from [`SEED_WORKERS`] connections.
pub(super) async fn seed(target: &Target, count: usize) -> Result<(), BenchError> {
    let mut tasks = Vec::new();
    for worker in 0..SEED_WORKERS {
        let (mut client, connection) = open(target).await?;
        let share = count / SEED_WORKERS + usize::from(worker < count % SEED_WORKERS);
        tasks.push(tokio::spawn(async move {
            for _ in 0..share {
                client
                    .new_session(&connection, super::scenarios::AGENT)
                    .await?;
            }
            Ok::<_, BenchError>(())
        }));
    }
    for task in tasks {
        task.await
            .map_err(|e| BenchError::Unexpected(format!("seeder panicked: {e}")))??;
    }
    Ok(())
}

/// Waits until the store holds every write (`storeWaiting` 0).
pub(super) async fn caught_up(target: &Target) -> Result<(), BenchError> {
    let mut client = HttpClient::connect(target.address, target.token.as_deref()).await?;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let (_, body) = client.get("/v2/health").await?;
        let health: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        if health["storeWaiting"] == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(BenchError::Unexpected(format!(
                "store never caught up: {health}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Page reads of [`PAGE`] entries: the first page and pages reached by
/// cursor all through the inventory, then the server's RSS.
async fn pages(target: &Target, size: usize) -> Result<ScenarioResult, BenchError> {
    let mut client = HttpClient::connect(target.address, target.token.as_deref()).await?;
    // One walk over everything: cursors spread through the inventory, and
    // whatever a listing leaves in memory is there when RSS is read.
    let mut cursors = vec![None];
    let mut cursor: Option<String> = None;
    let mut listed = 0;
    loop {
        let page = read_page(&mut client, cursor.as_deref(), 1000).await?;
        listed += page.0;
        match page.1 {
            Some(next) => {
                cursor = Some(next.clone());
                cursors.push(Some(next));
            }
            None => break,
        }
    }
    if listed != size {
        return Err(BenchError::Unexpected(format!(
            "listed {listed} sessions, {size} stored"
        )));
    }
    let mut latencies = Vec::with_capacity(PAGE_READS);
    let started = Instant::now();
    for n in 0..PAGE_READS {
        let at = &cursors[n % cursors.len()];
        let sent = Instant::now();
        let (entries, _) = read_page(&mut client, at.as_deref(), PAGE).await?;
        latencies.push(sent.elapsed());
        if entries == 0 {
            return Err(BenchError::Unexpected("an empty page".to_owned()));
        }
    }
    let mut result = ScenarioResult::timed(
        &format!("sessions: page of {PAGE}, {size} stored"),
        started.elapsed(),
        latencies,
        0,
    );
    result.rss_after = target.pid.and_then(super::rss_bytes);
    result.note(format!(
        "GET /v2/sessions?limit={PAGE}, the first page and pages by cursor spread over the inventory; RSS after a walk over all {size}"
    ));
    Ok(result)
}

/// One `GET /v2/sessions` page: entries and `nextCursor`.
async fn read_page(
    client: &mut HttpClient,
    cursor: Option<&str>,
    limit: usize,
) -> Result<(usize, Option<String>), BenchError> {
    let path = match cursor {
        Some(cursor) => format!(
            "/v2/sessions?limit={limit}&cursor={}",
            percent_encoding::utf8_percent_encode(cursor, percent_encoding::NON_ALPHANUMERIC)
        ),
        None => format!("/v2/sessions?limit={limit}"),
    };
    let (status, body) = client.get(&path).await?;
    if status != http::StatusCode::OK {
        return Err(BenchError::Unexpected(format!("GET {path}: {status}")));
    }
    let page: serde_json::Value = serde_json::from_slice(&body)
        .map_err(|e| BenchError::Unexpected(format!("GET {path}: {e}")))?;
    Ok((
        page["sessions"].as_array().map_or(0, Vec::len),
        page["nextCursor"].as_str().map(str::to_owned),
    ))
}
