//! What a connection's handles, its POST tasks and its incoming stream's
//! task (SSE or WebSocket) share: the endpoint and settings, the
//! connection id, the requests in flight, the incoming queue, close. The
//! tasks (`sse`, `websocket`) and the handle (`connection`) all stand on
//! it; it starts none of them.

use crate::backoff::ReconnectPolicy;
use crate::error::{Error, HttpFailure};
use crate::in_flight::InFlight;
use crate::link::Link;
use crate::options::{Direction, EnvelopeObserver};
use crate::protocol::{self, Kind};
use futures::channel::mpsc;
use parking_lot::Mutex;
use reqwest::Url;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How long a DELETE may take when no request timeout is configured.
pub(crate) const DEFAULT_CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest an answer waits for the event stream to deliver the events the
/// server released before it.
pub(crate) const STREAM_CATCH_UP: Duration = Duration::from_secs(30);

/// State shared by the handles, the POST tasks and the event-stream task.
pub(crate) struct Shared {
    /// HTTP client (and its connection pool) for every request.
    pub(crate) http: reqwest::Client,
    /// The endpoint URL (POST, GET and DELETE all go here).
    pub(crate) endpoint: Url,
    /// Limit on establishing a connection (the WebSocket handshake).
    pub(crate) connect_timeout: Option<Duration>,
    /// The socket of [`Transport::WebSocket`]; `None` for HTTP.
    pub(crate) websocket: Option<Link>,
    /// Send `Acp-Session-Id` with messages naming a session
    /// ([`Transport::AcpHttp`]).
    pub(crate) session_header: bool,
    /// Name of the connection-id header.
    pub(crate) connection_id_header: HeaderName,
    /// `Authorization` and the caller's extra headers, on every request.
    pub(crate) headers: HeaderMap,
    /// Limit on one POST exchange; `None`: no limit.
    pub(crate) request_timeout: Option<Duration>,
    /// Silence on the event stream after which it is reopened.
    pub(crate) stream_idle_timeout: Option<Duration>,
    /// Largest POST answer body and event-stream line, in bytes.
    pub(crate) max_message_bytes: usize,
    /// Event-stream reconnect timing.
    pub(crate) reconnect: ReconnectPolicy,
    /// The caller's envelope hook.
    pub(crate) observer: Option<EnvelopeObserver>,
    /// The connection id once known, and how many `initialize` POSTs that
    /// could name it are under way; sends without an id wait on this.
    pub(crate) state: watch::Sender<IdState>,
    /// Our requests waiting for their response (exactly-once delivery).
    pub(crate) in_flight: Mutex<InFlight>,
    /// Feeds [`Incoming`].
    pub(crate) incoming: mpsc::UnboundedSender<Result<String, Error>>,
    /// Cancelled by close: stops the event stream and waiting sends.
    pub(crate) closed: CancellationToken,
    /// Set by the first close, so DELETE is sent once.
    pub(crate) close_started: AtomicBool,
    /// Id of the newest event the stream delivered; POST answers that name a
    /// newer one (`x-acp-last-event-id`) wait for it.
    pub(crate) stream_position: watch::Sender<u64>,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct IdState {
    pub(crate) id: Option<ConnectionId>,
    pub(crate) pending_initializes: usize,
}

/// The connection id, as sent (header value) and as shown (text).
#[derive(Debug, Clone)]
pub(crate) struct ConnectionId {
    pub(crate) header: HeaderValue,
    pub(crate) text: String,
}

/// Why a POST failed, and whether that released a request.
#[derive(Debug)]
pub(crate) struct PostFailure {
    pub(crate) error: Error,
    /// The raw id text of a request that the server will never answer (it
    /// was not sent, or the server refused it); it is no longer in flight,
    /// so whoever waits for it must be answered here.
    pub(crate) released: Option<String>,
    /// The method of the failed message, for logs.
    pub(crate) method: Option<String>,
}

impl Shared {
    pub(crate) fn connection_id(&self) -> Option<String> {
        self.state.borrow().id.as_ref().map(|id| id.text.clone())
    }

    /// Waits until the event stream delivered event `event_id`, so an answer
    /// never overtakes the updates the agent wrote before it. Gives up when
    /// the connection closes or after [`STREAM_CATCH_UP`] (the stream is then
    /// down; the answer is delivered rather than held forever).
    pub(crate) async fn wait_for_stream(&self, event_id: u64) {
        let mut position = self.stream_position.subscribe();
        tokio::select! {
            _ = position.wait_for(|delivered| *delivered >= event_id) => {}
            () = self.closed.cancelled() => {}
            () = tokio::time::sleep(STREAM_CATCH_UP) => {
                tracing::debug!(event_id, "event stream did not catch up; delivering the answer anyway");
            }
        }
    }

    /// Records that the event stream delivered event `event_id`.
    pub(crate) fn stream_delivered(&self, event_id: u64) {
        self.stream_position.send_if_modified(|position| {
            let newer = event_id > *position;
            if newer {
                *position = event_id;
            }
            newer
        });
    }

    /// Delivers one incoming message (a POST body or an SSE event's data),
    /// dropping a response whose request is no longer in flight.
    pub(crate) fn deliver(&self, message: String) {
        match protocol::classify(&message) {
            Ok(kind) => self.deliver_classified(message, kind),
            Err(error) => {
                let head: String = message.chars().take(80).collect();
                tracing::warn!(%error, head, "dropping an event that is not a JSON-RPC message");
            }
        }
    }

    /// [`deliver`](Self::deliver) for a message already classified as `kind`.
    pub(crate) fn deliver_classified(&self, message: String, kind: Kind) {
        if let Kind::Response { id } = &kind
            && !self.in_flight.lock().take(id)
        {
            tracing::debug!(id, "dropping a duplicate response");
            return;
        }
        self.push(message);
    }

    /// Delivers a message without the duplicate check (an answer made up
    /// for a released request).
    pub(crate) fn push(&self, message: String) {
        self.observe(Direction::Incoming, &message);
        if self.incoming.unbounded_send(Ok(message)).is_err() {
            tracing::debug!("incoming stream closed; message dropped");
        }
    }

    /// Ends [`Incoming`] with `error` (the event stream is gone for good).
    pub(crate) fn fail(&self, error: Error) {
        tracing::warn!(%error, "event stream ended");
        let _ = self.incoming.unbounded_send(Err(error));
        self.incoming.close_channel();
    }

    pub(crate) async fn close(&self) -> Result<(), Error> {
        if self.close_started.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.closed.cancel();
        if let Some(link) = &self.websocket {
            // Closing the socket closes the connection on the server.
            link.wait_closed().await;
            self.incoming.close_channel();
            return Ok(());
        }
        let id = self.state.borrow().id.clone();
        let result = match id {
            Some(id) => self.delete(&id).await,
            None => Ok(()),
        };
        self.incoming.close_channel();
        result
    }

    /// Close without I/O (no runtime to send DELETE on).
    pub(crate) fn close_locally(&self) {
        self.close_started.store(true, Ordering::Release);
        self.closed.cancel();
        self.incoming.close_channel();
    }

    pub(crate) async fn delete(&self, id: &ConnectionId) -> Result<(), Error> {
        let response = self
            .http
            .delete(self.endpoint.clone())
            .headers(self.headers.clone())
            .header(&self.connection_id_header, id.header.clone())
            .timeout(self.request_timeout.unwrap_or(DEFAULT_CLOSE_TIMEOUT))
            .send()
            .await?;
        if response.status().is_success() {
            tracing::debug!(connection = id.text, "connection closed");
            Ok(())
        } else {
            Err(Error::Http(HttpFailure::from_response(response).await))
        }
    }

    /// Waits until the connection id is known, unless this is an
    /// `initialize` (which goes without one when none is known yet).
    pub(crate) async fn connection_id_for(
        &self,
        is_initialize: bool,
    ) -> Result<Option<ConnectionId>, Error> {
        let mut state = self.state.subscribe();
        loop {
            {
                let current = state.borrow_and_update();
                if let Some(id) = &current.id {
                    return Ok(Some(id.clone()));
                }
                if is_initialize {
                    return Ok(None);
                }
                if current.pending_initializes == 0 {
                    return Err(Error::NotConnected);
                }
            }
            tokio::select! {
                changed = state.changed() => {
                    if changed.is_err() {
                        return Err(Error::Closed);
                    }
                }
                () = self.closed.cancelled() => return Err(Error::Closed),
            }
        }
    }

    /// Records the connection id a WebSocket's 101 answer named.
    pub(crate) fn set_connection_id(&self, id: ConnectionId) {
        self.state.send_modify(|state| state.id = Some(id));
    }

    /// A failure after which the server will not answer `kind`'s request
    /// (if it is one): take it out of flight and report it released.
    pub(crate) fn release(&self, kind: &Kind, error: Error) -> PostFailure {
        let released = kind
            .request_id()
            .filter(|id| self.in_flight.lock().take(id))
            .map(str::to_owned);
        PostFailure {
            error,
            released,
            method: kind.method().map(str::to_owned),
        }
    }

    /// A POST that failed on the network. If it never reached the server
    /// (connect failure), or reached it before any event stream existed,
    /// the request is released. Otherwise the server still has it and
    /// will put the answer on the event stream (a POST's caller that went
    /// away does not cancel the request: research/contract.md,
    /// "Transport: /v2/rpc").
    pub(crate) fn network_failure(
        &self,
        kind: &Kind,
        error: reqwest::Error,
        answer_can_come_later: bool,
    ) -> PostFailure {
        if error.is_connect() || !answer_can_come_later {
            self.release(kind, Error::Request(error))
        } else {
            PostFailure {
                error: Error::Request(error),
                released: None,
                method: kind.method().map(str::to_owned),
            }
        }
    }

    pub(crate) fn observe(&self, direction: Direction, message: &str) {
        if let Some(observer) = &self.observer {
            observer(direction, message);
        }
    }
}
