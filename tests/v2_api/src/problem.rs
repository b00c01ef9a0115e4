//! RFC 9457 problem details, as research/contract.md ("Problem types")
//! defines them.

use serde_json::Value;

use crate::api::Reply;

/// Prefix of every problem `type`.
pub const PROBLEM_TYPE_PREFIX: &str = "urn:sandbox-agent:error:";

/// Asserts that `reply` is a problem of `status` and `kind`:
/// `Content-Type: application/problem+json`, a JSON object with
/// `type = "urn:sandbox-agent:error:<kind>"`, `status` equal to the HTTP
/// status, and non-empty string `title` and `detail`. Returns the document.
pub fn assert_problem(reply: &Reply, status: u16, kind: &str) -> Value {
    assert_eq!(
        reply.status.as_u16(),
        status,
        "unexpected status: {reply:?}"
    );
    let content_type = reply.header("content-type").unwrap_or_default();
    assert!(
        content_type
            .trim()
            .to_ascii_lowercase()
            .starts_with("application/problem+json"),
        "a {status} must be application/problem+json: {reply:?}"
    );
    let doc = reply.json();
    assert_eq!(
        doc["type"].as_str(),
        Some(format!("{PROBLEM_TYPE_PREFIX}{kind}").as_str()),
        "problem type: {reply:?}"
    );
    assert_eq!(
        doc["status"].as_u64(),
        Some(u64::from(status)),
        "problem status: {reply:?}"
    );
    for field in ["title", "detail"] {
        assert!(
            doc[field].as_str().is_some_and(|s| !s.trim().is_empty()),
            "problem `{field}` missing or empty: {reply:?}"
        );
    }
    doc
}

/// The problem's `title` and `detail` joined, for "mentions X" checks.
pub fn problem_text(doc: &Value) -> String {
    format!(
        "{} {}",
        doc["title"].as_str().unwrap_or_default(),
        doc["detail"].as_str().unwrap_or_default()
    )
}
