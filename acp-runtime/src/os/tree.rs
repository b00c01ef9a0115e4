//! The tree supervisor: a small process between the server and one process
//! tree it starts (research/contract.md, "Agent process trees and a server
//! that dies"). The server re-runs its own binary as
//! `sandbox-agent supervise --grace-ms N -- PROGRAM ARGS…` in a process
//! group of its own; the supervisor
//!
//! - makes itself a child subreaper (`PR_SET_CHILD_SUBREAPER`), so every
//!   descendant that loses its parent, a `setsid` daemon included, is
//!   reparented to it and stays findable;
//! - starts the program with the supervisor's own stdio (the server's pipes:
//!   no byte is relayed) in the supervisor's process group;
//! - on SIGTERM, SIGINT or SIGHUP (a graceful stop) sends SIGTERM to every
//!   descendant it finds in `/proc` (not only to its process group) and,
//!   after the grace period, SIGKILL;
//! - when the server is gone (a parent-death signal, or its parent pid
//!   changed, checked every [`PARENT_CHECK`]), or on [`KILL_NOW`], sends
//!   SIGKILL to every descendant at once;
//! - when the program exits, kills whatever of its tree is left, reaps
//!   everything and exits as the program did (its code, or its signal).
//!
//! With `--tty` (a process of the process API on a pseudo-terminal, started
//! by the server as the session leader of the terminal's session) the
//! program gets a process group of its own and is made the terminal's
//! foreground group, so a `^C` typed into the terminal reaches the program
//! and its jobs, never the supervisor.
//!
//! With `--user` (`--agent-user`, research/contract.md, "Agents under an
//! unprivileged user") the supervisor stays root and only the program
//! becomes the user: the supervisor starts it as
//! `sandbox-agent as-user --user NAME:UID:GID [--cwd DIR] -- PROGRAM ARGS…`
//! ([`exec_as_user`]), a child that takes the user's groups, group and uid
//! and then executes the program in place (same pid). A process of the
//! user may signal only processes whose real or saved uid is its own, so
//! no program of any tree can kill or stop a supervisor and leave its
//! `setsid` daemons unsupervised. As root the supervisor never acts on a
//! path of the user's: it reads `/proc` and signals descendants, each
//! through a pidfd opened on the process it found ([`signal_descendants`]),
//! so a recycled pid is never signalled.
//!
//! Signals are read from a `signalfd`, not from handlers, so the whole loop
//! is plain sequential code with no `unsafe`. This module is the one place
//! a tree is started for the runtime: the user switch belongs here too.

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, Signal, kill, raise};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, getpid, getppid};

use super::user::AgentUser;
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Where the supervisor comes from: the binary that has the
/// [`SUBCOMMAND`], and the grace period it gives a stopping tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeSupervisor {
    /// The `sandbox-agent` binary (the server's own, `current_exe`).
    pub binary: std::path::PathBuf,
    /// SIGTERM to SIGKILL, in a graceful stop. Shorter than the server's
    /// own grace, so the supervisor reaches a tree's `setsid` escapees
    /// before the server's SIGKILL to the group ends the supervisor.
    pub grace: Duration,
    /// The user the program runs as (`--agent-user`; the supervisor
    /// itself stays root, module doc); `None`: the server's own.
    pub user: Option<super::user::AgentUser>,
}

/// The hidden subcommand that runs [`run`] (the binary's, after its name).
pub const SUBCOMMAND: &str = "supervise";
/// The hidden subcommand that runs [`exec_as_user`]: what a supervisor
/// with a user starts its program through.
pub const AS_USER_SUBCOMMAND: &str = "as-user";
/// The supervisor's own binary, as the kernel holds it (the file on disk
/// may have been replaced or removed since the server started).
const OWN_BINARY: &str = "/proc/self/exe";
/// How often the supervisor checks that its server is still its parent.
pub const PARENT_CHECK: Duration = Duration::from_millis(200);
/// Rounds of "find descendants, SIGKILL them" before giving up on a tree
/// that forks faster than it is killed.
const KILL_ROUNDS: usize = 20;
/// Pause between two kill rounds.
const KILL_ROUND_PAUSE: Duration = Duration::from_millis(5);
/// The signal the kernel sends the supervisor when the thread that started
/// it (in the server) is gone: "kill the tree now".
const PARENT_DEATH: Signal = Signal::SIGUSR1;
/// The signal the server sends when a tree must go at once (a start that
/// timed out, an agent that closed stdout but did not exit): SIGKILL to
/// every descendant, then exit. SIGKILL to the group would end the
/// supervisor before it reached the escapees.
pub const KILL_NOW: Signal = Signal::SIGUSR2;
/// Signals a key typed into a terminal sends its foreground process group
/// with no permission check (`^\`, `^Z`), which the supervisor takes and
/// drops: a program on the supervisor's terminal (or the server's) can make
/// the supervisor's group the foreground one and type them (`TIOCSTI`),
/// and a supervisor that quit or stopped would leave its tree unsupervised
/// (research/contract.md, "Agents under an unprivileged user"). `^C`
/// (SIGINT) is a graceful stop of the supervisor's own tree, which its
/// program may end anyway.
const TYPED_SIGNALS: [Signal; 2] = [Signal::SIGQUIT, Signal::SIGTSTP];
/// The server's secrets, which no process it starts inherits (agents and
/// processes of the process API alike): the bearer token, the store URL
/// (it may hold a database password) and the OTLP exporter's headers (they
/// carry the collector's credentials; research/contract.md, "Traces"). The
/// OTLP endpoint itself stays: an agent may export to the same collector.
pub const SECRET_ENV: [&str; 4] = [
    "SANDBOX_AGENT_TOKEN",
    "SANDBOX_AGENT_STORE",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
];
/// Names of the variables that carry a sealed program environment
/// ([`seal_env`]), numbered from 0.
pub const SEALED_ENV_PREFIX: &str = "SANDBOX_AGENT_SUPERVISED_ENV_";
/// Base64 characters per sealed variable.
const SEALED_ENV_CHUNK: usize = 120 * 1024;
/// Exit status when the program cannot be started (as a shell's 127).
const CANNOT_RUN: i32 = 127;

impl TreeSupervisor {
    /// The arguments that make a supervisor of `program args…` for this
    /// binary: `supervise --grace-ms N [--tty] [--user NAME:UID:GID --cwd
    /// DIR] -- program args…` (`tty`: the supervisor leads a terminal's
    /// session, module doc; `--user`: [`TreeSupervisor::user`]). With a
    /// user, the program's working directory `cwd` is entered by the
    /// program as that user, never by the supervisor as root (which could
    /// enter where the user may not); without one the caller sets the
    /// supervisor's own.
    pub fn command_args(
        &self,
        tty: bool,
        cwd: Option<&std::path::Path>,
        program: &OsStr,
        args: &[String],
    ) -> Vec<OsString> {
        let mut all = vec![
            OsString::from(SUBCOMMAND),
            OsString::from("--grace-ms"),
            OsString::from(self.grace.as_millis().to_string()),
        ];
        if tty {
            all.push(OsString::from("--tty"));
        }
        if let Some(user) = &self.user {
            all.push(OsString::from("--user"));
            all.push(OsString::from(user.to_arg()));
            if let Some(cwd) = cwd {
                all.push(OsString::from("--cwd"));
                all.push(cwd.as_os_str().to_owned());
            }
        }
        all.push(OsString::from("--"));
        all.push(program.to_owned());
        all.extend(args.iter().map(OsString::from));
        all
    }
}

/// The command that starts `program args…` in `cwd` with `env` on top of
/// the server's environment (minus [`SECRET_ENV`]): under `supervisor`
/// when there is one, else the program alone. With a user to switch to,
/// the supervisor (root) gets none of the program's variables and does not
/// enter its `cwd`: the program does both, as the user ([`seal_env`],
/// [`TreeSupervisor::command_args`], [`exec_as_user`]). Stdio, process
/// group and the rest are the caller's.
pub fn command(
    supervisor: Option<&TreeSupervisor>,
    tty: bool,
    program: &std::path::Path,
    args: &[String],
    cwd: Option<&std::path::Path>,
    env: &[(String, String)],
) -> tokio::process::Command {
    let Some(supervisor) = supervisor else {
        let mut command = tokio::process::Command::new(program);
        command.args(args);
        plain_env(&mut command, cwd, env);
        return command;
    };
    let mut command = tokio::process::Command::new(&supervisor.binary);
    command.args(supervisor.command_args(tty, cwd, program.as_os_str(), args));
    if supervisor.user.is_some() {
        let env = program_env(env.iter().cloned());
        command.env_clear().envs(seal_env(&env));
    } else {
        plain_env(&mut command, cwd, env);
    }
    command
}

/// `env` and `cwd` set on `command` as they are, the secrets removed.
fn plain_env(
    command: &mut tokio::process::Command,
    cwd: Option<&std::path::Path>,
    env: &[(String, String)],
) {
    for secret in SECRET_ENV {
        command.env_remove(secret);
    }
    if let Some(cwd) = cwd {
        command.current_dir(cwd);
    }
    command.envs(env.iter().map(|(key, value)| (key, value)));
}

/// The environment a program gets: the server's own minus
/// [`SECRET_ENV`], with `extra` set on top (a later entry wins).
pub fn program_env(extra: impl IntoIterator<Item = (String, String)>) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(key, _)| !SECRET_ENV.iter().any(|secret| key == OsStr::new(secret)))
        .collect();
    for (key, value) in extra {
        env.retain(|(k, _)| k != OsStr::new(&key));
        env.push((key.into(), value.into()));
    }
    env
}

/// `env` packed into the variables [`SEALED_ENV_PREFIX`]`0`, `…1`, …: the
/// whole environment of a supervisor whose program runs as another user.
/// The supervisor, root, then sees none of the program's variables (an
/// `LD_PRELOAD` for the program must not load into a root process); the
/// program gets them once it is the user ([`exec_as_user`],
/// [`unseal_env`]). Each pair is `KEY=VALUE`
/// and a NUL (neither may hold one), base64, cut below the kernel's 128
/// KiB bound on one variable.
pub fn seal_env(env: &[(OsString, OsString)]) -> Vec<(String, String)> {
    use base64::Engine as _;
    use std::os::unix::ffi::OsStrExt as _;
    let mut packed = Vec::new();
    for (key, value) in env {
        packed.extend_from_slice(key.as_bytes());
        packed.push(b'=');
        packed.extend_from_slice(value.as_bytes());
        packed.push(0);
    }
    let text = base64::engine::general_purpose::STANDARD.encode(packed);
    text.as_bytes()
        .chunks(SEALED_ENV_CHUNK)
        .enumerate()
        .map(|(index, chunk)| {
            (
                format!("{SEALED_ENV_PREFIX}{index}"),
                String::from_utf8_lossy(chunk).into_owned(),
            )
        })
        .collect()
}

/// The environment [`seal_env`] packed into this process's own, if any.
fn unseal_env() -> Option<Vec<(OsString, OsString)>> {
    unseal_from(|name| std::env::var(name).ok())
}

/// [`unseal_env`] from the variables `lookup` finds.
fn unseal_from(lookup: impl Fn(&str) -> Option<String>) -> Option<Vec<(OsString, OsString)>> {
    use base64::Engine as _;
    use std::os::unix::ffi::OsStringExt as _;
    let mut text = String::new();
    for index in 0.. {
        match lookup(&format!("{SEALED_ENV_PREFIX}{index}")) {
            Some(chunk) => text.push_str(&chunk),
            None if index == 0 => return None,
            None => break,
        }
    }
    let packed = base64::engine::general_purpose::STANDARD
        .decode(text)
        .ok()?;
    Some(
        packed
            .split(|byte| *byte == 0)
            .filter(|pair| !pair.is_empty())
            .filter_map(|pair| {
                let equals = pair.iter().position(|byte| *byte == b'=')?;
                Some((
                    OsString::from_vec(pair[..equals].to_vec()),
                    OsString::from_vec(pair[equals + 1..].to_vec()),
                ))
            })
            .collect(),
    )
}

/// Runs the supervisor of `program args…` (module doc) and returns the exit
/// status to leave with; when the program died of a signal, the supervisor
/// dies of the same signal before returning. `tty`: stdin is the terminal
/// of the supervisor's session, and the program becomes its foreground
/// process group. `user`: the program runs as that user, started through
/// [`exec_as_user`] with the supervisor's own (sealed) environment; it
/// enters its working directory (the `Path`) as the user. The supervisor
/// stays root (module doc). Call it before any other thread exists: it
/// blocks signals for the process.
pub fn run(
    grace: Duration,
    tty: bool,
    user: Option<(&AgentUser, Option<&std::path::Path>)>,
    program: &OsStr,
    args: &[OsString],
) -> i32 {
    match Supervisor::start(grace, tty, user, program, args) {
        Ok(supervisor) => supervisor.serve(),
        Err((status, message)) => {
            eprintln!("sandbox-agent {SUBCOMMAND}: {message}");
            status
        }
    }
}

/// Becomes `user` and then runs `program args…` in place (the same pid,
/// the supervisor's child): what `sandbox-agent as-user` does. First the
/// user's supplementary groups (`initgroups`, never root's), its primary
/// group and its uid (real, effective and saved: no way back); then the
/// program's environment, unsealed from this process's own
/// ([`seal_env`]), and its working directory `cwd`, entered as the user
/// (a folder closed to the user fails here, whatever root could enter).
/// Returns only when that fails: the status to exit with (1: the switch
/// failed; 127, [`CANNOT_RUN`]: the program or its `cwd`), after a line on
/// stderr naming the program. Call it before any other thread exists.
pub fn exec_as_user(
    user: &AgentUser,
    cwd: Option<&std::path::Path>,
    program: &OsStr,
    args: &[OsString],
) -> i32 {
    let sealed = unseal_env();
    if let Err((status, message)) = become_user(user) {
        eprintln!("sandbox-agent {SUBCOMMAND}: {message}");
        return status;
    }
    let mut command = std::process::Command::new(program);
    command.args(args);
    if let Some(env) = sealed {
        command.env_clear().envs(env);
    }
    if let Some(cwd) = cwd {
        command.current_dir(cwd);
    }
    let error = command.exec();
    eprintln!(
        "sandbox-agent {SUBCOMMAND}: cannot run {}: {error}",
        program.to_string_lossy()
    );
    CANNOT_RUN
}

/// Becomes `user`: its supplementary groups (`initgroups`, never root's),
/// its primary group, then its uid (real, effective and saved, so there is
/// no way back).
fn become_user(user: &AgentUser) -> Result<(), (i32, String)> {
    let failed = |what: &str, errno: Errno| {
        (
            1,
            format!("cannot become user {} ({what}): {errno}", user.name),
        )
    };
    let name = std::ffi::CString::new(user.name.as_str())
        .map_err(|_| (1, format!("user name {:?} holds a NUL byte", user.name)))?;
    nix::unistd::initgroups(&name, user.gid()).map_err(|e| failed("initgroups", e))?;
    nix::unistd::setgid(user.gid()).map_err(|e| failed("setgid", e))?;
    nix::unistd::setuid(user.uid()).map_err(|e| failed("setuid", e))?;
    Ok(())
}

/// One supervised tree.
struct Supervisor {
    /// The server, our parent when we started.
    parent: Pid,
    /// Stop and death signals, read as data.
    signals: SignalFd,
    /// The program's pid.
    program: Pid,
    /// How long a graceful stop waits before SIGKILL.
    grace: Duration,
    /// How the program ended, once it was reaped.
    program_status: Option<WaitStatus>,
    /// A stop signal came before the signal mask was set.
    early_stop: bool,
    /// A kill-now signal came before the signal mask was set.
    early_kill: bool,
}

impl Supervisor {
    fn start(
        grace: Duration,
        tty: bool,
        user: Option<(&AgentUser, Option<&std::path::Path>)>,
        program: &OsStr,
        args: &[OsString],
    ) -> Result<Self, (i32, String)> {
        let parent = getppid();
        let setup = |what: &str, errno: Errno| (1, format!("cannot {what}: {errno}"));
        nix::sys::prctl::set_child_subreaper(true)
            .map_err(|e| setup("become a child subreaper", e))?;
        // Until the mask below is set, a stop or kill-now signal is caught
        // by a handler that only notes it (so it cannot end the supervisor
        // and leave the program behind); a typed one is noted and dropped. The program is started before the
        // mask: it inherits the mask, not the handlers (exec resets caught
        // signals to their default), and it must get its signals.
        let early_stop = Arc::new(AtomicBool::new(false));
        let early_kill = Arc::new(AtomicBool::new(false));
        for signal in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
            signal_hook::flag::register(signal as i32, early_stop.clone())
                .map_err(|e| (1, format!("cannot catch {signal}: {e}")))?;
        }
        signal_hook::flag::register(KILL_NOW as i32, early_kill.clone())
            .map_err(|e| (1, format!("cannot catch {KILL_NOW}: {e}")))?;
        let typed = Arc::new(AtomicBool::new(false));
        for signal in TYPED_SIGNALS {
            signal_hook::flag::register(signal as i32, typed.clone())
                .map_err(|e| (1, format!("cannot catch {signal}: {e}")))?;
        }
        // With a user, the supervisor keeps root's credentials (so no
        // program of the user can signal it, and its parent-death signal,
        // asked for below, is never cleared by a change of credentials):
        // its child becomes the user, then the program. The child gets the
        // supervisor's environment, the sealed one alone.
        let mut command = match user {
            Some((user, cwd)) => {
                let mut command = std::process::Command::new(OWN_BINARY);
                command.args([AS_USER_SUBCOMMAND, "--user", &user.to_arg()]);
                if let Some(cwd) = cwd {
                    command.arg("--cwd").arg(cwd);
                }
                command.arg("--").arg(program).args(args);
                command
            }
            None => {
                let mut command = std::process::Command::new(program);
                command.args(args);
                command
            }
        };
        if tty {
            command.process_group(0);
        }
        let child = command.spawn().map_err(|error| {
            (
                CANNOT_RUN,
                format!("cannot run {}: {error}", program.to_string_lossy()),
            )
        })?;
        let program = Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
        // Reaped below with waitpid, like every other descendant.
        drop(child);
        if tty {
            // The program's group takes the terminal. It may have touched
            // the terminal before this (and been stopped as a background
            // group): SIGCONT lets it go on. A program already gone leaves
            // nothing to hand the terminal to.
            let terminal = std::io::stdin();
            if nix::unistd::tcsetpgrp(terminal.as_fd(), program).is_ok() {
                let _ = nix::sys::signal::killpg(program, Signal::SIGCONT);
            }
        }
        let mut mask = SigSet::empty();
        for signal in [
            Signal::SIGTERM,
            Signal::SIGINT,
            Signal::SIGHUP,
            Signal::SIGCHLD,
            PARENT_DEATH,
            KILL_NOW,
        ]
        .into_iter()
        .chain(TYPED_SIGNALS)
        {
            mask.add(signal);
        }
        mask.thread_block().map_err(|e| setup("block signals", e))?;
        let signals = SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
            .map_err(|e| setup("open a signalfd", e))?;
        nix::sys::prctl::set_pdeathsig(PARENT_DEATH)
            .map_err(|e| setup("ask for a parent-death signal", e))?;
        // A server gone before the parent-death signal was asked for is seen
        // by the parent pid check of the first loop.
        Ok(Self {
            parent,
            signals,
            program,
            grace,
            program_status: None,
            early_stop: early_stop.load(Ordering::SeqCst),
            early_kill: early_kill.load(Ordering::SeqCst),
        })
    }

    /// The loop: reap, watch the parent, take signals, until the program
    /// has exited and its tree is gone.
    fn serve(mut self) -> i32 {
        let mut stop_deadline: Option<Instant> = None;
        if self.early_kill {
            self.kill_descendants_until_gone();
        } else if self.early_stop {
            signal_descendants(Signal::SIGTERM);
            stop_deadline = Some(Instant::now() + self.grace);
        }
        loop {
            self.reap();
            if let Some(status) = self.program_status {
                // The program is gone: nothing of its tree may stay.
                self.kill_descendants_until_gone();
                return exit_like(status);
            }
            if getppid() != self.parent {
                self.kill_descendants_until_gone();
            }
            if stop_deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                self.kill_descendants_until_gone();
                stop_deadline = None;
            }
            let mut fds = [PollFd::new(self.signals.as_fd(), PollFlags::POLLIN)];
            let wait = stop_deadline
                .map_or(PARENT_CHECK, |deadline| {
                    deadline.saturating_duration_since(Instant::now())
                })
                .min(PARENT_CHECK);
            let _ = poll(
                &mut fds,
                PollTimeout::try_from(wait).unwrap_or(PollTimeout::ZERO),
            );
            while let Ok(Some(info)) = self.signals.read_signal() {
                match Signal::try_from(i32::try_from(info.ssi_signo).unwrap_or(0)) {
                    Ok(Signal::SIGTERM | Signal::SIGINT | Signal::SIGHUP)
                        if stop_deadline.is_none() =>
                    {
                        signal_descendants(Signal::SIGTERM);
                        stop_deadline = Some(Instant::now() + self.grace);
                    }
                    // Also sent when only the server's thread that started
                    // us ended: the parent pid says whether the server is
                    // gone, checked at the top of the loop.
                    Ok(PARENT_DEATH) if getppid() != self.parent => {
                        self.kill_descendants_until_gone();
                    }
                    Ok(KILL_NOW) => self.kill_descendants_until_gone(),
                    _ => {}
                }
            }
        }
    }

    /// Reaps every child that exited (orphans reparented to us included),
    /// keeping the program's status when it is among them. Whether a child
    /// is left (`false`: none, and so no descendant either: as a subreaper
    /// we are the parent of every orphan of our tree).
    fn reap(&mut self) -> bool {
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => return true,
                Err(Errno::ECHILD) => return false,
                Ok(status) => {
                    if status.pid() == Some(self.program)
                        && matches!(status, WaitStatus::Exited(..) | WaitStatus::Signaled(..))
                    {
                        self.program_status = Some(status);
                    }
                }
                Err(Errno::EINTR) => {}
                Err(_) => return true,
            }
        }
    }

    /// SIGKILL to every descendant, again and again until none is left
    /// (a process forking while it is killed leaves a new child), reaping
    /// as it goes. Bounded by [`KILL_ROUNDS`].
    fn kill_descendants_until_gone(&mut self) {
        for _ in 0..KILL_ROUNDS {
            // No child, no descendant: the walk over `/proc` (the slow
            // part of a short program's supervision) is not needed.
            if !self.reap() {
                return;
            }
            if signal_descendants(Signal::SIGKILL) == 0 {
                self.reap();
                return;
            }
            std::thread::sleep(KILL_ROUND_PAUSE);
        }
    }
}

/// Leaves as the program did: its exit code, or death by its signal.
fn exit_like(status: WaitStatus) -> i32 {
    match status {
        WaitStatus::Exited(_, code) => code,
        WaitStatus::Signaled(_, signal, _) => {
            // The signal's default action back (a stop signal has the
            // early handler), unblocked, raised: this ends the supervisor
            // the way the program ended.
            let _ = signal_hook::low_level::emulate_default_handler(signal as i32);
            let _ = raise(signal);
            let _ = SigSet::from(signal).thread_unblock();
            128 + signal as i32
        }
        _ => 1,
    }
}

/// Sends `signal` to every descendant of this process; how many were
/// found. Each one through a pidfd opened on it, once its start time shows
/// it is still the process found: between the walk over `/proc` and the
/// signal a descendant may exit, be reaped by its parent and its pid go to
/// another process, which a root supervisor must not signal. Without
/// pidfds (Linux before 5.3) the start time is checked just before
/// `kill`, which narrows that window to the two calls.
fn signal_descendants(signal: Signal) -> usize {
    let found = descendants();
    for (pid, start_time) in &found {
        signal_process(*pid, *start_time, signal);
    }
    found.len()
}

/// Sends `signal` to `pid` if it is still the process that started at
/// `start_time` (field 22 of `/proc/<pid>/stat`) and not a zombie
/// ([`signal_descendants`]).
fn signal_process(pid: Pid, start_time: u64, signal: Signal) {
    let same = || {
        u32::try_from(pid.as_raw())
            .ok()
            .and_then(super::orphans::stat_fields)
            .is_some_and(|stat| stat.start_time == start_time && stat.state != 'Z')
    };
    let Some(target) = rustix::process::Pid::from_raw(pid.as_raw()) else {
        return;
    };
    match rustix::process::pidfd_open(target, rustix::process::PidfdFlags::empty()) {
        // The pidfd names the process that had the pid when it was opened:
        // if that is still the one found, the signal can reach no other.
        Ok(pidfd) => {
            if same()
                && let Some(raw) = rustix::process::Signal::from_named_raw(signal as i32)
            {
                let _ = rustix::process::pidfd_send_signal(&pidfd, raw);
            }
        }
        Err(rustix::io::Errno::SRCH) => {}
        Err(_) => {
            if same() {
                let _ = kill(pid, signal);
            }
        }
    }
}

/// Every live (not zombie) descendant of this process, from `/proc`, with
/// its start time.
fn descendants() -> Vec<(Pid, u64)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut children: HashMap<i32, Vec<(i32, u64)>> = HashMap::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if let Some(stat) = u32::try_from(pid)
            .ok()
            .and_then(super::orphans::stat_fields)
            && stat.state != 'Z'
            && let Ok(ppid) = i32::try_from(stat.ppid)
        {
            children
                .entry(ppid)
                .or_default()
                .push((pid, stat.start_time));
        }
    }
    let mut found = Vec::new();
    let mut pending = vec![getpid().as_raw()];
    while let Some(parent) = pending.pop() {
        if let Some(kids) = children.remove(&parent) {
            for (kid, start_time) in kids {
                found.push((Pid::from_raw(kid), start_time));
                pending.push(kid);
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_environment_opens_to_the_same_pairs() {
        let env: Vec<(OsString, OsString)> = vec![
            ("LD_PRELOAD".into(), "/tmp/x.so".into()),
            ("EMPTY".into(), "".into()),
            ("WITH_EQUALS".into(), "a=b=c".into()),
            ("BIG".into(), "x".repeat(300 * 1024).into()),
        ];
        let sealed = seal_env(&env);
        assert!(sealed.len() >= 3, "cut into several variables");
        assert!(
            sealed
                .iter()
                .all(|(key, value)| key.starts_with(SEALED_ENV_PREFIX)
                    && value.len() <= SEALED_ENV_CHUNK)
        );
        assert!(!sealed.iter().any(|(key, _)| key == "LD_PRELOAD"));
        let found: HashMap<String, String> = sealed.into_iter().collect();
        let opened = unseal_from(|name| found.get(name).cloned()).expect("sealed");
        assert_eq!(opened, env);
        assert_eq!(unseal_from(|_| None), None, "nothing sealed");
    }

    #[test]
    fn a_process_is_signalled_only_while_it_is_the_one_found() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let pid = Pid::from_raw(i32::try_from(child.id()).expect("pid"));
        let start_time = super::super::orphans::stat_fields(child.id())
            .expect("stat")
            .start_time;
        // Another start time: a recycled pid, never signalled.
        signal_process(pid, start_time + 1, Signal::SIGKILL);
        std::thread::sleep(Duration::from_millis(100));
        assert!(child.try_wait().expect("wait").is_none(), "still running");
        signal_process(pid, start_time, Signal::SIGKILL);
        let status = child.wait().expect("wait");
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(status.signal(), Some(Signal::SIGKILL as i32));
    }

    #[test]
    fn the_command_line_names_the_grace_and_the_program() {
        let supervisor = |grace: u64, user: Option<AgentUser>| TreeSupervisor {
            binary: "/bin/sandbox-agent".into(),
            grace: Duration::from_millis(grace),
            user,
        };
        let args = supervisor(2500, None).command_args(
            false,
            Some(std::path::Path::new("/work")),
            OsStr::new("/bin/agent"),
            &["--acp".to_owned()],
        );
        assert_eq!(
            args,
            [
                "supervise",
                "--grace-ms",
                "2500",
                "--",
                "/bin/agent",
                "--acp"
            ]
            .map(OsString::from)
            .to_vec()
        );
        let user = AgentUser {
            name: "agent".to_owned(),
            uid: 1000,
            gid: 1001,
            home: "/home/agent".into(),
            groups: Vec::new(),
        };
        let tty = supervisor(10, Some(user)).command_args(
            true,
            Some(std::path::Path::new("/work")),
            OsStr::new("sh"),
            &[],
        );
        assert_eq!(
            tty,
            [
                "supervise",
                "--grace-ms",
                "10",
                "--tty",
                "--user",
                "agent:1000:1001",
                "--cwd",
                "/work",
                "--",
                "sh"
            ]
            .map(OsString::from)
            .to_vec()
        );
    }
}
