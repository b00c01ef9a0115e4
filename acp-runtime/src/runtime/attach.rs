//! Several clients on one session (research/contract.md,
//! "`_sandboxagent/session/attach`"): a connection joins a live session as
//! controller or observer, and its history is replayed from the event log
//! to that connection alone; the agent is not asked. The same answers a
//! `session/load` of a session live on this runtime, so ACP clients that
//! only know `session/load` get the history once, and the other attached
//! clients do not get it again.
//!
//! What observers may not send is checked here too ([`Runtime::refuse_observer`]).

use super::Runtime;
use crate::memory::connection::Connection;
use crate::memory::session::{AttachOutcome, FromStore, Session};
use crate::protocol::{Method, RpcError, code};
use agent_client_protocol::v1::schema::LoadSessionResponse;
use ext_methods::{AttachResult, HistoryPolicy, Role};
use serde_json::Value;
use std::sync::Arc;

/// How often memory may evict the events a replay is reading from the store
/// before the replay takes what it has (the rest is a gap marker).
const STORE_READS: usize = 4;

/// Events read from the store per query of a replay.
const STORE_PAGE: usize = 1000;

impl Runtime {
    /// The session `id` of `connection`'s agent if it is live on the
    /// agent's current process: what attach and a runtime-answered
    /// `session/load` need.
    pub(crate) fn live_session(&self, connection: &Connection, id: &str) -> Option<Arc<Session>> {
        let process = self.agents.current(&connection.agent)?;
        self.sessions
            .live(id, process.generation)
            .filter(|session| !session.is_ended() && session.agent == connection.agent)
    }

    /// Attaches `connection` to the live session `id` with `role`, after
    /// putting the history `policy` asks for on its stream (research/contract.md,
    /// "The replay").
    ///
    /// # Errors
    /// `-32002` when the session is not live on this runtime (unknown,
    /// ended, or dormant: `session/load` revives a dormant one); `-32603`
    /// when the store cannot be read.
    pub(crate) async fn attach_session(
        &self,
        connection: &Arc<Connection>,
        id: &str,
        role: Role,
        policy: HistoryPolicy,
    ) -> Result<AttachResult, RpcError> {
        let not_live = || {
            RpcError::new(
                code::RESOURCE_NOT_FOUND,
                format!("session {id} is not live on this runtime (ended, dormant or unknown); session/load revives a dormant one"),
            )
            .with_data(serde_json::json!({ "sessionId": id, "live": false }))
        };
        let session = self.live_session(connection, id).ok_or_else(not_live)?;
        let start = policy.start();
        let mut stored = FromStore::default();
        for attempt in 0..=STORE_READS {
            let first = session.first_offset_in_memory();
            // The store keeps the last `--event-log-events` events, as
            // memory does: older offsets are a gap (the replay's marker)
            // whether or not their rows are gone yet.
            let floor = session
                .event_count()
                .saturating_sub(self.config.event_log_events as u64);
            if let Some(start) = start
                && stored.until < first
            {
                let from = start.max(floor);
                if attempt == STORE_READS {
                    // Take what was read; the rest shows as a gap.
                    stored.until = u64::MAX;
                } else if from < first && session.is_stored() {
                    stored = self.read_stored(&session, from, first).await?;
                } else {
                    stored.until = first;
                }
            }
            match session.attach_with_history(connection, role, start, &stored) {
                AttachOutcome::Attached {
                    next_offset,
                    replayed,
                } => {
                    if let Some(process) = self.agents.current(&connection.agent) {
                        process.router.attached(&session, connection);
                    }
                    let (modes, config_options, models) = session.load_hints();
                    return Ok(AttachResult {
                        session_id: id.to_owned(),
                        role,
                        modes,
                        config_options,
                        models,
                        next_offset,
                        replayed,
                    });
                }
                AttachOutcome::Ended => return Err(not_live()),
                AttachOutcome::ReadAgain => {}
            }
        }
        Err(RpcError::new(
            code::INTERNAL_ERROR,
            "the session's history kept moving out of memory while it was read",
        ))
    }

    /// The answer to a `session/load` of a session live on this runtime,
    /// made by the runtime (research/contract.md, "The replay"): the
    /// connection attaches as a controller, the whole history goes to it
    /// alone, and the answer carries the session's modes, config options
    /// (and models) with its `_meta["sandboxagent.dev"]` entry, as the
    /// agent's answer would.
    ///
    /// # Errors
    /// As [`Runtime::attach_session`].
    pub(crate) async fn load_live_session(
        &self,
        connection: &Arc<Connection>,
        session: &Session,
    ) -> Result<Value, RpcError> {
        let attached = self
            .attach_session(
                connection,
                &session.id,
                Role::Controller,
                HistoryPolicy::Full,
            )
            .await?;
        let mut meta = serde_json::Map::new();
        if let Ok(entry) = serde_json::to_value(session.meta()) {
            meta.insert(ext_methods::NAMESPACE.to_owned(), entry);
        }
        let answer = LoadSessionResponse::new()
            .modes(attached.modes)
            .config_options(attached.config_options)
            .meta(meta);
        let mut answer = serde_json::to_value(answer).unwrap_or_else(|_| serde_json::json!({}));
        if let (Some(models), Some(object)) = (attached.models, answer.as_object_mut())
            && let Ok(models) = serde_json::to_value(models)
        {
            object.insert("models".to_owned(), models);
        }
        Ok(answer)
    }

    /// The error for `method` on session `id` when `connection` is attached
    /// to it as an observer and the method is one observers may not send:
    /// `-32003` with `data` `{sessionId, role: "observer", method}`.
    pub(crate) fn refuse_observer(
        &self,
        connection: &Connection,
        id: &str,
        method: Method,
        name: &str,
    ) -> Option<RpcError> {
        if !method.controller_only() {
            return None;
        }
        let session = self.sessions.get(&connection.agent, id)?;
        (session.role_of(connection) == Some(Role::Observer)).then(|| {
            RpcError::new(
                code::OBSERVER_FORBIDDEN,
                format!("{name} is not allowed: this connection is attached to session {id} as an observer"),
            )
            .with_data(serde_json::json!({
                "sessionId": id,
                "role": Role::Observer.as_str(),
                "method": name,
            }))
        })
    }

    /// The events of `session` from `start` up to (not including) `until`
    /// that only the store holds, in order, at most `--replay-buffer-bytes`
    /// of messages.
    async fn read_stored(
        &self,
        session: &Session,
        start: u64,
        until: u64,
    ) -> Result<FromStore, RpcError> {
        let mut stored = FromStore {
            events: Vec::new(),
            until,
        };
        let Some(store) = &self.store else {
            return Ok(stored);
        };
        let mut offset = start;
        let mut bytes = 0_usize;
        // No more than the connection's ring can hold: a longer history
        // would only push its own oldest part out there (the rest is a gap).
        let budget = self.config.replay_buffer_bytes.max(1);
        while offset < until && bytes < budget {
            let rows = store
                .events(
                    &session.agent,
                    &session.id,
                    offset,
                    STORE_PAGE,
                    budget - bytes,
                )
                .await
                .map_err(|error| {
                    RpcError::new(
                        code::INTERNAL_ERROR,
                        format!("the session's history cannot be read from the store: {error}"),
                    )
                })?;
            let Some(last) = rows.last().map(|row| row.offset) else {
                break;
            };
            for row in rows.into_iter().filter(|row| row.offset < until) {
                bytes += row.message.len();
                stored.events.push((row.offset, row.direction, row.message));
            }
            offset = last + 1;
        }
        Ok(stored)
    }
}
