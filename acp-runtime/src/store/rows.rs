//! What the store reads and writes, and how it fails: the rows, the
//! writes the writer task batches, the error. A leaf of `store`: the store,
//! the writer and the file checks all use it; it uses none of them.

use super::share::Share;
use bytes::Bytes;
use ext_methods::{Direction, EndReason, ModelInfo};
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::oneshot;

/// Why the store could not be opened or used.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Connecting, or opening the SQLite file, failed.
    #[error("cannot open the session store {what}: {source}")]
    Open {
        /// The store, password redacted (for SQLite: the file).
        what: String,
        /// What the driver said.
        source: sqlx::Error,
    },
    /// Connecting to PostgreSQL failed a TLS check, or its `sslmode` or
    /// `sslrootcert` is wrong; `reason` names the check.
    #[error("cannot open the session store {what}: {reason}")]
    Tls {
        /// The store, password redacted.
        what: String,
        /// The check that failed, in words.
        reason: String,
    },
    /// A schema migration failed (or the database is newer than this binary).
    #[error("cannot migrate the session store {what}: {source}")]
    Migrate {
        /// The store, password redacted.
        what: String,
        /// What the migrator said.
        source: sqlx::migrate::MigrateError,
    },
    /// Reading the inventory failed (at start-up: a corrupt file).
    #[error("cannot read the session store {what}: {source}")]
    Read {
        /// The store, password redacted (for SQLite: the file).
        what: String,
        /// What the driver said.
        source: sqlx::Error,
    },
    /// A read or write failed.
    #[error("session store: {0}")]
    Query(#[from] sqlx::Error),
    /// A stored row could not be understood.
    #[error("session store: unreadable row: {0}")]
    Row(String),
    /// The data dir (the SQLite file's folder, the runtime id file) failed.
    #[error("{0}")]
    Io(String),
}

/// One inventory entry as stored: what `/v2/sessions`, `session/list` and
/// `_sandboxagent/session/get` show of a session.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionRow {
    /// The agent id that hosts the session.
    pub agent: Arc<str>,
    /// The agent's session id.
    pub session_id: Arc<str>,
    /// The working directory given at creation.
    pub cwd: Option<String>,
    /// First seen, in nanoseconds since the Unix epoch.
    pub created_ns: i64,
    /// Last activity, in nanoseconds since the Unix epoch.
    pub updated_ns: i64,
    /// Why it ended; `None` while live (after a restart: dormant).
    pub end_reason: Option<EndReason>,
    /// `_meta["sandboxagent.dev"]` as stored.
    pub metadata: Map<String, Value>,
    /// Events recorded so far (the next event's offset).
    pub event_count: u64,
    /// Title hint.
    pub title: Option<String>,
    /// Model hint.
    pub model: Option<String>,
    /// Mode hint.
    pub mode: Option<String>,
    /// The models the agent offered for it.
    pub models: Option<Vec<ModelInfo>>,
    /// The text of the session's first `session/prompt` (at most 200
    /// characters), for lists of untitled sessions.
    pub first_prompt: Option<String>,
}

/// What [`super::Store::page`] reads: a page of entries, newest first.
#[derive(Debug, Clone, Default)]
pub struct PageQuery {
    /// Entries at most.
    pub limit: usize,
    /// Only after this place in the order: (`created_ns`, agent, session id).
    pub after: Option<(i64, String, String)>,
    /// Only this agent's.
    pub agent: Option<String>,
    /// Only entries with this `cwd` (`session/list`).
    pub cwd: Option<String>,
    /// Only ended (`Some(true)`) or not ended (`Some(false)`) entries.
    pub ended: Option<bool>,
    /// Only entries whose title contains this text (case-insensitive for ASCII).
    pub title: Option<String>,
}

/// One recorded ACP message of a session, as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct EventRow {
    /// Its offset in the session's log (0-based, gapless until pruned).
    pub offset: u64,
    /// When the runtime saw it, in nanoseconds since the Unix epoch.
    pub at_ns: i64,
    /// Which side sent it.
    pub direction: Direction,
    /// The JSON-RPC message, one JSON object.
    pub message: Bytes,
}

/// A session's store key: (agent, session id).
pub(crate) type Key = (Arc<str>, Arc<str>);

/// The rows a batch writes, cloned from the pending ones when it is built:
/// key → (marker sequence number, version, row).
pub(crate) type RowSnapshot = HashMap<Key, (u64, u64, Box<SessionRow>)>;

/// The row a marker of (`agent`, `session`) with sequence number `seq` writes.
pub(crate) fn row_of<'a>(
    rows: &'a RowSnapshot,
    agent: &Arc<str>,
    session: &Arc<str>,
    seq: u64,
) -> Option<&'a SessionRow> {
    rows.get(&(agent.clone(), session.clone()))
        .filter(|(marker, _, _)| *marker == seq)
        .map(|(_, _, row)| row.as_ref())
}

/// One change for the store.
#[derive(Debug)]
pub(crate) enum Write {
    /// An inventory entry changed: write its newest row (kept in
    /// `Persist::rows` under this sequence number).
    Session {
        agent: Arc<str>,
        session: Arc<str>,
        seq: u64,
    },
    /// Append one event to a session's log.
    Event {
        agent: Arc<str>,
        session: Arc<str>,
        event: EventRow,
        /// The agent's share of the queue, which counts it until written.
        share: Arc<Share>,
    },
    /// Delete a session and its events (a pruned ended session, or an ended
    /// one replaced by a new session with the same id).
    Remove { agent: Arc<str>, session: Arc<str> },
    /// Answered once every earlier write is in the store.
    Flush(oneshot::Sender<()>),
    /// Answered once every earlier write is in the store, or dropped
    /// unanswered when the store turns degraded: what a durable answer
    /// waits for, which an outage must not hold up.
    Barrier(oneshot::Sender<()>),
}

impl Write {
    /// The bytes this write holds while it waits: its own size in the
    /// queue, and an event's message. What the waiting caps, an agent's
    /// share and the memory budget count (research/contract.md, "Memory
    /// budget").
    pub(crate) fn bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + match self {
                Self::Event { event, .. } => event.message.len(),
                _ => 0,
            }
    }
}

impl SessionRow {
    /// About the bytes this row holds while it waits for the writer: the
    /// row itself, its strings, and its metadata and models as JSON (an
    /// estimate for the memory budget; research/contract.md, "Memory
    /// budget").
    pub(crate) fn held_bytes(&self) -> usize {
        let text = |value: &Option<String>| value.as_ref().map_or(0, String::len);
        std::mem::size_of::<Self>()
            + text(&self.cwd)
            + text(&self.title)
            + text(&self.model)
            + text(&self.mode)
            + text(&self.first_prompt)
            + json_len(&self.metadata)
            + self.models.as_ref().map_or(0, json_len)
    }
}

/// The length of `value` as compact JSON (0 when it does not serialize).
fn json_len(value: &impl serde::Serialize) -> usize {
    serde_json::to_vec(value).map_or(0, |json| json.len())
}

/// Most offsets one batch prunes of one session.
const PRUNE_MOST: u64 = 65_536;

/// Which sessions a batch prunes to keep each stored log within `cap`
/// events: in steps of an eighth of the cap, so a busy session costs one
/// `DELETE` per step ([`super::Store::apply`] runs them in the batch's
/// transaction).
#[derive(Debug)]
pub(crate) struct Pruning<'a> {
    /// Events a session keeps in the store (`--event-log-events`).
    pub(crate) cap: u64,
    /// The offset each session was last pruned below.
    pub(crate) done: &'a HashMap<Key, u64>,
}

impl Pruning<'_> {
    /// The offset to prune `key`'s events below, now that its log holds
    /// `count` events; `None` while it is within the cap or within a step
    /// of its last prune.
    pub(crate) fn below(&self, key: &Key, count: u64) -> Option<u64> {
        let step = (self.cap / 8).max(1);
        let below = count.checked_sub(self.cap).filter(|below| *below > 0)?;
        let done = self.done.get(key).copied();
        if done.is_some_and(|done| below < done + step) {
            return None;
        }
        // At most PRUNE_MOST offsets past the last prune (from 0 after a
        // restart), so one batch never deletes a whole log's excess (a
        // cap lowered across a restart) and outlasts its timeout.
        Some(below.min(done.unwrap_or(0).saturating_add(PRUNE_MOST)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`Pruning::below`] for one session with `cap`, last pruned below
    /// `done` (`None`: never), at `count` events.
    fn below(cap: u64, done: Option<u64>, count: u64) -> Option<u64> {
        let key: Key = (Arc::from("mock"), Arc::from("s1"));
        let done: HashMap<Key, u64> = done.map(|d| (key.clone(), d)).into_iter().collect();
        Pruning { cap, done: &done }.below(&key, count)
    }

    #[test]
    fn a_session_is_pruned_past_its_cap_in_steps_of_an_eighth() {
        assert_eq!(below(800, None, 800), None, "within the cap");
        assert_eq!(below(800, None, 801), Some(1));
        assert_eq!(below(800, Some(1), 900), None, "within a step (100)");
        assert_eq!(below(800, Some(1), 901), Some(101));
    }

    #[test]
    fn one_batch_prunes_at_most_prune_most_offsets_of_a_session() {
        // A restart (nothing pruned yet) with a log far past its cap.
        assert_eq!(below(1000, None, 10_000_000), Some(PRUNE_MOST));
        assert_eq!(
            below(1000, Some(PRUNE_MOST), 10_000_000),
            Some(2 * PRUNE_MOST)
        );
        assert_eq!(
            below(1000, Some(PRUNE_MOST), PRUNE_MOST + 1100),
            None,
            "within a step"
        );
    }
}
