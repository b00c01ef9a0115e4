//! The mock agent's data: its sessions, each with the history
//! `session/load` replays and the prompt turn in progress.

use agent_client_protocol::v1::schema::{SessionConfigValueId, SessionId, SessionModeId};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::SystemTime;
use tokio_util::sync::CancellationToken;

/// The session map, with a counter that orders sessions by creation.
#[derive(Default)]
pub(super) struct Sessions {
    pub(super) by_id: HashMap<SessionId, Session>,
    pub(super) created: u64,
    pub(super) turns_started: u64,
}

/// One session.
pub(super) struct Session {
    /// Creation order, for a stable `session/list`.
    pub(super) created: u64,
    pub(super) cwd: PathBuf,
    pub(super) mode: SessionModeId,
    pub(super) model: SessionConfigValueId,
    /// What `session/load` replays, in order.
    pub(super) history: Vec<Message>,
    pub(super) updated_at: SystemTime,
    /// The prompt turn in progress, if any.
    pub(super) turn: Option<RunningTurn>,
}

/// A message of a session's history (in a state file: `{"from": "user" |
/// "agent", "text": …}`).
#[derive(Clone, Serialize, Deserialize)]
pub(super) struct Message {
    pub(super) from: Speaker,
    pub(super) text: String,
}

#[derive(Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum Speaker {
    User,
    Agent,
}

/// The handle of a running prompt turn.
#[derive(Clone)]
pub(super) struct RunningTurn {
    /// Tells the turn apart from a later one of the same session.
    pub(super) id: u64,
    /// Cancelled by `session/cancel`.
    pub(super) cancel: CancellationToken,
}
