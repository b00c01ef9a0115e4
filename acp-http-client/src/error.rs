//! The crate's error type and the RFC 9457 problem document.

use reqwest::StatusCode;
use serde::{Deserialize, Serialize};

/// Most bytes of an error body read to find a problem document.
const MAX_PROBLEM_BYTES: usize = 64 * 1024;

/// Everything that can go wrong in this crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The server answered with a non-2xx status (and perhaps an RFC 9457
    /// problem document).
    #[error("{0}")]
    Http(HttpFailure),
    /// The HTTP exchange itself failed: connect, TLS, timeout, a body cut
    /// off. `reqwest::Error::is_connect()` tells whether the request left
    /// this machine at all.
    #[error("HTTP request failed: {0}")]
    Request(#[from] reqwest::Error),
    /// The event stream was not valid SSE (bad UTF-8 or framing).
    #[error("invalid event stream: {0}")]
    EventStream(String),
    /// No bytes (not even a heartbeat comment) arrived on the event stream
    /// for this long; the stream is treated as dead and reopened.
    #[error("event stream idle for {0:?}")]
    StreamIdle(std::time::Duration),
    /// The event stream could not be reopened: `attempts` consecutive
    /// attempts failed (see [`ReconnectPolicy`](crate::ReconnectPolicy));
    /// `last` is the last attempt's error.
    #[error("event stream lost after {attempts} failed reconnect attempts: {last}")]
    StreamLost {
        /// Consecutive failed attempts.
        attempts: u32,
        /// The error of the last attempt.
        last: Box<Error>,
    },
    /// A message other than `initialize` was sent while no connection id is
    /// known and no `initialize` is under way to get one.
    #[error("not connected: send `initialize` first (no connection id yet)")]
    NotConnected,
    /// The connection was closed with `close()` (or all handles dropped).
    #[error("connection closed")]
    Closed,
    /// The server answered a POST with `2xx` but a body that is not one
    /// JSON-RPC message (not JSON, not an object, or over
    /// [`max_message_bytes`](crate::TransportOptions::max_message_bytes)).
    #[error("the server's answer is not a JSON-RPC message: {0}")]
    InvalidResponse(String),
    /// An outgoing message is not one JSON object.
    #[error("invalid JSON-RPC message: {0}")]
    InvalidMessage(String),
    /// The WebSocket opening handshake could not reach the server (connect
    /// failure or timeout): nothing was sent.
    #[error("WebSocket connect failed: {0}")]
    WebSocketConnect(String),
    /// The WebSocket failed or was closed by the server. A WebSocket
    /// cannot be resumed: what was in flight on it is lost.
    #[error("WebSocket: {0}")]
    WebSocket(String),
    /// The [`TransportOptions`](crate::TransportOptions) cannot work (a
    /// base URL that is not absolute http(s), a token that is not a valid
    /// header value, a client that cannot be built).
    #[error("invalid transport options: {0}")]
    InvalidOptions(String),
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
}

/// A non-2xx answer: its status and, when the body was one, its RFC 9457
/// problem document. Displayed as `HTTP 404 Not Found: <title>: <detail>`.
///
/// The one shape of an HTTP failure for this crate and the crates on top of
/// it: [`Error::Http`] holds one, and [`http_failure`](crate::http_failure)
/// reads one back from the JSON-RPC error the typed layer made up for it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("HTTP {status}{}", problem_suffix(status, .problem.as_deref()))]
pub struct HttpFailure {
    /// The HTTP status code.
    pub status: StatusCode,
    /// The problem document, if the body was one (boxed: it is large and
    /// rare).
    pub problem: Option<Box<Problem>>,
}

impl HttpFailure {
    /// The failure a non-2xx `response` stands for: its status, and its
    /// body parsed as a problem document when the body is one of at most
    /// 64 KiB (a longer body is not read to its end).
    pub async fn from_response(response: reqwest::Response) -> HttpFailure {
        HttpFailure {
            status: response.status(),
            problem: read_problem(response).await,
        }
    }
}

/// Reads at most [`MAX_PROBLEM_BYTES`] of an error body and parses it as a
/// problem document.
async fn read_problem(mut response: reqwest::Response) -> Option<Box<Problem>> {
    let mut body = Vec::new();
    while let Ok(Some(chunk)) = response.chunk().await {
        body.extend_from_slice(&chunk);
        if body.len() > MAX_PROBLEM_BYTES {
            return None;
        }
    }
    Problem::parse(std::str::from_utf8(&body).ok()?).map(Box::new)
}

/// `: title: detail` of a problem, leaving out a title that only repeats the
/// status line's reason phrase (`HTTP 401 Unauthorized: missing token`, not
/// `HTTP 401 Unauthorized: Unauthorized: missing token`).
fn problem_suffix(status: &StatusCode, problem: Option<&Problem>) -> String {
    let Some(problem) = problem else {
        return String::new();
    };
    let title = problem
        .title
        .as_ref()
        .filter(|title| status.canonical_reason() != Some(title.as_str()));
    match (title, &problem.detail) {
        (Some(title), Some(detail)) => format!(": {title}: {detail}"),
        (Some(text), None) | (None, Some(text)) => format!(": {text}"),
        (None, None) => format!(": {}", problem.problem_type),
    }
}

/// An RFC 9457 problem details document (`application/problem+json`).
///
/// The five members the RFC defines are typed; any extension member is
/// kept in `extensions`, so the document round-trips.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Problem {
    /// A URI reference naming the problem type. RFC 9457 section 3.1.1:
    /// `"about:blank"` when absent.
    #[serde(rename = "type", default = "about_blank")]
    pub problem_type: String,
    /// A short, human-readable summary of the problem type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// The HTTP status code the server generated for this occurrence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// A human-readable explanation of this occurrence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// A URI reference identifying this occurrence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// Every other member of the document.
    #[serde(flatten)]
    pub extensions: serde_json::Map<String, serde_json::Value>,
}

fn about_blank() -> String {
    "about:blank".to_owned()
}

impl Problem {
    /// Parses a problem document; `None` if `body` is not a JSON object of
    /// that shape.
    pub fn parse(body: &str) -> Option<Problem> {
        serde_json::from_str(body).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problem_keeps_extension_members_and_defaults_the_type() {
        let problem = Problem::parse(
            r#"{"title":"Not Found","status":404,"detail":"d","knownAgents":["mock"]}"#,
        );
        let Some(problem) = problem else {
            panic!("a problem document");
        };
        assert_eq!(problem.problem_type, "about:blank");
        assert_eq!(problem.status, Some(404));
        assert_eq!(
            problem.extensions.get("knownAgents"),
            Some(&serde_json::json!(["mock"]))
        );
        let error = Error::Http(HttpFailure {
            status: StatusCode::NOT_FOUND,
            problem: Some(Box::new(problem)),
        });
        assert_eq!(error.to_string(), "HTTP 404 Not Found: d");
        let titled = Error::Http(HttpFailure {
            status: StatusCode::CONFLICT,
            problem: Problem::parse(r#"{"title":"Agent busy","detail":"d"}"#).map(Box::new),
        });
        assert_eq!(titled.to_string(), "HTTP 409 Conflict: Agent busy: d");
        assert!(Problem::parse("[1]").is_none());
    }
}
