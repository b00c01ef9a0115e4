//! What a start asks for and what a process record may hold: [`StartRequest`]
//! (checked before anything runs) and [`ProcessLimits`] with the record bounds
//! (research/contract.md, "Processes and terminals", limits).

use super::spawn::TtySize;
use crate::error::Error;
use bytes::Bytes;
use std::path::PathBuf;

/// The bounds of the process API (server flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessLimits {
    /// Processes running at once (`--max-processes`; 429 past it).
    pub max_running: usize,
    /// Output retained per process, in bytes (`--process-output-bytes`).
    pub output_bytes: usize,
    /// Exited processes kept for reading (`--kept-processes`); the oldest
    /// is forgotten past it.
    pub kept_exited: usize,
}

/// Most bytes of a process's `title` (research/contract.md, "Process
/// trees, bounds, shutdown"): 400 `invalid-request` past it.
pub const MAX_TITLE_BYTES: usize = 1024;
/// Most bytes of a process's `command`, `args` and `env` together, each
/// string counted with one byte more (its NUL or `=`): what a record keeps
/// for reading and the program is started with. 400 past it.
pub const MAX_COMMAND_LINE_BYTES: usize = 64 * 1024;
/// Most bytes of the `sessionId` a process names. 400 past it.
pub const MAX_SESSION_ID_BYTES: usize = 1024;
/// Most bytes one page of the process list may take as JSON, counted as
/// the worst case (every byte of every string escaped as `\u00XX`): a
/// page stops early, with `nextCursor`, rather than pass it. One process
/// always fits.
pub const MAX_LIST_PAGE_BYTES: usize = 4 << 20;
/// What a record costs beyond its strings, as counted in the memory
/// budget and a list page: the fixed fields, the allocations' headers.
pub(super) const RECORD_OVERHEAD_BYTES: usize = 512;

impl Default for ProcessLimits {
    fn default() -> Self {
        Self {
            max_running: 64,
            output_bytes: 1024 * 1024,
            kept_exited: 256,
        }
    }
}

/// What to start.
#[derive(Debug, Clone, Default)]
pub struct StartRequest {
    /// The program: a name found on `PATH`, or a path (never a shell line).
    pub command: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Its working directory, already resolved and checked by the caller
    /// (the host file system rules).
    pub cwd: PathBuf,
    /// Variables set on top of the server's environment (minus its
    /// secrets).
    pub env: Vec<(String, String)>,
    /// A terminal of this size, or pipes.
    pub tty: Option<TtySize>,
    /// Bytes written to stdin first.
    pub stdin: Option<Bytes>,
    /// Close stdin after `stdin` (end of file).
    pub close_stdin: bool,
    /// A label for people.
    pub title: Option<String>,
    /// The session this process belongs to (an agent's terminal, or a
    /// client's choice).
    pub session_id: Option<String>,
    /// Retained output in bytes, instead of the server's default.
    pub output_bytes: Option<usize>,
}

impl StartRequest {
    /// Checks what the operating system cannot take: arguments with a NUL
    /// byte, a variable name that is empty or holds `=` or NUL, a value
    /// with NUL (for every surface that starts processes: the routes, an
    /// agent's `terminal/create`).
    ///
    /// # Errors
    /// 400 `invalid-request` naming what is wrong.
    pub fn check_args_and_env(args: &[String], env: &[(String, String)]) -> Result<(), Error> {
        let bytes = command_line_bytes("", args, env);
        if bytes > MAX_COMMAND_LINE_BYTES {
            return Err(Error::InvalidRequest(format!(
                "args and env hold {bytes} bytes; at most {MAX_COMMAND_LINE_BYTES} together"
            )));
        }
        for (key, value) in env {
            if key.is_empty() || key.contains(['=', '\0']) || value.contains('\0') {
                return Err(Error::InvalidRequest(format!(
                    "env: {key:?} is not a valid variable (a name without = or NUL, a value without NUL)"
                )));
            }
        }
        if args.iter().any(|arg| arg.contains('\0')) {
            return Err(Error::InvalidRequest(
                "args must not contain NUL bytes".to_owned(),
            ));
        }
        Ok(())
    }

    /// Checks the bounds of what a process record keeps (research/
    /// contract.md, "Process trees, bounds, shutdown"): `command`, `args`
    /// and `env` together at most [`MAX_COMMAND_LINE_BYTES`], `title` at
    /// most [`MAX_TITLE_BYTES`], `sessionId` at most
    /// [`MAX_SESSION_ID_BYTES`]; and [`StartRequest::check_args_and_env`].
    ///
    /// # Errors
    /// 400 `invalid-request` naming the member and its bound.
    pub fn check(&self) -> Result<(), Error> {
        Self::check_args_and_env(&self.args, &self.env)?;
        let bytes = command_line_bytes(&self.command, &self.args, &self.env);
        if bytes > MAX_COMMAND_LINE_BYTES {
            return Err(Error::InvalidRequest(format!(
                "command, args and env hold {bytes} bytes; at most {MAX_COMMAND_LINE_BYTES} together"
            )));
        }
        let too_long = |member: &str, value: Option<&String>, max: usize| match value {
            Some(value) if value.len() > max => Err(Error::InvalidRequest(format!(
                "{member} holds {} bytes; at most {max}",
                value.len()
            ))),
            _ => Ok(()),
        };
        too_long("title", self.title.as_ref(), MAX_TITLE_BYTES)?;
        too_long("sessionId", self.session_id.as_ref(), MAX_SESSION_ID_BYTES)
    }
}

/// The bytes of `command` (none when empty), `args` and `env`, each string
/// with one more (its NUL, or the `=` of a variable).
pub(super) fn command_line_bytes(
    command: &str,
    args: &[String],
    env: &[(String, String)],
) -> usize {
    let command = if command.is_empty() {
        0
    } else {
        command.len() + 1
    };
    args.iter()
        .map(String::len)
        .chain(env.iter().map(|(key, value)| key.len() + value.len()))
        .fold(command, |sum, len| sum.saturating_add(len + 1))
}
