//! Starting and stopping the real `sandbox-agent server`.
//!
//! The server is started as `sandbox-agent server --host 127.0.0.1 --port 0`
//! and announces its address with exactly one stdout line,
//! `sandbox-agent listening on http://HOST:PORT` (contract.md, "Server
//! start-up"). It is deliberately *not* put in a process group of its own:
//! the tests check that the server itself stops its agent processes. The
//! drop guard still makes sure nothing outlives a failing test.

use std::io::{BufRead, BufReader, Read};
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::api::Api;
use crate::procfs::{self, ProcessRef};
use crate::{SHUTDOWN_GRACE, STARTUP_TIMEOUT};

/// Prefix of the start-up line (contract.md, "Server start-up").
pub const LISTENING_PREFIX: &str = "sandbox-agent listening on ";

/// Path of the `sandbox-agent` binary under test, whether or not it exists:
/// `$SANDBOX_AGENT_BIN` if set, else `<target dir>/debug/sandbox-agent`, where
/// the target dir is `$CARGO_TARGET_DIR` (relative paths taken from the
/// workspace root) or `<workspace root>/target`.
pub fn binary_path() -> PathBuf {
    if let Some(bin) = std::env::var_os("SANDBOX_AGENT_BIN") {
        return PathBuf::from(bin);
    }
    let root = workspace_root();
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => root.join(dir),
        None => root.join("target"),
    };
    target.join("debug").join("sandbox-agent")
}

/// The workspace root: two levels above this crate's manifest.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("..")
}

/// [`binary_path`], checked to exist.
///
/// # Panics
/// If the binary is missing, with the command that builds it.
pub fn sandbox_agent_bin() -> PathBuf {
    let bin = binary_path();
    assert!(
        bin.is_file(),
        "sandbox-agent binary not found at {}: build it first: cargo build --workspace",
        bin.display()
    );
    bin
}

/// A `Command` for the binary with a clean environment for this product:
/// every inherited `SANDBOX_AGENT_*` variable is removed (a developer's own
/// token or timeouts must not change what the tests see), except
/// `SANDBOX_AGENT_BIN` which only the harness reads.
///
/// `XDG_DATA_HOME` is [`no_default_data_dir`]: a test must give every
/// command a data dir of its own (`SANDBOX_AGENT_DATA_DIR` or
/// `--data-dir`); one that forgets fails at once instead of writing into
/// the developer's `~/.local/share/sandbox-agent`.
pub fn sandbox_agent_command() -> Command {
    command_for(&sandbox_agent_bin())
}

/// [`sandbox_agent_command`] for another build of the binary at `bin`
/// (the release binary of [`crate::dist`]).
pub fn command_for(bin: &Path) -> Command {
    let mut command = Command::new(bin);
    for (key, _) in std::env::vars_os() {
        if let Some(key) = key.to_str()
            && key.starts_with("SANDBOX_AGENT_")
            && key != "SANDBOX_AGENT_BIN"
        {
            command.env_remove(key);
        }
    }
    command.env("XDG_DATA_HOME", no_default_data_dir());
    command
}

/// What the binary's default data dir resolves to in the tests: an
/// `XDG_DATA_HOME` whose `sandbox-agent` is a regular file, not a folder,
/// so nothing can be created or read under it. A command run without a
/// data dir of its own stops at its first use of the data dir, with an
/// error naming `…/v2-api-tests-gave-no-data-dir/sandbox-agent/…: Not a
/// directory`. Other programs that use `XDG_DATA_HOME` (the agents) still
/// can: only the `sandbox-agent` entry is taken.
///
/// # Panics
/// If the folder or the file cannot be made.
pub fn no_default_data_dir() -> PathBuf {
    let base = std::env::temp_dir().join("v2-api-tests-gave-no-data-dir");
    let blocker = base.join("sandbox-agent");
    if !blocker.is_file() {
        std::fs::create_dir_all(&base).expect("create the no-default-data-dir folder");
        // Written beside, then renamed: test binaries run at once.
        let temporary = base.join(format!(".sandbox-agent.{}", std::process::id()));
        std::fs::write(
            &temporary,
            "A test ran sandbox-agent without a data dir of its own: give it \
             SANDBOX_AGENT_DATA_DIR or --data-dir (a temporary folder).\n",
        )
        .expect("write the no-default-data-dir file");
        std::fs::rename(&temporary, &blocker).expect("place the no-default-data-dir file");
    }
    base
}

/// Runs `sandbox-agent server --no-token` (unless `args` give `--token`) on
/// a free loopback port with `args` until it exits (a start-up error): its exit status and stderr.
/// `None` when it still runs after `within` (it started; it is killed).
pub async fn start_up_outcome(args: &[&str], within: Duration) -> Option<(ExitStatus, String)> {
    // A data dir of its own, unless `args` name one (`--data-dir` wins).
    let data_dir = crate::agents::TempDir::new("start-up");
    let mut command = sandbox_agent_command();
    command.env("SANDBOX_AGENT_DATA_DIR", data_dir.path());
    command.args(["server", "--host", "127.0.0.1", "--port", "0"]);
    if !args
        .iter()
        .any(|a| *a == "--token" || a.starts_with("--token="))
    {
        command.arg("--no-token");
    }
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let child = tokio::process::Command::from(command)
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the server");
    let output = tokio::time::timeout(within, child.wait_with_output())
        .await
        .ok()?
        .expect("its output");
    Some((
        output.status,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    ))
}

/// Quotes `text` for the shell-word splitting of `--agent-command` values.
pub fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "'\\''"))
}

/// An `--agent-command` value that runs the built-in mock agent under the
/// agent id `name`: `NAME='<binary>' mock-agent <extra>`.
pub fn mock_agent_command(name: &str, extra: &str) -> String {
    let bin = sandbox_agent_bin();
    let command = format!(
        "{name}={} mock-agent {extra}",
        shell_quote(&bin.to_string_lossy())
    );
    command.trim_end().to_owned()
}

/// Per-process counter so parallel tests get distinct data directories.
static NEXT_SERVER: AtomicUsize = AtomicUsize::new(0);

/// One running `sandbox-agent server`, stopped when dropped.
///
/// Dereferences to [`Api`], so `server.post(..)`, `server.initialize(..)` and
/// friends work directly; [`TestServer::api`] gives an owned handle for
/// spawned tasks.
pub struct TestServer {
    /// The server process; `None` once it has been reaped.
    child: Option<Child>,
    /// Its pid, kept after reaping for diagnostics.
    pid: u32,
    /// HTTP client bound to this server's address (and token, if any).
    api: Api,
    /// Everything the server wrote to stderr so far (its logs), filled by a
    /// reader thread; printed when a test panics.
    stderr: Arc<Mutex<Vec<u8>>>,
    /// Stdout after the start-up line (the contract says there is none).
    stdout_rest: Arc<Mutex<Vec<u8>>>,
    /// Set by the stdout reader thread once stdout reached EOF.
    stdout_closed: Arc<AtomicBool>,
    /// Every descendant process seen while stopping, killed if it survives.
    seen_descendants: Vec<ProcessRef>,
    /// Private `SANDBOX_AGENT_DATA_DIR`, removed on drop.
    data_dir: PathBuf,
}

impl TestServer {
    /// Starts `sandbox-agent server --host 127.0.0.1 --port 0 <extra_args>`.
    ///
    /// `--no-token` is added unless `extra_args` choose auth themselves
    /// (`--token`, `--token=...`, `--no-token`). Waits up to
    /// [`STARTUP_TIMEOUT`] for the start-up line.
    ///
    /// # Panics
    /// If the binary is missing, the server exits early, or the start-up
    /// line does not come or has the wrong shape (the server's stderr is
    /// included in the message).
    pub async fn start(extra_args: &[&str]) -> TestServer {
        Self::start_with_env(extra_args, &[]).await
    }

    /// Like [`TestServer::start`], with extra environment variables. A
    /// `SANDBOX_AGENT_TOKEN` entry counts as choosing auth (no `--no-token`).
    pub async fn start_with_env(extra_args: &[&str], env: &[(&str, &str)]) -> TestServer {
        Self::start_via(&[], extra_args, env).await
    }

    /// Like [`TestServer::start_with_env`], with the binary started through
    /// `prefix` (a program that then execs it, such as `setpriv --groups
    /// 4,6 --`): the server's pid is the prefix's.
    pub async fn start_via(
        prefix: &[&str],
        extra_args: &[&str],
        env: &[(&str, &str)],
    ) -> TestServer {
        Self::start_from(&sandbox_agent_bin(), prefix, extra_args, env).await
    }

    /// Like [`TestServer::start`], with another build of the binary at
    /// `bin` (the release binary of [`crate::dist`]); its built-in agents
    /// (`mock`) run that binary too.
    pub async fn start_binary(bin: &Path, extra_args: &[&str]) -> TestServer {
        Self::start_from(bin, &[], extra_args, &[]).await
    }

    async fn start_from(
        bin: &Path,
        prefix: &[&str],
        extra_args: &[&str],
        env: &[(&str, &str)],
    ) -> TestServer {
        let env_token = env
            .iter()
            .find(|(key, _)| *key == "SANDBOX_AGENT_TOKEN")
            .map(|(_, value)| (*value).to_owned());
        let arg_token = token_from_args(extra_args);
        let chooses_auth = env_token.is_some()
            || extra_args
                .iter()
                .any(|a| *a == "--token" || a.starts_with("--token=") || *a == "--no-token");

        let data_dir = std::env::temp_dir().join(format!(
            "v2-api-tests-{}-{}",
            std::process::id(),
            NEXT_SERVER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&data_dir).expect("create the server's data dir");

        let mut command = command_for(bin);
        if let Some((program, rest)) = prefix.split_first() {
            let bin = command.get_program().to_owned();
            let mut via = Command::new(program);
            via.args(rest).arg(bin);
            for (key, value) in command.get_envs() {
                match value {
                    Some(value) => via.env(key, value),
                    None => via.env_remove(key),
                };
            }
            command = via;
        }
        command.args(["server", "--host", "127.0.0.1", "--port", "0"]);
        if !chooses_auth {
            command.arg("--no-token");
        }
        command
            .args(extra_args)
            .env("SANDBOX_AGENT_DATA_DIR", &data_dir)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("spawn sandbox-agent server");
        let pid = child.id();

        let stderr = Arc::new(Mutex::new(Vec::new()));
        let stdout_rest = Arc::new(Mutex::new(Vec::new()));
        let stderr_pipe = child.stderr.take().expect("stderr is piped");
        let stdout_pipe = child.stdout.take().expect("stdout is piped");
        spawn_stderr_reader(stderr_pipe, Arc::clone(&stderr));
        let stdout_closed = Arc::new(AtomicBool::new(false));
        let first_line = spawn_stdout_reader(
            stdout_pipe,
            Arc::clone(&stdout_rest),
            Arc::clone(&stdout_closed),
        );

        let line = tokio::task::spawn_blocking(move || first_line.recv_timeout(STARTUP_TIMEOUT))
            .await
            .expect("start-up line waiter");
        let mut server = TestServer {
            child: Some(child),
            pid,
            api: Api::new(String::new(), arg_token.or(env_token)),
            stderr,
            stdout_rest,
            stdout_closed,
            seen_descendants: Vec::new(),
            data_dir,
        };
        let line = match line {
            Ok(line) => line,
            Err(error) => {
                let exited = server
                    .child
                    .as_mut()
                    .and_then(|c| c.try_wait().ok().flatten());
                panic!(
                    "sandbox-agent server did not print its start-up line within {STARTUP_TIMEOUT:?} \
                     ({error:?}; exit status: {exited:?})\n--- stderr ---\n{}",
                    server.stderr_text()
                );
            }
        };
        let url = line
            .trim_end_matches(['\r', '\n'])
            .strip_prefix(LISTENING_PREFIX);
        let Some(url) = url.filter(|u| u.starts_with("http://127.0.0.1:")) else {
            panic!(
                "unexpected start-up line {line:?}; want `{LISTENING_PREFIX}http://127.0.0.1:PORT`\n\
                 --- stderr ---\n{}",
                server.stderr_text()
            );
        };
        let port = url.trim_start_matches("http://127.0.0.1:");
        assert!(
            port.parse::<u16>().is_ok_and(|p| p != 0),
            "start-up line names no real port: {line:?}"
        );
        server.api.set_base_url(url.to_owned());
        server
    }

    /// An owned HTTP handle to this server (for `tokio::spawn`ed tasks).
    pub fn api(&self) -> Api {
        self.api.clone()
    }

    /// The server's private data dir (`SANDBOX_AGENT_DATA_DIR`; a
    /// `--data-dir` argument overrides it).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The server's stderr (its logs) so far, lossily decoded.
    pub fn stderr_text(&self) -> String {
        let bytes = self.stderr.lock().map(|b| b.clone()).unwrap_or_default();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The server's stderr once `ready(log)` holds, waiting up to `timeout`
    /// (a reader thread copies the pipe, so a line written just before an
    /// HTTP answer may arrive a moment after it). Returns the log either way.
    pub async fn log_when(&self, ready: impl Fn(&str) -> bool, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let log = self.stderr_text();
            if ready(&log) || Instant::now() >= deadline {
                return log;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Everything the server wrote to stdout after the start-up line, once
    /// stdout is closed (normally: the server exited). `None` if stdout is
    /// still open after `timeout`.
    pub async fn stdout_after_start_line(&self, timeout: Duration) -> Option<String> {
        let deadline = Instant::now() + timeout;
        // The reader thread has no async signal; poll its flag.
        while !self.stdout_closed.load(Ordering::Acquire) {
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let bytes = self
            .stdout_rest
            .lock()
            .map(|b| b.clone())
            .unwrap_or_default();
        Some(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Current descendants of the server process (agents and their children).
    pub fn descendants(&self) -> Vec<ProcessRef> {
        procfs::descendants(self.pid)
    }

    /// Descendants whose command line contains `mock-agent`: the built-in
    /// mock agent's processes (not the tree supervisors they run under,
    /// whose command lines name the agent too).
    pub fn mock_agent_processes(&self) -> Vec<ProcessRef> {
        self.descendants()
            .into_iter()
            .filter(|p| {
                let command = procfs::cmdline(p.pid);
                command.contains("mock-agent") && !command.contains(" supervise ")
            })
            .collect()
    }

    /// Sends SIGTERM to the server (only the server, not its children).
    pub fn send_sigterm(&mut self) {
        self.remember_descendants();
        if let Ok(raw) = i32::try_from(self.pid) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(raw), Signal::SIGTERM);
        }
    }

    /// Kills the server with SIGKILL (only the server, not its children: a
    /// crash, the OOM killer, `kill -9`) and reaps it, waiting up to
    /// `timeout`. What it leaves behind is still killed on drop.
    pub async fn kill_now(&mut self, timeout: Duration) -> Option<ExitStatus> {
        self.remember_descendants();
        if let Ok(raw) = i32::try_from(self.pid) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(raw), Signal::SIGKILL);
        }
        self.wait_exit(timeout).await
    }

    /// Waits up to `timeout` for the server to exit and reaps it. Returns
    /// `None` on timeout (the server keeps running; drop will kill it).
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            // No exit notification exists for a std child; poll its state.
            self.remember_descendants();
            let child = self.child.as_mut()?;
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Records the current descendants so drop can kill survivors even after
    /// the server is gone (orphans are reparented and no longer found).
    fn remember_descendants(&mut self) {
        for process in procfs::descendants(self.pid) {
            if !self.seen_descendants.contains(&process) {
                self.seen_descendants.push(process);
            }
        }
    }
}

impl Deref for TestServer {
    type Target = Api;

    fn deref(&self) -> &Api {
        &self.api
    }
}

impl Drop for TestServer {
    /// SIGTERM, up to [`SHUTDOWN_GRACE`] to exit, then SIGKILL and reap; then
    /// SIGKILL every descendant ever seen that still runs. Prints the
    /// server's stderr if the test is failing.
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            self.remember_descendants();
            if matches!(child.try_wait(), Ok(None)) {
                if let Ok(raw) = i32::try_from(self.pid) {
                    let _ =
                        nix::sys::signal::kill(nix::unistd::Pid::from_raw(raw), Signal::SIGTERM);
                }
                let deadline = Instant::now() + SHUTDOWN_GRACE;
                while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                    self.remember_descendants();
                    std::thread::sleep(Duration::from_millis(20));
                }
                if matches!(child.try_wait(), Ok(None)) {
                    self.remember_descendants();
                    let _ = child.kill();
                }
            }
            let _ = child.wait();
        }
        for process in &self.seen_descendants {
            procfs::signal(process, Signal::SIGKILL);
        }
        if std::thread::panicking() {
            eprintln!(
                "--- sandbox-agent server (pid {}) stderr ---\n{}\n--- end of stderr ---",
                self.pid,
                self.stderr_text()
            );
        }
        let _ = std::fs::remove_dir_all(&self.data_dir);
    }
}

/// The value of `--token T` / `--token=T` in `args`, if any.
fn token_from_args(args: &[&str]) -> Option<String> {
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        if *arg == "--token" {
            return iter.next().map(|t| (*t).to_owned());
        }
        if let Some(token) = arg.strip_prefix("--token=") {
            return Some(token.to_owned());
        }
    }
    None
}

/// Drains the server's stderr into `sink` until EOF.
fn spawn_stderr_reader(mut pipe: impl Read + Send + 'static, sink: Arc<Mutex<Vec<u8>>>) {
    std::thread::spawn(move || {
        let mut buf = [0_u8; 8192];
        while let Ok(n) = pipe.read(&mut buf) {
            if n == 0 {
                break;
            }
            if let Ok(mut sink) = sink.lock() {
                sink.extend_from_slice(&buf[..n]);
            }
        }
    });
}

/// Sends the first stdout line on the returned channel, then drains the rest
/// into `rest` so the server never blocks on a full pipe.
fn spawn_stdout_reader(
    pipe: impl Read + Send + 'static,
    rest: Arc<Mutex<Vec<u8>>>,
    closed: Arc<AtomicBool>,
) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(pipe);
        let mut first = String::new();
        match reader.read_line(&mut first) {
            Ok(n) if n > 0 => {
                let _ = tx.send(first);
            }
            _ => {
                closed.store(true, Ordering::Release);
                return;
            }
        }
        drop(tx);
        let mut buf = [0_u8; 8192];
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            if let Ok(mut rest) = rest.lock() {
                rest.extend_from_slice(&buf[..n]);
            }
        }
        closed.store(true, Ordering::Release);
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_quoting_survives_single_quotes() {
        assert_eq!(shell_quote("/a b/c"), "'/a b/c'");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
    }

    #[test]
    fn token_is_read_from_either_form() {
        assert_eq!(token_from_args(&["--token", "t1"]), Some("t1".to_owned()));
        assert_eq!(
            token_from_args(&["--x", "--token=t2"]),
            Some("t2".to_owned())
        );
        assert_eq!(token_from_args(&["--no-token"]), None);
    }
}
