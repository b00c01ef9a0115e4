//! Running agents: their processes, one per agent id, shared by every
//! connection bound to it (research/contract.md, "Routing: connections,
//! sessions, one agent process"). Which agents exist and installing them is
//! [`crate::install`].
//!
//! - [`supervisor`]: [`Agents`], one slot per agent id: starts, restarts,
//!   lazy installs, state for `GET /v2/agents`, shutdown.
//!
//! A running agent:
//! - `process`: spawning in its own process group, the process's identity,
//!   recording how it ended.
//! - `exit`: how an agent process ended (exit code or signal).
//! - `orphans`: no agent tree outlives the server: the group's keeper, the
//!   group records in the data dir and the start-up reaping of leftovers.
//! - [`tree`]: the tree supervisor the server re-runs its binary as, one per
//!   agent process: a child subreaper that kills every descendant, `setsid`
//!   ones included, on a stop, when the agent exits or when the server dies.
//! - `secrets`: the server's secret environment values, masked in what
//!   leaves of an agent's stderr.
//! - `stdio`: the stdin writer and the stderr capture (the stdout loop,
//!   lines in order to the router and then the reaping, is the process's
//!   own: `process::read_stdout`).
//! - [`framing`]: stdout line framing with a maximum line length.
//! - `router`: the routing table: id rewriting, pending requests both ways,
//!   held messages, delivery to sessions and connections.
//! - `error_data`: what an agent's error answer gets added (its stderr
//!   since the request, masked and bounded; the root hint).
//! - [`user`]: the unprivileged user agents and processes run as when the
//!   server runs as root (`--agent-user`).
//! - [`elicitation`]: agent questions (ACP elicitation) as routing reads
//!   them, and the modes the runtime declares for them.
//! - [`client_side`]: the agent's `fs/*` and `terminal/*` requests answered
//!   in the sandbox, and the client capabilities declared for them.

pub mod client_side;
pub mod elicitation;
pub(crate) mod error_data;
pub(crate) mod exit;
pub mod framing;
pub(crate) mod orphans;
pub(crate) mod process;
pub(crate) mod router;
pub(crate) mod secrets;
pub(crate) mod stdio;
pub mod supervisor;
pub mod tree;
pub mod user;

pub use supervisor::{Agents, StartError};
