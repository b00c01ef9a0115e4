//! The `_sandboxagent/*` extension layer of sandbox-agent: what ACP lacks for
//! running agents as a service (session inventory, metadata, detach,
//! terminate, model listing), as wire names and typed values. Pure logic, no
//! I/O; the runtime and the SDK both build on it
//! (research/contract.md, "Extension methods and control plane").
//!
//! # Layout
//! - [`names`]: the namespace key, every method and notification name, the
//!   method table.
//! - [`types`]: params and results of each method, params of each
//!   notification, the event-log and agent-list shapes.
//! - [`fs`]: params and results of the host file system operations.
//! - [`process`]: params and results of the process API (run, start,
//!   list, get, signal, input, resize) and its output chunks.
//! - [`agent_error`]: what the runtime adds to an agent's JSON-RPC error
//!   (its stderr since the request, a hint) and how the agent's `data` is
//!   kept.
//! - [`attach`]: several clients on one session: attach params and result,
//!   roles, the observer error, `request/resolved`.
//! - [`meta`]: read, merge and inject `_meta["sandboxagent.dev"]`; the typed
//!   [`SessionMeta`].
//! - [`advertisement`]: the capability block in every `initialize` result.

pub mod agent_error;
pub mod attach;
pub mod fs;
pub mod meta;
pub mod names;
pub mod process;
pub mod types;

pub use agent_error::AgentErrorDetails;
pub use attach::{
    AttachParams, AttachResult, HistoryGap, HistoryPolicy, OBSERVER_FORBIDDEN, RequestResolved,
    Role,
};
pub use fs::*;
pub use meta::SessionMeta;
pub use names::{ExtMethod, METHODS, NAMESPACE, PREFIX, capability, method, notification};
pub use process::*;
pub use types::*;

use serde_json::{Map, Value};

/// The object the runtime puts at
/// `initialize` → `result.agentCapabilities._meta["sandboxagent.dev"]`:
/// `{"extensions": {<capability>: bool, …, "methods": [<name>, …]}}` (the
/// method list inside `extensions`, where clients written to seed 001 read
/// it).
///
/// `answered` is every method the server answers itself (derive it from the
/// dispatch table, so the list cannot drift); only `_sandboxagent/*` names are
/// listed, sorted. Each [`METHODS`] entry's flag says whether it is among
/// them; each of `behaviours` (see [`capability`]) is set to true.
pub fn advertisement<'a>(
    answered: impl IntoIterator<Item = &'a str>,
    behaviours: &[&str],
) -> Map<String, Value> {
    let mut methods: Vec<&str> = answered
        .into_iter()
        .filter(|name| name.starts_with(PREFIX))
        .collect();
    methods.sort_unstable();
    methods.dedup();
    let mut extensions = Map::new();
    for method in METHODS {
        extensions.insert(
            method.capability.to_owned(),
            Value::Bool(methods.contains(&method.name)),
        );
    }
    for behaviour in behaviours {
        extensions.insert((*behaviour).to_owned(), Value::Bool(true));
    }
    extensions.insert(
        METHODS_KEY.to_owned(),
        Value::Array(
            methods
                .into_iter()
                .map(|m| Value::String(m.to_owned()))
                .collect(),
        ),
    );
    let mut block = Map::new();
    block.insert(EXTENSIONS_KEY.to_owned(), Value::Object(extensions));
    block
}

/// Key of the capability block's flags (and the method list).
pub const EXTENSIONS_KEY: &str = "extensions";
/// Key of the method list inside `extensions`.
pub const METHODS_KEY: &str = "methods";

/// The extension methods a server advertised in its `initialize` result's
/// `agentCapabilities` (`_meta["sandboxagent.dev"].extensions.methods`);
/// empty when there is no such block (not a sandbox-agent server).
pub fn advertised_methods(agent_capabilities: &Value) -> Vec<String> {
    meta::read(agent_capabilities)
        .and_then(|block| block.get(EXTENSIONS_KEY))
        .and_then(|extensions| extensions.get(METHODS_KEY))
        .and_then(Value::as_array)
        .map(|methods| {
            methods
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// Adds `block` (from [`advertisement`]) to an `initialize` result at
/// `agentCapabilities._meta["sandboxagent.dev"]`, keeping everything the
/// agent put there. Returns false when the result has no
/// `agentCapabilities` object.
pub fn inject_advertisement(initialize_result: &mut Value, block: Map<String, Value>) -> bool {
    match initialize_result.get_mut("agentCapabilities") {
        Some(capabilities) if capabilities.is_object() => meta::inject(capabilities, block),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn advertisement_is_derived_from_the_answered_methods() {
        let block = advertisement(
            [
                method::SESSION_GET,
                method::SESSION_DETACH,
                "session/list",
                method::SESSION_GET,
            ],
            &[capability::SESSION_ENDED_NOTIFICATION],
        );
        assert_eq!(
            block["extensions"]["methods"],
            json!(["_sandboxagent/session/detach", "_sandboxagent/session/get"])
        );
        assert!(block.get("methods").is_none(), "methods sits in extensions");
        assert_eq!(block["extensions"]["sessionGet"], true);
        assert_eq!(block["extensions"]["sessionDetach"], true);
        assert_eq!(block["extensions"]["sessionTerminate"], false);
        assert_eq!(block["extensions"]["sessionEndedNotification"], true);
    }

    #[test]
    fn every_method_name_is_prefixed_and_unique() {
        for (i, m) in METHODS.iter().enumerate() {
            assert!(m.name.starts_with(PREFIX), "{}", m.name);
            assert!(
                METHODS[i + 1..]
                    .iter()
                    .all(|o| o.name != m.name && o.capability != m.capability)
            );
            assert_eq!(names::find(m.name), Some(m));
        }
        assert_eq!(names::find("session/list"), None);
    }

    #[test]
    fn injects_into_agent_capabilities_meta() {
        let mut result = json!({"protocolVersion": 1, "agentCapabilities": {"loadSession": true, "_meta": {"vendor": 1}}});
        assert!(inject_advertisement(
            &mut result,
            advertisement([method::AGENT_LIST], &[])
        ));
        assert_eq!(result["agentCapabilities"]["_meta"]["vendor"], 1);
        assert_eq!(
            result["agentCapabilities"]["_meta"]["sandboxagent.dev"]["extensions"]["methods"],
            json!(["_sandboxagent/agent/list"])
        );
        assert_eq!(
            advertised_methods(&result["agentCapabilities"]),
            ["_sandboxagent/agent/list"]
        );
        assert!(advertised_methods(&json!({})).is_empty());
        assert_eq!(result["agentCapabilities"]["loadSession"], true);
        let mut bare = json!({"protocolVersion": 1});
        assert!(!inject_advertisement(&mut bare, Map::new()));
    }
}
