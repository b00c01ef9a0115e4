//! The HTTP surface: routing, auth, CORS, and the response helpers.
//!
//! - [`routes`]: the route table (every path, the credential it needs).
//! - `edge`: a client's JSON-RPC message at the edge: the POST preamble,
//!   the one parse, a message run apart from its exchange.
//! - [`rpc`]: `POST` / `GET` / `DELETE` on `/v2/rpc`.
//! - [`acp`]: the ACP transports RFD profile on `/acp` and `/acp/{agent}`.
//! - [`websocket`]: the WebSocket upgrade on the same paths, and the
//!   opening handshake every WebSocket route shares.
//! - [`sse`]: the SSE answer and body of `GET /v2/rpc` and `GET /acp`.
//! - [`health`]: `GET /v2/health`.
//! - [`scrape`]: `GET /metrics`, Prometheus or OpenMetrics text.
//! - [`openapi`]: `GET /v2/openapi.json`, the OpenAPI document of the
//!   plain-HTTP routes.
//! - [`headers`]: bearer auth, `Accept`, `Content-Type`, `Last-Event-ID`.
//! - [`cross_site`]: the `Origin` and `Host` a request may carry.
//! - [`control`]: `/v2/sessions…`, `/v2/agents` and
//!   `/v2/agents/{agent}/install` (the control plane).
//! - [`fs`]: `/v2/fs/*`, the host file system API.
//! - [`processes`]: `/v2/processes…`, the process API.
//! - [`terminal`]: `/v2/processes/{id}/terminal`, a process's terminal over
//!   a WebSocket.
//! - [`conditional`]: `If-Match`, `If-None-Match`, `If-Range` on a file read.
//! - [`problem`]: [`Error`] → `application/problem+json`, in one place.
//! - [`ui`]: the inspector's page at `/ui/`, compiled into the binary.

pub mod acp;
pub mod body;
mod conditional;
pub mod control;
pub mod cross_site;
mod edge;
pub mod fs;
pub mod headers;
pub mod health;
mod json_string;
pub mod openapi;
pub mod problem;
pub mod processes;
pub mod query;
pub mod routes;
pub mod rpc;
pub mod scrape;
pub mod sse;
pub mod terminal;
pub mod ui;
pub mod websocket;

use crate::error::Error;
use crate::protocol::{
    ACP_CONNECTION_ID_HEADER, CONNECTION_ID_HEADER, CROSS_ORIGIN_RESOURCE_POLICY_HEADER,
    FORBIDDEN_AGENT_HEADER, LAST_EVENT_ID_HEADER,
};
use crate::runtime::Runtime;
use crate::spans;
use body::{Body, HttpRequest, declared_length, empty};
use http::header::{
    ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS, ACCESS_CONTROL_ALLOW_ORIGIN,
    ACCESS_CONTROL_EXPOSE_HEADERS, ACCESS_CONTROL_MAX_AGE, CONNECTION, EXPECT, ORIGIN, VARY,
};
use http::{HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use routes::{Access, Route};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

/// Reads and drops a request body no route read, so that the HTTP connection
/// can carry the client's next request. Left unread, a body still on its way
/// makes hyper close the connection after the answer without saying so, and
/// a client reusing the connection gets a reset. A body that cannot be read
/// cheaply (over `limit`, not complete within `timeout`, or held back by
/// `Expect: 100-continue`) is not waited for: the answer says
/// `Connection: close` instead (RFC 9112 section 9.6).
async fn discard_unread(
    request: HttpRequest,
    response: &mut Response<Body>,
    limit: usize,
    timeout: std::time::Duration,
) {
    let (parts, body) = request.into_parts();
    let Some(body) = body else { return };
    if hyper::body::Body::is_end_stream(&body) {
        return;
    }
    let expects_continue = parts
        .headers
        .get(EXPECT)
        .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let drained = !expects_continue
        && declared_length(&parts.headers).is_none_or(|length| length <= limit as u64)
        && matches!(
            tokio::time::timeout(timeout, Limited::new(body, limit).collect()).await,
            Ok(Ok(_))
        );
    // HTTP/2 ends one stream, never the connection; it has no such header.
    if !drained && parts.version < http::Version::HTTP_2 {
        response
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
}

/// Serves one request that arrived on a TCP connection accepted on the
/// local address `local` (which decides the `Host` rule, [`cross_site`]).
/// Never fails: errors become problem responses.
pub async fn handle(
    runtime: Arc<Runtime>,
    local: SocketAddr,
    request: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let started = std::time::Instant::now();
    let method = request.method().clone();
    let origin = request.headers().get(ORIGIN).cloned();
    // The route is parsed from this copy, once; a clone shares the URI's
    // bytes. Only its path is logged: a query may carry `access_token`
    // (research/contract.md, "Auth and CORS"), and no log line holds a
    // credential.
    let uri = request.uri().clone();
    let to = Route::of(uri.path());
    let template = to.template();
    // The request's span, continuing the client's `traceparent`: the spans
    // of what the request runs are its children (research/contract.md,
    // "Traces"), made with it as their parent rather than inside it.
    let span = spans::http_request(&method, template.as_str(), request.headers());
    let mut request = request.map(Some);
    let checked = cross_site::check(&runtime.config, local, &request);
    let routed = match checked {
        Ok(()) => route(&runtime, &mut request, to, &uri, &span).await,
        Err(error) => Err(error),
    };
    let mut response = match routed {
        Ok(response) => response,
        Err(error) => problem::response(&error),
    };
    spans::http_status(&span, response.status().as_u16());
    runtime.metrics.http_request(
        template,
        &method,
        response.status().as_u16(),
        started.elapsed(),
    );
    discard_unread(
        request,
        &mut response,
        runtime.config.max_body_bytes,
        runtime.config.read_timeout,
    )
    .await;
    // No page of another origin may embed an answer (`<script>`, `<img>`),
    // nor have one read as another type (research/contract.md, "Auth and
    // CORS").
    let headers = response.headers_mut();
    headers.insert(
        HeaderName::from_static(CROSS_ORIGIN_RESOURCE_POLICY_HEADER),
        HeaderValue::from_static("same-origin"),
    );
    headers.insert(
        http::header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    if let Some(origin) = origin
        && runtime
            .config
            .cors_allow_origins
            .iter()
            .any(|allowed| allowed == "*" || allowed.as_bytes() == origin.as_bytes())
    {
        let headers = response.headers_mut();
        headers.insert(ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        // Both response headers a client reads (research/contract.md,
        // "Auth and CORS"): the connection id and the answer-ordering id.
        // File downloads add the headers a resumable download reads
        // (research/contract.md, "Host file system"); `/acp` names its
        // connection in `acp-connection-id` ("The /acp profile").
        let exposed = [
            CONNECTION_ID_HEADER,
            LAST_EVENT_ID_HEADER,
            "content-range, accept-ranges, etag, last-modified",
            ACP_CONNECTION_ID_HEADER,
        ]
        .join(", ");
        if let Ok(exposed) = HeaderValue::from_str(&exposed) {
            headers.insert(ACCESS_CONTROL_EXPOSE_HEADERS, exposed);
        }
        headers.append(VARY, HeaderValue::from_static("Origin"));
    }
    tracing::debug!(%method, path = uri.path(), status = response.status().as_u16(), "request");
    Ok(response)
}

/// Checks the credential of `route` (`request`'s, parsed from `uri`, the
/// request's URI, by [`handle`]), then serves it: the one match of routes
/// and methods ([`routes`]). `span` is the request's, the parent of the
/// spans of the JSON-RPC requests it carries.
async fn route(
    runtime: &Arc<Runtime>,
    request: &mut HttpRequest,
    route: Route<'_>,
    uri: &http::Uri,
    span: &tracing::Span,
) -> Result<Response<Body>, Error> {
    if route == Route::Gone {
        return Err(Error::Gone);
    }
    if request.method() == Method::OPTIONS && !runtime.config.cors_allow_origins.is_empty() {
        return Ok(preflight());
    }
    let upgrade = request.method() == Method::GET && websocket::is_upgrade(request.headers());
    let access = if route == Route::Metrics && runtime.config.metrics_public {
        Access::Public
    } else {
        route.access()
    };
    if let Some(token) = &runtime.config.token {
        match access {
            Access::Public => {}
            Access::Bearer => headers::check_bearer(request.headers(), token)?,
            Access::BearerOrUpgradeQuery => {
                // Two credentials of one kind are refused, whichever is used.
                headers::single_authorization(request.headers())?;
                // Both kinds at once: the same rule, never one of them picked.
                if upgrade
                    && websocket::has_query_token(request.uri())
                    && request.headers().contains_key(http::header::AUTHORIZATION)
                {
                    return Err(Error::InvalidRequest(
                        "both an Authorization header and ?access_token: send one credential"
                            .to_owned(),
                    ));
                }
                let by_query = upgrade && websocket::query_token_matches(request.uri(), token)?;
                if !by_query {
                    headers::check_bearer(request.headers(), token)?;
                }
            }
        }
    }
    if access != Access::Public && runtime.shutdown.is_cancelled() {
        return Err(Error::ShuttingDown);
    }
    let method = request.method().clone();
    let get = method == Method::GET || method == Method::HEAD;
    match route {
        Route::Gone => Err(Error::Gone),
        Route::Health if get => Ok(health::serve(runtime)),
        Route::Health => Err(Error::MethodNotAllowed("GET")),
        Route::Metrics if !runtime.config.metrics => Err(Error::NotFound(
            "/metrics: metrics are off (--no-metrics)".to_owned(),
        )),
        Route::OpenApi if get => Ok(openapi::serve()),
        Route::OpenApi => Err(Error::MethodNotAllowed("GET")),
        Route::Metrics if get => Ok(scrape::serve(runtime, request.headers())),
        Route::Metrics => Err(Error::MethodNotAllowed("GET")),
        Route::Ui => ui::page(&method, uri.path()),
        Route::Acp { agent } => {
            let agent = agent.map(control::decode_segment).transpose()?;
            // On a bare `/acp` the server's `--default-agent` stands in.
            let agent = agent.as_deref().or(runtime.config.default_agent.as_deref());
            match method {
                Method::POST => acp::post(runtime, request, agent, span).await,
                Method::GET if upgrade => websocket::upgrade(runtime, request, agent),
                Method::GET => acp::get(runtime, request).await,
                Method::DELETE => acp::delete(runtime, request).await,
                _ => Err(Error::MethodNotAllowed("GET, POST, DELETE")),
            }
        }
        Route::Rpc => {
            if request.headers().contains_key(FORBIDDEN_AGENT_HEADER) {
                return Err(Error::InvalidRequest(format!(
                    "the {FORBIDDEN_AGENT_HEADER} header is not part of the contract; name the agent in params._meta[\"sandboxagent.dev\"].agent of initialize"
                )));
            }
            match method {
                Method::POST => rpc::post(runtime, request, span).await,
                Method::GET => rpc::get(runtime, request),
                Method::DELETE => rpc::delete(runtime, request),
                _ => Err(Error::MethodNotAllowed("GET, POST, DELETE")),
            }
        }
        Route::Fs { name } => fs::serve(runtime, request, name, &method).await,
        Route::Processes { id, part } => {
            processes::serve(runtime, request, id, part, &method).await
        }
        Route::Agents if get => control::agents(runtime),
        Route::AgentInstall { agent } => {
            let agent = control::decode_segment(agent)?;
            match method {
                Method::POST => control::install(runtime, &agent, request).await,
                _ => Err(Error::MethodNotAllowed("POST")),
            }
        }
        Route::Sessions if get => control::sessions(runtime, uri.query()).await,
        Route::Session { id } if get => control::session(runtime, id, uri.query()).await,
        Route::SessionEvents { id } if get => control::events(runtime, id, uri.query()).await,
        Route::Agents | Route::Sessions | Route::Session { .. } | Route::SessionEvents { .. } => {
            Err(Error::MethodNotAllowed("GET"))
        }
        Route::UnknownV2 | Route::Unknown => Err(Error::NotFound(uri.path().to_owned())),
    }
}

/// CORS preflight answer (Fetch standard, CORS protocol): the three verbs and
/// the headers this contract uses. `handle` adds the allowed origin.
fn preflight() -> Response<Body> {
    let mut response = empty(StatusCode::NO_CONTENT);
    let headers = response.headers_mut();
    headers.insert(
        ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST, PUT, DELETE"),
    );
    headers.insert(
        ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static(
            "authorization, content-type, accept, last-event-id, x-acp-connection-id, range, if-none-match, if-match, if-range, acp-connection-id, acp-session-id",
        ),
    );
    headers.insert(ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
    response
}
