//! Upload-batch (research/contract.md, "Host file system"): a tar stream
//! (gzip accepted, recognized by its magic bytes) unpacked into a directory
//! with the installer's rules, [`crate::agent::archive::unpack_tar_stream`]:
//! no absolute paths, no `..`, no links out, no device files, caps on bytes
//! and entries.

use super::{Scope, shown};
use crate::agent::archive::{self, Limits, RefusedKind};
use crate::error::Error;
use ext_methods::FsUploadBatchResult;
use std::io::{BufRead, BufReader, ErrorKind, Read};

/// Most paths listed in the answer; `truncated` says when more were unpacked.
pub(crate) const MAX_LISTED_PATHS: usize = 1000;

/// Unpacks the archive `reader` into the directory `path` (created with its
/// parents). Blocks.
///
/// # Errors
/// 400 `invalid-archive` (unsafe entry, not a tar), 403, 409
/// `not-a-directory`, 413 past `limits`, 507.
pub(crate) fn unpack(
    scope: &Scope,
    path: &str,
    reader: impl Read,
    limits: Limits,
) -> Result<FsUploadBatchResult, Error> {
    let dir = scope.make_dirs(path)?;
    let mut reader = BufReader::with_capacity(256 * 1024, reader);
    let gzip = reader
        .fill_buf()
        .map_err(|error| Error::InvalidRequest(format!("cannot read the archive: {error}")))?
        .starts_with(&[0x1f, 0x8b]);
    let mut paths = Vec::new();
    let mut count = 0usize;
    let on_entry = |relative: &std::path::Path| {
        count += 1;
        if paths.len() < MAX_LISTED_PATHS {
            paths.push(shown(&dir.real.join(relative)));
        }
    };
    let unpacked = if gzip {
        archive::unpack_tar_stream(
            flate2::read::GzDecoder::new(reader),
            &dir.real,
            limits,
            on_entry,
        )
    } else {
        archive::unpack_tar_stream(reader, &dir.real, limits, on_entry)
    };
    unpacked.map_err(|refused| match refused.kind {
        RefusedKind::Limit => Error::ArchiveTooLarge(refused.message),
        RefusedKind::Unsafe => Error::InvalidArchive(refused.message),
        RefusedKind::Io(ErrorKind::StorageFull | ErrorKind::QuotaExceeded) => {
            Error::InsufficientStorage(refused.message)
        }
        RefusedKind::Io(ErrorKind::PermissionDenied) => Error::PermissionDenied(refused.message),
        RefusedKind::Io(_) => Error::FsIo(refused.message),
    })?;
    Ok(FsUploadBatchResult {
        truncated: count > paths.len(),
        paths,
    })
}
