//! The server-wide session inventory: which agent process hosts each
//! session, which connections are attached to it, its metadata and hints,
//! and its event log (research/contract.md,
//! "Routing: connections, sessions, one agent process" and
//! "Extension methods and control plane").

use crate::budget::MemoryBudget;
use crate::error::Error;
use crate::metrics::{self, Metrics, TurnClock};
use crate::otel::TurnTrace;
use crate::protocol;
use crate::state::connection::Connection;
use crate::state::event_log::{EventLog, LogLimits};
use crate::state::hints::Hints;
use crate::state::replay::Replay;
use crate::store::share::Share;
use crate::store::writer::{self, Persist};
use crate::store::{self, EventRow, SessionRow};
use crate::time::rfc3339;
use agent_client_protocol::v1::schema::{
    ContentBlock, PromptRequest, SessionConfigOption, SessionInfo, SessionMode, SessionModeState,
};
use bytes::Bytes;
use dashmap::DashMap;
use ext_methods::notification::SESSION_ENDED;
use ext_methods::{
    Direction, EndReason, ListModelsResult, ModelInfo, Role, SessionEnded, SessionEventsPage,
    SessionMeta,
};
use parking_lot::Mutex;
use serde_json::{Map, Value};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// Most bytes a session's `_meta["sandboxagent.dev"]` may take as JSON, at
/// `session/new` or `fork` and after any `set_metadata`
/// (research/contract.md, "`session/new` with metadata"): the inventory
/// keeps it in memory and in every store row, live or ended, so it is
/// small by rule.
pub const MAX_METADATA_BYTES: usize = 64 * 1024;

/// The size of `metadata` as JSON, in bytes.
pub fn metadata_size(metadata: &Map<String, Value>) -> usize {
    serde_json::to_vec(metadata).map_or(usize::MAX, |json| json.len())
}

/// One ACP session known to the runtime.
#[derive(Debug)]
pub struct Session {
    /// The agent's session id.
    pub id: Arc<str>,
    /// The agent id that hosts it.
    pub agent: Arc<str>,
    /// Generation of the agent process that hosts it; its exit ends the session.
    pub process_generation: u64,
    /// When the runtime first saw it.
    pub created_at: SystemTime,
    /// Where its changes are stored; `None` with `--store memory`.
    persist: Option<Arc<Persist>>,
    /// Its agent's share of the store's queue (`None` with `--store memory`).
    share: Option<Arc<Share>>,
    /// Replaced, revived or forgotten: another entry owns its store key now,
    /// so nothing of this one is stored any more.
    retired: std::sync::atomic::AtomicBool,
    state: Mutex<SessionState>,
    /// Where the entry is counted in `sessions{state}` while it is one of
    /// the listing's (`None`: an inventory without metrics); see
    /// `SessionState::counted`.
    metrics: Option<Arc<Metrics>>,
    /// When the current prompt turn started, until its first update.
    pub(crate) turn_clock: TurnClock,
    /// The spans of the current prompt turn while tracing is on
    /// (research/contract.md, "Traces"); untouched otherwise.
    pub(crate) turn_trace: Mutex<TurnTrace>,
}

/// The state `sessions{state}` counts an entry in.
fn counted_state(state: &SessionState) -> metrics::SessionState {
    if state.ended.is_some() {
        metrics::SessionState::Ended
    } else if state.dormant {
        metrics::SessionState::Dormant
    } else {
        metrics::SessionState::Live
    }
}

impl Session {
    /// Takes the entry out of `sessions{state}`: it left the listing
    /// (forgotten, or replaced by a newer entry of its key).
    fn uncount(&self, state: &mut SessionState) {
        if std::mem::take(&mut state.counted)
            && let Some(metrics) = &self.metrics
        {
            metrics.sessions(counted_state(state)).dec();
        }
    }
}

/// A connection attached to a session, with what it may do
/// (research/contract.md, "`_sandboxagent/session/attach`").
#[derive(Debug, Clone)]
struct Attached {
    connection: Arc<Connection>,
    role: Role,
}

/// One event read from the store for a replay: offset, direction, message.
pub type StoredEvent = (u64, Direction, Bytes);

/// What [`Session::attach_with_history`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachOutcome {
    /// Attached: `replayed` messages went to the connection before any live
    /// one, covering the log up to `next_offset`.
    Attached {
        /// Event-log offset just past the replay.
        next_offset: u64,
        /// Messages pushed to the connection.
        replayed: u64,
    },
    /// The session has ended: nothing was attached.
    Ended,
    /// Memory evicted events past what the caller read from the store:
    /// read the store again up to [`Session::first_offset_in_memory`].
    ReadAgain,
}

/// The events of a replay that only the store holds: those before
/// `until`, the oldest offset memory held when they were read.
#[derive(Debug, Default)]
pub struct FromStore {
    /// Events at or after the replay's start, below `until`, in order.
    pub events: Vec<StoredEvent>,
    /// The first offset the read did not cover.
    pub until: u64,
}

#[derive(Debug)]
struct SessionState {
    cwd: Option<String>,
    attached: Vec<Attached>,
    updated_at: SystemTime,
    ended: Option<EndReason>,
    /// `_meta["sandboxagent.dev"]` as stored from `session/new` and `set_metadata`.
    metadata: Map<String, Value>,
    title: Option<String>,
    model: Option<String>,
    mode: Option<String>,
    models: Option<Vec<ModelInfo>>,
    /// Available modes (ACP `SessionMode` objects) as last reported.
    modes: Option<Vec<Value>>,
    /// Config options as last reported.
    config_options: Option<Vec<SessionConfigOption>>,
    log: EventLog,
    /// Restored from the store and not loaded since: its agent process is
    /// gone (research/contract.md, "Durable sessions").
    dormant: bool,
    /// The text of the first `session/prompt`, cut to
    /// [`FIRST_PROMPT_CHARS`] characters.
    first_prompt: Option<String>,
    /// When memory last took it in (created, or read from the store): the
    /// cache drops the longest untouched first, never one just recalled.
    touched: std::time::Instant,
    /// Read from the store into memory (by id, for a request that names
    /// it) rather than made here: only such an entry is pinned in the
    /// cache for [`RECALL_PIN`] (a `session/load` may wait for the agent).
    recalled: bool,
    /// Whether `sessions{state}` counts this entry: the gauge counts what
    /// the listing shows, each key once wherever it is held (research/
    /// contract.md, "Metrics"). Set for an entry of the inventory (made, or
    /// read from the store into memory, whose key was counted already),
    /// cleared when it leaves the listing; never set for the entries a
    /// listing page reads from the store to show. Memory dropping a cached
    /// entry leaves it counted: the store still lists it.
    counted: bool,
}

/// Most characters of a first prompt an entry keeps.
pub const FIRST_PROMPT_CHARS: usize = 200;

/// Non-live entries (ended or dormant) memory keeps with a store: past
/// this, the least recently changed are dropped from memory (their rows
/// stay in the store, which answers for them).
pub const CACHED_ENTRIES: usize = 1_000;

/// A cached entry taken in this recently is not evicted (a `session/load`
/// recalled it and waits for the agent), unless the cache holds ten times
/// [`CACHED_ENTRIES`].
const RECALL_PIN: std::time::Duration = std::time::Duration::from_secs(120);

/// What a listing shows (`GET /v2/sessions`, `session/list`).
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    /// Only this agent's sessions.
    pub agent: Option<String>,
    /// Only sessions with this `cwd`.
    pub cwd: Option<String>,
    /// Only sessions in this state.
    pub state: Option<ListState>,
    /// Only sessions whose title contains this (ASCII case-insensitive).
    pub title: Option<String>,
}

/// The state a listing filters on (the `state` query parameter of
/// `GET /v2/sessions`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, utoipa::ToSchema)]
#[schema(rename_all = "lowercase")]
pub enum ListState {
    /// Hosted by a running agent process.
    Live,
    /// Restored from the store and not loaded since.
    Dormant,
    /// Ended.
    Ended,
}

impl ListFilter {
    /// Whether `session` passes every filter.
    pub fn admits(&self, session: &Session) -> bool {
        let state = session.state.lock();
        let now = if state.ended.is_some() {
            ListState::Ended
        } else if state.dormant {
            ListState::Dormant
        } else {
            ListState::Live
        };
        self.agent.as_deref().is_none_or(|a| a == &*session.agent)
            && self
                .cwd
                .as_deref()
                .is_none_or(|c| state.cwd.as_deref() == Some(c))
            && self.state.is_none_or(|wanted| wanted == now)
            && self.title.as_deref().is_none_or(|needle| {
                state.title.as_deref().is_some_and(|title| {
                    title
                        .to_ascii_lowercase()
                        .contains(&needle.to_ascii_lowercase())
                })
            })
    }
}

impl Session {
    /// The connections that receive this session's updates, whatever their
    /// role.
    pub fn attached(&self) -> Vec<Arc<Connection>> {
        let state = self.state.lock();
        state
            .attached
            .iter()
            .map(|a| a.connection.clone())
            .collect()
    }

    /// The attached connections that receive agent requests (controllers).
    pub fn controllers(&self) -> Vec<Arc<Connection>> {
        controllers(&self.state.lock().attached)
    }

    /// The role `connection` is attached with, if it is attached.
    pub fn role_of(&self, connection: &Connection) -> Option<Role> {
        let state = self.state.lock();
        state
            .attached
            .iter()
            .find(|a| std::ptr::eq(a.connection.as_ref(), connection))
            .map(|a| a.role)
    }

    /// Attaches `connection` as a controller (a `session/new`, `load`,
    /// `resume` or `fork`); one attached already keeps its role.
    pub fn attach(&self, connection: &Arc<Connection>) {
        let mut state = self.state.lock();
        if !state
            .attached
            .iter()
            .any(|a| Arc::ptr_eq(&a.connection, connection))
        {
            state.attached.push(Attached {
                connection: connection.clone(),
                role: Role::Controller,
            });
        }
        drop(state);
        connection.attach_session(self.id.clone());
    }

    /// Attaches `connection` with `role` after replaying the session's
    /// history from log offset `start` (`None`: no history) to it alone
    /// (research/contract.md, "The replay"). The last part of the replay
    /// is pushed and the connection attached under the session's lock, the
    /// one under which every new event is recorded and delivered: every
    /// later event reaches it live, after the replay, so there is neither a
    /// gap nor a duplicate between the two. The bulk is built outside the
    /// lock (from shared copies of the log's messages), so a long history
    /// does not hold the agent's stdout loop. Events memory no longer holds
    /// come from `stored` (read from the store by the caller); those
    /// neither holds are a gap marker. A connection attached already gets
    /// its new role.
    pub fn attach_with_history(
        &self,
        connection: &Arc<Connection>,
        role: Role,
        start: Option<u64>,
        stored: &FromStore,
    ) -> AttachOutcome {
        /// Events still to take when the replay is finished under the lock.
        const UNDER_LOCK: u64 = 256;
        /// Rounds outside the lock before finishing under it whatever is left.
        const ROUNDS: usize = 8;
        let mut replay = None;
        if let Some(start) = start {
            let state = self.state.lock();
            if state.ended.is_some() {
                return AttachOutcome::Ended;
            }
            let first = state.log.first_offset();
            if self.store().is_some() && start < first && stored.until < first {
                return AttachOutcome::ReadAgain;
            }
            let held = copy_entries(&state.log, start.max(first));
            drop(state);
            let mut building = Replay::new(&self.id, start);
            for (offset, direction, message) in &stored.events {
                if *offset < first {
                    building.push(*offset, *direction, message);
                }
            }
            for (offset, direction, message) in &held {
                building.push(*offset, *direction, message);
            }
            replay = Some(building);
        }
        let mut rounds = 0;
        let mut state = loop {
            let state = self.state.lock();
            // A closed connection would stay attached for the session's
            // life (its close detached it already): nothing to attach.
            if state.ended.is_some() || connection.is_closed() {
                return AttachOutcome::Ended;
            }
            // Attached already: it has the history and the live updates
            // since; only its role changes (a replay would repeat them).
            if let Some(attached) = state
                .attached
                .iter()
                .position(|a| Arc::ptr_eq(&a.connection, connection))
            {
                let count = state.log.count();
                let mut state = state;
                state.attached[attached].role = role;
                return AttachOutcome::Attached {
                    next_offset: count,
                    replayed: 0,
                };
            }
            let Some(building) = replay.as_mut() else {
                break state;
            };
            rounds += 1;
            if state.log.count().saturating_sub(building.expected()) <= UNDER_LOCK
                || rounds >= ROUNDS
            {
                break state;
            }
            // A busy log moved on meanwhile: catch up outside the lock.
            let held = copy_entries(&state.log, building.expected());
            drop(state);
            for (offset, direction, message) in &held {
                building.push(*offset, *direction, message);
            }
        };
        let count = state.log.count();
        let mut replayed = 0;
        if let Some(mut building) = replay {
            for (offset, direction, message) in state.log.entries_from(building.expected()) {
                building.push(offset, direction, message);
            }
            building.gap_until(count);
            for line in building.into_lines() {
                if connection.push(line, Some(&self.id)).is_some() {
                    replayed += 1;
                }
            }
        }
        match state
            .attached
            .iter_mut()
            .find(|a| Arc::ptr_eq(&a.connection, connection))
        {
            Some(attached) => attached.role = role,
            None => state.attached.push(Attached {
                connection: connection.clone(),
                role,
            }),
        }
        drop(state);
        connection.attach_session(self.id.clone());
        AttachOutcome::Attached {
            next_offset: count,
            replayed,
        }
    }

    /// Stops delivery to `connection`; returns whether it was attached.
    pub fn detach(&self, connection: &Connection) -> bool {
        let mut state = self.state.lock();
        let before = state.attached.len();
        state
            .attached
            .retain(|a| !std::ptr::eq(a.connection.as_ref(), connection));
        let was_attached = state.attached.len() != before;
        drop(state);
        connection.detach_session(&self.id);
        was_attached
    }

    /// Marks the session ended and detaches every connection (nothing more of
    /// it is delivered; the event log still records it). Returns the
    /// connections that were attached, or `None` if it had already ended.
    pub fn end(&self, reason: EndReason) -> Option<Vec<Arc<Connection>>> {
        let mut state = self.state.lock();
        if state.ended.is_some() {
            return None;
        }
        if state.counted
            && let Some(metrics) = &self.metrics
        {
            metrics.sessions(counted_state(&state)).dec();
            metrics.sessions(metrics::SessionState::Ended).inc();
        }
        state.ended = Some(reason);
        state.dormant = false;
        state.updated_at = SystemTime::now();
        if self.store().is_some_and(|p| !p.is_shutting_down()) {
            self.store_row(&state);
        }
        let attached: Vec<Arc<Connection>> = std::mem::take(&mut state.attached)
            .into_iter()
            .map(|a| a.connection)
            .collect();
        drop(state);
        for connection in &attached {
            connection.detach_session(&self.id);
        }
        Some(attached)
    }

    /// Ends the session with `notice`'s reason and tells it: the
    /// `_sandboxagent/session/ended` notification goes into the event log
    /// and, once the log is committed to the store (at most
    /// `writer::DURABLE_WAIT`; at once with no store or a degraded one), to
    /// every connection that was attached: a client that saw the end sees
    /// every event before it after a restart (research/contract.md,
    /// "Durable sessions"). Returns `false` (and sends nothing) when the
    /// session had already ended.
    pub async fn end_with_notice(&self, notice: &SessionEnded) -> bool {
        let Some(attached) = self.end(notice.reason) else {
            return false;
        };
        let line = Bytes::from(protocol::notification_line(SESSION_ENDED, notice));
        // An end the shutdown caused is not stored: the session comes back
        // dormant (research/contract.md, "Durable sessions").
        let stored = self.persist.as_ref().is_none_or(|p| !p.is_shutting_down());
        {
            let mut state = self.state.lock();
            self.record_locked(
                &mut state,
                Direction::AgentToClient,
                line.clone(),
                stored,
                None,
            );
        }
        if stored {
            writer::until_committed(self.durable_barrier()).await;
        }
        for connection in attached {
            connection.push(line.clone(), Some(&self.id));
        }
        true
    }

    /// Whether the session ended.
    pub fn is_ended(&self) -> bool {
        self.state.lock().ended.is_some()
    }

    /// Whether the session was ended by `_sandboxagent/session/terminate`:
    /// then it is over for good (no load, resume or fork brings it back).
    pub fn is_terminated(&self) -> bool {
        self.state.lock().ended == Some(EndReason::Terminated)
    }

    /// Records one ACP message of this session in its event log.
    pub fn record(&self, direction: Direction, message: Bytes) {
        let mut state = self.state.lock();
        self.record_locked(&mut state, direction, message, true, None);
    }

    /// Records a client's message for which `room` was taken in the store's
    /// queue ([`Persist::room`]): never dropped from the store
    /// (research/contract.md, "Durable sessions"). `None` (no store) is
    /// [`Self::record`].
    pub(crate) fn record_admitted(&self, message: Bytes, room: Option<writer::Room>) {
        let mut state = self.state.lock();
        self.record_locked(&mut state, Direction::ClientToAgent, message, true, room);
    }

    /// Records a client's message once room for it is taken in this
    /// session's share of the store's queue ([`Persist::room`]; at once
    /// with no store or a degraded one).
    ///
    /// # Errors
    /// [`Error::StoreBehind`] (503) when there was no room within
    /// [`writer::CLIENT_WAIT`]: the message is not recorded, and the caller
    /// must not forward it (research/contract.md, "Durable sessions").
    pub(crate) async fn record_client(&self, message: &Bytes) -> Result<(), Error> {
        let room = match (self.store(), &self.share) {
            (Some(persist), Some(share)) => persist
                .room(share, message.len())
                .await
                .map_err(|()| Error::StoreBehind)?,
            _ => None,
        };
        self.record_admitted(message.clone(), room);
        Ok(())
    }

    /// Records a message and pushes `line` (the same message) to every
    /// attached connection, under one lock and without copying the list.
    pub fn record_and_deliver(&self, direction: Direction, message: Bytes) {
        let mut state = self.state.lock();
        for attached in &state.attached {
            attached.connection.push(message.clone(), Some(&self.id));
        }
        self.record_locked(&mut state, direction, message, true, None);
    }

    /// Records a message and returns the attached controllers, under one
    /// lock (an agent request goes to them only).
    pub fn record_and_controllers(
        &self,
        direction: Direction,
        message: Bytes,
    ) -> Vec<Arc<Connection>> {
        let mut state = self.state.lock();
        self.record_locked(&mut state, direction, message, true, None);
        controllers(&state.attached)
    }

    /// Appends to the log and, when `stored`, queues the event for the
    /// store. Under the state lock, so the store sees one session's writes
    /// in the order they happened.
    fn record_locked(
        &self,
        state: &mut SessionState,
        direction: Direction,
        message: Bytes,
        stored: bool,
        room: Option<writer::Room>,
    ) {
        let now = SystemTime::now();
        state.updated_at = now;
        if stored
            && let Some(persist) = self.store()
            && let Some(share) = &self.share
        {
            let event = EventRow {
                offset: state.log.count(),
                at_ns: store::nanos(now),
                direction,
                message: message.clone(),
            };
            persist.event(share, &self.id, event, room);
        }
        state.log.record(now, direction, message);
    }

    /// Up to `limit` logged events at or after `offset`, from memory.
    pub fn events(&self, offset: u64, limit: usize) -> SessionEventsPage {
        self.state.lock().log.page(offset, limit)
    }

    /// Events recorded so far (the next event's offset).
    pub fn event_count(&self) -> u64 {
        self.state.lock().log.count()
    }

    /// Offset of the oldest event memory holds: older ones are only in the
    /// store (or were dropped).
    pub fn first_offset_in_memory(&self) -> u64 {
        self.state.lock().log.first_offset()
    }

    /// Evicts the oldest events of the log until at most `keep` bytes of
    /// messages stay in memory (research/contract.md, "Memory budget"):
    /// with a store they are read from it, else their offsets are a gap.
    /// Returns how many went.
    pub fn evict_events(&self, keep: usize) -> u64 {
        self.state.lock().log.evict_to(keep)
    }

    /// Bytes of messages the log holds in memory.
    pub fn log_bytes(&self) -> usize {
        self.state.lock().log.bytes()
    }

    /// When the session last changed (an event, a hint, its end).
    pub fn updated_at(&self) -> SystemTime {
        self.state.lock().updated_at
    }

    /// Whether its changes go to a store (not `--store memory`, not retired).
    pub fn is_stored(&self) -> bool {
        self.store().is_some()
    }

    /// Whether no agent process hosts it: ended, or dormant.
    pub fn is_gone(&self) -> bool {
        let state = self.state.lock();
        state.ended.is_some() || state.dormant
    }

    /// Stops storing anything of this entry (see `retired`).
    fn retire(&self) {
        self.retired
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Where this entry's changes go: `None` with `--store memory` or once
    /// it is retired.
    /// Resolves once every event recorded so far is committed to the store
    /// (or fails when the store turns degraded first); `None` with no
    /// store, a degraded one, or a retired entry: what a durable answer
    /// waits for (research/contract.md, "Durable sessions").
    pub fn durable_barrier(&self) -> Option<tokio::sync::oneshot::Receiver<()>> {
        self.store()?.barrier()
    }

    fn store(&self) -> Option<&Arc<Persist>> {
        self.persist
            .as_ref()
            .filter(|_| !self.retired.load(std::sync::atomic::Ordering::Acquire))
    }

    /// Whether the session was restored from the store and not loaded since.
    pub fn is_dormant(&self) -> bool {
        self.state.lock().dormant
    }

    /// The entry as the store keeps it.
    fn row(&self, state: &SessionState) -> SessionRow {
        SessionRow {
            agent: self.agent.clone(),
            session_id: self.id.clone(),
            cwd: state.cwd.clone(),
            created_ns: store::nanos(self.created_at),
            updated_ns: store::nanos(state.updated_at),
            end_reason: state.ended,
            metadata: state.metadata.clone(),
            event_count: state.log.count(),
            title: state.title.clone(),
            model: state.model.clone(),
            mode: state.mode.clone(),
            models: state.models.clone(),
            first_prompt: state.first_prompt.clone(),
        }
    }

    /// Keeps the text of the session's first `session/prompt` (`params`,
    /// ACP `PromptRequest`): its text blocks joined by a space, cut to
    /// [`FIRST_PROMPT_CHARS`] characters. Later prompts change nothing.
    pub fn note_prompt(&self, params: &serde_json::value::RawValue) {
        if self.state.lock().first_prompt.is_some() {
            return;
        }
        let Ok(request) = serde_json::from_str::<PromptRequest>(params.get()) else {
            return;
        };
        let text: Vec<&str> = request
            .prompt
            .iter()
            .filter_map(|block| match block {
                ContentBlock::Text(text) => Some(text.text.as_str()),
                _ => None,
            })
            .collect();
        let text: String = text.join(" ").chars().take(FIRST_PROMPT_CHARS).collect();
        if text.is_empty() {
            return;
        }
        let mut state = self.state.lock();
        if state.first_prompt.is_none() {
            state.first_prompt = Some(text);
            self.store_row(&state);
        }
    }

    /// Queues the entry for the store (no-op with `--store memory`).
    fn store_row(&self, state: &SessionState) {
        if let Some(persist) = self.store() {
            persist.session(self.row(state));
        }
    }

    /// Takes what an agent message said about title, mode and model.
    pub fn apply_hints(&self, hints: &Hints) {
        let mut state = self.state.lock();
        if let Some(title) = &hints.title {
            state.title.clone_from(title);
        }
        if let Some(mode) = &hints.mode {
            state.mode = Some(mode.clone());
        }
        if let Some(model) = &hints.model {
            state.model = Some(model.clone());
        }
        if let Some(models) = &hints.models {
            state.models = Some(models.clone());
        }
        if let Some(modes) = &hints.modes {
            state.modes = Some(modes.clone());
        }
        if let Some(options) = &hints.config_options {
            state.config_options = Some(options.clone());
        }
        self.store_row(&state);
    }

    /// [`Session::apply_metadata`], unless the merged metadata would be
    /// larger than [`MAX_METADATA_BYTES`] (as JSON): then nothing changes.
    ///
    /// # Errors
    /// The size the merged metadata would have had, in bytes.
    pub fn try_apply_metadata(&self, patch: &Map<String, Value>) -> Result<(), usize> {
        let mut merged = self.state.lock().metadata.clone();
        ext_methods::meta::merge(&mut merged, patch);
        let size = metadata_size(&merged);
        if size > MAX_METADATA_BYTES {
            return Err(size);
        }
        self.apply_metadata(patch);
        Ok(())
    }

    /// Merges `patch` into the stored metadata (JSON Merge Patch); `title`,
    /// `model` and `mode` in it also set (or, as `null`, clear) the hints.
    pub fn apply_metadata(&self, patch: &Map<String, Value>) {
        let mut state = self.state.lock();
        ext_methods::meta::merge(&mut state.metadata, patch);
        for (key, slot) in [("title", 0), ("model", 1), ("mode", 2)] {
            let Some(value) = patch.get(key) else {
                continue;
            };
            let value = value.as_str().map(str::to_owned);
            if value.is_none() && !patch[key].is_null() {
                continue;
            }
            match slot {
                0 => state.title = value,
                1 => state.model = value,
                _ => state.mode = value,
            }
        }
        state.updated_at = SystemTime::now();
        self.store_row(&state);
    }

    /// The namespace object of this session's entry.
    pub fn meta(&self) -> SessionMeta {
        let state = self.state.lock();
        let mut extra = state.metadata.clone();
        for key in ext_methods::meta::RUNTIME_KEYS
            .iter()
            .chain(&["title", "model", "mode"])
        {
            extra.remove(*key);
        }
        SessionMeta {
            agent: self.agent.to_string(),
            created_at: rfc3339(self.created_at),
            updated_at: rfc3339(state.updated_at),
            ended: state.ended.is_some(),
            dormant: state.dormant,
            event_count: state.log.count(),
            title: state.title.clone(),
            model: state.model.clone(),
            mode: state.mode.clone(),
            first_prompt: state.first_prompt.clone(),
            extra,
        }
    }

    /// This session as a `session/list` entry (ACP `SessionInfo`) with
    /// `_meta["sandboxagent.dev"]`.
    pub fn info(&self) -> SessionInfo {
        let meta = self.meta();
        let (cwd, updated_at, title) = {
            let state = self.state.lock();
            (
                state.cwd.clone().unwrap_or_default(),
                rfc3339(state.updated_at),
                state.title.clone(),
            )
        };
        let mut namespace = Map::new();
        if let Ok(value) = serde_json::to_value(&meta) {
            namespace.insert(ext_methods::NAMESPACE.to_owned(), value);
        }
        SessionInfo::new(self.id.to_string(), cwd)
            .title(title)
            .updated_at(updated_at)
            .meta(namespace)
    }

    /// The models this session's agent offers and the session's current model.
    pub fn models(&self) -> ListModelsResult {
        let state = self.state.lock();
        ListModelsResult {
            available_models: state.models.clone().unwrap_or_default(),
            current_model_id: state.model.clone(),
        }
    }

    /// What a `session/load` answer says about the session, from its hints
    /// (research/contract.md, "The replay"): its modes (current and
    /// available), its config options, and, for agents that predate config
    /// options, its models.
    pub fn load_hints(
        &self,
    ) -> (
        Option<SessionModeState>,
        Option<Vec<SessionConfigOption>>,
        Option<ListModelsResult>,
    ) {
        let state = self.state.lock();
        let modes = match (&state.mode, &state.modes) {
            (Some(current), Some(available)) => Some(SessionModeState::new(
                current.clone(),
                available
                    .iter()
                    .filter_map(|mode| serde_json::from_value::<SessionMode>(mode.clone()).ok())
                    .collect(),
            )),
            _ => None,
        };
        let models = match (&state.config_options, &state.models) {
            (None, Some(models)) => Some(ListModelsResult {
                available_models: models.clone(),
                current_model_id: state.model.clone(),
            }),
            _ => None,
        };
        (modes, state.config_options.clone(), models)
    }

    /// The working directory given at creation, if known.
    pub fn cwd(&self) -> Option<String> {
        self.state.lock().cwd.clone()
    }
}

/// Settings of the inventory.
#[derive(Debug, Clone, Copy)]
pub struct InventoryLimits {
    /// Bounds of each session's event log.
    pub log: LogLimits,
    /// Ended sessions kept (the oldest are forgotten past this).
    pub ended_sessions: usize,
}

/// All sessions of this server, by session id.
#[derive(Debug)]
pub struct Sessions {
    /// By session id, then one entry per agent: a session is named by (agent,
    /// session id), since two agents may choose the same id
    /// (research/contract.md, "Routing: connections, sessions, one agent
    /// process"). Almost always one entry per id.
    map: DashMap<Arc<str>, Vec<Arc<Session>>>,
    limits: InventoryLimits,
    /// Where changes are stored; `None` with `--store memory`.
    persist: Option<Arc<Persist>>,
    /// The account every log is charged to (`None`: uncounted).
    budget: Option<Arc<MemoryBudget>>,
    /// Where every entry is counted by state (`None`: uncounted).
    metrics: Option<Arc<Metrics>>,
    /// When the cache was last trimmed: a trim walks every entry, so it
    /// runs at most once per [`TRIM_INTERVAL`], not per insert.
    last_trim: Mutex<Option<std::time::Instant>>,
}

/// Least time between two walks of the cache (see `Sessions::trim`).
const TRIM_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// One page of `session/list` (ACP cursor pagination).
#[derive(Debug)]
pub struct ListPage {
    /// Newest first.
    pub sessions: Vec<Arc<Session>>,
    /// Cursor of the next page, if there is one.
    pub next_cursor: Option<String>,
}

impl Sessions {
    /// The store's writer (`None` with `--store memory`).
    pub(crate) fn store(&self) -> Option<&Arc<Persist>> {
        self.persist.as_ref()
    }

    /// An empty inventory whose changes go to `persist` (`None`: memory only).
    pub(crate) fn new(limits: InventoryLimits, persist: Option<Arc<Persist>>) -> Self {
        Self {
            map: DashMap::new(),
            limits,
            persist,
            budget: None,
            metrics: None,
            last_trim: Mutex::new(None),
        }
    }

    /// Counts the inventory in `sessions{state}` from now on, starting
    /// from `stored`: the store's entries at start, `(dormant, ended)`
    /// (research/contract.md, "Metrics").
    pub(crate) fn with_metrics(mut self, metrics: Arc<Metrics>, stored: (u64, u64)) -> Self {
        let gauge = |count: u64| i64::try_from(count).unwrap_or(i64::MAX);
        metrics
            .sessions(metrics::SessionState::Dormant)
            .inc_by(gauge(stored.0));
        metrics
            .sessions(metrics::SessionState::Ended)
            .inc_by(gauge(stored.1));
        self.metrics = Some(metrics);
        self
    }

    /// Counts a new key of the listing in `state`.
    fn count(&self, state: &mut SessionState) {
        if let Some(metrics) = &self.metrics {
            metrics.sessions(counted_state(state)).inc();
        }
        state.counted = true;
    }

    /// Charges every log made from now on to `budget` (research/contract.md,
    /// "Memory budget").
    pub(crate) fn with_budget(mut self, budget: Arc<MemoryBudget>) -> Self {
        self.budget = Some(budget);
        self
    }

    /// An empty log whose next event gets offset `count`, charged to the
    /// budget.
    fn log_from(&self, count: u64) -> EventLog {
        let log = EventLog::starting_at(self.limits.log, count);
        match &self.budget {
            Some(budget) => log.with_budget(budget.clone()),
            None => log,
        }
    }

    /// An entry of `row` as read from the store: ended as it was, live
    /// dormant (no agent process hosts it until a `session/load` or
    /// `session/resume`; research/contract.md, "Durable sessions"). Its
    /// events stay in the store: memory holds none of them. Not registered,
    /// not counted.
    pub fn entry_of_row(&self, row: SessionRow) -> Arc<Session> {
        self.entry_of_stored(row, false)
    }

    /// [`Self::entry_of_row`]; `counted`: an entry memory takes in, whose
    /// key `sessions{state}` counts already (see `SessionState::counted`).
    fn entry_of_stored(&self, row: SessionRow, counted: bool) -> Arc<Session> {
        let state = SessionState {
            cwd: row.cwd,
            attached: Vec::new(),
            updated_at: store::time_of(row.updated_ns),
            ended: row.end_reason,
            metadata: row.metadata,
            title: row.title,
            model: row.model,
            mode: row.mode,
            models: row.models,
            modes: None,
            config_options: None,
            log: self.log_from(row.event_count),
            dormant: row.end_reason.is_none(),
            first_prompt: row.first_prompt,
            touched: std::time::Instant::now(),
            recalled: true,
            counted,
        };
        Arc::new(Session {
            id: row.session_id,
            share: self.persist.as_ref().map(|p| p.share(&row.agent)),
            agent: row.agent,
            process_generation: RESTORED_GENERATION,
            created_at: store::time_of(row.created_ns),
            persist: self.persist.clone(),
            retired: std::sync::atomic::AtomicBool::new(false),
            metrics: self.metrics.clone(),
            turn_clock: TurnClock::default(),
            turn_trace: Mutex::default(),
            state: Mutex::new(state),
        })
    }

    /// Registers entries read from the store (see [`Self::entry_of_row`]) whose
    /// key memory does not hold: an entry in memory is always the newer.
    pub fn restore(&self, rows: Vec<SessionRow>) {
        for row in rows {
            let mut entry = self.map.entry(row.session_id.clone()).or_default();
            let of_agent = entry.value_mut();
            if of_agent.iter().any(|s| s.agent == row.agent) {
                continue;
            }
            of_agent.push(self.entry_of_stored(row, true));
        }
        self.trim();
    }

    /// Whether memory holds session `id` of `agent` (any agent's, for `None`).
    pub fn holds(&self, agent: Option<&str>, id: &str) -> bool {
        self.map.get(id).is_some_and(|entry| {
            agent.is_none_or(|agent| entry.value().iter().any(|s| &*s.agent == agent))
        })
    }

    /// Up to `limit` entries memory holds that `filter` admits, after
    /// `after` in the listing order (newest first). One pass over memory's
    /// entries, each key computed once, and only the page is sorted: with a
    /// store memory holds the live sessions and a bounded cache
    /// ([`CACHED_ENTRIES`]), so a page costs the same at any inventory size.
    pub fn page_in_memory(
        &self,
        filter: &ListFilter,
        after: Option<&SortKey>,
        limit: usize,
    ) -> Vec<Arc<Session>> {
        if limit == 0 {
            return Vec::new();
        }
        let mut keyed: Vec<(SortKey, Arc<Session>)> = self
            .each()
            .filter_map(|s| {
                let key = sort_key(&s);
                (after.is_none_or(|after| key < *after) && filter.admits(&s)).then_some((key, s))
            })
            .collect();
        let newest_first = |a: &(SortKey, Arc<Session>), b: &(SortKey, Arc<Session>)| b.0.cmp(&a.0);
        if keyed.len() > limit {
            keyed.select_nth_unstable_by(limit - 1, newest_first);
            keyed.truncate(limit);
        }
        keyed.sort_unstable_by(newest_first);
        keyed.into_iter().map(|(_, s)| s).collect()
    }

    /// Keeps memory bounded: without a store, forgets the oldest sessions
    /// past `--ended-sessions`; with one, drops the least recently changed
    /// non-live entries past [`CACHED_ENTRIES`] from memory only (the
    /// store answers for them; retention is the store's, see
    /// `Runtime::retain_stored`). Runs at most once per [`TRIM_INTERVAL`]:
    /// after inserts, and once a second from the runtime's trim task, so
    /// sessions that ended after the last insert leave memory too.
    pub(crate) fn trim(&self) {
        match &self.persist {
            None => self.forget_old_ended(),
            Some(persist) => {
                // The walk is O(entries): once a second at most, so
                // creating 100,000 sessions is not quadratic.
                {
                    let mut last = self.last_trim.lock();
                    if last.is_some_and(|at| at.elapsed() < TRIM_INTERVAL) {
                        return;
                    }
                    *last = Some(std::time::Instant::now());
                }
                self.evict_cold(persist);
            }
        }
    }

    /// Drops the longest untouched ended and dormant entries past
    /// [`CACHED_ENTRIES`] from memory, sparing those whose row the writer
    /// has not written yet, and those recalled from the store within
    /// [`RECALL_PIN`] (unless the cache is crowded). Entries that were made
    /// here and ended are not pinned: nothing waits on them, and a cache
    /// of thousands of them made every listing walk them.
    fn evict_cold(&self, persist: &Persist) {
        let cold = |s: &Arc<Session>| s.is_ended() || s.is_dormant();
        let mut entries: Vec<(std::time::Instant, bool, Arc<Session>)> = self
            .each()
            .filter_map(|s| {
                let state = s.state.lock();
                let place = (state.ended.is_some() || state.dormant)
                    .then_some((state.touched, state.recalled));
                drop(state);
                place.map(|(touched, recalled)| (touched, recalled, s))
            })
            .collect();
        if entries.len() <= CACHED_ENTRIES {
            return;
        }
        entries.sort_unstable_by_key(|(touched, _, _)| *touched);
        let mut excess = entries.len() - CACHED_ENTRIES;
        let crowded = entries.len() > 10 * CACHED_ENTRIES;
        for (touched, recalled, evicted) in entries {
            if excess == 0 {
                break;
            }
            if persist.row_pending(&evicted.agent, &evicted.id)
                || (!crowded && recalled && touched.elapsed() < RECALL_PIN)
            {
                continue;
            }
            self.map.remove_if_mut(&evicted.id, |_, of_agent| {
                of_agent.retain(|s| !(Arc::ptr_eq(s, &evicted) && cold(s)));
                of_agent.is_empty()
            });
            excess -= 1;
        }
    }

    /// Forgets session `id` of `agent` from memory and the store (store
    /// retention), unless it is live. `stored_ended`: whether the store's
    /// row ended, which `sessions{state}` counts it by when memory does not
    /// hold it.
    pub fn forget(&self, agent: &str, id: &str, stored_ended: bool) {
        let gone = |s: &Arc<Session>| s.is_ended() || s.is_dormant();
        let mut live = false;
        let mut held = Vec::new();
        self.map.remove_if_mut(id, |_, of_agent| {
            live = of_agent.iter().any(|s| &*s.agent == agent && !gone(s));
            if !live {
                of_agent.retain(|s| {
                    let keep = &*s.agent != agent;
                    if !keep {
                        held.push(s.clone());
                    }
                    keep
                });
            }
            of_agent.is_empty()
        });
        if live {
            return;
        }
        for forgotten in &held {
            forgotten.uncount(&mut forgotten.state.lock());
        }
        let queued = self
            .persist
            .as_ref()
            .is_some_and(|persist| persist.remove(&Arc::from(agent), &Arc::from(id)));
        // Only the store held it: counted by its row, once (a removal
        // already queued was uncounted when it was queued).
        if held.is_empty()
            && queued
            && let Some(metrics) = &self.metrics
        {
            let state = if stored_ended {
                metrics::SessionState::Ended
            } else {
                metrics::SessionState::Dormant
            };
            metrics.sessions(state).dec();
        }
    }

    /// Session `id` of `agent`.
    pub fn get(&self, agent: &str, id: &str) -> Option<Arc<Session>> {
        let entry = self.map.get(id)?;
        entry.value().iter().find(|s| &*s.agent == agent).cloned()
    }

    /// Every session named `id`, one per agent that has one (the control
    /// plane resolves an id without an agent; more than one is ambiguous).
    pub fn by_id(&self, id: &str) -> Vec<Arc<Session>> {
        self.map
            .get(id)
            .map(|entry| entry.value().clone())
            .unwrap_or_default()
    }

    /// Registers a session, or replaces an ended one (or one of an earlier
    /// process) with the same id: a reused id replaces the ended entry, and
    /// the old history goes with it (research/contract.md,
    /// "Routing: connections, sessions, one agent process"). A live entry of
    /// the same process is kept and returned.
    ///
    /// `load` says a `session/load` or `session/resume` succeeded: only then
    /// is a dormant entry revived; a `session/new` or `fork` that reuses its
    /// id replaces it like an ended one.
    pub fn insert(
        &self,
        id: &str,
        agent: Arc<str>,
        process_generation: u64,
        cwd: Option<String>,
        metadata: Map<String, Value>,
        load: bool,
    ) -> Arc<Session> {
        // A fresh entry, or the revival of a dormant one: the same entry
        // (created, metadata, hints) whose log goes on after the stored
        // events (research/contract.md, "Durable sessions").
        let make = |revived: Option<&Session>| {
            let now = SystemTime::now();
            let mut state = SessionState {
                cwd: cwd.clone(),
                attached: Vec::new(),
                updated_at: now,
                ended: None,
                metadata: Map::new(),
                title: None,
                model: None,
                mode: None,
                models: None,
                modes: None,
                config_options: None,
                log: self.log_from(0),
                dormant: false,
                first_prompt: None,
                touched: std::time::Instant::now(),
                recalled: false,
                counted: false,
            };
            self.count(&mut state);
            let mut created_at = now;
            if let Some(old) = revived {
                let old_state = old.state.lock();
                created_at = old.created_at;
                state.cwd = cwd.clone().or_else(|| old_state.cwd.clone());
                state.metadata = old_state.metadata.clone();
                state.title.clone_from(&old_state.title);
                state.model.clone_from(&old_state.model);
                state.mode.clone_from(&old_state.mode);
                state.models.clone_from(&old_state.models);
                state.first_prompt.clone_from(&old_state.first_prompt);
                state.modes.clone_from(&old_state.modes);
                state.config_options.clone_from(&old_state.config_options);
                state.log = self.log_from(old_state.log.count());
            }
            let session = Arc::new(Session {
                id: id.into(),
                agent: agent.clone(),
                process_generation,
                created_at,
                share: self.persist.as_ref().map(|p| p.share(&agent)),
                persist: self.persist.clone(),
                retired: std::sync::atomic::AtomicBool::new(false),
                metrics: self.metrics.clone(),
                turn_clock: TurnClock::default(),
                turn_trace: Mutex::default(),
                state: Mutex::new(state),
            });
            session.apply_metadata(&metadata);
            session
        };
        let session = {
            let mut entry = self.map.entry(id.into()).or_default();
            let of_agent = entry.value_mut();
            match of_agent.iter_mut().find(|s| s.agent == agent) {
                Some(existing)
                    if !existing.is_ended()
                        && existing.process_generation == process_generation =>
                {
                    existing.clone()
                }
                Some(dormant) if load && dormant.is_dormant() => {
                    dormant.retire();
                    dormant.uncount(&mut dormant.state.lock());
                    *dormant = make(Some(dormant));
                    dormant.clone()
                }
                Some(replaced) => {
                    // The old history goes with the old entry, in the store too.
                    replaced.retire();
                    replaced.uncount(&mut replaced.state.lock());
                    if let Some(persist) = &self.persist {
                        persist.remove(&replaced.agent, &replaced.id);
                    }
                    *replaced = make(None);
                    replaced.clone()
                }
                None => {
                    // Memory does not hold the key, but the store may (an
                    // entry dropped from memory): a reused id replaces it
                    // there too, before anything of the new one is queued.
                    // (A load was recalled into memory first, so this is a
                    // new session, or a load the store knows nothing of.)
                    if !load && let Some(persist) = &self.persist {
                        persist.remove(&agent, &Arc::from(id));
                    }
                    let fresh = make(None);
                    of_agent.push(fresh.clone());
                    fresh
                }
            }
        };
        self.trim();
        session
    }

    /// The session if it is live on the agent process of `generation`: an
    /// entry of an earlier process of the same agent counts as unknown (a
    /// reload on the new process may revive it).
    /// Generations are unique across agents, so they pick the agent too.
    pub fn live(&self, id: &str, generation: u64) -> Option<Arc<Session>> {
        let entry = self.map.get(id)?;
        entry
            .value()
            .iter()
            .find(|session| session.process_generation == generation)
            .cloned()
    }

    /// Live sessions hosted by this agent process generation.
    pub fn live_of_process(&self, agent: &str, generation: u64) -> Vec<Arc<Session>> {
        self.each()
            .filter(|session| {
                &*session.agent == agent
                    && session.process_generation == generation
                    && !session.is_ended()
            })
            .collect()
    }

    /// Every session, newest first.
    pub fn all(&self) -> Vec<Arc<Session>> {
        let mut sessions: Vec<Arc<Session>> = self.each().collect();
        sessions.sort_by_key(|s| std::cmp::Reverse(sort_key(s)));
        sessions
    }

    /// Every session, in no order. Holds no lock once collected.
    pub(crate) fn each(&self) -> impl Iterator<Item = Arc<Session>> {
        let all: Vec<Arc<Session>> = self
            .map
            .iter()
            .flat_map(|entry| entry.value().clone())
            .collect();
        all.into_iter()
    }

    /// One page of sessions, newest first, optionally only those in `cwd`,
    /// after `cursor` (from an earlier page).
    ///
    /// # Errors
    /// A message when `cursor` was not made by this server.
    pub fn list(
        &self,
        cwd: Option<&str>,
        cursor: Option<&str>,
        page_size: usize,
    ) -> Result<ListPage, String> {
        let after = cursor.map(parse_cursor).transpose()?;
        let filter = ListFilter {
            cwd: cwd.map(str::to_owned),
            ..ListFilter::default()
        };
        let page_size = page_size.max(1);
        let mut sessions = self.page_in_memory(&filter, after.as_ref(), page_size + 1);
        let next_cursor = (sessions.len() > page_size).then(|| {
            sessions.truncate(page_size);
            cursor_of(&sort_key(&sessions[page_size - 1]))
        });
        Ok(ListPage {
            sessions,
            next_cursor,
        })
    }

    /// Past `--ended-sessions`, forgets the oldest sessions that no agent
    /// process hosts: ended ones and dormant ones (restored from the store
    /// and never loaded), so restarts cannot pile up dormant entries
    /// (research/contract.md, "Durable sessions").
    fn forget_old_ended(&self) {
        let gone = |s: &Arc<Session>| s.is_ended() || s.is_dormant();
        let mut ended: Vec<Arc<Session>> = self.each().filter(gone).collect();
        if ended.len() <= self.limits.ended_sessions {
            return;
        }
        ended.sort_by_key(sort_key);
        let excess = ended.len() - self.limits.ended_sessions;
        for forgotten in ended.into_iter().take(excess) {
            let mut dropped = false;
            self.map.remove_if_mut(&forgotten.id, |_, of_agent| {
                let before = of_agent.len();
                of_agent.retain(|s| !(Arc::ptr_eq(s, &forgotten) && gone(s)));
                dropped = of_agent.len() != before;
                of_agent.is_empty()
            });
            // Only when this very entry went: a newer session with the same
            // id may have replaced it meanwhile, and its rows stay.
            if dropped {
                forgotten.retire();
                forgotten.uncount(&mut forgotten.state.lock());
                if let Some(persist) = &self.persist {
                    persist.remove(&forgotten.agent, &forgotten.id);
                }
            }
        }
    }
}

/// Shared copies (no message is copied) of the log's events in memory at
/// or after `offset`.
fn copy_entries(log: &EventLog, offset: u64) -> Vec<StoredEvent> {
    log.entries_from(offset)
        .map(|(offset, direction, message)| (offset, direction, message.clone()))
        .collect()
}

/// The controllers among `attached`.
fn controllers(attached: &[Attached]) -> Vec<Arc<Connection>> {
    attached
        .iter()
        .filter(|a| a.role == Role::Controller)
        .map(|a| a.connection.clone())
        .collect()
}

/// The process generation of a session restored from the store: no agent
/// process has it (live generations start at 1).
pub const RESTORED_GENERATION: u64 = 0;

/// Creation time (ns since the epoch), agent and id: a total order for
/// listing (newest first is descending).
pub type SortKey = (u128, Arc<str>, Arc<str>);

/// The cursor naming `key`'s place in the listing order:
/// `{nanos}:{agent}:{id}` (agent ids have no `:`, session ids may).
pub fn cursor_of(key: &SortKey) -> String {
    store::cursor(i64::try_from(key.0).unwrap_or(i64::MAX), &key.1, &key.2)
}

/// Creation time (ns since the epoch), agent and id: a total order for listing.
pub fn sort_key(session: &Arc<Session>) -> SortKey {
    let nanos = session
        .created_at
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    (nanos, session.agent.clone(), session.id.clone())
}

/// The place a cursor from [`cursor_of`] names.
///
/// # Errors
/// A message naming the cursor when it was not made by [`cursor_of`].
pub fn parse_cursor(cursor: &str) -> Result<SortKey, String> {
    store::parse_cursor(cursor)
        .map(|(nanos, agent, id)| (nanos.unsigned_abs().into(), agent.into(), id.into()))
        .ok_or_else(|| format!("invalid cursor {cursor:?}: pass nextCursor from an earlier page"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sessions() -> Sessions {
        Sessions::new(
            InventoryLimits {
                log: LogLimits {
                    events: 10,
                    bytes: usize::MAX,
                },
                ended_sessions: 2,
            },
            None,
        )
    }

    fn object(value: Value) -> Map<String, Value> {
        value.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn metadata_pass_through_and_runtime_keys() {
        let inventory = sessions();
        let session = inventory.insert(
            "s",
            "mock".into(),
            1,
            Some("/w".into()),
            object(json!({"agent": "mock", "variant": "x", "title": "T", "eventCount": 99})),
            false,
        );
        session.record(Direction::AgentToClient, Bytes::from_static(b"{}"));
        let meta = session.meta();
        assert_eq!(meta.agent, "mock");
        assert_eq!(meta.title.as_deref(), Some("T"));
        assert_eq!(meta.event_count, 1, "runtime keys win over stored ones");
        assert_eq!(meta.extra.get("variant"), Some(&json!("x")));
        assert!(!meta.extra.contains_key("agent"));
        let info = serde_json::to_value(session.info()).expect("json");
        assert_eq!(info["sessionId"], "s");
        assert_eq!(info["cwd"], "/w");
        assert_eq!(info["title"], "T");
        assert_eq!(info["_meta"]["sandboxagent.dev"]["variant"], "x");
    }

    #[test]
    fn set_metadata_side_effects() {
        let inventory = sessions();
        let session = inventory.insert("s", "mock".into(), 1, None, Map::new(), false);
        session.apply_metadata(&object(
            json!({"title": "A", "model": "m", "mode": "plan", "labels": {"k": 1}}),
        ));
        let meta = session.meta();
        assert_eq!(
            (
                meta.title.as_deref(),
                meta.model.as_deref(),
                meta.mode.as_deref()
            ),
            (Some("A"), Some("m"), Some("plan"))
        );
        session.apply_metadata(&object(
            json!({"title": null, "labels": {"k": null, "j": 2}}),
        ));
        let meta = session.meta();
        assert_eq!(meta.title, None);
        assert_eq!(meta.extra["labels"], json!({"j": 2}));
    }

    #[test]
    fn list_is_newest_first_with_cursor_pages() {
        let inventory = sessions();
        for id in ["a", "b", "c", "d", "e"] {
            inventory.insert(id, "mock".into(), 1, Some("/w".into()), Map::new(), false);
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let page = inventory.list(None, None, 2).expect("page");
        let ids = |p: &ListPage| {
            p.sessions
                .iter()
                .map(|s| s.id.to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(&page), ["e", "d"]);
        let page = inventory
            .list(None, page.next_cursor.as_deref(), 2)
            .expect("page 2");
        assert_eq!(ids(&page), ["c", "b"]);
        let page = inventory
            .list(None, page.next_cursor.as_deref(), 2)
            .expect("page 3");
        assert_eq!(ids(&page), ["a"]);
        assert_eq!(page.next_cursor, None);
        assert!(inventory.list(None, Some("garbage"), 2).is_err());
        assert!(
            inventory
                .list(Some("/elsewhere"), None, 10)
                .expect("filter")
                .sessions
                .is_empty()
        );
    }

    #[test]
    fn ended_sessions_are_replaced_and_pruned() {
        let inventory = sessions();
        let first = inventory.insert("s", "mock".into(), 1, None, Map::new(), false);
        assert!(first.end(EndReason::Error).is_some());
        assert!(
            first.end(EndReason::Error).is_none(),
            "ending twice reports nothing new"
        );
        let second = inventory.insert("s", "mock".into(), 1, None, Map::new(), false);
        assert!(!Arc::ptr_eq(&first, &second));
        for id in ["x", "y", "z"] {
            inventory
                .insert(id, "mock".into(), 1, None, Map::new(), false)
                .end(EndReason::Completed);
        }
        inventory.insert("w", "mock".into(), 1, None, Map::new(), false);
        let ended = inventory.all().iter().filter(|s| s.is_ended()).count();
        assert_eq!(ended, 2, "only the newest ended sessions are kept");
        assert!(inventory.get("mock", "x").is_none());
    }

    #[test]
    fn two_agents_keep_their_own_session_of_the_same_id() {
        let inventory = sessions();
        let a = inventory.insert("s-1", "a".into(), 1, Some("/a".into()), Map::new(), false);
        let b = inventory.insert("s-1", "b".into(), 2, Some("/b".into()), Map::new(), false);
        assert!(!Arc::ptr_eq(&a, &b));
        let of_a = inventory.get("a", "s-1").expect("a's session");
        assert!(Arc::ptr_eq(&of_a, &a));
        assert_eq!(of_a.cwd().as_deref(), Some("/a"));
        assert!(Arc::ptr_eq(&inventory.live("s-1", 2).expect("b's"), &b));
        assert_eq!(inventory.by_id("s-1").len(), 2);
        assert_eq!(inventory.all().len(), 2);
        // Ending and replacing a's entry leaves b's alone.
        a.end(EndReason::Completed);
        let again = inventory.insert("s-1", "a".into(), 3, None, Map::new(), false);
        assert!(!Arc::ptr_eq(&again, &a));
        assert!(Arc::ptr_eq(&inventory.get("b", "s-1").expect("b's"), &b));
        assert_eq!(inventory.by_id("s-1").len(), 2);
    }

    #[test]
    fn listing_pages_through_sessions_of_two_agents_with_one_id() {
        let inventory = sessions();
        inventory.insert("s-1", "a".into(), 1, None, Map::new(), false);
        inventory.insert("s-1", "b".into(), 2, None, Map::new(), false);
        let first = inventory.list(None, None, 1).expect("page 1");
        let cursor = first.next_cursor.expect("a second page");
        let second = inventory.list(None, Some(&cursor), 1).expect("page 2");
        assert_eq!(second.sessions.len(), 1);
        assert_ne!(first.sessions[0].agent, second.sessions[0].agent);
        assert!(second.next_cursor.is_none());
    }
}
