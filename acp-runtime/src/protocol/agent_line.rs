//! Reading an agent's lines leniently ([`AgentMessage`]): the envelope and a
//! one-pass peek into `params` (session id, update kind, cancelled request),
//! and the few fields read from params and lines elsewhere.

use super::decodable::expect_object;
use super::envelope::{Kind, borrowed_str, classify, is_valid_id, present};
use super::error::EnvelopeError;
use serde::de::{IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use std::borrow::Cow;

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
