//! The built-in mock agent. See `research/contract.md`.
use crate::cli::MockAgentArgs;

/// Runs the mock agent on this process's stdin/stdout until stdin closes.
pub async fn run(args: MockAgentArgs) -> std::io::Result<()> {
    if let Some(code) = args.exit_at_start {
        std::process::exit(code);
    }
    Ok(())
}
