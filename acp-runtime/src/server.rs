//! The server's lifecycle: bind, announce, accept, reap idle connections, and
//! shut down gracefully on SIGINT/SIGTERM.
//!
//! Shutdown is one visible mechanism: the runtime's `shutdown` token. Once it
//! is cancelled the accept loop stops, every SSE stream ends, agents get
//! SIGTERM (SIGKILL after the grace period) and are reaped, their pending
//! requests fail with JSON-RPC errors so every waiting POST is answered, and
//! the HTTP connections drain.

use crate::config::ServerConfig;
use crate::http;
use crate::runtime::Runtime;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// How long open HTTP connections get to finish after agents stopped.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs a server until SIGINT or SIGTERM.
///
/// Writes `sandbox-agent listening on http://HOST:PORT` to stdout once the
/// socket is bound (see `research/contract.md`).
///
/// # Errors
/// When the address cannot be bound or the signal handlers cannot be installed.
pub async fn run(config: ServerConfig) -> std::io::Result<()> {
    let listener = TcpListener::bind(config.listen).await?;
    let address = listener.local_addr()?;
    let runtime = Runtime::new(config);
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let shutdown = runtime.shutdown.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
            _ = sigterm.recv() => tracing::info!("SIGTERM: shutting down"),
        }
        shutdown.cancel();
    });
    tokio::spawn(reap_idle(runtime.clone()));
    tracing::info!(%address, auth = runtime.config.token.is_some(), "listening");
    {
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "sandbox-agent listening on http://{address}")?;
        stdout.flush()?;
    }
    let graceful = GracefulShutdown::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((socket, _peer)) => {
                    let _ = socket.set_nodelay(true);
                    let runtime = runtime.clone();
                    let service = service_fn(move |request| http::handle(runtime.clone(), request));
                    let connection = http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(Duration::from_secs(30))
                        .serve_connection(TokioIo::new(socket), service);
                    let connection = graceful.watch(connection);
                    tokio::spawn(async move {
                        if let Err(error) = connection.await {
                            tracing::debug!(%error, "HTTP connection ended with an error");
                        }
                    });
                }
                Err(error) => {
                    // Out of file descriptors and the like: back off, keep serving.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            () = runtime.shutdown.cancelled() => break,
        }
    }
    drop(listener);
    runtime.agents.shutdown(runtime.config.shutdown_grace).await;
    for connection in runtime.connections.all() {
        runtime.connections.close(&connection.id, &runtime.sessions);
    }
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("HTTP connections did not drain in time");
    }
    tracing::info!("stopped");
    Ok(())
}

async fn reap_idle(runtime: Arc<Runtime>) {
    let idle = runtime.config.idle_timeout;
    let period = (idle / 4).clamp(Duration::from_millis(50), Duration::from_secs(30));
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {
                runtime.connections.reap_idle(idle, &runtime.sessions);
            }
            () = runtime.shutdown.cancelled() => return,
        }
    }
}
