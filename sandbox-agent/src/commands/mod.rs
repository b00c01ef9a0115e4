//! One module per subcommand of `sandbox-agent`. Each exposes `run`, which
//! `main` calls with the parsed arguments; a failure is a message for the
//! user (printed after `sandbox-agent: `, exit status 1).

pub mod agents;
pub mod bench;
pub mod bridge;
pub mod fs;
pub mod mock_agent;
pub mod prompt;
pub mod server;
pub mod sessions;
