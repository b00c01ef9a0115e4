//! List, stat, mkdir, move and delete (research/contract.md, "Host file
//! system"): the control operations, the same on `/v2/rpc` and `/v2/fs/*`.
//! Each one holds its scope's user ([`Scope::act`], `--agent-user`) from
//! its first path to its last: the kernel judges every open, create,
//! rename and unlink by that user's permissions.

use super::{Beneath, Scope, metadata_at, shown};
use crate::error::{Error, FsConflict};
use crate::time::rfc3339;
use ext_methods::{
    FsDeleteParams, FsEntries, FsEntry, FsEntryType, FsMoveParams, FsMoveResult, FsPathResult,
    MAX_LIST_ENTRIES,
};
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::Mode;
use nix::unistd::{UnlinkatFlags, unlinkat};
use rustix::fs::RenameFlags;
use std::ffi::OsStr;
use std::ffi::OsString;
use std::fs::File;
use std::fs::Metadata;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// `list_entries`: the entries of the directory `path` (default `.`),
/// sorted by name.
///
/// # Errors
/// 400, 403, 404, 409 `not-a-directory`.
pub(crate) fn list(scope: &Scope, path: Option<&str>) -> Result<FsEntries, Error> {
    let _acting = scope.act()?;
    let raw = path.unwrap_or(".");
    let absolute = scope.absolute(raw)?;
    let dir = scope.open_dir_at(&absolute, Path::new(raw))?;
    let real = dir.real.clone();
    let read = std::fs::read_dir(dir.child(OsStr::new("")))
        .map_err(|error| Error::from_io(&error, &real))?;
    // Only the first `MAX_LIST_ENTRIES` names are kept while reading (a
    // max-heap drops the largest), so a directory of any size costs at most
    // that many names; only those are looked at.
    let mut names = std::collections::BinaryHeap::with_capacity(MAX_LIST_ENTRIES + 1);
    let mut truncated = false;
    for item in read {
        names.push(
            item.map_err(|error| Error::from_io(&error, &real))?
                .file_name(),
        );
        if names.len() > MAX_LIST_ENTRIES {
            names.pop();
            truncated = true;
        }
    }
    let names = names.into_sorted_vec();
    let mut entries = Vec::with_capacity(names.len());
    for name in names {
        // An entry removed while listing is simply not listed.
        let Ok(meta) = metadata_at(dir.fd(), &name) else {
            continue;
        };
        let path = dir.real.join(&name);
        let link = meta
            .file_type()
            .is_symlink()
            .then(|| link_of(scope, &dir, &name, &path));
        entries.push(entry(&name, &path, &meta, link));
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(FsEntries { entries, truncated })
}

/// `stat`: the entry at `path`, a symlink reported as what it points to.
///
/// # Errors
/// 400, 403 (also for a link whose target is outside the root, and for any
/// path outside whether or not it exists), 404.
pub(crate) fn stat(scope: &Scope, path: &str) -> Result<FsEntry, Error> {
    let _acting = scope.act()?;
    let absolute = scope.absolute(path)?;
    if !scope.confined()
        && absolute
            .canonicalize()
            .is_ok_and(|real| real == Path::new("/"))
    {
        let meta = std::fs::metadata("/").map_err(|error| Error::from_io(&error, &absolute))?;
        return Ok(entry(OsStr::new("/"), &absolute, &meta, None));
    }
    // Resolved (beneath the root) first, so nothing is told about a path
    // outside; a symlink to nothing inside is still described, as a link.
    let shown = Path::new(path);
    let followed = match scope.follow(&absolute, shown) {
        // The root itself (its parent is outside): from its descriptor.
        Ok(Beneath::Dir(dir)) => {
            let meta = dir
                .file()
                .metadata()
                .map_err(|error| Error::from_io(&error, &absolute))?;
            Ok((meta, dir.real.clone()))
        }
        Ok(Beneath::Entry(target)) => target.metadata().map(|meta| (meta, target.real())),
        Err(error) => Err(error),
    };
    // The path itself, when it names a symlink (through its parent, not
    // followed).
    let link = scope
        .locate_absolute(&absolute, shown, false)
        .ok()
        .and_then(|located| {
            let meta = located.dir.metadata(&located.name).ok()?;
            meta.file_type().is_symlink().then_some((located, meta))
        });
    let (target_meta, real) = match (followed, &link) {
        (Ok((meta, real)), _) => (Some(meta), real),
        (Err(Error::FileNotFound(_)), Some((located, _))) => (None, located.real()),
        (Err(error), _) => return Err(error),
    };
    let name = absolute
        .file_name()
        .or_else(|| real.file_name())
        .unwrap_or(OsStr::new("/"))
        .to_owned();
    Ok(match (link, target_meta) {
        (Some((located, meta)), followed) => entry(
            &name,
            &absolute,
            &meta,
            Some(Link {
                target: located.dir.read_link(&located.name).ok(),
                // A dangling link resolves to nothing: shown as a link.
                followed: followed.filter(|m| !m.file_type().is_symlink()),
            }),
        ),
        (None, Some(meta)) => entry(&name, &absolute, &meta, None),
        (None, None) => return Err(Error::FileNotFound(absolute.display().to_string())),
    })
}

/// What a symlink in a listing or a stat shows: its text, and what it
/// points to when that is inside the root.
struct Link {
    /// The link's text.
    target: Option<PathBuf>,
    /// The `lstat` of what it resolves to, when inside the root.
    followed: Option<Metadata>,
}

/// The symlink `name` in `dir` (real path `path`), resolved again now and
/// followed only to something inside the root.
fn link_of(scope: &Scope, dir: &super::Dir, name: &OsStr, path: &Path) -> Link {
    Link {
        target: dir.read_link(name).ok(),
        followed: scope
            .locate_absolute(path, path, true)
            .ok()
            .and_then(|located| located.dir.metadata(&located.name).ok())
            // A dangling link resolves to itself: shown as a link.
            .filter(|meta| !meta.file_type().is_symlink()),
    }
}

/// The entry `name` at `path` (`lstat` result `meta`; `link` when it is a
/// symlink).
fn entry(name: &OsStr, path: &Path, meta: &Metadata, link: Option<Link>) -> FsEntry {
    let (followed, symlink_target) = match link {
        Some(link) => (link.followed, link.target.map(|t| shown(&t))),
        None => (None, None),
    };
    let (entry_type, described) = match (&followed, meta.file_type().is_symlink()) {
        (Some(target), _) if target.is_dir() => (FsEntryType::Directory, target),
        (Some(target), _) => (FsEntryType::File, target),
        (None, true) => (FsEntryType::Symlink, meta),
        (None, false) if meta.is_dir() => (FsEntryType::Directory, meta),
        (None, false) => (FsEntryType::File, meta),
    };
    let utf8 = name.to_str().is_some();
    FsEntry {
        name: name.to_string_lossy().into_owned(),
        path: shown(path),
        size: if entry_type == FsEntryType::File {
            described.len()
        } else {
            0
        },
        entry_type,
        entry_type_camel: entry_type,
        modified: described.modified().ok().map(rfc3339),
        symlink_target,
        raw_name: (!utf8).then(|| {
            percent_encoding::percent_encode(name.as_bytes(), RAW_NAME_ESCAPES).to_string()
        }),
    }
}

/// Bytes escaped in `rawName`: all but RFC 3986 unreserved characters.
const RAW_NAME_ESCAPES: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// `mkdir`: creates `path` and its missing parents; an existing directory
/// is fine.
///
/// # Errors
/// 400, 403, 409 `already-exists` (a file is there) / `not-a-directory`.
pub(crate) fn mkdir(scope: &Scope, path: &str) -> Result<FsPathResult, Error> {
    let _acting = scope.act()?;
    let dir = scope.make_dirs(path).map_err(|error| match error {
        Error::FsConflict {
            conflict: FsConflict::NotADirectory,
            detail,
        } => Error::FsConflict {
            conflict: FsConflict::AlreadyExists,
            detail: format!("{detail}; cannot create a directory there"),
        },
        other => other,
    })?;
    Ok(FsPathResult {
        path: shown(&dir.real),
    })
}

/// `move`: renames `from` to `to` (a symlink itself, not its target). The
/// parent of `to` must exist.
///
/// # Errors
/// 400, 403, 404, 409 `already-exists` (without `overwrite`),
/// `is-a-directory` / `not-a-directory` / `directory-not-empty` (replacing
/// an entry of the other kind or a non-empty directory), `cross-device`.
pub(crate) fn rename(scope: &Scope, params: &FsMoveParams) -> Result<FsMoveResult, Error> {
    let _acting = scope.act()?;
    let from = scope.locate(&params.from, false)?;
    let to = scope.locate(&params.to, false)?;
    from.metadata()?;
    let flags = if params.overwrite {
        RenameFlags::empty()
    } else {
        RenameFlags::NOREPLACE
    };
    // rustix makes the renameat2 system call itself: glibc has the
    // function only from 2.28, and the release binary runs on 2.17
    // (research/decisions.md, "A release binary for glibc 2.17").
    let renamed = rustix::fs::renameat_with(
        from.dir.file(),
        from.name.as_os_str(),
        to.dir.file(),
        to.name.as_os_str(),
        flags,
    );
    match renamed {
        // A file system without RENAME_NOREPLACE: check, then rename.
        Err(rustix::io::Errno::INVAL) if !params.overwrite => {
            if to.dir.metadata(&to.name).is_ok() {
                return Err(Error::from_io(
                    &std::io::Error::from(std::io::ErrorKind::AlreadyExists),
                    &to.real(),
                ));
            }
            rustix::fs::renameat(
                from.dir.file(),
                from.name.as_os_str(),
                to.dir.file(),
                to.name.as_os_str(),
            )
            .map_err(|errno| Error::from_io(&errno.into(), &to.real()))?;
        }
        Err(errno) => {
            return Err(Error::from_io(&std::io::Error::from(errno), &to.real()));
        }
        Ok(()) => {}
    }
    Ok(FsMoveResult {
        from: shown(&from.real()),
        to: shown(&to.real()),
    })
}

/// `delete_entry`: removes a file or symlink (never its target), an empty
/// directory, or with `recursive` a directory and everything in it.
///
/// # Errors
/// 400, 403, 404, 409 `directory-not-empty`.
pub(crate) fn delete(scope: &Scope, params: &FsDeleteParams) -> Result<FsPathResult, Error> {
    let _acting = scope.act()?;
    let located = scope.locate(&params.path, false)?;
    let real = located.real();
    let meta = located.metadata()?;
    let removed = if !meta.is_dir() {
        located.dir.remove(&located.name, false)
    } else if params.recursive {
        return remove_tree(&located.dir, &located.name, &real)
            .map(|()| FsPathResult { path: shown(&real) });
    } else {
        located.dir.remove(&located.name, true)
    };
    removed.map_err(|error| Error::from_io(&error, &real))?;
    Ok(FsPathResult { path: shown(&real) })
}

/// Most directory levels a recursive delete goes down (each holds one open
/// descriptor while it is emptied); a deeper tree is 409, to be deleted in
/// parts.
const MAX_DELETE_DEPTH: usize = 4096;

/// One directory level of [`remove_tree`].
struct Level {
    /// The directory, opened `O_NOFOLLOW` from its parent.
    dir: File,
    /// Its name in the parent.
    name: OsString,
    /// Its subdirectories still to empty and remove.
    subdirs: Vec<OsString>,
}

impl Level {
    /// Opens `name` in `parent` (never through a symlink), unlinks every
    /// non-directory in it and keeps the subdirectories for later.
    fn open(parent: BorrowedFd<'_>, name: &OsStr) -> std::io::Result<Self> {
        let fd = openat(
            parent,
            name,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        let dir = File::from(fd);
        let mut subdirs = Vec::new();
        for item in std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd()))? {
            let item = item?;
            let child = item.file_name();
            if item.file_type()?.is_dir() {
                subdirs.push(child);
            } else {
                match unlinkat(&dir, child.as_os_str(), UnlinkatFlags::NoRemoveDir) {
                    Ok(()) | Err(nix::errno::Errno::ENOENT) => {}
                    Err(errno) => return Err(errno.into()),
                }
            }
        }
        Ok(Self {
            dir,
            name: name.to_owned(),
            subdirs,
        })
    }
}

/// Removes the directory `name` in `parent` and everything in it, level by
/// level with an explicit stack (no recursion: a tree of any depth cannot
/// overflow the thread's stack), every directory opened from its parent's
/// descriptor with `O_NOFOLLOW`, so a symlink swapped in is unlinked, never
/// followed.
///
/// # Errors
/// 409 `directory-not-empty` for a tree deeper than [`MAX_DELETE_DEPTH`]
/// (or one written into while it is removed); as the system's otherwise.
fn remove_tree(parent: &super::Dir, name: &OsStr, real: &Path) -> Result<(), Error> {
    if !Path::new("/proc/self/fd").is_dir() {
        // Without `/proc`, std's (recursive) walk, which also never follows
        // a symlink.
        return std::fs::remove_dir_all(parent.child(name))
            .map_err(|error| Error::from_io(&error, real));
    }
    let io = |error: std::io::Error| Error::from_io(&error, real);
    let mut levels = vec![Level::open(parent.fd(), name).map_err(io)?];
    loop {
        let depth = levels.len();
        let Some(top) = levels.last_mut() else {
            return Ok(());
        };
        if let Some(sub) = top.subdirs.pop() {
            if depth >= MAX_DELETE_DEPTH {
                return Err(Error::FsConflict {
                    conflict: FsConflict::DirectoryNotEmpty,
                    detail: format!(
                        "{} is more than {MAX_DELETE_DEPTH} directories deep; delete its deepest parts first",
                        real.display()
                    ),
                });
            }
            let opened = Level::open(top.dir.as_fd(), &sub);
            match opened {
                Ok(level) => levels.push(level),
                // Gone meanwhile.
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                // Swapped for a symlink or a file: unlinked, never followed.
                Err(error)
                    if matches!(
                        error.raw_os_error(),
                        Some(nix::libc::ELOOP | nix::libc::ENOTDIR)
                    ) =>
                {
                    unlinkat(&top.dir, sub.as_os_str(), UnlinkatFlags::NoRemoveDir)
                        .map_err(|errno| io(errno.into()))?;
                }
                Err(error) => return Err(io(error)),
            }
            continue;
        }
        let Some(done) = levels.pop() else {
            return Ok(());
        };
        let at = levels.last().map_or(parent.fd(), |level| level.dir.as_fd());
        unlinkat(at, done.name.as_os_str(), UnlinkatFlags::RemoveDir)
            .map_err(|errno| io(errno.into()))?;
    }
}
