//! Running agents: their processes, one per agent id, shared by every
//! connection bound to it (research/contract.md, "Routing: connections,
//! sessions, one agent process"). Which agents exist and installing them is
//! [`crate::install`].
//!
//! - [`supervisor`]: [`Agents`], one slot per agent id: starts, restarts,
//!   lazy installs, state for `GET /v2/agents`, shutdown.
//!
//! A running agent (its tree supervisor, user and orphan records are the
//! operating system's, [`crate::os`]; its questions are
//! [`crate::elicitation`]):
//! - `agent_process`: spawning in its own process group, the process's identity,
//!   recording how it ended.
//! - `exit`: how an agent process ended (exit code or signal).
//! - `secrets`: the server's secret environment values, masked in what
//!   leaves of an agent's stderr.
//! - `stdio`: the stdin writer and the stderr capture (the stdout loop,
//!   lines in order to the router and then the reaping, is the process's
//!   own: `agent_process::read_stdout`).
//! - [`framing`]: stdout line framing with a maximum line length.
//! - `router`: the routing table: id rewriting, pending requests both ways,
//!   held messages, delivery to sessions and connections.
//! - `error_data`: what an agent's error answer gets added (its stderr
//!   since the request, masked and bounded; the root hint).
//! - [`client_side`]: the agent's `fs/*` and `terminal/*` requests answered
//!   in the sandbox, and the client capabilities declared for them.

pub(crate) mod agent_process;
pub mod client_side;
pub(crate) mod error_data;
pub(crate) mod exit;
pub mod framing;
pub(crate) mod router;
pub(crate) mod secrets;
pub(crate) mod stdio;
pub mod supervisor;

pub use supervisor::{Agents, StartError};
