//! The server's SIGINT and SIGTERM, taken on a thread of their own.
//!
//! The async runtime has one worker thread by default: a signal handled
//! there waits for that thread, and a worker kept busy (bodies to parse, a
//! store that lags) delayed it without bound. Here a signal is taken on a
//! thread with its own small runtime, logged, and turned into the server's
//! shutdown token; from then on the same thread bounds the shutdown: a
//! server still running [`MARGIN`] past the library's graceful steps
//! ([`acp_runtime::server::graceful_steps`]) is ended with exit status 1
//! and an error line (research/contract.md, "Shutdown").

use std::time::Duration;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

/// What the process adds to the library's graceful steps before it gives
/// up on a shutdown: the spans' flush (5 s, research/contract.md,
/// "Traces"), a copy of a deleted store file, reaping.
const MARGIN: Duration = Duration::from_secs(30);

/// Starts the thread that cancels `shutdown` on the first SIGINT or
/// SIGTERM and, once `shutdown` is cancelled by anyone (a signal, stdin's
/// end), exits the process if it is still running `steps` + [`MARGIN`]
/// later. Returns once the signal handlers are installed.
///
/// # Errors
/// The thread, its runtime or a signal handler cannot be set up.
pub async fn watch(shutdown: CancellationToken, steps: Duration) -> std::io::Result<()> {
    let (ready, installed) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("signal-watch".to_owned())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .enable_time()
                .build()
            {
                Ok(runtime) => runtime,
                Err(error) => {
                    let _ = ready.send(Err(error));
                    return;
                }
            };
            runtime.block_on(async move {
                let handlers = signal(SignalKind::terminate())
                    .and_then(|term| Ok((term, signal(SignalKind::interrupt())?)));
                let (mut term, mut interrupt) = match handlers {
                    Ok(handlers) => {
                        let _ = ready.send(Ok(()));
                        handlers
                    }
                    Err(error) => {
                        let _ = ready.send(Err(error));
                        return;
                    }
                };
                tokio::select! {
                    _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
                    _ = interrupt.recv() => tracing::info!("SIGINT: shutting down"),
                    () = shutdown.cancelled() => {}
                }
                shutdown.cancel();
                let limit = steps + MARGIN;
                tokio::time::sleep(limit).await;
                tracing::error!(
                    limit_ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX),
                    "the shutdown did not finish in time: exiting now (agents are killed with \
                     the server; store writes not yet taken are lost)"
                );
                std::process::exit(1);
            });
        })?;
    installed
        .await
        .unwrap_or_else(|_| Err(std::io::Error::other("the signal thread died")))
}
