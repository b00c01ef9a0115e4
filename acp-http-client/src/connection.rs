//! One ACP-over-HTTP connection: a POST per outgoing message, one merged
//! and de-duplicated stream of incoming messages, the connection id, close.

use crate::error::{Error, HttpFailure};
use crate::in_flight::InFlight;
use crate::link::Link;
use crate::options::{Direction, Transport, TransportOptions};
use crate::protocol::{
    self, ACP_SESSION_ID_HEADER, APPLICATION_JSON, INITIALIZE, Kind, LAST_EVENT_ID_HEADER,
};
use crate::shared::{ConnectionId, IdState, PostFailure, Shared};
use crate::sse;
use futures::StreamExt;
use futures::channel::mpsc;
use parking_lot::Mutex;
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How long the POST of a notification or response may take when no request
/// timeout is configured: the server acknowledges those at once (202)
/// without waiting for the agent, and closing a transport waits for them.
const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_secs(30);
/// A handle to one ACP-over-HTTP connection; cheap to clone, all clones
/// share the connection.
///
/// Created with [`HttpConnection::new`], which also returns the
/// connection's [`Incoming`] stream. Send the `initialize` request first:
/// its response names the connection id, after which the event stream is
/// opened. Messages sent before that response arrived wait for it.
///
/// Needs a Tokio runtime. When the last handle is dropped without
/// [`close`](Self::close), the connection is closed in the background (if a
/// runtime is still there).
#[derive(Clone)]
pub struct HttpConnection {
    owner: Arc<Owner>,
}

/// Every incoming JSON-RPC message of one connection, in arrival order:
/// responses from POST bodies and everything from the event stream, each
/// response once (see the crate docs). Each item is one JSON-RPC message as
/// raw JSON text.
///
/// Ends after [`HttpConnection::close`], or after an `Err` item when the
/// event stream is gone for good ([`Error::StreamLost`], or
/// [`Error::Http`] with 404 when the server no longer knows the
/// connection). Unbounded: read it.
#[derive(Debug)]
pub struct Incoming {
    rx: mpsc::UnboundedReceiver<Result<String, Error>>,
}

impl Incoming {
    /// The next incoming message; `None` once the stream ended.
    pub async fn recv(&mut self) -> Option<Result<String, Error>> {
        self.rx.next().await
    }
}

impl futures::Stream for Incoming {
    type Item = Result<String, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_next_unpin(cx)
    }
}

impl HttpConnection {
    /// A connection to the endpoint `options` describe, and its incoming
    /// stream. Nothing is sent yet.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] when the token is not a valid header value
    /// or the HTTP client cannot be built.
    pub fn new(options: TransportOptions) -> Result<(HttpConnection, Incoming), Error> {
        let mut builder = reqwest::Client::builder();
        if let Some(timeout) = options.connect_timeout {
            builder = builder.connect_timeout(timeout);
        }
        let http = builder
            .build()
            .map_err(|e| Error::InvalidOptions(format!("cannot build the HTTP client: {e}")))?;
        let mut headers = options.headers.clone();
        if let Some(token) = &options.token {
            let mut value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
                Error::InvalidOptions("the token is not a valid header value".to_owned())
            })?;
            value.set_sensitive(true);
            headers.insert(AUTHORIZATION, value);
        }
        let (tx, rx) = mpsc::unbounded();
        let endpoint = options.endpoint();
        let websocket = match options.transport {
            Transport::WebSocket => Some(Link::new(&endpoint)?),
            _ => None,
        };
        let shared = Arc::new(Shared {
            http,
            endpoint,
            connect_timeout: options.connect_timeout,
            session_header: options.transport == Transport::AcpHttp,
            websocket,
            connection_id_header: options.connection_id_header,
            headers,
            request_timeout: options.request_timeout,
            stream_idle_timeout: options.stream_idle_timeout,
            max_message_bytes: options.max_message_bytes,
            reconnect: options.reconnect,
            observer: options.observer,
            state: watch::Sender::new(IdState::default()),
            in_flight: Mutex::new(InFlight::default()),
            incoming: tx,
            closed: CancellationToken::new(),
            stream_position: watch::Sender::new(0),
            close_started: AtomicBool::new(false),
        });
        let connection = HttpConnection {
            owner: Arc::new(Owner { shared }),
        };
        Ok((connection, Incoming { rx }))
    }

    /// POSTs one JSON-RPC message (a request, a notification, or the answer
    /// to a request from the agent) and waits for the HTTP exchange.
    ///
    /// A request's response arrives on [`Incoming`], whether it came in the
    /// 200 body or later on the event stream. A message other than
    /// `initialize` sent before the connection id is known waits for the
    /// `initialize` response.
    ///
    /// # Errors
    /// - [`Error::InvalidMessage`]: `message` is not one JSON object.
    /// - [`Error::Http`]: the server answered non-2xx (with its problem
    ///   document).
    /// - [`Error::Request`]: the exchange failed. If the request may have
    ///   reached the server (anything but a connect failure) its response
    ///   can still arrive on [`Incoming`].
    /// - [`Error::NotConnected`]: not `initialize`, no connection id, and no
    ///   `initialize` under way.
    /// - [`Error::Closed`]: the connection was closed.
    ///
    /// The message is recorded when the returned future is first polled;
    /// callers that run several sends concurrently and need them recorded
    /// in call order (a pipelined `initialize` first) use
    /// [`submit`](Self::submit).
    pub async fn send(&self, message: String) -> Result<(), Error> {
        let shared = &self.owner.shared;
        let prepared = shared.prepare(message).map_err(|f| f.error)?;
        shared.execute(prepared).await.map_err(|f| f.error)
    }

    /// Records one JSON-RPC message now and returns the future that POSTs
    /// it; the raw layer for relays that answer failed requests themselves.
    ///
    /// Unlike [`send`](Self::send), the message is checked and recorded
    /// before this returns, so messages are ordered by `submit` calls even
    /// when the returned futures run on separate tasks (a message that must
    /// wait for a pipelined `initialize` finds it counted). The future owns
    /// what it needs (`'static`); dropping it unpolled sends nothing.
    ///
    /// # Errors
    /// The future fails with a [`SendError`]: the [`Error`] as for
    /// [`send`](Self::send), and [`SendError::released`] naming the
    /// request that will never be answered on [`Incoming`].
    pub fn submit(
        &self,
        message: String,
    ) -> impl Future<Output = Result<(), SendError>> + Send + 'static {
        let shared = Arc::clone(&self.owner.shared);
        let prepared = shared.prepare(message);
        async move {
            let prepared = prepared.map_err(SendError::from)?;
            shared.execute(prepared).await.map_err(SendError::from)
        }
    }

    /// The connection id the server named in the `initialize` response;
    /// `None` before that.
    pub fn connection_id(&self) -> Option<String> {
        self.owner.shared.connection_id()
    }

    /// Whether [`close`](Self::close) was called (or all handles dropped).
    pub fn is_closed(&self) -> bool {
        self.owner.shared.closed.is_cancelled()
    }

    /// Closes the connection: stops the event stream, sends DELETE (if a
    /// connection id is known) and ends [`Incoming`]. Idempotent: later
    /// calls return `Ok(())` at once. Sessions on the server live on
    /// (research/contract.md, "Transport: /v2/rpc", DELETE).
    ///
    /// # Errors
    /// [`Error::Http`] or [`Error::Request`] when the DELETE failed; the
    /// connection is closed on this side regardless.
    pub async fn close(&self) -> Result<(), Error> {
        self.owner.shared.close().await
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.owner.shared
    }
}

impl std::fmt::Debug for HttpConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpConnection")
            .field("endpoint", &self.owner.shared.endpoint.as_str())
            .field("connection_id", &self.connection_id())
            .field("closed", &self.is_closed())
            .finish()
    }
}

/// Held by user handles only (not by the transport's own tasks), so that
/// dropping the last handle closes the connection.
struct Owner {
    shared: Arc<Shared>,
}

impl Drop for Owner {
    fn drop(&mut self) {
        if self.shared.close_started.load(Ordering::Acquire) {
            return;
        }
        let shared = Arc::clone(&self.shared);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if let Err(error) = shared.close().await {
                        tracing::debug!(%error, "closing a dropped connection failed");
                    }
                });
            }
            Err(_) => shared.close_locally(),
        }
    }
}

/// An outgoing message that was checked and recorded (in submission order)
/// and is ready to be POSTed.
pub(crate) struct Prepared {
    message: String,
    kind: Kind,
    /// Present for an `initialize` sent while no connection id is known.
    initialize: Option<InitializeGuard>,
    /// Over WebSocket the message is already queued; this says when it was
    /// written.
    written: Option<tokio::sync::oneshot::Receiver<Result<(), Error>>>,
}

impl Prepared {
    /// Whether this message is a request (its POST waits for the agent).
    pub(crate) fn is_request(&self) -> bool {
        matches!(self.kind, Kind::Request { .. })
    }
}

/// A message submitted with [`HttpConnection::submit`] could not be
/// delivered.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct SendError {
    /// What went wrong.
    #[source]
    pub error: Error,
    /// Raw JSON text of the id of a request the server will never answer:
    /// it was not sent (connect failure, connection closed, no `initialize`
    /// yet), the server refused it (non-2xx), or it broke before any event
    /// stream existed that could carry a late answer. No response for it
    /// will arrive on [`Incoming`], so whoever waits for it must be
    /// answered by the caller. `None` for notifications and responses, and
    /// for a request whose POST broke after it reached the server: the
    /// server then delivers the answer on the event stream
    /// (research/contract.md, "Transport: /v2/rpc"), and it arrives on
    /// [`Incoming`] as usual.
    pub released: Option<String>,
}

impl From<PostFailure> for SendError {
    fn from(failure: PostFailure) -> Self {
        SendError {
            error: failure.error,
            released: failure.released,
        }
    }
}

/// Counts one `initialize` POST under way in [`IdState`]; settles the count
/// (and records the connection id) when finished or dropped.
struct InitializeGuard {
    shared: Option<Arc<Shared>>,
}

impl InitializeGuard {
    fn finish(mut self, header: Option<&HeaderValue>) {
        if let Some(shared) = self.shared.take() {
            shared.settle_initialize(header);
        }
    }
}

impl Drop for InitializeGuard {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            shared.settle_initialize(None);
        }
    }
}

impl Shared {
    /// Checks and records one outgoing message. Synchronous so that
    /// callers can keep submission order (a pipelined `initialize` is
    /// counted before the messages that must wait for it).
    pub(crate) fn prepare(self: &Arc<Self>, message: String) -> Result<Prepared, PostFailure> {
        let kind = protocol::classify(&message).map_err(|e| PostFailure {
            error: Error::InvalidMessage(e.to_string()),
            released: None,
            method: None,
        })?;
        if self.closed.is_cancelled() {
            return Err(PostFailure {
                error: Error::Closed,
                released: kind.request_id().map(str::to_owned),
                method: kind.method().map(str::to_owned),
            });
        }
        if let Some(id) = kind.request_id() {
            self.in_flight.lock().insert(id);
        }
        if let Some(link) = &self.websocket {
            self.observe(Direction::Outgoing, &message);
            let written = link
                .queue(self, message)
                .map_err(|error| self.release(&kind, error))?;
            return Ok(Prepared {
                message: String::new(),
                kind,
                initialize: None,
                written: Some(written),
            });
        }
        let initialize = (kind.method() == Some(INITIALIZE) && self.state.borrow().id.is_none())
            .then(|| {
                self.state
                    .send_modify(|state| state.pending_initializes += 1);
                InitializeGuard {
                    shared: Some(Arc::clone(self)),
                }
            });
        self.observe(Direction::Outgoing, &message);
        Ok(Prepared {
            message,
            kind,
            initialize,
            written: None,
        })
    }

    /// POSTs a prepared message and handles the answer: the connection id
    /// of an `initialize`, a 200 body into [`Incoming`], a problem into an
    /// error.
    pub(crate) async fn execute(self: &Arc<Self>, prepared: Prepared) -> Result<(), PostFailure> {
        let Prepared {
            message,
            kind,
            initialize,
            written,
        } = prepared;
        if let Some(written) = written {
            // A message that never reached the socket will not be answered.
            return match written.await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(error)) => Err(self.release(&kind, error)),
                Err(_) => Err(self.release(&kind, Error::Closed)),
            };
        }
        let is_initialize = kind.method() == Some(INITIALIZE);
        let connection_id = match self.connection_id_for(is_initialize).await {
            Ok(id) => id,
            Err(error) => return Err(self.release(&kind, error)),
        };

        let session = (self.session_header && !matches!(kind, Kind::Response { .. }))
            .then(|| protocol::params_session_id(&message))
            .flatten()
            .and_then(|id| HeaderValue::from_str(&id).ok());
        let mut request = self
            .http
            .post(self.endpoint.clone())
            .headers(self.headers.clone())
            .header(CONTENT_TYPE, APPLICATION_JSON)
            .header(ACCEPT, APPLICATION_JSON)
            .body(message);
        if let Some(session) = session {
            request = request.header(ACP_SESSION_ID_HEADER, session);
        }
        if let Some(id) = &connection_id {
            request = request.header(&self.connection_id_header, id.header.clone());
        }
        let timeout = match kind {
            Kind::Request { .. } => self.request_timeout,
            _ => Some(self.request_timeout.unwrap_or(DEFAULT_ACK_TIMEOUT)),
        };
        if let Some(timeout) = timeout {
            request = request.timeout(timeout);
        }
        // Without a connection id there is no event stream that could carry
        // a late answer.
        let answer_can_come_later = connection_id.is_some();

        let response = match request.send().await {
            Ok(response) => response,
            Err(error) => return Err(self.network_failure(&kind, error, answer_can_come_later)),
        };
        let status = response.status();
        if let Some(guard) = initialize {
            guard.finish(response.headers().get(&self.connection_id_header));
        }
        if !status.is_success() {
            let failure = HttpFailure::from_response(response).await;
            return Err(self.release(&kind, Error::Http(failure)));
        }
        let stream_must_reach = response
            .headers()
            .get(LAST_EVENT_ID_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        let mut response = response;
        let mut body = Vec::new();
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    if body.len() + chunk.len() > self.max_message_bytes {
                        let error = Error::InvalidResponse(format!(
                            "the body is over {} bytes",
                            self.max_message_bytes
                        ));
                        return Err(self.release(&kind, error));
                    }
                    body.extend_from_slice(&chunk);
                }
                Ok(None) => break,
                Err(error) => {
                    return Err(self.network_failure(&kind, error, answer_can_come_later));
                }
            }
        }
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(());
        }
        let (message, incoming) = match String::from_utf8(body) {
            Ok(text) => match protocol::classify(&text) {
                Ok(incoming) => (text, incoming),
                Err(_) => {
                    let head: String = text.chars().take(80).collect();
                    let error = Error::InvalidResponse(format!("{head:?}"));
                    return Err(self.release(&kind, error));
                }
            },
            Err(_) => {
                let error = Error::InvalidResponse("the body is not UTF-8".to_owned());
                return Err(self.release(&kind, error));
            }
        };
        if let Some(event_id) = stream_must_reach {
            self.wait_for_stream(event_id).await;
        }
        self.deliver_classified(message, incoming);
        Ok(())
    }

    /// One `initialize` POST finished; `header` is the connection id it
    /// named, if any. The first id opens the event stream.
    fn settle_initialize(self: &Arc<Self>, header: Option<&HeaderValue>) {
        let named = header.and_then(|value| match value.to_str() {
            Ok(text) if !text.trim().is_empty() => Some(ConnectionId {
                header: value.clone(),
                text: text.trim().to_owned(),
            }),
            _ => {
                tracing::warn!("ignoring a connection id that is not visible ASCII");
                None
            }
        });
        let mut opened = None;
        self.state.send_modify(|state| {
            state.pending_initializes = state.pending_initializes.saturating_sub(1);
            if state.id.is_none()
                && let Some(id) = named
            {
                state.id = Some(id.clone());
                opened = Some(id);
            }
        });
        let Some(id) = opened else { return };
        tracing::debug!(connection = id.text, "connection opened");
        if self.closed.is_cancelled() {
            // Closed while the initialize was under way: the server just
            // made a connection nobody will use.
            let shared = Arc::clone(self);
            tokio::spawn(async move {
                let _ = shared.delete(&id).await;
            });
        } else {
            sse::spawn(Arc::clone(self), id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    const REQUEST: &str = r#"{"jsonrpc":"2.0","id":7,"method":"x"}"#;
    const RESPONSE: &str = r#"{"jsonrpc":"2.0","id":7,"result":{}}"#;
    const NOTIFICATION: &str = r#"{"jsonrpc":"2.0","method":"n"}"#;

    fn drain(incoming: &mut Incoming) -> Vec<String> {
        let mut messages = Vec::new();
        while let Some(Some(Ok(message))) = incoming.recv().now_or_never() {
            messages.push(message);
        }
        messages
    }

    #[test]
    fn a_response_arriving_twice_is_delivered_once() -> Result<(), Error> {
        let (connection, mut incoming) =
            HttpConnection::new(TransportOptions::new("http://127.0.0.1:9")?)?;
        let shared = connection.shared();
        // Recorded as in flight; never sent (no runtime needed).
        drop(shared.prepare(REQUEST.to_owned()).map_err(|f| f.error)?);

        shared.deliver(RESPONSE.to_owned()); // in the POST body
        shared.deliver(RESPONSE.to_owned()); // and again on the stream
        shared.deliver(r#"{"jsonrpc":"2.0","id":8,"result":{}}"#.to_owned()); // never asked
        shared.deliver(NOTIFICATION.to_owned());
        shared.deliver(NOTIFICATION.to_owned()); // notifications are not de-duplicated

        assert_eq!(drain(&mut incoming), [RESPONSE, NOTIFICATION, NOTIFICATION]);
        Ok(())
    }

    #[test]
    fn a_released_request_no_longer_takes_a_late_response() -> Result<(), Error> {
        let (connection, mut incoming) =
            HttpConnection::new(TransportOptions::new("http://127.0.0.1:9")?)?;
        let shared = connection.shared();
        let prepared = shared.prepare(REQUEST.to_owned()).map_err(|f| f.error)?;
        // As after a 504: the request is answered locally...
        let failure = shared.release(&prepared.kind, Error::NotConnected);
        assert_eq!(failure.released.as_deref(), Some("7"));
        // ...so the agent's late answer on the stream is a duplicate.
        shared.deliver(RESPONSE.to_owned());
        assert!(drain(&mut incoming).is_empty());
        // Released once only.
        assert_eq!(
            shared.release(&prepared.kind, Error::NotConnected).released,
            None
        );
        Ok(())
    }

    #[test]
    fn sends_after_close_fail_and_release_their_request() -> Result<(), Error> {
        let (connection, _incoming) =
            HttpConnection::new(TransportOptions::new("http://127.0.0.1:9")?)?;
        connection.shared().close_locally();
        match connection.shared().prepare(REQUEST.to_owned()) {
            Err(PostFailure {
                error: Error::Closed,
                released: Some(id),
                ..
            }) => assert_eq!(id, "7"),
            Err(other) => panic!("unexpected failure {other:?}"),
            Ok(_) => panic!("a send after close was accepted"),
        }
        Ok(())
    }
}
