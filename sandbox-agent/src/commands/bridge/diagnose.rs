//! Turning transport failures into JSON-RPC errors that tell the editor's
//! user what to fix. Pure: no I/O.
//!
//! Every error the bridge makes up has code `-32603` and the same `data`
//! shape as the errors `acp-http-client`'s typed layer makes up (so
//! `acp_http_client::http_failure` reads them back): `{"httpStatus": N,
//! "problem": {..}}` for an HTTP answer, `{"transportError": ".."}`
//! otherwise.

use acp_http_client::{Error, HttpFailure, Problem};
use acp_runtime::protocol::{RpcError, code};
use serde_json::{Map, Value, json};

/// Who the bridge talks to, for the messages.
#[derive(Debug, Clone)]
pub struct Target {
    /// The runtime's base URL, as given with `--url`.
    pub url: String,
    /// The agent id given with `--agent`.
    pub agent: String,
    /// Whether a token was given (`--token` / `SANDBOX_AGENT_TOKEN`).
    pub has_token: bool,
}

/// A failure as the editor sees it.
#[derive(Debug, Clone)]
pub struct Diagnosis {
    /// The JSON-RPC error for the editor's request(s).
    pub error: RpcError,
    /// Whether the bridge cannot go on: every waiting request gets
    /// `error`, and the bridge exits non-zero.
    pub fatal: bool,
}

/// A POST of an editor message failed with `error`; `connected` tells
/// whether the runtime had already opened the connection (`initialize`
/// answered).
///
/// Fatal: the runtime is unreachable before any connection exists, it
/// rejects the token (401), or it no longer knows the connection (404
/// `unknown-connection`). Anything else fails only the one request.
pub fn post_failure(error: &Error, target: &Target, connected: bool) -> Diagnosis {
    match error {
        Error::Request(cause) if cause.is_connect() => Diagnosis {
            error: unreachable(target, error, &cause_text(cause)),
            fatal: !connected,
        },
        Error::WebSocketConnect(cause) => Diagnosis {
            error: unreachable(target, error, cause),
            fatal: !connected,
        },
        Error::Request(cause) => Diagnosis {
            error: transport_error(
                format!(
                    "the request to the sandbox-agent runtime at {} failed: {}",
                    target.url,
                    cause_text(cause)
                ),
                error,
            ),
            fatal: false,
        },
        Error::Http(HttpFailure { status, problem }) => {
            let status = status.as_u16();
            let problem = problem.as_deref();
            let kind = problem.map(problem_kind).unwrap_or_default();
            let message = match (status, kind) {
                (401, _) => token_message(target),
                (404, "unknown-agent") => format!(
                    "the runtime has no agent \"{}\" (404){}; pick another with --agent",
                    target.agent,
                    detail_suffix(problem)
                ),
                (404, "unknown-connection") => connection_gone(target, problem),
                _ => format!(
                    "the runtime refused the request: HTTP {status}{}{}",
                    if kind.is_empty() {
                        String::new()
                    } else {
                        format!(" ({kind})")
                    },
                    detail_suffix(problem)
                ),
            };
            Diagnosis {
                error: http_error(message, status, problem),
                fatal: status == 401 || (status == 404 && kind == "unknown-connection"),
            }
        }
        Error::NotConnected => Diagnosis {
            error: transport_error(
                "no connection to the runtime yet: send `initialize` first".to_owned(),
                error,
            ),
            fatal: false,
        },
        Error::Closed => Diagnosis {
            error: transport_error(
                "the bridge closed its connection to the runtime".to_owned(),
                error,
            ),
            fatal: false,
        },
        other => Diagnosis {
            error: transport_error(format!("sending to the runtime failed: {other}"), other),
            fatal: false,
        },
    }
}

/// The connection's event stream is gone for good (`Incoming` ended with
/// `error`): always fatal, nothing more can reach the editor.
pub fn stream_failure(error: &Error, target: &Target) -> RpcError {
    match error {
        Error::Http(HttpFailure { status, problem }) if status.as_u16() == 401 => {
            http_error(token_message(target), 401, problem.as_deref())
        }
        Error::Http(HttpFailure { status, problem }) if status.as_u16() == 404 => http_error(
            connection_gone(target, problem.as_deref()),
            404,
            problem.as_deref(),
        ),
        Error::Http(HttpFailure { status, problem }) => http_error(
            format!(
                "the runtime at {} refused the event stream: HTTP {}{}",
                target.url,
                status.as_u16(),
                detail_suffix(problem.as_deref())
            ),
            status.as_u16(),
            problem.as_deref(),
        ),
        Error::StreamLost { attempts, last } => transport_error(
            format!(
                "lost the event stream of the sandbox-agent runtime at {}: {attempts} reconnect \
                 attempts failed (last: {}); is `sandbox-agent server` still running?",
                target.url,
                error_cause(last)
            ),
            error,
        ),
        Error::WebSocket(cause) => transport_error(
            format!(
                "lost the WebSocket to the sandbox-agent runtime at {}: {cause}; a WebSocket \
                 cannot resume (the default transport can)",
                target.url
            ),
            error,
        ),
        other => transport_error(
            format!(
                "the event stream of the sandbox-agent runtime at {} failed: {other}",
                target.url
            ),
            other,
        ),
    }
}

/// The message for a configuration the bridge cannot start with (a bad
/// `--url` or token).
pub fn invalid_setup(message: String) -> RpcError {
    RpcError::new(code::INTERNAL_ERROR, message)
}

fn unreachable(target: &Target, error: &Error, cause: &str) -> RpcError {
    transport_error(
        format!(
            "cannot reach the sandbox-agent runtime at {}: {cause}; is `sandbox-agent server` \
             running there?",
            target.url
        ),
        error,
    )
}

fn token_message(target: &Target) -> String {
    if target.has_token {
        "the runtime rejected the token (401); pass the right one with --token or \
         SANDBOX_AGENT_TOKEN"
            .to_owned()
    } else {
        "the runtime requires a token (401); pass --token or set SANDBOX_AGENT_TOKEN".to_owned()
    }
}

fn connection_gone(target: &Target, problem: Option<&Problem>) -> String {
    format!(
        "the runtime at {} no longer knows this connection (404){}; it was closed or the \
         runtime restarted: restart the agent",
        target.url,
        detail_suffix(problem)
    )
}

/// `urn:sandbox-agent:error:unknown-agent` → `unknown-agent`.
fn problem_kind(problem: &Problem) -> &str {
    problem
        .problem_type
        .rsplit(':')
        .next()
        .unwrap_or(problem.problem_type.as_str())
}

fn detail_suffix(problem: Option<&Problem>) -> String {
    match problem.and_then(|p| p.detail.as_deref().or(p.title.as_deref())) {
        Some(detail) => format!(": {detail}"),
        None => String::new(),
    }
}

fn http_error(message: String, status: u16, problem: Option<&Problem>) -> RpcError {
    let mut data = Map::new();
    data.insert("httpStatus".to_owned(), status.into());
    if let Some(problem) = problem.and_then(|p| serde_json::to_value(p).ok()) {
        data.insert("problem".to_owned(), problem);
    }
    RpcError::new(code::INTERNAL_ERROR, message).with_data(Value::Object(data))
}

fn transport_error(message: String, error: &Error) -> RpcError {
    RpcError::new(code::INTERNAL_ERROR, message)
        .with_data(json!({ "transportError": error.to_string() }))
}

/// The innermost cause of an error chain, which names what actually
/// happened ("connection refused") rather than the request it happened to.
fn cause_text(error: &(dyn std::error::Error + 'static)) -> String {
    let mut current = error;
    while let Some(source) = current.source() {
        if let Some(io) = source.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::ConnectionRefused
        {
            return "connection refused".to_owned();
        }
        current = source;
    }
    current.to_string()
}

fn error_cause(error: &Error) -> String {
    match error {
        Error::Request(cause) => cause_text(cause),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;

    fn target(has_token: bool) -> Target {
        Target {
            url: "http://127.0.0.1:2468".into(),
            agent: "mock".into(),
            has_token,
        }
    }

    fn http(status: u16, kind: &str, detail: &str) -> Error {
        Error::Http(HttpFailure {
            status: StatusCode::from_u16(status).unwrap_or(StatusCode::IM_A_TEAPOT),
            problem: Some(Box::new(Problem {
                problem_type: format!("urn:sandbox-agent:error:{kind}"),
                title: None,
                status: Some(status),
                detail: Some(detail.into()),
                instance: None,
                extensions: Map::new(),
            })),
        })
    }

    #[test]
    fn a_rejected_token_is_fatal_and_says_how_to_pass_one() {
        let diagnosis = post_failure(&http(401, "unauthorized", "bad token"), &target(true), true);
        assert!(diagnosis.fatal);
        assert!(diagnosis.error.message.contains("rejected the token (401)"));
        assert!(diagnosis.error.message.contains("--token"));
        assert_eq!(
            diagnosis
                .error
                .data
                .as_ref()
                .map(|d| d["httpStatus"].clone()),
            Some(401.into())
        );
        let diagnosis = post_failure(&http(401, "unauthorized", "x"), &target(false), false);
        assert!(diagnosis.error.message.contains("SANDBOX_AGENT_TOKEN"));
    }

    #[test]
    fn other_problems_carry_status_and_detail_and_fail_one_request() {
        let diagnosis = post_failure(
            &http(
                404,
                "unknown-agent",
                "no agent \"nope\"; known agents: mock",
            ),
            &target(false),
            false,
        );
        assert!(!diagnosis.fatal);
        assert!(
            diagnosis.error.message.contains("known agents: mock"),
            "{:?}",
            diagnosis.error
        );
        assert!(diagnosis.error.message.contains("--agent"));
        let data = diagnosis.error.data.unwrap_or_default();
        assert_eq!(data["httpStatus"], 404);
        assert_eq!(
            data["problem"]["type"],
            "urn:sandbox-agent:error:unknown-agent"
        );

        let diagnosis = post_failure(
            &http(400, "invalid-request", "bad params"),
            &target(false),
            true,
        );
        assert!(!diagnosis.fatal);
        assert_eq!(
            diagnosis.error.message,
            "the runtime refused the request: HTTP 400 (invalid-request): bad params"
        );
        let gone = post_failure(
            &http(404, "unknown-connection", "gone"),
            &target(false),
            true,
        );
        assert!(gone.fatal);
    }

    #[test]
    fn a_lost_stream_names_the_runtime_and_the_last_cause() {
        let error = Error::StreamLost {
            attempts: 3,
            last: Box::new(Error::EventStream("boom".into())),
        };
        let rpc = stream_failure(&error, &target(false));
        assert!(
            rpc.message.contains("3 reconnect attempts failed"),
            "{}",
            rpc.message
        );
        assert!(rpc.message.contains("http://127.0.0.1:2468"));
        let rpc = stream_failure(&http(404, "unknown-connection", "gone"), &target(false));
        assert!(rpc.message.contains("no longer knows this connection"));
    }
}
