//! The runtime id: its rules, and the default one kept in the data dir.

use super::handle::*;
use super::rows::*;
use std::path::Path;

/// The rules of a runtime id (`--runtime-id` and `<data-dir>/runtime-id`):
/// 1 to 200 characters, not only white space, no control characters.
///
/// # Errors
/// A message saying which rule `id` breaks.
pub fn check_runtime_id(id: &str) -> Result<(), String> {
    let length = id.chars().count();
    if !(1..=200).contains(&length) || id.trim().is_empty() {
        return Err(format!(
            "a runtime id is 1 to 200 characters, not only white space (got {length})"
        ));
    }
    if id.chars().any(char::is_control) {
        return Err("a runtime id has no control characters".to_owned());
    }
    Ok(())
}

/// The text of the runtime id file at `path`: a regular file, opened
/// without following a symlink and without waiting on a FIFO, read up to
/// 4 KiB (an id is at most 200 characters: [`check_runtime_id`]).
///
/// # Errors
/// The file's `io::Error`; `InvalidData` for a symlink (`ELOOP`), a FIFO, a
/// device or a directory there.
pub(crate) fn read_runtime_id_file(path: &Path) -> std::io::Result<String> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let not_a_file = || {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not a regular file; remove it (a new id is made when it is missing)",
        )
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(nix::libc::ELOOP) {
                not_a_file()
            } else {
                e
            }
        })?;
    if !file.metadata()?.is_file() {
        return Err(not_a_file());
    }
    let mut text = String::new();
    file.take(4096).read_to_string(&mut text)?;
    Ok(text)
}

/// Reads `<data_dir>/runtime-id`, writing a new random id there first when
/// it is missing: the default runtime id is stable per data dir.
///
/// # Errors
/// When the file cannot be read or written.
pub fn default_runtime_id(data_dir: &Path) -> Result<String, StoreError> {
    let path = data_dir.join(RUNTIME_ID_FILE);
    let io = |e: std::io::Error| StoreError::Io(format!("{}: {e}", path.display()));
    match read_runtime_id_file(&path) {
        Ok(text) if !text.trim().is_empty() => {
            let id = text.trim();
            check_runtime_id(id).map_err(|rule| {
                StoreError::Io(format!(
                    "{}: {rule}; fix or delete the file (a new id is made when it is missing)",
                    path.display()
                ))
            })?;
            return Ok(id.to_owned());
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    std::fs::create_dir_all(data_dir).map_err(io)?;
    let id = uuid::Uuid::new_v4().to_string();
    let temporary = data_dir.join(format!(".{RUNTIME_ID_FILE}.{}", std::process::id()));
    // Readable by the server's user alone, like the store: an agent run as
    // another user (`--agent-user`) has no business with it.
    {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&temporary)
            .map_err(io)?;
        file.write_all(format!("{id}\n").as_bytes()).map_err(io)?;
    }
    // A hard link, not a rename: of servers started at once on a new data
    // dir, the first one's id stays and the others read it.
    let linked = std::fs::hard_link(&temporary, &path);
    let _ = std::fs::remove_file(&temporary);
    match linked {
        Ok(()) => Ok(id),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let text = read_runtime_id_file(&path).map_err(io)?;
            let id = text.trim();
            check_runtime_id(id)
                .map_err(|rule| StoreError::Io(format!("{}: {rule}", path.display())))?;
            Ok(id.to_owned())
        }
        Err(e) => Err(io(e)),
    }
}
