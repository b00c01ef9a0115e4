//! Starting an agent process and moving bytes to and from its stdio.
//!
//! stdin: one writer task fed by a bounded channel of complete lines; it
//! flushes when the channel runs dry, so a burst costs few syscalls and a
//! single message is not delayed. stdout: newline-delimited JSON-RPC with a
//! maximum line length ([`LineDecoder`]); a longer line is discarded and reported.
//! stderr: captured (first 20 and last 50 lines) and logged, never mixed into
//! the stream.

use super::framing::{Line, LineDecoder};
use bytes::Bytes;
use ext_methods::StderrExcerpt;
use futures::StreamExt;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::process::Stdio;
use std::sync::Arc;
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::mpsc;
use tokio_util::codec::FramedRead;

/// Lines of stderr kept from the start of the process.
const STDERR_HEAD: usize = 20;
/// Lines of stderr kept from the end of the process.
const STDERR_TAIL: usize = 50;
/// Longest stderr line kept, in bytes.
const STDERR_MAX_LINE: usize = 8 * 1024;
/// Lines queued for an agent's stdin before senders wait.
const STDIN_QUEUE: usize = 1024;

/// A resolved agent command line: what [`spawn`] runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchCommand {
    /// Program: a path, or a name looked up on `PATH`.
    pub program: std::path::PathBuf,
    /// Arguments after the program.
    pub args: Vec<String>,
    /// Variables set on top of the server's own environment, which the agent
    /// inherits (so credentials such as `OPENAI_API_KEY` pass through).
    pub env: Vec<(String, String)>,
}

/// A started agent process: its pid (and process group) and its stdio.
pub struct Spawned {
    /// The child; it leads its own process group.
    pub child: Child,
    /// Lines for the agent's stdin (each must end with `\n`).
    pub stdin: mpsc::Sender<Bytes>,
    /// The agent's stdout, split into lines.
    pub stdout: FramedRead<ChildStdout, LineDecoder>,
    /// Captured stderr.
    pub stderr: Arc<Mutex<StderrCapture>>,
}

/// Starts agent `agent` with `launch` in its own process group with piped stdio.
///
/// # Errors
/// The spawn error (program not found, not executable, …).
pub fn spawn(
    agent: &str,
    launch: &LaunchCommand,
    max_line_bytes: usize,
) -> std::io::Result<Spawned> {
    let mut command = Command::new(&launch.program);
    command
        .args(&launch.args)
        .envs(launch.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Own process group: shutdown signals reach the agent's children too.
        .process_group(0)
        .kill_on_drop(true);
    let mut child = command.spawn()?;
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(std::io::Error::other("agent stdio was not piped"));
    };
    let (stdin_tx, stdin_rx) = mpsc::channel(STDIN_QUEUE);
    tokio::spawn(write_stdin(stdin, stdin_rx));
    let capture = Arc::new(Mutex::new(StderrCapture::default()));
    tokio::spawn(read_stderr(agent.to_owned(), stderr, capture.clone()));
    Ok(Spawned {
        child,
        stdin: stdin_tx,
        stdout: FramedRead::with_capacity(stdout, LineDecoder::new(max_line_bytes), 64 * 1024),
        stderr: capture,
    })
}

async fn write_stdin(stdin: ChildStdin, mut lines: mpsc::Receiver<Bytes>) {
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
        if writer.flush().await.is_err() {
            return;
        }
    }
}

async fn read_stderr(
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

/// Sends `signal` to the agent's process group (the agent and its children).
pub fn signal_group(pid: u32, signal: Signal) {
    if let Ok(pid) = i32::try_from(pid)
        && let Err(error) = killpg(Pid::from_raw(pid), signal)
        && error != nix::errno::Errno::ESRCH
    {
        tracing::warn!(pid, ?signal, %error, "cannot signal agent process group");
    }
}
