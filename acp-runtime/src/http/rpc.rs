//! `POST`, `GET` and `DELETE` on `/v2/rpc`
//! (research/contract.md, "Transport: /v2/rpc").

use super::body::{Body, HttpRequest, empty, full};
use super::edge;
use super::headers::{accepts, last_event_id};
use super::sse;
use crate::error::Error;
use crate::inbound::one_line;
use crate::protocol::{APPLICATION_JSON, CONNECTION_ID_HEADER, EVENT_STREAM, LAST_EVENT_ID_HEADER};
use crate::runtime::dispatch::To;
use crate::runtime::open::Opening;
use crate::runtime::{Reply, Runtime};
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use std::sync::Arc;

/// `POST /v2/rpc`: one JSON-RPC message in, its response (200) or 202 out;
/// `span` is the HTTP request's (research/contract.md, "Traces").
///
/// # Errors
/// 415, 406, 413, 408, 400, 404, and the runtime's errors (502, 503, 504).
pub async fn post(
    runtime: &Arc<Runtime>,
    request: &mut HttpRequest,
    span: &tracing::Span,
) -> Result<Response<Body>, Error> {
    let body = edge::read(runtime, request).await?;
    let connection_id = connection_id(request.headers())?;
    let line = one_line(&body);
    let mut apart = None;
    let message = edge::parse(&line, &mut apart)
        .await
        .ok_or(Error::ShuttingDown)?
        .map_err(edge::invalid)?;
    let connection;
    let to = match connection_id {
        None => To::Open(Opening::default()),
        Some(id) => {
            connection = runtime.connections.lookup(id)?;
            To::Connection(&connection)
        }
    };
    match runtime.dispatch(to, &message, span).await? {
        Reply::Json {
            body,
            connection_id,
            last_event_id,
        } => {
            let mut response = full(StatusCode::OK, APPLICATION_JSON, body);
            if let Some(id) = connection_id
                && let Ok(value) = HeaderValue::from_str(&id)
            {
                response.headers_mut().insert(CONNECTION_ID_HEADER, value);
            }
            if let Some(seq) = last_event_id {
                response
                    .headers_mut()
                    .insert(LAST_EVENT_ID_HEADER, HeaderValue::from(seq));
            }
            Ok(response)
        }
        Reply::Accepted => Ok(empty(StatusCode::ACCEPTED)),
    }
}

/// `GET /v2/rpc`: the connection's SSE stream, resumed after `Last-Event-ID`.
///
/// # Errors
/// 406, 400 (missing connection id, bad `Last-Event-ID`), 404, 409.
pub fn get(runtime: &Arc<Runtime>, request: &HttpRequest) -> Result<Response<Body>, Error> {
    let headers = request.headers();
    if !accepts(headers, EVENT_STREAM) {
        return Err(Error::NotAcceptable(EVENT_STREAM));
    }
    let id = connection_id(headers)?.ok_or(Error::MissingConnectionId(""))?;
    let last_event_id = last_event_id(headers)?;
    let connection = runtime.connections.lookup(id)?;
    let stream = connection.open_stream(last_event_id)?;
    Ok(sse::response(
        stream,
        runtime.config.heartbeat,
        runtime.shutdown.clone(),
        CONNECTION_ID_HEADER,
        &connection.id,
    ))
}

/// `DELETE /v2/rpc`: closes the connection; 204 also when unknown or closed.
///
/// # Errors
/// 400 when the connection id header is missing.
pub fn delete(runtime: &Arc<Runtime>, request: &HttpRequest) -> Result<Response<Body>, Error> {
    let id = connection_id(request.headers())?.ok_or(Error::MissingConnectionId(""))?;
    if runtime.connections.close(id, &runtime.sessions) {
        tracing::info!(connection = id, "connection closed by DELETE");
    }
    Ok(empty(StatusCode::NO_CONTENT))
}

/// The connection id header, trimmed; an empty one counts as absent.
fn connection_id(headers: &HeaderMap) -> Result<Option<&str>, Error> {
    match super::headers::single(headers, CONNECTION_ID_HEADER)? {
        None => Ok(None),
        Some(value) => value
            .to_str()
            .map(|v| Some(v.trim()).filter(|v| !v.is_empty()))
            .map_err(|_| {
                Error::InvalidRequest(format!("{CONNECTION_ID_HEADER} must be visible ASCII"))
            }),
    }
}
