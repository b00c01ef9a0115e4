//! The client side of `/v2/rpc` (research/contract.md, "Transport: /v2/rpc"),
//! as plain HTTP.
//!
//! [`Api`] builds and sends requests; [`Reply`] is one response read to the
//! end. Helpers that "expect" something panic with the whole reply in the
//! message, which is what a failing test wants to show.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use reqwest::header::{self, HeaderMap};
use reqwest::{Method, RequestBuilder, StatusCode};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::acp;
use crate::sse::SseStream;
use crate::{CONNECTION_ID_HEADER, MOCK, REQUEST_TIMEOUT};

/// A cheap, clonable HTTP handle to one server.
#[derive(Clone)]
pub struct Api {
    /// Shared client. Connection pooling is off (`pool_max_idle_per_host(0)`)
    /// so a request never lands on a socket the server already closed, and
    /// dropping a request future closes its own TCP connection.
    http: reqwest::Client,
    /// `http://127.0.0.1:PORT`, from the server's start-up line.
    base_url: String,
    /// Bearer token added by [`Api::request`] when the server was started
    /// with one.
    token: Option<String>,
}

impl Api {
    /// A handle for `base_url`; `token` is sent as `Authorization: Bearer`.
    pub fn new(base_url: String, token: Option<String>) -> Api {
        let http = reqwest::Client::builder()
            .no_proxy()
            .pool_max_idle_per_host(0)
            .build()
            .expect("build the reqwest client");
        Api {
            http,
            base_url,
            token,
        }
    }

    pub(crate) fn set_base_url(&mut self, base_url: String) {
        self.base_url = base_url;
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> &str {
        self.base_url.trim_start_matches("http://")
    }

    /// The absolute URL of `path` (which starts with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }

    /// The token this handle authenticates with, if any.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// The bare client: requests built from it carry no `Authorization`.
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// A request to `path`, with `Authorization: Bearer <token>` when the
    /// server has a token.
    pub fn request(&self, method: Method, path: &str) -> RequestBuilder {
        let builder = self.http.request(method, self.url(path));
        match &self.token {
            Some(token) => builder.bearer_auth(token),
            None => builder,
        }
    }

    /// `POST /v2/rpc` with `Content-Type: application/json`, the connection
    /// header when `conn` is given, and auth; the body is up to the caller.
    pub fn rpc_post(&self, conn: Option<&str>) -> RequestBuilder {
        let builder = self
            .request(Method::POST, "/v2/rpc")
            .header(header::CONTENT_TYPE, "application/json");
        with_connection(builder, conn)
    }

    /// Sends `builder` and reads the whole response, within
    /// [`REQUEST_TIMEOUT`].
    ///
    /// # Panics
    /// On a transport error or timeout.
    pub async fn send(builder: RequestBuilder) -> Reply {
        Self::send_within(builder, REQUEST_TIMEOUT).await
    }

    /// [`Api::send`] with an explicit bound.
    pub async fn send_within(builder: RequestBuilder, timeout: Duration) -> Reply {
        let exchange = async {
            let response = builder.send().await?;
            Reply::read(response).await
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(error)) => panic!("HTTP exchange failed: {error:?}"),
            Err(_) => panic!("no complete HTTP response within {timeout:?}"),
        }
    }

    /// `POST /v2/processes/run` of `sh -c script` in `cwd`: (exit code,
    /// stdout, stderr); -1 and empty text for members missing.
    ///
    /// # Panics
    /// Unless the answer is 200.
    pub async fn run_sh(
        &self,
        script: &str,
        cwd: impl AsRef<std::path::Path>,
    ) -> (i64, String, String) {
        let reply = Self::send(
            self.request(Method::POST, "/v2/processes/run")
                .json(&json!({"command": "sh", "args": ["-c", script], "cwd": cwd.as_ref()})),
        )
        .await;
        reply.assert_status(200);
        let body = reply.json();
        (
            body["exitCode"].as_i64().unwrap_or(-1),
            body["stdout"].as_str().unwrap_or_default().to_owned(),
            body["stderr"].as_str().unwrap_or_default().to_owned(),
        )
    }

    /// POSTs one JSON body to `/v2/rpc`.
    pub async fn post(&self, conn: Option<&str>, body: &Value) -> Reply {
        Self::send(self.rpc_post(conn).body(body.to_string())).await
    }

    /// POSTs a JSON-RPC request and returns the JSON-RPC response object,
    /// asserting `200`, a JSON body and the same `id`.
    pub async fn call(&self, conn: &str, request: &Value) -> Value {
        let reply = self.post(Some(conn), request).await;
        reply.assert_status(200);
        let body = reply.json();
        assert_eq!(
            body.get("id"),
            request.get("id"),
            "response id differs from the request id: {reply:?}"
        );
        assert!(
            body.get("result").is_some() || body.get("error").is_some(),
            "not a JSON-RPC response: {reply:?}"
        );
        body
    }

    /// Sends the JSON-RPC request `method` with `params` under `id` on
    /// `conn`; returns the response object (see [`Api::call`]).
    pub async fn rpc(
        &self,
        conn: &str,
        id: impl Into<Value>,
        method: &str,
        params: Value,
    ) -> Value {
        self.call(conn, &acp::request(id, method, params)).await
    }

    /// `GET path` with auth; the whole reply.
    pub async fn get(&self, path: &str) -> Reply {
        Self::send(self.request(Method::GET, path)).await
    }

    /// `GET path`, asserting `200` and `Content-Type: application/json`;
    /// returns the body.
    pub async fn get_json(&self, path: &str) -> Value {
        let reply = self.get(path).await;
        reply.assert_status(200);
        assert!(
            reply
                .header("content-type")
                .is_some_and(|t| t.starts_with("application/json")),
            "GET {path} is not application/json: {reply:?}"
        );
        reply.json()
    }

    /// Waits until `/v2/health` says `"store": want`, at most `within`;
    /// returns that health.
    pub async fn store_state(&self, want: &str, within: Duration) -> Value {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let health = self.health().await.json();
            if health["store"] == want {
                return health;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "store did not become {want} within {within:?}: {health}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the store holds everything queued (`storeWaiting` 0,
    /// `store` ok), at most `within`; returns that health.
    pub async fn store_caught_up(&self, within: Duration) -> Value {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let health = self.health().await.json();
            assert_eq!(health["store"], "ok", "store not ok: {health}");
            if health["storeWaiting"] == 0 {
                return health;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "store did not catch up: {health}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Every logged event of the mock agent's `session`, paging
    /// `GET /v2/sessions/{id}/events` from offset 0.
    pub async fn all_events(&self, session: &str) -> Vec<Value> {
        let mut events = Vec::new();
        let mut offset = 0;
        loop {
            let page = self
                .get_json(&format!(
                    "/v2/sessions/{}/events?agent={MOCK}&offset={offset}&limit=1000",
                    path_segment(session)
                ))
                .await;
            let batch = page["events"].as_array().cloned().unwrap_or_default();
            let next = page["nextOffset"].as_u64().expect("nextOffset");
            if batch.is_empty() {
                return events;
            }
            events.extend(batch);
            offset = next;
        }
    }

    /// `initialize` for `agent` without a connection header; the raw reply.
    pub async fn initialize_reply(&self, agent: &str) -> Reply {
        let request = acp::request(0, "initialize", acp::initialize_params(agent));
        self.post(None, &request).await
    }

    /// `initialize` for `agent`; returns the new connection id.
    ///
    /// # Panics
    /// Unless the reply is `200` with a result and an `x-acp-connection-id`.
    pub async fn initialize(&self, agent: &str) -> String {
        let reply = self.initialize_reply(agent).await;
        reply.assert_status(200);
        let body = reply.json();
        assert!(body.get("result").is_some(), "initialize failed: {reply:?}");
        reply
            .connection_id()
            .unwrap_or_else(|| panic!("initialize reply has no {CONNECTION_ID_HEADER}: {reply:?}"))
    }

    /// `session/new` on `conn` for the mock agent; returns the session id.
    pub async fn new_session(&self, conn: &str) -> String {
        self.new_session_for(conn, MOCK).await
    }

    /// `session/new` on `conn` naming `agent`; returns the session id.
    pub async fn new_session_for(&self, conn: &str, agent: &str) -> String {
        let request = acp::request(1, "session/new", acp::new_session_params(agent));
        let body = self.call(conn, &request).await;
        body["result"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("session/new gave no sessionId: {body}"))
            .to_owned()
    }

    /// `session/prompt` with one text block; returns the JSON-RPC response
    /// object (asserting `200` and the same id).
    pub async fn prompt(&self, conn: &str, session: &str, id: Value, text: &str) -> Value {
        let request = acp::request(id, "session/prompt", acp::prompt_params(session, text));
        self.call(conn, &request).await
    }

    /// The mock agent's `_mock/echo` (answers with its params as result).
    pub async fn echo(&self, conn: &str, id: Value, params: Value) -> Value {
        self.call(conn, &acp::request(id, "_mock/echo", params))
            .await
    }

    /// `DELETE /v2/rpc`, with the connection header when `conn` is given.
    pub async fn delete(&self, conn: Option<&str>) -> Reply {
        Self::send(with_connection(
            self.request(Method::DELETE, "/v2/rpc"),
            conn,
        ))
        .await
    }

    /// `GET /v2/health` (never sends a token).
    pub async fn health(&self) -> Reply {
        Self::send(self.http.get(self.url("/v2/health"))).await
    }

    /// `GET /v2/rpc` with `Accept: text/event-stream`, the connection header
    /// and `Last-Event-ID` when given; returns as soon as the response head
    /// is in (the body of a `200` is the live stream).
    pub async fn get_stream(
        &self,
        conn: Option<&str>,
        last_event_id: Option<&str>,
    ) -> reqwest::Response {
        let mut builder = with_connection(self.request(Method::GET, "/v2/rpc"), conn)
            .header(header::ACCEPT, "text/event-stream");
        if let Some(id) = last_event_id {
            builder = builder.header("last-event-id", id);
        }
        Self::response_head(builder).await
    }

    /// Sends `builder` and waits (bounded) for the response head only.
    pub async fn response_head(builder: RequestBuilder) -> reqwest::Response {
        match tokio::time::timeout(REQUEST_TIMEOUT, builder.send()).await {
            Ok(Ok(response)) => response,
            Ok(Err(error)) => panic!("GET failed: {error:?}"),
            Err(_) => panic!("no response head within {REQUEST_TIMEOUT:?}"),
        }
    }

    /// Opens the SSE stream of `conn` and asserts `200`.
    pub async fn open_stream(&self, conn: &str, last_event_id: Option<u64>) -> SseStream {
        let last = last_event_id.map(|id| id.to_string());
        let response = self.get_stream(Some(conn), last.as_deref()).await;
        if response.status() != StatusCode::OK {
            let reply = read_bounded(response).await;
            panic!("GET /v2/rpc (Last-Event-ID {last_event_id:?}) was not 200: {reply:?}");
        }
        SseStream::new(response)
    }

    /// A `GET /v2/rpc` the test expects to fail; returns the error reply.
    ///
    /// # Panics
    /// If the server answers `2xx` (the stream would otherwise be read
    /// until the timeout).
    pub async fn get_stream_error(&self, conn: Option<&str>, last_event_id: Option<&str>) -> Reply {
        let response = self.get_stream(conn, last_event_id).await;
        assert!(
            !response.status().is_success(),
            "GET /v2/rpc (connection {conn:?}, Last-Event-ID {last_event_id:?}) unexpectedly \
             opened a stream: {} {:?}",
            response.status(),
            response.headers()
        );
        read_bounded(response).await
    }

    /// One hand-written HTTP/1.1 exchange over a fresh TCP connection with
    /// `Connection: close`, for requests `reqwest` cannot express (it always
    /// sends an `Accept` header). `headers` must not contain `Host`,
    /// `Content-Length` or `Connection`; auth is added when the server has a
    /// token.
    pub async fn raw_exchange(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> RawReply {
        let exchange = async {
            let mut stream = tokio::net::TcpStream::connect(self.addr()).await?;
            let mut head = format!(
                "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: {}\r\n",
                self.addr(),
                body.len()
            );
            if let Some(token) = &self.token {
                head.push_str(&format!("Authorization: Bearer {token}\r\n"));
            }
            for (name, value) in headers {
                head.push_str(&format!("{name}: {value}\r\n"));
            }
            head.push_str("\r\n");
            stream.write_all(head.as_bytes()).await?;
            stream.write_all(body).await?;
            let mut raw = Vec::new();
            stream.read_to_end(&mut raw).await?;
            Ok::<_, std::io::Error>(raw)
        };
        let raw = match tokio::time::timeout(REQUEST_TIMEOUT, exchange).await {
            Ok(Ok(raw)) => raw,
            Ok(Err(error)) => panic!("raw HTTP exchange failed: {error}"),
            Err(_) => panic!("raw HTTP exchange not finished within {REQUEST_TIMEOUT:?}"),
        };
        RawReply::parse(&raw)
    }
}

/// Reads a response whose head is already in to the end, within
/// [`REQUEST_TIMEOUT`].
///
/// # Panics
/// On a transport error or timeout.
pub async fn read_bounded(response: reqwest::Response) -> Reply {
    match tokio::time::timeout(REQUEST_TIMEOUT, Reply::read(response)).await {
        Ok(Ok(reply)) => reply,
        Ok(Err(error)) => panic!("reading the response body failed: {error:?}"),
        Err(_) => panic!("response body not complete within {REQUEST_TIMEOUT:?}"),
    }
}

/// Adds the connection header when `conn` is given.
fn with_connection(builder: RequestBuilder, conn: Option<&str>) -> RequestBuilder {
    match conn {
        Some(conn) => builder.header(CONNECTION_ID_HEADER, conn),
        None => builder,
    }
}

/// One HTTP response read to the end.
pub struct Reply {
    /// The status code.
    pub status: StatusCode,
    /// The response headers.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
}

impl Reply {
    /// Reads `response`'s body to the end (no timeout of its own: callers
    /// bound it).
    pub async fn read(response: reqwest::Response) -> reqwest::Result<Reply> {
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.bytes().await?;
        Ok(Reply {
            status,
            headers,
            body,
        })
    }

    /// The body as JSON.
    ///
    /// # Panics
    /// If it is not JSON.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {self:?}"))
    }

    /// The body, lossily decoded.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// One header's value as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The `x-acp-connection-id` response header.
    pub fn connection_id(&self) -> Option<String> {
        self.header(CONNECTION_ID_HEADER).map(str::to_owned)
    }

    /// Asserts the status code.
    pub fn assert_status(&self, status: u16) -> &Self {
        assert_eq!(self.status.as_u16(), status, "unexpected status: {self:?}");
        self
    }

    /// Asserts `202 Accepted` with an empty body (a notification or a
    /// response to an agent request; research/contract.md,
    /// "Transport: /v2/rpc").
    pub fn assert_accepted_empty(&self) -> &Self {
        self.assert_status(202);
        assert!(
            self.body.is_empty(),
            "202 must have an empty body: {self:?}"
        );
        self
    }
}

impl fmt::Debug for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "HTTP {} {:?} body: {}",
            self.status,
            self.headers,
            self.text()
        )
    }
}

/// A response read from a hand-written exchange ([`Api::raw_exchange`]).
#[derive(Debug)]
pub struct RawReply {
    /// The status code of the status line.
    pub status: u16,
    /// The response head (status line and headers), as text.
    pub head: String,
    /// Everything after the head (not de-chunked).
    pub body: Vec<u8>,
}

impl RawReply {
    /// Splits a whole raw response into status, head and body.
    ///
    /// # Panics
    /// When `raw` has no HTTP head.
    pub fn parse(raw: &[u8]) -> RawReply {
        let split = raw
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .unwrap_or_else(|| panic!("no HTTP head in {:?}", String::from_utf8_lossy(raw)));
        let head = String::from_utf8_lossy(&raw[..split]).into_owned();
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .unwrap_or_else(|| panic!("bad status line in {head:?}"));
        RawReply {
            status,
            head,
            body: raw[split + 4..].to_vec(),
        }
    }

    /// One header's value (case-insensitive name).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.trim().eq_ignore_ascii_case(name).then(|| value.trim())
        })
    }
}

/// A JSON body for `_mock/echo` of roughly `len` bytes, for size limits:
/// `{"jsonrpc":"2.0","id":1,"method":"_mock/echo","params":{"pad":"xxx…"}}`
/// padded so the serialized body is exactly `len` bytes.
///
/// # Panics
/// If `len` is smaller than the unpadded message.
pub fn echo_body_of_len(len: usize) -> String {
    let empty = json!({"jsonrpc": "2.0", "id": 1, "method": "_mock/echo", "params": {"pad": ""}})
        .to_string();
    assert!(len >= empty.len(), "{len} bytes cannot hold {empty}");
    let body = json!({
        "jsonrpc": "2.0", "id": 1, "method": "_mock/echo",
        "params": {"pad": "x".repeat(len - empty.len())}
    })
    .to_string();
    assert_eq!(body.len(), len);
    body
}

/// `text` as one URL path segment: every byte but RFC 3986's unreserved
/// characters percent-encoded (ACP session ids are arbitrary strings).
pub fn path_segment(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(byte).to_string()
            }
            _ => format!("%{byte:02X}"),
        })
        .collect()
}

/// `text` as a query value: like [`path_segment`] but `/` is kept, so a
/// file system path stays readable in the URL.
pub fn query_path(text: &str) -> String {
    text.split('/')
        .map(path_segment)
        .collect::<Vec<_>>()
        .join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echo_bodies_have_the_exact_length() {
        for len in [100, 1024, 1025, 4096] {
            let body = echo_body_of_len(len);
            assert_eq!(body.len(), len);
            assert!(serde_json::from_str::<Value>(&body).is_ok());
        }
    }

    #[test]
    fn raw_replies_parse() {
        let raw = RawReply::parse(b"HTTP/1.1 200 OK\r\nX-Acp-Connection-Id: abc\r\n\r\n{}");
        assert_eq!(raw.status, 200);
        assert_eq!(raw.header("x-acp-connection-id"), Some("abc"));
        assert_eq!(raw.body, b"{}");
    }
}
