//! `bench --scenario ext`: what an extension method costs a round trip
//! (research/contract.md, "Extension methods and control plane"), against
//! the same service without the extension layer, in the same run.
//!
//! One connection and ten sessions in a directory of the run's own (so the
//! listing is ten entries whatever else the server holds), then, each for
//! `--duration`, back to back on that connection:
//!
//! 1. `_sandboxagent/session/list {cwd}`: the extension method;
//! 2. `session/list {cwd}`: the same service (`Runtime::list_sessions`),
//!    answered without the extension layer: its p50 is the floor of 1;
//! 3. `_sandboxagent/session/get {sessionId}`: an extension method that
//!    touches neither the store nor the agent;
//! 4. `session/prompt "hello"` on one of the sessions: a plain prompt turn
//!    of the mock agent (one update, `end_turn`).
//!
//! To compare two builds run each one's server and point this scenario at
//! them with `--url` (research/benchmarks.md, "The extension table").

use super::client::{BenchError, HttpClient, session_id_of};
use super::report::ScenarioResult;
use super::scenarios::{AGENT, open, prompt};
use super::{BenchOptions, Target};
use bytes::Bytes;
use std::time::{Duration, Instant};

/// Sessions in the listing.
const SESSIONS: usize = 10;
/// Requests before each measurement, to warm caches and allocators.
const WARMUP: u64 = 200;

/// Runs the scenario. Results: `ext: _sandboxagent/session/list`,
/// `ext: session/list`, `ext: _sandboxagent/session/get`,
/// `ext: session/prompt`; `errors` counts answers that were not a result.
///
/// # Errors
/// A server that cannot be reached, or a session that cannot be made.
pub async fn ext(
    target: &Target,
    options: &BenchOptions,
) -> Result<Vec<ScenarioResult>, BenchError> {
    let cwd = std::env::temp_dir().join(format!("sandbox-agent-bench-ext-{}", std::process::id()));
    std::fs::create_dir_all(&cwd)?;
    let cwd = cwd.to_string_lossy().into_owned();
    let outcome = measure(target, options, &cwd).await;
    let _ = std::fs::remove_dir_all(&cwd);
    outcome
}

async fn measure(
    target: &Target,
    options: &BenchOptions,
    cwd: &str,
) -> Result<Vec<ScenarioResult>, BenchError> {
    let (mut client, connection) = open(target).await?;
    let mut sessions = Vec::with_capacity(SESSIONS);
    for _ in 0..SESSIONS {
        let body = serde_json::json!({
            "jsonrpc": "2.0", "id": 0, "method": "session/new",
            "params": {"cwd": cwd, "mcpServers": [],
                       "_meta": {"sandboxagent.dev": {"agent": AGENT}}}
        });
        let (_, _, body) = client
            .post(Some(&connection), Bytes::from(body.to_string()))
            .await?;
        sessions.push(session_id_of(&body)?);
    }
    let list = |method: &str, id: u64| {
        serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": {"cwd": cwd}})
            .to_string()
    };
    let session = &sessions[0];
    let get = |id: u64| {
        serde_json::json!({
            "jsonrpc": "2.0", "id": id, "method": "_sandboxagent/session/get",
            "params": {"sessionId": session}
        })
        .to_string()
    };
    // The listing holds the ten sessions: the two methods answer the same.
    let (_, _, page) = client
        .post(Some(&connection), Bytes::from(list("session/list", 0)))
        .await?;
    let listed = serde_json::from_slice::<serde_json::Value>(&page)
        .ok()
        .and_then(|page| page["result"]["sessions"].as_array().map(Vec::len));
    if listed != Some(SESSIONS) {
        return Err(BenchError::Unexpected(format!(
            "session/list {{cwd}} listed {listed:?} sessions, not {SESSIONS}"
        )));
    }

    let mut ext_list = timed(
        &mut client,
        &connection,
        options.duration,
        "ext: _sandboxagent/session/list",
        |id| list("_sandboxagent/session/list", id),
    )
    .await?;
    ext_list.note(format!(
        "{SESSIONS} sessions listed (params {{cwd}}), one connection, back to back"
    ));
    let mut plain_list = timed(
        &mut client,
        &connection,
        options.duration,
        "ext: session/list",
        |id| list("session/list", id),
    )
    .await?;
    plain_list.note("the same listing without the extension layer".to_owned());
    let ext_get = timed(
        &mut client,
        &connection,
        options.duration,
        "ext: _sandboxagent/session/get",
        get,
    )
    .await?;
    let mut turn = timed(
        &mut client,
        &connection,
        options.duration,
        "ext: session/prompt",
        |id| prompt(&id.to_string(), session, "hello"),
    )
    .await?;
    turn.note("a plain prompt turn of the mock agent: one update, end_turn".to_owned());
    Ok(vec![ext_list, plain_list, ext_get, turn])
}

/// [`WARMUP`] requests made by `request`, then as many as fit in
/// `duration`, one at a time on `connection`: their latencies as `name`.
async fn timed(
    client: &mut HttpClient,
    connection: &str,
    duration: Duration,
    name: &str,
    request: impl Fn(u64) -> String,
) -> Result<ScenarioResult, BenchError> {
    for id in 0..WARMUP {
        client
            .post(Some(connection), Bytes::from(request(id)))
            .await?;
    }
    let mut latencies = Vec::new();
    let mut errors = 0;
    let started = Instant::now();
    let until = started + duration;
    let mut id = WARMUP;
    while Instant::now() < until {
        id += 1;
        let body = Bytes::from(request(id));
        let sent = Instant::now();
        let (status, _, answer) = client.post(Some(connection), body).await?;
        latencies.push(sent.elapsed());
        if status != http::StatusCode::OK || memchr::memmem::find(&answer, b"\"result\"").is_none()
        {
            errors += 1;
        }
    }
    Ok(ScenarioResult::timed(
        name,
        started.elapsed(),
        latencies,
        errors,
    ))
}
