//! Agent questions: ACP elicitation (`elicitation/create`,
//! `elicitation/complete`) as the router sees it (research/contract.md,
//! "Agent questions (ACP elicitation)").
//!
//! The runtime declares both modes to every agent it starts, since its own
//! clients (SDK, inspector, `prompt`) answer them; a question then goes only
//! to the connections that declared its mode. What the router needs of one
//! is small: its mode, its scope (a session, or one of the runtime's request
//! ids), and the id a URL-mode question's `elicitation/complete` names. It
//! reads those with the ACP schema's own type and keeps the agent's line
//! as it was, except for a request-scoped question, whose `requestId` is
//! the client's own id of that request ([`with_request_id`]).

use crate::protocol::method;
use agent_client_protocol::v1::schema::{
    CreateElicitationRequest, ElicitationCapabilities, ElicitationMode, ElicitationScope,
};
use bytes::Bytes;
use serde_json::Value;
use serde_json::value::RawValue;
use std::collections::VecDeque;
use std::sync::Arc;

/// `elicitation/create` (ACP, agent → client).
pub const CREATE: &str = "elicitation/create";
/// `elicitation/complete` (ACP, agent → client notification).
pub const COMPLETE: &str = "elicitation/complete";
/// How many URL-mode questions a process remembers for the
/// `elicitation/complete` that may follow (the oldest is forgotten first;
/// a forgotten one's notice goes to every connection of the agent).
pub const URL_QUESTIONS_KEPT: usize = 256;

/// The elicitation capabilities the runtime declares to an agent
/// (`clientCapabilities.elicitation`): form and URL.
pub fn declared() -> Value {
    serde_json::json!({ "form": {}, "url": {} })
}

/// Which modes a client's `clientCapabilities.elicitation` declares, read
/// by the ACP schema's rule (`{}` for a mode declares it; missing, `null`
/// or malformed does not). Returns `(form, url)`.
pub fn modes_declared(capabilities: &Value) -> (bool, bool) {
    capabilities
        .get("elicitation")
        .and_then(|value| serde_json::from_value::<ElicitationCapabilities>(value.clone()).ok())
        .map_or((false, false), |declared| {
            (declared.supports_form(), declared.supports_url())
        })
}

/// The mode of a question, which a connection must have declared to get it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A form built from `requestedSchema`.
    Form,
    /// A URL the person opens out of band.
    Url,
}

/// What the router reads of one `elicitation/create`.
#[derive(Debug, Clone)]
pub struct Question {
    /// Its mode; `None` for a mode this schema does not know or params it
    /// cannot read, which the runtime refuses (`-32602`).
    pub mode: Option<Mode>,
    /// `requestId` of a request-scoped question: one of the runtime's own
    /// ids of a client's request to this agent.
    pub request_id: Option<i64>,
    /// `elicitationId` of a URL-mode question.
    pub elicitation_id: Option<Arc<str>>,
}

impl Question {
    /// Reads the question from the agent's params (raw JSON).
    pub fn read(params: Option<&RawValue>) -> Self {
        let unreadable = Self {
            mode: None,
            request_id: None,
            elicitation_id: None,
        };
        let Some(request) =
            params.and_then(|raw| serde_json::from_str::<CreateElicitationRequest>(raw.get()).ok())
        else {
            return unreadable;
        };
        // One scope: the schema reads `sessionId` first and would leave a
        // `requestId` (one of the runtime's ids) to reach clients as it is.
        if params.is_some_and(|raw| has_both_scopes(raw.get())) {
            return unreadable;
        }
        let (mode, elicitation_id) = match &request.mode {
            ElicitationMode::Form(_) => (Mode::Form, None),
            ElicitationMode::Url(url) if is_web_url(&url.url) => {
                (Mode::Url, Some(Arc::from(&*url.elicitation_id.0)))
            }
            _ => return unreadable,
        };
        let request_id = match request.scope() {
            ElicitationScope::Request(scope) => {
                let id = serde_json::to_value(&scope.request_id).ok();
                match id.as_ref().and_then(Value::as_i64) {
                    Some(id) => Some(id),
                    // A request scope naming no id of the runtime's.
                    None => {
                        return Self {
                            mode: None,
                            ..unreadable
                        };
                    }
                }
            }
            _ => None,
        };
        Self {
            mode: Some(mode),
            request_id,
            elicitation_id,
        }
    }
}

/// Whether params (raw JSON object) carry both `sessionId` and `requestId`.
fn has_both_scopes(params: &str) -> bool {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Scopes<'a> {
        #[serde(borrow, default)]
        session_id: Option<&'a RawValue>,
        #[serde(borrow, default)]
        request_id: Option<&'a RawValue>,
    }
    serde_json::from_str::<Scopes<'_>>(params)
        .is_ok_and(|scopes| scopes.session_id.is_some() && scopes.request_id.is_some())
}

/// Whether a URL-mode question's `url` is one a person may be sent to: an
/// `http` or `https` URL (a `javascript:` or `file:` one is refused before
/// any client could show it as a link).
fn is_web_url(url: &str) -> bool {
    let lower = url.get(..8).unwrap_or(url).to_ascii_lowercase();
    lower.starts_with("https://") || lower.starts_with("http://")
}

/// The answer the runtime gives the agent on the clients' behalf: the
/// question was dismissed (session ended, turn cancelled, nobody can
/// answer it).
pub fn cancelled() -> Value {
    serde_json::json!({ "action": "cancel" })
}

/// Whether `method` is a question.
pub fn is_question(method: &str) -> bool {
    method == CREATE
}

/// Whether a permission request or a question: the requests a turn's
/// `session/cancel` answers on the clients' behalf (ACP: after
/// `session/cancel` the client answers them as cancelled).
pub fn cancelled_with_turn(method: &str) -> bool {
    method == method::SESSION_REQUEST_PERMISSION || is_question(method)
}

/// The agent's answer for a request of `method` it gets when the runtime
/// dismisses it: `cancelled` for a permission, `cancel` for a question;
/// `None` for other requests (they get an error).
pub fn dismissed_result(method: &str) -> Option<Value> {
    if method == method::SESSION_REQUEST_PERMISSION {
        Some(serde_json::json!({ "outcome": { "outcome": "cancelled" } }))
    } else if is_question(method) {
        Some(cancelled())
    } else {
        None
    }
}

/// The `_sandboxagent/request/resolved` outcome of a request of `method`
/// the runtime dismissed.
pub fn dismissed_outcome(method: &str) -> Value {
    if is_question(method) {
        cancelled()
    } else {
        serde_json::json!({ "outcome": "cancelled" })
    }
}

/// `line` (an `elicitation/create`) with `params.requestId` replaced by
/// `client_id`, the id the client gave that request; `None` when the line
/// cannot be read back (it was parsed before, so only in theory).
pub fn with_request_id(line: &[u8], client_id: &RawValue) -> Option<Bytes> {
    let mut message: Value = serde_json::from_slice(line).ok()?;
    let id: Value = serde_json::from_str(client_id.get()).ok()?;
    *message.get_mut("params")?.get_mut("requestId")? = id;
    serde_json::to_vec(&message).ok().map(Bytes::from)
}

/// Where an `elicitation/complete` goes: the session of its URL-mode
/// question, or the one connection a request-scoped question went to.
#[derive(Debug, Clone)]
pub enum CompleteTarget<C> {
    /// Recorded in the session's log and delivered to its connections.
    Session(Arc<str>),
    /// Delivered to this connection only.
    Connection(C),
}

/// The URL-mode questions of one process, by `elicitationId`, newest last,
/// at most [`URL_QUESTIONS_KEPT`].
#[derive(Debug)]
pub struct UrlQuestions<C> {
    kept: VecDeque<(Arc<str>, CompleteTarget<C>)>,
}

impl<C> Default for UrlQuestions<C> {
    fn default() -> Self {
        Self {
            kept: VecDeque::new(),
        }
    }
}

impl<C> UrlQuestions<C> {
    /// Remembers where `elicitation/complete` for `id` goes.
    pub fn remember(&mut self, id: Arc<str>, target: CompleteTarget<C>) {
        self.kept.retain(|(kept, _)| *kept != id);
        if self.kept.len() >= URL_QUESTIONS_KEPT {
            self.kept.pop_front();
        }
        self.kept.push_back((id, target));
    }

    /// Where `elicitation/complete` for `id` goes, forgetting it.
    pub fn take(&mut self, id: &str) -> Option<CompleteTarget<C>> {
        let index = self.kept.iter().position(|(kept, _)| &**kept == id)?;
        self.kept.remove(index).map(|(_, target)| target)
    }

    /// Forgets everything (the process is gone).
    pub fn clear(&mut self) {
        self.kept.clear();
    }
}

/// `params.elicitationId` of an `elicitation/complete`, when a string.
pub fn completed_id(params: Option<&RawValue>) -> Option<String> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Params {
        elicitation_id: String,
    }
    serde_json::from_str::<Params>(params?.get())
        .ok()
        .map(|params| params.elicitation_id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn raw(value: &Value) -> Box<RawValue> {
        RawValue::from_string(value.to_string()).expect("JSON")
    }

    #[test]
    fn reads_mode_scope_and_url_id() {
        let form = raw(&json!({"mode": "form", "sessionId": "s", "message": "m",
            "requestedSchema": {"type": "object", "properties": {}}}));
        let question = Question::read(Some(&form));
        assert_eq!(question.mode, Some(Mode::Form));
        assert_eq!(question.request_id, None);
        let url = raw(&json!({"mode": "url", "requestId": 7, "message": "m",
            "elicitationId": "e-1", "url": "https://example.invalid/"}));
        let question = Question::read(Some(&url));
        assert_eq!(question.mode, Some(Mode::Url));
        assert_eq!(question.request_id, Some(7));
        assert_eq!(question.elicitation_id.as_deref(), Some("e-1"));
    }

    #[test]
    fn unknown_mode_or_foreign_request_id_is_unreadable() {
        let other = raw(&json!({"mode": "telepathy", "sessionId": "s", "message": "m"}));
        assert_eq!(Question::read(Some(&other)).mode, None);
        let foreign = raw(&json!({"mode": "form", "requestId": "abc", "message": "m",
            "requestedSchema": {"type": "object", "properties": {}}}));
        assert_eq!(Question::read(Some(&foreign)).mode, None);
        assert_eq!(Question::read(None).mode, None);
        let both = raw(
            &json!({"mode": "form", "sessionId": "s", "requestId": 3, "message": "m",
            "requestedSchema": {"type": "object", "properties": {}}}),
        );
        assert_eq!(Question::read(Some(&both)).mode, None);
        for url in [
            "javascript:alert(1)",
            "file:///etc/passwd",
            "data:text/html,x",
            "",
        ] {
            let params = raw(&json!({"mode": "url", "sessionId": "s", "message": "m",
                "elicitationId": "e", "url": url}));
            assert_eq!(Question::read(Some(&params)).mode, None, "{url}");
        }
        let upper = raw(&json!({"mode": "url", "sessionId": "s", "message": "m",
            "elicitationId": "e", "url": "HTTPS://example.invalid/"}));
        assert_eq!(Question::read(Some(&upper)).mode, Some(Mode::Url));
    }

    #[test]
    fn declared_modes_follow_the_schema() {
        assert_eq!(
            modes_declared(&json!({"elicitation": {"form": {}, "url": {}}})),
            (true, true)
        );
        assert_eq!(
            modes_declared(&json!({"elicitation": {"form": {}}})),
            (true, false)
        );
        assert_eq!(modes_declared(&json!({"elicitation": {}})), (false, false));
        assert_eq!(
            modes_declared(&json!({"elicitation": true})),
            (false, false)
        );
        assert_eq!(modes_declared(&json!({})), (false, false));
    }

    #[test]
    fn request_id_is_rewritten_to_the_clients() {
        let line = br#"{"jsonrpc":"2.0","id":"q","method":"elicitation/create","params":{"mode":"form","requestId":3,"message":"m","requestedSchema":{"type":"object","properties":{}}}}"#;
        let rewritten = with_request_id(line, &raw(&json!("client-1"))).expect("rewritten");
        let value: Value = serde_json::from_slice(&rewritten).expect("JSON");
        assert_eq!(value["params"]["requestId"], "client-1");
        assert_eq!(value["id"], "q");
    }

    #[test]
    fn url_questions_are_bounded() {
        let mut questions = UrlQuestions::<()>::default();
        for index in 0..=URL_QUESTIONS_KEPT {
            questions.remember(
                index.to_string().into(),
                CompleteTarget::Session("s".into()),
            );
        }
        assert!(questions.take("0").is_none());
        assert!(questions.take("1").is_some());
        assert!(questions.take("1").is_none());
    }
}
