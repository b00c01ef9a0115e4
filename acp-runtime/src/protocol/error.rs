//! Why bytes are not a JSON-RPC message the runtime takes ([`EnvelopeError`]),
//! and the deepest nesting it parses ([`MAX_DEPTH`]).

/// Why bytes are not a JSON-RPC 2.0 object.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    /// Not JSON, or JSON but not an object (arrays, i.e. batches, included).
    #[error("not a JSON object: {0}")]
    NotJson(String),
    /// `jsonrpc` is missing or not `"2.0"`.
    #[error("\"jsonrpc\" must be \"2.0\"")]
    Version,
    /// The combination of members is none of request / notification / response.
    #[error(
        "not a JSON-RPC request, notification or response (needs \"method\", or \"id\" with exactly one of \"result\"/\"error\")"
    )]
    Shape,
    /// `id` is not a string, a number or null.
    #[error("\"id\" must be a string, a number or null")]
    Id,
    /// `params` is not an object or an array.
    #[error("\"params\" must be an object or an array")]
    Params,
    /// A client's `params` is an array (by-position params). ACP names
    /// every param, and the runtime reads `sessionId` and `_meta` by name
    /// while an agent's decoder may read an array by position (serde's
    /// derived structs do): the two would read different messages, so a
    /// client's params must be an object (research/contract.md,
    /// "Transport: /v2/rpc").
    #[error(
        "\"params\" must be an object: ACP names its params (by-position params are not taken)"
    )]
    ParamsArray,
    /// Valid JSON grammar that an agent cannot decode: a lone UTF-16
    /// surrogate escape, or nesting deeper than [`MAX_DEPTH`].
    #[error("{0}")]
    Undecodable(String),
    /// An object of the message, at any depth, names one member twice
    /// (after unescaping): the runtime and the agent could read different
    /// values (the runtime the first `sessionId`, the agent the last), so
    /// the message is refused.
    #[error("an object names the member {0:?} more than once")]
    DuplicateMember(String),
}

/// Deepest nesting of arrays and objects a client message may have, counting
/// the message object itself: the most `serde_json` parses under its default
/// recursion limit of 128, and the Rust ACP agents (and the
/// `agent-client-protocol` crate) parse with it. Deeper JSON is valid grammar,
/// but such an agent could not even read the request's id to answer it.
pub const MAX_DEPTH: usize = 127;
