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

use super::process::{StderrCapture, StderrSummary};
use crate::connection::Connection;
use crate::protocol::{
    self, AGENT_UNPARSED, Envelope, Kind, RpcError, SESSION_ENDED, code, method,
};
use crate::runtime::Runtime;
use crate::session::Session;
use bytes::Bytes;
use parking_lot::Mutex;
use serde::Serialize;
use serde_json::value::RawValue;
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
    },
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

    /// Takes the client's answer to agent request `raw_id` if it is still
    /// unanswered; `false` when it was answered already or never existed (the
    /// caller drops the answer: exactly one answer reaches the agent).
    pub fn take_agent_request(&self, raw_id: &str) -> bool {
        let mut requests = self.agent_requests.lock();
        let key = requests
            .iter()
            .find(|(_, (id, _))| &**id == raw_id)
            .map(|(seq, _)| *seq);
        key.and_then(|seq| requests.remove(&seq)).is_some()
    }

    /// Handles one line the agent wrote to stdout.
    pub fn dispatch(&self, runtime: &Runtime, line: &[u8]) {
        if line.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        let (envelope, kind) = match Envelope::parse(line, false) {
            Ok(parsed) => parsed,
            Err(error) => {
                self.report_unparsed(runtime, &String::from_utf8_lossy(line), &error.to_string());
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
            Kind::Response => self.on_response(runtime, &envelope),
            Kind::Notification => self.on_notification(runtime, &envelope, line),
            Kind::Request => self.on_agent_request(runtime, &envelope, line),
        }
    }

    /// Reports a line that is not a JSON-RPC object to every connection of this agent.
    pub fn report_unparsed(&self, runtime: &Runtime, raw: &str, error: &str) {
        tracing::warn!(agent = %self.agent, error, "agent wrote a line that is not JSON-RPC");
        #[derive(Serialize)]
        struct Unparsed<'a> {
            agent: &'a str,
            raw: &'a str,
            error: &'a str,
        }
        let notice = protocol::notification_line(
            AGENT_UNPARSED,
            &Unparsed {
                agent: &self.agent,
                raw,
                error,
            },
        );
        for connection in runtime.connections.of_agent(&self.agent) {
            connection.push(&notice);
        }
    }

    fn on_response(&self, runtime: &Runtime, envelope: &Envelope<'_>) {
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
            } => {
                if let Some(result) = envelope.result {
                    self.apply_effect(runtime, &connection, effect, result);
                } else if let Effect::AttachSession { session, .. } = &effect
                    && let Some(session) = runtime.sessions.get(session)
                {
                    // The load failed: undo the early attach (see `prepare_attach`).
                    session.detach(&connection);
                }
                let line = protocol::response_line(&client_id, envelope.result, envelope.error);
                connection.release_request_id(client_id.get());
                deliver(&connection, reply, line);
            }
        }
    }

    fn apply_effect(
        &self,
        runtime: &Runtime,
        connection: &Arc<Connection>,
        effect: Effect,
        result: &RawValue,
    ) {
        let (session_id, cwd) = match effect {
            Effect::None => return,
            Effect::CreateSession { cwd } => match protocol::session_id_of(result) {
                Some(id) => (id, cwd),
                None => {
                    tracing::warn!(agent = %self.agent, "session answer without a sessionId");
                    return;
                }
            },
            Effect::AttachSession { session, cwd } => (session, cwd),
        };
        let session =
            runtime
                .sessions
                .insert(&session_id, self.agent.clone(), self.generation, cwd);
        if connection.is_closed() {
            return;
        }
        session.attach(connection);
        let delivered = self.flush_held(&session, connection);
        self.deliver_waiting_requests(&session, connection, &delivered);
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

    fn on_notification(&self, runtime: &Runtime, envelope: &Envelope<'_>, line: &[u8]) {
        let Some(session_id) = envelope.session_id() else {
            for connection in runtime.connections.of_agent(&self.agent) {
                connection.push(line);
            }
            return;
        };
        match self.live_session(runtime, &session_id) {
            Some(session) => {
                if envelope.method() == method::SESSION_UPDATE {
                    session.touch();
                }
                for connection in session.attached() {
                    connection.push(line);
                }
            }
            None => self.hold(session_id.into(), line, None),
        }
    }

    fn on_agent_request(&self, runtime: &Runtime, envelope: &Envelope<'_>, line: &[u8]) {
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
        let attached = session.attached();
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
    fn answer_method_not_found(&self, envelope: &Envelope<'_>, method: &str) {
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
            if let Ok((envelope, _)) = Envelope::parse(&line, false) {
                if let Some(id) = envelope.id {
                    self.take_agent_request(id.get());
                }
                self.answer_method_not_found(&envelope, envelope.method());
            }
        }
    }

    /// Fails every pending request (the process is gone) and ends the live
    /// sessions it hosted, telling their connections with
    /// `_sandboxagent/session/ended`.
    pub fn finish(&self, runtime: &Runtime, exit: ExitInfo) {
        *self.exit.lock() = Some(exit);
        self.exited.cancel();
        let stderr = self.stderr.lock().summary();
        let error = RpcError::new(
            code::INTERNAL_ERROR,
            format!("agent process exited ({})", exit.describe()),
        )
        .with_data(serde_json::json!({
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
            let Some(attached) = session.end() else {
                continue;
            };
            let notice = protocol::notification_line(
                SESSION_ENDED,
                &SessionEnded {
                    session_id: &session.id,
                    reason: if exit.code == Some(0) {
                        "completed"
                    } else {
                        "error"
                    },
                    terminated_by: "agent",
                    message: format!("agent process exited ({})", exit.describe()),
                    exit_code: exit.code,
                    stderr: &stderr,
                },
            );
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

/// `_sandboxagent/session/ended` params (DESIGN.md section 5).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SessionEnded<'a> {
    session_id: &'a str,
    reason: &'static str,
    terminated_by: &'static str,
    message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    exit_code: Option<i32>,
    stderr: &'a StderrSummary,
}

/// Hands a response to the waiting POST, or, when its HTTP caller is gone (or
/// timed out), appends it to the connection's SSE stream so nothing is lost.
fn deliver(connection: &Connection, reply: oneshot::Sender<Bytes>, line: Vec<u8>) {
    if let Err(line) = reply.send(Bytes::from(line)) {
        connection.push(&line);
    }
}
