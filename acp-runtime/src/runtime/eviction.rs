//! Keeping every event log and replay ring within `--memory-budget-bytes`
//! (research/contract.md, "Memory budget"). The hot path only charges the
//! account ([`MemoryBudget::charge`]); crossing the limit wakes
//! [`Runtime::keep_within_budget`], which evicts the oldest in-memory
//! events until the account is back at [`MemoryBudget::target`]:
//!
//! 1. the logs of ended and dormant sessions, least recently changed
//!    first (with a store they stay readable from it: `session_events`
//!    reads offsets below the log's first one from the store);
//! 2. then the oldest half of the largest live session logs and
//!    connection rings, largest first (a ring's stream gets a
//!    `_sandboxagent/stream/gap` notice for what it had not sent).
//!
//! Apart from the budget, with a store an ended session's log shrinks to
//! its last [`ENDED_TAIL_BYTES`] once the store has it all (checked every
//! [`TRIM_INTERVAL`]): the rest pages from the store.

use super::Runtime;
use crate::budget::MemoryBudget;
use crate::memory::connection::Connection;
use crate::memory::session::Session;
use std::sync::Arc;
use std::time::Duration;

/// Pause after a pass, so a server that cannot get under its budget (many
/// small holders) does not spin on the wake-ups of every push.
const PASS_PAUSE: Duration = Duration::from_millis(10);

/// Most halving rounds over the live holders in one pass.
const MAX_ROUNDS: usize = 16;

/// Bytes of messages an ended session's log keeps in memory once its
/// events are in the store.
pub(crate) const ENDED_TAIL_BYTES: usize = 64 * 1024;

/// How often ended sessions' logs are checked for trimming.
const TRIM_INTERVAL: Duration = Duration::from_secs(1);

/// Longest the trim waits for the store's writer to catch up.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// One live holder of events: a session's log or a connection's ring.
enum Holder {
    Log(Arc<Session>),
    Ring(Arc<Connection>),
}

impl Runtime {
    /// Evicts whenever the memory budget is crossed, until shutdown.
    pub(crate) async fn keep_within_budget(self: Arc<Self>) {
        loop {
            tokio::select! {
                () = self.memory.crossed() => {
                    self.evict();
                    tokio::time::sleep(PASS_PAUSE).await;
                }
                () = self.shutdown.cancelled() => return,
            }
        }
    }

    /// Trims ended sessions' logs to their tail and the inventory's cache
    /// of ended and dormant entries (`Sessions::trim`) every
    /// [`TRIM_INTERVAL`], until shutdown (a task of its own: it waits on
    /// the store).
    pub(crate) async fn trim_ended_sessions(self: Arc<Self>) {
        let mut ticker = tokio::time::interval(TRIM_INTERVAL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {
                    self.trim_ended().await;
                    // The cache of ended and dormant entries, also when no
                    // session was made since the last ones ended.
                    self.sessions.trim();
                }
                () = self.shutdown.cancelled() => return,
            }
        }
    }

    /// With a store, shrinks the log of every ended session to its last
    /// [`ENDED_TAIL_BYTES`] once the store's writer has written everything
    /// queued so far (a store that is behind or degraded keeps them all in
    /// memory). Returns how many events left memory.
    pub(crate) async fn trim_ended(&self) -> u64 {
        // A degraded store would only time the flush out, and leave one
        // more flush queued behind its writes each time.
        let Some(persist) = self.persist.as_ref().filter(|p| p.health().error.is_none()) else {
            return 0;
        };
        let ended: Vec<Arc<Session>> = self
            .sessions
            .each()
            .filter(|s| s.is_ended() && s.is_stored() && s.log_bytes() > ENDED_TAIL_BYTES)
            .collect();
        if ended.is_empty() || !persist.flush(FLUSH_TIMEOUT).await {
            return 0;
        }
        ended
            .iter()
            .map(|session| session.evict_events(ENDED_TAIL_BYTES))
            .sum()
    }

    /// One eviction pass (see the module doc); returns the events evicted.
    pub(crate) fn evict(&self) -> u64 {
        let budget: &MemoryBudget = &self.memory;
        if !budget.is_over() {
            return 0;
        }
        let target = budget.target();
        let mut evicted = 0;
        let mut gone: Vec<_> = self
            .sessions
            .all()
            .into_iter()
            .filter(|s| s.is_gone())
            .map(|s| (s.updated_at(), s))
            .collect();
        gone.sort_by_key(|(at, _)| *at);
        for (_, session) in gone {
            if budget.used() <= target {
                break;
            }
            evicted += session.evict_events(0);
        }
        for _ in 0..MAX_ROUNDS {
            if budget.used() <= target {
                break;
            }
            let mut holders: Vec<(usize, Holder)> = self
                .sessions
                .all()
                .into_iter()
                .filter(|s| !s.is_gone())
                .map(|s| (s.log_bytes(), Holder::Log(s)))
                .chain(
                    self.connections
                        .all()
                        .into_iter()
                        .map(|c| (c.ring_bytes(), Holder::Ring(c))),
                )
                .filter(|(bytes, _)| *bytes > 0)
                .collect();
            if holders.is_empty() {
                break;
            }
            holders.sort_by_key(|(bytes, _)| std::cmp::Reverse(*bytes));
            for (bytes, holder) in holders {
                if budget.used() <= target {
                    break;
                }
                evicted += match holder {
                    Holder::Log(session) => session.evict_events(bytes / 2),
                    Holder::Ring(connection) => connection.evict_to(bytes / 2),
                };
            }
        }
        budget.count_evicted(evicted);
        if evicted > 0 {
            tracing::debug!(
                evicted,
                used = budget.used(),
                limit = budget.limit(),
                "memory budget: evicted the oldest events held in memory"
            );
        }
        evicted
    }
}
