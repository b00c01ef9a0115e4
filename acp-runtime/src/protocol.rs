//! Wire constants and JSON-RPC envelope handling. No I/O.
//!
//! The runtime parses each JSON-RPC object once into an [`Envelope`] that
//! borrows from the received bytes: `id`, `params`, `result` and `error` stay
//! raw JSON (`serde_json::value::RawValue`) and are copied through verbatim,
//! so ids round-trip exactly (same JSON type, same digits, same string bytes)
//! and params are never re-serialized. Only the `id` of a request is rewritten
//! on its way to an agent
//! (research/contract.md, "Routing: connections, sessions, one agent process").

use serde::de::{IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;
use std::borrow::Cow;

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

/// ACP method names the runtime looks at (the ACP schema, `agent-client-protocol-schema` v1).
pub mod method {
    /// `initialize`
    pub const INITIALIZE: &str = "initialize";
    /// `authenticate`
    pub const AUTHENTICATE: &str = "authenticate";
    /// `session/new`
    pub const SESSION_NEW: &str = "session/new";
    /// `session/load`
    pub const SESSION_LOAD: &str = "session/load";
    /// `session/resume`
    pub const SESSION_RESUME: &str = "session/resume";
    /// `session/fork`
    pub const SESSION_FORK: &str = "session/fork";
    /// `session/prompt`
    pub const SESSION_PROMPT: &str = "session/prompt";
    /// `session/cancel`
    pub const SESSION_CANCEL: &str = "session/cancel";
    /// `session/update`
    pub const SESSION_UPDATE: &str = "session/update";
    /// `session/list`
    pub const SESSION_LIST: &str = "session/list";
    /// `session/set_mode`
    pub const SESSION_SET_MODE: &str = "session/set_mode";
    /// `session/set_model` (agents that predate config options)
    pub const SESSION_SET_MODEL: &str = "session/set_model";
    /// `$/cancel_request` (ACP protocol level): cancel a request by id.
    pub const CANCEL_REQUEST: &str = "$/cancel_request";
    /// ACP agent request asking the user for permission.
    pub const SESSION_REQUEST_PERMISSION: &str = "session/request_permission";
    /// ACP `session/set_config_option`.
    pub const SESSION_SET_CONFIG_OPTION: &str = "session/set_config_option";
    /// ACP agent request: read a text file (client capability
    /// `fs.readTextFile`).
    pub const FS_READ_TEXT_FILE: &str = "fs/read_text_file";
    /// ACP agent request: write a text file (`fs.writeTextFile`).
    pub const FS_WRITE_TEXT_FILE: &str = "fs/write_text_file";
    /// ACP agent request: start a terminal (`terminal`).
    pub const TERMINAL_CREATE: &str = "terminal/create";
    /// ACP agent request: a terminal's output so far.
    pub const TERMINAL_OUTPUT: &str = "terminal/output";
    /// ACP agent request: wait for a terminal's command to exit.
    pub const TERMINAL_WAIT_FOR_EXIT: &str = "terminal/wait_for_exit";
    /// ACP agent request: kill a terminal's command.
    pub const TERMINAL_KILL: &str = "terminal/kill";
    /// ACP agent request: kill and forget a terminal.
    pub const TERMINAL_RELEASE: &str = "terminal/release";
}

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

/// What kind of JSON-RPC object an [`Envelope`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Has `method` and `id`.
    Request,
    /// Has `method`, no `id`.
    Notification,
    /// Has `id` and exactly one of `result` / `error`, no `method`.
    Response,
}

/// One JSON-RPC 2.0 object, borrowed from the bytes it was parsed from.
///
/// Built with [`Envelope::parse`]; its fields are raw JSON so that they can be
/// copied to the other side unchanged.
#[derive(Debug, Deserialize)]
pub struct Envelope<'a> {
    /// `"jsonrpc"`; must be `"2.0"` for client messages.
    #[serde(default, borrow, deserialize_with = "borrowed_str")]
    pub jsonrpc: Option<Cow<'a, str>>,
    /// `"id"` as written, including an explicit `null`.
    #[serde(default, borrow, deserialize_with = "present")]
    pub id: Option<&'a RawValue>,
    /// `"method"`.
    #[serde(default, borrow, deserialize_with = "borrowed_str")]
    pub method: Option<Cow<'a, str>>,
    /// `"params"` as written.
    #[serde(default, borrow, deserialize_with = "present")]
    pub params: Option<&'a RawValue>,
    /// `"result"` as written (may be `null`).
    #[serde(default, borrow, deserialize_with = "present")]
    pub result: Option<&'a RawValue>,
    /// `"error"` as written.
    #[serde(default, borrow, deserialize_with = "present")]
    pub error: Option<&'a RawValue>,
}

/// Keeps a member that is present with the value `null` apart from an absent one.
fn present<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(deserializer).map(Some)
}

/// A string member (`null` is `None`), borrowed from the input unless it has
/// escapes. serde borrows a bare `Cow<str>` field, but not one inside an
/// `Option`: that one is always an owned copy, two allocations per message
/// (`jsonrpc`, `method`) on every hop (research/benchmarks.md, "The /acp
/// transports").
fn borrowed_str<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Cow<'de, str>>, D::Error> {
    Ok(Option::<BorrowedStr<'de>>::deserialize(deserializer)?.map(|text| text.0))
}

/// A JSON string, borrowed when it has no escapes (see [`borrowed_str`]).
struct BorrowedStr<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for BorrowedStr<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct StrVisitor;
        impl<'de> Visitor<'de> for StrVisitor {
            type Value = BorrowedStr<'de>;
            fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                // The words of `String`'s own visitor: error texts unchanged.
                formatter.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, text: &'de str) -> Result<Self::Value, E> {
                Ok(BorrowedStr(Cow::Borrowed(text)))
            }
            fn visit_str<E>(self, text: &str) -> Result<Self::Value, E> {
                Ok(BorrowedStr(Cow::Owned(text.to_owned())))
            }
            fn visit_string<E>(self, text: String) -> Result<Self::Value, E> {
                Ok(BorrowedStr(Cow::Owned(text)))
            }
        }
        deserializer.deserialize_str(StrVisitor)
    }
}

/// An [`Envelope`] that owns copies of its members, to move a parsed
/// message into a task (an `Envelope` borrows the frame it was parsed
/// from). The members are copied as written: no second parse.
#[derive(Debug)]
pub struct OwnedEnvelope {
    /// `"2.0"` (what a strict parse accepts) is not copied.
    jsonrpc: Option<Cow<'static, str>>,
    id: Option<Box<RawValue>>,
    method: Option<Box<str>>,
    params: Option<Box<RawValue>>,
    result: Option<Box<RawValue>>,
    error: Option<Box<RawValue>>,
}

impl OwnedEnvelope {
    /// Copies the members of `envelope`.
    pub fn new(envelope: &Envelope<'_>) -> Self {
        Self {
            jsonrpc: envelope.jsonrpc.as_deref().map(|version| match version {
                "2.0" => Cow::Borrowed("2.0"),
                other => Cow::Owned(other.to_owned()),
            }),
            id: envelope.id.map(RawValue::to_owned),
            method: envelope.method.as_deref().map(Box::from),
            params: envelope.params.map(RawValue::to_owned),
            result: envelope.result.map(RawValue::to_owned),
            error: envelope.error.map(RawValue::to_owned),
        }
    }

    /// The envelope again, borrowed from this copy.
    pub fn envelope(&self) -> Envelope<'_> {
        Envelope {
            jsonrpc: self.jsonrpc.as_deref().map(Cow::Borrowed),
            id: self.id.as_deref(),
            method: self.method.as_deref().map(Cow::Borrowed),
            params: self.params.as_deref(),
            result: self.result.as_deref(),
            error: self.error.as_deref(),
        }
    }
}

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

impl<'a> Envelope<'a> {
    /// Parses one JSON-RPC object from `bytes`.
    ///
    /// `strict` requires `"jsonrpc": "2.0"` (client messages); agent output is
    /// accepted without it, since relaying is more useful than rejecting.
    ///
    /// # Errors
    /// [`EnvelopeError`] naming what is wrong.
    pub fn parse(bytes: &'a [u8], strict: bool) -> Result<(Self, Kind), EnvelopeError> {
        expect_object(bytes)?;
        let envelope: Envelope<'a> =
            serde_json::from_slice(bytes).map_err(|e| EnvelopeError::NotJson(e.to_string()))?;
        if strict && envelope.jsonrpc.as_deref() != Some("2.0") {
            return Err(EnvelopeError::Version);
        }
        let kind = envelope.kind()?;
        if let Some(id) = envelope.id
            && !is_valid_id(id)
        {
            return Err(EnvelopeError::Id);
        }
        if let Some(params) = envelope.params
            && !matches!(params.get().as_bytes().first(), Some(b'{' | b'['))
        {
            return Err(EnvelopeError::Params);
        }
        if strict {
            check_decodable(bytes)?;
        }
        Ok((envelope, kind))
    }

    fn kind(&self) -> Result<Kind, EnvelopeError> {
        classify(
            self.method.is_some(),
            self.id.is_some(),
            self.result.is_some(),
            self.error.is_some(),
        )
    }

    /// The method name, or `""` for a response.
    pub fn method(&self) -> &str {
        self.method.as_deref().unwrap_or("")
    }

    /// `params.sessionId` when it is a string, without parsing the rest of params.
    pub fn session_id(&self) -> Option<String> {
        self.params.and_then(session_id_of)
    }
}

/// Which JSON-RPC object has these members (JSON-RPC 2.0 sections 4 and 5).
fn classify(method: bool, id: bool, result: bool, error: bool) -> Result<Kind, EnvelopeError> {
    match (method, id, result, error) {
        (true, true, false, false) => Ok(Kind::Request),
        (true, false, false, false) => Ok(Kind::Notification),
        (false, true, true, false) | (false, true, false, true) => Ok(Kind::Response),
        _ => Err(EnvelopeError::Shape),
    }
}

/// Rejects what a JSON parser lets through but a strict agent cannot decode
/// or could read differently from the runtime, in one pass over `bytes`,
/// which must already be valid JSON:
/// - a `\uD800`–`\uDFFF` escape that is not a high surrogate followed by a
///   low one (RFC 8259 section 8.2: such a string is not Unicode; `serde_json`
///   and so every Rust agent refuse the whole message, and answer with an
///   `id: null` error that cannot be routed back, leaving the request hanging);
/// - arrays and objects nested deeper than [`MAX_DEPTH`];
/// - a number too large for an `f64` (`1e400`, a 400-digit integer), which
///   `serde_json` refuses as "number out of range";
/// - an object, at any depth, that names a member twice (escapes decoded):
///   RFC 8259 section 4 leaves duplicates to the reader, and the runtime
///   routes and checks by members it reads (`sessionId`, `_meta` and the
///   runtime's own key in it) while the agent may keep another occurrence
///   (research/contract.md, "Transport: /v2/rpc").
///
/// # Errors
/// [`EnvelopeError::Undecodable`] naming the byte offset;
/// [`EnvelopeError::DuplicateMember`] naming the member.
pub fn check_decodable(bytes: &[u8]) -> Result<(), EnvelopeError> {
    // Open containers, innermost last; an object's member names so far sit
    // in `names` from its `first` on (nested objects' names after them,
    // dropped when they close), so the scan allocates once per message.
    let mut open: Vec<Container> = Vec::new();
    let mut names: Vec<Cow<'_, [u8]>> = Vec::new();
    let mut expect_name = false;
    let mut at = 0;
    while at < bytes.len() {
        match bytes[at] {
            b'"' => {
                let end = string_end(bytes, at + 1)?;
                if expect_name && let Some(Container::Object { first, set }) = open.last_mut() {
                    let name = member_name(&bytes[at + 1..end - 1]);
                    let twice = match set {
                        Some(set) => !set.insert(name.clone()),
                        None => names[*first..].contains(&name),
                    };
                    if twice {
                        return Err(EnvelopeError::DuplicateMember(
                            String::from_utf8_lossy(&name).into_owned(),
                        ));
                    }
                    names.push(name);
                    // A large object: a set from here on, so a hostile
                    // message of many members costs linear time.
                    if set.is_none() && names.len() - *first > SCANNED_NAMES {
                        *set = Some(names[*first..].iter().cloned().collect());
                    }
                    expect_name = false;
                }
                at = end;
            }
            bracket @ (b'{' | b'[') => {
                if open.len() >= MAX_DEPTH {
                    return Err(EnvelopeError::Undecodable(format!(
                        "JSON nested deeper than {MAX_DEPTH} levels (at byte {at})"
                    )));
                }
                expect_name = bracket == b'{';
                open.push(if expect_name {
                    Container::Object {
                        first: names.len(),
                        set: None,
                    }
                } else {
                    Container::Array
                });
                at += 1;
            }
            b'}' | b']' => {
                if let Some(Container::Object { first, .. }) = open.pop() {
                    names.truncate(first);
                }
                expect_name = false;
                at += 1;
            }
            b',' => {
                expect_name = matches!(open.last(), Some(Container::Object { .. }));
                at += 1;
            }
            b'-' | b'0'..=b'9' => at = number_end(bytes, at)?,
            _ => at += 1,
        }
    }
    Ok(())
}

/// Members of one object compared by a scan of its names before a set is
/// built for it.
const SCANNED_NAMES: usize = 32;

/// An open array or object of [`check_decodable`]'s scan.
enum Container<'a> {
    Array,
    Object {
        /// Where this object's member names start in the scan's list.
        first: usize,
        /// The names as a set, once there are more than [`SCANNED_NAMES`].
        set: Option<std::collections::HashSet<Cow<'a, [u8]>>>,
    },
}

/// A member name's text (the bytes between its quotes), its escapes
/// decoded: two spellings of one name (`"a"`, `"\u0061"`) compare equal.
fn member_name(raw: &[u8]) -> Cow<'_, [u8]> {
    if !raw.contains(&b'\\') {
        return Cow::Borrowed(raw);
    }
    let mut quoted = Vec::with_capacity(raw.len() + 2);
    quoted.push(b'"');
    quoted.extend_from_slice(raw);
    quoted.push(b'"');
    // Valid JSON with paired surrogates (checked by the scan): decodes.
    match serde_json::from_slice::<String>(&quoted) {
        Ok(text) => Cow::Owned(text.into_bytes()),
        Err(_) => Cow::Borrowed(raw),
    }
}

/// The longest number (in bytes, sign and fraction included) without an
/// exponent that [`number_end`] takes as fitting an `f64` without parsing
/// it: 308 integer digits at most, below `f64::MAX`.
const MAX_F64_DIGITS: usize = 308;

/// The offset just past the number starting at `at`, checking that it fits
/// an `f64` (integers that fit `u64`/`i64` always do).
fn number_end(bytes: &[u8], at: usize) -> Result<usize, EnvelopeError> {
    let length = bytes[at..]
        .iter()
        .position(|b| !matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
        .unwrap_or(bytes.len() - at);
    let end = at + length;
    // Without an exponent, fewer than 309 digits before the point always
    // fit (`f64::MAX` is about 1.8e308): ids and counts skip the parse.
    if length <= MAX_F64_DIGITS && !bytes[at..end].iter().any(|b| matches!(b, b'e' | b'E')) {
        return Ok(end);
    }
    let finite = std::str::from_utf8(&bytes[at..end])
        .ok()
        .and_then(|text| text.parse::<f64>().ok())
        .is_some_and(f64::is_finite);
    if finite {
        Ok(end)
    } else {
        Err(EnvelopeError::Undecodable(format!(
            "the number at byte {at} is out of range for a 64-bit float"
        )))
    }
}

/// The offset just past the string whose contents start at `at`, checking its
/// `\u` escapes pair up. Plain runs are skipped with `memchr`.
fn string_end(bytes: &[u8], mut at: usize) -> Result<usize, EnvelopeError> {
    let lone = |at: usize| {
        EnvelopeError::Undecodable(format!(
            "a string holds a lone UTF-16 surrogate escape at byte {at}; JSON text must be Unicode (RFC 8259 section 8.2)"
        ))
    };
    loop {
        let Some(offset) = memchr::memchr2(b'"', b'\\', &bytes[at..]) else {
            return Ok(bytes.len());
        };
        at += offset;
        if bytes[at] == b'"' {
            return Ok(at + 1);
        }
        if bytes.get(at + 1) != Some(&b'u') {
            at += 2;
            continue;
        }
        match hex_unit(bytes, at + 2) {
            Some(0xD800..=0xDBFF) => {
                let low = (bytes.get(at + 6..at + 8) == Some(b"\\u"))
                    .then(|| hex_unit(bytes, at + 8))
                    .flatten();
                if !matches!(low, Some(0xDC00..=0xDFFF)) {
                    return Err(lone(at));
                }
                at += 12;
            }
            Some(0xDC00..=0xDFFF) => return Err(lone(at)),
            _ => at += 6,
        }
    }
}

/// The four hex digits at `at` as a UTF-16 code unit.
fn hex_unit(bytes: &[u8], at: usize) -> Option<u16> {
    let digits = std::str::from_utf8(bytes.get(at..at + 4)?).ok()?;
    u16::from_str_radix(digits, 16).ok()
}

/// Leading bytes check shared by both envelope parsers: one JSON object.
fn expect_object(bytes: &[u8]) -> Result<(), EnvelopeError> {
    match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => Ok(()),
        Some(b'[') => Err(EnvelopeError::NotJson(
            "batches (arrays) are not supported".to_owned(),
        )),
        None => Err(EnvelopeError::NotJson("empty body".to_owned())),
        Some(_) => Err(EnvelopeError::NotJson("expected an object".to_owned())),
    }
}

/// One line of agent output, parsed in a single pass into what routing
/// needs, borrowed from the line: the raw `id`, `result` and `error` (a
/// response is relayed with only its id rewritten) and a peek into `params`
/// (session id, update kind, cancelled request id). Notifications and agent
/// requests are relayed as the agent's own bytes, so their params are never
/// kept. This is the hot path of streaming.
#[derive(Debug, Deserialize)]
pub struct AgentMessage<'a> {
    /// `"jsonrpc"`; must be `"2.0"`.
    #[serde(default, borrow, deserialize_with = "borrowed_str")]
    pub jsonrpc: Option<Cow<'a, str>>,
    /// `"id"` as written, including an explicit `null`.
    #[serde(default, borrow, deserialize_with = "present")]
    pub id: Option<&'a RawValue>,
    /// `"method"`.
    #[serde(default, borrow, deserialize_with = "borrowed_str")]
    pub method: Option<Cow<'a, str>>,
    /// What routing reads from `"params"`.
    #[serde(default, borrow)]
    pub params: Option<ParamsPeek<'a>>,
    /// `"result"` as written.
    #[serde(default, borrow, deserialize_with = "present")]
    pub result: Option<&'a RawValue>,
    /// `"error"` as written.
    #[serde(default, borrow, deserialize_with = "present")]
    pub error: Option<&'a RawValue>,
}

impl<'a> AgentMessage<'a> {
    /// Parses one agent stdout line. Like a client's, it must be JSON-RPC
    /// 2.0 (`"jsonrpc": "2.0"`): an object that merely has an `id` and a
    /// `result` (a log record, another protocol) never settles a request
    /// (research/contract.md, "Routing: connections, sessions, one agent
    /// process").
    ///
    /// # Errors
    /// [`EnvelopeError`] naming what is wrong.
    pub fn parse(line: &'a [u8]) -> Result<(Self, Kind), EnvelopeError> {
        expect_object(line)?;
        let message: AgentMessage<'a> =
            serde_json::from_slice(line).map_err(|e| EnvelopeError::NotJson(e.to_string()))?;
        if message.jsonrpc.as_deref() != Some("2.0") {
            return Err(EnvelopeError::Version);
        }
        let kind = classify(
            message.method.is_some(),
            message.id.is_some(),
            message.result.is_some(),
            message.error.is_some(),
        )?;
        if let Some(id) = message.id
            && !is_valid_id(id)
        {
            return Err(EnvelopeError::Id);
        }
        Ok((message, kind))
    }

    /// The method name, or `""` for a response.
    pub fn method(&self) -> &str {
        self.method.as_deref().unwrap_or("")
    }

    /// `params.sessionId`, when it is a string.
    pub fn session_id(&self) -> Option<&str> {
        self.params.as_ref()?.session_id.as_deref()
    }

    /// `params.update.sessionUpdate` (the kind of a `session/update`).
    pub fn update_kind(&self) -> Option<&str> {
        self.params.as_ref()?.update_kind.as_deref()
    }

    /// `params.requestId` of a `$/cancel_request`, as raw JSON.
    pub fn cancelled_request_id(&self) -> Option<&'a RawValue> {
        self.params.as_ref()?.request_id
    }
}

/// The members of an agent message's `params` that routing reads. Params of
/// another shape (an array, a number) or members of another type give an
/// empty peek rather than an error: the message is still relayed.
#[derive(Debug, Default)]
pub struct ParamsPeek<'a> {
    /// `sessionId`, when a string.
    pub session_id: Option<Cow<'a, str>>,
    /// `update.sessionUpdate`, when a string.
    pub update_kind: Option<Cow<'a, str>>,
    /// `requestId` as written.
    pub request_id: Option<&'a RawValue>,
}

impl<'de: 'a, 'a> Deserialize<'de> for ParamsPeek<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(Lenient(|map: &mut dyn ErasedMap<'de>| {
            let mut peek = ParamsPeek::default();
            while let Some(key) = map.key()? {
                match &*key {
                    "sessionId" => peek.session_id = map.loose_str()?,
                    "update" => peek.update_kind = map.update_kind()?,
                    "requestId" => peek.request_id = Some(map.raw()?),
                    _ => map.skip()?,
                }
            }
            Ok(peek)
        }))
    }
}

/// The map operations the lenient visitors need, object-safe so one closure
/// type serves every map access.
trait ErasedMap<'de> {
    fn key(&mut self) -> Result<Option<Cow<'de, str>>, String>;
    fn loose_str(&mut self) -> Result<Option<Cow<'de, str>>, String>;
    fn update_kind(&mut self) -> Result<Option<Cow<'de, str>>, String>;
    fn raw(&mut self) -> Result<&'de RawValue, String>;
    fn skip(&mut self) -> Result<(), String>;
}

impl<'de, A: MapAccess<'de>> ErasedMap<'de> for A {
    fn key(&mut self) -> Result<Option<Cow<'de, str>>, String> {
        self.next_key::<Cow<'de, str>>().map_err(|e| e.to_string())
    }
    fn loose_str(&mut self) -> Result<Option<Cow<'de, str>>, String> {
        self.next_value::<LooseStr<'de>>()
            .map(|s| s.0)
            .map_err(|e| e.to_string())
    }
    fn update_kind(&mut self) -> Result<Option<Cow<'de, str>>, String> {
        self.next_value::<UpdateKind<'de>>()
            .map(|u| u.0)
            .map_err(|e| e.to_string())
    }
    fn raw(&mut self) -> Result<&'de RawValue, String> {
        self.next_value::<&'de RawValue>()
            .map_err(|e| e.to_string())
    }
    fn skip(&mut self) -> Result<(), String> {
        self.next_value::<IgnoredAny>()
            .map(drop)
            .map_err(|e| e.to_string())
    }
}

/// A visitor that reads maps with `read` and turns every other JSON value
/// into `T::default()` (consuming it).
struct Lenient<F>(F);

impl<'de, T, F> Visitor<'de> for Lenient<F>
where
    T: Default,
    F: FnOnce(&mut dyn ErasedMap<'de>) -> Result<T, String>,
{
    type Value = T;

    fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<T, A::Error> {
        (self.0)(&mut map).map_err(serde::de::Error::custom)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<T, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(T::default())
    }

    fn visit_bool<E>(self, _: bool) -> Result<T, E> {
        Ok(T::default())
    }
    fn visit_i64<E>(self, _: i64) -> Result<T, E> {
        Ok(T::default())
    }
    fn visit_u64<E>(self, _: u64) -> Result<T, E> {
        Ok(T::default())
    }
    fn visit_f64<E>(self, _: f64) -> Result<T, E> {
        Ok(T::default())
    }
    fn visit_str<E>(self, _: &str) -> Result<T, E> {
        Ok(T::default())
    }
    fn visit_unit<E>(self) -> Result<T, E> {
        Ok(T::default())
    }
}

/// Any JSON value; `Some` when it is a string.
struct LooseStr<'a>(Option<Cow<'a, str>>);

impl<'de: 'a, 'a> Deserialize<'de> for LooseStr<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct StrVisitor;
        impl<'de> Visitor<'de> for StrVisitor {
            type Value = LooseStr<'de>;
            fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                formatter.write_str("any JSON value")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Self::Value, E> {
                Ok(LooseStr(Some(Cow::Borrowed(s))))
            }
            fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
                Ok(LooseStr(Some(Cow::Owned(s.to_owned()))))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(LooseStr(None))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(LooseStr(None))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                Ok(LooseStr(None))
            }
            fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
                Ok(LooseStr(None))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
                Ok(LooseStr(None))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
                Ok(LooseStr(None))
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(LooseStr(None))
            }
        }
        deserializer.deserialize_any(StrVisitor)
    }
}

/// `update.sessionUpdate` of a `session/update`, leniently.
#[derive(Default)]
struct UpdateKind<'a>(Option<Cow<'a, str>>);

impl<'de: 'a, 'a> Deserialize<'de> for UpdateKind<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(Lenient(|map: &mut dyn ErasedMap<'de>| {
            let mut kind = None;
            while let Some(key) = map.key()? {
                if key == "sessionUpdate" {
                    kind = map.loose_str()?;
                } else {
                    map.skip()?;
                }
            }
            Ok(UpdateKind(kind))
        }))
    }
}

/// `params.requestId` of a `$/cancel_request`, as raw JSON.
pub fn cancelled_request_id(params: Option<&RawValue>) -> Option<Box<RawValue>> {
    #[derive(Deserialize)]
    struct Params<'a> {
        #[serde(rename = "requestId", borrow)]
        request_id: Option<&'a RawValue>,
    }
    serde_json::from_str::<Params<'_>>(params?.get())
        .ok()?
        .request_id
        .map(ToOwned::to_owned)
}

/// `sessionId` of a params or result object, if it is a string.
pub fn session_id_of(raw: &RawValue) -> Option<String> {
    #[derive(Deserialize)]
    struct WithSession<'a> {
        #[serde(rename = "sessionId", borrow)]
        session_id: Option<Cow<'a, str>>,
    }
    serde_json::from_str::<WithSession<'_>>(raw.get())
        .ok()
        .and_then(|w| w.session_id.map(Cow::into_owned))
}

/// `result.stopReason` of a response line (a `session/prompt` answer), if
/// it is a string; `None` for an error answer or anything else.
pub fn stop_reason(line: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct Answer<'a> {
        #[serde(borrow)]
        result: Option<Turn<'a>>,
    }
    #[derive(Deserialize)]
    struct Turn<'a> {
        #[serde(rename = "stopReason", borrow)]
        stop_reason: Option<Cow<'a, str>>,
    }
    serde_json::from_slice::<Answer<'_>>(line)
        .ok()
        .and_then(|answer| answer.result?.stop_reason.map(Cow::into_owned))
}

fn is_valid_id(id: &RawValue) -> bool {
    matches!(
        id.get().as_bytes().first(),
        Some(b'"' | b'-' | b'0'..=b'9' | b'n')
    )
}

/// Replaces raw CR and LF bytes with spaces, in place.
///
/// In valid JSON these bytes can only be whitespace between tokens (inside
/// strings they must be escaped), so this keeps the value identical while
/// making it safe for newline-delimited stdio framing and for an SSE `data:`
/// line. Call it only on bytes that parsed as JSON.
pub fn flatten_newlines(bytes: &mut [u8]) {
    for byte in bytes.iter_mut() {
        if matches!(*byte, b'\n' | b'\r') {
            *byte = b' ';
        }
    }
}

/// True when `bytes` contain a CR or LF.
pub fn has_newline(bytes: &[u8]) -> bool {
    memchr::memchr2(b'\n', b'\r', bytes).is_some()
}

/// `json` as one line: borrowed when it has no CR or LF (the common case),
/// else a copy with them flattened ([`flatten_newlines`]). Both directions
/// need it: newline-delimited stdio toward the agent, SSE `data:` lines
/// toward the client. Call it only on bytes that parsed as JSON.
pub fn one_line(json: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    if has_newline(json) {
        let mut copy = json.to_vec();
        flatten_newlines(&mut copy);
        std::borrow::Cow::Owned(copy)
    } else {
        std::borrow::Cow::Borrowed(json)
    }
}

#[derive(Serialize)]
struct OutNotification<'a, P: Serialize> {
    jsonrpc: &'static str,
    method: &'a str,
    params: P,
}

/// A JSON-RPC error object (JSON-RPC 2.0 section 5.1).
#[derive(Debug, Clone, Serialize)]
pub struct RpcError {
    /// Error code, see [`code`].
    pub code: i64,
    /// One-sentence description.
    pub message: String,
    /// Structured details, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data: Option<serde_json::Value>,
}

impl RpcError {
    /// An error with `code` and `message` and no data.
    pub fn new(code: i64, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            data: None,
        }
    }

    /// Adds `data`.
    pub fn with_data(mut self, data: serde_json::Value) -> Self {
        self.data = Some(data);
        self
    }
}

/// Serializes a request `{jsonrpc, id, method, params}` as one line (no newline).
pub fn request_line(id: &RawValue, method: &str, params: Option<&RawValue>) -> Vec<u8> {
    let mut line = request_head(id.get().len(), method, params);
    line.extend_from_slice(id.get().as_bytes());
    request_tail(line, method, params)
}

/// [`request_line`] with the integer id `id` (the ids the runtime gives
/// the requests it forwards), written without a raw value of its own; the
/// line has room for the newline that ends it on the agent's stdin.
pub fn agent_request_line(id: i64, method: &str, params: Option<&RawValue>) -> Vec<u8> {
    let mut line = request_head(20, method, params);
    // Writing an integer to a `Vec` cannot fail.
    let _ = serde_json::to_writer(&mut line, &id);
    request_tail(line, method, params)
}

/// A request line's buffer, sized for an id of `id_len` bytes, `method`
/// and `params` (and a newline), holding everything before the id.
fn request_head(id_len: usize, method: &str, params: Option<&RawValue>) -> Vec<u8> {
    const HEAD: &[u8] = br#"{"jsonrpc":"2.0","id":"#;
    let params_len = params.map_or(0, |params| params.get().len());
    let mut line = Vec::with_capacity(HEAD.len() + id_len + method.len() + params_len + 24);
    line.extend_from_slice(HEAD);
    line
}

/// A request line after its id: the method (escaped as a JSON string) and
/// the params as written (left out when absent).
fn request_tail(mut line: Vec<u8>, method: &str, params: Option<&RawValue>) -> Vec<u8> {
    line.extend_from_slice(br#","method":"#);
    // Writing a string to a `Vec` cannot fail.
    let _ = serde_json::to_writer(&mut line, method);
    if let Some(params) = params {
        line.extend_from_slice(br#","params":"#);
        line.extend_from_slice(params.get().as_bytes());
    }
    line.push(b'}');
    line
}

/// Serializes a notification `{jsonrpc, method, params}` as one line (no newline).
pub fn notification_line(method: &str, params: &impl Serialize) -> Vec<u8> {
    to_vec(&OutNotification {
        jsonrpc: "2.0",
        method,
        params,
    })
}

/// Serializes a response with `id` and a raw `result` or `error`.
pub fn response_line(
    id: &RawValue,
    result: Option<&RawValue>,
    error: Option<&RawValue>,
) -> Vec<u8> {
    const HEAD: &[u8] = br#"{"jsonrpc":"2.0","id":"#;
    let len = |value: Option<&RawValue>| value.map_or(0, |value| value.get().len() + 10);
    let mut line = Vec::with_capacity(HEAD.len() + id.get().len() + len(result) + len(error) + 2);
    line.extend_from_slice(HEAD);
    line.extend_from_slice(id.get().as_bytes());
    // `result`, then `error`, each when present, as written.
    for (name, value) in [(&br#","result":"#[..], result), (br#","error":"#, error)] {
        if let Some(value) = value {
            line.extend_from_slice(name);
            line.extend_from_slice(value.get().as_bytes());
        }
    }
    line.push(b'}');
    line
}

/// Serializes an error response with `id`.
pub fn error_response_line(id: &RawValue, error: &RpcError) -> Vec<u8> {
    let error = raw(error);
    response_line(id, None, Some(&error))
}

/// Serializes a success response with `id` and `result`.
pub fn result_response_line(id: &RawValue, result: &impl Serialize) -> Vec<u8> {
    let result = raw(result);
    response_line(id, Some(&result), None)
}

/// Serializes `value` to an owned raw JSON value.
pub fn raw(value: &impl Serialize) -> Box<RawValue> {
    // Serializing our own types to JSON cannot fail (string keys, no NaN floats);
    // fall back to `null` rather than panic.
    serde_json::value::to_raw_value(value).unwrap_or_else(|_| RawValue::NULL.to_owned())
}

fn to_vec(value: &impl Serialize) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_else(|_| b"null".to_vec())
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn method_and_version_are_borrowed_unless_escaped() {
        let line = br#"{"jsonrpc":"2.0","id":1,"method":"a\/b","params":{"x":1}}"#;
        let (envelope, _) = Envelope::parse(line, true).expect("request");
        assert!(matches!(envelope.jsonrpc, Some(Cow::Borrowed("2.0"))));
        assert!(matches!(envelope.method, Some(Cow::Owned(ref m)) if m == "a/b"));
        let (message, _) = AgentMessage::parse(br#"{"jsonrpc":"2.0","method":"m"}"#).expect("ok");
        assert!(matches!(message.method, Some(Cow::Borrowed("m"))));
        // null is absent, another type the same error as before.
        let (envelope, _) = Envelope::parse(
            br#"{"jsonrpc":"2.0","id":1,"method":null,"result":1}"#,
            true,
        )
        .expect("response");
        assert_eq!(envelope.method, None);
        let error = Envelope::parse(br#"{"jsonrpc":"2.0","method":5}"#, true).expect_err("5");
        assert!(error.to_string().contains("expected a string"), "{error}");
        // The owned copy gives back the same members.
        let owned = OwnedEnvelope::new(&Envelope::parse(line, true).expect("request").0);
        let again = owned.envelope();
        assert_eq!(again.method(), "a/b");
        assert_eq!(again.id.map(RawValue::get), Some("1"));
        assert_eq!(again.params.map(RawValue::get), Some(r#"{"x":1}"#));
        assert_eq!(again.jsonrpc.as_deref(), Some("2.0"));
    }

    #[test]
    fn classifies_the_three_kinds() {
        let (_, kind) =
            Envelope::parse(br#"{"jsonrpc":"2.0","id":1,"method":"x"}"#, true).expect("request");
        assert_eq!(kind, Kind::Request);
        let (_, kind) =
            Envelope::parse(br#"{"jsonrpc":"2.0","method":"x"}"#, true).expect("notification");
        assert_eq!(kind, Kind::Notification);
        let (_, kind) = Envelope::parse(br#"{"jsonrpc":"2.0","id":"a","result":null}"#, true)
            .expect("response");
        assert_eq!(kind, Kind::Response);
    }

    #[test]
    fn a_member_named_twice_in_params_is_refused() {
        for params in [
            r#"{"sessionId":"x","prompt":[],"sessionId":"ended"}"#,
            r#"{"sessionId":"s","sessi\u006fnId":"t"}"#,
            r#"{"_meta":{"traceparent":"a"},"_meta":"s"}"#,
            r#"{"sessionId":"s","sessionId":"s","prompt":[{"type":"text","text":"hi"}]}"#,
            r#"{"sessionId":"s","_meta":{"traceparent":"a","traceparent":"a"},"prompt":[]}"#,
            r#"{"_meta":{"sandboxagent.dev":{"agent":"mock","agent":"mock"}}}"#,
            r#"{"prompt":[{"type":"text","text":"a","text":"a"}]}"#,
            r#"{"a":{"b":[{"c":{"d":1,"e":2,"d":1}}]}}"#,
        ] {
            let line = format!(r#"{{"jsonrpc":"2.0","id":1,"method":"x","params":{params}}}"#);
            let error = Envelope::parse(line.as_bytes(), true).expect_err(params);
            assert!(
                matches!(error, EnvelopeError::DuplicateMember(_)),
                "{params}: {error}"
            );
        }
        // Nested objects may repeat names of the top level, and agent output
        // is relayed as it is.
        let nested = br#"{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":{"a":1,"b":{"a":2}},"b":[{"a":1},{"a":1}],"c":{}}}"#;
        Envelope::parse(nested, true).expect("nested names");
        // Members of the message itself, and past the scanned names of a
        // large object (where a set takes over).
        let top = br#"{"jsonrpc":"2.0","id":1,"method":"x","x":1,"x":1}"#;
        assert!(matches!(
            Envelope::parse(top, true),
            Err(EnvelopeError::DuplicateMember(name)) if name == "x"
        ));
        let many: Vec<String> = (0..100).map(|n| format!(r#""m{n}":{n}"#)).collect();
        let wide = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"x","params":{{{}}}}}"#,
            many.join(",")
        );
        Envelope::parse(wide.as_bytes(), true).expect("100 names, each once");
        let wide_twice = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"x","params":{{{},"m7":0,"z":1}}}}"#,
            many.join(",")
        );
        assert!(matches!(
            Envelope::parse(wide_twice.as_bytes(), true),
            Err(EnvelopeError::DuplicateMember(name)) if name == "m7"
        ));
        let twice = br#"{"jsonrpc":"2.0","method":"x","params":{"a":1,"a":2}}"#;
        Envelope::parse(twice, false).expect("agent output is not checked");
    }

    /// A request whose params hold `value` (raw JSON).
    fn request_with(value: &str) -> String {
        format!(r#"{{"jsonrpc":"2.0","id":1,"method":"x","params":{{"v":{value}}}}}"#)
    }

    #[test]
    fn what_serde_json_cannot_decode_is_refused_and_the_rest_passes() {
        let cases = [
            (r#""emoji cut in half: \ud83d""#, false),
            (r#""\ud83d\ude00 whole emoji""#, true),
            (r#""low half alone \uDE00""#, false),
            (r#""high then text \ud83dx""#, false),
            (r#""high then other escape \ud83d\n""#, false),
            (r#""escaped backslash then u: \\ud83d""#, true),
            (r#""\u00e9 and \uFFFF""#, true),
            (r#"["\"quoted\" {[", "]}"]"#, true),
            ("1e400", false),
            ("-1e309", false),
            (&"9".repeat(400), false),
            ("18446744073709551616", true),
            ("-9223372036854775809", true),
            ("1.5e-400", true),
            ("[-0, 0.5, 1E+2, 12345678901234567890]", true),
        ];
        for (value, decodable) in cases {
            let body = request_with(value);
            let serde_ok = serde_json::from_str::<serde_json::Value>(&body).is_ok();
            assert_eq!(
                serde_ok, decodable,
                "serde_json and the case disagree: {body}"
            );
            let parsed = Envelope::parse(body.as_bytes(), true);
            assert_eq!(parsed.is_ok(), decodable, "{body}: {parsed:?}");
            if let Err(error) = parsed {
                let text = error.to_string();
                assert!(
                    text.contains("surrogate") || text.contains("out of range"),
                    "{text}"
                );
            }
        }
        // The request object and params take two levels; `v` the rest.
        for depth in [MAX_DEPTH - 3, MAX_DEPTH - 2, MAX_DEPTH - 1, MAX_DEPTH] {
            let body = request_with(&format!("{}{}", "[".repeat(depth), "]".repeat(depth)));
            let serde_ok = serde_json::from_str::<serde_json::Value>(&body).is_ok();
            let parsed = Envelope::parse(body.as_bytes(), true);
            assert_eq!(parsed.is_ok(), serde_ok, "depth {depth}: {parsed:?}");
        }
        let deep = request_with(&format!("{}{}", "[".repeat(200), "]".repeat(200)));
        let error = Envelope::parse(deep.as_bytes(), true).expect_err("too deep");
        assert!(error.to_string().contains("nested deeper"), "{error}");
        // Agent lines are relayed, not judged.
        assert!(Envelope::parse(request_with(r#""\ud83d""#).as_bytes(), false).is_ok());
    }

    #[test]
    fn keeps_explicit_null_id_apart_from_missing_id() {
        let (envelope, kind) =
            Envelope::parse(br#"{"jsonrpc":"2.0","id":null,"method":"x"}"#, true).expect("null id");
        assert_eq!(kind, Kind::Request);
        assert_eq!(envelope.id.map(RawValue::get), Some("null"));
    }

    #[test]
    fn ids_round_trip_verbatim() {
        for id in [
            "9007199254740993",
            "\"a\\u0062c\"",
            "-0",
            "18446744073709551616",
        ] {
            let text = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"m","params":{{}}}}"#);
            let (envelope, _) = Envelope::parse(text.as_bytes(), true).expect("parse");
            let id_raw = envelope.id.expect("id");
            assert_eq!(id_raw.get(), id);
            let line = result_response_line(id_raw, &serde_json::json!({}));
            let text = String::from_utf8(line).expect("utf8");
            assert!(text.contains(&format!(r#""id":{id}"#)), "{text}");
        }
    }

    #[test]
    fn rejects_bad_shapes() {
        let cases: &[(&[u8], EnvelopeError)] = &[
            (
                b"[]",
                EnvelopeError::NotJson("batches (arrays) are not supported".into()),
            ),
            (b"", EnvelopeError::NotJson("empty body".into())),
            (
                b"\"x\"",
                EnvelopeError::NotJson("expected an object".into()),
            ),
            (br#"{"id":1,"method":"x"}"#, EnvelopeError::Version),
            (br#"{"jsonrpc":"2.0","id":1}"#, EnvelopeError::Shape),
            (
                br#"{"jsonrpc":"2.0","id":1,"result":1,"error":{}}"#,
                EnvelopeError::Shape,
            ),
            (
                br#"{"jsonrpc":"2.0","id":{},"method":"x"}"#,
                EnvelopeError::Id,
            ),
            (
                br#"{"jsonrpc":"2.0","id":true,"method":"x"}"#,
                EnvelopeError::Id,
            ),
            (
                br#"{"jsonrpc":"2.0","method":"x","params":3}"#,
                EnvelopeError::Params,
            ),
        ];
        for (bytes, expected) in cases {
            let error = Envelope::parse(bytes, true).expect_err("must fail");
            assert_eq!(&error, expected, "{}", String::from_utf8_lossy(bytes));
        }
        assert!(matches!(
            Envelope::parse(b"{not json", true),
            Err(EnvelopeError::NotJson(_))
        ));
    }

    #[test]
    fn reads_session_id_and_meta_agent() {
        let (envelope, _) = Envelope::parse(
            br#"{"jsonrpc":"2.0","method":"session/update","params":{"update":{"x":[1,2]},"sessionId":"s-1"}}"#,
            true,
        )
        .expect("parse");
        assert_eq!(envelope.session_id().as_deref(), Some("s-1"));
        let params = RawValue::from_string(
            r#"{"cwd":"/","_meta":{"other":1,"sandboxagent.dev":{"agent":"mock","title":"t"}}}"#
                .to_owned(),
        )
        .expect("raw");
        assert_eq!(meta_agent(Some(&params)).as_deref(), Some("mock"));
        let params =
            RawValue::from_string(r#"{"_meta":{"sandboxagent.dev":{}}}"#.to_owned()).expect("raw");
        assert_eq!(meta_agent(Some(&params)), None);
    }

    #[test]
    fn agent_message_peeks_into_params_in_one_pass() {
        let line = br#"{"jsonrpc":"2.0","method":"session/update","params":{"update":{"content":{"text":"x"},"sessionUpdate":"agent_message_chunk"},"sessionId":"s-1"}}"#;
        let (message, kind) = AgentMessage::parse(line).expect("parse");
        assert_eq!(kind, Kind::Notification);
        assert_eq!(message.session_id(), Some("s-1"));
        assert_eq!(message.update_kind(), Some("agent_message_chunk"));
        assert!(matches!(
            message.params.as_ref().and_then(|p| p.session_id.as_ref()),
            Some(Cow::Borrowed(_))
        ));
        let (cancel, _) = AgentMessage::parse(
            br#"{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":"r 1"}}"#,
        )
        .expect("parse");
        assert_eq!(
            cancel.cancelled_request_id().map(RawValue::get),
            Some(r#""r 1""#)
        );
    }

    #[test]
    fn agent_message_params_of_other_shapes_are_relayed_not_rejected() {
        for line in [
            &br#"{"jsonrpc":"2.0","method":"x","params":[1,{"sessionId":"s"}]}"#[..],
            br#"{"jsonrpc":"2.0","method":"x","params":{"sessionId":5,"update":"text"}}"#,
            br#"{"jsonrpc":"2.0","method":"x","params":{"sessionId":{"a":[]},"update":{"sessionUpdate":7}}}"#,
            br#"{"jsonrpc":"2.0","method":"x","params":null}"#,
            br#"{"jsonrpc":"2.0","method":"x","params":"str"}"#,
        ] {
            let (message, kind) = AgentMessage::parse(line).expect("lenient");
            assert_eq!(kind, Kind::Notification);
            assert_eq!(message.session_id(), None);
            assert_eq!(message.update_kind(), None);
        }
        let (escaped, _) = AgentMessage::parse(
            br#"{"jsonrpc":"2.0","method":"x","params":{"sessionId":"a\u0062"}}"#,
        )
        .expect("parse");
        assert_eq!(escaped.session_id(), Some("ab"));
        assert!(AgentMessage::parse(b"[1]").is_err());
        assert!(AgentMessage::parse(br#"{"jsonrpc":"2.0","id":1}"#).is_err());
        assert!(
            AgentMessage::parse(br#"{"jsonrpc":"2.0","method":"x","params":{"sessionId":"s""#)
                .is_err()
        );
    }

    #[test]
    fn agent_messages_must_be_json_rpc_2_0() {
        for line in [
            &br#"{"id":3,"result":{"stopReason":"refusal"}}"#[..],
            br#"{"jsonrpc":"1.0","id":3,"result":{}}"#,
            br#"{"jsonrpc":2,"id":3,"result":{}}"#,
            br#"{"level":"info","id":3,"msg":"x","result":"logged"}"#,
            br#"{"method":"session/update","params":{}}"#,
        ] {
            let error = AgentMessage::parse(line).expect_err("not JSON-RPC 2.0");
            assert!(
                matches!(error, EnvelopeError::Version | EnvelopeError::NotJson(_)),
                "{error:?}"
            );
        }
        let (_, kind) =
            AgentMessage::parse(br#"{"jsonrpc":"2.0","id":3,"result":{}}"#).expect("2.0");
        assert_eq!(kind, Kind::Response);
    }

    #[test]
    fn flattens_newlines_outside_strings() {
        let mut bytes = b"{\n\"a\":\r\n\"b\\nc\"}".to_vec();
        flatten_newlines(&mut bytes);
        let value: serde_json::Value = serde_json::from_slice(&bytes).expect("still JSON");
        assert_eq!(value["a"], "b\nc");
        assert!(!has_newline(&bytes));
    }
}
