//! The shared state of a server and the JSON-RPC handling of one POST:
//! opening connections with `initialize`, forwarding requests and
//! notifications to the connection's agent, and relaying the client's answers
//! to agent requests (research/contract.md, "Transport: /v2/rpc" and
//! "Routing: connections, sessions, one agent process").

use crate::agent::process::AgentProcess;
use crate::agent::router::{Effect, RouteTargets};
use crate::agent::{Agents, StartError};
use crate::config::ServerConfig;
use crate::connection::{
    ClientCapabilities, Connection, InFlightId, MAX_IN_FLIGHT, Refused, ReplayLimits,
};
use crate::connections::Connections;
use crate::error::Error;
use crate::event_log::LogLimits;
use crate::ext::ExtMethods;
use crate::install::{InstallOptions, Installer, LogProgress};
use crate::protocol::{self, Envelope, Kind, RpcError, code, method};
use crate::session::{InventoryLimits, Session, Sessions};
use crate::store::Store;
use crate::store::writer::{Persist, StoreHealth};
use agent_client_protocol::v1::schema::{ListSessionsRequest, ListSessionsResponse};
use bytes::Bytes;
use ext_methods::{
    Direction, EndReason, ListModelsResult, ModelsTarget, PREFIX as EXTENSION_PREFIX, SessionEnded,
    TerminateResult, TerminatedBy, capability,
};
use serde_json::value::RawValue;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

/// Everything a running server shares between its tasks.
#[derive(Debug)]
pub struct Runtime {
    /// Settings from the command line.
    pub config: ServerConfig,
    /// Open client connections.
    pub connections: Arc<Connections>,
    /// Every session seen, across agents and connections.
    pub sessions: Arc<Sessions>,
    /// The same two handles, as agent processes get them to route to.
    routes: RouteTargets,
    /// Agent processes, one per agent id (shared with their start tasks).
    pub agents: Arc<Agents>,
    /// The `_sandboxagent/*` methods answered by the runtime itself.
    pub ext: ExtMethods,
    /// Cancelled when the server starts shutting down.
    pub shutdown: CancellationToken,
    /// The session store, for reads (`None` with `--store memory`).
    pub store: Option<Store>,
    /// The store's writer (`None` with `--store memory`).
    pub persist: Option<Arc<Persist>>,
}

/// An opened store and its writer task, as [`Runtime::new`] takes them.
#[derive(Debug)]
pub struct Durable {
    /// The store, for reads.
    pub store: Store,
    /// The writer task's handle.
    pub persist: Arc<Persist>,
}

/// How a client of the `/acp` profile differs from one of `/v2/rpc`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Profile<'a> {
    /// The agent the client named by path (`/acp/{agent}`), or the
    /// connection's agent: it stands in for `_meta["sandboxagent.dev"].agent`
    /// wherever `initialize` or `session/new` lack it (an RFD client knows
    /// no `_meta`).
    pub agent: Option<&'a str>,
    /// The id the connection an `initialize` opens gets: a WebSocket
    /// announced it in its 101 answer already.
    pub connection_id: Option<&'a str>,
}

/// The successful outcome of a POST.
#[derive(Debug)]
pub enum Reply {
    /// `200` with this JSON-RPC response; `connection_id` is set when an
    /// `initialize` opened a connection (sent as `x-acp-connection-id`).
    Json {
        /// One JSON-RPC response object.
        body: Bytes,
        /// The new connection's id.
        connection_id: Option<Arc<str>>,
        /// Newest event id of the connection when an agent's answer was
        /// released (sent as `x-acp-last-event-id`).
        last_event_id: Option<u64>,
    },
    /// `202`, empty body: a notification or an answer to an agent request.
    Accepted,
}

impl Reply {
    fn json(body: Vec<u8>) -> Self {
        Self::Json {
            body: Bytes::from(body),
            connection_id: None,
            last_event_id: None,
        }
    }

    /// `200` with a JSON-RPC error answering request `client_id`.
    fn error(client_id: &RawValue, error: &RpcError) -> Self {
        Self::json(protocol::error_response_line(client_id, error))
    }
}

impl Runtime {
    /// A runtime for `config`; agents start on first use. With `durable`,
    /// every session change is also written to its store.
    pub fn new(mut config: ServerConfig, durable: Option<Durable>) -> Arc<Self> {
        // The root as a real path, resolved once, here: never again per
        // request (research/contract.md, "Host file system").
        if let Some(real) = config
            .fs_root
            .as_ref()
            .and_then(|root| root.canonicalize().ok())
        {
            config.fs_root = Some(real);
        }
        let (store, persist) = match durable {
            Some(Durable { store, persist }) => (Some(store), Some(persist)),
            None => (None, None),
        };
        let limits = ReplayLimits {
            events: config.replay_buffer_events.max(1),
            bytes: config.replay_buffer_bytes,
        };
        let inventory = InventoryLimits {
            log: LogLimits {
                events: config.event_log_events.max(1),
                bytes: config.event_log_bytes,
            },
            ended_sessions: config.ended_sessions,
        };
        let routes = RouteTargets {
            sessions: Arc::new(Sessions::new(inventory, persist.clone())),
            connections: Arc::new(Connections::new(config.max_connections, limits)),
        };
        Arc::new_cyclic(|runtime| Self {
            connections: routes.connections.clone(),
            sessions: routes.sessions.clone(),
            routes,
            agents: Arc::new(
                Agents::new(
                    &config.agents,
                    config.max_line_bytes,
                    config.request_timeout,
                    Arc::new(
                        Installer::new(config.data_dir.clone(), config.install_timeout)
                            .with_retry_backoff(config.install_retry_backoff),
                    ),
                    config.require_preinstall,
                )
                .with_tree_supervisor(config.tree_supervisor.clone()),
            ),
            ext: ExtMethods::new(runtime.clone()),
            shutdown: CancellationToken::new(),
            store,
            persist,
            config,
        })
    }

    /// Handles one POST body on `/v2/rpc`.
    ///
    /// # Errors
    /// The [`Error`] that becomes the problem response; JSON-RPC level
    /// failures are `Ok(Reply::Json)` with an error object instead.
    pub async fn handle_post(
        self: &Arc<Self>,
        connection_id: Option<&str>,
        body: Bytes,
    ) -> Result<Reply, Error> {
        self.handle_post_for(connection_id, body, Profile::default())
            .await
    }

    /// [`Runtime::handle_post`] for a client of the `/acp` profile
    /// (research/contract.md, "The /acp profile"); see [`Profile`].
    ///
    /// # Errors
    /// As [`Runtime::handle_post`].
    pub async fn handle_post_for(
        self: &Arc<Self>,
        connection_id: Option<&str>,
        body: Bytes,
        profile: Profile<'_>,
    ) -> Result<Reply, Error> {
        let agent = profile.agent;
        // Newline-delimited stdio needs the message on one line.
        let body = match protocol::one_line(&body) {
            std::borrow::Cow::Owned(copy) => Bytes::from(copy),
            std::borrow::Cow::Borrowed(_) => body,
        };
        let (envelope, kind) = Envelope::parse(&body, true)
            .map_err(|error| Error::InvalidRequest(format!("invalid JSON-RPC message: {error}")))?;
        let Some(connection_id) = connection_id else {
            if kind != Kind::Request || envelope.method() != method::INITIALIZE {
                return Err(Error::MissingConnectionId(
                    " (only initialize may be sent without one)",
                ));
            }
            return self.initialize(&envelope, profile).await;
        };
        let connection = self.connections.lookup(connection_id)?;
        self.handle_parsed(&connection, &envelope, kind, &body, agent.is_some())
            .await
    }

    /// The part of [`Runtime::handle_post_for`] after the parse and the
    /// connection lookup, for a caller that did both already (a WebSocket
    /// frame, a POST on `/acp`): each message is parsed once
    /// (research/benchmarks.md, "The /acp transports"). `body` must be one
    /// line ([`protocol::one_line`]) and `envelope` of `kind` parsed from it
    /// (strict); `agent_implied` as for [`Profile::agent`].
    ///
    /// # Errors
    /// As [`Runtime::handle_post`]; [`Error::UnknownConnection`] once the
    /// connection is closed, as the lookup would have answered.
    pub(crate) async fn handle_parsed(
        self: &Arc<Self>,
        connection: &Arc<Connection>,
        envelope: &Envelope<'_>,
        kind: Kind,
        body: &Bytes,
        agent_implied: bool,
    ) -> Result<Reply, Error> {
        if connection.is_closed() {
            return Err(Error::UnknownConnection(connection.id.to_string()));
        }
        let _active = connection.begin_request();
        match kind {
            Kind::Request => {
                self.request(connection, envelope, body, agent_implied)
                    .await
            }
            Kind::Notification => self.notification(connection, envelope, body).await,
            Kind::Response => self.answer(connection, envelope, body).await,
        }
    }

    /// `initialize` without a connection: install (research/contract.md,
    /// "Agents: manifest, installs, lazy install") and start the agent if
    /// needed, open a connection, answer from the agent's cached `initialize`
    /// result.
    async fn initialize(
        self: &Arc<Self>,
        envelope: &Envelope<'_>,
        profile: Profile<'_>,
    ) -> Result<Reply, Error> {
        let client_id = envelope.id.unwrap_or(RawValue::NULL);
        let agent = protocol::meta_agent(envelope.params)
            .or_else(|| profile.agent.map(str::to_owned))
            .ok_or(Error::MissingAgent {
                method: method::INITIALIZE.to_owned(),
            })?;
        if !self.agents.is_known(&agent) {
            return Err(self.unknown_agent(agent));
        }
        if !self.connections.has_room() {
            return Err(Error::TooManyConnections {
                limit: self.config.max_connections,
            });
        }
        let process = match self.ready_agent(&agent, client_id).await? {
            Ok(process) => process,
            Err(rejected) => return Ok(rejected),
        };
        let capabilities = ClientCapabilities::from_initialize_params(envelope.params);
        let connection = match profile.connection_id {
            Some(id) => self
                .connections
                .open_as(id.into(), agent.as_str().into(), capabilities)?,
            None => self.connections.open(agent.as_str().into(), capabilities)?,
        };
        tracing::info!(connection = %connection.id, agent, "connection opened");
        let result = self.initialize_result(&process);
        Ok(Reply::Json {
            body: Bytes::from(protocol::response_line(client_id, Some(&result), None)),
            connection_id: Some(connection.id.clone()),
            last_event_id: None,
        })
    }

    /// The running process of `agent`, started if needed. `Ok(Err(reply))`:
    /// the agent answered `initialize` with a JSON-RPC error, which is the
    /// answer to the client's request `client_id` (a 200; research/contract.md,
    /// "Transport: /v2/rpc", POST).
    ///
    /// # Errors
    /// The problem when the agent is unknown, not installed or cannot start.
    async fn ready_agent(
        self: &Arc<Self>,
        agent: &str,
        client_id: &RawValue,
    ) -> Result<Result<Arc<AgentProcess>, Reply>, Error> {
        match self.agents.ensure_running(&self.routes, agent).await {
            Ok(process) => Ok(Ok(process)),
            Err(StartError::Rejected(error)) => Ok(Err(Reply::json(protocol::response_line(
                client_id,
                None,
                Some(&error),
            )))),
            Err(StartError::Unknown) => Err(self.unknown_agent(agent.to_owned())),
            Err(StartError::Failed(reason)) => Err(Error::AgentStartFailed {
                agent: agent.to_owned(),
                reason,
            }),
            Err(StartError::NotInstalled) => Err(Error::AgentNotInstalled {
                agent: agent.to_owned(),
                install_args: if crate::config::default_data_dir().as_ref()
                    == Some(&self.config.data_dir)
                {
                    String::new()
                } else {
                    format!(
                        " --data-dir {}",
                        shell_words::quote(&self.config.data_dir.to_string_lossy())
                    )
                },
            }),
            Err(StartError::Install(error)) => Err(Error::from_install(agent, error)),
        }
    }

    fn unknown_agent(&self, agent: String) -> Error {
        Error::UnknownAgent {
            agent,
            known: self.agents.known_ids(),
        }
    }

    /// A request on an open connection: answered by the runtime (extension
    /// methods, `session/list`, `initialize` again, a request on an ended
    /// session) or forwarded to the connection's agent and its answer awaited.
    async fn request(
        self: &Arc<Self>,
        connection: &Arc<Connection>,
        envelope: &Envelope<'_>,
        body: &Bytes,
        agent_implied: bool,
    ) -> Result<Reply, Error> {
        let client_id = envelope.id.unwrap_or(RawValue::NULL);
        let method = envelope.method();
        let in_flight = match connection.claim_request_id(client_id.get()) {
            Ok(in_flight) => in_flight,
            Err(Refused::Duplicate) => {
                let error = RpcError::new(
                    code::INVALID_REQUEST,
                    "request id already in flight on this connection",
                );
                return Ok(Reply::error(client_id, &error));
            }
            Err(Refused::Full) => {
                let error = RpcError::new(
                    code::TOO_MANY_REQUESTS,
                    format!(
                        "{MAX_IN_FLIGHT} requests are in flight on this connection already; wait for answers"
                    ),
                );
                return Ok(Reply::error(client_id, &error));
            }
        };
        if method.starts_with(EXTENSION_PREFIX) {
            let answer = self.ext.call(connection, method, envelope.params).await;
            let (result, error) = match &answer {
                Ok(result) => (Some(&**result), None),
                Err(error) => (None, Some(&**error)),
            };
            return Ok(Reply::json(protocol::response_line(
                client_id, result, error,
            )));
        }
        if method == method::SESSION_LIST {
            return Ok(match self.list_sessions(envelope.params) {
                Ok(page) => Reply::json(protocol::result_response_line(client_id, &page)),
                Err(error) => Reply::error(client_id, &error),
            });
        }
        let session = envelope.session_id().map(Arc::<str>::from);
        if let Some(error) = session
            .as_deref()
            .and_then(|id| self.ended_session_error(&connection.agent, id, method))
        {
            return Ok(Reply::error(client_id, &error));
        }
        let effect = self.effect_of(connection, envelope, body, agent_implied)?;
        let process = match self.ready_agent(&connection.agent, client_id).await? {
            Ok(process) => process,
            Err(rejected) => return Ok(rejected),
        };
        if method == method::INITIALIZE {
            let result = self.initialize_result(&process);
            return Ok(Reply::json(protocol::response_line(
                client_id,
                Some(&result),
                None,
            )));
        }
        self.forward(
            &process, connection, in_flight, envelope, body, effect, session,
        )
        .await
    }

    /// Requests on an ended session fail at once. A session that ended with
    /// its agent process may be loaded again on a new process; one that was
    /// terminated is over for good.
    fn ended_session_error(&self, agent: &str, id: &str, method: &str) -> Option<RpcError> {
        let ended = self.sessions.get(agent, id).filter(|s| s.is_ended())?;
        let revivable = matches!(
            method,
            method::SESSION_LOAD | method::SESSION_RESUME | method::SESSION_FORK
        );
        if revivable && !ended.is_terminated() {
            return None;
        }
        let how = if ended.is_terminated() {
            "was terminated"
        } else {
            "has ended"
        };
        Some(
            RpcError::new(code::RESOURCE_NOT_FOUND, format!("session {id} {how}"))
                .with_data(serde_json::json!({ "sessionId": id, "ended": true })),
        )
    }

    /// Sends a request whose id the connection has claimed (`in_flight`) to
    /// `process` (recorded in its session's event log first) and awaits the
    /// answer.
    #[allow(clippy::too_many_arguments)]
    async fn forward(
        &self,
        process: &AgentProcess,
        connection: &Arc<Connection>,
        in_flight: InFlightId<'_>,
        envelope: &Envelope<'_>,
        body: &Bytes,
        effect: Effect,
        session: Option<Arc<str>>,
    ) -> Result<Reply, Error> {
        let client_id = envelope.id.unwrap_or(RawValue::NULL);
        let method = envelope.method();
        if let Effect::AttachSession { session, .. } = &effect {
            process.router.prepare_attach(connection, session);
        }
        if let Some(session) = session
            .as_deref()
            .and_then(|id| self.sessions.live(id, process.generation))
        {
            session.record(Direction::ClientToAgent, body.clone());
        }
        let sent = process
            .router
            .send_request(
                connection,
                client_id,
                method,
                envelope.params,
                effect,
                session,
            )
            .await;
        match sent {
            Ok(receiver) => {
                in_flight.hand_over();
                self.await_answer(connection, client_id, method, receiver)
                    .await
            }
            // Dropping `in_flight` releases the id.
            Err(error) => {
                let error = RpcError::new(code::INTERNAL_ERROR, error.to_string());
                Ok(Reply::error(client_id, &error))
            }
        }
    }

    /// Waits for the agent's answer to a forwarded request: bounded by the
    /// request timeout (prompts only by `--prompt-timeout-ms`), cut short by
    /// the connection closing. An answer that comes too late goes to the SSE
    /// stream ([`ResponseWaiter`]).
    ///
    /// # Errors
    /// [`Error::Timeout`] (504) when the timeout elapsed first.
    async fn await_answer(
        &self,
        connection: &Arc<Connection>,
        client_id: &RawValue,
        method: &str,
        receiver: oneshot::Receiver<Bytes>,
    ) -> Result<Reply, Error> {
        let timeout = if method == method::SESSION_PROMPT {
            self.config.prompt_timeout
        } else {
            Some(self.config.request_timeout)
        };
        let mut waiter = ResponseWaiter {
            receiver: Some(receiver),
            connection: connection.clone(),
        };
        tokio::select! {
            waited = waiter.wait(timeout) => match waited {
                Waited::Answer(body) => Ok(Reply::Json {
                    body,
                    connection_id: None,
                    last_event_id: Some(connection.newest_event_id()),
                }),
                Waited::TimedOut => Err(Error::Timeout {
                    method: method.to_owned(),
                    timeout: timeout.unwrap_or_default(),
                }),
                Waited::Lost => {
                    let error = RpcError::new(code::INTERNAL_ERROR, "the agent's answer was lost");
                    Ok(Reply::error(client_id, &error))
                }
            },
            () = connection.closed().cancelled() => {
                let error = RpcError::new(code::INTERNAL_ERROR, "connection closed");
                Ok(Reply::error(client_id, &error))
            }
        }
    }

    /// Checks `_meta` rules and picks what the runtime does with the answer.
    /// `agent_implied`: the client named the agent by path, so `session/new`
    /// may leave `_meta` out.
    fn effect_of(
        &self,
        connection: &Connection,
        envelope: &Envelope<'_>,
        body: &Bytes,
        agent_implied: bool,
    ) -> Result<Effect, Error> {
        let method = envelope.method();
        let cwd = || cwd_of(envelope.params);
        Ok(match method {
            method::SESSION_NEW => {
                match protocol::meta_agent(envelope.params) {
                    None if agent_implied => {}
                    None => {
                        return Err(Error::MissingAgent {
                            method: method.to_owned(),
                        });
                    }
                    Some(agent) if *agent != *connection.agent => {
                        return Err(Error::AgentMismatch {
                            connection: connection.agent.to_string(),
                            requested: agent,
                        });
                    }
                    Some(_) => {}
                }
                Effect::CreateSession {
                    cwd: cwd(),
                    metadata: protocol::meta_namespace(envelope.params).unwrap_or_default(),
                    request: body.clone(),
                }
            }
            method::SESSION_FORK => Effect::CreateSession {
                cwd: cwd(),
                metadata: protocol::meta_namespace(envelope.params).unwrap_or_default(),
                request: body.clone(),
            },
            method::SESSION_LOAD | method::SESSION_RESUME => match envelope.session_id() {
                Some(session) => Effect::AttachSession {
                    session,
                    cwd: cwd(),
                    request: body.clone(),
                },
                None => Effect::None,
            },
            method::SESSION_SET_MODE | method::SESSION_SET_MODEL => {
                Effect::SetHints(crate::hints::from_request(method, envelope.params))
            }
            _ => Effect::None,
        })
    }

    async fn notification(
        self: &Arc<Self>,
        connection: &Arc<Connection>,
        envelope: &Envelope<'_>,
        body: &[u8],
    ) -> Result<Reply, Error> {
        let method = envelope.method();
        if method.starts_with(EXTENSION_PREFIX) {
            match ext_methods::names::find(method) {
                Some(ext) if ext.notification && self.ext.answers(method) => {
                    if let Err(error) = self.ext.call(connection, method, envelope.params).await {
                        tracing::info!(
                            method,
                            error = error.get(),
                            "extension notification failed"
                        );
                    }
                }
                _ => tracing::debug!(method, "ignoring unknown extension notification"),
            }
            return Ok(Reply::Accepted);
        }
        // A notification is not a reason to start an agent: with no process
        // there is nothing to cancel or inform.
        let Some(process) = self.agents.current(&connection.agent) else {
            return Ok(Reply::Accepted);
        };
        if method == method::CANCEL_REQUEST {
            // The client names its own request id; the agent knows another one.
            let Some(agent_id) = protocol::cancelled_request_id(envelope.params)
                .and_then(|id| process.router.agent_id_of(connection, id.get()))
            else {
                return Ok(Reply::Accepted);
            };
            let line = protocol::notification_line(
                method::CANCEL_REQUEST,
                &serde_json::json!({ "requestId": agent_id }),
            );
            if process.router.send_line(&line).await.is_err() {
                tracing::debug!(connection = %connection.id, "cancel dropped: agent process exited");
            }
            return Ok(Reply::Accepted);
        }
        if let Some(session) = envelope
            .session_id()
            .and_then(|id| self.sessions.live(&id, process.generation))
        {
            session.record(Direction::ClientToAgent, Bytes::copy_from_slice(body));
        }
        if process.router.send_line(body).await.is_err() {
            tracing::debug!(connection = %connection.id, "notification dropped: agent process exited");
        }
        Ok(Reply::Accepted)
    }

    /// The `initialize` result clients get: the agent's own, with the
    /// runtime's capability block at
    /// `agentCapabilities._meta["sandboxagent.dev"]` (research/contract.md,
    /// "Extension methods and control plane", the capability block).
    fn initialize_result(&self, process: &AgentProcess) -> Box<RawValue> {
        let Some(raw) = process.initialize_result.lock().clone() else {
            return RawValue::NULL.to_owned();
        };
        let Ok(mut result) = serde_json::from_str::<serde_json::Value>(raw.get()) else {
            return raw;
        };
        if let Some(object) = result.as_object_mut() {
            object
                .entry("agentCapabilities")
                .or_insert_with(|| serde_json::json!({}));
        }
        let block = ext_methods::advertisement(
            self.ext.names(),
            &[
                capability::SESSION_ENDED_NOTIFICATION,
                capability::AGENT_UNPARSED_NOTIFICATION,
                capability::STREAM_GAP_NOTIFICATION,
                capability::SESSION_AGENT_META,
                capability::SESSION_LIST_INVENTORY,
            ],
        );
        ext_methods::inject_advertisement(&mut result, block);
        protocol::raw(&result)
    }

    /// `session/list` (and its seed-era name `_sandboxagent/session/list`)
    /// from the server-wide inventory: every agent and connection, newest
    /// first, ACP cursor pagination (50 per page).
    ///
    /// # Errors
    /// `-32602` for params that are not `session/list` params or a cursor
    /// this server did not make.
    pub fn list_sessions(
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
        let cwd = request
            .cwd
            .as_ref()
            .map(|cwd| cwd.to_string_lossy().into_owned());
        let page = self
            .sessions
            .list(cwd.as_deref(), request.cursor.as_deref(), PAGE)
            .map_err(|message| RpcError::new(code::INVALID_PARAMS, message))?;
        let sessions = page.sessions.iter().map(|s| s.info()).collect();
        Ok(ListSessionsResponse::new(sessions).next_cursor(page.next_cursor))
    }

    /// Installs `agent`: `POST /v2/agents/{agent}/install` and
    /// `_sandboxagent/agent/install`, one path for both surfaces.
    ///
    /// # Errors
    /// As [`Agents::install`]: 404 `unknown-agent`, 400 for an unusable
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
        let ended = session.end_with_notice(&SessionEnded {
            session_id: id.to_owned(),
            reason: EndReason::Terminated,
            terminated_by: TerminatedBy::Daemon,
            message: Some("terminated on request".to_owned()),
            exit_code: None,
            stderr: None,
        });
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

    async fn answer(
        self: &Arc<Self>,
        connection: &Arc<Connection>,
        envelope: &Envelope<'_>,
        body: &[u8],
    ) -> Result<Reply, Error> {
        let raw_id = envelope.id.map(RawValue::get).unwrap_or("null");
        let current = self.agents.current(&connection.agent);
        match current
            .as_ref()
            .map(|p| (p, p.router.take_agent_request(raw_id)))
        {
            Some((process, Some(session))) => {
                if let Some(session) =
                    session.and_then(|id| self.sessions.live(&id, process.generation))
                {
                    session.record(Direction::ClientToAgent, Bytes::copy_from_slice(body));
                }
                if process.router.send_line(body).await.is_err() {
                    tracing::debug!(connection = %connection.id, "answer dropped: agent process exited");
                }
            }
            _ => {
                tracing::info!(connection = %connection.id, id = raw_id, "dropping an answer to an agent request that is unknown or already answered");
            }
        }
        Ok(Reply::Accepted)
    }
}

fn cwd_of(params: Option<&RawValue>) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Params {
        cwd: Option<String>,
    }
    params
        .and_then(|p| serde_json::from_str::<Params>(p.get()).ok())
        .and_then(|p| p.cwd)
}

/// Waits for the agent's answer to one POST. If the POST goes away (its
/// future is dropped because the HTTP caller left, or it timed out) an answer
/// that already arrived is moved to the connection's SSE stream; one that
/// arrives later is put there by the stdout reader. Nothing is lost.
struct ResponseWaiter {
    receiver: Option<oneshot::Receiver<Bytes>>,
    connection: Arc<Connection>,
}

/// How waiting for an answer ended.
enum Waited {
    /// The JSON-RPC response, with the client's id.
    Answer(Bytes),
    /// The timeout elapsed first; a later answer goes to the SSE stream.
    TimedOut,
    /// The answer's sender vanished (cannot happen while the pending table
    /// holds it; reported rather than waited on forever).
    Lost,
}

impl ResponseWaiter {
    async fn wait(&mut self, timeout: Option<Duration>) -> Waited {
        let Some(receiver) = self.receiver.as_mut() else {
            return Waited::Lost;
        };
        let answer = match timeout {
            Some(timeout) => tokio::time::timeout(timeout, receiver).await.ok(),
            None => Some(receiver.await),
        };
        match answer {
            Some(Ok(body)) => {
                self.receiver = None;
                Waited::Answer(body)
            }
            Some(Err(_)) => {
                self.receiver = None;
                Waited::Lost
            }
            None => {
                // An answer that raced in with the timeout wins over the 504.
                let Some(mut receiver) = self.receiver.take() else {
                    return Waited::TimedOut;
                };
                receiver.close();
                match receiver.try_recv() {
                    Ok(body) => Waited::Answer(body),
                    Err(_) => Waited::TimedOut,
                }
            }
        }
    }
}

impl Drop for ResponseWaiter {
    fn drop(&mut self) {
        if let Some(mut receiver) = self.receiver.take() {
            receiver.close();
            if let Ok(body) = receiver.try_recv() {
                self.connection.push(&body);
            }
        }
    }
}

impl Runtime {
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
                crate::event_log::wire_event(
                    event.offset,
                    crate::store::time_of(event.at_ns),
                    event.direction,
                    &event.message,
                )
            })
            .collect();
        if events.len() < limit {
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
}
