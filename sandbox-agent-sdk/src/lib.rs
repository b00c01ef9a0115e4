//! Drive coding agents on a sandbox-agent server: one [`SandboxAgentClient`]
//! per agent, in sandbox terms (sessions, prompts, permission requests,
//! metadata, events), on top of ACP over HTTP (`acp-http-client`).
//!
//! # A streamed turn with a permission answer
//!
//! Without a base URL the client starts a private `sandbox-agent server` (a
//! child process on a free loopback port with a random token; see
//! [`ClientOptions::binary`] for where the binary comes from) and stops it
//! on [`shutdown`](SandboxAgentClient::shutdown) or when the last clone is
//! dropped. [`prompt_stream`](SandboxAgentClient::prompt_stream) yields the
//! turn's events while it runs, permission requests included, and ends with
//! the stop reason:
//!
//! ```no_run
//! use sandbox_agent_sdk::schema::{NewSessionRequest, PromptRequest};
//! use sandbox_agent_sdk::{
//!     ClientOptions, PermissionDecision, SandboxAgentClient, StreamExt, TurnEvent,
//! };
//!
//! # async fn run() -> Result<(), sandbox_agent_sdk::Error> {
//! let client = SandboxAgentClient::connect(ClientOptions::new("mock")).await?;
//! let session = client.new_session(NewSessionRequest::new("/tmp")).await?;
//! let request = PromptRequest::new(session.session_id.clone(), vec!["please ask permission".into()]);
//! let mut turn = client.prompt_stream(request);
//! while let Some(event) = turn.next().await {
//!     match event {
//!         TurnEvent::MessageChunk(_) => print!("{}", event.text().unwrap_or_default()),
//!         TurnEvent::ToolCall(call) => eprintln!("[tool] {}", call.title),
//!         TurnEvent::PermissionRequest(request) => {
//!             eprintln!("[allowing] {}", request.title());
//!             request.decide(PermissionDecision::Allow)?;
//!         }
//!         TurnEvent::Stopped(done) => println!("\n[{:?}]", done.stop_reason), // EndTurn
//!         TurnEvent::Failed(error) => return Err(error),
//!         _ => {}
//!     }
//! }
//! client.shutdown().await; // or drop it
//! # Ok(())
//! # }
//! ```
//!
//! Runnable versions are in the crate's `examples/` folder
//! (`cargo run -p sandbox-agent-sdk --example stream_prompt` after
//! `cargo build -p sandbox-agent`): `stream_prompt` (embedded, streamed),
//! `server_mode` (a running server with a token), `permissions` (a
//! handler, and answering from the client-wide stream), `metadata_history`
//! (metadata and the recorded event history).
//!
//! # Server mode, a permission handler, the client-wide stream
//!
//! With a base URL (and the server's token) the client talks to a running
//! server. A [`permission_handler`](ClientOptions::permission_handler)
//! answers every permission request; [`Events`] carries everything the
//! agent sends, for every session (a dashboard's view). Read it while the
//! turn runs:
//!
//! ```no_run
//! use sandbox_agent_sdk::schema::{NewSessionRequest, PromptRequest, SessionUpdate};
//! use sandbox_agent_sdk::{ClientOptions, Event, PermissionDecision, SandboxAgentClient, StreamExt};
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
//! tokio::spawn(async move {
//!     while let Some(event) = events.next().await {
//!         if let Event::SessionUpdate(update) = event
//!             && let SessionUpdate::ToolCall(call) = update.update
//!         {
//!             eprintln!("[{}] {}", update.session_id, call.title);
//!         }
//!     }
//! });
//! let session = client.new_session(NewSessionRequest::new("/work")).await?;
//! let done = client
//!     .prompt(PromptRequest::new(session.session_id.clone(), vec!["hello".into()]))
//!     .await?;
//! println!("{:?}", done.stop_reason);
//! # Ok(())
//! # }
//! ```
//!
//! # Nothing waits for ever
//!
//! A permission request that no handler answers and nobody reads (from the
//! [`TurnStream`] or [`Events`]) within
//! [`unread_permission_timeout`](ClientOptions::unread_permission_timeout)
//! (30 s by default) is answered "cancelled" and logged as a warning, so
//! [`prompt`](SandboxAgentClient::prompt) returns (usually with stop reason
//! `cancelled`) instead of hanging. A question of the agent is answered
//! "cancel" the same way after
//! [`unread_question_timeout`](ClientOptions::unread_question_timeout).
//! [`ClientOptions::request_timeout`] bounds every call.
//!
//! # Questions of the agent
//!
//! The client declares ACP elicitation (`clientCapabilities.elicitation`,
//! form and URL modes; [`ClientOptions::elicitation`] to change that), so
//! an agent may ask the person something: a [`QuestionRequest`] on the
//! turn stream ([`TurnEvent::Question`]) or on [`Events`]
//! ([`Event::Question`]). [`QuestionRequest::accept`] checks the answer
//! against the form before sending it, and a wrong answer can be fixed:
//!
//! ```no_run
//! # use sandbox_agent_sdk::{QuestionRequest, Error};
//! # fn answer(question: QuestionRequest) -> Result<(), Error> {
//! use serde_json::json;
//! if let Some(url) = question.url() {
//!     println!("{}: open {url}", question.message());
//!     return question.accept(()); // URL mode: no content
//! }
//! match question.accept(json!({"name": "", "color": "green"})) {
//!     Err(Error::InvalidAnswer { field, message }) => {
//!         eprintln!("{field:?} {message}"); // Some("name") "must be at least 1 character long (is 0)"
//!         question.accept(json!({"name": "Ada", "color": "green", "confirm": true}))
//!     }
//!     other => other,
//! }
//! # }
//! ```
//!
//! # Errors
//!
//! One [`Error`] type; branch on [`Error::is_not_found`],
//! [`Error::is_unauthorized`], [`Error::is_connection_lost`],
//! [`Error::is_timeout`] and [`Error::is_auth_required`], which answer alike
//! for control-plane routes (HTTP status) and calls on the connection
//! (JSON-RPC code).
//!
//! # Layout
//! - `client/`: [`SandboxAgentClient`] (`handle`: the client and what its
//!   clones share), one file per area: `lifecycle`
//!   (`connect`, `open`, `close`, `shutdown`), `acp` (ACP methods under
//!   their ACP names: `new_session`, `prompt`, `prompt_stream`, …),
//!   `extensions` (sandbox-agent extensions under sandbox names:
//!   `set_metadata`, `terminate_session`, …), `control_plane` (`health`,
//!   `agents`, `install_agent`, `list_session_entries` (pages of the
//!   inventory) and `all_sessions`, `session_events`; `inventory_entry`
//!   and `inventory_events` for a session of any agent), `fs`
//!   (the host file system: [`FsPath`], listing, stat, mkdir, move,
//!   delete, streamed file reads ([`FsDownload`]) and writes, tree uploads
//!   (`upload_fs_batch`, `upload_fs_dir`)), `processes` (the process API:
//!   `run_process`, `start_process` → [`ProcessHandle`] with a resumable
//!   [`ProcessOutput`] stream, stdin, signals, resize, `wait`;
//!   `list_processes`, `get_process`).
//! - `options`: [`ClientOptions`] (agent, server or embedded mode,
//!   auto-connect, timeouts, client capabilities, permission and question
//!   handlers, embedded-server settings).
//! - `connection`: one live connection: the ACP client over
//!   `acp-http-client`, its task and handlers.
//! - `event`: [`Event`], [`PermissionRequest`], [`PermissionDecision`]:
//!   one event and the permission request it may carry.
//! - `events`: [`Events`], the stream of them, and the sink that routes
//!   each to the stream or to its session's running turn.
//! - `question`: [`QuestionRequest`] (ACP elicitation) and the check of an
//!   answer against the form the agent asked for.
//! - `pending`: the responder of a request handed to the caller, shared
//!   with the timer that answers it when nobody reads it in time.
//! - `turn`: [`TurnEvent`], [`TurnStream`], and the routing of a
//!   session's events to its running turn.
//! - `meta`: `_meta["sandboxagent.dev"]` in ([`Metadata`],
//!   [`sandbox_meta`], the agent id) and out ([`WithMeta`],
//!   [`SessionEntry`] with typed [`SessionMeta`]; an entry made from its
//!   metadata, as a server lists it).
//! - `embedded`: finding, starting and stopping the server binary.
//! - `provider`: [`SandboxProvider`] and [`Sandbox`] (create, start with a
//!   generated token, healthy, destroy), the [`local()`] provider.
//! - `docker` (feature `docker`): the `docker::docker()` provider, containers
//!   through the Docker Engine API, and `cleanup(fleet)`.
//! - `sandbox_agent`: [`SandboxAgent`] (`start`, `connect`,
//!   `create_session`, `destroy_sandbox`) and [`Session`] (`prompt`,
//!   `prompt_stream`, `cancel`).
//! - `control`: the control-plane HTTP routes.
//! - `error`: [`Error`], one enum for everything.

mod client;
mod connection;
mod control;
#[cfg(feature = "docker")]
pub mod docker;
mod embedded;
mod error;
mod event;
mod events;
mod meta;
mod options;
mod pending;
mod provider;
mod question;
mod sandbox_agent;
mod turn;

pub use client::{
    EventPage, FS_RESUME_ATTEMPTS, FsDownload, FsPath, OUTPUT_RECONNECT, OutputEvent,
    ProcessHandle, ProcessOutput, SandboxAgentClient, SessionEntryPage, SessionEntryQuery,
    SessionList, SessionState, SetSessionModelRequest, SetSessionModelResponse,
};
pub use control::{Health, InstallOptions, InstallResult};
pub use embedded::{BINARY_ENV, LISTENING_PREFIX};
pub use error::{BoxError, Error, SandboxStep};
pub use event::{Event, PermissionDecision, PermissionHandler, PermissionRequest};
pub use events::Events;
pub use meta::{Metadata, SessionEntry, WithMeta, sandbox_meta, session_meta};
pub use options::{
    ClientOptions, DEFAULT_SHUTDOWN_GRACE, DEFAULT_STARTUP_TIMEOUT,
    DEFAULT_UNREAD_PERMISSION_TIMEOUT, DEFAULT_UNREAD_QUESTION_TIMEOUT, Mode, ServerLogs,
    Transport,
};
pub use provider::{DEFAULT_SANDBOX_TIMEOUT, LocalProvider, Sandbox, SandboxProvider, local};
pub use question::{QuestionContent, QuestionHandler, QuestionRequest};
pub use sandbox_agent::{PromptContent, SandboxAgent, Session, SessionOptions, StartOptions};
pub use turn::{TurnEvent, TurnStream};

// `Stream` (implemented by `Events` and `TurnStream`) and `StreamExt`
// (`next()`, `map`, …), so callers need not depend on `futures` for them.
#[doc(no_inline)]
pub use futures::{Stream, StreamExt};

#[doc(no_inline)]
pub use reqwest::StatusCode;

#[doc(no_inline)]
pub use acp_http_client::{HttpFailure, Problem, ReconnectPolicy};

#[doc(no_inline)]
pub use ext_methods::{FsEntry, FsEntryType, FsMoveResult, FsUploadBatchResult, FsWriteResult};

#[doc(no_inline)]
pub use ext_methods::{
    Encoding, Exit, OutputChunk, OutputDropped, OutputStream, ProcessInfo, ProcessListParams,
    ProcessPage, ProcessRequest, ProcessState, RunResult,
};

#[doc(no_inline)]
pub use ext_methods::{
    AgentInfo, AgentSource, AgentUnparsed, AttachResult, Direction, EndReason, HistoryPolicy,
    InterruptReason, ListModelsResult, ModelInfo, ModelsTarget, RequestResolved, Role,
    SessionEnded, SessionEvent, SessionEventsPage, SessionMeta, StderrExcerpt, StreamGap,
    TerminateResult, TerminatedBy, TurnInterrupted,
};

/// The ACP (protocol v1) message types the client's methods take and
/// return: `NewSessionRequest`, `PromptRequest`, `PromptResponse`,
/// `StopReason`, `SessionNotification`, `SessionUpdate`, `ContentBlock`,
/// `RequestPermissionRequest`, `SessionId` (from a `String`, an
/// `Arc<str>` or a `&'static str`), …
pub use agent_client_protocol::v1::schema;
