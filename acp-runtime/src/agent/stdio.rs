//! The loops that move an agent process's bytes, one task each.
//!
//! - stdin ([`write_stdin`]): fed by a bounded channel of complete lines; it
//!   flushes when the channel runs dry, so a burst costs few syscalls and a
//!   single message is not delayed.
//! - stdout: read by the process itself ([`super::process::read_stdout`]),
//!   since its end is the process's end.
//! - stderr ([`read_stderr`]): captured (first 20 and last 50 lines) and
//!   logged, never mixed into the stream.

use super::framing::{Line, LineDecoder};
use bytes::Bytes;
use ext_methods::StderrExcerpt;
use futures::StreamExt;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::process::ChildStdin;
use tokio::sync::mpsc;
use tokio_util::codec::FramedRead;

/// Lines of stderr kept from the start of the process.
const STDERR_HEAD: usize = 20;
/// Lines of stderr kept from the end of the process.
const STDERR_TAIL: usize = 50;
/// Longest stderr line kept, in bytes.
const STDERR_MAX_LINE: usize = 8 * 1024;
/// Writes queued lines to the agent's stdin until the channel closes or a
/// write fails (the process is gone).
pub async fn write_stdin(stdin: ChildStdin, mut lines: mpsc::Receiver<Bytes>) {
    let mut writer = BufWriter::with_capacity(64 * 1024, stdin);
    while let Some(line) = lines.recv().await {
        if writer.write_all(&line).await.is_err() {
            return;
        }
        // Keep writing while more is queued; flush once the queue is empty.
        while let Ok(line) = lines.try_recv() {
            if writer.write_all(&line).await.is_err() {
                return;
            }
        }
        // Pipelined requests are queued by their own tasks, each of which
        // wakes this one: one pass of the scheduler lets the rest queue
        // theirs, so a burst is one write (research/benchmarks.md, "The /acp
        // transports").
        tokio::task::yield_now().await;
        while let Ok(line) = lines.try_recv() {
            if writer.write_all(&line).await.is_err() {
                return;
            }
        }
        if writer.flush().await.is_err() {
            return;
        }
    }
}

/// Reads the agent's stderr into `capture` (and the debug log) until it closes.
pub async fn read_stderr(
    agent: String,
    stderr: tokio::process::ChildStderr,
    capture: Arc<Mutex<StderrCapture>>,
) {
    let mut lines = FramedRead::new(stderr, LineDecoder::new(STDERR_MAX_LINE));
    while let Some(Ok(line)) = lines.next().await {
        let line = match line {
            Line::Message(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Line::TooLong { length, .. } => format!("[stderr line of {length} bytes, discarded]"),
        };
        tracing::debug!(target: "agent_stderr", agent = %agent, "{line}");
        capture.lock().push(line);
    }
}

/// Head and tail of an agent's stderr.
#[derive(Debug, Default)]
pub struct StderrCapture {
    head: Vec<String>,
    tail: VecDeque<String>,
    total: u64,
}

impl StderrCapture {
    fn push(&mut self, line: String) {
        self.total += 1;
        if self.head.len() < STDERR_HEAD {
            self.head.push(line);
            return;
        }
        if self.tail.len() == STDERR_TAIL {
            self.tail.pop_front();
        }
        self.tail.push_back(line);
    }

    /// The `stderr` member of `_sandboxagent/session/ended`: the first 20 and
    /// last 50 lines, whether lines in between were left out, and the count.
    pub fn summary(&self) -> StderrExcerpt {
        let kept = (self.head.len() + self.tail.len()) as u64;
        StderrExcerpt {
            head: (!self.head.is_empty()).then(|| self.head.join("\n")),
            tail: (!self.tail.is_empty())
                .then(|| self.tail.iter().cloned().collect::<Vec<_>>().join("\n")),
            truncated: self.total > kept,
            total_lines: Some(self.total),
        }
    }
}
