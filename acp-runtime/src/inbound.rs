//! One client message, parsed once at the edge that received it (a `POST
//! /v2/rpc`, a `POST /acp`, a WebSocket text frame) and handed to
//! [`crate::runtime::Runtime::dispatch`] as it is: the runtime never parses
//! a client's body again (research/contract.md, "Transport: /v2/rpc", POST).

use crate::protocol::{self, Envelope, EnvelopeError, Kind, Method, OwnedEnvelope};
use bytes::Bytes;

/// A client's JSON-RPC message: the line it arrived as (forwarded to the
/// agent and recorded as it is) and what the one parse found in it.
#[derive(Debug)]
pub struct Inbound<'a> {
    /// The message on one line (see [`one_line`]).
    pub line: &'a Bytes,
    /// Its members, borrowed from `line`.
    pub envelope: Envelope<'a>,
    /// Request, notification or response.
    pub kind: Kind,
    /// Its method, classified once ([`Method::Other`] for a response): what
    /// the runtime decides by method is read from this, never from the name.
    pub method: Method,
}

impl<'a> Inbound<'a> {
    /// Parses `line`, which [`one_line`] made (strict: `"jsonrpc": "2.0"`,
    /// decodable by an agent).
    ///
    /// # Errors
    /// [`EnvelopeError`] naming what is wrong.
    pub fn parse(line: &'a Bytes) -> Result<Self, EnvelopeError> {
        let (envelope, kind) = Envelope::parse(line, true)?;
        let method = match kind {
            Kind::Response => Method::Other,
            Kind::Request | Kind::Notification => Method::parse(envelope.method()),
        };
        Ok(Self {
            line,
            envelope,
            kind,
            method,
        })
    }

    /// The method's name as the client wrote it (unescaped), or `""` for a
    /// response.
    pub fn method_name(&self) -> &str {
        self.envelope.method()
    }

    /// Whether this is the `initialize` request.
    pub fn is_initialize(&self) -> bool {
        self.kind == Kind::Request && self.method == Method::Initialize
    }
}

/// An [`Inbound`] that owns its parts, to move a parsed message into a task
/// (a request on `/acp` runs apart from the exchange that brought it). The
/// members are copied as written: no second parse.
#[derive(Debug)]
pub struct OwnedInbound {
    line: Bytes,
    envelope: OwnedEnvelope,
    kind: Kind,
    method: Method,
}

impl OwnedInbound {
    /// Copies the members of `message`.
    pub fn new(message: &Inbound<'_>) -> Self {
        Self {
            line: message.line.clone(),
            envelope: OwnedEnvelope::new(&message.envelope),
            kind: message.kind,
            method: message.method,
        }
    }

    /// The message again, borrowed from this copy.
    pub fn inbound(&self) -> Inbound<'_> {
        Inbound {
            line: &self.line,
            envelope: self.envelope.envelope(),
            kind: self.kind,
            method: self.method,
        }
    }
}

/// The message of `body` as one line, ready for [`Inbound::parse`], in a
/// buffer of its own. One line: newline-delimited stdio toward the agent
/// needs it, so CR and LF between tokens become spaces (inside a string
/// they are left as they are, and the parse refuses them: JSON has no raw
/// control characters in strings). A buffer of its own: what an edge read
/// may be a slice of a larger read buffer (hyper's, tungstenite's) that
/// everything keeping the message (the session's log, the store's queue)
/// would otherwise keep alive. One copy, no parse.
pub fn one_line(body: &[u8]) -> Bytes {
    if !protocol::has_newline(body) {
        return Bytes::copy_from_slice(body);
    }
    let mut copy = body.to_vec();
    let (mut in_string, mut escaped) = (false, false);
    for byte in &mut copy {
        if in_string {
            match *byte {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
        } else if *byte == b'"' {
            in_string = true;
        } else if matches!(*byte, b'\n' | b'\r') {
            *byte = b' ';
        }
    }
    Bytes::from(copy)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_flattens_whitespace_but_not_strings() {
        let pretty = b"{\n \"jsonrpc\": \"2.0\",\r\n \"method\": \"m\"\n}";
        let line = one_line(pretty);
        assert!(!protocol::has_newline(&line));
        let message = Inbound::parse(&line).expect("parses");
        assert_eq!(
            (message.method_name(), message.kind),
            ("m", Kind::Notification)
        );
        let raw_newline = one_line(b"{\"jsonrpc\":\"2.0\",\"method\":\"a\nb\"}");
        assert_eq!(
            &raw_newline[..],
            b"{\"jsonrpc\":\"2.0\",\"method\":\"a\nb\"}"
        );
        assert!(Inbound::parse(&raw_newline).is_err());
        let escaped_quote = one_line(b"{\"jsonrpc\":\"2.0\",\n\"method\":\"a\\\"\n\"}");
        assert_eq!(
            &escaped_quote[..],
            b"{\"jsonrpc\":\"2.0\", \"method\":\"a\\\"\n\"}"
        );
    }

    #[test]
    fn owned_copy_reads_the_same() {
        let line = Bytes::from_static(b"{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"initialize\"}");
        let message = Inbound::parse(&line).expect("parses");
        let owned = OwnedInbound::new(&message);
        let again = owned.inbound();
        assert!(again.is_initialize());
        assert_eq!(again.envelope.id.map(|id| id.get()), Some("7"));
        assert_eq!(again.line, &line);
    }
}
