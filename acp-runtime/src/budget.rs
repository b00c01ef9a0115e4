//! The server-wide memory budget of event logs and replay rings
//! (research/contract.md, "Memory budget"): one account of the bytes every
//! session's log and every connection's ring hold, charged and released
//! with an atomic add on the hot path. Crossing the budget only wakes the
//! evictor (`runtime::eviction`), which frees the oldest in-memory events off
//! the hot path.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use tokio::sync::Notify;

/// The account: bytes held against a limit, and the events evicted so far.
#[derive(Debug)]
pub struct MemoryBudget {
    /// Most bytes logs and rings may hold together before eviction starts.
    limit: usize,
    /// Bytes held now: every log entry and ring event, counted once per
    /// holder (a message in a session's log and two rings counts three
    /// times, so the account errs on the side of evicting early).
    used: AtomicUsize,
    /// Events evicted to stay under the limit (from logs and rings).
    evicted: AtomicU64,
    /// Wakes the evictor when `used` crosses `limit`.
    over: Notify,
}

impl MemoryBudget {
    /// An account of `limit` bytes (`usize::MAX`: no limit).
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            used: AtomicUsize::new(0),
            evicted: AtomicU64::new(0),
            over: Notify::new(),
        }
    }

    /// Charges `bytes` newly held; wakes the evictor when over the limit.
    pub fn charge(&self, bytes: usize) {
        let used = self.used.fetch_add(bytes, Ordering::Relaxed) + bytes;
        if used > self.limit {
            self.over.notify_one();
        }
    }

    /// Releases `bytes` no longer held.
    pub fn release(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Counts `events` evicted to stay under the limit.
    pub fn count_evicted(&self, events: u64) {
        self.evicted.fetch_add(events, Ordering::Relaxed);
    }

    /// The limit in bytes.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes held now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Events evicted since the server started.
    pub fn evicted_events(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    /// Whether more than the limit is held.
    pub fn is_over(&self) -> bool {
        self.used() > self.limit
    }

    /// What eviction brings the account down to: seven eighths of the
    /// limit, so one pass buys room for many pushes.
    pub fn target(&self) -> usize {
        self.limit - self.limit / 8
    }

    /// Resolves once the account was over the limit since the last call.
    pub async fn crossed(&self) {
        self.over.notified().await;
    }

    /// Charges `bytes` for as long as the returned guard lives (a record
    /// the evictor cannot free, e.g. a process's, which then leaves less
    /// room to logs and rings).
    pub fn hold(budget: &Arc<Self>, bytes: usize) -> Charge {
        budget.charge(bytes);
        Charge {
            budget: budget.clone(),
            bytes,
        }
    }
}

/// Bytes charged to a [`MemoryBudget`] until dropped ([`MemoryBudget::hold`]).
#[derive(Debug)]
pub struct Charge {
    budget: Arc<MemoryBudget>,
    bytes: usize,
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.release(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_and_releases() {
        let budget = MemoryBudget::new(100);
        budget.charge(60);
        assert!(!budget.is_over());
        budget.charge(60);
        assert!(budget.is_over());
        budget.release(60);
        assert_eq!(budget.used(), 60);
        budget.count_evicted(3);
        assert_eq!(budget.evicted_events(), 3);
        assert_eq!(budget.target(), 88);
    }

    #[test]
    fn a_hold_is_released_when_dropped() {
        let budget = Arc::new(MemoryBudget::new(100));
        let held = MemoryBudget::hold(&budget, 70);
        assert_eq!(budget.used(), 70);
        drop(held);
        assert_eq!(budget.used(), 0);
    }
}
