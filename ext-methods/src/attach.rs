//! Several clients on one session (research/contract.md,
//! "`_sandboxagent/session/attach`"): the params and result of
//! `_sandboxagent/session/attach`, the role a connection has on a session,
//! the error an observer gets, and the `_sandboxagent/request/resolved`
//! notification. After ACP's multi-client attach proposal (RFD PR #533).

use crate::types::ListModelsResult;
use agent_client_protocol::v1::schema::{SessionConfigOption, SessionModeState};
use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

/// JSON-RPC error code of a request an observer may not send (`session/prompt`,
/// `session/set_mode`, `session/set_model`, `session/set_config_option`,
/// `_sandboxagent/session/set_metadata`, `_sandboxagent/session/terminate`);
/// `data` is `{sessionId, role: "observer", method}`.
pub const OBSERVER_FORBIDDEN: i64 = -32003;

/// What a connection attached to a session may do.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Prompts, cancels, answers agent requests; a session may have several.
    #[default]
    Controller,
    /// Receives every session update, no agent requests; may not prompt,
    /// cancel or change the session ([`OBSERVER_FORBIDDEN`]).
    Observer,
}

impl Role {
    /// The wire name (`controller`, `observer`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Controller => "controller",
            Self::Observer => "observer",
        }
    }
}

/// Which part of the session's history an attach replays.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum HistoryPolicy {
    /// `"full"`: from the first event the log still holds.
    #[default]
    Full,
    /// `"none"`: live updates only.
    None,
    /// `{"sinceOffset": N}`: from event-log offset `N` (the `nextOffset` of
    /// an earlier attach, or of `GET /v2/sessions/{id}/events`).
    SinceOffset(u64),
}

impl HistoryPolicy {
    /// The first event-log offset to replay; `None`: nothing (an offset
    /// past the log's end replays what is recorded from there on).
    pub fn start(self) -> Option<u64> {
        match self {
            Self::Full => Some(0),
            Self::None => None,
            Self::SinceOffset(offset) => Some(offset),
        }
    }
}

impl Serialize for HistoryPolicy {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Full => serializer.serialize_str("full"),
            Self::None => serializer.serialize_str("none"),
            Self::SinceOffset(offset) => {
                serde_json::json!({ "sinceOffset": offset }).serialize(serializer)
            }
        }
    }
}

impl<'de> Deserialize<'de> for HistoryPolicy {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        const EXPECTED: &str =
            "historyPolicy must be \"full\", \"none\" or {\"sinceOffset\": <non-negative integer>}";
        match Value::deserialize(deserializer)? {
            Value::String(name) if name == "full" => Ok(Self::Full),
            Value::String(name) if name == "none" => Ok(Self::None),
            Value::Object(object) if object.len() == 1 => object
                .get("sinceOffset")
                .and_then(Value::as_u64)
                .map(Self::SinceOffset)
                .ok_or_else(|| D::Error::custom(EXPECTED)),
            _ => Err(D::Error::custom(EXPECTED)),
        }
    }
}

/// Params of `_sandboxagent/session/attach`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AttachParams {
    /// A session live on this runtime, of the connection's agent.
    pub session_id: String,
    /// Default `controller`.
    #[serde(default)]
    pub role: Role,
    /// Default `full`.
    #[serde(default)]
    pub history_policy: HistoryPolicy,
}

/// Result of `_sandboxagent/session/attach` (the same hints a `session/load`
/// answer carries, from the session's inventory entry, plus where the
/// replayed history ended).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachResult {
    /// The session.
    pub session_id: String,
    /// The role the connection now has.
    pub role: Role,
    /// The session's modes, as its agent last reported them (ACP schema).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modes: Option<SessionModeState>,
    /// The session's config options, as its agent last reported them (ACP
    /// schema).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_options: Option<Vec<SessionConfigOption>>,
    /// The models of agents that predate config options, and the current one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<ListModelsResult>,
    /// Event-log offset just past the replayed history: every event at or
    /// after it reaches the connection live. Pass it as `sinceOffset` to
    /// attach again without a duplicate.
    pub next_offset: u64,
    /// Messages the replay put on the connection's stream (gap markers and
    /// `user_message_chunk`s included), before this answer.
    pub replayed: u64,
}

/// Params of `_sandboxagent/request/resolved`: an agent request this
/// connection received is no longer open, so a UI removes its question.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestResolved {
    /// The request's session.
    pub session_id: String,
    /// The agent's id of the request, as in the request.
    pub request_id: Value,
    /// How it ended: for `session/request_permission` the winning answer's
    /// ACP `RequestPermissionOutcome` (`{"outcome": "selected", "optionId"}`
    /// or `{"outcome": "cancelled"}`); for other requests the winning
    /// answer's `result`, or `{"outcome": "cancelled"}` when the runtime
    /// answered it because the session ended, or `{"outcome": "error"}` for
    /// an error answer.
    pub outcome: Value,
}

/// Params of the gap marker (`_sandboxagent/stream/gap`) at the start of an
/// attach replay whose first events the log no longer holds: `from` and `to`
/// are event-log offsets of `sessionId` (a stream's own gap marker has no
/// `sessionId`, and its `from`/`to` are event ids).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HistoryGap {
    /// First missing offset.
    pub from: u64,
    /// Last missing offset.
    pub to: u64,
    /// The session whose log has the gap.
    pub session_id: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn history_policy_forms() {
        let parse = |v: Value| serde_json::from_value::<HistoryPolicy>(v);
        assert_eq!(parse(json!("full")).ok(), Some(HistoryPolicy::Full));
        assert_eq!(parse(json!("none")).ok(), Some(HistoryPolicy::None));
        assert_eq!(
            parse(json!({"sinceOffset": 7})).ok(),
            Some(HistoryPolicy::SinceOffset(7))
        );
        for bad in [
            json!("pending_only"),
            json!({"sinceOffset": -1}),
            json!({"sinceOffset": 1, "x": 2}),
            json!(3),
        ] {
            let error = parse(bad).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(error.contains("historyPolicy must be"), "{error}");
        }
        let params: AttachParams =
            serde_json::from_value(json!({"sessionId": "s"})).expect("defaults");
        assert_eq!(
            (params.role, params.history_policy),
            (Role::Controller, HistoryPolicy::Full)
        );
        assert_eq!(
            serde_json::to_value(HistoryPolicy::SinceOffset(3)).ok(),
            Some(json!({"sinceOffset": 3}))
        );
    }
}
