//! Agents: which exist, installing them, and their processes (one per agent
//! id, shared by every connection bound to it; research/contract.md,
//! "Routing: connections, sessions, one agent process" and "Agents:
//! manifest, installs, lazy install").
//!
//! Which agents exist and how they are installed (public: the `agents`
//! command uses them without a server):
//! - [`manifest`]: the manifest format (the public ACP registry's shape) and
//!   the built-in manifest.
//! - [`catalog`]: built-ins + `--agents-file` + `--agent-command`, merged.
//! - [`install`]: installs into the data dir (npm, release archives), locks.
//! - [`archive`]: safe unpacking of tar.gz / zip downloads.
//! - [`supervisor`]: [`Agents`], one slot per agent id: starts, restarts,
//!   lazy installs, state for `GET /v2/agents`, shutdown.
//!
//! A running agent:
//! - `process`: spawning in its own process group, the process's identity
//!   and exit, signals.
//! - `orphans`: no agent tree outlives the server: the group's keeper, the
//!   group records in the data dir and the start-up reaping of leftovers.
//! - [`tree`]: the tree supervisor the server re-runs its binary as, one per
//!   agent process: a child subreaper that kills every descendant, `setsid`
//!   ones included, on a stop, when the agent exits or when the server dies.
//! - `stdio`: the stdin writer, the stdout loop (lines in order to the
//!   router, then reaping) and the stderr capture.
//! - [`framing`]: stdout line framing with a maximum line length.
//! - `router`: the routing table: id rewriting, pending requests both ways,
//!   held messages, delivery to sessions and connections.

pub(crate) mod exit;
pub mod framing;
pub(crate) mod orphans;
pub(crate) mod process;
pub(crate) mod router;
pub(crate) mod stdio;
pub mod supervisor;
pub mod tree;

pub use supervisor::{Agents, StartError};
