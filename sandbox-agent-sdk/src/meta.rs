//! `_meta["sandboxagent.dev"]` in and out: the agent id injected into
//! requests, and [`WithMeta`], an answer with its namespace object as typed
//! [`SessionMeta`] fields.

use agent_client_protocol::v1::schema::{Meta, SessionId, SessionInfo};
use ext_methods::{NAMESPACE, SessionMeta};
use serde_json::{Map, Value};
use std::ops::Deref;
use std::path::PathBuf;

/// An answer (a session result, a session list entry) with its
/// `_meta["sandboxagent.dev"]` read into [`SessionMeta`]: `agent`, `title`,
/// `model`, `mode`, `created_at`, `updated_at`, `ended`, `event_count`, and
/// every other stored key in `extra`.
///
/// Dereferences to the answer itself, so `created.session_id` works on a
/// `WithMeta<NewSessionResponse>`. The answer's own `meta` is left as sent.
#[derive(Debug, Clone, PartialEq)]
pub struct WithMeta<T> {
    /// The answer, as the ACP schema types it.
    pub value: T,
    /// Its `_meta["sandboxagent.dev"]`, typed; `None` when the server sent
    /// none or one without the runtime keys (`agent`, `createdAt`, …).
    pub meta: Option<SessionMeta>,
}

impl<T> WithMeta<T> {
    /// `value` with the namespace object read from its `_meta`, which
    /// `meta_of` picks out of it.
    pub(crate) fn read(value: T, meta_of: impl FnOnce(&T) -> Option<&Meta>) -> WithMeta<T> {
        WithMeta {
            meta: session_meta(meta_of(&value)),
            value,
        }
    }

    /// The answer without the typed metadata.
    pub fn into_inner(self) -> T {
        self.value
    }
}

impl<T> Deref for WithMeta<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.value
    }
}

/// One session of the server's inventory: ACP `SessionInfo` (`session_id`,
/// `cwd`, `title`, `updated_at`) and its typed metadata.
pub type SessionEntry = WithMeta<SessionInfo>;

impl SessionEntry {
    /// Reads an inventory entry (a `session/list` item, the result of
    /// `_sandboxagent/session/get` or `set_metadata`, a
    /// `GET /v2/sessions` item).
    pub(crate) fn from_info(info: SessionInfo) -> SessionEntry {
        WithMeta::read(info, |info| info.meta.as_ref())
    }

    /// The entry a server lists for the session `session_id` (working
    /// directory `cwd`) whose namespace object is `meta`: the same shape
    /// as a `GET /v2/sessions` item ([`SessionMeta::entry`]), for a tool
    /// that reads sessions from elsewhere (a session store) and shows them
    /// as a server would.
    pub fn from_meta(
        session_id: impl Into<SessionId>,
        cwd: impl Into<PathBuf>,
        meta: SessionMeta,
    ) -> SessionEntry {
        WithMeta {
            value: meta.entry(session_id, cwd),
            meta: Some(meta),
        }
    }
}

/// `meta["sandboxagent.dev"]` as [`SessionMeta`], if it has that shape.
pub fn session_meta(meta: Option<&Meta>) -> Option<SessionMeta> {
    let namespace = meta?.get(NAMESPACE)?;
    serde_json::from_value(namespace.clone()).ok()
}

/// Per-session metadata: a JSON object stored under
/// `_meta["sandboxagent.dev"]`. `title`, `model` and `mode` have a meaning
/// to the server (the session's title and hints); every other key is kept
/// as given and comes back in [`SessionMeta::extra`].
///
/// Build it with the typed setters, or convert a JSON object
/// (`serde_json::json!({...})`, with [`Metadata::from_json`] or
/// `TryFrom<Value>`) or a `serde_json::Map` (`From`).
///
/// ```
/// use sandbox_agent_sdk::{Metadata, sandbox_meta, schema::NewSessionRequest};
/// use serde_json::json;
///
/// let typed = Metadata::new()
///     .title("Fix the login bug")
///     .model("mock-fast")
///     .set("labels", json!({"team": "infra"}));
/// let request = NewSessionRequest::new("/work/app").meta(sandbox_meta(typed));
///
/// let from_json = Metadata::from_json(json!({"title": "Fix the login bug", "ticket": "ENG-42"}))?;
/// # let _ = (request, from_json);
/// # Ok::<(), sandbox_agent_sdk::Error>(())
/// ```
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
#[serde(transparent)]
pub struct Metadata(Map<String, Value>);

impl Metadata {
    /// No keys.
    pub fn new() -> Metadata {
        Metadata::default()
    }

    /// A JSON object as metadata.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`](crate::Error::InvalidOptions) when `value`
    /// is not an object.
    pub fn from_json(value: Value) -> Result<Metadata, crate::Error> {
        match value {
            Value::Object(map) => Ok(Metadata(map)),
            other => Err(crate::Error::InvalidOptions(format!(
                "metadata must be a JSON object, not {other}"
            ))),
        }
    }

    /// The session's title.
    pub fn title(self, title: impl Into<String>) -> Metadata {
        self.set("title", title.into())
    }

    /// The model hint (a model id of the agent).
    pub fn model(self, model: impl Into<String>) -> Metadata {
        self.set("model", model.into())
    }

    /// The mode hint (a mode id of the agent).
    pub fn mode(self, mode: impl Into<String>) -> Metadata {
        self.set("mode", mode.into())
    }

    /// Any key; with [`set_metadata`](crate::SandboxAgentClient::set_metadata)
    /// `Value::Null` removes it (JSON Merge Patch).
    pub fn set(mut self, key: impl Into<String>, value: impl Into<Value>) -> Metadata {
        self.0.insert(key.into(), value.into());
        self
    }

    /// The JSON object.
    pub fn into_map(self) -> Map<String, Value> {
        self.0
    }
}

impl From<Map<String, Value>> for Metadata {
    fn from(map: Map<String, Value>) -> Metadata {
        Metadata(map)
    }
}

impl TryFrom<Value> for Metadata {
    type Error = crate::Error;

    fn try_from(value: Value) -> Result<Metadata, crate::Error> {
        Metadata::from_json(value)
    }
}

/// `_meta` holding `metadata` under `"sandboxagent.dev"`: pass it to
/// `NewSessionRequest::meta` to store per-session metadata (see
/// [`Metadata`]; a `serde_json::Map` converts too).
///
/// ```
/// use sandbox_agent_sdk::{Metadata, sandbox_meta, schema::NewSessionRequest};
/// let request = NewSessionRequest::new("/work/app")
///     .meta(sandbox_meta(Metadata::new().title("Fix the login bug")));
/// # let _ = request;
/// ```
pub fn sandbox_meta(metadata: impl Into<Metadata>) -> Meta {
    let mut meta = Meta::new();
    meta.insert(NAMESPACE.to_owned(), Value::Object(metadata.into().0));
    meta
}

/// `meta` with `agent` set in its namespace object, unless the caller set
/// an agent there already (the server then checks that it matches the
/// connection's: research/contract.md,
/// "Routing: connections, sessions, one agent process"). Everything else is
/// kept.
pub(crate) fn with_agent(meta: Option<Meta>, agent: &str) -> Meta {
    let mut meta = meta.unwrap_or_default();
    let namespace = meta
        .entry(NAMESPACE.to_owned())
        .or_insert_with(|| Value::Object(Map::new()));
    if !namespace.is_object() {
        *namespace = Value::Object(Map::new());
    }
    if let Value::Object(namespace) = namespace {
        namespace
            .entry("agent".to_owned())
            .or_insert_with(|| Value::String(agent.to_owned()));
    }
    meta
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
    fn agent_is_injected_next_to_user_metadata() {
        let meta = with_agent(
            Some(object(
                json!({"other": 1, "sandboxagent.dev": {"variant": "fast"}}),
            )),
            "mock",
        );
        assert_eq!(
            Value::Object(meta),
            json!({"other": 1, "sandboxagent.dev": {"variant": "fast", "agent": "mock"}})
        );
        let meta = with_agent(None, "mock");
        assert_eq!(
            Value::Object(meta),
            json!({"sandboxagent.dev": {"agent": "mock"}})
        );
        let kept = with_agent(
            Some(sandbox_meta(object(json!({"agent": "codex"})))),
            "mock",
        );
        assert_eq!(kept[NAMESPACE]["agent"], "codex");
        let fixed = with_agent(Some(object(json!({"sandboxagent.dev": 5}))), "mock");
        assert_eq!(fixed[NAMESPACE]["agent"], "mock");
    }

    #[test]
    fn namespace_surfaces_as_typed_fields() {
        let meta = object(json!({"sandboxagent.dev": {
            "agent": "mock", "createdAt": "2026-01-01T00:00:00.000Z", "updatedAt": "2026-01-01T00:00:01.000Z",
            "ended": false, "eventCount": 4, "title": "T", "model": "mock-smart", "mode": "plan", "ticket": "ENG-42"
        }}));
        let typed = session_meta(Some(&meta));
        let Some(typed) = typed else {
            panic!("typed metadata");
        };
        assert_eq!(typed.agent, "mock");
        assert_eq!(typed.title.as_deref(), Some("T"));
        assert_eq!(typed.event_count, 4);
        assert_eq!(typed.extra.get("ticket"), Some(&json!("ENG-42")));
        assert!(session_meta(Some(&object(json!({"sandboxagent.dev": {"title": "x"}})))).is_none());
        assert!(session_meta(None).is_none());
    }

    #[test]
    fn an_entry_made_from_its_metadata_reads_back_the_same() -> Result<(), serde_json::Error> {
        let meta: SessionMeta = serde_json::from_value(json!({
            "agent": "mock", "createdAt": "2026-01-01T00:00:00.000Z",
            "updatedAt": "2026-01-01T00:00:01.000Z", "ended": true, "eventCount": 4,
            "title": "T", "ticket": "ENG-42"
        }))?;
        let made = SessionEntry::from_meta("s1", "/work", meta);
        assert_eq!(made.title.as_deref(), Some("T"));
        assert_eq!(made.updated_at.as_deref(), Some("2026-01-01T00:00:01.000Z"));
        let read =
            SessionEntry::from_info(serde_json::from_value(serde_json::to_value(&made.value)?)?);
        assert_eq!(read, made);
        Ok(())
    }
}
