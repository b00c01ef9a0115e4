//! The server's lifecycle: kill the agent trees a dead predecessor left,
//! bind, announce, accept, reap idle connections, and shut down gracefully
//! when the caller's token is cancelled (the binary cancels it on SIGINT or
//! SIGTERM, from a thread of its own).
//!
//! Shutdown is one visible mechanism: the runtime's `shutdown` token. Once it
//! is cancelled the accept loop stops, every SSE stream ends, agents get
//! SIGTERM (SIGKILL after the grace period) and are reaped, their pending
//! requests fail with JSON-RPC errors so every waiting POST is answered, and
//! the HTTP connections drain.

use crate::config::ServerConfig;
use crate::error::Error;
use crate::http;
use crate::runtime::{Durable, Runtime};
use crate::store::writer::Persist;
use crate::store::{Store, StoreUrl};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// Longest a graceful shutdown waits for the session store to take every
/// queued write (research/contract.md, "Durable sessions").
const STORE_FLUSH_TIMEOUT: Duration = Duration::from_secs(10);
/// How long open HTTP connections get to finish after agents stopped.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// Open files kept free of HTTP connections: agent pipes, installs, logs.
const RESERVED_FILES: u64 = 512;
/// Most open files asked for when raising the soft limit.
const MAX_OPEN_FILES: u64 = 1 << 20;
/// How long a refused connection gets to take its 503.
const REFUSE_TIMEOUT: Duration = Duration::from_secs(1);
/// Most HTTP/2 streams open at once on one TCP connection: each stream is a
/// request in flight, so this bounds one connection's share of the server
/// as `--max-http-connections` bounds the number of connections.
const MAX_HTTP2_STREAMS: u32 = 256;
/// Most bytes of request headers on one HTTP/2 stream, as HTTP/1.1's default.
const MAX_HTTP2_HEADER_BYTES: u32 = 64 * 1024;

/// The longest the graceful steps of a shutdown take once `shutdown` is
/// cancelled, with the agents' `grace` (`--shutdown-grace-ms`): the agents'
/// grace, the store's flush, the HTTP connections' drain. What a caller
/// waits before it gives up on a shutdown adds its own steps (research/
/// contract.md, "Shutdown").
#[must_use]
pub fn graceful_steps(grace: Duration) -> Duration {
    grace + STORE_FLUSH_TIMEOUT + DRAIN_TIMEOUT
}

/// Runs a server until `shutdown` is cancelled (or, with
/// `--exit-on-stdin-eof`, stdin closes, which cancels it too), then shuts
/// down gracefully and returns.
///
/// Writes `sandbox-agent listening on http://HOST:PORT` to stdout once the
/// socket is bound (see `research/contract.md`).
///
/// # Errors
/// When the session store cannot be opened (the message names the file or
/// the redacted URL) or the address cannot be bound.
pub async fn run(mut config: ServerConfig, shutdown: CancellationToken) -> std::io::Result<()> {
    // Before anything in the data dir is read or acted on (research/
    // contract.md, "Agents under an unprivileged user"); its real path from
    // here on.
    if let Some(user) = &config.agent_user {
        config.data_dir = crate::os::user::confine_data_dir(&config.data_dir, user)
            .map_err(std::io::Error::other)?;
        if let Some(StoreUrl::Sqlite(file)) = &config.store {
            config.store = Some(StoreUrl::Sqlite(
                crate::os::user::trusted_store_file(file, user).map_err(std::io::Error::other)?,
            ));
        }
    }
    let url = config
        .store
        .clone()
        .unwrap_or_else(|| StoreUrl::default_for(&config.data_dir));
    let failed = |e: crate::store::StoreError| std::io::Error::other(e.to_string());
    let runtime_id = match (&url, &config.runtime_id) {
        (StoreUrl::Memory, _) => None,
        (_, Some(id)) => Some(id.clone()),
        (_, None) => Some(crate::store::default_runtime_id(&config.data_dir).map_err(failed)?),
    };
    // Before anything else acts on the data dir or the store: a second
    // server with this runtime id stops here, having touched nothing
    // (research/contract.md, "One server per runtime id"). Held until
    // `run` returns; it dies with the process however that ends.
    let runtime_lock = match &runtime_id {
        Some(id) => {
            crate::store::runtime_lock::acquire(&url, &config.data_dir, id).map_err(failed)?
        }
        None => None,
    };
    // Before any agent can start: never two trees of one agent
    // (research/contract.md, "Agent process trees and a server that dies").
    crate::os::orphans::reap_leftovers(&config.data_dir).await;
    let durable = match runtime_id {
        Some(id) => open_store(&config, &url, id).await?,
        None => None,
    };
    let listener = TcpListener::bind(config.listen).await?;
    let address = listener.local_addr()?;
    if let Some(lock) = &runtime_lock {
        lock.record_url(&format!("http://{address}"));
    }
    let runtime = Runtime::new(config, durable, shutdown);
    tokio::spawn(reap_idle(runtime.clone()));
    // research/contract.md, "Memory budget".
    tokio::spawn(runtime.clone().keep_within_budget());
    tokio::spawn(runtime.clone().trim_ended_sessions());
    // research/contract.md, "Durable sessions": retention is the store's.
    tokio::spawn(runtime.clone().retain_stored());
    if runtime.config.exit_on_stdin_eof {
        watch_stdin(runtime.shutdown.clone())?;
    }
    let http_limit = http_connection_limit(runtime.config.max_http_connections);
    let permits = Arc::new(Semaphore::new(http_limit));
    let read_timeout = runtime.config.read_timeout;
    tracing::info!(%address, auth = runtime.config.token.is_some(), http_limit, "listening");
    tracing::info!("inspector: http://{address}/ui/");
    {
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "sandbox-agent listening on http://{address}")?;
        stdout.flush()?;
    }
    let graceful = GracefulShutdown::new();
    let builder = connection_builder(read_timeout);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((socket, _peer)) => {
                    let Ok(permit) = permits.clone().try_acquire_owned() else {
                        tokio::spawn(refuse(socket, http_limit));
                        continue;
                    };
                    let _ = socket.set_nodelay(true);
                    // The address the peer reached, not the bind address: a
                    // `0.0.0.0` server is reachable on loopback too, and the
                    // `Host` rule depends on it (research/contract.md, "Auth
                    // and CORS").
                    let Ok(local) = socket.local_addr() else {
                        continue;
                    };
                    let runtime = runtime.clone();
                    let service =
                        service_fn(move |request| http::handle(runtime.clone(), local, request));
                    let builder = builder.clone();
                    let watcher = graceful.watcher();
                    tokio::spawn(async move {
                        if !protocol_known(&socket, read_timeout).await {
                            drop(permit);
                            return;
                        }
                        let connection = builder
                            .serve_connection_with_upgrades(TokioIo::new(socket), service);
                        let connection = watcher.watch(connection.into_owned());
                        if let Err(error) = connection.await {
                            tracing::debug!(%error, "HTTP connection ended with an error");
                        }
                        drop(permit);
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
    // Sessions the shutdown ends come back dormant: their ends are not stored.
    if let Some(persist) = &runtime.persist {
        persist.begin_shutdown();
    }
    let grace = runtime.config.shutdown_grace;
    match &runtime.processes {
        Some(processes) => {
            tokio::join!(runtime.agents.shutdown(grace), processes.shutdown(grace));
        }
        None => runtime.agents.shutdown(grace).await,
    }
    for connection in runtime.connections.all() {
        runtime.connections.close(&connection.id, &runtime.sessions);
    }
    if let Some(persist) = &runtime.persist {
        if persist.flush(STORE_FLUSH_TIMEOUT).await {
            tracing::info!("session store flushed");
        } else {
            let health = persist.health();
            tracing::warn!(
                unwritten = health.waiting,
                error = health.error.as_deref().unwrap_or("too slow"),
                "session store: writes lost at shutdown"
            );
        }
    }
    if let Some(store) = &runtime.store {
        store.close().await;
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

/// Opens the store at `url` for `runtime_id` (`None` for
/// [`StoreUrl::Memory`]), with its writer task (the inventory stays in the
/// store; see `runtime::inventory`).
///
/// # Errors
/// The store's error, naming the file or the redacted URL.
async fn open_store(
    config: &ServerConfig,
    url: &StoreUrl,
    runtime_id: String,
) -> std::io::Result<Option<Durable>> {
    let failed = |e: crate::store::StoreError| std::io::Error::other(e.to_string());
    let Some(store) = Store::open(url, &runtime_id).await.map_err(failed)? else {
        return Ok(None);
    };
    // Entries stay in the store (memory takes in what is asked for): only
    // their count is read here, so start-up costs the same at any size.
    let started = std::time::Instant::now();
    let stored = store.count_sessions().await.map_err(failed)?;
    // The newest entry, read whole: a corrupt table fails here, at start,
    // naming the file, not at the first listing.
    store
        .page(&crate::store::PageQuery {
            limit: 1,
            ..crate::store::PageQuery::default()
        })
        .await
        .map_err(failed)?;
    // Before the writer starts: turns the last run left open are recorded
    // as interrupted (research/contract.md, "Restart semantics").
    let interrupted = store.record_interrupted_turns().await.map_err(failed)?;
    tracing::info!(
        store = store.describe(),
        runtime_id,
        sessions = stored.0 + stored.1,
        interrupted,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "session store opened"
    );
    let budget = Arc::new(crate::budget::MemoryBudget::new(config.memory_budget_bytes));
    let persist = Persist::start(
        store.clone(),
        url.backend(),
        config.event_log_events,
        budget,
    );
    Ok(Some(Durable {
        store,
        persist,
        stored,
    }))
}

/// One builder for every TCP connection: HTTP/1.1, and cleartext HTTP/2 by
/// prior knowledge (RFC 9113 section 3.3) on the same port, told apart by
/// the connection preface (research/contract.md, "HTTP/2"). The limits of
/// HTTP/1.1 hold for HTTP/2 too: the header read timeout is also how long an
/// idle HTTP/2 peer may stay silent to keep-alive pings; each stream's body
/// is bounded by the routes as on HTTP/1.1.
fn connection_builder(read_timeout: Duration) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(MAX_HTTP2_STREAMS)
        .max_header_list_size(MAX_HTTP2_HEADER_BYTES)
        .keep_alive_interval(read_timeout)
        .keep_alive_timeout(read_timeout);
    builder
}

/// Waits, at most `timeout`, until the first bytes of `socket` tell HTTP/1.1
/// from HTTP/2's connection preface. The version detection reads without a
/// timer of its own, so a peer that connects and stays silent (or stops
/// inside the preface) would otherwise hold a connection permit forever.
/// `false`: the peer closed or stayed silent; drop the connection.
async fn protocol_known(socket: &TcpStream, timeout: Duration) -> bool {
    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    let decided = async {
        let mut buffer = [0_u8; PREFACE.len()];
        let mut seen = 0;
        loop {
            let Ok(read) = socket.peek(&mut buffer).await else {
                return false;
            };
            if read == 0 {
                return false;
            }
            if read == PREFACE.len() || buffer[..read] != PREFACE[..read] {
                return true;
            }
            // A peek returns at once while bytes wait unread: poll gently
            // until more of the preface arrives.
            if read == seen {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            seen = read;
        }
    };
    tokio::time::timeout(timeout, decided)
        .await
        .unwrap_or(false)
}

/// The number of TCP connections served at once: `configured`, but no more
/// than the open-file limit allows with [`RESERVED_FILES`] left over. Raises
/// the soft open-file limit to the hard one first (the usual soft default of
/// 1024 would otherwise cap a server meant for thousands of streams).
fn http_connection_limit(configured: usize) -> usize {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return configured;
    };
    let wanted = hard.min(MAX_OPEN_FILES);
    let files = if soft < wanted && setrlimit(Resource::RLIMIT_NOFILE, wanted, hard).is_ok() {
        wanted
    } else {
        soft
    };
    let room = usize::try_from(files.saturating_sub(RESERVED_FILES)).unwrap_or(usize::MAX);
    let limit = configured.min(room.max(16));
    if limit < configured {
        tracing::warn!(
            configured,
            limit,
            open_files = files,
            "--max-http-connections lowered to fit the open-file limit"
        );
    }
    limit
}

/// Answers a connection over the limit with a 503 problem and closes it,
/// without reading its request.
async fn refuse(mut socket: TcpStream, limit: usize) {
    // At most one warning a second: a flood must not flood the log too.
    static LAST_WARNING: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    if LAST_WARNING.swap(now, std::sync::atomic::Ordering::Relaxed) != now {
        tracing::warn!(limit, "HTTP connections refused: too many open");
    }
    let body = crate::http::problem::document(&Error::TooManyHttpConnections { limit });
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: {}\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
        crate::http::problem::PROBLEM_JSON,
        body.len()
    );
    let answer = async {
        socket.write_all(head.as_bytes()).await?;
        socket.write_all(&body).await?;
        socket.shutdown().await
    };
    let _ = tokio::time::timeout(REFUSE_TIMEOUT, answer).await;
}

/// Cancels `shutdown` once stdin reaches end of file or fails. A plain thread,
/// not `tokio::io::stdin`: its blocking read cannot be cancelled and would
/// hold up the runtime's shutdown; a thread ends with the process.
fn watch_stdin(shutdown: tokio_util::sync::CancellationToken) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("stdin-watch".to_owned())
        .spawn(move || {
            use std::io::Read;
            let mut stdin = std::io::stdin().lock();
            let mut buffer = [0_u8; 256];
            while matches!(stdin.read(&mut buffer), Ok(read) if read > 0) {}
            if !shutdown.is_cancelled() {
                tracing::info!("stdin closed: shutting down");
                shutdown.cancel();
            }
        })
        .map(drop)
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
