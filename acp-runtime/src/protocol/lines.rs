//! Building JSON-RPC lines: requests with rewritten ids, notifications,
//! responses and errors ([`RpcError`]), newline-free for stdio and SSE.

use serde::Serialize;
use serde_json::value::RawValue;

/// Replaces raw CR and LF bytes with spaces, in place.
///
/// In valid JSON these bytes can only be whitespace between tokens (inside
/// strings they must be escaped), so this keeps the value identical while
/// making it safe for newline-delimited stdio framing and for an SSE `data:`
/// line. Call it only on bytes that parsed as JSON.
pub fn flatten_newlines(bytes: &mut [u8]) {
    for byte in bytes.iter_mut() {
        if matches!(*byte, b'\n' | b'\r') {
            *byte = b' ';
        }
    }
}

/// True when `bytes` contain a CR or LF.
pub fn has_newline(bytes: &[u8]) -> bool {
    memchr::memchr2(b'\n', b'\r', bytes).is_some()
}

/// `json` as one line: borrowed when it has no CR or LF (the common case),
/// else a copy with them flattened ([`flatten_newlines`]). Both directions
/// need it: newline-delimited stdio toward the agent, SSE `data:` lines
/// toward the client. Call it only on bytes that parsed as JSON.
pub fn one_line(json: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    if has_newline(json) {
        let mut copy = json.to_vec();
        flatten_newlines(&mut copy);
        std::borrow::Cow::Owned(copy)
    } else {
        std::borrow::Cow::Borrowed(json)
    }
}

#[derive(Serialize)]
struct OutNotification<'a, P: Serialize> {
    jsonrpc: &'static str,
    method: &'a str,
    params: P,
}

/// A JSON-RPC error object (JSON-RPC 2.0 section 5.1).
#[derive(Debug, Clone, Serialize)]
pub struct RpcError {
    /// Error code, see [`code`].
    pub code: i64,
    /// One-sentence description.
    pub message: String,
    /// Structured details, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
}

impl RpcError {
    /// An error with `code` and `message` and no data.
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            data: None,
        }
    }

    /// Adds `data`.
    pub fn with_data(mut self, data: serde_json::Value) -> Self {
        self.data = Some(data);
        self
    }
}

/// Serializes a request `{jsonrpc, id, method, params}` as one line (no newline).
pub fn request_line(id: &RawValue, method: &str, params: Option<&RawValue>) -> Vec<u8> {
    let mut line = request_head(id.get().len(), method, params);
    line.extend_from_slice(id.get().as_bytes());
    request_tail(line, method, params)
}

/// [`request_line`] with the integer id `id` (the ids the runtime gives
/// the requests it forwards), written without a raw value of its own; the
/// line has room for the newline that ends it on the agent's stdin.
pub fn agent_request_line(id: i64, method: &str, params: Option<&RawValue>) -> Vec<u8> {
    let mut line = request_head(20, method, params);
    // Writing an integer to a `Vec` cannot fail.
    let _ = serde_json::to_writer(&mut line, &id);
    request_tail(line, method, params)
}

/// A request line's buffer, sized for an id of `id_len` bytes, `method`
/// and `params` (and a newline), holding everything before the id.
fn request_head(id_len: usize, method: &str, params: Option<&RawValue>) -> Vec<u8> {
    const HEAD: &[u8] = br#"{"jsonrpc":"2.0","id":"#;
    let params_len = params.map_or(0, |params| params.get().len());
    let mut line = Vec::with_capacity(HEAD.len() + id_len + method.len() + params_len + 24);
    line.extend_from_slice(HEAD);
    line
}

/// A request line after its id: the method (escaped as a JSON string) and
/// the params as written (left out when absent).
fn request_tail(mut line: Vec<u8>, method: &str, params: Option<&RawValue>) -> Vec<u8> {
    line.extend_from_slice(br#","method":"#);
    // Writing a string to a `Vec` cannot fail.
    let _ = serde_json::to_writer(&mut line, method);
    if let Some(params) = params {
        line.extend_from_slice(br#","params":"#);
        line.extend_from_slice(params.get().as_bytes());
    }
    line.push(b'}');
    line
}

/// Serializes a notification `{jsonrpc, method, params}` as one line (no newline).
pub fn notification_line(method: &str, params: &impl Serialize) -> Vec<u8> {
    to_vec(&OutNotification {
        jsonrpc: "2.0",
        method,
        params,
    })
}

/// Serializes a response with `id` and a raw `result` or `error`.
pub fn response_line(
    id: &RawValue,
    result: Option<&RawValue>,
    error: Option<&RawValue>,
) -> Vec<u8> {
    const HEAD: &[u8] = br#"{"jsonrpc":"2.0","id":"#;
    let len = |value: Option<&RawValue>| value.map_or(0, |value| value.get().len() + 10);
    let mut line = Vec::with_capacity(HEAD.len() + id.get().len() + len(result) + len(error) + 2);
    line.extend_from_slice(HEAD);
    line.extend_from_slice(id.get().as_bytes());
    // `result`, then `error`, each when present, as written.
    for (name, value) in [(&br#","result":"#[..], result), (br#","error":"#, error)] {
        if let Some(value) = value {
            line.extend_from_slice(name);
            line.extend_from_slice(value.get().as_bytes());
        }
    }
    line.push(b'}');
    line
}

/// Serializes an error response with `id`.
pub fn error_response_line(id: &RawValue, error: &RpcError) -> Vec<u8> {
    let error = raw(error);
    response_line(id, None, Some(&error))
}

/// Serializes a success response with `id` and `result`.
pub fn result_response_line(id: &RawValue, result: &impl Serialize) -> Vec<u8> {
    let result = raw(result);
    response_line(id, Some(&result), None)
}

/// Serializes `value` to an owned raw JSON value.
pub fn raw(value: &impl Serialize) -> Box<RawValue> {
    // Serializing our own types to JSON cannot fail (string keys, no NaN floats);
    // fall back to `null` rather than panic.
    serde_json::value::to_raw_value(value).unwrap_or_else(|_| RawValue::NULL.to_owned())
}

fn to_vec(value: &impl Serialize) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_else(|_| b"null".to_vec())
}
