//! The transport: stdin split into lines for the SDK, and the one buffer
//! every stdout line goes through, emptied by one writer.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use parking_lot::Mutex;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};
use tokio_util::sync::CancellationToken;

/// Bytes buffered for stdout before senders wait for the writer.
const STDOUT_HIGH_WATER_BYTES: usize = 1024 * 1024;
/// Buffer for reading stdin, in bytes.
const STDIN_BUFFER_BYTES: usize = 64 * 1024;

/// The incoming side of the transport: stdin split into lines.
///
/// Line ends (`\n`, `\r\n`) are stripped and blank lines skipped. Bytes that
/// are not UTF-8 are replaced (U+FFFD) instead of ending the connection; a
/// line that is then not JSON gets the SDK's parse error.
pub(super) fn stdin_lines() -> impl futures::Stream<Item = io::Result<String>> + Send + 'static {
    let reader = tokio::io::BufReader::with_capacity(STDIN_BUFFER_BYTES, tokio::io::stdin());
    futures::stream::try_unfold((reader, Vec::new()), |(mut reader, mut bytes)| async move {
        loop {
            bytes.clear();
            if reader.read_until(b'\n', &mut bytes).await? == 0 {
                return Ok(None);
            }
            let line = String::from_utf8_lossy(&bytes);
            let line = line.trim_end_matches(['\n', '\r']);
            if !line.trim().is_empty() {
                let line = line.to_owned();
                return Ok(Some((line, (reader, bytes))));
            }
        }
    })
}

/// The only way to stdout: one buffer of whole lines, emptied by one writer.
///
/// The SDK's transport (through [`Stdout::sink`]) and the raw-line directives
/// (through [`Stdout::write_raw_line`]) append whole lines to the same buffer
/// under its lock, so lines never interleave and go out in the order they
/// were added. Lines are copied in by the thread that made them and the
/// writer takes the buffer a batch at a time: no allocation crosses threads
/// and a burst costs few writes. Clones share the buffer.
#[derive(Clone)]
pub(super) struct Stdout {
    shared: Arc<StdoutShared>,
}

struct StdoutShared {
    pending: Mutex<PendingLines>,
    /// Wakes the writer when lines are added or the buffer is closed.
    changed: tokio::sync::Notify,
    /// Cancelled when the writer stops on an error.
    failed: CancellationToken,
}

/// What the writer has not taken yet.
#[derive(Default)]
struct PendingLines {
    /// Whole lines, each ending in `\n`.
    bytes: Vec<u8>,
    /// Set by [`Stdout::close`]: the writer ends once `bytes` is written.
    closed: bool,
    /// Set when the writer stopped on an error: adding lines fails from then on.
    failed: bool,
    /// Senders waiting for `bytes` to drop below [`STDOUT_HIGH_WATER_BYTES`].
    waiting_for_room: Vec<Waker>,
}

impl Stdout {
    /// The buffer and its writer, a future to poll until it ends: after
    /// [`Stdout::close`] once everything added is written and flushed, or at
    /// the first write error.
    pub(super) fn new() -> (Self, impl Future<Output = io::Result<()>>) {
        let stdout = Self {
            shared: Arc::new(StdoutShared {
                pending: Mutex::default(),
                changed: tokio::sync::Notify::new(),
                failed: CancellationToken::new(),
            }),
        };
        let writer = write_out(stdout.shared.clone());
        (stdout, writer)
    }

    /// The outgoing side of the SDK's [`Lines`](agent_client_protocol::Lines) transport.
    pub(super) fn sink(&self) -> StdoutSink {
        StdoutSink(self.clone())
    }

    /// Adds one raw line (not JSON-RPC); `line` has no line end.
    pub(super) async fn write_raw_line(&self, line: &str) -> io::Result<()> {
        std::future::poll_fn(|cx| self.poll_room(cx)).await?;
        self.push_line(line)
    }

    /// Completes when the writer has stopped on an error (stdout is gone).
    pub(super) async fn failed(&self) {
        self.shared.failed.cancelled().await;
    }

    /// No more lines: the writer ends once everything added is written.
    pub(super) fn close(&self) {
        self.shared.pending.lock().closed = true;
        self.shared.changed.notify_one();
    }

    /// Ready when the buffer has room for another line.
    fn poll_room(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut pending = self.shared.pending.lock();
        if pending.failed {
            return Poll::Ready(Err(writer_stopped()));
        }
        if pending.bytes.len() < STDOUT_HIGH_WATER_BYTES {
            return Poll::Ready(Ok(()));
        }
        pending.waiting_for_room.push(cx.waker().clone());
        Poll::Pending
    }

    fn push_line(&self, line: &str) -> io::Result<()> {
        {
            let mut pending = self.shared.pending.lock();
            if pending.failed {
                return Err(writer_stopped());
            }
            pending.bytes.extend_from_slice(line.as_bytes());
            pending.bytes.push(b'\n');
        }
        self.shared.changed.notify_one();
        Ok(())
    }
}

/// [`Stdout`] as the `Sink<String>` of the SDK's [`Lines`](agent_client_protocol::Lines) transport.
///
/// A line counts as sent once it is in the buffer: `poll_flush` does not wait
/// for the writer, which flushes on its own whenever the buffer runs empty.
/// `run` waits for the writer after the connection ends.
pub(super) struct StdoutSink(Stdout);

impl futures::Sink<String> for StdoutSink {
    type Error = io::Error;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.0.poll_room(cx)
    }

    fn start_send(self: Pin<&mut Self>, line: String) -> io::Result<()> {
        self.0.push_line(&line)
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_close(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

pub(super) fn writer_stopped() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "the stdout writer has stopped")
}

/// The writer: takes everything buffered, writes it, and flushes whenever the
/// buffer is empty, so a single message goes out at once and a burst of
/// lines costs one write per batch.
async fn write_out(shared: Arc<StdoutShared>) -> io::Result<()> {
    let mut out = tokio::io::stdout();
    let mut batch = Vec::with_capacity(STDOUT_HIGH_WATER_BYTES);
    let result = loop {
        let (closed, waiting) = {
            let mut pending = shared.pending.lock();
            std::mem::swap(&mut batch, &mut pending.bytes);
            (
                pending.closed,
                std::mem::take(&mut pending.waiting_for_room),
            )
        };
        waiting.into_iter().for_each(Waker::wake);
        if batch.is_empty() {
            if let Err(error) = out.flush().await {
                break Err(error);
            }
            if closed {
                break Ok(());
            }
            // `notify_one` keeps a permit, so a line added since the swap is not missed.
            shared.changed.notified().await;
            continue;
        }
        if let Err(error) = out.write_all(&batch).await {
            break Err(error);
        }
        batch.clear();
    };
    if result.is_err() {
        let waiting = {
            let mut pending = shared.pending.lock();
            pending.failed = true;
            std::mem::take(&mut pending.waiting_for_room)
        };
        waiting.into_iter().for_each(Waker::wake);
        shared.failed.cancel();
    }
    result
}
