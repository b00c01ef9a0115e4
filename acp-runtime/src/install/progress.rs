//! What an install reports while it runs.

/// Receives progress lines while an install runs (the CLI shows them in a
/// spinner; the server logs them at debug level).
pub trait Progress: Send + Sync {
    /// One step or one line of npm output.
    fn step(&self, message: &str);
}

/// [`Progress`] into the log, at debug level.
#[derive(Debug)]
pub struct LogProgress {
    /// The agent being installed.
    pub agent: String,
}

impl Progress for LogProgress {
    fn step(&self, message: &str) {
        tracing::debug!(agent = %self.agent, "install: {message}");
    }
}
