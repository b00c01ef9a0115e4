//! The connection's event stream (GET, Server-Sent Events): opened once the
//! connection id is known, reopened with `Last-Event-ID` when it drops.

use crate::backoff::Backoff;
use crate::connection::{ConnectionId, Shared, read_problem};
use crate::error::Error;
use crate::protocol::{EVENT_STREAM, EventDisposition, EventIds, LAST_EVENT_ID};
use bytes::Bytes;
use eventsource_stream::{EventStreamError, Eventsource};
use futures::{Stream, StreamExt};
use reqwest::StatusCode;
use reqwest::header::{ACCEPT, HeaderValue};
use std::sync::Arc;
use std::time::Duration;

/// Starts the event-stream task of a connection.
pub(crate) fn spawn(shared: Arc<Shared>, id: ConnectionId) {
    tokio::spawn(async move {
        if let Err(error) = run(&shared, &id).await {
            shared.fail(error);
        }
    });
}

/// Why one stream stopped.
enum StreamEnd {
    /// The connection was closed on our side.
    Closed,
    /// The server ended the stream, or it broke; reconnect.
    Dropped(Option<Error>),
}

/// Keeps the stream open until the connection is closed (`Ok`) or the
/// stream cannot be reopened (`Err`).
async fn run(shared: &Shared, id: &ConnectionId) -> Result<(), Error> {
    let mut ids = EventIds::default();
    let mut backoff = Backoff::new(shared.reconnect);
    let mut reconnecting = false;
    loop {
        if reconnecting {
            let delay = backoff.delay(fastrand::f64());
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = shared.closed.cancelled() => return Ok(()),
            }
        }
        let resume_from = match ids.last() {
            Some(last) => Some(last.to_owned()),
            // After a drop, "0" asks for everything still buffered, and
            // lets the new stream take over from a half-open old one
            // (DESIGN section 3: a GET with Last-Event-ID is a resume).
            None if reconnecting => Some("0".to_owned()),
            None => None,
        };
        reconnecting = true;
        let opened = tokio::select! {
            opened = open(shared, id, resume_from.as_deref()) => opened,
            () = shared.closed.cancelled() => return Ok(()),
        };
        match opened {
            Ok(response) => {
                backoff.reset();
                ids.start_stream();
                tracing::debug!(resume_from, "event stream open");
                match read(shared, response, &mut ids).await {
                    StreamEnd::Closed => return Ok(()),
                    StreamEnd::Dropped(error) => {
                        tracing::debug!(
                            error = error.map(|e| e.to_string()),
                            "event stream dropped"
                        );
                    }
                }
            }
            Err(error) if is_final(&error) => return Err(error),
            Err(error) => {
                tracing::debug!(%error, failures = backoff.failures() + 1, "event stream did not open");
                if !backoff.record_failure() {
                    return Err(Error::StreamLost {
                        attempts: backoff.failures(),
                        last: Box::new(error),
                    });
                }
            }
        }
    }
}

/// A status after which retrying cannot help: 404 means the connection is
/// gone, and other client errors (bad token, bad `Last-Event-ID`) repeat
/// on every attempt. 408, 409 (another stream still live) and 429 are
/// worth retrying, and so is every server error.
fn is_final(error: &Error) -> bool {
    match error.status() {
        Some(status) => {
            status.is_client_error()
                && !matches!(
                    status,
                    StatusCode::REQUEST_TIMEOUT
                        | StatusCode::CONFLICT
                        | StatusCode::TOO_MANY_REQUESTS
                )
        }
        None => false,
    }
}

/// One GET: the response head of the stream, or why there is none.
async fn open(
    shared: &Shared,
    id: &ConnectionId,
    resume_from: Option<&str>,
) -> Result<reqwest::Response, Error> {
    let mut request = shared
        .http
        .get(shared.endpoint.clone())
        .headers(shared.headers.clone())
        .header(ACCEPT, EVENT_STREAM)
        .header(&shared.connection_id_header, id.header.clone());
    if let Some(last) = resume_from.and_then(|last| HeaderValue::from_str(last).ok()) {
        request = request.header(LAST_EVENT_ID, last);
    }
    let sent = request.send();
    let response = match shared.stream_idle_timeout {
        Some(limit) => tokio::time::timeout(limit, sent)
            .await
            .map_err(|_| Error::StreamIdle(limit))??,
        None => sent.await?,
    };
    let status = response.status();
    if status.is_success() {
        Ok(response)
    } else {
        let problem = read_problem(response).await;
        Err(Error::Http { status, problem })
    }
}

/// Reads events until the stream ends, breaks, or the connection closes.
async fn read(shared: &Shared, response: reqwest::Response, ids: &mut EventIds) -> StreamEnd {
    let mut events = idle_limited(response.bytes_stream(), shared.stream_idle_timeout)
        .eventsource()
        .boxed();
    loop {
        let next = tokio::select! {
            next = events.next() => next,
            () = shared.closed.cancelled() => return StreamEnd::Closed,
        };
        let event = match next {
            None => return StreamEnd::Dropped(None),
            Some(Err(error)) => return StreamEnd::Dropped(Some(event_error(error))),
            Some(Ok(event)) => event,
        };
        if event.event != "message" {
            tracing::debug!(
                event = event.event,
                "ignoring an event that is not a message"
            );
            continue;
        }
        match ids.classify(&event.id) {
            EventDisposition::Duplicate => {
                tracing::debug!(id = event.id, "dropping a replayed event");
            }
            EventDisposition::Fresh => {
                shared.deliver(event.data);
                if let Ok(id) = event.id.trim().parse::<u64>() {
                    shared.stream_delivered(id);
                }
            }
            EventDisposition::Unsequenced => {
                // For example sandbox-agent's stream-gap notice: surfaced
                // like any message, but it does not move the resume point.
                tracing::debug!("event without id");
                shared.deliver(event.data);
            }
        }
    }
}

/// The stream's bytes, ending with [`Error::StreamIdle`] when nothing
/// (not even a heartbeat comment) arrives for `limit`.
fn idle_limited(
    bytes: impl Stream<Item = reqwest::Result<Bytes>> + Send + 'static,
    limit: Option<Duration>,
) -> impl Stream<Item = Result<Bytes, Error>> + Send + 'static {
    futures::stream::unfold(Some(bytes.boxed()), move |bytes| async move {
        let mut bytes = bytes?;
        let next = match limit {
            Some(limit) => match tokio::time::timeout(limit, bytes.next()).await {
                Ok(next) => next,
                Err(_) => return Some((Err(Error::StreamIdle(limit)), None)),
            },
            None => bytes.next().await,
        };
        next.map(|item| (item.map_err(Error::Request), Some(bytes)))
    })
}

fn event_error(error: EventStreamError<Error>) -> Error {
    match error {
        EventStreamError::Transport(error) => error,
        EventStreamError::Utf8(error) => Error::EventStream(error.to_string()),
        EventStreamError::Parser(error) => Error::EventStream(error.to_string()),
    }
}
