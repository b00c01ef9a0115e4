//! The `sandbox-agent` binary.
use acp_runtime::cli::{Cli, Command};
use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match runtime_for(&cli.command).enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("sandbox-agent: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Server(args) => {
                init_logging("info");
                let config = args.into_config()?;
                acp_runtime::server::run(config)
                    .await
                    .map_err(|e| format!("server failed: {e}"))
            }
            Command::Agents(args) => {
                // The spinner shows progress; the log only has what went wrong.
                init_logging("error");
                acp_runtime::agents_command::run(args).await
            }
            Command::Prompt(args) => acp_runtime::prompt::run(args).await,
            Command::Bridge(args) => {
                // stdout is the ACP channel: logs go to stderr only.
                init_logging("warn");
                acp_runtime::bridge::run(args).await
            }
            Command::MockAgent(args) => acp_runtime::mock_agent::run(args)
                .await
                .map_err(|e| e.to_string()),
            Command::Bench(args) => {
                let json = args.json;
                let options = args.into_options()?;
                let report = acp_runtime::bench::run(options)
                    .await
                    .map_err(|e| format!("bench failed: {e}"))?;
                if json {
                    let checks = report.checks();
                    let value = serde_json::json!({ "report": report, "checks": checks });
                    println!(
                        "{}",
                        serde_json::to_string_pretty(&value).unwrap_or_default()
                    );
                } else {
                    print!("{}", report.render());
                }
                Ok(())
            }
        }
    });
    // Do not wait for blocking reads of stdin and the like.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("sandbox-agent: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The async runtime each command runs on. The server uses
/// `--worker-threads` (one thread by default); the mock agent keeps tokio's
/// default multi-threaded runtime; the client-side commands need one thread.
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
fn init_logging(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .log_internal_errors(false)
        .init();
}
