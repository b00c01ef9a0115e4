//! The JSON-RPC envelope of a client's message ([`Envelope`],
//! [`OwnedEnvelope`]): parsed once, borrowing from the received bytes, with
//! `id`, `params`, `result` and `error` kept raw.

use super::decodable::{check_decodable, expect_object};
use super::error::EnvelopeError;
use serde::de::Visitor;
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use std::borrow::Cow;

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
pub(super) fn present<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(deserializer).map(Some)
}

/// A string member (`null` is `None`), borrowed from the input unless it has
/// escapes. serde borrows a bare `Cow<str>` field, but not one inside an
/// `Option`: that one is always an owned copy, two allocations per message
/// (`jsonrpc`, `method`) on every hop (research/benchmarks.md, "The /acp
/// transports").
pub(super) fn borrowed_str<'de, D: Deserializer<'de>>(
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

impl<'a> Envelope<'a> {
    /// Parses one JSON-RPC object from `bytes`.
    ///
    /// `strict` (client messages) requires `"jsonrpc": "2.0"`, `params` as an
    /// object ([`EnvelopeError::ParamsArray`]) and bytes an agent decodes as
    /// the runtime does ([`check_decodable`]); agent output is accepted
    /// without them, since relaying is more useful than rejecting.
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
            if envelope
                .params
                .is_some_and(|params| params.get().starts_with('['))
            {
                return Err(EnvelopeError::ParamsArray);
            }
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
pub(super) fn classify(
    method: bool,
    id: bool,
    result: bool,
    error: bool,
) -> Result<Kind, EnvelopeError> {
    match (method, id, result, error) {
        (true, true, false, false) => Ok(Kind::Request),
        (true, false, false, false) => Ok(Kind::Notification),
        (false, true, true, false) | (false, true, false, true) => Ok(Kind::Response),
        _ => Err(EnvelopeError::Shape),
    }
}

pub(super) fn is_valid_id(id: &RawValue) -> bool {
    matches!(
        id.get().as_bytes().first(),
        Some(b'"' | b'-' | b'0'..=b'9' | b'n')
    )
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
