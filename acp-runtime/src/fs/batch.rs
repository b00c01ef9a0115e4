//! Upload-batch (research/contract.md, "Host file system"): a tar stream
//! (gzip accepted, recognized by its magic bytes, every member of a
//! multi-member gzip read) unpacked into a directory.
//!
//! The tar crate only reads the archive here; every entry is written by this
//! module through directory descriptors, never by path, so nothing a client
//! or another process does to the tree while the archive streams in can
//! redirect a write:
//! - the target directory is opened and checked once ([`Scope::make_dirs`])
//!   and checked again, where it is now, before every entry;
//! - an entry's parents are opened from it one component at a time with
//!   `O_NOFOLLOW` (created when missing): nothing is unpacked through a
//!   symlink, whether the archive made it or it was there before;
//! - files are created `O_CREAT | O_EXCL | O_NOFOLLOW` after whatever was at
//!   the name (a file or a symlink, never a directory) is unlinked, so
//!   nothing is written through an existing link;
//! - a symlink must be relative and stay inside the directory when read
//!   lexically; once the archive is done (or has failed), every symlink it
//!   made is resolved again and removed, failing the archive, if it lands
//!   outside the directory;
//! - a hard link may only point to a file this same archive unpacked, still
//!   the same inode;
//! - no absolute paths, no `..`, no device files or FIFOs (skipped), caps on
//!   unpacked bytes and entries ([`Limits`]);
//! - under `--agent-user`, all of it with the user's file system
//!   credentials ([`Scope::act`]): what is made is the user's, and the
//!   kernel refuses what the user could not reach.

use super::{Dir, Scope, metadata_at, shown};
use crate::archive::{self, Budget, Limits, check_link_target, safe_relative};
use crate::error::{Error, FsConflict};
use ext_methods::FsUploadBatchResult;
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{Mode, mkdirat};
use nix::unistd::{UnlinkatFlags, linkat, symlinkat, unlinkat};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, BufRead, BufReader, ErrorKind, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Most paths listed in the answer; `truncated` says when more were unpacked.
pub(crate) const MAX_LISTED_PATHS: usize = 1000;
/// Most bytes of paths listed in the answer (long names fill it first).
const MAX_LISTED_BYTES: usize = 1 << 20;
/// Longest entry name, in bytes (`PATH_MAX`): no tool can use a longer
/// path, and each name is walked component by component.
const MAX_ENTRY_NAME_BYTES: usize = 4096;

/// Most path components of one entry: every entry's parents are opened
/// one by one, and real trees are never this deep (`PATH_MAX` is 4096
/// bytes), while a deeper one would cost each entry that much work.
const MAX_ENTRY_DEPTH: usize = 1024;
/// Most bytes of symlink names one archive may make (each is kept until
/// the final check): thousands of links, a few for a real tree.
const MAX_LINK_NAME_BYTES: usize = 16 << 20;
/// Most parent directories an unpacking keeps open.
const OPEN_PARENTS: usize = 64;
/// Bytes copied per read of an entry's data.
const COPY_BUFFER_BYTES: usize = 64 * 1024;

/// Unpacks the archive `reader` into the directory `path` (created with its
/// parents). Blocks.
///
/// # Errors
/// 400 `invalid-archive` (unsafe entry, not a tar), 403, 409
/// `not-a-directory` / `is-a-directory`, 413 past `limits`, 507.
pub(crate) fn unpack(
    scope: &Scope,
    path: &str,
    reader: impl Read,
    limits: Limits,
) -> Result<FsUploadBatchResult, Error> {
    // The scope's user (`--agent-user`) for the whole archive: every
    // directory, file and link is made with that user's credentials, so
    // it is the user's and goes nowhere the user could not. The body is
    // read on this thread too (the caller's bridge blocks on it); that
    // reading touches no path.
    let _acting = scope.act()?;
    let dir = scope.make_dirs(path)?;
    let mut reader = BufReader::with_capacity(256 * 1024, reader);
    let gzip = reader
        .fill_buf()
        .map_err(|error| Error::InvalidRequest(format!("cannot read the archive: {error}")))?
        .starts_with(&[0x1f, 0x8b]);
    let mut unpacker = Unpacker {
        scope,
        dir: &dir,
        parents: HashMap::new(),
        files: HashMap::new(),
        listed_bytes: 0,
        links: Vec::new(),
        link_bytes: 0,
        paths: Vec::new(),
        count: 0,
    };
    let mut budget = Budget::new(limits);
    let unpacked = if gzip {
        archive::for_each_entry(
            flate2::read::MultiGzDecoder::new(reader),
            &mut budget,
            |entry, path| unpacker.entry(entry, &path),
        )
    } else {
        archive::for_each_entry(reader, &mut budget, |entry, path| {
            unpacker.entry(entry, &path)
        })
    };
    // Also after a failure: no link that escapes is left behind.
    let links = unpacker.check_links();
    unpacked?;
    links?;
    Ok(FsUploadBatchResult {
        truncated: unpacker.count > unpacker.paths.len(),
        paths: unpacker.paths,
    })
}

/// One archive being unpacked into `dir`.
struct Unpacker<'a> {
    scope: &'a Scope,
    /// The target directory, opened and checked.
    dir: &'a Dir,
    /// Parents of recent entries (relative path → descriptor), at most
    /// [`OPEN_PARENTS`]: archives list a directory's entries together, or
    /// take turns between a few directories.
    parents: HashMap<PathBuf, OwnedFd>,
    /// Files this archive unpacked (a hash of the relative path → device
    /// and inode), the only targets a hard link may have. Hashed so memory
    /// stays a few bytes an entry whatever the names; a collision cannot
    /// link another file, since the target's inode must match too.
    files: HashMap<u64, (u64, u64)>,
    /// Bytes of `paths` so far, against [`MAX_LISTED_BYTES`].
    listed_bytes: usize,
    /// Symlinks this archive made (relative paths), resolved again at the
    /// end; their names hold at most [`MAX_LINK_NAME_BYTES`].
    links: Vec<PathBuf>,
    /// Bytes of the names in `links`.
    link_bytes: usize,
    /// Real paths for the answer, at most [`MAX_LISTED_PATHS`].
    paths: Vec<String>,
    /// Entries unpacked.
    count: usize,
}

impl Unpacker<'_> {
    /// Unpacks one entry (read and counted by [`archive::for_each_entry`])
    /// at the relative `path`.
    fn entry(&mut self, entry: &mut tar::Entry<'_, impl Read>, path: &Path) -> Result<(), Error> {
        use tar::EntryType;
        if path.as_os_str().len() > MAX_ENTRY_NAME_BYTES {
            return Err(invalid(format!(
                "tar entry {}… has a name over {MAX_ENTRY_NAME_BYTES} bytes",
                path.iter().take(4).collect::<PathBuf>().display()
            )));
        }
        if path.components().count() > MAX_ENTRY_DEPTH {
            return Err(invalid(format!(
                "tar entry {}… is more than {MAX_ENTRY_DEPTH} directories deep",
                path.iter().take(8).collect::<PathBuf>().display()
            )));
        }
        self.dir.recheck(self.scope)?;
        match entry.header().entry_type() {
            EntryType::Regular | EntryType::Continuous => {
                let mode = entry.header().mode().unwrap_or(0o644) & 0o777;
                let mtime = entry.header().mtime().ok();
                self.file(path, entry, mode, mtime)?;
            }
            EntryType::Directory => self.directory(path)?,
            EntryType::Symlink => {
                let target = link_name(entry, path)?;
                check_link_target(path, &target)
                    .map_err(|error| invalid(format!("unsafe tar entry: {error}")))?;
                self.symlink(path, &target)?;
            }
            EntryType::Link => {
                let target = link_name(entry, path)?;
                let target = safe_relative(&target).map_err(|error| {
                    invalid(format!(
                        "unsafe tar entry: hard link {}: {error}",
                        path.display()
                    ))
                })?;
                self.hard_link(path, &target)?;
            }
            // Devices, FIFOs and metadata records are not unpacked; their
            // data (if any) is read past.
            _ => return Ok(()),
        }
        self.count += 1;
        let listed = shown(&self.dir.real.join(path));
        if self.paths.len() < MAX_LISTED_PATHS
            && self.listed_bytes + listed.len() <= MAX_LISTED_BYTES
        {
            self.listed_bytes += listed.len();
            self.paths.push(listed);
        }
        Ok(())
    }

    /// The parent directory of `path`, opened beneath the target directory
    /// one component at a time (created when missing, never through a
    /// symlink), and the entry's name in it.
    fn parent<'p>(&mut self, path: &'p Path) -> Result<(&OwnedFd, &'p OsStr), Error> {
        let name = path
            .file_name()
            .ok_or_else(|| invalid(format!("path {} names nothing", path.display())))?;
        let parent = path.parent().unwrap_or(Path::new(""));
        if !self.parents.contains_key(parent) {
            let fd = open_beneath(self.dir, parent, true)?;
            if self.parents.len() >= OPEN_PARENTS {
                self.parents.clear();
            }
            self.parents.insert(parent.to_owned(), fd);
        }
        match self.parents.get(parent) {
            Some(fd) => Ok((fd, name)),
            None => Err(Error::FsIo(
                "the parent directory was not opened".to_owned(),
            )),
        }
    }

    /// A regular file: whatever was at the name (not a directory) is
    /// unlinked, the file created anew and filled.
    fn file(
        &mut self,
        path: &Path,
        data: &mut impl Read,
        mode: u32,
        mtime: Option<u64>,
    ) -> Result<(), Error> {
        let real = self.dir.real.join(path);
        let (parent, name) = self.parent(path)?;
        make_room(parent, name, &real)?;
        let fd = openat(
            parent,
            name,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(mode),
        )
        .map_err(|errno| write_error(errno.into(), &real))?;
        let mut file = File::from(fd);
        let mut buffer = vec![0; COPY_BUFFER_BYTES];
        loop {
            let read = data.read(&mut buffer).map_err(corrupt)?;
            if read == 0 {
                break;
            }
            file.write_all(&buffer[..read])
                .map_err(|error| write_error(error, &real))?;
        }
        if let Some(mtime) = mtime.and_then(|m| i64::try_from(m).ok()) {
            let omit = nix::sys::time::TimeSpec::UTIME_OMIT;
            let when = nix::sys::time::TimeSpec::new(mtime, 0);
            // A file system without times is no reason to fail the archive.
            let _ = nix::sys::stat::futimens(file.as_fd(), &omit, &when);
        }
        let meta = file.metadata().map_err(|error| write_error(error, &real))?;
        self.files.insert(key(path), (meta.dev(), meta.ino()));
        Ok(())
    }

    /// A directory: created, or already one (a symlink there is refused).
    fn directory(&mut self, path: &Path) -> Result<(), Error> {
        // Opening it beneath the target creates it, and refuses a symlink or
        // a file on the way or at the end.
        let fd = open_beneath(self.dir, path, true)?;
        if self.parents.len() >= OPEN_PARENTS {
            self.parents.clear();
        }
        self.parents.insert(path.to_owned(), fd);
        Ok(())
    }

    /// A symlink (its target already checked lexically).
    fn symlink(&mut self, path: &Path, target: &Path) -> Result<(), Error> {
        let real = self.dir.real.join(path);
        let (parent, name) = self.parent(path)?;
        make_room(parent, name, &real)?;
        symlinkat(target, parent, name).map_err(|errno| write_error(errno.into(), &real))?;
        self.link_bytes += path.as_os_str().len();
        if self.link_bytes > MAX_LINK_NAME_BYTES {
            return Err(Error::ArchiveTooLarge(format!(
                "the archive's symlinks have more than {MAX_LINK_NAME_BYTES} bytes of names"
            )));
        }
        self.links.push(path.to_owned());
        Ok(())
    }

    /// A hard link to `target`, a file this archive unpacked.
    fn hard_link(&mut self, path: &Path, target: &Path) -> Result<(), Error> {
        if path == target {
            return Err(invalid(format!(
                "unsafe tar entry: hard link {} points to itself",
                path.display()
            )));
        }
        let Some(&(dev, ino)) = self.files.get(&key(target)) else {
            return Err(invalid(format!(
                "unsafe tar entry: hard link {} points to {}, which this archive did not unpack \
                 before it",
                path.display(),
                target.display()
            )));
        };
        let target_parent =
            open_beneath(self.dir, target.parent().unwrap_or(Path::new("")), false)?;
        let target_name = target.file_name().unwrap_or_default();
        let same = metadata_at(target_parent.as_fd(), target_name)
            .is_ok_and(|meta| meta.is_file() && meta.dev() == dev && meta.ino() == ino);
        if !same {
            return Err(invalid(format!(
                "hard link {}: {} was replaced while the archive was unpacked",
                path.display(),
                target.display()
            )));
        }
        let real = self.dir.real.join(path);
        let (parent, name) = self.parent(path)?;
        make_room(parent, name, &real)?;
        linkat(&target_parent, target_name, parent, name, AtFlags::empty())
            .map_err(|errno| write_error(errno.into(), &real))?;
        self.files.insert(key(path), (dev, ino));
        Ok(())
    }

    /// Resolves every symlink the archive made, through the target
    /// directory's descriptor, and removes each one that lands outside it
    /// (or nowhere).
    ///
    /// # Errors
    /// 400 `invalid-archive` naming the first such link.
    fn check_links(&self) -> Result<(), Error> {
        let mut first = None;
        let here = self.dir.current();
        for link in &self.links {
            let inside = self
                .dir
                .child(link.as_os_str())
                .canonicalize()
                .is_ok_and(|resolved| resolved.starts_with(&here));
            if inside {
                continue;
            }
            if let Ok(parent) =
                open_beneath(self.dir, link.parent().unwrap_or(Path::new("")), false)
            {
                let _ = unlinkat(
                    &parent,
                    link.file_name().unwrap_or_default(),
                    UnlinkatFlags::NoRemoveDir,
                );
            }
            first.get_or_insert_with(|| {
                invalid(format!(
                    "unsafe archive: symlink {} resolves outside {} (or to nothing); it was removed",
                    link.display(),
                    self.dir.real.display()
                ))
            });
        }
        first.map_or(Ok(()), Err)
    }
}

/// Opens `relative` beneath `dir` one component at a time, never through a
/// symlink; with `create`, missing directories are made.
///
/// # Errors
/// 400 `invalid-archive` for a symlink or a file on the way; as the system's
/// otherwise.
fn open_beneath(dir: &Dir, relative: &Path, create: bool) -> Result<OwnedFd, Error> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mut fd = openat(dir.fd(), ".", flags, Mode::empty())
        .map_err(|errno| Error::from_io(&errno.into(), &dir.real))?;
    let mut walked = PathBuf::new();
    for component in relative.components() {
        let std::path::Component::Normal(name) = component else {
            continue;
        };
        walked.push(name);
        if create {
            match mkdirat(&fd, name, Mode::from_bits_truncate(0o777)) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(errno) => return Err(write_error(errno.into(), &dir.real.join(&walked))),
            }
        }
        fd = openat(&fd, name, flags, Mode::empty()).map_err(|errno| match errno {
            Errno::ELOOP | Errno::ENOTDIR => invalid(format!(
                "{} is a symlink or a file, not a directory; nothing is unpacked through it",
                dir.real.join(&walked).display()
            )),
            other => write_error(other.into(), &dir.real.join(&walked)),
        })?;
    }
    Ok(fd)
}

/// Unlinks what is at `name` in `parent` (a file or a symlink) so an entry
/// can take its place; a directory there is a conflict.
fn make_room(parent: &OwnedFd, name: &OsStr, real: &Path) -> Result<(), Error> {
    match metadata_at(parent.as_fd(), name) {
        Err(error) if error.kind() == ErrorKind::NotFound => Ok(()),
        Err(error) => Err(write_error(error, real)),
        Ok(meta) if meta.is_dir() => Err(Error::FsConflict {
            conflict: FsConflict::IsADirectory,
            detail: format!(
                "{} is a directory; the archive has a non-directory entry there",
                real.display()
            ),
        }),
        Ok(_) => unlinkat(parent, name, UnlinkatFlags::NoRemoveDir)
            .map_err(|errno| write_error(errno.into(), real)),
    }
}

/// The link name of a symlink or hard link entry.
fn link_name(entry: &tar::Entry<'_, impl Read>, path: &Path) -> Result<PathBuf, Error> {
    entry
        .link_name()
        .map_err(|error| invalid(format!("tar link {} unreadable: {error}", path.display())))?
        .map(|target| target.into_owned())
        .ok_or_else(|| invalid(format!("tar link {} has no target", path.display())))
}

/// The key of `path` in [`Unpacker::files`].
fn key(path: &Path) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault};
    BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(path)
}

/// 400 `invalid-archive`.
fn invalid(message: String) -> Error {
    Error::InvalidArchive(message)
}

/// A failure reading the archive (its own corruption, or the body's).
fn corrupt(error: io::Error) -> Error {
    invalid(format!("corrupt tar archive: {error}"))
}

/// A failure writing `real`: disk full is 507, permission 403.
fn write_error(error: io::Error, real: &Path) -> Error {
    let message = format!("cannot unpack {}: {error}", real.display());
    match error.kind() {
        ErrorKind::StorageFull | ErrorKind::QuotaExceeded => Error::InsufficientStorage(message),
        ErrorKind::PermissionDenied => Error::PermissionDenied(message),
        _ => Error::FsIo(message),
    }
}
