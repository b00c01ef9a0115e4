//! The server under test: one the bench starts, or one at `--url`; its
//! address and, when local, its pid and RSS.

use super::client::BenchError;
use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncBufReadExt;
use tokio::process::{Child, Command};

/// A server under test: its address and, when local, its pid.
#[derive(Debug)]
pub struct Target {
    /// Where it listens.
    pub address: SocketAddr,
    /// Its pid, when the bench started it (for RSS).
    pub pid: Option<u32>,
    /// Bearer token.
    pub token: Option<String>,
    child: Option<Child>,
}

impl Target {
    /// Starts `program server` on a free loopback port and waits for its
    /// listening line.
    ///
    /// # Errors
    /// When it does not start.
    pub async fn start(program: &std::path::Path, extra: &[&str]) -> Result<Self, BenchError> {
        Self::start_with_env(program, extra, &[]).await
    }

    /// [`Target::start`] with `env` added to the server's environment.
    ///
    /// # Errors
    /// When it does not start.
    pub async fn start_with_env(
        program: &std::path::Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Self, BenchError> {
        let mut child = Command::new(program)
            .args(["server", "--host", "127.0.0.1", "--port", "0", "--no-token"])
            .args(extra)
            .env("RUST_LOG", "warn")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| BenchError::Unexpected("server stdout not piped".into()))?;
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .map_err(|_| BenchError::Unexpected("server did not start within 20 s".into()))??
            .ok_or_else(|| BenchError::Unexpected("server exited before listening".into()))?;
        let address = line
            .rsplit("http://")
            .next()
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| BenchError::Unexpected(format!("unexpected start line {line:?}")))?;
        Ok(Self {
            address,
            pid: child.id(),
            token: None,
            child: Some(child),
        })
    }

    /// A server started elsewhere.
    pub fn remote(address: SocketAddr, token: Option<String>) -> Self {
        Self {
            address,
            pid: None,
            token,
            child: None,
        }
    }

    /// Resident set size of the server in bytes, when it is local.
    pub fn rss(&self) -> Option<u64> {
        rss_bytes(self.pid?)
    }

    /// Stops a server the bench started (SIGTERM, then waits).
    pub async fn stop(mut self) {
        if let (Some(mut child), Some(pid)) = (self.child.take(), self.pid) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap_or(0)),
                nix::sys::signal::Signal::SIGTERM,
            );
            if tokio::time::timeout(Duration::from_secs(10), child.wait())
                .await
                .is_err()
            {
                let _ = child.kill().await;
            }
        }
    }
}

/// `VmRSS` of a process, in bytes (Linux `/proc/<pid>/status`).
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
