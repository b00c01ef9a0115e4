//! One process of the API ([`Process`]): its description, output ring,
//! stdin and terminal tasks, signals, terminal size, and the exit its
//! followers wait for.

use super::output::{self, BytesPage, Output, OutputStream, Page};
use super::request::MAX_TITLE_BYTES;
use super::spawn::{self, TtySize};
use crate::budget::Charge;
use crate::error::Error;
use crate::os::tree::{self};
use crate::time::rfc3339;
use bytes::{Bytes, BytesMut};
use ext_methods::{Exit, ProcessInfo, ProcessState};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use parking_lot::Mutex;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::{Duration, Instant, SystemTime};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, watch};

/// How `status` reads to a client; `killed`: the server killed the tree,
/// so the supervisor's kill-now signal means SIGKILL.
pub(super) fn exit_of(status: std::io::Result<std::process::ExitStatus>, killed: bool) -> Exit {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Ok(status) => Exit {
            exit_code: status.code(),
            signal: status.signal().map(|number| {
                if killed && number == tree::KILL_NOW as i32 {
                    Signal::SIGKILL.as_str().to_owned()
                } else {
                    signal_name(number)
                }
            }),
        },
        Err(_) => Exit {
            exit_code: None,
            signal: None,
        },
    }
}

/// `SIGTERM` for 15; `SIG<n>` for a number nix does not name.
pub(super) fn signal_name(number: i32) -> String {
    Signal::try_from(number).map_or_else(|_| format!("SIG{number}"), |s| s.as_str().to_owned())
}

/// A request to the task that owns a process's stdin.
pub(super) enum Input {
    /// Write these bytes; answer when written.
    Write(Bytes, oneshot::Sender<std::io::Result<()>>),
    /// Close stdin (a terminal gets `^D`, its end-of-file character).
    Eof(oneshot::Sender<std::io::Result<()>>),
    /// Resize the terminal.
    Resize(TtySize, oneshot::Sender<std::io::Result<()>>),
    /// The process exited: close stdin and end the task.
    Stop,
}

/// Room for input requests waiting for the stdin task.
pub(super) const INPUT_QUEUE: usize = 16;
/// Most bytes one read of output takes.
pub(super) const READ_BYTES: usize = 64 * 1024;
/// How long the output readers may go on after the process exited (a
/// descendant that kept the pipe open is killed with the tree; this bounds
/// the rest).
pub(super) const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(2);
/// How long a `DELETE` waits for the killed tree to be gone.
pub(super) const FORGET_WAIT: Duration = Duration::from_secs(5);
/// How long a supervisor has to end its tree after the kill-now signal
/// before the server kills its process group itself.
const KILL_NOW_BOUND: Duration = Duration::from_secs(2);
/// How long a stdin write may wait for a process that does not read.
pub const INPUT_TIMEOUT: Duration = Duration::from_secs(30);

/// One process (module doc).
#[derive(Debug)]
pub struct Process {
    /// The API's id.
    pub(super) id: Arc<str>,
    /// Start order.
    pub(super) seq: u64,
    /// The program as asked for.
    pub(super) command: String,
    /// Its arguments.
    pub(super) args: Vec<String>,
    /// Its working directory.
    pub(super) cwd: String,
    /// Whether it runs on a terminal.
    pub(super) tty: bool,
    /// Label.
    pub(super) title: Option<String>,
    /// Session.
    pub(super) session_id: Option<String>,
    /// The record's size, bounded by [`StartRequest::check`]: its strings
    /// plus [`RECORD_OVERHEAD_BYTES`] (a list page's and the memory
    /// budget's measure).
    pub(super) record_bytes: usize,
    /// The record's charge to the memory budget, released with the record.
    pub(super) _charge: Option<Charge>,
    /// The tool call showing it.
    pub(super) tool_call_id: Mutex<Option<String>>,
    /// When it started.
    pub(super) started_at: SystemTime,
    /// Monotonic start, for durations.
    pub(super) started: Instant,
    /// The child the server started: the supervisor, or the program.
    pub(super) child_pid: Pid,
    /// Whether `child_pid` is a supervisor.
    pub(super) supervised: bool,
    /// The program's pid (0 until seen).
    pub(super) program_pid: AtomicI32,
    /// Set once the server killed the tree (DELETE, SIGKILL, a run's
    /// bound): the supervisor's death by [`tree::KILL_NOW`] is then
    /// reported as the SIGKILL it stands for.
    pub(super) killed: AtomicBool,
    /// Held by one stdin request at a time, for the whole of its body, so
    /// two requests' bytes never interleave and an unread body waits in
    /// its socket, not in memory.
    pub(super) input_turn: tokio::sync::Mutex<()>,
    /// Output and exit.
    pub(super) state: Mutex<State>,
    /// Bumped on every change of `state`, for followers.
    pub(super) changed: watch::Sender<u64>,
    /// The stdin task.
    pub(super) input: mpsc::Sender<Input>,
}

#[derive(Debug)]
pub(super) struct State {
    pub(super) output: Output,
    pub(super) exit: Option<Exit>,
    pub(super) ended_at: Option<SystemTime>,
}

impl Process {
    /// The API's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Records the tool call that shows this process (an agent's terminal
    /// named in a tool call's content).
    pub fn tag_tool_call(&self, tool_call_id: &str) {
        // The agent's string: one past the title's bound is not kept, so a
        // record stays within what the list page and the budget counted.
        if tool_call_id.len() > MAX_TITLE_BYTES {
            return;
        }
        *self.tool_call_id.lock() = Some(tool_call_id.to_owned());
    }

    /// The description the API shows.
    pub fn info(&self) -> ProcessInfo {
        let pid = self.known_pid();
        let state = self.state.lock();
        ProcessInfo {
            id: self.id.to_string(),
            pid: pid.map(Pid::as_raw),
            command: self.command.clone(),
            args: self.args.clone(),
            cwd: self.cwd.clone(),
            tty: self.tty,
            title: self.title.clone(),
            session_id: self.session_id.clone(),
            tool_call_id: self.tool_call_id.lock().clone(),
            state: if state.exit.is_some() {
                ProcessState::Exited
            } else {
                ProcessState::Running
            },
            exit_code: state.exit.as_ref().and_then(|exit| exit.exit_code),
            signal: state.exit.as_ref().and_then(|exit| exit.signal.clone()),
            started_at: rfc3339(self.started_at),
            ended_at: state.ended_at.map(rfc3339),
            output_bytes: state.output.end(),
        }
    }

    /// The output from `offset` on, at most about `limit` bytes.
    pub fn read(&self, offset: u64, limit: usize) -> Page {
        self.state.lock().output.read(offset, limit)
    }

    /// The raw output bytes from `offset` on, at most `limit` (the
    /// terminal WebSocket's binary frames).
    pub fn read_bytes(&self, offset: u64, limit: usize) -> BytesPage {
        self.state.lock().output.read_bytes(offset, limit)
    }

    /// The newest at most `max` bytes of output and whether older output
    /// exists (ACP's `terminal/output`).
    pub fn tail(&self, max: usize) -> (Vec<u8>, bool) {
        self.state.lock().output.tail(max)
    }

    /// How it ended, once it has.
    pub fn exit(&self) -> Option<Exit> {
        self.state.lock().exit.clone()
    }

    /// A receiver that changes whenever output arrives or the process
    /// exits.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// Waits until it exited (and its output was read to the end).
    pub async fn wait(&self) -> Exit {
        let mut changes = self.changed.subscribe();
        loop {
            changes.borrow_and_update();
            if let Some(exit) = self.exit() {
                return exit;
            }
            if changes.changed().await.is_err() {
                // The sender lives in `self`: unreachable while borrowed.
                return Exit {
                    exit_code: None,
                    signal: None,
                };
            }
        }
    }

    /// The program's pid, waiting a moment for the supervisor to start it.
    pub async fn pid(&self) -> Option<Pid> {
        for pause in spawn::PID_POLL.iter().chain(std::iter::repeat_n(
            &spawn::PID_POLL[spawn::PID_POLL.len() - 1],
            50,
        )) {
            if let Some(pid) = self.known_pid() {
                return Some(pid);
            }
            if self.exit().is_some() {
                return None;
            }
            tokio::time::sleep(*pause).await;
        }
        self.known_pid()
    }

    /// The program's pid if it is known or can be seen now.
    pub(super) fn known_pid(&self) -> Option<Pid> {
        let known = self.program_pid.load(Ordering::Relaxed);
        if known > 0 {
            return Some(Pid::from_raw(known));
        }
        if !self.supervised || self.state.lock().exit.is_some() {
            return None;
        }
        let found = spawn::program_behind(self.child_pid)?;
        self.program_pid.store(found.as_raw(), Ordering::Relaxed);
        Some(found)
    }

    /// Sends `signal` to the process: SIGKILL to its whole tree (every
    /// descendant, a `setsid` one included); any other to the program (on
    /// a terminal, to its process group, as the terminal would).
    ///
    /// # Errors
    /// 409 `process-exited` once it exited.
    pub async fn signal(self: &Arc<Self>, signal: Signal) -> Result<(), Error> {
        if self.exit().is_some() {
            return Err(Error::ProcessExited(self.id.to_string()));
        }
        if signal == Signal::SIGKILL {
            self.kill_tree();
            return Ok(());
        }
        let target = self.pid().await;
        let Some(target) = target else {
            return Err(Error::ProcessExited(self.id.to_string()));
        };
        // Checked again: the pid of an exited program may be reused.
        if self.exit().is_some() {
            return Err(Error::ProcessExited(self.id.to_string()));
        }
        // On a terminal, the signal goes where typing it would: the
        // terminal's foreground process group (a shell's running job).
        let sent = if self.tty {
            killpg(spawn::foreground_group(target).unwrap_or(target), signal)
        } else {
            kill(target, signal)
        };
        match sent {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(()),
            Err(errno) => Err(Error::PermissionDenied(format!(
                "cannot signal process {}: {errno}",
                self.id
            ))),
        }
    }

    /// SIGKILL to the whole tree at once (through the supervisor, woken
    /// with SIGCONT in case its program stopped it), unless it already
    /// exited; a supervisor that has not ended the tree after
    /// [`KILL_NOW_BOUND`] is killed with its process group
    /// (research/contract.md, "Process trees, bounds, shutdown").
    pub fn kill_tree(self: &Arc<Self>) {
        if self.exit().is_some() || self.child_pid.as_raw() <= 0 {
            return;
        }
        self.killed.store(true, Ordering::Relaxed);
        if !self.supervised {
            let _ = killpg(self.child_pid, Signal::SIGKILL);
            return;
        }
        let _ = kill(self.child_pid, tree::KILL_NOW);
        // A supervisor its program stopped (`kill -STOP $PPID`; possible
        // where the program runs as the supervisor's user) takes the
        // signal only once it runs again.
        let _ = kill(self.child_pid, Signal::SIGCONT);
        // And one that still does not act is killed with its group: the
        // supervisor is this server's child, not reaped before its exit
        // is recorded, so its pid is still its own until then.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let process = Arc::clone(self);
        runtime.spawn(async move {
            if tokio::time::timeout(KILL_NOW_BOUND, process.wait())
                .await
                .is_err()
                && process.exit().is_none()
            {
                tracing::warn!(
                    process = %process.id,
                    "a process's supervisor did not end its tree: SIGKILL to its group"
                );
                let _ = killpg(process.child_pid, Signal::SIGKILL);
            }
        });
    }

    /// A graceful stop of the whole tree: SIGTERM through the supervisor
    /// (which sends SIGKILL after its grace), or to the group.
    pub(super) fn signal_tree(&self, signal: Signal) {
        if self.exit().is_some() || self.child_pid.as_raw() <= 0 {
            return;
        }
        if self.supervised {
            let _ = kill(self.child_pid, signal);
        } else {
            let _ = killpg(self.child_pid, signal);
        }
    }

    /// Waits (at most [`INPUT_TIMEOUT`]) for this request's turn at stdin:
    /// one request writes its whole body before the next starts.
    ///
    /// # Errors
    /// 504 when another request holds stdin past the timeout.
    pub async fn input_turn(&self) -> Result<tokio::sync::MutexGuard<'_, ()>, Error> {
        tokio::time::timeout(INPUT_TIMEOUT, self.input_turn.lock())
            .await
            .map_err(|_| Error::InputTimeout {
                id: self.id.to_string(),
                timeout: INPUT_TIMEOUT,
            })
    }

    /// Writes `bytes` to stdin.
    ///
    /// # Errors
    /// 409 `process-exited` when it exited or its stdin is closed; 504
    /// when the process does not read it within [`INPUT_TIMEOUT`].
    pub async fn write_stdin(&self, bytes: Bytes) -> Result<(), Error> {
        self.input_request(|done| Input::Write(bytes, done), "stdin")
            .await
    }

    /// Closes stdin (on a terminal: sends its end-of-file character).
    ///
    /// # Errors
    /// As [`Process::write_stdin`].
    pub async fn close_stdin(&self) -> Result<(), Error> {
        self.input_request(Input::Eof, "stdin").await
    }

    /// Resizes the terminal.
    ///
    /// # Errors
    /// 409 `not-a-tty` without one, `process-exited` once it exited.
    pub async fn resize(&self, size: TtySize) -> Result<(), Error> {
        if !self.tty {
            return Err(Error::NotATty(self.id.to_string()));
        }
        self.input_request(|done| Input::Resize(size, done), "resize")
            .await
    }

    async fn input_request(
        &self,
        request: impl FnOnce(oneshot::Sender<std::io::Result<()>>) -> Input,
        what: &str,
    ) -> Result<(), Error> {
        let exited = || Error::ProcessExited(self.id.to_string());
        if self.exit().is_some() {
            return Err(exited());
        }
        let (done, answer) = oneshot::channel();
        let sent = async {
            self.input.send(request(done)).await.map_err(|_| exited())?;
            answer.await.map_err(|_| exited())?.map_err(|_| exited())
        };
        tokio::time::timeout(INPUT_TIMEOUT, sent)
            .await
            .map_err(|_| Error::InputTimeout {
                id: format!("{} ({what})", self.id),
                timeout: INPUT_TIMEOUT,
            })?
    }

    /// Appends output read from `stream` and wakes followers.
    fn push(&self, stream: OutputStream, data: Bytes) {
        self.state.lock().output.push(stream, data);
        self.changed.send_modify(|version| *version += 1);
    }
}

/// Reads one output stream into the process's ring until end of file (a
/// terminal's `EIO` once every holder of its other side is gone counts as
/// end of file), holding back a character split across reads.
pub(super) async fn read_output(
    process: Arc<Process>,
    mut reader: impl AsyncRead + Unpin,
    stream: OutputStream,
) {
    let mut buffer = BytesMut::with_capacity(READ_BYTES);
    loop {
        if buffer.capacity() - buffer.len() < 4 {
            buffer.reserve(READ_BYTES);
        }
        match reader.read_buf(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                // At most 3 bytes wait: the start of a character the next
                // read finishes.
                let ready = output::complete_prefix(&buffer);
                if ready > 0 {
                    process.push(stream, buffer.split_to(ready).freeze());
                }
            }
        }
    }
    if !buffer.is_empty() {
        process.push(stream, buffer.freeze());
    }
}

/// Owns a pipe stdin: writes what [`Input`] asks, in order.
pub(super) async fn write_pipe(
    stdin: tokio::process::ChildStdin,
    mut requests: mpsc::Receiver<Input>,
) {
    let mut stdin = Some(stdin);
    while let Some(request) = requests.recv().await {
        match request {
            Input::Write(bytes, done) => {
                let result = match stdin.as_mut() {
                    Some(pipe) => pipe.write_all(&bytes).await,
                    None => Err(std::io::ErrorKind::BrokenPipe.into()),
                };
                let _ = done.send(result);
            }
            Input::Eof(done) => {
                let result = match stdin.take() {
                    Some(mut pipe) => pipe.shutdown().await,
                    None => Err(std::io::ErrorKind::BrokenPipe.into()),
                };
                let _ = done.send(result);
            }
            Input::Resize(_, done) => {
                let _ = done.send(Err(std::io::ErrorKind::Unsupported.into()));
            }
            Input::Stop => return,
        }
    }
}

/// Owns a terminal's writing side: writes and resizes, in order.
pub(super) async fn write_pty(
    mut pty: pty_process::OwnedWritePty,
    mut requests: mpsc::Receiver<Input>,
) {
    /// The terminal's end-of-file character (`VEOF`, `^D`).
    const EOF: &[u8] = &[0x04];
    while let Some(request) = requests.recv().await {
        match request {
            Input::Write(bytes, done) => {
                let _ = done.send(pty.write_all(&bytes).await);
            }
            Input::Eof(done) => {
                let _ = done.send(pty.write_all(EOF).await);
            }
            Input::Resize(size, done) => {
                let result = pty
                    .resize(pty_process::Size::new(size.rows, size.cols))
                    .map_err(std::io::Error::other);
                let _ = done.send(result);
            }
            Input::Stop => return,
        }
    }
}
