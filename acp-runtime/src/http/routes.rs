//! The route table: every path this server answers, parsed once into a
//! [`Route`] (research/contract.md lists them). [`super::route`] checks the
//! route's credential ([`Access`]) and then matches the route and the HTTP
//! method in one `match`; a reader finds every route here and every
//! handler from there.

pub use crate::route_template::{ACP_PATH, METRICS_PATH, OPENAPI_PATH, Template};

/// One route, by path; path segments are still percent-encoded (decoded
/// by the handler, after the credential check, as a 400 must not leak past
/// a 401).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route<'a> {
    /// `/v1`, `/v1/*`: the seed-era API, gone (410).
    Gone,
    /// `/v2/health`.
    Health,
    /// `/v2/openapi.json`: the OpenAPI document (research/contract.md,
    /// "OpenAPI").
    OpenApi,
    /// `/metrics`: Prometheus and OpenMetrics text (research/contract.md,
    /// "Metrics").
    Metrics,
    /// `/ui`, `/ui/*`: the inspector's page.
    Ui,
    /// `/acp`, `/acp/{agent}`: the ACP transports RFD profile (POST, GET,
    /// DELETE, and the WebSocket upgrade).
    Acp {
        /// The agent named by path.
        agent: Option<&'a str>,
    },
    /// `/v2/rpc`.
    Rpc,
    /// `/v2/fs/{name}`: the host file system API (`name` picks the
    /// operation, [`super::fs::serve`]).
    Fs {
        /// What follows `/v2/fs/`.
        name: &'a str,
    },
    /// `/v2/agents`.
    Agents,
    /// `/v2/agents/{agent}/install`.
    AgentInstall {
        /// The agent to install.
        agent: &'a str,
    },
    /// `/v2/sessions`.
    Sessions,
    /// `/v2/sessions/{id}`.
    Session {
        /// The session id.
        id: &'a str,
    },
    /// `/v2/sessions/{id}/events`.
    SessionEvents {
        /// The session id.
        id: &'a str,
    },
    /// `/v2/processes`, `/v2/processes/{id}`, `/v2/processes/{id}/{part}`
    /// (research/contract.md, "Processes and terminals").
    Processes {
        /// The process id (or `run`).
        id: Option<&'a str>,
        /// What follows the id: `output`, `input`, `signal`, `resize`,
        /// `terminal`.
        part: Option<&'a str>,
    },
    /// Any other path under `/v2` (404, after the token check).
    UnknownV2,
    /// Any other path (404).
    Unknown,
}

/// What a request must carry to reach a route when the server has a token
/// (research/contract.md, "Auth and CORS").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Nothing: health, the inspector's page, 404s outside `/v2`.
    Public,
    /// `Authorization: Bearer <token>`.
    Bearer,
    /// The bearer header, or on a WebSocket upgrade `?access_token=`
    /// (a browser cannot set headers there).
    BearerOrUpgradeQuery,
}

/// Prefix of the host file system routes.
pub const FS_PREFIX: &str = "/v2/fs/";

impl<'a> Route<'a> {
    /// The route of `path`.
    pub fn of(path: &'a str) -> Self {
        if path == "/v1" || path.starts_with("/v1/") {
            return Self::Gone;
        }
        if path == METRICS_PATH {
            return Self::Metrics;
        }
        if path == "/ui" || path.starts_with("/ui/") {
            return Self::Ui;
        }
        if let Some(rest) = path.strip_prefix(ACP_PATH) {
            if rest.is_empty() || rest == "/" {
                return Self::Acp { agent: None };
            }
            if let Some(agent) = rest.strip_prefix('/')
                && !agent.is_empty()
                && !agent.contains('/')
            {
                return Self::Acp { agent: Some(agent) };
            }
        }
        if path != "/v2" && !path.starts_with("/v2/") {
            return Self::Unknown;
        }
        if let Some(name) = path.strip_prefix(FS_PREFIX) {
            return Self::Fs { name };
        }
        let mut segments = path["/v2".len()..].split('/').filter(|s| !s.is_empty());
        let parts = [segments.next(), segments.next(), segments.next()];
        if segments.next().is_some() {
            return Self::UnknownV2;
        }
        match parts {
            [Some("health"), None, None] if path == "/v2/health" => Self::Health,
            [Some("openapi.json"), None, None] if path == OPENAPI_PATH => Self::OpenApi,
            [Some("rpc"), None, None] if path == "/v2/rpc" => Self::Rpc,
            [Some("agents"), None, None] => Self::Agents,
            [Some("agents"), Some(agent), Some("install")]
                if path == format!("/v2/agents/{agent}/install") =>
            {
                Self::AgentInstall { agent }
            }
            [Some("sessions"), None, None] => Self::Sessions,
            // An empty id (`/v2/sessions//events`) names no session; it
            // must not shift `events` into the id's place.
            [Some("sessions"), Some(_), _] if path.contains("//") => Self::UnknownV2,
            [Some("sessions"), Some(id), None] => Self::Session { id },
            [Some("sessions"), Some(id), Some("events")] => Self::SessionEvents { id },
            [Some("processes"), Some(_), _] if path.contains("//") => Self::UnknownV2,
            [Some("processes"), id, part] => Self::Processes { id, part },
            _ => Self::UnknownV2,
        }
    }

    /// The route's template, the `route` label of the HTTP metrics and
    /// the `http.route` of its span: never an id from the path, so the
    /// label stays bounded.
    pub fn template(&self) -> Template {
        match self {
            Self::Gone => Template::Gone,
            Self::Health => Template::Health,
            Self::OpenApi => Template::OpenApi,
            Self::Metrics => Template::Metrics,
            Self::Ui => Template::Ui,
            Self::Acp { agent: None } => Template::Acp,
            Self::Acp { agent: Some(_) } => Template::AcpAgent,
            Self::Rpc => Template::Rpc,
            Self::Fs { .. } => Template::Fs,
            Self::Agents => Template::Agents,
            Self::AgentInstall { .. } => Template::AgentInstall,
            Self::Sessions => Template::Sessions,
            Self::Session { .. } => Template::Session,
            Self::SessionEvents { .. } => Template::SessionEvents,
            Self::Processes { id: None, .. } => Template::Processes,
            Self::Processes {
                id: Some(_),
                part: None,
            } => Template::Process,
            Self::Processes {
                id: Some(_),
                part: Some(_),
            } => Template::ProcessPart,
            Self::UnknownV2 | Self::Unknown => Template::Unknown,
        }
    }

    /// The credential this route needs when the server has a token.
    pub fn access(&self) -> Access {
        match self {
            Self::Gone | Self::Health | Self::OpenApi | Self::Ui | Self::Unknown => Access::Public,
            Self::Acp { .. }
            | Self::Processes {
                part: Some("terminal"),
                ..
            } => Access::BearerOrUpgradeQuery,
            _ => Access::Bearer,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        assert_eq!(Route::of("/acp"), Route::Acp { agent: None });
        assert_eq!(Route::of("/acp/"), Route::Acp { agent: None });
        assert_eq!(
            Route::of("/acp/mock"),
            Route::Acp {
                agent: Some("mock")
            }
        );
        assert_eq!(Route::of("/acp/mock/x"), Route::Unknown);
        assert_eq!(Route::of("/acpx"), Route::Unknown);
        assert_eq!(Route::of("/v2/rpc"), Route::Rpc);
        assert_eq!(Route::of("/v2/rpc/"), Route::UnknownV2);
        assert_eq!(Route::of("/v2/health"), Route::Health);
        assert_eq!(Route::of("/v1/sessions"), Route::Gone);
        assert_eq!(Route::of("/ui/app.js"), Route::Ui);
        assert_eq!(Route::of("/v2/fs/file"), Route::Fs { name: "file" });
        assert_eq!(Route::of("/v2/sessions/"), Route::Sessions);
        assert_eq!(
            Route::of("/v2/sessions/a%2Fb"),
            Route::Session { id: "a%2Fb" }
        );
        assert_eq!(
            Route::of("/v2/sessions/s/events"),
            Route::SessionEvents { id: "s" }
        );
        assert_eq!(Route::of("/v2/sessions//events"), Route::UnknownV2);
        assert_eq!(Route::of("/v2/sessions//"), Route::Sessions);
        assert_eq!(
            Route::of("/v2/agents/mock/install"),
            Route::AgentInstall { agent: "mock" }
        );
        assert_eq!(Route::of("/v2/agents//mock/install"), Route::UnknownV2);
        assert_eq!(Route::of("/v2/agents"), Route::Agents);
        assert_eq!(Route::of("/v2/nothing"), Route::UnknownV2);
        assert_eq!(
            Route::of("/v2/processes"),
            Route::Processes {
                id: None,
                part: None
            }
        );
        assert_eq!(
            Route::of("/v2/processes/p1/output"),
            Route::Processes {
                id: Some("p1"),
                part: Some("output")
            }
        );
        assert_eq!(Route::of("/v2/processes//output"), Route::UnknownV2);
        assert_eq!(
            Route::of("/v2/processes/p1/terminal").access(),
            Access::BearerOrUpgradeQuery
        );
        assert_eq!(Route::of("/v2/processes/p1").access(), Access::Bearer);
        assert_eq!(Route::of("/elsewhere"), Route::Unknown);
        assert_eq!(Route::of("/v2/health").access(), Access::Public);
        assert_eq!(Route::of("/v2/openapi.json"), Route::OpenApi);
        assert_eq!(Route::of("/v2/openapi.json").access(), Access::Public);
        assert_eq!(Route::of("/v2/openapi.json/x"), Route::UnknownV2);
        assert_eq!(
            Route::of("/acp/mock").access(),
            Access::BearerOrUpgradeQuery
        );
        assert_eq!(Route::of("/v2/nothing").access(), Access::Bearer);
        assert_eq!(Route::of("/metrics"), Route::Metrics);
        assert_eq!(Route::of("/metrics").access(), Access::Bearer);
        assert_eq!(
            Route::of("/v2/sessions/s-1/events").template().as_str(),
            "/v2/sessions/{id}/events"
        );
        assert_eq!(
            Route::of("/v2/anything/else").template().as_str(),
            "unknown"
        );
        assert_eq!(Template::COUNT, 18);
        assert_eq!(Template::Unknown.index(), Template::COUNT - 1);
    }
}
