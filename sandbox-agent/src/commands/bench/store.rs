//! `bench --scenario store`: what the durable session store costs
//! (research/contract.md, "Durable sessions"), as ratios within one run.
//!
//! 1. The same two workloads against a server with `--store memory` and one
//!    with the default SQLite store, each in a private data dir: an SSE
//!    stream of M updates (every update is an event-log row) and 16
//!    connections each prompting its own session back to back (requests,
//!    updates and answers are all rows), once the store has written the
//!    stream's backlog.
//! 2. Seeding through the real server: 10,000 sessions with 100 updates
//!    each (about a million events) plus one long session, then SIGTERM.
//! 3. Start-up on that store: process start to the first `/v2/health` 200
//!    (the inventory is read before the port is bound).
//! 4. `GET /v2/sessions/{id}/events?limit=1000` on the restarted server: the
//!    long session's events come from the store only.

use super::client::{BenchError, EventCounter, HttpClient, count_events};
use super::report::ScenarioResult;
use super::scenarios::{AGENT, open, prompt, start_to_healthy};
use super::{BenchOptions, Target};
use bytes::Bytes;
use std::path::Path;
use std::time::{Duration, Instant};

/// Sessions the seeded store holds.
const SEED_SESSIONS: usize = 10_000;
/// Updates each seeded session's prompt emits.
const SEED_UPDATES: usize = 100;
/// Updates of the long session the page reads come from.
const LONG_UPDATES: usize = 5_000;
/// Workers (connections) that seed in parallel.
const SEED_WORKERS: usize = 16;
/// Connections of the prompt round-trip workload.
const PROMPT_CONNECTIONS: usize = 16;
/// Page reads measured.
const PAGE_READS: usize = 200;
/// Start-ups measured on the seeded store.
const STARTUP_RUNS: usize = 3;

/// Runs the store scenario (see the module documentation). Uses its own
/// servers and temp dirs, whatever `--url` says.
///
/// # Errors
/// A server that does not start or answer.
pub async fn store(options: &BenchOptions) -> Result<Vec<ScenarioResult>, BenchError> {
    let root =
        std::env::temp_dir().join(format!("sandbox-agent-bench-store-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let outcome = run(options, &root).await;
    let _ = std::fs::remove_dir_all(&root);
    outcome
}

async fn run(options: &BenchOptions, root: &Path) -> Result<Vec<ScenarioResult>, BenchError> {
    let mut results = Vec::new();
    let memory_dir = root.join("memory");
    let sqlite_dir = root.join("sqlite");
    for (label, dir, store) in [
        ("memory", &memory_dir, "memory".to_owned()),
        (
            "sqlite",
            &sqlite_dir,
            format!("sqlite:{}", sqlite_dir.join("sessions.db").display()),
        ),
    ] {
        std::fs::create_dir_all(dir)?;
        let target = start(options, dir, &store).await?;
        results.push(stream(&target, options, label).await?);
        // The prompts measure their own writes: the burst's backlog is
        // written first (each answer waits for every earlier commit).
        super::inventory::caught_up(&target).await?;
        results.push(prompts(&target, options, label).await?);
        target.stop().await;
    }

    // Seed the SQLite store through a real server, then restart on it.
    let seed_dir = root.join("seeded");
    std::fs::create_dir_all(&seed_dir)?;
    let store = format!("sqlite:{}", seed_dir.join("sessions.db").display());
    let target = start(options, &seed_dir, &store).await?;
    let started = Instant::now();
    let long_session = seed(&target).await?;
    let events = settled_events(&target).await?;
    let seeding = started.elapsed();
    target.stop().await;
    let mut seeded =
        ScenarioResult::events("store: seeding through the server", seeding, events, 0);
    seeded.note(format!(
        "{SEED_SESSIONS} sessions x {SEED_UPDATES} updates + one of {LONG_UPDATES}, {SEED_WORKERS} connections, until the store caught up"
    ));
    results.push(seeded);
    results.push(startup(options, &seed_dir, &store, events).await?);

    let target = start(options, &seed_dir, &store).await?;
    results.push(pages(&target, &long_session).await?);
    target.stop().await;
    Ok(results)
}

async fn start(options: &BenchOptions, dir: &Path, store: &str) -> Result<Target, BenchError> {
    let dir = dir.to_string_lossy().into_owned();
    Target::start(
        &options.program,
        &[
            "--data-dir",
            &dir,
            "--store",
            store,
            "--ended-sessions",
            "100000",
        ],
    )
    .await
}

/// One prompt of M updates read over SSE: updates per second.
async fn stream(
    target: &Target,
    options: &BenchOptions,
    label: &str,
) -> Result<ScenarioResult, BenchError> {
    let (elapsed, events, status) = stream_once(target, options).await?;
    let mut result = ScenarioResult::events(
        &format!("store: stream SSE ({label})"),
        elapsed,
        events,
        u64::from(status != http::StatusCode::OK),
    );
    result.note(format!(
        "{} updates of {} bytes",
        options.stream_updates, options.stream_bytes
    ));
    Ok(result)
}

/// A new session's prompt of `options.stream_updates` updates, read over
/// SSE: the time from the POST to the last update, the updates read and the
/// POST's status.
pub(super) async fn stream_once(
    target: &Target,
    options: &BenchOptions,
) -> Result<(Duration, u64, http::StatusCode), BenchError> {
    let m = options.stream_updates;
    let text = format!("!emit {m} {}", options.stream_bytes);
    let (mut client, connection) = open(target).await?;
    let session = client.new_session(&connection, AGENT).await?;
    let mut sse = HttpClient::connect(target.address, target.token.as_deref()).await?;
    let mut body = sse.stream(&connection, None).await?;
    let reader = tokio::spawn(async move {
        let mut counter = EventCounter::default();
        let result = count_events(&mut body, &mut counter, m).await;
        (result, Instant::now(), counter.events)
    });
    let started = Instant::now();
    let (status, _, _) = client
        .post(
            Some(&connection),
            Bytes::from(prompt("emit", &session, &text)),
        )
        .await?;
    let (outcome, finished, events) = reader
        .await
        .map_err(|e| BenchError::Unexpected(format!("reader panicked: {e}")))?;
    outcome?;
    Ok((finished.duration_since(started), events, status))
}

/// 16 connections, each prompting its own session back to back.
async fn prompts(
    target: &Target,
    options: &BenchOptions,
    label: &str,
) -> Result<ScenarioResult, BenchError> {
    let mut workers = Vec::new();
    for _ in 0..PROMPT_CONNECTIONS {
        let (mut client, connection) = open(target).await?;
        let session = client.new_session(&connection, AGENT).await?;
        workers.push((client, connection, session));
    }
    let started = Instant::now();
    let until = started + options.duration;
    let tasks: Vec<_> = workers
        .into_iter()
        .map(|(mut client, connection, session)| {
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut errors = 0_u64;
                let mut id = 0_u64;
                while Instant::now() < until {
                    id += 1;
                    let body = prompt(&format!("p{id}"), &session, "hello");
                    let sent = Instant::now();
                    let (status, _, answer) =
                        client.post(Some(&connection), Bytes::from(body)).await?;
                    latencies.push(sent.elapsed());
                    if status != http::StatusCode::OK
                        || memchr::memmem::find(&answer, b"end_turn").is_none()
                    {
                        errors += 1;
                    }
                }
                Ok::<_, BenchError>((latencies, errors))
            })
        })
        .collect();
    let mut latencies = Vec::new();
    let mut errors = 0;
    for task in tasks {
        let (mut more, failed) = task
            .await
            .map_err(|e| BenchError::Unexpected(format!("worker panicked: {e}")))??;
        latencies.append(&mut more);
        errors += failed;
    }
    let mut result = ScenarioResult::timed(
        &format!("store: prompts, {PROMPT_CONNECTIONS} connections ({label})"),
        started.elapsed(),
        latencies,
        errors,
    );
    result.note("session/prompt \"hello\" (request, 3 updates, answer: 5 events)".to_owned());
    Ok(result)
}

/// Creates the seeded sessions; returns the long session's id.
async fn seed(target: &Target) -> Result<String, BenchError> {
    let (mut client, connection) = open(target).await?;
    let long = client.new_session(&connection, AGENT).await?;
    let (status, _, _) = client
        .post(
            Some(&connection),
            Bytes::from(prompt("long", &long, &format!("!emit {LONG_UPDATES} 64"))),
        )
        .await?;
    if status != http::StatusCode::OK {
        return Err(BenchError::Unexpected(format!(
            "long prompt answered {status}"
        )));
    }
    let per_worker = SEED_SESSIONS / SEED_WORKERS;
    let mut tasks = Vec::new();
    for _ in 0..SEED_WORKERS {
        let (mut client, connection) = open(target).await?;
        tasks.push(tokio::spawn(async move {
            let text = format!("!emit {SEED_UPDATES} 64");
            for n in 0..per_worker {
                let session = client.new_session(&connection, AGENT).await?;
                let (status, _, _) = client
                    .post(
                        Some(&connection),
                        Bytes::from(prompt(&format!("s{n}"), &session, &text)),
                    )
                    .await?;
                if status != http::StatusCode::OK {
                    return Err(BenchError::Unexpected(format!(
                        "seed prompt answered {status}"
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
    Ok(long)
}

/// Waits for the store to hold everything; returns the events recorded
/// (the sum of every session's `eventCount`).
async fn settled_events(target: &Target) -> Result<u64, BenchError> {
    super::inventory::caught_up(target).await?;
    let mut client = HttpClient::connect(target.address, target.token.as_deref()).await?;
    // Every page of the inventory (research/contract.md, "Control plane").
    let mut events = 0;
    let mut path = "/v2/sessions?limit=1000".to_owned();
    loop {
        let (_, body) = client.get(&path).await?;
        let listing: serde_json::Value = serde_json::from_slice(&body)
            .map_err(|e| BenchError::Unexpected(format!("GET {path}: {e}")))?;
        events += listing["sessions"].as_array().map_or(0, |sessions| {
            sessions
                .iter()
                .filter_map(|s| s["_meta"]["sandboxagent.dev"]["eventCount"].as_u64())
                .sum::<u64>()
        });
        let Some(next) = listing["nextCursor"].as_str() else {
            return Ok(events);
        };
        path = format!(
            "/v2/sessions?limit=1000&cursor={}",
            percent_encoding::utf8_percent_encode(next, percent_encoding::NON_ALPHANUMERIC)
        );
    }
}

/// Process start to the first `/v2/health` 200 on the seeded store.
async fn startup(
    options: &BenchOptions,
    dir: &Path,
    store: &str,
    events: u64,
) -> Result<ScenarioResult, BenchError> {
    let dir = dir.to_string_lossy();
    let extra = [
        "--data-dir",
        &dir,
        "--store",
        store,
        "--ended-sessions",
        "100000",
    ];
    let mut latencies = Vec::new();
    let mut rss = None;
    for _ in 0..STARTUP_RUNS {
        let (latency, idle) = start_to_healthy(options, &extra, Duration::from_secs(60)).await?;
        latencies.push(latency);
        rss = idle;
    }
    let mut result = ScenarioResult::timed(
        "store: startup, seeded",
        latencies.iter().sum(),
        latencies,
        0,
    );
    result.rss_after = rss;
    result.note(format!(
        "{} sessions, {events} events in SQLite; process start to /v2/health 200; RSS: idle, 200 ms after, every session restored (dormant)",
        SEED_SESSIONS + 1
    ));
    Ok(result)
}

/// Pages of 1,000 events of the long session, read from the store.
async fn pages(target: &Target, session: &str) -> Result<ScenarioResult, BenchError> {
    let mut client = HttpClient::connect(target.address, target.token.as_deref()).await?;
    let encoded: String = session
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect();
    let max_offset = LONG_UPDATES.saturating_sub(1000) as u64;
    let mut latencies = Vec::with_capacity(PAGE_READS);
    let mut errors = 0;
    let started = Instant::now();
    for read in 0..PAGE_READS as u64 {
        // Spread over the session, in no order a cache would like.
        let offset = read * 7919 % (max_offset + 1);
        let path =
            format!("/v2/sessions/{encoded}/events?agent={AGENT}&offset={offset}&limit=1000");
        let sent = Instant::now();
        let (status, body) = client.get(&path).await?;
        latencies.push(sent.elapsed());
        let full = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|page| page["events"].as_array().map(Vec::len))
            == Some(1000);
        errors += u64::from(status != http::StatusCode::OK || !full);
    }
    let mut result = ScenarioResult::timed(
        "store: events page of 1000 (from the store)",
        started.elapsed(),
        latencies,
        errors,
    );
    result.note("random offsets in a restored session: every event comes from SQLite".to_owned());
    Ok(result)
}
