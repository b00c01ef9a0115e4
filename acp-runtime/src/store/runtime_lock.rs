//! One server per runtime id and store on this host (research/contract.md,
//! "Durable sessions", "One server per runtime id"): two servers with one
//! runtime id on one store would write the same rows, each taking the
//! other's live sessions for dormant ones.
//!
//! The server takes an exclusive `flock(2)` on a lock file named for its
//! runtime id and holds it for its life. The lock belongs to the open file,
//! not to a pid: it dies with the process however it ends (SIGKILL, the OOM
//! killer, a container restart where every process is PID 1 again), so a
//! stale lock cannot exist. The file is opened close-on-exec (Rust's
//! default), so agent processes never inherit it.

use super::{StoreError, StoreUrl};
use nix::fcntl::{Flock, FlockArg};
use std::fs::File;
use std::path::{Path, PathBuf};

/// Longest runtime id used verbatim in the lock file's name; a longer one,
/// or one with another character than `[A-Za-z0-9._-]`, is named by its
/// SHA-256 (a runtime id may hold `/` and reach 200 characters, a file
/// name 255 bytes).
const VERBATIM_ID_CHARS: usize = 64;

/// The held lock: dropping it (or the process ending) releases it.
#[derive(Debug)]
pub(crate) struct RuntimeLock {
    /// The lock file, locked; it holds the holder's base URL once the
    /// server listens ([`RuntimeLock::record_url`]).
    file: Flock<File>,
}

/// Most bytes of a lock file read back for the holder's URL.
const MAX_URL_BYTES: u64 = 512;

impl RuntimeLock {
    /// Writes `url` (the server's base URL, `http://HOST:PORT`) into the
    /// lock file, so a second server refused by the lock can say where
    /// the first one listens. Best effort: a failure is only logged.
    pub(crate) fn record_url(&self, url: &str) {
        use std::io::{Seek, Write};
        let mut file: &File = &self.file;
        let written = file
            .set_len(0)
            .and_then(|()| file.seek(std::io::SeekFrom::Start(0)))
            .and_then(|_| file.write_all(format!("{url}\n").as_bytes()));
        if let Err(error) = written {
            tracing::debug!(%error, "cannot write the server's URL into its runtime lock file");
        }
    }
}

/// The URL a lock's holder wrote ([`RuntimeLock::record_url`]), if it
/// reads as one (the file is the holder's, but only a URL is repeated).
fn holder_url(file: &File) -> Option<String> {
    use std::io::Read;
    let mut text = String::new();
    file.take(MAX_URL_BYTES).read_to_string(&mut text).ok()?;
    let url = text.trim();
    let plain = url.starts_with("http://")
        && url[7..]
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b':' | b'[' | b']' | b'-'));
    plain.then(|| url.to_owned())
}

/// The lock file of `runtime_id` on the store `url` (`None` for
/// [`StoreUrl::Memory`]: nothing is shared):
/// - SQLite: `<file>.runtime-<key>.lock`, beside the file, so servers with
///   different data dirs sharing one `--store sqlite:PATH` are covered;
/// - PostgreSQL: `<data_dir>/runtime-<key>.lock`, this host's data dir
///   only (two hosts on one database are not covered).
///
/// `<key>` is the runtime id itself when it is at most
/// [`VERBATIM_ID_CHARS`] characters of `[A-Za-z0-9._-]` (the default UUID
/// is), else `sha256-` and the hex SHA-256 of the id.
pub(crate) fn lock_path(url: &StoreUrl, data_dir: &Path, runtime_id: &str) -> Option<PathBuf> {
    let key = file_key(runtime_id);
    match url {
        StoreUrl::Memory => None,
        StoreUrl::Sqlite(file) => {
            let mut name = file.as_os_str().to_owned();
            name.push(format!(".runtime-{key}.lock"));
            Some(PathBuf::from(name))
        }
        StoreUrl::Postgres(_) => Some(data_dir.join(format!("runtime-{key}.lock"))),
    }
}

/// The part of the lock file's name that stands for `runtime_id`.
fn file_key(runtime_id: &str) -> String {
    let plain = runtime_id.len() <= VERBATIM_ID_CHARS
        && runtime_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if plain {
        return runtime_id.to_owned();
    }
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(runtime_id.as_bytes());
    let mut key = String::from("sha256-");
    for byte in digest {
        key.push_str(&format!("{byte:02x}"));
    }
    key
}

/// Takes the lock of `runtime_id` on the store `url` (see [`lock_path`]),
/// without waiting. `Ok(None)` for [`StoreUrl::Memory`]. The lock file is
/// created (mode 0600, with its folder) when missing and never removed:
/// removing it could let a third server lock a new file beside a holder of
/// the old one.
///
/// # Errors
/// [`StoreError::Io`] when another process holds the lock, naming the
/// store, the runtime id, the lock file and how to start a second server
/// (another data dir, or another `--runtime-id`); or when the file cannot
/// be created or locked.
pub(crate) fn acquire(
    url: &StoreUrl,
    data_dir: &Path,
    runtime_id: &str,
) -> Result<Option<RuntimeLock>, StoreError> {
    let Some(path) = lock_path(url, data_dir, runtime_id) else {
        return Ok(None);
    };
    let io = |e: &dyn std::fmt::Display| StoreError::Io(format!("{}: {e}", path.display()));
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| io(&e))?;
    }
    let file = {
        use std::os::unix::fs::OpenOptionsExt as _;
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .mode(0o600)
            // A link planted where the lock goes is refused, not followed;
            // a FIFO there does not block the open (refused below).
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
            .open(&path)
            .map_err(|e| io(&e))?
    };
    let meta = file.metadata().map_err(|e| io(&e))?;
    if !meta.is_file() {
        return Err(io(&"not a regular file"));
    }
    // A hard link planted there would have the holder's URL written over
    // another file's bytes (research/contract.md, "One server per runtime id").
    if std::os::unix::fs::MetadataExt::nlink(&meta) > 1 {
        return Err(io(&"a file with other hard links; remove it"));
    }
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(locked) => Ok(Some(RuntimeLock { file: locked })),
        Err((file, nix::errno::Errno::EWOULDBLOCK)) => Err(StoreError::Io(format!(
            "another sandbox-agent server runs with runtime id {runtime_id:?} on the session \
             store {store} (data dir {data_dir}; it holds {lock}){listens}: two servers with \
             one runtime id would write the same sessions. Send requests to that server \
             (sandbox-agent prompt --url URL), or start this one with another data dir \
             (--data-dir PATH, with its own store), or with its own runtime id \
             (--runtime-id ID; servers with different runtime ids may share one store)",
            store = url.redacted(),
            data_dir = data_dir.display(),
            lock = path.display(),
            listens = holder_url(&file)
                .map(|url| format!(" and listens on {url}"))
                .unwrap_or_default(),
        ))),
        Err((_, errno)) => Err(io(&errno)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_ids_name_the_file_and_others_are_hashed() {
        assert_eq!(file_key("8f0c-1d2e_a.b"), "8f0c-1d2e_a.b");
        let slash = file_key("../etc");
        assert!(
            slash.starts_with("sha256-") && slash.len() == 7 + 64,
            "{slash}"
        );
        assert_ne!(file_key("a/b"), file_key("a/c"));
        assert!(file_key(&"x".repeat(65)).starts_with("sha256-"));
        assert_eq!(
            lock_path(
                &StoreUrl::Sqlite(PathBuf::from("/d/sessions.db")),
                Path::new("/other"),
                "rid"
            ),
            Some(PathBuf::from("/d/sessions.db.runtime-rid.lock"))
        );
        assert_eq!(lock_path(&StoreUrl::Memory, Path::new("/d"), "rid"), None);
    }
}
