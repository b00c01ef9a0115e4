//! Taking an npm prefix back from the agents' user (`--agent-user`;
//! research/contract.md, "Agents under an unprivileged user"): npm runs
//! the packages' install scripts as the user, in a staging folder the user
//! owns while it runs; before the server (root) reads anything in it or
//! moves it into place, every entry becomes the server's and nobody else's
//! to change.
//!
//! The walk goes by file descriptor, each folder made the server's (and
//! closed to writes by others) before it is listed, so once a folder is
//! listed the user can add, remove or swap nothing in it; every entry is
//! opened relative to its folder without following a symlink and changed
//! through that descriptor. A hard link is taken back only when its file
//! is the user's own (the owner of the staging folder when the walk
//! starts): packages make them (opencode's install script links its
//! binary), and one to a file of someone else's would hand that file to
//! the server. Anything else npm does not make (a hard link to another
//! owner's file, a FIFO, a socket, a device) fails the install, as does a
//! tree past [`MAX_ENTRIES`] or [`MAX_DEPTH`].

use nix::fcntl::{AtFlags, OFlag, open, openat};
use nix::sys::stat::{FileStat, Mode, SFlag, fchmod, fstat};
use nix::unistd::{Gid, Uid, fchownat};
use std::ffi::OsStr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

/// Most entries of one install taken back; a larger one fails.
const MAX_ENTRIES: usize = 1_000_000;
/// Deepest folder of an install taken back; a deeper one fails.
const MAX_DEPTH: usize = 256;
/// The permission bits kept: none of set-user-ID, set-group-ID, sticky, or
/// write for group and others.
const KEPT_BITS: u32 = 0o755;

/// Makes the folder `dir` and everything in it the server's (its effective
/// uid and gid), without set-ID bits or write permission for anyone else
/// (module doc).
///
/// # Errors
/// A message naming the entry that could not be taken back, or why the
/// tree was refused.
pub(super) fn reclaim(dir: &Path) -> Result<(), String> {
    let top = open(
        dir,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|errno| format!("cannot open {}: {errno}", dir.display()))?;
    let user = fstat(&top)
        .map_err(|errno| format!("cannot stat {}: {errno}", dir.display()))?
        .st_uid;
    let mut walk = Walk {
        user: Uid::from_raw(user),
        uid: nix::unistd::geteuid(),
        gid: nix::unistd::getegid(),
        left: MAX_ENTRIES,
    };
    walk.folder(&top, dir, 0)
}

/// One walk: whose the tree was (the staging folder's owner), whose it
/// becomes, and how many entries it may still look at.
struct Walk {
    user: Uid,
    uid: Uid,
    gid: Gid,
    left: usize,
}

impl Walk {
    /// Takes back the open folder `dir` (at `path`, for messages), then
    /// everything in it.
    fn folder(&mut self, dir: &OwnedFd, path: &Path, depth: usize) -> Result<(), String> {
        let failed = |what: &str, e: &dyn std::fmt::Display| {
            format!("cannot take back {} ({what}): {e}", path.display())
        };
        // The folder first: from here on only the server may change what is
        // in it.
        self.own(dir).map_err(|e| failed("chown", &e))?;
        let stat = fstat(dir).map_err(|e| failed("stat", &e))?;
        fchmod(dir, Mode::from_bits_truncate(stat.st_mode & KEPT_BITS))
            .map_err(|e| failed("chmod", &e))?;
        // Listed through its `/proc` link: the same folder even if it was
        // moved meanwhile.
        let entries = std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd()))
            .map_err(|e| failed("list", &e))?;
        for entry in entries {
            let name = entry.map_err(|e| failed("list", &e))?.file_name();
            self.left = self.left.checked_sub(1).ok_or_else(|| {
                format!("the install has more than {MAX_ENTRIES} entries; it is not taken back")
            })?;
            self.entry(dir, path, &name, depth)?;
        }
        Ok(())
    }

    /// Takes back the entry `name` of the open folder `dir`.
    fn entry(
        &mut self,
        dir: &OwnedFd,
        path: &Path,
        name: &OsStr,
        depth: usize,
    ) -> Result<(), String> {
        let at = path.join(name);
        let failed = |what: &str, e: &dyn std::fmt::Display| {
            format!("cannot take back {} ({what}): {e}", at.display())
        };
        let fd = openat(
            dir,
            name,
            OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| failed("open", &e))?;
        let stat = fstat(&fd).map_err(|e| failed("stat", &e))?;
        match kind(&stat) {
            SFlag::S_IFDIR => {
                if depth >= MAX_DEPTH {
                    return Err(format!(
                        "the install is more than {MAX_DEPTH} folders deep at {}; it is not taken back",
                        at.display()
                    ));
                }
                let folder = openat(
                    dir,
                    name,
                    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| failed("open", &e))?;
                self.folder(&folder, &at, depth + 1)
            }
            SFlag::S_IFLNK => self.own(&fd).map_err(|e| failed("chown", &e)),
            SFlag::S_IFREG => {
                // Ownership is the inode's: a file the user owns is the
                // user's under every name it has.
                if stat.st_nlink > 1 && Uid::from_raw(stat.st_uid) != self.user {
                    return Err(format!(
                        "{} is a hard link ({} names) to a file of uid {}, not the installing user's; it is not taken back",
                        at.display(),
                        stat.st_nlink,
                        stat.st_uid
                    ));
                }
                self.own(&fd).map_err(|e| failed("chown", &e))?;
                // `fchmod` does not take an `O_PATH` descriptor; its `/proc`
                // link is the same file, whatever its name is now.
                std::fs::set_permissions(
                    format!("/proc/self/fd/{}", fd.as_raw_fd()),
                    std::os::unix::fs::PermissionsExt::from_mode(stat.st_mode & KEPT_BITS),
                )
                .map_err(|e| failed("chmod", &e))
            }
            _ => Err(format!(
                "{} is not a file, a folder or a symlink; npm makes none",
                at.display()
            )),
        }
    }

    /// Makes the entry `fd` is (not followed) the server's.
    fn own(&self, fd: &OwnedFd) -> nix::Result<()> {
        fchownat(
            fd,
            "",
            Some(self.uid),
            Some(self.gid),
            AtFlags::AT_EMPTY_PATH | AtFlags::AT_SYMLINK_NOFOLLOW,
        )
    }
}

/// The file type bits of `stat`.
fn kind(stat: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn temp(label: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("reclaim-{label}-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        dir
    }

    #[test]
    fn write_and_set_id_bits_are_dropped_and_links_are_not_followed() {
        let dir = temp("bits");
        std::fs::create_dir(dir.join("sub")).expect("mkdir");
        std::fs::write(dir.join("sub/file"), "x").expect("write");
        std::fs::set_permissions(
            dir.join("sub/file"),
            std::fs::Permissions::from_mode(0o6777),
        )
        .expect("chmod");
        std::fs::set_permissions(dir.join("sub"), std::fs::Permissions::from_mode(0o777))
            .expect("chmod");
        let outside = temp("outside");
        std::fs::write(outside.join("target"), "y").expect("write");
        std::fs::set_permissions(
            outside.join("target"),
            std::fs::Permissions::from_mode(0o666),
        )
        .expect("chmod");
        std::os::unix::fs::symlink(outside.join("target"), dir.join("link")).expect("symlink");
        reclaim(&dir).expect("reclaim");
        let mode = |path: &Path| std::fs::symlink_metadata(path).expect("lstat").mode() & 0o7777;
        assert_eq!(mode(&dir.join("sub")), 0o755);
        assert_eq!(mode(&dir.join("sub/file")), 0o755);
        assert_eq!(mode(&outside.join("target")), 0o666, "not followed");
        let me = nix::unistd::geteuid().as_raw();
        assert_eq!(
            std::fs::symlink_metadata(dir.join("link"))
                .expect("lstat")
                .uid(),
            me
        );
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_dir_all(&outside);
    }

    #[test]
    fn hard_links_to_others_files_and_fifos_fail_the_install() {
        let dir = temp("links");
        std::fs::write(dir.join("a"), "x").expect("write");
        std::fs::hard_link(dir.join("a"), dir.join("b")).expect("link");
        // The folder's owner's own file under two names (a package's
        // install script's link): taken back.
        reclaim(&dir).expect("a link to the user's own file");
        // A file of another owner's (only root can make one here): refused,
        // and not handed over.
        if nix::unistd::geteuid().is_root() {
            let other = 4242;
            std::fs::write(dir.join("c"), "y").expect("write");
            std::os::unix::fs::chown(dir.join("c"), Some(other), None).expect("chown");
            std::fs::hard_link(dir.join("c"), dir.join("d")).expect("link");
            let error = reclaim(&dir).expect_err("a hard link to another's file");
            assert!(error.contains("hard link"), "{error}");
            assert_eq!(
                std::fs::symlink_metadata(dir.join("c"))
                    .expect("lstat")
                    .uid(),
                other
            );
            std::fs::remove_file(dir.join("c")).expect("unlink");
            std::fs::remove_file(dir.join("d")).expect("unlink");
        }
        nix::unistd::mkfifo(&dir.join("fifo"), Mode::from_bits_truncate(0o644)).expect("mkfifo");
        let error = reclaim(&dir).expect_err("a FIFO");
        assert!(error.contains("not a file"), "{error}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
