//! The `/acp` profile's transports measured: `_mock/echo` over a WebSocket
//! (1 and 16 in flight, to compare with the `stdio` scenario), and POST
//! throughput over one HTTP/2 connection with 32 streams (to compare with
//! `roundtrip` over N HTTP/1.1 connections).

use super::client::BenchError;
use super::report::ScenarioResult;
use super::{BenchOptions, Target};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http_body_util::{BodyExt, Full};
use std::collections::VecDeque;
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// Requests before measuring.
const WARMUP: usize = 200;
/// Requests in flight in the pipelined WebSocket run (as the stdio one).
const PIPELINE_DEPTH: usize = 16;
/// Concurrent streams on the one HTTP/2 connection.
const HTTP2_STREAMS: usize = 32;
/// Bytes one WebSocket read asks for: tungstenite zero-fills this much
/// before every read (128 KiB by default), a cost the stdio client (a
/// `BufReader`) does not pay.
const WS_READ_CHUNK: usize = 16 * 1024;

fn echo(id: u64) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"_mock/echo","params":{{"n":{id}}}}}"#)
}

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}"#;

fn failed(what: &str, detail: impl std::fmt::Display) -> BenchError {
    BenchError::Unexpected(format!("{what}: {detail}"))
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The next JSON-RPC response on `socket` (frames that are not one skipped).
async fn next_response(socket: &mut Socket) -> Result<(), BenchError> {
    loop {
        match socket.next().await {
            Some(Ok(Message::Text(text))) if text.contains("\"result\"") => return Ok(()),
            Some(Ok(Message::Text(text))) if text.contains("\"error\"") => {
                return Err(failed("WebSocket request failed", text));
            }
            Some(Ok(_)) => {}
            Some(Err(error)) => return Err(failed("WebSocket read", error)),
            None => return Err(failed("WebSocket", "closed by the server")),
        }
    }
}

async fn send(socket: &mut Socket, text: String) -> Result<(), BenchError> {
    socket
        .send(Message::text(text))
        .await
        .map_err(|error| failed("WebSocket write", error))
}

/// `websocket`: `_mock/echo` over `ws://…/acp/mock`, one in flight, then
/// [`PIPELINE_DEPTH`] in flight.
///
/// # Errors
/// Transport failures.
pub async fn websocket(
    target: &Target,
    options: &BenchOptions,
) -> Result<Vec<ScenarioResult>, BenchError> {
    let mut request = format!("ws://{}/acp/mock", target.address)
        .into_client_request()
        .map_err(|error| failed("WebSocket request", error))?;
    if let Some(token) = &target.token
        && let Ok(value) = format!("Bearer {token}").parse()
    {
        request.headers_mut().insert("authorization", value);
    }
    let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
        .read_buffer_size(WS_READ_CHUNK);
    let (mut socket, _) = tokio_tungstenite::connect_async_with_config(request, Some(config), true)
        .await
        .map_err(|error| failed("WebSocket upgrade", error))?;
    send(&mut socket, INITIALIZE.to_owned()).await?;
    next_response(&mut socket).await?;
    for id in 1..=WARMUP as u64 {
        send(&mut socket, echo(id)).await?;
        next_response(&mut socket).await?;
    }
    let mut id = WARMUP as u64;
    let mut latencies = Vec::new();
    let started = Instant::now();
    let until = started + options.duration;
    while Instant::now() < until {
        id += 1;
        let sent = Instant::now();
        send(&mut socket, echo(id)).await?;
        next_response(&mut socket).await?;
        latencies.push(sent.elapsed());
    }
    let single = ScenarioResult::timed("websocket (1 in flight)", started.elapsed(), latencies, 0);

    let mut sent_at = VecDeque::with_capacity(PIPELINE_DEPTH);
    let mut latencies = Vec::new();
    let started = Instant::now();
    let until = started + options.duration;
    for _ in 0..PIPELINE_DEPTH {
        id += 1;
        send(&mut socket, echo(id)).await?;
        sent_at.push_back(Instant::now());
    }
    while let Some(sent) = sent_at.pop_front() {
        next_response(&mut socket).await?;
        latencies.push(sent.elapsed());
        if Instant::now() < until {
            id += 1;
            send(&mut socket, echo(id)).await?;
            sent_at.push_back(Instant::now());
        }
    }
    let name = format!("websocket ({PIPELINE_DEPTH} in flight)");
    let pipelined = ScenarioResult::timed(&name, started.elapsed(), latencies, 0);
    let _ = socket.close(None).await;
    Ok(vec![single, pipelined])
}

/// `http2`: `_mock/echo` POSTs on `/v2/rpc` from [`HTTP2_STREAMS`] tasks
/// sharing one cleartext HTTP/2 connection (prior knowledge).
///
/// # Errors
/// Transport failures.
pub async fn http2(
    target: &Target,
    options: &BenchOptions,
) -> Result<Vec<ScenarioResult>, BenchError> {
    let tcp = tokio::net::TcpStream::connect(target.address)
        .await
        .map_err(|error| failed("connect", error))?;
    let _ = tcp.set_nodelay(true);
    let (sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .map_err(|error| failed("HTTP/2 handshake", error))?;
    tokio::spawn(connection);
    let post = {
        let token = target.token.clone();
        let address = target.address;
        move |connection: Option<&str>, body: String| {
            let mut builder = http::Request::post(format!("http://{address}/v2/rpc"))
                .header("content-type", "application/json");
            if let Some(token) = &token {
                builder = builder.header("authorization", format!("Bearer {token}"));
            }
            if let Some(connection) = connection {
                builder = builder.header("x-acp-connection-id", connection);
            }
            builder.body(Full::new(Bytes::from(body)))
        }
    };
    let init = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{},"_meta":{"sandboxagent.dev":{"agent":"mock"}}}}"#.to_owned();
    let request = post(None, init).map_err(|error| failed("request", error))?;
    let response = sender
        .clone()
        .send_request(request)
        .await
        .map_err(|error| failed("initialize", error))?;
    let connection = response
        .headers()
        .get("x-acp-connection-id")
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned)
        .ok_or_else(|| failed("initialize", "no connection id"))?;
    let started = Instant::now();
    let until = started + options.duration;
    let tasks: Vec<_> = (0..HTTP2_STREAMS as u64)
        .map(|task| {
            let mut sender = sender.clone();
            let connection = connection.clone();
            let post = post.clone();
            tokio::spawn(async move {
                let mut latencies: Vec<Duration> = Vec::new();
                let mut errors = 0_u64;
                let mut id = task << 32;
                while Instant::now() < until {
                    id += 1;
                    let Ok(request) = post(Some(&connection), echo(id)) else {
                        errors += 1;
                        continue;
                    };
                    let sent = Instant::now();
                    match sender.send_request(request).await {
                        Ok(response) => {
                            let ok = response.status() == http::StatusCode::OK;
                            let body = response.into_body().collect().await;
                            errors += u64::from(!ok || body.is_err());
                        }
                        Err(_) => errors += 1,
                    }
                    latencies.push(sent.elapsed());
                }
                (latencies, errors)
            })
        })
        .collect();
    let mut latencies = Vec::new();
    let mut errors = 0;
    for task in tasks {
        let (mut own, failed_requests) =
            task.await.map_err(|error| failed("HTTP/2 task", error))?;
        latencies.append(&mut own);
        errors += failed_requests;
    }
    let mut result = ScenarioResult::timed(
        &format!("http2 (1 connection, {HTTP2_STREAMS} streams)"),
        started.elapsed(),
        latencies,
        errors,
    );
    result.note(format!(
        "POST /v2/rpc _mock/echo from {HTTP2_STREAMS} tasks on one cleartext HTTP/2 connection; compare with roundtrip over HTTP/1.1 connections"
    ));
    Ok(vec![result])
}
