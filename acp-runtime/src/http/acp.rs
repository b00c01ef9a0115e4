//! The ACP transports RFD profile (Streamable HTTP) at `/acp` and
//! `/acp/{agent}` (research/contract.md, "The /acp profile").
//!
//! The same connections, sessions and agent processes as `/v2/rpc`; only the
//! shape differs: `initialize` answers 200 with `Acp-Connection-Id`, every
//! other message 202 with its answer on a stream; `GET` opens the
//! connection's stream, or with `Acp-Session-Id` one session's stream (a lane
//! of the same ring, see [`crate::memory::connection`]), both resumable with
//! `Last-Event-ID`; `DELETE` ends the connection and the sessions only it is
//! attached to.

use super::body::{Body, HttpRequest, empty, full};
use super::edge::{self, Detached};
use super::headers::{accepts, last_event_id};
use super::routes::ACP_PATH;
use super::sse;
use crate::error::Error;
use crate::inbound::{Inbound, one_line};
use crate::memory::connection::Profile;
use crate::protocol::{
    self, ACP_CONNECTION_ID_HEADER, ACP_SESSION_ID_HEADER, APPLICATION_JSON, EVENT_STREAM, Kind,
    Lane, Scope,
};
use crate::runtime::dispatch::To;
use crate::runtime::open::Opening;
use crate::runtime::{Reply, Runtime};
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use std::sync::Arc;
use tracing::Span;

/// `POST`: `initialize` without a connection → 200 with the JSON answer and
/// `Acp-Connection-Id`; anything else → 202, its answer (if any) pushed to
/// the connection's ring. `path_agent`: the agent named by path, or the
/// server's `--default-agent` on a bare `/acp` (an `initialize` takes its
/// agent from `_meta`, else this, else gets 400). `span` is the HTTP
/// request's, the parent of the JSON-RPC request's span, which outlives it
/// (research/contract.md, "Traces").
///
/// # Errors
/// The problem the RFD's routing table gives (400, 404, 406, 409, 415, 501)
/// and the runtime's own.
pub async fn post(
    runtime: &Arc<Runtime>,
    request: &mut HttpRequest,
    path_agent: Option<&str>,
    span: &Span,
) -> Result<Response<Body>, Error> {
    let body = edge::read(runtime, request).await?;
    if body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
        return Err(Error::BatchNotSupported);
    }
    let connection_id = header(request.headers(), ACP_CONNECTION_ID_HEADER)?;
    let session_header = header(request.headers(), ACP_SESSION_ID_HEADER)?;
    let line = one_line(&body);
    let mut apart = None;
    let message = edge::parse(&line, &mut apart)
        .await
        .ok_or(Error::ShuttingDown)?
        .map_err(edge::invalid)?;
    let Some(connection_id) = connection_id else {
        if !message.is_initialize() {
            return Err(Error::InvalidRequest(format!(
                "the {ACP_CONNECTION_ID_HEADER} header is required (only initialize may be sent without one)"
            )));
        }
        if path_agent.is_none() && protocol::meta_agent(message.envelope.params).is_none() {
            return Err(Error::InvalidRequest(format!(
                "name the agent in the path: POST {ACP_PATH}/{{agent}} (known agents: {}), or in params._meta[\"sandboxagent.dev\"].agent of initialize (or start the server with --default-agent)",
                runtime.agents.known_ids()
            )));
        }
        return initialize(runtime, &message, path_agent, span).await;
    };
    let connection = runtime.connections.lookup(&connection_id)?;
    let method = message.method_name();
    let params_session = message.envelope.session_id();
    if message.kind != Kind::Response && message.method.scope() == Scope::Session {
        match (&session_header, &params_session) {
            (None, _) => {
                return Err(Error::InvalidRequest(format!(
                    "{method} is session-scoped: send the {ACP_SESSION_ID_HEADER} header"
                )));
            }
            (Some(header), Some(params)) if header != params => {
                return Err(Error::InvalidRequest(format!(
                    "the {ACP_SESSION_ID_HEADER} header does not match params.sessionId"
                )));
            }
            _ => {}
        }
    }
    let lane = match message.method.lane() {
        Lane::Connection => None,
        Lane::Session => session_header.or(params_session),
    };
    let detached = Detached {
        runtime: runtime.clone(),
        connection,
        lane,
        span: span.clone(),
    };
    detached.start(&message).await;
    Ok(empty(StatusCode::ACCEPTED))
}

/// `initialize` opening a connection: the 200 answer with
/// `Acp-Connection-Id`.
async fn initialize(
    runtime: &Arc<Runtime>,
    message: &Inbound<'_>,
    path_agent: Option<&str>,
    span: &Span,
) -> Result<Response<Body>, Error> {
    let opening = Opening {
        profile: Profile::Acp,
        agent: path_agent,
        connection_id: None,
    };
    let reply = runtime.dispatch(To::Open(opening), message, span).await?;
    let Reply::Json {
        body,
        connection_id,
        ..
    } = reply
    else {
        return Ok(empty(StatusCode::ACCEPTED));
    };
    let mut response = full(StatusCode::OK, APPLICATION_JSON, body);
    if let Some(id) = connection_id
        && let Ok(value) = HeaderValue::from_str(&id)
    {
        response
            .headers_mut()
            .insert(ACP_CONNECTION_ID_HEADER, value);
    }
    Ok(response)
}

/// `GET`: the connection's stream, or with `Acp-Session-Id` that session's.
pub async fn get(runtime: &Arc<Runtime>, request: &HttpRequest) -> Result<Response<Body>, Error> {
    let headers = request.headers();
    if !accepts(headers, EVENT_STREAM) {
        return Err(Error::NotAcceptable(EVENT_STREAM));
    }
    let id = header(headers, ACP_CONNECTION_ID_HEADER)?.ok_or_else(|| {
        Error::InvalidRequest(format!("the {ACP_CONNECTION_ID_HEADER} header is required"))
    })?;
    let last_event_id = last_event_id(headers)?;
    let connection = runtime.connections.lookup(&id)?;
    let session = header(headers, ACP_SESSION_ID_HEADER)?;
    if let Some(session) = &session {
        // Known to this connection, or to its agent (a stream opened before
        // `session/load` on a new connection, as the RFD's resume flow does).
        let attached = connection
            .attached_sessions()
            .iter()
            .any(|attached| **attached == **session);
        if !attached {
            runtime.recall(Some(&connection.agent), session).await?;
        }
        let known = attached || runtime.sessions.get(&connection.agent, session).is_some();
        if !known {
            return Err(Error::UnknownSession(session.clone()));
        }
    }
    let stream = connection.open_lane_stream(session.as_deref(), last_event_id)?;
    Ok(sse::response(
        stream,
        runtime.config.heartbeat,
        runtime.shutdown.clone(),
        ACP_CONNECTION_ID_HEADER,
        &connection.id,
    ))
}

/// `DELETE`: 202; ends the sessions only this connection is attached to
/// (the RFD terminates "the connection and all associated sessions"; a
/// session another connection also follows lives on), then the connection.
///
/// # Errors
/// 400 without `Acp-Connection-Id`, 404 for an unknown one.
pub async fn delete(
    runtime: &Arc<Runtime>,
    request: &HttpRequest,
) -> Result<Response<Body>, Error> {
    let id = header(request.headers(), ACP_CONNECTION_ID_HEADER)?.ok_or_else(|| {
        Error::InvalidRequest(format!("the {ACP_CONNECTION_ID_HEADER} header is required"))
    })?;
    let connection = runtime.connections.lookup(&id)?;
    for session_id in connection.attached_sessions() {
        let Some(session) = runtime.sessions.get(&connection.agent, &session_id) else {
            continue;
        };
        let alone = session
            .attached()
            .iter()
            .all(|other| Arc::ptr_eq(other, &connection));
        if alone && !session.is_ended() {
            let _ = runtime
                .terminate_session(&connection.agent, &session_id)
                .await;
        }
    }
    if runtime.connections.close(&id, &runtime.sessions) {
        tracing::info!(connection = id, "connection closed by DELETE /acp");
    }
    Ok(empty(StatusCode::ACCEPTED))
}

/// A header's value, trimmed; an empty one counts as absent.
fn header(headers: &HeaderMap, name: &str) -> Result<Option<String>, Error> {
    match super::headers::single(headers, name)? {
        None => Ok(None),
        Some(value) => value
            .to_str()
            .map(|v| Some(v.trim().to_owned()).filter(|v| !v.is_empty()))
            .map_err(|_| Error::InvalidRequest(format!("{name} must be visible ASCII"))),
    }
}
