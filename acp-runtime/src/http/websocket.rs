//! WebSocket on `/acp` and `/acp/{agent}` (research/contract.md, "The /acp
//! profile", WebSocket): the RFC 6455 opening handshake over hyper's
//! upgrade, then tungstenite for the framing. The handshake itself
//! ([`accept_key`], [`switch`]) is shared with the terminal WebSocket
//! ([`super::terminal`]).
//!
//! One socket is one connection. Its id is made at the upgrade and sent in
//! the 101 answer; the connection itself opens with the first message,
//! which must be `initialize`. After that each text frame is one JSON-RPC
//! message, handled as a POST on `/acp` is, and every message for the client
//! is one text frame read from the connection's ring, so a client that reads
//! slowly costs at most the ring, as an SSE reader does. Binary frames are
//! ignored. The server pings every heartbeat interval and gives up on a
//! peer it has heard nothing from, pong included, for two intervals. A
//! closed socket closes its connection; the sessions live on for
//! `session/load` on another.
//!
//! One task serves a socket: it reads frames, runs notifications before
//! the next frame, and polls the requests in flight itself (a
//! `FuturesUnordered`, not a task each), also while a send waits for a slow
//! peer. A request's answer is pushed to the ring like any event (the next
//! sequence number, the same replay) and written right away by the task
//! that pushed it; the ring's wake-up serves what others push (session
//! updates, agent requests). Requests still in flight when the socket ends
//! finish in tasks of their own, as a POSTed one does
//! (research/benchmarks.md, "The message path, once").

use super::body::{Body, HttpRequest, empty};
use super::edge::{self, Detached, error_line};
use super::routes::ACP_PATH;
use crate::error::Error;
use crate::inbound::one_line;
use crate::memory::connection::{Batch, Connection, Outgoing, Profile, Stream};
use crate::memory::connections;
use crate::protocol::{self, ACP_CONNECTION_ID_HEADER, Kind, RpcError, code};
use crate::runtime::dispatch::To;
use crate::runtime::open::Opening;
use crate::runtime::{Reply, Runtime};
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{SinkExt, StreamExt};
use http::header::{
    CONNECTION, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY, SEC_WEBSOCKET_VERSION, UPGRADE,
};
use http::{HeaderMap, HeaderValue, Response, StatusCode, Uri, Version};
use hyper_util::rt::TokioIo;
use serde_json::value::RawValue;
use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};
use subtle::ConstantTimeEq;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{self, Message};

/// Most bytes the socket buffers for writing before a send waits (the ring
/// holds the rest).
const MAX_WRITE_BUFFER: usize = 1024 * 1024;
/// Most bytes one socket read asks for. tungstenite zero-fills this much of
/// its read buffer before every read (128 KiB by default, a memset per
/// frame of a pipelined client); JSON-RPC messages are small, and a big one
/// is still read whole, in more reads (research/benchmarks.md, "The /acp
/// transports").
const READ_CHUNK: usize = 16 * 1024;

/// A server-side WebSocket over an upgraded HTTP/1.1 connection.
pub(crate) type Socket = WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;

/// The requests a socket has in flight, each the run of one request
/// ([`Detached::request`]), polled by the socket's own task. The
/// connection's in-flight bound ([`crate::memory::connection::MAX_IN_FLIGHT`])
/// bounds it: a request over it completes at once with its error.
type Requests = FuturesUnordered<BoxFuture<'static, ()>>;

/// Whether the request asks for a WebSocket (`Upgrade: websocket`).
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    headers
        .get_all(UPGRADE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|token| token.trim().eq_ignore_ascii_case("websocket"))
}

/// Whether `?access_token=` on `uri` is `token` (compared in constant
/// time). Browsers cannot set headers on a WebSocket, so the upgrade, and
/// only the upgrade, may carry the token in the query.
///
/// # Errors
/// [`Error::InvalidRequest`] (400) for two or more `access_token` values:
/// none is picked (research/contract.md, "Auth and CORS").
pub fn query_token_matches(uri: &Uri, token: &str) -> Result<bool, Error> {
    let mut values = form_urlencoded::parse(uri.query().unwrap_or("").as_bytes())
        .filter(|(name, _)| name == "access_token")
        .map(|(_, value)| value);
    let Some(value) = values.next() else {
        return Ok(false);
    };
    if values.next().is_some() {
        return Err(Error::InvalidRequest(
            "the query has more than one access_token; send exactly one".to_owned(),
        ));
    }
    Ok(bool::from(value.as_bytes().ct_eq(token.as_bytes())))
}

/// Whether `uri`'s query carries an `access_token`.
pub fn has_query_token(uri: &Uri) -> bool {
    form_urlencoded::parse(uri.query().unwrap_or("").as_bytes())
        .any(|(name, _)| name == "access_token")
}

/// Answers the upgrade with 101 (RFC 6455 section 4.2.2) and serves the
/// socket in its own task once hyper hands it over.
///
/// # Errors
/// 400 for a request that is not a valid WebSocket opening handshake
/// (HTTP/1.1 only), 503 at the connection cap.
pub fn upgrade(
    runtime: &Arc<Runtime>,
    request: &mut HttpRequest,
    agent: Option<&str>,
) -> Result<Response<Body>, Error> {
    let accept = accept_key(request)?;
    if !runtime.connections.has_room() {
        return Err(Error::TooManyConnections {
            limit: runtime.config.max_connections,
        });
    }
    let id = connections::new_id();
    let peer = Peer {
        runtime: runtime.clone(),
        id: id.clone(),
        agent: agent.map(str::to_owned),
    };
    let config = WebSocketConfig::default()
        .max_message_size(Some(runtime.config.max_body_bytes))
        .max_frame_size(Some(runtime.config.max_body_bytes))
        .max_write_buffer_size(MAX_WRITE_BUFFER)
        .read_buffer_size(READ_CHUNK);
    let mut response = switch(request, accept, config, |socket| peer.serve(socket));
    if let Ok(value) = HeaderValue::from_str(&id) {
        response
            .headers_mut()
            .insert(ACP_CONNECTION_ID_HEADER, value);
    }
    Ok(response)
}

/// Checks a WebSocket opening handshake (RFC 6455 section 4.2.1): the
/// value of the answer's `Sec-WebSocket-Accept`. Shared by every WebSocket
/// route (`/acp`, a process's terminal).
///
/// # Errors
/// 400 for a request that is not a valid opening handshake (HTTP/1.1
/// only).
pub(crate) fn accept_key(request: &HttpRequest) -> Result<HeaderValue, Error> {
    let headers = request.headers();
    if request.version() != Version::HTTP_11 {
        return Err(Error::InvalidRequest(
            "a WebSocket opens with an HTTP/1.1 upgrade".to_owned(),
        ));
    }
    let connection_upgrade = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|token| token.trim().eq_ignore_ascii_case("upgrade"));
    if !connection_upgrade {
        return Err(Error::InvalidRequest(
            "a WebSocket upgrade needs Connection: Upgrade".to_owned(),
        ));
    }
    if headers
        .get(SEC_WEBSOCKET_VERSION)
        .map(HeaderValue::as_bytes)
        != Some(b"13")
    {
        return Err(Error::InvalidRequest(
            "only WebSocket version 13 is served (Sec-WebSocket-Version: 13)".to_owned(),
        ));
    }
    let Some(key) = headers.get(SEC_WEBSOCKET_KEY) else {
        return Err(Error::InvalidRequest(
            "a WebSocket upgrade needs Sec-WebSocket-Key".to_owned(),
        ));
    };
    HeaderValue::from_str(&tungstenite::handshake::derive_accept_key(key.as_bytes()))
        .map_err(|_| Error::InvalidRequest("invalid Sec-WebSocket-Key".to_owned()))
}

/// Answers a handshake [`accept_key`] checked with 101 (RFC 6455 section
/// 4.2.2) and runs `serve` on the socket, in a task of its own, once hyper
/// hands it over (after the 101 is written).
pub(crate) fn switch<F, Fut>(
    request: &mut HttpRequest,
    accept: HeaderValue,
    config: WebSocketConfig,
    serve: F,
) -> Response<Body>
where
    F: FnOnce(Socket) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let on_upgrade = hyper::upgrade::on(&mut *request);
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => {
                let socket = WebSocketStream::from_raw_socket(
                    TokioIo::new(upgraded),
                    Role::Server,
                    Some(config),
                )
                .await;
                serve(socket).await;
            }
            Err(error) => tracing::debug!(%error, "WebSocket upgrade failed"),
        }
    });
    let mut response = empty(StatusCode::SWITCHING_PROTOCOLS);
    let headers = response.headers_mut();
    headers.insert(UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
    headers.insert(SEC_WEBSOCKET_ACCEPT, accept);
    response
}

/// One socket's side of the server.
struct Peer {
    runtime: Arc<Runtime>,
    /// The connection id announced in the 101.
    id: Arc<str>,
    /// The agent named by path.
    agent: Option<String>,
}

/// Why the serve loop ended, and what the close frame says.
pub(crate) struct Ending {
    /// The close code (RFC 6455 section 7.4.1).
    pub code: CloseCode,
    /// The close reason.
    pub reason: &'static str,
}

/// The connection was closed (DELETE, idle reaping): the stream ended.
const CLOSED: Ending = Ending {
    code: CloseCode::Normal,
    reason: "connection closed",
};

impl Peer {
    /// Reads frames, writes the ring, pings, until either side ends.
    async fn serve(self, socket: Socket) {
        let (mut sink, mut source) = socket.split();
        let heartbeat = self.runtime.config.heartbeat;
        let mut connection: Option<Arc<Connection>> = None;
        let mut stream: Option<Stream> = None;
        let mut batch: Vec<Outgoing> = Vec::new();
        let mut requests = Requests::new();
        let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + heartbeat, heartbeat);
        let mut last_heard = Instant::now();
        let ending = loop {
            let closed = async {
                match &connection {
                    Some(connection) => connection.closed().cancelled().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                frame = source.next() => {
                    last_heard = Instant::now();
                    match frame {
                        None => break None,
                        Some(Err(error)) => break close_for(&error),
                        Some(Ok(Message::Text(text))) => {
                            let body = Bytes::from(text);
                            let answer = match &connection {
                                None => self.initialize(body, &mut connection, &mut stream).await,
                                Some(open) => self.message(open, body, &mut requests).await,
                            };
                            last_heard = Instant::now();
                            if let Some(answer) = answer
                                && !sending(send(&mut sink, answer, heartbeat), &mut requests).await
                            {
                                break None;
                            }
                            // A new request runs at once, before the next
                            // frame is read; one that needed no waiting (the
                            // runtime answered it) has its answer written now.
                            if settle(&mut requests).await
                                && let Err(ending) = write_ring(&mut stream, &mut batch, &mut sink, heartbeat, &mut requests).await
                            {
                                break ending;
                            }
                        }
                        Some(Ok(Message::Close(_))) => break None,
                        // Binary frames are ignored (RFD); tungstenite answers pings.
                        Some(Ok(_)) => {}
                    }
                }
                Some(()) = requests.next(), if !requests.is_empty() => {
                    // An answer is in the ring: with the others that are
                    // ready too, it is written now, not after a wake-up
                    // through the ring.
                    settle(&mut requests).await;
                    if let Err(ending) = write_ring(&mut stream, &mut batch, &mut sink, heartbeat, &mut requests).await {
                        break ending;
                    }
                }
                more = next_batch(&mut stream, &mut batch) => {
                    if !more {
                        break Some(CLOSED);
                    }
                    if !sending(send_batch(&mut sink, &mut batch, heartbeat), &mut requests).await {
                        break None;
                    }
                }
                _ = ping.tick() => {
                    if last_heard.elapsed() > heartbeat * 2 {
                        break Some(Ending { code: CloseCode::Away, reason: "keep-alive timeout" });
                    }
                    let ping = send_message(&mut sink, Message::Ping(Bytes::new()), heartbeat);
                    if !sending(ping, &mut requests).await {
                        break None;
                    }
                }
                () = closed => break Some(CLOSED),
                () = self.runtime.shutdown.cancelled() => {
                    break Some(Ending { code: CloseCode::Away, reason: "server shutting down" });
                }
            }
        };
        if let Some(Ending { code, reason }) = ending {
            let frame = CloseFrame {
                code,
                reason: reason.into(),
            };
            let _ = send_message(&mut sink, Message::Close(Some(frame)), heartbeat).await;
        }
        drop(stream);
        // What is still in flight finishes in tasks of its own, as a request
        // POSTed on `/acp` does: each ends once the connection is closed
        // (below), answering "connection closed" to a ring that is gone.
        for request in requests {
            tokio::spawn(request);
        }
        if let Some(connection) = connection
            && self
                .runtime
                .connections
                .close(&connection.id, &self.runtime.sessions)
        {
            tracing::info!(connection = %connection.id, "WebSocket closed; its sessions live on");
        }
    }

    /// The first message: it must be `initialize`, which opens the
    /// connection under the id of the 101. The answer frame to send.
    async fn initialize(
        &self,
        body: Bytes,
        connection: &mut Option<Arc<Connection>>,
        stream: &mut Option<Stream>,
    ) -> Option<Bytes> {
        let line = one_line(&body);
        let mut apart = None;
        let message = match edge::parse(&line, &mut apart).await? {
            Ok(message) => message,
            Err(error) => return Some(parse_error(&error.to_string())),
        };
        let id = message.envelope.id.unwrap_or(RawValue::NULL);
        if !message.is_initialize() {
            let error = RpcError::new(
                code::INVALID_REQUEST,
                "the first message on a WebSocket must be initialize",
            );
            return Some(Bytes::from(protocol::error_response_line(id, &error)));
        }
        if self.agent.is_none() && protocol::meta_agent(message.envelope.params).is_none() {
            let error = Error::InvalidRequest(format!(
                "name the agent in the path: {ACP_PATH}/{{agent}} (known agents: {}), or in params._meta[\"sandboxagent.dev\"].agent of initialize (or start the server with --default-agent)",
                self.runtime.agents.known_ids()
            ));
            return Some(Bytes::from(error_line(id, &error)));
        }
        let opening = Opening {
            profile: Profile::Acp,
            agent: self.agent.as_deref(),
            connection_id: Some(&self.id),
        };
        let answer = match self
            .runtime
            .dispatch(To::Open(opening), &message, &tracing::Span::none())
            .await
        {
            Ok(Reply::Json { body, .. }) => body,
            Ok(Reply::Accepted) => return None,
            Err(error) => return Some(Bytes::from(error_line(id, &error))),
        };
        if let Some(open) = self.runtime.connections.get(&self.id) {
            match open.open_stream(None) {
                Ok(opened) => *stream = Some(opened),
                Err(error) => tracing::warn!(%error, "WebSocket connection without a stream"),
            }
            *connection = Some(open);
        }
        Some(answer)
    }

    /// A message on an open connection: handled as a POST on `/acp` is, its
    /// answer pushed to the ring. A notification or an answer to an agent
    /// request runs before the next frame is read; a request is added to
    /// `requests`, which the socket task polls (no task of its own). An
    /// answer frame only for a message that does not parse.
    ///
    /// The frame is parsed once, here: the runtime takes the parsed message
    /// ([`Detached`]).
    async fn message(
        &self,
        connection: &Arc<Connection>,
        body: Bytes,
        requests: &mut Requests,
    ) -> Option<Bytes> {
        let line = one_line(&body);
        let mut apart = None;
        let message = match edge::parse(&line, &mut apart).await? {
            Ok(message) => message,
            Err(error) => return Some(parse_error(&error.to_string())),
        };
        let detached = Detached {
            runtime: self.runtime.clone(),
            connection: connection.clone(),
            lane: None,
            // On a WebSocket each request starts a trace
            // (research/contract.md, "Traces").
            span: tracing::Span::none(),
        };
        if message.kind == Kind::Request {
            requests.push(Box::pin(detached.request(&message)));
        } else {
            detached.start(&message).await;
        }
        None
    }
}

/// The JSON-RPC answer to a frame that is not one JSON-RPC message
/// (JSON-RPC 2.0 section 5.1: id null).
fn parse_error(detail: &str) -> Bytes {
    let error = RpcError::new(
        code::INVALID_REQUEST,
        format!("invalid JSON-RPC message: {detail}"),
    );
    Bytes::from(protocol::error_response_line(RawValue::NULL, &error))
}

/// The close frame for a read error (RFC 6455 section 7.4.1), or `None`
/// when the socket is gone and nothing can be sent.
pub(crate) fn close_for(error: &tungstenite::Error) -> Option<Ending> {
    match error {
        tungstenite::Error::Capacity(_) => Some(Ending {
            code: CloseCode::Size,
            reason: "message too big",
        }),
        tungstenite::Error::Utf8(_) => Some(Ending {
            code: CloseCode::Invalid,
            reason: "text frame is not UTF-8",
        }),
        tungstenite::Error::Protocol(_) => Some(Ending {
            code: CloseCode::Protocol,
            reason: "WebSocket protocol error",
        }),
        _ => None,
    }
}

/// Fills `batch` with the next events of the ring: `true` when it has
/// some, `false` once the stream ended; pending forever before the
/// connection opened.
async fn next_batch(stream: &mut Option<Stream>, batch: &mut Vec<Outgoing>) -> bool {
    let Some(stream) = stream else {
        return std::future::pending().await;
    };
    loop {
        match stream.next_batch(batch) {
            Batch::Data => return true,
            Batch::Ended => return false,
            Batch::Idle => {}
        }
        // A push between `next_batch` and here leaves a permit: no miss.
        let wake = stream.wake().clone();
        wake.notified().await;
        // Answers come in bursts (one read of the agent's stdout settles
        // several requests, each pushed by its own task): one pass of the
        // scheduler lets the others push theirs, so one write carries the
        // burst.
        tokio::task::yield_now().await;
    }
}

/// Polls the requests that are ready, without waiting: `true` when one or
/// more completed (their answers are in the ring).
async fn settle(requests: &mut Requests) -> bool {
    let mut any = false;
    while let Poll::Ready(Some(())) = futures::poll!(requests.next()) {
        any = true;
    }
    any
}

/// Sends what the ring has for the socket now, without waiting for the
/// ring's wake-up: the socket task pushed it itself (a request's answer).
/// The wake-up that push left is taken first, so it costs no second pass;
/// a push after that leaves a new one, so none is missed.
///
/// # Errors
/// How the socket ends: [`CLOSED`] once the stream ended, `None` when the
/// socket failed or the peer does not read ([`send_batch`]).
async fn write_ring<S>(
    stream: &mut Option<Stream>,
    batch: &mut Vec<Outgoing>,
    sink: &mut S,
    heartbeat: Duration,
    requests: &mut Requests,
) -> Result<(), Option<Ending>>
where
    S: futures::Sink<Message, Error = tungstenite::Error> + Unpin,
{
    let Some(stream) = stream else {
        return Ok(());
    };
    let _ = futures::poll!(std::pin::pin!(stream.wake().notified()));
    match stream.next_batch(batch) {
        Batch::Idle => Ok(()),
        Batch::Ended => Err(Some(CLOSED)),
        Batch::Data if sending(send_batch(sink, batch, heartbeat), requests).await => Ok(()),
        Batch::Data => Err(None),
    }
}

/// Awaits `send` (one of the sends below) while the socket's requests go on
/// being polled: a request whose answer comes while the peer is slow to
/// read still has it pushed to the ring (and written next), as a request in
/// a task of its own would.
async fn sending(send: impl Future<Output = bool>, requests: &mut Requests) -> bool {
    let mut send = std::pin::pin!(send);
    loop {
        tokio::select! {
            sent = &mut send => return sent,
            Some(()) = requests.next(), if !requests.is_empty() => {}
        }
    }
}

/// Sends one text frame; `false` when the socket failed or the peer did
/// not take it within two heartbeat intervals (it does not read).
async fn send<S>(sink: &mut S, json: Bytes, heartbeat: Duration) -> bool
where
    S: futures::Sink<Message, Error = tungstenite::Error> + Unpin,
{
    match tungstenite::Utf8Bytes::try_from(json) {
        Ok(text) => send_message(sink, Message::Text(text), heartbeat).await,
        Err(_) => true,
    }
}

/// Sends the JSON of every message of `batch` as a text frame (emptying
/// it), flushing once at the end (one write for many small messages);
/// `false` as for [`send`].
async fn send_batch<S>(sink: &mut S, batch: &mut Vec<Outgoing>, heartbeat: Duration) -> bool
where
    S: futures::Sink<Message, Error = tungstenite::Error> + Unpin,
{
    let feed_all = async {
        for message in batch.drain(..) {
            if let Ok(text) = tungstenite::Utf8Bytes::try_from(message.json) {
                sink.feed(Message::Text(text)).await?;
            }
        }
        sink.flush().await
    };
    matches!(
        tokio::time::timeout(heartbeat * 2, feed_all).await,
        Ok(Ok(()))
    )
}

/// Sends one frame; `false` when the socket failed or the peer did not
/// take it within two heartbeat intervals (it does not read).
pub(crate) async fn send_message<S>(sink: &mut S, message: Message, heartbeat: Duration) -> bool
where
    S: futures::Sink<Message, Error = tungstenite::Error> + Unpin,
{
    matches!(
        tokio::time::timeout(heartbeat * 2, sink.send(message)).await,
        Ok(Ok(()))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_token_in_the_query() {
        let uri: Uri = "/acp/mock?x=1&access_token=s%20t".parse().expect("uri");
        assert_eq!(query_token_matches(&uri, "s t").ok(), Some(true));
        assert_eq!(query_token_matches(&uri, "s").ok(), Some(false));
        let uri: Uri = "/acp/mock".parse().expect("uri");
        assert_eq!(query_token_matches(&uri, "s").ok(), Some(false));
        let uri: Uri = "/acp/mock?access_token=s&access_token=t"
            .parse()
            .expect("uri");
        assert!(query_token_matches(&uri, "s").is_err());
    }

    #[tokio::test]
    async fn requests_go_on_while_a_send_waits() {
        // The send finishes only once the request did: a socket task that
        // stopped polling its requests during a send would hang here.
        let answered = Arc::new(tokio::sync::Notify::new());
        let mut requests = Requests::new();
        let notify = answered.clone();
        requests.push(Box::pin(async move {
            tokio::task::yield_now().await;
            notify.notify_one();
        }));
        let send = async {
            answered.notified().await;
            true
        };
        let sent = tokio::time::timeout(Duration::from_secs(5), sending(send, &mut requests));
        assert_eq!(sent.await.ok(), Some(true));
        assert!(requests.is_empty());
    }

    #[tokio::test]
    async fn settle_takes_only_what_is_ready() {
        let mut requests = Requests::new();
        assert!(!settle(&mut requests).await);
        let (answer, waiting) = tokio::sync::oneshot::channel::<()>();
        requests.push(Box::pin(async {}));
        requests.push(Box::pin(async move {
            let _ = waiting.await;
        }));
        assert!(settle(&mut requests).await, "the ready one completed");
        assert_eq!(requests.len(), 1, "the waiting one is still in flight");
        let _ = answer.send(());
        assert!(settle(&mut requests).await);
        assert!(requests.is_empty());
    }
}
