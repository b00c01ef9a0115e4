//! One running agent process: starting it in its own process group (with
//! the group's keeper and record, [`crate::os::orphans`]), its identity (agent
//! id, generation, pid), its routing table ([`Router`]) and how it ended.
//! Its stdout is read here ([`read_stdout`]: the end of stdout is the end
//! of the process); the stdin and stderr loops are in [`super::stdio`].

use super::exit::ExitInfo;
use super::framing::{Line, LineDecoder};
use super::router::{ReportedHints, RouteTargets, Router};
use super::stdio::{self, StderrCapture};
use crate::memory::connection::ClientCapabilities;
use crate::os::orphans::{self, GroupRecordFile};
use crate::os::process_group::signal_group;
use crate::os::tree::{self, TreeSupervisor};
use bytes::Bytes;
use futures::StreamExt;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use parking_lot::Mutex;
use serde_json::value::RawValue;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;
use tokio::process::{Child, ChildStdout};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;

/// How long a tree supervisor gets to kill its tree on
/// [`AgentProcess::kill_tree_now`] before SIGKILL goes to its group.
const KILL_NOW_BOUND: std::time::Duration = std::time::Duration::from_secs(2);
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
    /// The working directory; `None`: the server's.
    pub cwd: Option<std::path::PathBuf>,
}

/// A started agent process: its pid (and process group) and its stdio.
pub struct Spawned {
    /// The child; it leads its own process group.
    pub child: Child,
    /// Lines for the agent's stdin (each must end with `\n`), written by
    /// [`stdio::write_stdin`].
    pub stdin: mpsc::Sender<Bytes>,
    /// The agent's stdout, split into lines (read by [`read_stdout`]).
    pub stdout: FramedRead<ChildStdout, LineDecoder>,
    /// Captured stderr, filled by [`stdio::read_stderr`].
    pub stderr: Arc<StderrCapture>,
    /// The record of the process group in the data dir, if it could be
    /// written; [`AgentProcess::finish`] removes it.
    pub(crate) group_record: Option<GroupRecordFile>,
    /// Whether the child is a tree supervisor (research/contract.md, "Agent
    /// process trees and a server that dies") rather than the agent itself.
    pub supervised: bool,
}

/// Starts agent `agent` with `launch` in its own process group with piped
/// stdio, records the group under `data_dir` and starts its keeper (so the
/// tree dies with the server, research/contract.md, "Agent process trees
/// and a server that dies"), and the stdin writer and stderr reader tasks.
///
/// # Errors
/// The spawn error (program not found, not executable, …). A record or
/// keeper that cannot be made is logged, not an error.
pub fn spawn(
    agent: &str,
    launch: &LaunchCommand,
    max_line_bytes: usize,
    data_dir: &Path,
    tree_supervisor: Option<&TreeSupervisor>,
) -> std::io::Result<Spawned> {
    let mut command = tree::command(
        tree_supervisor,
        false,
        &launch.program,
        &launch.args,
        launch.cwd.as_deref(),
        &launch.env,
    );
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Own process group: shutdown signals reach the agent's children too.
        .process_group(0)
        .kill_on_drop(true);
    let mut child = command.spawn()?;
    let pid = child.id().unwrap_or(0);
    let group_record = orphans::record_group(data_dir, agent, pid);
    // A tree supervisor watches for the server's death itself.
    if tree_supervisor.is_none()
        && let Err(error) = orphans::spawn_keeper(pid)
    {
        tracing::warn!(agent, pid, %error, "cannot start the keeper of the agent's process group; the group is killed at the next start-up if the server dies");
    }
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(std::io::Error::other("agent stdio was not piped"));
    };
    let (stdin_tx, stdin_rx) = mpsc::channel(STDIN_QUEUE);
    tokio::spawn(stdio::write_stdin(stdin, stdin_rx));
    let capture = Arc::new(StderrCapture::default());
    tokio::spawn(stdio::read_stderr(
        agent.to_owned(),
        stderr,
        capture.clone(),
    ));
    Ok(Spawned {
        child,
        stdin: stdin_tx,
        stdout: FramedRead::with_capacity(stdout, LineDecoder::new(max_line_bytes), 64 * 1024),
        stderr: capture,
        group_record,
        supervised: tree_supervisor.is_some(),
    })
}

/// One running agent process, shared by the request handlers, its stdout
/// loop and the supervisor.
pub struct AgentProcess {
    /// Agent id.
    pub agent: Arc<str>,
    /// Increases with every start of any agent; sessions carry the
    /// generation of the process that hosts them.
    pub generation: u64,
    /// OS process id; also the process group id.
    pub pid: u32,
    /// Where its messages go and where answers come back.
    pub(crate) router: Router,
    /// The process's stderr (also the router's, for its error answers).
    pub(crate) stderr: Arc<StderrCapture>,
    /// Cancelled once the process is gone and its pending requests failed.
    pub(crate) exited: CancellationToken,
    /// The agent's answer to the runtime's `initialize`.
    pub(crate) initialize_result: Mutex<Option<Box<RawValue>>>,
    /// How the process ended, once it did.
    pub(crate) exit: Mutex<Option<ExitInfo>>,
    /// Whether it runs under a tree supervisor (see [`Spawned::supervised`]).
    pub(crate) supervised: bool,
    /// The record of its process group; dropped (the file removed) once the
    /// group has been killed.
    group_record: Mutex<Option<GroupRecordFile>>,
}

impl std::fmt::Debug for AgentProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentProcess")
            .field("agent", &self.agent)
            .field("generation", &self.generation)
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

impl AgentProcess {
    /// The process `spawned` as generation `generation` of `agent`, routing
    /// to `targets`.
    pub(crate) fn new(
        agent: Arc<str>,
        generation: u64,
        pid: u32,
        stdin: mpsc::Sender<Bytes>,
        stderr: Arc<StderrCapture>,
        targets: RouteTargets,
        reported: Arc<Mutex<ReportedHints>>,
    ) -> Self {
        let exited = CancellationToken::new();
        let mut router = Router::new(
            agent.clone(),
            generation,
            stdin,
            targets,
            reported,
            exited.clone(),
        );
        router.set_stderr(stderr.clone());
        Self {
            router,
            agent,
            generation,
            pid,
            stderr,
            exited,
            initialize_result: Mutex::new(None),
            exit: Mutex::new(None),
            group_record: Mutex::new(None),
            supervised: false,
        }
    }

    /// The same process, whose file and terminal requests in `served` the
    /// runtime answers ([`Router::set_served`]).
    pub(crate) fn serving(mut self, served: ClientCapabilities) -> Self {
        self.router.set_served(served);
        self
    }

    /// The same process, whose failed `session/new` and `session/load`
    /// carry the hint that the server runs as root without `--agent-user`
    /// when `root_hint` ([`Router::set_root_hint`]).
    pub(crate) fn with_root_hint(mut self, root_hint: bool) -> Self {
        self.router.set_root_hint(root_hint);
        self
    }

    /// The same process, started under a tree supervisor when `supervised`:
    /// [`kill_tree_now`](Self::kill_tree_now) then asks the supervisor.
    pub(crate) fn with_supervisor(mut self, supervised: bool) -> Self {
        self.supervised = supervised;
        self
    }

    /// Kills the whole tree at once: through its supervisor
    /// ([`tree::KILL_NOW`]), which reaches descendants that left the process
    /// group, with SIGKILL to the group after [`KILL_NOW_BOUND`] in case the
    /// supervisor cannot act; without one, SIGKILL to the group.
    pub(crate) fn kill_tree_now(&self) {
        let pid = self.pid;
        if !self.supervised {
            signal_group(pid, Signal::SIGKILL);
            return;
        }
        if let Ok(raw) = i32::try_from(pid) {
            let _ = nix::sys::signal::kill(Pid::from_raw(raw), tree::KILL_NOW);
        }
        let exited = self.exited.clone();
        tokio::spawn(async move {
            if tokio::time::timeout(KILL_NOW_BOUND, exited.cancelled())
                .await
                .is_err()
            {
                signal_group(pid, Signal::SIGKILL);
            }
        });
    }

    /// The same process, owning the record of its process group (removed
    /// by [`finish`](Self::finish)).
    pub(crate) fn with_group_record(self, record: Option<GroupRecordFile>) -> Self {
        *self.group_record.lock() = record;
        self
    }

    /// Whether the process is still serving.
    pub fn is_alive(&self) -> bool {
        !self.exited.is_cancelled()
    }

    /// Records how the process ended and lets its router fail what was
    /// pending and end its sessions. Called after the process group was
    /// killed, so the group's record goes too.
    pub(crate) async fn finish(&self, exit: ExitInfo) {
        drop(self.group_record.lock().take());
        *self.exit.lock() = Some(exit);
        self.exited.cancel();
        let stderr = self.stderr.summary();
        self.router.finish(exit, stderr).await;
    }
}

/// After the agent process exits, how long its stdout may still drain (a
/// child of the agent can hold the pipe open).
const EXIT_DRAIN: Duration = Duration::from_millis(500);
/// After stdout closes, how long to wait for the process to exit before killing it.
const EXIT_WAIT: Duration = Duration::from_secs(2);

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
    // Held messages past their TTL and requests nobody is left to answer
    // are settled even while the agent is silent: one tick a second, not
    // a look per line.
    let mut sweep = tokio::time::interval(super::router::SWEEP_INTERVAL);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let drain_deadline = async {
            match drain_until {
                Some(deadline) => tokio::time::sleep_until(deadline).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            // A full share of the store's queue pauses reading here: the
            // pipe then pushes back on the agent (research/contract.md,
            // "Durable sessions"). At once in the common case.
            line = async {
                // Not once the process exited: what it left on the pipe is
                // read out before the exit drain ends.
                if status.is_none() {
                    process.router.wait_for_store().await;
                }
                stdout.next().await
            } => match line {
                Some(Ok(Line::Message(bytes))) => {
                    if let Some(answer) = process.router.dispatch(bytes) {
                        // Before the next line, so nothing overtakes it.
                        answer.deliver(&process.router).await;
                    }
                }
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
            _ = sweep.tick() => process.router.sweep(),
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
    process.finish(exit).await;
    exit
}
