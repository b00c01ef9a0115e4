//! JSON-RPC 2.0 / ACP messages the tests send, and what the mock agent is
//! expected to answer (contract.md, "The mock agent").
//!
//! Messages are built as `serde_json::Value` on purpose: the tests must be
//! able to send exactly the bytes they want, including wrong ones.

use serde_json::{Value, json};

use crate::META_KEY;

/// A JSON-RPC request.
pub fn request(id: impl Into<Value>, method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id.into(), "method": method, "params": params})
}

/// A JSON-RPC notification (no `id`).
pub fn notification(method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "method": method, "params": params})
}

/// A JSON-RPC success response (the client answering an agent request).
pub fn response(id: Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// `{"sandboxagent.dev": {"agent": agent}}`, the `_meta` naming the agent.
pub fn agent_meta(agent: &str) -> Value {
    json!({ META_KEY: {"agent": agent} })
}

/// `initialize` params: protocol v1, no client capabilities, the agent in
/// `_meta`.
pub fn initialize_params(agent: &str) -> Value {
    json!({"protocolVersion": 1, "clientCapabilities": {}, "_meta": agent_meta(agent)})
}

/// `session/new` params: cwd `/tmp`, no MCP servers, the agent in `_meta`.
pub fn new_session_params(agent: &str) -> Value {
    json!({"cwd": "/tmp", "mcpServers": [], "_meta": agent_meta(agent)})
}

/// `session/prompt` params with one text content block.
pub fn prompt_params(session: &str, text: &str) -> Value {
    json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]})
}

/// The `session/cancel` notification for `session`.
pub fn cancel(session: &str) -> Value {
    notification("session/cancel", json!({"sessionId": session}))
}

/// The client's answer to `session/request_permission` selecting
/// `option_id` (e.g. `allow-once`, `reject-once`).
pub fn permission_answer(agent_request_id: Value, option_id: &str) -> Value {
    response(
        agent_request_id,
        json!({"outcome": {"outcome": "selected", "optionId": option_id}}),
    )
}

/// Splits `sentence` the way the mock agent streams it: one chunk per word,
/// each word followed by a space except the last.
pub fn word_chunks(sentence: &str) -> Vec<String> {
    let words: Vec<&str> = sentence.split_whitespace().collect();
    let last = words.len().saturating_sub(1);
    words
        .iter()
        .enumerate()
        .map(|(i, w)| {
            if i == last {
                (*w).to_owned()
            } else {
                format!("{w} ")
            }
        })
        .collect()
}

/// The mock agent's plain reply to a prompt `text`.
pub fn mock_reply(text: &str) -> String {
    format!("Hello from the mock agent. You said: {text}")
}

/// The `agent_message_chunk` texts of the mock's plain reply to `text`.
pub fn mock_reply_chunks(text: &str) -> Vec<String> {
    word_chunks(&mock_reply(text))
}

/// The `!slow N MS` chunk texts: `chunk-1 `, ..., `chunk-N `.
pub fn slow_chunks(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("chunk-{i} ")).collect()
}

/// The `stopReason` of a `session/prompt` response, if it has one.
pub fn stop_reason(response: &Value) -> Option<&str> {
    response["result"]["stopReason"].as_str()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_words_with_a_trailing_space_except_the_last() {
        assert_eq!(
            mock_reply_chunks("hi"),
            [
                "Hello ", "from ", "the ", "mock ", "agent. ", "You ", "said: ", "hi"
            ]
        );
        assert_eq!(
            word_chunks("Permission granted."),
            ["Permission ", "granted."]
        );
        assert_eq!(slow_chunks(2), ["chunk-1 ", "chunk-2 "]);
    }
}
