//! The process API's processes (research/contract.md, "Processes and
//! terminals"): programs started in the sandbox on a client's request (or
//! an agent's terminal), each under a tree supervisor, with its output kept
//! in a ring numbered by byte offset so a follower that lost its connection
//! resumes exactly.
//!
//! - [`Processes`]: the table, the bounds (`--max-processes` running at
//!   once, exited ones kept), start, run to completion, shutdown.
//! - [`Process`]: one process: its description, output, stdin, signals,
//!   terminal size, and the exit its followers wait for.
//! - [`output`]: the output ring.

pub mod output;
mod spawn;

use crate::budget::{Charge, MemoryBudget};
use crate::error::Error;
use crate::os::tree::{self, TreeSupervisor};
use crate::time::rfc3339;
use bytes::{Bytes, BytesMut};
use ext_methods::{Encoding, Exit, ProcessInfo, ProcessPage, ProcessState, RunResult};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use output::{BytesPage, Output, OutputStream, Page};
use parking_lot::Mutex;
pub use spawn::TtySize;
use spawn::{Io, Launch};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, watch};

/// The bounds of the process API (server flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessLimits {
    /// Processes running at once (`--max-processes`; 429 past it).
    pub max_running: usize,
    /// Output retained per process, in bytes (`--process-output-bytes`).
    pub output_bytes: usize,
    /// Exited processes kept for reading (`--kept-processes`); the oldest
    /// is forgotten past it.
    pub kept_exited: usize,
}

/// Most bytes of a process's `title` (research/contract.md, "Process
/// trees, bounds, shutdown"): 400 `invalid-request` past it.
pub const MAX_TITLE_BYTES: usize = 1024;
/// Most bytes of a process's `command`, `args` and `env` together, each
/// string counted with one byte more (its NUL or `=`): what a record keeps
/// for reading and the program is started with. 400 past it.
pub const MAX_COMMAND_LINE_BYTES: usize = 64 * 1024;
/// Most bytes of the `sessionId` a process names. 400 past it.
pub const MAX_SESSION_ID_BYTES: usize = 1024;
/// Most bytes one page of the process list may take as JSON, counted as
/// the worst case (every byte of every string escaped as `\u00XX`): a
/// page stops early, with `nextCursor`, rather than pass it. One process
/// always fits.
pub const MAX_LIST_PAGE_BYTES: usize = 4 << 20;
/// What a record costs beyond its strings, as counted in the memory
/// budget and a list page: the fixed fields, the allocations' headers.
const RECORD_OVERHEAD_BYTES: usize = 512;

impl Default for ProcessLimits {
    fn default() -> Self {
        Self {
            max_running: 64,
            output_bytes: 1024 * 1024,
            kept_exited: 256,
        }
    }
}

/// What to start.
#[derive(Debug, Clone, Default)]
pub struct StartRequest {
    /// The program: a name found on `PATH`, or a path (never a shell line).
    pub command: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Its working directory, already resolved and checked by the caller
    /// (the host file system rules).
    pub cwd: PathBuf,
    /// Variables set on top of the server's environment (minus its
    /// secrets).
    pub env: Vec<(String, String)>,
    /// A terminal of this size, or pipes.
    pub tty: Option<TtySize>,
    /// Bytes written to stdin first.
    pub stdin: Option<Bytes>,
    /// Close stdin after `stdin` (end of file).
    pub close_stdin: bool,
    /// A label for people.
    pub title: Option<String>,
    /// The session this process belongs to (an agent's terminal, or a
    /// client's choice).
    pub session_id: Option<String>,
    /// Retained output in bytes, instead of the server's default.
    pub output_bytes: Option<usize>,
}

impl StartRequest {
    /// Checks what the operating system cannot take: arguments with a NUL
    /// byte, a variable name that is empty or holds `=` or NUL, a value
    /// with NUL (for every surface that starts processes: the routes, an
    /// agent's `terminal/create`).
    ///
    /// # Errors
    /// 400 `invalid-request` naming what is wrong.
    pub fn check_args_and_env(args: &[String], env: &[(String, String)]) -> Result<(), Error> {
        let bytes = command_line_bytes("", args, env);
        if bytes > MAX_COMMAND_LINE_BYTES {
            return Err(Error::InvalidRequest(format!(
                "args and env hold {bytes} bytes; at most {MAX_COMMAND_LINE_BYTES} together"
            )));
        }
        for (key, value) in env {
            if key.is_empty() || key.contains(['=', '\0']) || value.contains('\0') {
                return Err(Error::InvalidRequest(format!(
                    "env: {key:?} is not a valid variable (a name without = or NUL, a value without NUL)"
                )));
            }
        }
        if args.iter().any(|arg| arg.contains('\0')) {
            return Err(Error::InvalidRequest(
                "args must not contain NUL bytes".to_owned(),
            ));
        }
        Ok(())
    }

    /// Checks the bounds of what a process record keeps (research/
    /// contract.md, "Process trees, bounds, shutdown"): `command`, `args`
    /// and `env` together at most [`MAX_COMMAND_LINE_BYTES`], `title` at
    /// most [`MAX_TITLE_BYTES`], `sessionId` at most
    /// [`MAX_SESSION_ID_BYTES`]; and [`StartRequest::check_args_and_env`].
    ///
    /// # Errors
    /// 400 `invalid-request` naming the member and its bound.
    pub fn check(&self) -> Result<(), Error> {
        Self::check_args_and_env(&self.args, &self.env)?;
        let bytes = command_line_bytes(&self.command, &self.args, &self.env);
        if bytes > MAX_COMMAND_LINE_BYTES {
            return Err(Error::InvalidRequest(format!(
                "command, args and env hold {bytes} bytes; at most {MAX_COMMAND_LINE_BYTES} together"
            )));
        }
        let too_long = |member: &str, value: Option<&String>, max: usize| match value {
            Some(value) if value.len() > max => Err(Error::InvalidRequest(format!(
                "{member} holds {} bytes; at most {max}",
                value.len()
            ))),
            _ => Ok(()),
        };
        too_long("title", self.title.as_ref(), MAX_TITLE_BYTES)?;
        too_long("sessionId", self.session_id.as_ref(), MAX_SESSION_ID_BYTES)
    }
}

/// The bytes of `command` (none when empty), `args` and `env`, each string
/// with one more (its NUL, or the `=` of a variable).
fn command_line_bytes(command: &str, args: &[String], env: &[(String, String)]) -> usize {
    let command = if command.is_empty() {
        0
    } else {
        command.len() + 1
    };
    args.iter()
        .map(String::len)
        .chain(env.iter().map(|(key, value)| key.len() + value.len()))
        .fold(command, |sum, len| sum.saturating_add(len + 1))
}

/// How `status` reads to a client; `killed`: the server killed the tree,
/// so the supervisor's kill-now signal means SIGKILL.
fn exit_of(status: std::io::Result<std::process::ExitStatus>, killed: bool) -> Exit {
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
fn signal_name(number: i32) -> String {
    Signal::try_from(number).map_or_else(|_| format!("SIG{number}"), |s| s.as_str().to_owned())
}

/// Which processes a list shows.
#[derive(Debug, Clone, Default)]
pub struct ProcessFilter {
    /// Only this session's.
    pub session_id: Option<String>,
    /// Only running (`Some(true)`) or exited (`Some(false)`) ones.
    pub running: Option<bool>,
}

/// Every process of the API.
#[derive(Debug)]
pub struct Processes {
    /// The bounds.
    limits: ProcessLimits,
    /// The tree supervisor every process starts under (`None`: none).
    supervisor: Option<TreeSupervisor>,
    /// The table.
    table: Mutex<Table>,
    /// Numbers processes in start order (list order, cursors).
    next_seq: AtomicU64,
    /// The server's memory budget, which every record is charged to while
    /// it lives (research/contract.md, "Memory budget"); `None`: not
    /// counted.
    budget: Option<Arc<MemoryBudget>>,
}

#[derive(Debug, Default)]
struct Table {
    by_id: HashMap<Arc<str>, Arc<Process>>,
    by_seq: BTreeMap<u64, Arc<Process>>,
    /// Running processes (and starts under way).
    running: usize,
    /// Exited processes still kept, oldest first, with the output bytes
    /// each retains.
    exited: VecDeque<(u64, usize)>,
    /// Output bytes the exited processes retain, together.
    exited_bytes: usize,
}

/// Output bytes all exited processes may retain together; past it the
/// oldest exited process is forgotten (as past `--kept-processes`).
const EXITED_OUTPUT_BYTES: usize = 64 * 1024 * 1024;

/// A request to the task that owns a process's stdin.
enum Input {
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
const INPUT_QUEUE: usize = 16;
/// Most bytes one read of output takes.
const READ_BYTES: usize = 64 * 1024;
/// How long the output readers may go on after the process exited (a
/// descendant that kept the pipe open is killed with the tree; this bounds
/// the rest).
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(2);
/// How long a `DELETE` waits for the killed tree to be gone.
const FORGET_WAIT: Duration = Duration::from_secs(5);
/// How long a supervisor has to end its tree after the kill-now signal
/// before the server kills its process group itself.
const KILL_NOW_BOUND: Duration = Duration::from_secs(2);
/// How long a stdin write may wait for a process that does not read.
pub const INPUT_TIMEOUT: Duration = Duration::from_secs(30);

/// One process (module doc).
#[derive(Debug)]
pub struct Process {
    /// The API's id.
    id: Arc<str>,
    /// Start order.
    seq: u64,
    /// The program as asked for.
    command: String,
    /// Its arguments.
    args: Vec<String>,
    /// Its working directory.
    cwd: String,
    /// Whether it runs on a terminal.
    tty: bool,
    /// Label.
    title: Option<String>,
    /// Session.
    session_id: Option<String>,
    /// The record's size, bounded by [`StartRequest::check`]: its strings
    /// plus [`RECORD_OVERHEAD_BYTES`] (a list page's and the memory
    /// budget's measure).
    record_bytes: usize,
    /// The record's charge to the memory budget, released with the record.
    _charge: Option<Charge>,
    /// The tool call showing it.
    tool_call_id: Mutex<Option<String>>,
    /// When it started.
    started_at: SystemTime,
    /// Monotonic start, for durations.
    started: Instant,
    /// The child the server started: the supervisor, or the program.
    child_pid: Pid,
    /// Whether `child_pid` is a supervisor.
    supervised: bool,
    /// The program's pid (0 until seen).
    program_pid: AtomicI32,
    /// Set once the server killed the tree (DELETE, SIGKILL, a run's
    /// bound): the supervisor's death by [`tree::KILL_NOW`] is then
    /// reported as the SIGKILL it stands for.
    killed: AtomicBool,
    /// Held by one stdin request at a time, for the whole of its body, so
    /// two requests' bytes never interleave and an unread body waits in
    /// its socket, not in memory.
    input_turn: tokio::sync::Mutex<()>,
    /// Output and exit.
    state: Mutex<State>,
    /// Bumped on every change of `state`, for followers.
    changed: watch::Sender<u64>,
    /// The stdin task.
    input: mpsc::Sender<Input>,
}

#[derive(Debug)]
struct State {
    output: Output,
    exit: Option<Exit>,
    ended_at: Option<SystemTime>,
}

impl Processes {
    /// An empty table with these bounds; processes start under
    /// `supervisor`.
    pub fn new(limits: ProcessLimits, supervisor: Option<TreeSupervisor>) -> Self {
        Self {
            limits,
            supervisor,
            table: Mutex::new(Table::default()),
            next_seq: AtomicU64::new(1),
            budget: None,
        }
    }

    /// This table with every record charged to `budget` while it lives.
    #[must_use]
    pub fn with_budget(mut self, budget: Arc<MemoryBudget>) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Starts `request`'s program.
    ///
    /// # Errors
    /// 429 `too-many-processes` at `--max-processes`; 400
    /// `program-not-found`, `invalid-request` (also past the bounds of
    /// [`StartRequest::check`]); 500 when it cannot be started otherwise.
    pub async fn start(self: &Arc<Self>, request: StartRequest) -> Result<Arc<Process>, Error> {
        request.check()?;
        // Checked here for a clear error; started by its name, so the
        // program sees the `argv[0]` it was asked by (as `execvp` gives).
        spawn::find_program(&request.command, &request.cwd, &request.env)?;
        // The program enters `cwd` as the agents' user; a folder closed to
        // it is said here, naming the user, not as an exit status 127.
        if let Some(user) = self.supervisor.as_ref().and_then(|s| s.user.as_ref())
            && let Some(step) = crate::os::user::unreachable_step(user, &request.cwd)
        {
            return Err(Error::PermissionDenied(format!(
                "{} is closed to user {} (--agent-user), which runs processes: {} may not be entered",
                request.cwd.display(),
                user.name,
                step.display()
            )));
        }
        let program = PathBuf::from(&request.command);
        {
            let mut table = self.table.lock();
            if table.running >= self.limits.max_running {
                return Err(Error::TooManyProcesses {
                    limit: self.limits.max_running,
                });
            }
            table.running += 1;
        }
        let launch = Launch {
            program: &program,
            args: &request.args,
            cwd: &request.cwd,
            env: &request.env,
            tty: request.tty,
        };
        let started = match spawn::spawn(self.supervisor.as_ref(), &launch) {
            Ok(started) => started,
            Err(error) => {
                self.table.lock().running -= 1;
                return Err(spawn::start_error(&request.command, &request.cwd, &error));
            }
        };
        let child_pid = started
            .child
            .id()
            .and_then(|pid| i32::try_from(pid).ok())
            .map_or(Pid::from_raw(0), Pid::from_raw);
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        let (input_tx, input_rx) = mpsc::channel(INPUT_QUEUE);
        let supervised = self.supervisor.is_some();
        let cwd = request.cwd.to_string_lossy().into_owned();
        let record_bytes = RECORD_OVERHEAD_BYTES
            + command_line_bytes(&request.command, &request.args, &[])
            + cwd.len()
            + request.title.as_ref().map_or(0, String::len)
            + request.session_id.as_ref().map_or(0, String::len);
        let process = Arc::new(Process {
            id: Arc::from(uuid::Uuid::new_v4().simple().to_string()),
            seq,
            command: request.command,
            args: request.args,
            cwd,
            tty: request.tty.is_some(),
            title: request.title,
            session_id: request.session_id,
            record_bytes,
            _charge: self
                .budget
                .as_ref()
                .map(|budget| MemoryBudget::hold(budget, record_bytes)),
            tool_call_id: Mutex::new(None),
            started_at: SystemTime::now(),
            started: Instant::now(),
            child_pid,
            supervised,
            program_pid: AtomicI32::new(if supervised { 0 } else { child_pid.as_raw() }),
            killed: AtomicBool::new(false),
            input_turn: tokio::sync::Mutex::new(()),
            state: Mutex::new(State {
                output: Output::new(request.output_bytes.unwrap_or(self.limits.output_bytes)),
                exit: None,
                ended_at: None,
            }),
            changed: watch::channel(0).0,
            input: input_tx,
        });
        {
            let mut table = self.table.lock();
            table.by_id.insert(process.id.clone(), process.clone());
            table.by_seq.insert(seq, process.clone());
        }
        let readers = match started.io {
            Io::Pipes(stdin, stdout, stderr) => {
                tokio::spawn(write_pipe(stdin, input_rx));
                vec![
                    tokio::spawn(read_output(process.clone(), stdout, OutputStream::Stdout)),
                    tokio::spawn(read_output(process.clone(), stderr, OutputStream::Stderr)),
                ]
            }
            Io::Pty(pty) => {
                let (read, write) = pty.into_split();
                tokio::spawn(write_pty(write, input_rx));
                vec![tokio::spawn(read_output(
                    process.clone(),
                    read,
                    OutputStream::Tty,
                ))]
            }
        };
        tokio::spawn(wait_for_exit(
            self.clone(),
            process.clone(),
            started.child,
            readers,
        ));
        if let Some(stdin) = request.stdin.filter(|bytes| !bytes.is_empty()) {
            // Queued first: nothing a client sends later overtakes it.
            let (done, _) = oneshot::channel();
            let _ = process.input.try_send(Input::Write(stdin, done));
        }
        if request.close_stdin {
            let (done, _) = oneshot::channel();
            let _ = process.input.send(Input::Eof(done)).await;
        }
        Ok(process)
    }

    /// Runs `request`'s program to completion: at most `max_output` bytes
    /// of stdout and of stderr (past either, the tree is killed and
    /// `truncated` set), killed at `timeout`. Stdin is closed after
    /// `request.stdin`. The process is listed while it runs and forgotten
    /// when it returns; when the caller goes away first (the future is
    /// dropped), its tree is killed.
    ///
    /// # Errors
    /// As [`Processes::start`].
    pub async fn run(
        self: &Arc<Self>,
        mut request: StartRequest,
        timeout: Option<Duration>,
        max_output: usize,
    ) -> Result<RunResult, Error> {
        request.close_stdin = true;
        request.tty = None;
        request.output_bytes = Some(max_output.saturating_mul(2).saturating_add(READ_BYTES));
        let process = self.start(request).await?;
        let guard = Forget {
            processes: self.clone(),
            process: process.clone(),
        };
        let deadline = timeout.map(|timeout| tokio::time::Instant::now() + timeout);
        let mut changes = process.changed.subscribe();
        let mut truncated = false;
        let mut timed_out = false;
        loop {
            changes.borrow_and_update();
            {
                let state = process.state.lock();
                if state.exit.is_some() {
                    break;
                }
                if !truncated
                    && (state.output.written(OutputStream::Stdout) > max_output as u64
                        || state.output.written(OutputStream::Stderr) > max_output as u64)
                {
                    truncated = true;
                    drop(state);
                    process.kill_tree();
                }
            }
            let sleep = async {
                match deadline {
                    Some(deadline) => tokio::time::sleep_until(deadline).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = changes.changed() => {}
                () = sleep, if !timed_out => {
                    timed_out = true;
                    process.kill_tree();
                }
            }
        }
        let (stdout, stderr, exit) = {
            let state = process.state.lock();
            let page = state.output.read(0, usize::MAX);
            let mut streams = (Vec::new(), Vec::new());
            for chunk in &page.chunks {
                match chunk.stream {
                    OutputStream::Stderr => streams.1.extend_from_slice(&chunk.data),
                    _ => streams.0.extend_from_slice(&chunk.data),
                }
            }
            (streams.0, streams.1, state.exit.clone())
        };
        drop(guard);
        let exit = exit.unwrap_or(Exit {
            exit_code: None,
            signal: None,
        });
        let (stdout, stdout_encoding) = text_or_base64(stdout, max_output);
        let (stderr, stderr_encoding) = text_or_base64(stderr, max_output);
        Ok(RunResult {
            exit_code: exit.exit_code,
            signal: exit.signal,
            stdout,
            stdout_encoding,
            stderr,
            stderr_encoding,
            truncated,
            timed_out,
            duration_ms: u64::try_from(process.started.elapsed().as_millis()).unwrap_or(u64::MAX),
        })
    }

    /// The process with this id.
    pub fn get(&self, id: &str) -> Option<Arc<Process>> {
        self.table.lock().by_id.get(id).cloned()
    }

    /// [`Processes::forget`], then waits (at most [`FORGET_WAIT`]) until
    /// the tree is gone, so its slot is free when the caller answers.
    pub async fn forget_and_wait(&self, id: &str) -> bool {
        let Some(process) = self.get(id) else {
            return false;
        };
        let known = self.forget(id);
        let _ = tokio::time::timeout(FORGET_WAIT, process.wait()).await;
        known
    }

    /// Kills a running process's tree, then forgets it. Whether it was
    /// known.
    pub fn forget(&self, id: &str) -> bool {
        let removed = {
            let mut table = self.table.lock();
            let removed = table.by_id.remove(id);
            if let Some(process) = &removed {
                table.by_seq.remove(&process.seq);
                let seq = process.seq;
                if let Some(at) = table.exited.iter().position(|(other, _)| *other == seq) {
                    let (_, bytes) = table.exited.remove(at).unwrap_or_default();
                    table.exited_bytes -= bytes;
                }
            }
            removed
        };
        match removed {
            Some(process) => {
                process.kill_tree();
                true
            }
            None => false,
        }
    }

    /// For the metrics: processes running (and starts under way), and
    /// exited ones still kept.
    pub(crate) fn counts(&self) -> (u64, u64) {
        let table = self.table.lock();
        (table.running as u64, table.exited.len() as u64)
    }

    /// A page of processes, newest first: at most `limit`, older than
    /// `cursor` (a previous page's `nextCursor`).
    ///
    /// # Errors
    /// 400 `invalid-request` for a cursor this server did not make.
    pub fn list(
        &self,
        filter: &ProcessFilter,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<ProcessPage, Error> {
        let before = match cursor {
            None => u64::MAX,
            Some(cursor) => cursor
                .strip_prefix('p')
                .and_then(|seq| seq.parse::<u64>().ok())
                .ok_or_else(|| {
                    Error::InvalidRequest(format!(
                        "query parameter cursor: {cursor:?} is not a cursor of this list"
                    ))
                })?,
        };
        let table = self.table.lock();
        let mut processes = Vec::new();
        let mut next_cursor = None;
        let mut page_bytes = 0usize;
        for (seq, process) in table.by_seq.range(..before).rev() {
            if filter
                .session_id
                .as_deref()
                .is_some_and(|id| process.session_id.as_deref() != Some(id))
            {
                continue;
            }
            let info = process.info();
            if filter
                .running
                .is_some_and(|running| running != (info.state == ProcessState::Running))
            {
                continue;
            }
            // Every string byte escaped at worst as six (`\u00XX`).
            let bytes = process.record_bytes.saturating_mul(6);
            if processes.len() == limit
                || (!processes.is_empty() && page_bytes.saturating_add(bytes) > MAX_LIST_PAGE_BYTES)
            {
                next_cursor = Some(format!("p{}", seq + 1));
                break;
            }
            page_bytes = page_bytes.saturating_add(bytes);
            processes.push(info);
        }
        Ok(ProcessPage {
            processes,
            next_cursor,
        })
    }

    /// Stops every running process at server shutdown: SIGTERM to each
    /// tree (its supervisor sends SIGKILL after its grace), then, after
    /// `grace`, SIGKILL to what is left.
    pub async fn shutdown(&self, grace: Duration) {
        let running: Vec<Arc<Process>> = self
            .table
            .lock()
            .by_seq
            .values()
            .filter(|process| process.exit().is_none())
            .cloned()
            .collect();
        for process in &running {
            process.signal_tree(Signal::SIGTERM);
        }
        let all = futures::future::join_all(running.iter().map(|process| process.wait()));
        if tokio::time::timeout(grace, all).await.is_err() {
            for process in &running {
                process.kill_tree();
            }
        }
    }

    /// Records that `process` exited: one fewer running; kept among the
    /// exited, the oldest of which are forgotten past `--kept-processes`
    /// or past [`EXITED_OUTPUT_BYTES`] of their output together.
    fn exited(&self, process: &Process) {
        let retained = process.state.lock().output.retained();
        let mut table = self.table.lock();
        table.running = table.running.saturating_sub(1);
        if !table.by_id.contains_key(&process.id) {
            return;
        }
        table.exited.push_back((process.seq, retained));
        table.exited_bytes += retained;
        while table.exited.len() > self.limits.kept_exited
            || (table.exited_bytes > EXITED_OUTPUT_BYTES && table.exited.len() > 1)
        {
            let Some((oldest, bytes)) = table.exited.pop_front() else {
                break;
            };
            table.exited_bytes -= bytes;
            if let Some(gone) = table.by_seq.remove(&oldest) {
                table.by_id.remove(&gone.id);
            }
        }
    }
}

/// Forgets a run's process when the run ends or is dropped (its tree is
/// killed if it still runs).
struct Forget {
    processes: Arc<Processes>,
    process: Arc<Process>,
}

impl Drop for Forget {
    fn drop(&mut self) {
        self.processes.forget(&self.process.id);
    }
}

/// `bytes` cut to `max`, as text when it is UTF-8, else base64.
fn text_or_base64(mut bytes: Vec<u8>, max: usize) -> (String, Option<Encoding>) {
    bytes.truncate(max);
    match String::from_utf8(bytes) {
        Ok(text) => (text, None),
        Err(error) => {
            let bytes = error.into_bytes();
            // A cap that cut a character in two leaves text with a broken
            // end: keep the text, drop the broken character's start.
            let keep = output::complete_prefix(&bytes);
            match std::str::from_utf8(&bytes[..keep]) {
                Ok(text) if bytes.len() - keep < 4 => (text.to_owned(), None),
                _ => ext_methods::encode_bytes(&bytes),
            }
        }
    }
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
    fn known_pid(&self) -> Option<Pid> {
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
    fn signal_tree(&self, signal: Signal) {
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
async fn read_output(
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
async fn write_pipe(stdin: tokio::process::ChildStdin, mut requests: mpsc::Receiver<Input>) {
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
async fn write_pty(mut pty: pty_process::OwnedWritePty, mut requests: mpsc::Receiver<Input>) {
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

/// Waits for the child, lets the readers finish (bounded), then records
/// the exit and wakes followers.
async fn wait_for_exit(
    processes: Arc<Processes>,
    process: Arc<Process>,
    mut child: tokio::process::Child,
    readers: Vec<tokio::task::JoinHandle<()>>,
) {
    let status = child.wait().await;
    // A supervisor that died of a signal nobody here sent (the program
    // killed it) left its tree: what is still in its process group (the
    // program's, on a terminal) goes now. A `setsid` escapee of such a
    // tree is out of reach (research/contract.md, "Processes and
    // terminals", limits).
    if process.supervised && !process.killed.load(Ordering::Relaxed) {
        use std::os::unix::process::ExitStatusExt;
        if status
            .as_ref()
            .is_ok_and(|status| status.signal().is_some())
        {
            let _ = killpg(process.child_pid, Signal::SIGKILL);
            if let Some(program) = process.known_pid() {
                let _ = killpg(program, Signal::SIGKILL);
            }
        }
    }
    let aborts: Vec<_> = readers.iter().map(|reader| reader.abort_handle()).collect();
    let drained = futures::future::join_all(readers);
    if tokio::time::timeout(DRAIN_AFTER_EXIT, drained)
        .await
        .is_err()
    {
        for abort in aborts {
            abort.abort();
        }
    }
    {
        let mut state = process.state.lock();
        state.exit = Some(exit_of(status, process.killed.load(Ordering::Relaxed)));
        state.ended_at = Some(SystemTime::now());
    }
    process.changed.send_modify(|version| *version += 1);
    // The stdin task lets go of its pipe (or the terminal) now, not when
    // the process is forgotten.
    let input = process.input.clone();
    tokio::spawn(async move {
        let _ = input.send(Input::Stop).await;
    });
    processes.exited(&process);
}
