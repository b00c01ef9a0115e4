//! A client's JSON-RPC message at the HTTP edges: the POST preamble both
//! `/v2/rpc` and `/acp` share, the one parse ([`Inbound`]), and the run of a
//! message whose answer goes to the connection's ring instead of the
//! exchange that brought it (`/acp` POSTs, WebSocket frames).

use super::body::{HttpRequest, read_body};
use super::headers::{accepts, is_json_content};
use crate::error::Error;
use crate::inbound::{Inbound, OwnedInbound};
use crate::memory::connection::Connection;
use crate::protocol::{self, APPLICATION_JSON, EnvelopeError, Kind};
use crate::runtime::dispatch::To;
use crate::runtime::{Reply, Runtime};
use bytes::Bytes;
use serde_json::value::RawValue;
use std::sync::Arc;
use tracing::Span;

/// Checks a POST carrying one JSON-RPC message (`Content-Type` JSON,
/// `Accept` allowing JSON) and reads its body, as sent (see [`one_line`]).
///
/// # Errors
/// 415, 406, 413, 408, and 400 for a body that breaks off.
pub async fn read(runtime: &Runtime, request: &mut HttpRequest) -> Result<Bytes, Error> {
    if !is_json_content(request.headers()) {
        return Err(Error::UnsupportedMediaType);
    }
    if !accepts(request.headers(), APPLICATION_JSON) {
        return Err(Error::NotAcceptable(APPLICATION_JSON));
    }
    read_body(
        request,
        runtime.config.max_body_bytes,
        runtime.config.read_timeout,
    )
    .await
}

/// Longest message, in bytes, parsed on the async thread that read it. A
/// longer one (up to `--max-body-bytes`, 16 MiB by default) is parsed on the
/// blocking pool ([`parse_apart`]): its passes take milliseconds per MiB,
/// and on the default single async thread (`--worker-threads 1`) every other
/// exchange would wait for them.
pub const INLINE_PARSE_BYTES: usize = 64 * 1024;

/// Parses `line` (longer than [`INLINE_PARSE_BYTES`]) on the blocking pool,
/// into a message that owns its members: one copy of them, no second parse.
///
/// # Errors
/// The [`EnvelopeError`] naming what is wrong; [`Error::ShuttingDown`] (as
/// the inner error's carrier) when the blocking pool no longer runs tasks.
async fn parse_apart(line: Bytes) -> Result<Result<OwnedInbound, EnvelopeError>, Error> {
    tokio::task::spawn_blocking(move || Inbound::parse(&line).map(|m| OwnedInbound::new(&m)))
        .await
        // The closure cannot panic; a join error means the runtime is
        // dropping its blocking tasks: it is shutting down.
        .map_err(|_| Error::ShuttingDown)
}

/// The message of `line`, parsed in place, or on the blocking pool into
/// `apart` when it is longer than [`INLINE_PARSE_BYTES`] (every edge: a
/// `/v2/rpc` or `/acp` POST, a WebSocket frame). `None` when the server is
/// shutting down.
pub async fn parse<'a>(
    line: &'a Bytes,
    apart: &'a mut Option<OwnedInbound>,
) -> Option<Result<Inbound<'a>, EnvelopeError>> {
    if line.len() <= INLINE_PARSE_BYTES {
        return Some(Inbound::parse(line));
    }
    match parse_apart(line.clone()).await.ok()? {
        Ok(owned) => Some(Ok(apart.insert(owned).inbound())),
        Err(error) => Some(Err(error)),
    }
}

/// The 400 for bytes that are not a JSON-RPC message.
pub fn invalid(error: EnvelopeError) -> Error {
    Error::InvalidRequest(format!("invalid JSON-RPC message: {error}"))
}

/// One message of an open connection, run apart from the HTTP exchange or
/// WebSocket frame that brought it; its answer goes to the ring.
pub struct Detached {
    /// The runtime that runs it.
    pub runtime: Arc<Runtime>,
    /// The connection it came on.
    pub connection: Arc<Connection>,
    /// The session whose stream gets the answer (when it has one).
    pub lane: Option<String>,
    /// The span of the exchange that brought the message, the parent of
    /// its request's span (research/contract.md, "Traces"): a `POST /acp`'s,
    /// which the request outlives; [`Span::none`] for a WebSocket frame.
    pub span: Span,
}

impl Detached {
    /// Runs `message`: a request in its own task (its answer may take a
    /// whole prompt turn), a notification or an answer to an agent request
    /// before returning, so a later message cannot overtake it on its way to
    /// the agent.
    pub async fn start(self, message: &Inbound<'_>) {
        if message.kind == Kind::Request {
            // The request outlives the exchange (202 at once); its spans
            // still descend from the exchange's (`span`).
            tokio::spawn(self.request(message));
        } else {
            self.run(message).await;
        }
    }

    /// The run of request `message` as a future of its own, for whoever
    /// drives it: [`Detached::start`] spawns it, a WebSocket polls it in its
    /// socket task (`http::websocket`). It owns a copy of the message's
    /// members ([`OwnedInbound`], no second parse) and has pushed the answer
    /// to the ring when it completes.
    pub fn request(self, message: &Inbound<'_>) -> impl Future<Output = ()> + Send + 'static {
        let owned = OwnedInbound::new(message);
        async move { self.run(&owned.inbound()).await }
    }

    /// Hands the message to the runtime and pushes what comes back to the
    /// connection's ring: the answer, or a JSON-RPC error carrying the
    /// problem a `/v2/rpc` POST would have answered with.
    async fn run(self, message: &Inbound<'_>) {
        let reply = self
            .runtime
            .dispatch(To::Connection(&self.connection), message, &self.span)
            .await;
        let line = match reply {
            Ok(Reply::Json { body, .. }) => body,
            Ok(Reply::Accepted) => return,
            Err(error) => {
                let Some(id) = message.envelope.id else {
                    tracing::debug!(connection = %self.connection.id, %error, "message failed");
                    return;
                };
                Bytes::from(error_line(id, &error))
            }
        };
        self.connection.push(line, self.lane.as_deref());
    }
}

/// The JSON-RPC error answering request `id` that carries the problem
/// `error` (research/contract.md, "The /acp profile").
pub fn error_line(id: &RawValue, error: &Error) -> Vec<u8> {
    protocol::error_response_line(id, &error.to_rpc_error())
}
