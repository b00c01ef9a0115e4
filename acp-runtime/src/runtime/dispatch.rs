//! The one way in for a client's message ([`Runtime::dispatch`]), parsed
//! once at its edge ([`Inbound`]): requests answered by the runtime
//! (extension methods, `session/list`, `initialize` again, a request on an
//! ended session) or forwarded to the connection's agent and their answer
//! awaited, notifications forwarded, and the client's answers to agent
//! requests relayed (research/contract.md, "Transport: /v2/rpc" and
//! "Routing: connections, sessions, one agent process").

use super::open::Opening;
use super::{Reply, Runtime};
use crate::agent::agent_process::AgentProcess;
use crate::agent::router::Effect;
use crate::error::Error;
use crate::inbound::Inbound;
use crate::memory::connection::{Connection, InFlightId, MAX_IN_FLIGHT, Profile, Refused};
use crate::memory::session::{MAX_METADATA_BYTES, metadata_size};
use crate::protocol::{self, Envelope, Kind, Method, RpcError, code, method};
use crate::spans;
use crate::store::writer::Room;
use bytes::Bytes;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;
use tracing::Span;

/// Where a message goes.
#[derive(Debug, Clone, Copy)]
pub enum To<'a> {
    /// No connection yet: only `initialize` may come, and opens one.
    Open(Opening<'a>),
    /// An open connection (looked up by the edge).
    Connection(&'a Arc<Connection>),
}

impl Runtime {
    /// Handles one client message: the only way in, for every edge.
    /// `parent` is the span of the exchange that brought it (its HTTP
    /// request's; [`Span::none`] on a WebSocket, where each request starts a
    /// trace): a request's span is its child (research/contract.md,
    /// "Traces"). Spans are passed down, never entered: with tracing on, an
    /// enter and an exit on every poll cost more than the spans themselves
    /// (research/benchmarks.md, "Issue 39: the request hot path").
    ///
    /// # Errors
    /// The [`Error`] that becomes the problem response (or, where the edge
    /// has no HTTP answer left to give, a JSON-RPC error); JSON-RPC level
    /// failures are `Ok(Reply::Json)` with an error object instead.
    /// [`Error::UnknownConnection`] once the connection is closed, as a
    /// lookup would have answered.
    pub async fn dispatch(
        self: &Arc<Self>,
        to: To<'_>,
        message: &Inbound<'_>,
        parent: &Span,
    ) -> Result<Reply, Error> {
        if message.kind == Kind::Request && spans::enabled() {
            // The request's span (research/contract.md, "Traces"): checked
            // first so that, with tracing off, `params` is not read for it.
            let connection = match to {
                To::Open(_) => None,
                To::Connection(connection) => Some(&*connection.id),
            };
            let session = message.envelope.session_id();
            let span = spans::rpc_request(
                parent,
                message.method,
                message.method_name(),
                connection,
                session.as_deref(),
            );
            return self.dispatch_to(to, message, &span).await;
        }
        self.dispatch_to(to, message, &Span::none()).await
    }

    /// [`Runtime::dispatch`] of a message whose span (a request's, while
    /// tracing is on) is `span`.
    async fn dispatch_to(
        self: &Arc<Self>,
        to: To<'_>,
        message: &Inbound<'_>,
        span: &Span,
    ) -> Result<Reply, Error> {
        let connection = match to {
            To::Open(opening) => return self.open(message, opening).await,
            To::Connection(connection) => connection,
        };
        if connection.is_closed() {
            return Err(Error::UnknownConnection(connection.id.to_string()));
        }
        let _active = connection.begin_request();
        match message.kind {
            Kind::Request => self.request(connection, message, span).await,
            Kind::Notification => self.notification(connection, message).await,
            Kind::Response => self.answer(connection, message).await,
        }
    }

    /// A request on an open connection: answered by the runtime (extension
    /// methods, `session/list`, `initialize` again, a request on an ended
    /// session) or forwarded to the connection's agent and its answer
    /// awaited; `span` is the request's.
    async fn request(
        self: &Arc<Self>,
        connection: &Arc<Connection>,
        message: &Inbound<'_>,
        span: &Span,
    ) -> Result<Reply, Error> {
        let envelope = &message.envelope;
        let client_id = envelope.id.unwrap_or(RawValue::NULL);
        let (method, name) = (message.method, message.method_name());
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
        // A session this runtime keeps in the store only (ended, dormant,
        // from before a restart) is read into memory before anything looks
        // it up (research/contract.md, "Durable sessions").
        let session = envelope.session_id().map(Arc::<str>::from);
        if let Some(id) = &session
            && let Err(error) = self.recall(Some(&connection.agent), id).await
        {
            return Ok(Reply::error(client_id, &error.to_rpc_error()));
        }
        if let Some(error) = session
            .as_deref()
            .and_then(|id| self.refuse_observer(connection, id, method, name))
        {
            return Ok(Reply::error(client_id, &error));
        }
        // What the runtime answers itself, whatever the session's state.
        match method {
            Method::Ext(_) | Method::UnknownExt => {
                let answer = super::ext::call(self, connection, name, envelope.params).await;
                let (result, error) = match &answer {
                    Ok(result) => (Some(&**result), None),
                    Err(error) => (None, Some(&**error)),
                };
                let mut reply = Reply::json(protocol::response_line(client_id, result, error));
                if let Method::Ext(ext) = method
                    && ext.name == ext_methods::method::SESSION_ATTACH
                    && let Reply::Json { last_event_id, .. } = &mut reply
                {
                    // The replayed history is on the stream up to this id.
                    *last_event_id = Some(connection.newest_event_id());
                }
                return Ok(reply);
            }
            Method::SessionList => {
                return Ok(match self.list_sessions(envelope.params).await {
                    Ok(page) => Reply::json(protocol::result_response_line(client_id, &page)),
                    Err(error) => Reply::error(client_id, &error),
                });
            }
            _ => {}
        }
        if let Some(error) = session
            .as_deref()
            .and_then(|id| self.ended_session_error(&connection.agent, id, method))
        {
            return Ok(Reply::error(client_id, &error));
        }
        // A session live here is loaded from its event log, to this
        // connection alone: the agent would replay it to every attached one
        // (research/contract.md, "`_sandboxagent/session/attach`").
        if method == Method::SessionLoad
            && let Some(live) = session
                .as_deref()
                .and_then(|id| self.live_session(connection, id))
        {
            let reply = match self.load_live_session(connection, &live).await {
                Ok(result) => protocol::result_response_line(client_id, &result),
                Err(error) => protocol::error_response_line(client_id, &error),
            };
            return Ok(Reply::Json {
                body: Bytes::from(reply),
                connection_id: None,
                last_event_id: Some(connection.newest_event_id()),
            });
        }
        let effect = self.effect_of(connection, message)?;
        if let Some(error) = self.cwd_refused(method, envelope.params) {
            return Ok(Reply::error(client_id, &error.to_rpc_error()));
        }
        let process = match self.ready_agent(&connection.agent, client_id).await? {
            Ok(process) => process,
            Err(rejected) => return Ok(rejected),
        };
        if method == Method::Initialize {
            let result = self.initialize_result(&process);
            return Ok(Reply::json(protocol::response_line(
                client_id,
                Some(&result),
                None,
            )));
        }
        self.forward(
            &process, connection, in_flight, message, effect, session, span,
        )
        .await
    }

    /// Requests on an ended session fail at once. A session that ended with
    /// its agent process may be loaded again on a new process; one that was
    /// terminated is over for good.
    fn ended_session_error(&self, agent: &str, id: &str, method: Method) -> Option<RpcError> {
        let ended = self.sessions.get(agent, id).filter(|s| s.is_ended())?;
        if method.revives() && !ended.is_terminated() {
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
    /// answer; `span` is the request's.
    // What `request` found out on its way here, passed on as it is.
    #[allow(clippy::too_many_arguments)]
    async fn forward(
        &self,
        process: &AgentProcess,
        connection: &Arc<Connection>,
        in_flight: InFlightId<'_>,
        message: &Inbound<'_>,
        effect: Effect,
        session: Option<Arc<str>>,
        span: &Span,
    ) -> Result<Reply, Error> {
        let envelope = &message.envelope;
        let client_id = envelope.id.unwrap_or(RawValue::NULL);
        let (method, name) = (message.method, message.method_name());
        if let Effect::AttachSession { session, .. } = &effect {
            process.router.prepare_attach(connection, session);
        }
        if let Some(session) = session
            .as_deref()
            .and_then(|id| self.sessions.live(id, process.generation))
        {
            // Dropping `in_flight` on a refusal releases the id.
            session.record_client(message.line).await?;
            if method == Method::SessionPrompt
                && let Some(params) = envelope.params
            {
                session.note_prompt(params);
            }
        }
        let sent = process
            .router
            .send_request(
                connection,
                client_id,
                method,
                name,
                envelope.params,
                effect,
                session,
                span,
            )
            .await;
        match sent {
            Ok(receiver) => {
                in_flight.hand_over();
                self.await_answer(connection, client_id, method, name, receiver)
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
        method: Method,
        name: &str,
        receiver: oneshot::Receiver<Bytes>,
    ) -> Result<Reply, Error> {
        let timeout = if method == Method::SessionPrompt {
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
                    method: name.to_owned(),
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

    /// A session's `cwd` the agents' user cannot write (`--agent-user`),
    /// checked before the agent sees the request: the agent's own failure
    /// would not name the user (research/contract.md, "Agents under an
    /// unprivileged user"). Relative or absent: the agent's to judge.
    fn cwd_refused(&self, method: Method, params: Option<&RawValue>) -> Option<Error> {
        let user = self.config.agent_user.as_ref()?;
        if !method.opens_session() {
            return None;
        }
        let cwd = cwd_of(params)?;
        let path = std::path::Path::new(&cwd);
        if !path.is_absolute() || crate::os::user::may_write(user, path) {
            return None;
        }
        Some(Error::CwdNotWritable {
            user: user.name.clone(),
            missing: !path.exists(),
            cwd,
        })
    }

    /// Checks `_meta` rules and picks what the runtime does with the answer.
    /// On a connection of the `/acp` profile `session/new` may leave `_meta`
    /// out: the connection's agent stands in for it.
    fn effect_of(&self, connection: &Connection, message: &Inbound<'_>) -> Result<Effect, Error> {
        let (envelope, body, method) = (&message.envelope, message.line, message.method);
        let cwd = || cwd_of(envelope.params);
        if method.opens_session()
            && let Some(cwd) = cwd()
            && cwd.len() > MAX_CWD_BYTES
        {
            // The inventory keeps it in every entry, row and listing.
            return Err(Error::InvalidRequest(format!(
                "cwd is {} bytes; a session keeps at most {MAX_CWD_BYTES}",
                cwd.len()
            )));
        }
        Ok(match method {
            Method::SessionNew => {
                match protocol::meta_agent(envelope.params) {
                    None if connection.profile == Profile::Acp => {}
                    None => {
                        return Err(Error::MissingAgent {
                            method: message.method_name().to_owned(),
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
                    metadata: metadata_of(envelope)?,
                    request: body.clone(),
                }
            }
            Method::SessionFork => Effect::CreateSession {
                cwd: cwd(),
                metadata: metadata_of(envelope)?,
                request: body.clone(),
            },
            Method::SessionLoad | Method::SessionResume => match envelope.session_id() {
                Some(session) => Effect::AttachSession {
                    session,
                    cwd: cwd(),
                    request: body.clone(),
                },
                None => Effect::None,
            },
            Method::SessionSetMode | Method::SessionSetModel => {
                Effect::SetHints(crate::memory::hints::from_request(method, envelope.params))
            }
            _ => Effect::None,
        })
    }

    async fn notification(
        self: &Arc<Self>,
        connection: &Arc<Connection>,
        message: &Inbound<'_>,
    ) -> Result<Reply, Error> {
        let (envelope, body) = (&message.envelope, message.line);
        let (method, name) = (message.method, message.method_name());
        if let Some(session) = envelope.session_id()
            && let Some(error) = self.refuse_observer(connection, &session, method, name)
        {
            // A notification has no answer to carry the error: dropped.
            tracing::info!(connection = %connection.id, method = name, error = %error.message, "dropping an observer's notification");
            return Ok(Reply::Accepted);
        }
        match method {
            Method::Ext(ext) if ext.notification && super::ext::answers(self, name) => {
                if let Err(error) = super::ext::call(self, connection, name, envelope.params).await
                {
                    tracing::info!(
                        method = name,
                        error = error.get(),
                        "extension notification failed"
                    );
                }
                return Ok(Reply::Accepted);
            }
            Method::Ext(_) | Method::UnknownExt => {
                tracing::debug!(method = name, "ignoring unknown extension notification");
                return Ok(Reply::Accepted);
            }
            _ => {}
        }
        // A notification is not a reason to start an agent: with no process
        // there is nothing to cancel or inform.
        let Some(process) = self.agents.current(&connection.agent) else {
            return Ok(Reply::Accepted);
        };
        if method == Method::CancelRequest {
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
        let session = envelope
            .session_id()
            .and_then(|id| self.sessions.live(&id, process.generation));
        if let Some(session) = &session {
            session.record_client(body).await?;
        }
        if process.router.send_line(body).await.is_err() {
            tracing::debug!(connection = %connection.id, "notification dropped: agent process exited");
        }
        if method == Method::SessionCancel
            && let Some(session) = &session
        {
            // ACP: after `session/cancel` the client answers the turn's open
            // permission requests and questions as cancelled; with several
            // clients the runtime does, once (research/contract.md, "Agent
            // questions (ACP elicitation)").
            process.router.cancel_turn_requests(&session.id);
        }
        Ok(Reply::Accepted)
    }

    async fn answer(
        self: &Arc<Self>,
        connection: &Arc<Connection>,
        message: &Inbound<'_>,
    ) -> Result<Reply, Error> {
        let (envelope, body) = (&message.envelope, message.line);
        let raw_id = envelope.id.map(RawValue::get).unwrap_or("null");
        // Room first: a refused answer leaves the agent's request open, for
        // this client to answer again.
        let room = self.room_for(&connection.agent, body).await?;
        let current = self.agents.current(&connection.agent);
        match current
            .as_ref()
            .map(|p| (p, p.router.take_answered(raw_id, connection)))
        {
            Some((process, Some(answered))) => {
                if let Some(session) = answered
                    .session
                    .as_deref()
                    .and_then(|id| self.sessions.live(id, process.generation))
                {
                    session.record_admitted(body.clone(), room);
                }
                if process.router.send_line(body).await.is_err() {
                    tracing::debug!(connection = %connection.id, "answer dropped: agent process exited");
                }
                // The first answer won: the other clients remove the question.
                process
                    .router
                    .announce_resolved(&answered, connection, body);
            }
            _ => {
                tracing::info!(connection = %connection.id, id = raw_id, "dropping an answer to an agent request that is unknown or already answered");
            }
        }
        Ok(Reply::Accepted)
    }
}

impl Runtime {
    /// Room in `agent`'s share of the store's queue for `line`, a client's
    /// answer to an agent request, taken before the request is looked up
    /// (which removes it) and the answer recorded and forwarded (`None`
    /// with no store or a degraded one). A message to a known session takes
    /// its room through [`crate::memory::session::Session::record_client`].
    ///
    /// # Errors
    /// [`Error::StoreBehind`] (503) when the queue had no room within
    /// `CLIENT_WAIT`: the message is neither recorded nor forwarded, so it
    /// is never silently missing from the stored log (research/contract.md,
    /// "Durable sessions").
    async fn room_for(&self, agent: &Arc<str>, line: &Bytes) -> Result<Option<Room>, Error> {
        let Some(persist) = self.sessions.store() else {
            return Ok(None);
        };
        persist
            .room(&persist.share(agent), line.len())
            .await
            .map_err(|()| Error::StoreBehind)
    }
}

/// The `_meta["sandboxagent.dev"]` a new session starts with.
///
/// # Errors
/// 400 past [`MAX_METADATA_BYTES`]: the inventory keeps it for the
/// session's whole life (research/contract.md, "`session/new` with metadata").
fn metadata_of(envelope: &Envelope<'_>) -> Result<Map<String, Value>, Error> {
    let metadata = protocol::meta_namespace(envelope.params).unwrap_or_default();
    let size = metadata_size(&metadata);
    if size > MAX_METADATA_BYTES {
        return Err(Error::InvalidRequest(format!(
            "_meta[\"sandboxagent.dev\"] is {size} bytes; a session keeps at most {MAX_METADATA_BYTES}"
        )));
    }
    Ok(metadata)
}

/// Longest `cwd` a session keeps, in bytes (Linux's `PATH_MAX`).
const MAX_CWD_BYTES: usize = 4096;

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
                // An answer has no `params`: the connection's own lane.
                self.connection.push(body, None);
            }
        }
    }
}
