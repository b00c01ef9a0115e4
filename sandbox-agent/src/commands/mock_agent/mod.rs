//! The built-in mock agent (`sandbox-agent mock-agent`, agent id `mock`).
//!
//! A real ACP agent (protocol v1, agent side of the `agent-client-protocol`
//! crate) speaking newline-delimited JSON-RPC on stdin/stdout. It is
//! deterministic: the same prompt gives the same updates in the same order.
//! Its behaviour is specified in `research/contract.md`, section "The mock
//! agent"; [`Behaviour::from_prompt`](behaviour::Behaviour::from_prompt) is
//! the one place that maps prompt text to what a prompt turn does.
//!
//! How it is put together:
//! - stdin is read by tokio and handed to the SDK's [`Lines`] transport;
//! - stdout has exactly one writer, fed by one buffer of whole lines
//!   ([`Stdout`]): the SDK's serialized messages and the raw lines of
//!   `!garbage` / `!huge` go through the same buffer, so a raw line can never
//!   split a JSON line;
//! - request handlers run in the SDK's dispatch loop and never wait for the
//!   client; each prompt turn runs in a task spawned with `cx.spawn`, so
//!   `session/cancel` is handled while a turn runs;
//! - sessions live in one shared map
//!   ([`MockAgent::sessions`](agent::MockAgent::sessions)); with
//!   `--state-dir` each is also kept in a file of its own
//!   ([`StateDir`](state_dir::StateDir)), so `session/load` in a later
//!   process (after a runtime restart) finds it.
//!
//! # Layout
//! - this file: the process (`run`: stdout writer, `!crash` exit) and the
//!   ACP connection's foreground.
//! - [`args`]: the command line, [`MockAgentArgs`].
//! - [`handlers`](mod@handlers): every request and notification handler, in
//!   dispatch order.
//! - [`methods`]: the requests outside the v1 schema (`session/set_model`).
//! - [`agent`]: [`MockAgent`] and its answers to `initialize`,
//!   `authenticate` and the session methods.
//! - [`session`]: the sessions it keeps, their history and running turn.
//! - [`state_dir`]: `--state-dir`, one file per session.
//! - [`behaviour`]: what a prompt's text makes a turn do.
//! - [`turn`]: prompt turns: starting, cancelling and playing them,
//!   requests to the client included.
//! - [`stdio`]: stdin lines in, one stdout writer out.

mod agent;
mod args;
mod behaviour;
mod handlers;
mod methods;
mod session;
mod state_dir;
mod stdio;
mod turn;

/// The prompt command's tests ask this form.
#[cfg(test)]
pub(crate) use turn::question_form;

use std::io;
use std::sync::Arc;
use std::time::Duration;

use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::{Agent, Client, ConnectTo, Error, Lines};
use tokio_util::task::TaskTracker;

use agent::MockAgent;
pub use args::MockAgentArgs;
use handlers::handlers;
use stdio::{Stdout, stdin_lines, writer_stopped};

/// How long `!crash` waits for stdout to be written before exiting anyway.
const CRASH_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs the mock agent on this process's stdin/stdout until stdin closes.
///
/// With `--exit-at-start CODE` the process exits with CODE before reading
/// anything. When stdin closes, prompt turns still running are allowed to
/// finish (a turn waiting for the client ends, since the client is gone), then
/// this returns. `!crash [CODE]` ends the process with CODE, after everything
/// queued for stdout has been written; it does not return.
///
/// # Errors
/// An I/O error of stdin or stdout, or a failure of the ACP connection
/// (reported by the SDK, wrapped as [`io::ErrorKind::Other`]).
pub async fn run(args: MockAgentArgs) -> io::Result<()> {
    if let Some(code) = args.exit_at_start {
        std::process::exit(code);
    }
    if let Some(dir) = &args.state_dir {
        std::fs::create_dir_all(dir).map_err(|error| {
            io::Error::new(
                error.kind(),
                format!("--state-dir {}: {error}", dir.display()),
            )
        })?;
    }
    let (stdout, writer) = Stdout::new();
    // The writer runs in a task of its own, so writing overlaps serializing.
    let writer = tokio::spawn(writer);
    let (crash_tx, crash_rx) = tokio::sync::mpsc::unbounded_channel();
    let agent = Arc::new(MockAgent::new(&args, stdout.clone(), crash_tx));
    let transport = Lines::new(stdout.sink(), stdin_lines());

    let ending = serve(agent, transport, crash_rx).await;
    // The connection has queued its last line: write out the rest and stop.
    stdout.close();
    if let Ok(Ending::Crash(code)) = ending {
        exit_once_written(code, writer).await;
    }
    // A write error explains a failed connection better than the connection's error.
    writer
        .await
        .unwrap_or_else(|error| Err(io::Error::other(error)))?;
    ending.map_err(io::Error::other)?;
    Ok(())
}

/// `!crash`: exits with `code` once the writer has written everything, or
/// after [`CRASH_DRAIN_TIMEOUT`] if stdout is stuck (nobody reading).
async fn exit_once_written(code: i32, writer: tokio::task::JoinHandle<io::Result<()>>) -> ! {
    match tokio::time::timeout(CRASH_DRAIN_TIMEOUT, writer).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(error))) => eprintln!("mock agent: writing stdout failed: {error}"),
        Ok(Err(error)) => eprintln!("mock agent: the stdout writer failed: {error}"),
        Err(_) => eprintln!("mock agent: stdout not written after {CRASH_DRAIN_TIMEOUT:?}"),
    }
    std::process::exit(code)
}

/// Why the connection ended.
enum Ending {
    /// stdin reached EOF and every prompt turn has finished.
    StdinClosed,
    /// A `!crash` turn asked for the process to exit with this code.
    Crash(i32),
}

/// Runs the ACP connection: the handlers, and a foreground that ends on a
/// crash request, on stdin EOF once the running turns are done, or when
/// stdout fails. When the
/// foreground ends, the SDK writes out everything already queued and closes
/// the transport before this returns.
async fn serve(
    agent: Arc<MockAgent>,
    transport: impl ConnectTo<Agent> + 'static,
    crash_rx: tokio::sync::mpsc::UnboundedReceiver<i32>,
) -> Result<Ending, Error> {
    let turns = agent.turns.clone();
    let stdout = agent.stdout.clone();
    handlers(&agent)
        .connect_with(transport, async move |cx: ConnectionTo<Client>| {
            foreground(cx, crash_rx, turns, stdout).await
        })
        .await
}

/// The connection's foreground: ends on a crash request, on stdin EOF once
/// the running turns are done, or when stdout fails.
async fn foreground(
    cx: ConnectionTo<Client>,
    mut crash_rx: tokio::sync::mpsc::UnboundedReceiver<i32>,
    turns: TaskTracker,
    stdout: Stdout,
) -> Result<Ending, Error> {
    tokio::select! {
        Some(code) = crash_rx.recv() => Ok(Ending::Crash(code)),
        () = async {
            cx.incoming_closed().await;
            turns.close();
            turns.wait().await;
        } => Ok(Ending::StdinClosed),
        // Nothing can reach the client any more.
        () = stdout.failed() => Err(Error::into_internal_error(writer_stopped())),
    }
}
