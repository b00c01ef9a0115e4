//! `sandbox-agent supervise` (hidden): the tree supervisor the server starts
//! each agent process under (`acp_runtime::os::tree`), and `sandbox-agent
//! as-user` (hidden), what a supervisor with a user starts its program
//! through.

use clap::Args;
use std::process::ExitCode;

/// `sandbox-agent supervise --grace-ms N [--tty] [--user NAME:UID:GID [--cwd DIR]] -- PROGRAM ARGS…`: what the server
/// runs each agent process under (`acp_runtime::os::tree`).
#[derive(Debug, Clone, Args)]
pub struct SuperviseArgs {
    /// SIGTERM to SIGKILL of the tree in a graceful stop, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub grace_ms: u64,
    /// Stdin is a terminal this supervisor leads the session of: the
    /// program becomes its foreground process group.
    #[arg(long)]
    pub tty: bool,
    /// Run the program as this user (`NAME:UID:GID`); the supervisor stays
    /// root.
    #[arg(long, value_name = "NAME:UID:GID", value_parser = acp_runtime::os::user::AgentUser::from_arg)]
    pub user: Option<acp_runtime::os::user::AgentUser>,
    /// With `--user`: the program's working directory, entered as the user.
    #[arg(long, value_name = "DIR", requires = "user")]
    pub cwd: Option<std::path::PathBuf>,
    /// The program to run.
    pub program: std::ffi::OsString,
    /// Its arguments.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub args: Vec<std::ffi::OsString>,
}

/// Runs the program under the tree supervisor and returns its exit status.
/// `main` calls it before any async runtime thread exists (the supervisor
/// blocks signals for the whole process).
pub fn run(args: &SuperviseArgs) -> ExitCode {
    let status = acp_runtime::os::tree::run(
        std::time::Duration::from_millis(args.grace_ms),
        args.tty,
        args.user.as_ref().map(|user| (user, args.cwd.as_deref())),
        &args.program,
        &args.args,
    );
    ExitCode::from(u8::try_from(status).unwrap_or(1))
}

/// `sandbox-agent as-user --user NAME:UID:GID [--cwd DIR] -- PROGRAM ARGS…`:
/// becomes the user, then the program (`acp_runtime::os::tree::exec_as_user`).
#[derive(Debug, Clone, Args)]
pub struct AsUserArgs {
    /// The user to become (`NAME:UID:GID`).
    #[arg(long, value_name = "NAME:UID:GID", value_parser = acp_runtime::os::user::AgentUser::from_arg)]
    pub user: acp_runtime::os::user::AgentUser,
    /// The program's working directory, entered as the user.
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<std::path::PathBuf>,
    /// The program to run.
    pub program: std::ffi::OsString,
    /// Its arguments.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub args: Vec<std::ffi::OsString>,
}

/// Becomes the user and runs the program in place; returns only when that
/// fails, with the status to exit with (the message is on stderr already).
/// `main` calls it before any async runtime thread exists.
pub fn as_user(args: &AsUserArgs) -> ExitCode {
    let status = acp_runtime::os::tree::exec_as_user(
        &args.user,
        args.cwd.as_deref(),
        &args.program,
        &args.args,
    );
    ExitCode::from(u8::try_from(status).unwrap_or(1))
}
