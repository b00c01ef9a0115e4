//! The control plane (research/contract.md,
//! "Extension methods and control plane"): plain HTTP + JSON views of the
//! session inventory, the event logs and the agents, and agent installs.

use super::body::{Body, HttpRequest, full, read_body};
use super::headers::is_json_content;
use super::problem::Problem;
use crate::error::Error;
use crate::memory::session::Session;
use crate::memory::sessions::{ListFilter, ListState};
use crate::protocol::APPLICATION_JSON;
use crate::runtime::Runtime;
use agent_client_protocol::v1::schema::SessionInfo;
use bytes::Bytes;
use ext_methods::{
    AgentInstallParams, AgentInstallResult, AgentListResult, SessionEventsPage, SessionMeta,
};
use http::StatusCode;
use serde::Serialize;
use std::sync::Arc;

/// Largest body of `POST /v2/agents/{agent}/install`, in bytes.
const INSTALL_BODY_LIMIT: usize = 64 * 1024;

/// Events per page of `GET /v2/sessions/{id}/events` when `limit` is not given.
const DEFAULT_EVENTS_LIMIT: usize = 100;
/// Largest `limit` accepted.
const MAX_EVENTS_LIMIT: usize = 1000;

/// One path segment, percent-decoded (RFC 3986 section 2.1): ACP session ids
/// are arbitrary strings, so a client escapes `/`, spaces and the like.
///
/// # Errors
/// 400 when a `%` is not followed by two hex digits or the bytes are not UTF-8.
pub fn decode_segment(segment: &str) -> Result<String, Error> {
    let bytes = segment.as_bytes();
    let malformed = bytes.iter().enumerate().any(|(at, &byte)| {
        byte == b'%'
            && !bytes
                .get(at + 1..at + 3)
                .is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit))
    });
    if malformed {
        return Err(Error::InvalidRequest(format!(
            "path segment {segment:?} has a % not followed by two hex digits"
        )));
    }
    percent_encoding::percent_decode_str(segment)
        .decode_utf8()
        .map(std::borrow::Cow::into_owned)
        .map_err(|_| {
            Error::InvalidRequest(format!("path segment {segment:?} does not decode to UTF-8"))
        })
}

fn json(value: &impl Serialize) -> Result<http::Response<Body>, Error> {
    let body = serde_json::to_vec(value)
        .map_err(|e| Error::InvalidRequest(format!("cannot serialize the answer: {e}")))?;
    Ok(full(StatusCode::OK, APPLICATION_JSON, Bytes::from(body)))
}

/// One session as `GET /v2/sessions` lists it and `GET /v2/sessions/{id}`
/// answers: ACP's `SessionInfo` (whose crate has no OpenAPI schema), with
/// the runtime's `_meta["sandboxagent.dev"]`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionEntry {
    /// The session id.
    pub session_id: String,
    /// The session's working directory.
    pub cwd: String,
    /// Additional workspace roots, when the agent reported any.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub additional_directories: Vec<String>,
    /// Title, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Last activity (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<String>,
    /// `{"sandboxagent.dev": SessionMeta}`.
    #[serde(rename = "_meta")]
    pub meta: SessionEntryMeta,
}

/// The `_meta` of a [`SessionEntry`].
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SessionEntryMeta {
    /// What the runtime knows of the session.
    #[serde(rename = "sandboxagent.dev")]
    pub namespace: SessionMeta,
}

/// The answer of `GET /v2/sessions`: one page of the inventory.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionList {
    /// Newest first: ACP `SessionInfo` entries with
    /// `_meta["sandboxagent.dev"]`.
    #[schema(value_type = Vec<SessionEntry>)]
    sessions: Vec<SessionInfo>,
    /// Pass as `cursor` (with the same filters) for the next page; absent
    /// on the last.
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}

/// Entries per page of `GET /v2/sessions` when `limit` is not given.
const DEFAULT_SESSIONS_LIMIT: usize = 100;
/// Largest `limit` of `GET /v2/sessions`.
const MAX_SESSIONS_LIMIT: usize = 1000;

/// The longest title search `GET /v2/sessions?q=` takes, in characters
/// (research/contract.md, "Extension methods and control plane").
const MAX_TITLE_QUERY_CHARS: usize = 1024;

/// `GET /v2/sessions?limit=N&cursor=C&agent=A&state=S&q=TEXT` →
/// `{"sessions": [entry, …], "nextCursor"?}`, newest first
/// (research/contract.md, "Control plane").
///
/// # Errors
/// 400 `invalid-request` naming the parameter: `limit` not plain digits,
/// 0 or over 1000; a cursor this server did not make; an unknown `state`.
/// 503 `store-unavailable` when the store cannot be read.
#[utoipa::path(
    get,
    path = "/v2/sessions",
    summary = "List sessions.",
    description = "A page of the session inventory, newest first.",
    tag = "sessions",
    params(
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 1000, description = "Entries per page (default 100)."),
        ("cursor" = Option<String>, Query, description = "A previous page's `nextCursor`."),
        ("agent" = Option<String>, Query, description = "Only this agent's sessions."),
        ("state" = Option<ListState>, Query, description = "Only sessions in this state."),
        ("q" = Option<String>, Query, description = "Only sessions whose title contains this text (at most 1024 characters)."),
    ),
    responses(
        (status = 200, description = "A page of sessions, newest first.", body = SessionList),
        (status = 400, response = Problem),
        (status = 401, response = Problem),
        (status = 503, response = Problem),
    )
)]
pub async fn sessions(
    runtime: &Runtime,
    query: Option<&str>,
) -> Result<http::Response<Body>, Error> {
    let mut filter = ListFilter::default();
    let mut cursor = None;
    let mut limit = DEFAULT_SESSIONS_LIMIT;
    for (key, value) in super::query::pairs(query)? {
        if value.contains('\0') {
            return Err(Error::InvalidRequest(format!(
                "query parameter {key} must not contain NUL"
            )));
        }
        match &*key {
            "limit" => {
                limit = value
                    .bytes()
                    .all(|b| b.is_ascii_digit())
                    .then(|| value.parse::<usize>().ok())
                    .flatten()
                    .filter(|n| (1..=MAX_SESSIONS_LIMIT).contains(n))
                    .ok_or_else(|| {
                        Error::InvalidRequest(format!(
                            "query parameter limit must be between 1 and {MAX_SESSIONS_LIMIT}, got {value:?}"
                        ))
                    })?;
            }
            "cursor" => cursor = Some(value.into_owned()),
            "agent" => filter.agent = Some(value.into_owned()),
            "q" => {
                // SQLite refuses LIKE patterns past 50,000 bytes; a search
                // for a title needs far less.
                if value.chars().count() > MAX_TITLE_QUERY_CHARS {
                    return Err(Error::InvalidRequest(format!(
                        "query parameter q must be at most {MAX_TITLE_QUERY_CHARS} characters"
                    )));
                }
                filter.title = Some(value.into_owned()).filter(|q| !q.is_empty());
            }
            "state" => {
                filter.state = Some(match &*value {
                    "live" => ListState::Live,
                    "dormant" => ListState::Dormant,
                    "ended" => ListState::Ended,
                    other => {
                        return Err(Error::InvalidRequest(format!(
                            "query parameter state must be live, dormant or ended, got {other:?}"
                        )));
                    }
                });
            }
            _ => {}
        }
    }
    let page = runtime
        .inventory_page(&filter, cursor.as_deref(), limit)
        .await
        .map_err(|error| match error {
            Error::InvalidRequest(message) => {
                Error::InvalidRequest(format!("query parameter cursor: {message}"))
            }
            other => other,
        })?;
    json(&SessionList {
        sessions: page.sessions.iter().map(|s| s.info()).collect(),
        next_cursor: page.next_cursor,
    })
}

/// The query of `/v2/sessions/{id}[/events]`: `agent` picks among sessions
/// of several agents that share the id; `offset` and `limit` page events.
/// `application/x-www-form-urlencoded` (WHATWG URL standard), as browsers
/// and `reqwest` write queries; numbers are plain decimal digits; other keys
/// are ignored.
#[derive(Debug, Default)]
struct SessionQuery {
    agent: Option<String>,
    offset: Option<u64>,
    limit: Option<u64>,
}

impl SessionQuery {
    /// # Errors
    /// 400 for a number that is not plain decimal digits.
    fn parse(query: Option<&str>) -> Result<Self, Error> {
        let mut parsed = Self::default();
        for (key, value) in super::query::pairs(query)? {
            let number = || {
                value
                    .bytes()
                    .all(|b| b.is_ascii_digit())
                    .then(|| value.parse().ok())
                    .flatten()
                    .ok_or_else(|| {
                        Error::InvalidRequest(format!(
                            "query parameter {key} must be a non-negative integer, got {value:?}"
                        ))
                    })
            };
            match &*key {
                "agent" => parsed.agent = Some(value.into_owned()),
                "offset" => parsed.offset = Some(number()?),
                "limit" => parsed.limit = Some(number()?),
                _ => {}
            }
        }
        Ok(parsed)
    }
}

/// The session a control-plane path names (`id` still percent-encoded, as
/// in the path) and the query it came with: `id` of `query.agent` when
/// given, else the one session with that id.
///
/// # Errors
/// 400 for a bad segment or query; 404 `unknown-session`; 409
/// `ambiguous-session` naming the agents when several have that id and no
/// `agent` was given (research/contract.md, "Control plane"); 503 when
/// the store cannot be read.
async fn resolve(
    runtime: &Runtime,
    id: &str,
    query: Option<&str>,
) -> Result<(Arc<Session>, SessionQuery), Error> {
    let id = decode_segment(id)?;
    let query = SessionQuery::parse(query)?;
    runtime.recall(query.agent.as_deref(), &id).await?;
    let session = named(runtime, &id, &query)?;
    Ok((session, query))
}

/// Session `id` of `query.agent`, else the one session with that id.
fn named(runtime: &Runtime, id: &str, query: &SessionQuery) -> Result<Arc<Session>, Error> {
    let unknown = || Error::UnknownSession(id.to_owned());
    if let Some(agent) = &query.agent {
        return runtime.sessions.get(agent, id).ok_or_else(unknown);
    }
    let mut found = runtime.sessions.by_id(id);
    match found.len() {
        0 => Err(unknown()),
        1 => Ok(found.remove(0)),
        _ => Err(Error::AmbiguousSession {
            id: id.to_owned(),
            agents: found.iter().map(|s| s.agent.to_string()).collect(),
        }),
    }
}

/// `GET /v2/sessions/{id}[?agent=A]` → one entry; `id` as in the path
/// (percent-encoded).
///
/// # Errors
/// 400, 404, 409 as [`resolve`].
#[utoipa::path(
    get,
    path = "/v2/sessions/{id}",
    summary = "Describe a session.",
    description = "409 `ambiguous-session` names the agents when sessions of several agents share the id and `agent` is not given.",
    tag = "sessions",
    params(
        ("id" = String, Path, min_length = 1, description = "The session id, percent-encoded."),
        ("agent" = Option<String>, Query, description = "The agent, when sessions of several agents share the id."),
    ),
    responses(
        (status = 200, description = "The session.", body = SessionEntry),
        (status = 400, response = Problem),
        (status = 401, response = Problem),
        (status = 404, response = Problem),
        (status = 409, response = Problem),
        (status = 503, response = Problem),
    )
)]
pub async fn session(
    runtime: &Runtime,
    id: &str,
    query: Option<&str>,
) -> Result<http::Response<Body>, Error> {
    json(&resolve(runtime, id, query).await?.0.info())
}

/// `GET /v2/sessions/{id}/events?offset=N&limit=M[&agent=A]` → `SessionEventsPage`;
/// events memory no longer holds come from the store (research/contract.md,
/// "Durable sessions").
///
/// # Errors
/// 400 for a bad `limit`, 400, 404, 409 as [`resolve`], 503 when the
/// store cannot be read.
#[utoipa::path(
    get,
    path = "/v2/sessions/{id}/events",
    summary = "Read a session's event log.",
    description = "The ACP messages recorded for the session, oldest first; events memory no longer holds come from the session store.",
    tag = "sessions",
    params(
        ("id" = String, Path, min_length = 1, description = "The session id, percent-encoded."),
        ("agent" = Option<String>, Query, description = "The agent, when sessions of several agents share the id."),
        ("offset" = Option<u64>, Query, description = "The first event's offset (default 0)."),
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 1000, description = "Events per page (default 100)."),
    ),
    responses(
        (status = 200, description = "A page of the session's recorded ACP messages.", body = SessionEventsPage),
        (status = 400, response = Problem),
        (status = 401, response = Problem),
        (status = 404, response = Problem),
        (status = 409, response = Problem),
        (status = 503, response = Problem),
    )
)]
pub async fn events(
    runtime: &Runtime,
    id: &str,
    query: Option<&str>,
) -> Result<http::Response<Body>, Error> {
    let (session, query) = resolve(runtime, id, query).await?;
    let offset = query.offset.unwrap_or(0);
    let limit = query.limit.unwrap_or(DEFAULT_EVENTS_LIMIT as u64);
    if limit == 0 || limit > MAX_EVENTS_LIMIT as u64 {
        return Err(Error::InvalidRequest(format!(
            "limit must be between 1 and {MAX_EVENTS_LIMIT}"
        )));
    }
    json(
        &runtime
            .session_events(&session, offset, limit as usize)
            .await?,
    )
}

/// `GET /v2/agents` → `{"agents": [AgentInfo, …]}`.
#[utoipa::path(
    get,
    path = "/v2/agents",
    summary = "The agents this server knows.",
    description = "Every configured agent: installed or not, running or not, with what its `initialize` reported.",
    tag = "agents",
    responses(
        (status = 200, description = "Every known agent.", body = AgentListResult),
        (status = 401, response = Problem),
    )
)]
pub fn agents(runtime: &Runtime) -> Result<http::Response<Body>, Error> {
    json(&AgentListResult {
        agents: runtime.agents.infos(),
    })
}

/// `POST /v2/agents/{agent}/install` with an optional JSON body
/// `{"reinstall": bool, "version": "x"}` → `AgentInstallResult`. Installing
/// what is already there answers at once with `alreadyInstalled: true`.
///
/// # Errors
/// 400 (bad body or version), 404 `unknown-agent`, 408, 409 `not-installable`,
/// 413, 415, 502 `install-failed` (npm's output or the download error in
/// `detail`).
#[utoipa::path(
    post,
    path = "/v2/agents/{agent}/install",
    summary = "Install an agent.",
    description = "Installs the agent's version from its registry (npm, a release archive). Installing what is already there answers at once with `alreadyInstalled: true`. 502 `install-failed` carries npm's output or the download error in `detail`.",
    tag = "agents",
    params(("agent" = String, Path, min_length = 1, description = "The agent id.")),
    request_body(content = Option<AgentInstallParams>, description = "Optional; an empty body is `{}`."),
    responses(
        (status = 200, description = "What is installed now.", body = AgentInstallResult),
        (status = 400, response = Problem),
        (status = 401, response = Problem),
        (status = 404, response = Problem),
        (status = 408, response = Problem),
        (status = 409, response = Problem),
        (status = 413, response = Problem),
        (status = 415, response = Problem),
        (status = 502, response = Problem),
    )
)]
pub async fn install(
    runtime: &Arc<Runtime>,
    agent: &str,
    request: &mut HttpRequest,
) -> Result<http::Response<Body>, Error> {
    let body = read_body(request, INSTALL_BODY_LIMIT, runtime.config.read_timeout).await?;
    let params = match body.iter().find(|b| !b.is_ascii_whitespace()) {
        None => AgentInstallParams::default(),
        Some(first) => {
            if !is_json_content(request.headers()) {
                return Err(Error::UnsupportedMediaType);
            }
            let shape =
                "install options must be a JSON object {\"reinstall\": bool, \"version\": string}";
            // serde would also take a struct from an array; the contract says object.
            if *first != b'{' {
                return Err(Error::InvalidRequest(shape.to_owned()));
            }
            let params = serde_json::from_slice::<AgentInstallParams>(&body)
                .map_err(|error| Error::InvalidRequest(format!("{shape}: {error}")))?;
            crate::protocol::check_decodable(&body)
                .map_err(|error| Error::InvalidRequest(format!("{shape}: {error}")))?;
            params
        }
    };
    json(&runtime.install_agent(agent, params).await?)
}
