//! The process API's operations as both surfaces ask for them
//! (research/contract.md, "Processes and terminals"): the `/v2/processes…`
//! routes and the `_sandboxagent/process/*` methods parse their own input
//! into the shared wire types of `ext-methods`, then call these, so a rule
//! (a cwd, a signal name, a terminal size, a bound) is checked in one place
//! and fails with the same problem on both.

use super::Runtime;
use crate::error::Error;
use crate::process::{Process, ProcessFilter, Processes, StartRequest, TtySize};
use bytes::Bytes;
use ext_methods::{
    DEFAULT_PROCESS_PAGE, MAX_PROCESS_PAGE, ProcessListParams, ProcessPage, ProcessRequest,
    ProcessState, RunResult,
};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

/// Terminal size when not given, and the largest side.
const DEFAULT_TTY: TtySize = TtySize { cols: 80, rows: 24 };
const MAX_TTY_SIDE: u16 = 4096;
/// `maxOutputBytes` of a run when not given, and the most.
const DEFAULT_RUN_OUTPUT: u64 = 1024 * 1024;
const MAX_RUN_OUTPUT: u64 = 16 * 1024 * 1024;
/// How long a start waits for the program's pid behind its supervisor.
const PID_WAIT: Duration = Duration::from_secs(1);

impl Runtime {
    /// The process table.
    ///
    /// # Errors
    /// 404 `processes-disabled` with `--no-processes`.
    pub fn processes(&self) -> Result<&Arc<Processes>, Error> {
        self.processes.as_ref().ok_or(Error::ProcessesDisabled)
    }

    /// The process `id`.
    ///
    /// # Errors
    /// 404 `processes-disabled`, `unknown-process`.
    pub fn process(&self, id: &str) -> Result<Arc<Process>, Error> {
        self.processes()?
            .get(id)
            .ok_or_else(|| Error::UnknownProcess(id.to_owned()))
    }

    /// Starts `request`'s program and waits (at most a second) for its pid.
    ///
    /// # Errors
    /// 400 `invalid-request` (a run's fields, a bad size, env or args),
    /// `program-not-found`; the working directory's errors (403
    /// `outside-root`, 404 `unknown-session`, …); 429 `too-many-processes`.
    pub async fn start_process(&self, request: ProcessRequest) -> Result<Arc<Process>, Error> {
        let processes = self.processes()?;
        if request.timeout_ms.is_some() || request.max_output_bytes.is_some() {
            return Err(Error::InvalidRequest(
                "timeoutMs and maxOutputBytes belong to POST /v2/processes/run".to_owned(),
            ));
        }
        let start = self.start_request(request).await?;
        let process = processes.start(start).await?;
        let _ = tokio::time::timeout(PID_WAIT, process.pid()).await;
        Ok(process)
    }

    /// Runs `request`'s program to completion (the process is listed while
    /// it runs and forgotten after).
    ///
    /// # Errors
    /// As [`Runtime::start_process`]; 400 for `tty` or a `maxOutputBytes`
    /// past 16 MiB.
    pub async fn run_process(&self, request: ProcessRequest) -> Result<RunResult, Error> {
        let processes = self.processes()?;
        if request.tty {
            return Err(Error::InvalidRequest(
                "a run has no terminal; start the process with POST /v2/processes".to_owned(),
            ));
        }
        let timeout = request.timeout_ms.map(Duration::from_millis);
        let cap = request.max_output_bytes.unwrap_or(DEFAULT_RUN_OUTPUT);
        if cap > MAX_RUN_OUTPUT {
            return Err(Error::InvalidRequest(format!(
                "maxOutputBytes must be at most {MAX_RUN_OUTPUT}"
            )));
        }
        let start = self.start_request(request).await?;
        let cap = usize::try_from(cap).unwrap_or(usize::MAX);
        processes.run(start, timeout, cap).await
    }

    /// A page of processes, newest first.
    ///
    /// # Errors
    /// 400 `invalid-request` for a `limit` outside 1..=1000 or a cursor
    /// this server did not make.
    pub fn list_processes(&self, params: &ProcessListParams) -> Result<ProcessPage, Error> {
        let limit = params.limit.unwrap_or(DEFAULT_PROCESS_PAGE);
        if !(1..=MAX_PROCESS_PAGE).contains(&limit) {
            return Err(Error::InvalidRequest(format!(
                "limit must be between 1 and {MAX_PROCESS_PAGE}, got {limit}"
            )));
        }
        let filter = ProcessFilter {
            session_id: params.session_id.clone(),
            running: params.state.map(|state| state == ProcessState::Running),
        };
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        self.processes()?
            .list(&filter, params.cursor.as_deref(), limit)
    }

    /// Writes `bytes` to `process`'s stdin, then closes it when `eof`, in
    /// one turn (no other input interleaves; the `input` route streams its
    /// body within the same turn).
    ///
    /// # Errors
    /// 409 `process-exited` once it exited or its stdin is closed; 504
    /// when it does not read within 30 s, or another input holds the turn
    /// that long.
    pub async fn write_process_input(
        &self,
        process: &Process,
        bytes: Bytes,
        eof: bool,
    ) -> Result<(), Error> {
        if process.exit().is_some() {
            return Err(Error::ProcessExited(process.id().to_owned()));
        }
        let _turn = process.input_turn().await?;
        if !bytes.is_empty() {
            process.write_stdin(bytes).await?;
        }
        if eof {
            process.close_stdin().await?;
        }
        Ok(())
    }

    /// Sends the signal named `name` (`SIGINT`, `int`, any case, with or
    /// without `SIG`) to `process`.
    ///
    /// # Errors
    /// 400 `invalid-request` for a name that is not a signal; 409
    /// `process-exited`.
    pub async fn signal_process(&self, process: &Arc<Process>, name: &str) -> Result<(), Error> {
        let upper = name.to_ascii_uppercase();
        let full_name = if upper.starts_with("SIG") {
            upper
        } else {
            format!("SIG{upper}")
        };
        let signal = nix::sys::signal::Signal::from_str(&full_name).map_err(|_| {
            Error::InvalidRequest(format!(
                "signal {name:?} is not a signal name (SIGINT, SIGTERM, SIGKILL, SIGHUP, …)"
            ))
        })?;
        process.signal(signal).await
    }

    /// Resizes `process`'s terminal to `cols` × `rows` cells.
    ///
    /// # Errors
    /// 400 `invalid-request` for a side outside 1..=4096; 409 `not-a-tty`,
    /// `process-exited`.
    pub async fn resize_process(
        &self,
        process: &Process,
        cols: u16,
        rows: u16,
    ) -> Result<(), Error> {
        let size = TtySize { cols, rows };
        check_size(size)?;
        process.resize(size).await
    }

    /// A start or run request as a [`StartRequest`]: the working directory
    /// resolved, the environment, arguments and terminal size checked.
    async fn start_request(&self, request: ProcessRequest) -> Result<StartRequest, Error> {
        let env: Vec<(String, String)> = request.env.into_iter().collect();
        StartRequest::check_args_and_env(&request.args, &env)?;
        // Before the session is looked up: past the bound is 400, not 404.
        if let Some(id) = &request.session_id
            && id.len() > crate::process::MAX_SESSION_ID_BYTES
        {
            return Err(Error::InvalidRequest(format!(
                "sessionId holds {} bytes; at most {}",
                id.len(),
                crate::process::MAX_SESSION_ID_BYTES
            )));
        }
        let tty = if request.tty {
            let size = TtySize {
                cols: request.cols.unwrap_or(DEFAULT_TTY.cols),
                rows: request.rows.unwrap_or(DEFAULT_TTY.rows),
            };
            check_size(size)?;
            Some(size)
        } else if request.cols.is_some() || request.rows.is_some() {
            return Err(Error::InvalidRequest(
                "cols and rows size a terminal: set tty: true".to_owned(),
            ));
        } else {
            None
        };
        let cwd = self
            .process_cwd(request.session_id.as_deref(), request.cwd.as_deref())
            .await?;
        Ok(StartRequest {
            command: request.command,
            args: request.args,
            cwd,
            env,
            tty,
            stdin: request.stdin.map(Bytes::from),
            close_stdin: false,
            title: request.title,
            session_id: request.session_id,
            output_bytes: None,
        })
    }
}

fn check_size(size: TtySize) -> Result<(), Error> {
    if size.cols == 0 || size.rows == 0 || size.cols > MAX_TTY_SIDE || size.rows > MAX_TTY_SIDE {
        return Err(Error::InvalidRequest(format!(
            "cols and rows must be between 1 and {MAX_TTY_SIDE}"
        )));
    }
    Ok(())
}
