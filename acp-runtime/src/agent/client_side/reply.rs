//! The answers the runtime gives an agent's file and terminal requests, in
//! their JSON-RPC shapes: results as ACP's response objects, failures as
//! JSON-RPC errors.

use crate::error::Error;
use crate::protocol::{RpcError, code};
use serde::Serialize;
use serde_json::{Map, Value};

/// A file API failure as the agent's JSON-RPC error: the file API's own
/// mapping (`-32602` for a 4xx, `-32603` else, the problem in `data`),
/// with ACP's "resource not found" (`-32002`) for a missing file.
pub(super) fn fs_error(error: &Error) -> RpcError {
    let mut rpc = error.to_rpc_error();
    if matches!(error, Error::FileNotFound(_)) {
        rpc.code = code::RESOURCE_NOT_FOUND;
    }
    rpc
}

/// `-32601` for a method the runtime does not serve.
pub(super) fn not_served(method: &str) -> RpcError {
    RpcError::new(
        code::METHOD_NOT_FOUND,
        format!("method not found: {method}"),
    )
}

/// An empty result object (`{}`), as ACP's empty responses serialize.
pub(super) fn empty() -> Value {
    Value::Object(Map::new())
}

/// An ACP response object as the result value.
pub(super) fn to_value(response: impl Serialize) -> Result<Value, RpcError> {
    serde_json::to_value(response)
        .map_err(|error| RpcError::new(code::INTERNAL_ERROR, error.to_string()))
}
