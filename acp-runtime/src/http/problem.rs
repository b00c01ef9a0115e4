//! Problem details (RFC 9457): the one place where an [`Error`] becomes an
//! HTTP status and an `application/problem+json` body.

use super::{Body, full};
use crate::error::Error;
use http::header::{ALLOW, CONNECTION, CONTENT_TYPE, RETRY_AFTER, WWW_AUTHENTICATE};
use http::{HeaderValue, Response, StatusCode};
use serde::Serialize;

/// `Content-Type` of problem responses.
pub const PROBLEM_JSON: &str = "application/problem+json";
/// Prefix of every problem `type`.
pub const TYPE_PREFIX: &str = "urn:sandbox-agent:error:";

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
            | Self::InvalidArchive(_) => StatusCode::BAD_REQUEST,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::OutsideRoot { .. }
            | Self::PermissionDenied(_)
            | Self::ForbiddenOrigin(_)
            | Self::ForbiddenHost(_) => StatusCode::FORBIDDEN,
            Self::FileNotFound(_)
            | Self::UnknownConnection(_)
            | Self::ExpiredConnection { .. }
            | Self::UnknownSession(_)
            | Self::UnknownAgent { .. }
            | Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            Self::NotAcceptable(_) => StatusCode::NOT_ACCEPTABLE,
            Self::StreamConflict
            | Self::AmbiguousSession { .. }
            | Self::AgentNotInstalled { .. }
            | Self::NotInstallable(_)
            | Self::FsConflict { .. } => StatusCode::CONFLICT,
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
            | Self::StoreUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
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
            Self::Timeout { .. } => "timeout",
            Self::InvalidPath(_) => "invalid-path",
            Self::OutsideRoot { .. } => "outside-root",
            Self::PermissionDenied(_) => "permission-denied",
            Self::FileNotFound(_) => "file-not-found",
            Self::FsConflict { conflict, .. } => conflict.kind(),
            Self::RangeNotSatisfiable { .. } => "range-not-satisfiable",
            Self::PreconditionFailed(_) => "precondition-failed",
            Self::InsufficientStorage(_) => "insufficient-storage",
            Self::InvalidArchive(_) => "invalid-archive",
            Self::FsIo(_) => "io-error",
        }
    }
}

/// An RFC 9457 problem document.
#[derive(Debug, Serialize)]
pub struct Problem {
    /// `urn:sandbox-agent:error:<kind>`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Short summary of the problem type (the status' reason phrase).
    pub title: &'static str,
    /// The HTTP status, repeated.
    pub status: u16,
    /// What happened and what to do about it.
    pub detail: String,
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

/// The problem document of `error`, serialized.
pub fn document(error: &Error) -> Vec<u8> {
    let status = error.status();
    let problem = Problem {
        kind: format!("{TYPE_PREFIX}{}", error.kind()),
        title: status.canonical_reason().unwrap_or("Error"),
        status: status.as_u16(),
        detail: error.to_string(),
    };
    serde_json::to_vec(&problem).unwrap_or_default()
}

/// The problem response for `error`, with the headers its status calls for.
pub fn response(error: &Error) -> Response<Body> {
    let mut response = full(error.status(), PROBLEM_JSON, document(error).into());
    let headers = response.headers_mut();
    match error {
        Error::Unauthorized => {
            headers.insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        Error::MethodNotAllowed(allow) => {
            headers.insert(ALLOW, HeaderValue::from_static(allow));
        }
        Error::RequestTimeout { .. } | Error::PayloadTooLarge { .. } => {
            // RFC 9110 sections 15.5.9 and 15.5.14: the rest of the body is
            // not read, so the server closes the connection, and says so.
            headers.insert(CONNECTION, HeaderValue::from_static("close"));
        }
        Error::RangeNotSatisfiable { size } => {
            // RFC 9110 section 14.4: the current length, for the next try.
            if let Ok(value) = HeaderValue::from_str(&format!("bytes */{size}")) {
                headers.insert(http::header::CONTENT_RANGE, value);
            }
        }
        Error::TooManyConnections { .. } | Error::ShuttingDown => {
            headers.insert(RETRY_AFTER, HeaderValue::from_static("1"));
        }
        _ => {}
    }
    debug_assert!(headers.contains_key(CONTENT_TYPE));
    response
}
