//! One agent's share of the store writer's queue: while the store is healthy
//! and an agent's unwritten events fill its share, its stdout reader stops
//! reading (the pipe then pushes back on the agent) until the writer has
//! caught up (research/contract.md, "Durable sessions": "A flood slows the
//! agent"). Each agent has its own share, so one agent's flood never holds
//! back another's.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use tokio::sync::Notify;

/// Most unwritten events of one agent before its reader pauses: a burst
/// of 100,000 updates (`bench --scenario store`) fits without a pause.
pub(crate) const SHARE_EVENTS: usize = 100_000;
/// Most unwritten bytes of one agent before its reader pauses (messages
/// and the writes' own size, see `Write::bytes`), unless the memory budget
/// makes it smaller (`Persist::start`).
pub(crate) const SHARE_BYTES: usize = 32 << 20;

/// One agent's count of unwritten events, and the wake-up of its paused reader.
#[derive(Debug)]
pub(crate) struct Share {
    /// The agent id.
    pub(crate) agent: Arc<str>,
    /// Unwritten bytes at which the reader pauses ([`SHARE_BYTES`], or less
    /// under a small memory budget).
    max_bytes: usize,
    waiting: AtomicUsize,
    waiting_bytes: AtomicUsize,
    /// Set while the agent's reader waits for room.
    paused: AtomicBool,
    room: Notify,
}

impl Share {
    /// An empty share of `agent` that is full at `max_bytes` unwritten bytes
    /// (or [`SHARE_EVENTS`] events).
    pub(crate) fn new(agent: Arc<str>, max_bytes: usize) -> Self {
        Self {
            agent,
            max_bytes,
            waiting: AtomicUsize::new(0),
            waiting_bytes: AtomicUsize::new(0),
            paused: AtomicBool::new(false),
            room: Notify::new(),
        }
    }

    /// An event of `bytes` bytes (`Write::bytes`) was queued.
    pub(crate) fn add(&self, bytes: usize) {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        self.waiting_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Takes `bytes` of the share for a client's message unless the share
    /// is full; atomic, so of many clients racing for the last room only
    /// one gets it (the share then ends at most one message past its
    /// cap). Returns whether the room was taken; give it back with
    /// [`Self::remove`].
    pub(crate) fn try_take(&self, bytes: usize) -> bool {
        if self.waiting.load(Ordering::Relaxed) >= SHARE_EVENTS {
            return false;
        }
        let taken = self
            .waiting_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |waiting| {
                (waiting < self.max_bytes).then_some(waiting + bytes)
            })
            .is_ok();
        if taken {
            self.waiting.fetch_add(1, Ordering::Relaxed);
        }
        taken
    }

    /// An event of `bytes` bytes was written or dropped.
    pub(crate) fn remove(&self, bytes: usize) {
        self.waiting.fetch_sub(1, Ordering::Relaxed);
        self.waiting_bytes.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Whether the share is full: the reader should wait.
    pub(crate) fn is_full(&self) -> bool {
        self.waiting.load(Ordering::Relaxed) >= SHARE_EVENTS
            || self.waiting_bytes.load(Ordering::Relaxed) >= self.max_bytes
    }

    /// Whether the share has drained to half: a paused reader goes on
    /// (half, so a reader does not wake for every written batch).
    fn has_room(&self) -> bool {
        self.waiting.load(Ordering::Relaxed) <= SHARE_EVENTS / 2
            && self.waiting_bytes.load(Ordering::Relaxed) <= self.max_bytes / 2
    }

    /// Whether the agent's reader is waiting now.
    pub(crate) fn is_paused(&self) -> bool {
        self.paused.load(Ordering::Acquire)
    }

    /// Marks the reader paused (or not).
    pub(crate) fn set_paused(&self, paused: bool) {
        self.paused.store(paused, Ordering::Release);
    }

    /// Resolves at the next wake-up; create it before checking the state it
    /// waits for, so a wake-up in between is not missed.
    pub(crate) fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.room.notified()
    }

    /// Called by the writer after a batch: wakes a paused reader once the
    /// share has room, or when `force` (the store became degraded: the
    /// reader stops waiting and today's drop rule applies).
    pub(crate) fn wake(&self, force: bool) {
        if self.is_paused() && (force || self.has_room()) {
            self.room.notify_waiters();
        }
    }

    /// Whether the reader may go on after a wake-up.
    pub(crate) fn may_resume(&self) -> bool {
        self.has_room()
    }
}
