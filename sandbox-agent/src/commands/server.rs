//! `sandbox-agent server`: the runtime itself, `acp_runtime::server::run`
//! with the settings from the command line.

use crate::cli::ServerArgs;

/// Runs the server until SIGINT/SIGTERM (or stdin EOF with
/// `--exit-on-stdin-eof`).
///
/// # Errors
/// Invalid settings, or a server that cannot bind or fails while serving.
pub async fn run(args: ServerArgs) -> Result<(), String> {
    let config = args.into_config()?;
    if config.fs_root.is_none() {
        // Said once, at start (research/contract.md, "Host file system").
        tracing::warn!(
            "no --fs-root: the file system API (/v2/fs/*, _sandboxagent/fs/*) reaches every file this server's user can; pass --fs-root DIR to confine it"
        );
    }
    acp_runtime::server::run(config)
        .await
        .map_err(|e| format!("server failed: {e}"))
}
