//! The operating system under the runtime: process groups, the tree
//! supervisor, the agents' user, and the records of agent trees a dead
//! server left (research/contract.md, "Agent process trees and a server
//! that dies", "Agents under an unprivileged user"). The bottom layer: it
//! imports nothing of the crate, and `agent`, `process`, `fs` and `install`
//! all stand on it.
//!
//! - [`tree`]: the tree supervisor the server re-runs its binary as, one per
//!   agent process or process-API program: a child subreaper that kills
//!   every descendant, `setsid` ones included, on a stop, when its program
//!   exits or when the server dies; and the `as-user` step.
//! - [`user`]: the unprivileged user agents and processes run as when the
//!   server runs as root (`--agent-user`), and the per-thread file
//!   credentials the file API acts with.
//! - `orphans`: the group records in the data dir, the keeper of each
//!   group, and the start-up reaping of what a dead server left.
//! - `process_group`: signalling a process group (an agent's, npm's).

pub(crate) mod orphans;
pub(crate) mod process_group;
pub mod tree;
pub mod user;
