//! A session's event log: every ACP message of the session, in order, with
//! the time the runtime saw it (`GET /v2/sessions/{id}/events`;
//! research/contract.md, "Extension methods and control plane"). Bounded
//! by events and bytes; the oldest go first, which shows as a jump in
//! offsets. Every entry is charged to the server-wide memory budget
//! (research/contract.md, "Memory budget"), which may evict the oldest
//! entries early: with a store they are read from it, without one they
//! are gone like any dropped event.

use crate::budget::MemoryBudget;
use bytes::Bytes;
use ext_methods::{Direction, SessionEvent, SessionEventsPage};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::SystemTime;

/// What one entry costs against the memory budget beside its message: the
/// entry itself and its share of the deque, in bytes.
pub const ENTRY_OVERHEAD: usize = 48;

/// Bounds of one session's log.
#[derive(Debug, Clone, Copy)]
pub struct LogLimits {
    /// Most events kept.
    pub events: usize,
    /// Most bytes of messages kept (the newest event is always kept).
    pub bytes: usize,
}

#[derive(Debug)]
struct Entry {
    at: SystemTime,
    direction: Direction,
    message: Bytes,
}

/// The recorded messages of one session.
#[derive(Debug)]
pub struct EventLog {
    entries: VecDeque<Entry>,
    /// Offset of `entries[0]`.
    first_offset: u64,
    bytes: usize,
    limits: LogLimits,
    /// The account this log's entries are charged to (`None`: uncounted).
    budget: Option<Arc<MemoryBudget>>,
}

impl EventLog {
    /// An empty log.
    pub fn new(limits: LogLimits) -> Self {
        Self {
            entries: VecDeque::new(),
            first_offset: 0,
            bytes: 0,
            limits,
            budget: None,
        }
    }

    /// Charges this log's entries to `budget` from now on (call it on an
    /// empty log).
    pub fn with_budget(mut self, budget: Arc<MemoryBudget>) -> Self {
        self.budget = Some(budget);
        self
    }

    /// An empty log whose next event gets offset `count`: a session whose
    /// earlier events are in the store only (research/contract.md,
    /// "Durable sessions").
    pub fn starting_at(limits: LogLimits, count: u64) -> Self {
        let mut log = Self::new(limits);
        log.first_offset = count;
        log
    }

    /// Offset of the oldest event held in memory (older ones are dropped,
    /// or in the store).
    pub fn first_offset(&self) -> u64 {
        self.first_offset
    }

    /// Records one JSON-RPC message (`message`: one JSON object) seen at `at`.
    pub fn record(&mut self, at: SystemTime, direction: Direction, message: Bytes) {
        self.bytes += message.len();
        if let Some(budget) = &self.budget {
            budget.charge(message.len() + ENTRY_OVERHEAD);
        }
        self.entries.push_back(Entry {
            at,
            direction,
            message,
        });
        while self.entries.len() > self.limits.events
            || (self.bytes > self.limits.bytes && self.entries.len() > 1)
        {
            self.pop_oldest();
        }
    }

    /// Drops the oldest entry (its offset then shows as a gap, or is read
    /// from the store); returns whether there was one.
    fn pop_oldest(&mut self) -> bool {
        let Some(old) = self.entries.pop_front() else {
            return false;
        };
        self.bytes -= old.message.len();
        self.first_offset += 1;
        if let Some(budget) = &self.budget {
            budget.release(old.message.len() + ENTRY_OVERHEAD);
        }
        true
    }

    /// Evicts the oldest entries until at most `keep` bytes of messages are
    /// held (`0` empties the log; its count stays). Returns how many went.
    pub fn evict_to(&mut self, keep: usize) -> u64 {
        let mut evicted = 0;
        while self.bytes > keep && self.pop_oldest() {
            evicted += 1;
        }
        evicted
    }

    /// Bytes of messages held in memory.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Messages recorded so far, including dropped ones.
    pub fn count(&self) -> u64 {
        self.first_offset + self.entries.len() as u64
    }

    /// The events held in memory at or after `offset`, oldest first:
    /// `(offset, direction, message)`.
    pub fn entries_from(&self, offset: u64) -> impl Iterator<Item = (u64, Direction, &Bytes)> {
        let start = offset.saturating_sub(self.first_offset) as usize;
        self.entries
            .iter()
            .enumerate()
            .skip(start)
            .map(|(index, entry)| {
                (
                    self.first_offset + index as u64,
                    entry.direction,
                    &entry.message,
                )
            })
    }

    /// Up to `limit` events at or after `offset`. Dropped events are skipped:
    /// the first returned offset is then larger than `offset`.
    pub fn page(&self, offset: u64, limit: usize) -> SessionEventsPage {
        let start = offset.saturating_sub(self.first_offset) as usize;
        let events: Vec<SessionEvent> = self
            .entries
            .iter()
            .enumerate()
            .skip(start)
            .take(limit)
            .map(|(index, entry)| {
                wire_event(
                    self.first_offset + index as u64,
                    entry.at,
                    entry.direction,
                    &entry.message,
                )
            })
            .collect();
        let next_offset = events
            .last()
            .map_or(offset.max(self.first_offset).min(self.count()), |e| {
                e.offset + 1
            });
        SessionEventsPage {
            events,
            next_offset,
        }
    }
}

impl Drop for EventLog {
    fn drop(&mut self) {
        if let Some(budget) = &self.budget {
            budget.release(self.bytes + self.entries.len() * ENTRY_OVERHEAD);
        }
    }
}

/// One recorded message as `GET /v2/sessions/{id}/events` shows it, from
/// memory or from the store: RFC 3339 time with milliseconds; the message
/// as JSON, or as a string when its bytes are not JSON.
pub fn wire_event(
    offset: u64,
    at: SystemTime,
    direction: Direction,
    message: &[u8],
) -> SessionEvent {
    SessionEvent {
        offset,
        at: crate::time::rfc3339(at),
        direction,
        message: serde_json::from_slice(message).unwrap_or_else(|_| {
            serde_json::Value::String(String::from_utf8_lossy(message).into_owned())
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log(events: usize) -> EventLog {
        EventLog::new(LogLimits {
            events,
            bytes: usize::MAX,
        })
    }

    fn offsets(page: &SessionEventsPage) -> Vec<u64> {
        page.events.iter().map(|e| e.offset).collect()
    }

    #[test]
    fn pages_through_in_order() {
        let mut log = log(100);
        for i in 0..5 {
            log.record(
                SystemTime::now(),
                Direction::AgentToClient,
                Bytes::from(format!("{{\"n\":{i}}}")),
            );
        }
        let page = log.page(0, 2);
        assert_eq!(offsets(&page), [0, 1]);
        assert_eq!(page.next_offset, 2);
        assert_eq!(page.events[1].message["n"], 1);
        let page = log.page(page.next_offset, 10);
        assert_eq!(offsets(&page), [2, 3, 4]);
        assert_eq!(page.next_offset, 5);
        let page = log.page(5, 10);
        assert!(page.events.is_empty());
        assert_eq!(page.next_offset, 5);
    }

    #[test]
    fn dropped_events_show_as_an_offset_gap() {
        let mut log = log(3);
        for _ in 0..7 {
            log.record(
                SystemTime::now(),
                Direction::ClientToAgent,
                Bytes::from_static(b"{}"),
            );
        }
        assert_eq!(log.count(), 7);
        let page = log.page(0, 10);
        assert_eq!(offsets(&page), [4, 5, 6]);
        assert_eq!(page.next_offset, 7);
        assert!(
            log.page(1, 10)
                .events
                .first()
                .is_some_and(|e| e.offset == 4)
        );
    }

    #[test]
    fn byte_cap_keeps_the_newest() {
        let mut log = EventLog::new(LogLimits {
            events: 100,
            bytes: 4,
        });
        log.record(
            SystemTime::now(),
            Direction::AgentToClient,
            Bytes::from_static(b"{\"a\":1}"),
        );
        log.record(
            SystemTime::now(),
            Direction::AgentToClient,
            Bytes::from_static(b"{\"b\":2}"),
        );
        assert_eq!(offsets(&log.page(0, 10)), [1]);
    }

    #[test]
    fn eviction_moves_the_first_offset_and_releases_the_budget() {
        let budget = Arc::new(MemoryBudget::new(usize::MAX));
        let mut log = log(100).with_budget(budget.clone());
        for _ in 0..4 {
            log.record(
                SystemTime::now(),
                Direction::AgentToClient,
                Bytes::from_static(b"{\"a\":1}"),
            );
        }
        assert_eq!(budget.used(), 4 * (7 + ENTRY_OVERHEAD));
        assert_eq!(log.evict_to(14), 2);
        assert_eq!(log.first_offset(), 2);
        assert_eq!(log.count(), 4);
        assert_eq!(offsets(&log.page(0, 10)), [2, 3]);
        assert_eq!(budget.used(), 2 * (7 + ENTRY_OVERHEAD));
        assert_eq!(log.evict_to(0), 2);
        assert!(log.page(0, 10).events.is_empty());
        assert_eq!(log.page(0, 10).next_offset, 4);
        log.record(
            SystemTime::now(),
            Direction::AgentToClient,
            Bytes::from_static(b"{}"),
        );
        drop(log);
        assert_eq!(budget.used(), 0, "a dropped log releases what it held");
    }
}
