//! Routing between client connections and one agent process
//! (DESIGN.md section 4).
//!
//! Toward the agent, every client request gets a fresh integer id from this
//! process's counter; the pending table maps it back to the connection and the
//! client's own id (kept as raw JSON, so it round-trips exactly). From the
//! agent, one task reads stdout line by line and dispatches each message in
//! order: notifications and agent requests go to the connections attached to
//! their session; responses go back to the waiting POST, or to the
//! connection's SSE stream when the POST is gone. Because that task handles
//! lines strictly in the order the agent wrote them, every notification
//! written before a response is in the connection's ring before the response
//! is released.

use super::framing::PREFIX_BYTES;
use super::process::StderrCapture;
use crate::connection::Connection;
use crate::hints;
use crate::protocol::{self, AgentMessage, Kind, RpcError, code, method};
use crate::runtime::Runtime;
use crate::session::Session;
use bytes::Bytes;
use ext_methods::notification::{AGENT_UNPARSED, SESSION_ENDED};
use ext_methods::{AgentUnparsed, Direction, EndReason, SessionEnded, TerminatedBy};
use parking_lot::Mutex;
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// Messages held for sessions whose owner is not known yet (DESIGN.md
/// section 3, edge rules): at most this many …
const HELD_MAX: usize = 256;
/// … and for at most this long.
const HELD_TTL: Duration = Duration::from_secs(5);

/// What the runtime does when the agent answers a client request successfully.
#[derive(Debug, Clone)]
pub enum Effect {
    /// Nothing beyond relaying the answer.
    None,
    /// `session/new`, `session/fork`: register the session named by
    /// `result.sessionId` and attach the requesting connection.
    CreateSession {
        /// `params.cwd` of the request.
        cwd: Option<String>,
        /// `params._meta["sandboxagent.dev"]`, stored as the session's metadata.
        metadata: Map<String, Value>,
        /// The client's request, first entry of the session's event log.
        request: Bytes,
    },
    /// `session/set_mode`, `session/set_model`: what the request implies
    /// about the session once the agent accepted it.
    SetHints(hints::Hints),
    /// `session/load`, `session/resume`: attach the requesting connection to
    /// `params.sessionId`.
    AttachSession {
        /// The session id from the request.
        session: String,
        /// `params.cwd` of the request.
        cwd: Option<String>,
    },
}

/// A request waiting for the agent's answer.
enum Pending {
    /// A client's request: the answer goes back with the client's own id.
    Client {
        connection: Arc<Connection>,
        client_id: Box<RawValue>,
        reply: oneshot::Sender<Bytes>,
        effect: Effect,
        /// `params.sessionId`: the answer goes to that session's event log.
        session: Option<Arc<str>>,
        /// A `session/prompt`, which terminate may answer on the agent's behalf.
        prompt: bool,
    },
    /// The runtime's own request (its `initialize`).
    Runtime(oneshot::Sender<Result<Box<RawValue>, Box<RawValue>>>),
}

/// An agent-initiated request no client has answered yet.
struct AgentRequest {
    session: Option<Arc<str>>,
    method: Box<str>,
    line: Bytes,
}

/// A message held until its session's owner is known.
struct Held {
    at: Instant,
    session: Arc<str>,
    line: Bytes,
    /// Raw id when the message is an agent request.
    request_id: Option<Box<str>>,
}

/// Why the agent could not take a message.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The process exited (or its stdin closed).
    #[error("agent process exited")]
    Exited,
}

/// One running agent process and its routing tables. Shared by the request
/// handlers (client → agent) and the stdout reader task (agent → client).
pub struct AgentProcess {
    /// Agent id.
    pub agent: Arc<str>,
    /// Increases with every start of this agent id.
    pub generation: u64,
    /// OS process id; also the process group id.
    pub pid: u32,
    /// Complete lines for the agent's stdin.
    stdin: mpsc::Sender<Bytes>,
    /// Source of the ids the runtime puts on requests to the agent.
    next_id: AtomicI64,
    /// Requests sent to the agent and not answered yet, by runtime id.
    pending: Mutex<HashMap<i64, Pending>>,
    /// Agent requests not answered yet, by raw id, in arrival order.
    agent_requests: Mutex<BTreeMap<u64, (Box<str>, AgentRequest)>>,
    /// Arrival counter for `agent_requests`.
    agent_request_seq: AtomicU64,
    /// Messages for sessions whose owner is not known yet.
    held: Mutex<VecDeque<Held>>,
    /// The connection that sent this agent its most recent request.
    last_requester: Mutex<Weak<Connection>>,
    /// The process's stderr excerpt.
    pub(crate) stderr: Arc<Mutex<StderrCapture>>,
    /// Cancelled once the process is gone and its pending requests failed.
    pub(crate) exited: CancellationToken,
    /// The agent's answer to the runtime's `initialize`.
    pub(crate) initialize_result: Mutex<Option<Box<RawValue>>>,
    /// How the process ended, once it did.
    pub(crate) exit: Mutex<Option<ExitInfo>>,
}

impl std::fmt::Debug for AgentProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentProcess")
            .field("agent", &self.agent)
            .field("generation", &self.generation)
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

impl AgentProcess {
    /// Routing state for a freshly spawned process.
    pub fn new(
        agent: Arc<str>,
        generation: u64,
        pid: u32,
        stdin: mpsc::Sender<Bytes>,
        stderr: Arc<Mutex<StderrCapture>>,
    ) -> Self {
        Self {
            agent,
            generation,
            pid,
            stdin,
            next_id: AtomicI64::new(1),
            pending: Mutex::new(HashMap::new()),
            agent_requests: Mutex::new(BTreeMap::new()),
            agent_request_seq: AtomicU64::new(0),
            held: Mutex::new(VecDeque::new()),
            last_requester: Mutex::new(Weak::new()),
            stderr,
            exited: CancellationToken::new(),
            initialize_result: Mutex::new(None),
            exit: Mutex::new(None),
        }
    }

    /// Whether the process is still serving.
    pub fn is_alive(&self) -> bool {
        !self.exited.is_cancelled()
    }

    /// Sends a client's request with a fresh agent-side id. The receiver gets
    /// the agent's answer with the client's id restored (or a JSON-RPC error
    /// if the process exits first).
    ///
    /// # Errors
    /// [`SendError::Exited`] when the process is gone.
    pub async fn send_request(
        &self,
        connection: &Arc<Connection>,
        client_id: &RawValue,
        method: &str,
        params: Option<&RawValue>,
        effect: Effect,
        session: Option<Arc<str>>,
    ) -> Result<oneshot::Receiver<Bytes>, SendError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut line = protocol::request_line(&protocol::agent_id(id), method, params);
        line.push(b'\n');
        let (reply, receiver) = oneshot::channel();
        self.pending.lock().insert(
            id,
            Pending::Client {
                connection: connection.clone(),
                client_id: client_id.to_owned(),
                reply,
                effect,
                session,
                prompt: method == method::SESSION_PROMPT,
            },
        );
        *self.last_requester.lock() = Arc::downgrade(connection);
        if self.stdin.send(Bytes::from(line)).await.is_err() || !self.is_alive() {
            self.pending.lock().remove(&id);
            return Err(SendError::Exited);
        }
        Ok(receiver)
    }

    /// Sends the runtime's own request and waits for the raw result (`Ok`) or
    /// raw error object (`Err(Some)`); `Err(None)` when the process exited.
    pub async fn call(
        &self,
        method: &str,
        params: &impl Serialize,
    ) -> Result<Box<RawValue>, Option<Box<RawValue>>> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let params = protocol::raw(params);
        let mut line = protocol::request_line(&protocol::agent_id(id), method, Some(&params));
        line.push(b'\n');
        let (reply, receiver) = oneshot::channel();
        self.pending.lock().insert(id, Pending::Runtime(reply));
        if self.stdin.send(Bytes::from(line)).await.is_err() {
            self.pending.lock().remove(&id);
            return Err(None);
        }
        match receiver.await {
            Ok(Ok(result)) => Ok(result),
            Ok(Err(error)) => Err(Some(error)),
            Err(_) => Err(None),
        }
    }

    /// Writes one complete line (a notification, or a client's answer to an
    /// agent request) to the agent's stdin. `line` must be one line of JSON.
    ///
    /// # Errors
    /// [`SendError::Exited`] when the process is gone.
    pub async fn send_line(&self, line: &[u8]) -> Result<(), SendError> {
        let mut bytes = Vec::with_capacity(line.len() + 1);
        bytes.extend_from_slice(line);
        bytes.push(b'\n');
        self.stdin
            .send(Bytes::from(bytes))
            .await
            .map_err(|_| SendError::Exited)
    }

    /// Takes agent request `raw_id` if it is still unanswered, returning its
    /// session; `None` when it was answered already or never existed (the
    /// caller drops the answer: exactly one answer reaches the agent).
    pub fn take_agent_request(&self, raw_id: &str) -> Option<Option<Arc<str>>> {
        let mut requests = self.agent_requests.lock();
        let key = requests
            .iter()
            .find(|(_, (id, _))| &**id == raw_id)
            .map(|(seq, _)| *seq)?;
        requests.remove(&key).map(|(_, request)| request.session)
    }

    /// Handles one line the agent wrote to stdout.
    pub fn dispatch(&self, runtime: &Runtime, line: &[u8]) {
        if line.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        let (message, kind) = match AgentMessage::parse(line) {
            Ok(parsed) => parsed,
            Err(error) => {
                // The report goes to every connection of the agent: a long
                // line is cut to its first KiB, as an over-long one is.
                if line.len() > PREFIX_BYTES {
                    let raw = format!("{}…", String::from_utf8_lossy(&line[..PREFIX_BYTES]));
                    let error = format!("{error} (line of {} bytes, cut)", line.len());
                    self.report_unparsed(runtime, &raw, &error);
                } else {
                    self.report_unparsed(
                        runtime,
                        &String::from_utf8_lossy(line),
                        &error.to_string(),
                    );
                }
                return;
            }
        };
        // Agent lines are one line, but a bare CR inside is JSON whitespace that
        // would split an SSE `data:` line; flatten it in a copy.
        let flattened;
        let line = if protocol::has_newline(line) {
            let mut copy = line.to_vec();
            protocol::flatten_newlines(&mut copy);
            flattened = copy;
            &flattened[..]
        } else {
            line
        };
        match kind {
            Kind::Response => self.on_response(runtime, &message),
            Kind::Notification => self.on_notification(runtime, &message, line),
            Kind::Request => self.on_agent_request(runtime, &message, line),
        }
    }

    /// Reports a line that is not a JSON-RPC object to every connection of this agent.
    pub fn report_unparsed(&self, runtime: &Runtime, raw: &str, error: &str) {
        tracing::warn!(agent = %self.agent, error, "agent wrote a line that is not JSON-RPC");
        let notice = protocol::notification_line(
            AGENT_UNPARSED,
            &AgentUnparsed {
                agent: self.agent.to_string(),
                raw: raw.to_owned(),
                error: error.to_owned(),
            },
        );
        for connection in runtime.connections.of_agent(&self.agent) {
            connection.push(&notice);
        }
    }

    fn on_response(&self, runtime: &Runtime, envelope: &AgentMessage<'_>) {
        let id = envelope.id.and_then(|id| id.get().parse::<i64>().ok());
        let Some(pending) = id.and_then(|id| self.pending.lock().remove(&id)) else {
            tracing::warn!(agent = %self.agent, id = ?envelope.id.map(RawValue::get), "agent answered an unknown request id; dropped");
            return;
        };
        match pending {
            Pending::Runtime(reply) => {
                let outcome = match (envelope.result, envelope.error) {
                    (Some(result), _) => Ok(result.to_owned()),
                    (None, Some(error)) => Err(error.to_owned()),
                    (None, None) => Err(protocol::raw(&RpcError::new(
                        code::INTERNAL_ERROR,
                        "empty response",
                    ))),
                };
                let _ = reply.send(outcome);
            }
            Pending::Client {
                connection,
                client_id,
                reply,
                effect,
                session,
                ..
            } => {
                let mut result = envelope.result.map(Cow::Borrowed);
                let session = match (envelope.result, effect) {
                    (Some(raw), Effect::None) => {
                        let session = session.and_then(|id| self.live_session(runtime, &id));
                        if let Some(session) = &session
                            && let Some(hints) = hints::from_result(raw)
                        {
                            self.take_hints(runtime, session, &hints);
                        }
                        session
                    }
                    (Some(raw), Effect::SetHints(mut implied)) => {
                        let session = session.and_then(|id| self.live_session(runtime, &id));
                        if let Some(session) = &session {
                            if let Some(reported) = hints::from_result(raw) {
                                implied.merge(reported);
                            }
                            self.take_hints(runtime, session, &implied);
                        }
                        session
                    }
                    (Some(raw), effect) => {
                        let created = self.apply_effect(runtime, &connection, effect, raw);
                        if let Some(session) = &created {
                            result = Some(Cow::Owned(with_session_meta(raw, session)));
                        }
                        created
                    }
                    (None, Effect::AttachSession { session, .. }) => {
                        // The load failed: undo the early attach (see `prepare_attach`).
                        if let Some(session) = runtime.sessions.get(&session) {
                            session.detach(&connection);
                        }
                        None
                    }
                    (None, _) => session.and_then(|id| self.live_session(runtime, &id)),
                };
                let line = protocol::response_line(&client_id, result.as_deref(), envelope.error);
                if let Some(session) = session {
                    session.record(Direction::AgentToClient, Bytes::copy_from_slice(&line));
                }
                connection.release_request_id(client_id.get());
                deliver(&connection, reply, line);
            }
        }
    }

    /// Registers and attaches the session a successful `session/new` /
    /// `fork` / `load` / `resume` names, takes its hints, and flushes what was
    /// held for it. Returns the session.
    fn apply_effect(
        &self,
        runtime: &Runtime,
        connection: &Arc<Connection>,
        effect: Effect,
        result: &RawValue,
    ) -> Option<Arc<Session>> {
        let (session_id, cwd, metadata, request) = match effect {
            Effect::None | Effect::SetHints(_) => return None,
            Effect::CreateSession {
                cwd,
                metadata,
                request,
            } => match protocol::session_id_of(result) {
                Some(id) => (id, cwd, metadata, Some(request)),
                None => {
                    tracing::warn!(agent = %self.agent, "session answer without a sessionId");
                    return None;
                }
            },
            Effect::AttachSession { session, cwd } => (session, cwd, Map::new(), None),
        };
        let session = runtime.sessions.insert(
            &session_id,
            self.agent.clone(),
            self.generation,
            cwd,
            metadata,
        );
        if let Some(request) = request {
            session.record(Direction::ClientToAgent, request);
        }
        self.take_hints(runtime, &session, &hints::from_session_result(result));
        if !connection.is_closed() {
            session.attach(connection);
            let delivered = self.flush_held(&session, connection);
            self.deliver_waiting_requests(&session, connection, &delivered);
        }
        Some(session)
    }

    fn take_hints(&self, runtime: &Runtime, session: &Session, hints: &hints::Hints) {
        if !hints.is_empty() {
            session.apply_hints(hints);
            runtime.agents.report_hints(&self.agent, hints);
        }
    }

    /// Attaches `connection` to a known live session of this process before a
    /// `session/load` / `session/resume` is answered, so the history the agent
    /// replays during the load reaches it. Undone if the load fails.
    pub fn prepare_attach(&self, runtime: &Runtime, connection: &Arc<Connection>, session: &str) {
        if let Some(session) = runtime.sessions.get(session)
            && session.process_generation == self.generation
            && !session.is_ended()
        {
            session.attach(connection);
        }
    }

    fn on_notification(&self, runtime: &Runtime, envelope: &AgentMessage<'_>, line: &[u8]) {
        if envelope.method() == method::CANCEL_REQUEST {
            self.on_agent_cancel(runtime, envelope, line);
            return;
        }
        let Some(session_id) = envelope.session_id() else {
            for connection in runtime.connections.of_agent(&self.agent) {
                connection.push(line);
            }
            return;
        };
        match self.live_session(runtime, session_id) {
            Some(session) => {
                if envelope.method() == method::SESSION_UPDATE
                    && let Some(kind) = envelope.update_kind()
                    && let Some(hints) = hints::from_update(kind, line)
                {
                    self.take_hints(runtime, &session, &hints);
                }
                session.record_and_deliver(Direction::AgentToClient, Bytes::copy_from_slice(line));
            }
            None => self.hold(session_id.into(), line, None),
        }
    }

    /// The agent withdraws one of its requests: only the connections that got
    /// it hear about it, and a later answer is dropped.
    fn on_agent_cancel(&self, runtime: &Runtime, envelope: &AgentMessage<'_>, line: &[u8]) {
        let Some(request_id) = envelope.cancelled_request_id() else {
            return;
        };
        let Some(session) = self.take_agent_request(request_id.get()) else {
            return;
        };
        let targets = match session.and_then(|id| self.live_session(runtime, &id)) {
            Some(session) => {
                session.record_and_targets(Direction::AgentToClient, Bytes::copy_from_slice(line))
            }
            None => self.last_requester.lock().upgrade().into_iter().collect(),
        };
        for connection in targets {
            connection.push(line);
        }
    }

    /// The agent-side id of `connection`'s in-flight request `client_id`
    /// (raw JSON text), to translate a client's `$/cancel_request`.
    pub fn agent_id_of(&self, connection: &Connection, client_id: &str) -> Option<i64> {
        self.pending
            .lock()
            .iter()
            .find_map(|(id, pending)| match pending {
                Pending::Client {
                    connection: c,
                    client_id: cid,
                    ..
                } if std::ptr::eq(c.as_ref(), connection) && cid.get() == client_id => Some(*id),
                _ => None,
            })
    }

    fn on_agent_request(&self, runtime: &Runtime, envelope: &AgentMessage<'_>, line: &[u8]) {
        let Some(raw_id) = envelope.id.map(|id| Box::<str>::from(id.get())) else {
            return;
        };
        let method = envelope.method();
        let session_id: Option<Arc<str>> = envelope.session_id().map(Into::into);
        let line = Bytes::copy_from_slice(line);
        let Some(session_id) = session_id else {
            // No session: exactly one connection, the most recent requester.
            let target = self
                .last_requester
                .lock()
                .upgrade()
                .filter(|c| !c.is_closed());
            match target {
                Some(connection) if connection.capabilities.allows(method) => {
                    self.remember_agent_request(&raw_id, None, method, line.clone());
                    connection.push(&line);
                }
                _ => self.answer_method_not_found(envelope, method),
            }
            return;
        };
        self.remember_agent_request(&raw_id, Some(session_id.clone()), method, line.clone());
        let Some(session) = self.live_session(runtime, &session_id) else {
            self.hold(session_id, &line, Some(raw_id));
            return;
        };
        let attached = session.record_and_targets(Direction::AgentToClient, line.clone());
        if attached.is_empty() {
            // Waits until a connection attaches (`deliver_waiting_requests`).
            return;
        }
        let allowed: Vec<_> = attached
            .iter()
            .filter(|c| c.capabilities.allows(method))
            .collect();
        if allowed.is_empty() {
            self.take_agent_request(&raw_id);
            self.answer_method_not_found(envelope, method);
            return;
        }
        for connection in allowed {
            connection.push(&line);
        }
    }

    fn remember_agent_request(
        &self,
        raw_id: &str,
        session: Option<Arc<str>>,
        method: &str,
        line: Bytes,
    ) {
        let seq = self.agent_request_seq.fetch_add(1, Ordering::Relaxed);
        self.agent_requests.lock().insert(
            seq,
            (
                raw_id.into(),
                AgentRequest {
                    session,
                    method: method.into(),
                    line,
                },
            ),
        );
    }

    /// Answers an agent request with "method not found" on the client's behalf
    /// (DESIGN.md section 4: capabilities the client did not declare).
    fn answer_method_not_found(&self, envelope: &AgentMessage<'_>, method: &str) {
        let Some(id) = envelope.id else { return };
        let error = RpcError::new(
            code::METHOD_NOT_FOUND,
            format!("method not found: {method} (no attached client declared this capability)"),
        );
        let mut line = protocol::error_response_line(id, &error);
        line.push(b'\n');
        if self.stdin.try_send(Bytes::from(line)).is_err() {
            tracing::warn!(agent = %self.agent, "cannot answer agent request: stdin queue full or closed");
        }
    }

    /// The session if it is hosted by this process (an entry from an earlier
    /// process generation counts as unknown: a reload on a new process may
    /// revive it).
    fn live_session(&self, runtime: &Runtime, id: &str) -> Option<Arc<Session>> {
        runtime
            .sessions
            .get(id)
            .filter(|s| s.process_generation == self.generation)
    }

    fn hold(&self, session: Arc<str>, line: &[u8], request_id: Option<Box<str>>) {
        let mut held = self.held.lock();
        let now = Instant::now();
        while let Some(front) = held.front() {
            if held.len() < HELD_MAX && now.duration_since(front.at) < HELD_TTL {
                break;
            }
            tracing::warn!(agent = %self.agent, session = %front.session, "dropping a message held for a session nobody owns");
            held.pop_front();
        }
        held.push_back(Held {
            at: now,
            session,
            line: Bytes::copy_from_slice(line),
            request_id,
        });
    }

    /// Delivers held messages of `session` to `connection` in their original
    /// order; returns the raw ids of the agent requests among them.
    fn flush_held(&self, session: &Session, connection: &Connection) -> HashSet<Box<str>> {
        let mut held = self.held.lock();
        if held.is_empty() {
            return HashSet::new();
        }
        let now = Instant::now();
        let mut delivered = HashSet::new();
        held.retain_mut(|message| {
            if *message.session != *session.id {
                return true;
            }
            if now.duration_since(message.at) < HELD_TTL {
                session.record(Direction::AgentToClient, message.line.clone());
                connection.push(&message.line);
                if let Some(id) = message.request_id.take() {
                    delivered.insert(id);
                }
            }
            false
        });
        delivered
    }

    /// Delivers the unanswered agent requests of `session` to a connection
    /// that just attached, except those in `skip`.
    fn deliver_waiting_requests(
        &self,
        session: &Session,
        connection: &Connection,
        skip: &HashSet<Box<str>>,
    ) {
        let mut refused = Vec::new();
        {
            let requests = self.agent_requests.lock();
            for (id, request) in requests.values() {
                if request.session.as_deref() != Some(&*session.id) || skip.contains(id) {
                    continue;
                }
                if connection.capabilities.allows(&request.method) {
                    connection.push(&request.line);
                } else {
                    refused.push(request.line.clone());
                }
            }
        }
        for line in refused {
            if let Ok((envelope, _)) = AgentMessage::parse(&line) {
                if let Some(id) = envelope.id {
                    self.take_agent_request(id.get());
                }
                self.answer_method_not_found(&envelope, envelope.method());
            }
        }
    }

    /// Answers this session's pending `session/prompt` requests with stop
    /// reason `cancelled` on the agent's behalf (a terminated session whose
    /// agent did not end the turn); the agent's later answers are dropped.
    /// Returns how many.
    pub fn abandon_prompts(&self, runtime: &Runtime, session_id: &str) -> usize {
        let abandoned: Vec<Pending> = {
            let mut pending = self.pending.lock();
            let ids: Vec<i64> = pending
                .iter()
                .filter(|(_, p)| {
                    matches!(p, Pending::Client { prompt: true, session: Some(s), .. } if **s == *session_id)
                })
                .map(|(id, _)| *id)
                .collect();
            ids.iter().filter_map(|id| pending.remove(id)).collect()
        };
        let count = abandoned.len();
        let session = self.live_session(runtime, session_id);
        for pending in abandoned {
            if let Pending::Client {
                connection,
                client_id,
                reply,
                ..
            } = pending
            {
                let line = protocol::result_response_line(
                    &client_id,
                    &serde_json::json!({ "stopReason": "cancelled" }),
                );
                if let Some(session) = &session {
                    session.record(Direction::AgentToClient, Bytes::copy_from_slice(&line));
                }
                connection.release_request_id(client_id.get());
                deliver(&connection, reply, line);
            }
        }
        count
    }

    /// Fails every pending request (the process is gone) and ends the live
    /// sessions it hosted, telling their connections with
    /// `_sandboxagent/session/ended`.
    pub fn finish(&self, runtime: &Runtime, exit: ExitInfo) {
        *self.exit.lock() = Some(exit);
        self.exited.cancel();
        let stderr = self.stderr.lock().summary();
        let message = format!("agent process exited ({})", exit.describe());
        let error =
            RpcError::new(code::INTERNAL_ERROR, message.clone()).with_data(serde_json::json!({
                "agent": &*self.agent,
                "exitCode": exit.code,
                "signal": exit.signal,
                "stderr": &stderr,
            }));
        let pending: Vec<_> = self.pending.lock().drain().map(|(_, p)| p).collect();
        for pending in pending {
            match pending {
                Pending::Client {
                    connection,
                    client_id,
                    reply,
                    ..
                } => {
                    connection.release_request_id(client_id.get());
                    deliver(
                        &connection,
                        reply,
                        protocol::error_response_line(&client_id, &error),
                    );
                }
                // Dropping the sender tells the runtime's caller the process is gone.
                Pending::Runtime(_) => {}
            }
        }
        self.agent_requests.lock().clear();
        self.held.lock().clear();
        for session in runtime
            .sessions
            .live_of_process(&self.agent, self.generation)
        {
            let reason = if exit.code == Some(0) {
                EndReason::Completed
            } else {
                EndReason::Error
            };
            let Some(attached) = session.end(reason) else {
                continue;
            };
            let notice = protocol::notification_line(
                SESSION_ENDED,
                &SessionEnded {
                    session_id: session.id.to_string(),
                    reason,
                    terminated_by: TerminatedBy::Agent,
                    message: Some(message.clone()),
                    exit_code: exit.code,
                    stderr: Some(stderr.clone()),
                },
            );
            session.record(Direction::AgentToClient, Bytes::copy_from_slice(&notice));
            for connection in attached {
                connection.push(&notice);
            }
        }
    }
}

/// How an agent process ended.
#[derive(Debug, Clone, Copy, Default)]
pub struct ExitInfo {
    /// Exit code, when it exited normally.
    pub code: Option<i32>,
    /// Signal number, when a signal ended it.
    pub signal: Option<i32>,
}

impl ExitInfo {
    /// "exit code N", "signal N" or "unknown status".
    pub fn describe(&self) -> String {
        match (self.code, self.signal) {
            (Some(code), _) => format!("exit code {code}"),
            (None, Some(signal)) => format!("signal {signal}"),
            (None, None) => "unknown status".to_owned(),
        }
    }
}

/// `result` with the session's `_meta["sandboxagent.dev"]` entry added.
fn with_session_meta(result: &RawValue, session: &Session) -> Box<RawValue> {
    let Ok(mut value) = serde_json::from_str::<Value>(result.get()) else {
        return result.to_owned();
    };
    let entries = match serde_json::to_value(session.meta()) {
        Ok(Value::Object(entries)) => entries,
        _ => return result.to_owned(),
    };
    if ext_methods::meta::inject(&mut value, entries) {
        protocol::raw(&value)
    } else {
        result.to_owned()
    }
}

/// Hands a response to the waiting POST, or, when its HTTP caller is gone (or
/// timed out), appends it to the connection's SSE stream so nothing is lost.
fn deliver(connection: &Connection, reply: oneshot::Sender<Bytes>, line: Vec<u8>) {
    if let Err(line) = reply.send(Bytes::from(line)) {
        connection.push(&line);
    }
}
