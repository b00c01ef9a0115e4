//! List, stat, mkdir, move and delete (research/contract.md, "Host file
//! system"): the control operations, the same on `/v2/rpc` and `/v2/fs/*`.

use super::{Scope, shown};
use crate::error::{Error, FsConflict};
use crate::session::rfc3339;
use ext_methods::{
    FsDeleteParams, FsEntries, FsEntry, FsEntryType, FsMoveParams, FsMoveResult, FsPathResult,
};
use nix::fcntl::RenameFlags;
use std::ffi::OsStr;
use std::fs::Metadata;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// `list_entries`: the entries of the directory `path` (default `.`),
/// sorted by name.
///
/// # Errors
/// 400, 403, 404, 409 `not-a-directory`.
pub(crate) fn list(scope: &Scope, path: Option<&str>) -> Result<FsEntries, Error> {
    let raw = path.unwrap_or(".");
    let absolute = scope.absolute(raw)?;
    let real = absolute
        .canonicalize()
        .map_err(|error| scope.resolve_error(&error, &absolute))?;
    let dir = scope.open_dir(&real, &absolute)?;
    let read = std::fs::read_dir(dir.child(OsStr::new("")))
        .map_err(|error| Error::from_io(&error, &real))?;
    let mut entries = Vec::new();
    for item in read {
        let item = item.map_err(|error| Error::from_io(&error, &real))?;
        let name = item.file_name();
        // An entry removed while listing is simply not listed.
        let Ok(meta) = item.metadata() else { continue };
        let path = dir.real.join(&name);
        let link = meta
            .file_type()
            .is_symlink()
            .then(|| link_of(scope, &dir, &name, &path));
        entries.push(entry(&name, &path, &meta, link));
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(FsEntries { entries })
}

/// `stat`: the entry at `path`, a symlink reported as what it points to.
///
/// # Errors
/// 400, 403 (also for a link whose target is outside the root, and for any
/// path outside whether or not it exists), 404.
pub(crate) fn stat(scope: &Scope, path: &str) -> Result<FsEntry, Error> {
    let absolute = scope.absolute(path)?;
    let canonical = absolute.canonicalize().ok();
    if canonical.as_deref() == Some(Path::new("/")) && !scope.confined() {
        let meta = std::fs::metadata("/").map_err(|error| Error::from_io(&error, &absolute))?;
        return Ok(entry(OsStr::new("/"), &absolute, &meta, None));
    }
    // The root itself: its parent is outside, so it is opened directly.
    if let Some(real) = canonical.filter(|real| scope.is_root(real)) {
        let dir = scope.open_dir(&real, &absolute)?;
        let meta = dir
            .file()
            .metadata()
            .map_err(|error| Error::from_io(&error, &absolute))?;
        let name = real.file_name().unwrap_or(OsStr::new("/")).to_owned();
        return Ok(entry(&name, &absolute, &meta, None));
    }
    // Resolved and checked first, so nothing is told about a path outside.
    let target = scope.locate_absolute(&absolute, true)?;
    let target_meta = target.metadata()?;
    // The path itself, when it names a symlink (through its parent, not
    // followed).
    let link = scope
        .locate_absolute(&absolute, false)
        .ok()
        .and_then(|located| {
            let meta = located.dir.metadata(&located.name).ok()?;
            meta.file_type().is_symlink().then_some((located, meta))
        });
    let real = target.real();
    let name = absolute
        .file_name()
        .or_else(|| real.file_name())
        .unwrap_or(OsStr::new("/"))
        .to_owned();
    Ok(match link {
        Some((located, meta)) => entry(
            &name,
            &absolute,
            &meta,
            Some(Link {
                target: located.dir.read_link(&located.name).ok(),
                // A dangling link resolves to itself: shown as a link.
                followed: Some(target_meta).filter(|m| !m.file_type().is_symlink()),
            }),
        ),
        None => entry(&name, &absolute, &target_meta, None),
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
            .locate_absolute(path, true)
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
    let from = scope.locate(&params.from, false)?;
    let to = scope.locate(&params.to, false)?;
    from.metadata()?;
    let flags = if params.overwrite {
        RenameFlags::empty()
    } else {
        RenameFlags::RENAME_NOREPLACE
    };
    let renamed = nix::fcntl::renameat2(
        from.dir.file(),
        from.name.as_os_str(),
        to.dir.file(),
        to.name.as_os_str(),
        flags,
    );
    match renamed {
        // A file system without RENAME_NOREPLACE: check, then rename.
        Err(nix::errno::Errno::EINVAL) if !params.overwrite => {
            if to.dir.metadata(&to.name).is_ok() {
                return Err(Error::from_io(
                    &std::io::Error::from(std::io::ErrorKind::AlreadyExists),
                    &to.real(),
                ));
            }
            nix::fcntl::renameat(
                from.dir.fd(),
                from.name.as_os_str(),
                to.dir.fd(),
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
    let located = scope.locate(&params.path, false)?;
    let real = located.real();
    let meta = located.metadata()?;
    let removed = if !meta.is_dir() {
        located.dir.remove(&located.name, false)
    } else if params.recursive {
        // std's remove_dir_all opens each level relative to its parent and
        // never follows symlinks; it starts at the checked parent's
        // descriptor (`/proc/self/fd/N/name`).
        std::fs::remove_dir_all(located.handle())
    } else {
        located.dir.remove(&located.name, true)
    };
    removed.map_err(|error| Error::from_io(&error, &real))?;
    Ok(FsPathResult { path: shown(&real) })
}
