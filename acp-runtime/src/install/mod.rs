//! Installing agents.

pub mod catalog;
mod installer;
pub mod manifest;

pub use installer::{
    InstallError, InstallOptions, InstallOutcome, Installation, Installer, LogProgress,
    NPM_NETWORK_DEFAULTS, Progress,
};
