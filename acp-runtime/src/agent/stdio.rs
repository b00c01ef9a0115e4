//! The loops that move an agent process's bytes, one task each.
//!
//! - stdin ([`write_stdin`]): fed by a bounded channel of complete lines; it
//!   flushes when the channel runs dry, so a burst costs few syscalls and a
//!   single message is not delayed.
//! - stdout ([`read_stdout`]): newline-delimited JSON-RPC with a maximum line
//!   length ([`LineDecoder`]); each line goes to the process's router in
//!   order, a longer line is discarded and reported. When stdout closes (or
//!   the process exits and its stdout stays quiet) it reaps the process and
//!   runs the exit handling.
//! - stderr ([`read_stderr`]): captured (first 20 and last 50 lines) and
//!   logged, never mixed into the stream.

use super::exit::ExitInfo;
use super::framing::{Line, LineDecoder};
use super::process::AgentProcess;
use crate::process_group::signal_group;
use bytes::Bytes;
use ext_methods::StderrExcerpt;
use futures::StreamExt;
use nix::sys::signal::Signal;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::os::unix::process::ExitStatusExt;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::codec::FramedRead;

/// Lines of stderr kept from the start of the process.
const STDERR_HEAD: usize = 20;
/// Lines of stderr kept from the end of the process.
const STDERR_TAIL: usize = 50;
/// Longest stderr line kept, in bytes.
const STDERR_MAX_LINE: usize = 8 * 1024;
/// After the agent process exits, how long its stdout may still drain (a
/// child of the agent can hold the pipe open).
const EXIT_DRAIN: Duration = Duration::from_millis(500);
/// After stdout closes, how long to wait for the process to exit before killing it.
const EXIT_WAIT: Duration = Duration::from_secs(2);

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

/// Reads the agent's stdout until it closes (or the process exits and its
/// stdout stays quiet), handing each line to the router; then reaps the
/// process, kills what it left in its process group, and finishes the
/// process ([`AgentProcess::finish`]). Returns how it ended.
pub async fn read_stdout(
    process: &AgentProcess,
    mut stdout: FramedRead<ChildStdout, LineDecoder>,
    mut child: Child,
    max_line_bytes: usize,
) -> ExitInfo {
    let mut status = None;
    let mut drain_until: Option<Instant> = None;
    loop {
        let drain_deadline = async {
            match drain_until {
                Some(deadline) => tokio::time::sleep_until(deadline).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            line = stdout.next() => match line {
                Some(Ok(Line::Message(bytes))) => process.router.dispatch(&bytes),
                Some(Ok(Line::TooLong { prefix, length })) => {
                    process.router.report_too_long(&prefix, length, max_line_bytes);
                }
                Some(Err(error)) => {
                    tracing::warn!(agent = %process.agent, %error, "cannot read agent stdout");
                    break;
                }
                None => break,
            },
            exit = child.wait(), if status.is_none() => {
                status = Some(exit);
                drain_until = Some(Instant::now() + EXIT_DRAIN);
            }
            () = drain_deadline => break,
        }
    }
    let status = match status {
        Some(status) => status,
        None => match tokio::time::timeout(EXIT_WAIT, child.wait()).await {
            Ok(status) => status,
            Err(_) => {
                process.kill_tree_now();
                child.wait().await
            }
        },
    };
    // Whatever the agent left running in its group would be orphaned now.
    signal_group(process.pid, Signal::SIGKILL);
    let exit = match status {
        Ok(status) => ExitInfo {
            code: status.code(),
            signal: status.signal(),
        },
        Err(error) => {
            tracing::warn!(agent = %process.agent, %error, "cannot reap agent process");
            ExitInfo::default()
        }
    };
    tracing::info!(agent = %process.agent, pid = process.pid, ?exit, "agent process exited");
    process.finish(exit);
    exit
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
