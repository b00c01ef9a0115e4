//! What a connection needs to know about the server: [`TransportOptions`].

use crate::backoff::ReconnectPolicy;
use crate::error::Error;
use crate::protocol::{
    ACP_CONNECTION_ID_HEADER, ACP_PATH, DEFAULT_CONNECTION_ID_HEADER, DEFAULT_PATH,
};
use reqwest::Url;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Which way a message went, for the [`EnvelopeObserver`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// A message this client sent (POST body), before it is sent.
    Outgoing,
    /// A message delivered to the caller (a 200 body, an SSE event, or an
    /// error response this crate made up for a failed request), after
    /// duplicates were dropped.
    Incoming,
}

/// Which wire a connection's messages travel over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Transport {
    /// `POST` each message, read the rest from a Server-Sent Events stream
    /// resumed with `Last-Event-ID` after a drop (sandbox-agent's
    /// research/contract.md, "Transport: /v2/rpc"). No answer or update is
    /// lost while the server's replay ring holds it.
    #[default]
    Http,
    /// One WebSocket on `/acp` (research/contract.md, "The /acp profile",
    /// WebSocket): each message one text frame, the lowest latency. **No
    /// resume**: a WebSocket cannot rejoin its connection, so a dropped
    /// socket ends [`Incoming`](crate::Incoming) with an error and loses
    /// what was in flight (the sessions live on for `session/load`). Only
    /// `http://` base URLs (no TLS for WebSockets in this crate).
    WebSocket,
    /// The ACP transports RFD's Streamable HTTP at `/acp`
    /// (research/contract.md, "The /acp profile"): `initialize` answers
    /// 200 with `Acp-Connection-Id`, every other message 202 with its
    /// answer on the connection's event stream (resumed with
    /// `Last-Event-ID` as over [`Transport::Http`]); session-scoped
    /// messages carry `Acp-Session-Id` (taken from `params.sessionId`).
    /// Unlike `/v2/rpc`, [`close`](crate::HttpConnection::close) (DELETE)
    /// ends the sessions only this connection is attached to.
    AcpHttp,
}

/// Default of [`TransportOptions::max_message_bytes`]: 64 MiB.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// A hook called with every raw JSON-RPC message sent and delivered, for
/// logging and inspectors. It runs on the transport's tasks: keep it quick
/// and do not block.
pub type EnvelopeObserver = Arc<dyn Fn(Direction, &str) + Send + Sync>;

/// How to reach one ACP-over-HTTP endpoint.
///
/// Built with [`TransportOptions::new`] and the builder methods; every
/// setting has a default that matches sandbox-agent's research/contract.md,
/// "Transport: /v2/rpc".
#[derive(Clone)]
pub struct TransportOptions {
    pub(crate) base_url: Url,
    pub(crate) path: String,
    pub(crate) connection_id_header: HeaderName,
    pub(crate) token: Option<String>,
    pub(crate) headers: HeaderMap,
    pub(crate) connect_timeout: Option<Duration>,
    pub(crate) request_timeout: Option<Duration>,
    pub(crate) stream_idle_timeout: Option<Duration>,
    pub(crate) max_message_bytes: usize,
    pub(crate) reconnect: ReconnectPolicy,
    pub(crate) observer: Option<EnvelopeObserver>,
    pub(crate) transport: Transport,
}

impl TransportOptions {
    /// Options for the server at `base_url` (for example
    /// `http://127.0.0.1:2468`; a path prefix such as
    /// `https://host/sandbox/` is kept and the endpoint path is appended to
    /// it).
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] if `base_url` is not an absolute `http` or
    /// `https` URL.
    pub fn new(base_url: &str) -> Result<TransportOptions, Error> {
        let base_url = Url::parse(base_url)
            .map_err(|e| Error::InvalidOptions(format!("base URL {base_url:?}: {e}")))?;
        if !matches!(base_url.scheme(), "http" | "https") {
            return Err(Error::InvalidOptions(format!(
                "base URL {base_url}: the scheme must be http or https"
            )));
        }
        Ok(TransportOptions {
            base_url,
            path: DEFAULT_PATH.to_owned(),
            connection_id_header: HeaderName::from_static(DEFAULT_CONNECTION_ID_HEADER),
            token: None,
            headers: HeaderMap::new(),
            connect_timeout: Some(Duration::from_secs(10)),
            request_timeout: None,
            stream_idle_timeout: Some(Duration::from_secs(60)),
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            reconnect: ReconnectPolicy::default(),
            observer: None,
            transport: Transport::Http,
        })
    }

    /// The wire to use (default [`Transport::Http`]). Also sets the
    /// transport's own [`path`](Self::path) and
    /// [`connection_id_header`](Self::connection_id_header): `/v2/rpc` and
    /// `x-acp-connection-id` for HTTP, `/acp` and `acp-connection-id` for
    /// WebSocket and AcpHttp (call those after this one to change them).
    pub fn transport(mut self, transport: Transport) -> Self {
        let (path, header) = match transport {
            Transport::Http => (DEFAULT_PATH, DEFAULT_CONNECTION_ID_HEADER),
            Transport::WebSocket | Transport::AcpHttp => (ACP_PATH, ACP_CONNECTION_ID_HEADER),
        };
        self.transport = transport;
        self.path = path.to_owned();
        self.connection_id_header = HeaderName::from_static(header);
        self
    }

    /// Path of the endpoint under the base URL. Default `/v2/rpc`.
    pub fn path(mut self, path: impl Into<String>) -> Self {
        self.path = path.into();
        self
    }

    /// Name of the header that carries the connection id (sent on every
    /// request after the `initialize` response named it). Default
    /// `x-acp-connection-id`.
    pub fn connection_id_header(mut self, name: HeaderName) -> Self {
        self.connection_id_header = name;
        self
    }

    /// Bearer token: every request carries `Authorization: Bearer <token>`.
    /// Default none. The token is never logged.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// An extra header sent on every request (POST, GET and DELETE). Adding
    /// a name twice sends both values.
    pub fn header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.headers.append(name, value);
        self
    }

    /// Limit on establishing a TCP (and TLS) connection. Default 10 s;
    /// `None` waits as long as the OS does.
    pub fn connect_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Limit on one whole POST exchange (request sent, response read).
    /// Default `None`: a `session/prompt` can run for many minutes. A POST
    /// that times out leaves its request in flight; the server delivers the
    /// answer on the event stream instead. When it is `None`, POSTs of
    /// notifications and responses (answered at once with 202) still get
    /// 30 s and DELETE gets 10 s.
    pub fn request_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// How long the event stream may be silent (no event, no heartbeat
    /// comment) before it is treated as dead and reopened with
    /// `Last-Event-ID`. Catches half-open TCP connections. Default 60 s;
    /// keep it above the server's heartbeat interval (sandbox-agent: 15 s).
    /// `None` waits forever.
    pub fn stream_idle_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.stream_idle_timeout = timeout;
        self
    }

    /// Largest message accepted from the server, in bytes: a POST's answer
    /// body, and one line of the event stream. Default 64 MiB (sandbox-agent's
    /// own limit on an agent's line). A bigger answer fails its request with
    /// [`Error::InvalidResponse`]; a bigger stream line drops the stream,
    /// which is reopened. The server is not trusted with this client's memory.
    pub fn max_message_bytes(mut self, bytes: usize) -> Self {
        self.max_message_bytes = bytes.max(1);
        self
    }

    /// How the event stream is reopened after it drops. Default
    /// [`ReconnectPolicy::default`].
    pub fn reconnect(mut self, policy: ReconnectPolicy) -> Self {
        self.reconnect = policy;
        self
    }

    /// A hook called with every raw message sent and delivered (see
    /// [`EnvelopeObserver`]).
    pub fn observer(mut self, observer: impl Fn(Direction, &str) + Send + Sync + 'static) -> Self {
        self.observer = Some(Arc::new(observer));
        self
    }

    /// The endpoint URL: the base URL with [`path`](Self::path) appended to
    /// its own path.
    pub fn endpoint(&self) -> Url {
        let mut url = self.base_url.clone();
        let joined = format!(
            "{}/{}",
            url.path().trim_end_matches('/'),
            self.path.trim_start_matches('/')
        );
        url.set_path(&joined);
        url
    }
}

impl fmt::Debug for TransportOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransportOptions")
            .field("endpoint", &self.endpoint().as_str())
            .field("connection_id_header", &self.connection_id_header)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("max_message_bytes", &self.max_message_bytes)
            .field("stream_idle_timeout", &self.stream_idle_timeout)
            .field("reconnect", &self.reconnect)
            .field("observer", &self.observer.is_some())
            .field("transport", &self.transport)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_appends_the_path_to_any_prefix() -> Result<(), Error> {
        let options = TransportOptions::new("http://127.0.0.1:2468")?;
        assert_eq!(options.endpoint().as_str(), "http://127.0.0.1:2468/v2/rpc");
        let options = TransportOptions::new("https://host/sandbox/")?.path("rpc");
        assert_eq!(options.endpoint().as_str(), "https://host/sandbox/rpc");
        assert!(TransportOptions::new("ftp://host").is_err());
        assert!(TransportOptions::new("not a url").is_err());
        Ok(())
    }

    #[test]
    fn debug_output_hides_the_token() -> Result<(), Error> {
        let options = TransportOptions::new("http://h")?.token("secret-token");
        assert!(!format!("{options:?}").contains("secret-token"));
        Ok(())
    }
}
