//! The runtime: the handles a running server shares between its tasks
//! (research/contract.md, "Routing: connections, sessions, one agent
//! process"), and what it does with a message.
//!
//! - `mod.rs` (here): [`Runtime`], its handles and how it is built.
//! - `open`: `initialize` without a connection: the agent made ready, a
//!   connection opened, the cached `initialize` answer.
//! - `dispatch`: the one way in for a client's parsed message
//!   ([`Runtime::dispatch`]): answered here, or forwarded to the agent and
//!   its answer awaited.
//! - `services`: what the runtime answers itself, for every surface
//!   (`session/list`, terminate, models, installs, event pages, health).
//! - `eviction`: keeping event logs and replay rings within the memory
//!   budget (the evictor).
//! - `attach`: several clients on one session: attach (and a `session/load`
//!   of a live session) answered from the event log, observers' limits.
//! - `processes`: the process API's operations, shared by its routes and
//!   its `_sandboxagent/process/*` methods.
//! - `ext`: the `_sandboxagent/*` methods: one table pairing each with its
//!   handler, read by the dispatcher and the `initialize` advertisement;
//!   a handler deserializes its params from the bytes the edge parsed.

mod attach;
pub mod dispatch;
mod eviction;
mod ext;
mod inventory;
pub mod open;
mod processes;
mod services;

use crate::agent::Agents;
use crate::agent::client_side::ClientSide;
use crate::agent::router::RouteTargets;
use crate::budget::MemoryBudget;
use crate::config::ServerConfig;
use crate::install::Installer;
use crate::memory::connection::ReplayLimits;
use crate::memory::connections::Connections;
use crate::memory::event_log::LogLimits;
use crate::memory::sessions::{InventoryLimits, Sessions};
use crate::metrics::{self, Metrics, ScrapeSource, Scraped};
use crate::process::Processes;
use crate::protocol::{self, RpcError};
use crate::store::writer::Persist;
use crate::store::{Store, StoreUrl};
use bytes::Bytes;
use prometheus_client::registry::Registry;
use serde_json::value::RawValue;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Everything a running server shares between its tasks.
#[derive(Debug)]
pub struct Runtime {
    /// Settings from the command line.
    pub config: ServerConfig,
    /// Open client connections.
    pub connections: Arc<Connections>,
    /// Every session seen, across agents and connections.
    pub sessions: Arc<Sessions>,
    /// The same two handles, as agent processes get them to route to.
    routes: RouteTargets,
    /// Agent processes, one per agent id (shared with their start tasks).
    pub agents: Arc<Agents>,
    /// Cancelled when the server starts shutting down.
    pub shutdown: CancellationToken,
    /// The session store, for reads (`None` with `--store memory`).
    pub store: Option<Store>,
    /// The store's writer (`None` with `--store memory`).
    pub persist: Option<Arc<Persist>>,
    /// The account of every event log and replay ring
    /// (`--memory-budget-bytes`; research/contract.md, "Memory budget").
    pub memory: Arc<MemoryBudget>,
    /// The process API's processes (`None` with `--no-processes`;
    /// research/contract.md, "Processes and terminals").
    pub processes: Option<Arc<Processes>>,
    /// The metrics recorded where things happen (research/contract.md,
    /// "Metrics"); the same handles are in `registry`.
    pub metrics: Arc<Metrics>,
    /// What `GET /metrics` encodes: `metrics`, the store's write times and
    /// the values read at scrape time ([`Scraped`]).
    pub registry: Registry,
    /// `--agent-user`, whose file system credentials the host file system
    /// API acts with ([`Runtime::fs_scope`]).
    agent_user: Option<Arc<crate::os::user::AgentUser>>,
}

/// An opened store and its writer task, as [`Runtime::new`] takes them.
#[derive(Debug)]
pub struct Durable {
    /// The store, for reads.
    pub store: Store,
    /// The writer task's handle.
    pub persist: Arc<Persist>,
    /// The store's entries of this runtime id at start, `(not ended,
    /// ended)`: what `sessions{state}` starts from (they are dormant and
    /// ended until loaded).
    pub stored: (u64, u64),
}

/// The successful outcome of a POST.
#[derive(Debug)]
pub enum Reply {
    /// `200` with this JSON-RPC response; `connection_id` is set when an
    /// `initialize` opened a connection (sent as `x-acp-connection-id`).
    Json {
        /// One JSON-RPC response object.
        body: Bytes,
        /// The new connection's id.
        connection_id: Option<Arc<str>>,
        /// Newest event id of the connection when an agent's answer was
        /// released (sent as `x-acp-last-event-id`).
        last_event_id: Option<u64>,
    },
    /// `202`, empty body: a notification or an answer to an agent request.
    Accepted,
}

impl Reply {
    fn json(body: Vec<u8>) -> Self {
        Self::Json {
            body: Bytes::from(body),
            connection_id: None,
            last_event_id: None,
        }
    }

    /// `200` with a JSON-RPC error answering request `client_id`.
    fn error(client_id: &RawValue, error: &RpcError) -> Self {
        Self::json(protocol::error_response_line(client_id, error))
    }
}

impl Runtime {
    /// A runtime for `config`; agents start on first use. With `durable`,
    /// every session change is also written to its store. Cancelling
    /// `shutdown` starts its shutdown.
    pub fn new(
        mut config: ServerConfig,
        durable: Option<Durable>,
        shutdown: CancellationToken,
    ) -> Arc<Self> {
        // The root as a real path, resolved once, here: never again per
        // request (research/contract.md, "Host file system").
        if let Some(real) = config
            .fs_root
            .as_ref()
            .and_then(|root| root.canonicalize().ok())
        {
            config.fs_root = Some(real);
        }
        let (store, persist, stored) = match durable {
            Some(Durable {
                store,
                persist,
                stored,
            }) => (Some(store), Some(persist), stored),
            None => (None, None, (0, 0)),
        };
        let limits = ReplayLimits {
            events: config.replay_buffer_events.max(1),
            bytes: config.replay_buffer_bytes,
        };
        let inventory = InventoryLimits {
            log: LogLimits {
                events: config.event_log_events.max(1),
                bytes: config.event_log_bytes,
            },
            ended_sessions: config.ended_sessions,
        };
        // One account: the store's writer charges its queue to it too.
        let memory = persist.as_ref().map_or_else(
            || Arc::new(MemoryBudget::new(config.memory_budget_bytes)),
            |persist| persist.budget().clone(),
        );
        let processes = config.processes.map(|limits| {
            Arc::new(
                Processes::new(limits, config.tree_supervisor.clone()).with_budget(memory.clone()),
            )
        });
        let metrics = Arc::new(if config.metrics {
            Metrics::default()
        } else {
            Metrics::off()
        });
        let mut sessions = Sessions::new(inventory, persist.clone()).with_budget(memory.clone());
        let mut connections =
            Connections::new(config.max_connections, limits).with_budget(memory.clone());
        if metrics.is_on() {
            sessions = sessions.with_metrics(metrics.clone(), stored);
            connections = connections.with_metrics(metrics.clone());
        }
        let routes = RouteTargets {
            metrics: metrics.clone(),
            sessions: Arc::new(sessions),
            connections: Arc::new(connections),
            client_side: Some(Arc::new(
                ClientSide::new(
                    config.fs_root.clone(),
                    config.fs_root_as_given.clone(),
                    &config.data_dir,
                    match &config.store {
                        Some(StoreUrl::Sqlite(path)) => Some(path.as_path()),
                        _ => None,
                    },
                    config.max_upload_bytes,
                )
                .with_processes(processes.clone())
                .acting_as(config.agent_user.clone()),
            )),
        };
        let agents = Arc::new(
            Agents::new(
                &config.agents,
                config.max_line_bytes,
                config.request_timeout,
                Arc::new(
                    Installer::new(config.data_dir.clone(), config.install_timeout)
                        .with_retry_backoff(config.install_retry_backoff)
                        .with_agent_user(config.tree_supervisor.clone()),
                ),
                config.require_preinstall,
            )
            .with_tree_supervisor(config.tree_supervisor.clone())
            .with_metrics(metrics.clone()),
        );
        metrics.for_agents(config.agents.keys().map(String::as_str));
        let mut registry = Registry::with_prefix(metrics::PREFIX);
        metrics.register(&mut registry);
        if let Some(persist) = &persist {
            registry.register(
                "store_write_duration_seconds",
                "Time to write one batch to the session store (successful or not)",
                persist.write_duration.clone(),
            );
        }
        registry.register_collector(Box::new(Scraped(ScrapeFrom {
            agents: agents.clone(),
            processes: processes.clone(),
            persist: persist.clone(),
        })));
        Arc::new(Self {
            connections: routes.connections.clone(),
            sessions: routes.sessions.clone(),
            routes,
            agents,
            shutdown,
            store,
            persist,
            memory,
            processes,
            metrics,
            registry,
            agent_user: config.agent_user.clone().map(Arc::new),
            config,
        })
    }
}

/// What a scrape reads from the running server: counts each part keeps.
#[derive(Debug)]
struct ScrapeFrom {
    agents: Arc<Agents>,
    processes: Option<Arc<Processes>>,
    persist: Option<Arc<Persist>>,
}

impl ScrapeSource for ScrapeFrom {
    fn agent_processes(&self) -> Vec<(Arc<str>, bool, u64)> {
        self.agents.process_counts()
    }

    fn processes(&self) -> (u64, u64) {
        self.processes
            .as_ref()
            .map_or((0, 0), |processes| processes.counts())
    }

    fn store(&self) -> (u64, u64) {
        self.persist.as_ref().map_or((0, 0), |persist| {
            let health = persist.health();
            (health.waiting as u64, health.dropped_events)
        })
    }
}
