//! The connection's Server-Sent Events stream (`GET /v2/rpc`;
//! research/contract.md, "Transport: /v2/rpc"), parsed by
//! `eventsource-stream`.
//!
//! Framing per the contract: `event: message`, `id: <sequence>`, `data: <one
//! JSON object on one line>`; the `_sandboxagent/stream/gap` notice has no
//! `id:` line. The SSE parser keeps the "last event ID" across events (as
//! the SSE spec says), so an event whose id equals the previous event's id
//! had no `id:` line of its own and is reported with `id: None`. The server
//! never repeats a sequence id, so this loses nothing: a duplicated event
//! still shows up as a second event with the same payload.

use std::pin::Pin;
use std::time::{Duration, Instant};

use eventsource_stream::{Event, EventStreamError, Eventsource};
use futures::{Stream, StreamExt};
use reqwest::header::HeaderMap;
use serde_json::Value;

type EventResults =
    Pin<Box<dyn Stream<Item = Result<Event, EventStreamError<reqwest::Error>>> + Send>>;

/// One SSE event.
#[derive(Debug, Clone, PartialEq)]
pub struct SseEvent {
    /// The sequence id from the event's own `id:` line; `None` when the
    /// event had none (the gap notice).
    pub id: Option<u64>,
    /// The `event:` name (`message` when absent, per the SSE spec).
    pub event: String,
    /// The `data:` payload, parsed (one JSON-RPC object).
    pub data: Value,
}

impl SseEvent {
    /// `data.method`, for requests and notifications.
    pub fn method(&self) -> Option<&str> {
        self.data.get("method").and_then(Value::as_str)
    }

    /// `data.params` (`Null` when absent).
    pub fn params(&self) -> &Value {
        self.data.get("params").unwrap_or(&Value::Null)
    }

    /// `params.sessionId`.
    pub fn session_id(&self) -> Option<&str> {
        self.params().get("sessionId").and_then(Value::as_str)
    }

    /// For a `session/update`: `params.update.sessionUpdate`.
    pub fn update_kind(&self) -> Option<&str> {
        if self.method() != Some("session/update") {
            return None;
        }
        self.params()["update"]["sessionUpdate"].as_str()
    }

    /// For a `session/update`: `params.update`.
    pub fn update(&self) -> Option<&Value> {
        (self.method() == Some("session/update")).then(|| &self.params()["update"])
    }

    /// The text of an `agent_message_chunk` update.
    pub fn agent_text(&self) -> Option<&str> {
        self.chunk_text("agent_message_chunk")
    }

    /// The text of a `<kind>` chunk update (`agent_message_chunk`,
    /// `user_message_chunk`, ...).
    pub fn chunk_text(&self, kind: &str) -> Option<&str> {
        if self.update_kind() != Some(kind) {
            return None;
        }
        self.params()["update"]["content"]["text"].as_str()
    }

    /// Whether this is a JSON-RPC response (no `method`) with this `id`.
    pub fn is_response_to(&self, id: &Value) -> bool {
        self.method().is_none() && self.data.get("id") == Some(id)
    }
}

/// How waiting for the next event turned out.
#[derive(Debug)]
pub enum Next {
    /// An event arrived.
    Event(SseEvent),
    /// The server ended the response body cleanly.
    Ended,
    /// The transport failed (connection reset, truncated chunked body, ...)
    /// or the bytes were not valid SSE.
    Failed(String),
    /// Nothing within the timeout.
    TimedOut,
}

/// An open event stream; dropping it closes the HTTP connection (the
/// client's way to "drop" the stream mid-flight).
pub struct SseStream {
    /// Response headers of the `GET`.
    pub headers: HeaderMap,
    /// Parsed events.
    events: EventResults,
    /// The parser's last-event-id buffer after the previous event.
    previous_id: String,
    /// Every event received so far, in order.
    pub history: Vec<SseEvent>,
}

impl SseStream {
    /// Wraps a `200` response of `GET /v2/rpc`.
    pub fn new(response: reqwest::Response) -> SseStream {
        let headers = response.headers().clone();
        Self::from_bytes(headers, response.bytes_stream())
    }

    /// Wraps any byte stream (the body of a `GET /v2/rpc`).
    pub fn from_bytes<S>(headers: HeaderMap, bytes: S) -> SseStream
    where
        S: Stream<Item = reqwest::Result<bytes::Bytes>> + Send + 'static,
    {
        SseStream {
            headers,
            events: Box::pin(bytes.eventsource()),
            previous_id: String::new(),
            history: Vec::new(),
        }
    }

    /// One response header's value as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Waits up to `timeout` for the next event.
    ///
    /// # Panics
    /// If an event's `id:` is not an integer or its data is not one JSON
    /// object on one line (framing violations are failures, not outcomes).
    pub async fn try_next(&mut self, timeout: Duration) -> Next {
        match tokio::time::timeout(timeout, self.events.next()).await {
            Err(_) => Next::TimedOut,
            Ok(None) => Next::Ended,
            Ok(Some(Err(error))) => Next::Failed(error.to_string()),
            Ok(Some(Ok(raw))) => {
                let event = self.convert(raw);
                self.history.push(event.clone());
                Next::Event(event)
            }
        }
    }

    /// The next event, within `timeout`.
    ///
    /// # Panics
    /// If the stream ends, fails or stays quiet.
    pub async fn next_event(&mut self, timeout: Duration) -> SseEvent {
        match self.try_next(timeout).await {
            Next::Event(event) => event,
            other => panic!(
                "expected an SSE event, got {other:?}; events so far: {:#?}",
                self.history
            ),
        }
    }

    /// Skips events until one matches `pred` and returns it; the whole wait
    /// is bounded by `timeout`. Skipped events stay in [`SseStream::history`].
    ///
    /// # Panics
    /// If none matches in time or the stream ends first.
    pub async fn next_event_matching(
        &mut self,
        mut pred: impl FnMut(&SseEvent) -> bool,
        timeout: Duration,
    ) -> SseEvent {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.try_next(left).await {
                Next::Event(event) if pred(&event) => return event,
                Next::Event(_) => {}
                other => panic!(
                    "no matching SSE event within {timeout:?} ({other:?}); events so far: {:#?}",
                    self.history
                ),
            }
        }
    }

    /// Every event up to and including the first one matching `pred`.
    pub async fn collect_until(
        &mut self,
        mut pred: impl FnMut(&SseEvent) -> bool,
        timeout: Duration,
    ) -> Vec<SseEvent> {
        let start = self.history.len();
        self.next_event_matching(&mut pred, timeout).await;
        self.history[start..].to_vec()
    }

    /// Waits for the stream to end; returns [`Next::Ended`] or
    /// [`Next::Failed`].
    ///
    /// # Panics
    /// If an event arrives or nothing happens within `timeout`.
    pub async fn expect_end(&mut self, timeout: Duration) -> Next {
        match self.try_next(timeout).await {
            Next::Event(event) => panic!("expected the stream to end, got {event:?}"),
            Next::TimedOut => panic!("the stream did not end within {timeout:?}"),
            end => end,
        }
    }

    /// Reads until the stream ends (events are kept in the history) or
    /// `timeout` passes; returns how it ended.
    pub async fn drain_to_end(&mut self, timeout: Duration) -> Next {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.try_next(left).await {
                Next::Event(_) => {}
                end => return end,
            }
        }
    }

    /// Closes the stream from the client side (drops the connection).
    pub fn close(self) {
        drop(self);
    }

    fn convert(&mut self, raw: Event) -> SseEvent {
        let id = if raw.id == self.previous_id {
            None
        } else {
            self.previous_id = raw.id.clone();
            Some(
                raw.id
                    .parse::<u64>()
                    .unwrap_or_else(|_| panic!("SSE id is not a non-negative integer: {raw:?}")),
            )
        };
        assert!(
            !raw.data.contains('\n'),
            "SSE data must be one JSON object on one line (one data: line): {raw:?}"
        );
        let data: Value = serde_json::from_str(&raw.data)
            .unwrap_or_else(|e| panic!("SSE data is not JSON ({e}): {raw:?}"));
        assert!(
            data.is_object(),
            "SSE data must be one JSON-RPC object: {raw:?}"
        );
        SseEvent {
            id,
            event: raw.event,
            data,
        }
    }
}

/// Reads a raw `GET /v2/rpc` body until `count` SSE comment lines (lines
/// starting with `:`) were seen or `timeout` passes; returns the comment
/// lines found. Used for heartbeats, which the event parser hides.
pub async fn read_comment_lines(
    response: reqwest::Response,
    count: usize,
    timeout: Duration,
) -> Vec<String> {
    let mut bytes = Box::pin(response.bytes_stream());
    let mut pending = String::new();
    let mut comments = Vec::new();
    let deadline = Instant::now() + timeout;
    while comments.len() < count {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, bytes.next()).await {
            Ok(Some(Ok(chunk))) => pending.push_str(&String::from_utf8_lossy(&chunk)),
            _ => break,
        }
        // SSE lines end in CRLF, LF or CR.
        while let Some(end) = pending.find(['\n', '\r']) {
            let line: String = pending.drain(..=end).collect();
            let line = line.trim_end_matches(['\n', '\r']);
            if line.starts_with(':') {
                comments.push(line.to_owned());
            }
        }
    }
    comments
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream_of(text: &'static str) -> SseStream {
        let chunks = text
            .as_bytes()
            .chunks(7)
            .map(|c| Ok(bytes::Bytes::from_static(c)))
            .collect::<Vec<_>>();
        SseStream::from_bytes(HeaderMap::new(), futures::stream::iter(chunks))
    }

    const WAIT: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn events_without_an_id_line_have_no_id() {
        let mut stream = stream_of(concat!(
            "event: message\ndata: {\"method\":\"_sandboxagent/stream/gap\"}\n\n",
            ": heartbeat\n\n",
            "event: message\nid: 5\ndata: {\"n\":5}\n\n",
            "event: message\ndata: {\"method\":\"_sandboxagent/stream/gap\"}\n\n",
            "event: message\nid: 6\ndata: {\"n\":6}\n\n",
        ));
        let ids: Vec<Option<u64>> = [
            stream.next_event(WAIT).await,
            stream.next_event(WAIT).await,
            stream.next_event(WAIT).await,
            stream.next_event(WAIT).await,
        ]
        .iter()
        .map(|e| e.id)
        .collect();
        assert_eq!(ids, [None, Some(5), None, Some(6)]);
        assert!(matches!(stream.try_next(WAIT).await, Next::Ended));
        assert_eq!(stream.history.len(), 4);
    }

    #[tokio::test]
    #[should_panic(expected = "one JSON object on one line")]
    async fn data_over_several_lines_is_a_framing_error() {
        let mut stream = stream_of("id: 1\ndata: {\"a\":\ndata: 1}\n\n");
        stream.next_event(WAIT).await;
    }

    #[tokio::test]
    #[should_panic(expected = "not a non-negative integer")]
    async fn non_integer_ids_are_a_framing_error() {
        let mut stream = stream_of("id: abc\ndata: {}\n\n");
        stream.next_event(WAIT).await;
    }

    #[tokio::test]
    async fn next_event_matching_keeps_skipped_events() {
        let mut stream = stream_of("id: 1\ndata: {\"n\":1}\n\nid: 2\ndata: {\"n\":2}\n\n");
        let found = stream.next_event_matching(|e| e.data["n"] == 2, WAIT).await;
        assert_eq!(found.id, Some(2));
        assert_eq!(stream.history.len(), 2);
    }
}
