//! `terminal/*` answered in the sandbox (research/contract.md, "Files and
//! terminals of the agent, served in the sandbox"): each agent terminal is a
//! process of the process API ([`Processes`]), its terminal id the process
//! id, tagged with its session (and with the tool call that later names
//! it), so a person follows the agent's command on `/v2/processes`.

use super::reply::{empty, fs_error, to_value};
use crate::error::Error;
use crate::fs::Scope;
use crate::memory::session::Session;
use crate::process::{MAX_TITLE_BYTES, Processes, StartRequest};
use crate::protocol::{RpcError, code};
use agent_client_protocol::v1::schema::{
    CreateTerminalRequest, CreateTerminalResponse, KillTerminalRequest, ReleaseTerminalRequest,
    TerminalExitStatus, TerminalOutputRequest, TerminalOutputResponse, WaitForTerminalExitRequest,
    WaitForTerminalExitResponse,
};
use parking_lot::Mutex;
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

/// Most output one terminal retains, in bytes, whatever its
/// `outputByteLimit` asks: 16 MiB, as for a file read
/// ([`super::fs::MAX_READ_BYTES`]).
pub(crate) const MAX_OUTPUT_BYTES: usize = super::fs::MAX_READ_BYTES;

/// The agents' terminals: which session owns each, and its output limit.
/// A terminal id names a process only for the session that created it.
#[derive(Debug, Default)]
pub(super) struct Terminals {
    by_id: Mutex<HashMap<String, Owned>>,
}

/// One terminal's owner and bound.
#[derive(Debug, Clone)]
struct Owned {
    /// The agent that created it.
    agent: Arc<str>,
    /// The agent process generation that created it.
    generation: u64,
    /// The session that created it.
    session: Arc<str>,
    /// `outputByteLimit`, capped at [`MAX_OUTPUT_BYTES`].
    limit: usize,
}

impl Terminals {
    /// `terminal/create`: starts `sh`-less `command` with `args` (ACP's
    /// command is a program, as the process API's) in `cwd` (the
    /// session's by default, under `scope`), stdin closed, `env` on top of
    /// the server's.
    ///
    /// # Errors
    /// `-32602` for a cwd the file rules refuse, a program not found, bad
    /// args or env; `-32603` when the process cannot start (also at
    /// `--max-processes`, with `data.type` `too-many-processes`).
    pub(super) async fn create(
        &self,
        processes: &Arc<Processes>,
        scope: Scope,
        session: &Session,
        generation: u64,
        request: CreateTerminalRequest,
    ) -> Result<Value, RpcError> {
        let env: Vec<(String, String)> = request
            .env
            .into_iter()
            .map(|variable| (variable.name, variable.value))
            .collect();
        StartRequest::check_args_and_env(&request.args, &env).map_err(|error| fs_error(&error))?;
        let raw = request
            .cwd
            .map_or_else(|| ".".to_owned(), |cwd| cwd.to_string_lossy().into_owned());
        let cwd = tokio::task::spawn_blocking(move || {
            // Looked up as the agents' user (when there is one): the
            // program runs as that user, and root's look would tell apart
            // what that user cannot see (research/contract.md, "Agents
            // under an unprivileged user").
            let _acting = scope.act()?;
            let absolute = scope.absolute(&raw)?;
            scope
                .open_dir_at(&absolute, Path::new(&raw))
                .map(|dir| dir.current())
                .map_err(|error| scope.naming_user(error))
        })
        .await
        .map_err(|error| RpcError::new(code::INTERNAL_ERROR, error.to_string()))?
        .map_err(|error| fs_error(&error))?;
        let limit = request
            .output_byte_limit
            .map_or(usize::MAX, |limit| {
                usize::try_from(limit).unwrap_or(usize::MAX)
            })
            .min(MAX_OUTPUT_BYTES);
        let mut title = std::iter::once(request.command.as_str())
            .chain(request.args.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" ");
        // The command line as a label: cut to the title's bound (at a
        // character boundary) rather than refuse a long one.
        if title.len() > MAX_TITLE_BYTES {
            let mut end = MAX_TITLE_BYTES;
            while !title.is_char_boundary(end) {
                end -= 1;
            }
            title.truncate(end);
        }
        let start = StartRequest {
            command: request.command,
            args: request.args,
            cwd,
            env,
            close_stdin: true,
            title: Some(title),
            session_id: Some(session.id.to_string()),
            output_bytes: request.output_byte_limit.is_some().then_some(limit),
            ..StartRequest::default()
        };
        let process = processes.start(start).await.map_err(|error| {
            let mut rpc = fs_error(&error);
            // A limit of the sandbox, not a bad request: ACP's internal
            // error, the problem's `type` in `data` (research/contract.md,
            // "Files and terminals of the agent, served in the sandbox").
            if matches!(error, Error::TooManyProcesses { .. }) {
                rpc.code = code::INTERNAL_ERROR;
            }
            rpc
        })?;
        self.by_id.lock().insert(
            process.id().to_owned(),
            Owned {
                agent: session.agent.clone(),
                generation,
                session: session.id.clone(),
                limit,
            },
        );
        to_value(CreateTerminalResponse::new(process.id().to_owned()))
    }

    /// `terminal/output`: the newest output within the terminal's limit
    /// (cut at a character boundary; bytes that are not UTF-8 become
    /// U+FFFD), whether older output was cut, and the exit once there is
    /// one.
    ///
    /// # Errors
    /// `-32002` for a terminal this session does not own (or released).
    pub(super) fn output(
        &self,
        processes: &Processes,
        session: &Session,
        request: &TerminalOutputRequest,
    ) -> Result<Value, RpcError> {
        let (process, owned) = self.owned(processes, session, &request.terminal_id.0)?;
        let (bytes, truncated) = process.tail(owned.limit);
        let response =
            TerminalOutputResponse::new(String::from_utf8_lossy(&bytes).into_owned(), truncated)
                .exit_status(process.exit().map(exit_status));
        to_value(response)
    }

    /// `terminal/wait_for_exit`: waits for the exit (as long as it takes;
    /// the agent's exit ends the wait).
    ///
    /// # Errors
    /// As [`Terminals::output`].
    pub(super) async fn wait_for_exit(
        &self,
        processes: &Processes,
        session: &Session,
        request: &WaitForTerminalExitRequest,
    ) -> Result<Value, RpcError> {
        let (process, _) = self.owned(processes, session, &request.terminal_id.0)?;
        let exit = process.wait().await;
        to_value(WaitForTerminalExitResponse::new(exit_status(exit)))
    }

    /// `terminal/kill`: kills the whole tree; the terminal and its output
    /// stay until released.
    ///
    /// # Errors
    /// As [`Terminals::output`].
    pub(super) fn kill(
        &self,
        processes: &Processes,
        session: &Session,
        request: &KillTerminalRequest,
    ) -> Result<Value, RpcError> {
        let (process, _) = self.owned(processes, session, &request.terminal_id.0)?;
        process.kill_tree();
        Ok(empty())
    }

    /// `terminal/release`: kills the tree if it still runs and forgets the
    /// process (gone from `/v2/processes`).
    ///
    /// # Errors
    /// As [`Terminals::output`].
    pub(super) fn release(
        &self,
        processes: &Processes,
        session: &Session,
        request: &ReleaseTerminalRequest,
    ) -> Result<Value, RpcError> {
        let id = &request.terminal_id.0;
        self.owned(processes, session, id)?;
        self.by_id.lock().remove(&**id);
        processes.forget(id);
        Ok(empty())
    }

    /// Tags terminal `terminal` of `session` with the tool call that shows
    /// it (a `tool_call` or `tool_call_update` whose content names it).
    pub(super) fn tag(
        &self,
        processes: &Processes,
        session: &Session,
        terminal: &str,
        tool_call: &str,
    ) {
        if let Ok((process, _)) = self.owned(processes, session, terminal) {
            process.tag_tool_call(tool_call);
        }
    }

    /// Releases every terminal process `generation` of `agent` created:
    /// the agent exited, nobody will release them.
    pub(super) fn release_all(&self, processes: &Processes, agent: &str, generation: u64) {
        let released: Vec<String> = {
            let mut by_id = self.by_id.lock();
            let ids: Vec<String> = by_id
                .iter()
                .filter(|(_, owned)| &*owned.agent == agent && owned.generation == generation)
                .map(|(id, _)| id.clone())
                .collect();
            for id in &ids {
                by_id.remove(id);
            }
            ids
        };
        for id in released {
            processes.forget(&id);
        }
    }

    /// The process of terminal `id` if `session` owns it.
    fn owned(
        &self,
        processes: &Processes,
        session: &Session,
        id: &str,
    ) -> Result<(Arc<crate::process::Process>, Owned), RpcError> {
        let owned = {
            let mut by_id = self.by_id.lock();
            let process = processes.get(id);
            if process.is_none() {
                // Forgotten by the process API (its exited-process bound).
                by_id.remove(id);
            }
            by_id
                .get(id)
                .filter(|owned| owned.agent == session.agent && owned.session == session.id)
                .cloned()
                .zip(process)
        };
        owned
            .map(|(owned, process)| (process, owned))
            .ok_or_else(|| {
                RpcError::new(
                    code::RESOURCE_NOT_FOUND,
                    format!("unknown terminal {id} (not created in this session, or released)"),
                )
                .with_data(serde_json::json!({ "terminalId": id }))
            })
    }
}

/// ACP's exit status of a process's exit.
fn exit_status(exit: ext_methods::Exit) -> TerminalExitStatus {
    TerminalExitStatus::new()
        .exit_code(exit.exit_code.and_then(|code| u32::try_from(code).ok()))
        .signal(exit.signal)
}
