//! What the bridge does with one line from the editor, and the JSON-RPC
//! lines it writes on its own. Pure: no I/O.
//!
//! Editor messages are forwarded as the editor wrote them, except that
//! `initialize` and `session/new` get the bridge's agent in
//! `params._meta["sandboxagent.dev"].agent` (the runtime reads the agent
//! from there: research/contract.md, "Transport: /v2/rpc"). Lines that are
//! not a JSON-RPC message are
//! answered here, as JSON-RPC 2.0 section 5.1 says: `-32700` for text that
//! is not JSON, `-32600` for JSON that is not a request, notification or
//! response.

use acp_runtime::protocol::{self, Envelope, EnvelopeError, Kind, RpcError, code, method};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// JSON-RPC "parse error": the line is not JSON (JSON-RPC 2.0 section 5.1).
pub const PARSE_ERROR: i64 = -32700;

/// What to do with one line the editor wrote.
#[derive(Debug, PartialEq, Eq)]
pub enum EditorLine {
    /// An empty (or all-whitespace) line: nothing to do.
    Blank,
    /// POST `body` to the runtime. `request` is set for a request, whose
    /// answer the editor waits for.
    Forward {
        /// The message to POST (one JSON object, one line).
        body: String,
        /// The request's raw id and method; `None` for notifications and
        /// responses.
        request: Option<RequestInfo>,
        /// The method of a request or notification (`None` for an answer
        /// to the agent), for logs.
        method: Option<String>,
    },
    /// Write this line (a JSON-RPC error response) back to the editor;
    /// nothing goes to the runtime.
    Reject(String),
}

/// A request the editor sent and waits an answer for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestInfo {
    /// The id as the editor wrote it (raw JSON text).
    pub id: String,
    /// The method, for logs.
    pub method: String,
}

/// Reads one line from the editor (without its newline) and decides what
/// to do with it; `agent` is the bridge's `--agent`.
pub fn read_editor_line(line: &[u8], agent: &str) -> EditorLine {
    if line.iter().all(u8::is_ascii_whitespace) {
        return EditorLine::Blank;
    }
    let Ok(text) = std::str::from_utf8(line) else {
        return EditorLine::Reject(error_line(
            None,
            &RpcError::new(PARSE_ERROR, "Parse error: the line is not UTF-8"),
        ));
    };
    let (envelope, kind) = match Envelope::parse(line, true) {
        Ok(parsed) => parsed,
        Err(error) => return EditorLine::Reject(invalid_line(line, &error)),
    };
    let request = match (kind, envelope.id) {
        (Kind::Request, Some(id)) => Some(RequestInfo {
            id: id.get().to_owned(),
            method: envelope.method().to_owned(),
        }),
        _ => None,
    };
    let body = match (kind, envelope.method(), envelope.id) {
        (Kind::Request, method::INITIALIZE | method::SESSION_NEW, Some(id)) => {
            with_agent(id, envelope.method(), envelope.params, agent)
                .unwrap_or_else(|| text.to_owned())
        }
        _ => text.to_owned(),
    };
    let method = envelope.method.as_deref().map(str::to_owned);
    EditorLine::Forward {
        body,
        request,
        method,
    }
}

/// The answer to a line [`Envelope::parse`] refused: `-32700` when it is
/// not JSON at all, `-32600` (with the id, when one can be read) when it
/// is JSON but not a JSON-RPC message.
fn invalid_line(line: &[u8], error: &EnvelopeError) -> String {
    let is_json = serde_json::from_slice::<serde::de::IgnoredAny>(line).is_ok();
    if !is_json {
        let detail = serde_json::from_slice::<serde::de::IgnoredAny>(line)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        return error_line(
            None,
            &RpcError::new(PARSE_ERROR, format!("Parse error: {detail}")),
        );
    }
    #[derive(serde::Deserialize)]
    struct IdOnly<'a> {
        #[serde(borrow)]
        id: Option<&'a RawValue>,
    }
    let id = serde_json::from_slice::<IdOnly<'_>>(line)
        .ok()
        .and_then(|envelope| envelope.id)
        .filter(|id| matches!(id.get().as_bytes().first(), Some(b'"' | b'-' | b'0'..=b'9')));
    error_line(
        id,
        &RpcError::new(code::INVALID_REQUEST, format!("Invalid Request: {error}")),
    )
}

/// The request rebuilt with `agent` in `params._meta["sandboxagent.dev"]`,
/// other `_meta` and namespace keys kept. An agent the editor named there
/// is replaced (logged at debug): the bridge serves one agent. `None` when
/// params is not an object (the runtime then refuses the request itself,
/// with a problem naming what is missing).
fn with_agent(
    id: &RawValue,
    method: &str,
    params: Option<&RawValue>,
    agent: &str,
) -> Option<String> {
    let mut params: Value = match params {
        Some(raw) => serde_json::from_str(raw.get()).ok()?,
        None => Value::Object(Map::new()),
    };
    if let Some(named) = ext_methods::meta::read(&params)
        .and_then(|namespace| namespace.get("agent"))
        .filter(|named| named.as_str() != Some(agent))
    {
        tracing::debug!(%named, agent, method, "the editor named another agent; using the bridge's");
    }
    let mut entries = Map::new();
    entries.insert("agent".to_owned(), Value::String(agent.to_owned()));
    if !ext_methods::meta::inject(&mut params, entries) {
        return None;
    }
    let params = protocol::raw(&params);
    String::from_utf8(protocol::request_line(id, method, Some(&params))).ok()
}

/// A JSON-RPC error response line for the request with raw id `id` (`null`
/// when `None`).
pub fn error_line(id: Option<&RawValue>, error: &RpcError) -> String {
    let id = id.unwrap_or(RawValue::NULL);
    String::from_utf8_lossy(&protocol::error_response_line(id, error)).into_owned()
}

/// [`error_line`] for a raw id text kept from an earlier message.
pub fn error_line_for(id: &str, error: &RpcError) -> String {
    match RawValue::from_string(id.to_owned()) {
        Ok(id) => error_line(Some(&id), error),
        Err(_) => error_line(None, error),
    }
}

/// What a message from the runtime is, as far as the bridge cares.
#[derive(Debug, PartialEq, Eq)]
pub enum RuntimeMessage {
    /// A response to a request of the editor; the raw id text.
    Response(String),
    /// A notification; its method.
    Notification(String),
    /// Anything else (an agent request, or text that does not parse).
    Other,
}

/// Classifies one message from the runtime (parsed once, members raw).
pub fn read_runtime_message(message: &str) -> RuntimeMessage {
    match Envelope::parse(message.as_bytes(), false) {
        Ok((envelope, Kind::Response)) => match envelope.id {
            Some(id) => RuntimeMessage::Response(id.get().to_owned()),
            None => RuntimeMessage::Other,
        },
        Ok((envelope, Kind::Notification)) => {
            RuntimeMessage::Notification(envelope.method().to_owned())
        }
        _ => RuntimeMessage::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn forwarded(line: &str) -> (Value, Option<RequestInfo>) {
        match read_editor_line(line.as_bytes(), "mock") {
            EditorLine::Forward { body, request, .. } => {
                (serde_json::from_str(&body).unwrap_or(Value::Null), request)
            }
            other => panic!("not forwarded: {other:?}"),
        }
    }

    fn rejected(line: &str) -> Value {
        match read_editor_line(line.as_bytes(), "mock") {
            EditorLine::Reject(answer) => serde_json::from_str(&answer).unwrap_or(Value::Null),
            other => panic!("not rejected: {other:?}"),
        }
    }

    #[test]
    fn initialize_and_session_new_get_the_agent_and_keep_other_meta() {
        let (body, request) = forwarded(
            r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1,"_meta":{"zed.dev":{"x":1},"sandboxagent.dev":{"variant":"v"}}}}"#,
        );
        assert_eq!(
            body,
            json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1,
                "_meta":{"zed.dev":{"x":1},"sandboxagent.dev":{"variant":"v","agent":"mock"}}}})
        );
        assert_eq!(
            request,
            Some(RequestInfo {
                id: "0".into(),
                method: "initialize".into()
            })
        );

        let (body, _) = forwarded(
            r#"{"jsonrpc":"2.0","id":"n","method":"session/new","params":{"cwd":"/w","mcpServers":[]}}"#,
        );
        assert_eq!(body["params"]["_meta"]["sandboxagent.dev"]["agent"], "mock");
        assert_eq!(body["params"]["cwd"], "/w");
        assert_eq!(body["id"], "n");

        // The editor's own choice loses: the bridge serves one agent.
        let (body, _) = forwarded(
            r#"{"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w","_meta":{"sandboxagent.dev":{"agent":"codex"}}}}"#,
        );
        assert_eq!(body["params"]["_meta"]["sandboxagent.dev"]["agent"], "mock");

        // No params at all: created.
        let (body, _) = forwarded(r#"{"jsonrpc":"2.0","id":1,"method":"initialize"}"#);
        assert_eq!(body["params"]["_meta"]["sandboxagent.dev"]["agent"], "mock");
    }

    #[test]
    fn ids_keep_their_exact_text() {
        let line = r#"{"jsonrpc":"2.0","id":9007199254740993,"method":"initialize","params":{}}"#;
        let EditorLine::Forward { body, request, .. } = read_editor_line(line.as_bytes(), "mock")
        else {
            panic!("not forwarded");
        };
        assert!(body.contains(r#""id":9007199254740993"#), "{body}");
        assert_eq!(request.map(|r| r.id).as_deref(), Some("9007199254740993"));
    }

    #[test]
    fn other_messages_are_forwarded_byte_for_byte() {
        for line in [
            r#"{"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{"sessionId":"s","prompt":[]}}"#,
            r#"{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"s"}}"#,
            r#"{"jsonrpc":"2.0","id":0,"result":{"outcome":{"outcome":"selected","optionId":"allow-once"}}}"#,
        ] {
            let EditorLine::Forward { body, .. } = read_editor_line(line.as_bytes(), "mock") else {
                panic!("not forwarded: {line}");
            };
            assert_eq!(body, line);
        }
        let (_, request) = forwarded(r#"{"jsonrpc":"2.0","method":"session/cancel","params":{}}"#);
        assert_eq!(request, None, "a notification waits for nothing");
    }

    #[test]
    fn lines_that_are_not_json_rpc_are_answered_here() {
        let answer = rejected("this is not json");
        assert_eq!(answer["id"], Value::Null);
        assert_eq!(answer["error"]["code"], PARSE_ERROR);
        assert_eq!(
            rejected(r#"{"jsonrpc":"2.0","id":1,"#)["error"]["code"],
            PARSE_ERROR
        );

        let answer = rejected("[1,2]");
        assert_eq!(answer["error"]["code"], code::INVALID_REQUEST);
        let answer = rejected(r#"{"jsonrpc":"2.0","id":5}"#);
        assert_eq!(answer["error"]["code"], code::INVALID_REQUEST);
        assert_eq!(answer["id"], 5, "the id is kept when it can be read");
        let answer = rejected(r#"{"id":"x","method":"m"}"#);
        assert_eq!(answer["id"], "x");
        assert!(
            answer["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("2.0")),
            "{answer}"
        );
        assert_eq!(
            read_editor_line(b"  \t", "mock"),
            EditorLine::Blank,
            "blank lines are skipped"
        );
        let EditorLine::Reject(answer) = read_editor_line(b"\xff\xfe", "mock") else {
            panic!("bytes that are not UTF-8 were forwarded");
        };
        assert!(answer.contains("-32700"), "{answer}");
    }

    #[test]
    fn responses_and_notifications_are_recognised() {
        assert_eq!(
            read_runtime_message(r#"{"jsonrpc":"2.0","id":"a","result":{}}"#),
            RuntimeMessage::Response(r#""a""#.into())
        );
        assert_eq!(
            read_runtime_message(r#"{"jsonrpc":"2.0","id":1,"method":"m"}"#),
            RuntimeMessage::Other,
            "an agent request"
        );
        assert_eq!(
            read_runtime_message(r#"{"jsonrpc":"2.0","method":"session/update","params":{}}"#),
            RuntimeMessage::Notification("session/update".into())
        );
        let line = error_line_for("9007199254740993", &RpcError::new(-1, "m"));
        assert!(line.contains(r#""id":9007199254740993"#), "{line}");
    }
}
