//! Embedded mode: find the `sandbox-agent` binary, start
//! `sandbox-agent server` on a free loopback port with a random token, wait
//! until it is ready, and stop it (SIGTERM, then SIGKILL after a grace
//! period) when the client is disposed or dropped.
//!
//! The server announces its address on stdout (`sandbox-agent listening on
//! http://HOST:PORT`, research/contract.md "Server start-up"); the client
//! asks for `--port 0` and reads that line, so there is no race for a port.
//! The token goes in the environment (`SANDBOX_AGENT_TOKEN`), not on the
//! command line, which other users of the machine can read in `/proc`.
//!
//! The server stays in the caller's process group: a Ctrl-C in a terminal
//! reaches it too, so it stops even when the program that started it is
//! killed by that signal. A program killed with SIGKILL (or aborting on
//! panic) runs no destructor, so the server is also started with
//! `--exit-on-stdin-eof` and a pipe on its stdin whose write end only this
//! process holds: when the process dies in any way the kernel closes it and
//! the server shuts down (no `PR_SET_PDEATHSIG`, which needs `unsafe`).

use crate::error::Error;
use crate::options::{EmbeddedSettings, ServerLogs};
use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Name of the binary.
const BINARY_NAME: &str = "sandbox-agent";

/// Environment variable naming the binary.
pub const BINARY_ENV: &str = "SANDBOX_AGENT_BIN";

/// Prefix of the line the server prints on stdout once it serves.
pub const LISTENING_PREFIX: &str = "sandbox-agent listening on ";

/// Server settings read from the environment that embedded mode sets
/// itself; inherited values are removed so they cannot conflict (a
/// `SANDBOX_AGENT_NO_TOKEN` next to the token would stop the server).
const OWNED_ENV: [&str; 4] = [
    "SANDBOX_AGENT_TOKEN",
    "SANDBOX_AGENT_NO_TOKEN",
    "SANDBOX_AGENT_HOST",
    "SANDBOX_AGENT_PORT",
];

/// Bytes of random token (hex-encoded: twice as many characters).
const TOKEN_BYTES: usize = 24;

/// Stderr lines kept with [`ServerLogs::Capture`].
const STDERR_LINES: usize = 200;

/// How often readiness and exit are polled.
const POLL: Duration = Duration::from_millis(20);

/// A running embedded server; stopped when dropped.
#[derive(Debug)]
pub(crate) struct EmbeddedServer {
    /// The server process; `None` once reaped.
    child: Option<Child>,
    /// Its pid, kept after reaping.
    pid: u32,
    /// `http://127.0.0.1:PORT`.
    base_url: String,
    /// The bearer token it requires.
    token: String,
    /// SIGTERM → SIGKILL delay.
    grace: Duration,
    /// Its last stderr lines (with [`ServerLogs::Capture`]).
    stderr: Arc<parking_lot::Mutex<VecDeque<String>>>,
    /// Ends (its sender dropped) once the stderr reader saw the pipe close:
    /// a server that exited may still have lines in the pipe.
    stderr_read: Option<tokio::sync::oneshot::Receiver<()>>,
}

impl EmbeddedServer {
    /// Starts `binary server` and waits until it answers `GET /v2/health`.
    ///
    /// # Errors
    /// [`Error::BinaryNotFound`], [`Error::ServerStart`] (spawn failed, the
    /// server exited or printed something unexpected),
    /// [`Error::StartupTimeout`].
    pub(crate) async fn start(
        settings: &EmbeddedSettings,
        http: &reqwest::Client,
    ) -> Result<EmbeddedServer, Error> {
        let binary = match &settings.binary {
            Some(binary) => binary.clone(),
            None => find_binary(
                std::env::var_os(BINARY_ENV),
                std::env::current_exe().ok(),
                std::env::var_os("PATH"),
            )?,
        };
        let token = random_token()?;
        let started = Instant::now();
        let agent_grace_ms = settings.shutdown_grace.as_millis().saturating_mul(2) / 5;

        let mut command = Command::new(&binary);
        command
            .args(["server", "--host", "127.0.0.1", "--port", "0"])
            .arg("--exit-on-stdin-eof")
            .arg("--shutdown-grace-ms")
            .arg(agent_grace_ms.to_string())
            .args(&settings.args);
        for key in OWNED_ENV {
            command.env_remove(key);
        }
        command
            .envs(settings.env.iter().map(|(k, v)| (k, v)))
            .env("SANDBOX_AGENT_TOKEN", &token)
            // Kept open inside `child` for the server's lifetime (see above).
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(match settings.logs {
                ServerLogs::Capture => Stdio::piped(),
                ServerLogs::Inherit => Stdio::inherit(),
            });
        let mut child = command.spawn().map_err(|error| Error::ServerStart {
            message: format!("cannot run {}: {error}", binary.display()),
            stderr: String::new(),
        })?;
        let pid = child.id();
        let stderr = Arc::new(parking_lot::Mutex::new(VecDeque::new()));
        let stderr_read = child
            .stderr
            .take()
            .map(|pipe| keep_tail(pipe, Arc::clone(&stderr)));
        let first_line = match child.stdout.take() {
            Some(pipe) => read_first_line(pipe),
            None => {
                let (_, rx) = tokio::sync::oneshot::channel();
                rx
            }
        };
        let mut server = EmbeddedServer {
            child: Some(child),
            pid,
            base_url: String::new(),
            token,
            grace: settings.shutdown_grace,
            stderr,
            stderr_read,
        };
        tracing::debug!(pid, binary = %binary.display(), "embedded server started");

        let timeout = settings.startup_timeout;
        let line = match tokio::time::timeout(timeout, first_line).await {
            Ok(Ok(line)) => line,
            Ok(Err(_closed)) => {
                // Stdout closed without the line: the server is exiting.
                let status = server.wait_exit(Duration::from_secs(2)).await;
                server.wait_stderr_read(Duration::from_secs(2)).await;
                return Err(Error::ServerStart {
                    message: match status {
                        Some(status) => format!("it exited ({status}) before it was ready"),
                        None => "it closed stdout before it was ready".to_owned(),
                    },
                    stderr: server.stderr_text(),
                });
            }
            Err(_) => {
                return Err(Error::StartupTimeout {
                    timeout,
                    stderr: server.stderr_text(),
                });
            }
        };
        let Some(url) = line.trim_end().strip_prefix(LISTENING_PREFIX) else {
            return Err(Error::ServerStart {
                message: format!("unexpected first line on stdout: {line:?}"),
                stderr: server.stderr_text(),
            });
        };
        server.base_url = url.to_owned();
        let remaining = timeout.saturating_sub(started.elapsed());
        if !wait_healthy(http, &server.base_url, remaining).await {
            return Err(Error::StartupTimeout {
                timeout,
                stderr: server.stderr_text(),
            });
        }
        tracing::debug!(pid, url = %server.base_url, elapsed = ?started.elapsed(), "embedded server ready");
        Ok(server)
    }

    /// `http://127.0.0.1:PORT`.
    pub(crate) fn base_url(&self) -> &str {
        &self.base_url
    }

    /// The token the server requires.
    pub(crate) fn token(&self) -> &str {
        &self.token
    }

    /// The server's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// Its captured stderr lines, joined by `\n`.
    pub(crate) fn stderr_text(&self) -> String {
        let lines = self.stderr.lock();
        lines.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    /// Stops the server without blocking the async runtime: SIGTERM, up to
    /// the grace period to exit, then SIGKILL; reaps it.
    pub(crate) async fn stop(&mut self) {
        if !self.running() {
            return;
        }
        self.signal_terminate();
        if self.wait_exit(self.grace).await.is_none() {
            self.kill_and_reap();
        }
    }

    /// Whether the process still runs (reaps it when it exited).
    fn running(&mut self) -> bool {
        match self.child.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => true,
            Some(_) => {
                self.child = None;
                false
            }
            None => false,
        }
    }

    /// Polls for the exit for up to `limit`; the exit status once reaped.
    async fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            let child = self.child.as_mut()?;
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            // A std child has no exit notification; poll.
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits up to `limit` for the stderr reader to reach the end of the
    /// pipe (a process that inherited it can hold it open longer).
    async fn wait_stderr_read(&mut self, limit: Duration) {
        if let Some(read) = self.stderr_read.take() {
            let _ = tokio::time::timeout(limit, read).await;
        }
    }

    #[cfg(unix)]
    fn signal_terminate(&self) {
        if let Ok(pid) = i32::try_from(self.pid) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
    }

    #[cfg(not(unix))]
    fn signal_terminate(&mut self) {
        // No SIGTERM: stop at once.
        self.kill_and_reap();
    }

    fn kill_and_reap(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for EmbeddedServer {
    /// SIGTERM, up to the grace period (polling, blocking this thread),
    /// then SIGKILL; reaps the process. Prefer
    /// [`dispose`](crate::SandboxAgentClient::dispose), which waits without
    /// blocking.
    fn drop(&mut self) {
        if !self.running() {
            return;
        }
        self.signal_terminate();
        let deadline = Instant::now() + self.grace;
        while self.running() && Instant::now() < deadline {
            std::thread::sleep(POLL);
        }
        if self.running() {
            tracing::warn!(
                pid = self.pid,
                "embedded server ignored SIGTERM; killing it"
            );
            self.kill_and_reap();
        }
    }
}

/// Where the binary is: `env_bin` (`$SANDBOX_AGENT_BIN`) if set; else
/// `sandbox-agent` next to `current_exe` (also one directory up when that
/// directory is cargo's `deps` or `examples`, so tests and examples find
/// the workspace's binary, and in the other of cargo's `debug` and
/// `release` profile directories beside it); else the first
/// `sandbox-agent` on `path`. Each candidate is looked at once.
///
/// # Errors
/// [`Error::BinaryNotFound`] listing the candidates; a set
/// `$SANDBOX_AGENT_BIN` that is not a file is not skipped (it is an error:
/// the caller asked for that binary).
pub(crate) fn find_binary(
    env_bin: Option<OsString>,
    current_exe: Option<PathBuf>,
    path: Option<OsString>,
) -> Result<PathBuf, Error> {
    if let Some(bin) = env_bin.filter(|bin| !bin.is_empty()) {
        let bin = PathBuf::from(bin);
        return if bin.is_file() {
            Ok(bin)
        } else {
            Err(Error::BinaryNotFound {
                searched: vec![bin],
            })
        };
    }
    let mut searched: Vec<PathBuf> = Vec::new();
    let mut search = |candidate: PathBuf| {
        // A directory named twice (PATH repeats one, or names the
        // program's own) is looked at, and listed, once.
        if !searched.contains(&candidate) {
            searched.push(candidate);
        }
    };
    if let Some(dir) = current_exe.as_deref().and_then(Path::parent) {
        search(dir.join(BINARY_NAME));
        let cargo_subdir = dir
            .file_name()
            .is_some_and(|name| name == OsStr::new("deps") || name == OsStr::new("examples"));
        let profile = if cargo_subdir {
            dir.parent()
        } else {
            Some(dir)
        };
        if let Some(profile) = profile {
            search(profile.join(BINARY_NAME));
            // A debug program finds the workspace's release build, and the
            // other way round: `cargo build --release` is what README has
            // a user run, while the program itself is often a debug build.
            let other = match profile.file_name().and_then(OsStr::to_str) {
                Some("debug") => Some("release"),
                Some("release") => Some("debug"),
                _ => None,
            };
            if let (Some(other), Some(target)) = (other, profile.parent()) {
                search(target.join(other).join(BINARY_NAME));
            }
        }
    }
    if let Some(path) = path {
        for dir in std::env::split_paths(&path) {
            search(dir.join(BINARY_NAME));
        }
    }
    match searched.iter().find(|candidate| is_executable(candidate)) {
        Some(found) => Ok(found.clone()),
        None => Err(Error::BinaryNotFound { searched }),
    }
}

#[cfg(unix)]
fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

#[cfg(not(unix))]
fn is_executable(path: &Path) -> bool {
    path.is_file()
}

/// 24 random bytes from the operating system, hex-encoded.
pub(crate) fn random_token() -> Result<String, Error> {
    let mut bytes = [0_u8; TOKEN_BYTES];
    getrandom::fill(&mut bytes)
        .map_err(|error| Error::Io(std::io::Error::other(format!("no randomness: {error}"))))?;
    Ok(bytes.iter().map(|byte| format!("{byte:02x}")).collect())
}

/// Sends the first stdout line on the returned channel, then drains stdout
/// so the server never blocks on a full pipe. The channel closes without a
/// value when stdout ends first.
fn read_first_line(pipe: impl Read + Send + 'static) -> tokio::sync::oneshot::Receiver<String> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(pipe);
        let mut line = String::new();
        if matches!(reader.read_line(&mut line), Ok(n) if n > 0) {
            let _ = tx.send(line);
        } else {
            return;
        }
        let _ = std::io::copy(&mut reader, &mut std::io::sink());
    });
    rx
}

/// Keeps the last [`STDERR_LINES`] lines of `pipe` in `tail`; the receiver
/// resolves (closed) once the pipe ended.
fn keep_tail(
    pipe: impl Read + Send + 'static,
    tail: Arc<parking_lot::Mutex<VecDeque<String>>>,
) -> tokio::sync::oneshot::Receiver<()> {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        // Dropped when the pipe ends: `rx` resolves.
        let _tx = tx;
        let reader = BufReader::new(pipe);
        for line in reader.split(b'\n') {
            let Ok(line) = line else { break };
            let mut tail = tail.lock();
            if tail.len() == STDERR_LINES {
                tail.pop_front();
            }
            tail.push_back(String::from_utf8_lossy(&line).into_owned());
        }
    });
    rx
}

/// Polls `GET {base_url}/v2/health` until it answers 200; false when
/// `limit` passes first.
pub(crate) async fn wait_healthy(http: &reqwest::Client, base_url: &str, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    let url = format!("{}/v2/health", base_url.trim_end_matches('/'));
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return false;
        }
        let answer = http.get(&url).timeout(remaining).send().await;
        if answer.is_ok_and(|response| response.status().is_success()) {
            return true;
        }
        tokio::time::sleep(POLL.min(deadline.saturating_duration_since(Instant::now()))).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch directory under the system temp dir, removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Scratch {
            let dir = std::env::temp_dir()
                .join(format!("sandbox-agent-sdk-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("scratch dir: {e}"));
            Scratch(dir)
        }

        fn executable(&self, relative: &str) -> PathBuf {
            let path = self.0.join(relative);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).unwrap_or_else(|e| panic!("mkdir: {e}"));
            }
            std::fs::write(&path, "#!/bin/sh\n").unwrap_or_else(|e| panic!("write: {e}"));
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
                    .unwrap_or_else(|e| panic!("chmod: {e}"));
            }
            path
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn the_environment_variable_wins_and_must_exist() {
        let scratch = Scratch::new("env");
        let bin = scratch.executable("custom/sandbox-agent");
        let exe = scratch.executable("target/debug/sandbox-agent");
        let found = find_binary(Some(bin.clone().into()), Some(exe), None);
        assert_eq!(found.ok(), Some(bin));
        let missing = find_binary(Some(scratch.0.join("nope").into()), None, None);
        assert!(matches!(missing, Err(Error::BinaryNotFound { searched }) if searched.len() == 1));
    }

    #[test]
    fn next_to_the_executable_then_above_cargo_deps_then_path() {
        let scratch = Scratch::new("lookup");
        let beside = scratch.executable("target/debug/sandbox-agent");
        let test_exe = scratch.0.join("target/debug/deps/my_test-123");
        assert_eq!(
            find_binary(None, Some(test_exe), None).ok(),
            Some(beside.clone())
        );
        let app = scratch.0.join("target/debug/app");
        assert_eq!(find_binary(None, Some(app), None).ok(), Some(beside));

        let on_path = scratch.executable("bin/sandbox-agent");
        let path = std::env::join_paths([scratch.0.join("empty"), scratch.0.join("bin")])
            .unwrap_or_default();
        let elsewhere = scratch.0.join("elsewhere/app");
        assert_eq!(
            find_binary(None, Some(elsewhere.clone()), Some(path)).ok(),
            Some(on_path)
        );
        let error = find_binary(None, Some(elsewhere), None);
        assert!(matches!(error, Err(Error::BinaryNotFound { searched }) if !searched.is_empty()));
    }

    #[test]
    fn a_debug_program_finds_the_release_build_and_no_directory_is_listed_twice() {
        let scratch = Scratch::new("other-profile");
        let release = scratch.executable("target/release/sandbox-agent");
        for exe in [
            "target/debug/app",
            "target/debug/deps/app-1234",
            "target/debug/examples/stream_prompt",
        ] {
            assert_eq!(
                find_binary(None, Some(scratch.0.join(exe)), None).ok(),
                Some(release.clone()),
                "{exe}"
            );
        }
        let bin = scratch.0.join("bin");
        let path = std::env::join_paths([bin.clone(), bin.clone(), scratch.0.join("target/x")])
            .expect("PATH");
        let error = find_binary(None, Some(scratch.0.join("target/x/app")), Some(path));
        let Err(Error::BinaryNotFound { searched }) = error else {
            panic!("{error:?}");
        };
        assert_eq!(
            searched,
            [
                scratch.0.join("target/x/sandbox-agent"),
                scratch.0.join("bin/sandbox-agent")
            ]
        );
    }

    #[test]
    fn tokens_are_48_hex_characters_and_differ() -> Result<(), Error> {
        let a = random_token()?;
        let b = random_token()?;
        assert_eq!(a.len(), 2 * TOKEN_BYTES);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
        Ok(())
    }
}
