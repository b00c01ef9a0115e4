//! The `sandbox-agent` binary.
use acp_runtime::cli::{Cli, Command};
use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("sandbox-agent: cannot start the async runtime: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::MockAgent(args) => acp_runtime::mock_agent::run(args).await,
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("sandbox-agent: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}
