//! The sandbox-agent extensions (`_sandboxagent/*`, answered by the server)
//! under sandbox names: models, metadata, attach, detach, terminate, one
//! session.

use super::SandboxAgentClient;
use crate::error::Error;
use crate::meta::SessionEntry;
use agent_client_protocol::v1::schema::{SessionId, SessionInfo};
use ext_methods::{
    AttachParams, AttachResult, HistoryPolicy, ListModelsParams, ListModelsResult, ModelsTarget,
    Role, SessionRef, SetMetadataParams, TerminateResult, method,
};
use serde::Serialize;
use serde_json::Value;

impl SandboxAgentClient {
    /// The models of a session's agent (with the session's current model)
    /// or of an agent (`_sandboxagent/session/list_models`). Empty until the
    /// agent reported any.
    ///
    /// # Errors
    /// [`Error::NotConnected`]; [`Error::Rpc`] `-32002` (unknown session) or
    /// `-32602` (unknown agent).
    pub async fn list_models(&self, target: ModelsTarget) -> Result<ListModelsResult, Error> {
        let params = match target {
            ModelsTarget::Session(session_id) => ListModelsParams {
                session_id: Some(session_id),
                agent: None,
            },
            ModelsTarget::Agent(agent) => ListModelsParams {
                session_id: None,
                agent: Some(agent),
            },
        };
        self.ext_request(method::SESSION_LIST_MODELS, &params).await
    }

    /// Merges `metadata` into the session's stored metadata (JSON Merge
    /// Patch, RFC 7396: `null` removes a key;
    /// `_sandboxagent/session/set_metadata`). `title`, `model` and `mode`
    /// also set the session's title and hints. Answers the updated entry.
    ///
    /// `metadata` is anything that serializes to a JSON object:
    /// `serde_json::json!({"title": "Fix the login bug"})`, a
    /// [`Metadata`](crate::Metadata) builder, a `serde_json::Map`, or a
    /// struct of your own.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] when `metadata` is not a JSON object;
    /// [`Error::NotConnected`]; [`Error::Rpc`] `-32002` (unknown session,
    /// [`Error::is_not_found`]).
    pub async fn set_metadata(
        &self,
        session_id: impl Into<SessionId>,
        metadata: impl Serialize,
    ) -> Result<SessionEntry, Error> {
        let metadata = match serde_json::to_value(metadata) {
            Ok(Value::Object(metadata)) => metadata,
            Ok(other) => {
                return Err(Error::InvalidOptions(format!(
                    "metadata must be a JSON object, not {other}"
                )));
            }
            Err(error) => {
                return Err(Error::InvalidOptions(format!(
                    "metadata does not serialize to JSON: {error}"
                )));
            }
        };
        let params = SetMetadataParams::new(session_id.into().0.to_string(), metadata);
        let info: SessionInfo = self
            .ext_request(method::SESSION_SET_METADATA, &params)
            .await?;
        Ok(SessionEntry::from_info(info))
    }

    /// Joins a session live on the server as `role`
    /// (`_sandboxagent/session/attach`): the history `history` asks for,
    /// from the server's event log, comes to this client alone as session
    /// updates (prompts as `user_message_chunk`s) before the answer, then
    /// the live ones, with no gap and no duplicate; the agent is not asked.
    /// An observer gets no permission requests, and its prompts fail with
    /// `-32003` (research/contract.md, "Several clients on one session").
    ///
    /// # Errors
    /// [`Error::NotConnected`]; [`Error::Rpc`] `-32002` (the session is not
    /// live on the server: [`load_session`](Self::load_session) revives a
    /// dormant one).
    pub async fn attach_session(
        &self,
        session_id: impl Into<SessionId>,
        role: Role,
        history: HistoryPolicy,
    ) -> Result<AttachResult, Error> {
        let params = AttachParams {
            session_id: session_id.into().0.to_string(),
            role,
            history_policy: history,
        };
        self.ext_request(method::SESSION_ATTACH, &params).await
    }

    /// This connection stops receiving the session's updates and requests
    /// (`_sandboxagent/session/detach`); the session and its running turn go
    /// on, and any connection can pick it up.
    ///
    /// # Errors
    /// [`Error::NotConnected`]; [`Error::Rpc`] `-32002` (unknown session).
    pub async fn detach_session(&self, session_id: impl Into<SessionId>) -> Result<(), Error> {
        let _: Value = self
            .ext_request(method::SESSION_DETACH, &session_ref(session_id))
            .await?;
        Ok(())
    }

    /// Ends the session for good (`_sandboxagent/session/terminate`): a
    /// running turn is cancelled, attached connections get
    /// [`Event::SessionEnded`](crate::Event::SessionEnded). Idempotent
    /// (`already_ended` on later calls).
    ///
    /// # Errors
    /// [`Error::NotConnected`]; [`Error::Rpc`] `-32002` (unknown session).
    pub async fn terminate_session(
        &self,
        session_id: impl Into<SessionId>,
    ) -> Result<TerminateResult, Error> {
        self.ext_request(method::SESSION_TERMINATE, &session_ref(session_id))
            .await
    }

    /// One session of this client's agent, from the server's inventory:
    /// over the connection (`_sandboxagent/session/get`) when one is live,
    /// else over the control plane (`GET /v2/sessions/{id}?agent=`), so it
    /// works without a connection too.
    ///
    /// # Errors
    /// An unknown session is [`Error::is_not_found`] (JSON-RPC `-32002` over
    /// the connection, HTTP 404 `unknown-session` over the control plane);
    /// [`Error::Disposed`]; as [`health`](Self::health).
    pub async fn get_session(
        &self,
        session_id: impl Into<SessionId>,
    ) -> Result<SessionEntry, Error> {
        let session_id = session_id.into();
        if !self.is_connected() {
            self.check_disposed()?;
            return self
                .control_call(
                    "GET /v2/sessions/{id}",
                    self.control.session(Some(&self.agent), &session_id.0),
                )
                .await;
        }
        let info: SessionInfo = self
            .ext_request(method::SESSION_GET, &session_ref(session_id))
            .await?;
        Ok(SessionEntry::from_info(info))
    }
}

fn session_ref(session_id: impl Into<SessionId>) -> SessionRef {
    SessionRef {
        session_id: session_id.into().0.to_string(),
    }
}
