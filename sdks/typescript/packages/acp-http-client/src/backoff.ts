/**
 * Reconnect timing for the event stream: bounded, jittered exponential
 * back-off (the same policy as the Rust `acp-http-client`).
 */

/** How the event stream is reopened after it drops. */
export interface ReconnectPolicy {
  /** Delay before the first reconnect attempt, in milliseconds, before jitter. Default 250. */
  initialDelayMs: number;
  /** Upper bound of any delay, in milliseconds, before jitter. Default 10,000. */
  maxDelayMs: number;
  /**
   * Consecutive failed attempts before giving up (the connection is then
   * lost). Default 10; `0` gives up at the first failure.
   */
  maxAttempts: number;
}

/** The default policy: 250 ms doubling up to 10 s, 10 attempts. */
export const DEFAULT_RECONNECT_POLICY: ReconnectPolicy = {
  initialDelayMs: 250,
  maxDelayMs: 10_000,
  maxAttempts: 10,
};

/**
 * The delay before attempt `failures` (0-based count of consecutive
 * failures): `initialDelayMs * 2^failures` capped at `maxDelayMs`, then
 * jittered by `unit` (a number in `[0, 1)`) into `[delay / 2, delay]`, so
 * that many clients cut off at once do not come back at once.
 */
export function reconnectDelayMs(policy: ReconnectPolicy, failures: number, unit: number): number {
  const base = Math.min(policy.initialDelayMs * 2 ** Math.min(failures, 30), policy.maxDelayMs);
  const clamped = Math.min(Math.max(unit, 0), 1);
  return base / 2 + (base / 2) * clamped;
}
