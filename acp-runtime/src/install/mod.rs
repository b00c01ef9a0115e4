//! Agent installs: which agents exist and how they get onto this machine
//! (research/contract.md, "Agents: manifest, installs, lazy install"). Public:
//! the `agents` command uses the catalog and the installer without a server.
//! Running the installed agents is [`crate::agent`]'s.
//!
//! - [`manifest`]: the manifest format (the public ACP registry's shape) and
//!   the built-in manifest (`builtin.json`).
//! - [`catalog`]: built-ins + `--agents-file` + `--agent-command`, merged.
//! - `installer`: [`Installer`]: one install at a time per agent, shared by
//!   its callers, in its own task; resolving versions, locks, the failure
//!   back-off.
//! - `npm`: the npm driver: `npm install` into a fresh prefix, `npm view`,
//!   the package's `bin`; under `--agent-user` as that user, through the
//!   tree supervisor.
//! - `reclaim`: the prefix npm filled as the agents' user made the
//!   server's again before it is read.
//! - `download`: release archives: HTTPS download, size cap, SHA-256 check,
//!   unpacking by `crate::archive`.
//! - `layout`: the data dir's `agents/<id>/…` and `homes/<id>/`: receipts,
//!   the active version, staging folders renamed into place.
//! - `progress`: [`Progress`], the lines an install reports as it runs.

pub mod catalog;
mod download;
mod installer;
mod layout;
pub mod manifest;
mod npm;
mod progress;
mod reclaim;

pub use catalog::{AgentSpec, Launch};
pub use installer::{
    DEFAULT_INSTALL_RETRY_BACKOFF_MS, InstallError, InstallOptions, InstallOutcome, Installer,
};
pub use layout::Installation;
pub use npm::NPM_NETWORK_DEFAULTS;
pub use progress::{LogProgress, Progress};
