//! One client connection: its replay ring, its live stream slots, the
//! JSON-RPC ids it has in flight, and the sessions it is attached to.
//!
//! Every message for a connection gets the next sequence number and is
//! appended to the ring as it is: `(sequence, lane, JSON bytes)`, shared
//! (`Bytes`) with the session's log and every other connection that gets
//! the same message. The ring knows no transport: `http::sse` frames an
//! event as SSE when it writes it, `http::websocket` sends its JSON as one
//! text frame. A live stream is only a cursor into that ring plus a
//! wake-up: replay and live delivery are the same code path, so the seam
//! between them can have neither a gap nor a duplicate, and a client that
//! never reads costs at most the ring (research/contract.md, "Transport:
//! /v2/rpc", GET).
//!
//! Lanes: on `/acp` a client may open one stream per session beside the
//! connection's own (research/contract.md, "The /acp profile"). Each event is
//! put in a lane when it is pushed: the lane of the session the pusher names
//! once a session stream for it was opened, else the connection lane. Every
//! stream reads one lane of the same ring with the same sequence numbers, so
//! replay by `Last-Event-ID` works per stream and no event is in two lanes.

use crate::budget::MemoryBudget;
use crate::elicitation;
use crate::error::Error;
use crate::metrics::{GaugeGuard, Metrics, Transport};
use crate::protocol::{self, method};
use bytes::Bytes;
use ext_methods::{StreamGap, notification::STREAM_GAP};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Client capabilities a connection declared in its `initialize`
/// (`params.clientCapabilities`, ACP schema `ClientCapabilities`), and
/// whether it takes the agent's file and terminal requests itself
/// (`params._meta["sandboxagent.dev"].fsAndTerminal`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientCapabilities {
    /// `fs.readTextFile`
    pub read_text_file: bool,
    /// `fs.writeTextFile`
    pub write_text_file: bool,
    /// `terminal`
    pub terminal: bool,
    /// `elicitation.form`: takes form-mode questions.
    pub elicitation_form: bool,
    /// `elicitation.url`: takes URL-mode questions.
    pub elicitation_url: bool,
    /// `fsAndTerminal: "client"`: this connection answers the `fs/*` and
    /// `terminal/*` requests it declared capabilities for, instead of the
    /// runtime (research/contract.md, "Files and terminals of the agent,
    /// served in the sandbox").
    pub serves_fs_and_terminal: bool,
}

impl ClientCapabilities {
    /// Every capability the runtime itself can serve an agent in the
    /// sandbox (`terminal` only when processes are on).
    pub fn sandbox(terminal: bool) -> Self {
        Self {
            read_text_file: true,
            write_text_file: true,
            terminal,
            ..Self::default()
        }
    }

    /// Reads the capabilities from raw `initialize` params; anything missing or
    /// malformed counts as not declared.
    pub fn from_initialize_params(params: Option<&serde_json::value::RawValue>) -> Self {
        #[derive(serde::Deserialize, Default)]
        #[serde(rename_all = "camelCase")]
        struct Params {
            #[serde(default)]
            client_capabilities: serde_json::Value,
            #[serde(default, rename = "_meta")]
            meta: serde_json::Value,
        }
        let params: Params = params
            .and_then(|raw| serde_json::from_str(raw.get()).ok())
            .unwrap_or_default();
        let by_client = params
            .meta
            .get(ext_methods::NAMESPACE)
            .and_then(|namespace| namespace.get(ext_methods::meta::FS_AND_TERMINAL_KEY))
            .and_then(serde_json::Value::as_str)
            == Some(ext_methods::meta::FS_AND_TERMINAL_CLIENT);
        Self {
            serves_fs_and_terminal: by_client,
            ..Self::declared(&params.client_capabilities)
        }
    }

    /// What an ACP `ClientCapabilities` object declares; anything missing or
    /// not `true` counts as not declared.
    pub fn declared(capabilities: &serde_json::Value) -> Self {
        let flag =
            |pointer: &str| capabilities.pointer(pointer) == Some(&serde_json::Value::Bool(true));
        let (elicitation_form, elicitation_url) = elicitation::modes_declared(capabilities);
        Self {
            read_text_file: flag("/fs/readTextFile"),
            write_text_file: flag("/fs/writeTextFile"),
            terminal: flag("/terminal"),
            elicitation_form,
            elicitation_url,
            serves_fs_and_terminal: false,
        }
    }

    /// Whether a connection with these capabilities may receive a question
    /// (`elicitation/create`) of `mode`.
    pub fn asks(&self, mode: elicitation::Mode) -> bool {
        match mode {
            elicitation::Mode::Form => self.elicitation_form,
            elicitation::Mode::Url => self.elicitation_url,
        }
    }

    /// Whether a connection with these capabilities may receive the agent
    /// request `method`. Methods outside `fs/*` and `terminal/*` need none.
    pub fn allows(&self, method: &str) -> bool {
        match method {
            method::FS_READ_TEXT_FILE => self.read_text_file,
            method::FS_WRITE_TEXT_FILE => self.write_text_file,
            m if m.starts_with("fs/") => self.read_text_file || self.write_text_file,
            m if m.starts_with("terminal/") => self.terminal,
            _ => true,
        }
    }

    /// Whether `method` is one of the `fs/*` or `terminal/*` requests these
    /// capabilities cover (every other agent request needs none).
    pub fn covers(method: &str) -> bool {
        method.starts_with("fs/") || method.starts_with("terminal/")
    }
}

/// The transport profile a connection was opened on (research/contract.md,
/// "The /acp profile"): it decides whether `session/new` must name its agent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Profile {
    /// `/v2/rpc`: `session/new` names its agent in
    /// `_meta["sandboxagent.dev"].agent`, as `initialize` did.
    #[default]
    V2Rpc,
    /// `/acp` (Streamable HTTP or WebSocket): an RFD client knows no
    /// `_meta`, so the connection's agent stands in for it.
    Acp,
}

/// Replay limits of one connection.
#[derive(Debug, Clone, Copy)]
pub struct ReplayLimits {
    /// Most events kept.
    pub events: usize,
    /// Most bytes of events kept, each counted as its JSON plus
    /// [`EVENT_OVERHEAD`] (the newest event is always kept).
    pub bytes: usize,
}

/// One open client connection. Shared (`Arc`) by the registry, the request
/// handlers and the agent's stdout reader.
#[derive(Debug)]
pub struct Connection {
    /// The id sent in `x-acp-connection-id`.
    pub id: Arc<str>,
    /// The agent this connection is bound to (from its `initialize`).
    pub agent: Arc<str>,
    /// What the client declared it can do.
    pub capabilities: ClientCapabilities,
    /// The profile the connection was opened on.
    pub profile: Profile,
    /// Ring, sequence counter and live stream slot; never held across an await.
    state: Mutex<State>,
    /// Cancelled on DELETE, idle reaping or shutdown; pending POSTs and the
    /// live stream watch it.
    closed: CancellationToken,
    /// Milliseconds since `epoch` of the last request or stream activity.
    last_activity_ms: AtomicU64,
    /// Reference point of `last_activity_ms`.
    epoch: Instant,
    /// POST requests of this connection currently being served.
    active_requests: AtomicUsize,
    /// Raw JSON-RPC ids of this connection's requests the agent has not answered.
    in_flight: Mutex<HashSet<Box<str>>>,
    /// Sessions this connection is attached to (receives their updates).
    sessions: Mutex<HashSet<Arc<str>>>,
    /// Whether any session lane exists: until one does, a push need not
    /// look for a session id (the `/v2/rpc` case).
    has_lanes: AtomicBool,
    /// Where replays and stream gaps are counted (`None`: uncounted).
    metrics: Option<Arc<Metrics>>,
    /// Counts the connection in `acp_connections{transport}` until it
    /// closes.
    counted: Mutex<Option<GaugeGuard>>,
}

/// Which stream of a connection an event belongs to: `None` is the
/// connection's own stream, `Some(session)` a session stream.
pub type Lane = Option<Arc<str>>;

#[derive(Debug)]
struct State {
    events: VecDeque<Event>,
    bytes: usize,
    /// Sequence number the next event gets; starts at 1.
    next_seq: u64,
    /// The live stream of each lane that has one.
    streams: HashMap<Lane, LiveStream>,
    /// Sessions with a lane of their own (a session stream was opened).
    lanes: HashSet<Arc<str>>,
    /// Per lane, the sequence number of its newest event dropped from the
    /// ring (for the gap notice).
    dropped: HashMap<Lane, u64>,
    stream_generation: u64,
    limits: ReplayLimits,
    closed: bool,
    /// The server-wide account the ring's bytes are charged to (`None`:
    /// uncounted; research/contract.md, "Memory budget").
    budget: Option<Arc<MemoryBudget>>,
}

impl State {
    /// Drops the oldest event, noting it for its lane's gap notice; returns
    /// whether there was one.
    fn pop_oldest(&mut self) -> bool {
        let Some(old) = self.events.pop_front() else {
            return false;
        };
        let cost = old.json.len() + EVENT_OVERHEAD;
        self.bytes -= cost;
        if let Some(budget) = &self.budget {
            budget.release(cost);
        }
        self.dropped.insert(old.lane, old.seq);
        true
    }
}

impl Drop for State {
    fn drop(&mut self) {
        if let Some(budget) = &self.budget {
            budget.release(self.bytes);
        }
    }
}

#[derive(Debug)]
struct Event {
    seq: u64,
    lane: Lane,
    json: Bytes,
}

/// What one event costs against [`ReplayLimits::bytes`] beside its JSON:
/// about what SSE framing adds (`event: message`, `id:`, `data:`), so the
/// bound means the same bytes on every transport.
pub const EVENT_OVERHEAD: usize = 48;

/// One message a stream writes: the JSON of a ring event with its sequence
/// number, or a notice the stream made (`seq: None`, no `id:`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// The event's sequence number; `None` for a stream's own notice.
    pub seq: Option<u64>,
    /// One JSON-RPC object on one line.
    pub json: Bytes,
}

#[derive(Debug)]
struct LiveStream {
    generation: u64,
    wake: Arc<Notify>,
}

/// Most bytes one [`Stream::next_batch`] hands out when several
/// events are waiting (one event is always handed out, whatever its size).
pub const BATCH_BYTES: usize = 256 * 1024;

impl Connection {
    /// A new connection with an empty ring.
    pub fn new(
        id: Arc<str>,
        agent: Arc<str>,
        capabilities: ClientCapabilities,
        profile: Profile,
        limits: ReplayLimits,
        epoch: Instant,
    ) -> Self {
        let connection = Self {
            id,
            agent,
            capabilities,
            profile,
            state: Mutex::new(State {
                events: VecDeque::new(),
                bytes: 0,
                next_seq: 1,
                streams: HashMap::new(),
                lanes: HashSet::new(),
                dropped: HashMap::new(),
                stream_generation: 0,
                limits,
                closed: false,
                budget: None,
            }),
            closed: CancellationToken::new(),
            last_activity_ms: AtomicU64::new(0),
            epoch,
            active_requests: AtomicUsize::new(0),
            in_flight: Mutex::new(HashSet::new()),
            sessions: Mutex::new(HashSet::new()),
            has_lanes: AtomicBool::new(false),
            metrics: None,
            counted: Mutex::new(None),
        };
        connection.touch();
        connection
    }

    /// Appends one JSON-RPC object (`json`: one line of JSON, no CR/LF) as the
    /// next event and wakes the live stream of its lane. Returns its
    /// sequence number, or `None` when the connection is closed (the message
    /// is dropped).
    ///
    /// The event goes to the lane of `session` (the session the message
    /// belongs to, as the caller parsed it) when that session has a lane,
    /// else to the connection lane: the ring never parses a message.
    pub fn push(&self, json: Bytes, session: Option<&str>) -> Option<u64> {
        let mut state = self.state.lock();
        if state.closed {
            return None;
        }
        let lane: Lane = match session {
            Some(id) if self.has_lanes.load(Ordering::Acquire) => state.lanes.get(id).cloned(),
            _ => None,
        };
        let seq = state.next_seq;
        state.next_seq += 1;
        state.bytes += json.len() + EVENT_OVERHEAD;
        if let Some(budget) = &state.budget {
            budget.charge(json.len() + EVENT_OVERHEAD);
        }
        if let Some(stream) = state.streams.get(&lane) {
            stream.wake.notify_one();
        }
        state.events.push_back(Event { seq, lane, json });
        let limits = state.limits;
        while state.events.len() > limits.events
            || (state.bytes > limits.bytes && state.events.len() > 1)
        {
            state.pop_oldest();
        }
        Some(seq)
    }

    /// Charges this connection's ring to `budget` from now on (call it
    /// before the first push).
    pub fn with_budget(mut self, budget: Arc<MemoryBudget>) -> Self {
        self.state.get_mut().budget = Some(budget);
        self
    }

    /// Counts the connection as open on `transport` until it closes, and
    /// its replays and stream gaps, in `metrics` (research/contract.md,
    /// "Metrics").
    pub(crate) fn with_metrics(mut self, metrics: Arc<Metrics>, transport: Transport) -> Self {
        *self.counted.get_mut() = Some(GaugeGuard::new(metrics.connections(transport)));
        self.metrics = Some(metrics);
        self
    }

    /// Bytes the ring holds, as [`ReplayLimits::bytes`] counts them.
    pub fn ring_bytes(&self) -> usize {
        self.state.lock().bytes
    }

    /// Evicts the oldest events until the ring holds at most `keep` bytes,
    /// as if the replay limits had dropped them: a stream that had not sent
    /// them gets a `_sandboxagent/stream/gap` notice (research/contract.md,
    /// "Transport: /v2/rpc", GET). Returns how many went.
    pub fn evict_to(&self, keep: usize) -> u64 {
        let mut state = self.state.lock();
        let mut evicted = 0;
        while state.bytes > keep && state.pop_oldest() {
            evicted += 1;
        }
        evicted
    }

    /// Opens the live stream, replaying from after `last_event_id`.
    ///
    /// Without `last_event_id` the stream starts at the oldest buffered event,
    /// and a live stream means 409. With it, a live stream is taken over (the
    /// old one ends): that is how a client resumes after a half-open TCP
    /// connection (research/contract.md, "Transport: /v2/rpc", GET).
    ///
    /// # Errors
    /// [`Error::StreamConflict`], [`Error::InvalidLastEventId`] when the id is
    /// past the newest event, [`Error::UnknownConnection`] when closed.
    pub fn open_stream(self: &Arc<Self>, last_event_id: Option<u64>) -> Result<Stream, Error> {
        self.open_lane_stream(None, last_event_id)
    }

    /// [`Connection::open_stream`] for one lane: `Some(session)` gives the
    /// session a lane of its own first (its later events go there).
    ///
    /// # Errors
    /// As [`Connection::open_stream`].
    pub fn open_lane_stream(
        self: &Arc<Self>,
        session: Option<&str>,
        last_event_id: Option<u64>,
    ) -> Result<Stream, Error> {
        let mut state = self.state.lock();
        if state.closed {
            return Err(Error::UnknownConnection(self.id.to_string()));
        }
        let newest = state.next_seq - 1;
        if let Some(id) = last_event_id
            && id > newest
        {
            return Err(Error::InvalidLastEventId(format!(
                "Last-Event-ID {id} is newer than the newest event of this connection ({newest})"
            )));
        }
        let lane: Lane = match session {
            None => None,
            Some(id) => {
                let id: Arc<str> = match state.lanes.get(id) {
                    Some(known) => known.clone(),
                    None => {
                        let id = Arc::<str>::from(id);
                        state.lanes.insert(id.clone());
                        self.has_lanes.store(true, Ordering::Release);
                        id
                    }
                };
                Some(id)
            }
        };
        if let Some(old) = state.streams.remove(&lane) {
            if last_event_id.is_none() {
                state.streams.insert(lane, old);
                return Err(Error::StreamConflict);
            }
            // The old stream sees the generation change and ends.
            old.wake.notify_one();
        }
        state.stream_generation += 1;
        let wake = Arc::new(Notify::new());
        let live = LiveStream {
            generation: state.stream_generation,
            wake: wake.clone(),
        };
        state.streams.insert(lane.clone(), live);
        let generation = state.stream_generation;
        if let (Some(metrics), Some(after)) = (&self.metrics, last_event_id) {
            let oldest = state.events.front().map_or(state.next_seq, |e| e.seq);
            metrics.events_replayed(newest.saturating_sub(after.max(oldest.saturating_sub(1))));
        }
        drop(state);
        self.touch();
        Ok(Stream {
            connection: self.clone(),
            lane,
            generation,
            sent: last_event_id.unwrap_or(0),
            wake,
        })
    }

    /// Sequence number of the newest event (0 before the first).
    pub fn newest_event_id(&self) -> u64 {
        self.state.lock().next_seq - 1
    }

    /// Whether a live stream is attached.
    pub fn has_stream(&self) -> bool {
        !self.state.lock().streams.is_empty()
    }

    /// Closes the connection: drops the ring, ends the live stream, and
    /// cancels [`Connection::closed`]. Idempotent.
    pub fn close(&self) {
        let mut state = self.state.lock();
        state.closed = true;
        state.events = VecDeque::new();
        if let Some(budget) = &state.budget {
            budget.release(state.bytes);
        }
        state.bytes = 0;
        for (_, stream) in state.streams.drain() {
            stream.wake.notify_one();
        }
        drop(state);
        self.counted.lock().take();
        self.closed.cancel();
    }

    /// Cancelled once the connection is closed.
    pub fn closed(&self) -> &CancellationToken {
        &self.closed
    }

    /// Whether [`Connection::close`] ran.
    pub fn is_closed(&self) -> bool {
        self.closed.is_cancelled()
    }

    /// Records activity now (resets the idle clock).
    pub fn touch(&self) {
        let now = self.epoch.elapsed().as_millis() as u64;
        self.last_activity_ms.store(now, Ordering::Relaxed);
    }

    /// Milliseconds since the last activity, for idle reaping.
    pub fn idle_ms(&self) -> u64 {
        let now = self.epoch.elapsed().as_millis() as u64;
        now.saturating_sub(self.last_activity_ms.load(Ordering::Relaxed))
    }

    /// Marks a POST as being served until the guard drops.
    pub fn begin_request(self: &Arc<Self>) -> RequestGuard {
        self.active_requests.fetch_add(1, Ordering::AcqRel);
        self.touch();
        RequestGuard {
            connection: self.clone(),
        }
    }

    /// Whether any POST of this connection is being served.
    pub fn has_active_requests(&self) -> bool {
        self.active_requests.load(Ordering::Acquire) > 0
    }

    /// Registers request id `raw_id` (raw JSON) as in flight until the
    /// returned guard is dropped, or, once the request is forwarded, until
    /// the router releases it with the answer ([`InFlightId::hand_over`]).
    ///
    /// # Errors
    /// [`Refused::Duplicate`] if the id already is in flight: the second
    /// request is answered with -32600 whoever would answer it, the agent or
    /// the runtime (research/contract.md, "Transport: /v2/rpc", edge rules).
    /// [`Refused::Full`] at [`MAX_IN_FLIGHT`] requests: `/acp` answers a
    /// request 202 before it runs, so without this bound one client could
    /// pile up pending requests (and their tasks) without end.
    pub fn claim_request_id<'a>(&'a self, raw_id: &'a str) -> Result<InFlightId<'a>, Refused> {
        let mut in_flight = self.in_flight.lock();
        if in_flight.contains(raw_id) {
            return Err(Refused::Duplicate);
        }
        if in_flight.len() >= MAX_IN_FLIGHT {
            return Err(Refused::Full);
        }
        in_flight.insert(raw_id.into());
        drop(in_flight);
        Ok(InFlightId {
            connection: self,
            raw_id,
            armed: true,
        })
    }

    /// Forgets an in-flight request id once its answer was produced.
    pub fn release_request_id(&self, raw_id: &str) {
        self.in_flight.lock().remove(raw_id);
    }

    /// Records that this connection is attached to `session`.
    pub fn attach_session(&self, session: Arc<str>) {
        self.sessions.lock().insert(session);
    }

    /// Records that this connection no longer receives `session`.
    pub fn detach_session(&self, session: &str) {
        self.sessions.lock().remove(session);
    }

    /// The sessions this connection is attached to.
    pub fn attached_sessions(&self) -> Vec<Arc<str>> {
        self.sessions.lock().iter().cloned().collect()
    }
}

/// Requests one connection may have in flight at once.
pub const MAX_IN_FLIGHT: usize = 1024;

/// Why [`Connection::claim_request_id`] refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The id is already in flight on this connection.
    Duplicate,
    /// [`MAX_IN_FLIGHT`] requests are in flight already.
    Full,
}

/// A request id claimed on its connection; released when dropped, unless
/// handed over to whoever answers it later.
#[derive(Debug)]
pub struct InFlightId<'a> {
    connection: &'a Connection,
    raw_id: &'a str,
    armed: bool,
}

impl InFlightId<'_> {
    /// The request was forwarded: the router releases the id when it
    /// delivers the answer.
    pub fn hand_over(mut self) {
        self.armed = false;
    }
}

impl Drop for InFlightId<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.connection.release_request_id(self.raw_id);
        }
    }
}

/// Counts a POST as active while alive.
#[derive(Debug)]
pub struct RequestGuard {
    connection: Arc<Connection>,
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.connection
            .active_requests
            .fetch_sub(1, Ordering::AcqRel);
        self.connection.touch();
    }
}

/// What [`Stream::next_batch`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Batch {
    /// Messages were appended to the caller's buffer (a gap notice first
    /// when there is one), to write in order.
    Data,
    /// Nothing new; wait on [`Stream::wake`].
    Idle,
    /// The stream was taken over or the connection closed.
    Ended,
}

/// The live SSE stream of a connection: a cursor into its ring.
/// Dropping it frees the connection's stream slot (unless it was taken over).
#[derive(Debug)]
pub struct Stream {
    connection: Arc<Connection>,
    /// The lane this stream reads.
    lane: Lane,
    generation: u64,
    /// Sequence number of the last event written to this stream.
    sent: u64,
    wake: Arc<Notify>,
}

impl Stream {
    /// Appends the next events after the cursor to `out`, up to about
    /// [`BATCH_BYTES`] (each event counted as for the byte bound: its JSON
    /// plus [`EVENT_OVERHEAD`]; at least one event), with a
    /// `_sandboxagent/stream/gap` notice first when events the client has not
    /// seen were already dropped from the ring. The JSON is shared with the
    /// ring, not copied.
    ///
    /// Events of other lanes are stepped over: the cursor is a sequence
    /// number of the whole ring.
    pub fn next_batch(&mut self, out: &mut Vec<Outgoing>) -> Batch {
        let state = self.connection.state.lock();
        if state.closed
            || state.streams.get(&self.lane).map(|s| s.generation) != Some(self.generation)
        {
            return Batch::Ended;
        }
        // A ring evicted to empty (the memory budget can empty it) holds
        // nothing from `next_seq` on: events before that are gone and
        // still get the gap notice (research/contract.md, "Transport:
        // /v2/rpc", GET).
        let oldest = state.events.front().map_or(state.next_seq, |e| e.seq);
        let before = out.len();
        let dropped = state.dropped.get(&self.lane).copied().unwrap_or(0);
        if dropped > self.sent {
            if let Some(metrics) = &self.connection.metrics {
                metrics.stream_gap();
            }
            let gap = StreamGap {
                from: self.sent + 1,
                to: dropped,
            };
            out.push(Outgoing {
                seq: None,
                json: Bytes::from(protocol::notification_line(STREAM_GAP, &gap)),
            });
        }
        self.sent = self.sent.max(oldest - 1);
        let start = (self.sent + 1 - oldest) as usize;
        let mut bytes = 0;
        let mut full = false;
        for event in state
            .events
            .range(start.min(state.events.len())..)
            .filter(|event| event.lane == self.lane)
        {
            let size = event.json.len() + EVENT_OVERHEAD;
            if bytes > 0 && bytes + size > BATCH_BYTES {
                full = true;
                break;
            }
            bytes += size;
            out.push(Outgoing {
                seq: Some(event.seq),
                json: event.json.clone(),
            });
            self.sent = event.seq;
        }
        if !full {
            // Nothing of this lane is left: step over the rest.
            self.sent = state.next_seq - 1;
        }
        if out.len() == before {
            Batch::Idle
        } else {
            Batch::Data
        }
    }

    /// Woken when an event is pushed, the stream is taken over, or the
    /// connection closes.
    pub fn wake(&self) -> &Arc<Notify> {
        &self.wake
    }

    /// The connection this stream belongs to.
    pub fn connection(&self) -> &Arc<Connection> {
        &self.connection
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let mut state = self.connection.state.lock();
        if state.streams.get(&self.lane).map(|s| s.generation) == Some(self.generation) {
            state.streams.remove(&self.lane);
        }
        drop(state);
        self.connection.touch();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connection(events: usize) -> Arc<Connection> {
        Arc::new(unshared(ReplayLimits {
            events,
            bytes: usize::MAX,
        }))
    }

    /// A `/v2/rpc` connection with `limits`, not yet shared.
    fn unshared(limits: ReplayLimits) -> Connection {
        Connection::new(
            "c".into(),
            "mock".into(),
            ClientCapabilities::default(),
            Profile::V2Rpc,
            limits,
            Instant::now(),
        )
    }

    /// The next batch of `stream`, its ids in order ("gap" for a notice).
    fn ids(stream: &mut Stream) -> Vec<String> {
        let mut out = Vec::new();
        stream.next_batch(&mut out);
        out.iter()
            .map(|m| {
                m.seq
                    .map_or_else(|| "gap".to_owned(), |seq| seq.to_string())
            })
            .collect()
    }

    /// What the next [`Stream::next_batch`] says, its messages dropped.
    fn next(stream: &mut Stream) -> Batch {
        stream.next_batch(&mut Vec::new())
    }

    fn empty_object() -> Bytes {
        Bytes::from_static(b"{}")
    }

    #[test]
    fn request_ids_are_claimed_once_and_bounded_per_connection() {
        let c = connection(16);
        let first = c.claim_request_id("1").expect("free");
        assert_eq!(c.claim_request_id("1").err(), Some(Refused::Duplicate));
        // A refused claim leaves the first one in place.
        assert_eq!(c.claim_request_id("1").err(), Some(Refused::Duplicate));
        drop(first);
        let ids: Vec<String> = (0..MAX_IN_FLIGHT).map(|i| format!("\"r{i}\"")).collect();
        for id in &ids {
            c.claim_request_id(id).expect("under the bound").hand_over();
        }
        assert_eq!(c.claim_request_id("7").err(), Some(Refused::Full));
        c.release_request_id(&ids[0]);
        assert!(
            c.claim_request_id("7").is_ok(),
            "room again after an answer"
        );
    }

    #[test]
    fn replays_after_last_event_id_then_continues_live() {
        let c = connection(16);
        for _ in 0..5 {
            c.push(empty_object(), None);
        }
        let mut stream = c.open_stream(Some(3)).expect("open");
        assert_eq!(ids(&mut stream), ["4", "5"]);
        assert!(matches!(next(&mut stream), Batch::Idle));
        c.push(empty_object(), None);
        assert_eq!(ids(&mut stream), ["6"]);
    }

    #[test]
    fn gap_notice_when_ring_dropped_unseen_events() {
        let c = connection(3);
        for _ in 0..6 {
            c.push(empty_object(), None);
        }
        let mut stream = c.open_stream(None).expect("open");
        let mut out = Vec::new();
        assert_eq!(stream.next_batch(&mut out), Batch::Data);
        assert_eq!(
            out[0],
            Outgoing {
                seq: None,
                json: Bytes::from_static(b"{\"jsonrpc\":\"2.0\",\"method\":\"_sandboxagent/stream/gap\",\"params\":{\"from\":1,\"to\":3}}"),
            }
        );
        let seqs: Vec<_> = out[1..].iter().map(|m| m.seq).collect();
        assert_eq!(seqs, [Some(4), Some(5), Some(6)]);
    }

    #[test]
    fn second_stream_conflicts_unless_resuming() {
        let c = connection(8);
        c.push(empty_object(), None);
        let first = c.open_stream(None).expect("first");
        assert!(matches!(c.open_stream(None), Err(Error::StreamConflict)));
        let mut second = c.open_stream(Some(1)).expect("takeover");
        let mut first = first;
        assert!(matches!(next(&mut first), Batch::Ended));
        drop(first);
        assert!(c.has_stream(), "dropping the old stream keeps the new slot");
        assert!(matches!(next(&mut second), Batch::Idle));
        drop(second);
        assert!(!c.has_stream());
        assert!(c.open_stream(None).is_ok());
    }

    #[test]
    fn session_lanes_split_the_ring_and_resume_per_lane() {
        let c = connection(16);
        let update = |session: &str| {
            Bytes::from(format!(
                r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"{session}"}}}}"#
            ))
        };
        c.push(update("a"), Some("a"));
        let mut lane_a = c.open_lane_stream(Some("a"), None).expect("lane a");
        let mut main = c.open_stream(None).expect("connection lane");
        c.push(update("a"), Some("a"));
        c.push(update("b"), Some("b"));
        c.push(empty_object(), Some("a"));
        // Before the lane existed, "a" went to the connection lane.
        assert_eq!(ids(&mut main), ["1", "3"]);
        assert_eq!(ids(&mut lane_a), ["2", "4"]);
        assert!(matches!(next(&mut lane_a), Batch::Idle));
        assert!(matches!(
            c.open_lane_stream(Some("a"), None),
            Err(Error::StreamConflict)
        ));
        let mut resumed = c.open_lane_stream(Some("a"), Some(2)).expect("resume");
        assert!(matches!(next(&mut lane_a), Batch::Ended));
        assert_eq!(ids(&mut resumed), ["4"]);
    }

    #[test]
    fn last_event_id_past_newest_is_rejected() {
        let c = connection(8);
        c.push(empty_object(), None);
        assert!(matches!(
            c.open_stream(Some(2)),
            Err(Error::InvalidLastEventId(_))
        ));
        assert!(c.open_stream(Some(1)).is_ok());
    }

    #[test]
    fn byte_limit_keeps_newest_event() {
        let c = Arc::new(unshared(ReplayLimits {
            events: 100,
            bytes: 10,
        }));
        c.push(Bytes::from_static(b"{\"a\":1}"), None);
        c.push(Bytes::from_static(b"{\"b\":2}"), None);
        let mut stream = c.open_stream(Some(1)).expect("open");
        assert_eq!(ids(&mut stream), ["2"]);
    }

    #[test]
    fn closed_connection_drops_pushes_and_ends_stream() {
        let c = connection(8);
        let mut stream = c.open_stream(None).expect("open");
        c.close();
        assert_eq!(c.push(empty_object(), None), None);
        assert!(matches!(next(&mut stream), Batch::Ended));
    }

    #[test]
    fn capability_gate() {
        let caps = ClientCapabilities {
            read_text_file: true,
            ..Default::default()
        };
        assert!(caps.allows("session/request_permission"));
        assert!(caps.allows("fs/read_text_file"));
        assert!(!caps.allows("fs/write_text_file"));
        assert!(!caps.allows("terminal/create"));
    }

    #[test]
    fn budget_eviction_leaves_a_gap_notice_and_releases_the_budget() {
        let budget = Arc::new(MemoryBudget::new(usize::MAX));
        let conn = Arc::new(
            unshared(ReplayLimits {
                events: 100,
                bytes: usize::MAX,
            })
            .with_budget(budget.clone()),
        );
        for _ in 0..4 {
            conn.push(Bytes::from_static(b"{}"), None);
        }
        assert_eq!(budget.used(), 4 * (2 + EVENT_OVERHEAD));
        assert_eq!(conn.evict_to(2 * (2 + EVENT_OVERHEAD)), 2);
        assert_eq!(budget.used(), 2 * (2 + EVENT_OVERHEAD));
        let mut stream = conn.open_stream(Some(0)).expect("stream");
        let mut out = Vec::new();
        assert_eq!(stream.next_batch(&mut out), Batch::Data);
        let seqs: Vec<Option<u64>> = out.iter().map(|o| o.seq).collect();
        assert_eq!(seqs, [None, Some(3), Some(4)], "a gap notice, then 3 and 4");
        assert!(std::str::from_utf8(&out[0].json).is_ok_and(|j| j.contains(STREAM_GAP)));
        drop(stream);
        conn.close();
        assert_eq!(budget.used(), 0, "a closed connection releases its ring");
    }

    #[test]
    fn a_ring_evicted_to_empty_still_gives_the_gap_notice() {
        let c = connection(16);
        for _ in 0..3 {
            c.push(empty_object(), None);
        }
        assert_eq!(c.evict_to(0), 3);
        let mut resumed = c.open_stream(Some(1)).expect("resume");
        let mut out = Vec::new();
        assert_eq!(resumed.next_batch(&mut out), Batch::Data);
        assert_eq!(
            out,
            [Outgoing {
                seq: None,
                json: Bytes::from_static(b"{\"jsonrpc\":\"2.0\",\"method\":\"_sandboxagent/stream/gap\",\"params\":{\"from\":2,\"to\":3}}"),
            }]
        );
        assert!(matches!(next(&mut resumed), Batch::Idle), "one notice");
        c.push(empty_object(), None);
        assert_eq!(ids(&mut resumed), ["4"]);
        drop(resumed);
        let mut first = c.open_stream(None).expect("first GET");
        let mut out = Vec::new();
        assert_eq!(first.next_batch(&mut out), Batch::Data);
        let seqs: Vec<_> = out.iter().map(|m| m.seq).collect();
        assert_eq!(seqs, [None, Some(4)], "a gap notice for 1..=3, then 4");
    }
}
