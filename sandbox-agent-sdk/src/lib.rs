//! Drive coding agents on a sandbox-agent server: one [`SandboxAgentClient`]
//! per agent, in sandbox terms (sessions, prompts, permission requests,
//! metadata, events), on top of ACP over HTTP (`acp-http-client`).
//!
//! # Embedded mode
//!
//! Without a base URL the client starts a private `sandbox-agent server` (a
//! child process on a free loopback port with a random token) and stops it
//! when it is disposed or dropped. The binary is `$SANDBOX_AGENT_BIN`, else
//! `sandbox-agent` next to the current executable, else on `PATH`.
//!
//! ```no_run
//! use sandbox_agent_sdk::schema::{NewSessionRequest, PromptRequest};
//! use sandbox_agent_sdk::{ClientOptions, SandboxAgentClient};
//!
//! # async fn run() -> Result<(), sandbox_agent_sdk::Error> {
//! let client = SandboxAgentClient::connect(ClientOptions::new("mock")).await?;
//! let session = client.new_session(NewSessionRequest::new("/tmp")).await?;
//! let done = client
//!     .prompt(PromptRequest::new(session.session_id.clone(), vec!["hello".into()]))
//!     .await?;
//! println!("{:?}", done.stop_reason); // EndTurn
//! client.dispose().await; // or drop it
//! # Ok(())
//! # }
//! ```
//!
//! # Server mode
//!
//! With a base URL (and the server's token) the client talks to a running
//! server; its events stream the agent's reply:
//!
//! ```no_run
//! use sandbox_agent_sdk::schema::{ContentBlock, NewSessionRequest, PromptRequest, SessionUpdate};
//! use sandbox_agent_sdk::{ClientOptions, Event, PermissionDecision, SandboxAgentClient};
//!
//! # async fn run() -> Result<(), sandbox_agent_sdk::Error> {
//! let options = ClientOptions::new("mock")
//!     .base_url("http://127.0.0.1:2468")
//!     .token("T")
//!     .permission_handler(|_request| async { PermissionDecision::Allow });
//! let client = SandboxAgentClient::connect(options).await?;
//! let Some(mut events) = client.take_events() else {
//!     return Ok(()); // taken before
//! };
//! let session = client.new_session(NewSessionRequest::new("/work")).await?;
//! client
//!     .prompt(PromptRequest::new(session.session_id.clone(), vec!["hello".into()]))
//!     .await?;
//! while let Some(event) = events.try_recv() {
//!     if let Event::SessionUpdate(update) = event
//!         && let SessionUpdate::AgentMessageChunk(chunk) = update.update
//!         && let ContentBlock::Text(text) = chunk.content
//!     {
//!         print!("{}", text.text);
//!     }
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Layout
//! - `client`: [`SandboxAgentClient`]: lifecycle (connect, open, disconnect,
//!   dispose) and every call: ACP methods under their ACP names
//!   (`new_session`, `prompt`, …), sandbox-agent extensions under sandbox
//!   names (`set_metadata`, `terminate_session`, …), the control plane
//!   (`health`, `agents`, `install_agent`, `sessions`, `session_events`).
//! - `options`: [`ClientOptions`] (agent, server or embedded mode,
//!   auto-connect, permission handler, embedded-server settings).
//! - `connection`: one live connection: the ACP client over
//!   `acp-http-client`, its task and handlers.
//! - `events`: [`Event`], [`Events`], [`PermissionRequest`],
//!   [`PermissionDecision`].
//! - `meta`: `_meta["sandboxagent.dev"]` in ([`sandbox_meta`], the agent
//!   id) and out ([`WithMeta`], [`SessionEntry`] with typed
//!   [`SessionMeta`]).
//! - `embedded`: finding, starting and stopping the server binary.
//! - `control`: the control-plane HTTP routes.
//! - `error`: [`Error`], one enum for everything.

mod client;
mod connection;
mod control;
mod embedded;
mod error;
mod events;
mod meta;
mod options;

pub use client::{
    SandboxAgentClient, SessionList, SetSessionModelRequest, SetSessionModelResponse,
};
pub use control::{Health, InstallOptions, InstallResult};
pub use embedded::{BINARY_ENV, LISTENING_PREFIX};
pub use error::Error;
pub use events::{Event, Events, PermissionDecision, PermissionHandler, PermissionRequest};
pub use meta::{SessionEntry, WithMeta, sandbox_meta, session_meta};
pub use options::{
    ClientOptions, DEFAULT_SHUTDOWN_GRACE, DEFAULT_STARTUP_TIMEOUT, Mode, ServerLogs,
};

/// The HTTP status type of [`Error::Http`].
pub use reqwest::StatusCode;

/// What [`Error::Http`] holds: a non-2xx answer's status and its RFC 9457
/// problem document.
pub use acp_http_client::{HttpFailure, Problem};

/// The sandbox-agent extension types: typed metadata, extension results and
/// notification params, control-plane shapes.
pub use ext_methods::{
    AgentInfo, AgentSource, AgentUnparsed, Direction, EndReason, ListModelsResult, ModelInfo,
    ModelsTarget, SessionEnded, SessionEvent, SessionEventsPage, SessionMeta, StderrExcerpt,
    StreamGap, TerminateResult, TerminatedBy,
};

/// The ACP (protocol v1) message types the client's methods take and
/// return: `NewSessionRequest`, `PromptRequest`, `PromptResponse`,
/// `StopReason`, `SessionNotification`, `SessionUpdate`, `ContentBlock`,
/// `RequestPermissionRequest`, `SessionId`, …
pub use agent_client_protocol::v1::schema;
