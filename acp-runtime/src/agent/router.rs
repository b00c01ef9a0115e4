//! The routing table of one agent process (research/contract.md, "Routing:
//! connections, sessions, one agent process").
//!
//! Toward the agent, every client request gets a fresh integer id from this
//! process's counter; the pending table maps it back to the connection and the
//! client's own id (kept as raw JSON, so it round-trips exactly). From the
//! agent, the stdout loop ([`super::process::read_stdout`]) hands each line to
//! [`Router::dispatch`] in order: notifications and agent requests go to the
//! connections attached to their session; responses go back to the waiting
//! POST, or to the connection's SSE stream when the POST is gone. Because
//! lines are handled strictly in the order the agent wrote them, every
//! notification written before a response is in the connection's ring before
//! the response is released. An error answer to a client's request is
//! held a moment for the agent's stderr ([`Deferred::AgentError`]) and
//! relayed with the lines written since the request and, where it applies,
//! a hint ([`super::error_data`]; research/contract.md, "Agent errors:
//! stderr and hint").
//!
//! A router reaches the rest of the server only through [`RouteTargets`]
//! (the session inventory and the open connections) and its agent's
//! [`ReportedHints`], so it can be built, and tested, without a server.

use super::client_side::ClientSide;
use super::error_data;
use super::exit::ExitInfo;
use super::framing::PREFIX_BYTES;
use super::stdio::StderrCapture;
use crate::elicitation::{self, CompleteTarget, Question, UrlQuestions};
use crate::log_limit::{LogLimit, WARN_INTERVAL};
use crate::metrics::{self, GaugeGuard, Metrics};
use crate::otel;
use crate::protocol::{self, AgentMessage, Kind, RpcError, code, method};
use crate::state::connection::{ClientCapabilities, Connection};
use crate::state::connections::Connections;
use crate::state::hints::{self, Hints};
use crate::state::session::{Session, Sessions};
use crate::store::share::Share;
use crate::store::writer::{self, Persist};
use bytes::Bytes;
use ext_methods::notification::AGENT_UNPARSED;
use ext_methods::notification::REQUEST_RESOLVED;
use ext_methods::{
    AgentUnparsed, Direction, EndReason, ModelInfo, RequestResolved, Role, SessionEnded,
    StderrExcerpt, TerminatedBy,
};
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
use tracing::Span;

/// Messages held for sessions whose owner is not known yet
/// (research/contract.md, "Routing: connections, sessions, one agent
/// process"): at most this many …
const HELD_MAX: usize = 256;
/// … and for at most this long.
const HELD_TTL: Duration = Duration::from_secs(5);
/// Open agent requests one process may have (research/contract.md,
/// "Routing"): past it a new one is answered at once, as cancelled.
pub const AGENT_REQUESTS_MAX: usize = 1024;
/// How often the stdout loop looks for open requests whose only
/// connections closed and for held messages past their TTL
/// ([`Router::sweep`]).
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// What a router delivers to outside its own process: the server-wide
/// session inventory and the open connections. Every process of every agent
/// gets a clone (two `Arc`s).
#[derive(Debug, Clone)]
pub struct RouteTargets {
    /// Every session, across agents and connections.
    pub sessions: Arc<Sessions>,
    /// The open client connections.
    pub connections: Arc<Connections>,
    /// The agents' file and terminal requests answered in the sandbox
    /// (`None`: every such request goes to the connections, as any other).
    pub client_side: Option<Arc<ClientSide>>,
    /// Where prompt turns and permission requests are counted.
    pub(crate) metrics: Arc<Metrics>,
}

/// The models and modes an agent reported in any of its sessions (for
/// `GET /v2/agents` and `_sandboxagent/session/list_models` on an agent).
/// One per agent id, shared by its successive processes.
#[derive(Debug, Default)]
pub struct ReportedHints {
    /// The newest model list the agent reported.
    pub models: Option<Vec<ModelInfo>>,
    /// The newest mode list (ACP `SessionMode` objects).
    pub modes: Option<Vec<Value>>,
}

impl ReportedHints {
    fn take(&mut self, hints: &Hints) {
        if let Some(models) = &hints.models {
            self.models = Some(models.clone());
        }
        if let Some(modes) = &hints.modes {
            self.modes = Some(modes.clone());
        }
    }
}

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
    SetHints(Hints),
    /// `session/load`, `session/resume`: attach the requesting connection to
    /// `params.sessionId`.
    AttachSession {
        /// The session id from the request.
        session: String,
        /// `params.cwd` of the request.
        cwd: Option<String>,
        /// The client's request: the event log gets it before the history
        /// the agent replays when the session was not live (a dormant one,
        /// or one of an earlier process), as it does for a live one.
        request: Bytes,
    },
}

/// A client's request waiting for the agent's answer, which goes back with
/// the client's own id.
struct ClientRequest {
    connection: Arc<Connection>,
    client_id: Box<RawValue>,
    reply: oneshot::Sender<Bytes>,
    effect: Effect,
    /// `params.sessionId`: the answer goes to that session's event log.
    session: Option<Arc<str>>,
    /// A `session/prompt`, which terminate may answer on the agent's behalf.
    prompt: bool,
    /// When it was forwarded: a prompt turn's duration counts from here.
    sent_at: Instant,
    /// Stderr lines the process had written when the request was forwarded:
    /// an error answer carries only the lines after it.
    stderr_mark: u64,
    /// An error answer gets the root hint ([`Router::root_hint`] and a
    /// `session/new` or `session/load`).
    hint_on_error: bool,
    /// A `session/prompt`'s turn span while tracing is on
    /// (research/contract.md, "Traces").
    turn: Option<TracedTurn>,
}

/// A prompt turn's `invoke_agent` span and the session whose tool calls
/// and permission waits it parents: however the request ends (answered,
/// the process gone, the session ended), dropping it ends the session's
/// turn trace with it, so no span outlives its turn.
struct TracedTurn {
    span: tracing::Span,
    session: Weak<Session>,
}

impl Drop for TracedTurn {
    fn drop(&mut self) {
        if let Some(session) = self.session.upgrade() {
            session.turn_trace.lock().end(&self.span);
        }
    }
}

/// A request waiting for the agent's answer.
enum Pending {
    /// A client's request (boxed: it is most of the table's entries' size).
    Client(Box<ClientRequest>),
    /// The runtime's own request (its `initialize`): the raw result, or the
    /// raw error object.
    Runtime(oneshot::Sender<Result<Box<RawValue>, Box<RawValue>>>),
}

/// An agent-initiated request no client has answered yet.
struct AgentRequest {
    session: Option<Arc<str>>,
    method: Box<str>,
    /// The mode of a question (`elicitation/create`), which a connection
    /// must have declared to get it.
    mode: Option<elicitation::Mode>,
    /// The runtime's id of the client request a request-scoped question
    /// belongs to: answered `cancel` once that request is.
    scope: Option<i64>,
    line: Bytes,
    /// The connections it was pushed to: an agent's `$/cancel_request` goes
    /// to them, and none gets it twice.
    targets: Vec<Arc<Connection>>,
    /// Counts a permission request in `permission_requests_pending` until
    /// the entry goes, however it goes.
    _pending: Option<GaugeGuard>,
    /// A permission request's span (research/contract.md, "Traces"),
    /// ended with the entry; [`tracing::Span::none`] otherwise.
    _span: tracing::Span,
}

/// An agent request a client answered first: who else must hear that it
/// is resolved ([`Router::announce_resolved`]).
#[derive(Debug)]
pub struct Answered {
    /// The request's session.
    pub session: Option<Arc<str>>,
    /// The agent's id of the request (raw JSON).
    pub raw_id: Box<str>,
}

/// A message held until its session's owner is known.
struct Held {
    at: Instant,
    session: Arc<str>,
    line: Bytes,
    /// Raw id when the message is an agent request.
    request_id: Option<Box<str>>,
}

/// The warnings an agent can trigger once per message it writes, each
/// rate-limited ([`crate::log_limit`]): a flood of them costs a few log
/// lines, not one per message.
#[derive(Debug)]
struct Warnings {
    unparsed: LogLimit,
    unknown_id: LogLimit,
    held_dropped: LogLimit,
    no_session_id: LogLimit,
    stdin_full: LogLimit,
    too_many_requests: LogLimit,
}

impl Warnings {
    fn new(agent: &Arc<str>) -> Self {
        let summary = |what: &'static str| {
            let agent = agent.clone();
            LogLimit::new(WARN_INTERVAL, move |count, interval| {
                let seconds = interval.as_secs();
                tracing::warn!(agent = %agent, count, "{what}: {count} more in the last {seconds} s");
            })
        };
        Self {
            unparsed: summary("agent wrote lines that are not JSON-RPC"),
            unknown_id: summary("agent answered unknown request ids; dropped"),
            held_dropped: summary("dropped messages held for sessions nobody owns"),
            no_session_id: summary("session answers without a sessionId"),
            stdin_full: summary("cannot answer agent requests: stdin queue full or closed"),
            too_many_requests: summary("agent requests answered as cancelled: too many open"),
        }
    }
}

/// Why the agent could not take a message.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The process exited (or its stdin closed).
    #[error("agent process exited")]
    Exited,
}

/// The routing table of one agent process: requests in flight both ways,
/// messages held for sessions not yet owned, and the handles to deliver to.
/// Shared by the request handlers (client → agent) and the stdout loop
/// (agent → client).
pub struct Router {
    /// Agent id.
    agent: Arc<str>,
    /// The process generation; sessions it hosts carry the same number.
    generation: u64,
    /// Complete lines for the agent's stdin.
    stdin: mpsc::Sender<Bytes>,
    /// Where messages go.
    targets: RouteTargets,
    /// The agent's reported models and modes (agent-wide).
    reported: Arc<Mutex<ReportedHints>>,
    /// Cancelled when the process is gone; nothing more is sent then.
    exited: CancellationToken,
    /// Source of the ids the runtime puts on requests to the agent.
    next_id: AtomicI64,
    /// Requests sent to the agent and not answered yet, by runtime id.
    pending: Mutex<HashMap<i64, Pending>>,
    /// Agent requests not answered yet, by arrival number: (raw id, request).
    agent_requests: Mutex<BTreeMap<u64, (Box<str>, AgentRequest)>>,
    /// Arrival counter for `agent_requests`.
    agent_request_seq: AtomicU64,
    /// Messages for sessions whose owner is not known yet.
    held: Mutex<VecDeque<Held>>,
    /// The connection that sent this agent its most recent request.
    last_requester: Mutex<Weak<Connection>>,
    /// Where the `elicitation/complete` of each URL-mode question goes.
    url_questions: Mutex<UrlQuestions<Arc<Connection>>>,
    /// Rate limits of the per-message warnings.
    warnings: Warnings,
    /// The store's writer and this agent's share of its queue (`None` with
    /// `--store memory`): the stdout reader waits on it under a flood.
    store: Option<(Arc<Persist>, Arc<Share>)>,
    /// The client capabilities the runtime declared to this process and
    /// answers itself ([`ClientSide::declare`]) unless a connection takes
    /// them.
    served: ClientCapabilities,
    /// The process's stderr, whose lines since a request its error answer
    /// carries (`None`: none are added; routers without a process).
    stderr: Option<Arc<StderrCapture>>,
    /// The server runs as root without `--agent-user`: a failed
    /// `session/new` or `session/load` carries the hint that this may be
    /// why (research/contract.md, "Agent errors: stderr and hint").
    root_hint: bool,
}

/// A client's answer held until every event before it is committed to the
/// store: what [`Router::dispatch`] returns for a `session/prompt` answer
/// when a store is on (research/contract.md, "Durable sessions": an answer
/// a client has seen is durable). Deliver it before reading the agent's
/// next line, so nothing overtakes it.
#[must_use = "the answer reaches the client only through `deliver`"]
pub struct DurableAnswer {
    committed: oneshot::Receiver<()>,
    request: ClientRequest,
    line: Bytes,
}

impl DurableAnswer {
    /// Waits for the commit (at most [`writer::DURABLE_WAIT`]; at once when
    /// the store turns degraded), then sends the answer to the client.
    pub async fn deliver(self) {
        writer::until_committed(Some(self.committed)).await;
        deliver(self.request, self.line);
    }
}

impl std::fmt::Debug for DurableAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DurableAnswer").finish_non_exhaustive()
    }
}

/// An agent's error answer to a client's request, held until the stderr
/// reader caught up (see [`error_data::settle`]): what [`Router::dispatch`]
/// returns for one when the process's stderr is captured.
#[must_use = "the answer reaches the client only through `deliver`"]
pub struct AgentErrorAnswer {
    request: ClientRequest,
    /// The agent's error object, as written.
    error: Box<RawValue>,
}

impl std::fmt::Debug for AgentErrorAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentErrorAnswer").finish_non_exhaustive()
    }
}

/// An answer [`Router::dispatch`] could not release at once. Deliver it
/// before reading the agent's next line, so nothing overtakes it.
#[derive(Debug)]
#[must_use = "the answer reaches the client only through `deliver`"]
pub enum Deferred {
    /// A `session/prompt` answer waiting for the store.
    Durable(DurableAnswer),
    /// An error answer waiting for the agent's stderr.
    AgentError(AgentErrorAnswer),
}

impl Deferred {
    /// Completes the answer (its stderr, the store's commit) and sends it
    /// to the client; `router` is the one that returned it.
    pub async fn deliver(self, router: &Router) {
        let durable = match self {
            Deferred::Durable(answer) => Some(answer),
            Deferred::AgentError(answer) => router.complete_error(answer).await,
        };
        if let Some(answer) = durable {
            answer.deliver().await;
        }
    }
}

/// Sends `line`, the answer to `request`, to the waiting POST, or to the
/// connection's SSE stream when the POST is gone (or timed out), so nothing
/// is lost.
fn deliver(request: ClientRequest, line: Bytes) {
    request
        .connection
        .release_request_id(request.client_id.get());
    if let Err(line) = request.reply.send(line) {
        // An answer has no `params`: the connection's own lane.
        request.connection.push(line, None);
    }
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router")
            .field("agent", &self.agent)
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

impl Router {
    /// An empty table for process `generation` of `agent`, writing to
    /// `stdin`; `exited` is cancelled when the process is gone.
    pub fn new(
        agent: Arc<str>,
        generation: u64,
        stdin: mpsc::Sender<Bytes>,
        targets: RouteTargets,
        reported: Arc<Mutex<ReportedHints>>,
        exited: CancellationToken,
    ) -> Self {
        let warnings = Warnings::new(&agent);
        let store = targets
            .sessions
            .store()
            .map(|persist| (persist.clone(), persist.share(&agent)));
        Self {
            agent,
            generation,
            stdin,
            targets,
            reported,
            exited,
            next_id: AtomicI64::new(1),
            pending: Mutex::new(HashMap::new()),
            agent_requests: Mutex::new(BTreeMap::new()),
            url_questions: Mutex::new(UrlQuestions::default()),
            agent_request_seq: AtomicU64::new(0),
            held: Mutex::new(VecDeque::new()),
            last_requester: Mutex::new(Weak::new()),
            warnings,
            store,
            served: ClientCapabilities::default(),
            stderr: None,
            root_hint: false,
        }
    }

    /// Makes this process's error answers carry its stderr lines written
    /// since each request was forwarded (research/contract.md, "Agent
    /// errors: stderr and hint").
    pub fn set_stderr(&mut self, stderr: Arc<StderrCapture>) {
        self.stderr = Some(stderr);
    }

    /// Makes a failed `session/new` or `session/load` carry the hint that
    /// the server runs as root without `--agent-user`.
    pub fn set_root_hint(&mut self, root_hint: bool) {
        self.root_hint = root_hint;
    }

    /// Makes the runtime answer this process's file and terminal requests
    /// in `served` ([`ClientSide::declare`]) when no connection takes them;
    /// nothing without `targets.client_side`.
    pub fn set_served(&mut self, served: ClientCapabilities) {
        if self.targets.client_side.is_some() {
            self.served = served;
        }
    }

    /// Waits while the store's writer is behind on this agent's events and
    /// the store is healthy (see [`Persist::wait_for_room`]); the stdout
    /// reader calls it before each line. At once in the common case.
    pub async fn wait_for_store(&self) {
        if let Some((persist, share)) = &self.store {
            persist.wait_for_room(share).await;
        }
    }

    /// Sends a request with a fresh agent-side id and files `pending` under
    /// it: the one path for the client's requests and the runtime's own.
    async fn submit(
        &self,
        method: &str,
        params: Option<&RawValue>,
        pending: Pending,
    ) -> Result<(), SendError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut line = protocol::agent_request_line(id, method, params);
        line.push(b'\n');
        self.pending.lock().insert(id, pending);
        if self.stdin.send(Bytes::from(line)).await.is_err() || self.exited.is_cancelled() {
            self.pending.lock().remove(&id);
            return Err(SendError::Exited);
        }
        Ok(())
    }

    /// Sends a client's request with a fresh agent-side id. The receiver gets
    /// the agent's answer with the client's id restored (or a JSON-RPC error
    /// if the process exits first). `span` is the request's (research/contract.md,
    /// "Traces"; [`Span::none`] while tracing is off).
    ///
    /// # Errors
    /// [`SendError::Exited`] when the process is gone.
    // The request's members, what its answer does, its session and span:
    // one caller (`Runtime::forward`), which has each at hand.
    #[allow(clippy::too_many_arguments)]
    pub async fn send_request(
        &self,
        connection: &Arc<Connection>,
        client_id: &RawValue,
        method: &str,
        params: Option<&RawValue>,
        effect: Effect,
        session: Option<Arc<str>>,
        span: &Span,
    ) -> Result<oneshot::Receiver<Bytes>, SendError> {
        let (reply, receiver) = oneshot::channel();
        *self.last_requester.lock() = Arc::downgrade(connection);
        let prompt = method == method::SESSION_PROMPT;
        let live = if prompt {
            session.as_deref().and_then(|id| self.live_session(id))
        } else {
            None
        };
        let (turn, traced_params) =
            self.trace_request(span, prompt, session.as_deref(), live.as_ref(), params);
        let params = traced_params.as_deref().or(params);
        let request = ClientRequest {
            connection: connection.clone(),
            client_id: client_id.to_owned(),
            reply,
            effect,
            session,
            prompt,
            sent_at: Instant::now(),
            stderr_mark: self.stderr.as_ref().map_or(0, |stderr| stderr.count()),
            hint_on_error: self.root_hint
                && (method == method::SESSION_NEW || method == method::SESSION_LOAD),
            turn,
        };
        if let Some(session) = live {
            session.turn_clock.start();
        }
        self.submit(method, params, Pending::Client(Box::new(request)))
            .await?;
        Ok(receiver)
    }

    /// The spans of a client request about to be forwarded, while tracing
    /// is on (research/contract.md, "Traces"): a prompt's `invoke_agent`
    /// span (under the request's span `span`, and leading `live`'s tool
    /// calls and permission waits), and `params` with the trace context of
    /// that span (any other request: `span`) in `_meta`, for the agent.
    /// `(None, None)` at the cost of one check when tracing is off.
    fn trace_request(
        &self,
        span: &Span,
        prompt: bool,
        session: Option<&str>,
        live: Option<&Arc<Session>>,
        params: Option<&RawValue>,
    ) -> (Option<TracedTurn>, Option<Box<RawValue>>) {
        if !otel::enabled() {
            return (None, None);
        }
        if !prompt {
            return (None, otel::with_trace_meta(span, params));
        }
        let span = otel::invoke_agent(span, &self.agent, session);
        let traced_params = otel::with_trace_meta(&span, params);
        if let Some(live) = live {
            live.turn_trace.lock().begin(&span);
        }
        let turn = TracedTurn {
            span,
            session: live.map_or_else(Weak::new, Arc::downgrade),
        };
        (Some(turn), traced_params)
    }

    /// Sends the runtime's own request and waits for the raw result (`Ok`) or
    /// raw error object (`Err(Some)`); `Err(None)` when the process exited.
    pub async fn call(
        &self,
        method: &str,
        params: &impl Serialize,
    ) -> Result<Box<RawValue>, Option<Box<RawValue>>> {
        let params = protocol::raw(params);
        let (reply, receiver) = oneshot::channel();
        if self
            .submit(method, Some(&params), Pending::Runtime(reply))
            .await
            .is_err()
        {
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

    /// Answers a client's request with `line` (a JSON-RPC response carrying
    /// the client's id): into the session's event log when there is one, then
    /// to the client (see [`deliver`]). A `session/prompt` answer with a
    /// store comes back as a [`DurableAnswer`] to deliver once the turn's
    /// events are committed.
    fn settle(
        &self,
        request: ClientRequest,
        line: Vec<u8>,
        session: Option<&Session>,
    ) -> Option<DurableAnswer> {
        if request.prompt {
            let stop_reason = metrics::stop_reason_label(protocol::stop_reason(&line).as_deref());
            self.targets
                .metrics
                .prompt_turn(&self.agent, stop_reason, request.sent_at.elapsed());
            if let Some(turn) = &request.turn {
                otel::end_turn(&turn.span, &line);
            }
        }
        let line = Bytes::from(line);
        if let Some(session) = session {
            session.record(Direction::AgentToClient, line.clone());
            if request.prompt
                && let Some(committed) = session.durable_barrier()
            {
                return Some(DurableAnswer {
                    committed,
                    request,
                    line,
                });
            }
        }
        deliver(request, line);
        None
    }

    /// Takes agent request `raw_id` if it is still unanswered, returning its
    /// session; `None` when it was answered already or never existed (the
    /// caller drops the answer: exactly one answer reaches the agent).
    pub fn take_agent_request(&self, raw_id: &str) -> Option<Option<Arc<str>>> {
        self.take_request(raw_id).map(|request| request.session)
    }

    fn take_request(&self, raw_id: &str) -> Option<AgentRequest> {
        let mut requests = self.agent_requests.lock();
        let key = requests
            .iter()
            .find(|(_, (id, _))| &**id == raw_id)
            .map(|(seq, _)| *seq)?;
        requests.remove(&key).map(|(_, request)| request)
    }

    /// Takes agent request `raw_id` for `connection`'s answer: the first
    /// answer wins (research/contract.md, "Routing"). `None` when it was
    /// answered already, never existed, was not sent to `connection`, or
    /// `connection` is attached to its session as an observer: the caller
    /// drops the answer.
    pub fn take_answered(&self, raw_id: &str, connection: &Connection) -> Option<Answered> {
        let mut requests = self.agent_requests.lock();
        // Only a connection the request went to answers it: an agent may use
        // one id in two sessions, and another client never saw it.
        let (key, request) = requests
            .iter()
            .find(|(_, (id, request))| {
                &**id == raw_id
                    && request
                        .targets
                        .iter()
                        .any(|target| std::ptr::eq(target.as_ref(), connection))
            })
            .map(|(seq, (_, request))| (*seq, request))?;
        let observer = request
            .session
            .as_deref()
            .and_then(|id| self.live_session(id))
            .and_then(|session| session.role_of(connection))
            == Some(Role::Observer);
        if observer {
            return None;
        }
        let (raw_id, request) = requests.remove(&key)?;
        Some(Answered {
            session: request.session,
            raw_id,
        })
    }

    /// Tells every connection attached to the request's session except
    /// `answerer` that the request is resolved
    /// (`_sandboxagent/request/resolved`), so their UIs remove the
    /// question. `answer` is the winning JSON-RPC response.
    pub fn announce_resolved(&self, answered: &Answered, answerer: &Connection, answer: &[u8]) {
        let Some(session) = answered
            .session
            .as_deref()
            .and_then(|id| self.live_session(id))
        else {
            return;
        };
        let others: Vec<_> = session
            .attached()
            .into_iter()
            .filter(|c| !std::ptr::eq(c.as_ref(), answerer))
            .collect();
        if others.is_empty() {
            return;
        }
        let notice = resolved_line(&session.id, &answered.raw_id, outcome_of(answer));
        for connection in others {
            connection.push(notice.clone(), Some(&session.id));
        }
    }

    /// Answers every open agent request of `session_id` on the clients'
    /// behalf, as cancelled, because the session ended: a permission gets
    /// the ACP outcome `cancelled`, a question the action `cancel`, any
    /// other request the error `-32800` (request cancelled). The
    /// connections that got one hear `_sandboxagent/request/resolved`.
    /// Returns how many.
    pub fn cancel_session_requests(&self, session_id: &str) -> usize {
        self.dismiss_requests(session_id, |_| true)
    }

    /// Answers the open permission requests and questions of `session_id`
    /// on the clients' behalf, as cancelled, because a client cancelled the
    /// turn (`session/cancel`; ACP: the client answers them `cancelled`
    /// then, and several clients may hold them). Returns how many.
    pub fn cancel_turn_requests(&self, session_id: &str) -> usize {
        self.dismiss_requests(session_id, |method| {
            elicitation::cancelled_with_turn(method)
        })
    }

    /// Takes the open agent requests of `session_id` whose method `which`
    /// picks and answers each as cancelled ([`Router::dismiss`]).
    fn dismiss_requests(&self, session_id: &str, which: impl Fn(&str) -> bool) -> usize {
        let dismissed: Vec<(Box<str>, AgentRequest)> = {
            let mut requests = self.agent_requests.lock();
            let keys: Vec<u64> = requests
                .iter()
                .filter(|(_, (_, request))| {
                    request.session.as_deref() == Some(session_id) && which(&request.method)
                })
                .map(|(seq, _)| *seq)
                .collect();
            keys.iter().filter_map(|key| requests.remove(key)).collect()
        };
        for (raw_id, request) in &dismissed {
            self.dismiss(raw_id, request);
        }
        dismissed.len()
    }

    /// Answers agent request `raw_id` (taken from the open requests) on the
    /// clients' behalf, as cancelled: a permission `cancelled`, a question
    /// `cancel`, any other request `-32800`. The answer is recorded in the
    /// session's log; the connections that got the request hear
    /// `_sandboxagent/request/resolved`.
    fn dismiss(&self, raw_id: &str, request: &AgentRequest) {
        let Ok(id) = RawValue::from_string(raw_id.to_owned()) else {
            return;
        };
        let session_id = request.session.as_deref();
        let mut line = match elicitation::dismissed_result(&request.method) {
            Some(result) => protocol::result_response_line(&id, &result),
            None => {
                let why = match session_id {
                    Some(session) => format!("request cancelled: session {session} ended"),
                    None => "request cancelled".to_owned(),
                };
                protocol::error_response_line(&id, &RpcError::new(code::REQUEST_CANCELLED, why))
            }
        };
        if let Some(session) = session_id.and_then(|id| self.targets.sessions.get(&self.agent, id))
        {
            session.record(Direction::ClientToAgent, Bytes::from(line.clone()));
        }
        line.push(b'\n');
        // Every dismissed request gets its answer, even past the stdin
        // queue (at most `AGENT_REQUESTS_MAX` of them wait in tasks).
        match self.stdin.try_send(Bytes::from(line)) {
            Err(mpsc::error::TrySendError::Full(line)) => {
                let stdin = self.stdin.clone();
                tokio::spawn(async move {
                    let _ = stdin.send(line).await;
                });
            }
            Err(mpsc::error::TrySendError::Closed(_)) | Ok(()) => {}
        }
        if let Some(session_id) = session_id {
            let notice = resolved_line(
                session_id,
                raw_id,
                elicitation::dismissed_outcome(&request.method),
            );
            for connection in &request.targets {
                connection.push(notice.clone(), Some(session_id));
            }
        }
    }

    /// Handles one line the agent wrote to stdout. The line itself (shared,
    /// not copied) is what the session log and the connections' rings keep.
    /// Returns the answer to deliver before the next line when it waits
    /// for the store or the agent's stderr ([`Deferred`]).
    pub fn dispatch(&self, line: Bytes) -> Option<Deferred> {
        if line.iter().all(u8::is_ascii_whitespace) {
            return None;
        }
        let (message, kind) = match AgentMessage::parse(&line) {
            Ok(parsed) => parsed,
            Err(error) => {
                // The report goes to every connection of the agent: a long
                // line is cut to its first KiB, as an over-long one is.
                if line.len() > PREFIX_BYTES {
                    let error = format!("{error} (line of {} bytes, cut)", line.len());
                    self.report_unparsed(&cut(&line[..PREFIX_BYTES]), &error);
                } else {
                    self.report_unparsed(&String::from_utf8_lossy(&line), &error.to_string());
                }
                return None;
            }
        };
        // Agent lines are one line, but a bare CR inside is JSON whitespace
        // that would split an SSE `data:` line.
        // One exact-size copy, shared by the session's log and every ring:
        // `line` is a slice of the reader's buffer, which a message kept
        // for long would otherwise keep alive whole.
        let line = match protocol::one_line(&line) {
            std::borrow::Cow::Borrowed(line) => Bytes::copy_from_slice(line),
            std::borrow::Cow::Owned(flat) => Bytes::from(flat),
        };
        match kind {
            Kind::Response => return self.on_response(&message),
            Kind::Notification => self.on_notification(&message, &line),
            Kind::Request => self.on_agent_request(&message, &line),
        }
        None
    }

    /// Reports a line longer than `max` bytes (of which the framing kept
    /// `prefix`) to every connection of this agent.
    pub fn report_too_long(&self, prefix: &[u8], length: usize, max: usize) {
        let error = format!("line of {length} bytes exceeds the maximum of {max} bytes; discarded");
        self.report_unparsed(&cut(prefix), &error);
    }

    /// Reports a line that is not a JSON-RPC object to every connection of
    /// this agent (`_sandboxagent/agent/unparsed`).
    fn report_unparsed(&self, raw: &str, error: &str) {
        if self.warnings.unparsed.admit() {
            tracing::warn!(agent = %self.agent, error, "agent wrote a line that is not JSON-RPC");
        }
        let notice = Bytes::from(protocol::notification_line(
            AGENT_UNPARSED,
            &AgentUnparsed {
                agent: self.agent.to_string(),
                raw: raw.to_owned(),
                error: error.to_owned(),
            },
        ));
        for connection in self.targets.connections.of_agent(&self.agent) {
            connection.push(notice.clone(), None);
        }
    }

    fn on_response(&self, envelope: &AgentMessage<'_>) -> Option<Deferred> {
        let id = envelope.id.and_then(|id| id.get().parse::<i64>().ok());
        let Some(pending) = id.and_then(|id| self.pending.lock().remove(&id)) else {
            if self.warnings.unknown_id.admit() {
                tracing::warn!(agent = %self.agent, id = ?envelope.id.map(RawValue::get), "agent answered an unknown request id; dropped");
            }
            return None;
        };
        if let (Pending::Client(_), Some(id)) = (&pending, id) {
            self.settle_scoped_questions(id);
        }
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
                None
            }
            Pending::Client(request) => match (envelope.result, envelope.error) {
                (Some(result), _) => self.answer_client(*request, result).map(Deferred::Durable),
                (None, Some(error)) => self.answer_error(*request, error),
                // A response has one of the two (`AgentMessage::parse`).
                (None, None) => None,
            },
        }
    }

    /// Relays the agent's error answer to a client's request with the
    /// details the runtime adds ([`error_data`]): at once when it has no
    /// stderr to wait for, else as a [`Deferred::AgentError`].
    fn answer_error(&self, request: ClientRequest, error: &RawValue) -> Option<Deferred> {
        if self.stderr.is_some() {
            return Some(Deferred::AgentError(AgentErrorAnswer {
                request,
                error: error.to_owned(),
            }));
        }
        let hint = request.hint_on_error && error_data::may_be_root(error);
        let details = error_data::details(&self.agent, None, 0, hint);
        let error = error_data::with_details(error, &details);
        self.relay_error(request, &error).map(Deferred::Durable)
    }

    /// Completes a held error answer once the stderr reader caught up:
    /// the lines since the request and the hint, then the relay.
    async fn complete_error(&self, answer: AgentErrorAnswer) -> Option<DurableAnswer> {
        let AgentErrorAnswer { request, error } = answer;
        if let Some(stderr) = &self.stderr {
            error_data::settle(stderr).await;
        }
        let details = error_data::details(
            &self.agent,
            self.stderr.as_deref(),
            request.stderr_mark,
            request.hint_on_error && error_data::may_be_root(&error),
        );
        let error = error_data::with_details(&error, &details);
        self.relay_error(request, &error)
    }

    /// Relays the agent's successful answer `result` to a client's request,
    /// after applying what it implies (a new or attached session, hints).
    fn answer_client(
        &self,
        mut request: ClientRequest,
        result: &RawValue,
    ) -> Option<DurableAnswer> {
        let effect = std::mem::replace(&mut request.effect, Effect::None);
        let session_id = request.session.take();
        let mut result = Cow::Borrowed(result);
        let session = match effect {
            effect @ (Effect::None | Effect::SetHints(_)) => {
                let session = session_id.and_then(|id| self.live_session(&id));
                if let Some(session) = &session {
                    let mut hints = match effect {
                        Effect::SetHints(implied) => implied,
                        _ => Hints::default(),
                    };
                    if let Some(reported) = hints::from_result(&result) {
                        hints.merge(reported);
                    }
                    self.take_hints(session, &hints);
                }
                session
            }
            effect => {
                let created = self.apply_effect(&request.connection, effect, &result);
                if let Some(session) = &created {
                    result = Cow::Owned(with_session_meta(&result, session));
                }
                created
            }
        };
        let line = protocol::response_line(&request.client_id, Some(&result), None);
        self.settle(request, line, session.as_deref())
    }

    /// Relays `error`, the answer to `request`: a failed load undoes its
    /// early attach first.
    fn relay_error(&self, mut request: ClientRequest, error: &RawValue) -> Option<DurableAnswer> {
        let effect = std::mem::replace(&mut request.effect, Effect::None);
        let session = match effect {
            Effect::AttachSession { session, .. } => {
                // The load failed: undo the early attach (see `prepare_attach`).
                if let Some(session) = self.targets.sessions.get(&self.agent, &session) {
                    session.detach(&request.connection);
                }
                None
            }
            _ => request.session.take().and_then(|id| self.live_session(&id)),
        };
        let line = protocol::response_line(&request.client_id, None, Some(error));
        self.settle(request, line, session.as_deref())
    }

    /// Registers and attaches the session a successful `session/new` /
    /// `fork` / `load` / `resume` names, takes its hints, and flushes what was
    /// held for it. Returns the session.
    fn apply_effect(
        &self,
        connection: &Arc<Connection>,
        effect: Effect,
        result: &RawValue,
    ) -> Option<Arc<Session>> {
        let load = matches!(effect, Effect::AttachSession { .. });
        let (session_id, cwd, metadata, request) = match effect {
            Effect::None | Effect::SetHints(_) => return None,
            Effect::CreateSession {
                cwd,
                metadata,
                request,
            } => match protocol::session_id_of(result) {
                Some(id) => (id, cwd, metadata, Some(request)),
                None => {
                    if self.warnings.no_session_id.admit() {
                        tracing::warn!(agent = %self.agent, "session answer without a sessionId");
                    }
                    return None;
                }
            },
            Effect::AttachSession {
                session,
                cwd,
                request,
            } => {
                // A live session logged the request when it was forwarded.
                let logged = self.live_session(&session).is_some();
                (session, cwd, Map::new(), (!logged).then_some(request))
            }
        };
        let session = self.targets.sessions.insert(
            &session_id,
            self.agent.clone(),
            self.generation,
            cwd,
            metadata,
            load,
        );
        if let Some(request) = request {
            session.record(Direction::ClientToAgent, request);
        }
        self.take_hints(&session, &hints::from_session_result(result));
        if !connection.is_closed() {
            session.attach(connection);
            let delivered = self.flush_held(&session, connection);
            self.deliver_waiting_requests(&session, connection, &delivered);
        }
        Some(session)
    }

    /// Applies hints to the session and remembers the agent-wide ones.
    fn take_hints(&self, session: &Session, hints: &Hints) {
        if !hints.is_empty() {
            session.apply_hints(hints);
            self.reported.lock().take(hints);
        }
    }

    /// A connection attached to `session` without the agent being asked
    /// (`_sandboxagent/session/attach`, or a `session/load` the runtime
    /// answered): as a controller it gets the session's open agent requests
    /// it has not had yet.
    pub fn attached(&self, session: &Session, connection: &Arc<Connection>) {
        self.deliver_waiting_requests(session, connection, &HashSet::new());
    }

    /// Attaches `connection` to a known live session of this process before a
    /// `session/load` / `session/resume` is answered, so the history the agent
    /// replays during the load reaches it. Undone if the load fails.
    pub fn prepare_attach(&self, connection: &Arc<Connection>, session: &str) {
        if let Some(session) = self.live_session(session)
            && !session.is_ended()
        {
            session.attach(connection);
        }
    }

    fn on_notification(&self, envelope: &AgentMessage<'_>, line: &Bytes) {
        if envelope.method() == method::CANCEL_REQUEST {
            self.on_agent_cancel(envelope, line);
            return;
        }
        if envelope.method() == elicitation::COMPLETE && self.on_question_complete(line) {
            return;
        }
        let Some(session_id) = envelope.session_id() else {
            for connection in self.targets.connections.of_agent(&self.agent) {
                connection.push(line.clone(), None);
            }
            return;
        };
        match self.live_session(session_id) {
            Some(session) => {
                if envelope.method() == method::SESSION_UPDATE
                    && let Some(kind) = envelope.update_kind()
                {
                    if let Some(hints) = hints::from_update(kind, line) {
                        self.take_hints(&session, &hints);
                    }
                    if let Some(client_side) = &self.targets.client_side {
                        client_side.tag_terminals(&session, kind, line);
                    }
                    if let Some(took) = session.turn_clock.first_update() {
                        self.targets.metrics.first_update(&self.agent, took);
                    }
                    if otel::enabled() {
                        session.turn_trace.lock().on_update(kind, line);
                    }
                }
                session.record_and_deliver(Direction::AgentToClient, line.clone());
            }
            None => self.hold(session_id.into(), line, None),
        }
    }

    /// `elicitation/complete` of a URL-mode question this process asked:
    /// recorded in its session's log and delivered to the session's
    /// connections, or (request-scoped) delivered to the connection the
    /// question went to. `false` for an id it does not know (the notice
    /// then goes where any notification without a session goes).
    fn on_question_complete(&self, line: &Bytes) -> bool {
        let Some(id) = elicitation::completed_id(raw_params(line)) else {
            return false;
        };
        let Some(target) = self.url_questions.lock().take(&id) else {
            return false;
        };
        match target {
            CompleteTarget::Session(session_id) => match self.live_session(&session_id) {
                Some(session) => session.record_and_deliver(Direction::AgentToClient, line.clone()),
                None => self.hold(session_id, line, None),
            },
            CompleteTarget::Connection(connection) => {
                connection.push(line.clone(), None);
            }
        }
        true
    }

    /// The agent withdraws one of its requests: only the connections that got
    /// it hear about it, and a later answer is dropped.
    fn on_agent_cancel(&self, envelope: &AgentMessage<'_>, line: &Bytes) {
        let Some(request_id) = envelope.cancelled_request_id() else {
            return;
        };
        let Some(request) = self.take_request(request_id.get()) else {
            return;
        };
        if let Some(session) = request
            .session
            .as_deref()
            .and_then(|id| self.live_session(id))
        {
            session.record(Direction::AgentToClient, line.clone());
        }
        // Exactly the connections that got the request: for one without a
        // session, the connection it went to, whoever asked last since.
        for connection in &request.targets {
            connection.push(line.clone(), request.session.as_deref());
        }
    }

    /// The agent-side id of `connection`'s in-flight request `client_id`
    /// (raw JSON text), to translate a client's `$/cancel_request`.
    pub fn agent_id_of(&self, connection: &Connection, client_id: &str) -> Option<i64> {
        self.pending
            .lock()
            .iter()
            .find_map(|(id, pending)| match pending {
                Pending::Client(request)
                    if std::ptr::eq(request.connection.as_ref(), connection)
                        && request.client_id.get() == client_id =>
                {
                    Some(*id)
                }
                _ => None,
            })
    }

    fn on_agent_request(&self, envelope: &AgentMessage<'_>, line: &Bytes) {
        let Some(raw_id) = envelope.id.map(|id| Box::<str>::from(id.get())) else {
            return;
        };
        let method = envelope.method();
        if self.agent_requests.lock().len() >= AGENT_REQUESTS_MAX {
            if self.warnings.too_many_requests.admit() {
                tracing::warn!(agent = %self.agent, max = AGENT_REQUESTS_MAX, "agent has too many open requests; answering new ones as cancelled");
            }
            self.answer_dismissed(envelope, method, "too many open agent requests");
            return;
        }
        let question = elicitation::is_question(method).then(|| Question::read(raw_params(line)));
        let mode = match &question {
            Some(Question { mode: None, .. }) => {
                let error = RpcError::new(
                    code::INVALID_PARAMS,
                    "invalid params: elicitation/create needs mode \"form\" or \"url\" (an \
                     http or https url) and one scope (sessionId, or the requestId of a \
                     request this agent was sent)",
                );
                self.answer_agent(envelope, &error);
                return;
            }
            Some(question) => question.mode,
            None => None,
        };
        if let Some(request_id) = question.as_ref().and_then(|q| q.request_id) {
            self.ask_requester(envelope, raw_id, line, request_id, question.as_ref());
            return;
        }
        let session_id: Option<Arc<str>> = envelope.session_id().map(Into::into);
        if let (Some(session), Some(id)) = (
            &session_id,
            question.as_ref().and_then(|q| q.elicitation_id.clone()),
        ) {
            self.url_questions
                .lock()
                .remember(id, CompleteTarget::Session(session.clone()));
        }
        let Some(session_id) = session_id else {
            // No session: exactly one connection, the most recent requester.
            let target = self
                .last_requester
                .lock()
                .upgrade()
                .filter(|c| !c.is_closed());
            match target {
                Some(connection) if self.takes(&connection, method, mode) => {
                    // Filed first: an answer may come as soon as it is pushed.
                    self.remember_agent_request(
                        &raw_id,
                        None,
                        (method, mode, None),
                        line.clone(),
                        vec![connection.clone()],
                    );
                    connection.push(line.clone(), None);
                }
                // Files and terminals live in a session's directory.
                _ if self.runtime_serves(method) => self.answer_agent(
                    envelope,
                    &RpcError::new(
                        code::INVALID_PARAMS,
                        format!("invalid params: {method} needs a sessionId"),
                    ),
                ),
                _ => self.answer_method_not_found(envelope, method),
            }
            return;
        };
        let Some(session) = self.live_session(&session_id) else {
            self.remember_agent_request(
                &raw_id,
                Some(session_id.clone()),
                (method, mode, None),
                line.clone(),
                Vec::new(),
            );
            self.hold(session_id, line, Some(raw_id));
            return;
        };
        if session.is_ended() {
            // Nobody attaches to an ended session, and the runtime does
            // not act for it any more (no file or terminal): answered at
            // once.
            let why = format!("request cancelled: session {session_id} ended");
            self.answer_dismissed(envelope, method, &why);
            return;
        }
        // Pushed and filed under one lock: a connection attaching meanwhile
        // (`deliver_waiting_requests`) sees it either filed with its
        // targets or not at all, so it never gets it twice.
        let mut requests = self.agent_requests.lock();
        let controllers = session.record_and_controllers(Direction::AgentToClient, line.clone());
        let allowed: Vec<Arc<Connection>> = controllers
            .iter()
            .filter(|c| self.takes(c, method, mode))
            .cloned()
            .collect();
        if allowed.is_empty() && self.runtime_serves(method) {
            drop(requests);
            self.serve(raw_id, method, line.clone(), session);
            return;
        }
        if !controllers.is_empty() && allowed.is_empty() {
            drop(requests);
            self.refuse(envelope, method, Some(&session));
            return;
        }
        // With no controller attached it waits until one attaches.
        for connection in &allowed {
            connection.push(line.clone(), Some(&session_id));
        }
        let seq = self.agent_request_seq.fetch_add(1, Ordering::Relaxed);
        requests.insert(
            seq,
            (
                raw_id,
                AgentRequest {
                    session: Some(session_id),
                    method: method.into(),
                    mode,
                    scope: None,
                    line: line.clone(),
                    _span: self.trace_permission(method, &session, line),
                    targets: allowed,
                    _pending: self.count_pending(method),
                },
            ),
        );
    }

    /// A question scoped to a request (`requestId`, one of this router's
    /// ids of a client's request): it goes to the connection that sent that
    /// request, with the client's own id in `requestId`. When that request
    /// is not pending, or its connection is closed or did not declare the
    /// question's mode, the runtime answers `cancel`.
    fn ask_requester(
        &self,
        envelope: &AgentMessage<'_>,
        raw_id: Box<str>,
        line: &Bytes,
        request_id: i64,
        question: Option<&Question>,
    ) {
        let mode = question.and_then(|q| q.mode);
        let requester = match self.pending.lock().get(&request_id) {
            Some(Pending::Client(request)) => {
                Some((request.connection.clone(), request.client_id.clone()))
            }
            _ => None,
        };
        let target = requester.filter(|(connection, _)| {
            !connection.is_closed() && self.takes(connection, elicitation::CREATE, mode)
        });
        let rewritten = target.and_then(|(connection, client_id)| {
            elicitation::with_request_id(line, &client_id).map(|line| (connection, line))
        });
        let Some((connection, line)) = rewritten else {
            self.answer_agent_result(envelope, &elicitation::cancelled());
            return;
        };
        if let Some(id) = question.and_then(|q| q.elicitation_id.clone()) {
            self.url_questions
                .lock()
                .remember(id, CompleteTarget::Connection(connection.clone()));
        }
        // Filed first: an answer may come as soon as it is pushed.
        self.remember_agent_request(
            &raw_id,
            None,
            (elicitation::CREATE, mode, Some(request_id)),
            line.clone(),
            vec![connection.clone()],
        );
        connection.push(line, None);
    }

    /// Refuses an agent request none of the session's attached controllers
    /// can take: a question is answered `cancel` (recorded in the session's
    /// log, since the runtime declared questions to the agent), any other
    /// request `-32601`.
    fn refuse(&self, envelope: &AgentMessage<'_>, method: &str, session: Option<&Session>) {
        if elicitation::is_question(method) {
            let answer = self.answer_agent_result(envelope, &elicitation::cancelled());
            if let (Some(session), Some(answer)) = (session, answer) {
                session.record(Direction::ClientToAgent, answer);
            }
        } else {
            self.answer_method_not_found(envelope, method);
        }
    }

    /// Whether the runtime answers agent request `method` itself when no
    /// connection takes it: a file or terminal request it declared
    /// (research/contract.md, "Files and terminals of the agent, served in
    /// the sandbox").
    fn runtime_serves(&self, method: &str) -> bool {
        ClientCapabilities::covers(method) && self.served.allows(method)
    }

    /// Whether `connection` gets agent request `method`: it declared the
    /// capability, and for a request the runtime serves it also opted to
    /// serve it itself (`fsAndTerminal: "client"`).
    /// A question goes only to connections that declared its `mode`.
    fn takes(
        &self,
        connection: &Connection,
        method: &str,
        mode: Option<elicitation::Mode>,
    ) -> bool {
        let capabilities = &connection.capabilities;
        if elicitation::is_question(method) {
            return mode.is_some_and(|mode| capabilities.asks(mode));
        }
        capabilities.allows(method)
            && (capabilities.serves_fs_and_terminal || !self.runtime_serves(method))
    }

    /// Answers the agent's file or terminal request `line` in the sandbox,
    /// in a task of its own (a `terminal/wait_for_exit` may wait long; the
    /// stdout loop goes on). The request is in the session's log already;
    /// the answer goes there too (`client_to_agent`, as a client's would),
    /// then to the agent. Nothing is sent once the process is gone.
    fn serve(&self, raw_id: Box<str>, method: &str, line: Bytes, session: Arc<Session>) {
        let Some(client_side) = self.targets.client_side.clone() else {
            return;
        };
        let (stdin, exited, method) = (self.stdin.clone(), self.exited.clone(), method.to_owned());
        let generation = self.generation;
        tokio::spawn(async move {
            #[derive(serde::Deserialize)]
            struct Params<'a> {
                #[serde(borrow, default)]
                params: Option<&'a RawValue>,
            }
            let params = serde_json::from_slice::<Params<'_>>(&line)
                .ok()
                .and_then(|request| request.params);
            let answer = tokio::select! {
                answer = client_side.answer(&method, params, &session, generation) => answer,
                () = exited.cancelled() => return,
            };
            let Ok(id) = RawValue::from_string(raw_id.into_string()) else {
                return;
            };
            let mut line = match answer {
                Ok(result) => protocol::result_response_line(&id, &result),
                Err(error) => protocol::error_response_line(&id, &error),
            };
            session.record(Direction::ClientToAgent, Bytes::from(line.clone()));
            line.push(b'\n');
            if stdin.send(Bytes::from(line)).await.is_err() {
                tracing::debug!(
                    method,
                    "answer to an agent request dropped: agent process exited"
                );
            }
        });
    }

    /// Files an open agent request of `(method, question mode, request
    /// scope)`.
    fn remember_agent_request(
        &self,
        raw_id: &str,
        session: Option<Arc<str>>,
        (method, mode, scope): (&str, Option<elicitation::Mode>, Option<i64>),
        line: Bytes,
        targets: Vec<Arc<Connection>>,
    ) {
        let seq = self.agent_request_seq.fetch_add(1, Ordering::Relaxed);
        self.agent_requests.lock().insert(
            seq,
            (
                raw_id.into(),
                AgentRequest {
                    session,
                    method: method.into(),
                    mode,
                    scope,
                    line,
                    targets,
                    _pending: self.count_pending(method),
                    _span: tracing::Span::none(),
                },
            ),
        );
    }

    /// A count in `permission_requests_pending` for an agent request of
    /// `method`, when it is a permission request.
    fn count_pending(&self, method: &str) -> Option<GaugeGuard> {
        (method == method::SESSION_REQUEST_PERMISSION)
            .then(|| GaugeGuard::new(self.targets.metrics.permission_requests_pending()))
    }

    /// The span of agent request `line` of `method` in `session` while it
    /// waits for an answer, when it is a permission request and tracing is
    /// on (research/contract.md, "Traces").
    fn trace_permission(&self, method: &str, session: &Session, line: &[u8]) -> tracing::Span {
        if method != method::SESSION_REQUEST_PERMISSION || !otel::enabled() {
            return tracing::Span::none();
        }
        session.turn_trace.lock().permission(line)
    }

    /// Answers an agent request with "method not found" on the client's
    /// behalf: no attached client declared the capability
    /// (research/contract.md, "Routing: connections, sessions, one agent
    /// process").
    fn answer_method_not_found(&self, envelope: &AgentMessage<'_>, method: &str) {
        let error = RpcError::new(
            code::METHOD_NOT_FOUND,
            format!("method not found: {method} (no attached client declared this capability)"),
        );
        self.answer_agent(envelope, &error);
    }

    /// Answers agent request `envelope` with `error` on the clients' behalf.
    fn answer_agent(&self, envelope: &AgentMessage<'_>, error: &RpcError) {
        let Some(id) = envelope.id else { return };
        self.send_answer(protocol::error_response_line(id, error));
    }

    /// Answers agent request `envelope` with `result` on the clients'
    /// behalf; returns the answer (without its line feed) for the log.
    fn answer_agent_result(&self, envelope: &AgentMessage<'_>, result: &Value) -> Option<Bytes> {
        let id = envelope.id?;
        let line = protocol::result_response_line(id, result);
        let answer = Bytes::from(line.clone());
        self.send_answer(line);
        Some(answer)
    }

    /// Answers agent request `envelope` at once, on the clients' behalf,
    /// as cancelled: a permission `cancelled`, a question `cancel`, any
    /// other request `-32800` with `why`.
    fn answer_dismissed(&self, envelope: &AgentMessage<'_>, method: &str, why: &str) {
        match elicitation::dismissed_result(method) {
            Some(result) => {
                self.answer_agent_result(envelope, &result);
            }
            None => self.answer_agent(envelope, &RpcError::new(code::REQUEST_CANCELLED, why)),
        }
    }

    /// Queues one answer line for the agent's stdin.
    fn send_answer(&self, mut line: Vec<u8>) {
        line.push(b'\n');
        if self.stdin.try_send(Bytes::from(line)).is_err() && self.warnings.stdin_full.admit() {
            tracing::warn!(agent = %self.agent, "cannot answer agent request: stdin queue full or closed");
        }
    }

    /// The session if this process hosts it.
    fn live_session(&self, id: &str) -> Option<Arc<Session>> {
        self.targets.sessions.live(id, self.generation)
    }

    fn hold(&self, session: Arc<str>, line: &Bytes, request_id: Option<Box<str>>) {
        let mut held = self.held.lock();
        let now = Instant::now();
        while let Some(front) = held.front() {
            if held.len() < HELD_MAX && now.duration_since(front.at) < HELD_TTL {
                break;
            }
            if self.warnings.held_dropped.admit() {
                tracing::warn!(agent = %self.agent, session = %front.session, "dropping a message held for a session nobody owns");
            }
            if let Some(dropped) = held.pop_front() {
                self.forget_dropped(&dropped);
            }
        }
        held.push_back(Held {
            at: now,
            session,
            line: line.clone(),
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
                // An agent request goes only to a connection that can take
                // it; `deliver_waiting_requests` settles the others.
                let takes = message.request_id.as_deref().is_none_or(|id| {
                    self.held_request_kind(id, &session.id)
                        .is_some_and(|(method, mode)| self.takes(connection, &method, mode))
                });
                if takes {
                    connection.push(message.line.clone(), Some(&message.session));
                    if let Some(id) = message.request_id.take() {
                        delivered.insert(id);
                    }
                }
            } else {
                self.forget_dropped(message);
            }
            false
        });
        delivered
    }

    /// The method and question mode of open agent request `raw_id` of
    /// session `session`.
    fn held_request_kind(
        &self,
        raw_id: &str,
        session: &str,
    ) -> Option<(Box<str>, Option<elicitation::Mode>)> {
        self.agent_requests
            .lock()
            .values()
            .find(|(id, request)| &**id == raw_id && request.session.as_deref() == Some(session))
            .map(|(_, request)| (request.method.clone(), request.mode))
    }

    /// Drops held messages past their TTL (a permission request or question
    /// among them answered as cancelled) and answers, as cancelled, the
    /// open requests without a session whose every connection closed: nobody
    /// is left to answer them.
    pub fn sweep(&self) {
        let now = Instant::now();
        let expired: Vec<Held> = {
            let mut held = self.held.lock();
            let mut expired = Vec::new();
            while held
                .front()
                .is_some_and(|front| now.duration_since(front.at) >= HELD_TTL)
            {
                expired.extend(held.pop_front());
            }
            expired
        };
        for dropped in &expired {
            self.forget_dropped(dropped);
        }
        let orphaned: Vec<(Box<str>, AgentRequest)> = {
            let mut requests = self.agent_requests.lock();
            let keys: Vec<u64> = requests
                .iter()
                .filter(|(_, (_, request))| {
                    request.session.is_none()
                        && request.targets.iter().all(|target| target.is_closed())
                })
                .map(|(seq, _)| *seq)
                .collect();
            keys.iter().filter_map(|key| requests.remove(key)).collect()
        };
        for (raw_id, request) in &orphaned {
            self.dismiss(raw_id, request);
        }
    }

    /// The client request the agent knows as `agent_id` was answered: its
    /// request-scoped questions still open are answered `cancel`.
    fn settle_scoped_questions(&self, agent_id: i64) {
        let scoped: Vec<(Box<str>, AgentRequest)> = {
            let mut requests = self.agent_requests.lock();
            if requests.is_empty() {
                return;
            }
            let keys: Vec<u64> = requests
                .iter()
                .filter(|(_, (_, request))| request.scope == Some(agent_id))
                .map(|(seq, _)| *seq)
                .collect();
            keys.iter().filter_map(|key| requests.remove(key)).collect()
        };
        for (raw_id, request) in &scoped {
            self.dismiss(raw_id, request);
        }
    }

    /// A held agent request dropped past the cap or the TTL is never
    /// delivered: it leaves the unanswered-requests table too.
    /// A permission request or question among them is answered as
    /// cancelled, so the agent does not wait for ever.
    fn forget_dropped(&self, dropped: &Held) {
        if let Some(id) = &dropped.request_id
            && let Some(request) = self.take_request(id)
            && elicitation::dismissed_result(&request.method).is_some()
        {
            self.dismiss(id, &request);
        }
    }

    /// Delivers the unanswered agent requests of `session` to a connection
    /// that just attached, except those in `skip`. One it cannot take is
    /// refused (`-32601`) only when no attached connection can: another may
    /// hold it already.
    fn deliver_waiting_requests(
        &self,
        session: &Session,
        connection: &Arc<Connection>,
        skip: &HashSet<Box<str>>,
    ) {
        // Observers get no agent requests (research/contract.md,
        // "`_sandboxagent/session/attach`").
        if session.role_of(connection) != Some(Role::Controller) {
            return;
        }
        let mut refused = Vec::new();
        {
            let mut requests = self.agent_requests.lock();
            for (id, request) in requests.values_mut() {
                if request.session.as_deref() != Some(&*session.id)
                    || request.targets.iter().any(|c| Arc::ptr_eq(c, connection))
                {
                    continue;
                }
                if skip.contains(id) {
                    // Flushed with the held messages already.
                    request.targets.push(connection.clone());
                } else if self.takes(connection, &request.method, request.mode) {
                    connection.push(request.line.clone(), request.session.as_deref());
                    request.targets.push(connection.clone());
                } else {
                    refused.push((request.line.clone(), request.mode));
                }
            }
        }
        let attached = session.controllers();
        for (line, mode) in refused {
            if let Ok((envelope, _)) = AgentMessage::parse(&line) {
                if attached
                    .iter()
                    .any(|c| self.takes(c, envelope.method(), mode))
                {
                    continue;
                }
                if let Some(id) = envelope.id {
                    self.take_agent_request(id.get());
                }
                self.refuse(&envelope, envelope.method(), Some(session));
            }
        }
    }

    /// Answers this session's pending `session/prompt` requests with stop
    /// reason `cancelled` on the agent's behalf (a terminated session whose
    /// agent did not end the turn); the agent's later answers are dropped.
    /// Returns how many.
    pub fn abandon_prompts(&self, session_id: &str) -> usize {
        let abandoned: Vec<Pending> = {
            let mut pending = self.pending.lock();
            let ids: Vec<i64> = pending
                .iter()
                .filter(|(_, p)| {
                    matches!(p, Pending::Client(request) if request.prompt && request.session.as_deref() == Some(session_id))
                })
                .map(|(id, _)| *id)
                .collect();
            ids.iter().filter_map(|id| pending.remove(id)).collect()
        };
        let count = abandoned.len();
        let session = self.live_session(session_id);
        for pending in abandoned {
            if let Pending::Client(request) = pending {
                let line = protocol::result_response_line(
                    &request.client_id,
                    &serde_json::json!({ "stopReason": "cancelled" }),
                );
                if let Some(answer) = self.settle(*request, line, session.as_deref()) {
                    tokio::spawn(answer.deliver());
                }
            }
        }
        count
    }

    /// The process is gone: fails every pending request with a JSON-RPC
    /// error naming the exit and carrying the stderr excerpt, forgets agent
    /// requests and held messages, and ends the live sessions it hosted,
    /// telling their connections with `_sandboxagent/session/ended`.
    pub async fn finish(&self, exit: ExitInfo, stderr: StderrExcerpt) {
        let message = format!("agent process exited ({})", exit.describe());
        let error =
            RpcError::new(code::INTERNAL_ERROR, message.clone()).with_data(serde_json::json!({
                "agent": &*self.agent,
                "exitCode": exit.code,
                "signal": exit.signal,
                "stderr": &stderr,
            }));
        let pending: Vec<_> = self.pending.lock().drain().map(|(_, p)| p).collect();
        self.agent_requests.lock().clear();
        self.url_questions.lock().clear();
        // No process outlives its owner: the agent's terminals die with it.
        if let Some(client_side) = &self.targets.client_side {
            client_side.release_terminals(&self.agent, self.generation);
        }
        self.held.lock().clear();
        let reason = if exit.code == Some(0) {
            EndReason::Completed
        } else {
            EndReason::Error
        };
        // Together: each waits for the same group commit.
        let sessions = self
            .targets
            .sessions
            .live_of_process(&self.agent, self.generation);
        futures::future::join_all(sessions.iter().map(|session| {
            let notice = SessionEnded {
                session_id: session.id.to_string(),
                reason,
                terminated_by: TerminatedBy::Agent,
                message: Some(message.clone()),
                exit_code: exit.code,
                stderr: Some(stderr.clone()),
            };
            async move { session.end_with_notice(&notice).await }
        }))
        .await;
        // After the end notices: a client reading both sees why the session
        // ended (the exit, the agent's stderr) before its failed request.
        for pending in pending {
            match pending {
                Pending::Client(request) => {
                    let line = protocol::error_response_line(&request.client_id, &error);
                    // Into the session's log too, as every answer is
                    // (research/contract.md, "Control plane": the log holds
                    // responses), and durable like any other.
                    let session = request
                        .session
                        .as_deref()
                        .and_then(|id| self.targets.sessions.get(&self.agent, id));
                    if let Some(answer) = self.settle(*request, line, session.as_deref()) {
                        answer.deliver().await;
                    }
                }
                // Dropping the sender tells the runtime's caller the process is gone.
                Pending::Runtime(_) => {}
            }
        }
    }
}

/// `params` of a JSON-RPC message line, as raw JSON.
fn raw_params(line: &[u8]) -> Option<&RawValue> {
    #[derive(serde::Deserialize)]
    struct Message<'a> {
        #[serde(borrow, default)]
        params: Option<&'a RawValue>,
    }
    serde_json::from_slice::<Message<'_>>(line).ok()?.params
}

/// The kept start of an unusable line, marked as cut.
fn cut(prefix: &[u8]) -> String {
    format!("{}…", String::from_utf8_lossy(prefix))
}

/// A `_sandboxagent/request/resolved` notification.
fn resolved_line(session_id: &str, raw_id: &str, outcome: Value) -> Bytes {
    let request_id = serde_json::from_str(raw_id).unwrap_or(Value::Null);
    Bytes::from(protocol::notification_line(
        REQUEST_RESOLVED,
        &RequestResolved {
            session_id: session_id.to_owned(),
            request_id,
            outcome,
        },
    ))
}

/// The `outcome` of `_sandboxagent/request/resolved` for a winning answer
/// (see [`RequestResolved::outcome`]).
fn outcome_of(answer: &[u8]) -> Value {
    #[derive(serde::Deserialize)]
    struct Answer {
        result: Option<Value>,
    }
    match serde_json::from_slice::<Answer>(answer)
        .ok()
        .and_then(|a| a.result)
    {
        Some(Value::Object(mut result)) if result.contains_key("outcome") => {
            result.remove("outcome").unwrap_or(Value::Null)
        }
        Some(result) => result,
        None => serde_json::json!({ "outcome": "error" }),
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

#[cfg(test)]
mod tests;
