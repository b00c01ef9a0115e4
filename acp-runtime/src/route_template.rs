//! The closed set of route templates and the fixed paths they name
//! (research/contract.md, "Metrics": route templates). The metrics and the
//! HTTP spans label a request by its template; `http::routes` maps a
//! request's path to one.

/// A route template (research/contract.md, "Metrics": route templates):
/// the closed set of `route` labels, so that a metric series per template
/// is found by index ([`Template::index`]) rather than by hashing a label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Template {
    /// `/v1/*`.
    Gone,
    /// `/v2/health`.
    Health,
    /// `/v2/openapi.json`.
    OpenApi,
    /// `/metrics`.
    Metrics,
    /// `/ui/*`.
    Ui,
    /// `/acp`.
    Acp,
    /// `/acp/{agent}`.
    AcpAgent,
    /// `/v2/rpc`.
    Rpc,
    /// `/v2/fs/{name}`.
    Fs,
    /// `/v2/agents`.
    Agents,
    /// `/v2/agents/{agent}/install`.
    AgentInstall,
    /// `/v2/sessions`.
    Sessions,
    /// `/v2/sessions/{id}`.
    Session,
    /// `/v2/sessions/{id}/events`.
    SessionEvents,
    /// `/v2/processes`.
    Processes,
    /// `/v2/processes/{id}`.
    Process,
    /// `/v2/processes/{id}/{part}`.
    ProcessPart,
    /// Any other path: `unknown`.
    Unknown,
}

impl Template {
    /// How many templates there are: [`Template::index`] is below it.
    pub const COUNT: usize = Self::Unknown as usize + 1;

    /// The template as the label and the span attribute write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Gone => "/v1/*",
            Self::Health => "/v2/health",
            Self::OpenApi => OPENAPI_PATH,
            Self::Metrics => METRICS_PATH,
            Self::Ui => "/ui/*",
            Self::Acp => ACP_PATH,
            Self::AcpAgent => "/acp/{agent}",
            Self::Rpc => "/v2/rpc",
            Self::Fs => "/v2/fs/{name}",
            Self::Agents => "/v2/agents",
            Self::AgentInstall => "/v2/agents/{agent}/install",
            Self::Sessions => "/v2/sessions",
            Self::Session => "/v2/sessions/{id}",
            Self::SessionEvents => "/v2/sessions/{id}/events",
            Self::Processes => "/v2/processes",
            Self::Process => "/v2/processes/{id}",
            Self::ProcessPart => "/v2/processes/{id}/{part}",
            Self::Unknown => "unknown",
        }
    }

    /// A dense index, from 0 to [`Template::COUNT`] − 1.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// Path of the metrics, where Prometheus looks by default.
pub const METRICS_PATH: &str = "/metrics";
/// Path of the ACP transports profile; `/acp/{agent}` names the agent.
pub const ACP_PATH: &str = "/acp";
/// Path of the OpenAPI document.
pub const OPENAPI_PATH: &str = "/v2/openapi.json";
