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
//! A request travels `server` → `http` → `runtime` → `agent::router` → the
//! agent's stdin; what the agent writes travels `agent::stdio` →
//! `agent::router` → `session` / `connection` → `http::sse`.
//!
//! - [`server`]: bind, accept loop, idle reaping, graceful shutdown (public:
//!   [`server::run`]).
//! - `http`: routing, auth, CORS, cross-site checks, `/v2/rpc` handlers,
//!   SSE body, problem+json, the control plane, the `/acp` profile
//!   (Streamable HTTP and WebSocket), `/v2/fs/*`, the inspector at `/ui/`
//!   (assets in `acp-runtime/ui/`).
//! - `runtime`: shared state and the JSON-RPC handling of one POST.
//! - `connection`: one connection: replay ring, its lanes and their live
//!   stream slots, in-flight ids.
//! - `connections`: the open connections, the connection cap, idle reaping.
//! - `session`: the server-wide session inventory: attachments, metadata, hints.
//! - `event_log`: each session's recorded ACP traffic.
//! - [`store`]: durable sessions: SQLite or PostgreSQL, the writer task off
//!   the request path (public: the CLI reads a store directly).
//! - `ext`: the `_sandboxagent/*` methods (a jsonrpsee `RpcModule`).
//! - `fs`: the host file system API (paths, confinement, transfers),
//!   behind `/v2/fs/*` and the `_sandboxagent/fs/*` methods.
//! - `hints`: title / model / mode read from ACP messages.
//! - `log_limit`: rate limits for warnings an agent can trigger per message.
//! - [`install`]: agent installs (public: the `agents` command uses them
//!   without a server): the manifest, the catalog of known agents
//!   ([`install::AgentSpec`]), the installer, its npm driver, downloads and
//!   on-disk layout.
//! - [`agent`]: running agents: the supervisor (public), processes, their
//!   stdio loops, the tree supervisor, orphan reaping and the routing table.
//! - `archive`: safe unpacking of release archives and upload-batch tars.
//! - `process_group`: signalling a process group (an agent's, npm's).
//! - [`protocol`]: wire constants and JSON-RPC envelope parsing (no I/O).
//! - `error`: the error enum every HTTP failure is made of, with its HTTP
//!   status, problem type and JSON-RPC error.
//! - `time`: timestamps as the runtime writes them (RFC 3339).
//! - [`config`]: validated settings and their defaults.

pub mod agent;
pub(crate) mod archive;
pub mod config;
pub(crate) mod connection;
pub(crate) mod connections;
pub(crate) mod error;
pub(crate) mod event_log;
pub(crate) mod ext;
pub(crate) mod fs;
pub(crate) mod hints;
pub(crate) mod http;
pub mod install;
pub(crate) mod log_limit;
pub(crate) mod message;
pub(crate) mod process_group;
pub mod protocol;
pub(crate) mod runtime;
pub mod server;
pub(crate) mod session;
pub mod store;
pub(crate) mod time;
