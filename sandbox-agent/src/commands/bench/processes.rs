//! `bench --scenario processes`: the process API (research/contract.md,
//! "Processes and terminals") against what the same machine does without
//! the server, as ratios within one run (research/benchmarks.md).
//!
//! 1. `POST /v2/processes/run` of `/bin/true`, one after another, against a
//!    spawn and wait of `/bin/true` by the bench itself: p50 against p50
//!    (the server's path includes its tree supervisor's exec).
//! 2. A process printing `--process-bytes` of `y\n` (`yes | head -c N`),
//!    followed over SSE from its first byte until `event: exit`, against
//!    `yes | head -c N | cat > /dev/null` run locally: bytes per second
//!    against bytes per second, and the server's RSS growth (its peak,
//!    sampled from `/proc/<pid>/status` every 20 ms, minus before). The
//!    same output followed through the SDK's `ProcessOutput` is measured
//!    too, for what a Rust client sees.
//!
//! 3. The terminal echo: one byte sent over the terminal WebSocket
//!    (`GET /v2/processes/{id}/terminal`) of a shell on a pseudo-terminal,
//!    until its echo comes back, one at a time: p50 against 1 ms.

use super::client::{BenchError, HttpClient};
use super::fs::RssSampler;
use super::report::ScenarioResult;
use super::{BenchOptions, Target};
use bytes::BytesMut;
use futures::{SinkExt, StreamExt};
use http_body_util::BodyExt;
use sandbox_agent_sdk::{ClientOptions, OutputEvent, ProcessRequest, SandboxAgentClient};
use std::time::{Duration, Instant};

/// Runs of `/bin/true` measured on each side.
const RUNS: usize = 300;

/// Runs the scenario. Results: `processes: run /bin/true`,
/// `processes: spawn+wait /bin/true (local)`, `processes: follow
/// (SSE)`, `processes: follow (SDK)`, `processes: yes | head | cat
/// (local)`; a follow's `count` is the output bytes delivered, `errors` the
/// bytes reported dropped.
///
/// # Errors
/// A server that cannot be reached or refuses a process.
pub async fn processes(
    target: &Target,
    options: &BenchOptions,
) -> Result<Vec<ScenarioResult>, BenchError> {
    let mut results = vec![run_true(target).await?, spawn_true()?];
    let bytes = options.process_bytes;
    results.push(local_pipeline(bytes).await?);
    results.push(follow_sse(target, bytes).await?);
    results.push(follow_sdk(target, bytes).await?);
    results.push(terminal_echo(target).await?);
    Ok(results)
}

/// [`RUNS`] × `POST /v2/processes/run {"command": "/bin/true"}`.
async fn run_true(target: &Target) -> Result<ScenarioResult, BenchError> {
    let mut client = HttpClient::connect(target.address, target.token.as_deref()).await?;
    let body = bytes::Bytes::from_static(br#"{"command":"/bin/true"}"#);
    let mut latencies = Vec::with_capacity(RUNS);
    let mut errors = 0;
    // One warm-up (the first spawn pages the binaries in).
    client.post_json("/v2/processes/run", body.clone()).await?;
    let started = Instant::now();
    for _ in 0..RUNS {
        let sent = Instant::now();
        let (status, answer) = client.post_json("/v2/processes/run", body.clone()).await?;
        latencies.push(sent.elapsed());
        let exit: serde_json::Value = serde_json::from_slice(&answer).unwrap_or_default();
        if status != http::StatusCode::OK || exit["exitCode"] != 0 {
            errors += 1;
        }
    }
    let mut result = ScenarioResult::timed(
        "processes: run /bin/true",
        started.elapsed(),
        latencies,
        errors,
    );
    result.note("POST /v2/processes/run, one at a time, one connection".to_owned());
    Ok(result)
}

/// Bytes typed into the terminal, one at a time.
const ECHOES: usize = 300;

/// [`ECHOES`] × a byte over the terminal WebSocket of `sh` until the
/// terminal's echo of it comes back (the line discipline echoes it, so the
/// shell's own speed is not in it).
async fn terminal_echo(target: &Target) -> Result<ScenarioResult, BenchError> {
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut client = HttpClient::connect(target.address, target.token.as_deref()).await?;
    let body = serde_json::json!({"command": "sh", "tty": true});
    let (status, answer) = client
        .post_json("/v2/processes", body.to_string().into())
        .await?;
    let info: serde_json::Value = serde_json::from_slice(&answer).unwrap_or_default();
    let Some(id) = info["id"]
        .as_str()
        .filter(|_| status == http::StatusCode::CREATED)
    else {
        return Err(BenchError::Unexpected(format!(
            "POST /v2/processes answered {status}: {}",
            String::from_utf8_lossy(&answer)
        )));
    };
    let url = format!("ws://{}/v2/processes/{id}/terminal", target.address);
    let mut request = url
        .into_client_request()
        .map_err(|e| BenchError::Unexpected(format!("terminal URL: {e}")))?;
    if let Some(token) = &target.token
        && let Ok(value) = http::HeaderValue::from_str(&format!("Bearer {token}"))
    {
        request
            .headers_mut()
            .insert(http::header::AUTHORIZATION, value);
    }
    let (mut socket, _) = tokio_tungstenite::connect_async(request)
        .await
        .map_err(|e| BenchError::Unexpected(format!("terminal WebSocket: {e}")))?;
    // The shell's prompt first: the terminal is then quiet.
    let _ = tokio::time::timeout(Duration::from_secs(5), socket.next()).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut latencies = Vec::with_capacity(ECHOES);
    let mut errors = 0;
    let started = Instant::now();
    for at in 0..ECHOES {
        let byte = b'a' + u8::try_from(at % 26).unwrap_or(0);
        let sent = Instant::now();
        socket
            .send(Message::Binary(vec![byte].into()))
            .await
            .map_err(|e| BenchError::Unexpected(format!("terminal send: {e}")))?;
        let echoed = tokio::time::timeout(Duration::from_secs(5), async {
            while let Some(Ok(message)) = socket.next().await {
                if let Message::Binary(bytes) = message
                    && bytes.contains(&byte)
                {
                    return true;
                }
            }
            false
        })
        .await;
        latencies.push(sent.elapsed());
        errors += u64::from(!matches!(echoed, Ok(true)));
    }
    let elapsed = started.elapsed();
    let _ = socket.close(None).await;
    forget(&mut client, id).await;
    let mut result = ScenarioResult::timed("processes: terminal echo", elapsed, latencies, errors);
    result.note(
        "a byte over GET /v2/processes/{id}/terminal (sh on a pty) until its echo".to_owned(),
    );
    Ok(result)
}

/// [`RUNS`] × spawn and wait of `/bin/true` here.
fn spawn_true() -> Result<ScenarioResult, BenchError> {
    let mut latencies = Vec::with_capacity(RUNS);
    let mut errors = 0;
    std::process::Command::new("/bin/true").status()?;
    let started = Instant::now();
    for _ in 0..RUNS {
        let sent = Instant::now();
        let status = std::process::Command::new("/bin/true").status()?;
        latencies.push(sent.elapsed());
        errors += u64::from(!status.success());
    }
    let mut result = ScenarioResult::timed(
        "processes: spawn+wait /bin/true (local)",
        started.elapsed(),
        latencies,
        errors,
    );
    result.note("std::process::Command::status in the bench".to_owned());
    Ok(result)
}

/// The shell line that prints `bytes` bytes of `y\n`.
fn writer(bytes: u64) -> String {
    format!("yes | head -c {bytes}")
}

/// `yes | head -c N | cat > /dev/null` here: the pipeline's own speed.
async fn local_pipeline(bytes: u64) -> Result<ScenarioResult, BenchError> {
    let line = format!("{} | cat > /dev/null", writer(bytes));
    let started = Instant::now();
    let status = tokio::process::Command::new("sh")
        .args(["-c", &line])
        .status()
        .await?;
    let elapsed = started.elapsed();
    if !status.success() {
        return Err(BenchError::Unexpected(format!("{line}: {status}")));
    }
    let mut result =
        ScenarioResult::events("processes: yes | head | cat (local)", elapsed, bytes, 0);
    result.note(format!("sh -c '{line}'; events/s is bytes/s"));
    Ok(result)
}

/// Starts the writer through the API; its id.
async fn start_writer(client: &mut HttpClient, bytes: u64) -> Result<String, BenchError> {
    let body = serde_json::json!({"command": "sh", "args": ["-c", writer(bytes)]});
    let (status, answer) = client
        .post_json("/v2/processes", body.to_string().into())
        .await?;
    let info: serde_json::Value = serde_json::from_slice(&answer).unwrap_or_default();
    match info["id"].as_str() {
        Some(id) if status == http::StatusCode::CREATED => Ok(id.to_owned()),
        _ => Err(BenchError::Unexpected(format!(
            "POST /v2/processes answered {status}: {}",
            String::from_utf8_lossy(&answer)
        ))),
    }
}

/// Starts the writer and follows its output over SSE with the bench's lean
/// client: the `id:` of each event is the offset after its chunk, so the
/// bytes delivered are the last id less what `event: dropped` reported.
async fn follow_sse(target: &Target, bytes: u64) -> Result<ScenarioResult, BenchError> {
    let mut client = HttpClient::connect(target.address, target.token.as_deref()).await?;
    let rss = RssSampler::start(target);
    let started = Instant::now();
    let id = start_writer(&mut client, bytes).await?;
    let mut body = client
        .get_event_stream(&format!("/v2/processes/{id}/output"))
        .await?;
    let mut lines = BytesMut::new();
    let mut last_id = 0u64;
    let mut dropped = 0u64;
    let mut in_dropped = false;
    let mut exited = false;
    'read: while let Some(frame) = body.frame().await {
        let frame = frame?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        lines.extend_from_slice(&data);
        while let Some(end) = memchr::memchr(b'\n', &lines) {
            let line = lines.split_to(end + 1);
            let line = &line[..end];
            if let Some(value) = line.strip_prefix(b"id: ") {
                last_id = std::str::from_utf8(value)
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(last_id);
            } else if line == b"event: dropped" {
                in_dropped = true;
            } else if line == b"event: exit" {
                exited = true;
            } else if let Some(data) = line.strip_prefix(b"data: ") {
                if in_dropped {
                    let marker: serde_json::Value =
                        serde_json::from_slice(data).unwrap_or_default();
                    dropped += marker["dropped"].as_u64().unwrap_or(0);
                    in_dropped = false;
                }
                if exited {
                    break 'read;
                }
            }
        }
    }
    let elapsed = started.elapsed();
    let mut result = ScenarioResult::events(
        "processes: follow (SSE)",
        elapsed,
        last_id.saturating_sub(dropped),
        dropped,
    );
    rss.finish(&mut result);
    forget(&mut client, &id).await;
    if !exited || last_id != bytes {
        return Err(BenchError::Unexpected(format!(
            "followed to offset {last_id} of {bytes} (exit seen: {exited})"
        )));
    }
    result.note(format!(
        "start of sh -c '{}' to event: exit, GET /v2/processes/{{id}}/output (text/event-stream) from offset 0; errors = bytes dropped; events/s is bytes/s",
        writer(bytes)
    ));
    Ok(result)
}

/// The same through the SDK: `start_process`, then its `ProcessOutput`
/// (each chunk's JSON parsed, its bytes counted).
async fn follow_sdk(target: &Target, bytes: u64) -> Result<ScenarioResult, BenchError> {
    let mut options = ClientOptions::new("mock")
        .base_url(format!("http://{}", target.address))
        .auto_connect(false)
        .no_request_timeout();
    if let Some(token) = &target.token {
        options = options.token(token);
    }
    let failed = |e: sandbox_agent_sdk::Error| BenchError::Unexpected(e.to_string());
    let client = SandboxAgentClient::connect(options).await.map_err(failed)?;
    let rss = RssSampler::start(target);
    let started = Instant::now();
    let process = client
        .start_process(ProcessRequest::new("sh").arg("-c").arg(writer(bytes)))
        .await
        .map_err(failed)?;
    let mut output = process.output();
    let mut delivered = 0u64;
    let mut dropped = 0u64;
    let mut exited = false;
    while let Some(event) = output.next().await {
        match event.map_err(failed)? {
            OutputEvent::Chunk(chunk) => delivered += chunk.data.len() as u64,
            OutputEvent::Dropped(gap) => dropped += gap.dropped,
            OutputEvent::Exit(_) => exited = true,
        }
    }
    let elapsed = started.elapsed();
    let mut result = ScenarioResult::events("processes: follow (SDK)", elapsed, delivered, dropped);
    rss.finish(&mut result);
    let _ = process.forget().await;
    if !exited || delivered + dropped != bytes {
        return Err(BenchError::Unexpected(format!(
            "the SDK delivered {delivered} and dropped {dropped} of {bytes} (exit seen: {exited})"
        )));
    }
    result.note(
        "sandbox_agent_sdk start_process + ProcessOutput; count = text bytes of the chunks"
            .to_owned(),
    );
    Ok(result)
}

/// `DELETE /v2/processes/{id}`, best effort.
async fn forget(client: &mut HttpClient, id: &str) {
    let _ = tokio::time::timeout(
        Duration::from_secs(5),
        client.delete_path(&format!("/v2/processes/{id}")),
    )
    .await;
}
