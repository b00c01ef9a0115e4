//! What the runtime reads from `params._meta["sandboxagent.dev"]`.

use serde::Deserialize;
use serde_json::value::RawValue;

/// `params._meta["sandboxagent.dev"]` when it is an object (other params
/// members are skipped, not parsed into values).
pub fn meta_namespace(
    params: Option<&RawValue>,
) -> Option<serde_json::Map<String, serde_json::Value>> {
    #[derive(Deserialize)]
    struct Params {
        #[serde(rename = "_meta")]
        meta: Option<serde_json::Map<String, serde_json::Value>>,
    }
    let params: Params = serde_json::from_str(params?.get()).ok()?;
    match params.meta?.remove(ext_methods::NAMESPACE)? {
        serde_json::Value::Object(namespace) => Some(namespace),
        _ => None,
    }
}

/// `params._meta["sandboxagent.dev"].agent`, when it is a non-empty string.
pub fn meta_agent(params: Option<&RawValue>) -> Option<String> {
    meta_namespace(params)?
        .get("agent")?
        .as_str()
        .filter(|agent| !agent.is_empty())
        .map(str::to_owned)
}
