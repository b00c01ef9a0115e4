//! The SSE response body of `GET /v2/rpc` and `GET /acp`: an opening
//! comment, then the connection's ring from the stream cursor on, then live
//! events, with heartbeat comments while quiet. Events are framed here, as
//! they are written (the ring holds JSON, not SSE text).

use super::body::Body;
use crate::memory::connection::{Batch, Outgoing, Stream};
use crate::protocol::{EVENT_STREAM, X_ACCEL_BUFFERING_HEADER};
use bytes::{BufMut, Bytes, BytesMut};
use futures::StreamExt;
use http::header::{CACHE_CONTROL, CONTENT_TYPE};
use http::{HeaderValue, Response};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use std::convert::Infallible;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// An SSE comment line (SSE spec: lines starting with `:` are ignored by
/// clients) that keeps proxies from closing a quiet stream.
const HEARTBEAT: &[u8] = b": heartbeat\n\n";

/// The first bytes of every stream, an SSE comment like [`HEARTBEAT`]. A
/// proxy that sends response headers only with the first body byte (nginx
/// towards an HTTP/2 client does) would otherwise hold a quiet stream's
/// headers back until the first heartbeat.
const OPENED: &[u8] = b": stream open\n\n";

/// The `200` answer of a stream request (`GET /v2/rpc`, `GET /acp`): the
/// [`body`] of `stream`, `Content-Type: text/event-stream`, `Cache-Control:
/// no-cache`, `X-Accel-Buffering: no` (so proxies do not buffer it), and
/// the connection id under `id_header` (the route's own header name).
pub fn response(
    stream: Stream,
    heartbeat: Duration,
    shutdown: CancellationToken,
    id_header: &'static str,
    connection_id: &str,
) -> Response<Body> {
    let mut response = Response::new(body(stream, heartbeat, shutdown));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(EVENT_STREAM));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(X_ACCEL_BUFFERING_HEADER, HeaderValue::from_static("no"));
    if let Ok(value) = HeaderValue::from_str(connection_id) {
        headers.insert(id_header, value);
    }
    response
}

/// A streaming body that writes [`OPENED`], then `stream`'s events until the
/// stream is taken over, the connection closes, or the server shuts down.
/// Each batch of waiting events is one body frame (one write).
pub fn body(stream: Stream, heartbeat: Duration, shutdown: CancellationToken) -> Body {
    let events = futures::stream::unfold(
        (stream, shutdown, Vec::new()),
        move |(mut stream, shutdown, mut batch)| async move {
            loop {
                match stream.next_batch(&mut batch) {
                    Batch::Data => {
                        let frame = Frame::data(frame_all(&batch));
                        batch.clear();
                        return Some((Ok(frame), (stream, shutdown, batch)));
                    }
                    Batch::Ended => return None,
                    Batch::Idle => {}
                }
                // A push between `next_batch` and here leaves a permit in the
                // Notify, so this wakes at once: no event is missed.
                let wake = stream.wake().clone();
                tokio::select! {
                    () = wake.notified() => {}
                    () = tokio::time::sleep(heartbeat) => {
                        let frame = Frame::data(Bytes::from_static(HEARTBEAT));
                        return Some((Ok::<_, Infallible>(frame), (stream, shutdown, batch)));
                    }
                    () = shutdown.cancelled() => return None,
                }
            }
        },
    );
    let opened = futures::stream::once(std::future::ready(Ok::<_, Infallible>(Frame::data(
        Bytes::from_static(OPENED),
    ))));
    StreamBody::new(opened.chain(events)).boxed_unsync()
}

/// Frames each message as an SSE event (SSE spec, "event stream
/// interpretation"): `event: message`, an `id:` line when it has a sequence
/// number, one `data:` line, and a blank line. One allocation for the batch.
fn frame_all(batch: &[Outgoing]) -> Bytes {
    const EVENT: &[u8] = b"event: message\n";
    const ID: &[u8] = b"id: ";
    const DATA: &[u8] = b"data: ";
    let size = batch
        .iter()
        .map(|m| EVENT.len() + ID.len() + 21 + DATA.len() + m.json.len() + 2)
        .sum();
    let mut out = BytesMut::with_capacity(size);
    for message in batch {
        out.put_slice(EVENT);
        if let Some(seq) = message.seq {
            out.put_slice(ID);
            out.put_slice(itoa::Buffer::new().format(seq).as_bytes());
            out.put_u8(b'\n');
        }
        out.put_slice(DATA);
        out.put_slice(&message.json);
        out.put_slice(b"\n\n");
    }
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_framed_with_and_without_id() {
        let batch = [
            Outgoing {
                seq: None,
                json: Bytes::from_static(b"{\"gap\":1}"),
            },
            Outgoing {
                seq: Some(12),
                json: Bytes::from_static(b"{\"a\":1}"),
            },
        ];
        assert_eq!(
            &frame_all(&batch)[..],
            &b"event: message\ndata: {\"gap\":1}\n\nevent: message\nid: 12\ndata: {\"a\":1}\n\n"[..]
        );
    }
}
