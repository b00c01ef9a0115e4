//! The store's writer task: every change to the inventory and the event
//! logs leaves the request path through [`Persist`] and is written in
//! batches, one transaction each (research/contract.md, "Durable sessions").
//!
//! - The hot path never waits: a send is a push onto an unbounded channel
//!   whose length and bytes are counted and capped; while the store is
//!   degraded, past the cap an event is dropped, counted, and logged (rate
//!   limited): a gap, never a block. While it is healthy the shares below
//!   bound the queue and nothing is dropped.
//! - An agent's flood is slowed, not dropped: each agent has its own
//!   [`Share`] of the queue, and while the store is healthy and the share is
//!   full, the agent's stdout reader waits ([`Persist::wait_for_room`]).
//!   While the store is degraded nobody waits and the caps above apply.
//! - A client's message is stored or refused, never dropped: before it is
//!   recorded and forwarded it takes room in its agent's share
//!   ([`Persist::room`]), waiting at most [`CLIENT_WAIT`]; past that it is
//!   refused (`store-behind`, 503) and the agent never sees it. While the
//!   store is degraded it does not wait: the outage's caps apply to it.
//! - An answer a client sees is durable: [`Persist::barrier`] resolves once
//!   every earlier write is committed (group commit: it rides the batch),
//!   or at once when the store turns degraded.
//! - A batch is whatever queued while the previous one was written (at most
//!   [`MAX_BATCH`] writes): under load batches grow by themselves, idle the
//!   latency is one transaction.
//! - A failing store (unreachable, full, read-only) keeps its writes queued
//!   inside the same caps and is retried with back-off; `GET /v2/health`
//!   says `"store": "degraded"` meanwhile.
//! - A write the database refuses for what it holds (a value or key it
//!   cannot take: SQLSTATE classes 22, 23, 54; SQLite's TOOBIG, CONSTRAINT,
//!   MISMATCH, RANGE) is found by retrying the batch one write at a time,
//!   then dropped, counted and logged: one bad value never stalls the rest.
//! - A SQLite file deleted, replaced or made unwritable under the server
//!   (see [`super::file`]) is checked before each batch and once a second
//!   while idle, and shown as `"degraded"`; writes wait while `-wal` or
//!   `-shm` cannot be written, since a write then could kill the process.
//! - Inventory entries are coalesced: a changed entry queues a marker once,
//!   and the newest row is kept beside the queue until written, so an entry
//!   changed a thousand times while the store is down costs one row.
//! - The queue lives inside the memory budget (research/contract.md,
//!   "Memory budget"): every waiting write and pending row is charged to
//!   the server's [`MemoryBudget`] until written, and the waiting caps and
//!   the agents' shares shrink with a small budget ([`QueueLimits`]), so
//!   the queue never holds more than a quarter of it; a batch takes at most
//!   [`MAX_BATCH_BYTES`] of messages, which bounds the copies the driver
//!   makes while it writes.

use super::Store;
use super::file::Problem;
use super::keys::SessionKeys;
use super::rows::{EventRow, Key, Pruning, RowSnapshot, SessionRow, Write};
use super::share::Share;
use super::writer_priority::WriterConnection;
use crate::budget::MemoryBudget;
use crate::log_limit::{LogLimit, WARN_INTERVAL};
use crate::metrics;
use parking_lot::Mutex;
use prometheus_client::metrics::histogram::Histogram;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::AtomicU64 as Sequence;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

/// Most writes in one transaction.
const MAX_BATCH: usize = 4096;
/// Most bytes of writes (`Write::bytes`) in one transaction (at least one
/// write): the driver copies a batch's messages into its statement while
/// it writes, outside the queue's account.
const MAX_BATCH_BYTES: usize = 2 << 20;
/// Most writes waiting (queued and unwritten together) before events are
/// dropped: room for four agents' full shares ([`super::share`]).
const MAX_WAITING: usize = 400_000;
/// Most bytes waiting before events are dropped (four shares), unless the
/// memory budget makes it smaller ([`QueueLimits`]).
const MAX_WAITING_BYTES: usize = 128 << 20;

/// The queue's byte caps under a memory budget: the waiting writes may take
/// a quarter of it (at most [`MAX_WAITING_BYTES`]), each agent's share a
/// quarter of that (at most [`super::share::SHARE_BYTES`]). The default
/// budget (512 MiB) gives the full 128 MiB and 32 MiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QueueLimits {
    /// Bytes waiting past which new events are dropped.
    pub(crate) waiting_bytes: usize,
    /// Bytes of one agent's unwritten events at which its reader pauses.
    pub(crate) share_bytes: usize,
}

impl QueueLimits {
    /// The caps for a memory budget of `budget` bytes.
    pub(crate) fn of_budget(budget: usize) -> Self {
        let waiting_bytes = (budget / 4).min(MAX_WAITING_BYTES);
        Self {
            waiting_bytes,
            share_bytes: (waiting_bytes / 4).min(super::share::SHARE_BYTES),
        }
    }
}

/// Longest one batch may take before it counts as failed and is retried.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// First and longest pause between retries of a failing store.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);
/// How often an idle writer checks the SQLite file.
const FILE_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// How often a paused reader checks whether the store turned degraded.
const PAUSE_CHECK_INTERVAL: Duration = Duration::from_millis(250);
/// Longest an answer waits for its commit before it goes out anyway (a
/// write that hangs is failed after [`WRITE_TIMEOUT`], which releases it
/// too).
pub(crate) const DURABLE_WAIT: Duration = Duration::from_secs(5);

/// Longest a client's message waits for room in its agent's share before
/// it is refused (research/contract.md, "Durable sessions": a client's
/// message is stored or refused, never dropped).
pub(crate) const CLIENT_WAIT: Duration = Duration::from_secs(5);
/// How often a waiting client's message looks for room again.
const CLIENT_POLL: Duration = Duration::from_millis(20);

/// Room held in an agent's share for one client message until it is
/// recorded ([`crate::memory::session::Session::record_admitted`]); given
/// back when dropped, so a message that ends up not recorded holds nothing.
#[derive(Debug)]
pub(crate) struct Room {
    share: Arc<Share>,
    bytes: usize,
}

impl Drop for Room {
    fn drop(&mut self) {
        self.share.remove(self.bytes);
    }
}

/// Waits until `barrier` (from [`Persist::barrier`]) resolves, at most
/// [`DURABLE_WAIT`]. Returns whether the writes before it are committed;
/// `false` at once for `None` (no store, or a degraded one).
pub(crate) async fn until_committed(barrier: Option<oneshot::Receiver<()>>) -> bool {
    let Some(barrier) = barrier else {
        return false;
    };
    match tokio::time::timeout(DURABLE_WAIT, barrier).await {
        Ok(Ok(())) => true,
        Ok(Err(_)) => false,
        Err(_) => {
            tracing::warn!(
                waited = ?DURABLE_WAIT,
                "session store: an answer waited too long for its commit; sent without it"
            );
            false
        }
    }
}

/// The newest unwritten row of an entry, and which marker writes it.
#[derive(Debug)]
struct PendingRow {
    /// The marker's sequence number.
    seq: u64,
    /// Bumped by each change coalesced into it.
    version: u64,
    row: Box<SessionRow>,
    /// What it is charged to the memory budget ([`SessionRow::held_bytes`]).
    bytes: usize,
}

/// What `GET /v2/health` shows of the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoreHealth {
    /// `sqlite`, `postgres` or `memory`.
    pub backend: &'static str,
    /// `ok`, `degraded` (writes failing, kept and retried) or `memory`.
    pub state: &'static str,
    /// The last error while degraded.
    pub error: Option<String>,
    /// Writes not in the store yet.
    pub waiting: usize,
    /// Events dropped because the waiting writes hit their cap.
    pub dropped_events: u64,
    /// Writes the database refused for what they hold (dropped, logged).
    pub rejected_writes: u64,
    /// Agents whose stdout reader waits for the writer now.
    pub paused_agents: Vec<String>,
    /// Times an agent's reader waited for the writer.
    pub pauses: u64,
    /// Milliseconds agents' readers waited for the writer, in total.
    pub paused_ms: u64,
}

/// The hot path's handle on the writer task.
#[derive(Debug)]
pub(crate) struct Persist {
    tx: mpsc::UnboundedSender<Write>,
    /// Writes sent and not yet written (channel and writer's queue).
    waiting: AtomicUsize,
    waiting_bytes: AtomicUsize,
    /// The byte caps of the queue, from the memory budget.
    limits: QueueLimits,
    /// The server's memory budget: every waiting write and pending row is
    /// charged to it until written (research/contract.md, "Memory budget").
    budget: Arc<MemoryBudget>,
    dropped: AtomicU64,
    rejected: AtomicU64,
    /// The newest unwritten row of each changed entry.
    rows: Mutex<HashMap<Key, PendingRow>>,
    next_seq: Sequence,
    /// Set when shutdown begins: session ends from then on are the
    /// shutdown's, not the sessions', and are not stored (research/contract.md,
    /// "Durable sessions": live sessions come back dormant).
    shutting_down: AtomicBool,
    degraded: Mutex<Option<String>>,
    /// What the last check of the SQLite file found wrong (see
    /// [`super::file`]); shown before a write error.
    file_problem: Mutex<Option<String>>,
    backend: &'static str,
    drop_warning: LogLimit,
    /// Client messages refused for want of room ([`Self::room`]): never
    /// dropped events, so logged apart from them.
    refusal_warning: LogLimit,
    /// Each agent's share of the waiting writes.
    shares: Mutex<HashMap<Arc<str>, Arc<Share>>>,
    /// Removals queued and not written yet: one is never queued twice
    /// (retention asks again every pass until the store has it).
    removing: Mutex<std::collections::HashSet<Key>>,
    /// Batches written so far: a paused reader that sees none for
    /// [`WRITE_TIMEOUT`] stops waiting (a writer stuck).
    batches: AtomicU64,
    pauses: AtomicU64,
    paused_ns: AtomicU64,
    pause_notice: LogLimit,
    /// How long each batch took to write, successful or not
    /// (`store_write_duration_seconds`, registered by the runtime).
    pub(crate) write_duration: Histogram,
}

impl Persist {
    /// Starts the writer task for `store`; `event_cap` is the per-session
    /// event cap (`--event-log-events`) the store keeps too; `budget` is
    /// the server's memory budget, which the queue is charged to and sized
    /// by ([`QueueLimits`]).
    pub(crate) fn start(
        store: Store,
        backend: &'static str,
        event_cap: usize,
        budget: Arc<MemoryBudget>,
    ) -> Arc<Self> {
        let (tx, rx) = mpsc::unbounded_channel();
        let persist = Arc::new(Self {
            tx,
            waiting: AtomicUsize::new(0),
            waiting_bytes: AtomicUsize::new(0),
            limits: QueueLimits::of_budget(budget.limit()),
            budget,
            dropped: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            write_duration: metrics::store_write_buckets(),
            rows: Mutex::new(HashMap::new()),
            next_seq: Sequence::new(0),
            shutting_down: AtomicBool::new(false),
            degraded: Mutex::new(None),
            file_problem: Mutex::new(None),
            backend,
            drop_warning: LogLimit::new(WARN_INTERVAL, |count, interval| {
                tracing::warn!(
                    count,
                    ?interval,
                    "session store: more events dropped (not stored)"
                );
            }),
            refusal_warning: LogLimit::new(WARN_INTERVAL, |count, interval| {
                tracing::warn!(
                    count,
                    ?interval,
                    "session store: more client messages refused (503 store-behind, not forwarded, nothing dropped)"
                );
            }),
            shares: Mutex::new(HashMap::new()),
            removing: Mutex::new(std::collections::HashSet::new()),
            batches: AtomicU64::new(0),
            pauses: AtomicU64::new(0),
            paused_ns: AtomicU64::new(0),
            pause_notice: LogLimit::new(WARN_INTERVAL, |count, interval| {
                tracing::info!(
                    count,
                    ?interval,
                    "session store: agents' readers waited for the writer again"
                );
            }),
        });
        tokio::spawn(run(store, rx, persist.clone(), event_cap.max(1) as u64));
        persist
    }

    /// Queues an inventory entry: the newest row of an entry already queued
    /// replaces the one waiting (one row per entry, never dropped).
    pub(crate) fn session(&self, row: SessionRow) {
        let key: Key = (row.agent.clone(), row.session_id.clone());
        let bytes = row.held_bytes();
        self.budget.charge(bytes);
        let mut rows = self.rows.lock();
        if let Some(pending) = rows.get_mut(&key) {
            *pending.row = row;
            pending.version += 1;
            let replaced = std::mem::replace(&mut pending.bytes, bytes);
            drop(rows);
            self.budget.release(replaced);
            return;
        }
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        rows.insert(
            key.clone(),
            PendingRow {
                seq,
                version: 0,
                row: Box::new(row),
                bytes,
            },
        );
        drop(rows);
        self.send(Write::Session {
            agent: key.0,
            session: key.1,
            seq,
        });
    }

    /// Whether the entry of (`agent`, `session`) has a row the writer has
    /// not written yet.
    pub(crate) fn row_pending(&self, agent: &Arc<str>, session: &Arc<str>) -> bool {
        self.rows
            .lock()
            .contains_key(&(agent.clone(), session.clone()))
    }

    /// Clones the pending rows the markers of `batch` write.
    fn snapshot(&self, batch: &[Write]) -> RowSnapshot {
        let rows = self.rows.lock();
        batch
            .iter()
            .filter_map(|write| match write {
                Write::Session {
                    agent,
                    session,
                    seq,
                } => {
                    let key: Key = (agent.clone(), session.clone());
                    let pending = rows.get(&key).filter(|p| p.seq == *seq)?;
                    Some((key, (pending.seq, pending.version, pending.row.clone())))
                }
                _ => None,
            })
            .collect()
    }

    /// After `snapshot` was written: forgets the rows written; a row changed
    /// since gets a new marker.
    fn written_rows(&self, snapshot: RowSnapshot) {
        let mut rows = self.rows.lock();
        for (key, (seq, version, _)) in snapshot {
            let Some(pending) = rows.get_mut(&key).filter(|p| p.seq == seq) else {
                continue;
            };
            if pending.version == version {
                if let Some(written) = rows.remove(&key) {
                    self.budget.release(written.bytes);
                }
                continue;
            }
            let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
            pending.seq = seq;
            self.send(Write::Session {
                agent: key.0,
                session: key.1,
                seq,
            });
        }
    }

    /// The share of the queue of `agent`'s events (one per agent id).
    pub(crate) fn share(&self, agent: &Arc<str>) -> Arc<Share> {
        self.shares
            .lock()
            .entry(agent.clone())
            .or_insert_with(|| Arc::new(Share::new(agent.clone(), self.limits.share_bytes)))
            .clone()
    }

    /// Whether writes fail now (the store is unreachable, full, or its
    /// file cannot be written).
    fn is_degraded(&self) -> bool {
        self.degraded.lock().is_some() || self.file_problem.lock().is_some()
    }

    /// Waits while `share` is full and the store is healthy: the caller is
    /// the agent's stdout reader, so the agent's pipe pushes back on it.
    /// Returns at once in the common case (two atomic loads); while the
    /// store is degraded it never waits (an outage must not freeze agents).
    pub(crate) async fn wait_for_room(&self, share: &Share) {
        if !share.is_full() || self.is_degraded() {
            return;
        }
        let started = Instant::now();
        share.set_paused(true);
        // Cleared however the wait ends (the reader's select may drop it).
        let _paused = scopeguard(share);
        self.pauses.fetch_add(1, Ordering::Relaxed);
        if self.pause_notice.admit() {
            tracing::info!(
                agent = %share.agent,
                "session store is behind: reading this agent's output waits for the writer"
            );
        }
        let mut progress = (self.batches.load(Ordering::Relaxed), Instant::now());
        loop {
            let woken = share.notified();
            if share.may_resume() || self.is_degraded() {
                break;
            }
            // A writer that commits nothing for WRITE_TIMEOUT is stuck (a
            // batch that never ends without failing): go on, as for a
            // degraded store.
            let batches = self.batches.load(Ordering::Relaxed);
            if batches != progress.0 {
                progress = (batches, Instant::now());
            } else if progress.1.elapsed() >= WRITE_TIMEOUT {
                tracing::warn!(agent = %share.agent, "session store writer made no progress: reading this agent's output goes on");
                break;
            }
            let _ = tokio::time::timeout(PAUSE_CHECK_INTERVAL, woken).await;
        }
        let waited = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.paused_ns.fetch_add(waited, Ordering::Relaxed);
    }

    /// A receiver that resolves once every write queued before this call is
    /// committed, or fails (dropped) when the store turns degraded first;
    /// `None` while the store is degraded. The writer answers it with the
    /// batch it is in: a group commit, no transaction of its own.
    pub(crate) fn barrier(&self) -> Option<oneshot::Receiver<()>> {
        if self.is_degraded() {
            return None;
        }
        let (done, committed) = oneshot::channel();
        self.send(Write::Barrier(done));
        Some(committed)
    }

    /// Wakes the paused readers whose share has room (all of them when
    /// `force`: the store turned degraded).
    fn wake_shares(&self, force: bool) {
        for share in self.shares.lock().values() {
            share.wake(force);
        }
    }

    /// Room in `share` (an agent's) for a client message of `message_len` bytes,
    /// waiting while the share is full, at most
    /// [`CLIENT_WAIT`]; `Ok(None)` while the store is degraded (an outage
    /// must not stop the service: the outage's caps apply, as to every
    /// event, and a gap is counted).
    ///
    /// # Errors
    /// `Err(())` when the share had no room within [`CLIENT_WAIT`]: the
    /// message must be refused, not forwarded (research/contract.md,
    /// "Durable sessions").
    pub(crate) async fn room(
        &self,
        share: &Arc<Share>,
        message_len: usize,
    ) -> Result<Option<Room>, ()> {
        let bytes = std::mem::size_of::<Write>() + message_len;
        let deadline = Instant::now() + CLIENT_WAIT;
        loop {
            if self.is_degraded() {
                return Ok(None);
            }
            if share.try_take(bytes) {
                return Ok(Some(Room {
                    share: share.clone(),
                    bytes,
                }));
            }
            if Instant::now() >= deadline {
                if self.refusal_warning.admit() {
                    tracing::warn!(
                        agent = %share.agent,
                        "session store is behind: a client's message was refused (not forwarded)"
                    );
                }
                return Err(());
            }
            tokio::time::sleep(CLIENT_POLL).await;
        }
    }

    /// Queues one event of `share`'s agent. While the store is degraded it
    /// is dropped (counted, logged) past the waiting caps; while it is
    /// healthy it is always queued: the shares pace whoever makes events
    /// (the agent's stdout reader waits, a client's message takes
    /// [`Self::room`] or is refused; what the runtime records itself
    /// follows an agent's line or a session's end), so the queue stays
    /// within the shares' caps plus one message per producer.
    pub(crate) fn event(
        &self,
        share: &Arc<Share>,
        session: &Arc<str>,
        event: EventRow,
        room: Option<Room>,
    ) {
        let bytes = std::mem::size_of::<Write>() + event.message.len();
        // At the cap, not past it: one message larger than the whole cap
        // (a small budget's) is still queued when the queue has room.
        if room.is_none()
            && self.is_degraded()
            && (self.waiting.load(Ordering::Relaxed) >= MAX_WAITING
                || self.waiting_bytes.load(Ordering::Relaxed) >= self.limits.waiting_bytes)
        {
            let dropped = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if self.drop_warning.admit() {
                tracing::warn!(
                    dropped,
                    "session store is behind: events are not being stored (a gap in the stored log)"
                );
            }
            return;
        }
        share.add(bytes);
        // The event holds its own bytes now: the room goes back.
        drop(room);
        self.send(Write::Event {
            agent: share.agent.clone(),
            session: session.clone(),
            event,
            share: share.clone(),
        });
    }

    /// Drops the unwritten row of (`agent`, `session`) if marker `seq`
    /// still owns it.
    fn forget_row(&self, agent: &Arc<str>, session: &Arc<str>, seq: u64) {
        let mut rows = self.rows.lock();
        let key: Key = (agent.clone(), session.clone());
        if rows.get(&key).is_some_and(|pending| pending.seq == seq)
            && let Some(forgotten) = rows.remove(&key)
        {
            self.budget.release(forgotten.bytes);
        }
    }

    /// Queues the removal of a session and its events (and drops its
    /// unwritten row). `false` when its removal was already queued and not
    /// done yet (nothing more is queued).
    pub(crate) fn remove(&self, agent: &Arc<str>, session: &Arc<str>) -> bool {
        let key: Key = (agent.clone(), session.clone());
        if let Some(unwritten) = self.rows.lock().remove(&key) {
            self.budget.release(unwritten.bytes);
        }
        if !self.removing.lock().insert(key) {
            return false;
        }
        self.send(Write::Remove {
            agent: agent.clone(),
            session: session.clone(),
        });
        true
    }

    fn send(&self, write: Write) {
        let bytes = write.bytes();
        self.waiting.fetch_add(1, Ordering::Relaxed);
        self.waiting_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.budget.charge(bytes);
        if let Err(mpsc::error::SendError(write)) = self.tx.send(write) {
            self.written(&write);
        }
    }

    fn written(&self, write: &Write) {
        let bytes = write.bytes();
        self.waiting.fetch_sub(1, Ordering::Relaxed);
        self.waiting_bytes.fetch_sub(bytes, Ordering::Relaxed);
        self.budget.release(bytes);
        match write {
            Write::Event { share, .. } => share.remove(write.bytes()),
            Write::Remove { agent, session } => {
                self.removing
                    .lock()
                    .remove(&(agent.clone(), session.clone()));
            }
            _ => {}
        }
    }

    /// The memory budget the queue is charged to.
    pub(crate) fn budget(&self) -> &Arc<MemoryBudget> {
        &self.budget
    }

    /// Whether shutdown has begun (see [`Self::begin_shutdown`]).
    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }

    /// From now on session ends are not stored: the agents are being
    /// stopped by the shutdown, and their sessions come back dormant.
    pub(crate) fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::Release);
    }

    /// Waits until every write queued before this call is in the store, at
    /// most `timeout`. Returns whether it got there.
    pub(crate) async fn flush(&self, timeout: Duration) -> bool {
        let (done, written) = oneshot::channel();
        self.send(Write::Flush(done));
        matches!(tokio::time::timeout(timeout, written).await, Ok(Ok(())))
    }

    /// The store's state for `GET /v2/health`.
    pub(crate) fn health(&self) -> StoreHealth {
        let error = self
            .file_problem
            .lock()
            .clone()
            .or_else(|| self.degraded.lock().clone());
        StoreHealth {
            backend: self.backend,
            state: if error.is_some() { "degraded" } else { "ok" },
            error,
            waiting: self.waiting.load(Ordering::Relaxed),
            dropped_events: self.dropped.load(Ordering::Relaxed),
            rejected_writes: self.rejected.load(Ordering::Relaxed),
            paused_agents: self
                .shares
                .lock()
                .values()
                .filter(|share| share.is_paused())
                .map(|share| share.agent.to_string())
                .collect(),
            pauses: self.pauses.load(Ordering::Relaxed),
            paused_ms: self.paused_ns.load(Ordering::Relaxed) / 1_000_000,
        }
    }
}

/// The writer task: gathers a batch, writes it, retries while the store fails.
async fn run(
    store: Store,
    mut rx: mpsc::UnboundedReceiver<Write>,
    persist: Arc<Persist>,
    event_cap: u64,
) {
    let mut queue: VecDeque<Write> = VecDeque::new();
    let mut retry = RETRY_FIRST;
    let mut pruned: HashMap<Key, u64> = HashMap::new();
    let mut keys = SessionKeys::default();
    // The writer's own connection (see `Store::apply`).
    let mut connection = None;
    // Writes left to retry one at a time after the database refused a batch.
    let mut isolate = 0_usize;
    let failure_warning = LogLimit::new(WARN_INTERVAL, |count, interval| {
        tracing::warn!(count, ?interval, "session store: writes still failing");
    });
    let unstorable_warning = LogLimit::new(WARN_INTERVAL, |count, interval| {
        tracing::warn!(
            count,
            ?interval,
            "session store: more batches with events SQLite cannot store"
        );
    });
    loop {
        if queue.is_empty() {
            if persist.is_shutting_down() {
                // `Store::close` waits for the pool's connections to come
                // back; SQLite's own is closed here.
                match connection.take() {
                    Some(WriterConnection::Own(own)) => {
                        let _ = sqlx::Connection::close(own).await;
                    }
                    Some(WriterConnection::Pooled(_)) | None => {}
                }
            }
            tokio::select! {
                write = rx.recv() => match write {
                    Some(write) => queue.push_back(write),
                    None => return,
                },
                () = tokio::time::sleep(FILE_CHECK_INTERVAL) => {
                    // Idle: PostgreSQL's back to the pool, which tests a
                    // connection before handing it out (one a server closed
                    // is replaced); SQLite's own is kept.
                    if connection
                        .as_ref()
                        .is_some_and(WriterConnection::is_pooled)
                    {
                        connection = None;
                    }
                    file_ready(&store, &persist);
                    continue;
                }
            }
        }
        while queue.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(write) => queue.push_back(write),
                Err(_) => break,
            }
        }
        if !file_ready(&store, &persist) {
            release_barriers(&mut queue, &persist);
            take_while_waiting(&mut rx, &mut queue, retry).await;
            shed(&mut queue, &persist);
            retry = (retry * 2).min(RETRY_MAX);
            continue;
        }
        let take = if isolate > 0 { 1 } else { batch_len(&queue) };
        let batch = &queue.make_contiguous()[..take];
        let rows = persist.snapshot(batch);
        let started = Instant::now();
        let outcome = tokio::time::timeout(
            WRITE_TIMEOUT,
            store.apply(
                &mut connection,
                batch,
                &rows,
                &mut keys,
                &Pruning {
                    cap: event_cap,
                    done: &pruned,
                },
            ),
        )
        .await;
        persist
            .write_duration
            .observe(started.elapsed().as_secs_f64());
        let error = match outcome {
            Ok(Ok(applied)) => {
                if applied.unstorable > 0 {
                    let rejected = persist
                        .rejected
                        .fetch_add(applied.unstorable, Ordering::Relaxed)
                        + applied.unstorable;
                    if unstorable_warning.admit() {
                        tracing::warn!(
                            store = store.describe(),
                            rejected,
                            "session store: events at offset 2^32 or later of a session \
                             (or of a session key from 2^31) have no SQLite event id: not stored"
                        );
                    }
                }
                written(&mut queue, take, &persist, &mut pruned);
                if queue.is_empty() && queue.capacity() > 4 * MAX_BATCH {
                    // A burst's backlog: give its slots back.
                    queue.shrink_to(MAX_BATCH);
                }
                persist.written_rows(rows);
                persist.batches.fetch_add(1, Ordering::Relaxed);
                persist.wake_shares(false);
                isolate = isolate.saturating_sub(1);
                if persist.degraded.lock().take().is_some() {
                    tracing::info!(store = store.describe(), "session store is writable again");
                }
                retry = RETRY_FIRST;
                pruned.extend(applied.pruned);
                continue;
            }
            Ok(Err(error)) => error,
            Err(_) => {
                // Cut off mid-transaction: a new connection next time.
                connection = None;
                sqlx::Error::PoolTimedOut
            }
        };
        if refused(&error, store.is_postgres()) {
            if take > 1 {
                // Find the write it refuses: the same writes, one at a time.
                isolate = take;
                continue;
            }
            let rejected = persist.rejected.fetch_add(1, Ordering::Relaxed) + 1;
            tracing::warn!(
                store = store.describe(),
                %error,
                rejected,
                write = describe(&queue[0]),
                "session store refused a write for what it holds: dropped"
            );
            if let Write::Session {
                agent,
                session,
                seq,
            } = &queue[0]
            {
                // Its row goes too, so the entry's next change queues anew.
                persist.forget_row(agent, session, *seq);
            }
            written(&mut queue, 1, &persist, &mut pruned);
            isolate = isolate.saturating_sub(1);
            continue;
        }
        let code = match &error {
            sqlx::Error::Database(database) => database.code().map(|c| c.into_owned()),
            _ => None,
        };
        let error = match error {
            sqlx::Error::PoolTimedOut => format!("a write took longer than {WRITE_TIMEOUT:?}"),
            other => store.error_text(&other),
        };
        if failure_warning.admit() {
            tracing::warn!(
                store = store.describe(),
                %error,
                code = code.as_deref().unwrap_or("-"),
                waiting = queue.len(),
                "session store write failed: serving from memory, retrying"
            );
        }
        *persist.degraded.lock() = Some(error);
        release_barriers(&mut queue, &persist);
        take_while_waiting(&mut rx, &mut queue, retry).await;
        shed(&mut queue, &persist);
        retry = (retry * 2).min(RETRY_MAX);
    }
}

/// How many writes from the front of `queue` the next batch takes: at most
/// [`MAX_BATCH`] writes and [`MAX_BATCH_BYTES`] bytes, at least one.
fn batch_len(queue: &VecDeque<Write>) -> usize {
    let mut bytes = 0;
    let mut take = 0;
    for write in queue.iter().take(MAX_BATCH) {
        bytes += write.bytes();
        if take > 0 && bytes > MAX_BATCH_BYTES {
            break;
        }
        take += 1;
    }
    take
}

/// Waits `pause` before a retry, queueing the writes that arrive meanwhile
/// (`shed` then applies the caps).
async fn take_while_waiting(
    rx: &mut mpsc::UnboundedReceiver<Write>,
    queue: &mut VecDeque<Write>,
    pause: Duration,
) {
    let pause = tokio::time::sleep(pause);
    tokio::pin!(pause);
    loop {
        tokio::select! {
            () = &mut pause => break,
            write = rx.recv() => match write {
                Some(write) => queue.push_back(write),
                None => break,
            },
        }
    }
}

/// Checks the SQLite file (see [`super::file`]), shows what it found in the
/// health and logs each change of it. `false` when writes must wait.
fn file_ready(store: &Store, persist: &Persist) -> bool {
    let problem = store.check_file().err();
    let message = problem.as_ref().map(|p| p.message().to_owned());
    let mut shown = persist.file_problem.lock();
    if *shown != message {
        match &message {
            Some(message) => tracing::warn!(store = store.describe(), "{message}"),
            None => tracing::info!(
                store = store.describe(),
                "the session store file is writable again"
            ),
        }
        *shown = message;
    }
    !matches!(problem, Some(Problem::Unwritable(_)))
}

/// Takes the first `count` writes off the queue once they are in the
/// store (or dropped): answers flushes, forgets removed sessions.
fn written(
    queue: &mut VecDeque<Write>,
    count: usize,
    persist: &Persist,
    pruned: &mut HashMap<Key, u64>,
) {
    for write in queue.drain(..count) {
        persist.written(&write);
        match write {
            Write::Flush(done) | Write::Barrier(done) => {
                let _ = done.send(());
            }
            Write::Remove { agent, session } => {
                pruned.remove(&(agent, session));
            }
            _ => {}
        }
    }
}

/// Whether the database refused a write for what it holds (a value or key
/// it cannot take), as opposed to being unreachable, full or busy.
fn refused(error: &sqlx::Error, postgres: bool) -> bool {
    let sqlx::Error::Database(database) = error else {
        return false;
    };
    let Some(code) = database.code() else {
        return false;
    };
    if postgres {
        // SQLSTATE classes: data exception, integrity constraint violation,
        // program limit exceeded (an index row too large).
        return ["22", "23", "54"]
            .iter()
            .any(|class| code.starts_with(class));
    }
    // SQLite: the primary result code is the low byte of the extended one
    // (SQLITE_TOOBIG 18, SQLITE_CONSTRAINT 19, SQLITE_MISMATCH 20,
    // SQLITE_RANGE 25).
    code.parse::<u32>()
        .is_ok_and(|number| matches!(number & 0xff, 18 | 19 | 20 | 25))
}

/// A write, for a log line (no message contents).
fn describe(write: &Write) -> String {
    match write {
        Write::Session { agent, session, .. } => format!("entry of session {session:?} of {agent}"),
        Write::Event {
            agent,
            session,
            event,
            ..
        } => format!("event {} of session {session:?} of {agent}", event.offset),
        Write::Remove { agent, session } => format!("removal of session {session:?} of {agent}"),
        Write::Flush(_) => "flush".to_owned(),
        Write::Barrier(_) => "barrier".to_owned(),
    }
}

/// Clears `share`'s paused mark when dropped.
fn scopeguard(share: &Share) -> impl Drop + '_ {
    struct Unpause<'a>(&'a Share);
    impl Drop for Unpause<'_> {
        fn drop(&mut self) {
            self.0.set_paused(false);
        }
    }
    Unpause(share)
}

/// The store turned degraded: answers nobody waiting on a barrier (the
/// dropped senders tell them the answer goes out undurable) and lets every
/// paused reader go on, so an outage never holds up a client or an agent.
fn release_barriers(queue: &mut VecDeque<Write>, persist: &Persist) {
    queue.retain(|write| {
        let barrier = matches!(write, Write::Barrier(_));
        if barrier {
            persist.written(write);
        }
        !barrier
    });
    persist.wake_shares(true);
}

/// Past the waiting caps, drops the oldest queued events (counted).
fn shed(queue: &mut VecDeque<Write>, persist: &Persist) {
    let mut index = 0;
    while (queue.len() > MAX_WAITING
        || persist.waiting_bytes.load(Ordering::Relaxed) > persist.limits.waiting_bytes)
        && index < queue.len()
    {
        if matches!(queue[index], Write::Event { .. }) {
            if let Some(write) = queue.remove(index) {
                persist.written(&write);
                let dropped = persist.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                if persist.drop_warning.admit() {
                    tracing::warn!(
                        dropped,
                        "session store unreachable too long: oldest unwritten events dropped"
                    );
                }
            }
        } else {
            index += 1;
        }
    }
}
