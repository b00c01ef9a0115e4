//! The unprivileged user agents run as when the server runs as root
//! (`--agent-user`, research/contract.md, "Agents under an unprivileged
//! user"): who it is, resolved once at start from the user database.

use nix::unistd::{Gid, Uid, User};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// A user from the user database (`/etc/passwd` or NSS): whom the tree
/// supervisor's programs run as (the supervisor stays root;
/// [`crate::os::tree`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentUser {
    /// The login name (`initgroups` reads the supplementary groups by it).
    pub name: String,
    /// The user id.
    pub uid: u32,
    /// The primary group id.
    pub gid: u32,
    /// The home directory of the user database entry (the process API's
    /// `HOME` for this user; agents get their own home in the data dir).
    pub home: PathBuf,
    /// Every group of the user (primary and supplementary), for the
    /// permission checks the server makes on the user's behalf. Empty when
    /// read back from [`AgentUser::from_arg`].
    pub groups: Vec<u32>,
}

impl AgentUser {
    /// Resolves `spec`, a user name or a numeric uid, in the user database.
    ///
    /// # Errors
    /// A message for the user when no such user exists, the lookup fails,
    /// or `spec` names root (uid 0) or a member of group 0 (primary or
    /// supplementary): agents must not run as root this way.
    pub fn resolve(spec: &str) -> Result<Self, String> {
        let spec = spec.trim();
        if spec.is_empty() {
            return Err("--agent-user must name a user (a name or a uid)".to_owned());
        }
        let found = match spec.parse::<u32>() {
            Ok(uid) => User::from_uid(Uid::from_raw(uid)),
            Err(_) => User::from_name(spec),
        }
        .map_err(|errno| format!("--agent-user {spec}: cannot read the user database: {errno}"))?
        .ok_or_else(|| {
            format!("--agent-user {spec}: no such user (create it first, e.g. `useradd -m {spec}`)")
        })?;
        if found.uid.is_root() {
            return Err(format!(
                "--agent-user {spec} is root: name an unprivileged user for the agents"
            ));
        }
        let name = std::ffi::CString::new(found.name.as_str())
            .map_err(|_| format!("--agent-user {spec}: the name holds a NUL byte"))?;
        let groups = nix::unistd::getgrouplist(&name, found.gid)
            .map_err(|errno| format!("--agent-user {spec}: cannot read its groups: {errno}"))?
            .into_iter()
            .map(Gid::as_raw)
            .collect::<Vec<u32>>();
        if found.gid.as_raw() == 0 || groups.contains(&0) {
            return Err(format!(
                "--agent-user {spec} is in group root (gid 0): name a user outside it"
            ));
        }
        Ok(Self {
            name: found.name,
            uid: found.uid.as_raw(),
            gid: found.gid.as_raw(),
            home: found.dir,
            groups,
        })
    }

    /// The form the server hands the tree supervisor: `NAME:UID:GID` (a
    /// user database name never holds `:`).
    pub fn to_arg(&self) -> String {
        format!("{}:{}:{}", self.name, self.uid, self.gid)
    }

    /// Reads [`AgentUser::to_arg`]'s form back (the home is not carried:
    /// the supervisor does not need it).
    ///
    /// # Errors
    /// A message when `arg` is not `NAME:UID:GID`.
    pub fn from_arg(arg: &str) -> Result<Self, String> {
        let bad = || format!("--user {arg:?}: expected NAME:UID:GID");
        let mut parts = arg.rsplitn(3, ':');
        let gid = parts.next().and_then(|g| g.parse().ok()).ok_or_else(bad)?;
        let uid = parts.next().and_then(|u| u.parse().ok()).ok_or_else(bad)?;
        let name = parts.next().filter(|n| !n.is_empty()).ok_or_else(bad)?;
        Ok(Self {
            name: name.to_owned(),
            uid,
            gid,
            home: PathBuf::new(),
            groups: Vec::new(),
        })
    }

    /// The user id as nix's type.
    pub fn uid(&self) -> Uid {
        Uid::from_raw(self.uid)
    }

    /// The primary group id as nix's type.
    pub fn gid(&self) -> Gid {
        Gid::from_raw(self.gid)
    }
}

/// What the user may do to a file: the permission bits of `meta` for the
/// user (owner, a group of the user, others). ACLs are not read.
pub(crate) fn allowed(user: &AgentUser, meta: &std::fs::Metadata) -> u32 {
    let mode = meta.mode();
    if meta.uid() == user.uid {
        (mode >> 6) & 0o7
    } else if meta.gid() == user.gid || user.groups.contains(&meta.gid()) {
        (mode >> 3) & 0o7
    } else {
        mode & 0o7
    }
}

/// The first directory on the way to `path` (its ancestors and itself,
/// when it is a directory) that `user` may not search, if any.
pub fn unreachable_step(user: &AgentUser, path: &Path) -> Option<PathBuf> {
    let mut dirs: Vec<&Path> = path.ancestors().collect();
    dirs.reverse();
    for dir in dirs {
        match std::fs::metadata(dir) {
            Ok(meta) if meta.is_dir() && allowed(user, &meta) & 0o1 == 0 => {
                return Some(dir.to_owned());
            }
            Ok(_) => {}
            Err(_) => return Some(dir.to_owned()),
        }
    }
    None
}

/// Whether `user` may create files in directory `dir`: every directory on
/// the way searchable and `dir` itself writable and searchable (permission
/// bits; ACLs and read-only mounts are not seen).
pub fn may_write(user: &AgentUser, dir: &Path) -> bool {
    unreachable_step(user, dir).is_none()
        && std::fs::metadata(dir).is_ok_and(|meta| allowed(user, &meta) & 0o3 == 0o3)
}

/// The variables that make a program at home as `user` in `home`: `HOME`,
/// `USER` and `LOGNAME` (what `login` and `su -` set).
pub fn login_env(user: &AgentUser, home: &Path) -> [(String, String); 3] {
    [
        ("HOME".to_owned(), home.to_string_lossy().into_owned()),
        ("USER".to_owned(), user.name.clone()),
        ("LOGNAME".to_owned(), user.name.clone()),
    ]
}

/// Makes `home` the user's: created when missing, every entry owned by
/// the user (a home used while a server ran agents as root holds root's
/// files, the agent would fail on them), mode 0700. Walked at every start
/// of the agent: entries already the user's are only looked at.
///
/// # Errors
/// When the folder cannot be created, handed over or restricted.
pub fn prepare_home(user: &AgentUser, home: &Path) -> std::io::Result<()> {
    use nix::fcntl::{OFlag, open};
    use nix::sys::stat::{Mode, fchmod};
    std::fs::create_dir_all(home)?;
    // By file descriptor from here on: the user may rename, swap and
    // replace entries inside its home while the walk runs, and a path
    // would follow what it swapped in (a symlink to /etc).
    let top = open(
        home,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let mut budget = MAX_HOME_ENTRIES;
    hand_over_dir(&top, user, 0, &mut budget);
    if budget == 0 {
        tracing::warn!(home = %home.display(), "more than {MAX_HOME_ENTRIES} entries in an agent home: the rest were not looked at");
    }
    fchmod(&top, Mode::from_bits_truncate(0o700))?;
    Ok(())
}

/// Most entries of an agent home looked at per start.
const MAX_HOME_ENTRIES: usize = 200_000;
/// Deepest folder of an agent home looked into.
const MAX_HOME_DEPTH: usize = 64;

/// Hands `dir` (an open folder) and everything under it that is not the
/// user's yet to the user: each entry opened relative to its folder
/// without following a symlink, and changed through that descriptor, so a
/// swap during the walk changes nothing outside (a symlink is handed over
/// itself; a hard link is left alone: it could be a link to any root
/// file). Best effort: an entry that fails is skipped.
fn hand_over_dir(dir: &std::os::fd::OwnedFd, user: &AgentUser, depth: usize, budget: &mut usize) {
    use nix::fcntl::{AtFlags, OFlag, openat};
    use nix::sys::stat::{Mode, SFlag, fstat};
    use std::os::fd::AsRawFd;
    let give = |fd: &std::os::fd::OwnedFd| {
        let _ = nix::unistd::fchownat(
            fd,
            "",
            Some(user.uid()),
            Some(user.gid()),
            AtFlags::AT_EMPTY_PATH,
        );
    };
    if let Ok(stat) = fstat(dir)
        && (stat.st_uid != user.uid || stat.st_gid != user.gid)
    {
        give(dir);
    }
    // The folder the descriptor is, listed through its `/proc` link: the
    // same folder even if it was moved meanwhile.
    let Ok(entries) = std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd())) else {
        return;
    };
    for entry in entries.flatten() {
        if *budget == 0 {
            return;
        }
        *budget -= 1;
        let name = entry.file_name();
        let folder = openat(
            dir,
            name.as_os_str(),
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        );
        if let Ok(folder) = folder {
            if depth < MAX_HOME_DEPTH {
                hand_over_dir(&folder, user, depth + 1, budget);
            }
            continue;
        }
        let Ok(fd) = openat(
            dir,
            name.as_os_str(),
            OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) else {
            continue;
        };
        let Ok(stat) = fstat(&fd) else {
            continue;
        };
        let kind = SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT;
        if kind != SFlag::S_IFDIR && stat.st_nlink > 1 {
            tracing::warn!(entry = ?name, "a hard link in an agent home stays root's");
            continue;
        }
        if stat.st_uid != user.uid || stat.st_gid != user.gid {
            give(&fd);
        }
    }
}

/// Readies the data dir for agents run as `user` (research/contract.md,
/// "Agents under an unprivileged user") and returns its real path, which
/// the server uses from then on (a path through a symlink would be
/// resolved again at every use): the data dir `0711` (the user may pass
/// through to `agents/` and its own home, never list it or open the store
/// or the runtime id), `homes/` `0711`, `agents/` searchable.
///
/// # Errors
/// A message for the user when the data dir cannot be made so, when the
/// user could have made or could swap it ([`trusted_dir`]), or when a
/// directory above it keeps the user out (a data dir under `/root`).
pub fn confine_data_dir(data_dir: &Path, user: &AgentUser) -> Result<PathBuf, String> {
    let failed = |path: &Path, e: std::io::Error| format!("{}: {e}", path.display());
    let data_dir = &std::path::absolute(data_dir).map_err(|e| failed(data_dir, e))?;
    std::fs::create_dir_all(data_dir).map_err(|e| failed(data_dir, e))?;
    let data_dir = &trusted_dir(data_dir, user, "data dir")?;
    let closed_to_user = |step: PathBuf| {
        format!(
            "--agent-user {}: the user cannot reach the data dir {} ({} is closed to it); pass --data-dir in a directory the user can pass through, e.g. /var/lib/sandbox-agent",
            user.name,
            data_dir.display(),
            step.display()
        )
    };
    // Before anything is changed: a data dir the user cannot reach stays
    // as it was.
    let closed = data_dir
        .parent()
        .and_then(|parent| unreachable_step(user, parent));
    if let Some(step) = closed {
        return Err(closed_to_user(step));
    }
    for (dir, mode) in [
        (data_dir.to_owned(), 0o711),
        (data_dir.join("homes"), 0o711),
        (data_dir.join("agents"), 0o755),
    ] {
        std::fs::create_dir_all(&dir).map_err(|e| failed(&dir, e))?;
        let meta = std::fs::symlink_metadata(&dir).map_err(|e| failed(&dir, e))?;
        if !meta.is_dir() {
            return Err(format!("{} is not a directory", dir.display()));
        }
        if meta.mode() & 0o777 != mode {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode))
                .map_err(|e| failed(&dir, e))?;
        }
    }
    if let Some(step) = unreachable_step(user, &data_dir.join("agents")) {
        return Err(closed_to_user(step));
    }
    Ok(data_dir.to_owned())
}

/// The SQLite store file `file` of `--store`, by the rules of
/// [`trusted_dir`] for its folder: the real folder joined with the file's
/// name, which must not be a symlink of another user.
///
/// # Errors
/// A message naming what the user could change.
pub fn trusted_store_file(file: &Path, user: &AgentUser) -> Result<PathBuf, String> {
    let own = nix::unistd::geteuid().as_raw();
    let absolute = std::path::absolute(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let (Some(folder), Some(name)) = (absolute.parent(), absolute.file_name()) else {
        return Err(format!("--store {}: not a file path", file.display()));
    };
    std::fs::create_dir_all(folder).map_err(|e| format!("{}: {e}", folder.display()))?;
    let folder = trusted_dir(folder, user, "store's folder")?;
    let real = folder.join(name);
    if let Ok(meta) = std::fs::symlink_metadata(&real)
        && meta.uid() != own
    {
        return Err(format!(
            "--agent-user {}: the store file {} belongs to uid {}; the user could have made it",
            user.name,
            real.display(),
            meta.uid()
        ));
    }
    Ok(real)
}

/// The real path of directory `dir` (`what` names it in errors), refused
/// when the user could have made it or could swap it: a step of the path,
/// as given or as resolved, that is a symlink of another user, or a
/// folder the user may write that is not sticky (the user could rename
/// the next step away and put its own in its place); or the directory
/// itself not the server's, or writable by group or others. Root acts on
/// what is in such a directory: group records it kills, a store file it
/// creates and chmods, a runtime id it reads.
///
/// # Errors
/// A message naming the step and what to do.
pub fn trusted_dir(dir: &Path, user: &AgentUser, what: &str) -> Result<PathBuf, String> {
    let own = nix::unistd::geteuid().as_raw();
    let refuse = |why: String| {
        Err(format!(
            "--agent-user {}: the {what} {} {why}; the user could plant files in it that the server (root) acts on. Use a directory only the server's user can change, e.g. /var/lib/sandbox-agent",
            user.name,
            dir.display()
        ))
    };
    let read = |path: &Path| {
        std::fs::symlink_metadata(path).map_err(|e| format!("{}: {e}", path.display()))
    };
    let open_to_user = |meta: &std::fs::Metadata| {
        meta.mode() & 0o1000 == 0 && (meta.uid() == user.uid || allowed(user, meta) & 0o3 == 0o3)
    };
    // Rebuilt from its components: a trailing `/` would make the last
    // step's metadata follow a symlink.
    let given: PathBuf = std::path::absolute(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .components()
        .collect();
    let real = given
        .canonicalize()
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    for path in [&given, &real] {
        let steps: Vec<&Path> = path.ancestors().collect();
        for (index, step) in steps.iter().enumerate() {
            let meta = read(step)?;
            if meta.file_type().is_symlink() {
                if meta.uid() != own && meta.uid() != 0 {
                    return refuse(format!(
                        "is reached through {}, a symlink of uid {}",
                        step.display(),
                        meta.uid()
                    ));
                }
                continue;
            }
            // The folders above the directory: nobody but root may
            // replace what is in them.
            if index > 0 && meta.is_dir() && open_to_user(&meta) {
                return refuse(format!(
                    "is in {}, which the user may change",
                    step.display()
                ));
            }
        }
    }
    let meta = read(&real)?;
    if meta.uid() != own {
        return refuse(format!("belongs to uid {}", meta.uid()));
    }
    if meta.mode() & 0o022 != 0 {
        return refuse(format!(
            "is writable by others (mode {:o})",
            meta.mode() & 0o7777
        ));
    }
    Ok(real)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_and_unknown_users_are_refused_with_the_reason() {
        let root = AgentUser::resolve("root").expect_err("root is refused");
        assert!(root.contains("is root"), "{root}");
        let zero = AgentUser::resolve("0").expect_err("uid 0 is refused");
        assert!(zero.contains("is root"), "{zero}");
        let unknown = AgentUser::resolve("no-such-user-sandbox-agent").expect_err("unknown");
        assert!(unknown.contains("no such user"), "{unknown}");
        assert!(AgentUser::resolve(" ").is_err());
    }

    fn user(uid: u32, gid: u32, groups: &[u32]) -> AgentUser {
        AgentUser {
            name: "agent".to_owned(),
            uid,
            gid,
            home: PathBuf::new(),
            groups: groups.to_vec(),
        }
    }

    #[test]
    fn permission_bits_are_read_as_owner_group_or_other() {
        let dir = std::env::temp_dir().join(format!("user-bits-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let me = std::fs::metadata(&dir).expect("meta");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o710)).expect("chmod");
        let owner = user(me.uid(), 4242, &[]);
        let in_group = user(4243, 4244, &[me.gid()]);
        let other = user(4245, 4246, &[]);
        assert!(may_write(&owner, &dir));
        assert!(!may_write(&in_group, &dir), "group has x only");
        assert!(
            unreachable_step(&in_group, &dir).is_none(),
            "group may pass"
        );
        assert_eq!(unreachable_step(&other, &dir.join("x")), Some(dir.clone()));
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        assert!(may_write(&other, &dir));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_supervisor_argument_reads_back() {
        let user = AgentUser::from_arg("agent:1000:1001").expect("parses");
        assert_eq!(
            (user.name.as_str(), user.uid, user.gid),
            ("agent", 1000, 1001)
        );
        assert_eq!(user.to_arg(), "agent:1000:1001");
        for bad in ["", "agent", "agent:1", ":1:2", "agent:x:1", "agent:1:y"] {
            assert!(AgentUser::from_arg(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_user_resolves_by_name_and_by_uid_alike() {
        // `nobody` exists on every Debian system.
        let by_name = AgentUser::resolve("nobody").expect("nobody");
        let by_uid = AgentUser::resolve(&by_name.uid.to_string()).expect("by uid");
        assert_eq!(by_name, by_uid);
        assert_eq!(by_name.name, "nobody");
    }
}
