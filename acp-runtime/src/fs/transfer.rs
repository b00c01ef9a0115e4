//! File bytes in and out (research/contract.md, "Host file system", reads
//! and writes): reads open the file through its checked parent; writes go to
//! a temporary file beside the target, are fsynced and renamed into place,
//! so a reader never sees half a file and a failed upload leaves the old one.

use super::{Located, Scope, is_a_directory, shown};
use crate::error::Error;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use nix::fcntl::OFlag;
use std::fs::{File, Metadata};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use tokio::io::AsyncWriteExt;

/// Bytes gathered before one write to the temp file.
const WRITE_BUFFER_BYTES: usize = 1 << 20;

/// A file opened for reading.
#[derive(Debug)]
pub(crate) struct OpenFile {
    /// The file, at offset 0.
    pub(crate) file: File,
    /// Its metadata (size, modification time, inode for the ETag).
    pub(crate) meta: Metadata,
}

impl OpenFile {
    /// A strong validator (RFC 9110 section 8.8.3): inode, size and
    /// modification time in nanoseconds; a rewrite (a new inode by rename)
    /// or an in-place change gives a new one.
    pub(crate) fn etag(&self) -> String {
        format!(
            "\"{:x}-{:x}-{:x}{:08x}\"",
            self.meta.ino(),
            self.meta.len(),
            self.meta.mtime(),
            self.meta.mtime_nsec()
        )
    }
}

/// Opens the regular file at `path` (symlinks followed inside the root).
///
/// # Errors
/// 400, 403, 404, 409 `is-a-directory`.
pub(crate) fn open(scope: &Scope, path: &str) -> Result<OpenFile, Error> {
    let acting = scope.act()?;
    let located = scope.locate(path, true)?;
    let real = located.real();
    let file = located
        .dir
        .open_file(&located.name, OFlag::O_RDONLY | OFlag::O_NONBLOCK, 0)
        .map_err(|error| {
            // Still a symlink after resolution: one that points nowhere.
            let dangling = error.raw_os_error() == Some(nix::libc::ELOOP)
                && located
                    .dir
                    .metadata(&located.name)
                    .is_ok_and(|meta| meta.file_type().is_symlink());
            if dangling {
                Error::FileNotFound(format!("{} (a symlink to nothing)", real.display()))
            } else {
                Error::from_io(&error, &real)
            }
        })?;
    let meta = file
        .metadata()
        .map_err(|error| Error::from_io(&error, &real))?;
    drop(acting);
    if !scope.user_may(&meta, 4) {
        return Err(Error::PermissionDenied(real.display().to_string()));
    }
    if meta.is_dir() {
        return Err(is_a_directory(&real));
    }
    if !meta.is_file() {
        return Err(Error::InvalidPath(format!(
            "{} is not a regular file",
            real.display()
        )));
    }
    Ok(OpenFile { file, meta })
}

/// The temporary file of a write in progress; removed when dropped unless
/// committed, so every exit path (an error, a client that hangs up and
/// drops the request future) leaves no temp file behind.
struct TempFile {
    located: Located,
    name: std::ffi::OsString,
    committed: bool,
    /// The scope, whose user (if any) the rename is made as.
    scope: Scope,
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.committed {
            let _ = self.located.dir.remove(&self.name, false);
        }
    }
}

/// Writes `body` to `path` (parents created; a symlink at the path is
/// followed, inside the root, and its target replaced by rename, never
/// written in place). Memory stays at one chunk.
/// Returns the path written and the byte count. On an error the rest of
/// `body` is left unread, for the caller to drain.
///
/// # Errors
/// 400, 403, 409 `is-a-directory`, 413 past `limit` bytes, 507, and the
/// body's own error (408, 400) as it is.
pub(crate) async fn write<S>(
    scope: Scope,
    path: String,
    body: &mut S,
    limit: u64,
) -> Result<(PathBuf, u64), Error>
where
    S: Stream<Item = Result<Bytes, Error>> + Unpin,
{
    let (temp, file) = tokio::task::spawn_blocking(move || begin(&scope, &path))
        .await
        .map_err(|error| Error::FsIo(error.to_string()))??;
    let real = temp.located.real();
    // Body chunks are often a few KiB; each write to a tokio file is a trip
    // to the blocking pool, so they are gathered into 1 MiB writes.
    let mut file =
        tokio::io::BufWriter::with_capacity(WRITE_BUFFER_BYTES, tokio::fs::File::from_std(file));
    let mut written = 0u64;
    while let Some(chunk) = body.next().await {
        let chunk = chunk?;
        written += chunk.len() as u64;
        if written > limit {
            return Err(Error::PayloadTooLarge {
                limit: usize::try_from(limit).unwrap_or(usize::MAX),
            });
        }
        file.write_all(&chunk)
            .await
            .map_err(|error| Error::from_io(&error, &real))?;
    }
    file.flush()
        .await
        .map_err(|error| Error::from_io(&error, &real))?;
    let file = file.into_inner().into_std().await;
    tokio::task::spawn_blocking(move || commit(temp, &file))
        .await
        .map_err(|error| Error::FsIo(error.to_string()))??;
    Ok((real, written))
}

/// Creates the temp file beside the target.
fn begin(scope: &Scope, path: &str) -> Result<(TempFile, File), Error> {
    let _acting = scope.act()?;
    let absolute = scope.absolute(path)?;
    if let Some(parent) = absolute.parent() {
        scope.make_dirs(&shown(parent))?;
    }
    let located = scope.locate(path, true)?;
    let real = located.real();
    if let Ok(meta) = located.dir.metadata(&located.name) {
        if meta.is_dir() {
            return Err(is_a_directory(&real));
        }
        // A FIFO, socket or device node is not replaced by a file (a PUT
        // to /dev/null would make it one), as a read refuses them too.
        if !meta.is_file() && !meta.file_type().is_symlink() {
            return Err(Error::InvalidPath(format!(
                "{} is not a regular file",
                real.display()
            )));
        }
    }
    let dir_meta = located
        .dir
        .file()
        .metadata()
        .map_err(|error| Error::from_io(&error, &real))?;
    if !scope.user_may(&dir_meta, 0o3) {
        return Err(Error::PermissionDenied(real.display().to_string()));
    }
    let mut name = std::ffi::OsString::from(".");
    name.push(&located.name);
    name.push(format!(
        ".sandbox-agent-upload-{}",
        uuid::Uuid::new_v4().simple()
    ));
    let file = located
        .dir
        .open_file(
            &name,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL,
            0o644,
        )
        .map_err(|error| Error::from_io(&error, &real))?;
    Ok((
        TempFile {
            located,
            name,
            committed: false,
            scope: scope.clone(),
        },
        file,
    ))
}

/// fsync, rename into place, fsync the directory.
fn commit(mut temp: TempFile, file: &File) -> Result<(), Error> {
    let real = temp.located.real();
    let io = |error: std::io::Error| Error::from_io(&error, &real);
    file.sync_all().map_err(io)?;
    let acting = temp.scope.act()?;
    // renameat(2), not nix's renameat2 (a glibc 2.28 symbol; the release
    // binary runs on 2.17): replacing is what a commit wants.
    rustix::fs::renameat(
        temp.located.dir.file(),
        temp.name.as_os_str(),
        temp.located.dir.file(),
        temp.located.name.as_os_str(),
    )
    .map_err(|errno| io(errno.into()))?;
    drop(acting);
    temp.committed = true;
    temp.located.dir.file().sync_all().map_err(io)?;
    Ok(())
}
