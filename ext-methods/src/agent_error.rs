//! What the runtime adds to an agent's JSON-RPC error answer:
//! `error.data["sandboxagent.dev"]` with the agent's stderr since the
//! request was forwarded and, where it applies, a hint
//! (research/contract.md, "Agent errors: stderr and hint").
//!
//! The agent's own `data` is kept: an object gets the key added; an absent
//! (or `null`) `data` becomes an object with only the key; any other value
//! is wrapped
//! as `{"agent": <the value>, "sandboxagent.dev": {…}}`.

use crate::names::NAMESPACE;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The key under which a `data` that is not an object is kept when the
/// runtime adds its own entry (see the module doc).
pub const AGENT_DATA_KEY: &str = "agent";

/// `error.data["sandboxagent.dev"]` of an agent's JSON-RPC error.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentErrorDetails {
    /// The lines the agent wrote to stderr after the request was forwarded
    /// to it, oldest first, secrets masked as `***`: at most the last 20
    /// lines and 4 KiB in all; when lines were left out, the first entry
    /// says how many (`… N earlier lines dropped`). Absent when there are
    /// none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stderr: Vec<String>,
    /// A sentence on what may fix it (a server running as root without
    /// `--agent-user`, on a failed `session/new` or `session/load`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

impl AgentErrorDetails {
    /// Whether there is nothing to add.
    pub fn is_empty(&self) -> bool {
        self.stderr.is_empty() && self.hint.is_none()
    }

    /// The entry in an error's `data`, when there is one that reads as this
    /// shape.
    pub fn from_data(data: &Value) -> Option<AgentErrorDetails> {
        serde_json::from_value(data.get(NAMESPACE)?.clone()).ok()
    }

    /// `data` (the agent's, `None` when absent) with this entry added by
    /// the rule of the module doc.
    pub fn attach_to(&self, data: Option<Value>) -> Value {
        let entry = serde_json::to_value(self).unwrap_or(Value::Null);
        let mut object = match data {
            Some(Value::Object(object)) => object,
            None | Some(Value::Null) => Map::new(),
            Some(other) => Map::from_iter([(AGENT_DATA_KEY.to_owned(), other)]),
        };
        object.insert(NAMESPACE.to_owned(), entry);
        Value::Object(object)
    }
}

/// The `data` the agent sent, from an error's `data` the runtime may have
/// added its entry to: the object without the entry (`None` when nothing
/// else is left), or the wrapped value.
pub fn agent_data(data: &Value) -> Option<Value> {
    let Some(object) = data.as_object() else {
        return Some(data.clone());
    };
    if !object.contains_key(NAMESPACE) {
        return Some(data.clone());
    }
    let mut rest = object.clone();
    rest.remove(NAMESPACE);
    if rest.len() == 1
        && let Some(original) = rest.get(AGENT_DATA_KEY)
        && !original.is_object()
    {
        return Some(original.clone());
    }
    (!rest.is_empty()).then_some(Value::Object(rest))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn details() -> AgentErrorDetails {
        AgentErrorDetails {
            stderr: vec!["one".into(), "two".into()],
            hint: None,
        }
    }

    #[test]
    fn an_object_gets_the_key_added() {
        let data = details().attach_to(Some(json!({"reason": "x"})));
        assert_eq!(
            data,
            json!({"reason": "x", "sandboxagent.dev": {"stderr": ["one", "two"]}})
        );
        assert_eq!(agent_data(&data), Some(json!({"reason": "x"})));
        assert_eq!(AgentErrorDetails::from_data(&data), Some(details()));
    }

    #[test]
    fn absent_data_becomes_an_object() {
        for original in [None, Some(Value::Null)] {
            let data = details().attach_to(original);
            assert_eq!(
                data,
                json!({"sandboxagent.dev": {"stderr": ["one", "two"]}})
            );
            assert_eq!(agent_data(&data), None);
        }
    }

    #[test]
    fn another_value_is_wrapped() {
        for original in [json!("text"), json!(3), json!([1]), json!(false)] {
            let data = details().attach_to(Some(original.clone()));
            assert_eq!(data["agent"], original);
            assert_eq!(data["sandboxagent.dev"]["stderr"], json!(["one", "two"]));
            assert_eq!(agent_data(&data), Some(original));
        }
    }

    #[test]
    fn data_without_the_entry_is_the_agents() {
        assert_eq!(agent_data(&json!("x")), Some(json!("x")));
        assert_eq!(AgentErrorDetails::from_data(&json!({"a": 1})), None);
    }
}
