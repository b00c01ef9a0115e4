//! The `sandbox-agent` command line.
use clap::{Args, Parser, Subcommand};

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
    /// Run the built-in mock ACP agent on stdin/stdout.
    MockAgent(MockAgentArgs),
}

/// Knobs of `sandbox-agent mock-agent` that make it misbehave from the start.
#[derive(Debug, Clone, Default, Args)]
pub struct MockAgentArgs {
    /// Exit with this code before reading anything (an agent that dies at once).
    #[arg(long, value_name = "CODE")]
    pub exit_at_start: Option<i32>,
    /// Announce each new session with a `session_info_update` before answering `session/new`.
    #[arg(long)]
    pub announce_session_early: bool,
}
