//! sandbox-agent runtime: ACP agents over HTTP.
//!
//! A client opens a connection with `initialize` on `POST /v2/rpc`, sends
//! JSON-RPC messages with POST, reads what the agent sends on an SSE stream
//! (`GET /v2/rpc`, resumable with `Last-Event-ID`) and closes with DELETE. One
//! agent process per agent id serves every connection bound to it. The full
//! contract is `DESIGN.md` sections 3–7 and `research/contract.md`.
//!
//! # Layout
//! - [`server`]: bind, accept loop, idle reaping, graceful shutdown.
//! - [`http`]: routing, auth, CORS, `/v2/rpc` handlers, SSE body, problem+json.
//! - [`runtime`]: shared state and the JSON-RPC handling of one POST.
//! - [`registry`]: open connections, the connection cap, idle reaping.
//! - [`connection`]: one connection: replay ring, live stream slot, in-flight ids.
//! - [`session`]: the server-wide session inventory: attachments, metadata, hints.
//! - [`event_log`]: each session's recorded ACP traffic.
//! - [`ext`]: the `_sandboxagent/*` methods (a jsonrpsee `RpcModule`).
//! - [`hints`]: title / model / mode read from ACP messages.
//! - [`agent`]: the agent manifest and catalog, installs into the data dir,
//!   agent processes, stdio framing, id rewriting and routing.
//! - [`agents_command`]: `sandbox-agent agents list|install`.
//! - [`protocol`]: wire constants and JSON-RPC envelope parsing (no I/O).
//! - [`error`]: the error enum every HTTP failure is made of.
//! - [`config`], [`cli`]: settings and the command line.
//! - [`mock_agent`]: the built-in deterministic ACP agent (`sandbox-agent mock-agent`).
//! - [`bench`]: `sandbox-agent bench`, the load generator and its report.
//! - [`bridge`]: `sandbox-agent bridge`, ACP on stdio for editors, relayed to
//!   a runtime over HTTP with `acp-http-client`.
//! - [`prompt`]: `sandbox-agent prompt`, the quick start, built on `sandbox-agent-sdk`.

pub mod agent;
pub mod agents_command;
pub mod bench;
pub mod bridge;
pub mod cli;
pub mod config;
pub mod connection;
pub mod error;
pub mod event_log;
pub mod ext;
pub mod hints;
pub mod http;
pub mod mock_agent;
pub mod prompt;
pub mod protocol;
pub mod registry;
pub mod runtime;
pub mod server;
pub mod session;
