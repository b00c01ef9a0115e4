//! The ACP methods, named after them: `authenticate`, the session methods
//! (`session/new`, `load`, `resume`, `fork`, `list`, `set_mode`,
//! `set_config_option`, `set_model`), and prompt turns (`prompt`,
//! `prompt_stream`, `cancel`).

use super::SandboxAgentClient;
use crate::error::Error;
use crate::meta::{SessionEntry, WithMeta, with_agent};
use crate::turn::{TurnEvent, TurnStream};
use agent_client_protocol::Agent;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    AuthMethodId, AuthenticateRequest, AuthenticateResponse, CancelNotification,
    ForkSessionRequest, ForkSessionResponse, ListSessionsRequest, LoadSessionRequest,
    LoadSessionResponse, Meta, NewSessionRequest, NewSessionResponse, PromptRequest,
    PromptResponse, ResumeSessionRequest, ResumeSessionResponse, SessionId,
    SetSessionConfigOptionRequest, SetSessionConfigOptionResponse, SetSessionModeRequest,
    SetSessionModeResponse,
};
use serde::{Deserialize, Serialize};
use std::time::Duration;

// Named in doc links only.
#[cfg(doc)]
use crate::{ClientOptions, Events};

/// `session/set_model {sessionId, modelId}`: selects a model on agents that
/// predate session config options. Not in the ACP v1 schema; agents that do
/// not know it answer "method not found" (prefer
/// [`set_session_config_option`](SandboxAgentClient::set_session_config_option)
/// with the model option where the agent offers one).
#[derive(
    Debug, Clone, PartialEq, Serialize, Deserialize, agent_client_protocol::JsonRpcRequest,
)]
#[serde(rename_all = "camelCase")]
#[request(method = "session/set_model", response = SetSessionModelResponse)]
pub struct SetSessionModelRequest {
    /// The session.
    pub session_id: SessionId,
    /// The model to use (an id from [`SandboxAgentClient::list_models`]).
    pub model_id: String,
    /// Implementation data (`_meta`).
    #[serde(rename = "_meta", default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<Meta>,
}

impl SetSessionModelRequest {
    /// Selects `model_id` for `session_id`.
    pub fn new(session_id: impl Into<SessionId>, model_id: impl Into<String>) -> Self {
        SetSessionModelRequest {
            session_id: session_id.into(),
            model_id: model_id.into(),
            meta: None,
        }
    }
}

/// The answer to [`SetSessionModelRequest`]: `{}` (with the agent's `_meta`,
/// if any).
#[derive(
    Debug, Clone, Default, PartialEq, Serialize, Deserialize, agent_client_protocol::JsonRpcResponse,
)]
pub struct SetSessionModelResponse {
    /// Implementation data (`_meta`).
    #[serde(rename = "_meta", default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<Meta>,
}

/// How long a timed-out prompt waits for the agent to end the cancelled
/// turn.
const CANCEL_GRACE: Duration = Duration::from_secs(2);

/// One page of [`SandboxAgentClient::list_sessions`].
#[derive(Debug, Clone, PartialEq)]
pub struct SessionList {
    /// The sessions of this page, newest first.
    pub sessions: Vec<SessionEntry>,
    /// Pass it back in `ListSessionsRequest::cursor` for the next page;
    /// `None` on the last page.
    pub next_cursor: Option<String>,
}

impl SandboxAgentClient {
    /// `authenticate {methodId}`: authenticates the agent with one of the
    /// `authMethods` of its `initialize` result
    /// ([`initialize_result`](Self::initialize_result)). The server forwards
    /// it to the agent process, which every connection to the agent shares;
    /// a server that has the credential in its environment has usually
    /// done it already (research/contract.md, "Agent authentication").
    ///
    /// # Errors
    /// [`Error::NotConnected`], [`Error::Rpc`] (the agent's refusal, e.g. an
    /// unknown method or a credential that is not set).
    pub async fn authenticate(
        &self,
        method_id: impl Into<AuthMethodId>,
    ) -> Result<AuthenticateResponse, Error> {
        self.request(AuthenticateRequest::new(method_id)).await
    }

    /// `session/new`: a new session of the agent. The agent id is added to
    /// `request.meta["sandboxagent.dev"]` (keep your own metadata there; see
    /// [`sandbox_meta`](crate::sandbox_meta)); the answer's metadata is typed
    /// in [`WithMeta::meta`].
    ///
    /// # Errors
    /// [`Error::NotConnected`], [`Error::Http`] (e.g. 400 `agent-mismatch`
    /// when the metadata names another agent), [`Error::Rpc`].
    pub async fn new_session(
        &self,
        mut request: NewSessionRequest,
    ) -> Result<WithMeta<NewSessionResponse>, Error> {
        request.meta = Some(with_agent(request.meta.take(), &self.agent));
        let response = self.request(request).await?;
        Ok(WithMeta::read(response, |response| response.meta.as_ref()))
    }

    /// `session/load`: picks up an existing session on this connection; the
    /// agent replays its history as session updates (on the event stream,
    /// before this returns).
    ///
    /// # Errors
    /// As [`new_session`](Self::new_session); a terminated or unknown
    /// session is [`Error::Rpc`] `-32002`.
    pub async fn load_session(
        &self,
        request: LoadSessionRequest,
    ) -> Result<WithMeta<LoadSessionResponse>, Error> {
        let response = self.request(request).await?;
        Ok(WithMeta::read(response, |response| response.meta.as_ref()))
    }

    /// `session/resume`: picks up an existing session without a history
    /// replay.
    ///
    /// # Errors
    /// As [`load_session`](Self::load_session).
    pub async fn resume_session(
        &self,
        request: ResumeSessionRequest,
    ) -> Result<WithMeta<ResumeSessionResponse>, Error> {
        let response = self.request(request).await?;
        Ok(WithMeta::read(response, |response| response.meta.as_ref()))
    }

    /// `session/fork`: a new session with a copy of another's history.
    ///
    /// # Errors
    /// As [`load_session`](Self::load_session).
    pub async fn fork_session(
        &self,
        request: ForkSessionRequest,
    ) -> Result<WithMeta<ForkSessionResponse>, Error> {
        let response = self.request(request).await?;
        Ok(WithMeta::read(response, |response| response.meta.as_ref()))
    }

    /// `session/list`: the server's session inventory (every agent, every
    /// connection, ended sessions included), newest first, 50 per page.
    ///
    /// # Errors
    /// [`Error::NotConnected`]; [`Error::Rpc`] `-32602` for a cursor the
    /// server did not make.
    pub async fn list_sessions(&self, request: ListSessionsRequest) -> Result<SessionList, Error> {
        let response = self.request(request).await?;
        Ok(SessionList {
            sessions: response
                .sessions
                .into_iter()
                .map(SessionEntry::from_info)
                .collect(),
            next_cursor: response.next_cursor,
        })
    }

    /// `session/prompt`: one prompt turn. The agent's reply streams in as
    /// [`Event::SessionUpdate`](crate::Event::SessionUpdate)s on
    /// [`Events`]; this returns the stop reason when the turn ends, after
    /// all of the turn's updates are on the event stream. To get the
    /// turn's events with the turn, use [`prompt_stream`](Self::prompt_stream).
    /// No timeout unless [`ClientOptions::request_timeout`] is set.
    ///
    /// # Permission requests
    /// A turn may stop until a permission request is answered. Without a
    /// [`permission_handler`](ClientOptions::permission_handler), the
    /// request arrives on [`Events`], so read them *while* this runs
    /// (`tokio::select!` on both, or a task of its own), or use
    /// [`prompt_stream`](Self::prompt_stream). A request nobody reads within
    /// [`unread_permission_timeout`](ClientOptions::unread_permission_timeout)
    /// (30 s by default) is answered "cancelled" and logged as a warning;
    /// the turn then ends (the mock agent, like most, with stop reason
    /// `cancelled`) instead of hanging.
    ///
    /// # Errors
    /// [`Error::NotConnected`], [`Error::Rpc`] (e.g. `-32603` when the agent
    /// process exited mid-turn; a
    /// [`SessionEnded`](crate::Event::SessionEnded) event says why),
    /// [`Error::Http`], [`Error::ConnectionLost`], [`Error::Timeout`] (the
    /// turn is then cancelled with `session/cancel`, and this returns once
    /// the agent ended it, or at most 2 s later).
    pub async fn prompt(&self, request: PromptRequest) -> Result<PromptResponse, Error> {
        let cx = self.cx()?;
        prompt_turn(cx, request, self.shared.options.request_timeout).await
    }

    /// `session/prompt` as a stream of the turn's events: the agent's text
    /// and thought chunks, tool calls and their updates, plans, other
    /// updates of the session, permission requests (carrying their
    /// responder), and last the stop reason
    /// ([`TurnEvent::Stopped`]) or the error ([`TurnEvent::Failed`]); then
    /// the stream ends. Every update of the turn comes before the last item.
    ///
    /// The turn starts at once (the request is sent before this returns),
    /// on a task of its own. Updates also go to the client-wide [`Events`];
    /// permission requests only here (unless a
    /// [`permission_handler`](ClientOptions::permission_handler) answers
    /// them). A turn over [`ClientOptions::request_timeout`] ends with
    /// [`TurnEvent::Failed`] ([`Error::Timeout`]) and is cancelled
    /// (`session/cancel`). Poll the stream while the turn runs: a permission request
    /// left unread for
    /// [`unread_permission_timeout`](ClientOptions::unread_permission_timeout)
    /// is answered "cancelled". Dropping the stream does not end the turn
    /// ([`cancel`](Self::cancel) does).
    ///
    /// ```no_run
    /// use sandbox_agent_sdk::schema::PromptRequest;
    /// use sandbox_agent_sdk::{PermissionDecision, SandboxAgentClient, StreamExt, TurnEvent};
    ///
    /// # async fn run(client: SandboxAgentClient, session_id: sandbox_agent_sdk::schema::SessionId) -> Result<(), sandbox_agent_sdk::Error> {
    /// let mut turn = client.prompt_stream(PromptRequest::new(session_id, vec!["hello".into()]));
    /// while let Some(event) = turn.next().await {
    ///     match event {
    ///         TurnEvent::MessageChunk(_) => print!("{}", event.text().unwrap_or_default()),
    ///         TurnEvent::PermissionRequest(request) => request.decide(PermissionDecision::Allow)?,
    ///         TurnEvent::Stopped(done) => println!("\n[{:?}]", done.stop_reason),
    ///         TurnEvent::Failed(error) => return Err(error),
    ///         _ => {}
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn prompt_stream(&self, request: PromptRequest) -> TurnStream {
        let session_id = request.session_id.clone();
        let cx = match self.cx() {
            Ok(cx) => cx,
            Err(error) => return TurnStream::failed(session_id, error),
        };
        let limit = self.shared.options.request_timeout;
        TurnStream::start(&self.shared.turns, session_id.clone(), move |tx| {
            tokio::spawn(async move {
                let result = prompt_turn(cx, request, limit).await;
                let _ = tx.send(match result {
                    Ok(response) => TurnEvent::Stopped(response),
                    Err(error) => TurnEvent::Failed(error),
                });
            })
        })
    }

    /// `session/cancel`: asks the agent to end the session's running turn;
    /// the pending [`prompt`](Self::prompt) then returns with stop reason
    /// `cancelled`. A notification: returns once it is queued.
    ///
    /// # Errors
    /// [`Error::NotConnected`]; [`Error::Rpc`] when it cannot be queued.
    pub async fn cancel(&self, session_id: impl Into<SessionId>) -> Result<(), Error> {
        let cx = self.cx()?;
        cx.send_notification(CancelNotification::new(session_id))
            .map_err(Error::from_rpc)
    }

    /// `session/set_mode`: switches the session's mode (one of the modes its
    /// `new_session` answer listed).
    ///
    /// # Errors
    /// [`Error::NotConnected`], [`Error::Rpc`].
    pub async fn set_session_mode(
        &self,
        request: SetSessionModeRequest,
    ) -> Result<SetSessionModeResponse, Error> {
        self.request(request).await
    }

    /// `session/set_config_option`: sets one of the session's config options
    /// (for example its model); the answer lists all options.
    ///
    /// # Errors
    /// [`Error::NotConnected`], [`Error::Rpc`].
    pub async fn set_session_config_option(
        &self,
        request: SetSessionConfigOptionRequest,
    ) -> Result<SetSessionConfigOptionResponse, Error> {
        self.request(request).await
    }

    /// `session/set_model` (see [`SetSessionModelRequest`]).
    ///
    /// # Errors
    /// [`Error::NotConnected`], [`Error::Rpc`] (`-32601` from agents without
    /// it).
    pub async fn set_session_model(
        &self,
        request: SetSessionModelRequest,
    ) -> Result<SetSessionModelResponse, Error> {
        self.request(request).await
    }
}

/// One `session/prompt` on `cx`. Past `limit` the turn is cancelled
/// (`session/cancel`: it would go on at the agent and refuse the session's
/// next prompt) and, once the agent ended it or after [`CANCEL_GRACE`],
/// reported as [`Error::Timeout`].
async fn prompt_turn(
    cx: ConnectionTo<Agent>,
    request: PromptRequest,
    limit: Option<Duration>,
) -> Result<PromptResponse, Error> {
    let session_id = request.session_id.clone();
    let answer = cx.send_request(request).block_task();
    tokio::pin!(answer);
    let Some(limit) = limit else {
        return answer.await.map_err(Error::from_rpc);
    };
    if let Ok(result) = tokio::time::timeout(limit, &mut answer).await {
        return result.map_err(Error::from_rpc);
    }
    if let Err(error) = cx.send_notification(CancelNotification::new(session_id)) {
        tracing::debug!(%error, "cancelling a timed-out turn failed");
    } else {
        let _ = tokio::time::timeout(CANCEL_GRACE, answer).await;
    }
    Err(Error::Timeout {
        what: "session/prompt".to_owned(),
        after: Some(limit),
        source: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_client_protocol::JsonRpcMessage;

    #[test]
    fn set_model_has_the_wire_shape() -> Result<(), serde_json::Error> {
        let request = SetSessionModelRequest::new("s", "mock-smart");
        assert_eq!(
            serde_json::to_value(&request)?,
            serde_json::json!({"sessionId": "s", "modelId": "mock-smart"})
        );
        assert_eq!(request.method(), "session/set_model");
        Ok(())
    }
}
