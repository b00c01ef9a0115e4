//! ACP (Agent Client Protocol) over streamable HTTP, client side.
//!
//! The transport (sandbox-agent's research/contract.md, "Transport: /v2/rpc",
//! but nothing here is specific to it): `POST` each JSON-RPC message to one
//! endpoint (a request gets its response as the 200 body, anything else
//! 202); the first
//! `initialize` response names the connection in a header that every later
//! request carries; `GET` the same endpoint for a Server-Sent Events stream
//! of everything else the agent sends (notifications, its own requests, late
//! responses), resumable with `Last-Event-ID`; `DELETE` closes the
//! connection. Non-2xx answers are RFC 9457 problem documents.
//!
//! This crate does the transport and nothing else: what goes in `_meta`
//! (for example which agent a server should run) is the caller's business.
//!
//! # Layout
//! - `transport`: the typed layer. [`HttpTransport`] is an
//!   `agent-client-protocol` transport, so a client written against that
//!   crate runs over HTTP unchanged.
//! - `connection`: the raw layer. [`HttpConnection`] POSTs raw JSON-RPC
//!   messages; its [`Incoming`] stream yields everything that comes back,
//!   de-duplicated.
//! - `sse`: the event stream task: open, read, reconnect with back-off.
//! - `sse_parser`: the SSE wire format, bytes into [`SseEvent`]s
//!   ([`sse_events`]); public for the workspace's other SSE readers.
//! - `websocket`: the [`Transport::WebSocket`] socket task (one text frame
//!   per message, no resume).
//! - `options`: [`TransportOptions`] (URL, headers, token, timeouts, hook).
//! - `backoff`: [`ReconnectPolicy`] and the delay computation.
//! - `in_flight`: the requests waiting for a response (exactly-once delivery).
//! - `protocol`: wire constants and pure message / event-id classification.
//! - `error`: [`Error`], [`HttpFailure`] (a non-2xx answer) and the RFC 9457
//!   [`Problem`] document.
//!
//! # Delivery rules
//! - Each response is delivered once: a response can come in a POST body
//!   and on the event stream (a server moves it there when the POST's
//!   caller went away); the first arrival of a response whose request is in
//!   flight wins, later ones are dropped.
//! - Events on the stream are delivered in stream order; after a reconnect
//!   an event whose id is at or below the last one seen is dropped. An
//!   event without an id (such as a stream-gap notice) is delivered and does
//!   not move the resume point.
//! - Messages sent before the `initialize` response arrived wait for the
//!   connection id, so a caller may pipeline.
//! - A response never overtakes the notifications the agent sent before
//!   it: when a POST answer names the connection's newest event id
//!   (`x-acp-last-event-id`), the answer is held until the event stream
//!   delivered that event (at most 30 s, in case the stream is down).
//!
//! # The two-minute path
//!
//! ```sh
//! cargo add acp-http-client agent-client-protocol serde_json
//! cargo add tokio --features macros,rt-multi-thread
//! ```
//!
//! Start a server (`sandbox-agent server --no-token`) and prompt its
//! built-in mock agent, printing the reply as it streams in:
//!
//! ```no_run
//! use acp_http_client::{HttpTransport, TransportOptions};
//! use agent_client_protocol::schema::ProtocolVersion;
//! use agent_client_protocol::v1::schema::{
//!     ContentBlock, ContentChunk, InitializeRequest, NewSessionRequest, PromptRequest,
//!     SessionNotification, SessionUpdate,
//! };
//! use agent_client_protocol::Client;
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let transport = HttpTransport::new(TransportOptions::new("http://127.0.0.1:2468")?)?;
//!     // sandbox-agent reads the agent to run from `_meta`.
//!     let meta = serde_json::json!({"sandboxagent.dev": {"agent": "mock"}});
//!     let meta = meta.as_object().cloned();
//!     Client
//!         .v1()
//!         .on_receive_notification(
//!             async |notification: SessionNotification, _cx| {
//!                 if let SessionUpdate::AgentMessageChunk(ContentChunk {
//!                     content: ContentBlock::Text(text),
//!                     ..
//!                 }) = notification.update
//!                 {
//!                     print!("{}", text.text);
//!                 }
//!                 Ok(())
//!             },
//!             agent_client_protocol::on_receive_notification!(),
//!         )
//!         .connect_with(transport, async |cx| {
//!             let init = InitializeRequest::new(ProtocolVersion::V1).meta(meta.clone());
//!             cx.send_request(init).block_task().await?;
//!             let new_session = NewSessionRequest::new("/tmp").meta(meta);
//!             let session = cx.send_request(new_session).block_task().await?;
//!             let prompt = PromptRequest::new(session.session_id, vec!["hello".into()]);
//!             let done = cx.send_request(prompt).block_task().await?;
//!             println!("\n[{:?}]", done.stop_reason);
//!             Ok(())
//!         })
//!         .await?;
//!     Ok(())
//! }
//! ```
//!
//! `examples/prompt.rs` is the same with arguments, permission answers and
//! the wait for the last update.

mod backoff;
mod connection;
mod error;
mod in_flight;
mod link;
mod options;
mod protocol;
mod shared;
mod sse;
mod sse_parser;
mod transport;
mod websocket;

pub use backoff::ReconnectPolicy;
pub use connection::{HttpConnection, Incoming, SendError};
pub use error::{Error, HttpFailure, Problem};
pub use options::{
    DEFAULT_MAX_MESSAGE_BYTES, Direction, EnvelopeObserver, Transport, TransportOptions,
};
pub use protocol::{
    ACP_CONNECTION_ID_HEADER, ACP_PATH, ACP_SESSION_ID_HEADER, DEFAULT_CONNECTION_ID_HEADER,
    DEFAULT_PATH, LAST_EVENT_ID_HEADER,
};
pub use sse::whole_lines;
pub use sse_parser::{SseEvent, SseParser, sse_events};
pub use transport::{HttpTransport, TransportHandle, http_failure};
