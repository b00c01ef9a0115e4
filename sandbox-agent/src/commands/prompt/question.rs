//! Questions of the agent (ACP elicitation) on the terminal: a form is
//! asked field by field on stderr, each answer read from stdin as one line
//! (terminal or pipe alike); a URL question shows the link (never opens
//! it) and asks whether to go on. `--deny` declines every question; stdin
//! at end of input declines too (research/contract.md, "`sandbox-agent
//! prompt`").

use super::{Flow, Interrupts, TurnView, one_line, read_stdin_line};
use sandbox_agent_sdk::QuestionRequest;
use sandbox_agent_sdk::schema::{
    ElicitationPropertySchema, ElicitationSchema, MultiSelectItems, StringPropertySchema,
};
use serde_json::Value;

/// What came back for one prompt of a question.
enum Reply {
    /// A line (without its line feed).
    Line(String),
    /// stdin is at end of input.
    Closed,
    /// Ctrl-C.
    Interrupted,
    /// The connection to the server closed: nobody can answer.
    ServerGone,
}

impl TurnView {
    /// Asks `question` (or declines it under `--deny`) and answers it.
    /// `Interrupted` when Ctrl-C came while it waited (it is cancelled).
    pub(super) async fn question(
        &mut self,
        question: QuestionRequest,
        interrupts: &mut Interrupts,
    ) -> Flow {
        let message = one_line(question.message()).into_owned();
        if self.deny_questions {
            self.note(&format!("[question] {message}: declined (--deny)"));
            self.decline(question);
            return Flow::Continue;
        }
        if let Some(url) = question.url() {
            let url = url.to_owned();
            return self
                .url_question(question, &message, &url, interrupts)
                .await;
        }
        let Some(schema) = question.schema().cloned() else {
            self.note(&format!(
                "[question] {message}: a kind of question this client cannot ask: declining"
            ));
            self.decline(question);
            return Flow::Continue;
        };
        self.note(&format!("[question] {message}"));
        for line in [&schema.title, &schema.description].into_iter().flatten() {
            self.note(&format!("  {}", one_line(line)));
        }
        let fields = fields(&schema);
        if let Some(ghost) = missing_required(&schema) {
            // No answer can satisfy the agent's own form.
            self.note(&format!(
                "[question] field {ghost:?} is required but not in the form: declining"
            ));
            self.decline(question);
            return Flow::Continue;
        }
        if !fields.iter().any(Field::askable) {
            // Nothing to fill in: the question itself is what is asked.
            return match self
                .confirm(question, "  Accept? (y/n): ", interrupts)
                .await
            {
                Ok(question) => {
                    if let Err(error) = question.accept(Value::Object(serde_json::Map::new())) {
                        self.note(&format!("[question] could not send the answer: {error}"));
                    }
                    Flow::Continue
                }
                Err(flow) => flow,
            };
        }
        let mut content = serde_json::Map::new();
        for field in fields {
            if !field.askable() {
                if field.required {
                    self.note(&format!(
                        "[question] field {:?} is of a kind this client cannot ask: declining",
                        field.name
                    ));
                    self.decline(question);
                    return Flow::Continue;
                }
                continue;
            }
            if let Some(description) = field.description() {
                self.note(&format!("  {}", one_line(description)));
            }
            loop {
                self.ask(&field.prompt());
                let line = match self.reply(interrupts).await {
                    Reply::Line(line) => line,
                    Reply::Closed => {
                        self.note("[question] no answer (stdin is closed): declining");
                        self.decline(question);
                        return Flow::Continue;
                    }
                    Reply::Interrupted => {
                        self.note("^C: cancelling the question and the turn");
                        if let Err(error) = question.cancel() {
                            self.note(&format!("[question] could not send the answer: {error}"));
                        }
                        return Flow::Interrupted;
                    }
                    Reply::ServerGone => return self.unanswerable(question),
                };
                match field.parse(&question, &line) {
                    Ok(Some(value)) => {
                        content.insert(field.name.to_owned(), value);
                        break;
                    }
                    Ok(None) => break,
                    Err(error) if self.terminal.stdin => self.note(&format!("  {error}")),
                    Err(error) => {
                        self.note(&format!("[question] {error}: declining"));
                        self.decline(question);
                        return Flow::Continue;
                    }
                }
            }
        }
        if let Err(error) = question.accept(Value::Object(content)) {
            self.note(&format!("[question] {error}: declining"));
            self.decline(question);
        }
        Flow::Continue
    }

    /// A URL question: the link, then "go on?" as y/n.
    async fn url_question(
        &mut self,
        question: QuestionRequest,
        message: &str,
        url: &str,
        interrupts: &mut Interrupts,
    ) -> Flow {
        self.note(&format!("[question] {message}"));
        self.note(&format!("  open this link: {}", one_line(url)));
        match self
            .confirm(question, "  Continue once done? (y/n): ", interrupts)
            .await
        {
            Ok(question) => {
                if let Err(error) = question.accept(()) {
                    self.note(&format!("[question] could not send the answer: {error}"));
                }
                Flow::Continue
            }
            Err(flow) => flow,
        }
    }

    /// Asks `prompt` as y/n (again on a terminal until the answer is one).
    /// Yes gives the question back to be accepted; every other outcome
    /// answers it here (no, unrecognised from a pipe, stdin closed: decline;
    /// Ctrl-C: cancel) and gives the flow.
    async fn confirm(
        &mut self,
        question: QuestionRequest,
        prompt: &str,
        interrupts: &mut Interrupts,
    ) -> Result<QuestionRequest, Flow> {
        loop {
            self.ask(prompt);
            let line = match self.reply(interrupts).await {
                Reply::Line(line) => line,
                Reply::Closed => {
                    self.note("[question] no answer (stdin is closed): declining");
                    self.decline(question);
                    return Err(Flow::Continue);
                }
                Reply::Interrupted => {
                    self.note("^C: cancelling the question and the turn");
                    if let Err(error) = question.cancel() {
                        self.note(&format!("[question] could not send the answer: {error}"));
                    }
                    return Err(Flow::Interrupted);
                }
                Reply::ServerGone => return Err(self.unanswerable(question)),
            };
            match yes_or_no(&line) {
                Some(true) => return Ok(question),
                Some(false) => {
                    self.decline(question);
                    return Err(Flow::Continue);
                }
                None if self.terminal.stdin => self.note("  please answer y or n"),
                None => {
                    self.note(&format!(
                        "[question] unrecognised answer {:?}: declining",
                        line.trim()
                    ));
                    self.decline(question);
                    return Err(Flow::Continue);
                }
            }
        }
    }

    /// A question nobody can answer any more (the server went away):
    /// dropped, said so, and the turn given up.
    fn unanswerable(&mut self, question: QuestionRequest) -> Flow {
        self.note("[question] no answer can reach the agent: the server went away");
        drop(question);
        Flow::ServerGone
    }

    /// One line of stdin for the prompt just asked; a piped answer is
    /// shown after it (a terminal echoes what is typed).
    async fn reply(&mut self, interrupts: &mut Interrupts) -> Reply {
        let gone = interrupts.server_gone();
        let line = tokio::select! {
            line = read_stdin_line() => line,
            () = interrupts.next() => return Reply::Interrupted,
            () = gone => return Reply::ServerGone,
        };
        let Some(line) = line else {
            return Reply::Closed;
        };
        let line = line.trim_end_matches(['\n', '\r']).to_owned();
        // The user's Enter ended the prompt's line on a terminal.
        self.question_open = false;
        if !self.terminal.stdin {
            self.note(line.trim());
        }
        Reply::Line(line)
    }

    fn decline(&mut self, question: QuestionRequest) {
        if let Err(error) = question.decline() {
            self.note(&format!("[question] could not send the answer: {error}"));
        }
    }
}

/// One field of a form, as asked.
struct Field<'a> {
    name: &'a str,
    property: &'a ElicitationPropertySchema,
    required: bool,
}

/// The fields of `schema`: the required ones first, each group in name
/// order (the ACP type keeps properties by name, not in the agent's order).
fn fields(schema: &ElicitationSchema) -> Vec<Field<'_>> {
    let required = schema.required.as_deref().unwrap_or_default();
    let mut fields: Vec<Field<'_>> = schema
        .properties
        .iter()
        .map(|(name, property)| Field {
            name,
            property,
            required: required.contains(name),
        })
        .collect();
    fields.sort_by_key(|field| !field.required);
    fields
}

impl Field<'_> {
    /// Whether the terminal can ask it (a kind the ACP schema names).
    fn askable(&self) -> bool {
        matches!(
            self.property,
            ElicitationPropertySchema::String(_)
                | ElicitationPropertySchema::Number(_)
                | ElicitationPropertySchema::Integer(_)
                | ElicitationPropertySchema::Boolean(_)
                | ElicitationPropertySchema::Array(_)
        )
    }

    fn title(&self) -> &str {
        let title = match self.property {
            ElicitationPropertySchema::String(p) => p.title.as_deref(),
            ElicitationPropertySchema::Number(p) => p.title.as_deref(),
            ElicitationPropertySchema::Integer(p) => p.title.as_deref(),
            ElicitationPropertySchema::Boolean(p) => p.title.as_deref(),
            ElicitationPropertySchema::Array(p) => p.title.as_deref(),
            _ => None,
        };
        title.unwrap_or(self.name)
    }

    fn description(&self) -> Option<&str> {
        match self.property {
            ElicitationPropertySchema::String(p) => p.description.as_deref(),
            ElicitationPropertySchema::Number(p) => p.description.as_deref(),
            ElicitationPropertySchema::Integer(p) => p.description.as_deref(),
            ElicitationPropertySchema::Boolean(p) => p.description.as_deref(),
            ElicitationPropertySchema::Array(p) => p.description.as_deref(),
            _ => None,
        }
    }

    /// The choices of a single or multiple choice, as `(value, label)`.
    fn choices(&self) -> Vec<(&str, &str)> {
        match self.property {
            ElicitationPropertySchema::String(string) => string_choices(string),
            ElicitationPropertySchema::Array(array) => match &array.items {
                MultiSelectItems::String(items) => items
                    .values
                    .iter()
                    .map(|v| (v.as_str(), v.as_str()))
                    .collect(),
                MultiSelectItems::Titled(items) => items
                    .options
                    .iter()
                    .map(|o| (o.value.as_str(), o.title.as_str()))
                    .collect(),
                _ => Vec::new(),
            },
            _ => Vec::new(),
        }
    }

    /// The prompt: the title, the numbered choices, and what is expected
    /// (`  Name (1 to 64 characters): `).
    fn prompt(&self) -> String {
        let choices = self.choices();
        let mut hints = Vec::new();
        match self.property {
            ElicitationPropertySchema::String(string) if choices.is_empty() => {
                if let Some(length) = length_hint(string) {
                    hints.push(length);
                }
            }
            ElicitationPropertySchema::String(_) => hints.push(format!("1-{}", choices.len())),
            ElicitationPropertySchema::Number(number) => {
                hints.push(bounds_hint("a number", number.minimum, number.maximum));
            }
            ElicitationPropertySchema::Integer(integer) => {
                hints.push(bounds_hint("an integer", integer.minimum, integer.maximum));
            }
            ElicitationPropertySchema::Boolean(_) => hints.push("y/n".to_owned()),
            ElicitationPropertySchema::Array(_) => {
                hints.push(format!("numbers 1-{} separated by commas", choices.len()));
            }
            _ => {}
        }
        if let Some(default) = self.default() {
            hints.push(format!("Enter for {}", one_line(&shown(&default))));
        } else if !self.required {
            hints.push("Enter to skip".to_owned());
        }
        let mut prompt = String::new();
        for (index, (value, label)) in choices.iter().enumerate() {
            let (value, label) = (one_line(value), one_line(label));
            if value == label {
                prompt.push_str(&format!("    {}) {value}\n", index + 1));
            } else {
                prompt.push_str(&format!("    {}) {label} ({value})\n", index + 1));
            }
        }
        prompt.push_str(&format!("  {}", one_line(self.title())));
        if !hints.is_empty() {
            prompt.push_str(&format!(" ({})", hints.join("; ")));
        }
        prompt.push_str(": ");
        prompt
    }

    /// The form's default value of the field, if it has one.
    fn default(&self) -> Option<Value> {
        match self.property {
            ElicitationPropertySchema::String(p) => p.default.clone().map(Value::from),
            ElicitationPropertySchema::Number(p) => p.default.map(Value::from),
            ElicitationPropertySchema::Integer(p) => p.default.map(Value::from),
            ElicitationPropertySchema::Boolean(p) => p.default.map(Value::from),
            ElicitationPropertySchema::Array(p) => p.default.clone().map(Value::from),
            _ => None,
        }
    }

    /// The value `line` gives the field, checked by the SDK against the
    /// form; `None` for an optional field skipped with an empty line.
    ///
    /// # Errors
    /// What is wrong, naming the field (the SDK's `invalid answer: field
    /// "name" …`).
    fn parse(&self, question: &QuestionRequest, line: &str) -> Result<Option<Value>, String> {
        let text = line.trim();
        let invalid = |what: String| format!("invalid answer: field {:?} {what}", self.name);
        if text.is_empty() {
            return match self.default() {
                Some(default) => Ok(Some(default)),
                None if self.required => Err(invalid("is required".to_owned())),
                None => Ok(None),
            };
        }
        let choices = self.choices();
        let value = match self.property {
            ElicitationPropertySchema::String(_) => Value::from(choice(text, &choices)),
            ElicitationPropertySchema::Number(_) => match text.parse::<f64>() {
                Ok(number) => Value::from(number),
                Err(_) => return Err(invalid(format!("must be a number, not {text:?}"))),
            },
            ElicitationPropertySchema::Integer(_) => match text.parse::<i64>() {
                Ok(number) => Value::from(number),
                Err(_) => return Err(invalid(format!("must be an integer, not {text:?}"))),
            },
            ElicitationPropertySchema::Boolean(_) => match yes_or_no(text) {
                Some(flag) => Value::from(flag),
                None => return Err(invalid(format!("must be y or n, not {text:?}"))),
            },
            ElicitationPropertySchema::Array(_) => Value::from(
                text.split(',')
                    .map(str::trim)
                    .filter(|item| !item.is_empty())
                    .map(|item| choice(item, &choices))
                    .collect::<Vec<_>>(),
            ),
            _ => return Err(invalid("is of a kind this client cannot ask".to_owned())),
        };
        question
            .check_field(self.name, &value)
            .map(|_| Some(value))
            .map_err(|error| error.to_string())
    }
}

/// A required field the form does not define, if any.
fn missing_required(schema: &ElicitationSchema) -> Option<&str> {
    schema
        .required
        .as_deref()
        .unwrap_or_default()
        .iter()
        .find(|name| !schema.properties.contains_key(*name))
        .map(String::as_str)
}

/// A string property's choices (`enum`, else `oneOf`), as `(value, label)`.
fn string_choices(string: &StringPropertySchema) -> Vec<(&str, &str)> {
    match (&string.enum_values, &string.one_of) {
        (Some(values), _) => values.iter().map(|v| (v.as_str(), v.as_str())).collect(),
        (None, Some(options)) => options
            .iter()
            .map(|o| (o.value.as_str(), o.title.as_str()))
            .collect(),
        (None, None) => Vec::new(),
    }
}

/// The value `text` names among `choices`: its number (from 1), else
/// `text` itself (checked afterwards).
fn choice(text: &str, choices: &[(&str, &str)]) -> String {
    text.parse::<usize>()
        .ok()
        .and_then(|number| number.checked_sub(1))
        .and_then(|index| choices.get(index))
        .map_or_else(|| text.to_owned(), |(value, _)| (*value).to_owned())
}

/// `1 to 64 characters`, `at least 3 characters`, … for a string's length
/// bounds.
fn length_hint(string: &StringPropertySchema) -> Option<String> {
    match (string.min_length, string.max_length) {
        (Some(min), Some(max)) => Some(format!("{min} to {max} characters")),
        (Some(min), None) => Some(format!("at least {min} characters")),
        (None, Some(max)) => Some(format!("at most {max} characters")),
        (None, None) => None,
    }
}

/// `a number from 0 to 1`, `an integer of at least 1`, … .
fn bounds_hint<T: std::fmt::Display>(kind: &str, min: Option<T>, max: Option<T>) -> String {
    match (min, max) {
        (Some(min), Some(max)) => format!("{kind} from {min} to {max}"),
        (Some(min), None) => format!("{kind} of at least {min}"),
        (None, Some(max)) => format!("{kind} of at most {max}"),
        (None, None) => kind.to_owned(),
    }
}

/// `y`/`yes`/`true` or `n`/`no`/`false`, in any case.
fn yes_or_no(text: &str) -> Option<bool> {
    match text.trim().to_ascii_lowercase().as_str() {
        "y" | "yes" | "true" => Some(true),
        "n" | "no" | "false" => Some(false),
        _ => None,
    }
}

/// A default value as the prompt shows it.
fn shown(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Bool(true) => "y".to_owned(),
        Value::Bool(false) => "n".to_owned(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_agent_sdk::schema::IntegerPropertySchema;

    /// The mock agent's own `ask question` form, with an integer field.
    fn mock_form() -> ElicitationSchema {
        crate::commands::mock_agent::question_form().property(
            "count",
            IntegerPropertySchema::new().minimum(1).maximum(3),
            false,
        )
    }

    #[test]
    fn required_fields_come_first_and_prompts_say_what_is_expected() {
        let schema = mock_form();
        let prompts: Vec<String> = fields(&schema).iter().map(Field::prompt).collect();
        assert_eq!(
            prompts,
            [
                "  Name (1 to 64 characters): ",
                "    1) red\n    2) green\n    3) blue\n  Favourite colour (1-3; Enter to skip): ",
                "  Confirm (y/n; Enter to skip): ",
                "  count (an integer from 1 to 3; Enter to skip): ",
            ]
        );
    }

    #[test]
    fn choices_are_numbers_or_values_and_booleans_y_or_n() {
        let choices = [("red", "red"), ("green", "green")];
        assert_eq!(choice("2", &choices), "green");
        assert_eq!(choice("red", &choices), "red");
        assert_eq!(choice("3", &choices), "3");
        assert_eq!(yes_or_no(" Yes"), Some(true));
        assert_eq!(yes_or_no("n"), Some(false));
        assert_eq!(yes_or_no("maybe"), None);
    }
}
