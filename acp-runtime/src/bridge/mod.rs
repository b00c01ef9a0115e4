//! `sandbox-agent bridge`: ACP on stdio toward an editor, forwarded to a
//! sandbox-agent runtime over HTTP (issue 8).

use clap::Args;

/// `sandbox-agent bridge --url URL --agent NAME [--token T]`.
#[derive(Debug, Clone, Args)]
pub struct BridgeArgs {
    /// Base URL of the runtime, e.g. http://127.0.0.1:2468.
    #[arg(long)]
    pub url: String,
    /// Agent id to use on the runtime.
    #[arg(long)]
    pub agent: String,
    /// Bearer token of the runtime.
    #[arg(long, env = "SANDBOX_AGENT_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

/// Runs the bridge until stdin closes.
///
/// # Errors
/// A message for the user when the bridge cannot serve.
pub async fn run(args: BridgeArgs) -> Result<(), String> {
    Err(format!("bridge to {} is not built yet", args.url))
}
