//! Argument groups that more than one command takes, declared once and
//! flattened into each (`#[command(flatten)]`): the agent catalog
//! (`server`, `agents`) and the running server a client command talks to
//! (`fs`, `sessions`, `exec`, `ps`), with the SDK client they talk through.

use acp_runtime::config::default_data_dir;
use acp_runtime::install::{AgentSpec, catalog};
use acp_runtime::protocol::PROBLEM_TYPE_PREFIX;
use clap::Args;
use sandbox_agent_sdk::{ClientOptions, HttpFailure, SandboxAgentClient};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// The environment variable that names the server when `--url` does not
/// (`fs` and `prompt` through clap, `sessions` by hand).
pub const URL_ENV: &str = "SANDBOX_AGENT_URL";

/// Where agents come from and where they are installed; shared by `server`
/// and `agents`.
#[derive(Debug, Clone, Args)]
pub struct CatalogArgs {
    /// Data dir: installed agents (agents/<id>/<version>) and agent homes
    /// (homes/<id>). Default: $XDG_DATA_HOME/sandbox-agent or
    /// ~/.local/share/sandbox-agent.
    #[arg(
        long,
        env = "SANDBOX_AGENT_DATA_DIR",
        value_name = "DIR",
        global = true
    )]
    pub data_dir: Option<PathBuf>,
    /// A manifest of more agents (the ACP registry's format); its entries
    /// replace built-in ones with the same id.
    #[arg(
        long,
        env = "SANDBOX_AGENT_AGENTS_FILE",
        value_name = "FILE",
        global = true
    )]
    pub agents_file: Option<PathBuf>,
    /// Add or override an agent: NAME=COMMAND [ARGS...] (shell-word split). Repeatable.
    #[arg(long = "agent-command", value_name = "NAME=CMD", global = true)]
    pub agent_commands: Vec<String>,
}

impl CatalogArgs {
    /// The known agents (built-ins, the agents file, `--agent-command`).
    ///
    /// # Errors
    /// A message naming the file and entry, or the bad `--agent-command`; no
    /// data dir (see [`CatalogArgs::data_dir`]).
    pub fn agents(&self) -> Result<BTreeMap<String, AgentSpec>, String> {
        catalog::load(
            &self.data_dir()?,
            self.agents_file.as_deref(),
            &self.agent_commands,
        )
    }

    /// `--data-dir`, else the XDG default.
    ///
    /// # Errors
    /// When neither is available (no `HOME`, no `XDG_DATA_HOME`).
    pub fn data_dir(&self) -> Result<PathBuf, String> {
        self.data_dir
            .clone()
            .or_else(default_data_dir)
            .ok_or_else(|| {
                "no data dir: set --data-dir (or SANDBOX_AGENT_DATA_DIR), XDG_DATA_HOME or HOME"
                    .to_owned()
            })
    }
}

/// The running server a client command talks to. Global, so they may also
/// follow the subcommand (`fs ls --url …`). A command adds what its `--url`
/// does besides (`mut_arg`): `fs` reads [`URL_ENV`] through clap,
/// `sessions` has its own help and a default.
#[derive(Debug, Clone, Args)]
pub struct RemoteArgs {
    /// The server (http://host:port).
    #[arg(long, global = true, value_name = "URL")]
    pub url: Option<String>,
    /// Its bearer token.
    #[arg(
        long,
        global = true,
        env = "SANDBOX_AGENT_TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
}

/// The agent the client commands' SDK clients are bound to. None of their
/// calls sends it (the control plane, the process API and the file system
/// are not per agent), but an SDK client is bound to one.
const UNUSED_AGENT: &str = "mock";

/// An SDK client of the server at `url`, with `token`, without a
/// connection to an agent (the client commands need none); each request
/// bounded by `timeout` (`None`: no limit).
///
/// # Errors
/// The SDK's refusal of the URL or the token, in its words.
pub async fn client(
    url: &str,
    token: Option<&str>,
    timeout: Option<Duration>,
) -> Result<SandboxAgentClient, String> {
    let mut options = ClientOptions::new(UNUSED_AGENT)
        .base_url(url)
        .auto_connect(false);
    if let Some(token) = token {
        options = options.token(token);
    }
    if let Some(timeout) = timeout {
        options = options.request_timeout(timeout);
    }
    SandboxAgentClient::connect(options)
        .await
        .map_err(|e| e.to_string())
}

/// A running server, for `exec` and `ps`: the SDK's client of it, and its
/// base URL and token for what the SDK does not speak (the terminal
/// WebSocket of `exec -t`).
#[derive(Debug, Clone)]
pub struct Remote {
    /// Every request but the terminal WebSocket; no request timeout.
    pub client: SandboxAgentClient,
    /// `http://host:port`, without a trailing slash.
    pub base: String,
    /// The bearer token, when the server has one.
    pub token: Option<String>,
}

/// A failed request: the problem type's last part (`program-not-found`;
/// empty when the server sent no problem document) and a message for the
/// user.
#[derive(Debug, Clone)]
pub struct Failure {
    /// The problem type without its prefix.
    pub kind: String,
    /// The server's `detail`, or what went wrong on the way.
    pub message: String,
}

impl From<sandbox_agent_sdk::Error> for Failure {
    /// The server's answer as [`Failure::of_http`] words it; a request
    /// that failed on the way in reqwest's words (as `exec` and `ps` said
    /// it before they used the SDK); anything else in the SDK's.
    fn from(error: sandbox_agent_sdk::Error) -> Self {
        if let sandbox_agent_sdk::Error::Http(failure) = &error {
            return Self::of_http(failure);
        }
        Self {
            kind: String::new(),
            message: reqwest_error(&error).map_or_else(|| error.to_string(), ToString::to_string),
        }
    }
}

/// The reqwest error behind an SDK error (a request that could not be
/// sent, a body cut off, a timeout), if there is one.
pub fn reqwest_error(error: &sandbox_agent_sdk::Error) -> Option<&reqwest::Error> {
    if let sandbox_agent_sdk::Error::Request(error) = error {
        return Some(error);
    }
    let mut cause = std::error::Error::source(error);
    while let Some(error) = cause {
        if let Some(error) = error.downcast_ref::<reqwest::Error>() {
            return Some(error);
        }
        cause = error.source();
    }
    None
}

impl RemoteArgs {
    /// The server `--url` names, with `--token`.
    ///
    /// # Errors
    /// No `--url` (nor `$SANDBOX_AGENT_URL`), or one that is not an http(s) URL.
    pub async fn remote(&self) -> Result<Remote, String> {
        let url = self
            .url
            .as_deref()
            .ok_or("--url is required (the server to talk to, e.g. http://127.0.0.1:2468)")?;
        let parsed = reqwest::Url::parse(url).map_err(|e| format!("--url {url}: {e}"))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(format!("--url {url}: an http:// or https:// URL"));
        }
        Ok(Remote {
            client: client(url, self.token.as_deref(), None).await?,
            base: url.trim_end_matches('/').to_owned(),
            token: self.token.clone(),
        })
    }
}

impl Failure {
    /// The failure a non-2xx answer describes: the kind from its problem
    /// document's (RFC 9457) type, the message its `detail` with the
    /// status (`unknown process (404 Not Found)`), else the status alone.
    pub fn of_http(failure: &HttpFailure) -> Self {
        let status = failure.status;
        let problem = failure.problem.as_deref();
        let kind = problem
            .and_then(|problem| problem.problem_type.strip_prefix(PROBLEM_TYPE_PREFIX))
            .unwrap_or("")
            .to_owned();
        let message = match problem.and_then(|problem| problem.detail.as_deref()) {
            Some(detail) => format!("{detail} ({status})"),
            None => format!("the server answered {status}"),
        };
        Self { kind, message }
    }
}
