//! [`SandboxAgentClient`]: the server (remote or embedded), at most one
//! live connection to the agent, the event stream, and every call.

use crate::connection::{Live, Setup};
use crate::control::{ControlPlane, Health, InstallOptions, InstallResult};
use crate::embedded::EmbeddedServer;
use crate::error::Error;
use crate::events::{Event, EventSink, Events};
use crate::meta::{SessionEntry, WithMeta, with_agent};
use crate::options::ClientOptions;
use acp_http_client::TransportOptions;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    AuthMethodId, AuthenticateRequest, AuthenticateResponse, CancelNotification,
    ForkSessionRequest, ForkSessionResponse, InitializeResponse, ListSessionsRequest,
    LoadSessionRequest, LoadSessionResponse, Meta, NewSessionRequest, NewSessionResponse,
    PromptRequest, PromptResponse, ResumeSessionRequest, ResumeSessionResponse, SessionId,
    SessionInfo, SetSessionConfigOptionRequest, SetSessionConfigOptionResponse,
    SetSessionModeRequest, SetSessionModeResponse,
};
use agent_client_protocol::{Agent, JsonRpcRequest, JsonRpcResponse, UntypedMessage};
use ext_methods::{
    AgentInfo, ListModelsParams, ListModelsResult, ModelsTarget, SessionEventsPage, SessionRef,
    SetMetadataParams, TerminateResult, method,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::mpsc;

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

/// One page of [`SandboxAgentClient::list_sessions`].
#[derive(Debug, Clone, PartialEq)]
pub struct SessionList {
    /// The sessions of this page, newest first.
    pub sessions: Vec<SessionEntry>,
    /// Pass it back in `ListSessionsRequest::cursor` for the next page;
    /// `None` on the last page.
    pub next_cursor: Option<String>,
}

/// A client of one sandbox-agent server, bound to one agent.
///
/// Created by [`connect`](Self::connect), which reaches a running server
/// (server mode) or starts one (embedded mode), and by default opens the
/// connection to the agent. One connection at a time:
/// [`open`](Self::open) fails with [`Error::AlreadyConnected`] while one is
/// live, calls that need it fail with [`Error::NotConnected`] before
/// `open` and after [`disconnect`](Self::disconnect); `open` after
/// `disconnect` starts a new one. Sessions outlive connections: pick one up
/// again with [`load_session`](Self::load_session) or
/// [`resume_session`](Self::resume_session).
///
/// Everything the agent sends besides answers arrives on one
/// [`Events`] stream ([`take_events`](Self::take_events)).
///
/// Dropping the client closes the connection and stops an embedded server
/// (SIGTERM, SIGKILL after the grace period; this blocks the dropping thread
/// up to the grace period). [`dispose`](Self::dispose) does the same
/// without blocking. Needs a Tokio runtime.
pub struct SandboxAgentClient {
    agent: String,
    /// Base URL of the server (the embedded one's `http://127.0.0.1:PORT`).
    base_url: String,
    /// Its bearer token, if any.
    token: Option<String>,
    /// `clientInfo` and the request timeout of each connection.
    options: ClientOptions,
    /// Control-plane HTTP access.
    control: ControlPlane,
    /// Serialises open / disconnect / dispose.
    lifecycle: tokio::sync::Mutex<()>,
    /// The live connection. Declared before `server`: dropped first.
    live: parking_lot::Mutex<Option<Live>>,
    /// Feeds [`Events`]; cloned into every connection.
    events_tx: mpsc::UnboundedSender<Event>,
    /// Until taken.
    events: parking_lot::Mutex<Option<Events>>,
    /// The embedded server, in embedded mode, until disposed.
    server: parking_lot::Mutex<Option<EmbeddedServer>>,
    /// The embedded server's pid (kept after dispose).
    server_pid: Option<u32>,
    /// Set by [`dispose`](Self::dispose).
    disposed: AtomicBool,
}

impl SandboxAgentClient {
    /// Reaches the server the options name (server mode), or starts one
    /// (embedded mode; see [`ClientOptions::binary`]), then, unless
    /// `auto_connect(false)`, opens the connection to the agent
    /// (`initialize`).
    ///
    /// # Errors
    /// - [`Error::InvalidOptions`]: mode and base URL disagree, a bad URL or
    ///   token.
    /// - Embedded mode: [`Error::BinaryNotFound`], [`Error::ServerStart`],
    ///   [`Error::StartupTimeout`].
    /// - Opening the connection: as [`open`](Self::open).
    pub async fn connect(options: ClientOptions) -> Result<SandboxAgentClient, Error> {
        let http = reqwest::Client::builder()
            .build()
            .map_err(|e| Error::InvalidOptions(format!("cannot build the HTTP client: {e}")))?;
        let (base_url, token, server) = match options.resolve_mode()? {
            Some(url) => (url.to_owned(), options.token.clone(), None),
            None => {
                let server = EmbeddedServer::start(&options.embedded, &http).await?;
                (
                    server.base_url().to_owned(),
                    Some(server.token().to_owned()),
                    Some(server),
                )
            }
        };
        let control = ControlPlane::new(http, &base_url, token.as_deref())?;
        let (events_tx, rx) = mpsc::unbounded_channel();
        let client = SandboxAgentClient {
            agent: options.agent.clone(),
            base_url,
            token,
            control,
            lifecycle: tokio::sync::Mutex::new(()),
            live: parking_lot::Mutex::new(None),
            events_tx,
            events: parking_lot::Mutex::new(Some(Events { rx })),
            server_pid: server.as_ref().map(EmbeddedServer::pid),
            server: parking_lot::Mutex::new(server),
            disposed: AtomicBool::new(false),
            options,
        };
        if client.options.auto_connect
            && let Err(error) = client.open().await
        {
            // Stop an embedded server without blocking (drop would).
            client.dispose().await;
            return Err(error);
        }
        Ok(client)
    }

    /// Opens the connection to the agent: `initialize` with the agent id in
    /// `_meta["sandboxagent.dev"].agent`. Called by
    /// [`connect`](Self::connect) unless `auto_connect(false)`; call it
    /// again after [`disconnect`](Self::disconnect) for a new connection.
    ///
    /// # Errors
    /// - [`Error::AlreadyConnected`]: a connection is live.
    /// - [`Error::Disposed`].
    /// - [`Error::Http`]: the server refused (e.g. 404 `unknown-agent`, 401
    ///   wrong token, 502 the agent could not be started), with its problem
    ///   document.
    /// - [`Error::Transport`]: the server could not be reached.
    /// - [`Error::Rpc`]: the agent answered `initialize` with an error.
    pub async fn open(&self) -> Result<(), Error> {
        let _lifecycle = self.lifecycle.lock().await;
        self.check_disposed()?;
        {
            let mut live = self.live.lock();
            match live.as_ref() {
                Some(current) if current.is_alive() => return Err(Error::AlreadyConnected),
                // A connection that ended on its own is replaced.
                Some(_) => *live = None,
                None => {}
            }
        }
        let mut transport = TransportOptions::new(&self.base_url)
            .map_err(Error::from_transport)?
            .request_timeout(self.options.request_timeout);
        if let Some(token) = &self.token {
            transport = transport.token(token);
        }
        let setup = Setup {
            agent: self.agent.clone(),
            client_name: self.options.client_name.clone(),
            client_version: self.options.client_version.clone(),
            sink: EventSink {
                tx: self.events_tx.clone(),
                permission_handler: self.options.permission_handler.clone(),
            },
        };
        let live = Live::open(transport, setup).await?;
        *self.live.lock() = Some(live);
        Ok(())
    }

    /// Closes the connection (HTTP DELETE). Sessions live on on the server;
    /// an embedded server keeps running. Idempotent: `Ok(())` when not
    /// connected.
    ///
    /// # Errors
    /// None today: a DELETE that fails is logged (the server closes idle
    /// connections itself); the `Result` leaves room for reporting it.
    pub async fn disconnect(&self) -> Result<(), Error> {
        let _lifecycle = self.lifecycle.lock().await;
        let live = self.live.lock().take();
        if let Some(mut live) = live {
            live.close().await;
        }
        Ok(())
    }

    /// Whether a connection is live.
    pub fn is_connected(&self) -> bool {
        self.live.lock().as_ref().is_some_and(Live::is_alive)
    }

    /// Closes the connection and stops an embedded server (SIGTERM, then
    /// SIGKILL after the grace period), waiting without blocking. Later
    /// calls fail with [`Error::Disposed`]. Idempotent.
    pub async fn dispose(&self) {
        let _lifecycle = self.lifecycle.lock().await;
        self.disposed.store(true, Ordering::Release);
        let live = self.live.lock().take();
        if let Some(mut live) = live {
            live.close().await;
        }
        let server = self.server.lock().take();
        if let Some(mut server) = server {
            server.stop().await;
        }
    }

    /// The event stream, once: the first call takes it, later calls get
    /// `None`. See [`Events`].
    pub fn take_events(&self) -> Option<Events> {
        self.events.lock().take()
    }

    /// The agent id this client is bound to.
    pub fn agent(&self) -> &str {
        &self.agent
    }

    /// The server's base URL (in embedded mode `http://127.0.0.1:PORT`).
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// The embedded server's process id; `None` in server mode.
    pub fn server_pid(&self) -> Option<u32> {
        self.server_pid
    }

    /// The embedded server's last log lines (with
    /// [`ServerLogs::Capture`](crate::ServerLogs::Capture)); `None` in
    /// server mode or after dispose.
    pub fn server_logs(&self) -> Option<String> {
        self.server.lock().as_ref().map(EmbeddedServer::stderr_text)
    }

    /// The server's id of the live connection (`x-acp-connection-id`).
    pub fn connection_id(&self) -> Option<String> {
        self.live.lock().as_ref().and_then(Live::connection_id)
    }

    /// The agent's answer to this connection's `initialize`: protocol
    /// version, `agent_info`, capabilities (with the server's extension
    /// block in `agent_capabilities.meta["sandboxagent.dev"]`). `None` when
    /// not connected.
    pub fn initialize_result(&self) -> Option<InitializeResponse> {
        self.live
            .lock()
            .as_ref()
            .filter(|live| live.is_alive())
            .map(|live| live.initialize.clone())
    }

    /// The `_sandboxagent/*` methods the server answers, as it advertised
    /// them in this connection's `initialize` result
    /// (`agentCapabilities._meta["sandboxagent.dev"].extensions.methods`);
    /// empty when not connected.
    pub fn extension_methods(&self) -> Vec<String> {
        let Some(capabilities) = self
            .initialize_result()
            .and_then(|result| serde_json::to_value(result.agent_capabilities).ok())
        else {
            return Vec::new();
        };
        ext_methods::advertised_methods(&capabilities)
    }

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

    // -----------------------------------------------------------------
    // Sessions and prompt turns (ACP methods, named after them)
    // -----------------------------------------------------------------

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
    /// [`Event::SessionUpdate`](crate::Event::SessionUpdate)s; this returns
    /// the stop reason when the turn ends, after all of the turn's updates
    /// are on the event stream. No timeout unless
    /// [`ClientOptions::request_timeout`] is set.
    ///
    /// # Errors
    /// [`Error::NotConnected`], [`Error::Rpc`] (e.g. `-32603` when the agent
    /// process exited mid-turn; a
    /// [`SessionEnded`](crate::Event::SessionEnded) event says why),
    /// [`Error::Http`], [`Error::Transport`].
    pub async fn prompt(&self, request: PromptRequest) -> Result<PromptResponse, Error> {
        self.request(request).await
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

    // -----------------------------------------------------------------
    // sandbox-agent extensions (`_sandboxagent/*`, answered by the server)
    // -----------------------------------------------------------------

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
    /// # Errors
    /// [`Error::NotConnected`]; [`Error::Rpc`] `-32002` (unknown session).
    pub async fn set_metadata(
        &self,
        session_id: impl Into<SessionId>,
        metadata: Map<String, Value>,
    ) -> Result<SessionEntry, Error> {
        let params = SetMetadataParams::new(session_id.into().0.to_string(), metadata);
        let info: SessionInfo = self
            .ext_request(method::SESSION_SET_METADATA, &params)
            .await?;
        Ok(SessionEntry::from_info(info))
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

    /// One session of the server's inventory
    /// (`_sandboxagent/session/get`); [`session`](Self::session) is the same
    /// without a connection.
    ///
    /// # Errors
    /// [`Error::NotConnected`]; [`Error::Rpc`] `-32002` (unknown session).
    pub async fn get_session(
        &self,
        session_id: impl Into<SessionId>,
    ) -> Result<SessionEntry, Error> {
        let info: SessionInfo = self
            .ext_request(method::SESSION_GET, &session_ref(session_id))
            .await?;
        Ok(SessionEntry::from_info(info))
    }

    // -----------------------------------------------------------------
    // Control plane (plain HTTP; no connection needed)
    // -----------------------------------------------------------------

    /// `GET /v2/health`.
    ///
    /// # Errors
    /// [`Error::Request`] when the server cannot be reached,
    /// [`Error::Http`], [`Error::Disposed`].
    pub async fn health(&self) -> Result<Health, Error> {
        self.check_disposed()?;
        self.control.health().await
    }

    /// `GET /v2/agents`: every agent the server knows, installed or not,
    /// with its source, version, process state, and models / modes once
    /// reported.
    ///
    /// # Errors
    /// As [`health`](Self::health) (401 with a wrong token).
    pub async fn agents(&self) -> Result<Vec<AgentInfo>, Error> {
        self.check_disposed()?;
        self.control.agents().await
    }

    /// `POST /v2/agents/{agent}/install`: installs an agent (idempotent:
    /// `already_installed` says whether anything was done).
    ///
    /// # Errors
    /// As [`health`](Self::health); [`Error::Http`] 404 (unknown agent or a
    /// server without this route), 409 `not-installable`, 502
    /// `install-failed`.
    pub async fn install_agent(
        &self,
        agent: &str,
        options: InstallOptions,
    ) -> Result<InstallResult, Error> {
        self.check_disposed()?;
        self.control.install(agent, &options).await
    }

    /// `GET /v2/sessions`: the whole inventory, newest first.
    ///
    /// # Errors
    /// As [`health`](Self::health).
    pub async fn sessions(&self) -> Result<Vec<SessionEntry>, Error> {
        self.check_disposed()?;
        self.control.sessions().await
    }

    /// `GET /v2/sessions/{id}?agent=`: session `session_id` of this client's
    /// agent (session ids are per agent).
    ///
    /// # Errors
    /// As [`health`](Self::health); [`Error::Http`] 404 `unknown-session`.
    pub async fn session(&self, session_id: &str) -> Result<SessionEntry, Error> {
        self.check_disposed()?;
        self.control.session(&self.agent, session_id).await
    }

    /// `GET /v2/sessions/{id}/events?offset=&limit=`: the session's recorded
    /// ACP traffic from `offset` on, oldest first; `limit` 1..=1000 (server
    /// default 100). Continue with the page's `next_offset`.
    ///
    /// # Errors
    /// As [`session`](Self::session); 400 for a bad `limit`.
    pub async fn session_events(
        &self,
        session_id: &str,
        offset: u64,
        limit: Option<u32>,
    ) -> Result<SessionEventsPage, Error> {
        self.check_disposed()?;
        self.control
            .session_events(&self.agent, session_id, offset, limit)
            .await
    }

    // -----------------------------------------------------------------

    fn check_disposed(&self) -> Result<(), Error> {
        if self.disposed.load(Ordering::Acquire) {
            Err(Error::Disposed)
        } else {
            Ok(())
        }
    }

    /// The live connection's sender.
    fn cx(&self) -> Result<ConnectionTo<Agent>, Error> {
        self.check_disposed()?;
        match self.live.lock().as_ref() {
            Some(live) if live.is_alive() => Ok(live.cx.clone()),
            _ => Err(Error::NotConnected),
        }
    }

    /// Sends `request` and waits for its answer.
    async fn request<Req: JsonRpcRequest>(&self, request: Req) -> Result<Req::Response, Error>
    where
        Req::Response: JsonRpcResponse + Send,
    {
        let cx = self.cx()?;
        cx.send_request(request)
            .block_task()
            .await
            .map_err(Error::from_rpc)
    }

    /// Sends an extension request and reads its result as `R`.
    async fn ext_request<P: Serialize, R: DeserializeOwned>(
        &self,
        method: &str,
        params: &P,
    ) -> Result<R, Error> {
        let message = UntypedMessage::new(method, params).map_err(Error::from_rpc)?;
        let value = self.request(message).await?;
        serde_json::from_value(value).map_err(|error| Error::InvalidResponse {
            what: method.to_owned(),
            message: error.to_string(),
        })
    }
}

fn session_ref(session_id: impl Into<SessionId>) -> SessionRef {
    SessionRef {
        session_id: session_id.into().0.to_string(),
    }
}

impl std::fmt::Debug for SandboxAgentClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxAgentClient")
            .field("agent", &self.agent)
            .field("base_url", &self.base_url)
            .field("server_pid", &self.server_pid)
            .field("connected", &self.is_connected())
            .field("disposed", &self.disposed.load(Ordering::Relaxed))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use agent_client_protocol::JsonRpcMessage;

    fn assert_send_sync<T: Send + Sync>() {}
    fn assert_send<T: Send>() {}

    #[test]
    fn the_client_and_its_parts_can_be_shared_across_tasks() {
        assert_send_sync::<SandboxAgentClient>();
        assert_send_sync::<Events>();
        assert_send_sync::<Error>();
        // Events cross tasks; a permission request is answered by one owner.
        assert_send::<Event>();
    }

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
