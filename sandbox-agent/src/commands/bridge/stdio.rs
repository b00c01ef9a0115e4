//! The editor's side: newline-delimited JSON-RPC in, one message per line
//! out, flushed.

use acp_runtime::agent::framing::LineDecoder;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::codec::FramedRead;

/// The editor's lines, split by [`LineDecoder`] (a line over `max_bytes`
/// is reported, not buffered).
pub fn editor_lines<R: AsyncRead>(input: R, max_bytes: usize) -> FramedRead<R, LineDecoder> {
    FramedRead::new(input, LineDecoder::new(max_bytes))
}

/// Queue of lines for the editor. A writer task owns the output and writes
/// them in queue order, so a message is never interleaved with another.
#[derive(Debug)]
pub struct EditorOut {
    tx: mpsc::UnboundedSender<String>,
}

impl EditorOut {
    /// Queues one message (one JSON object) to be written as one line.
    /// Newlines inside it (only possible as whitespace between JSON tokens)
    /// become spaces, so the framing holds. Dropped silently when the
    /// output is gone (see [`EditorOut::closed`]).
    pub fn send(&self, mut message: String) {
        if message.contains(['\n', '\r']) {
            message = message.replace(['\n', '\r'], " ");
        }
        if self.tx.send(message).is_err() {
            tracing::debug!("the editor's output is closed; message dropped");
        }
    }

    /// Resolves when the writer stopped (the editor closed its end of the
    /// pipe, or writing failed).
    pub async fn closed(&self) {
        self.tx.closed().await;
    }
}

/// Starts the writer task over `output`. The task ends when every
/// [`EditorOut`] is dropped and the queue is written (`Ok`), or at the
/// first write error.
pub fn spawn_writer<W>(output: W) -> (EditorOut, JoinHandle<std::io::Result<()>>)
where
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (tx, rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(write_lines(rx, output));
    (EditorOut { tx }, task)
}

async fn write_lines<W: AsyncWrite + Unpin>(
    mut rx: mpsc::UnboundedReceiver<String>,
    output: W,
) -> std::io::Result<()> {
    let mut output = BufWriter::new(output);
    while let Some(line) = rx.recv().await {
        write_line(&mut output, &line).await?;
        // Write what else is queued, then flush once: one flush per burst,
        // and nothing waits in the buffer while the queue is empty.
        while let Ok(line) = rx.try_recv() {
            write_line(&mut output, &line).await?;
        }
        output.flush().await?;
    }
    output.flush().await
}

async fn write_line<W: AsyncWrite + Unpin>(output: &mut W, line: &str) -> std::io::Result<()> {
    output.write_all(line.as_bytes()).await?;
    output.write_all(b"\n").await
}
