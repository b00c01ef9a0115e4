//! The runtime's error type. Each variant maps to one HTTP status and one
//! problem type in [`crate::http::problem`], the only place that mapping lives.

use crate::agent::install::InstallError;
use std::time::Duration;

/// Errors a `/v2` request can end with. Method-level failures are not here:
/// those are JSON-RPC error objects inside a 200 (research/contract.md,
/// "Transport: /v2/rpc", POST).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The body is not one JSON-RPC 2.0 object, or a header is not allowed.
    #[error("{0}")]
    InvalidRequest(String),
    /// `x-acp-connection-id` is required here.
    #[error("the x-acp-connection-id header is required here{0}")]
    MissingConnectionId(&'static str),
    /// `params._meta["sandboxagent.dev"].agent` is missing.
    #[error("{method} must carry params._meta[\"sandboxagent.dev\"].agent (the agent id)")]
    MissingAgent {
        /// The method that lacked it.
        method: String,
    },
    /// `session/new` names another agent than the connection's.
    #[error(
        "this connection is bound to agent {connection:?} but the request names agent {requested:?}; open another connection for that agent"
    )]
    AgentMismatch {
        /// The connection's agent.
        connection: String,
        /// The agent the request named.
        requested: String,
    },
    /// `Last-Event-ID` is not usable.
    #[error("{0}")]
    InvalidLastEventId(String),
    /// Missing or wrong bearer token.
    #[error("missing or wrong bearer token (send Authorization: Bearer <token>)")]
    Unauthorized,
    /// No open connection has this id.
    #[error("no open connection with id {0:?}; initialize a new one")]
    UnknownConnection(String),
    /// The connection was closed after `--idle-timeout-ms` without a stream
    /// or a request (research/contract.md, "DELETE and the connection
    /// lifecycle").
    #[error(
        "connection {id:?} expired after {} ms idle (--idle-timeout-ms) and was closed; initialize a new one",
        idle.as_millis()
    )]
    ExpiredConnection {
        /// The connection id the request named.
        id: String,
        /// The idle timeout that closed it.
        idle: Duration,
    },
    /// No session with this id is known.
    #[error("no session with id {0:?}")]
    UnknownSession(String),
    /// Two or more agents have a session with this id and the request did
    /// not pick one with `?agent=`.
    #[error("session id {id:?} is used by the agents {}; pick one with ?agent=", agents.join(", "))]
    AmbiguousSession {
        /// The session id.
        id: String,
        /// The agents that have a session with that id.
        agents: Vec<String>,
    },
    /// The agent id is not configured.
    #[error("unknown agent {agent:?}; known agents: {known}")]
    UnknownAgent {
        /// What the request named.
        agent: String,
        /// Comma-separated known ids.
        known: String,
    },
    /// No such route.
    #[error("no route for {0}")]
    NotFound(String),
    /// Known path, wrong verb.
    #[error("method not allowed; allowed: {0}")]
    MethodNotAllowed(&'static str),
    /// `Accept` excludes the media type this route produces.
    #[error("the Accept header must allow {0}")]
    NotAcceptable(&'static str),
    /// A stream is already live on this connection.
    #[error(
        "a stream is already open on this connection; resume with Last-Event-ID to take it over"
    )]
    StreamConflict,
    /// `/v1/*` was removed.
    #[error("v1 API removed; use /v2")]
    Gone,
    /// The client did not send the whole body in time (`--read-timeout-ms`).
    #[error("the request body did not arrive within {} ms", timeout.as_millis())]
    RequestTimeout {
        /// The read timeout.
        timeout: Duration,
    },
    /// The body is over the limit.
    #[error("request body larger than {limit} bytes")]
    PayloadTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// POST without `Content-Type: application/json`.
    #[error("Content-Type must be application/json")]
    UnsupportedMediaType,
    /// The agent process could not be started or initialized.
    #[error("agent {agent:?} could not be started: {reason}")]
    AgentStartFailed {
        /// Agent id.
        agent: String,
        /// What went wrong, with the head of its stderr when there is one.
        reason: String,
    },
    /// The agent is not installed and the server runs with
    /// `--require-preinstall`.
    #[error(
        "agent {agent:?} is not installed and this server requires preinstalled agents (--require-preinstall); install it first: sandbox-agent agents install {agent}{install_args} (or POST /v2/agents/{agent}/install)"
    )]
    AgentNotInstalled {
        /// Agent id.
        agent: String,
        /// What the install command needs to reach this server's data dir:
        /// ` --data-dir PATH` when it is not the default, else empty.
        install_args: String,
    },
    /// The agent has nothing this runtime can install here (no distribution
    /// for this platform, a command agent whose program is missing).
    #[error("{0}")]
    NotInstallable(String),
    /// Installing the agent failed (npm, download, checksum, archive, disk).
    #[error("{0}")]
    InstallFailed(String),
    /// `--max-connections` reached.
    #[error("too many open connections (limit {limit}); close one or retry later")]
    TooManyConnections {
        /// The limit.
        limit: usize,
    },
    /// `--max-http-connections` TCP connections are served already; this one
    /// gets the answer and is closed.
    #[error("too many HTTP connections (limit {limit}); retry later")]
    TooManyHttpConnections {
        /// The limit in effect.
        limit: usize,
    },
    /// The server is shutting down.
    #[error("the server is shutting down")]
    ShuttingDown,
    /// The agent did not answer in time.
    #[error("agent did not answer {method} within {} ms", timeout.as_millis())]
    Timeout {
        /// The request's method.
        method: String,
        /// The timeout that elapsed.
        timeout: Duration,
    },
}

impl Error {
    /// The HTTP error for a failed install of `agent`.
    pub fn from_install(agent: &str, error: InstallError) -> Self {
        match error {
            InstallError::NotInstallable(message) => Self::NotInstallable(message),
            InstallError::InvalidVersion(message) => {
                Self::InvalidRequest(format!("agent {agent:?}: {message}"))
            }
            InstallError::Failed(message) => Self::InstallFailed(message),
        }
    }
}
