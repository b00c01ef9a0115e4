//! Every process of the API ([`Processes`]): the table, the bounds
//! (`--max-processes` running at once, exited ones kept), start, run to
//! completion, the wait for an exit, shutdown.

use super::handle::{
    DRAIN_AFTER_EXIT, FORGET_WAIT, INPUT_QUEUE, Input, Process, READ_BYTES, State, exit_of,
    read_output, write_pipe, write_pty,
};
use super::output::{self, Output, OutputStream};
use super::request::{
    MAX_LIST_PAGE_BYTES, ProcessLimits, RECORD_OVERHEAD_BYTES, StartRequest, command_line_bytes,
};
use super::spawn::{self, Io, Launch};
use crate::budget::MemoryBudget;
use crate::error::Error;
use crate::os::tree::TreeSupervisor;
use ext_methods::{Encoding, Exit, ProcessPage, ProcessState, RunResult};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::{mpsc, oneshot, watch};

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
