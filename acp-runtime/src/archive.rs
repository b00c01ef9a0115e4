//! Unpacking a downloaded release archive into an install folder, safely,
//! and the tar reader the file system API's upload-batch shares
//! ([`for_each_entry`]).
//!
//! The rules, for tar and zip alike: every entry path is relative and has no
//! `..` (an absolute or escaping path fails the whole archive rather than being
//! skipped); a symlink must be relative and stay inside the folder; nothing is
//! written through a symlink or into a parent that resolves outside the folder;
//! device files and FIFOs are skipped. After unpacking, every symlink in the
//! folder is resolved once more and must land inside it. Formats follow the
//! registry's list (`.tar.gz`, `.tgz`, `.zip`, or a bare executable), plus
//! plain `.tar`; `.tar.bz2` and `.tar.xz` are refused with a clear message.
//! An archive is untrusted: [`Limits`] caps what it may unpack to (total bytes
//! and entry count), so a decompression bomb fails instead of filling the disk.

use crate::error::Error;
use flate2::read::GzDecoder;
use std::cell::Cell;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::{Component, Path, PathBuf};
use std::rc::Rc;

/// Largest tar header record (GNU long name or long link, PAX extended
/// header) accepted, in bytes. The `tar` crate reads these whole into memory
/// before it yields the entry they describe, so without a bound a small
/// compressed archive could claim gigabytes of memory. Real ones are a few
/// hundred bytes.
const MAX_TAR_RECORD_BYTES: u64 = 1 << 20;
/// Tar header block and padding slack added to every read allowance.
const TAR_BLOCK_SLACK: u64 = 2048;

/// How an archive is packed, judged by the URL's path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `.tar.gz` / `.tgz`.
    TarGz,
    /// `.tar`.
    Tar,
    /// `.zip`.
    Zip,
    /// Anything else: the download is the executable itself.
    Bare,
}

/// Caps on what one archive may unpack to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Total bytes of file content, summed over every entry.
    pub max_bytes: u64,
    /// Number of entries (files, folders and links).
    pub max_entries: usize,
}

impl Limits {
    /// What an agent release plausibly needs, with room to spare: 4 GiB and
    /// 200,000 entries (the largest ACP agent archives today are a few hundred
    /// MiB with a few thousand entries).
    pub const DEFAULT: Limits = Limits {
        max_bytes: 4 << 30,
        max_entries: 200_000,
    };
}

/// Counts what an archive unpacks against its [`Limits`].
pub(crate) struct Budget {
    limits: Limits,
    bytes: u64,
    entries: usize,
}

impl Budget {
    /// Nothing counted yet.
    pub(crate) fn new(limits: Limits) -> Self {
        Self {
            limits,
            bytes: 0,
            entries: 0,
        }
    }

    /// Counts one entry of `size` bytes.
    ///
    /// # Errors
    /// A message when past either cap.
    pub(crate) fn take(&mut self, size: u64) -> Result<(), String> {
        self.entries += 1;
        if self.entries > self.limits.max_entries {
            return Err(format!(
                "the archive has more than {} entries",
                self.limits.max_entries
            ));
        }
        self.take_bytes(size)
    }

    /// Counts `size` more bytes of the current entry.
    fn take_bytes(&mut self, size: u64) -> Result<(), String> {
        self.bytes = self.bytes.saturating_add(size);
        if self.bytes > self.limits.max_bytes {
            return Err(format!(
                "the archive unpacks to more than {} bytes",
                self.limits.max_bytes
            ));
        }
        Ok(())
    }

    /// Bytes still allowed.
    fn remaining(&self) -> u64 {
        self.limits.max_bytes - self.bytes
    }
}

/// The format of the archive at `url_path` (a URL's path, without query).
///
/// # Errors
/// For compressions this runtime does not unpack (`.tar.bz2`, `.tbz2`,
/// `.tar.xz`, `.txz`, `.tar.zst`) and installer formats (`.dmg`, `.pkg`,
/// `.deb`, `.rpm`, `.msi`).
pub fn format_of(url_path: &str) -> Result<Format, String> {
    let lower = url_path.to_ascii_lowercase();
    let ends = |suffixes: &[&str]| suffixes.iter().any(|s| lower.ends_with(s));
    if ends(&[".tar.gz", ".tgz"]) {
        Ok(Format::TarGz)
    } else if ends(&[".tar"]) {
        Ok(Format::Tar)
    } else if ends(&[".zip"]) {
        Ok(Format::Zip)
    } else if ends(&[
        ".tar.bz2",
        ".tbz2",
        ".tar.xz",
        ".txz",
        ".tar.zst",
        ".dmg",
        ".pkg",
        ".deb",
        ".rpm",
        ".msi",
        ".appimage",
    ]) {
        Err(format!(
            "archive format of {url_path:?} is not supported (use .tar.gz, .tgz, .tar, .zip or a bare executable)"
        ))
    } else {
        Ok(Format::Bare)
    }
}

/// Unpacks `archive` (of `format`) into the existing, empty folder `dest`. A
/// [`Format::Bare`] download is copied to `dest/<bare_name>`.
///
/// # Errors
/// A message naming the offending entry: unsafe path or link, a corrupt or
/// truncated archive, more than `limits` allow, an I/O failure. What was
/// unpacked before the error stays in `dest`; the caller discards the folder.
pub fn unpack(
    format: Format,
    archive: &Path,
    dest: &Path,
    bare_name: &Path,
    limits: Limits,
) -> Result<(), String> {
    let open = || File::open(archive).map_err(|e| format!("cannot open the download: {e}"));
    let mut budget = Budget::new(limits);
    match format {
        Format::TarGz => unpack_tar(
            GzDecoder::new(BufReader::new(open()?)),
            dest,
            &mut budget,
            |_, _| {},
        )
        .map_err(|refused| refused.message)?,
        Format::Tar => unpack_tar(BufReader::new(open()?), dest, &mut budget, |_, _| {})
            .map_err(|refused| refused.message)?,
        Format::Zip => unpack_zip(open()?, dest, &mut budget)?,
        Format::Bare => {
            let target = dest.join(bare_name);
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
            }
            std::fs::copy(archive, &target)
                .map_err(|e| format!("cannot copy the download into place: {e}"))?;
        }
    }
    check_symlinks_inside(dest)
}

/// A relative path with no `..`, no root and no prefix, with `.` parts removed.
///
/// # Errors
/// When `path` is absolute or climbs out with `..`.
pub fn safe_relative(path: &Path) -> Result<PathBuf, String> {
    let mut clean = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => clean.push(part),
            Component::CurDir => {}
            Component::ParentDir => {
                return Err(format!("path {} climbs out with ..", path.display()));
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(format!("path {} is absolute", path.display()));
            }
        }
    }
    if clean.as_os_str().is_empty() {
        return Err(format!(
            "path {:?} names nothing",
            path.display().to_string()
        ));
    }
    Ok(clean)
}

/// Checks that a symlink at `entry` (relative to the folder) pointing at
/// `target` stays inside the folder when read lexically.
///
/// # Errors
/// A message naming the link when its target is absolute or climbs out.
pub(crate) fn check_link_target(entry: &Path, target: &Path) -> Result<(), String> {
    if target.is_absolute() {
        return Err(format!(
            "symlink {} points to the absolute path {}",
            entry.display(),
            target.display()
        ));
    }
    let mut depth = entry.components().count().saturating_sub(1);
    for component in target.components() {
        match component {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir => {
                depth = depth.checked_sub(1).ok_or_else(|| {
                    format!(
                        "symlink {} points outside the install folder ({})",
                        entry.display(),
                        target.display()
                    )
                })?;
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(format!(
                    "symlink {} has an absolute target",
                    entry.display()
                ));
            }
        }
    }
    Ok(())
}

/// A reader that fails once it has read more than its allowance, which the
/// unpack loop sets before each step: header records may take
/// [`MAX_TAR_RECORD_BYTES`], an entry's data its own (budgeted) size.
pub(crate) struct Allowance<R> {
    inner: R,
    left: Rc<Cell<u64>>,
}

impl<R> Allowance<R> {
    /// `inner`, read no further than `left` allows at each read.
    fn new(inner: R, left: Rc<Cell<u64>>) -> Self {
        Self { inner, left }
    }
}

impl<R: Read> Read for Allowance<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.left.get();
        if left == 0 && !buf.is_empty() {
            return Err(io::Error::other(format!(
                "a tar header record (GNU long name or PAX) is over {MAX_TAR_RECORD_BYTES} bytes"
            )));
        }
        let most = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let read = self.inner.read(&mut buf[..most])?;
        self.left.set(left - read as u64);
        Ok(read)
    }
}

/// Why unpacking a tar archive stopped.
#[derive(Debug)]
pub struct Refused {
    /// What kind of failure it is.
    pub kind: RefusedKind,
    /// A message naming the offending entry.
    pub message: String,
}

/// The kinds of [`Refused`], for callers that answer each differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusedKind {
    /// Past [`Limits`] (bytes or entries).
    Limit,
    /// An unsafe entry, or not a readable tar.
    Unsafe,
    /// Writing to the folder failed (disk full, permission denied, …).
    Io(io::ErrorKind),
}

impl Refused {
    fn limit(message: String) -> Self {
        Self {
            kind: RefusedKind::Limit,
            message,
        }
    }

    fn unsafe_entry(message: String) -> Self {
        Self {
            kind: RefusedKind::Unsafe,
            message,
        }
    }
}

/// An archive the unpacker refused: over its caps is 413
/// `payload-too-large`, unsafe or unreadable 400 `invalid-archive`, a disk
/// full 507, a permission 403, any other write failure 500.
impl From<Refused> for Error {
    fn from(refused: Refused) -> Self {
        use std::io::ErrorKind;
        match refused.kind {
            RefusedKind::Limit => Self::ArchiveTooLarge(refused.message),
            RefusedKind::Unsafe => Self::InvalidArchive(refused.message),
            RefusedKind::Io(ErrorKind::StorageFull | ErrorKind::QuotaExceeded) => {
                Self::InsufficientStorage(refused.message)
            }
            RefusedKind::Io(ErrorKind::PermissionDenied) => Self::PermissionDenied(refused.message),
            RefusedKind::Io(_) => Self::FsIo(refused.message),
        }
    }
}

/// Reads the tar stream `reader` entry by entry with the rules every
/// unpacker here shares and hands each entry, with its safe relative path,
/// to `each`: header records bounded by [`MAX_TAR_RECORD_BYTES`], an entry's
/// data by its own size, counted against `budget`; the `./` entry that
/// `tar -C dir -c .` writes first is skipped. What `each` leaves unread of
/// an entry is read past. Used by agent installs and by the file system
/// API's upload-batch (`crate::fs::batch`).
///
/// # Errors
/// [`Refused`] (as `E`): not a readable tar, a corrupt one, an unsafe
/// path, past `budget`; or `each`'s own error.
pub(crate) fn for_each_entry<R: Read, E: From<Refused>>(
    reader: R,
    budget: &mut Budget,
    mut each: impl FnMut(&mut tar::Entry<'_, Allowance<R>>, PathBuf) -> Result<(), E>,
) -> Result<(), E> {
    let corrupt = |e: io::Error| Refused::unsafe_entry(format!("corrupt tar archive: {e}"));
    let left = Rc::new(Cell::new(0));
    let mut archive = tar::Archive::new(Allowance::new(reader, left.clone()));
    let mut entries = archive
        .entries()
        .map_err(|e| Refused::unsafe_entry(format!("not a readable tar archive: {e}")))?;
    loop {
        // Room for the next header, its records and the end-of-archive blocks.
        left.set(MAX_TAR_RECORD_BYTES + TAR_BLOCK_SLACK);
        let Some(entry) = entries.next() else {
            return Ok(());
        };
        let mut entry = entry.map_err(corrupt)?;
        let raw_path = entry
            .path()
            .map_err(|e| Refused::unsafe_entry(format!("tar entry with an unreadable path: {e}")))?
            .into_owned();
        // `./`, which `tar -C dir -c .` writes first: the folder itself.
        if entry.header().entry_type() == tar::EntryType::Directory
            && raw_path.components().all(|c| c == Component::CurDir)
        {
            budget.take(0).map_err(Refused::limit)?;
            continue;
        }
        let path = safe_relative(&raw_path)
            .map_err(|e| Refused::unsafe_entry(format!("unsafe tar entry: {e}")))?;
        // `size()` is what follows in the archive: the header's size, or a
        // PAX `size` record's.
        budget.take(entry.size()).map_err(Refused::limit)?;
        left.set(entry.size().saturating_add(TAR_BLOCK_SLACK));
        each(&mut entry, path)?;
        // Data `each` did not read (devices, links, directories), within the
        // allowance.
        io::copy(&mut entry, &mut io::sink()).map_err(corrupt)?;
    }
}

/// Unpacks a tar stream into the private folder `dest` with the tar crate
/// (`unpack_in`, which checks every parent it writes into), calling
/// `on_entry` with each unpacked path and whether it is a symlink.
fn unpack_tar(
    reader: impl Read,
    dest: &Path,
    budget: &mut Budget,
    mut on_entry: impl FnMut(&Path, bool),
) -> Result<(), Refused> {
    use tar::EntryType;
    for_each_entry(reader, budget, |entry, path| {
        let kind = entry.header().entry_type();
        match kind {
            EntryType::Regular | EntryType::Continuous | EntryType::Directory => {}
            EntryType::Symlink => {
                let target = entry
                    .link_name()
                    .map_err(|e| {
                        Refused::unsafe_entry(format!(
                            "tar symlink {} unreadable: {e}",
                            path.display()
                        ))
                    })?
                    .ok_or_else(|| {
                        Refused::unsafe_entry(format!(
                            "tar symlink {} has no target",
                            path.display()
                        ))
                    })?;
                check_link_target(&path, &target)
                    .map_err(|e| Refused::unsafe_entry(format!("unsafe tar entry: {e}")))?;
            }
            EntryType::Link => {
                let target = entry
                    .link_name()
                    .map_err(|e| {
                        Refused::unsafe_entry(format!(
                            "tar hard link {} unreadable: {e}",
                            path.display()
                        ))
                    })?
                    .ok_or_else(|| {
                        Refused::unsafe_entry(format!(
                            "tar hard link {} has no target",
                            path.display()
                        ))
                    })?;
                safe_relative(&target).map_err(|e| {
                    Refused::unsafe_entry(format!(
                        "unsafe tar entry: hard link {}: {e}",
                        path.display()
                    ))
                })?;
            }
            // Devices, FIFOs, and metadata records are not part of an agent;
            // their data (if any) is read past.
            _ => return Ok(()),
        }
        let unpacked = entry.unpack_in(dest).map_err(|e| {
            // The tar crate reports its own path checks as `Other`.
            let kind = match e.kind() {
                io::ErrorKind::Other | io::ErrorKind::InvalidData => RefusedKind::Unsafe,
                other => RefusedKind::Io(other),
            };
            Refused {
                kind,
                message: format!("cannot unpack {}: {e}", path.display()),
            }
        })?;
        if !unpacked {
            return Err(Refused::unsafe_entry(format!(
                "unsafe tar entry {} was refused",
                path.display()
            )));
        }
        on_entry(&path, kind == EntryType::Symlink);
        Ok(())
    })
}

fn unpack_zip(file: File, dest: &Path, budget: &mut Budget) -> Result<(), String> {
    let mut archive = zip::ZipArchive::new(BufReader::new(file))
        .map_err(|e| format!("not a readable zip archive: {e}"))?;
    let root = dest
        .canonicalize()
        .map_err(|e| format!("cannot resolve {}: {e}", dest.display()))?;
    for index in 0..archive.len() {
        let mut entry = archive
            .by_index(index)
            .map_err(|e| format!("corrupt zip archive: {e}"))?;
        let path =
            safe_relative(Path::new(entry.name())).map_err(|e| format!("unsafe zip entry: {e}"))?;
        // The declared size can lie; the copy below is capped independently.
        budget.take(0)?;
        let target = root.join(&path);
        if entry.is_dir() {
            create_dir_inside(&root, &target)?;
            continue;
        }
        let parent = target.parent().unwrap_or(&root);
        create_dir_inside(&root, parent)?;
        // Never write through something already there (a symlink above all).
        if target.symlink_metadata().is_ok() {
            std::fs::remove_file(&target)
                .map_err(|e| format!("cannot replace {}: {e}", path.display()))?;
        }
        if entry.is_symlink() {
            let mut link = String::new();
            entry
                .by_ref()
                .take(4096)
                .read_to_string(&mut link)
                .map_err(|e| format!("zip symlink {} unreadable: {e}", path.display()))?;
            check_link_target(&path, Path::new(&link))
                .map_err(|e| format!("unsafe zip entry: {e}"))?;
            std::os::unix::fs::symlink(&link, &target)
                .map_err(|e| format!("cannot create symlink {}: {e}", path.display()))?;
            continue;
        }
        let mut out =
            File::create(&target).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        let allowed = budget.remaining();
        let written = io::copy(
            &mut entry.by_ref().take(allowed.saturating_add(1)),
            &mut out,
        )
        .map_err(|e| format!("cannot unpack {}: {e}", path.display()))?;
        budget.take_bytes(written)?;
        if let Some(mode) = entry.unix_mode() {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&target, std::fs::Permissions::from_mode(mode & 0o777))
                .map_err(|e| format!("cannot set the mode of {}: {e}", path.display()))?;
        }
    }
    Ok(())
}

/// Creates `dir` (under `root`, canonical) and checks it resolves inside `root`.
fn create_dir_inside(root: &Path, dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let resolved = dir
        .canonicalize()
        .map_err(|e| format!("cannot resolve {}: {e}", dir.display()))?;
    if resolved.starts_with(root) {
        Ok(())
    } else {
        Err(format!(
            "unsafe archive: {} resolves outside the install folder",
            dir.display()
        ))
    }
}

/// The symlink at `path` must resolve to something inside `root` (canonical);
/// `shown` names it in the message.
fn check_link_inside(
    root: &Path,
    path: &Path,
    shown: &impl std::fmt::Display,
) -> Result<(), String> {
    match path.canonicalize() {
        Ok(resolved) if resolved.starts_with(root) => Ok(()),
        Ok(_) => Err(format!(
            "unsafe archive: symlink {shown} resolves outside the install folder"
        )),
        Err(_) => Err(format!(
            "unsafe archive: symlink {shown} points to nothing inside the install folder"
        )),
    }
}

/// Every symlink under `dest` must resolve to something inside `dest`.
fn check_symlinks_inside(dest: &Path) -> Result<(), String> {
    let root = dest
        .canonicalize()
        .map_err(|e| format!("cannot resolve {}: {e}", dest.display()))?;
    let mut pending = vec![root.clone()];
    while let Some(dir) = pending.pop() {
        let entries =
            std::fs::read_dir(&dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
        for entry in entries {
            let entry = entry.map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
            let path = entry.path();
            let kind = entry
                .file_type()
                .map_err(|e| format!("cannot inspect {}: {e}", path.display()))?;
            let shown = path.strip_prefix(&root).unwrap_or(&path).display();
            if kind.is_symlink() {
                check_link_inside(&root, &path, &shown)?;
            } else if kind.is_dir() {
                pending.push(path);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    struct TempDir(PathBuf);
    impl TempDir {
        fn new() -> Self {
            let path = std::env::temp_dir().join(format!("archive-test-{}", uuid::Uuid::new_v4()));
            std::fs::create_dir_all(path.join("dest")).expect("temp dir");
            Self(path)
        }
        fn dest(&self) -> PathBuf {
            self.0.join("dest")
        }
    }
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A tar entry with raw header fields, so unsafe paths can be written.
    fn raw_entry(
        builder: &mut tar::Builder<Vec<u8>>,
        kind: tar::EntryType,
        path: &str,
        link: Option<&str>,
        data: &[u8],
    ) {
        let mut header = tar::Header::new_gnu();
        let name = &mut header.as_old_mut().name;
        name[..path.len()].copy_from_slice(path.as_bytes());
        if let Some(link) = link {
            let linkname = &mut header.as_old_mut().linkname;
            linkname[..link.len()].copy_from_slice(link.as_bytes());
        }
        header.set_entry_type(kind);
        header.set_mode(0o755);
        header.set_size(data.len() as u64);
        header.set_cksum();
        builder.append(&header, data).expect("append");
    }

    fn tar_gz(dir: &TempDir, build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> PathBuf {
        let mut builder = tar::Builder::new(Vec::new());
        build(&mut builder);
        let tar = builder.into_inner().expect("tar bytes");
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&tar).expect("gzip");
        let path = dir.0.join("a.tar.gz");
        std::fs::write(&path, gz.finish().expect("gzip")).expect("write archive");
        path
    }

    fn unpack_tar_gz(dir: &TempDir, archive: &Path) -> Result<(), String> {
        unpack(
            Format::TarGz,
            archive,
            &dir.dest(),
            Path::new("x"),
            Limits::DEFAULT,
        )
    }

    #[test]
    fn formats_follow_the_url() {
        assert_eq!(format_of("/r/agent-linux.tar.gz"), Ok(Format::TarGz));
        assert_eq!(format_of("/r/agent.TGZ"), Ok(Format::TarGz));
        assert_eq!(format_of("/r/agent.zip"), Ok(Format::Zip));
        assert_eq!(format_of("/r/agent.tar"), Ok(Format::Tar));
        assert_eq!(format_of("/r/agent"), Ok(Format::Bare));
        assert!(format_of("/r/agent.tar.bz2").is_err());
        assert!(format_of("/r/agent.dmg").is_err());
    }

    #[test]
    fn a_good_tar_gz_unpacks_with_its_links_and_modes() {
        let dir = TempDir::new();
        let archive = tar_gz(&dir, |b| {
            raw_entry(b, tar::EntryType::Directory, "pkg/", None, b"");
            raw_entry(
                b,
                tar::EntryType::Regular,
                "pkg/bin/agent",
                None,
                b"#!/bin/sh\n",
            );
            raw_entry(
                b,
                tar::EntryType::Symlink,
                "pkg/run",
                Some("bin/agent"),
                b"",
            );
            raw_entry(
                b,
                tar::EntryType::Symlink,
                "pkg/bin/up",
                Some("../run"),
                b"",
            );
        });
        unpack_tar_gz(&dir, &archive).expect("unpack");
        let agent = dir.dest().join("pkg/bin/agent");
        assert_eq!(std::fs::read(&agent).expect("agent"), b"#!/bin/sh\n");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&agent)
            .expect("meta")
            .permissions()
            .mode();
        assert_ne!(mode & 0o100, 0, "mode {mode:o}");
        assert_eq!(
            std::fs::read(dir.dest().join("pkg/bin/up")).expect("link"),
            b"#!/bin/sh\n"
        );
    }

    #[test]
    fn unsafe_tar_entries_fail_the_archive() {
        let cases: [(tar::EntryType, &str, Option<&str>, &str); 5] = [
            (tar::EntryType::Regular, "../evil", None, "climbs out"),
            (tar::EntryType::Regular, "/etc/evil", None, "absolute"),
            (tar::EntryType::Symlink, "link", Some("/etc"), "absolute"),
            (
                tar::EntryType::Symlink,
                "a/link",
                Some("../../etc"),
                "outside",
            ),
            (
                tar::EntryType::Link,
                "hard",
                Some("../etc/passwd"),
                "climbs out",
            ),
        ];
        for (kind, path, link, needle) in cases {
            let dir = TempDir::new();
            let archive = tar_gz(&dir, |b| raw_entry(b, kind, path, link, b"x"));
            let error = unpack_tar_gz(&dir, &archive).expect_err(path);
            assert!(error.contains(needle), "{path}: {error}");
            assert!(!dir.0.join("evil").exists());
        }
    }

    #[test]
    fn a_symlink_that_escapes_through_another_symlink_is_caught() {
        let dir = TempDir::new();
        // `up` is `.`, so `x/..`-style resolution through it would leave the folder.
        let archive = tar_gz(&dir, |b| {
            raw_entry(b, tar::EntryType::Symlink, "up", Some("."), b"");
            raw_entry(b, tar::EntryType::Symlink, "escape", Some("up/.."), b"");
        });
        let error = unpack_tar_gz(&dir, &archive).expect_err("escape");
        assert!(error.contains("escape"), "{error}");
    }

    #[test]
    fn garbage_is_not_a_tar_gz() {
        let dir = TempDir::new();
        let archive = dir.0.join("bad.tar.gz");
        std::fs::write(&archive, b"this is not an archive").expect("write");
        let error = unpack_tar_gz(&dir, &archive).expect_err("garbage");
        assert!(error.contains("tar"), "{error}");
    }

    fn zip_with(dir: &TempDir, build: impl FnOnce(&mut zip::ZipWriter<std::fs::File>)) -> PathBuf {
        let path = dir.0.join("a.zip");
        let file = std::fs::File::create(&path).expect("zip file");
        let mut writer = zip::ZipWriter::new(file);
        build(&mut writer);
        writer.finish().expect("finish zip");
        path
    }

    #[test]
    fn zip_archives_unpack_and_refuse_escapes() {
        let options = || {
            zip::write::SimpleFileOptions::default()
                .compression_method(zip::CompressionMethod::Stored)
                .unix_permissions(0o755)
        };
        let dir = TempDir::new();
        let archive = zip_with(&dir, |w| {
            w.start_file("bin/agent", options()).expect("file");
            w.write_all(b"agent").expect("data");
            w.add_symlink("agent-link", "bin/agent", options())
                .expect("link");
        });
        unpack(
            Format::Zip,
            &archive,
            &dir.dest(),
            Path::new("x"),
            Limits::DEFAULT,
        )
        .expect("unpack zip");
        assert_eq!(
            std::fs::read(dir.dest().join("agent-link")).expect("link"),
            b"agent"
        );

        let dir = TempDir::new();
        let archive = zip_with(&dir, |w| {
            w.add_symlink("escape", "../../etc", options())
                .expect("link");
        });
        let error = unpack(
            Format::Zip,
            &archive,
            &dir.dest(),
            Path::new("x"),
            Limits::DEFAULT,
        )
        .expect_err("escape");
        assert!(error.contains("outside"), "{error}");
    }

    #[test]
    fn archives_that_unpack_past_the_limits_fail() {
        let small = Limits {
            max_bytes: 1000,
            max_entries: 3,
        };
        // A compressed bomb: 4 KB of zeros gzip to a few dozen bytes.
        let dir = TempDir::new();
        let archive = tar_gz(&dir, |b| {
            raw_entry(b, tar::EntryType::Regular, "zeros", None, &[0; 4096]);
        });
        let error =
            unpack(Format::TarGz, &archive, &dir.dest(), Path::new("x"), small).expect_err("bomb");
        assert!(error.contains("more than 1000 bytes"), "{error}");
        assert!(!dir.dest().join("zeros").exists());

        let dir = TempDir::new();
        let archive = tar_gz(&dir, |b| {
            for name in ["a", "b", "c", "d"] {
                raw_entry(b, tar::EntryType::Regular, name, None, b"x");
            }
        });
        let error = unpack(Format::TarGz, &archive, &dir.dest(), Path::new("x"), small)
            .expect_err("entries");
        assert!(error.contains("more than 3 entries"), "{error}");

        let dir = TempDir::new();
        let archive = zip_with(&dir, |w| {
            let options = zip::write::SimpleFileOptions::default()
                .compression_method(zip::CompressionMethod::Deflated);
            w.start_file("zeros", options).expect("file");
            w.write_all(&[0; 4096]).expect("data");
        });
        let error = unpack(Format::Zip, &archive, &dir.dest(), Path::new("x"), small)
            .expect_err("zip bomb");
        assert!(error.contains("more than 1000 bytes"), "{error}");
        let written = std::fs::metadata(dir.dest().join("zeros")).map_or(0, |m| m.len());
        assert!(written <= 1001, "wrote {written} bytes");

        // A PAX `size` record larger than the header's size is what counts.
        let dir = TempDir::new();
        let mut builder = tar::Builder::new(Vec::new());
        raw_entry(
            &mut builder,
            tar::EntryType::XHeader,
            "pax",
            None,
            b"15 size=100000\n",
        );
        raw_entry(&mut builder, tar::EntryType::Regular, "big", None, b"");
        let tar = builder.get_mut();
        tar.extend_from_slice(&[b'x'; 100_000]);
        tar.resize(tar.len().next_multiple_of(512), 0);
        let archive = dir.0.join("pax.tar");
        std::fs::write(&archive, builder.into_inner().expect("tar")).expect("write");
        let error =
            unpack(Format::Tar, &archive, &dir.dest(), Path::new("x"), small).expect_err("pax");
        assert!(error.contains("more than 1000 bytes"), "{error}");
        assert!(!dir.dest().join("big").exists());

        // A long-name record is not read into memory past its bound.
        let dir = TempDir::new();
        let archive = tar_gz(&dir, |b| {
            let name = vec![b'a'; (MAX_TAR_RECORD_BYTES as usize) * 2];
            raw_entry(b, tar::EntryType::GNULongName, "././@LongLink", None, &name);
            raw_entry(b, tar::EntryType::Regular, "short", None, b"x");
        });
        let error = unpack(
            Format::TarGz,
            &archive,
            &dir.dest(),
            Path::new("x"),
            Limits::DEFAULT,
        )
        .expect_err("long name");
        assert!(error.contains("header record"), "{error}");

        // Within the limits, the same shapes unpack.
        let dir = TempDir::new();
        let archive = tar_gz(&dir, |b| {
            raw_entry(b, tar::EntryType::Regular, "zeros", None, &[0; 1000]);
        });
        unpack(Format::TarGz, &archive, &dir.dest(), Path::new("x"), small).expect("fits");

        // Long names (GNU long-name records, as `tar::Builder` writes them
        // past 100 bytes) still unpack.
        let dir = TempDir::new();
        let long = format!("{}/agent", "deep".repeat(40));
        let archive = tar_gz(&dir, |b| {
            let mut header = tar::Header::new_gnu();
            header.set_size(2);
            header.set_mode(0o644);
            b.append_data(&mut header, &long, &b"hi"[..])
                .expect("long name");
        });
        unpack(Format::TarGz, &archive, &dir.dest(), Path::new("x"), small).expect("long name");
        assert_eq!(std::fs::read(dir.dest().join(&long)).expect("file"), b"hi");
    }

    #[test]
    fn a_bare_download_is_the_program() {
        let dir = TempDir::new();
        let archive = dir.0.join("download");
        std::fs::write(&archive, b"#!/bin/sh\n").expect("write");
        unpack(
            Format::Bare,
            &archive,
            &dir.dest(),
            Path::new("bin/agent"),
            Limits::DEFAULT,
        )
        .expect("bare");
        assert!(dir.dest().join("bin/agent").is_file());
    }
}
