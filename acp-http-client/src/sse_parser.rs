//! The Server-Sent Events wire format read from bytes: lines into events,
//! by the HTML Living Standard's rules ("Server-sent events", section
//! 9.2.6, interpreting an event stream).
//!
//! Lean on purpose: it is on the hot path of every followed stream of this
//! workspace (a process's output arrives as 64 KiB `data:` lines). Each
//! byte is searched for a line end once (`memchr`); an event's data is a
//! slice of the received bytes when it has one `data:` line (the usual
//! case), so nothing is copied or decoded per line; only `event:` and `id:`
//! values become strings. Data stays bytes: a reader that parses JSON from
//! it (`serde_json::from_slice`) validates UTF-8 as it goes.

use bytes::{Buf, Bytes, BytesMut};
use futures::{Stream, StreamExt};
use std::sync::Arc;
use std::time::Duration;

/// A UTF-8 byte-order mark, dropped at the start of a stream.
const BOM: &[u8] = b"\xEF\xBB\xBF";

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field; `"message"` when the event had none.
    pub event: String,
    /// The last event ID: the latest `id:` field of this event or of an
    /// earlier one on the same stream (`""` before any). Invalid UTF-8 is
    /// replaced by U+FFFD, as the standard decodes the stream.
    pub id: String,
    /// The `data:` lines' values joined by `\n`, as received (not decoded:
    /// text by the standard, but checked by whoever parses it).
    pub data: Bytes,
    /// The `retry:` field of this event (reconnection time), if it had one.
    pub retry: Option<Duration>,
}

/// The data of the event being read.
#[derive(Debug, Default)]
enum Data {
    /// No `data:` line yet: an empty line dispatches nothing.
    #[default]
    None,
    /// One line: a slice of the received bytes.
    One(Bytes),
    /// Several, joined by `\n`.
    Many(BytesMut),
}

impl Data {
    fn len(&self) -> usize {
        match self {
            Self::None => 0,
            Self::One(data) => data.len(),
            Self::Many(data) => data.len(),
        }
    }

    fn push(&mut self, value: Bytes) {
        match std::mem::take(self) {
            Self::None => *self = Self::One(value),
            Self::One(first) => {
                let mut joined = BytesMut::with_capacity(first.len() + 1 + value.len());
                joined.extend_from_slice(&first);
                joined.extend_from_slice(b"\n");
                joined.extend_from_slice(&value);
                *self = Self::Many(joined);
            }
            Self::Many(mut joined) => {
                joined.extend_from_slice(b"\n");
                joined.extend_from_slice(&value);
                *self = Self::Many(joined);
            }
        }
    }
}

/// An incremental SSE parser: [`push`](Self::push) received bytes, then
/// take events with [`next_event`](Self::next_event) until it answers
/// `None`. Bytes of an unfinished line or event wait for the next push;
/// what is unfinished when the stream ends is discarded (the standard's
/// rule).
#[derive(Debug, Default)]
pub struct SseParser {
    /// Received bytes not yet read: the start of a line.
    pending: BytesMut,
    /// Bytes of `pending` already searched for a line end (they hold none).
    searched: usize,
    /// The last line ended in `\r`: a `\n` first in the next bytes is the
    /// rest of that line end.
    after_cr: bool,
    /// Past the stream's first bytes (where a byte-order mark is dropped).
    started: bool,
    /// The event being read: its `event:` value.
    event: Option<String>,
    /// Its `data:` values.
    data: Data,
    /// Its `retry:` value.
    retry: Option<Duration>,
    /// The last event ID buffer, kept across events.
    last_id: String,
}

impl SseParser {
    /// A parser at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        self.pending.extend_from_slice(bytes);
    }

    /// Bytes held that are not yet part of a dispatched event: the
    /// unfinished line plus the data of the unfinished event. A reader
    /// bounds its memory by refusing a stream where this grows past its
    /// limit.
    pub fn buffered(&self) -> usize {
        self.pending.len() + self.data.len()
    }

    /// The next complete event in the bytes pushed so far, if any.
    pub fn next_event(&mut self) -> Option<SseEvent> {
        if !self.started {
            if self.pending.len() < BOM.len() && BOM.starts_with(&self.pending) {
                return None;
            }
            if self.pending.starts_with(BOM) {
                self.pending.advance(BOM.len());
            }
            self.started = true;
        }
        loop {
            if self.after_cr && !self.pending.is_empty() {
                if self.pending[0] == b'\n' {
                    self.pending.advance(1);
                }
                self.after_cr = false;
            }
            let unsearched = self.pending.get(self.searched..).unwrap_or_default();
            let Some(found) = memchr::memchr2(b'\n', b'\r', unsearched) else {
                self.searched = self.pending.len();
                return None;
            };
            let end = self.searched + found;
            self.after_cr = self.pending[end] == b'\r';
            let line = self.pending.split_to(end).freeze();
            self.pending.advance(1);
            self.searched = 0;
            if let Some(event) = self.line(line) {
                return Some(event);
            }
        }
    }

    /// Reads one line (without its line end); an empty line dispatches.
    fn line(&mut self, line: Bytes) -> Option<SseEvent> {
        if line.is_empty() {
            return self.dispatch();
        }
        if line[0] == b':' {
            return None;
        }
        let (name, value) = match memchr::memchr(b':', &line) {
            Some(colon) => {
                let start = colon + 1 + usize::from(line.get(colon + 1) == Some(&b' '));
                (&line[..colon], line.slice(start..))
            }
            None => (&line[..], Bytes::new()),
        };
        match name {
            b"data" => self.data.push(value),
            b"event" => self.event = Some(String::from_utf8_lossy(&value).into_owned()),
            b"id" if !value.contains(&0) => {
                self.last_id = String::from_utf8_lossy(&value).into_owned();
            }
            b"retry" if !value.is_empty() && value.iter().all(u8::is_ascii_digit) => {
                // Digits only; past u64 (never a real delay) it is ignored.
                if let Some(ms) = std::str::from_utf8(&value)
                    .ok()
                    .and_then(|v| v.parse().ok())
                {
                    self.retry = Some(Duration::from_millis(ms));
                }
            }
            _ => {}
        }
        None
    }

    /// Ends the event being read: an event when it had data, else nothing.
    fn dispatch(&mut self) -> Option<SseEvent> {
        let event = self.event.take();
        let retry = self.retry.take();
        let data = match std::mem::take(&mut self.data) {
            Data::None => return None,
            Data::One(data) => data,
            Data::Many(data) => data.freeze(),
        };
        Some(SseEvent {
            event: event.unwrap_or_else(|| "message".to_owned()),
            id: self.last_id.clone(),
            data,
            retry,
        })
    }
}

/// The events of an SSE body given as a stream of byte chunks.
///
/// A transport error ends the stream after it is yielded. A line, or the
/// data of one event, over `max_bytes` ends it with `too_long(max_bytes)`
/// instead of growing memory (a reader then reopens the stream with
/// `Last-Event-ID`). An event unfinished when the bytes end is discarded.
pub fn sse_events<E: Send + 'static>(
    bytes: impl Stream<Item = Result<Bytes, E>> + Send + 'static,
    max_bytes: usize,
    too_long: impl Fn(usize) -> E + Send + Sync + 'static,
) -> impl Stream<Item = Result<SseEvent, E>> + Send + 'static {
    let too_long = Arc::new(too_long);
    let state = (bytes.boxed(), SseParser::new(), false);
    futures::stream::unfold(state, move |(mut bytes, mut parser, done)| {
        let too_long = too_long.clone();
        async move {
            if done {
                return None;
            }
            loop {
                if let Some(event) = parser.next_event() {
                    if event.data.len() > max_bytes {
                        return Some((Err(too_long(max_bytes)), (bytes, parser, true)));
                    }
                    return Some((Ok(event), (bytes, parser, false)));
                }
                if parser.buffered() > max_bytes {
                    return Some((Err(too_long(max_bytes)), (bytes, parser, true)));
                }
                match bytes.next().await {
                    Some(Ok(chunk)) => parser.push(&chunk),
                    Some(Err(error)) => return Some((Err(error), (bytes, parser, true))),
                    None => return None,
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use eventsource_stream::Eventsource;

    /// The events of `chunks` through [`sse_events`].
    async fn parse(chunks: &[&[u8]], max_bytes: usize) -> Vec<Result<SseEvent, String>> {
        let input: Vec<Result<Bytes, String>> = chunks
            .iter()
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        sse_events(futures::stream::iter(input), max_bytes, |max| {
            format!("over {max} bytes")
        })
        .collect()
        .await
    }

    fn event(event: &str, id: &str, data: &str) -> Result<SseEvent, String> {
        Ok(SseEvent {
            event: event.to_owned(),
            id: id.to_owned(),
            data: Bytes::copy_from_slice(data.as_bytes()),
            retry: None,
        })
    }

    #[tokio::test]
    async fn fields_comments_and_line_ends_as_the_standard_reads_them() {
        let out = parse(
            &[
                b"\xEF\xBB\xBF: comment\n",
                b"id: 7\r\nevent: exit\rdata: a\ndata:b\n\n",
            ],
            1024,
        )
        .await;
        assert_eq!(out, [event("exit", "7", "a\nb")]);
        // The id stays for the next event; an event without data is not
        // dispatched; a field without a colon has an empty value.
        let out = parse(
            &[b"id: 1\ndata: x\n\nevent: e\n\ndata\n\nid\ndata: y\n\n"],
            1024,
        )
        .await;
        assert_eq!(
            out,
            [
                event("message", "1", "x"),
                event("message", "1", ""),
                event("message", "", "y")
            ]
        );
        // Retry: digits only, this event only; an id with NUL is ignored.
        let out = parse(
            &[b"retry: 250\nid: a\x00b\ndata: r\n\nretry: 1x\ndata: s\n\n"],
            1024,
        )
        .await;
        let retries: Vec<_> = out
            .iter()
            .map(|e| e.as_ref().map(|e| (e.retry, e.id.clone())))
            .collect();
        assert_eq!(
            retries,
            [
                Ok((Some(Duration::from_millis(250)), String::new())),
                Ok((None, String::new()))
            ]
        );
    }

    #[tokio::test]
    async fn an_event_unfinished_at_the_end_is_discarded() {
        let out = parse(&[b"data: whole\n\ndata: half\n", b"data: x"], 1024).await;
        assert_eq!(out, [event("message", "", "whole")]);
    }

    #[tokio::test]
    async fn a_crlf_split_between_chunks_is_one_line_end() {
        let out = parse(&[b"data: a\r", b"\n", b"\r", b"\ndata: b\r", b"\r"], 1024).await;
        assert_eq!(out, [event("message", "", "a"), event("message", "", "b")]);
    }

    #[tokio::test]
    async fn a_line_or_an_event_over_the_limit_ends_the_stream() {
        let out = parse(&[b"data: ", b"0123456789", b"0123456789", b"\n\n"], 16).await;
        assert_eq!(out, [Err("over 16 bytes".to_owned())]);
        let out = parse(&[b"data: 0123456789\n", b"data: 0123456789\n\n"], 16).await;
        assert_eq!(out, [Err("over 16 bytes".to_owned())]);
        // Many short events are fine whatever their total.
        let many = vec![&b"data: x\n\n"[..]; 100];
        let out = parse(&many, 16).await;
        assert_eq!(out.len(), 100);
        assert!(out.iter().all(Result::is_ok), "{out:?}");
    }

    /// The events `eventsource-stream` (the crate this parser replaces)
    /// reads from the same chunks.
    async fn reference(chunks: &[Vec<u8>]) -> Vec<(String, String, String)> {
        let input: Vec<Result<Bytes, std::io::Error>> = chunks
            .iter()
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        futures::stream::iter(input)
            .eventsource()
            .filter_map(|e| async move { e.ok().map(|e| (e.event, e.id, e.data)) })
            .collect()
            .await
    }

    #[tokio::test]
    async fn the_same_events_as_eventsource_stream_however_the_bytes_are_cut() {
        let pieces: [&[u8]; 12] = [
            b"data: {\"a\":1}\n",
            b"\n",
            b"id: 12\n",
            b"event: dropped\n",
            b"data: \xC3\xA9\xE2\x82\xAC\n",
            b": heartbeat\n",
            b"data:no space\r\n",
            b"\r\n",
            b"data\n",
            b"id: 13\r",
            b"field: ignored\n",
            b"data:  two spaces\r",
        ];
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..500 {
            let mut text = Vec::new();
            for _ in 0..rng.usize(1..30) {
                text.extend_from_slice(pieces[rng.usize(..pieces.len())]);
            }
            text.extend_from_slice(b"\n\n");
            let mut chunks = Vec::new();
            let mut at = 0;
            while at < text.len() {
                let end = (at + rng.usize(1..12)).min(text.len());
                chunks.push(text[at..end].to_vec());
                at = end;
            }
            let expected = reference(&chunks).await;
            let slices: Vec<&[u8]> = chunks.iter().map(Vec::as_slice).collect();
            let got: Vec<(String, String, String)> = parse(&slices, 1 << 20)
                .await
                .into_iter()
                .map(|e| {
                    let e = e.expect("no error");
                    let data = String::from_utf8(e.data.to_vec()).expect("UTF-8");
                    (e.event, e.id, data)
                })
                .collect();
            assert_eq!(got, expected, "{:?}", String::from_utf8_lossy(&text));
        }
    }
}
