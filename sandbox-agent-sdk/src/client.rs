//! [`SandboxAgentClient`]: the server (remote or embedded), at most one
//! live connection to the agent, the event stream, and every call.

use crate::connection::{Live, Setup};
use crate::control::{ControlPlane, Health, InstallOptions, InstallResult};
use crate::embedded::EmbeddedServer;
use crate::error::Error;
use crate::events::{Event, EventSink, Events};
use crate::meta::{SessionEntry, WithMeta, with_agent};
use crate::options::ClientOptions;
use crate::turn::{TurnEvent, TurnStream, Turns};
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
    AgentInfo, ListModelsParams, ListModelsResult, ModelsTarget, SessionEvent, SessionEventsPage,
    SessionRef, SetMetadataParams, TerminateResult, method,
};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;

/// The file system methods (their own `impl` block; a child module so they
/// reach the control plane).
#[path = "fs.rs"]
pub(crate) mod fs;

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

/// Events per [`session_events`](SandboxAgentClient::session_events) page
/// when no limit is given (the server's default).
const DEFAULT_EVENTS_LIMIT: u32 = 100;

/// The largest `limit` the events route accepts
/// (research/contract.md, "Extension methods and control plane").
const MAX_EVENTS_LIMIT: u32 = 1000;

/// How much longer than [`ClientOptions::request_timeout`] the transport
/// waits, so that the client's own limit fires first and is reported as
/// [`Error::Timeout`].
const TRANSPORT_TIMEOUT_MARGIN: Duration = Duration::from_secs(1);

/// How long a timed-out prompt waits for the agent to end the cancelled
/// turn.
const CANCEL_GRACE: Duration = Duration::from_secs(2);

/// One page of [`SandboxAgentClient::session_events`].
#[derive(Debug, Clone, PartialEq)]
pub struct EventPage {
    /// Recorded messages at or after the requested offset, oldest first.
    pub events: Vec<SessionEvent>,
    /// Pass it back as `offset` for the next page; `None` when this page
    /// reaches the end of what is recorded now.
    pub next_offset: Option<u64>,
    /// The offset after this page, also at the end: a running session
    /// records more later; ask again from here to get only what is new.
    pub offset_after: u64,
}

impl EventPage {
    /// The page for `limit` events from `offset`, out of a wire page that
    /// asked for one more (when the limit allowed): an extra event means
    /// there is more.
    fn from_wire(page: SessionEventsPage, offset: u64, limit: u32) -> EventPage {
        let SessionEventsPage {
            mut events,
            next_offset,
        } = page;
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        if events.len() > limit {
            events.truncate(limit);
            let next = events.last().map_or(offset, |event| event.offset + 1);
            return EventPage {
                events,
                next_offset: Some(next),
                offset_after: next,
            };
        }
        // A full page at the largest limit may have more behind it.
        let full = events.len() == limit && limit == MAX_EVENTS_LIMIT as usize;
        EventPage {
            next_offset: full.then_some(next_offset),
            offset_after: next_offset,
            events,
        }
    }
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
/// `open` and after [`close`](Self::close); `open` after `close` starts a
/// new one. Sessions outlive connections: pick one up again with
/// [`load_session`](Self::load_session) or
/// [`resume_session`](Self::resume_session).
///
/// A prompt turn's events come with the turn from
/// [`prompt_stream`](Self::prompt_stream); everything the agent sends
/// besides answers, for every session, also arrives on one [`Events`]
/// stream ([`take_events`](Self::take_events)).
///
/// Cloning is cheap and shares everything (connection, event stream,
/// embedded server), like `reqwest::Client`: hand clones to tasks.
/// Dropping the last clone closes the connection and stops an embedded
/// server (SIGTERM, SIGKILL after the grace period; this blocks the
/// dropping thread up to the grace period). [`shutdown`](Self::shutdown)
/// does the same at once for every clone, without blocking. Needs a Tokio
/// runtime.
#[derive(Clone)]
pub struct SandboxAgentClient {
    agent: String,
    /// Control-plane HTTP access.
    control: ControlPlane,
    /// Everything else, shared by the clones.
    shared: Arc<Shared>,
}

/// The part of a [`SandboxAgentClient`] its clones share.
struct Shared {
    /// Base URL of the server (the embedded one's `http://127.0.0.1:PORT`).
    base_url: String,
    /// Its bearer token, if any.
    token: Option<String>,
    /// `clientInfo` and the request timeout of each connection.
    options: ClientOptions,
    /// Serialises open / close / shutdown.
    lifecycle: tokio::sync::Mutex<()>,
    /// The live connection. Declared before `server`: dropped first.
    live: parking_lot::Mutex<Option<Live>>,
    /// Feeds [`Events`]; cloned into every connection.
    events_tx: mpsc::UnboundedSender<Event>,
    /// Until taken.
    events: parking_lot::Mutex<Option<Events>>,
    /// Running turn streams, by session.
    turns: Arc<Turns>,
    /// The embedded server, in embedded mode, until shut down.
    server: parking_lot::Mutex<Option<EmbeddedServer>>,
    /// The embedded server's pid (kept after shutdown).
    server_pid: Option<u32>,
    /// Set by [`shutdown`](SandboxAgentClient::shutdown).
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
        let build = |timeout: Option<Duration>| {
            let mut builder = reqwest::Client::builder();
            if let Some(timeout) = timeout {
                builder = builder.timeout(timeout);
            }
            builder
                .build()
                .map_err(|e| Error::InvalidOptions(format!("cannot build the HTTP client: {e}")))
        };
        // The embedded server's readiness checks have their own limit.
        let http = build(None)?;
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
        let control =
            ControlPlane::new(build(options.request_timeout)?, &base_url, token.as_deref())?;
        let (events_tx, rx) = mpsc::unbounded_channel();
        let client = SandboxAgentClient {
            agent: options.agent.clone(),
            control,
            shared: Arc::new(Shared {
                base_url,
                token,
                lifecycle: tokio::sync::Mutex::new(()),
                live: parking_lot::Mutex::new(None),
                events_tx,
                events: parking_lot::Mutex::new(Some(Events { rx })),
                turns: Arc::default(),
                server_pid: server.as_ref().map(EmbeddedServer::pid),
                server: parking_lot::Mutex::new(server),
                disposed: AtomicBool::new(false),
                options,
            }),
        };
        if client.shared.options.auto_connect
            && let Err(error) = client.open().await
        {
            // Stop an embedded server without blocking (drop would).
            client.shutdown().await;
            return Err(error);
        }
        Ok(client)
    }

    /// Opens the connection to the agent: `initialize` with the agent id in
    /// `_meta["sandboxagent.dev"].agent`. Called by
    /// [`connect`](Self::connect) unless `auto_connect(false)`; call it
    /// again after [`close`](Self::close) (or a lost connection) for a new
    /// connection.
    ///
    /// # Errors
    /// - [`Error::AlreadyConnected`]: a connection is live.
    /// - [`Error::Disposed`].
    /// - [`Error::Http`]: the server refused (e.g. 404 `unknown-agent`, 401
    ///   wrong token, 502 the agent could not be started), with its problem
    ///   document.
    /// - [`Error::ConnectionLost`]: the server could not be reached.
    /// - [`Error::Timeout`]: `initialize` took longer than the request
    ///   timeout.
    /// - [`Error::Rpc`]: the agent answered `initialize` with an error.
    pub async fn open(&self) -> Result<(), Error> {
        let shared = &self.shared;
        let _lifecycle = shared.lifecycle.lock().await;
        self.check_disposed()?;
        {
            let mut live = shared.live.lock();
            match live.as_ref() {
                Some(current) if current.is_alive() => return Err(Error::AlreadyConnected),
                // A connection that ended on its own is replaced.
                Some(_) => *live = None,
                None => {}
            }
        }
        // The transport's own limit is a little longer than the one this
        // client applies (`within_timeout`), which thus reports it.
        let mut transport = TransportOptions::new(&shared.base_url)
            .map_err(Error::from_transport)?
            .transport(shared.options.transport)
            .request_timeout(
                shared
                    .options
                    .request_timeout
                    .map(|limit| limit + TRANSPORT_TIMEOUT_MARGIN),
            );
        if let Some(token) = &shared.token {
            transport = transport.token(token);
        }
        let setup = Setup {
            agent: self.agent.clone(),
            client_name: shared.options.client_name.clone(),
            client_version: shared.options.client_version.clone(),
            sink: EventSink {
                tx: shared.events_tx.clone(),
                permission_handler: shared.options.permission_handler.clone(),
                turns: Arc::clone(&shared.turns),
                unread_permission_timeout: shared.options.unread_permission_timeout,
            },
        };
        let live = self
            .within_timeout("initialize", Live::open(transport, setup))
            .await?;
        *shared.live.lock() = Some(live);
        Ok(())
    }

    /// Closes the connection (HTTP DELETE). Sessions live on on the server;
    /// an embedded server keeps running; [`open`](Self::open) starts a new
    /// connection. Idempotent: `Ok(())` when not connected.
    ///
    /// # Errors
    /// None today: a DELETE that fails is logged (the server closes idle
    /// connections itself); the `Result` leaves room for reporting it.
    pub async fn close(&self) -> Result<(), Error> {
        let _lifecycle = self.shared.lifecycle.lock().await;
        let live = self.shared.live.lock().take();
        if let Some(mut live) = live {
            live.close().await;
        }
        Ok(())
    }

    /// The old name of [`close`](Self::close).
    ///
    /// # Errors
    /// As [`close`](Self::close).
    #[deprecated(since = "0.2.0", note = "renamed to `close`")]
    pub async fn disconnect(&self) -> Result<(), Error> {
        self.close().await
    }

    /// Whether a connection is live.
    pub fn is_connected(&self) -> bool {
        self.shared.live.lock().as_ref().is_some_and(Live::is_alive)
    }

    /// Closes the connection and stops an embedded server (SIGTERM, then
    /// SIGKILL after the grace period), waiting without blocking; for every
    /// clone of this client. Later calls fail with [`Error::Disposed`].
    /// Idempotent.
    pub async fn shutdown(&self) {
        let shared = &self.shared;
        let _lifecycle = shared.lifecycle.lock().await;
        shared.disposed.store(true, Ordering::Release);
        let live = shared.live.lock().take();
        if let Some(mut live) = live {
            live.close().await;
        }
        let server = shared.server.lock().take();
        if let Some(mut server) = server {
            server.stop().await;
        }
    }

    /// The old name of [`shutdown`](Self::shutdown).
    #[deprecated(since = "0.2.0", note = "renamed to `shutdown`")]
    pub async fn dispose(&self) {
        self.shutdown().await;
    }

    /// The client-wide event stream, once: the first call (on any clone)
    /// takes it, later calls get `None`. See [`Events`].
    ///
    /// Permission requests (without a
    /// [`permission_handler`](ClientOptions::permission_handler), and
    /// outside a [`prompt_stream`](Self::prompt_stream) turn) arrive here.
    /// Read it *while* a turn runs, not only after
    /// [`prompt`](Self::prompt) returned: a permission request nobody takes
    /// from here within
    /// [`unread_permission_timeout`](ClientOptions::unread_permission_timeout)
    /// (30 s by default) is answered "cancelled", with a warning in the
    /// log, also when this was never called.
    pub fn take_events(&self) -> Option<Events> {
        self.shared.events.lock().take()
    }

    /// The agent id this client is bound to.
    pub fn agent(&self) -> &str {
        &self.agent
    }

    /// The server's base URL (in embedded mode `http://127.0.0.1:PORT`).
    pub fn base_url(&self) -> &str {
        &self.shared.base_url
    }

    /// The embedded server's process id; `None` in server mode.
    pub fn server_pid(&self) -> Option<u32> {
        self.shared.server_pid
    }

    /// The embedded server's last log lines (with
    /// [`ServerLogs::Capture`](crate::ServerLogs::Capture)); `None` in
    /// server mode or after shutdown.
    pub fn server_logs(&self) -> Option<String> {
        self.shared
            .server
            .lock()
            .as_ref()
            .map(EmbeddedServer::stderr_text)
    }

    /// The server's id of the live connection (`x-acp-connection-id`).
    pub fn connection_id(&self) -> Option<String> {
        self.shared
            .live
            .lock()
            .as_ref()
            .and_then(Live::connection_id)
    }

    /// The agent's answer to this connection's `initialize`: protocol
    /// version, `agent_info`, capabilities (with the server's extension
    /// block in `agent_capabilities.meta["sandboxagent.dev"]`). `None` when
    /// not connected.
    pub fn initialize_result(&self) -> Option<InitializeResponse> {
        self.shared
            .live
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
                    self.control.session(&self.agent, &session_id.0),
                )
                .await;
        }
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
    /// [`Error::ConnectionLost`] when the server cannot be reached,
    /// [`Error::Timeout`] past the request timeout, [`Error::Http`] (a
    /// wrong token on the other routes: [`Error::is_unauthorized`]),
    /// [`Error::Disposed`].
    pub async fn health(&self) -> Result<Health, Error> {
        self.check_disposed()?;
        self.control_call("GET /v2/health", self.control.health())
            .await
    }

    /// `GET /v2/agents`: every agent the server knows, installed or not,
    /// with its source, version, process state, and models / modes once
    /// reported.
    ///
    /// # Errors
    /// As [`health`](Self::health) (401 with a wrong token).
    pub async fn agents(&self) -> Result<Vec<AgentInfo>, Error> {
        self.check_disposed()?;
        self.control_call("GET /v2/agents", self.control.agents())
            .await
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
        self.control_call(
            "POST /v2/agents/{agent}/install",
            self.control.install(agent, &options),
        )
        .await
    }

    /// `GET /v2/sessions`: the whole inventory (every agent, ended sessions
    /// included), newest first, in one list and without a connection.
    /// [`list_sessions`](Self::list_sessions) is the paged ACP
    /// `session/list` over the connection.
    ///
    /// # Errors
    /// As [`health`](Self::health).
    pub async fn all_sessions(&self) -> Result<Vec<SessionEntry>, Error> {
        self.check_disposed()?;
        self.control_call("GET /v2/sessions", self.control.sessions())
            .await
    }

    /// The old name of [`all_sessions`](Self::all_sessions).
    ///
    /// # Errors
    /// As [`all_sessions`](Self::all_sessions).
    #[deprecated(since = "0.2.0", note = "renamed to `all_sessions`")]
    pub async fn sessions(&self) -> Result<Vec<SessionEntry>, Error> {
        self.all_sessions().await
    }

    /// `GET /v2/sessions/{id}?agent=`; now [`get_session`](Self::get_session),
    /// which uses this route when not connected.
    ///
    /// # Errors
    /// As [`get_session`](Self::get_session).
    #[deprecated(
        since = "0.2.0",
        note = "use `get_session`, which works with or without a connection"
    )]
    pub async fn session(&self, session_id: impl Into<SessionId>) -> Result<SessionEntry, Error> {
        self.check_disposed()?;
        let session_id = session_id.into();
        self.control_call(
            "GET /v2/sessions/{id}",
            self.control.session(&self.agent, &session_id.0),
        )
        .await
    }

    /// `GET /v2/sessions/{id}/events?offset=&limit=`: one page of the
    /// session's recorded ACP traffic from `offset` on, oldest first, at
    /// most `limit` events (1..=1000; `None`: 100). Continue with the
    /// page's [`next_offset`](EventPage::next_offset) until it is `None`
    /// (the end of what is recorded now).
    ///
    /// ```no_run
    /// # async fn run(client: sandbox_agent_sdk::SandboxAgentClient, id: sandbox_agent_sdk::schema::SessionId) -> Result<(), sandbox_agent_sdk::Error> {
    /// let mut offset = Some(0);
    /// while let Some(from) = offset {
    ///     let page = client.session_events(id.clone(), from, None).await?;
    ///     for event in &page.events {
    ///         println!("{} {:?} {}", event.offset, event.direction, event.message);
    ///     }
    ///     offset = page.next_offset;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`health`](Self::health); an unknown session
    /// [`Error::is_not_found`] (404 `unknown-session`); [`Error::Http`] 400
    /// for a `limit` out of range.
    pub async fn session_events(
        &self,
        session_id: impl Into<SessionId>,
        offset: u64,
        limit: Option<u32>,
    ) -> Result<EventPage, Error> {
        self.check_disposed()?;
        let session_id = session_id.into();
        let limit = limit.unwrap_or(DEFAULT_EVENTS_LIMIT);
        // One more than asked for, when the server allows it, tells whether
        // the page is the last.
        let asked = if (1..MAX_EVENTS_LIMIT).contains(&limit) {
            limit + 1
        } else {
            limit
        };
        let page = self
            .control_call(
                "GET /v2/sessions/{id}/events",
                self.control
                    .session_events(&self.agent, &session_id.0, offset, Some(asked)),
            )
            .await?;
        Ok(EventPage::from_wire(page, offset, limit))
    }

    // -----------------------------------------------------------------

    fn check_disposed(&self) -> Result<(), Error> {
        if self.shared.disposed.load(Ordering::Acquire) {
            Err(Error::Disposed)
        } else {
            Ok(())
        }
    }

    /// The live connection's sender.
    fn cx(&self) -> Result<ConnectionTo<Agent>, Error> {
        self.check_disposed()?;
        match self.shared.live.lock().as_ref() {
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
        let method = request.method().to_owned();
        self.within_timeout(&method, async {
            cx.send_request(request)
                .block_task()
                .await
                .map_err(Error::from_rpc)
        })
        .await
    }

    /// `call`, failing with [`Error::Timeout`] after the request timeout.
    async fn within_timeout<T>(
        &self,
        what: &str,
        call: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        within_limit(self.shared.options.request_timeout, what, call).await
    }

    /// A control-plane call; a reqwest timeout is reported with the route
    /// and the limit.
    async fn control_call<T>(
        &self,
        what: &str,
        call: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        match call.await {
            Err(Error::Timeout { source, .. }) => Err(Error::Timeout {
                what: what.to_owned(),
                after: self.shared.options.request_timeout,
                source,
            }),
            other => other,
        }
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

/// `call`, failing with [`Error::Timeout`] naming `what` after `limit`
/// (none: no limit).
async fn within_limit<T>(
    limit: Option<Duration>,
    what: &str,
    call: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    let Some(limit) = limit else {
        return call.await;
    };
    match tokio::time::timeout(limit, call).await {
        Ok(result) => result,
        Err(_) => Err(Error::Timeout {
            what: what.to_owned(),
            after: Some(limit),
            source: None,
        }),
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

fn session_ref(session_id: impl Into<SessionId>) -> SessionRef {
    SessionRef {
        session_id: session_id.into().0.to_string(),
    }
}

impl std::fmt::Debug for SandboxAgentClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxAgentClient")
            .field("agent", &self.agent)
            .field("base_url", &self.shared.base_url)
            .field("server_pid", &self.shared.server_pid)
            .field("connected", &self.is_connected())
            .field("disposed", &self.shared.disposed.load(Ordering::Relaxed))
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
        assert_send_sync::<TurnStream>();
        assert_send::<TurnEvent>();
    }

    fn wire_page(offsets: std::ops::Range<u64>, next_offset: u64) -> SessionEventsPage {
        SessionEventsPage {
            events: offsets
                .map(|offset| SessionEvent {
                    offset,
                    at: "2026-01-01T00:00:00.000Z".to_owned(),
                    direction: ext_methods::Direction::ClientToAgent,
                    message: Value::Null,
                })
                .collect(),
            next_offset,
        }
    }

    #[test]
    fn event_pages_mark_their_end() {
        // One more than asked came back: more to fetch.
        let page = EventPage::from_wire(wire_page(0..3, 3), 0, 2);
        assert_eq!(page.events.len(), 2);
        assert_eq!(page.next_offset, Some(2));
        assert_eq!(page.offset_after, 2);
        // Fewer than asked, or exactly as many (the extra one was missing):
        // the end.
        let page = EventPage::from_wire(wire_page(2..4, 4), 2, 5);
        assert_eq!((page.next_offset, page.offset_after), (None, 4));
        let page = EventPage::from_wire(wire_page(2..4, 4), 2, 2);
        assert_eq!(page.next_offset, None);
        let page = EventPage::from_wire(wire_page(0..0, 7), 7, 10);
        assert_eq!((page.next_offset, page.offset_after), (None, 7));
        // At the server's largest limit nothing extra can be asked for: a
        // full page may have more behind it.
        let page = EventPage::from_wire(wire_page(0..1000, 1000), 0, MAX_EVENTS_LIMIT);
        assert_eq!(page.next_offset, Some(1000));
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
