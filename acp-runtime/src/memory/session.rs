//! The server-wide session inventory: which agent process hosts each
//! session, which connections are attached to it, its metadata and hints,
//! and its event log (research/contract.md,
//! "Routing: connections, sessions, one agent process" and
//! "Extension methods and control plane").

use crate::error::Error;
use crate::memory::connection::Connection;
use crate::memory::event_log::EventLog;
use crate::memory::hints::Hints;
use crate::memory::history::History;
use crate::metrics::{self, Metrics, TurnClock};
use crate::protocol;
use crate::spans::TurnTrace;
use crate::store::share::Share;
use crate::store::writer::{self, Persist};
use crate::store::{self, EventRow, SessionRow};
use crate::time::rfc3339;
use agent_client_protocol::v1::schema::{
    ContentBlock, PromptRequest, SessionConfigOption, SessionInfo, SessionMode, SessionModeState,
};
use bytes::Bytes;
use ext_methods::notification::SESSION_ENDED;
use ext_methods::{
    Direction, EndReason, ListModelsResult, ModelInfo, Role, SessionEnded, SessionEventsPage,
    SessionMeta,
};
use parking_lot::Mutex;
use serde_json::{Map, Value};
use std::sync::Arc;
use std::time::SystemTime;

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
    pub(super) persist: Option<Arc<Persist>>,
    /// Its agent's share of the store's queue (`None` with `--store memory`).
    pub(super) share: Option<Arc<Share>>,
    /// Replaced, revived or forgotten: another entry owns its store key now,
    /// so nothing of this one is stored any more.
    pub(super) retired: std::sync::atomic::AtomicBool,
    pub(super) state: Mutex<SessionState>,
    /// Where the entry is counted in `sessions{state}` while it is one of
    /// the listing's (`None`: an inventory without metrics); see
    /// `SessionState::counted`.
    pub(super) metrics: Option<Arc<Metrics>>,
    /// When the current prompt turn started, until its first update.
    pub(crate) turn_clock: TurnClock,
    /// The spans of the current prompt turn while tracing is on
    /// (research/contract.md, "Traces"); untouched otherwise.
    pub(crate) turn_trace: Mutex<TurnTrace>,
}

/// The state `sessions{state}` counts an entry in.
pub(super) fn counted_state(state: &SessionState) -> metrics::SessionState {
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
    pub(super) fn uncount(&self, state: &mut SessionState) {
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
pub(super) struct Attached {
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
pub(super) struct SessionState {
    pub(super) cwd: Option<String>,
    pub(super) attached: Vec<Attached>,
    pub(super) updated_at: SystemTime,
    pub(super) ended: Option<EndReason>,
    /// `_meta["sandboxagent.dev"]` as stored from `session/new` and `set_metadata`.
    pub(super) metadata: Map<String, Value>,
    pub(super) title: Option<String>,
    pub(super) model: Option<String>,
    pub(super) mode: Option<String>,
    pub(super) models: Option<Vec<ModelInfo>>,
    /// Available modes (ACP `SessionMode` objects) as last reported.
    pub(super) modes: Option<Vec<Value>>,
    /// Config options as last reported.
    pub(super) config_options: Option<Vec<SessionConfigOption>>,
    pub(super) log: EventLog,
    /// Restored from the store and not loaded since: its agent process is
    /// gone (research/contract.md, "Durable sessions").
    pub(super) dormant: bool,
    /// The text of the first `session/prompt`, cut to
    /// [`FIRST_PROMPT_CHARS`] characters.
    pub(super) first_prompt: Option<String>,
    /// When memory last took it in (created, or read from the store): the
    /// cache drops the longest untouched first, never one just recalled.
    pub(super) touched: std::time::Instant,
    /// Read from the store into memory (by id, for a request that names
    /// it) rather than made here: only such an entry is pinned in the
    /// cache for [`RECALL_PIN`] (a `session/load` may wait for the agent).
    pub(super) recalled: bool,
    /// Whether `sessions{state}` counts this entry: the gauge counts what
    /// the listing shows, each key once wherever it is held (research/
    /// contract.md, "Metrics"). Set for an entry of the inventory (made, or
    /// read from the store into memory, whose key was counted already),
    /// cleared when it leaves the listing; never set for the entries a
    /// listing page reads from the store to show. Memory dropping a cached
    /// entry leaves it counted: the store still lists it.
    pub(super) counted: bool,
}

/// Most characters of a first prompt an entry keeps.
pub const FIRST_PROMPT_CHARS: usize = 200;

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
            let mut building = History::new(&self.id, start);
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
    pub(super) fn retire(&self) {
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
        let extra = SessionMeta::extra_from(&state.metadata);
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
        let cwd = self.state.lock().cwd.clone().unwrap_or_default();
        meta.entry(self.id.to_string(), cwd)
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
