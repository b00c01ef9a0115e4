//! The store's writer task: every change to the inventory and the event
//! logs leaves the request path through [`Persist`] and is written in
//! batches, one transaction each (research/contract.md, "Durable sessions").
//!
//! - The hot path never waits: a send is a push onto an unbounded channel
//!   whose length and bytes are counted and capped; past the cap an event is
//!   dropped, counted, and logged (rate limited): a gap, never a block.
//! - A batch is whatever queued while the previous one was written (at most
//!   [`MAX_BATCH`] writes): under load batches grow by themselves, idle the
//!   latency is one transaction.
//! - A failing store (unreachable, full, read-only) keeps its writes queued
//!   inside the same caps and is retried with back-off; `GET /v2/health`
//!   says `"store": "degraded"` meanwhile.

use super::{EventRow, SessionRow, Store};
use crate::log_limit::{LogLimit, WARN_INTERVAL};
use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// Most writes in one transaction.
const MAX_BATCH: usize = 4096;
/// Most writes waiting (queued and unwritten together) before events are dropped.
const MAX_WAITING: usize = 200_000;
/// Most message bytes waiting before events are dropped.
const MAX_WAITING_BYTES: usize = 64 << 20;
/// Longest one batch may take before it counts as failed and is retried.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// First and longest pause between retries of a failing store.
const RETRY_FIRST: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);

/// One change for the store.
#[derive(Debug)]
pub(crate) enum Write {
    /// Insert or replace an inventory entry.
    Session(Box<SessionRow>),
    /// Append one event to a session's log.
    Event {
        agent: Arc<str>,
        session: Arc<str>,
        event: EventRow,
    },
    /// Delete a session and its events (a pruned ended session, or an ended
    /// one replaced by a new session with the same id).
    Remove { agent: Arc<str>, session: Arc<str> },
    /// Answered once every earlier write is in the store.
    Flush(oneshot::Sender<()>),
}

impl Write {
    fn bytes(&self) -> usize {
        match self {
            Self::Event { event, .. } => event.message.len(),
            _ => 0,
        }
    }
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
}

/// The hot path's handle on the writer task.
#[derive(Debug)]
pub(crate) struct Persist {
    tx: mpsc::UnboundedSender<Write>,
    /// Writes sent and not yet written (channel and writer's queue).
    waiting: AtomicUsize,
    waiting_bytes: AtomicUsize,
    dropped: AtomicU64,
    /// Set when shutdown begins: session ends from then on are the
    /// shutdown's, not the sessions', and are not stored (research/contract.md,
    /// "Durable sessions": live sessions come back dormant).
    shutting_down: AtomicBool,
    degraded: Mutex<Option<String>>,
    backend: &'static str,
    drop_warning: LogLimit,
}

impl Persist {
    /// Starts the writer task for `store`; `event_cap` is the per-session
    /// event cap (`--event-log-events`) the store keeps too.
    pub(crate) fn start(store: Store, backend: &'static str, event_cap: usize) -> Arc<Self> {
        let (tx, rx) = mpsc::unbounded_channel();
        let persist = Arc::new(Self {
            tx,
            waiting: AtomicUsize::new(0),
            waiting_bytes: AtomicUsize::new(0),
            dropped: AtomicU64::new(0),
            shutting_down: AtomicBool::new(false),
            degraded: Mutex::new(None),
            backend,
            drop_warning: LogLimit::new(WARN_INTERVAL, |count, interval| {
                tracing::warn!(
                    count,
                    ?interval,
                    "session store: more events dropped (not stored)"
                );
            }),
        });
        tokio::spawn(run(store, rx, persist.clone(), event_cap.max(1) as u64));
        persist
    }

    /// Queues an inventory entry (never dropped: entries are few).
    pub(crate) fn session(&self, row: SessionRow) {
        self.send(Write::Session(Box::new(row)));
    }

    /// Queues one event; dropped (counted, logged) past the waiting caps.
    pub(crate) fn event(&self, agent: &Arc<str>, session: &Arc<str>, event: EventRow) {
        let bytes = event.message.len();
        if self.waiting.load(Ordering::Relaxed) >= MAX_WAITING
            || self.waiting_bytes.load(Ordering::Relaxed) + bytes > MAX_WAITING_BYTES
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
        self.send(Write::Event {
            agent: agent.clone(),
            session: session.clone(),
            event,
        });
    }

    /// Queues the removal of a session and its events.
    pub(crate) fn remove(&self, agent: &Arc<str>, session: &Arc<str>) {
        self.send(Write::Remove {
            agent: agent.clone(),
            session: session.clone(),
        });
    }

    fn send(&self, write: Write) {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        self.waiting_bytes
            .fetch_add(write.bytes(), Ordering::Relaxed);
        if let Err(mpsc::error::SendError(write)) = self.tx.send(write) {
            self.written(&write);
        }
    }

    fn written(&self, write: &Write) {
        self.waiting.fetch_sub(1, Ordering::Relaxed);
        self.waiting_bytes
            .fetch_sub(write.bytes(), Ordering::Relaxed);
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
        let error = self.degraded.lock().clone();
        StoreHealth {
            backend: self.backend,
            state: if error.is_some() { "degraded" } else { "ok" },
            error,
            waiting: self.waiting.load(Ordering::Relaxed),
            dropped_events: self.dropped.load(Ordering::Relaxed),
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
    let mut pruned: HashMap<(Arc<str>, Arc<str>), u64> = HashMap::new();
    let failure_warning = LogLimit::new(WARN_INTERVAL, |count, interval| {
        tracing::warn!(count, ?interval, "session store: writes still failing");
    });
    loop {
        if queue.is_empty() {
            match rx.recv().await {
                Some(write) => queue.push_back(write),
                None => return,
            }
        }
        while queue.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(write) => queue.push_back(write),
                Err(_) => break,
            }
        }
        let take = queue.len().min(MAX_BATCH);
        let batch = &queue.make_contiguous()[..take];
        let outcome = tokio::time::timeout(WRITE_TIMEOUT, store.apply(batch)).await;
        match outcome {
            Ok(Ok(counts)) => {
                for write in queue.drain(..take) {
                    persist.written(&write);
                    match write {
                        Write::Flush(done) => {
                            let _ = done.send(());
                        }
                        Write::Remove { agent, session } => {
                            pruned.remove(&(agent, session));
                        }
                        _ => {}
                    }
                }
                if persist.degraded.lock().take().is_some() {
                    tracing::info!(store = store.describe(), "session store is writable again");
                }
                retry = RETRY_FIRST;
                prune(&store, counts, &mut pruned, event_cap).await;
            }
            failed => {
                let error = match failed {
                    Ok(Err(error)) => error.to_string(),
                    _ => format!("a write took longer than {WRITE_TIMEOUT:?}"),
                };
                if failure_warning.admit() {
                    tracing::warn!(
                        store = store.describe(),
                        %error,
                        waiting = queue.len(),
                        "session store write failed: serving from memory, retrying"
                    );
                }
                *persist.degraded.lock() = Some(error);
                // Keep taking writes while waiting, within the caps.
                let pause = tokio::time::sleep(retry);
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
                shed(&mut queue, &persist);
                retry = (retry * 2).min(RETRY_MAX);
            }
        }
    }
}

/// Past the waiting caps, drops the oldest queued events (counted).
fn shed(queue: &mut VecDeque<Write>, persist: &Persist) {
    let mut index = 0;
    while (queue.len() > MAX_WAITING
        || persist.waiting_bytes.load(Ordering::Relaxed) > MAX_WAITING_BYTES)
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

/// Keeps each session's stored log within `event_cap`, pruning in steps of
/// an eighth of the cap so a busy session costs one `DELETE` per step.
async fn prune(
    store: &Store,
    counts: Vec<(Arc<str>, Arc<str>, u64)>,
    pruned: &mut HashMap<(Arc<str>, Arc<str>), u64>,
    event_cap: u64,
) {
    let step = (event_cap / 8).max(1);
    for (agent, session, count) in counts {
        if count <= event_cap {
            continue;
        }
        let below = count - event_cap;
        let key = (agent, session);
        if pruned.get(&key).is_some_and(|done| below < done + step) {
            continue;
        }
        match store.prune(&key.0, &key.1, below).await {
            Ok(()) => {
                pruned.insert(key, below);
            }
            Err(error) => tracing::debug!(%error, "pruning a session's stored events failed"),
        }
    }
}
