//! The unprivileged user the `--agent-user` tests run agents as, created
//! when missing (the tests run as root, as CI and most sandbox images do).

use std::process::Command;
use std::sync::Mutex;

/// The user's name: a system user with a home, and a member of
/// [`EXTRA_GROUP`].
pub const AGENT_USER: &str = "sandbox-agent-test";
/// A supplementary group of [`AGENT_USER`], to tell its groups from root's.
pub const EXTRA_GROUP: &str = "sandbox-agent-test-extra";

/// The user's ids from the user database: `(uid, gid)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ids {
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
}

/// Whether this process runs as root (only root may start agents as
/// another user).
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// [`AGENT_USER`], created (with its home and [`EXTRA_GROUP`]) when
/// missing; `None` when the tests do not run as root, so cannot.
/// `useradd` and `groupadd` lock the user database themselves; an "already
/// exists" from a test running at once is success.
///
/// # Panics
/// When the user cannot be created as root.
pub fn agent_user() -> Option<Ids> {
    static CREATING: Mutex<()> = Mutex::new(());
    if !is_root() {
        return None;
    }
    let _one_at_a_time = CREATING.lock().unwrap_or_else(|e| e.into_inner());
    if lookup(AGENT_USER).is_none() {
        // 9: the group or user exists (made by another test binary now).
        run_allowing("groupadd", &["--force", EXTRA_GROUP], &[]);
        run_allowing(
            "useradd",
            &[
                "--system",
                "--user-group",
                "--create-home",
                "--shell",
                "/bin/sh",
                "--groups",
                EXTRA_GROUP,
                AGENT_USER,
            ],
            &[9],
        );
    }
    Some(lookup(AGENT_USER).unwrap_or_else(|| panic!("user {AGENT_USER} was not created")))
}

/// The numeric id of group `name`.
///
/// # Panics
/// When it does not exist.
pub fn group_id(name: &str) -> u32 {
    nix::unistd::Group::from_name(name)
        .ok()
        .flatten()
        .unwrap_or_else(|| panic!("no group {name}"))
        .gid
        .as_raw()
}

fn lookup(name: &str) -> Option<Ids> {
    let user = nix::unistd::User::from_name(name).ok().flatten()?;
    Some(Ids {
        uid: user.uid.as_raw(),
        gid: user.gid.as_raw(),
    })
}

fn run_allowing(program: &str, args: &[&str], allowed: &[i32]) {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    let code = output.status.code().unwrap_or(-1);
    assert!(
        output.status.success() || allowed.contains(&code),
        "{program} {args:?}: exit {code}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}
