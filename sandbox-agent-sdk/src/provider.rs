//! Sandbox providers: where a runtime (`sandbox-agent server`) runs for a
//! [`SandboxAgent`](crate::SandboxAgent), behind one interface.
//!
//! A provider's [`start`](SandboxProvider::start) goes through the same
//! steps everywhere: create the sandbox from the provider's spec, put the
//! runtime in it (already in the image, or the binary beside the program),
//! start the server with a token generated for this start, learn its base
//! URL, and wait until `GET /v2/health` answers 200 within the start-up
//! timeout. A failure is an [`Error::Sandbox`] naming the step
//! ([`SandboxStep`]) and what the sandbox printed, and leaves nothing
//! running. The token reaches the runtime only through its environment
//! (`SANDBOX_AGENT_TOKEN`, research/contract.md "Auth"), never a command
//! line, a log line or an error.
//!
//! Providers here: [`local()`] (a child process, the embedded server) and,
//! with the `docker` feature, `docker::docker()` (a
//! container through the Docker Engine API). Hosted sandboxes (E2B,
//! Daytona, Modal, …) fit the same two traits.

use crate::embedded::EmbeddedServer;
use crate::error::{Error, SandboxStep};
use crate::options::{DEFAULT_SHUTDOWN_GRACE, EmbeddedSettings, ServerLogs};
use futures::future::BoxFuture;
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

/// Default limit for a sandbox to become healthy (create and start
/// included): 60 s.
pub const DEFAULT_SANDBOX_TIMEOUT: Duration = Duration::from_secs(60);

/// Something that makes sandboxes running the runtime.
///
/// Implement it for another engine: `start` must generate a fresh token
/// (pass it to the runtime in its environment only), return once
/// `GET /v2/health` answers 200, and on any failure remove what it made
/// and return [`Error::Sandbox`] with the step and the sandbox's output.
pub trait SandboxProvider: Send + Sync + std::fmt::Debug {
    /// A short name for errors and logs: `local`, `docker`.
    fn name(&self) -> &'static str;

    /// Creates a sandbox, starts the runtime in it with a new token and
    /// waits until it is healthy.
    ///
    /// # Errors
    /// [`Error::Sandbox`] with step [`SandboxStep::Create`],
    /// [`SandboxStep::Start`] or [`SandboxStep::Health`] (the start-up
    /// timeout passed); nothing it made is left behind.
    fn start(&self) -> BoxFuture<'_, Result<Box<dyn Sandbox>, Error>>;
}

/// One running sandbox of a [`SandboxProvider`].
///
/// Dropping it without [`destroy`](Sandbox::destroy) stops a local
/// process, but leaves a container running: destroy it, or remove a crashed
/// program's leftovers with the provider's `cleanup(fleet)`.
pub trait Sandbox: Send + Sync + std::fmt::Debug {
    /// Its id at the provider: a container id, `local-PID`.
    fn id(&self) -> &str;

    /// The fleet it belongs to (a label on containers); `None` for local
    /// processes.
    fn fleet(&self) -> Option<&str>;

    /// Where the runtime answers, as `http://HOST:PORT` (no trailing slash).
    fn base_url(&self) -> &str;

    /// The bearer token the runtime requires (generated for this start).
    fn token(&self) -> &str;

    /// The working directory sessions get when the caller names none: the
    /// image's `WORKDIR` for containers, the current directory locally.
    fn default_cwd(&self) -> String;

    /// Stops the runtime and removes the sandbox; calling it again does
    /// nothing.
    ///
    /// # Errors
    /// [`Error::Sandbox`] with step [`SandboxStep::Destroy`].
    fn destroy(&mut self) -> BoxFuture<'_, Result<(), Error>>;
}

/// `text` with every occurrence of `token` replaced by `[token]`: what a
/// sandbox printed goes into errors only through this. (The local provider
/// needs none: its server's token never leaves `EmbeddedServer`.)
#[cfg_attr(not(feature = "docker"), allow(dead_code))]
pub(crate) fn redact(text: &str, token: &str) -> String {
    if token.is_empty() {
        text.to_owned()
    } else {
        text.replace(token, "[token]")
    }
}

/// The runtime as a child process of this program (the embedded server of
/// [`SandboxAgentClient`](crate::SandboxAgentClient)): `sandbox-agent
/// server` on a free loopback port, found as
/// [`ClientOptions::binary`](crate::ClientOptions::binary) says, stopped
/// (SIGTERM, then SIGKILL) on destroy, on drop, and when this process dies.
#[derive(Debug, Clone)]
pub struct LocalProvider {
    /// The binary; `None`: looked up.
    binary: Option<PathBuf>,
    /// Extra `sandbox-agent server` arguments.
    args: Vec<OsString>,
    /// Extra environment variables of the server (API keys for agents).
    env: Vec<(OsString, OsString)>,
    /// Start-up limit.
    timeout: Duration,
}

/// A [`LocalProvider`] with the defaults: the binary looked up, no extra
/// arguments or environment, [`DEFAULT_SANDBOX_TIMEOUT`].
pub fn local() -> LocalProvider {
    LocalProvider {
        binary: None,
        args: Vec::new(),
        env: Vec::new(),
        timeout: DEFAULT_SANDBOX_TIMEOUT,
    }
}

impl LocalProvider {
    /// The `sandbox-agent` binary to run (else `SANDBOX_AGENT_BIN`, beside
    /// this program, `PATH`).
    pub fn binary(mut self, path: impl Into<PathBuf>) -> Self {
        self.binary = Some(path.into());
        self
    }

    /// One more `sandbox-agent server` argument.
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// One more environment variable of the server (and so of its agents).
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// How long the server may take to become healthy.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}

impl SandboxProvider for LocalProvider {
    fn name(&self) -> &'static str {
        "local"
    }

    fn start(&self) -> BoxFuture<'_, Result<Box<dyn Sandbox>, Error>> {
        Box::pin(async move {
            let settings = EmbeddedSettings {
                binary: self.binary.clone(),
                startup_timeout: self.timeout,
                shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
                args: self.args.clone(),
                env: self.env.clone(),
                logs: ServerLogs::Capture,
            };
            let http = reqwest::Client::new();
            let failed = |step, message: String, logs: String| Error::Sandbox {
                provider: "local",
                step,
                message,
                logs,
            };
            let server =
                EmbeddedServer::start(&settings, &http)
                    .await
                    .map_err(|error| match error {
                        Error::BinaryNotFound { .. } => {
                            failed(SandboxStep::Create, error.to_string(), String::new())
                        }
                        Error::ServerStart { message, stderr } => {
                            failed(SandboxStep::Start, message, stderr)
                        }
                        Error::StartupTimeout { timeout, stderr } => failed(
                            SandboxStep::Health,
                            format!("GET /v2/health did not answer 200 within {timeout:?}"),
                            stderr,
                        ),
                        other => failed(SandboxStep::Start, other.to_string(), String::new()),
                    })?;
            let sandbox: Box<dyn Sandbox> = Box::new(LocalSandbox {
                id: format!("local-{}", server.pid()),
                base_url: server.base_url().to_owned(),
                token: server.token().to_owned(),
                server: Some(server),
            });
            Ok(sandbox)
        })
    }
}

/// A runtime started by [`LocalProvider`].
#[derive(Debug)]
struct LocalSandbox {
    /// `local-PID`.
    id: String,
    base_url: String,
    token: String,
    /// The process; `None` once destroyed.
    server: Option<EmbeddedServer>,
}

impl Sandbox for LocalSandbox {
    fn id(&self) -> &str {
        &self.id
    }

    fn fleet(&self) -> Option<&str> {
        None
    }

    fn base_url(&self) -> &str {
        &self.base_url
    }

    fn token(&self) -> &str {
        &self.token
    }

    fn default_cwd(&self) -> String {
        std::env::current_dir()
            .map(|dir| dir.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "/".to_owned())
    }

    fn destroy(&mut self) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(async move {
            if let Some(mut server) = self.server.take() {
                server.stop().await;
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redaction_replaces_every_occurrence() {
        assert_eq!(redact("a T b T", "T"), "a [token] b [token]");
        assert_eq!(redact("nothing", ""), "nothing");
    }

    #[test]
    fn errors_name_the_provider_the_step_and_the_output() {
        let error = Error::Sandbox {
            provider: "docker",
            step: SandboxStep::Health,
            message: "no answer".to_owned(),
            logs: "line 1\nline 2\n".to_owned(),
        };
        let text = error.to_string();
        assert!(
            text.starts_with("docker sandbox: health failed: no answer"),
            "{text}"
        );
        assert!(text.ends_with("line 1\nline 2"), "{text}");
    }
}
