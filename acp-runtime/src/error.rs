//! The runtime's error type. Each variant maps to one HTTP status and one
//! problem type here ([`Error::status`], [`Error::kind`]), the only place
//! that mapping lives; [`crate::http::problem`] writes it as a problem+json
//! response and [`Error::to_rpc_error`] as a JSON-RPC error object.

use http::StatusCode;
use std::time::Duration;

/// Prefix of every problem `type`.
pub const TYPE_PREFIX: &str = crate::protocol::PROBLEM_TYPE_PREFIX;

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
    /// A JSON-RPC batch (a JSON array) where only single messages are
    /// served (the ACP transports RFD answers batches with 501).
    #[error("JSON-RPC batches are not supported; send one message per request")]
    BatchNotSupported,
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
    /// A browser request from a page of another site: its `Origin` is
    /// neither the request's own host and port nor allowed by
    /// `--cors-allow-origin` (research/contract.md, "Auth and CORS").
    #[error(
        "cross-site request refused: Origin {0:?} is neither this server's own host and port nor allowed by --cors-allow-origin"
    )]
    ForbiddenOrigin(String),
    /// A request on a loopback connection naming a host that is not a
    /// loopback name nor an `--allowed-host` value: DNS rebinding
    /// (research/contract.md, "Auth and CORS").
    #[error(
        "Host {0:?} is not served on a loopback connection (DNS rebinding protection); use localhost, 127.0.0.1 or [::1], or start the server with --allowed-host NAME for a proxy in front"
    )]
    ForbiddenHost(String),
    /// `POST /v2/fs/upload-batch` without an archive `Content-Type`
    /// (research/contract.md, "Host file system").
    #[error(
        "Content-Type must be application/x-tar or application/gzip (a tar stream, gzip allowed)"
    )]
    UnsupportedArchiveType,
    /// The session store could not be read (research/contract.md,
    /// "Durable sessions"); the newest events are still served from memory.
    #[error("the session store cannot be read right now: {0}")]
    StoreUnavailable(String),
    /// A client's message found no room in the session store's queue within
    /// `CLIENT_WAIT` (5 s): refused and not forwarded to the agent, so what
    /// the agent ran is always in the stored log (research/contract.md,
    /// "Durable sessions").
    #[error("the session store is behind: the message was not forwarded to the agent; retry later")]
    StoreBehind,
    /// A file system path that cannot be used: empty, with a NUL byte, `..`
    /// in a relative path, or naming the file system root where an entry is
    /// needed (research/contract.md, "Host file system").
    #[error("{0}")]
    InvalidPath(String),
    /// The path resolves (after symlinks) outside `--fs-root`.
    #[error("{path} is outside the file system root this server is confined to (--fs-root)")]
    OutsideRoot {
        /// The path as resolved (or as given, when it does not resolve).
        path: String,
    },
    /// The operating system refused access (`EACCES`, `EPERM`).
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// No file or directory at the path.
    #[error("no such file or directory: {0}")]
    FileNotFound(String),
    /// A session's `cwd` the agents' user (`--agent-user`) cannot write
    /// (research/contract.md, "Agents under an unprivileged user").
    #[error(
        "the agents run as user {user:?} (--agent-user), which cannot write the cwd {cwd}: {}",
        if *missing {
            "it does not exist; create it and give it to the user".to_owned()
        } else {
            format!("give it to the user (chown -R {user} {cwd}) or choose another")
        }
    )]
    CwdNotWritable {
        /// The user's name.
        user: String,
        /// The `cwd` as the request gave it.
        cwd: String,
        /// Whether it does not exist at all.
        missing: bool,
    },
    /// The entry's kind conflicts with the operation.
    #[error("{detail}")]
    FsConflict {
        /// Which conflict.
        conflict: FsConflict,
        /// The path and what to do.
        detail: String,
    },
    /// A precondition of the request (`If-Match`) is false for the
    /// current file (RFC 9110 section 15.5.13).
    #[error("precondition failed: {0}")]
    PreconditionFailed(String),
    /// A `Range` that starts at or past the end of the file (RFC 9110
    /// section 15.5.17).
    #[error("range not satisfiable: the file has {size} bytes")]
    RangeNotSatisfiable {
        /// The file's size in bytes, sent back in `Content-Range: bytes */size`.
        size: u64,
    },
    /// The disk (or quota) is full (`ENOSPC`, `EDQUOT`).
    #[error("no space left on the device: {0}")]
    InsufficientStorage(String),
    /// An upload-batch archive that is not a safe, readable tar.
    #[error("{0}")]
    InvalidArchive(String),
    /// An upload-batch archive past `--max-unpacked-bytes` unpacked, or past
    /// the entry cap.
    #[error("{0}")]
    ArchiveTooLarge(String),
    /// Any other file system failure.
    #[error("file system error: {0}")]
    FsIo(String),
    /// No process of the process API with this id.
    #[error("no process with id {0:?}")]
    UnknownProcess(String),
    /// The process API is off (`--no-processes`).
    #[error("the process API is turned off on this server (--no-processes)")]
    ProcessesDisabled,
    /// The program to start does not exist or is not executable.
    #[error("cannot start the program {0}")]
    ProgramNotFound(String),
    /// `--max-processes` are running.
    #[error("too many running processes (limit {limit}); wait for one to exit or forget one")]
    TooManyProcesses {
        /// `--max-processes`.
        limit: usize,
    },
    /// Input or a signal for a process that exited (or whose stdin is
    /// closed).
    #[error("process {0} has exited (or its stdin is closed)")]
    ProcessExited(String),
    /// A process did not take its stdin within the time allowed.
    #[error("process {id} did not read its stdin within {} ms", timeout.as_millis())]
    InputTimeout {
        /// The process id (and what waited).
        id: String,
        /// The time allowed.
        timeout: Duration,
    },
    /// A resize of a process that has no terminal.
    #[error("process {0} has no terminal (start it with tty: true)")]
    NotATty(String),
    /// The agent did not answer in time.
    #[error("agent did not answer {method} within {} ms", timeout.as_millis())]
    Timeout {
        /// The request's method.
        method: String,
        /// The timeout that elapsed.
        timeout: Duration,
    },
}

/// The 409 conflicts of the file system operations, each its own problem
/// type (research/contract.md, "Host file system").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsConflict {
    /// The target exists (`move` without `overwrite`, `mkdir` over a file).
    AlreadyExists,
    /// A directory was needed (a path component or the target is a file).
    NotADirectory,
    /// A file was needed and the path is a directory.
    IsADirectory,
    /// A non-empty directory, deleted without `recursive`.
    DirectoryNotEmpty,
    /// A move across file systems (`EXDEV`).
    CrossDevice,
}

impl FsConflict {
    /// The problem `<kind>`.
    pub fn kind(self) -> &'static str {
        match self {
            Self::AlreadyExists => "already-exists",
            Self::NotADirectory => "not-a-directory",
            Self::IsADirectory => "is-a-directory",
            Self::DirectoryNotEmpty => "directory-not-empty",
            Self::CrossDevice => "cross-device",
        }
    }
}

impl Error {
    /// A file system failure on `path` as the error of its kind: 404, 403,
    /// 409, 507, else 500 `io-error`.
    pub fn from_io(error: &std::io::Error, path: &std::path::Path) -> Self {
        use std::io::ErrorKind as Kind;
        let shown = path.display().to_string();
        let conflict = |conflict: FsConflict, what: &str| Self::FsConflict {
            conflict,
            detail: format!("{shown}: {what}"),
        };
        match error.kind() {
            Kind::NotFound => Self::FileNotFound(shown),
            Kind::PermissionDenied => Self::PermissionDenied(shown),
            Kind::AlreadyExists => conflict(FsConflict::AlreadyExists, "already exists"),
            Kind::NotADirectory => conflict(FsConflict::NotADirectory, "not a directory"),
            Kind::IsADirectory => conflict(FsConflict::IsADirectory, "is a directory"),
            Kind::DirectoryNotEmpty => conflict(
                FsConflict::DirectoryNotEmpty,
                "directory not empty (delete with recursive=true)",
            ),
            Kind::CrossesDevices => {
                conflict(FsConflict::CrossDevice, "cannot move across file systems")
            }
            Kind::StorageFull | Kind::QuotaExceeded => Self::InsufficientStorage(shown),
            Kind::InvalidFilename => Self::InvalidPath(format!("{shown}: invalid file name")),
            // EINVAL: e.g. moving a directory into itself.
            Kind::InvalidInput => Self::InvalidPath(format!("{shown}: {error}")),
            Kind::ReadOnlyFilesystem => {
                Self::PermissionDenied(format!("{shown} (read-only file system)"))
            }
            // ELOOP: a symlink where `O_NOFOLLOW` forbids one, i.e. the path
            // changed into a link during the request.
            _ if error.raw_os_error() == Some(nix::libc::ELOOP) => {
                Self::PermissionDenied(format!("{shown}: a symlink appeared on the path"))
            }
            _ => Self::FsIo(format!("{shown}: {error}")),
        }
    }
}

impl Error {
    /// HTTP status (research/contract.md, "Problem types").
    pub fn status(&self) -> StatusCode {
        match self {
            Self::InvalidRequest(_)
            | Self::MissingConnectionId(_)
            | Self::MissingAgent { .. }
            | Self::AgentMismatch { .. }
            | Self::InvalidLastEventId(_)
            | Self::InvalidPath(_)
            | Self::InvalidArchive(_)
            | Self::ProgramNotFound(_) => StatusCode::BAD_REQUEST,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::OutsideRoot { .. }
            | Self::PermissionDenied(_)
            | Self::CwdNotWritable { .. }
            | Self::ForbiddenOrigin(_)
            | Self::ForbiddenHost(_) => StatusCode::FORBIDDEN,
            Self::FileNotFound(_)
            | Self::UnknownConnection(_)
            | Self::ExpiredConnection { .. }
            | Self::UnknownSession(_)
            | Self::UnknownAgent { .. }
            | Self::UnknownProcess(_)
            | Self::ProcessesDisabled
            | Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            Self::NotAcceptable(_) => StatusCode::NOT_ACCEPTABLE,
            Self::StreamConflict
            | Self::AmbiguousSession { .. }
            | Self::AgentNotInstalled { .. }
            | Self::NotInstallable(_)
            | Self::FsConflict { .. }
            | Self::ProcessExited(_)
            | Self::NotATty(_) => StatusCode::CONFLICT,
            Self::TooManyProcesses { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::RangeNotSatisfiable { .. } => StatusCode::RANGE_NOT_SATISFIABLE,
            Self::PreconditionFailed(_) => StatusCode::PRECONDITION_FAILED,
            Self::InsufficientStorage(_) => StatusCode::INSUFFICIENT_STORAGE,
            Self::FsIo(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Self::Gone => StatusCode::GONE,
            Self::RequestTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            Self::PayloadTooLarge { .. } | Self::ArchiveTooLarge(_) => {
                StatusCode::PAYLOAD_TOO_LARGE
            }
            Self::UnsupportedMediaType | Self::UnsupportedArchiveType => {
                StatusCode::UNSUPPORTED_MEDIA_TYPE
            }
            Self::AgentStartFailed { .. } | Self::InstallFailed(_) => StatusCode::BAD_GATEWAY,
            Self::TooManyConnections { .. }
            | Self::TooManyHttpConnections { .. }
            | Self::ShuttingDown
            | Self::StoreUnavailable(_)
            | Self::StoreBehind => StatusCode::SERVICE_UNAVAILABLE,
            Self::Timeout { .. } | Self::InputTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            Self::BatchNotSupported => StatusCode::NOT_IMPLEMENTED,
        }
    }

    /// The `<kind>` of `urn:sandbox-agent:error:<kind>`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::InvalidRequest(_) => "invalid-request",
            Self::MissingConnectionId(_) => "missing-connection-id",
            Self::MissingAgent { .. } => "missing-agent",
            Self::AgentMismatch { .. } => "agent-mismatch",
            Self::InvalidLastEventId(_) => "invalid-last-event-id",
            Self::Unauthorized => "unauthorized",
            Self::UnknownConnection(_) | Self::ExpiredConnection { .. } => "unknown-connection",
            Self::UnknownSession(_) => "unknown-session",
            Self::AmbiguousSession { .. } => "ambiguous-session",
            Self::UnknownAgent { .. } => "unknown-agent",
            Self::NotFound(_) => "not-found",
            Self::MethodNotAllowed(_) => "method-not-allowed",
            Self::NotAcceptable(_) => "not-acceptable",
            Self::StreamConflict => "stream-conflict",
            Self::Gone => "gone",
            Self::RequestTimeout { .. } => "request-timeout",
            Self::PayloadTooLarge { .. } | Self::ArchiveTooLarge(_) => "payload-too-large",
            Self::UnsupportedMediaType | Self::UnsupportedArchiveType => "unsupported-media-type",
            Self::ForbiddenOrigin(_) => "forbidden-origin",
            Self::ForbiddenHost(_) => "forbidden-host",
            Self::BatchNotSupported => "batch-not-supported",
            Self::AgentStartFailed { .. } => "agent-start-failed",
            Self::AgentNotInstalled { .. } => "agent-not-installed",
            Self::NotInstallable(_) => "not-installable",
            Self::InstallFailed(_) => "install-failed",
            Self::TooManyConnections { .. } => "too-many-connections",
            Self::TooManyHttpConnections { .. } => "too-many-http-connections",
            Self::ShuttingDown => "shutting-down",
            Self::StoreUnavailable(_) => "store-unavailable",
            Self::StoreBehind => "store-behind",
            Self::Timeout { .. } | Self::InputTimeout { .. } => "timeout",
            Self::InvalidPath(_) => "invalid-path",
            Self::OutsideRoot { .. } => "outside-root",
            Self::PermissionDenied(_) => "permission-denied",
            Self::CwdNotWritable { .. } => "cwd-not-writable",
            Self::FileNotFound(_) => "file-not-found",
            Self::FsConflict { conflict, .. } => conflict.kind(),
            Self::RangeNotSatisfiable { .. } => "range-not-satisfiable",
            Self::PreconditionFailed(_) => "precondition-failed",
            Self::InsufficientStorage(_) => "insufficient-storage",
            Self::InvalidArchive(_) => "invalid-archive",
            Self::FsIo(_) => "io-error",
            Self::UnknownProcess(_) => "unknown-process",
            Self::ProcessesDisabled => "processes-disabled",
            Self::ProgramNotFound(_) => "program-not-found",
            Self::TooManyProcesses { .. } => "too-many-processes",
            Self::ProcessExited(_) => "process-exited",
            Self::NotATty(_) => "not-a-tty",
        }
    }
}

impl Error {
    /// The same failure as a JSON-RPC error object, for a request on
    /// `/v2/rpc` that the runtime answers (an extension method): `-32602`
    /// (invalid params) for a 4xx problem, `-32603` otherwise, with the
    /// problem's `type`, `status` and `detail` in `data` so a client branches
    /// on the same names on both surfaces.
    pub fn to_rpc_error(&self) -> crate::protocol::RpcError {
        use crate::protocol::{RpcError, code};
        let status = self.status();
        let code = if status.is_client_error() {
            code::INVALID_PARAMS
        } else {
            code::INTERNAL_ERROR
        };
        RpcError::new(code, self.to_string()).with_data(serde_json::json!({
            "type": format!("{TYPE_PREFIX}{}", self.kind()),
            "status": status.as_u16(),
            "detail": self.to_string(),
        }))
    }
}
