//! Black-box test harness.
