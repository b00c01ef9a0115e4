//! Title, model and mode hints read from ACP messages, for the session
//! inventory and `GET /v2/agents` (research/contract.md,
//! "Extension methods and control plane": hints for `title`/`model`/`mode`).
//!
//! Sources (ACP schema v1): the result of `session/new` / `load` / `resume` /
//! `fork` (`modes`, `configOptions` with category `model`), and the
//! `session_info_update`, `current_mode_update` and `config_option_update`
//! session updates. Agents that predate config options send
//! `models: {availableModels, currentModelId}` in the result; that is read too.

use crate::protocol::Method;
use agent_client_protocol::schema::MaybeUndefined;
use agent_client_protocol::v1::schema::{
    SessionConfigKind, SessionConfigOption, SessionConfigOptionCategory,
    SessionConfigSelectOptions, SessionMode, SessionNotification, SessionUpdate,
};
use ext_methods::ModelInfo;
use serde::Deserialize;
use serde_json::value::RawValue;

/// What one message says about its session. `None` fields: not mentioned.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Hints {
    /// New title; `Some(None)` clears it.
    pub title: Option<Option<String>>,
    /// Current mode id.
    pub mode: Option<String>,
    /// Available modes (ACP `SessionMode` objects).
    pub modes: Option<Vec<serde_json::Value>>,
    /// Current model id.
    pub model: Option<String>,
    /// Available models.
    pub models: Option<Vec<ModelInfo>>,
    /// Every config option, as the agent last reported them (the attach
    /// answer gives them back).
    pub config_options: Option<Vec<SessionConfigOption>>,
}

impl Hints {
    /// Whether the message said nothing.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// Takes every field `other` sets.
    pub fn merge(&mut self, other: Hints) {
        if other.title.is_some() {
            self.title = other.title;
        }
        if other.mode.is_some() {
            self.mode = other.mode;
        }
        if other.modes.is_some() {
            self.modes = other.modes;
        }
        if other.model.is_some() {
            self.model = other.model;
        }
        if other.models.is_some() {
            self.models = other.models;
        }
        if other.config_options.is_some() {
            self.config_options = other.config_options;
        }
    }
}

/// Hints in the result of a session-creating or -loading request.
pub fn from_session_result(result: &RawValue) -> Hints {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Result {
        #[serde(default)]
        modes: Option<Modes>,
        #[serde(default)]
        config_options: Option<Vec<serde_json::Value>>,
        #[serde(default)]
        models: Option<LegacyModels>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Modes {
        current_mode_id: Option<String>,
        #[serde(default)]
        available_modes: Vec<SessionMode>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct LegacyModels {
        current_model_id: Option<String>,
        #[serde(default)]
        available_models: Vec<ModelInfo>,
    }
    let Ok(result) = serde_json::from_str::<Result>(result.get()) else {
        return Hints::default();
    };
    let mut hints = Hints::default();
    if let Some(modes) = result.modes {
        hints.mode = modes.current_mode_id;
        hints.modes = Some(
            modes
                .available_modes
                .iter()
                .filter_map(|m| serde_json::to_value(m).ok())
                .collect(),
        );
    }
    if let Some(options) = result.config_options {
        let options = parse_options(options);
        apply_config_options(&mut hints, &options);
        hints.config_options = Some(options);
    }
    if hints.models.is_none()
        && let Some(models) = result.models
    {
        hints.model = models.current_model_id;
        hints.models = Some(models.available_models);
    }
    hints
}

/// Hints in the result of any other session request (e.g. the
/// `configOptions` a `session/set_config_option` answer carries), or `None`
/// when the result names none of `configOptions`, `modes`, `models`.
pub fn from_result(result: &RawValue) -> Option<Hints> {
    let text = result.get().as_bytes();
    let mentions = [&b"\"configOptions\""[..], b"\"modes\"", b"\"models\""]
        .iter()
        .any(|key| memchr::memmem::find(text, key).is_some());
    if !mentions {
        return None;
    }
    Some(from_session_result(result)).filter(|hints| !hints.is_empty())
}

/// Hints a successful request implies by its params: `session/set_mode`
/// (`modeId`) and `session/set_model` (`modelId`, agents that predate config
/// options).
pub fn from_request(method: Method, params: Option<&RawValue>) -> Hints {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Params {
        mode_id: Option<String>,
        model_id: Option<String>,
    }
    let params = params.and_then(|p| serde_json::from_str::<Params>(p.get()).ok());
    let mut hints = Hints::default();
    if let Some(params) = params {
        match method {
            Method::SessionSetMode => hints.mode = params.mode_id,
            Method::SessionSetModel => hints.model = params.model_id,
            _ => {}
        }
    }
    hints
}

/// Hints in one `session/update` line whose update kind (`sessionUpdate`)
/// is `kind`, or `None` when it carries none. Free for the common chunk
/// updates: the line is only parsed for the kinds that carry hints.
pub fn from_update(kind: &str, line: &[u8]) -> Option<Hints> {
    if !matches!(
        kind,
        "session_info_update" | "current_mode_update" | "config_option_update"
    ) {
        return None;
    }
    #[derive(Deserialize)]
    struct Notification {
        params: SessionNotification,
    }
    let notification: Notification = serde_json::from_slice(line).ok()?;
    let mut hints = Hints::default();
    match notification.params.update {
        SessionUpdate::SessionInfoUpdate(update) => match update.title {
            MaybeUndefined::Undefined => {}
            MaybeUndefined::Null => hints.title = Some(None),
            MaybeUndefined::Value(title) => hints.title = Some(Some(title)),
        },
        SessionUpdate::CurrentModeUpdate(update) => {
            hints.mode = Some(update.current_mode_id.to_string());
        }
        SessionUpdate::ConfigOptionUpdate(update) => {
            apply_config_options(&mut hints, &update.config_options);
            hints.config_options = Some(update.config_options);
        }
        _ => {}
    }
    (!hints.is_empty()).then_some(hints)
}

fn parse_options(values: Vec<serde_json::Value>) -> Vec<SessionConfigOption> {
    values
        .into_iter()
        .filter_map(|value| serde_json::from_value(value).ok())
        .collect()
}

fn apply_config_options(hints: &mut Hints, options: &[SessionConfigOption]) {
    let Some(model) = options
        .iter()
        .find(|o| o.category == Some(SessionConfigOptionCategory::Model))
    else {
        return;
    };
    let SessionConfigKind::Select(select) = &model.kind else {
        return;
    };
    hints.model = Some(select.current_value.to_string());
    let options = match &select.options {
        SessionConfigSelectOptions::Ungrouped(options) => options.iter().collect::<Vec<_>>(),
        SessionConfigSelectOptions::Grouped(groups) => {
            groups.iter().flat_map(|g| g.options.iter()).collect()
        }
        _ => Vec::new(),
    };
    hints.models = Some(
        options
            .into_iter()
            .map(|o| ModelInfo {
                model_id: o.value.to_string(),
                name: Some(o.name.clone()),
                description: o.description.clone(),
            })
            .collect(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(text: &str) -> Box<RawValue> {
        RawValue::from_string(text.to_owned()).expect("json")
    }

    #[test]
    fn session_result_with_modes_and_model_option() {
        let hints = from_session_result(&raw(
            r#"{"sessionId":"s","modes":{"currentModeId":"default","availableModes":[{"id":"default","name":"Default"},{"id":"plan","name":"Plan"}]},
               "configOptions":[{"id":"model","name":"Model","category":"model","type":"select","currentValue":"fast","options":[{"value":"fast","name":"Fast"},{"value":"smart","name":"Smart","description":"slow"}]}]}"#,
        ));
        assert_eq!(hints.mode.as_deref(), Some("default"));
        assert_eq!(hints.modes.as_ref().map(Vec::len), Some(2));
        assert_eq!(hints.model.as_deref(), Some("fast"));
        let models = hints.models.expect("models");
        assert_eq!(models[1].model_id, "smart");
        assert_eq!(models[1].description.as_deref(), Some("slow"));
    }

    #[test]
    fn legacy_models_field() {
        let hints = from_session_result(&raw(
            r#"{"sessionId":"s","models":{"currentModelId":"m1","availableModels":[{"modelId":"m1","name":"M one"}]}}"#,
        ));
        assert_eq!(hints.model.as_deref(), Some("m1"));
        assert_eq!(hints.models.map(|m| m.len()), Some(1));
    }

    #[test]
    fn set_config_option_result_and_request_params() {
        let result = raw(
            r#"{"configOptions":[{"id":"model","name":"Model","category":"model","type":"select","currentValue":"smart","options":[{"value":"smart","name":"Smart"}]}]}"#,
        );
        assert_eq!(
            from_result(&result).and_then(|h| h.model).as_deref(),
            Some("smart")
        );
        assert_eq!(from_result(&raw("{}")), None);
        let params = raw(r#"{"sessionId":"s","modeId":"plan"}"#);
        assert_eq!(
            from_request(Method::parse("session/set_mode"), Some(&params))
                .mode
                .as_deref(),
            Some("plan")
        );
        let params = raw(r#"{"sessionId":"s","modelId":"m2"}"#);
        assert_eq!(
            from_request(Method::parse("session/set_model"), Some(&params))
                .model
                .as_deref(),
            Some("m2")
        );
        assert!(from_request(Method::parse("session/prompt"), Some(&params)).is_empty());
    }

    #[test]
    fn garbage_result_gives_no_hints() {
        assert!(from_session_result(&raw("[1,2]")).is_empty());
        assert!(from_session_result(&raw(r#"{"modes":5}"#)).is_empty());
    }

    #[test]
    fn chunk_updates_are_skipped_without_parsing() {
        // Not even valid JSON: proves the line is not parsed.
        assert_eq!(from_update("agent_message_chunk", b"{"), None);
    }

    #[test]
    fn title_mode_and_model_updates() {
        let title = br#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"session_info_update","title":"Fix the bug"}}}"#;
        assert_eq!(
            from_update("session_info_update", title).and_then(|h| h.title),
            Some(Some("Fix the bug".to_owned()))
        );
        let mode = br#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"current_mode_update","currentModeId":"plan"}}}"#;
        assert_eq!(
            from_update("current_mode_update", mode)
                .and_then(|h| h.mode)
                .as_deref(),
            Some("plan")
        );
        let model = br#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"config_option_update","configOptions":[{"id":"model","name":"Model","category":"model","type":"select","currentValue":"smart","options":[{"value":"smart","name":"Smart"}]}]}}}"#;
        assert_eq!(
            from_update("config_option_update", model)
                .and_then(|h| h.model)
                .as_deref(),
            Some("smart")
        );
    }
}
