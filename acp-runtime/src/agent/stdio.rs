//! The loops that move an agent process's bytes, one task each.
//!
//! - stdin ([`write_stdin`]): fed by a bounded channel of complete lines; it
//!   flushes when the channel runs dry, so a burst costs few syscalls and a
//!   single message is not delayed.
//! - stdout: read by the process itself ([`super::agent_process::read_stdout`]),
//!   since its end is the process's end.
//! - stderr ([`read_stderr`]): captured (first 20 and last 50 lines, and
//!   a count of lines) and logged, never mixed into the stream.

use super::framing::{Line, LineDecoder};
use bytes::Bytes;
use ext_methods::StderrExcerpt;
use futures::StreamExt;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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

/// Reads the agent's stderr into `capture` (and the debug log) until it
/// closes; then marks the capture closed.
pub async fn read_stderr(
    agent: String,
    stderr: tokio::process::ChildStderr,
    capture: Arc<StderrCapture>,
) {
    let mut lines = FramedRead::new(stderr, LineDecoder::new(STDERR_MAX_LINE));
    while let Some(Ok(line)) = lines.next().await {
        let line = match line {
            Line::Message(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Line::TooLong { length, .. } => format!("[stderr line of {length} bytes, discarded]"),
        };
        tracing::debug!(target: "agent_stderr", agent = %agent, "{line}");
        capture.push(line);
    }
    capture.closed.store(true, Ordering::Release);
}

/// An agent's stderr: its first 20 and last 50 lines, and how many lines
/// it wrote. Shared by the stderr reader (which fills it), the router
/// (which marks where each request starts and reads the lines after it,
/// research/contract.md, "Agent errors: stderr and hint") and the process
/// (the excerpt of `_sandboxagent/session/ended`).
#[derive(Debug, Default)]
pub struct StderrCapture {
    kept: Mutex<Kept>,
    /// Lines captured so far; raised after each line is kept, so every
    /// line up to it can be read. Read without the lock when a request is
    /// forwarded.
    count: AtomicU64,
    /// Set once stderr closed: no line will come any more.
    closed: AtomicBool,
}

/// The kept lines; `total` numbers them: the head holds lines
/// `1..=head.len()`, the tail the last `tail.len()` lines up to `total`.
#[derive(Debug, Default)]
struct Kept {
    head: Vec<String>,
    tail: VecDeque<String>,
    total: u64,
}

/// What [`StderrCapture::lines_after`] found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct LinesAfter {
    /// The newest lines after the mark, oldest first.
    pub lines: Vec<String>,
    /// Lines after the mark not in `lines`: past the limit, or no longer
    /// kept.
    pub left_out: u64,
}

impl StderrCapture {
    /// Keeps `line` (without its newline) and counts it.
    pub(crate) fn push(&self, line: String) {
        let mut kept = self.kept.lock();
        kept.total += 1;
        if kept.head.len() < STDERR_HEAD {
            kept.head.push(line);
        } else {
            if kept.tail.len() == STDERR_TAIL {
                kept.tail.pop_front();
            }
            kept.tail.push_back(line);
        }
        self.count.store(kept.total, Ordering::Release);
    }

    /// Lines captured so far: the mark a forwarded request keeps.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Acquire)
    }

    /// Whether stderr closed (every line it carried is captured).
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// The last `limit` (at most 50) lines written after the first `mark`
    /// lines, as far as they are kept. The tail keeps 50, so with a limit
    /// of 20 only lines older than 50 newer ones are ever missing.
    pub fn lines_after(&self, mark: u64, limit: usize) -> LinesAfter {
        let kept = self.kept.lock();
        let tail_first = kept.total + 1 - kept.tail.len() as u64;
        // Newest first, each with its number.
        let tail = kept.tail.iter().rev().zip((tail_first..=kept.total).rev());
        let head = kept
            .head
            .iter()
            .rev()
            .zip((1..=kept.head.len() as u64).rev());
        let numbered = tail.chain(head);
        let mut lines: Vec<String> = numbered
            .take_while(|(_, number)| *number > mark)
            .take(limit)
            .map(|(line, _)| line.clone())
            .collect();
        lines.reverse();
        LinesAfter {
            left_out: kept.total.saturating_sub(mark) - lines.len() as u64,
            lines,
        }
    }

    /// The `stderr` member of `_sandboxagent/session/ended`: the first 20 and
    /// last 50 lines, whether lines in between were left out, and the count.
    pub fn summary(&self) -> StderrExcerpt {
        let kept = self.kept.lock();
        let held = (kept.head.len() + kept.tail.len()) as u64;
        // Secrets masked as in agent errors (research/contract.md, "Agent
        // errors: stderr and hint"): this excerpt reaches every client of
        // the process and the store.
        let mask = super::secrets::mask_secrets;
        StderrExcerpt {
            head: (!kept.head.is_empty()).then(|| mask(kept.head.join("\n"))),
            tail: (!kept.tail.is_empty())
                .then(|| mask(kept.tail.iter().cloned().collect::<Vec<_>>().join("\n"))),
            truncated: kept.total > held,
            total_lines: Some(kept.total),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capture(lines: u64) -> StderrCapture {
        let capture = StderrCapture::default();
        for line in 1..=lines {
            capture.push(format!("line {line}"));
        }
        capture
    }

    fn numbers(found: &LinesAfter) -> Vec<String> {
        found.lines.iter().map(|l| l.replace("line ", "")).collect()
    }

    #[test]
    fn lines_after_a_mark_are_the_newest_up_to_the_limit() {
        let few = capture(5);
        assert_eq!(few.count(), 5);
        let found = few.lines_after(3, 20);
        assert_eq!(
            (numbers(&found), found.left_out),
            (vec!["4".into(), "5".into()], 0)
        );
        assert_eq!(few.lines_after(5, 20), LinesAfter::default());
        // Across the head and the tail.
        let found = capture(30).lines_after(15, 20);
        assert_eq!(
            numbers(&found),
            (16..=30).map(|n| n.to_string()).collect::<Vec<_>>()
        );
        let found = capture(30).lines_after(0, 20);
        assert_eq!(
            numbers(&found),
            (11..=30).map(|n| n.to_string()).collect::<Vec<_>>()
        );
        assert_eq!(found.left_out, 10);
        // Past what the head and tail hold: the tail's newest.
        let found = capture(1000).lines_after(10, 20);
        assert_eq!(
            numbers(&found),
            (981..=1000).map(|n| n.to_string()).collect::<Vec<_>>()
        );
        assert_eq!(found.left_out, 970);
    }
}
