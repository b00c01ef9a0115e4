//! The shared state of a server and the JSON-RPC handling of one POST:
//! opening connections with `initialize`, forwarding requests and
//! notifications to the connection's agent, and relaying the client's answers
//! to agent requests (DESIGN.md sections 3 and 4).

use crate::agent::router::{AgentProcess, Effect};
use crate::agent::{Agents, StartError};
use crate::config::ServerConfig;
use crate::connection::{ClientCapabilities, Connection, ReplayLimits};
use crate::error::Error;
use crate::protocol::{self, EXTENSION_PREFIX, Envelope, Kind, RpcError, code, method};
use crate::registry::Connections;
use crate::session::Sessions;
use bytes::Bytes;
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
    pub connections: Connections,
    /// Every session seen, across agents and connections.
    pub sessions: Sessions,
    /// Agent processes, one per agent id.
    pub agents: Agents,
    /// Cancelled when the server starts shutting down.
    pub shutdown: CancellationToken,
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
    },
    /// `202`, empty body: a notification or an answer to an agent request.
    Accepted,
}

impl Reply {
    fn json(body: Vec<u8>) -> Self {
        Self::Json {
            body: Bytes::from(body),
            connection_id: None,
        }
    }
}

impl Runtime {
    /// A runtime for `config`; agents start on first use.
    pub fn new(config: ServerConfig) -> Arc<Self> {
        let limits = ReplayLimits {
            events: config.replay_buffer_events.max(1),
            bytes: config.replay_buffer_bytes,
        };
        Arc::new(Self {
            connections: Connections::new(config.max_connections, limits),
            sessions: Sessions::default(),
            agents: Agents::new(
                &config.agents,
                config.max_line_bytes,
                config.request_timeout,
            ),
            shutdown: CancellationToken::new(),
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
        // Newline-delimited stdio needs the message on one line.
        let body = if protocol::has_newline(&body) {
            let mut copy = body.to_vec();
            protocol::flatten_newlines(&mut copy);
            Bytes::from(copy)
        } else {
            body
        };
        let (envelope, kind) = Envelope::parse(&body, true)
            .map_err(|error| Error::InvalidRequest(format!("invalid JSON-RPC message: {error}")))?;
        let Some(connection_id) = connection_id else {
            if kind != Kind::Request || envelope.method() != method::INITIALIZE {
                return Err(Error::MissingConnectionId(
                    " (only initialize may be sent without one)",
                ));
            }
            return self.initialize(&envelope).await;
        };
        let connection = self
            .connections
            .get(connection_id)
            .ok_or_else(|| Error::UnknownConnection(connection_id.to_owned()))?;
        let _active = connection.begin_request();
        match kind {
            Kind::Request => self.request(&connection, &envelope).await,
            Kind::Notification => self.notification(&connection, &envelope, &body).await,
            Kind::Response => self.answer(&connection, &envelope, &body).await,
        }
    }

    /// `initialize` without a connection: start the agent if needed, open a
    /// connection, answer from the agent's cached `initialize` result.
    async fn initialize(self: &Arc<Self>, envelope: &Envelope<'_>) -> Result<Reply, Error> {
        let client_id = envelope.id.unwrap_or(RawValue::NULL);
        let agent = protocol::meta_agent(envelope.params).ok_or(Error::MissingAgent {
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
        let process = match self.ready_agent(&agent).await {
            Ok(process) => process,
            Err(Ok(error)) => {
                return Ok(Reply::json(protocol::response_line(
                    client_id,
                    None,
                    Some(&error),
                )));
            }
            Err(Err(error)) => return Err(error),
        };
        let capabilities = ClientCapabilities::from_initialize_params(envelope.params);
        let connection = self.connections.open(agent.as_str().into(), capabilities)?;
        tracing::info!(connection = %connection.id, agent, "connection opened");
        let result = initialize_result(&process);
        Ok(Reply::Json {
            body: Bytes::from(protocol::response_line(client_id, Some(&result), None)),
            connection_id: Some(connection.id.clone()),
        })
    }

    /// The running process of `agent`. `Err(Ok(error))`: the agent answered
    /// `initialize` with this JSON-RPC error object.
    async fn ready_agent(
        self: &Arc<Self>,
        agent: &str,
    ) -> Result<Arc<AgentProcess>, Result<Box<RawValue>, Error>> {
        match self.agents.ensure_running(self, agent).await {
            Ok(process) => Ok(process),
            Err(StartError::Unknown) => Err(Err(self.unknown_agent(agent.to_owned()))),
            Err(StartError::Failed(reason)) => Err(Err(Error::AgentStartFailed {
                agent: agent.to_owned(),
                reason,
            })),
            Err(StartError::Rejected(error)) => Err(Ok(error)),
        }
    }

    fn unknown_agent(&self, agent: String) -> Error {
        Error::UnknownAgent {
            agent,
            known: self.agents.known_ids(),
        }
    }

    async fn request(
        self: &Arc<Self>,
        connection: &Arc<Connection>,
        envelope: &Envelope<'_>,
    ) -> Result<Reply, Error> {
        let client_id = envelope.id.unwrap_or(RawValue::NULL);
        let method = envelope.method();
        if method.starts_with(EXTENSION_PREFIX) {
            let error = RpcError::new(
                code::METHOD_NOT_FOUND,
                format!("method not found: {method}"),
            );
            return Ok(Reply::json(protocol::error_response_line(
                client_id, &error,
            )));
        }
        let effect = self.effect_of(connection, envelope)?;
        let process = match self.ready_agent(&connection.agent).await {
            Ok(process) => process,
            Err(Ok(error)) => {
                return Ok(Reply::json(protocol::response_line(
                    client_id,
                    None,
                    Some(&error),
                )));
            }
            Err(Err(error)) => return Err(error),
        };
        if method == method::INITIALIZE {
            let result = initialize_result(&process);
            return Ok(Reply::json(protocol::response_line(
                client_id,
                Some(&result),
                None,
            )));
        }
        if !connection.claim_request_id(client_id.get()) {
            let error = RpcError::new(
                code::INVALID_REQUEST,
                "request id already in flight on this connection",
            );
            return Ok(Reply::json(protocol::error_response_line(
                client_id, &error,
            )));
        }
        if let Effect::AttachSession { session, .. } = &effect {
            process.prepare_attach(self, connection, session);
        }
        let receiver = match process
            .send_request(connection, client_id, method, envelope.params, effect)
            .await
        {
            Ok(receiver) => receiver,
            Err(error) => {
                connection.release_request_id(client_id.get());
                let error = RpcError::new(code::INTERNAL_ERROR, error.to_string());
                return Ok(Reply::json(protocol::error_response_line(
                    client_id, &error,
                )));
            }
        };
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
                Waited::Answer(body) => Ok(Reply::Json { body, connection_id: None }),
                Waited::TimedOut => Err(Error::Timeout {
                    method: method.to_owned(),
                    timeout: timeout.unwrap_or_default(),
                }),
                Waited::Lost => {
                    let error = RpcError::new(code::INTERNAL_ERROR, "the agent's answer was lost");
                    Ok(Reply::json(protocol::error_response_line(client_id, &error)))
                }
            },
            () = connection.closed().cancelled() => {
                let error = RpcError::new(code::INTERNAL_ERROR, "connection closed");
                Ok(Reply::json(protocol::error_response_line(client_id, &error)))
            }
        }
    }

    /// Checks `_meta` rules and picks what the runtime does with the answer.
    fn effect_of(&self, connection: &Connection, envelope: &Envelope<'_>) -> Result<Effect, Error> {
        let method = envelope.method();
        let cwd = || cwd_of(envelope.params);
        Ok(match method {
            method::SESSION_NEW => {
                match protocol::meta_agent(envelope.params) {
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
                Effect::CreateSession { cwd: cwd() }
            }
            method::SESSION_FORK => Effect::CreateSession { cwd: cwd() },
            method::SESSION_LOAD | method::SESSION_RESUME => match envelope.session_id() {
                Some(session) => Effect::AttachSession {
                    session,
                    cwd: cwd(),
                },
                None => Effect::None,
            },
            _ => Effect::None,
        })
    }

    async fn notification(
        self: &Arc<Self>,
        connection: &Arc<Connection>,
        envelope: &Envelope<'_>,
        body: &[u8],
    ) -> Result<Reply, Error> {
        if envelope.method().starts_with(EXTENSION_PREFIX) {
            tracing::debug!(
                method = envelope.method(),
                "ignoring unknown extension notification"
            );
            return Ok(Reply::Accepted);
        }
        // A notification is not a reason to start an agent: with no process
        // there is nothing to cancel or inform.
        if let Some(process) = self.agents.current(&connection.agent)
            && process.send_line(body).await.is_err()
        {
            tracing::debug!(connection = %connection.id, "notification dropped: agent process exited");
        }
        Ok(Reply::Accepted)
    }

    async fn answer(
        self: &Arc<Self>,
        connection: &Arc<Connection>,
        envelope: &Envelope<'_>,
        body: &[u8],
    ) -> Result<Reply, Error> {
        let raw_id = envelope.id.map(RawValue::get).unwrap_or("null");
        match self.agents.current(&connection.agent) {
            Some(process) if process.take_agent_request(raw_id) => {
                if process.send_line(body).await.is_err() {
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

/// The `initialize` result clients get: the agent's own.
fn initialize_result(process: &AgentProcess) -> Box<RawValue> {
    process
        .initialize_result
        .lock()
        .clone()
        .unwrap_or_else(|| RawValue::NULL.to_owned())
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
