//! `--state-dir`: each session in a JSON file of its own, so `session/load`
//! in a later process (after a runtime restart) finds it.

use std::borrow::Cow;
use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

use agent_client_protocol::v1::schema::{SessionConfigValueId, SessionId, SessionModeId};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use super::session::{Message, Session};

/// `--state-dir`: one JSON file per session, `<sha256 of the id, hex>.json`
/// (a name safe for any session id), holding a [`SavedSession`]. Each write
/// goes to a temp file first and is renamed over the old one, so a process
/// killed mid-write leaves the previous version whole.
///
/// A save is encoded while the session map is locked ([`Self::encode`])
/// and written once it is released ([`Self::write`]): sessions save side
/// by side, and a session's saves land in the order they were encoded (an
/// older one that comes second is skipped). Under one lock, a file write
/// and rename per turn start and end held every other session's turn.
pub(super) struct StateDir {
    pub(super) dir: PathBuf,
    /// Numbers the encoded saves, in the order of the changes they hold.
    next: AtomicU64,
    /// Per session, the number of the newest save written (its lock is held
    /// while a save of that session is written).
    written: Mutex<HashMap<SessionId, Arc<Mutex<u64>>>>,
}

/// A session's state file contents, numbered ([`StateDir::encode`]).
pub(super) struct Encoded {
    id: SessionId,
    number: u64,
    bytes: Vec<u8>,
}

impl Encoded {
    /// The session it holds.
    pub(super) fn id(&self) -> &SessionId {
        &self.id
    }
}

/// A session as kept in its state file (`Cow`, so saving borrows the
/// session and loading owns what it reads).
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SavedSession<'a> {
    /// The session's id, checked on load.
    session_id: Cow<'a, SessionId>,
    cwd: Cow<'a, Path>,
    mode: Cow<'a, SessionModeId>,
    model: Cow<'a, SessionConfigValueId>,
    /// Milliseconds since the Unix epoch.
    updated_at_ms: u64,
    /// What `session/load` replays, in order.
    history: Cow<'a, [Message]>,
}

impl StateDir {
    /// The state file of session `id`.
    pub(super) fn path(&self, id: &SessionId) -> PathBuf {
        let digest = Sha256::digest(id.0.as_bytes());
        let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
        self.dir.join(format!("{hex}.json"))
    }

    pub(super) fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            next: AtomicU64::new(1),
            written: Mutex::default(),
        }
    }

    /// Encodes session `id` for [`Self::write`]; called with the session
    /// map locked, so numbers follow the order of the changes.
    pub(super) fn encode(&self, id: &SessionId, session: &Session) -> io::Result<Encoded> {
        let saved = SavedSession {
            session_id: Cow::Borrowed(id),
            cwd: Cow::Borrowed(&session.cwd),
            mode: Cow::Borrowed(&session.mode),
            model: Cow::Borrowed(&session.model),
            updated_at_ms: session
                .updated_at
                .duration_since(UNIX_EPOCH)
                .map_or(0, |since| {
                    u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
                }),
            history: Cow::Borrowed(&session.history),
        };
        let bytes = serde_json::to_vec(&saved).map_err(io::Error::other)?;
        Ok(Encoded {
            id: id.clone(),
            number: self.next.fetch_add(1, Ordering::Relaxed),
            bytes,
        })
    }

    /// Writes an encoded save unless a newer one of the session is
    /// already written.
    pub(super) fn write(&self, encoded: Encoded) -> io::Result<()> {
        let Encoded { id, number, bytes } = encoded;
        let newest = Arc::clone(self.written.lock().entry(id.clone()).or_default());
        let mut newest = newest.lock();
        if *newest > number {
            return Ok(());
        }
        let path = self.path(&id);
        let mut temp = path.clone().into_os_string();
        temp.push(format!(".{}.tmp", std::process::id()));
        let temp = PathBuf::from(temp);
        let written = std::fs::write(&temp, bytes).and_then(|()| std::fs::rename(&temp, &path));
        if written.is_err() {
            let _ = std::fs::remove_file(&temp);
        } else {
            *newest = number;
        }
        written
    }

    /// Every saved session as `session/list` shows it: `(id, cwd, last
    /// update)`. A file that cannot be read or is not a state file (a
    /// temp file, another program's) is skipped: the list shows what
    /// `session/load` can load.
    pub(super) fn list(&self) -> Vec<(SessionId, PathBuf, SystemTime)> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        entries
            .filter_map(Result::ok)
            .filter(|entry| entry.path().extension().is_some_and(|e| e == "json"))
            .filter_map(|entry| {
                let bytes = std::fs::read(entry.path()).ok()?;
                let saved: SavedSession<'static> = serde_json::from_slice(&bytes).ok()?;
                // Only a file at its id's own name loads.
                if self.path(&saved.session_id) != entry.path() {
                    return None;
                }
                Some((
                    saved.session_id.into_owned(),
                    saved.cwd.into_owned(),
                    UNIX_EPOCH + Duration::from_millis(saved.updated_at_ms),
                ))
            })
            .collect()
    }

    /// The saved session `id`, or `None` when it has no state file.
    pub(super) fn load(&self, id: &SessionId) -> io::Result<Option<Session>> {
        let bytes = match std::fs::read(self.path(id)) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(error),
        };
        let saved: SavedSession<'static> = serde_json::from_slice(&bytes)
            .map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error))?;
        if saved.session_id.as_ref() != id {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the file holds session {:?}", saved.session_id.0),
            ));
        }
        Ok(Some(Session {
            created: 0,
            cwd: saved.cwd.into_owned(),
            mode: saved.mode.into_owned(),
            model: saved.model.into_owned(),
            history: saved.history.into_owned(),
            updated_at: UNIX_EPOCH + Duration::from_millis(saved.updated_at_ms),
            turn: None,
        }))
    }
}
