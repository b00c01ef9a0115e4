//! The mock agent's command line: knobs that make it misbehave from the start.

use clap::Args;
use std::path::PathBuf;

/// Knobs of `sandbox-agent mock-agent` that make it misbehave from the start.
#[derive(Debug, Clone, Args)]
pub struct MockAgentArgs {
    /// Exit with this code before reading anything (an agent that dies at once).
    #[arg(long, value_name = "CODE")]
    pub exit_at_start: Option<i32>,
    /// Announce each new session with a `session/update` before answering `session/new`.
    #[arg(long)]
    pub announce_session_early: bool,
    /// Session ids are this text followed by a UUID. ACP session ids are
    /// arbitrary strings; this makes ones with `/`, spaces or non-ASCII text.
    #[arg(long, value_name = "TEXT", default_value = "mock-")]
    pub session_id_prefix: String,
    /// Answer every `session/new` with this session id (an agent whose ids
    /// collide with another agent's; a later session replaces an earlier one).
    #[arg(long, value_name = "ID", conflicts_with = "session_id_prefix")]
    pub session_id: Option<String>,
    /// Advertise the auth method METHOD and answer session requests with
    /// `-32000` "Authentication required" until `authenticate {methodId:
    /// METHOD}` came (an agent that needs a credential).
    #[arg(long, value_name = "METHOD")]
    pub require_auth: Option<String>,
    /// Keep every session (id, cwd, mode, model, the history `session/load`
    /// replays) in DIR, one JSON file per session, so a later process can
    /// load a session of an earlier one. Created when missing.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
}
