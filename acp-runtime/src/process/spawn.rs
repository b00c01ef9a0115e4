//! Starting one process of the process API: finding the program, the
//! command line (under the tree supervisor, research/contract.md, "Agent
//! process trees and a server that dies"), pipes or a pseudo-terminal, and
//! the program's pid behind its supervisor.

use crate::error::Error;
use crate::os::tree::{self, TreeSupervisor};
use nix::unistd::{AccessFlags, Pid, access};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout};

/// `PATH` when neither the request nor the server has one.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// `TERM` of a process on a terminal that did not name one.
const DEFAULT_TERM: &str = "xterm-256color";

/// A terminal's size, in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TtySize {
    /// Columns.
    pub cols: u16,
    /// Rows.
    pub rows: u16,
}

/// A started process's ends.
pub(super) enum Io {
    /// Pipes: stdin, stdout, stderr.
    Pipes(ChildStdin, ChildStdout, ChildStderr),
    /// The terminal's controlling side (both directions, and resizes).
    Pty(pty_process::Pty),
}

/// What [`spawn`] started.
pub(super) struct Started {
    /// The child: the supervisor, or the program without one.
    pub child: Child,
    /// Its ends.
    pub io: Io,
}

/// What a start needs, resolved.
pub(super) struct Launch<'a> {
    /// The program as asked for (checked by [`find_program`]; found again
    /// on the same `PATH` by the exec).
    pub program: &'a Path,
    /// Its arguments.
    pub args: &'a [String],
    /// Its working directory, resolved and checked.
    pub cwd: &'a Path,
    /// Variables set on top of the server's environment.
    pub env: &'a [(String, String)],
    /// A terminal of this size, or pipes.
    pub tty: Option<TtySize>,
}

/// Starts `launch` under `supervisor` (or alone, in a process group or
/// terminal session of its own, when the server has none).
///
/// # Errors
/// The spawn's or the terminal's I/O error.
pub(super) fn spawn(
    supervisor: Option<&TreeSupervisor>,
    launch: &Launch<'_>,
) -> std::io::Result<Started> {
    let user = supervisor.and_then(|s| s.user.as_ref());
    let mut env: Vec<(String, String)> = Vec::new();
    // Run as another user, a process gets that user's home from the user
    // database, as `docker exec -u` gives (research/contract.md, "Agents
    // under an unprivileged user"); the request's variables still win.
    if let Some(user) = user {
        env.extend(crate::os::user::login_env(user, &user.home));
    }
    if launch.tty.is_some() && !launch.env.iter().any(|(key, _)| key == "TERM") {
        env.push(("TERM".to_owned(), DEFAULT_TERM.to_owned()));
    }
    env.extend(launch.env.iter().cloned());
    let mut command = tree::command(
        supervisor,
        launch.tty.is_some(),
        launch.program,
        launch.args,
        Some(launch.cwd),
        &env,
    );
    // The tree outlives nothing it should: the waiter kills it when the
    // process is forgotten, the supervisor when the server is gone.
    command.kill_on_drop(false);
    match launch.tty {
        None => {
            command
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .process_group(0);
            let mut child = command.spawn()?;
            let (Some(stdin), Some(stdout), Some(stderr)) =
                (child.stdin.take(), child.stdout.take(), child.stderr.take())
            else {
                return Err(std::io::Error::other("the process's stdio was not piped"));
            };
            Ok(Started {
                child,
                io: Io::Pipes(stdin, stdout, stderr),
            })
        }
        Some(size) => {
            let (pty, pts) = pty_process::open().map_err(std::io::Error::other)?;
            pty.resize(pty_process::Size::new(size.rows, size.cols))
                .map_err(std::io::Error::other)?;
            // The terminal is the user's, as `login` makes it: a program
            // that opens it again by name (`/dev/pts/N`, `tty`) may.
            if let Some(user) = supervisor.and_then(|s| s.user.as_ref()) {
                nix::unistd::fchown(&pts, Some(user.uid()), Some(user.gid()))
                    .map_err(std::io::Error::from)?;
            }
            // The child leads a new session with the terminal as its
            // controlling terminal (a supervisor then hands the terminal's
            // foreground to the program, `tree`).
            let child = pty_process::Command::from(command)
                .spawn(pts)
                .map_err(std::io::Error::other)?;
            Ok(Started {
                child,
                io: Io::Pty(pty),
            })
        }
    }
}

/// The program `command` names, as `execvp` would find it: a name with a
/// `/` from `cwd`, else the first executable file of that name on the
/// `PATH` the process gets (`env`'s, else the server's).
///
/// # Errors
/// 400 `invalid-request` for an empty name or one with a NUL byte; 400
/// `program-not-found` naming it when nothing executable is there.
pub(super) fn find_program(
    command: &str,
    cwd: &Path,
    env: &[(String, String)],
) -> Result<PathBuf, Error> {
    if command.is_empty() || command.contains('\0') {
        return Err(Error::InvalidRequest(
            "command must be a program name or path, without NUL bytes".to_owned(),
        ));
    }
    if command.contains('/') {
        let path = cwd.join(command);
        return if executable(&path) {
            Ok(path)
        } else {
            Err(Error::ProgramNotFound(format!(
                "{command}: no executable file at {}",
                path.display()
            )))
        };
    }
    let path = env
        .iter()
        .rev()
        .find(|(key, _)| key == "PATH")
        .map(|(_, value)| std::ffi::OsString::from(value))
        .or_else(|| std::env::var_os("PATH"))
        .unwrap_or_else(|| DEFAULT_PATH.into());
    std::env::split_paths(&path)
        .map(|dir| cwd.join(dir).join(command))
        .find(|candidate| executable(candidate))
        .ok_or_else(|| {
            Error::ProgramNotFound(format!(
                "{command}: not found on PATH ({})",
                path.to_string_lossy()
            ))
        })
}

/// The problem of a start that failed after the checks: 400 for an
/// argument list or environment over the system's limit (`E2BIG`) and for
/// a working directory that went away; 500 `io-error` otherwise.
pub(super) fn start_error(command: &str, cwd: &Path, error: &std::io::Error) -> Error {
    match error.raw_os_error() {
        Some(nix::libc::E2BIG) => Error::InvalidRequest(format!(
            "cannot start {command}: the arguments and environment are over the system's limit (E2BIG)"
        )),
        _ if !cwd.is_dir() => Error::InvalidPath(format!(
            "cannot start {command}: its working directory {} is gone",
            cwd.display()
        )),
        _ => Error::FsIo(format!(
            "cannot start {command} in {}: {error}",
            cwd.display()
        )),
    }
}

/// Whether `path` is a file the server may execute.
fn executable(path: &Path) -> bool {
    path.metadata().is_ok_and(|meta| meta.is_file()) && access(path, AccessFlags::X_OK).is_ok()
}

/// The program's pid behind the supervisor `supervisor`: the supervisor's
/// one child, read from `/proc`. `None` while it has not started it, or
/// once it is gone.
pub(super) fn program_behind(supervisor: Pid) -> Option<Pid> {
    let path = format!("/proc/{supervisor}/task/{supervisor}/children");
    let children = std::fs::read_to_string(path).ok()?;
    let first = children.split_ascii_whitespace().next()?;
    first.parse().ok().map(Pid::from_raw)
}

/// The foreground process group of the terminal `pid` runs on (`tpgid`
/// of `/proc/<pid>/stat`), when it has one.
pub(super) fn foreground_group(pid: Pid) -> Option<Pid> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name (which may hold spaces and parentheses):
    // state, ppid, pgrp, session, tty_nr, tpgid.
    let fields = stat.rsplit_once(')')?.1;
    let group: i32 = fields.split_ascii_whitespace().nth(5)?.parse().ok()?;
    (group > 0).then(|| Pid::from_raw(group))
}

/// Pauses between two looks for the program behind its supervisor: the
/// supervisor starts it within a few milliseconds of its own start.
pub(super) const PID_POLL: [Duration; 4] = [
    Duration::from_micros(200),
    Duration::from_millis(1),
    Duration::from_millis(5),
    Duration::from_millis(20),
];
