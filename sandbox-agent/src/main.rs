//! The `sandbox-agent` binary: parses the command line, picks the async
//! runtime each command wants, and runs the command.
//!
//! # Layout
//! - [`cli`]: the command line (clap): the top-level parser and the
//!   subcommand enum.
//! - [`commands`]: one module per subcommand, each with its own arguments —
//!   `server` (the runtime, `acp_runtime`), `prompt` (the quick start, on
//!   `sandbox-agent-sdk`), `bridge` (ACP on stdio for editors, on
//!   `acp-http-client`), `agents` (list and install), `bench` (the load
//!   generator), `mock_agent` (the built-in deterministic agent the server
//!   runs as `mock`), `sessions` (the inventory and event logs, from a
//!   server or a session store), `fs` (files in and out of a server),
//!   `exec` and `ps` (programs run in a server's sandbox),
//!   `supervise` (the agents' tree supervisor); `args` holds the argument
//!   groups several commands share.
//! - [`signals`]: the server's SIGINT and SIGTERM, on a thread of their
//!   own, and the bound on how long its shutdown may take.
//! - [`telemetry`]: the server's log lines, and its spans over OTLP when
//!   the OpenTelemetry variables ask for them.
//!
//! One executable on purpose: embedded mode (the SDK) and the `mock` agent
//! re-run it.

mod cli;
mod commands;
mod signals;
mod telemetry;
mod version;

/// jemalloc, not glibc's malloc: freed memory goes back to the system (its
/// options are in `.cargo/config.toml`), so the server's RSS falls after
/// sessions end and connections close (research/contract.md, "Memory
/// budget"; the measurement is in research/decisions.md).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use clap::{CommandFactory, FromArgMatches};
use cli::{Cli, Command};
use commands::server::LogFormat;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = parse_command_line();
    // Before any runtime thread exists: the supervisor blocks signals for
    // the whole process and reads them from a signalfd.
    if let Command::Supervise(args) = &cli.command {
        return commands::supervise::run(args);
    }
    if let Command::AsUser(args) = &cli.command {
        return commands::supervise::as_user(args);
    }
    if let Command::Openapi = cli.command {
        print!("{}", acp_runtime::openapi_document());
        return ExitCode::SUCCESS;
    }
    // Built before the async runtime: the exporter has a thread and an
    // HTTP client of its own, and its shutdown blocks.
    let traces = match &cli.command {
        Command::Server(_) => telemetry::Traces::from_env(),
        _ => Ok(None),
    };
    let (traces, traces_error) = match traces {
        Ok(traces) => (traces, None),
        Err(error) => (None, Some(error)),
    };
    let exporting = traces.as_ref();
    let runtime = match runtime_for(&cli.command).enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("sandbox-agent: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        let done = match cli.command {
            Command::Server(args) => {
                let format = args.log_format;
                telemetry::init_server("info", format, exporting);
                if let Some(error) = traces_error {
                    tracing::warn!("{error}");
                }
                let served = commands::server::run(*args).await;
                if let (LogFormat::Json, Err(error)) = (format, &served) {
                    // A log collector reads stderr as JSON lines: the error
                    // that stops the server is one of them, not plain text.
                    tracing::error!(error = %error, "stopped");
                    return Ok(ExitCode::FAILURE);
                }
                served
            }
            Command::Agents(args) => {
                // The spinner shows progress; the log only has what went wrong.
                init_logging("error");
                commands::agents::run(args).await
            }
            Command::Prompt(args) => commands::prompt::run(args).await,
            Command::Bridge(args) => {
                // stdout is the ACP channel: logs go to stderr only.
                init_logging("warn");
                commands::bridge::run(args).await
            }
            Command::MockAgent(args) => commands::mock_agent::run(args)
                .await
                .map_err(|e| e.to_string()),
            Command::Bench(args) => commands::bench::run(args).await,
            // Handled above, before the async runtime.
            Command::Supervise(_) | Command::AsUser(_) | Command::Openapi => Ok(()),
            Command::Fs(args) => {
                init_logging("error");
                commands::fs::run(args).await
            }
            Command::Sessions(args) => {
                init_logging("error");
                commands::sessions::run(args).await
            }
            Command::Ps(args) => {
                init_logging("error");
                commands::ps::run(args).await
            }
            // The program's exit status is exec's own.
            Command::Exec(args) => {
                init_logging("error");
                return Ok(commands::exec::run(args).await);
            }
        };
        done.map(|()| ExitCode::SUCCESS)
    });
    // Do not wait for blocking reads of stdin and the like.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    // The server has stopped (SIGTERM, ctrl-c, stdin EOF, an error): its
    // last spans go out before the process exits (research/contract.md,
    // "Traces").
    if let Some(traces) = traces {
        traces.shutdown();
    }
    match result {
        Ok(status) => status,
        Err(error) => {
            eprintln!("sandbox-agent: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The async runtime each command runs on. The server uses
/// `--worker-threads` (one thread by default); the mock agent keeps tokio's
/// default multi-threaded runtime; the client-side commands need one thread.
/// `Cli::parse()`, with `--version`'s commit, target and glibc lines
/// (src/version.rs), which read the binary's own file: only when asked.
fn parse_command_line() -> Cli {
    let mut command = Cli::command();
    if std::env::args_os().any(|arg| arg == "--version") {
        // Leaked once: clap keeps &'static str, and the process prints it
        // and exits.
        command = command.long_version(&*Box::leak(version::long_version().into_boxed_str()));
    }
    Cli::from_arg_matches(&command.get_matches()).unwrap_or_else(|error| error.exit())
}

fn runtime_for(command: &Command) -> tokio::runtime::Builder {
    let threads = match command {
        Command::Server(args) => args.worker_threads,
        Command::MockAgent(_) => return tokio::runtime::Builder::new_multi_thread(),
        _ => 1,
    };
    if threads <= 1 {
        return tokio::runtime::Builder::new_current_thread();
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.worker_threads(threads);
    builder
}

/// Logs to stderr; the level comes from `RUST_LOG` (else `default`).
///
/// A log line that cannot be written is dropped silently: by default
/// tracing-subscriber reports the failure with `eprintln!`, which panics when
/// stderr itself is the broken pipe (an embedded server whose parent died),
/// and that panic would take down whatever task logged.
/// The server's variant is [`telemetry::init_server`], which adds the JSON
/// format and the trace export.
fn init_logging(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .log_internal_errors(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}
