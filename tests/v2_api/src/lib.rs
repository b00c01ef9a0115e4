//! Black-box test harness for the `sandbox-agent` server: the real binary on
//! a real TCP port, spoken to over real HTTP, with real agent processes.
//!
//! The tests under `tests/` follow `research/contract.md` (the transport,
//! routing, the start-up line, problem types, the mock agent's prompt
//! directives). They only ever see what a client sees: status codes,
//! headers, bodies, Server-Sent Events, and the processes in `/proc`.
//!
//! # Layout
//! - [`server`]: finds the binary, starts `sandbox-agent server` on port 0,
//!   reads its start-up line, keeps its stderr, and stops it (and anything it
//!   left behind) on drop.
//! - [`api`]: the HTTP client side: [`Api`] (POST / GET / DELETE on
//!   `/v2/rpc`, `initialize`, `session/new`, prompts) and [`Reply`], one
//!   buffered HTTP response.
//! - [`sse`]: [`SseStream`], the connection's event stream parsed with
//!   `eventsource-stream` into [`SseEvent`]s (sequence id, event name, JSON).
//! - [`problem`]: [`assert_problem`], the RFC 9457 problem+json check.
//! - [`acp`]: JSON-RPC / ACP message builders and readers (prompt text,
//!   session updates, the mock agent's expected reply).
//! - [`ext`]: the `_sandboxagent/*` names, `_meta["sandboxagent.dev"]`
//!   readers, JSON-RPC result / error checks (research/contract.md,
//!   "Extension methods and control plane").
//! - [`agents`]: agents files, release archives, a loopback file server,
//!   and the install endpoint
//!   (research/contract.md, "Agents: manifest, installs, lazy install").
//! - [`procfs`]: process-tree helpers over `/proc` (descendants, liveness,
//!   command lines, resident memory).
//! - [`bridge`]: [`BridgeProcess`], `sandbox-agent bridge` driven through
//!   its stdio, as an editor drives it.
//! - [`proxy`]: [`CutProxy`], a loopback TCP proxy that logs request heads
//!   and cuts connections on demand; `ResponseCut`, one that breaks off a
//!   chosen answer after N bytes.
//! - [`prometheus`]: [`prometheus::Prometheus`], a private Prometheus
//!   scraping a test server with its token, read back through its query API.
//! - [`dist`]: the release tarball scripts/dist makes, found in one place
//!   ([`dist::tarball`]) and unpacked once ([`dist::unpacked_binary`]).
//! - [`postgres`]: [`PgServer`], a private PostgreSQL server (its own
//!   `initdb` dir, a loopback port, a non-root user) for the store's tests.
//! - [`dist`]: the release tarball of `scripts/dist`, found and unpacked.
//! - [`podman`]: containers: podman with this machine's settings, the
//!   Debian base image made with debootstrap, the `Dockerfile`'s image,
//!   containers and volumes removed on drop.
//!
//! # Timeouts
//! Every wait in the harness is bounded, so no test can hang; the bounds are
//! generous because the test machine is small and shared (see
//! [`STARTUP_TIMEOUT`], [`REQUEST_TIMEOUT`], [`EVENT_TIMEOUT`]).

pub mod acp;
pub mod agents;
pub mod api;
pub mod bridge;
pub mod browser;
pub mod dist;
pub mod ext;
pub mod podman;
pub mod postgres;
pub mod problem;
pub mod procfs;
pub mod prometheus;
pub mod proxy;
pub mod server;
pub mod sse;
pub mod users;

use std::time::Duration;

pub use agents::TempDir;
pub use api::{Api, Reply, path_segment, query_path};
pub use bridge::BridgeProcess;
pub use postgres::PgServer;
pub use problem::assert_problem;
pub use proxy::CutProxy;
pub use server::{TestServer, mock_agent_command, shell_quote};
pub use sse::{SseEvent, SseStream};

/// How long the server may take to print its start-up line.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(20);

/// Upper bound on one HTTP exchange (request sent, whole response read) that
/// the test expects to finish. Agent start-up happens inside the first
/// `initialize`, so this is generous.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Default upper bound when waiting for an SSE event (or a stream's end).
pub const EVENT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the server gets between SIGTERM and SIGKILL when a test drops it.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Header naming the transport connection (research/contract.md,
/// "Transport: /v2/rpc").
pub const CONNECTION_ID_HEADER: &str = "x-acp-connection-id";

/// The `_meta` namespace key of this product (research/contract.md,
/// "Extension methods and control plane").
pub const META_KEY: &str = "sandboxagent.dev";

/// Agent id of the built-in mock agent (contract.md, "The mock agent").
pub const MOCK: &str = "mock";

/// Awaits a spawned task for at most `timeout`.
///
/// # Panics
/// If the task panicked, was cancelled, or is still running after
/// `timeout` (it is aborted then).
pub async fn join_within<T>(mut task: tokio::task::JoinHandle<T>, timeout: Duration) -> T {
    match tokio::time::timeout(timeout, &mut task).await {
        Ok(Ok(value)) => value,
        Ok(Err(error)) => panic!("spawned task failed: {error}"),
        Err(_) => {
            task.abort();
            panic!("spawned task still running after {timeout:?}")
        }
    }
}
