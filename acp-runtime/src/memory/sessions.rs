//! The server-wide session inventory ([`Sessions`]): every session by id,
//! the listing order and its cursors, the cache of sessions recalled from
//! the store, the limits each session's log gets.

use crate::budget::MemoryBudget;
use crate::memory::event_log::{EventLog, LogLimits};
use crate::memory::session::{RESTORED_GENERATION, Session, SessionState, counted_state};
use crate::metrics::{self, Metrics, TurnClock};
use crate::store::writer::Persist;
use crate::store::{self, SessionRow};
use dashmap::DashMap;
use parking_lot::Mutex;
use serde_json::{Map, Value};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

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
    use bytes::Bytes;
    use ext_methods::{Direction, EndReason};
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
