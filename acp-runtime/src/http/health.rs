//! `GET /v2/health` (research/contract.md, "Durable sessions"): the
//! server's version and the session store's state, without a token.

use super::body::{Body, full};
use crate::protocol::APPLICATION_JSON;
use crate::runtime::Runtime;
use bytes::Bytes;
use http::{Response, StatusCode};
use serde::Serialize;

/// The answer of `GET /v2/health`: the server's version and the session
/// store's state (research/contract.md, "Durable sessions").
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Health {
    /// Always `ok`: the server answers.
    #[schema(example = "ok")]
    status: &'static str,
    /// The server's version.
    version: &'static str,
    /// The store's state: `ok`, `degraded` (writes failing, kept and
    /// retried) or `memory` (no store).
    #[schema(example = "ok")]
    store: &'static str,
    /// `sqlite`, `postgres` or `memory`.
    store_backend: &'static str,
    /// Writes not in the store yet.
    store_waiting: usize,
    /// Events dropped because the waiting writes hit their cap.
    store_dropped_events: u64,
    /// Writes the database refused for what they hold.
    store_rejected_writes: u64,
    /// Agents whose output waits for the store's writer now.
    store_paused_agents: Vec<String>,
    /// Times an agent's output waited for the store's writer.
    store_pauses: u64,
    /// Milliseconds agents' output waited for the store's writer, in total.
    store_paused_ms: u64,
    /// `--memory-budget`, in bytes.
    memory_budget_bytes: usize,
    /// Bytes of recorded events held in memory now.
    memory_used_bytes: usize,
    /// Events evicted from memory to stay within the budget.
    memory_evicted_events: u64,
    /// The store's last error while degraded; only on a server without a
    /// token (it can name hosts).
    #[serde(skip_serializing_if = "Option::is_none")]
    store_error: Option<String>,
    /// The id this server writes its sessions under in the store; only on
    /// a server without a token.
    #[serde(skip_serializing_if = "Option::is_none")]
    runtime_id: Option<String>,
}

/// `GET /v2/health`: `status`, `version`, and the session store's state.
/// Health needs no token: with one set, what could name hosts or ids (the
/// driver's error, the runtime id) stays off it.
#[utoipa::path(
    get,
    path = "/v2/health",
    operation_id = "health",
    summary = "Is the server up?",
    description = "The server's version and the session store's state. Needs no token; with a token set, what could name hosts or ids (`storeError`, `runtimeId`) is left out.",
    tag = "server",
    security(()),
    responses(
        (status = 200, description = "The server answers.", body = Health),
    )
)]
pub fn serve(runtime: &Runtime) -> Response<Body> {
    let store = runtime.store_health();
    let open = runtime.config.token.is_none();
    let health = Health {
        status: "ok",
        version: env!("CARGO_PKG_VERSION"),
        store: store.state,
        store_backend: store.backend,
        store_waiting: store.waiting,
        store_dropped_events: store.dropped_events,
        store_rejected_writes: store.rejected_writes,
        store_paused_agents: store.paused_agents,
        store_pauses: store.pauses,
        store_paused_ms: store.paused_ms,
        memory_budget_bytes: runtime.memory.limit(),
        memory_used_bytes: runtime.memory.used(),
        memory_evicted_events: runtime.memory.evicted_events(),
        store_error: store.error.filter(|_| open),
        runtime_id: runtime
            .store
            .as_ref()
            .filter(|_| open)
            .map(|store| store.runtime_id().to_owned()),
    };
    let body = serde_json::to_vec(&health).unwrap_or_default();
    full(StatusCode::OK, APPLICATION_JSON, Bytes::from(body))
}
