//! The WebSocket transport ([`Transport::WebSocket`](crate::Transport)):
//! one socket on the server's `/acp` (sandbox-agent's research/contract.md,
//! "The /acp profile", WebSocket), each JSON-RPC message one text frame
//! both ways.
//!
//! The socket is opened by the first message sent (which must be
//! `initialize`); the connection id is the `Acp-Connection-Id` of the 101
//! answer. Messages are queued in submission order and written by one task,
//! which writes every queued message before one flush. Frames from the
//! server are delivered as they come, through the same duplicate check as
//! the HTTP transport.
//!
//! No replay: a WebSocket cannot rejoin its connection, so a socket that
//! drops (or a server that closes it) ends [`Incoming`](crate::Incoming)
//! with an error; answers and updates in flight at that moment are lost.
//! The server keeps the sessions, so a new connection can `session/load`
//! them.

use crate::error::{Error, HttpFailure, Problem};
use crate::link::{CLOSE_TIMEOUT, Link, Outgoing};
use crate::shared::{ConnectionId, Shared};
use futures::{SinkExt, StreamExt};
use reqwest::Url;
use reqwest::header::HeaderValue;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{self, Message};

/// Most bytes one socket read asks for: tungstenite zero-fills this much
/// before every read (128 KiB by default); messages are mostly small, and a
/// big one is still read whole, in more reads.
const READ_CHUNK: usize = 16 * 1024;

impl Link {
    /// Queues `text` for the socket (starting the socket task on first
    /// use); the receiver says when it was written. Synchronous, so
    /// messages go out in the order they were queued.
    pub(crate) fn queue(
        &self,
        shared: &Arc<Shared>,
        text: String,
    ) -> Result<oneshot::Receiver<Result<(), Error>>, Error> {
        // Held until the message is queued, so a socket task that failed to
        // connect and hands the receiver back cannot strand it.
        let mut idle = self.receiver.lock();
        if idle.is_some() {
            let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
                Error::InvalidOptions("the WebSocket transport needs a Tokio runtime".to_owned())
            })?;
            if let Some(receiver) = idle.take() {
                runtime.spawn(run(Arc::clone(shared), receiver));
            }
        }
        let (written, told) = oneshot::channel();
        self.queue
            .send(Outgoing { text, written })
            .map_err(|_| Error::Closed)?;
        drop(idle);
        Ok(told)
    }
}

/// The socket task: connect, then relay until the connection is closed or
/// the socket is gone. A failed handshake fails the queued messages (none
/// reached the server) and leaves the next message to try again, as a
/// failed POST does; a lost socket ends `Incoming` with the error.
async fn run(shared: Arc<Shared>, mut receiver: mpsc::UnboundedReceiver<Outgoing>) {
    let Some(link) = shared.websocket.as_ref() else {
        return;
    };
    let socket = match connect(&shared, &link.url).await {
        Ok(socket) => socket,
        Err(error) => {
            let mut idle = link.receiver.lock();
            while let Ok(outgoing) = receiver.try_recv() {
                let _ = outgoing.written.send(Err(copy(&error)));
            }
            if shared.closed.is_cancelled() {
                link.done.cancel();
            } else {
                *idle = Some(receiver);
            }
            return;
        }
    };
    let outcome = relay(&shared, socket, &mut receiver).await;
    receiver.close();
    while let Ok(outgoing) = receiver.try_recv() {
        let error = outcome.as_ref().err().map_or(Error::Closed, copy);
        let _ = outgoing.written.send(Err(error));
    }
    link.done.cancel();
    if let Err(error) = outcome
        && !shared.closed.is_cancelled()
    {
        shared.fail(error);
    }
}

/// The same failure again, for each message it fails.
fn copy(error: &Error) -> Error {
    match error {
        Error::Http(failure) => Error::Http(failure.clone()),
        Error::WebSocketConnect(text) => Error::WebSocketConnect(text.clone()),
        other => Error::WebSocket(other.to_string()),
    }
}

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The opening handshake, with the connection's headers (bearer token
/// included); records the connection id of the 101 answer.
async fn connect(shared: &Shared, url: &Url) -> Result<Socket, Error> {
    let mut request = url
        .as_str()
        .into_client_request()
        .map_err(|error| Error::InvalidOptions(format!("WebSocket URL {url}: {error}")))?;
    for (name, value) in &shared.headers {
        request.headers_mut().append(name, value.clone());
    }
    let config = WebSocketConfig::default()
        .max_message_size(Some(shared.max_message_bytes))
        .max_frame_size(Some(shared.max_message_bytes))
        .read_buffer_size(READ_CHUNK);
    let handshake = tokio_tungstenite::connect_async_with_config(request, Some(config), true);
    let connected = match shared.connect_timeout {
        Some(limit) => tokio::time::timeout(limit, handshake).await.map_err(|_| {
            Error::WebSocketConnect(format!("no answer to the upgrade within {limit:?}"))
        })?,
        None => handshake.await,
    };
    let (socket, response) = connected.map_err(handshake_error)?;
    if let Some(value) = response.headers().get(&shared.connection_id_header)
        && let Ok(text) = value.to_str()
    {
        shared.set_connection_id(ConnectionId {
            header: HeaderValue::from_bytes(value.as_bytes())
                .map_err(|_| Error::InvalidResponse("bad connection id".to_owned()))?,
            text: text.trim().to_owned(),
        });
    }
    Ok(socket)
}

/// A failed handshake as this crate's error: a refusal with a status (401,
/// 404, 503, …) is [`Error::Http`] with its problem document.
fn handshake_error(error: tungstenite::Error) -> Error {
    match error {
        tungstenite::Error::Http(response) => {
            let problem = response
                .body()
                .as_deref()
                .and_then(|body| std::str::from_utf8(body).ok())
                .and_then(Problem::parse)
                .map(Box::new);
            Error::Http(HttpFailure {
                status: response.status(),
                problem,
            })
        }
        tungstenite::Error::Io(error) => Error::WebSocketConnect(error.to_string()),
        other => Error::WebSocket(other.to_string()),
    }
}

/// Relays until the connection is closed on this side (`Ok`) or the
/// socket ends (`Err`).
async fn relay(
    shared: &Shared,
    socket: Socket,
    receiver: &mut mpsc::UnboundedReceiver<Outgoing>,
) -> Result<(), Error> {
    let (mut sink, mut source) = socket.split();
    let idle = shared.stream_idle_timeout;
    let mut deadline = idle.map(|idle| Instant::now() + idle);
    let mut batch = Vec::new();
    loop {
        let silence = async {
            match deadline {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = shared.closed.cancelled() => {
                let frame = tungstenite::protocol::CloseFrame {
                    code: CloseCode::Normal,
                    reason: "client closed the connection".into(),
                };
                let _ = tokio::time::timeout(CLOSE_TIMEOUT, sink.send(Message::Close(Some(frame)))).await;
                return Ok(());
            }
            count = receiver.recv_many(&mut batch, 256) => {
                if count == 0 {
                    return Ok(());
                }
                // Every queued message, then one flush.
                let write = async {
                    for outgoing in &mut batch {
                        let text = std::mem::take(&mut outgoing.text);
                        sink.feed(Message::text(text)).await?;
                    }
                    sink.flush().await
                };
                let written = match idle {
                    Some(limit) => tokio::time::timeout(limit, write).await.unwrap_or_else(|_| {
                        Err(tungstenite::Error::Io(std::io::ErrorKind::TimedOut.into()))
                    }),
                    None => write.await,
                };
                let failed = written.as_ref().err().map(ToString::to_string);
                for outgoing in batch.drain(..) {
                    let result = match &failed {
                        None => Ok(()),
                        Some(text) => Err(Error::WebSocket(text.clone())),
                    };
                    let _ = outgoing.written.send(result);
                }
                if let Some(text) = failed {
                    return Err(Error::WebSocket(format!("writing to the WebSocket failed: {text}")));
                }
            }
            frame = source.next() => {
                deadline = idle.map(|idle| Instant::now() + idle);
                match frame {
                    Some(Ok(Message::Text(text))) => shared.deliver(text.as_str().to_owned()),
                    Some(Ok(Message::Close(frame))) => {
                        let why = frame.map_or_else(
                            || "no close code".to_owned(),
                            |f| format!("{}: {}", u16::from(f.code), f.reason),
                        );
                        return Err(Error::WebSocket(format!("the server closed the WebSocket ({why})")));
                    }
                    // Pings are answered by tungstenite; binary frames mean nothing here.
                    Some(Ok(_)) => {}
                    Some(Err(error)) => return Err(Error::WebSocket(error.to_string())),
                    None => return Err(Error::WebSocket("the server closed the WebSocket".to_owned())),
                }
            }
            () = silence => {
                if let Some(limit) = idle {
                    return Err(Error::StreamIdle(limit));
                }
            }
        }
    }
}
