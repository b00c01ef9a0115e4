//! Driving `sandbox-agent bridge` through its stdio, as an editor does.
//!
//! [`BridgeProcess`] starts the real binary with piped stdin, stdout and
//! stderr, writes JSON-RPC lines to it and reads the lines it writes back.
//! Every read has a timeout; the process is killed on drop, and its stderr
//! is printed when a test panics.

use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

use crate::EVENT_TIMEOUT;
use crate::server::sandbox_agent_command;

/// A running `sandbox-agent bridge`, killed when dropped.
pub struct BridgeProcess {
    child: Child,
    /// Its stdin; `None` once closed.
    stdin: Option<ChildStdin>,
    /// Lines it wrote to stdout, in order (filled by a reader task).
    lines: mpsc::UnboundedReceiver<String>,
    /// Everything it wrote to stderr (its logs).
    stderr: Arc<Mutex<Vec<u8>>>,
    /// The task filling `stderr`; done once stderr reached EOF.
    stderr_reader: Option<tokio::task::JoinHandle<()>>,
}

impl BridgeProcess {
    /// Starts `sandbox-agent bridge --url URL --agent AGENT <extra>` with
    /// `env` added to a clean environment (no inherited `SANDBOX_AGENT_*`)
    /// and `RUST_LOG=debug`, so a failing test shows what happened.
    ///
    /// # Panics
    /// If the binary is missing or cannot be started.
    pub fn start(url: &str, agent: &str, extra: &[&str], env: &[(&str, &str)]) -> BridgeProcess {
        let mut command = Command::from(sandbox_agent_command());
        command
            .args(["bridge", "--url", url, "--agent", agent])
            .args(extra)
            .env("RUST_LOG", "debug")
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().expect("spawn sandbox-agent bridge");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut stderr_pipe = child.stderr.take().expect("stderr is piped");

        let (tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&stderr);
        let stderr_reader = tokio::spawn(async move {
            let mut buf = [0_u8; 8192];
            while let Ok(n) = stderr_pipe.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                if let Ok(mut sink) = sink.lock() {
                    sink.extend_from_slice(&buf[..n]);
                }
            }
        });
        BridgeProcess {
            child,
            stdin,
            lines,
            stderr,
            stderr_reader: Some(stderr_reader),
        }
    }

    /// Writes `message` as one line on the bridge's stdin.
    ///
    /// # Panics
    /// If stdin is closed or the write fails.
    pub async fn send(&mut self, message: &Value) {
        self.send_line(&message.to_string()).await;
    }

    /// Writes `line` and a newline on the bridge's stdin.
    ///
    /// # Panics
    /// If stdin is closed or the write fails.
    pub async fn send_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin is still open");
        let mut bytes = line.as_bytes().to_vec();
        bytes.push(b'\n');
        stdin.write_all(&bytes).await.expect("write to the bridge");
        stdin.flush().await.expect("flush the bridge's stdin");
    }

    /// Closes the bridge's stdin (EOF).
    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// The next line the bridge wrote, parsed as JSON, within
    /// [`EVENT_TIMEOUT`].
    ///
    /// # Panics
    /// On timeout, on the end of stdout, or if the line is not JSON.
    pub async fn next(&mut self) -> Value {
        match self.next_line(EVENT_TIMEOUT).await {
            Some(line) => serde_json::from_str(&line).unwrap_or_else(|e| {
                panic!("the bridge wrote a line that is not JSON ({e}): {line:?}")
            }),
            None => panic!(
                "the bridge's stdout ended\n--- bridge stderr ---\n{}",
                self.stderr_text()
            ),
        }
    }

    /// The next raw line within `timeout`; `None` when stdout ended.
    ///
    /// # Panics
    /// On timeout.
    pub async fn next_line(&mut self, timeout: Duration) -> Option<String> {
        match tokio::time::timeout(timeout, self.lines.recv()).await {
            Ok(line) => line,
            Err(_) => panic!(
                "no line from the bridge within {timeout:?}\n--- bridge stderr ---\n{}",
                self.stderr_text()
            ),
        }
    }

    /// Reads lines until the response with `id` (a message with that id and
    /// no `method`); returns it and everything read before it.
    pub async fn until_response(&mut self, id: &Value) -> (Value, Vec<Value>) {
        let mut before = Vec::new();
        loop {
            let message = self.next().await;
            if message.get("id") == Some(id) && message.get("method").is_none() {
                return (message, before);
            }
            before.push(message);
        }
    }

    /// Sends `request` and returns its response (skipping anything else).
    pub async fn call(&mut self, request: &Value) -> Value {
        self.send(request).await;
        self.until_response(&request["id"]).await.0
    }

    /// Sends `signal` to the bridge process.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        if let Some(pid) = self.child.id().and_then(|pid| i32::try_from(pid).ok()) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
        }
    }

    /// Waits up to `timeout` for the bridge to exit, and for the last of
    /// its stderr.
    ///
    /// # Panics
    /// If it is still running after `timeout`.
    pub async fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        match tokio::time::timeout(timeout, self.child.wait()).await {
            Ok(Ok(status)) => {
                if let Some(reader) = self.stderr_reader.take() {
                    let _ = tokio::time::timeout(timeout, reader).await;
                }
                status
            }
            Ok(Err(error)) => panic!("waiting for the bridge failed: {error}"),
            Err(_) => panic!(
                "the bridge did not exit within {timeout:?}\n--- bridge stderr ---\n{}",
                self.stderr_text()
            ),
        }
    }

    /// Everything after the last line read, once stdout ends (within
    /// `timeout`).
    ///
    /// # Panics
    /// If stdout does not end within `timeout`.
    pub async fn rest_of_stdout(&mut self, timeout: Duration) -> Vec<String> {
        let mut rest = Vec::new();
        while let Some(line) = self.next_line(timeout).await {
            rest.push(line);
        }
        rest
    }

    /// The bridge's stderr so far, lossily decoded.
    pub fn stderr_text(&self) -> String {
        let bytes = self.stderr.lock().map(|b| b.clone()).unwrap_or_default();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

impl Drop for BridgeProcess {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        if std::thread::panicking() {
            eprintln!(
                "--- sandbox-agent bridge stderr ---\n{}\n--- end of bridge stderr ---",
                self.stderr_text()
            );
        }
    }
}
