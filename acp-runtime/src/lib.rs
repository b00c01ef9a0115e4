//! The sandbox-agent server: ACP agents over HTTP.
//!
//! A client opens a connection with `initialize` on `POST /v2/rpc`, sends
//! JSON-RPC messages with POST, reads what the agent sends on an SSE stream
//! (`GET /v2/rpc`, resumable with `Last-Event-ID`) and closes with DELETE. One
//! agent process per agent id serves every connection bound to it. The wire
//! contract, as built, is `research/contract.md`.
//!
//! This crate is the server and only the server; the `sandbox-agent` binary
//! and its other commands live in the `sandbox-agent` crate.
//!
//! # Layout
//! A message travels `server` → `http` (one parse at the edge into a
//! `inbound::Inbound`) → `runtime` (`Runtime::dispatch`, the one way in) →
//! `agent::router` → the agent's stdin; what the agent writes travels
//! `agent::agent_process` (stdout) → `agent::router` → `memory` (the session's
//! log, each connection's ring of JSON) → `http::sse` or `http::websocket`,
//! which frame it as they write. Modules are listed highest first; none
//! imports a module above it, and no two files import each other
//! (`scripts/module-cycles.py`). A client's body is copied once and parsed
//! once (`message::one_line`, `message::Inbound`).
//!
//! - [`server`]: bind, accept loop, idle reaping, graceful shutdown (public:
//!   [`server::run`]).
//! - `http`: the route table (`http::routes`), auth, CORS, cross-site
//!   checks, the `/v2/rpc` and `/acp` edges (Streamable HTTP, WebSocket),
//!   SSE, problem+json, the control plane, `/v2/fs/*`, the inspector at
//!   `/ui/` (assets in `acp-runtime/ui/`).
//! - `runtime`: the handles a server shares (`Runtime`), `initialize` on no
//!   connection (`open`), the dispatch of a client's message (`dispatch`),
//!   what the runtime answers itself (`services`, the `_sandboxagent/*`
//!   methods in `ext`, several clients on one session in `attach`).
//! - [`config`]: validated settings and their defaults, the aggregate of
//!   the settings types of the modules below it.
//! - [`agent`]: running agents: the supervisor (public), processes and
//!   their stdout, the stdin/stderr loops, line framing, the routing
//!   table, and the agent's client-side files and terminals served in the
//!   sandbox.
//! - [`install`]: agent installs (public: the `agents` command uses them
//!   without a server): the manifest, the catalog of known agents
//!   ([`install::AgentSpec`]), the installer, its npm driver, downloads and
//!   on-disk layout.
//! - `process`: the process API's processes (started under the tree
//!   supervisor, pipes or a pseudo-terminal, output rings by byte offset),
//!   behind `/v2/processes`.
//! - `fs`: the host file system API (paths, confinement, transfers),
//!   behind `/v2/fs/*` and the `_sandboxagent/fs/*` methods.
//! - `memory`: what the server holds in memory (the database is
//!   `store`): connections (the replay ring, lanes, in-flight ids), the
//!   open-connection registry, the session inventory (with each attached
//!   connection's role), event logs, the history an attach gets, hints.
//! - `budget`: the server-wide memory budget of logs, rings, the store's
//!   queue and process records.
//! - [`store`]: durable sessions: SQLite or PostgreSQL, the writer task off
//!   the request path (public: the CLI reads a store directly).
//! - `inbound`: a client's JSON-RPC message, parsed once (`Inbound`, with
//!   its `protocol::Method`).
//! - [`elicitation`]: agent questions (ACP elicitation) as routing reads
//!   them, and the modes the runtime declares for them.
//! - [`os`]: the bottom layer, the operating system: process groups, the
//!   tree supervisor (public: the binary re-runs itself as it), the agents'
//!   user (`--agent-user`), the records of agent trees a dead server left.
//!   It imports nothing of the crate; `agent`, `process`, `fs` and
//!   `install` stand on it.
//! - `archive`: safe unpacking of release archives and upload-batch tars.
//! - `log_limit`: rate limits for warnings an agent can trigger per message.
//! - `error`: the error enum every HTTP failure is made of, with its HTTP
//!   status, problem type and JSON-RPC error.
//! - [`protocol`]: wire constants (header names, media types, methods,
//!   codes), `Method` (a client message's method, classified once) and
//!   JSON-RPC envelope parsing (no I/O).
//! - `metrics`: the metrics `GET /metrics` (`http::scrape`) serves (one `Metrics` of
//!   counter, gauge and histogram handles, shared by `Arc`), and the
//!   values read at scrape time.
//! - [`spans`]: the OpenTelemetry spans (HTTP and ACP requests, prompt
//!   turns, tool calls, permission waits) and W3C trace context in and out
//!   (public: the binary exports their target over OTLP).
//! - `route_template`: the closed set of route templates the metrics and
//!   the HTTP spans label requests by, and the fixed paths they name.
//! - `time`: timestamps as the runtime writes them (RFC 3339).

pub mod agent;
pub(crate) mod archive;
pub(crate) mod budget;
pub mod config;
pub mod elicitation;
pub(crate) mod error;
pub(crate) mod fs;
pub(crate) mod http;
pub(crate) mod inbound;
pub mod install;
pub(crate) mod log_limit;
pub(crate) mod memory;
pub(crate) mod metrics;
pub mod os;
pub(crate) mod process;
pub mod protocol;
pub(crate) mod route_template;
pub(crate) mod runtime;
pub mod server;
pub mod spans;
pub mod store;
pub(crate) mod time;

/// The OpenAPI document of the plain-HTTP routes, as `GET /v2/openapi.json`
/// serves it (research/contract.md, "OpenAPI").
pub use http::openapi::document as openapi_document;
