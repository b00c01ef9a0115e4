//! One module per subcommand of `sandbox-agent`. Each declares its own
//! arguments (`…Args`, clap) and exposes `run`, which `main` calls with them
//! parsed; a failure is a message for the user (printed after
//! `sandbox-agent: `, exit status 1). `supervise` runs before any async
//! runtime and returns the exit status itself; `exec` returns the status
//! of the program it ran. [`args`] holds the argument
//! groups several commands flatten.

pub mod agents;
pub mod args;
pub mod bench;
pub mod bridge;
pub mod exec;
pub mod fs;
pub mod mock_agent;
pub mod prompt;
pub mod ps;
pub mod server;
pub mod sessions;
pub mod supervise;
