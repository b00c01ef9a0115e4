//! The `sandbox-agent` command line: the top-level parser and the
//! subcommand enum. Each command's arguments live in its module under
//! `commands/`.
use crate::commands::agents::AgentsArgs;
use crate::commands::bench::BenchArgs;
use crate::commands::bridge::BridgeArgs;
use crate::commands::exec::ExecArgs;
use crate::commands::fs::FsArgs;
use crate::commands::mock_agent::MockAgentArgs;
use crate::commands::prompt::PromptArgs;
use crate::commands::ps::PsArgs;
use crate::commands::server::ServerArgs;
use crate::commands::sessions::SessionsArgs;
use crate::commands::supervise::{AsUserArgs, SuperviseArgs};
use clap::{Parser, Subcommand};

/// `sandbox-agent`: run ACP agents inside a sandbox and drive them over HTTP.
#[derive(Debug, Parser)]
#[command(name = "sandbox-agent", version, about)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Send one prompt to an agent and stream the reply (starts a server when no --url or $SANDBOX_AGENT_URL).
    Prompt(PromptArgs),
    /// Serve ACP agents over HTTP at /v2/rpc.
    Server(Box<ServerArgs>),
    /// List or install agents (works on the data dir; no server needed).
    Agents(AgentsArgs),
    /// Speak ACP on stdio (for editors) and forward it to a runtime over HTTP.
    Bridge(BridgeArgs),
    /// Files in and out of a running server: ls, stat, get, put, upload, rm, mv, mkdir.
    Fs(FsArgs),
    /// Run a program in the sandbox of a running server, as if here: output, stdin, exit status (-t: on a terminal).
    Exec(ExecArgs),
    /// The processes of a running server: id, pid, state, exit, command.
    Ps(PsArgs),
    /// Sessions and their event logs, from a running server or a session store: list, show, events.
    Sessions(SessionsArgs),
    /// Run the built-in mock ACP agent on stdin/stdout.
    MockAgent(MockAgentArgs),
    /// Measure the runtime against the raw stdio limit of the mock agent.
    Bench(BenchArgs),
    /// The tree supervisor the server starts each agent under (internal).
    #[command(hide = true)]
    Supervise(SuperviseArgs),
    /// What a tree supervisor with a user starts its program through: become the user, then the program (internal).
    #[command(hide = true)]
    AsUser(AsUserArgs),
    /// Print the OpenAPI document of the HTTP API (docs/openapi.json).
    #[command(hide = true)]
    Openapi,
}
