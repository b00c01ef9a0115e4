//! The ACP transports RFD profile (Streamable HTTP) at `/acp` and
//! `/acp/{agent}` (research/contract.md, "The /acp profile").
//!
//! The same connections, sessions and agent processes as `/v2/rpc`; only the
//! shape differs: `initialize` answers 200 with `Acp-Connection-Id`, every
//! other message 202 with its answer on a stream; `GET` opens the
//! connection's stream, or with `Acp-Session-Id` one session's stream (a lane
//! of the same ring, see [`crate::connection`]), both resumable with
//! `Last-Event-ID`; `DELETE` ends the connection and the sessions only it is
//! attached to.

use super::headers::{accepts, is_json_content, last_event_id};
use super::{Body, HttpRequest, empty, full, read_body, sse};
use crate::connection::Connection;
use crate::error::Error;
use crate::protocol::{self, Envelope, EnvelopeError, Kind, OwnedEnvelope, method};
use crate::runtime::{Profile, Reply, Runtime};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Response, StatusCode};
use serde_json::value::RawValue;
use std::sync::Arc;

/// Header naming the connection (ACP transports RFD, "Identity Model").
pub const CONNECTION_ID_HEADER: &str = "acp-connection-id";
/// Header naming the session of a session-scoped request or stream.
pub const SESSION_ID_HEADER: &str = "acp-session-id";
/// Path of the profile; `/acp/{agent}` names the agent.
pub const PATH: &str = "/acp";

const APPLICATION_JSON: &str = "application/json";
use sse::EVENT_STREAM;

/// Methods that act on one session: the RFD requires `Acp-Session-Id` on
/// them (the list the official Rust client uses).
const SESSION_SCOPED: &[&str] = &[
    method::SESSION_PROMPT,
    method::SESSION_CANCEL,
    "session/close",
    "session/delete",
    method::SESSION_FORK,
    method::SESSION_LOAD,
    method::SESSION_RESUME,
    "session/set_config_option",
    method::SESSION_SET_MODE,
    method::SESSION_SET_MODEL,
];

/// Answers that belong on the connection stream even though the request
/// names a session: the client may not have that session's stream yet
/// (RFD, "Streamable HTTP Message Flow").
const CONNECTION_LANE_ANSWERS: &[&str] = &[
    method::SESSION_NEW,
    method::SESSION_LOAD,
    method::SESSION_RESUME,
    method::SESSION_FORK,
];

/// The agent `path` names: `Some(None)` for `/acp`, `Some(Some(segment))`
/// for `/acp/{agent}` (still percent-encoded), `None` for other paths.
pub fn target(path: &str) -> Option<Option<&str>> {
    let rest = path.strip_prefix(PATH)?;
    if rest.is_empty() || rest == "/" {
        return Some(None);
    }
    let agent = rest.strip_prefix('/')?;
    (!agent.is_empty() && !agent.contains('/')).then_some(Some(agent))
}

/// Serves one request on the profile; `agent` is the agent named by path.
/// On a bare `/acp` the server's `--default-agent` stands in for it, so an
/// `initialize` takes its agent from `_meta`, else the default, else gets 400.
///
/// # Errors
/// The problem the RFD's routing table gives (400, 404, 406, 409, 415, 501)
/// and the runtime's own.
pub async fn route(
    runtime: &Arc<Runtime>,
    request: &mut HttpRequest,
    agent: Option<&str>,
) -> Result<Response<Body>, Error> {
    let agent = agent.or(runtime.config.default_agent.as_deref());
    match *request.method() {
        Method::POST => post(runtime, request, agent).await,
        Method::GET if super::websocket::is_upgrade(request.headers()) => {
            super::websocket::upgrade(runtime, request, agent)
        }
        Method::GET => get(runtime, request),
        Method::DELETE => delete(runtime, request).await,
        _ => Err(Error::MethodNotAllowed("GET, POST, DELETE")),
    }
}

/// `POST`: `initialize` without a connection → 200 with the JSON answer and
/// `Acp-Connection-Id`; anything else → 202, its answer (if any) pushed to
/// the connection's ring.
async fn post(
    runtime: &Arc<Runtime>,
    request: &mut HttpRequest,
    path_agent: Option<&str>,
) -> Result<Response<Body>, Error> {
    if !is_json_content(request.headers()) {
        return Err(Error::UnsupportedMediaType);
    }
    if !accepts(request.headers(), APPLICATION_JSON) {
        return Err(Error::NotAcceptable(APPLICATION_JSON));
    }
    let body = read_body(
        request,
        runtime.config.max_body_bytes,
        runtime.config.read_timeout,
    )
    .await?;
    if body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[') {
        return Err(Error::BatchNotSupported);
    }
    let connection_id = header(request.headers(), CONNECTION_ID_HEADER)?;
    let session_header = header(request.headers(), SESSION_ID_HEADER)?;
    let invalid =
        |error: EnvelopeError| Error::InvalidRequest(format!("invalid JSON-RPC message: {error}"));
    let body = one_line_message(body).map_err(invalid)?;
    let (envelope, kind) = Envelope::parse(&body, true).map_err(invalid)?;
    let Some(connection_id) = connection_id else {
        if kind != Kind::Request || envelope.method() != method::INITIALIZE {
            return Err(Error::InvalidRequest(format!(
                "the {CONNECTION_ID_HEADER} header is required (only initialize may be sent without one)"
            )));
        }
        if path_agent.is_none() && protocol::meta_agent(envelope.params).is_none() {
            return Err(Error::InvalidRequest(format!(
                "name the agent in the path: POST {PATH}/{{agent}} (known agents: {}), or in params._meta[\"sandboxagent.dev\"].agent of initialize (or start the server with --default-agent)",
                runtime.agents.known_ids()
            )));
        }
        return initialize(runtime, body, path_agent).await;
    };
    let connection = runtime.connections.lookup(&connection_id)?;
    let method = envelope.method().to_owned();
    let params_session = envelope.session_id();
    if kind != Kind::Response && SESSION_SCOPED.contains(&method.as_str()) {
        match (&session_header, &params_session) {
            (None, _) => {
                return Err(Error::InvalidRequest(format!(
                    "{method} is session-scoped: send the {SESSION_ID_HEADER} header"
                )));
            }
            (Some(header), Some(params)) if header != params => {
                return Err(Error::InvalidRequest(format!(
                    "the {SESSION_ID_HEADER} header does not match params.sessionId"
                )));
            }
            _ => {}
        }
    }
    let request_id = envelope.id.map(RawValue::to_owned);
    let lane = if CONNECTION_LANE_ANSWERS.contains(&method.as_str()) {
        None
    } else {
        session_header.or(params_session)
    };
    let dispatch = Dispatch {
        runtime: runtime.clone(),
        connection,
        request_id,
        lane,
    };
    dispatch.start(&envelope, kind, &body).await;
    Ok(empty(StatusCode::ACCEPTED))
}

/// `initialize` opening a connection: the 200 answer with
/// `Acp-Connection-Id`.
async fn initialize(
    runtime: &Arc<Runtime>,
    body: Bytes,
    path_agent: Option<&str>,
) -> Result<Response<Body>, Error> {
    let profile = Profile {
        agent: path_agent,
        connection_id: None,
    };
    let reply = runtime.handle_post_for(None, body, profile).await?;
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
        response.headers_mut().insert(CONNECTION_ID_HEADER, value);
    }
    Ok(response)
}

/// One message of an open connection, handled apart from the HTTP exchange
/// or WebSocket frame that brought it; its answer goes to the ring.
pub(crate) struct Dispatch {
    pub(crate) runtime: Arc<Runtime>,
    pub(crate) connection: Arc<Connection>,
    /// The client's request id; `None` for notifications and answers.
    pub(crate) request_id: Option<Box<RawValue>>,
    /// The session whose stream gets the answer (when it has one).
    pub(crate) lane: Option<String>,
}

impl Dispatch {
    /// Runs `envelope` of `kind`, parsed from `body` (one line, see
    /// [`one_line_message`]): a request in its own task (its answer may
    /// take a whole prompt turn), a notification or an answer to an agent
    /// request before returning, so a later message cannot overtake it on
    /// its way to the agent. The message is not parsed again: a request's
    /// task gets a copy of its members ([`OwnedEnvelope`]).
    pub(crate) async fn start(self, envelope: &Envelope<'_>, kind: Kind, body: &Bytes) {
        if kind == Kind::Request {
            let owned = OwnedEnvelope::new(envelope);
            let body = body.clone();
            tokio::spawn(async move { self.run(&owned.envelope(), kind, &body).await });
        } else {
            self.run(envelope, kind, body).await;
        }
    }

    /// Hands the message to the runtime and pushes what comes back to the
    /// connection's ring: the answer, or a JSON-RPC error carrying the
    /// problem a `/v2/rpc` POST would have answered with. The connection's
    /// agent stands in for `_meta` ([`Profile::agent`]).
    async fn run(self, envelope: &Envelope<'_>, kind: Kind, body: &Bytes) {
        let reply = self
            .runtime
            .handle_parsed(&self.connection, envelope, kind, body, true)
            .await;
        let line = match reply {
            Ok(Reply::Json { body, .. }) => body,
            Ok(Reply::Accepted) => return,
            Err(error) => {
                let Some(id) = &self.request_id else {
                    tracing::debug!(connection = %self.connection.id, %error, "message failed");
                    return;
                };
                Bytes::from(protocol::error_response_line(id, &error.to_rpc_error()))
            }
        };
        self.connection.push_in(&line, self.lane.as_deref());
    }
}

/// The message of `body` as one line, ready for the one parse that
/// [`Dispatch::start`] takes: `body` itself when it has no CR or LF (the
/// common case); else, once it parsed as a JSON-RPC message, a copy with them
/// flattened ([`protocol::one_line`] is only for bytes that parsed: a raw
/// newline inside a string must stay an error).
///
/// # Errors
/// Why `body` is not a JSON-RPC message, when it has a CR or LF.
pub(crate) fn one_line_message(body: Bytes) -> Result<Bytes, EnvelopeError> {
    if !protocol::has_newline(&body) {
        return Ok(body);
    }
    Envelope::parse(&body, true)?;
    Ok(Bytes::from(protocol::one_line(&body).into_owned()))
}

/// `GET`: the connection's stream, or with `Acp-Session-Id` that session's.
fn get(runtime: &Arc<Runtime>, request: &HttpRequest) -> Result<Response<Body>, Error> {
    let headers = request.headers();
    if !accepts(headers, EVENT_STREAM) {
        return Err(Error::NotAcceptable(EVENT_STREAM));
    }
    let id = header(headers, CONNECTION_ID_HEADER)?.ok_or_else(|| {
        Error::InvalidRequest(format!("the {CONNECTION_ID_HEADER} header is required"))
    })?;
    let last_event_id = last_event_id(headers)?;
    let connection = runtime.connections.lookup(&id)?;
    let session = header(headers, SESSION_ID_HEADER)?;
    if let Some(session) = &session {
        // Known to this connection, or to its agent (a stream opened before
        // `session/load` on a new connection, as the RFD's resume flow does).
        let known = connection
            .attached_sessions()
            .iter()
            .any(|attached| **attached == **session)
            || runtime.sessions.get(&connection.agent, session).is_some();
        if !known {
            return Err(Error::UnknownSession(session.clone()));
        }
    }
    let stream = connection.open_lane_stream(session.as_deref(), last_event_id)?;
    Ok(sse::response(
        stream,
        runtime.config.heartbeat,
        runtime.shutdown.clone(),
        CONNECTION_ID_HEADER,
        &connection.id,
    ))
}

/// `DELETE`: 202; ends the sessions only this connection is attached to
/// (the RFD terminates "the connection and all associated sessions"; a
/// session another connection also follows lives on), then the connection.
///
/// # Errors
/// 400 without `Acp-Connection-Id`, 404 for an unknown one.
async fn delete(runtime: &Arc<Runtime>, request: &HttpRequest) -> Result<Response<Body>, Error> {
    let id = header(request.headers(), CONNECTION_ID_HEADER)?.ok_or_else(|| {
        Error::InvalidRequest(format!("the {CONNECTION_ID_HEADER} header is required"))
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
    match headers.get(name) {
        None => Ok(None),
        Some(value) => value
            .to_str()
            .map(|v| Some(v.trim().to_owned()).filter(|v| !v.is_empty()))
            .map_err(|_| Error::InvalidRequest(format!("{name} must be visible ASCII"))),
    }
}

#[cfg(test)]
mod tests {
    use super::target;

    #[test]
    fn paths() {
        assert_eq!(target("/acp"), Some(None));
        assert_eq!(target("/acp/"), Some(None));
        assert_eq!(target("/acp/mock"), Some(Some("mock")));
        assert_eq!(target("/acp/mock/x"), None);
        assert_eq!(target("/acpx"), None);
        assert_eq!(target("/v2/rpc"), None);
    }
}
