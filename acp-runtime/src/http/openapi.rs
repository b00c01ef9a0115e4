//! `GET /v2/openapi.json` (research/contract.md, "OpenAPI"): the OpenAPI
//! 3.1 document of the plain-HTTP routes. Each operation is the
//! `#[utoipa::path]` attribute on its handler, each schema the `ToSchema`
//! derive of the type that serializes the answer; the document is built
//! once, on first use, and served as it is (`docs/openapi.json` is a copy).

use super::body::{Body, full};
use super::problem::Problem;
use crate::memory::sessions::ListState;
use crate::protocol::APPLICATION_JSON;
use bytes::Bytes;
use http::{Response, StatusCode};
use std::sync::LazyLock;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

/// Name of the bearer security scheme in the document (the `security` of
/// [`Document`] names it as a literal: the macro takes no constant).
const BEARER: &str = "bearer";

/// The document: every plain-HTTP operation, the schemas they name, the
/// problem response and the bearer scheme.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "sandbox-agent",
        description = "The plain-HTTP routes of sandbox-agent, a server that runs ACP coding agents in a sandbox. The ACP transports (`/v2/rpc`, `/acp`, `/acp/{agent}`: JSON-RPC over POST, SSE and WebSocket), the terminal WebSocket (`/v2/processes/{id}/terminal`) and the inspector (`/ui/`) are not plain HTTP and are not described here (research/contract.md). With a token set (`--token`), every operation except `/v2/health` and `/v2/openapi.json` needs `Authorization: Bearer <token>` (401 otherwise). Every `GET` answers `HEAD` too. On any route: a method not listed answers 405 with `Allow`; a cross-site `Origin`, or on a loopback connection a `Host` that is not a loopback name, 403; a server shutting down 503. Every error is `application/problem+json` (RFC 9457)."
    ),
    paths(
        super::health::serve,
        serve,
        super::scrape::serve,
        super::control::agents,
        super::control::install,
        super::control::sessions,
        super::control::session,
        super::control::events,
        super::fs::entries,
        super::fs::stat,
        super::fs::mkdir,
        super::fs::rename,
        super::fs::delete,
        super::fs::read,
        super::fs::write,
        super::fs::upload_batch,
        super::processes::list,
        super::processes::start,
        super::processes::run,
        super::processes::one,
        super::processes::forget,
        super::processes::output,
        super::processes::input,
        super::processes::signal,
        super::processes::resize,
    ),
    components(schemas(ListState), responses(Problem)),
    modifiers(&BearerScheme),
    security(("bearer" = [])),
    tags(
        (name = "server", description = "Health, metrics and this document."),
        (name = "agents", description = "The agents and their installs."),
        (name = "sessions", description = "The session inventory and event logs."),
        (name = "fs", description = "The host file system (confined to `--fs-root` when it is set)."),
        (name = "processes", description = "Programs run in the sandbox (off with `--no-processes`: 404 `processes-disabled`)."),
    )
)]
struct Document;

/// Adds the bearer scheme that the document's `security` names.
struct BearerScheme;

impl Modify for BearerScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let scheme = HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .description(Some("The server's `--token`."))
            .build();
        openapi
            .components
            .get_or_insert_with(Default::default)
            .add_security_scheme(BEARER, SecurityScheme::Http(scheme));
    }
}

/// The document as served: pretty-printed JSON with a final newline, built
/// on first use.
static DOCUMENT: LazyLock<String> = LazyLock::new(|| {
    let mut text = Document::openapi()
        .to_pretty_json()
        .unwrap_or_else(|error| format!("{{\"error\": \"{error}\"}}"));
    text.push('\n');
    text
});

/// The OpenAPI document, as `GET /v2/openapi.json` serves it and
/// `docs/openapi.json` holds it (`sandbox-agent openapi` prints it).
pub fn document() -> &'static str {
    &DOCUMENT
}

/// `GET /v2/openapi.json`: [`document`]. Public: it names routes and
/// shapes, nothing of this server's state.
#[utoipa::path(
    get,
    path = "/v2/openapi.json",
    summary = "This document.",
    description = "Needs no token: it names routes and shapes, nothing of a server's state.",
    operation_id = "openapi",
    tag = "server",
    security(()),
    responses(
        (status = 200, description = "This document (OpenAPI 3.1).", body = serde_json::Value),
    )
)]
pub fn serve() -> Response<Body> {
    full(
        StatusCode::OK,
        APPLICATION_JSON,
        Bytes::from_static(document().as_bytes()),
    )
}
