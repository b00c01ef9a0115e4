//! `GET /v2/processes/{id}/terminal`: a process's terminal over a
//! WebSocket (research/contract.md, "Terminal WebSocket").
//!
//! Binary frames are raw bytes both ways: the client's go to the process's
//! stdin, the server's are its output. The output comes from the process's
//! ring, from `?offset=` (default 0: everything retained) on, so a second
//! client sees what the first saw and a client that lost its socket
//! resumes exactly at the offset it counted. Text frames are JSON control
//! messages: the client sends `resize` (and `eof`); the server sends
//! `dropped` (the ring no longer held bytes the client asked for), `error`
//! (a request of the client failed; the socket stays open) and, after the
//! last byte, `exit`, then closes normally. A text frame the server does
//! not understand closes the socket (1003, the reason says why).
//!
//! One task serves a socket. Output is read from the ring one frame at a
//! time, only once the previous frame was written, so a client that does
//! not read holds at most one frame and the socket's buffers, never the
//! output. Input is one request at a time: the next frame is read only
//! once the process took the previous one, so a client that writes faster
//! than the process reads is held back by TCP, not by a queue here. Pings
//! go out every heartbeat interval; a peer not heard from (pong included)
//! for two intervals, or that does not take a frame within two, is given
//! up on, as on `/acp`.

use super::body::{Body, HttpRequest};
use super::problem;
use super::websocket::{self, Ending, Socket, close_for, send_message};
use crate::error::Error;
use crate::process::{Process, TtySize};
use crate::runtime::Runtime;
use bytes::Bytes;
use ext_methods::Exit;
use futures::StreamExt;
use futures::future::BoxFuture;
use http::Response;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_util::sync::CancellationToken;

/// Most output bytes one binary frame carries.
const FRAME_BYTES: usize = 64 * 1024;
/// Largest frame (and message) a client may send, in bytes (close 1009
/// past it).
const MAX_CLIENT_MESSAGE: usize = 1024 * 1024;
/// Most bytes the socket buffers for writing before a send waits.
const MAX_WRITE_BUFFER: usize = 1024 * 1024;
/// The terminal's largest side, in cells (as `POST …/resize`).
const MAX_SIDE: u16 = 4096;

/// A text frame from the client: exactly one of two shapes, member for
/// member (research/contract.md, "Terminal WebSocket"); read by
/// [`control`].
#[derive(Debug, PartialEq, Eq)]
enum Control {
    /// `{"type":"resize","cols":N,"rows":N}`.
    Resize {
        /// Columns.
        cols: u16,
        /// Rows.
        rows: u16,
    },
    /// `{"type":"eof"}`: close stdin (on a terminal: its end-of-file
    /// character).
    Eof,
}

/// A text frame from the server.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum Notice<'a> {
    /// The ring no longer held `dropped` bytes from `offset` on; the next
    /// binary frame starts at `nextOffset`.
    #[serde(rename_all = "camelCase")]
    Dropped {
        dropped: u64,
        offset: u64,
        next_offset: u64,
    },
    /// How the process ended (after its last byte).
    Exit(&'a Exit),
    /// A request of the client failed: the problem document (RFC 9457) of
    /// what the matching HTTP route would have answered.
    Error {
        problem: &'a serde_json::value::RawValue,
    },
}

/// Answers the upgrade with 101 and serves `process`'s terminal on the
/// socket (module doc). `?offset=N`: the first byte to send (default 0).
///
/// # Errors
/// 400 for a request that is not a WebSocket opening handshake, or a bad
/// `offset`.
pub fn upgrade(
    runtime: &Arc<Runtime>,
    process: Arc<Process>,
    request: &mut HttpRequest,
) -> Result<Response<Body>, Error> {
    if !websocket::is_upgrade(request.headers()) {
        return Err(Error::InvalidRequest(
            "a terminal is a WebSocket: send GET with Upgrade: websocket".to_owned(),
        ));
    }
    let offset = offset_of(request.uri().query())?;
    let accept = websocket::accept_key(request)?;
    let config = WebSocketConfig::default()
        .max_message_size(Some(MAX_CLIENT_MESSAGE))
        .max_frame_size(Some(MAX_CLIENT_MESSAGE))
        .max_write_buffer_size(MAX_WRITE_BUFFER);
    let terminal = Terminal {
        process,
        offset,
        heartbeat: runtime.config.heartbeat,
        shutdown: runtime.shutdown.clone(),
    };
    Ok(websocket::switch(request, accept, config, |socket| {
        terminal.serve(socket)
    }))
}

/// `?offset=N` of the query, else 0.
fn offset_of(query: Option<&str>) -> Result<u64, Error> {
    let mut offset = 0;
    for (key, value) in super::query::pairs(query)? {
        if key == "offset" {
            offset = value.parse::<u64>().map_err(|_| {
                Error::InvalidRequest(format!(
                    "query parameter offset must be a byte offset, got {value:?}"
                ))
            })?;
        }
    }
    Ok(offset)
}

/// One terminal socket's side of the server.
struct Terminal {
    process: Arc<Process>,
    /// The offset of the next output byte to send.
    offset: u64,
    heartbeat: Duration,
    shutdown: CancellationToken,
}

/// What the ring has for the client next.
enum Next {
    /// Bytes from offset `from` on, after a `dropped` notice when the
    /// `dropped` bytes before `from` are gone.
    Output {
        data: Bytes,
        from: u64,
        dropped: u64,
    },
    /// Every byte was sent and the process exited.
    Exit(Exit),
}

/// The client's request the process is taking (stdin, resize, eof).
type InFlight = BoxFuture<'static, Result<(), Error>>;

/// The process exited and the client has every byte and the exit frame.
const EXITED: Ending = Ending {
    code: CloseCode::Normal,
    reason: "process exited",
};

impl Terminal {
    /// Sends output, takes input, pings, until the process exited and the
    /// client has it all, or either side ends.
    async fn serve(mut self, socket: Socket) {
        let (mut sink, mut source) = socket.split();
        let heartbeat = self.heartbeat;
        let mut changes = self.process.changes();
        let mut input: Option<InFlight> = None;
        let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + heartbeat, heartbeat);
        let mut last_heard = Instant::now();
        let shutdown = self.shutdown.clone();
        let ending = loop {
            tokio::select! {
                frame = source.next(), if input.is_none() => {
                    last_heard = Instant::now();
                    match frame {
                        None | Some(Ok(Message::Close(_))) => break None,
                        Some(Err(error)) => break close_for(&error),
                        Some(Ok(Message::Binary(bytes))) if !bytes.is_empty() => {
                            let process = self.process.clone();
                            input = Some(Box::pin(async move { process.write_stdin(bytes).await }));
                        }
                        Some(Ok(Message::Text(text))) => match control(text.as_str()) {
                            Ok(request) => input = Some(self.request(request)),
                            Err(ending) => break Some(ending),
                        },
                        // Pings are answered by tungstenite; pongs only count as heard.
                        Some(Ok(_)) => {}
                    }
                }
                done = in_flight(&mut input) => {
                    input = None;
                    // Frames (pongs too) waited unread meanwhile.
                    last_heard = Instant::now();
                    if let Err(error) = done
                        && let Some(problem) = problem_of(&error)
                        && !send_notice(&mut sink, &Notice::Error { problem: &problem }, heartbeat).await
                    {
                        break None;
                    }
                }
                next = self.next(&mut changes) => match next {
                    Next::Output { data, from, dropped } => {
                        if dropped > 0 {
                            let notice = Notice::Dropped {
                                dropped,
                                offset: from - dropped,
                                next_offset: from,
                            };
                            if !send_notice(&mut sink, &notice, heartbeat).await {
                                break None;
                            }
                        }
                        if !data.is_empty() && !send_message(&mut sink, Message::Binary(data), heartbeat).await {
                            break None;
                        }
                    }
                    Next::Exit(exit) => {
                        if !send_notice(&mut sink, &Notice::Exit(&exit), heartbeat).await {
                            break None;
                        }
                        break Some(EXITED);
                    }
                },
                _ = ping.tick() => {
                    // While the process takes a frame the peer's pongs
                    // wait unread: that is not silence.
                    if input.is_none() && last_heard.elapsed() > heartbeat * 2 {
                        break Some(Ending { code: CloseCode::Away, reason: "keep-alive timeout" });
                    }
                    if !send_message(&mut sink, Message::Ping(Bytes::new()), heartbeat).await {
                        break None;
                    }
                }
                () = shutdown.cancelled() => {
                    break Some(Ending { code: CloseCode::Away, reason: "server shutting down" });
                }
            }
        };
        match ending {
            Some(Ending { code, reason }) => {
                let frame = CloseFrame {
                    code,
                    reason: reason.into(),
                };
                let _ = send_message(&mut sink, Message::Close(Some(frame)), heartbeat).await;
            }
            // The peer closed (its close frame is answered on this flush)
            // or the socket failed.
            None => {
                let _ = tokio::time::timeout(heartbeat, futures::SinkExt::close(&mut sink)).await;
            }
        }
    }

    /// The process's answer to a control request.
    fn request(&self, request: Control) -> InFlight {
        let process = self.process.clone();
        match request {
            Control::Resize { cols, rows } => {
                Box::pin(async move { process.resize(TtySize { cols, rows }).await })
            }
            Control::Eof => Box::pin(async move { process.close_stdin().await }),
        }
    }

    /// Waits for what the ring has past `self.offset` (moving it on), or
    /// for the exit once every byte was taken. The exit is read before the
    /// bytes: the process's last bytes are in the ring before its exit is
    /// recorded, so none comes after the exit frame.
    async fn next(&mut self, changes: &mut tokio::sync::watch::Receiver<u64>) -> Next {
        loop {
            changes.borrow_and_update();
            let exit = self.process.exit();
            let page = self.process.read_bytes(self.offset, FRAME_BYTES);
            if page.dropped > 0 || !page.data.is_empty() {
                self.offset = page.next_offset;
                return Next::Output {
                    from: page.next_offset - page.data.len() as u64,
                    data: page.data,
                    dropped: page.dropped,
                };
            }
            if let Some(exit) = exit {
                return Next::Exit(exit);
            }
            if changes.changed().await.is_err() {
                // The sender lives in the process, which this holds.
                return std::future::pending().await;
            }
        }
    }
}

/// Waits for the request in flight; pending forever when there is none.
async fn in_flight(input: &mut Option<InFlight>) -> Result<(), Error> {
    match input {
        Some(request) => request.await,
        None => std::future::pending().await,
    }
}

/// The problem document (RFC 9457) of `error`, as the HTTP route would
/// answer it.
fn problem_of(error: &Error) -> Option<Box<serde_json::value::RawValue>> {
    String::from_utf8(problem::document(error))
        .ok()
        .and_then(|json| serde_json::value::RawValue::from_string(json).ok())
}

/// A client's text frame as a [`Control`], or how to close the socket:
/// 1003 for any other shape (not a JSON object, another `type`, a member
/// missing, another member, a member named twice, a side that is not an
/// integer), 1007 for a resize whose integer side is outside 1–4096
/// (research/contract.md, "Terminal WebSocket"). The members are read by
/// hand: serde's internally tagged enums let unknown members of a unit
/// variant through, and a side past `u16` would fail as a shape.
fn control(text: &str) -> Result<Control, Ending> {
    const SHAPE: Ending = Ending {
        code: CloseCode::Unsupported,
        reason: "a text frame must be {\"type\":\"resize\",\"cols\":N,\"rows\":N} or {\"type\":\"eof\"}",
    };
    const RANGE: Ending = Ending {
        code: CloseCode::Invalid,
        reason: "resize: cols and rows must be between 1 and 4096",
    };
    let members = frame_members(text).ok_or(SHAPE)?;
    let get = |name: &str| {
        members
            .iter()
            .find(|(member, _)| member == name)
            .map(|(_, value)| value)
    };
    match get("type").and_then(serde_json::Value::as_str) {
        Some("eof") if members.len() == 1 => Ok(Control::Eof),
        Some("resize") if members.len() == 3 => {
            let side = |name: &str| -> Result<u16, Ending> {
                let value = get(name).ok_or(SHAPE)?;
                if !(value.is_i64() || value.is_u64()) {
                    return Err(SHAPE);
                }
                value
                    .as_u64()
                    .and_then(|side| u16::try_from(side).ok())
                    .filter(|side| (1..=MAX_SIDE).contains(side))
                    .ok_or(RANGE)
            };
            Ok(Control::Resize {
                cols: side("cols")?,
                rows: side("rows")?,
            })
        }
        _ => Err(SHAPE),
    }
}

/// The members of the JSON object `text`, in order, or `None` when it is
/// not an object or names a member twice.
fn frame_members(text: &str) -> Option<Vec<(String, serde_json::Value)>> {
    struct Members(Option<Vec<(String, serde_json::Value)>>);
    impl<'de> Deserialize<'de> for Members {
        fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            struct Visit;
            impl<'de> serde::de::Visitor<'de> for Visit {
                type Value = Members;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("an object")
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(
                    self,
                    mut map: A,
                ) -> Result<Members, A::Error> {
                    let mut members: Vec<(String, serde_json::Value)> = Vec::new();
                    while let Some((name, value)) = map.next_entry::<String, serde_json::Value>()? {
                        // Frames are at most a few members: a scan beats a set.
                        if members.len() >= 8 || members.iter().any(|(seen, _)| *seen == name) {
                            return Ok(Members(None));
                        }
                        members.push((name, value));
                    }
                    Ok(Members(Some(members)))
                }
            }
            deserializer.deserialize_map(Visit)
        }
    }
    serde_json::from_str::<Members>(text).ok()?.0
}

/// Sends a text frame; `false` as [`send_message`].
async fn send_notice<S>(sink: &mut S, notice: &Notice<'_>, heartbeat: Duration) -> bool
where
    S: futures::Sink<Message, Error = tokio_tungstenite::tungstenite::Error> + Unpin,
{
    match serde_json::to_string(notice) {
        Ok(text) => send_message(sink, Message::text(text), heartbeat).await,
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_frames() {
        assert_eq!(
            control(r#"{"type":"resize","cols":100,"rows":30}"#).ok(),
            Some(Control::Resize {
                cols: 100,
                rows: 30
            })
        );
        assert_eq!(control(r#"{"type":"eof"}"#).ok(), Some(Control::Eof));
        for bad in [
            "ls\r",
            r#"{"type":"resize","cols":0,"rows":30}"#,
            r#"{"type":"resize","cols":5000,"rows":30}"#,
            r#"{"type":"resize","cols":80}"#,
            r#"{"type":"paste","data":"x"}"#,
            r#"{"type":"eof","x":1}"#,
            r#"{"type":"eof","type":"eof"}"#,
            r#"{"type":"resize","cols":80,"rows":24,"x":1}"#,
            r#"{"type":"resize","cols":"80","rows":24}"#,
            r#"{"type":"resize","cols":80.5,"rows":24}"#,
            r#"["eof"]"#,
        ] {
            assert!(control(bad).is_err(), "{bad}");
        }
        for shape in [
            r#"{"type":"eof","x":1}"#,
            r#"{"type":"eof","type":"eof"}"#,
            r#"{"type":"resize","cols":"80","rows":24}"#,
        ] {
            assert_eq!(
                control(shape).err().map(|e| e.code),
                Some(CloseCode::Unsupported),
                "{shape}"
            );
        }
        for range in [
            r#"{"type":"resize","cols":70000,"rows":24}"#,
            r#"{"type":"resize","cols":80,"rows":-1}"#,
            r#"{"type":"resize","cols":4097,"rows":24}"#,
        ] {
            assert_eq!(
                control(range).err().map(|e| e.code),
                Some(CloseCode::Invalid),
                "{range}"
            );
        }
        assert_eq!(
            control(r#"{"type":"resize","cols":0,"rows":1}"#)
                .err()
                .map(|e| e.code),
            Some(CloseCode::Invalid)
        );
    }

    #[test]
    fn notices() {
        let exit = Exit {
            exit_code: Some(3),
            signal: None,
        };
        let text = serde_json::to_string(&Notice::Exit(&exit)).ok();
        assert_eq!(
            text.as_deref(),
            Some(r#"{"type":"exit","exitCode":3,"signal":null}"#)
        );
        let dropped = Notice::Dropped {
            dropped: 4,
            offset: 0,
            next_offset: 4,
        };
        assert_eq!(
            serde_json::to_string(&dropped).ok().as_deref(),
            Some(r#"{"type":"dropped","dropped":4,"offset":0,"nextOffset":4}"#)
        );
        assert_eq!(offset_of(Some("access_token=x&offset=12")).ok(), Some(12));
        assert!(offset_of(Some("offset=-1")).is_err());
    }
}
