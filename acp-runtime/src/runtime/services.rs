//! What the runtime answers itself, the same for every surface that asks
//! (a JSON-RPC method, a control-plane route, the CLI): `session/list`, a
//! session by id, terminate, models, agent installs, event pages, the
//! store's health.

use super::Runtime;
use crate::error::Error;
use crate::fs::Scope;
use crate::install::{InstallOptions, LogProgress};
use crate::memory::session::Session;
use crate::memory::sessions::ListFilter;
use crate::protocol::{self, RpcError, code, method};
use crate::store::writer::StoreHealth;
use agent_client_protocol::v1::schema::{ListSessionsRequest, ListSessionsResponse};
use bytes::Bytes;
use ext_methods::{
    Direction, EndReason, ListModelsResult, ModelsTarget, SessionEnded, TerminateResult,
    TerminatedBy,
};
use serde_json::value::RawValue;
use std::sync::Arc;

impl Runtime {
    /// `session/list` (and its seed-era name `_sandboxagent/session/list`)
    /// from the server-wide inventory: every agent and connection, newest
    /// first, ACP cursor pagination (50 per page).
    ///
    /// # Errors
    /// `-32602` for params that are not `session/list` params or a cursor
    /// this server did not make.
    pub async fn list_sessions(
        &self,
        params: Option<&RawValue>,
    ) -> Result<ListSessionsResponse, RpcError> {
        const PAGE: usize = 50;
        let request: ListSessionsRequest = match params {
            None => ListSessionsRequest::new(),
            Some(params) => serde_json::from_str(params.get()).map_err(|error| {
                RpcError::new(code::INVALID_PARAMS, format!("invalid params: {error}"))
            })?,
        };
        let filter = ListFilter {
            cwd: request
                .cwd
                .as_ref()
                .map(|cwd| cwd.to_string_lossy().into_owned()),
            ..ListFilter::default()
        };
        let page = self
            .inventory_page(&filter, request.cursor.as_deref(), PAGE)
            .await
            .map_err(|error| match error {
                Error::InvalidRequest(message) => RpcError::new(code::INVALID_PARAMS, message),
                other => other.to_rpc_error(),
            })?;
        let sessions = page.sessions.iter().map(|s| s.info()).collect();
        Ok(ListSessionsResponse::new(sessions).next_cursor(page.next_cursor))
    }

    /// Installs `agent`: `POST /v2/agents/{agent}/install` and
    /// `_sandboxagent/agent/install`, one path for both surfaces.
    ///
    /// # Errors
    /// As [`crate::agent::Agents::install`]: 404 `unknown-agent`, 400 for an unusable
    /// version, 409 `not-installable`, 502 `install-failed`.
    pub async fn install_agent(
        &self,
        agent: &str,
        params: ext_methods::AgentInstallParams,
    ) -> Result<ext_methods::AgentInstallResult, Error> {
        let options = InstallOptions {
            reinstall: params.reinstall,
            version: params.version,
        };
        let progress = Arc::new(LogProgress {
            agent: agent.to_owned(),
        });
        self.agents.install(agent, options, progress).await
    }

    /// Session `id` of `agent` (a connection names sessions within its own
    /// agent), or the JSON-RPC error for an unknown one (`-32002`).
    ///
    /// # Errors
    /// [`RpcError`] with code `RESOURCE_NOT_FOUND`.
    pub fn session_or_error(&self, agent: &str, id: &str) -> Result<Arc<Session>, RpcError> {
        self.sessions.get(agent, id).ok_or_else(|| {
            RpcError::new(code::RESOURCE_NOT_FOUND, format!("unknown session {id}"))
                .with_data(serde_json::json!({ "sessionId": id }))
        })
    }

    /// `_sandboxagent/session/terminate`: ends the session for good. Tells
    /// its connections with `session/ended` (`terminated` by `daemon`), sends
    /// the agent `session/cancel`, and after `terminate_grace` answers a
    /// prompt the agent still has not ended with stop reason `cancelled`.
    /// Idempotent.
    ///
    /// # Errors
    /// [`RpcError`] for an unknown session.
    pub async fn terminate_session(
        &self,
        agent: &str,
        id: &str,
    ) -> Result<TerminateResult, RpcError> {
        let session = self.session_or_error(agent, id)?;
        let ended = session
            .end_with_notice(&SessionEnded {
                session_id: id.to_owned(),
                reason: EndReason::Terminated,
                terminated_by: TerminatedBy::Daemon,
                message: Some("terminated on request".to_owned()),
                exit_code: None,
                stderr: None,
            })
            .await;
        if !ended {
            return Ok(TerminateResult {
                session_id: id.to_owned(),
                already_ended: true,
            });
        }
        tracing::info!(session = id, "terminating session");
        if let Some(process) = self
            .agents
            .current(&session.agent)
            .filter(|p| p.generation == session.process_generation)
        {
            // Nobody will answer its open requests now: the runtime does.
            process.router.cancel_session_requests(id);
            let cancel = protocol::notification_line(
                method::SESSION_CANCEL,
                &serde_json::json!({ "sessionId": id }),
            );
            session.record(Direction::ClientToAgent, Bytes::copy_from_slice(&cancel));
            if process.router.send_line(&cancel).await.is_ok() {
                let id = id.to_owned();
                let grace = self.config.terminate_grace;
                tokio::spawn(async move {
                    tokio::time::sleep(grace).await;
                    let abandoned = process.router.abandon_prompts(&id);
                    if abandoned > 0 {
                        tracing::warn!(
                            session = id,
                            abandoned,
                            "agent did not end the turn of a terminated session; answered it as cancelled"
                        );
                    }
                });
            }
        }
        Ok(TerminateResult {
            session_id: id.to_owned(),
            already_ended: false,
        })
    }

    /// `_sandboxagent/session/list_models`.
    ///
    /// # Errors
    /// [`RpcError`] for an unknown session or agent.
    /// A session is named within `caller_agent`, the agent of the asking
    /// connection.
    pub fn list_models(
        &self,
        caller_agent: &str,
        target: ModelsTarget,
    ) -> Result<ListModelsResult, RpcError> {
        match target {
            ModelsTarget::Session(id) => Ok(self.session_or_error(caller_agent, &id)?.models()),
            ModelsTarget::Agent(agent) => {
                if !self.agents.is_known(&agent) {
                    return Err(RpcError::new(
                        code::INVALID_PARAMS,
                        format!(
                            "unknown agent {agent:?}; known agents: {}",
                            self.agents.known_ids()
                        ),
                    ));
                }
                Ok(ListModelsResult {
                    available_models: self.agents.reported_models(&agent).unwrap_or_default(),
                    current_model_id: None,
                })
            }
        }
    }

    /// The store's state for `GET /v2/health`.
    pub fn store_health(&self) -> StoreHealth {
        match &self.persist {
            Some(persist) => persist.health(),
            None => StoreHealth {
                backend: "memory",
                state: "memory",
                error: None,
                waiting: 0,
                dropped_events: 0,
                rejected_writes: 0,
                paused_agents: Vec::new(),
                pauses: 0,
                paused_ms: 0,
            },
        }
    }

    /// Up to `limit` events of `session` at or after `offset`: what memory
    /// no longer holds (or never held: a session restored from the store)
    /// is read from the store, the rest from memory.
    ///
    /// # Errors
    /// 503 `store-unavailable` when the store cannot be read.
    pub async fn session_events(
        &self,
        session: &Session,
        offset: u64,
        limit: usize,
    ) -> Result<ext_methods::SessionEventsPage, Error> {
        let in_memory = session.first_offset_in_memory();
        // The store keeps the last `--event-log-events` too, pruned a little
        // behind the writer: below that floor an event counts as dropped
        // whether or not its row is gone yet, as in memory.
        let floor = session
            .event_count()
            .saturating_sub(self.config.event_log_events as u64);
        let offset = offset.max(floor);
        let Some(store) = self.store.as_ref().filter(|_| offset < in_memory) else {
            return Ok(session.events(offset, limit));
        };
        let stored = store
            .events(
                &session.agent,
                &session.id,
                offset,
                limit,
                self.config.event_log_bytes.max(1),
            )
            .await
            .map_err(|e| Error::StoreUnavailable(e.to_string()))?;
        let mut events: Vec<ext_methods::SessionEvent> = stored
            .into_iter()
            .filter(|event| event.offset < in_memory)
            .map(|event| {
                crate::memory::event_log::wire_event(
                    event.offset,
                    crate::store::time_of(event.at_ns),
                    event.direction,
                    &event.message,
                )
            })
            .collect();
        // Memory's events follow only when the store's part reached them: a
        // store read cut short by `--event-log-bytes` ends the page there
        // (the next page goes on from it), or the events between would be
        // skipped by `nextOffset`.
        let reached_memory = events.last().is_none_or(|e| e.offset + 1 >= in_memory);
        if events.len() < limit && reached_memory {
            let next = events
                .last()
                .map_or(in_memory, |e| (e.offset + 1).max(in_memory));
            let rest = session.events(next, limit - events.len());
            events.extend(rest.events);
        }
        let next_offset = events.last().map_or_else(
            || offset.max(in_memory).min(session.event_count()),
            |e| e.offset + 1,
        );
        Ok(ext_methods::SessionEventsPage {
            events,
            next_offset,
        })
    }

    /// The file system scope of a request naming `session` (its `cwd` is the
    /// base of relative paths). `agent` picks among sessions of several
    /// agents that share the id (the calling connection's agent on
    /// `/v2/rpc`). Under `--agent-user` the scope acts as that user: every
    /// operation of the host file system API takes on the user's file
    /// system credentials ([`Scope::act`]; research/contract.md, "Agents
    /// under an unprivileged user").
    ///
    /// # Errors
    /// 404 `unknown-session`; 409 `ambiguous-session` when sessions of
    /// several agents have the id and different `cwd`s; 500 when the
    /// server's working directory is gone.
    pub fn fs_scope(&self, session: Option<&str>, agent: Option<&str>) -> Result<Scope, Error> {
        let cwd = match session {
            None => None,
            Some(id) => {
                let own = agent.and_then(|agent| self.sessions.get(agent, id));
                let candidates = match own {
                    Some(session) => vec![session],
                    None => self.sessions.by_id(id),
                };
                let Some(first) = candidates.first() else {
                    return Err(Error::UnknownSession(id.to_owned()));
                };
                let cwd = first.cwd();
                if candidates.iter().any(|other| other.cwd() != cwd) {
                    return Err(Error::AmbiguousSession {
                        id: id.to_owned(),
                        agents: candidates.iter().map(|s| s.agent.to_string()).collect(),
                    });
                }
                cwd
            }
        };
        // Under --agent-user, `/proc` is out of reach as it is for the
        // agents' own file requests: the server's threads keep
        // CAP_SYS_PTRACE with the user's file system ids, so the kernel
        // would show root's processes' links and descriptors (and
        // `/proc/self` is the server's own) to what the user cannot see
        // itself (research/contract.md, "Agents under an unprivileged user").
        let excluded = if self.agent_user.is_some() {
            vec![std::path::PathBuf::from("/proc")]
        } else {
            Vec::new()
        };
        Scope::new(
            self.config.fs_root.clone(),
            self.config.fs_root_as_given.clone(),
            cwd,
        )
        .map(|scope| scope.excluding(excluded).acting_as(self.agent_user.clone()))
    }
}

impl Runtime {
    /// The working directory of a process (research/contract.md, "Processes
    /// and terminals"): `cwd` by the host file system's path rules (relative
    /// to `session`'s `cwd`, or to the server's working directory; beneath
    /// `--fs-root`), symlinks resolved; without `cwd`, the session's `cwd`,
    /// else the server's working directory, else (confined, and that is
    /// outside) `--fs-root` itself.
    ///
    /// # Errors
    /// 404 `unknown-session`, `file-not-found`; 403 `outside-root`; 409
    /// `not-a-directory`; 400 `invalid-path`.
    pub async fn process_cwd(
        &self,
        session: Option<&str>,
        cwd: Option<&str>,
    ) -> Result<std::path::PathBuf, Error> {
        if let Some(id) = session {
            self.recall(None, id).await?;
        }
        let scope = self.fs_scope(session, None)?;
        let raw = cwd.unwrap_or(".").to_owned();
        let root = self.config.fs_root.clone();
        let defaulted = cwd.is_none() && session.is_none();
        tokio::task::spawn_blocking(move || {
            // Looked up as the agents' user (when there is one): the
            // program runs as that user, and root's look would tell apart
            // what that user cannot see (research/contract.md, "Agents
            // under an unprivileged user").
            let _acting = scope.act()?;
            let absolute = scope.absolute(&raw)?;
            match scope.open_dir_at(&absolute, std::path::Path::new(&raw)) {
                Ok(dir) => Ok(dir.current()),
                Err(Error::OutsideRoot { .. }) if defaulted && root.is_some() => {
                    Ok(root.unwrap_or_default())
                }
                Err(error) => Err(scope.naming_user(error)),
            }
        })
        .await
        .map_err(|error| Error::FsIo(error.to_string()))?
    }
}
