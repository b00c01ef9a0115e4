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
use std::path::Path;

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
        .map_err(|error| Error::from_io(&error, &absolute))?;
    let dir = scope.open_dir(&real)?;
    let read = std::fs::read_dir(dir.child(OsStr::new("")))
        .map_err(|error| Error::from_io(&error, &real))?;
    let mut entries = Vec::new();
    for item in read {
        let item = item.map_err(|error| Error::from_io(&error, &real))?;
        let name = item.file_name();
        // An entry removed while listing is simply not listed.
        let Ok(meta) = item.metadata() else { continue };
        entries.push(entry(
            scope,
            &name,
            &dir.real.join(&name),
            &dir.child(&name),
            &meta,
        ));
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(FsEntries { entries })
}

/// `stat`: the entry at `path`, a symlink reported as what it points to.
///
/// # Errors
/// 400, 403 (also for a link whose target is outside the root), 404.
pub(crate) fn stat(scope: &Scope, path: &str) -> Result<FsEntry, Error> {
    let absolute = scope.absolute(path)?;
    let real = absolute
        .canonicalize()
        .map_err(|error| Error::from_io(&error, &absolute))?;
    scope.check(&real)?;
    let meta =
        std::fs::symlink_metadata(&absolute).map_err(|error| Error::from_io(&error, &absolute))?;
    let name = absolute
        .file_name()
        .or_else(|| real.file_name())
        .unwrap_or(OsStr::new("/"))
        .to_owned();
    Ok(entry(scope, &name, &absolute, &absolute, &meta))
}

/// The entry `name` at `path` (`lstat` result `meta`, `access` the path to
/// follow a link through).
fn entry(scope: &Scope, name: &OsStr, path: &Path, access: &Path, meta: &Metadata) -> FsEntry {
    let mut followed = None;
    let mut symlink_target = None;
    if meta.file_type().is_symlink() {
        symlink_target = std::fs::read_link(access).ok().map(|t| shown(&t));
        // A link is followed only to something inside the root.
        followed = access
            .canonicalize()
            .ok()
            .filter(|real| scope.check(real).is_ok())
            .and_then(|real| std::fs::metadata(real).ok());
    }
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
    std::fs::symlink_metadata(from.handle())
        .map_err(|error| Error::from_io(&error, &from.real()))?;
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
            if std::fs::symlink_metadata(to.handle()).is_ok() {
                return Err(Error::from_io(
                    &std::io::Error::from(std::io::ErrorKind::AlreadyExists),
                    &to.real(),
                ));
            }
            std::fs::rename(from.handle(), to.handle())
                .map_err(|error| Error::from_io(&error, &to.real()))?;
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
    let target = located.handle();
    let real = located.real();
    let meta = std::fs::symlink_metadata(&target).map_err(|error| Error::from_io(&error, &real))?;
    let removed = if !meta.is_dir() {
        std::fs::remove_file(&target)
    } else if params.recursive {
        // std's remove_dir_all opens each level relative to its parent and
        // never follows symlinks.
        std::fs::remove_dir_all(&target)
    } else {
        std::fs::remove_dir(&target)
    };
    removed.map_err(|error| Error::from_io(&error, &real))?;
    Ok(FsPathResult { path: shown(&real) })
}
