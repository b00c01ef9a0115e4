//! Argument groups that more than one command takes, declared once and
//! flattened into each (`#[command(flatten)]`): the agent catalog
//! (`server`, `agents`) and the running server a client command talks to
//! (`fs`, `sessions`).

use acp_runtime::config::default_data_dir;
use acp_runtime::install::{AgentSpec, catalog};
use acp_runtime::protocol::PROBLEM_TYPE_PREFIX;
use clap::Args;
use std::collections::BTreeMap;
use std::path::PathBuf;

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

/// A running server's HTTP API, for the client commands that speak plain
/// HTTP (`exec`, `ps`): its base URL and the bearer token on every request.
#[derive(Debug, Clone)]
pub struct Remote {
    /// One connection pool for every request.
    pub http: reqwest::Client,
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

impl From<reqwest::Error> for Failure {
    fn from(error: reqwest::Error) -> Self {
        Self {
            kind: String::new(),
            message: error.to_string(),
        }
    }
}

impl RemoteArgs {
    /// The server `--url` names, with `--token`.
    ///
    /// # Errors
    /// No `--url` (nor `$SANDBOX_AGENT_URL`), or one that is not an http(s) URL.
    pub fn remote(&self) -> Result<Remote, String> {
        let url = self
            .url
            .as_deref()
            .ok_or("--url is required (the server to talk to, e.g. http://127.0.0.1:2468)")?;
        let parsed = reqwest::Url::parse(url).map_err(|e| format!("--url {url}: {e}"))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(format!("--url {url}: an http:// or https:// URL"));
        }
        Ok(Remote {
            http: reqwest::Client::new(),
            base: url.trim_end_matches('/').to_owned(),
            token: self.token.clone(),
        })
    }
}

impl Remote {
    /// A request to `path` (absolute, from `/v2/…`), with the token.
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let builder = self.http.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(token) => builder.bearer_auth(token),
            None => builder,
        }
    }

    /// Sends `builder`: the response when its status is a success.
    ///
    /// # Errors
    /// The server's problem document as a [`Failure`], or the transport's
    /// error.
    pub async fn send(builder: reqwest::RequestBuilder) -> Result<reqwest::Response, Failure> {
        let response = builder.send().await?;
        if response.status().is_success() || response.status().is_informational() {
            return Ok(response);
        }
        let status = response.status();
        let body: serde_json::Value = response.json().await.unwrap_or_default();
        Err(Failure::of_problem(status, &body))
    }
}

impl Failure {
    /// The failure a problem document `body` (RFC 9457) answered with
    /// `status` describes.
    pub fn of_problem(status: http::StatusCode, body: &serde_json::Value) -> Self {
        let kind = body["type"]
            .as_str()
            .and_then(|kind| kind.strip_prefix(PROBLEM_TYPE_PREFIX))
            .unwrap_or("")
            .to_owned();
        let message = match body["detail"].as_str() {
            Some(detail) => format!("{detail} ({status})"),
            None => format!("the server answered {status}"),
        };
        Self { kind, message }
    }
}
