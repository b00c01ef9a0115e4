//! sandbox-agent runtime: ACP agents over HTTP.
//!
//! # Layout
//! - [`cli`]: the `sandbox-agent` command line (clap), one subcommand per job.
//! - [`mock_agent`]: the built-in deterministic ACP agent (`sandbox-agent mock-agent`).
pub mod cli;
pub mod mock_agent;
