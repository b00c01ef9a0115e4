//! Wire constants and small pure functions over JSON-RPC messages and SSE
//! event ids. No I/O here.

use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;

/// Default path of the endpoint under the base URL.
pub const DEFAULT_PATH: &str = "/v2/rpc";

/// Default name of the header that carries the connection id.
pub const DEFAULT_CONNECTION_ID_HEADER: &str = "x-acp-connection-id";

/// Path of the ACP transports RFD profile (sandbox-agent's
/// research/contract.md, "The /acp profile"); `/acp/{agent}` names the
/// agent, bare `/acp` takes it from `_meta` or the server's default.
pub const ACP_PATH: &str = "/acp";

/// The connection-id header of the `/acp` profile (RFD, "Identity Model").
pub const ACP_CONNECTION_ID_HEADER: &str = "acp-connection-id";

/// The session-id header of the `/acp` profile: session-scoped requests
/// (`session/prompt`, `session/cancel`, …) must carry it.
pub const ACP_SESSION_ID_HEADER: &str = "acp-session-id";

/// Response header of a POST answer naming the newest event id of the
/// connection when the answer was released; the client holds the answer
/// until its event stream delivered that event, so a turn's updates always
/// come before the turn's answer.
pub const LAST_EVENT_ID_HEADER: &str = "x-acp-last-event-id";

/// MIME type of every POST body and of the response to a request.
pub const APPLICATION_JSON: &str = "application/json";

/// MIME type the GET asks for.
pub const EVENT_STREAM: &str = "text/event-stream";

/// The SSE resume header (WHATWG HTML, "Server-sent events").
pub const LAST_EVENT_ID: &str = "last-event-id";

/// The only method that may be sent before a connection id is known: its
/// response carries the id.
pub const INITIALIZE: &str = "initialize";

/// What one JSON-RPC message is, as far as the transport cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// Has `method` and a non-null `id`. `id` is the raw JSON text.
    Request { id: String, method: String },
    /// Has `method` and no `id` (or `id: null`).
    Notification { method: String },
    /// Has no `method` and a non-null `id`. `id` is the raw JSON text.
    Response { id: String },
    /// Any other JSON object (for example an error response with
    /// `id: null`, answering a message that could not be read).
    Other,
}

impl Kind {
    /// The raw id text of a request, if this is one.
    pub fn request_id(&self) -> Option<&str> {
        match self {
            Kind::Request { id, .. } => Some(id),
            _ => None,
        }
    }

    /// The method of a request or notification.
    pub fn method(&self) -> Option<&str> {
        match self {
            Kind::Request { method, .. } | Kind::Notification { method } => Some(method),
            _ => None,
        }
    }
}

/// The members of a JSON-RPC message the transport looks at; everything
/// else stays raw and unparsed.
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    method: Option<Cow<'a, str>>,
}

/// Classifies one JSON-RPC message.
///
/// # Errors
/// When `text` is not one JSON object (a batch array, a bare value or
/// malformed JSON): the serde error.
pub fn classify(text: &str) -> Result<Kind, serde_json::Error> {
    // serde reads a struct from an array too; a JSON-RPC message is an object.
    if !text.trim_start().starts_with('{') {
        return Err(serde::de::Error::custom(
            "a JSON-RPC message is a JSON object",
        ));
    }
    let envelope: Envelope<'_> = serde_json::from_str(text)?;
    // `Option<&RawValue>` reads `null` as `None`, which is what we want:
    // a null id names no request of ours.
    let id = envelope.id.map(|raw| raw.get().to_owned());
    Ok(match (envelope.method, id) {
        (Some(method), Some(id)) => Kind::Request {
            id,
            method: method.into_owned(),
        },
        (Some(method), None) => Kind::Notification {
            method: method.into_owned(),
        },
        (None, Some(id)) => Kind::Response { id },
        (None, None) => Kind::Other,
    })
}

/// `params.sessionId` of a message, when it is a string.
pub fn params_session_id(text: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct Params<'a> {
        #[serde(borrow, rename = "sessionId")]
        session_id: Option<Cow<'a, str>>,
    }
    #[derive(Deserialize)]
    struct Message<'a> {
        #[serde(borrow)]
        params: Option<Params<'a>>,
    }
    let message: Message<'_> = serde_json::from_str(text).ok()?;
    message.params?.session_id.map(Cow::into_owned)
}

/// A JSON-RPC error response for the request whose raw id text is `raw_id`,
/// built by hand so the id keeps its exact bytes.
///
/// `error` is the JSON-RPC error object (`code`, `message`, `data`).
pub fn error_response(raw_id: &str, error: &serde_json::Value) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{raw_id},"error":{error}}}"#)
}

/// What to do with one SSE event, judged by its id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventDisposition {
    /// A new event: deliver it; its id is the new resume point.
    Fresh,
    /// An event without an `id:` line (such as a stream-gap notice):
    /// deliver it, the resume point stays.
    Unsequenced,
    /// Already delivered (a replay overlapping what we saw): drop it.
    Duplicate,
}

/// Tracks SSE event ids across reconnects: the resume point for
/// `Last-Event-ID`, and duplicate detection.
///
/// The SSE parser (per the WHATWG spec) carries the last `id:` forward to
/// events that have none, so an event without an `id:` line shows up with
/// the previous event's id, or with an empty id at the start of a stream.
/// Within one stream the server never repeats an id, so "same id as the
/// event before it in this stream" means "no id line".
#[derive(Debug, Default, Clone)]
pub struct EventIds {
    /// Text of the newest id delivered, sent as `Last-Event-ID`.
    last: Option<String>,
    /// The id the parser reported for the previous event of the current
    /// stream (empty at the start of a stream).
    previous_in_stream: String,
}

impl EventIds {
    /// Call when a new stream starts (the parser starts with no id).
    pub fn start_stream(&mut self) {
        self.previous_in_stream.clear();
    }

    /// The resume point: the newest id delivered, if any.
    pub fn last(&self) -> Option<&str> {
        self.last.as_deref()
    }

    /// Judges the event whose parser-reported id is `id`, and moves the
    /// resume point for a fresh one.
    ///
    /// Ids are compared as unsigned integers (research/contract.md,
    /// "Transport: /v2/rpc": sequence numbers increase by 1); an id that is
    /// not an integer cannot be compared and counts as fresh.
    pub fn classify(&mut self, id: &str) -> EventDisposition {
        if id.is_empty() || id == self.previous_in_stream {
            return EventDisposition::Unsequenced;
        }
        self.previous_in_stream.clear();
        self.previous_in_stream.push_str(id);
        if let (Ok(new), Some(Ok(last))) = (
            id.parse::<u64>(),
            self.last.as_deref().map(str::parse::<u64>),
        ) && new <= last
        {
            return EventDisposition::Duplicate;
        }
        self.last = Some(id.to_owned());
        EventDisposition::Fresh
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_session_id_reads_a_string_session_id_only() {
        let prompt = r#"{"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{"sessionId":"s-1","prompt":[]}}"#;
        assert_eq!(params_session_id(prompt).as_deref(), Some("s-1"));
        assert_eq!(
            params_session_id(r#"{"id":1,"method":"x","params":{}}"#),
            None
        );
        assert_eq!(params_session_id(r#"{"id":1,"method":"x"}"#), None);
        assert_eq!(
            params_session_id(r#"{"method":"x","params":{"sessionId":7}}"#),
            None
        );
    }

    #[test]
    fn classifies_the_four_shapes_and_keeps_raw_ids() {
        assert_eq!(
            classify(r#"{"jsonrpc":"2.0","id":9007199254740993,"method":"x","params":{}}"#).ok(),
            Some(Kind::Request {
                id: "9007199254740993".into(),
                method: "x".into()
            })
        );
        assert_eq!(
            classify(r#"{"jsonrpc":"2.0","method":"session/update"}"#).ok(),
            Some(Kind::Notification {
                method: "session/update".into()
            })
        );
        assert_eq!(
            classify(r#"{"jsonrpc":"2.0","id":"a\"b","result":{}}"#).ok(),
            Some(Kind::Response {
                id: r#""a\"b""#.into()
            })
        );
        assert_eq!(
            classify(r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"x"}}"#).ok(),
            Some(Kind::Other)
        );
        assert!(classify("[]").is_err());
        assert!(classify("not json").is_err());
    }

    #[test]
    fn error_response_keeps_the_id_bytes() {
        let text = error_response(
            "9007199254740993",
            &serde_json::json!({"code": -32603, "message": "m"}),
        );
        assert_eq!(
            classify(&text).ok(),
            Some(Kind::Response {
                id: "9007199254740993".into()
            })
        );
    }

    #[test]
    fn event_ids_drop_replays_and_keep_unsequenced_events() {
        let mut ids = EventIds::default();
        ids.start_stream();
        assert_eq!(ids.classify("1"), EventDisposition::Fresh);
        assert_eq!(ids.classify("2"), EventDisposition::Fresh);
        // An event without `id:` is reported with the carried-forward id.
        assert_eq!(ids.classify("2"), EventDisposition::Unsequenced);
        assert_eq!(ids.classify("3"), EventDisposition::Fresh);
        assert_eq!(ids.last(), Some("3"));

        // Reconnect: the replay overlaps.
        ids.start_stream();
        assert_eq!(ids.classify(""), EventDisposition::Unsequenced);
        assert_eq!(ids.classify("2"), EventDisposition::Duplicate);
        assert_eq!(ids.classify("3"), EventDisposition::Duplicate);
        assert_eq!(ids.classify("4"), EventDisposition::Fresh);
        assert_eq!(ids.last(), Some("4"));
    }
}
