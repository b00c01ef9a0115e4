//! Argument groups that more than one command takes, declared once and
//! flattened into each (`#[command(flatten)]`): the agent catalog
//! (`server`, `agents`) and the running server a client command talks to
//! (`fs`, `sessions`).

use acp_runtime::config::default_data_dir;
use acp_runtime::install::{AgentSpec, catalog};
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
