//! How an agent process ended, as its routing table and supervisor see it.

/// How an agent process ended.
#[derive(Debug, Clone, Copy, Default)]
pub struct ExitInfo {
    /// Exit code, when it exited normally.
    pub code: Option<i32>,
    /// Signal number, when a signal ended it.
    pub signal: Option<i32>,
}

impl ExitInfo {
    /// "exit code N", "signal N" or "unknown status".
    pub fn describe(&self) -> String {
        match (self.code, self.signal) {
            (Some(code), _) => format!("exit code {code}"),
            (None, Some(signal)) => format!("signal {signal}"),
            (None, None) => "unknown status".to_owned(),
        }
    }
}
