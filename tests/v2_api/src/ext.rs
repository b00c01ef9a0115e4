//! The `_sandboxagent/*` extension layer and the control plane
//! (research/contract.md, "Extension methods and control plane"): wire names,
//! readers for the `_meta["sandboxagent.dev"]` namespace, and JSON-RPC
//! result / error checks.
//!
//! The names are spelled out here rather than taken from the `ext-methods`
//! crate on purpose: the tests check the wire, not the server's constants.

use serde_json::{Value, json};

use crate::{META_KEY, acp};

/// `_sandboxagent/session/attach`.
pub const ATTACH: &str = "_sandboxagent/session/attach";
/// `_sandboxagent/session/detach`.
pub const DETACH: &str = "_sandboxagent/session/detach";
/// `_sandboxagent/session/terminate`.
pub const TERMINATE: &str = "_sandboxagent/session/terminate";
/// `_sandboxagent/session/list_models`.
pub const LIST_MODELS: &str = "_sandboxagent/session/list_models";
/// `_sandboxagent/session/set_metadata`.
pub const SET_METADATA: &str = "_sandboxagent/session/set_metadata";
/// `_sandboxagent/session/get`.
pub const SESSION_GET: &str = "_sandboxagent/session/get";
/// `_sandboxagent/agent/list`.
pub const AGENT_LIST: &str = "_sandboxagent/agent/list";
/// `_sandboxagent/session/list` (seed-era name of `session/list`).
pub const SESSION_LIST: &str = "_sandboxagent/session/list";
/// `_sandboxagent/agent/install` (as `POST /v2/agents/{agent}/install`).
pub const AGENT_INSTALL: &str = "_sandboxagent/agent/install";
/// `_sandboxagent/fs/list_entries`.
pub const FS_LIST_ENTRIES: &str = "_sandboxagent/fs/list_entries";
/// `_sandboxagent/fs/stat`.
pub const FS_STAT: &str = "_sandboxagent/fs/stat";
/// `_sandboxagent/fs/mkdir`.
pub const FS_MKDIR: &str = "_sandboxagent/fs/mkdir";
/// `_sandboxagent/fs/move`.
pub const FS_MOVE: &str = "_sandboxagent/fs/move";
/// `_sandboxagent/fs/delete_entry`.
pub const FS_DELETE_ENTRY: &str = "_sandboxagent/fs/delete_entry";
/// `_sandboxagent/process/run`.
pub const PROCESS_RUN: &str = "_sandboxagent/process/run";
/// `_sandboxagent/process/start`.
pub const PROCESS_START: &str = "_sandboxagent/process/start";
/// `_sandboxagent/process/list`.
pub const PROCESS_LIST: &str = "_sandboxagent/process/list";
/// `_sandboxagent/process/get`.
pub const PROCESS_GET: &str = "_sandboxagent/process/get";
/// `_sandboxagent/process/signal`.
pub const PROCESS_SIGNAL: &str = "_sandboxagent/process/signal";
/// `_sandboxagent/process/input`.
pub const PROCESS_INPUT: &str = "_sandboxagent/process/input";
/// `_sandboxagent/process/resize`.
pub const PROCESS_RESIZE: &str = "_sandboxagent/process/resize";
/// The process methods, sorted (absent with `--no-processes`).
pub const PROCESS_METHODS: [&str; 7] = [
    PROCESS_GET,
    PROCESS_INPUT,
    PROCESS_LIST,
    PROCESS_RESIZE,
    PROCESS_RUN,
    PROCESS_SIGNAL,
    PROCESS_START,
];
/// `_sandboxagent/session/ended` (notification).
pub const SESSION_ENDED: &str = "_sandboxagent/session/ended";

/// Every extension method research/contract.md defines, sorted
/// ("Extension methods and control plane").
pub const ALL_METHODS: [&str; 21] = [
    AGENT_INSTALL,
    AGENT_LIST,
    FS_DELETE_ENTRY,
    FS_LIST_ENTRIES,
    FS_MKDIR,
    FS_MOVE,
    FS_STAT,
    PROCESS_GET,
    PROCESS_INPUT,
    PROCESS_LIST,
    PROCESS_RESIZE,
    PROCESS_RUN,
    PROCESS_SIGNAL,
    PROCESS_START,
    ATTACH,
    DETACH,
    SESSION_GET,
    SESSION_LIST,
    LIST_MODELS,
    SET_METADATA,
    TERMINATE,
];

/// JSON-RPC "method not found".
pub const METHOD_NOT_FOUND: i64 = -32601;
/// JSON-RPC "invalid params".
pub const INVALID_PARAMS: i64 = -32602;
/// ACP "resource not found": unknown or ended session.
pub const RESOURCE_NOT_FOUND: i64 = -32002;

/// `{"sessionId": session}`.
pub fn session_ref(session: &str) -> Value {
    json!({ "sessionId": session })
}

/// `session/new` params in `cwd` whose `_meta["sandboxagent.dev"]` is
/// `{"agent": agent}` plus the members of `extra` (an object).
pub fn new_session_params(agent: &str, cwd: &str, extra: &Value) -> Value {
    let mut params = acp::new_session_params(agent);
    params["cwd"] = json!(cwd);
    if let (Some(namespace), Some(extra)) =
        (params["_meta"][META_KEY].as_object_mut(), extra.as_object())
    {
        for (key, value) in extra {
            namespace.insert(key.clone(), value.clone());
        }
    }
    params
}

/// `holder._meta["sandboxagent.dev"]` (`Null` when absent).
pub fn namespace(holder: &Value) -> &Value {
    holder
        .get("_meta")
        .and_then(|meta| meta.get(META_KEY))
        .unwrap_or(&Value::Null)
}

/// The `result` of a JSON-RPC response.
///
/// # Panics
/// If the response is an error or has no result.
pub fn expect_result(response: &Value) -> &Value {
    assert!(
        response.get("error").is_none(),
        "expected a result, got an error: {response}"
    );
    response
        .get("result")
        .unwrap_or_else(|| panic!("no result in {response}"))
}

/// The `error` object of a JSON-RPC response, checked to carry `code`.
///
/// # Panics
/// If the response has a result, or an error with another code.
pub fn expect_error(response: &Value, code: i64) -> &Value {
    assert!(
        response.get("result").is_none(),
        "expected JSON-RPC error {code}, got a result: {response}"
    );
    let error = &response["error"];
    assert_eq!(error["code"].as_i64(), Some(code), "error code: {response}");
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "a JSON-RPC error has a message: {response}"
    );
    error
}

/// The `sessionId`s of a `session/list` result or `GET /v2/sessions` body.
pub fn session_ids(list: &Value) -> Vec<String> {
    list["sessions"]
        .as_array()
        .unwrap_or_else(|| panic!("no sessions array in {list}"))
        .iter()
        .map(|s| {
            s["sessionId"]
                .as_str()
                .unwrap_or_else(|| panic!("entry without sessionId: {s}"))
                .to_owned()
        })
        .collect()
}

/// Whether `text` looks like an RFC 3339 UTC timestamp
/// (`YYYY-MM-DDTHH:MM:SS[.fff]Z` or with an offset).
pub fn is_rfc3339(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.len() >= 20
        && bytes[4] == b'-'
        && bytes[7] == b'-'
        && bytes[10] == b'T'
        && bytes[13] == b':'
        && bytes[16] == b':'
        && (text.ends_with('Z') || text[19..].contains(['+', '-']))
        && bytes[..4].iter().all(u8::is_ascii_digit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_and_params() {
        let params = new_session_params("mock", "/w", &json!({"variant": "x"}));
        assert_eq!(params["cwd"], "/w");
        assert_eq!(
            namespace(&params),
            &json!({"agent": "mock", "variant": "x"})
        );
        assert_eq!(namespace(&json!({})), &Value::Null);
    }

    #[test]
    fn rfc3339_shapes() {
        assert!(is_rfc3339("2026-01-01T00:00:00.123Z"));
        assert!(is_rfc3339("2026-01-01T00:00:00+02:00"));
        assert!(!is_rfc3339("yesterday"));
        assert!(!is_rfc3339("1767225600"));
    }

    #[test]
    fn all_methods_are_sorted() {
        let mut sorted = ALL_METHODS;
        sorted.sort_unstable();
        assert_eq!(sorted, ALL_METHODS);
    }
}
