//! What the runtime adds to an agent's JSON-RPC error answer to a client's
//! request (research/contract.md, "Agent errors: stderr and hint"):
//! `error.data["sandboxagent.dev"]` ([`AgentErrorDetails`]) with
//!
//! - `stderr`: the lines the agent wrote to stderr after the request was
//!   forwarded (one process serves many clients: never older lines), the
//!   newest 20 at most and 4 KiB in all, secrets of the server's
//!   environment masked;
//! - `hint`: on a failed `session/new` or `session/load` of a server that
//!   runs as root without `--agent-user`, why that may be the cause.
//!
//! Success answers cost nothing: a forwarded request keeps the stderr line
//! count (an atomic read), and only an error answer reads lines.

use super::secrets::{SECRETS, mask};
use super::stdio::StderrCapture;
use ext_methods::AgentErrorDetails;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::time::Duration;
use tokio::time::Instant;

/// Most stderr lines an error carries (the newest).
const MAX_LINES: usize = 20;
/// Most bytes of stderr text an error carries, entries summed (the
/// "lines dropped" entry included).
const MAX_BYTES: usize = 4 * 1024;
/// Stderr is read by a task of its own, so a line written just before the
/// error answer may not be captured when the answer is read: the answer
/// waits until no line came for this long …
const SETTLE_QUIET: Duration = Duration::from_millis(5);
/// … and never longer than this in all (research/decisions.md, "Agent
/// stderr in agent errors: the wait").
const SETTLE_MAX: Duration = Duration::from_millis(50);
/// The agent id of Claude Code in the built-in manifest.
const CLAUDE_AGENT: &str = "claude";

/// Waits until the stderr reader has caught up with what the agent wrote
/// before its answer, as far as that can be seen: until no line came for
/// [`SETTLE_QUIET`], at most [`SETTLE_MAX`]; at once when stderr closed.
pub(crate) async fn settle(capture: &StderrCapture) {
    let deadline = Instant::now() + SETTLE_MAX;
    let mut seen = capture.count();
    while !capture.is_closed() {
        let now = Instant::now();
        if now >= deadline {
            return;
        }
        tokio::time::sleep(SETTLE_QUIET.min(deadline - now)).await;
        let count = capture.count();
        if count == seen {
            return;
        }
        seen = count;
    }
}

/// The entry for an error answer of `agent` to a request forwarded when
/// `capture` had counted `mark` lines; with `hint`, the root hint.
pub(crate) fn details(
    agent: &str,
    capture: Option<&StderrCapture>,
    mark: u64,
    hint: bool,
) -> AgentErrorDetails {
    let stderr = capture.map_or_else(Vec::new, |capture| {
        let found = capture.lines_after(mark, MAX_LINES);
        excerpt(found.lines, found.left_out, &SECRETS)
    });
    let hint = hint.then(|| root_hint(agent, &stderr));
    AgentErrorDetails { stderr, hint }
}

/// `lines` (oldest first) masked and cut to [`MAX_BYTES`] from the newest
/// back; a first entry counts the lines left out (`left_out` and those
/// that did not fit). A newest line longer than the bound alone is cut.
fn excerpt(lines: Vec<String>, left_out: u64, secrets: &[String]) -> Vec<String> {
    let mut kept: Vec<String> = Vec::new();
    let mut bytes = 0;
    let mut dropped = left_out;
    // Room for the "lines dropped" entry, which is short.
    let budget = MAX_BYTES - dropped_entry(u64::MAX).len();
    let mut newest_first = lines.into_iter().rev();
    for line in newest_first.by_ref() {
        let line = mask(line, secrets);
        if bytes + line.len() <= budget {
            bytes += line.len();
            kept.push(line);
        } else {
            if kept.is_empty() {
                kept.push(cut(&line, budget));
            } else {
                dropped += 1;
            }
            break;
        }
    }
    dropped += newest_first.count() as u64;
    if dropped > 0 {
        kept.push(dropped_entry(dropped));
    }
    kept.reverse();
    kept
}

/// The first entry when `count` lines were left out.
fn dropped_entry(count: u64) -> String {
    let s = if count == 1 { "" } else { "s" };
    format!("… {count} earlier line{s} dropped")
}

/// The start of `line` in at most `max` bytes, ending in `…`.
fn cut(line: &str, max: usize) -> String {
    let mut end = max.saturating_sub('…'.len_utf8());
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &line[..end])
}

/// Whether running as root may be why the agent answered with `error`:
/// not when the agent said it needs authentication (ACP's `-32000`: codex
/// without a key, which runs as root well), where the root hint would
/// send the reader the wrong way.
pub(crate) fn may_be_root(error: &RawValue) -> bool {
    #[derive(serde::Deserialize)]
    struct Code {
        code: Option<i64>,
    }
    serde_json::from_str::<Code>(error.get()).map_or(true, |error| {
        error.code != Some(crate::protocol::code::AUTH_REQUIRED)
    })
}

/// The hint for a failed `session/new` or `session/load` of a server that
/// runs as root without `--agent-user`: Claude Code's refusal named when
/// the agent is Claude Code or its stderr mentions root.
fn root_hint(agent: &str, stderr: &[String]) -> String {
    let claude = agent == CLAUDE_AGENT
        || stderr
            .iter()
            .any(|line| line.to_ascii_lowercase().contains("root"));
    let refusal = if claude {
        "Claude Code refuses to run as root (and some other agents do too)"
    } else {
        "some agents refuse to run as root (Claude Code does)"
    };
    format!(
        "sandbox-agent runs as root and starts agents as root; {refusal}. Restart it with --agent-user USER (or SANDBOX_AGENT_AGENT_USER=USER, which `sandbox-agent prompt` passes to its own server) to run agents as that unprivileged user."
    )
}

/// The agent's error object `error` with `details` added to its `data`
/// (the rule of [`ext_methods::agent_error`]); unchanged when there is
/// nothing to add or it is not an object.
pub(crate) fn with_details(error: &RawValue, details: &AgentErrorDetails) -> Box<RawValue> {
    // An agent may not speak for the runtime: a `sandboxagent.dev` key of
    // its own in `data` (a forged stderr or hint) is dropped even when the
    // runtime has nothing to add. Cheap when absent: a substring test.
    let forged = error.get().contains(ext_methods::NAMESPACE);
    if details.is_empty() && !forged {
        return error.to_owned();
    }
    let Ok(mut object) = serde_json::from_str::<Map<String, Value>>(error.get()) else {
        return error.to_owned();
    };
    let mut data = object.remove("data");
    if let Some(Value::Object(fields)) = &mut data {
        fields.remove(ext_methods::NAMESPACE);
    }
    if details.is_empty() {
        if let Some(data) = data.filter(|d| !d.as_object().is_some_and(Map::is_empty)) {
            object.insert("data".to_owned(), data);
        }
    } else {
        object.insert("data".to_owned(), details.attach_to(data));
    }
    crate::protocol::raw(&object)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lines(count: usize, bytes: usize) -> Vec<String> {
        (1..=count)
            .map(|n| format!("{n:04}{}", "x".repeat(bytes.saturating_sub(4))))
            .collect()
    }

    #[test]
    fn an_excerpt_keeps_the_newest_lines_within_4_kib() {
        let few = excerpt(lines(3, 10), 0, &[]);
        assert_eq!(few, lines(3, 10));
        // Left out by the 20-line limit before: counted.
        let counted = excerpt(lines(20, 10), 5, &[]);
        assert_eq!(counted[0], "… 5 earlier lines dropped");
        assert_eq!(counted[1..], lines(20, 10)[..]);
        // 10 lines of 1000 bytes: the newest 4 fit.
        let big = excerpt(lines(10, 1000), 0, &[]);
        assert_eq!(
            big.len(),
            5,
            "{:?}",
            big.iter().map(|l| &l[..4]).collect::<Vec<_>>()
        );
        assert_eq!(big[0], "… 6 earlier lines dropped");
        assert!(big[1].starts_with("0007") && big[4].starts_with("0010"));
        assert!(big.iter().map(String::len).sum::<usize>() <= MAX_BYTES);
        // One line over the bound: its start.
        let huge = excerpt(vec!["é".repeat(5000)], 0, &[]);
        assert_eq!(huge.len(), 1);
        assert!(huge[0].len() <= MAX_BYTES && huge[0].ends_with('…'));
    }

    #[test]
    fn the_hint_names_claude_code_when_it_may_be_the_one() {
        let generic = root_hint("codex", &[]);
        assert!(
            generic.contains("some agents refuse to run as root"),
            "{generic}"
        );
        assert!(generic.contains("--agent-user USER"), "{generic}");
        for (agent, line) in [
            ("claude", "anything"),
            ("other", "cannot be used with root/sudo"),
        ] {
            let named = root_hint(agent, &[line.to_owned()]);
            assert!(
                named.contains("Claude Code refuses to run as root"),
                "{named}"
            );
        }
    }

    #[test]
    fn an_agents_own_runtime_key_is_dropped() {
        let nothing = AgentErrorDetails::default();
        let raw = |value: Value| RawValue::from_string(value.to_string()).expect("raw");
        let forged = raw(json!({"code": -32603, "message": "m",
            "data": {"sandboxagent.dev": {"hint": "curl … | sh"}, "mine": 1}}));
        let relayed: Value =
            serde_json::from_str(with_details(&forged, &nothing).get()).expect("json");
        assert_eq!(
            relayed,
            json!({"code": -32603, "message": "m", "data": {"mine": 1}})
        );
        let only = raw(json!({"code": 1, "message": "m", "data": {"sandboxagent.dev": {}}}));
        let relayed: Value =
            serde_json::from_str(with_details(&only, &nothing).get()).expect("json");
        assert_eq!(relayed, json!({"code": 1, "message": "m"}));
    }

    #[test]
    fn details_are_added_to_the_agents_data() {
        let details = AgentErrorDetails {
            stderr: vec!["oops".into()],
            hint: None,
        };
        let error = RawValue::from_string(r#"{"code":-32603,"message":"m","data":"text"}"#.into())
            .expect("json");
        let added: Value =
            serde_json::from_str(with_details(&error, &details).get()).expect("json");
        assert_eq!(
            added,
            json!({"code": -32603, "message": "m", "data": {"agent": "text", "sandboxagent.dev": {"stderr": ["oops"]}}})
        );
        let same = with_details(&error, &AgentErrorDetails::default());
        assert_eq!(same.get(), error.get());
    }
}
