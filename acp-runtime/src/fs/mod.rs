//! The host file system API (research/contract.md, "Host file system"): one
//! implementation behind both surfaces, the `_sandboxagent/fs/*` methods
//! (`crate::ext`) and the `/v2/fs/*` routes (`crate::http::fs`).
//!
//! - this file: [`Scope`], path resolution and `--fs-root` confinement.
//! - `ops`: list, stat, mkdir, move, delete.
//! - `transfer`: streaming file reads and writes (temp file, fsync, rename).
//! - `batch`: upload-batch, a tar stream unpacked with the installer's rules.
//!
//! Path rules: absolute paths are taken as given; relative ones start at the
//! named session's `cwd`, else the server's working directory, and may not
//! contain `..`. With `--fs-root`, every path must resolve, symlinks
//! followed, inside the root.
//!
//! Check and use: a path is resolved to a real directory, that directory is
//! opened (`O_DIRECTORY | O_NOFOLLOW`), and the opened descriptor's own path
//! (`/proc/self/fd/N`) is checked against the root. Every operation then goes
//! through that descriptor (`/proc/self/fd/N/name`, the final name opened with
//! `O_NOFOLLOW` or renamed with `renameat2`), so a symlink swapped into the
//! path after the check cannot redirect it. Where `/proc` is not mounted the
//! checked real path is used instead (check, then use).
//!
//! Every function here blocks; callers run them on the blocking pool.

pub(crate) mod batch;
pub(crate) mod ops;
pub(crate) mod transfer;

use crate::error::{Error, FsConflict};
use crate::runtime::Runtime;
use std::ffi::{OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};
use std::sync::OnceLock;

/// Where one request's paths start and how far they may reach.
#[derive(Debug, Clone)]
pub(crate) struct Scope {
    /// `--fs-root`, canonical; `None`: no confinement.
    root: Option<PathBuf>,
    /// Base of relative paths: the session's `cwd` or the server's working
    /// directory.
    base: PathBuf,
}

impl Scope {
    /// The scope of a request naming `session` (its `cwd` is the base of
    /// relative paths). `agent` picks among sessions of several agents that
    /// share the id (the calling connection's agent on `/v2/rpc`).
    ///
    /// # Errors
    /// 404 `unknown-session`; 409 `ambiguous-session` when sessions of
    /// several agents have the id and different `cwd`s; 500 when the
    /// server's working directory is gone.
    pub(crate) fn new(
        runtime: &Runtime,
        session: Option<&str>,
        agent: Option<&str>,
    ) -> Result<Self, Error> {
        let root = match &runtime.config.fs_root {
            Some(root) => Some(
                root.canonicalize()
                    .map_err(|error| Error::from_io(&error, root))?,
            ),
            None => None,
        };
        let cwd = match session {
            None => None,
            Some(id) => {
                let own = agent.and_then(|agent| runtime.sessions.get(agent, id));
                let candidates = match own {
                    Some(session) => vec![session],
                    None => runtime.sessions.by_id(id),
                };
                let Some(first) = candidates.first() else {
                    return Err(Error::UnknownSession(id.to_owned()));
                };
                let cwd = first.cwd();
                if candidates.iter().any(|other| other.cwd() != cwd) {
                    return Err(Error::AmbiguousSession {
                        id: id.to_owned(),
                        agents: candidates.iter().map(|s| s.agent.to_string()).collect(),
                    });
                }
                cwd.filter(|cwd| Path::new(cwd).is_absolute())
            }
        };
        let base = match cwd {
            Some(cwd) => PathBuf::from(cwd),
            None => std::env::current_dir()
                .map_err(|error| Error::FsIo(format!("the server's working directory: {error}")))?,
        };
        Ok(Self { root, base })
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
        if path.is_absolute() {
            return Ok(path.to_owned());
        }
        if path.components().any(|c| c == Component::ParentDir) {
            return Err(Error::InvalidPath(format!(
                "relative path {raw:?} contains ..; use an absolute path or one without .."
            )));
        }
        Ok(self.base.join(path))
    }

    /// Checks that the real path `real` is inside the root.
    ///
    /// # Errors
    /// 403 `outside-root`.
    pub(crate) fn check(&self, real: &Path) -> Result<(), Error> {
        match &self.root {
            Some(root) if !real.starts_with(root) => Err(Error::OutsideRoot {
                path: real.display().to_string(),
            }),
            _ => Ok(()),
        }
    }

    /// Whether `real` is the confinement root itself.
    fn is_root(&self, real: &Path) -> bool {
        self.root.as_deref() == Some(real)
    }

    /// Opens the directory at `path` (its last component not followed) and
    /// checks where the descriptor really is.
    ///
    /// # Errors
    /// 404, 409 `not-a-directory`, 403 (outside the root, permission, a
    /// symlink swapped in).
    pub(crate) fn open_dir(&self, path: &Path) -> Result<Dir, Error> {
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_DIRECTORY | nix::libc::O_NOFOLLOW)
            .open(path)
            .map_err(|error| Error::from_io(&error, path))?;
        let (real, handle) = match fd_path(&file) {
            Some(handle) => {
                let real =
                    std::fs::read_link(&handle).map_err(|error| Error::from_io(&error, path))?;
                (real, handle)
            }
            None => (path.to_owned(), path.to_owned()),
        };
        self.check(&real)?;
        Ok(Dir { file, real, handle })
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
        let mut path = self.absolute(raw)?;
        let last_is_normal = matches!(path.components().next_back(), Some(Component::Normal(_)));
        if follow || !last_is_normal {
            match path.canonicalize() {
                Ok(real) => path = real,
                Err(error) if error.kind() == std::io::ErrorKind::NotFound && last_is_normal => {}
                Err(error) => return Err(Error::from_io(&error, &path)),
            }
        }
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(Error::InvalidPath(format!(
                "{} is the file system root; name an entry inside it",
                path.display()
            )));
        };
        let parent_real = parent
            .canonicalize()
            .map_err(|error| Error::from_io(&error, parent))?;
        if self.is_root(&parent_real.join(name)) && !follow {
            return Err(Error::OutsideRoot {
                path: format!("{} (the root itself)", path.display()),
            });
        }
        Ok(Located {
            dir: self.open_dir(&parent_real)?,
            name: name.to_owned(),
        })
    }

    /// The directory `raw`, created with its missing parents (like
    /// `mkdir -p`), each created one opened and checked before the next.
    ///
    /// # Errors
    /// As [`Scope::open_dir`]; 400 for `..` below a directory that does not
    /// exist yet; 409 `not-a-directory` when a component is a file.
    pub(crate) fn make_dirs(&self, raw: &str) -> Result<Dir, Error> {
        let path = self.absolute(raw)?;
        let mut existing = path.as_path();
        let real = loop {
            match existing.canonicalize() {
                Ok(real) => break real,
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                    existing = existing
                        .parent()
                        .ok_or_else(|| Error::from_io(&error, &path))?;
                }
                Err(error) => return Err(Error::from_io(&error, existing)),
            }
        };
        let mut dir = self.open_dir(&real)?;
        let rest = path.strip_prefix(existing).unwrap_or(Path::new(""));
        for component in rest.components() {
            let Component::Normal(name) = component else {
                return Err(Error::InvalidPath(format!(
                    "{}: .. below a directory that does not exist",
                    path.display()
                )));
            };
            let next = dir.child(name);
            match std::fs::create_dir(&next) {
                Ok(()) => {}
                Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(error) => return Err(Error::from_io(&error, &dir.real.join(name))),
            }
            dir = self.open_dir(&next)?;
        }
        Ok(dir)
    }
}

/// An opened, checked directory.
#[derive(Debug)]
pub(crate) struct Dir {
    /// The descriptor; keeps `handle` pointing at this directory.
    file: File,
    /// Its real path (shown in answers, checked against the root).
    pub(crate) real: PathBuf,
    /// The path operations go through: `/proc/self/fd/N`, or `real` where
    /// `/proc` is missing.
    handle: PathBuf,
}

impl Dir {
    /// The path of `name` in this directory, through the descriptor.
    pub(crate) fn child(&self, name: &OsStr) -> PathBuf {
        self.handle.join(name)
    }

    /// The descriptor, for `renameat2` and `fsync`.
    pub(crate) fn file(&self) -> &File {
        &self.file
    }
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
    /// The path of the entry through the parent's descriptor.
    pub(crate) fn handle(&self) -> PathBuf {
        self.dir.child(&self.name)
    }

    /// The real path, for answers and messages.
    pub(crate) fn real(&self) -> PathBuf {
        self.dir.real.join(&self.name)
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
            root: root.map(Path::to_owned),
            base: PathBuf::from("/work/session"),
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
        assert!(confined.check(Path::new("/srv/root")).is_ok());
        assert!(confined.check(Path::new("/srv/root/a/b")).is_ok());
        for outside in ["/srv/rootless", "/srv", "/etc/passwd"] {
            assert!(
                matches!(
                    confined.check(Path::new(outside)),
                    Err(Error::OutsideRoot { .. })
                ),
                "{outside}"
            );
        }
        assert!(scope(None).check(Path::new("/anything")).is_ok());
    }
}
