//! The control plane (DESIGN.md section 6): plain HTTP + JSON views of the
//! session inventory, the event logs and the agents, and agent installs.

use super::headers::is_json_content;
use super::{Body, full};
use crate::agent::install::{InstallOptions, LogProgress};
use crate::error::Error;
use crate::runtime::Runtime;
use bytes::Bytes;
use ext_methods::{AgentInstallParams, AgentListResult};
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde::Serialize;
use std::sync::Arc;

/// Largest body of `POST /v2/agents/{agent}/install`, in bytes.
const INSTALL_BODY_LIMIT: usize = 64 * 1024;

/// Events per page of `GET /v2/sessions/{id}/events` when `limit` is not given.
const DEFAULT_EVENTS_LIMIT: usize = 100;
/// Largest `limit` accepted.
const MAX_EVENTS_LIMIT: usize = 1000;

/// Routes `/v2/sessions…` and `/v2/agents`; `None` when `path` is not one of them.
pub fn route(
    runtime: &Arc<Runtime>,
    method: &Method,
    path: &str,
    query: Option<&str>,
) -> Option<Result<http::Response<Body>, Error>> {
    let segments: Vec<&str> = path
        .strip_prefix("/v2/")?
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let handled = match segments.as_slice() {
        ["sessions"] => get_only(method, || sessions(runtime)),
        ["sessions", id] => get_only(method, || session(runtime, id)),
        ["sessions", id, "events"] => get_only(method, || events(runtime, id, query)),
        ["agents"] => get_only(method, || agents(runtime)),
        _ => return None,
    };
    Some(handled)
}

fn get_only(
    method: &Method,
    handler: impl FnOnce() -> Result<http::Response<Body>, Error>,
) -> Result<http::Response<Body>, Error> {
    match *method {
        Method::GET | Method::HEAD => handler(),
        _ => Err(Error::MethodNotAllowed("GET")),
    }
}

fn json(value: &impl Serialize) -> Result<http::Response<Body>, Error> {
    let body = serde_json::to_vec(value)
        .map_err(|e| Error::InvalidRequest(format!("cannot serialize the answer: {e}")))?;
    Ok(full(StatusCode::OK, "application/json", Bytes::from(body)))
}

/// `GET /v2/sessions` → `{"sessions": [entry, …]}`, newest first.
fn sessions(runtime: &Runtime) -> Result<http::Response<Body>, Error> {
    let sessions: Vec<_> = runtime.sessions.all().iter().map(|s| s.info()).collect();
    json(&serde_json::json!({ "sessions": sessions }))
}

/// `GET /v2/sessions/{id}` → one entry, 404 when unknown.
fn session(runtime: &Runtime, id: &str) -> Result<http::Response<Body>, Error> {
    let session = runtime
        .sessions
        .get(id)
        .ok_or_else(|| Error::UnknownSession(id.to_owned()))?;
    json(&session.info())
}

/// `GET /v2/sessions/{id}/events?offset=N&limit=M` → `SessionEventsPage`.
fn events(runtime: &Runtime, id: &str, query: Option<&str>) -> Result<http::Response<Body>, Error> {
    let session = runtime
        .sessions
        .get(id)
        .ok_or_else(|| Error::UnknownSession(id.to_owned()))?;
    let mut offset = 0_u64;
    let mut limit = DEFAULT_EVENTS_LIMIT;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let bad = || {
            Error::InvalidRequest(format!(
                "query parameter {key} must be a non-negative integer, got {value:?}"
            ))
        };
        match key {
            "offset" => offset = value.parse().map_err(|_| bad())?,
            "limit" => limit = value.parse().map_err(|_| bad())?,
            _ => {}
        }
    }
    if limit == 0 || limit > MAX_EVENTS_LIMIT {
        return Err(Error::InvalidRequest(format!(
            "limit must be between 1 and {MAX_EVENTS_LIMIT}"
        )));
    }
    json(&session.events(offset, limit))
}

/// `GET /v2/agents` → `{"agents": [AgentInfo, …]}`.
fn agents(runtime: &Runtime) -> Result<http::Response<Body>, Error> {
    json(&AgentListResult {
        agents: runtime.agents.infos(),
    })
}

/// The agent id of an install path, `/v2/agents/{agent}/install`.
pub fn install_target(path: &str) -> Option<&str> {
    let agent = path.strip_prefix("/v2/agents/")?.strip_suffix("/install")?;
    (!agent.is_empty() && !agent.contains('/')).then_some(agent)
}

/// `POST /v2/agents/{agent}/install` with an optional JSON body
/// `{"reinstall": bool, "version": "x"}` → `AgentInstallResult`. Installing
/// what is already there answers at once with `alreadyInstalled: true`.
///
/// # Errors
/// 400 (bad body or version), 404 `unknown-agent`, 409 `not-installable`,
/// 413, 415, 502 `install-failed` (npm's output or the download error in
/// `detail`).
pub async fn install(
    runtime: &Arc<Runtime>,
    agent: &str,
    request: Request<Incoming>,
) -> Result<http::Response<Body>, Error> {
    let (parts, body) = request.into_parts();
    let body = match Limited::new(body, INSTALL_BODY_LIMIT).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => {
            return Err(Error::PayloadTooLarge {
                limit: INSTALL_BODY_LIMIT,
            });
        }
        Err(error) => {
            return Err(Error::InvalidRequest(format!(
                "cannot read the request body: {error}"
            )));
        }
    };
    let params = if body.iter().all(u8::is_ascii_whitespace) {
        AgentInstallParams::default()
    } else {
        if !is_json_content(&parts.headers) {
            return Err(Error::UnsupportedMediaType);
        }
        serde_json::from_slice::<AgentInstallParams>(&body).map_err(|error| {
            Error::InvalidRequest(format!(
                "install options must be {{\"reinstall\": bool, \"version\": string}}: {error}"
            ))
        })?
    };
    let options = InstallOptions {
        reinstall: params.reinstall,
        version: params.version,
    };
    let progress = Arc::new(LogProgress {
        agent: agent.to_owned(),
    });
    let result = runtime.agents.install(agent, options, progress).await?;
    json(&result)
}
