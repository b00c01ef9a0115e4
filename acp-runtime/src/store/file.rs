//! The SQLite store's files under a running server (research/contract.md,
//! "Durable sessions"): `<file>`, `<file>-wal` and `<file>-shm`.
//!
//! - At open, each one that exists must be writable. SQLite maps `-shm`
//!   into memory; when it cannot be written (immutable, a read-only mount)
//!   a write through that mapping kills the process with SIGBUS, which no
//!   handler can recover from. So it is refused before SQLite opens it.
//! - While the server runs, [`SqliteFile::check`] runs before each write
//!   and once a second while idle: the file must still be the one opened
//!   (not deleted or replaced at its path: a later start would not see the
//!   writes) and `-wal`/`-shm` writable. It uses `stat` and `access` only:
//!   opening and closing one of SQLite's files would release every POSIX
//!   lock SQLite holds on it in this process (fcntl semantics).

use super::rows::StoreError;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The files SQLite keeps beside the database in WAL mode.
const COMPANIONS: [&str; 2] = ["-wal", "-shm"];

/// What was at the store's path before it was opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    /// Nothing: SQLite creates a new store.
    Missing,
    /// A file of 0 bytes (truncated?): a store with no sessions.
    Empty,
    /// A file with content.
    Store,
}

/// Why the SQLite file cannot take writes as it should.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Problem {
    /// Deleted or replaced at its path: writes still reach the open file,
    /// but no later start will see them.
    Gone(String),
    /// A file SQLite writes is not writable: writing now could kill the
    /// process (SIGBUS), so writes wait.
    Unwritable(String),
}

impl Problem {
    /// The message for the log and `storeError`.
    pub(crate) fn message(&self) -> &str {
        match self {
            Self::Gone(message) | Self::Unwritable(message) => message,
        }
    }
}

/// `path` with `suffix` appended (`sessions.db` → `sessions.db-shm`).
fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Before SQLite opens `path` in this process, under the open lock: what
/// is there, and whether the database and its `-wal` and `-shm` (those that
/// exist) open for writing. When the file is missing:
/// - `-wal` and `-shm` left there belong to a deleted file (SQLite leaves
///   them when its file was unlinked while open) and are removed: SQLite
///   would read them into the new file, and a server still running on the
///   deleted file keeps its own descriptors of them;
/// - the newest copy [`super::Store::close`] saved of a file deleted under
///   a server is put in its place.
///
/// # Errors
/// [`StoreError::Io`] naming the first file that cannot be written, or a
/// copy that cannot be moved in place.
pub(crate) fn check_before_open(path: &Path) -> Result<Found, StoreError> {
    let io = |file: &Path, e: std::io::Error| StoreError::Io(format!("{}: {e}", file.display()));
    let mut found = match std::fs::metadata(path) {
        Ok(metadata) if metadata.len() == 0 => Found::Empty,
        Ok(_) => Found::Store,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Found::Missing,
        Err(e) => return Err(io(path, e)),
    };
    if found == Found::Missing {
        for suffix in COMPANIONS {
            let orphan = with_suffix(path, suffix);
            match std::fs::remove_file(&orphan) {
                Ok(()) => tracing::warn!(
                    file = %orphan.display(),
                    "removed, left by a deleted session store file"
                ),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io(&orphan, e)),
            }
        }
    }
    if found == Found::Missing
        && let Some(copy) = newest_copy(path)
    {
        std::fs::rename(&copy, path).map_err(|e| io(&copy, e))?;
        tracing::warn!(
            store = %path.display(),
            copy = %copy.display(),
            "the session store file was missing: the copy saved when it was deleted under \
             a server is put in its place"
        );
        found = Found::Store;
    }
    let files = std::iter::once(path.to_owned())
        .chain(COMPANIONS.iter().map(|suffix| with_suffix(path, suffix)));
    for file in files {
        // Read and write, never create nor truncate; an immutable or
        // append-only file refuses this even to root.
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&file)
        {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(StoreError::Io(unwritable(&file, &e))),
        }
    }
    Ok(found)
}

/// The newest `<path>.recovered-<ms>` beside `path`, if any.
fn newest_copy(path: &Path) -> Option<PathBuf> {
    let folder = match path.parent() {
        Some(folder) if !folder.as_os_str().is_empty() => folder,
        _ => Path::new("."),
    };
    let prefix = format!("{}.recovered-", path.file_name()?.to_str()?);
    std::fs::read_dir(folder)
        .ok()?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let name = entry.file_name();
            let ms: u128 = name.to_str()?.strip_prefix(&prefix)?.parse().ok()?;
            Some((ms, entry.path()))
        })
        .max_by_key(|(ms, _)| *ms)
        .map(|(_, copy)| copy)
}

/// The message for a store file that cannot be written.
fn unwritable(file: &Path, error: &dyn std::fmt::Display) -> String {
    format!(
        "the session store file {} is not writable ({error}): make it writable \
         (an immutable or append-only flag shows in lsattr; a read-only mount in mount)",
        file.display()
    )
}

/// The SQLite file as opened: its path and identity (device, inode).
#[derive(Debug)]
pub(crate) struct SqliteFile {
    path: PathBuf,
    identity: (u64, u64),
}

impl SqliteFile {
    /// Notes the identity of `path`, just opened by SQLite.
    ///
    /// # Errors
    /// [`StoreError::Io`] when it cannot be read.
    pub(crate) fn opened(path: &Path) -> Result<Self, StoreError> {
        let metadata = std::fs::metadata(path)
            .map_err(|e| StoreError::Io(format!("{}: {e}", path.display())))?;
        Ok(Self {
            path: path.to_owned(),
            identity: (metadata.dev(), metadata.ino()),
        })
    }

    /// Where [`super::Store::close`] saves the content of a file deleted or
    /// replaced while open: `<file>.recovered-<ms since the epoch>`.
    pub(crate) fn recovery_path(&self) -> PathBuf {
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_millis());
        with_suffix(&self.path, &format!(".recovered-{ms}"))
    }

    /// Whether the file at the path is still the one opened, and its
    /// `-wal` and `-shm` (those that exist) are writable.
    ///
    /// # Errors
    /// The first [`Problem`] found.
    pub(crate) fn check(&self) -> Result<(), Problem> {
        let file = self.path.display();
        let gone = |what: &str, after: &str| {
            Problem::Gone(format!(
                "the session store file {file} was {what} while the server ran: writes go \
                 to the old file, and a restart {after}; a stop with SIGTERM saves the old \
                 file's content as {file}.recovered-<ms>, which a start that finds no \
                 {file} puts in its place"
            ))
        };
        match std::fs::metadata(&self.path) {
            Ok(metadata) if (metadata.dev(), metadata.ino()) == self.identity => {}
            Ok(_) => {
                return Err(gone(
                    "replaced",
                    "reads the new file without the sessions kept here",
                ));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(gone(
                    "deleted",
                    "without the saved copy starts with no sessions",
                ));
            }
            Err(e) => {
                return Err(Problem::Unwritable(format!("{file}: {e}")));
            }
        }
        for suffix in COMPANIONS {
            let file = with_suffix(&self.path, suffix);
            match nix::unistd::access(&file, nix::unistd::AccessFlags::W_OK) {
                Ok(()) | Err(nix::errno::Errno::ENOENT) => {}
                Err(errno) => return Err(Problem::Unwritable(unwritable(&file, &errno))),
            }
        }
        Ok(())
    }
}

/// Makes the SQLite store readable by its owner only (mode 0600): the
/// file and its `-wal`, `-shm` and `.lock` companions, when more open
/// than that. SQLite gives the companions it creates later the file's
/// mode. Sessions hold prompts, file contents and tool output; an agent
/// run as another user (`--agent-user`) must not read them
/// (research/contract.md, "Agents under an unprivileged user").
///
/// # Errors
/// When a mode cannot be read or changed.
pub(crate) fn owner_only(file: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::PermissionsExt;
    for suffix in ["", "-wal", "-shm", ".lock"] {
        let path = with_suffix(file, suffix);
        let io = |e: std::io::Error| StoreError::Io(format!("{}: {e}", path.display()));
        let mode = match std::fs::metadata(&path) {
            Ok(meta) => meta.permissions().mode(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io(e)),
        };
        if mode & 0o077 != 0 {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode & 0o700))
                .map_err(io)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn companions_are_named_after_the_file() {
        assert_eq!(
            with_suffix(Path::new("/d/sessions.db"), "-shm"),
            PathBuf::from("/d/sessions.db-shm")
        );
    }
}
