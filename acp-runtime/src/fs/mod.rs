//! The host file system API (research/contract.md, "Host file system"): one
//! implementation behind both surfaces, the `_sandboxagent/fs/*` methods
//! (`crate::runtime`'s ext methods) and the `/v2/fs/*` routes (`crate::http::fs`).
//!
//! - this file: [`Scope`], path resolution and `--fs-root` confinement.
//! - `ops`: list, stat, mkdir, move, delete.
//! - `transfer`: streaming file reads and writes (temp file, fsync, rename).
//! - `batch`: upload-batch, a tar stream unpacked entry by entry through
//!   directory descriptors.
//!
//! Path rules: absolute paths are taken as given; relative ones start at the
//! named session's `cwd`, else the server's working directory, and may not
//! contain `..`. With `--fs-root`, every path must resolve, symlinks
//! followed, inside the root; a path outside is 403 whether or not anything
//! is there, and the 403 names the path as the client gave it, never where
//! it resolved.
//!
//! Resolution under a root: the path must start with the root, and the rest
//! is walked from the root's descriptor one component at a time
//! ([`Scope::beneath`]): each directory opened `O_DIRECTORY | O_NOFOLLOW`
//! from the last, each symlink read with `readlinkat` and its text walked in
//! turn (an absolute text must name the root, a `..` above the root is 403
//! at once). Nothing outside the root is ever looked at, so no answer can
//! depend on what exists there. Without a root, paths are resolved with
//! `realpath` and the directory is then opened one component at a time
//! from `/` the same way.
//!
//! Check and use: every opened directory's own path (`/proc/self/fd/N`) is
//! checked against the root, and every operation goes through that
//! descriptor (`openat`, `mkdirat`, `unlinkat`, `renameat2`, `linkat`,
//! `symlinkat` on one final name, never followed), so nothing re-resolves a
//! path string after the check. A symlink is never trusted for where it
//! pointed when it was made (a later move can re-aim it): it is resolved,
//! and checked, again on every use.
//!
//! What this does not defend against: a process with write access both inside
//! and outside the root can move an opened directory out between the check
//! and the use, or plant a hard link to an outside file (which cannot be told
//! from any multiply-linked file); research/decisions.md.
//!
//! Under `--agent-user`, both the agents' `fs/*` requests and the host file
//! system API act as that user ([`Scope::act`]): each operation's blocking
//! thread takes on the user's file system uid, gid and groups from its first
//! path to its last, so what it creates is the user's and the kernel refuses
//! what the user could not reach, through the user's own symlinks too
//! (research/decisions.md, "The host file system API under --agent-user").
//!
//! Every function here blocks; callers run them on the blocking pool.

pub(crate) mod batch;
pub(crate) mod ops;
pub(crate) mod transfer;

use crate::error::{Error, FsConflict};
use nix::errno::Errno;
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::{Mode, mkdirat};
use nix::unistd::{UnlinkatFlags, unlinkat};
use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::fs::{File, Metadata};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, OnceLock};

use crate::os::user::AgentUser;

/// Where one request's paths start and how far they may reach.
#[derive(Debug, Clone)]
pub(crate) struct Scope {
    /// `--fs-root`, canonical; `None`: no confinement.
    root: Option<PathBuf>,
    /// `--fs-root` as the operator wrote it, when that differs from `root`
    /// (a path through a symlink): client paths may start with either.
    root_alias: Option<PathBuf>,
    /// Base of relative paths: the session's `cwd` or the server's working
    /// directory.
    base: PathBuf,
    /// Real paths nothing of this scope may be inside of (each one and
    /// everything below it): the runtime's own data for an agent's
    /// `fs/*` and `terminal/*` requests ([`Scope::excluding`]). Empty for
    /// the host file system API.
    excluded: Vec<PathBuf>,
    /// The user whose file permissions bind this scope's opens, creates
    /// and renames (under `--agent-user`: an agent's `fs/*` requests and
    /// every operation of the host file system API, [`Scope::acting_as`]);
    /// `None`: the server's own.
    user: Option<Arc<AgentUser>>,
}

/// While alive, the calling thread's file system uid and gid and its
/// supplementary groups are a user's: the kernel checks that user's
/// permissions, and only theirs, on every path the thread opens. Linux
/// keeps credentials per thread (`setfsuid`, `setfsgid` and the raw
/// `setgroups` change the calling thread alone; glibc's `setgroups` would
/// change every thread), and moving the file system uid off 0 drops the
/// capabilities that override file permissions. The thread's other
/// effective capabilities are dropped too (`capset` is per thread): with
/// CAP_SYS_PTRACE the kernel would still show the user `/proc`'s links and
/// descriptors of root's processes. Restored to the server's own when
/// dropped. Blocking threads only: a future may move between threads.
pub(crate) struct ActingAs {
    uid: nix::unistd::Uid,
    gid: nix::unistd::Gid,
    groups: Vec<rustix::process::Gid>,
    /// The thread's capabilities before, once its effective set is empty.
    capabilities: Option<rustix::thread::CapabilitySets>,
}

impl ActingAs {
    fn begin(user: &AgentUser) -> Result<Self, Error> {
        let failed = |e: rustix::io::Errno| {
            Error::FsIo(format!(
                "cannot take on user {}'s groups for this request: {e}",
                user.name
            ))
        };
        let groups = rustix::process::getgroups().map_err(failed)?;
        let theirs: Vec<rustix::process::Gid> = user
            .groups
            .iter()
            .map(|&gid| rustix::process::Gid::from_raw(gid))
            .collect();
        rustix::thread::set_thread_groups(&theirs).map_err(failed)?;
        let gid = nix::unistd::setfsgid(user.gid());
        let uid = nix::unistd::setfsuid(user.uid());
        // From here on a failure drops `acting`, which restores the above.
        let mut acting = Self {
            uid,
            gid,
            groups,
            capabilities: None,
        };
        let dropped = |e: rustix::io::Errno| {
            Error::FsIo(format!(
                "cannot drop the capabilities of this request's thread for user {}: {e}",
                user.name
            ))
        };
        let before = rustix::thread::capabilities(None).map_err(dropped)?;
        let mut none = before;
        none.effective = rustix::thread::CapabilitySet::empty();
        rustix::thread::set_capabilities(None, none).map_err(dropped)?;
        acting.capabilities = Some(before);
        Ok(acting)
    }
}

impl Drop for ActingAs {
    fn drop(&mut self) {
        // First: giving the groups back needs CAP_SETGID.
        if let Some(before) = self.capabilities
            && let Err(error) = rustix::thread::set_capabilities(None, before)
        {
            tracing::error!(%error, "cannot give a blocking thread its capabilities back");
        }
        nix::unistd::setfsuid(self.uid);
        nix::unistd::setfsgid(self.gid);
        if let Err(error) = rustix::thread::set_thread_groups(&self.groups) {
            tracing::error!(%error, "cannot give a blocking thread its supplementary groups back");
        }
    }
}

impl Scope {
    /// The scope of one request: confined to `root` (`--fs-root`, resolved
    /// once, at start: resolving it again per request would follow a root
    /// later replaced by a symlink; `as_given` is the root as the operator
    /// wrote it), relative paths from `cwd` (a session's) or else the
    /// server's working directory.
    ///
    /// # Errors
    /// 500 when the server's working directory is gone.
    pub(crate) fn new(
        root: Option<PathBuf>,
        as_given: Option<PathBuf>,
        cwd: Option<String>,
    ) -> Result<Self, Error> {
        let root_alias = as_given.filter(|given| Some(given) != root.as_ref());
        let cwd = cwd.filter(|cwd| Path::new(cwd).is_absolute());
        let base = match cwd {
            Some(cwd) => PathBuf::from(cwd),
            None => std::env::current_dir()
                .map_err(|error| Error::FsIo(format!("the server's working directory: {error}")))?,
        };
        Ok(Self {
            root,
            root_alias,
            base,
            excluded: Vec::new(),
            user: None,
        })
    }

    /// This scope with `excluded` (real paths) made unreachable: a path
    /// that resolves to one of them or below is refused as the root's
    /// outside is, by [`Scope::check`], which every opened directory and
    /// every located entry passes (research/contract.md, "Files and
    /// terminals of the agent, served in the sandbox").
    pub(crate) fn excluding(mut self, excluded: Vec<PathBuf>) -> Self {
        self.excluded = excluded;
        self
    }

    /// This scope bound by `user`'s file permissions (research/contract.md,
    /// "Agents under an unprivileged user"): see [`Scope::act`].
    pub(crate) fn acting_as(mut self, user: Option<Arc<AgentUser>>) -> Self {
        self.user = user;
        self
    }

    /// Takes on the scope's user for the calling (blocking) thread until
    /// the guard is dropped ([`ActingAs`]); `None` without one.
    ///
    /// # Errors
    /// 500 when the thread's groups cannot be changed.
    pub(crate) fn act(&self) -> Result<Option<ActingAs>, Error> {
        self.user.as_deref().map(ActingAs::begin).transpose()
    }

    /// `error` naming the scope's user when it is a 403 and there is one:
    /// the kernel refused that user, which runs the processes a `cwd` is
    /// looked up for (research/contract.md, "Agents under an unprivileged
    /// user").
    pub(crate) fn naming_user(&self, error: Error) -> Error {
        match (error, self.user.as_deref()) {
            (Error::PermissionDenied(detail), Some(user)) => Error::PermissionDenied(format!(
                "{detail}: closed to user {} (--agent-user), which runs processes",
                user.name
            )),
            (error, _) => error,
        }
    }

    /// Whether the scope's user (if any) may do `want` (permission bits:
    /// 4 read, 2 write, 1 search) to the file `meta` describes, by its
    /// permission bits: a second check of the opened file, after the
    /// kernel's under [`Scope::act`].
    pub(crate) fn user_may(&self, meta: &std::fs::Metadata, want: u32) -> bool {
        self.user
            .as_deref()
            .is_none_or(|user| crate::os::user::allowed(user, meta) & want == want)
    }

    /// `raw` as an absolute path, by the path rules (module doc).
    ///
    /// # Errors
    /// 400 `invalid-path`: empty, a NUL byte, `..` in a relative path.
    pub(crate) fn absolute(&self, raw: &str) -> Result<PathBuf, Error> {
        if raw.is_empty() {
            return Err(Error::InvalidPath("the path is empty".to_owned()));
        }
        if raw.contains('\0') {
            return Err(Error::InvalidPath(format!(
                "path {raw:?} contains a NUL byte"
            )));
        }
        let path = Path::new(raw);
        let absolute = if path.is_absolute() {
            path.to_owned()
        } else if path.components().any(|c| c == Component::ParentDir) {
            return Err(Error::InvalidPath(format!(
                "relative path {raw:?} contains ..; use an absolute path or one without .."
            )));
        } else {
            self.base.join(path)
        };
        // With a root, `..` (in the path or in a session's `cwd`) is
        // outside: resolving it would walk outside and back.
        if self.confined() && absolute.components().any(|c| c == Component::ParentDir) {
            return Err(outside_root(Path::new(raw)));
        }
        Ok(absolute)
    }

    /// Checks that the real path `real` is inside the root and outside every
    /// excluded path; `shown` (the path as the client gave it) is what a
    /// refusal names.
    ///
    /// # Errors
    /// 403 `outside-root`; 403 `permission-denied` inside an excluded path.
    pub(crate) fn check(&self, real: &Path, shown: &Path) -> Result<(), Error> {
        match &self.root {
            Some(root) if !real.starts_with(root) => Err(outside_root(shown)),
            _ if self
                .excluded
                .iter()
                .any(|excluded| real.starts_with(excluded)) =>
            {
                Err(Error::PermissionDenied(format!(
                    "{} is the sandbox-agent runtime's own data",
                    shown.display()
                )))
            }
            _ => Ok(()),
        }
    }

    /// Whether `--fs-root` confines this scope.
    pub(crate) fn confined(&self) -> bool {
        self.root.is_some()
    }

    /// Opens the directory at the real path `real` one component at a time
    /// from `/` (none followed) and checks where the descriptor really is;
    /// `shown` names the client's path in errors.
    ///
    /// # Errors
    /// 404, 409 `not-a-directory` (also for a component swapped for a symlink
    /// after `real` was resolved), 403 (outside the root, permission).
    pub(crate) fn open_dir(&self, real: &Path, shown: &Path) -> Result<Dir, Error> {
        let io = |error: std::io::Error| Error::from_io(&error, shown);
        let mut fd: OwnedFd = File::open("/").map_err(io)?.into();
        for component in real.components() {
            match component {
                Component::Normal(name) => {
                    fd = openat(&fd, name, DIR_FLAGS, Mode::empty()).map_err(|errno| {
                        if errno == Errno::ELOOP {
                            swapped(shown)
                        } else {
                            io(errno.into())
                        }
                    })?;
                }
                Component::RootDir | Component::CurDir => {}
                Component::ParentDir | Component::Prefix(_) => {
                    return Err(Error::InvalidPath(format!(
                        "{} is not a resolved path",
                        real.display()
                    )));
                }
            }
        }
        Dir::checked(self, File::from(fd), real.to_owned(), shown)
    }

    /// The entry at `raw` as a name in its opened parent directory. With
    /// `follow`, symlinks in the whole path are resolved first (an existing
    /// link at the end is replaced by its target); without, only the parent's
    /// are (the operation acts on the link itself).
    ///
    /// # Errors
    /// As [`Scope::absolute`] and [`Scope::open_dir`]; 400 for the file system
    /// root; 403 for the confinement root itself without `follow`.
    pub(crate) fn locate(&self, raw: &str, follow: bool) -> Result<Located, Error> {
        let absolute = self.absolute(raw)?;
        self.locate_absolute(&absolute, Path::new(raw), follow)
    }

    /// [`Scope::locate`] for a path already absolute; `shown`, the path as
    /// the client sent it, is what a 403 names (a relative one joined to a
    /// base would show the server's working directory or a session's `cwd`).
    pub(crate) fn locate_absolute(
        &self,
        absolute: &Path,
        shown: &Path,
        follow: bool,
    ) -> Result<Located, Error> {
        let Some(root) = &self.root else {
            let located = self.locate_unconfined(absolute, follow)?;
            self.check(&located.real(), shown)?;
            return Ok(located);
        };
        match self.beneath(root, absolute, shown, follow, false)? {
            Beneath::Entry(located) => {
                // The entry itself may be excluded (a store file in a
                // session's directory), not only its directory.
                self.check(&located.real(), shown)?;
                Ok(located)
            }
            Beneath::Dir(_) if follow => Err(is_a_directory(absolute)),
            Beneath::Dir(_) => Err(Error::OutsideRoot {
                path: format!("{} (the root itself)", shown.display()),
            }),
        }
    }

    /// The directory at `absolute`, symlinks followed (beneath the root when
    /// there is one).
    ///
    /// # Errors
    /// 403, 404, 409 `not-a-directory`.
    pub(crate) fn open_dir_at(&self, absolute: &Path, shown: &Path) -> Result<Dir, Error> {
        let Some(root) = &self.root else {
            let real = absolute
                .canonicalize()
                .map_err(|error| Error::from_io(&error, absolute))?;
            return self.open_dir(&real, absolute);
        };
        match self.beneath(root, absolute, shown, true, false)? {
            Beneath::Dir(dir) => Ok(dir),
            Beneath::Entry(located) => located.dir.open_dir(self, &located.name, shown),
        }
    }

    /// Where `absolute` leads, symlinks followed (beneath the root when there
    /// is one): a directory the walk ended on (the root itself), or a name
    /// in its parent.
    ///
    /// # Errors
    /// As [`Scope::locate`].
    pub(crate) fn follow(&self, absolute: &Path, shown: &Path) -> Result<Beneath, Error> {
        match &self.root {
            Some(root) => self.beneath(root, absolute, shown, true, false),
            None => {
                let located = self.locate_unconfined(absolute, true)?;
                self.check(&located.real(), shown)?;
                Ok(Beneath::Entry(located))
            }
        }
    }

    /// `absolute` as a path below the root, if it starts with the root (as
    /// resolved, or as the operator wrote it).
    fn below_root(&self, root: &Path, absolute: &Path) -> Option<PathBuf> {
        [Some(root), self.root_alias.as_deref()]
            .into_iter()
            .flatten()
            .find_map(|prefix| absolute.strip_prefix(prefix).ok())
            .map(Path::to_owned)
    }

    /// Resolves `absolute` beneath `root` one component at a time from the
    /// root's descriptor, never looking at anything outside it: each
    /// directory opened `O_DIRECTORY|O_NOFOLLOW` from the last, each symlink
    /// read with `readlinkat` and its text walked in turn (an absolute text
    /// must name the root; `..` above the root is 403). With `follow`, a
    /// symlink at the end is followed too; with `create`, missing
    /// directories on the way are made. Errors met inside the root (404,
    /// 409) are the root's business; nothing outside is ever touched, so no
    /// answer can tell what is there.
    ///
    /// # Errors
    /// 403 `outside-root`, 404, 409 `not-a-directory`, 400 for a loop of
    /// symlinks.
    fn beneath(
        &self,
        root: &Path,
        absolute: &Path,
        shown: &Path,
        follow: bool,
        create: bool,
    ) -> Result<Beneath, Error> {
        let rest = self
            .below_root(root, absolute)
            .ok_or_else(|| outside_root(shown))?;
        // A root that is no longer a directory (swapped for a symlink) is
        // never followed: nothing is beneath it.
        let root_dir = self.open_dir(root, shown).map_err(|error| match error {
            Error::FsConflict { .. } => outside_root(shown),
            other => other,
        })?;
        let mut dirs = vec![root_dir];
        let mut steps: VecDeque<Step> = VecDeque::new();
        push_steps(&mut steps, &rest);
        let mut hops = 0;
        while let Some(step) = steps.pop_front() {
            let name = match step {
                Step::Up => {
                    if dirs.len() == 1 {
                        return Err(outside_root(shown));
                    }
                    dirs.pop();
                    continue;
                }
                Step::Name(name) => name,
            };
            let last = steps.is_empty();
            let Some(top) = dirs.last() else {
                return Err(outside_root(shown));
            };
            let link = if last {
                if !follow {
                    return into_entry(dirs, name, shown);
                }
                match top.metadata(&name) {
                    Ok(meta) if meta.file_type().is_symlink() => top.read_link(&name).ok(),
                    _ => return into_entry(dirs, name, shown),
                }
            } else {
                let mut opened = openat(top.fd(), name.as_os_str(), DIR_FLAGS, Mode::empty());
                if create && matches!(opened, Err(Errno::ENOENT)) {
                    // Made, then opened once more (what is there then, even a
                    // symlink swapped in, is judged below like any other).
                    match mkdirat(top.fd(), name.as_os_str(), Mode::from_bits_truncate(0o777)) {
                        Ok(()) | Err(Errno::EEXIST) => {}
                        Err(errno) => {
                            return Err(Error::from_io(&errno.into(), &top.real.join(&name)));
                        }
                    }
                    opened = openat(top.fd(), name.as_os_str(), DIR_FLAGS, Mode::empty());
                }
                match opened {
                    Ok(fd) => {
                        let real = top.real.join(&name);
                        dirs.push(Dir::checked(self, File::from(fd), real, shown)?);
                        continue;
                    }
                    // `O_NOFOLLOW|O_DIRECTORY` on a symlink: ELOOP or
                    // ENOTDIR, depending on the kernel.
                    Err(Errno::ELOOP | Errno::ENOTDIR)
                        if top
                            .metadata(&name)
                            .is_ok_and(|meta| meta.file_type().is_symlink()) =>
                    {
                        top.read_link(&name).ok()
                    }
                    Err(Errno::ENOENT) => {
                        return Err(Error::FileNotFound(absolute.display().to_string()));
                    }
                    Err(Errno::ENOTDIR | Errno::ELOOP) => {
                        return Err(Error::FsConflict {
                            conflict: FsConflict::NotADirectory,
                            detail: format!(
                                "{}: {} is not a directory",
                                absolute.display(),
                                top.real.join(&name).display()
                            ),
                        });
                    }
                    Err(errno) => return Err(Error::from_io(&errno.into(), &top.real.join(&name))),
                }
            };
            // A symlink: walk its text instead of its name.
            let Some(text) = link else {
                return Err(Error::FileNotFound(absolute.display().to_string()));
            };
            hops += 1;
            if hops > MAX_LINK_HOPS {
                return Err(Error::InvalidPath(format!(
                    "{}: more than {MAX_LINK_HOPS} symlinks on the way",
                    absolute.display()
                )));
            }
            if text.is_absolute() {
                let below = self
                    .below_root(root, &text)
                    .ok_or_else(|| outside_root(shown))?;
                dirs.truncate(1);
                let mut rest = VecDeque::new();
                push_steps(&mut rest, &below);
                rest.extend(steps);
                steps = rest;
            } else {
                let mut rest = VecDeque::new();
                push_steps(&mut rest, &text);
                rest.extend(steps);
                steps = rest;
            }
        }
        // Every step walked: a directory (the root, or one a `..` led to).
        match dirs.pop() {
            Some(dir) => Ok(Beneath::Dir(dir)),
            None => Err(outside_root(shown)),
        }
    }

    /// [`Scope::locate_absolute`] without a root: `realpath`, then the
    /// parent opened one component at a time.
    fn locate_unconfined(&self, absolute: &Path, follow: bool) -> Result<Located, Error> {
        let mut path = absolute.to_owned();
        let last_is_normal = matches!(path.components().next_back(), Some(Component::Normal(_)));
        if follow || !last_is_normal {
            match path.canonicalize() {
                Ok(real) => path = real,
                Err(error) if error.kind() == std::io::ErrorKind::NotFound && last_is_normal => {}
                Err(error) => return Err(Error::from_io(&error, absolute)),
            }
        }
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(Error::InvalidPath(format!(
                "{} is the file system root; name an entry inside it",
                absolute.display()
            )));
        };
        let parent_real = parent
            .canonicalize()
            .map_err(|error| Error::from_io(&error, absolute))?;
        Ok(Located {
            dir: self.open_dir(&parent_real, absolute)?,
            name: name.to_owned(),
        })
    }

    /// The directory `raw`, created with its missing parents (like
    /// `mkdir -p`), each created through its opened, checked parent.
    ///
    /// # Errors
    /// As [`Scope::open_dir`]; 400 for `..` below a directory that does not
    /// exist yet; 409 `not-a-directory` when a component is a file.
    pub(crate) fn make_dirs(&self, raw: &str) -> Result<Dir, Error> {
        let path = self.absolute(raw)?;
        let Some(root) = &self.root else {
            return self.make_dirs_at(&path);
        };
        let shown = Path::new(raw);
        match self.beneath(root, &path, shown, true, true)? {
            Beneath::Dir(dir) => Ok(dir),
            Beneath::Entry(located) => {
                match mkdirat(
                    located.dir.fd(),
                    located.name.as_os_str(),
                    Mode::from_bits_truncate(0o777),
                ) {
                    Ok(()) | Err(Errno::EEXIST) => {}
                    Err(errno) => return Err(Error::from_io(&errno.into(), &located.real())),
                }
                located.dir.open_dir(self, &located.name, shown)
            }
        }
    }

    fn make_dirs_at(&self, path: &Path) -> Result<Dir, Error> {
        let path = path.to_owned();
        let mut existing = path.as_path();
        let real = loop {
            match existing.canonicalize() {
                Ok(real) => break real,
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                    existing = existing
                        .parent()
                        .ok_or_else(|| Error::from_io(&error, &path))?;
                }
                Err(error) => return Err(Error::from_io(&error, &path)),
            }
        };
        let rest = path.strip_prefix(existing).unwrap_or(Path::new(""));
        // Checked before anything is created.
        if rest
            .components()
            .any(|component| !matches!(component, Component::Normal(_)))
        {
            return Err(Error::InvalidPath(format!(
                "{}: .. below a directory that does not exist",
                path.display()
            )));
        }
        let mut dir = self.open_dir(&real, &path)?;
        for component in rest.components() {
            let Component::Normal(name) = component else {
                continue;
            };
            match mkdirat(dir.fd(), name, Mode::from_bits_truncate(0o777)) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(errno) => return Err(Error::from_io(&errno.into(), &dir.real.join(name))),
            }
            dir = dir.open_dir(self, name, &path)?;
        }
        Ok(dir)
    }
}

/// Where a path leads, symlinks followed.
pub(crate) enum Beneath {
    /// A directory reached as such: the root itself, or where a `..` led.
    Dir(Dir),
    /// A name in an opened, checked directory (it may not exist).
    Entry(Located),
}

/// One step of a walk beneath the root.
enum Step {
    /// Into the entry of this name.
    Name(OsString),
    /// Back to the parent (`..` in a symlink's text).
    Up,
}

/// Appends the steps of the relative path `path` to `steps`.
fn push_steps(steps: &mut VecDeque<Step>, path: &Path) {
    for component in path.components() {
        match component {
            Component::Normal(name) => steps.push_back(Step::Name(name.to_owned())),
            Component::ParentDir => steps.push_back(Step::Up),
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
}

/// `name` in the last of `dirs` (never empty: it starts with the root).
fn into_entry(mut dirs: Vec<Dir>, name: OsString, absolute: &Path) -> Result<Beneath, Error> {
    match dirs.pop() {
        Some(dir) => Ok(Beneath::Entry(Located { dir, name })),
        None => Err(outside_root(absolute)),
    }
}

/// Most symlinks followed by text when judging where a path lands.
const MAX_LINK_HOPS: usize = 40;
/// Flags of every directory opened on the way: never through a symlink.
const DIR_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

/// 403 `outside-root` naming the client's `path`.
fn outside_root(path: &Path) -> Error {
    Error::OutsideRoot {
        path: path.display().to_string(),
    }
}

/// 409 for a directory that turned into a symlink while it was opened.
fn swapped(path: &Path) -> Error {
    Error::FsConflict {
        conflict: FsConflict::NotADirectory,
        detail: format!(
            "{}: a directory on the way was replaced by a symlink while it was opened; try again",
            path.display()
        ),
    }
}

/// An opened, checked directory.
#[derive(Debug)]
pub(crate) struct Dir {
    /// The descriptor; keeps `handle` pointing at this directory.
    file: File,
    /// Its real path (shown in answers, checked against the root).
    pub(crate) real: PathBuf,
    /// The path `read_dir` and `remove_dir_all` go through:
    /// `/proc/self/fd/N`, or `real` where `/proc` is missing.
    handle: PathBuf,
}

impl Dir {
    /// `file`, opened at `real`, checked against the root where it really
    /// is now (`/proc/self/fd/N`).
    fn checked(scope: &Scope, file: File, real: PathBuf, shown: &Path) -> Result<Self, Error> {
        let (real, handle) = match fd_path(&file) {
            Some(handle) => {
                let now =
                    std::fs::read_link(&handle).map_err(|error| Error::from_io(&error, shown))?;
                (now, handle)
            }
            None => (real.clone(), real),
        };
        scope.check(&real, shown)?;
        Ok(Self { file, real, handle })
    }

    /// Opens the directory `name` in this one (not followed) and checks it;
    /// `shown` names the client's path in errors.
    ///
    /// # Errors
    /// 404, 409 `not-a-directory` (a file or a symlink there), 403.
    pub(crate) fn open_dir(&self, scope: &Scope, name: &OsStr, shown: &Path) -> Result<Dir, Error> {
        let real = self.real.join(name);
        let fd = openat(self.fd(), name, DIR_FLAGS, Mode::empty()).map_err(|errno| {
            if errno == Errno::ELOOP {
                Error::FsConflict {
                    conflict: FsConflict::NotADirectory,
                    detail: format!("{} is a symlink, not a directory", real.display()),
                }
            } else {
                Error::from_io(&errno.into(), &real)
            }
        })?;
        Dir::checked(scope, File::from(fd), real, shown)
    }

    /// Where this directory is now (`/proc/self/fd/N`'s target), or its
    /// checked path where `/proc` is missing.
    pub(crate) fn current(&self) -> PathBuf {
        fd_path(&self.file)
            .and_then(|handle| std::fs::read_link(handle).ok())
            .unwrap_or_else(|| self.real.clone())
    }

    /// Checks again that this directory is inside the root, where it is now.
    ///
    /// # Errors
    /// 403 `outside-root` when it was moved out.
    pub(crate) fn recheck(&self, scope: &Scope) -> Result<(), Error> {
        match fd_path(&self.file) {
            Some(handle) => {
                let now = std::fs::read_link(&handle)
                    .map_err(|error| Error::from_io(&error, &self.real))?;
                scope.check(&now, &self.real)
            }
            None => Ok(()),
        }
    }

    /// The path of `name` in this directory, through the descriptor, for the
    /// few std calls without an `*at` form (`read_dir`, `remove_dir_all`).
    pub(crate) fn child(&self, name: &OsStr) -> PathBuf {
        self.handle.join(name)
    }

    /// The descriptor, for the `*at` calls.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// The descriptor as a file, for `fsync`.
    pub(crate) fn file(&self) -> &File {
        &self.file
    }

    /// The `lstat` of `name` in this directory (a symlink not followed).
    ///
    /// # Errors
    /// As the system's: `NotFound` when nothing is there.
    pub(crate) fn metadata(&self, name: &OsStr) -> std::io::Result<Metadata> {
        metadata_at(self.fd(), name)
    }

    /// Opens `name` in this directory with `flags` (`O_NOFOLLOW` and
    /// `O_CLOEXEC` always added) and, when created, `mode`.
    ///
    /// # Errors
    /// As the system's; a symlink at `name` fails (`ELOOP`).
    pub(crate) fn open_file(&self, name: &OsStr, flags: OFlag, mode: u32) -> std::io::Result<File> {
        let fd = openat(
            self.fd(),
            name,
            flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(mode),
        )?;
        Ok(File::from(fd))
    }

    /// Removes the file, symlink or (with `directory`) empty directory `name`.
    ///
    /// # Errors
    /// As the system's.
    pub(crate) fn remove(&self, name: &OsStr, directory: bool) -> std::io::Result<()> {
        let flag = if directory {
            UnlinkatFlags::RemoveDir
        } else {
            UnlinkatFlags::NoRemoveDir
        };
        Ok(unlinkat(self.fd(), name, flag)?)
    }

    /// The target text of the symlink `name`.
    ///
    /// # Errors
    /// As the system's (`EINVAL`: not a symlink).
    pub(crate) fn read_link(&self, name: &OsStr) -> std::io::Result<PathBuf> {
        Ok(PathBuf::from(nix::fcntl::readlinkat(self.fd(), name)?))
    }
}

/// The `lstat` of `name` in the directory `parent` (a symlink not
/// followed), through an `O_PATH` descriptor.
///
/// # Errors
/// As the system's: `NotFound` when nothing is there.
pub(crate) fn metadata_at(parent: BorrowedFd<'_>, name: &OsStr) -> std::io::Result<Metadata> {
    let fd = openat(
        parent,
        name,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    File::from(fd).metadata()
}

/// An entry named in an opened, checked directory (it may not exist).
#[derive(Debug)]
pub(crate) struct Located {
    /// The parent.
    pub(crate) dir: Dir,
    /// The entry's name in it (one normal path component).
    pub(crate) name: OsString,
}

impl Located {
    /// The real path, for answers and messages.
    pub(crate) fn real(&self) -> PathBuf {
        self.dir.real.join(&self.name)
    }

    /// The entry's `lstat`.
    ///
    /// # Errors
    /// 404 when nothing is there, as [`Error::from_io`] otherwise.
    pub(crate) fn metadata(&self) -> Result<Metadata, Error> {
        self.dir
            .metadata(&self.name)
            .map_err(|error| Error::from_io(&error, &self.real()))
    }
}

/// `/proc/self/fd/N` of `file`, when `/proc` is mounted.
fn fd_path(file: &File) -> Option<PathBuf> {
    static PROC: OnceLock<bool> = OnceLock::new();
    PROC.get_or_init(|| Path::new("/proc/self/fd").is_dir())
        .then(|| PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd())))
}

/// A path for answers: lossy UTF-8 (research/contract.md, "Host file
/// system", non-UTF-8 names).
pub(crate) fn shown(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// 409 `is-a-directory` for `path`.
pub(crate) fn is_a_directory(path: &Path) -> Error {
    Error::FsConflict {
        conflict: FsConflict::IsADirectory,
        detail: format!("{} is a directory", path.display()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(root: Option<&Path>) -> Scope {
        Scope {
            excluded: Vec::new(),
            root: root.map(Path::to_owned),
            root_alias: None,
            base: PathBuf::from("/work/session"),
            user: None,
        }
    }

    #[test]
    fn relative_paths_start_at_the_base_and_may_not_climb() {
        let scope = scope(None);
        assert_eq!(
            scope.absolute("src/main.rs").ok(),
            Some(PathBuf::from("/work/session/src/main.rs"))
        );
        assert_eq!(
            scope.absolute("/etc/hosts").ok(),
            Some(PathBuf::from("/etc/hosts"))
        );
        assert_eq!(
            scope.absolute("/a/../b").ok(),
            Some(PathBuf::from("/a/../b")),
            "absolute paths are resolved later, not refused"
        );
        for bad in ["", "../x", "a/../../x", "a\0b"] {
            assert!(
                matches!(scope.absolute(bad), Err(Error::InvalidPath(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn the_root_confines_by_component() {
        let confined = scope(Some(Path::new("/srv/root")));
        assert!(
            confined
                .check(Path::new("/srv/root"), Path::new("/x"))
                .is_ok()
        );
        assert!(
            confined
                .check(Path::new("/srv/root/a/b"), Path::new("/x"))
                .is_ok()
        );
        for outside in ["/srv/rootless", "/srv", "/etc/passwd"] {
            assert!(
                matches!(
                    confined.check(Path::new(outside), Path::new(outside)),
                    Err(Error::OutsideRoot { .. })
                ),
                "{outside}"
            );
        }
        assert!(
            scope(None)
                .check(Path::new("/anything"), Path::new("/x"))
                .is_ok()
        );
    }
}
