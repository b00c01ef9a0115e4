//! `sandbox-agent prompt`: the quick start, one prompt through the SDK with
//! the reply streamed to the terminal (issue 5).

use clap::Args;

/// `sandbox-agent prompt [--agent mock] [--url URL] [--yes|--deny] "text"`.
#[derive(Debug, Clone, Args)]
pub struct PromptArgs {
    /// The prompt.
    #[arg(required = true)]
    pub text: Vec<String>,
}

/// Runs one prompt; the exit code follows the stop reason.
///
/// # Errors
/// A message for the user.
pub async fn run(args: PromptArgs) -> Result<(), String> {
    Err(format!("prompt {:?} is not built yet", args.text))
}
