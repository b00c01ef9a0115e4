//! The unprivileged user agents run as when the server runs as root
//! (`--agent-user`, research/contract.md, "Agents under an unprivileged
//! user"): who it is, resolved once at start from the user database.

use nix::unistd::{Gid, Uid, User};

/// A user from the user database (`/etc/passwd` or NSS): what the tree
/// supervisor switches to before it starts a program
/// ([`crate::agent::tree`]).
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
    pub home: std::path::PathBuf,
}

impl AgentUser {
    /// Resolves `spec`, a user name or a numeric uid, in the user database.
    ///
    /// # Errors
    /// A message for the user when no such user exists, the lookup fails,
    /// or `spec` names root (uid 0): agents must not run as root this way.
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
        Ok(Self {
            name: found.name,
            uid: found.uid.as_raw(),
            gid: found.gid.as_raw(),
            home: found.dir,
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
            home: std::path::PathBuf::new(),
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
