//! The connection's event stream (GET, Server-Sent Events): opened once the
//! connection id is known, reopened with `Last-Event-ID` when it drops.

use crate::backoff::Backoff;
use crate::error::{Error, HttpFailure};
use crate::protocol::{EVENT_STREAM, EventDisposition, EventIds, LAST_EVENT_ID};
use crate::shared::{ConnectionId, Shared};
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
            // (research/contract.md, "Transport: /v2/rpc": a GET with
            // Last-Event-ID is a resume).
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
    if response.status().is_success() {
        Ok(response)
    } else {
        Err(Error::Http(HttpFailure::from_response(response).await))
    }
}

/// Reads events until the stream ends, breaks, or the connection closes.
async fn read(shared: &Shared, response: reqwest::Response, ids: &mut EventIds) -> StreamEnd {
    let bytes = idle_limited(response.bytes_stream(), shared.stream_idle_timeout);
    let mut events = whole_lines(bytes, shared.max_message_bytes, line_too_long)
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

/// The stream's bytes regrouped so every chunk ends at a line end (`\n`, or
/// a `\r` that is not the last byte seen, since it may be half of `\r\n`).
///
/// The SSE parser re-reads its buffered partial event on every chunk, so a
/// long line arriving in small pieces costs time quadratic in its length;
/// with whole lines each byte is parsed once. A line over `max_line` bytes
/// ends the stream with `too_long(max_line)` instead of growing memory
/// (the caller then reopens it with `Last-Event-ID`). Public for the other
/// SSE readers of this workspace (the SDK's process output).
pub fn whole_lines<E: Send + 'static>(
    bytes: impl Stream<Item = Result<Bytes, E>> + Send + 'static,
    max_line: usize,
    too_long: impl Fn(usize) -> E + Send + Sync + 'static,
) -> impl Stream<Item = Result<Bytes, E>> + Send + 'static {
    let too_long = Arc::new(too_long);
    let state = (bytes.boxed(), bytes::BytesMut::new(), false);
    futures::stream::unfold(state, move |(mut bytes, mut pending, done)| {
        let too_long = too_long.clone();
        async move {
            if done {
                return None;
            }
            loop {
                let chunk = match bytes.next().await {
                    Some(Ok(chunk)) => chunk,
                    Some(Err(error)) => return Some((Err(error), (bytes, pending, true))),
                    None if pending.is_empty() => return None,
                    None => {
                        let rest = pending.split().freeze();
                        return Some((Ok(rest), (bytes, pending, true)));
                    }
                };
                // Only the new bytes (and a held-back `\r`) can hold a line end.
                let from = pending.len().saturating_sub(1);
                pending.extend_from_slice(&chunk);
                let searchable = pending.len() - usize::from(pending.last() == Some(&b'\r'));
                if let Some(end) = pending
                    .get(from..searchable)
                    .and_then(|new| memchr::memrchr2(b'\n', b'\r', new))
                {
                    let lines = pending.split_to(from + end + 1).freeze();
                    return Some((Ok(lines), (bytes, pending, false)));
                }
                if pending.len() > max_line {
                    return Some((Err(too_long(max_line)), (bytes, pending, true)));
                }
            }
        }
    })
}

/// The error of a line over `max_line` bytes on this crate's streams.
fn line_too_long(max_line: usize) -> Error {
    Error::EventStream(format!(
        "a line of the event stream is over {max_line} bytes"
    ))
}

fn event_error(error: EventStreamError<Error>) -> Error {
    match error {
        EventStreamError::Transport(error) => error,
        EventStreamError::Utf8(error) => Error::EventStream(error.to_string()),
        EventStreamError::Parser(error) => Error::EventStream(error.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `chunks` through [`whole_lines`] with `max_line`.
    async fn regroup(chunks: &[&str], max_line: usize) -> Vec<Result<String, String>> {
        let input: Vec<Result<Bytes, Error>> = chunks
            .iter()
            .map(|c| Ok(Bytes::copy_from_slice(c.as_bytes())))
            .collect();
        whole_lines(futures::stream::iter(input), max_line, line_too_long)
            .map(|item| {
                item.map(|b| String::from_utf8_lossy(&b).into_owned())
                    .map_err(|e| e.to_string())
            })
            .collect()
            .await
    }

    #[tokio::test]
    async fn chunks_are_regrouped_at_line_ends_without_losing_a_byte() {
        let chunks = [
            "da",
            "ta: a",
            "\n\nid: 2\r",
            "\ndata: b\r",
            "\r",
            "data",
            ": c\n",
            "\n",
            "tail",
        ];
        let out = regroup(&chunks, 1024).await;
        let joined: String = out.iter().map(|r| r.clone().unwrap_or_default()).collect();
        assert_eq!(joined, chunks.concat());
        let (last, whole) = out.split_last().expect("output");
        for chunk in whole {
            let chunk = chunk.as_ref().expect("no error");
            assert!(
                chunk.ends_with('\n') || chunk.ends_with('\r'),
                "{chunk:?} does not end at a line end"
            );
        }
        assert_eq!(last.as_deref(), Ok("tail"), "the rest comes at the end");
        // A `\r` that may be half of `\r\n` is held back.
        assert!(
            !out.iter().any(|c| c.as_deref() == Ok("\nid: 2\r")),
            "{out:?}"
        );
    }

    #[tokio::test]
    async fn a_line_over_the_limit_ends_the_stream() {
        let out = regroup(&["data: ", "0123456789", "0123456789", "\n\n"], 16).await;
        assert_eq!(out.len(), 1, "{out:?}");
        let error = out[0].clone().expect_err("over the limit");
        assert!(error.contains("over 16 bytes"), "{error}");
        // Many short lines are fine whatever their total.
        let many = vec!["data: x\n\n"; 100];
        let out = regroup(&many, 16).await;
        assert!(out.iter().all(Result::is_ok), "{out:?}");
    }

    #[tokio::test]
    async fn events_parse_the_same_after_regrouping() {
        let chunks = [
            "id: 1\r",
            "\ndata: {\"a\"",
            ":1}\r\n\r",
            "\nid: 2\ndata: x\n\n",
        ];
        let input: Vec<Result<Bytes, Error>> = chunks
            .iter()
            .map(|c| Ok(Bytes::copy_from_slice(c.as_bytes())))
            .collect();
        let events: Vec<(String, String)> =
            whole_lines(futures::stream::iter(input), 1024, line_too_long)
                .eventsource()
                .map(|e| e.map(|e| (e.id, e.data)).expect("event"))
                .collect()
                .await;
        assert_eq!(
            events,
            [
                ("1".to_owned(), "{\"a\":1}".to_owned()),
                ("2".to_owned(), "x".to_owned())
            ]
        );
    }
}
