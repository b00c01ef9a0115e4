//! One function per benchmark scenario. Each returns named results; the
//! report compares them.

use super::client::{
    BenchError, EventCounter, HttpClient, LineAgent, RelayedAgent, StdioAgent, count_events,
    is_response,
};
use super::report::ScenarioResult;
use super::{BenchOptions, Target};
use bytes::Bytes;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite};

pub(super) const AGENT: &str = "mock";
/// Requests before measuring, to warm caches, allocators and the agent.
const WARMUP: usize = 200;
/// Requests in flight in the pipelined stdio run (the same as the
/// concurrent HTTP run's default connections, so the two compare).
const PIPELINE_DEPTH: usize = 16;

fn echo(id: u64) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"_mock/echo","params":{{"n":{id}}}}}"#)
}

pub(super) fn prompt(id: &str, session: &str, text: &str) -> String {
    serde_json::json!({
        "jsonrpc": "2.0", "id": id, "method": "session/prompt",
        "params": {"sessionId": session, "prompt": [{"type": "text", "text": text}]}
    })
    .to_string()
}

pub(super) async fn open(target: &Target) -> Result<(HttpClient, String), BenchError> {
    let mut client = HttpClient::connect(target.address, target.token.as_deref()).await?;
    let connection = client.initialize(AGENT).await?;
    Ok((client, connection))
}

/// Sends echo requests back to back on one HTTP connection until `until`.
pub(super) async fn echo_loop(
    client: &mut HttpClient,
    connection: &str,
    until: Instant,
    latencies: &mut Vec<Duration>,
) -> Result<u64, BenchError> {
    let mut errors = 0;
    let mut id = 0_u64;
    while Instant::now() < until {
        id += 1;
        let started = Instant::now();
        let (status, _, body) = client.post(Some(connection), Bytes::from(echo(id))).await?;
        latencies.push(started.elapsed());
        if status != http::StatusCode::OK || memchr::memmem::find(&body, b"\"result\"").is_none() {
            errors += 1;
        }
    }
    Ok(errors)
}

/// `roundtrip`: `_mock/echo` through `/v2/rpc`, sequential on 1 connection,
/// then concurrently on `options.connections` connections.
///
/// # Errors
/// Transport failures.
pub async fn roundtrip(
    target: &Target,
    options: &BenchOptions,
) -> Result<Vec<ScenarioResult>, BenchError> {
    let (mut client, connection) = open(target).await?;
    let mut warm = Vec::with_capacity(WARMUP);
    for id in 0..WARMUP as u64 {
        let started = Instant::now();
        client
            .post(Some(&connection), Bytes::from(echo(id)))
            .await?;
        warm.push(started.elapsed());
    }
    let mut latencies = Vec::new();
    let started = Instant::now();
    let errors = echo_loop(
        &mut client,
        &connection,
        started + options.duration,
        &mut latencies,
    )
    .await?;
    let single = ScenarioResult::timed(
        "roundtrip (1 connection)",
        started.elapsed(),
        latencies,
        errors,
    );

    // The HTTP floor: the same connection, a route that touches no agent.
    let mut latencies = Vec::new();
    let started = Instant::now();
    let until = started + options.duration / 2;
    let mut errors = 0;
    while Instant::now() < until {
        let sent = Instant::now();
        errors += u64::from(client.health().await? != http::StatusCode::OK);
        latencies.push(sent.elapsed());
    }
    let mut floor = ScenarioResult::timed(
        "http floor (/v2/health)",
        started.elapsed(),
        latencies,
        errors,
    );
    floor.note(
        "GET /v2/health on the same connection: HTTP and loopback TCP only, no agent".to_owned(),
    );

    let mut clients = Vec::new();
    for _ in 0..options.connections {
        clients.push(open(target).await?);
    }
    let started = Instant::now();
    let until = started + options.duration;
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|(mut client, connection)| {
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let errors = echo_loop(&mut client, &connection, until, &mut latencies).await;
                (latencies, errors)
            })
        })
        .collect();
    let mut latencies = Vec::new();
    let mut errors = 0;
    for task in tasks {
        let (mut part, part_errors) = task
            .await
            .map_err(|e| BenchError::Unexpected(format!("worker panicked: {e}")))?;
        latencies.append(&mut part);
        errors += part_errors.unwrap_or(1);
    }
    let name = format!("roundtrip ({} connections)", options.connections);
    let concurrent = ScenarioResult::timed(&name, started.elapsed(), latencies, errors);
    Ok(vec![single, floor, concurrent])
}

/// `stdio`: the same echo requests straight to a mock agent process, one at
/// a time and then pipelined 16 deep.
///
/// # Errors
/// Agent failures.
pub async fn stdio(options: &BenchOptions) -> Result<Vec<ScenarioResult>, BenchError> {
    let (agent, _) = StdioAgent::start(&options.program).await?;
    echo_lines(agent, "stdio", options).await
}

/// `relay`: the same echo requests over TCP through `socat` to a mock
/// agent ([`RelayedAgent`]): what a relay process that does nothing but
/// copy lines adds to stdio, measured in the same run as the others.
///
/// # Errors
/// No `socat`, or agent failures.
pub async fn relay(options: &BenchOptions) -> Result<Vec<ScenarioResult>, BenchError> {
    let (agent, _) = RelayedAgent::start(&options.program).await?;
    let mut results = echo_lines(agent, "relay", options).await?;
    for result in &mut results {
        result.note(
            "socat TCP-LISTEN:PORT,nodelay EXEC:'PROGRAM mock-agent', newline-delimited JSON-RPC over loopback TCP; \
             its ratio to stdio is the floor of any relay's"
                .to_owned(),
        );
    }
    Ok(results)
}

/// Echo requests over `agent`'s lines, one at a time and then pipelined
/// [`PIPELINE_DEPTH`] deep: results named `"{label} (1 in flight)"` and
/// `"{label} (16 in flight)"`.
async fn echo_lines<W, R>(
    mut agent: LineAgent<W, R>,
    label: &str,
    options: &BenchOptions,
) -> Result<Vec<ScenarioResult>, BenchError>
where
    W: AsyncWrite + Unpin,
    R: AsyncRead + Unpin,
{
    for id in 0..WARMUP as u64 {
        agent.call(&echo(id)).await?;
    }
    let mut latencies = Vec::new();
    let started = Instant::now();
    let until = started + options.duration;
    let mut id = 0_u64;
    while Instant::now() < until {
        id += 1;
        let sent = Instant::now();
        agent.call(&echo(id)).await?;
        latencies.push(sent.elapsed());
    }
    let name = format!("{label} (1 in flight)");
    let single = ScenarioResult::timed(&name, started.elapsed(), latencies, 0);

    // Pipelined: keep PIPELINE_DEPTH requests outstanding.
    let mut sent_at = std::collections::VecDeque::with_capacity(PIPELINE_DEPTH);
    let mut latencies = Vec::new();
    let started = Instant::now();
    let until = started + options.duration;
    for _ in 0..PIPELINE_DEPTH {
        id += 1;
        agent.send(&echo(id)).await?;
        sent_at.push_back(Instant::now());
    }
    agent.flush().await?;
    let mut line = String::new();
    while let Some(sent) = sent_at.pop_front() {
        agent.read_line(&mut line).await?;
        if !is_response(line.as_bytes()) {
            sent_at.push_front(sent);
            continue;
        }
        latencies.push(sent.elapsed());
        if Instant::now() < until {
            id += 1;
            agent.send(&echo(id)).await?;
            agent.flush().await?;
            sent_at.push_back(Instant::now());
        }
    }
    let name = format!("{label} ({PIPELINE_DEPTH} in flight)");
    let pipelined = ScenarioResult::timed(&name, started.elapsed(), latencies, 0);
    agent.stop().await;
    Ok(vec![single, pipelined])
}

/// `stream`: one prompt that makes the mock agent emit M updates of K bytes;
/// updates per second delivered to an SSE client, and the same over raw stdio.
///
/// # Errors
/// Transport or agent failures.
pub async fn stream(
    target: &Target,
    options: &BenchOptions,
) -> Result<Vec<ScenarioResult>, BenchError> {
    let text = format!("!emit {} {}", options.stream_updates, options.stream_bytes);
    let m = options.stream_updates;

    let (mut client, connection) = open(target).await?;
    let session = client.new_session(&connection, AGENT).await?;
    let mut sse = HttpClient::connect(target.address, target.token.as_deref()).await?;
    let mut body = sse.stream(&connection, None).await?;
    let rss_before = target.rss();
    let reader = tokio::spawn(async move {
        let mut counter = EventCounter::default();
        let result = count_events(&mut body, &mut counter, m).await;
        (result, Instant::now(), counter.events)
    });
    let started = Instant::now();
    let (status, _, answer) = client
        .post(
            Some(&connection),
            Bytes::from(prompt("emit", &session, &text)),
        )
        .await?;
    let answered = started.elapsed();
    let (outcome, finished, events) = reader
        .await
        .map_err(|e| BenchError::Unexpected(format!("reader panicked: {e}")))?;
    outcome?;
    let elapsed = finished.duration_since(started);
    let errors = u64::from(
        status != http::StatusCode::OK || memchr::memmem::find(&answer, b"end_turn").is_none(),
    );
    let mut over_sse = ScenarioResult::events("stream (SSE)", elapsed, events, errors);
    over_sse.note(format!(
        "{m} updates of {} bytes; prompt answered after {:.1} ms",
        options.stream_bytes,
        answered.as_secs_f64() * 1e3
    ));
    over_sse.rss_before = rss_before;
    over_sse.rss_after = target.rss();

    let (mut agent, session) = StdioAgent::start(&options.program).await?;
    let started = Instant::now();
    agent.send(&prompt("emit", &session, &text)).await?;
    agent.flush().await?;
    let mut line = String::new();
    let mut updates = 0_u64;
    loop {
        agent.read_line(&mut line).await?;
        if is_response(line.as_bytes()) {
            break;
        }
        updates += 1;
    }
    let elapsed = started.elapsed();
    agent.stop().await;
    let over_stdio =
        ScenarioResult::events("stream (stdio)", elapsed, updates, u64::from(updates != m));
    Ok(vec![over_sse, over_stdio])
}

/// `replay`: fill a connection's ring, then time resumes from
/// `Last-Event-ID: 0` until the last replayed event arrives.
///
/// # Errors
/// Transport failures.
pub async fn replay(
    target: &Target,
    options: &BenchOptions,
) -> Result<Vec<ScenarioResult>, BenchError> {
    const RUNS: usize = 20;
    let (mut client, connection) = open(target).await?;
    let session = client.new_session(&connection, AGENT).await?;
    let text = format!("!emit {} 16", options.replay_events);
    client
        .post(
            Some(&connection),
            Bytes::from(prompt("fill", &session, &text)),
        )
        .await?;
    let mut latencies = Vec::with_capacity(RUNS);
    let mut errors = 0;
    for _ in 0..RUNS {
        let mut sse = HttpClient::connect(target.address, target.token.as_deref()).await?;
        let started = Instant::now();
        let mut body = sse.stream(&connection, Some(0)).await?;
        let mut counter = EventCounter::default();
        if count_events(&mut body, &mut counter, options.replay_events)
            .await
            .is_err()
        {
            errors += 1;
        }
        latencies.push(started.elapsed());
    }
    let mut result = ScenarioResult::timed("replay", latencies.iter().sum(), latencies, errors);
    result.note(format!(
        "{} events from Last-Event-ID 0, {RUNS} resumes; latency = request to last event",
        options.replay_events
    ));
    Ok(vec![result])
}

/// `connections`: N connections, each with a live SSE stream; server RSS per
/// connection, and a request on every one of them afterwards.
///
/// # Errors
/// Transport failures.
pub async fn connections(
    target: &Target,
    options: &BenchOptions,
) -> Result<Vec<ScenarioResult>, BenchError> {
    // A connection already exists from earlier scenarios, or not; measure
    // from a settled server either way.
    let rss_before = target.rss();
    let started = Instant::now();
    let mut streams = Vec::with_capacity(options.idle_connections);
    let mut ids = Vec::with_capacity(options.idle_connections);
    let mut batch = Vec::new();
    for _ in 0..options.idle_connections {
        let address = target.address;
        let token = target.token.clone();
        batch.push(tokio::spawn(async move {
            let mut client = HttpClient::connect(address, token.as_deref()).await?;
            let connection = client.initialize(AGENT).await?;
            let body = client.stream(&connection, None).await?;
            Ok::<_, BenchError>((client, connection, body))
        }));
        if batch.len() == 64 {
            for task in batch.drain(..) {
                let (client, connection, body) = task
                    .await
                    .map_err(|e| BenchError::Unexpected(format!("opener panicked: {e}")))??;
                ids.push(connection);
                streams.push((client, body));
            }
        }
    }
    for task in batch {
        let (client, connection, body) = task
            .await
            .map_err(|e| BenchError::Unexpected(format!("opener panicked: {e}")))??;
        ids.push(connection);
        streams.push((client, body));
    }
    let opened = started.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_after = target.rss();

    // Every connection still answers.
    let mut workers = Vec::new();
    let chunk = ids.len().div_ceil(16).max(1);
    for part in ids.chunks(chunk) {
        let part = part.to_vec();
        let address = target.address;
        let token = target.token.clone();
        workers.push(tokio::spawn(async move {
            let mut client = HttpClient::connect(address, token.as_deref()).await?;
            let mut served = 0_u64;
            for (i, connection) in part.iter().enumerate() {
                let (status, _, _) = client
                    .post(Some(connection), Bytes::from(echo(i as u64)))
                    .await?;
                served += u64::from(status == http::StatusCode::OK);
            }
            Ok::<_, BenchError>(served)
        }));
    }
    let mut served = 0;
    for worker in workers {
        served += worker
            .await
            .map_err(|e| BenchError::Unexpected(format!("checker panicked: {e}")))??;
    }
    let n = options.idle_connections as u64;
    let mut result = ScenarioResult::events("connections", opened, n, n - served.min(n));
    result.rss_before = rss_before;
    result.rss_after = rss_after;
    result.note(format!(
        "{served} of {n} connections answered a request with all streams open"
    ));
    if let (Some(before), Some(after)) = (rss_before, rss_after) {
        result.per_connection_bytes = Some(after.saturating_sub(before) / n.max(1));
    }
    drop(streams);
    Ok(vec![result])
}

/// `startup`: process start to `/v2/health` answering 200, on a fresh server
/// each run; the best and median of the runs.
///
/// # Errors
/// When a server does not come up.
pub async fn startup(options: &BenchOptions) -> Result<Vec<ScenarioResult>, BenchError> {
    let mut latencies = Vec::with_capacity(options.startup_runs);
    let mut idle_rss = Vec::new();
    for _ in 0..options.startup_runs {
        let (latency, rss) = start_to_healthy(options, &[], Duration::from_secs(10)).await?;
        latencies.push(latency);
        idle_rss.extend(rss);
    }
    let mut result = ScenarioResult::timed("startup", latencies.iter().sum(), latencies, 0);
    idle_rss.sort_unstable();
    result.rss_after = idle_rss.get(idle_rss.len() / 2).copied();
    result.note("RSS column: idle server, 200 ms after its first health answer".to_owned());
    Ok(vec![result])
}

/// Starts `program server --no-token` with `extra` on a free loopback port
/// and times process start to the first `/v2/health` 200; returns that and
/// the server's RSS 200 ms later (then kills it).
///
/// # Errors
/// When it does not answer within `within`.
pub(super) async fn start_to_healthy(
    options: &BenchOptions,
    extra: &[&str],
    within: Duration,
) -> Result<(Duration, Option<u64>), BenchError> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let started = Instant::now();
    let mut child = tokio::process::Command::new(&options.program)
        .args(["server", "--host", "127.0.0.1", "--no-token", "--port"])
        .arg(port.to_string())
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let latency = loop {
        if health(address).await {
            break started.elapsed();
        }
        if started.elapsed() > within {
            return Err(BenchError::Unexpected(format!(
                "server did not answer /v2/health within {within:?}"
            )));
        }
        tokio::time::sleep(Duration::from_micros(500)).await;
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let rss = child.id().and_then(super::rss_bytes);
    let _ = child.kill().await;
    Ok((latency, rss))
}

pub(super) async fn health(address: std::net::SocketAddr) -> bool {
    let Ok(stream) = tokio::net::TcpStream::connect(address).await else {
        return false;
    };
    let Ok((mut sender, connection)) = hyper::client::conn::http1::handshake::<
        _,
        http_body_util::Empty<Bytes>,
    >(hyper_util::rt::TokioIo::new(stream))
    .await
    else {
        return false;
    };
    tokio::spawn(connection);
    let request = http::Request::builder()
        .uri("/v2/health")
        .header(http::header::HOST, address.to_string())
        .body(http_body_util::Empty::new());
    let Ok(request) = request else { return false };
    matches!(sender.send_request(request).await, Ok(r) if r.status() == http::StatusCode::OK)
}
