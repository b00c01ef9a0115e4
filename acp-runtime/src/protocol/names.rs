//! Wire names: the header names and media types the server reads or writes,
//! the problem-type prefix, ACP method names, update kinds and JSON-RPC
//! error codes (research/contract.md).

// Every header name and media type the server reads or writes that the
// `http` crate does not name, in one place (research/contract.md).

/// Prefix of every problem document's `type` (RFC 9457;
/// research/contract.md, "Problem types"): `urn:sandbox-agent:error:<kind>`.
pub const PROBLEM_TYPE_PREFIX: &str = "urn:sandbox-agent:error:";

/// Request and response header that carries the connection id
/// (research/contract.md, "Transport: /v2/rpc").
pub const CONNECTION_ID_HEADER: &str = "x-acp-connection-id";
/// Response header of a POST answered 200 on an open connection: the newest
/// SSE event id of the connection when the answer was released. Every event
/// the agent wrote before its answer has an id at or below it, so a client
/// can hold the answer until its stream got that far.
pub const LAST_EVENT_ID_HEADER: &str = "x-acp-last-event-id";
/// A header that is not part of the contract; a request carrying it gets 400.
pub const FORBIDDEN_AGENT_HEADER: &str = "x-acp-agent";
/// Header naming the connection on the `/acp` profile (ACP transports RFD,
/// "Identity Model"); `/v2/rpc` names it in [`CONNECTION_ID_HEADER`].
pub const ACP_CONNECTION_ID_HEADER: &str = "acp-connection-id";
/// Header naming the session of a session-scoped request or stream on the
/// `/acp` profile.
pub const ACP_SESSION_ID_HEADER: &str = "acp-session-id";
/// The Fetch metadata header that says how a browser request relates to
/// the page that made it (W3C Fetch Metadata Request Headers).
pub const SEC_FETCH_SITE_HEADER: &str = "sec-fetch-site";
/// The Fetch metadata header that says what kind of request it is
/// (`navigate` for a navigation).
pub const SEC_FETCH_MODE_HEADER: &str = "sec-fetch-mode";
/// The Fetch metadata header that says where the answer goes (`document`
/// for a top-level navigation, `iframe`, `script`, `image`, …).
pub const SEC_FETCH_DEST_HEADER: &str = "sec-fetch-dest";
/// Fetch standard: which origins may embed an answer (`same-origin` on
/// every answer; research/contract.md, "Auth and CORS").
pub const CROSS_ORIGIN_RESOURCE_POLICY_HEADER: &str = "cross-origin-resource-policy";
/// Tells a proxy (nginx) not to buffer an event stream.
pub const X_ACCEL_BUFFERING_HEADER: &str = "x-accel-buffering";
/// Media type of a JSON-RPC message, its answer and every JSON body.
pub const APPLICATION_JSON: &str = "application/json";
/// Media type of every event stream (SSE).
pub const EVENT_STREAM: &str = "text/event-stream";
/// OpenMetrics' media type, which a scraper names in `Accept` to get
/// OpenMetrics text from `GET /metrics`.
pub const OPENMETRICS: &str = "application/openmetrics-text";
/// `Content-Type` of OpenMetrics text (OpenMetrics 1.0).
pub const OPENMETRICS_TEXT: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// `Content-Type` of Prometheus's text format, `GET /metrics`'s default.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";
// The `_meta` namespace and the `_sandboxagent/*` names live in `ext-methods`.

/// ACP `session/update` kinds (`params.update.sessionUpdate`) the runtime
/// looks at.
pub mod update {
    /// A new tool call.
    pub const TOOL_CALL: &str = "tool_call";
    /// An update of a tool call.
    pub const TOOL_CALL_UPDATE: &str = "tool_call_update";
}

/// JSON-RPC 2.0 error codes used by the runtime (JSON-RPC 2.0 section 5.1).
pub mod code {
    /// Invalid Request: e.g. a request id already in flight on this connection.
    pub const INVALID_REQUEST: i64 = -32600;
    /// Method not found: also sent on a client's behalf for capabilities it did not declare.
    pub const METHOD_NOT_FOUND: i64 = -32601;
    /// Invalid params.
    pub const INVALID_PARAMS: i64 = -32602;
    /// Internal error: agent process exited, connection closed, server shutting down.
    pub const INTERNAL_ERROR: i64 = -32603;
    /// Resource not found (ACP): unknown or ended session.
    pub const RESOURCE_NOT_FOUND: i64 = -32002;
    /// Request cancelled (ACP, as LSP): the runtime's answer to an agent
    /// request of a session that ended before any client answered it.
    pub const REQUEST_CANCELLED: i64 = -32800;
    /// A request an observer of the session may not send
    /// ([`ext_methods::OBSERVER_FORBIDDEN`]).
    pub const OBSERVER_FORBIDDEN: i64 = ext_methods::OBSERVER_FORBIDDEN;
    /// Server error (JSON-RPC's implementation-defined range): too many
    /// requests in flight on one connection.
    pub const TOO_MANY_REQUESTS: i64 = -32001;
    /// Authentication required (ACP): the agent needs `authenticate` or a
    /// credential in its environment first.
    pub const AUTH_REQUIRED: i64 = -32000;
}
