//! The agent's client-side files and terminals, served in the sandbox
//! (research/contract.md, "Files and terminals of the agent, served in the
//! sandbox").
//!
//! An ACP agent asks its *client* for `fs/read_text_file`,
//! `fs/write_text_file` and `terminal/*` when the client declared those
//! capabilities. A remote client's disk is not the sandbox, so the runtime
//! declares them to the agent itself ([`ClientSide::declare`]) and answers
//! them ([`ClientSide::answer`]) in the session's `cwd`, under the host file
//! system API's rules (`--fs-root`, `..`, symlinks: the same [`Scope`]) and
//! never inside the runtime's own data. A connection that opted in
//! (`fsAndTerminal: "client"`) takes them instead; the router decides
//! ([`super::router`]).
//!
//! - this file: [`ClientSide`], the capability rule, dispatch by method.
//! - `fs`: `fs/read_text_file` (lines, limit, size bound) and
//!   `fs/write_text_file` (atomic, as the file API writes).
//! - `terminal`: `terminal/*`, each terminal a process of the process API
//!   tagged with its session and tool call.
//! - `reply`: results and errors in their JSON-RPC shapes.

mod fs;
mod reply;
mod terminal;

use crate::fs::Scope;
use crate::memory::connection::ClientCapabilities;
use crate::memory::session::Session;
use crate::os::user::AgentUser;
use crate::process::Processes;
use crate::protocol::method::{
    FS_READ_TEXT_FILE, FS_WRITE_TEXT_FILE, TERMINAL_CREATE, TERMINAL_KILL, TERMINAL_OUTPUT,
    TERMINAL_RELEASE, TERMINAL_WAIT_FOR_EXIT,
};
use crate::protocol::{RpcError, code, update};
use agent_client_protocol::v1::schema::{SessionNotification, SessionUpdate, ToolCallContent};
use reply::{fs_error, not_served};
use serde::de::DeserializeOwned;
use serde_json::Value;
use serde_json::value::RawValue;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// What the runtime needs to answer an agent's file and terminal requests:
/// the confinement of the host file system API and the paths no agent
/// request may reach. One per server, shared by every agent's router.
#[derive(Debug)]
pub struct ClientSide {
    /// `--fs-root`, canonical (as the file API has it).
    fs_root: Option<PathBuf>,
    /// `--fs-root` as written, when it differs.
    fs_root_as_given: Option<PathBuf>,
    /// Real paths refused to every request: the data dir and the SQLite
    /// store's files.
    excluded: Vec<PathBuf>,
    /// Largest `fs/write_text_file` content, in bytes (`--max-upload-bytes`).
    max_write_bytes: u64,
    /// The process API's processes, which agent terminals are (`None`
    /// with `--no-processes`: no `terminal` is declared).
    processes: Option<Arc<Processes>>,
    /// Which session owns which terminal.
    terminals: terminal::Terminals,
    /// The user agents run as (`--agent-user`): its file permissions bind
    /// the agents' `fs/*` requests, as they bind its terminals.
    user: Option<Arc<AgentUser>>,
}

impl ClientSide {
    /// The service for a server confined to `fs_root` (canonical; and as the
    /// operator wrote it) whose own data is `data_dir` plus `store_file` (a
    /// SQLite store outside it, if any). Writes are capped at
    /// `max_write_bytes`.
    pub fn new(
        fs_root: Option<PathBuf>,
        fs_root_as_given: Option<PathBuf>,
        data_dir: &Path,
        store_file: Option<&Path>,
        max_write_bytes: u64,
    ) -> Self {
        let mut excluded = vec![real_path(data_dir)];
        if let Some(store) = store_file {
            let store = real_path(store);
            // SQLite keeps the database's journal beside it.
            for suffix in ["", "-wal", "-shm", "-journal"] {
                let mut name = store.clone().into_os_string();
                name.push(suffix);
                excluded.push(PathBuf::from(name));
            }
        }
        Self {
            fs_root,
            fs_root_as_given,
            excluded,
            max_write_bytes,
            processes: None,
            terminals: terminal::Terminals::default(),
            user: None,
        }
    }

    /// The same service with agent terminals run as `processes` (`None`:
    /// no terminals).
    pub fn with_processes(mut self, processes: Option<Arc<Processes>>) -> Self {
        self.processes = processes;
        self
    }

    /// The service with agents' file requests made as `user`
    /// (research/contract.md, "Agents under an unprivileged user").
    pub fn acting_as(mut self, user: Option<AgentUser>) -> Self {
        if user.is_some() {
            // `/proc/self` here is the server's (root's) own: its memory
            // map, its open files. The user reads `/proc` itself, from a
            // terminal, where the kernel judges it as the user.
            self.excluded.push(PathBuf::from("/proc"));
        }
        self.user = user.map(Arc::new);
        self
    }

    /// The client capabilities the runtime declares in its own `initialize`
    /// to an agent whose manifest entry has `manifest` (an ACP
    /// `ClientCapabilities` object, `{}` by default), and those of them the
    /// runtime serves itself.
    ///
    /// The rule (research/contract.md, "Files and terminals of the agent,
    /// served in the sandbox", "Agent questions (ACP elicitation)"): the
    /// runtime's own `{"fs": {"readTextFile": true, "writeTextFile": true},
    /// "terminal": true, "elicitation": {"form": {}, "url": {}}}` (no
    /// `terminal` without processes; questions go to its clients), with the manifest's object merged over it as a
    /// JSON Merge Patch (RFC 7396): a manifest's `false` turns one off, its
    /// `null` removes it, its other members are added. The runtime serves
    /// what it offered and the result still declares; what only the manifest
    /// declares goes to the connections that declared it, as before.
    pub fn declare(&self, manifest: &Value) -> (Value, ClientCapabilities) {
        let offered = ClientCapabilities::sandbox(self.processes.is_some());
        let mut declared = serde_json::json!({
            "fs": { "readTextFile": true, "writeTextFile": true },
            "elicitation": crate::elicitation::declared(),
        });
        if let Some(object) = declared.as_object_mut() {
            if offered.terminal {
                object.insert("terminal".to_owned(), Value::Bool(true));
            }
            if let Some(patch) = manifest.as_object() {
                ext_methods::meta::merge(object, patch);
            }
        }
        let kept = ClientCapabilities::declared(&declared);
        let served = ClientCapabilities {
            read_text_file: offered.read_text_file && kept.read_text_file,
            write_text_file: offered.write_text_file && kept.write_text_file,
            terminal: offered.terminal && kept.terminal,
            ..ClientCapabilities::default()
        };
        (declared, served)
    }

    /// Answers agent request `method` with `params` (raw JSON) for
    /// `session`, whose agent process is `generation`: the result object,
    /// or the JSON-RPC error the agent gets.
    ///
    /// # Errors
    /// `-32602` for params that are not the method's (ACP schema) and for
    /// refused paths (`data.type` names the file API's problem type:
    /// `outside-root`, `permission-denied` for the runtime's own data,
    /// `invalid-path`, `program-not-found`, …), `-32002` for a missing file
    /// or an unknown terminal, `-32603` for other failures, `-32601` for a
    /// method the runtime does not serve.
    pub(crate) async fn answer(
        &self,
        method: &str,
        params: Option<&RawValue>,
        session: &Session,
        generation: u64,
    ) -> Result<Value, RpcError> {
        let terminals = |processes: &Option<Arc<Processes>>| {
            processes.clone().ok_or_else(|| not_served(method))
        };
        match method {
            FS_READ_TEXT_FILE => fs::read_text_file(self.scope(session)?, parse(params)?).await,
            FS_WRITE_TEXT_FILE => {
                fs::write_text_file(self.scope(session)?, parse(params)?, self.max_write_bytes)
                    .await
            }
            TERMINAL_CREATE => {
                let processes = terminals(&self.processes)?;
                let scope = self.scope(session)?;
                self.terminals
                    .create(&processes, scope, session, generation, parse(params)?)
                    .await
            }
            TERMINAL_OUTPUT => {
                let processes = terminals(&self.processes)?;
                self.terminals.output(&processes, session, &parse(params)?)
            }
            TERMINAL_WAIT_FOR_EXIT => {
                let processes = terminals(&self.processes)?;
                self.terminals
                    .wait_for_exit(&processes, session, &parse(params)?)
                    .await
            }
            TERMINAL_KILL => {
                let processes = terminals(&self.processes)?;
                self.terminals.kill(&processes, session, &parse(params)?)
            }
            TERMINAL_RELEASE => {
                let processes = terminals(&self.processes)?;
                self.terminals.release(&processes, session, &parse(params)?)
            }
            other => Err(not_served(other)),
        }
    }

    /// Tags the terminals a `session/update` line of `session` (of update
    /// kind `kind`) names in a tool call's content (`{"type": "terminal",
    /// "terminalId"}`) with that tool call's id, so the process API shows
    /// which tool call runs each. Other kinds cost a comparison, other
    /// tool calls one substring search.
    pub(crate) fn tag_terminals(&self, session: &Session, kind: &str, line: &[u8]) {
        let Some(processes) = &self.processes else {
            return;
        };
        if kind != update::TOOL_CALL && kind != update::TOOL_CALL_UPDATE {
            return;
        }
        if memchr::memmem::find(line, b"\"terminalId\"").is_none() {
            return;
        }
        #[derive(serde::Deserialize)]
        struct Notification {
            params: SessionNotification,
        }
        let Ok(notification) = serde_json::from_slice::<Notification>(line) else {
            return;
        };
        let (tool_call, content) = match &notification.params.update {
            SessionUpdate::ToolCall(call) => (&call.tool_call_id, Some(&call.content)),
            SessionUpdate::ToolCallUpdate(update) => {
                (&update.tool_call_id, update.fields.content.as_ref())
            }
            _ => return,
        };
        for entry in content.into_iter().flatten() {
            if let ToolCallContent::Terminal(terminal) = entry {
                self.terminals
                    .tag(processes, session, &terminal.terminal_id.0, &tool_call.0);
            }
        }
    }

    /// Kills and forgets the terminals agent process `generation` of
    /// `agent` left (it exited: nobody will release them).
    pub(crate) fn release_terminals(&self, agent: &str, generation: u64) {
        if let Some(processes) = &self.processes {
            self.terminals.release_all(processes, agent, generation);
        }
    }

    /// Paths of `session`'s requests: from its `cwd`, under the file API's
    /// root, never into the runtime's own data.
    fn scope(&self, session: &Session) -> Result<Scope, RpcError> {
        Scope::new(
            self.fs_root.clone(),
            self.fs_root_as_given.clone(),
            session.cwd(),
        )
        .map(|scope| {
            scope
                .excluding(self.excluded.clone())
                .acting_as(self.user.clone())
        })
        .map_err(|error| fs_error(&error))
    }
}

/// `path` with symlinks resolved, as far as it exists (a store file not
/// made yet still gets its directory resolved).
fn real_path(path: &Path) -> PathBuf {
    if let Ok(real) = path.canonicalize() {
        return real;
    }
    match (path.parent().map(Path::canonicalize), path.file_name()) {
        (Some(Ok(parent)), Some(name)) => parent.join(name),
        _ => path.to_owned(),
    }
}

/// The params of an agent request as their ACP schema type.
fn parse<T: DeserializeOwned>(params: Option<&RawValue>) -> Result<T, RpcError> {
    let raw = params.map_or("null", RawValue::get);
    serde_json::from_str(raw)
        .map_err(|error| RpcError::new(code::INVALID_PARAMS, format!("invalid params: {error}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn service(terminals: bool) -> ClientSide {
        let processes = terminals.then(|| {
            Arc::new(Processes::new(
                crate::process::ProcessLimits::default(),
                None,
            ))
        });
        ClientSide::new(None, None, Path::new("/nonexistent-data"), None, 1)
            .with_processes(processes)
    }

    #[test]
    fn the_manifest_is_merged_over_the_runtime_capabilities() {
        let (declared, served) = service(true).declare(&json!({}));
        assert_eq!(
            declared,
            json!({"fs": {"readTextFile": true, "writeTextFile": true}, "terminal": true,
                "elicitation": {"form": {}, "url": {}}})
        );
        assert_eq!(served, ClientCapabilities::sandbox(true));

        let manifest = json!({"fs": {"writeTextFile": false}, "terminal": null, "_meta": {"x": 1},
            "elicitation": {"url": null}});
        let (declared, served) = service(true).declare(&manifest);
        assert_eq!(
            declared,
            json!({"fs": {"readTextFile": true, "writeTextFile": false}, "_meta": {"x": 1},
                "elicitation": {"form": {}}})
        );
        assert!(served.read_text_file && !served.write_text_file && !served.terminal);
    }

    #[test]
    fn without_processes_terminal_is_neither_declared_nor_served() {
        let (declared, served) = service(false).declare(&json!({}));
        assert_eq!(
            declared,
            json!({"fs": {"readTextFile": true, "writeTextFile": true},
                "elicitation": {"form": {}, "url": {}}})
        );
        assert!(!served.terminal);
        // A manifest may still declare it: then connections get it, as before.
        let (declared, served) = service(false).declare(&json!({"terminal": true}));
        assert_eq!(declared["terminal"], true);
        assert!(!served.terminal);
    }
}
