//! Typed params and results of the extension methods, and the params of the
//! notifications the runtime sends
//! (research/contract.md, "Extension methods and control plane"). camelCase on
//! the wire, like ACP.

use crate::names::NAMESPACE;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Params that are wrong in a way serde cannot express (e.g. two forms given,
/// or none). Servers answer it with JSON-RPC invalid params (`-32602`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid params: {0}")]
pub struct ParamsError(pub String);

/// `{sessionId}`: params of `detach`, `terminate` and `session/get`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionRef {
    /// The session.
    pub session_id: String,
}

/// Result of `_sandboxagent/session/terminate`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TerminateResult {
    /// The session.
    pub session_id: String,
    /// The session had already ended before this call (terminate is idempotent).
    pub already_ended: bool,
}

/// Params of `_sandboxagent/session/list_models`: exactly one of `sessionId`
/// (the models of that session's agent, with its current model) or `agent`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListModelsParams {
    /// Models as seen by this session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// Models of this agent id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
}

/// What `list_models` asks about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelsTarget {
    /// A session id.
    Session(String),
    /// An agent id.
    Agent(String),
}

impl ListModelsParams {
    /// The one target named.
    ///
    /// # Errors
    /// [`ParamsError`] when both or neither are given.
    pub fn target(self) -> Result<ModelsTarget, ParamsError> {
        match (self.session_id, self.agent) {
            (Some(session), None) => Ok(ModelsTarget::Session(session)),
            (None, Some(agent)) => Ok(ModelsTarget::Agent(agent)),
            (Some(_), Some(_)) => Err(ParamsError(
                "give either sessionId or agent, not both".to_owned(),
            )),
            (None, None) => Err(ParamsError("sessionId or agent is required".to_owned())),
        }
    }
}

/// One model an agent offers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelInfo {
    /// Id to select it with.
    pub model_id: String,
    /// Display name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Longer description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// Result of `_sandboxagent/session/list_models`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListModelsResult {
    /// Models the agent reported (empty until it reported any).
    pub available_models: Vec<ModelInfo>,
    /// The session's current model, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_model_id: Option<String>,
}

/// Params of `_sandboxagent/session/set_metadata`, in either form:
/// `{sessionId, metadata: {...}}` or `{sessionId, _meta: {"sandboxagent.dev": {...}}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SetMetadataParams {
    /// The session.
    pub session_id: String,
    /// The patch, plain form.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    /// The patch, `_meta` form.
    #[serde(rename = "_meta", default, skip_serializing_if = "Option::is_none")]
    pub meta: Option<Value>,
}

impl SetMetadataParams {
    /// The plain form.
    pub fn new(session_id: impl Into<String>, metadata: Map<String, Value>) -> Self {
        Self {
            session_id: session_id.into(),
            metadata: Some(Value::Object(metadata)),
            meta: None,
        }
    }

    /// The session id and the patch to merge (JSON Merge Patch, see
    /// [`crate::meta::merge`]; its `null` members remove keys). When both
    /// forms are given, the `_meta` form's top-level keys win.
    ///
    /// # Errors
    /// [`ParamsError`] when neither form is given or a patch is not an object.
    pub fn into_patch(self) -> Result<(String, Map<String, Value>), ParamsError> {
        let mut patch = Map::new();
        let mut found = false;
        if let Some(metadata) = self.metadata {
            let Value::Object(object) = metadata else {
                return Err(ParamsError("metadata must be an object".to_owned()));
            };
            patch = object;
            found = true;
        }
        if let Some(meta) = self.meta {
            let namespace = meta
                .as_object()
                .ok_or_else(|| ParamsError("_meta must be an object".to_owned()))?
                .get(NAMESPACE);
            match namespace {
                Some(Value::Object(object)) => {
                    patch.extend(object.clone());
                    found = true;
                }
                Some(_) => {
                    return Err(ParamsError(format!(
                        "_meta[\"{NAMESPACE}\"] must be an object"
                    )));
                }
                None => {}
            }
        }
        if !found {
            return Err(ParamsError(format!(
                "give metadata: {{...}} or _meta: {{\"{NAMESPACE}\": {{...}}}}"
            )));
        }
        Ok((self.session_id, patch))
    }
}

/// Why a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EndReason {
    /// The agent process exited normally.
    Completed,
    /// The agent process failed.
    Error,
    /// Ended on request (`_sandboxagent/session/terminate`).
    Terminated,
}

/// Who ended a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TerminatedBy {
    /// The agent (its process ended).
    Agent,
    /// The runtime, on a client's request.
    Daemon,
}

/// Head and tail of an agent's stderr.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StderrExcerpt {
    /// First lines (up to 20), joined by `\n`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head: Option<String>,
    /// Last lines (up to 50), joined by `\n`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tail: Option<String>,
    /// Lines between head and tail were left out.
    #[serde(default)]
    pub truncated: bool,
    /// Lines seen in all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_lines: Option<u64>,
}

/// Params of `_sandboxagent/session/ended`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionEnded {
    /// The session.
    pub session_id: String,
    /// Why.
    pub reason: EndReason,
    /// Who.
    pub terminated_by: TerminatedBy,
    /// Human-readable explanation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The agent process's exit code, when it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The agent's stderr, when it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<StderrExcerpt>,
}

/// Why a prompt turn was interrupted (`reason` of
/// `_sandboxagent/turn/interrupted`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InterruptReason {
    /// The server stopped (killed, crashed, or shut down) while the turn ran.
    ServerStopped,
}

/// Params of `_sandboxagent/turn/interrupted` (research/contract.md,
/// "Notifications the runtime sends"): the last `session/prompt` of
/// `sessionId` had no answer when its server stopped. Recorded once, in the
/// session's event log, when the store is next opened; the turn's stop
/// reason is `cancelled` and the agent requests in `requestIds` can no
/// longer be answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnInterrupted {
    /// The session.
    pub session_id: String,
    /// Why: the server stopped.
    pub reason: InterruptReason,
    /// The stop reason the turn is taken to have (ACP `StopReason`):
    /// always `cancelled`.
    pub stop_reason: agent_client_protocol::v1::schema::StopReason,
    /// The client's JSON-RPC id of the `session/prompt` request that got no
    /// answer, as logged.
    pub prompt_id: Value,
    /// The agent's ids of its requests (`session/request_permission`,
    /// `elicitation/create`, …) the turn left unanswered, oldest first:
    /// an answer to them is dropped.
    pub request_ids: Vec<Value>,
}

/// Params of `_sandboxagent/agent/unparsed`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentUnparsed {
    /// The agent id.
    pub agent: String,
    /// The line as written; a line over 1 KiB is cut to its first KiB
    /// followed by `…` (and `error` gives its length).
    pub raw: String,
    /// Why it is not a JSON-RPC message.
    pub error: String,
}

/// Params of `_sandboxagent/stream/gap`: the first and last sequence numbers
/// the stream can no longer replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamGap {
    /// First missing sequence number.
    pub from: u64,
    /// Last missing sequence number.
    pub to: u64,
}

/// Where an agent comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum AgentSource {
    /// Inside the `sandbox-agent` binary (the mock agent).
    Builtin,
    /// Installed from its registry (npm, a release archive).
    Registry,
    /// Found elsewhere (a user-given command, `PATH`).
    Fallback,
}

/// An ACP auth method that an environment variable satisfies: a manifest
/// entry's `auth` member, also listed in [`AgentInfo::auth`]. When `env` is
/// set for the server (or in the agent's manifest `env`) and the agent
/// advertises `methodId` in its `initialize` result, the runtime sends it
/// `authenticate {methodId}` once after starting it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuthEnv {
    /// The auth method id, as in the agent's `authMethods`.
    pub method_id: String,
    /// The environment variable that satisfies it (e.g. `OPENAI_API_KEY`).
    pub env: String,
}

/// One agent in `GET /v2/agents` and `_sandboxagent/agent/list`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentInfo {
    /// Agent id.
    pub id: String,
    /// Display name.
    pub name: String,
    /// Whether it can be started without an install step.
    pub installed: bool,
    /// Installed (or reported) version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Where it comes from.
    pub source: AgentSource,
    /// The program that is run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Whether a process is running now.
    pub running: bool,
    /// Its pid, when running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// Starts after the first.
    pub restarts: u64,
    /// Why the last start or process failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// `agentCapabilities` from the agent's `initialize` result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<Value>,
    /// `agentInfo` from the agent's `initialize` result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_info: Option<Value>,
    /// Models, once the agent reported them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<Vec<ModelInfo>>,
    /// Session modes (ACP `SessionMode`), once the agent reported them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modes: Option<Vec<Value>>,
    /// Auth methods an environment variable satisfies, from the manifest
    /// (names only, never values); empty: none known.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub auth: Vec<AuthEnv>,
    /// Environment variables the agent reads itself as its credential, with
    /// no auth method to match, from the manifest (names only); the runtime
    /// sends nothing for them. Empty: none known.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub credential_env: Vec<String>,
}

/// Result of `_sandboxagent/agent/list`; also the body of `GET /v2/agents`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AgentListResult {
    /// Every known agent.
    pub agents: Vec<AgentInfo>,
}

/// Body of `POST /v2/agents/{agent}/install` (optional; `{}` when empty).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentInstallParams {
    /// Install again even when that version is already installed. Left out
    /// of the body when `false` (the server's default).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reinstall: bool,
    /// A version other than the manifest's (npm packages only; `latest` is
    /// allowed). It stays the agent's active version until another install
    /// names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// Params of `_sandboxagent/agent/install`: the agent and the body of
/// `POST /v2/agents/{agent}/install`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentInstallRequest {
    /// Agent id.
    pub agent: String,
    /// Version and reinstall, as the HTTP body.
    #[serde(flatten)]
    pub options: AgentInstallParams,
}

/// Answer of `POST /v2/agents/{agent}/install`: what is installed now and
/// whether this call installed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentInstallResult {
    /// Agent id.
    pub agent: String,
    /// The installed version (absent for a command agent of unknown version).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Where the agent comes from.
    pub source: AgentSource,
    /// The program that is run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Nothing was installed: it was already there (or needs no install).
    pub already_installed: bool,
    /// How long the call took, in milliseconds.
    pub duration_ms: u64,
}

/// Which side sent a recorded message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// From the agent (updates, agent requests, responses).
    AgentToClient,
    /// From a client (requests, notifications, answers to agent requests).
    ClientToAgent,
}

/// One recorded ACP message of a session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionEvent {
    /// Position in the session's log, from 0, without holes except where
    /// the oldest events were dropped.
    pub offset: u64,
    /// When the runtime saw it (RFC 3339).
    pub at: String,
    /// Who sent it.
    pub direction: Direction,
    /// The JSON-RPC message as relayed (ids as the client sees them).
    pub message: Value,
}

impl SessionEvent {
    /// [`at`](Self::at) as a point in time; `None` when it is not RFC 3339.
    pub fn time(&self) -> Option<std::time::SystemTime> {
        crate::meta::parse_time(&self.at)
    }

    /// The params of this event when it is the runtime's
    /// `_sandboxagent/turn/interrupted` (a turn its server stopped in;
    /// research/contract.md, "Notifications the runtime sends"); `None` for
    /// any other event, or params that do not read as [`TurnInterrupted`].
    pub fn turn_interrupted(&self) -> Option<TurnInterrupted> {
        if self.direction != Direction::AgentToClient
            || self.message.get("method").and_then(Value::as_str)
                != Some(crate::notification::TURN_INTERRUPTED)
        {
            return None;
        }
        serde_json::from_value(self.message.get("params")?.clone()).ok()
    }
}

/// Body of `GET /v2/sessions/{id}/events`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionEventsPage {
    /// Events at or after the requested offset, oldest first.
    pub events: Vec<SessionEvent>,
    /// Offset to ask for next.
    pub next_offset: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn params(value: Value) -> Result<SetMetadataParams, serde_json::Error> {
        serde_json::from_value(value)
    }

    #[test]
    fn set_metadata_plain_form() {
        let (session, patch) = params(json!({"sessionId": "s", "metadata": {"title": "T"}}))
            .expect("parse")
            .into_patch()
            .expect("valid");
        assert_eq!(session, "s");
        assert_eq!(Value::Object(patch), json!({"title": "T"}));
    }

    #[test]
    fn set_metadata_meta_form() {
        let (_, patch) = params(
            json!({"sessionId": "s", "_meta": {"sandboxagent.dev": {"model": "m"}, "other": 1}}),
        )
        .expect("parse")
        .into_patch()
        .expect("valid");
        assert_eq!(Value::Object(patch), json!({"model": "m"}));
    }

    #[test]
    fn set_metadata_both_forms_merge() {
        let (_, patch) = params(json!({"sessionId": "s", "metadata": {"a": 1, "b": 1}, "_meta": {"sandboxagent.dev": {"b": 2}}}))
            .expect("parse")
            .into_patch()
            .expect("valid");
        assert_eq!(Value::Object(patch), json!({"a": 1, "b": 2}));
    }

    #[test]
    fn set_metadata_patch_keeps_nulls_so_they_remove_keys() {
        let (_, patch) =
            params(json!({"sessionId": "s", "metadata": {"title": null, "labels": {"k": null}}}))
                .expect("parse")
                .into_patch()
                .expect("valid");
        assert_eq!(
            Value::Object(patch),
            json!({"title": null, "labels": {"k": null}})
        );
    }

    #[test]
    fn set_metadata_wrong_types_are_params_errors() {
        for bad in [
            json!({"sessionId": "s", "metadata": "title"}),
            json!({"sessionId": "s", "metadata": [1]}),
            json!({"sessionId": "s", "_meta": {"sandboxagent.dev": 5}}),
            json!({"sessionId": "s", "_meta": "x"}),
            json!({"sessionId": "s"}),
            json!({"sessionId": "s", "_meta": {"other": {}}}),
        ] {
            let result = params(bad.clone()).expect("shape parses").into_patch();
            assert!(result.is_err(), "{bad}");
        }
        assert!(
            params(json!({"metadata": {}})).is_err(),
            "sessionId is required"
        );
        assert!(params(json!({"sessionId": 5, "metadata": {}})).is_err());
    }

    #[test]
    fn list_models_needs_exactly_one_target() {
        let target = |v: Value| {
            serde_json::from_value::<ListModelsParams>(v)
                .expect("parse")
                .target()
        };
        assert_eq!(
            target(json!({"sessionId": "s"})),
            Ok(ModelsTarget::Session("s".into()))
        );
        assert_eq!(
            target(json!({"agent": "mock"})),
            Ok(ModelsTarget::Agent("mock".into()))
        );
        assert!(target(json!({})).is_err());
        assert!(target(json!({"sessionId": "s", "agent": "mock"})).is_err());
    }

    #[test]
    fn session_ended_wire_shape() {
        let ended = SessionEnded {
            session_id: "s".into(),
            reason: EndReason::Terminated,
            terminated_by: TerminatedBy::Daemon,
            message: None,
            exit_code: None,
            stderr: None,
        };
        assert_eq!(
            serde_json::to_value(&ended).expect("serialize"),
            json!({"sessionId": "s", "reason": "terminated", "terminatedBy": "daemon"})
        );
        let parsed: SessionEnded = serde_json::from_value(json!({
            "sessionId": "s", "reason": "error", "terminatedBy": "agent", "exitCode": 3,
            "stderr": {"head": "boom", "truncated": false, "totalLines": 1}
        }))
        .expect("parse");
        assert_eq!(parsed.exit_code, Some(3));
        assert_eq!(parsed.stderr.and_then(|s| s.head).as_deref(), Some("boom"));
    }

    #[test]
    fn direction_and_event_page_shape() {
        let page = SessionEventsPage {
            events: vec![SessionEvent {
                offset: 4,
                at: "2026-01-01T00:00:00Z".into(),
                direction: Direction::AgentToClient,
                message: json!({"jsonrpc": "2.0", "method": "session/update"}),
            }],
            next_offset: 5,
        };
        let wire = serde_json::to_value(&page).expect("serialize");
        assert_eq!(wire["nextOffset"], 5);
        assert_eq!(wire["events"][0]["direction"], "agent_to_client");
    }
}
