//! `_meta["sandboxagent.dev"]`: reading, merging and injecting the
//! namespace object (research/contract.md,
//! "`_meta["sandboxagent.dev"]`: where it appears, which keys").
//!
//! ACP reserves `_meta` on every params and result object for
//! implementation data; this product keeps everything it adds under one key,
//! [`NAMESPACE`], and never touches other keys of `_meta`.

use crate::names::NAMESPACE;
use agent_client_protocol::v1::schema::{SessionId, SessionInfo};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::path::PathBuf;
use std::time::SystemTime;

/// Keys the runtime always sets itself in a session's namespace object; a
/// client cannot override them (they are replaced on the way out).
pub const RUNTIME_KEYS: &[&str] = &[
    "agent",
    "createdAt",
    "updatedAt",
    "ended",
    "dormant",
    "eventCount",
    "firstPrompt",
];

/// `initialize` params `_meta["sandboxagent.dev"].fsAndTerminal`: who
/// answers the agent's `fs/read_text_file`, `fs/write_text_file` and
/// `terminal/*` requests in the sessions of this connection. Absent (or
/// [`FS_AND_TERMINAL_SANDBOX`]): the runtime, in the sandbox;
/// [`FS_AND_TERMINAL_CLIENT`]: this connection, for each of those
/// capabilities it declared in `clientCapabilities` (research/contract.md,
/// "Files and terminals of the agent, served in the sandbox").
pub const FS_AND_TERMINAL_KEY: &str = "fsAndTerminal";
/// [`FS_AND_TERMINAL_KEY`] value: the runtime serves them (the default).
pub const FS_AND_TERMINAL_SANDBOX: &str = "sandbox";
/// [`FS_AND_TERMINAL_KEY`] value: the connection serves them itself.
pub const FS_AND_TERMINAL_CLIENT: &str = "client";

/// The namespace object of a params or result object:
/// `holder._meta["sandboxagent.dev"]`, when it is an object.
pub fn read(holder: &Value) -> Option<&Map<String, Value>> {
    holder.get("_meta")?.get(NAMESPACE)?.as_object()
}

/// The namespace object of `holder`, created (with `_meta`) when missing.
/// Returns `None` when `holder` is not an object, or `_meta` or the namespace
/// exists but is not an object (it is then left as it is).
pub fn ensure(holder: &mut Value) -> Option<&mut Map<String, Value>> {
    let meta = holder
        .as_object_mut()?
        .entry("_meta")
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()?;
    meta.entry(NAMESPACE)
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()
}

/// Sets `entries` in `holder._meta["sandboxagent.dev"]`, keeping every other
/// key of `_meta` and of the namespace. Returns false when `holder` (or an
/// existing `_meta` / namespace) is not an object.
pub fn inject(holder: &mut Value, entries: Map<String, Value>) -> bool {
    match ensure(holder) {
        Some(namespace) => {
            namespace.extend(entries);
            true
        }
        None => false,
    }
}

/// Merges `patch` into `target` as a JSON Merge Patch (RFC 7396): a `null`
/// member removes the key, an object member merges recursively, anything
/// else replaces.
pub fn merge(target: &mut Map<String, Value>, patch: &Map<String, Value>) {
    for (key, value) in patch {
        match value {
            Value::Null => {
                target.remove(key);
            }
            Value::Object(patch_object) => {
                let slot = target
                    .entry(key.clone())
                    .or_insert_with(|| Value::Object(Map::new()));
                if !slot.is_object() {
                    *slot = Value::Object(Map::new());
                }
                if let Some(object) = slot.as_object_mut() {
                    merge(object, patch_object);
                }
            }
            other => {
                target.insert(key.clone(), other.clone());
            }
        }
    }
}

/// The namespace object of a session entry (a `session/list` item,
/// `_sandboxagent/session/get`, `session/new` result), typed.
///
/// The runtime always sets `agent`, `createdAt`, `updatedAt` (RFC 3339),
/// `ended` and `eventCount`; `title`, `model` and `mode` when known. Every
/// other stored key (`variant`, `permissionMode`, …) is kept in `extra`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionMeta {
    /// The agent id that hosts the session.
    pub agent: String,
    /// When the runtime first saw the session (RFC 3339).
    pub created_at: String,
    /// Last activity (RFC 3339).
    pub updated_at: String,
    /// Whether the session ended.
    pub ended: bool,
    /// Restored from the session store after a restart and not loaded
    /// since: listed and readable, and a `session/load` or `session/resume`
    /// starts its agent to load it. Absent when `false`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dormant: bool,
    /// ACP messages recorded in the session's event log so far.
    pub event_count: u64,
    /// Title, from metadata or the agent's `session_info_update`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// Model hint, from metadata or the agent's model config option.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Mode hint, from metadata or the agent's `current_mode_update`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// The text of the session's first `session/prompt` (its text blocks
    /// joined, at most 200 characters): what a list shows for a session
    /// without a title. Absent before the first prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_prompt: Option<String>,
    /// Every other key, as stored (pass-through).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl SessionMeta {
    /// The keys of a session's stored metadata object that
    /// [`extra`](Self::extra) carries: every key but [`RUNTIME_KEYS`] and
    /// the ones this type has fields for (`title`, `model`, `mode`).
    pub fn extra_from(stored: &Map<String, Value>) -> Map<String, Value> {
        let mut extra = stored.clone();
        for key in RUNTIME_KEYS.iter().chain(&["title", "model", "mode"]) {
            extra.remove(*key);
        }
        extra
    }

    /// The inventory entry of the session `session_id` (working directory
    /// `cwd`) with this namespace object: ACP `SessionInfo` whose `title`
    /// and `updatedAt` are this object's, with the object itself under
    /// `_meta["sandboxagent.dev"]`; the shape of a `session/list` item and
    /// of a `GET /v2/sessions` item (research/contract.md, "Control
    /// plane").
    pub fn entry(&self, session_id: impl Into<SessionId>, cwd: impl Into<PathBuf>) -> SessionInfo {
        let mut namespace = Map::new();
        if let Ok(value) = serde_json::to_value(self) {
            namespace.insert(NAMESPACE.to_owned(), value);
        }
        SessionInfo::new(session_id, cwd)
            .title(self.title.clone())
            .updated_at(self.updated_at.clone())
            .meta(namespace)
    }

    /// [`created_at`](Self::created_at) as a point in time; `None` when it
    /// is not RFC 3339.
    pub fn created_time(&self) -> Option<SystemTime> {
        parse_time(&self.created_at)
    }

    /// [`updated_at`](Self::updated_at) as a point in time; `None` when it
    /// is not RFC 3339.
    pub fn updated_time(&self) -> Option<SystemTime> {
        parse_time(&self.updated_at)
    }
}

/// An RFC 3339 timestamp of the wire (`2026-11-30T11:09:58.060Z`) as a
/// point in time; `None` when it does not parse.
pub fn parse_time(text: &str) -> Option<SystemTime> {
    humantime::parse_rfc3339_weak(text).ok()
}

/// `time` as the wire writes it: RFC 3339 in UTC with milliseconds
/// (`2026-11-30T11:09:58.060Z`). Every timestamp the runtime sends or
/// stores has this form (`createdAt`, `updatedAt`, an event's `at`, a
/// process's `startedAt`, a file's `modified`); [`parse_time`] reads it
/// back. The one formatter: the runtime, the SDK and the CLI all call it.
pub fn format_time(time: SystemTime) -> String {
    humantime::format_rfc3339_millis(time).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            _ => Map::new(),
        }
    }

    #[test]
    fn read_finds_the_namespace_only_when_it_is_an_object() {
        let holder = json!({"_meta": {"sandboxagent.dev": {"agent": "mock"}, "other": 1}});
        assert_eq!(
            read(&holder).and_then(|m| m.get("agent")),
            Some(&json!("mock"))
        );
        assert!(read(&json!({"_meta": {"sandboxagent.dev": 3}})).is_none());
        assert!(read(&json!({"_meta": []})).is_none());
        assert!(read(&json!({})).is_none());
        assert!(read(&json!("x")).is_none());
    }

    #[test]
    fn inject_keeps_other_meta_keys_and_namespace_keys() {
        let mut holder = json!({"sessionId": "s", "_meta": {"other.vendor": {"x": 1}, "sandboxagent.dev": {"variant": "a"}}});
        assert!(inject(
            &mut holder,
            object(json!({"agent": "mock", "ended": false}))
        ));
        assert_eq!(
            holder,
            json!({"sessionId": "s", "_meta": {"other.vendor": {"x": 1}, "sandboxagent.dev": {"variant": "a", "agent": "mock", "ended": false}}})
        );
    }

    #[test]
    fn inject_creates_meta_when_missing() {
        let mut holder = json!({"sessionId": "s"});
        assert!(inject(&mut holder, object(json!({"agent": "mock"}))));
        assert_eq!(holder["_meta"]["sandboxagent.dev"]["agent"], "mock");
    }

    #[test]
    fn inject_refuses_non_objects_without_clobbering() {
        let mut holder = json!({"_meta": "not an object"});
        assert!(!inject(&mut holder, object(json!({"agent": "mock"}))));
        assert_eq!(holder, json!({"_meta": "not an object"}));
        let mut holder = json!([1]);
        assert!(!inject(&mut holder, Map::new()));
    }

    #[test]
    fn merge_follows_rfc_7396() {
        let mut target = object(
            json!({"title": "a", "labels": {"x": 1, "y": 2}, "keep": true, "n": {"deep": 1}}),
        );
        merge(
            &mut target,
            &object(
                json!({"title": "b", "labels": {"x": null, "z": 3}, "keep": null, "n": 5, "new": [1]}),
            ),
        );
        assert_eq!(
            Value::Object(target),
            json!({"title": "b", "labels": {"y": 2, "z": 3}, "n": 5, "new": [1]})
        );
    }

    #[test]
    fn merge_turns_a_scalar_into_an_object_when_patched_with_one() {
        let mut target = object(json!({"labels": "flat"}));
        merge(&mut target, &object(json!({"labels": {"a": 1}})));
        assert_eq!(target["labels"], json!({"a": 1}));
    }

    #[test]
    fn session_meta_round_trips_with_pass_through_keys() {
        let wire = json!({
            "agent": "mock", "createdAt": "2026-01-01T00:00:00Z", "updatedAt": "2026-01-01T00:00:01Z",
            "ended": false, "eventCount": 3, "model": "m", "variant": "fast", "skills": ["a"]
        });
        let meta: SessionMeta = serde_json::from_value(wire.clone()).expect("parse");
        assert_eq!(meta.model.as_deref(), Some("m"));
        assert_eq!(meta.extra.get("variant"), Some(&json!("fast")));
        assert_eq!(serde_json::to_value(&meta).expect("serialize"), wire);
    }

    #[test]
    fn wire_timestamps_read_as_times() {
        let Some(time) = super::parse_time("2026-11-30T11:09:58.060Z") else {
            panic!("an RFC 3339 timestamp");
        };
        let since_epoch = time
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        assert_eq!(since_epoch.as_millis(), 1_796_036_998_060);
        assert!(super::parse_time("yesterday").is_none());
        assert_eq!(super::format_time(time), "2026-11-30T11:09:58.060Z");
        assert_eq!(
            super::format_time(std::time::UNIX_EPOCH),
            "1970-01-01T00:00:00.000Z"
        );
    }

    #[test]
    fn an_entry_carries_its_namespace_object() {
        let stored = object(json!({"agent": "x", "dormant": true, "title": "T", "ticket": 7}));
        let meta = SessionMeta {
            agent: "mock".to_owned(),
            created_at: "2026-01-01T00:00:00.000Z".to_owned(),
            updated_at: "2026-01-01T00:00:01.000Z".to_owned(),
            ended: false,
            dormant: true,
            event_count: 2,
            title: Some("T".to_owned()),
            model: None,
            mode: None,
            first_prompt: None,
            extra: SessionMeta::extra_from(&stored),
        };
        assert_eq!(Value::Object(meta.extra.clone()), json!({"ticket": 7}));
        let entry = serde_json::to_value(meta.entry("s1", "/work")).unwrap_or_default();
        assert_eq!(
            entry,
            json!({"sessionId": "s1", "cwd": "/work", "title": "T",
                   "updatedAt": "2026-01-01T00:00:01.000Z",
                   "_meta": {"sandboxagent.dev": {
                       "agent": "mock", "createdAt": "2026-01-01T00:00:00.000Z",
                       "updatedAt": "2026-01-01T00:00:01.000Z", "ended": false,
                       "dormant": true, "eventCount": 2, "title": "T", "ticket": 7}}})
        );
    }
}
