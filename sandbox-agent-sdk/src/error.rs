//! [`Error`]: everything a [`SandboxAgentClient`](crate::SandboxAgentClient)
//! call can fail with.

use acp_http_client::{HttpFailure, Problem};
use ext_methods::AgentErrorDetails;
use reqwest::StatusCode;
use std::path::PathBuf;
use std::time::Duration;

/// JSON-RPC "internal error": the code `acp-http-client` uses for the errors
/// it makes up when a request's HTTP exchange failed.
const INTERNAL_ERROR: i32 = -32603;

/// `data` member naming a transport failure in such a made-up error.
const DATA_TRANSPORT_ERROR: &str = "transportError";

/// A boxed underlying error, as kept in [`Error::ConnectionLost`] and
/// [`Error::Timeout`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong in this crate.
///
/// Branch on the predicates rather than on variants where one exists:
/// [`is_not_found`](Error::is_not_found),
/// [`is_unauthorized`](Error::is_unauthorized),
/// [`is_connection_lost`](Error::is_connection_lost),
/// [`is_timeout`](Error::is_timeout),
/// [`is_auth_required`](Error::is_auth_required). They answer alike
/// whether the failure came from a control-plane route (HTTP status) or a
/// JSON-RPC call on the connection (error code).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A call that needs the connection to the agent was made before
    /// [`open`](crate::SandboxAgentClient::open) (with
    /// `auto_connect(false)`), after
    /// [`close`](crate::SandboxAgentClient::close), or after the
    /// connection was lost.
    #[error("not connected: open the connection first (SandboxAgentClient::open)")]
    NotConnected,
    /// [`open`](crate::SandboxAgentClient::open) was called while the client
    /// already has a live connection (one connection per client).
    #[error("already connected: close the connection first to open a new one")]
    AlreadyConnected,
    /// The client was shut down
    /// ([`shutdown`](crate::SandboxAgentClient::shutdown)): its embedded
    /// server is stopped and it opens no more connections.
    #[error("the client was shut down")]
    Disposed,
    /// The [`ClientOptions`](crate::ClientOptions) cannot work (for example
    /// server mode without a base URL, a URL that is not http(s)).
    #[error("invalid options: {0}")]
    InvalidOptions(String),
    /// The server answered with a non-2xx HTTP status, and perhaps an
    /// RFC 9457 problem document: `acp-http-client`'s [`HttpFailure`], so
    /// both crates say it alike.
    #[error("{0}")]
    Http(HttpFailure),
    /// A control-plane HTTP exchange failed for a reason that is neither a
    /// lost connection nor a timeout (for example a body that could not be
    /// decoded). Those two are [`Error::ConnectionLost`] and
    /// [`Error::Timeout`].
    #[error("HTTP request failed: {0}")]
    Request(reqwest::Error),
    /// The server could not be reached, or the connection to it broke: a
    /// refused or reset TCP connection, an answer cut off, the event stream
    /// lost for good, an answer to a permission request that could not be
    /// sent. The same variant on the control plane and on the connection to
    /// the agent; [`is_connection_lost`](Error::is_connection_lost) says so
    /// too. `source` holds the underlying error where one survived (an
    /// error that crossed the connection's JSON-RPC layer keeps only its
    /// text, in `message`).
    #[error("connection lost: {message}")]
    ConnectionLost {
        /// What happened.
        message: String,
        /// The underlying error, when there is one.
        #[source]
        source: Option<BoxError>,
    },
    /// A request took longer than
    /// [`ClientOptions::request_timeout`](crate::ClientOptions::request_timeout).
    #[error("{what} timed out{}", after_suffix(.after))]
    Timeout {
        /// The method or route.
        what: String,
        /// The limit that passed, when known here.
        after: Option<Duration>,
        /// The underlying error, when there is one (reqwest's timeout).
        #[source]
        source: Option<BoxError>,
    },
    /// The agent (or the server on its behalf) answered with a JSON-RPC
    /// error: code, message and data as sent. The text names the agent's
    /// stderr lines and the hint the server added to `data`
    /// (`JSON-RPC error -32603: <message> (agent stderr: line 1 | line 2)
    /// (hint: …)`; [`agent_stderr`](Error::agent_stderr),
    /// [`agent_hint`](Error::agent_hint)).
    #[error("{}", rpc_text(.0))]
    Rpc(agent_client_protocol::Error),
    /// An answer did not have the shape this crate expects.
    #[error("unexpected answer to {what}: {message}")]
    InvalidResponse {
        /// The method or route.
        what: String,
        /// What was wrong.
        message: String,
    },
    /// An answer to a question of the agent
    /// ([`QuestionRequest`](crate::QuestionRequest)) was not sent: it does
    /// not fit the form the agent asked for (a required field missing, a
    /// value of the wrong type, outside its bounds or not one of its
    /// choices; the rules are the ACP elicitation schema's), or the
    /// question was answered already. The question stays unanswered when
    /// the content was wrong, so it can be answered again.
    #[error("invalid answer: {}{message}", field_prefix(.field))]
    InvalidAnswer {
        /// The field that is wrong, by its name in the form; `None` when
        /// the answer as a whole is.
        field: Option<String>,
        /// What is wrong (`must be at least 1 character long (is 0)`).
        message: String,
    },
    /// Embedded mode: no `sandbox-agent` binary was found. `searched` lists
    /// the places looked at, in order.
    #[error("sandbox-agent binary not found (looked at: {}); set SANDBOX_AGENT_BIN or ClientOptions::binary", display_paths(.searched))]
    BinaryNotFound {
        /// Every candidate path tried.
        searched: Vec<PathBuf>,
    },
    /// Embedded mode: the server could not be started, or exited before it
    /// was ready. `stderr` holds its last log lines (may be empty).
    #[error("the embedded sandbox-agent server failed to start: {message}{}", stderr_suffix(.stderr))]
    ServerStart {
        /// What happened.
        message: String,
        /// The server's last stderr lines, joined by `\n`.
        stderr: String,
    },
    /// Embedded mode: the server was not ready (start-up line and
    /// `GET /v2/health`) within the start-up timeout.
    #[error("the embedded sandbox-agent server was not ready within {timeout:?}{}", stderr_suffix(.stderr))]
    StartupTimeout {
        /// The limit that passed.
        timeout: Duration,
        /// The server's last stderr lines, joined by `\n`.
        stderr: String,
    },
    /// An operating-system error (spawning the server, signalling it).
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// A sandbox provider ([`SandboxProvider`](crate::SandboxProvider))
    /// failed at `step`: for example `docker sandbox: start failed: the
    /// container exited (status 64) before it served` followed by what the
    /// sandbox printed. The runtime's token is never in `message` or `logs`
    /// (it is replaced by `[token]` should the sandbox print it).
    #[error("{provider} sandbox: {step} failed: {message}{}", logs_suffix(.logs))]
    Sandbox {
        /// The provider's name (`local`, `docker`).
        provider: &'static str,
        /// The step that failed.
        step: SandboxStep,
        /// What happened.
        message: String,
        /// The last lines the sandbox printed (its log tail; may be empty).
        logs: String,
    },
}

/// The steps of a sandbox's life, as named in [`Error::Sandbox`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxStep {
    /// Making the sandbox (the container, or finding the binary): nothing
    /// runs yet.
    Create,
    /// Starting the runtime in it: the container or process started and
    /// exited, or never printed that it listens.
    Start,
    /// Waiting for `GET /v2/health` to answer 200 within the start-up
    /// timeout.
    Health,
    /// Destroying it (removing the container).
    Destroy,
    /// Finding and removing a fleet's leftovers.
    Cleanup,
}

impl SandboxStep {
    /// `create`, `start`, `health`, `destroy`, `cleanup`.
    pub fn as_str(self) -> &'static str {
        match self {
            SandboxStep::Create => "create",
            SandboxStep::Start => "start",
            SandboxStep::Health => "health",
            SandboxStep::Destroy => "destroy",
            SandboxStep::Cleanup => "cleanup",
        }
    }
}

impl std::fmt::Display for SandboxStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Error {
    /// The HTTP status, for [`Error::Http`].
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            Error::Http(failure) => Some(failure.status),
            _ => None,
        }
    }

    /// The problem document, for [`Error::Http`] with one.
    pub fn problem(&self) -> Option<&Problem> {
        match self {
            Error::Http(failure) => failure.problem.as_deref(),
            _ => None,
        }
    }

    /// The JSON-RPC error code, for [`Error::Rpc`].
    pub fn rpc_code(&self) -> Option<i32> {
        match self {
            Error::Rpc(error) => Some(i32::from(error.code)),
            _ => None,
        }
    }

    /// For an agent's JSON-RPC error ([`Error::Rpc`]): the lines the agent
    /// wrote to stderr after the request was sent to it, oldest first, as
    /// the server added them to the error's `data` (research/contract.md,
    /// "Agent errors: stderr and hint": at most the last 20 lines and 4 KiB,
    /// secrets masked as `***`, a first entry `… N earlier lines dropped`
    /// when lines were left out). Empty when there are none, and for every
    /// other error.
    pub fn agent_stderr(&self) -> Vec<String> {
        self.agent_details()
            .map(|details| details.stderr)
            .unwrap_or_default()
    }

    /// For an agent's JSON-RPC error ([`Error::Rpc`]): the server's hint on
    /// what may fix it, when it gave one (a server running as root without
    /// `--agent-user`, whose agent failed `session/new` or `session/load`).
    pub fn agent_hint(&self) -> Option<String> {
        self.agent_details().and_then(|details| details.hint)
    }

    /// `data["sandboxagent.dev"]` of an [`Error::Rpc`].
    fn agent_details(&self) -> Option<AgentErrorDetails> {
        match self {
            Error::Rpc(error) => error.data.as_ref().and_then(AgentErrorDetails::from_data),
            _ => None,
        }
    }

    /// Whether this is the agent's "Authentication required" (JSON-RPC
    /// `-32000`, ACP `auth_required`): authenticate first
    /// ([`SandboxAgentClient::authenticate`](crate::SandboxAgentClient::authenticate)),
    /// or give the server the agent's credential.
    pub fn is_auth_required(&self) -> bool {
        self.rpc_code() == Some(i32::from(agent_client_protocol::ErrorCode::AUTH_REQUIRED))
    }

    /// Whether the thing asked about does not exist: HTTP 404 (an unknown
    /// agent, session or route) or JSON-RPC `-32002` (ACP "resource not
    /// found": an unknown or terminated session).
    pub fn is_not_found(&self) -> bool {
        self.status() == Some(StatusCode::NOT_FOUND)
            || self.rpc_code()
                == Some(i32::from(
                    agent_client_protocol::ErrorCode::RESOURCE_NOT_FOUND,
                ))
    }

    /// Whether the server refused the bearer token: HTTP 401 (a wrong or
    /// missing [`ClientOptions::token`](crate::ClientOptions::token)). Not
    /// the agent's own "Authentication required", which is
    /// [`is_auth_required`](Error::is_auth_required).
    pub fn is_unauthorized(&self) -> bool {
        self.status() == Some(StatusCode::UNAUTHORIZED)
    }

    /// Whether the server could not be reached or the connection broke
    /// ([`Error::ConnectionLost`]). Calls that need the connection then
    /// fail with [`Error::NotConnected`] until
    /// [`open`](crate::SandboxAgentClient::open) succeeds again.
    pub fn is_connection_lost(&self) -> bool {
        matches!(self, Error::ConnectionLost { .. })
    }

    /// Whether a request ran out of time ([`Error::Timeout`]; see
    /// [`ClientOptions::request_timeout`](crate::ClientOptions::request_timeout)),
    /// or an embedded server was not ready in time
    /// ([`Error::StartupTimeout`]).
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Timeout { .. } | Error::StartupTimeout { .. })
    }

    /// A lost connection described by `message`, without an underlying
    /// error.
    pub(crate) fn connection_lost(message: impl Into<String>) -> Error {
        Error::ConnectionLost {
            message: message.into(),
            source: None,
        }
    }

    /// An answer to a question that was not sent: `field` (by name) or
    /// the answer as a whole, and what is wrong.
    pub(crate) fn invalid_answer(field: Option<&str>, message: impl Into<String>) -> Error {
        Error::InvalidAnswer {
            field: field.map(str::to_owned),
            message: message.into(),
        }
    }

    /// Sorts an error of the typed connection: an HTTP failure of the
    /// request's POST (made up by `acp-http-client`, see its
    /// `http_failure`), a transport failure, or the agent's own JSON-RPC
    /// error.
    pub(crate) fn from_rpc(error: agent_client_protocol::Error) -> Error {
        if let Some(failure) = acp_http_client::http_failure(&error) {
            return Error::Http(failure);
        }
        if i32::from(error.code) == INTERNAL_ERROR
            && let Some(transport) = error
                .data
                .as_ref()
                .and_then(|data| data.get(DATA_TRANSPORT_ERROR))
                .and_then(serde_json::Value::as_str)
        {
            return Error::connection_lost(transport);
        }
        if agent_client_protocol::is_connection_terminated(&error)
            || agent_client_protocol::is_incoming_transport_closed(&error)
        {
            return Error::ConnectionLost {
                message: error.message.clone(),
                source: Some(Box::new(error)),
            };
        }
        Error::Rpc(error)
    }

    /// An error of `acp-http-client` outside a request (building the
    /// transport).
    pub(crate) fn from_transport(error: acp_http_client::Error) -> Error {
        match error {
            acp_http_client::Error::Http(failure) => Error::Http(failure),
            acp_http_client::Error::InvalidOptions(message) => Error::InvalidOptions(message),
            acp_http_client::Error::Request(error) => Error::from(error),
            other => Error::ConnectionLost {
                message: other.to_string(),
                source: Some(Box::new(other)),
            },
        }
    }
}

impl From<reqwest::Error> for Error {
    /// A timeout becomes [`Error::Timeout`]; a failed connect, a request
    /// that could not be sent and a body cut off become
    /// [`Error::ConnectionLost`]; anything else [`Error::Request`]. The
    /// reqwest error is kept as the source.
    fn from(error: reqwest::Error) -> Error {
        if error.is_timeout() {
            Error::Timeout {
                what: error
                    .url()
                    .map_or_else(|| "the request".to_owned(), |url| url.path().to_owned()),
                after: None,
                source: Some(Box::new(error)),
            }
        } else if error.is_connect() || error.is_request() || error.is_body() {
            Error::ConnectionLost {
                message: error_chain(&error),
                source: Some(Box::new(error)),
            }
        } else {
            Error::Request(error)
        }
    }
}

/// `error` and its sources, joined by `: ` (reqwest's own text omits the
/// cause, such as "Connection refused").
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// `JSON-RPC error CODE: MESSAGE`, then the agent's own `data`, its stderr
/// lines and the server's hint, each in parentheses.
fn rpc_text(error: &agent_client_protocol::Error) -> String {
    let mut text = format!(
        "JSON-RPC error {}: {}",
        i32::from(error.code),
        error.message
    );
    let details = error.data.as_ref().and_then(AgentErrorDetails::from_data);
    let own = match &details {
        Some(_) => error
            .data
            .as_ref()
            .and_then(ext_methods::agent_error::agent_data),
        None => error.data.clone(),
    };
    if let Some(data) = own {
        text.push_str(&format!(" ({data})"));
    }
    if let Some(details) = details {
        if !details.stderr.is_empty() {
            text.push_str(&format!(" (agent stderr: {})", details.stderr.join(" | ")));
        }
        if let Some(hint) = details.hint {
            text.push_str(&format!(" (hint: {hint})"));
        }
    }
    text
}

fn after_suffix(after: &Option<Duration>) -> String {
    after.map_or_else(String::new, |after| format!(" after {after:?}"))
}

fn field_prefix(field: &Option<String>) -> String {
    field
        .as_ref()
        .map_or_else(String::new, |field| format!("field {field:?} "))
}

fn logs_suffix(logs: &str) -> String {
    if logs.trim().is_empty() {
        "; it printed nothing".to_owned()
    } else {
        format!("\n--- sandbox output (last lines) ---\n{}", logs.trim_end())
    }
}

fn stderr_suffix(stderr: &str) -> String {
    if stderr.trim().is_empty() {
        String::new()
    } else {
        format!("\n--- server stderr ---\n{}", stderr.trim_end())
    }
}

fn display_paths(paths: &[PathBuf]) -> String {
    if paths.is_empty() {
        return "nothing".to_owned();
    }
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn made_up_http_errors_keep_status_and_problem() {
        let error = agent_client_protocol::Error::new(-32603, "HTTP 404".to_owned()).data(
            serde_json::json!({"httpStatus": 404, "problem": {"type": "urn:sandbox-agent:error:unknown-agent", "title": "Not Found", "status": 404, "detail": "no agent nope"}}),
        );
        let error = Error::from_rpc(error);
        assert_eq!(error.status(), Some(StatusCode::NOT_FOUND));
        assert_eq!(
            error.problem().and_then(|p| p.detail.as_deref()),
            Some("no agent nope")
        );
        assert!(error.to_string().contains("no agent nope"), "{error}");
    }

    #[test]
    fn agent_stderr_and_hint_are_read_from_data() {
        let error = Error::from_rpc(
            agent_client_protocol::Error::new(-32603, "failed".to_owned()).data(
                serde_json::json!({
                    "reason": "x",
                    "sandboxagent.dev": {"stderr": ["one", "two"], "hint": "use --agent-user"},
                }),
            ),
        );
        assert_eq!(error.agent_stderr(), ["one", "two"]);
        assert_eq!(error.agent_hint().as_deref(), Some("use --agent-user"));
        assert_eq!(
            error.to_string(),
            r#"JSON-RPC error -32603: failed ({"reason":"x"}) (agent stderr: one | two) (hint: use --agent-user)"#
        );
        let plain = Error::from_rpc(agent_client_protocol::Error::new(-32002, "gone".to_owned()));
        assert!(plain.agent_stderr().is_empty() && plain.agent_hint().is_none());
        assert_eq!(plain.to_string(), "JSON-RPC error -32002: gone");
    }

    #[test]
    fn transport_and_agent_errors_are_told_apart() {
        let transport = agent_client_protocol::Error::new(-32603, "x".to_owned())
            .data(serde_json::json!({"transportError": "connection refused"}));
        let lost = Error::from_rpc(transport);
        assert!(lost.is_connection_lost(), "{lost:?}");
        assert!(lost.to_string().contains("connection refused"), "{lost}");
        let agent = agent_client_protocol::Error::new(-32002, "unknown session".to_owned());
        let error = Error::from_rpc(agent);
        assert_eq!(error.rpc_code(), Some(-32002));
        assert!(error.is_not_found());
        assert!(!error.is_connection_lost());
        assert!(error.to_string().contains("unknown session"));
    }
}
