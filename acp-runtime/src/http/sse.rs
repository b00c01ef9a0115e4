//! The SSE response body of `GET /v2/rpc`: an opening comment, then the
//! connection's ring from the stream cursor on, then live events, with
//! heartbeat comments while quiet.

use super::Body;
use crate::connection::{Batch, Stream};
use bytes::Bytes;
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

/// `Content-Type` of every event stream.
pub const EVENT_STREAM: &str = "text/event-stream";

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
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    if let Ok(value) = HeaderValue::from_str(connection_id) {
        headers.insert(id_header, value);
    }
    response
}

/// A streaming body that writes [`OPENED`], then `stream`'s events until the
/// stream is taken over, the connection closes, or the server shuts down.
pub fn body(stream: Stream, heartbeat: Duration, shutdown: CancellationToken) -> Body {
    let events = futures::stream::unfold(
        (stream, shutdown),
        move |(mut stream, shutdown)| async move {
            loop {
                match stream.next_batch() {
                    Batch::Data(bytes) => {
                        return Some((Ok(Frame::data(bytes)), (stream, shutdown)));
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
                        return Some((Ok::<_, Infallible>(frame), (stream, shutdown)));
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
