//! Questions of the agent (ACP elicitation, `elicitation/create`):
//! [`QuestionRequest`] with its responder, and the check of an answer
//! against the form the agent asked for.
//!
//! The rules of a form come from the ACP schema (`ElicitationSchema`, a
//! restricted JSON Schema: an object of flat properties, each a string,
//! number, integer, boolean or multi-select array). An answer is checked
//! before it is sent, so a mistake is the caller's to fix rather than the
//! agent's to refuse (research/contract.md, "The SDK and `sandbox-agent
//! prompt`").

use crate::error::Error;
use crate::pending::Pending;
use agent_client_protocol::v1::Responder;
use agent_client_protocol::v1::schema::{
    CreateElicitationRequest, CreateElicitationResponse, ElicitationAcceptAction,
    ElicitationAction, ElicitationContentValue, ElicitationId, ElicitationMode,
    ElicitationPropertySchema, ElicitationSchema, ElicitationScope, IntegerPropertySchema,
    MultiSelectItems, MultiSelectPropertySchema, NumberPropertySchema, RequestId, SessionId,
    StringPropertySchema, ToolCallId,
};
use futures::future::BoxFuture;
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// A question handler (see
/// [`ClientOptions::question_handler`](crate::ClientOptions::question_handler)):
/// given what the agent asks, the ACP answer (`ElicitationAction`).
pub type QuestionHandler =
    Arc<dyn Fn(CreateElicitationRequest) -> BoxFuture<'static, ElicitationAction> + Send + Sync>;

/// The content of an accepted form: ACP's map of field name to value.
pub type QuestionContent = BTreeMap<String, ElicitationContentValue>;

/// A question of the agent (ACP `elicitation/create`), waiting for an
/// answer: it carries its responder.
///
/// Two modes (ACP `ElicitationMode`):
/// - **form**: [`schema`](Self::schema) is the form (a title, properties,
///   the required ones); answer with [`accept`](Self::accept) and the
///   values, which are checked against it first.
/// - **URL**: the agent wants the person to open [`url`](Self::url) (for
///   example to sign in somewhere); [`accept`](Self::accept) with no
///   content (`()`) says they went. The agent may later send
///   `elicitation/complete` for its [`elicitation_id`](Self::elicitation_id)
///   ([`Event::QuestionCompleted`](crate::Event::QuestionCompleted)).
///
/// Or [`decline`](Self::decline) (the person said no) or
/// [`cancel`](Self::cancel) (dismissed without a choice). Dropping it
/// unanswered answers "cancel", so the agent never waits forever. Once
/// handed to you (by [`Events`](crate::Events) or a
/// [`TurnStream`](crate::TurnStream)) it waits for your answer as long as
/// you keep it.
pub struct QuestionRequest {
    request: CreateElicitationRequest,
    pending: Pending<CreateElicitationResponse>,
}

impl QuestionRequest {
    pub(crate) fn new(
        request: CreateElicitationRequest,
        responder: Responder<CreateElicitationResponse>,
    ) -> QuestionRequest {
        QuestionRequest {
            request,
            pending: Pending::new(responder),
        }
    }

    /// Marks the question as handed to a reader; `false` when it was
    /// answered already (expired unread).
    pub(crate) fn claim(&self) -> bool {
        self.pending.claim()
    }

    /// Answers "cancel" after `limit` unless a reader claimed the question
    /// by then (or it was answered); logs a warning when it does.
    pub(crate) fn expire_unread_after(&self, limit: Duration) {
        let message = self.request.message.clone();
        let session = self.session_id().map(|id| id.0.to_string());
        self.pending.expire_unread_after(limit, move |responder| {
            tracing::warn!(
                session = session.as_deref().unwrap_or("-"),
                question = %message,
                ?limit,
                "a question of the agent was not read within the limit and is answered \"cancel\": \
                 set ClientOptions::question_handler, or read Events or the turn's TurnStream \
                 (ClientOptions::unread_question_timeout)"
            );
            if let Err(error) =
                responder.respond(CreateElicitationResponse::new(ElicitationAction::Cancel))
            {
                tracing::debug!(%error, "answering an expired question failed");
            }
        });
    }

    /// What the agent asks, as sent (`elicitation/create` params).
    pub fn request(&self) -> &CreateElicitationRequest {
        &self.request
    }

    /// The agent's text for the person (what it needs and why).
    pub fn message(&self) -> &str {
        &self.request.message
    }

    /// The mode: form (with its schema), URL (with its URL and
    /// elicitation id), or one this crate does not know.
    pub fn mode(&self) -> &ElicitationMode {
        &self.request.mode
    }

    /// The form to fill in, for a form-mode question.
    pub fn schema(&self) -> Option<&ElicitationSchema> {
        match &self.request.mode {
            ElicitationMode::Form(form) => Some(&form.requested_schema),
            _ => None,
        }
    }

    /// The URL to open, for a URL-mode question. Show it; opening it is
    /// the person's choice.
    pub fn url(&self) -> Option<&str> {
        match &self.request.mode {
            ElicitationMode::Url(url) => Some(&url.url),
            _ => None,
        }
    }

    /// The agent's id of a URL-mode question, which its
    /// `elicitation/complete` names.
    pub fn elicitation_id(&self) -> Option<&ElicitationId> {
        match &self.request.mode {
            ElicitationMode::Url(url) => Some(&url.elicitation_id),
            _ => None,
        }
    }

    /// What the question belongs to: a session (perhaps one tool call of
    /// it), or a request outside any session (such as `authenticate`).
    pub fn scope(&self) -> &ElicitationScope {
        self.request.scope()
    }

    /// The session of a session-scoped question.
    pub fn session_id(&self) -> Option<&SessionId> {
        match self.scope() {
            ElicitationScope::Session(scope) => Some(&scope.session_id),
            _ => None,
        }
    }

    /// The tool call a session-scoped question belongs to, if the agent
    /// named one.
    pub fn tool_call_id(&self) -> Option<&ToolCallId> {
        match self.scope() {
            ElicitationScope::Session(scope) => scope.tool_call_id.as_ref(),
            _ => None,
        }
    }

    /// The request (its id as the agent sent it) a request-scoped question
    /// belongs to.
    pub fn request_id(&self) -> Option<&RequestId> {
        match self.scope() {
            ElicitationScope::Request(scope) => Some(&scope.request_id),
            _ => None,
        }
    }

    /// `content` checked against the question without answering it: the
    /// ACP content [`accept`](Self::accept) would send.
    ///
    /// `content` is anything that serializes to a JSON object of field
    /// name to value (`serde_json::json!({...})`, a [`QuestionContent`], a
    /// struct); `()` (null) is no content. Form mode: every required field
    /// present; no field the form does not have; each value of its
    /// field's type (a string; a number; an integer; `true`/`false`; an
    /// array of strings); a string within `minLength`/`maxLength` (in
    /// characters) and one of its `enum` / `oneOf` values when it has
    /// them; a number or integer within `minimum`/`maximum`; an array's
    /// items among its values and their count within
    /// `minItems`/`maxItems`. A null value counts as left out. `pattern`
    /// and `format` are not checked (the agent does). URL mode: no
    /// content (null or `{}`). A mode this crate does not know: any
    /// object, unchecked.
    ///
    /// # Errors
    /// [`Error::InvalidAnswer`] naming the first field that is wrong (in
    /// the form's field order) and what is wrong with it.
    pub fn check(&self, content: impl Serialize) -> Result<Option<QuestionContent>, Error> {
        let content = serde_json::to_value(content).map_err(|error| {
            Error::invalid_answer(None, format!("the content does not serialize: {error}"))
        })?;
        match &self.request.mode {
            ElicitationMode::Form(form) => check_form(&form.requested_schema, content).map(Some),
            ElicitationMode::Url(_) => match content {
                Value::Null => Ok(None),
                Value::Object(map) if map.is_empty() => Ok(None),
                _ => Err(Error::invalid_answer(
                    None,
                    "a URL-mode question takes no content (accept it with `()`)",
                )),
            },
            _ => match content {
                Value::Null => Ok(None),
                other => serde_json::from_value(other).map(Some).map_err(|error| {
                    Error::invalid_answer(None, format!("not a map of field values: {error}"))
                }),
            },
        }
    }

    /// One field's value checked against its property in the form, by the
    /// rules of [`check`](Self::check) (a null is refused): the ACP value
    /// it becomes. For asking field by field, as a form on a terminal does.
    ///
    /// # Errors
    /// [`Error::InvalidAnswer`] naming `field`: not a field of the form (or
    /// not a form-mode question), or a value that does not fit it.
    pub fn check_field(
        &self,
        field: &str,
        value: impl Serialize,
    ) -> Result<ElicitationContentValue, Error> {
        let property = self
            .schema()
            .and_then(|schema| schema.properties.get(field))
            .ok_or_else(|| Error::invalid_answer(Some(field), "is not a field of the form"))?;
        let value = serde_json::to_value(value).map_err(|error| {
            Error::invalid_answer(Some(field), format!("does not serialize: {error}"))
        })?;
        if value.is_null() {
            return Err(Error::invalid_answer(Some(field), "has no value"));
        }
        check_value(property, value).map_err(|message| Error::invalid_answer(Some(field), message))
    }

    /// Accepts the question with `content` (see [`check`](Self::check)
    /// for what it may be and how it is checked): `{"action": "accept",
    /// "content": {...}}`, or with no `content` for a URL question.
    ///
    /// Takes `&self`: a rejected answer leaves the question unanswered, to
    /// be answered again (fixed, declined or cancelled).
    ///
    /// # Errors
    /// [`Error::InvalidAnswer`] when `content` does not fit the question
    /// (nothing is sent) or the question was answered already;
    /// [`Error::ConnectionLost`] when the answer cannot be sent.
    pub fn accept(&self, content: impl Serialize) -> Result<(), Error> {
        let content = self.check(content)?;
        self.send(ElicitationAction::Accept(
            ElicitationAcceptAction::new().content(content),
        ))
    }

    /// Declines the question (`{"action": "decline"}`): the person said no.
    ///
    /// # Errors
    /// [`Error::InvalidAnswer`] when it was answered already;
    /// [`Error::ConnectionLost`] when the answer cannot be sent.
    pub fn decline(self) -> Result<(), Error> {
        self.send(ElicitationAction::Decline)
    }

    /// Cancels the question (`{"action": "cancel"}`): dismissed without a
    /// choice. Dropping the question unanswered does the same.
    ///
    /// # Errors
    /// [`Error::InvalidAnswer`] when it was answered already;
    /// [`Error::ConnectionLost`] when the answer cannot be sent.
    pub fn cancel(self) -> Result<(), Error> {
        self.send(ElicitationAction::Cancel)
    }

    /// Answers with an ACP action as it is; an `accept`'s content is
    /// checked first, as by [`accept`](Self::accept).
    ///
    /// # Errors
    /// As [`accept`](Self::accept).
    pub fn respond(&self, action: ElicitationAction) -> Result<(), Error> {
        match action {
            ElicitationAction::Accept(accept) => self.accept(accept.content),
            other => self.send(other),
        }
    }

    fn send(&self, action: ElicitationAction) -> Result<(), Error> {
        let Some(responder) = self.pending.take() else {
            return Err(Error::invalid_answer(
                None,
                "the question was answered already",
            ));
        };
        // Sending an answer fails only when the connection is gone.
        responder
            .respond(CreateElicitationResponse::new(action))
            .map_err(|error| Error::ConnectionLost {
                message: format!("cannot answer the question: {}", error.message),
                source: Some(Box::new(error)),
            })
    }
}

impl Drop for QuestionRequest {
    fn drop(&mut self) {
        if self.pending.is_answered() {
            return;
        }
        if let Err(error) = self.send(ElicitationAction::Cancel) {
            tracing::debug!(%error, "answering a dropped question failed");
        }
    }
}

impl std::fmt::Debug for QuestionRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuestionRequest")
            .field("request", &self.request)
            .field("answered", &self.pending.is_answered())
            .finish()
    }
}

/// `content` (a JSON object, or null for none) checked against `schema`
/// and converted to ACP values, field by field in the schema's order.
fn check_form(schema: &ElicitationSchema, content: Value) -> Result<QuestionContent, Error> {
    let mut given = match content {
        Value::Null => serde_json::Map::new(),
        Value::Object(map) => map,
        other => {
            return Err(Error::invalid_answer(
                None,
                format!("the content must be an object of field values, not {other}"),
            ));
        }
    };
    given.retain(|_, value| !value.is_null());
    if let Some(name) = given
        .keys()
        .find(|name| !schema.properties.contains_key(*name))
    {
        return Err(Error::invalid_answer(
            Some(name.as_str()),
            "is not a field of the form",
        ));
    }
    let required = schema.required.as_deref().unwrap_or_default();
    if let Some(ghost) = required
        .iter()
        .find(|name| !schema.properties.contains_key(*name))
    {
        return Err(Error::invalid_answer(
            Some(ghost.as_str()),
            "is required but not a field of the form (no answer can satisfy it)",
        ));
    }
    let mut content = QuestionContent::new();
    for (name, property) in &schema.properties {
        let Some(value) = given.remove(name) else {
            if required.contains(name) {
                return Err(Error::invalid_answer(Some(name.as_str()), "is required"));
            }
            continue;
        };
        let value = check_value(property, value)
            .map_err(|message| Error::invalid_answer(Some(name.as_str()), message))?;
        content.insert(name.clone(), value);
    }
    Ok(content)
}

/// One field's value checked against its property; the message says what
/// is wrong (after the field's name).
fn check_value(
    property: &ElicitationPropertySchema,
    value: Value,
) -> Result<ElicitationContentValue, String> {
    match property {
        ElicitationPropertySchema::String(string) => check_string(string, value),
        ElicitationPropertySchema::Number(number) => check_number(number, &value),
        ElicitationPropertySchema::Integer(integer) => check_integer(integer, &value),
        ElicitationPropertySchema::Boolean(_) => match value {
            Value::Bool(flag) => Ok(ElicitationContentValue::Boolean(flag)),
            other => Err(format!("must be true or false, not {other}")),
        },
        ElicitationPropertySchema::Array(array) => check_array(array, value),
        _ => serde_json::from_value(value.clone())
            .map_err(|_| format!("cannot be sent as an answer: {value}")),
    }
}

fn check_string(
    property: &StringPropertySchema,
    value: Value,
) -> Result<ElicitationContentValue, String> {
    let Value::String(text) = value else {
        return Err(format!("must be a string, not {value}"));
    };
    let length = text.chars().count();
    if let Some(min) = property.min_length
        && length < min as usize
    {
        return Err(format!(
            "must be at least {min} character{} long (is {length})",
            plural(min)
        ));
    }
    if let Some(max) = property.max_length
        && length > max as usize
    {
        return Err(format!(
            "must be at most {max} character{} long (is {length})",
            plural(max)
        ));
    }
    let allowed: Option<Vec<&str>> = match (&property.enum_values, &property.one_of) {
        (Some(values), _) => Some(values.iter().map(String::as_str).collect()),
        (None, Some(options)) => Some(options.iter().map(|o| o.value.as_str()).collect()),
        (None, None) => None,
    };
    if let Some(allowed) = allowed
        && !allowed.contains(&text.as_str())
    {
        return Err(format!("must be one of {}, not {text:?}", quoted(&allowed)));
    }
    Ok(ElicitationContentValue::String(text))
}

fn check_number(
    property: &NumberPropertySchema,
    value: &Value,
) -> Result<ElicitationContentValue, String> {
    let Some(number) = value.as_f64() else {
        return Err(format!("must be a number, not {value}"));
    };
    within(number, property.minimum, property.maximum)?;
    Ok(ElicitationContentValue::Number(number))
}

fn check_integer(
    property: &IntegerPropertySchema,
    value: &Value,
) -> Result<ElicitationContentValue, String> {
    let Some(number) = value.as_i64() else {
        return Err(format!("must be an integer, not {value}"));
    };
    within(number, property.minimum, property.maximum)?;
    Ok(ElicitationContentValue::Integer(number))
}

/// `number` checked against a property's `minimum` and `maximum`.
fn within<T: PartialOrd + std::fmt::Display>(
    number: T,
    min: Option<T>,
    max: Option<T>,
) -> Result<(), String> {
    if let Some(min) = min
        && number < min
    {
        return Err(format!("must be at least {min} (is {number})"));
    }
    if let Some(max) = max
        && number > max
    {
        return Err(format!("must be at most {max} (is {number})"));
    }
    Ok(())
}

fn check_array(
    property: &MultiSelectPropertySchema,
    value: Value,
) -> Result<ElicitationContentValue, String> {
    let items: Option<Vec<String>> = match &value {
        Value::Array(items) => items
            .iter()
            .map(|item| item.as_str().map(str::to_owned))
            .collect(),
        _ => None,
    };
    let Some(items) = items else {
        return Err(format!("must be an array of strings, not {value}"));
    };
    let allowed: Option<Vec<&str>> = match &property.items {
        MultiSelectItems::String(strings) => {
            Some(strings.values.iter().map(String::as_str).collect())
        }
        MultiSelectItems::Titled(titled) => {
            Some(titled.options.iter().map(|o| o.value.as_str()).collect())
        }
        _ => None,
    };
    if let Some(allowed) = allowed {
        // A set: an agent's form may list many choices, and an answer may
        // hold each of them.
        let set: std::collections::HashSet<&str> = allowed.iter().copied().collect();
        if let Some(item) = items.iter().find(|item| !set.contains(item.as_str())) {
            return Err(format!("may only hold {}, not {item:?}", quoted(&allowed)));
        }
    }
    let count = items.len() as u64;
    if let Some(min) = property.min_items
        && count < min
    {
        return Err(format!("must hold at least {min} (holds {count})"));
    }
    if let Some(max) = property.max_items
        && count > max
    {
        return Err(format!("must hold at most {max} (holds {count})"));
    }
    Ok(ElicitationContentValue::StringArray(items))
}

/// `"a", "b", "c"`.
/// The choices for an error message, quoted: at most [`QUOTED_MAX`] of
/// them, then how many more.
fn quoted(values: &[&str]) -> String {
    let mut listed = values
        .iter()
        .take(QUOTED_MAX)
        .map(|value| format!("{value:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    if values.len() > QUOTED_MAX {
        listed.push_str(&format!(" (and {} more)", values.len() - QUOTED_MAX));
    }
    listed
}

/// Most choices an error message lists.
const QUOTED_MAX: usize = 10;

fn plural(count: u32) -> &'static str {
    if count == 1 { "" } else { "s" }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_client_protocol::v1::schema::{BooleanPropertySchema, EnumOption};
    use serde_json::json;

    /// The mock agent's `ask question` form, plus a number, an integer and
    /// a multi-select.
    fn form() -> ElicitationSchema {
        ElicitationSchema::new()
            .property(
                "name",
                StringPropertySchema::new().min_length(1).max_length(4),
                true,
            )
            .property(
                "color",
                StringPropertySchema::new().enum_values(vec!["red".into(), "green".into()]),
                false,
            )
            .property(
                "size",
                StringPropertySchema::new().one_of(vec![EnumOption::new("s", "Small")]),
                false,
            )
            .property("confirm", BooleanPropertySchema::new(), false)
            .property(
                "ratio",
                NumberPropertySchema::new().minimum(0.0).maximum(1.0),
                false,
            )
            .property(
                "count",
                IntegerPropertySchema::new().minimum(1).maximum(3),
                false,
            )
            .property(
                "tags",
                MultiSelectPropertySchema::new(vec!["a".into(), "b".into()]).max_items(1),
                false,
            )
    }

    fn error(content: Value) -> String {
        match check_form(&form(), content) {
            Err(Error::InvalidAnswer { field, message }) => {
                format!("{}: {message}", field.unwrap_or_default())
            }
            other => panic!("accepted: {other:?}"),
        }
    }

    #[test]
    fn a_fitting_answer_becomes_acp_values() {
        let content = check_form(
            &form(),
            json!({"name": "Ada", "color": "green", "size": "s", "confirm": true,
                   "ratio": 0.5, "count": 2, "tags": ["b"], "skipped": null}),
        );
        let content = match content {
            Ok(content) => content,
            Err(error) => panic!("{error}"),
        };
        assert_eq!(
            content["name"],
            ElicitationContentValue::String("Ada".into())
        );
        assert_eq!(content["confirm"], ElicitationContentValue::Boolean(true));
        assert_eq!(content["ratio"], ElicitationContentValue::Number(0.5));
        assert_eq!(content["count"], ElicitationContentValue::Integer(2));
        assert_eq!(
            content["tags"],
            ElicitationContentValue::StringArray(vec!["b".into()])
        );
        // Optional fields may be left out.
        assert!(check_form(&form(), json!({"name": "Ada"})).is_ok());
    }

    #[test]
    fn each_rule_names_the_field() {
        assert_eq!(error(json!({})), "name: is required");
        assert_eq!(error(json!({"name": null})), "name: is required");
        assert_eq!(
            error(json!({"name": ""})),
            "name: must be at least 1 character long (is 0)"
        );
        assert_eq!(
            error(json!({"name": "Adaline"})),
            "name: must be at most 4 characters long (is 7)"
        );
        assert_eq!(error(json!({"name": 7})), "name: must be a string, not 7");
        assert_eq!(
            error(json!({"name": "Ada", "color": "blue"})),
            "color: must be one of \"red\", \"green\", not \"blue\""
        );
        assert_eq!(
            error(json!({"name": "Ada", "size": "xl"})),
            "size: must be one of \"s\", not \"xl\""
        );
        assert_eq!(
            error(json!({"name": "Ada", "confirm": "yes"})),
            "confirm: must be true or false, not \"yes\""
        );
        assert_eq!(
            error(json!({"name": "Ada", "ratio": 2})),
            "ratio: must be at most 1 (is 2)"
        );
        assert_eq!(
            error(json!({"name": "Ada", "count": 1.5})),
            "count: must be an integer, not 1.5"
        );
        assert_eq!(
            error(json!({"name": "Ada", "count": 0})),
            "count: must be at least 1 (is 0)"
        );
        assert_eq!(
            error(json!({"name": "Ada", "tags": ["c"]})),
            "tags: may only hold \"a\", \"b\", not \"c\""
        );
        assert_eq!(
            error(json!({"name": "Ada", "tags": ["a", "b"]})),
            "tags: must hold at most 1 (holds 2)"
        );
        assert_eq!(
            error(json!({"name": "Ada", "extra": 1})),
            "extra: is not a field of the form"
        );
        assert_eq!(
            error(json!(["Ada"])),
            ": the content must be an object of field values, not [\"Ada\"]"
        );
    }

    #[test]
    fn a_required_field_the_form_lacks_cannot_be_answered() {
        let mut schema = form();
        schema.required = Some(vec!["ghost".to_owned()]);
        match check_form(&schema, json!({"name": "Ada"})) {
            Err(Error::InvalidAnswer { field, message }) => {
                assert_eq!(field.as_deref(), Some("ghost"));
                assert!(message.contains("not a field of the form"), "{message}");
            }
            other => panic!("accepted: {other:?}"),
        }
    }

    #[test]
    fn many_choices_are_checked_at_once_and_listed_briefly() {
        let values: Vec<String> = (0..50_000).map(|n| format!("c{n}")).collect();
        let schema = ElicitationSchema::new().property(
            "tags",
            MultiSelectPropertySchema::new(values.clone()),
            false,
        );
        assert!(check_form(&schema, json!({ "tags": values })).is_ok());
        match check_form(&schema, json!({"tags": ["nope"]})) {
            Err(Error::InvalidAnswer { message, .. }) => {
                assert!(
                    message.ends_with("(and 49990 more), not \"nope\""),
                    "{message}"
                );
            }
            other => panic!("accepted: {other:?}"),
        }
    }

    #[test]
    fn length_counts_characters_not_bytes() {
        assert!(check_form(&form(), json!({"name": "Zoë"})).is_ok());
        assert!(check_form(&form(), json!({"name": "日本語"})).is_ok());
    }
}
