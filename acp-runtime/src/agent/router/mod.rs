//! The routing table of one agent process (research/contract.md, "Routing:
//! connections, sessions, one agent process").
//!
//! Toward the agent, every client request gets a fresh integer id from this
//! process's counter; the pending table maps it back to the connection and the
//! client's own id (kept as raw JSON, so it round-trips exactly). From the
//! agent, the stdout loop ([`super::agent_process::read_stdout`]) hands each line to
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
//!
//! # Layout
//! - this file: the router's state (the pending tables, held messages,
//!   warnings), [`Router::dispatch`] (one agent line in, by kind), the
//!   sweep of expired held messages and the end of the process.
//! - `client_requests`: a client's requests to the agent and their
//!   answers (ids rewritten both ways, errors completed with stderr, the
//!   effects an answer has on its session).
//! - `agent_requests`: the agent's requests to clients (permissions,
//!   questions, the client-side methods the runtime serves), the pending
//!   table, answers taken back, requests dismissed.
//! - `held`: the agent's notifications, and what is held for a session no
//!   client is attached to yet.

mod agent_requests;
mod client_requests;
mod held;

use super::client_side::ClientSide;
use super::error_data;
use super::exit::ExitInfo;
use super::framing::PREFIX_BYTES;
use super::stdio::StderrCapture;
use crate::elicitation::{self, CompleteTarget, Question, UrlQuestions};
use crate::log_limit::{LogLimit, WARN_INTERVAL};
use crate::memory::connection::{ClientCapabilities, Connection};
use crate::memory::connections::Connections;
use crate::memory::hints::{self, Hints};
use crate::memory::session::Session;
use crate::memory::sessions::Sessions;
use crate::metrics::{self, GaugeGuard, Metrics};
use crate::protocol::{self, AgentMessage, Kind, Method, RpcError, code, method};
use crate::spans;
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
