//! Reconnect timing for the SSE stream: bounded, jittered exponential
//! back-off.

use std::time::Duration;

/// How the event stream is reopened after it drops.
///
/// The delay before reconnect attempt `n` (counting consecutive failed
/// attempts from 0) is `initial_delay * 2^n`, capped at `max_delay`, then
/// jittered to a uniformly random value in `[delay / 2, delay]` so that many
/// clients cut off at once do not come back at once. A successful connect
/// resets the count. After `max_attempts` consecutive failed attempts the
/// stream gives up and the incoming stream ends with
/// [`Error::StreamLost`](crate::Error::StreamLost).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReconnectPolicy {
    /// Delay before the first reconnect attempt after a drop (before
    /// jitter). Default 250 ms.
    pub initial_delay: Duration,
    /// Upper bound of any delay (before jitter). Default 10 s.
    pub max_delay: Duration,
    /// Consecutive failed connect attempts before giving up. Default 10;
    /// `0` gives up at the first failure.
    pub max_attempts: u32,
}

impl Default for ReconnectPolicy {
    fn default() -> Self {
        ReconnectPolicy {
            initial_delay: Duration::from_millis(250),
            max_delay: Duration::from_secs(10),
            max_attempts: 10,
        }
    }
}

impl ReconnectPolicy {
    /// The delay before attempt `failures` (0-based count of consecutive
    /// failures so far), before jitter: `initial_delay * 2^failures`,
    /// capped at `max_delay`.
    pub fn base_delay(&self, failures: u32) -> Duration {
        let factor = 1_u32.checked_shl(failures.min(31)).unwrap_or(u32::MAX);
        self.initial_delay
            .checked_mul(factor)
            .unwrap_or(Duration::MAX)
            .min(self.max_delay)
    }
}

/// `base` jittered by `unit` (a random number in `[0, 1)`) into
/// `[base / 2, base]`.
pub fn jittered(base: Duration, unit: f64) -> Duration {
    let half = base / 2;
    // Float rounding may overshoot `half` for huge delays; clamp instead of
    // trusting it.
    let extra = Duration::try_from_secs_f64(half.as_secs_f64() * unit.clamp(0.0, 1.0))
        .unwrap_or(half)
        .min(half);
    half.saturating_add(extra).min(base)
}

/// Consecutive-failure state of one stream.
#[derive(Debug, Clone)]
pub struct Backoff {
    policy: ReconnectPolicy,
    failures: u32,
}

impl Backoff {
    /// No failures yet.
    pub fn new(policy: ReconnectPolicy) -> Self {
        Backoff {
            policy,
            failures: 0,
        }
    }

    /// Records one failed connect attempt. Returns `false` once
    /// `max_attempts` consecutive attempts have failed (give up).
    pub fn record_failure(&mut self) -> bool {
        self.failures = self.failures.saturating_add(1);
        self.failures < self.policy.max_attempts
    }

    /// A connect succeeded: the next delay is the initial one again.
    pub fn reset(&mut self) {
        self.failures = 0;
    }

    /// Consecutive failed attempts so far.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// How long to wait before the next attempt, with `unit` in `[0, 1)`
    /// as the source of jitter.
    pub fn delay(&self, unit: f64) -> Duration {
        jittered(self.policy.base_delay(self.failures), unit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> ReconnectPolicy {
        ReconnectPolicy {
            initial_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(2),
            max_attempts: 5,
        }
    }

    #[test]
    fn base_delay_doubles_and_is_capped() {
        let p = policy();
        assert_eq!(p.base_delay(0), Duration::from_millis(100));
        assert_eq!(p.base_delay(1), Duration::from_millis(200));
        assert_eq!(p.base_delay(4), Duration::from_millis(1600));
        assert_eq!(p.base_delay(5), Duration::from_secs(2));
        assert_eq!(p.base_delay(64), Duration::from_secs(2));
        assert_eq!(p.base_delay(u32::MAX), Duration::from_secs(2));
    }

    #[test]
    fn huge_settings_do_not_overflow() {
        let p = ReconnectPolicy {
            initial_delay: Duration::MAX,
            max_delay: Duration::MAX,
            max_attempts: u32::MAX,
        };
        assert_eq!(p.base_delay(40), Duration::MAX);
        let mut backoff = Backoff::new(p);
        let _ = backoff.delay(0.99);
        for _ in 0..3 {
            assert!(backoff.record_failure());
        }
    }

    #[test]
    fn jitter_stays_within_half_and_full_delay() {
        let base = Duration::from_millis(800);
        assert_eq!(jittered(base, 0.0), Duration::from_millis(400));
        assert_eq!(jittered(base, 1.0), base);
        assert_eq!(jittered(base, 7.0), base, "out-of-range input is clamped");
        for _ in 0..1000 {
            let delay = jittered(base, fastrand::f64());
            assert!(
                delay >= Duration::from_millis(400) && delay <= base,
                "{delay:?}"
            );
        }
    }

    #[test]
    fn delays_grow_with_failures_within_bounds() {
        let p = policy();
        let mut backoff = Backoff::new(p);
        for failures in 0..8 {
            assert_eq!(backoff.failures(), failures);
            let base = p.base_delay(failures);
            let delay = backoff.delay(fastrand::f64());
            assert!(delay >= base / 2 && delay <= base, "{failures}: {delay:?}");
            assert!(delay <= p.max_delay);
            let _ = backoff.record_failure();
        }
    }

    #[test]
    fn gives_up_after_max_attempts_consecutive_failures() {
        let mut backoff = Backoff::new(policy());
        for _ in 0..4 {
            assert!(backoff.record_failure());
        }
        assert!(!backoff.record_failure(), "the fifth failure gives up");
    }

    #[test]
    fn zero_attempts_gives_up_at_once() {
        let mut backoff = Backoff::new(ReconnectPolicy {
            max_attempts: 0,
            ..policy()
        });
        assert!(!backoff.record_failure());
    }

    #[test]
    fn reset_returns_to_the_initial_delay() {
        let p = policy();
        let mut backoff = Backoff::new(p);
        for _ in 0..3 {
            assert!(backoff.record_failure());
        }
        assert_eq!(backoff.delay(1.0), Duration::from_millis(800));
        backoff.reset();
        assert_eq!(backoff.failures(), 0);
        assert_eq!(backoff.delay(1.0), p.initial_delay);
        assert_eq!(backoff.delay(0.0), p.initial_delay / 2);
        // The full allowance of attempts is available again.
        for _ in 0..4 {
            assert!(backoff.record_failure());
        }
    }
}
