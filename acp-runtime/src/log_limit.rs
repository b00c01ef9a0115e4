//! Rate limits for warnings that an agent can trigger once per message.
//!
//! An agent that writes the same mistake in a loop (updates for a session
//! nobody owns, answers to unknown ids, lines that are not JSON-RPC) must not
//! flood the log with one line per message. A [`LogLimit`] lets the first
//! occurrence through, then counts the rest and writes one summary per
//! interval while they keep coming; after an interval without any, the next
//! occurrence is logged in full again (research/contract.md, "Routing:
//! connections, sessions, one agent process").

use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// The interval of the agent-driven warnings: at most one full line and one
/// summary per interval and kind of warning.
pub(crate) const WARN_INTERVAL: Duration = Duration::from_secs(10);

/// Writes the summary of `count` suppressed occurrences of one warning over
/// the last `interval`.
type Summary = dyn Fn(u64, Duration) + Send + Sync;

/// One kind of warning, rate-limited: see the module documentation.
pub(crate) struct LogLimit {
    inner: Arc<Inner>,
}

struct Inner {
    interval: Duration,
    summary: Box<Summary>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// End of the current interval; occurrences before it are counted, not
    /// logged. `None`: quiet, the next occurrence is logged.
    until: Option<Instant>,
    /// Occurrences counted in the current interval.
    suppressed: u64,
    /// A task will write the summary at `until`.
    flush_armed: bool,
}

impl std::fmt::Debug for LogLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogLimit")
            .field("interval", &self.inner.interval)
            .finish_non_exhaustive()
    }
}

impl LogLimit {
    /// A limit of one full line, then one `summary(count, interval)` per
    /// `interval` while occurrences keep coming.
    pub(crate) fn new(
        interval: Duration,
        summary: impl Fn(u64, Duration) + Send + Sync + 'static,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                interval,
                summary: Box::new(summary),
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// Whether this occurrence should be logged in full. When not, it is
    /// counted; the count is written as a summary when the interval ends
    /// (by a timer task, so a flood that stops is still summed up).
    pub(crate) fn admit(&self) -> bool {
        let now = Instant::now();
        let mut state = self.inner.state.lock();
        match state.until {
            // An armed timer sums up what is counted until it fires.
            Some(until) if now < until || state.flush_armed => {
                state.suppressed += 1;
                if !state.flush_armed {
                    state.flush_armed = self.arm_flush(until);
                }
                false
            }
            _ => {
                // Quiet for a whole interval (or never armed a timer: no
                // async runtime): sum up what was left, then start afresh.
                let left = std::mem::take(&mut state.suppressed);
                state.until = Some(now + self.inner.interval);
                drop(state);
                if left > 0 {
                    (self.inner.summary)(left, self.inner.interval);
                }
                true
            }
        }
    }

    /// Starts the task that writes the summary at `until`; `false` outside
    /// an async runtime (the next admitted occurrence writes it then).
    fn arm_flush(&self, until: Instant) -> bool {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        let inner = self.inner.clone();
        handle.spawn(async move {
            let mut until = until;
            loop {
                tokio::time::sleep_until(until).await;
                let mut state = inner.state.lock();
                let count = std::mem::take(&mut state.suppressed);
                if count == 0 {
                    // Quiet for the whole interval: the next one is logged.
                    state.until = None;
                    state.flush_armed = false;
                    return;
                }
                // Still coming: keep counting for another interval.
                until += inner.interval;
                state.until = Some(until);
                drop(state);
                (inner.summary)(count, inner.interval);
            }
        });
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// The interval of these tests: long enough for a slow machine to do
    /// each step well inside one.
    const INTERVAL: Duration = Duration::from_millis(400);

    fn counting() -> (LogLimit, Arc<Mutex<Vec<u64>>>) {
        let summaries = Arc::new(Mutex::new(Vec::new()));
        let sink = summaries.clone();
        let limit = LogLimit::new(INTERVAL, move |count, _| {
            sink.lock().push(count);
        });
        (limit, summaries)
    }

    #[tokio::test]
    async fn the_first_is_logged_then_one_summary_per_interval() {
        let (limit, summaries) = counting();
        assert!(limit.admit(), "the first occurrence is logged");
        let admitted = AtomicU64::new(0);
        for _ in 0..10_000 {
            if limit.admit() {
                admitted.fetch_add(1, Ordering::Relaxed);
            }
        }
        assert_eq!(admitted.load(Ordering::Relaxed), 0);
        assert!(
            summaries.lock().is_empty(),
            "no summary before the interval ends"
        );
        // 1.5 intervals: the summary came at the end of the first.
        tokio::time::sleep(INTERVAL * 3 / 2).await;
        assert_eq!(*summaries.lock(), [10_000]);
        // Still coming in the second interval: counted, summed up again.
        assert!(!limit.admit());
        assert!(!limit.admit());
        tokio::time::sleep(INTERVAL).await;
        assert_eq!(*summaries.lock(), [10_000, 2]);
        // The third interval is quiet: the next occurrence is logged in full.
        tokio::time::sleep(INTERVAL * 3 / 2).await;
        assert!(limit.admit());
        assert_eq!(*summaries.lock(), [10_000, 2]);
    }

    #[test]
    fn without_a_runtime_the_next_admitted_occurrence_sums_up() {
        let (limit, summaries) = counting();
        *limit.inner.state.lock() = State {
            until: Some(Instant::now()),
            suppressed: 7,
            flush_armed: false,
        };
        assert!(limit.admit());
        assert_eq!(*summaries.lock(), [7]);
    }
}
