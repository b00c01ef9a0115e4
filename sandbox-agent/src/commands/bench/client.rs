//! The load generator's side of the wire: a lean HTTP/1.1 client (one hyper
//! connection per simulated client, no pooling), an SSE event counter, and a
//! raw stdio driver for the mock agent.

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::process::Stdio;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use acp_runtime::protocol::CONNECTION_ID_HEADER;

/// Why a benchmark request failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Socket-level failure.
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    /// HTTP-level failure.
    #[error("HTTP: {0}")]
    Http(#[from] hyper::Error),
    /// An answer that is not what the scenario expects.
    #[error("{0}")]
    Unexpected(String),
}

/// One HTTP/1.1 connection to the server.
pub struct HttpClient {
    sender: http1::SendRequest<Full<Bytes>>,
    host: String,
    token: Option<String>,
}

impl HttpClient {
    /// Opens a TCP connection and performs the HTTP/1.1 handshake.
    ///
    /// # Errors
    /// Connect or handshake failure.
    pub async fn connect(address: SocketAddr, token: Option<&str>) -> Result<Self, BenchError> {
        let stream = TcpStream::connect(address).await?;
        stream.set_nodelay(true)?;
        let (sender, connection) = http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(Self {
            sender,
            host: address.to_string(),
            token: token.map(str::to_owned),
        })
    }

    /// A request builder for `method path` with the host and the bearer
    /// token (when there is one), and `x-acp-connection-id` when given.
    fn request_to(
        &self,
        method: http::Method,
        path: &str,
        connection_id: Option<&str>,
    ) -> http::request::Builder {
        let mut builder = Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, &self.host);
        if let Some(id) = connection_id {
            builder = builder.header(CONNECTION_ID_HEADER, id);
        }
        if let Some(token) = &self.token {
            builder = builder.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        builder
    }

    fn request(&self, method: http::Method, connection_id: Option<&str>) -> http::request::Builder {
        self.request_to(method, "/v2/rpc", connection_id)
    }

    /// Sends `body` with `builder`; returns status, headers and the whole
    /// body.
    async fn exchange(
        &mut self,
        builder: http::request::Builder,
        body: Bytes,
    ) -> Result<(StatusCode, HeaderMap, Bytes), BenchError> {
        let request = builder
            .body(Full::new(body))
            .map_err(|e| BenchError::Unexpected(e.to_string()))?;
        self.sender.ready().await?;
        let response = self.sender.send_request(request).await?;
        let (parts, body) = response.into_parts();
        let body = body.collect().await?.to_bytes();
        Ok((parts.status, parts.headers, body))
    }

    /// POSTs one JSON-RPC message; returns status, headers and the whole body.
    ///
    /// # Errors
    /// Transport failures.
    pub async fn post(
        &mut self,
        connection_id: Option<&str>,
        body: Bytes,
    ) -> Result<(StatusCode, HeaderMap, Bytes), BenchError> {
        let builder = self
            .request(http::Method::POST, connection_id)
            .header(http::header::CONTENT_TYPE, "application/json");
        self.exchange(builder, body).await
    }

    /// `GET /v2/health`; returns the status.
    ///
    /// # Errors
    /// Transport failures.
    pub async fn health(&mut self) -> Result<StatusCode, BenchError> {
        let request = Request::builder()
            .uri("/v2/health")
            .header(http::header::HOST, &self.host)
            .body(Full::new(Bytes::new()))
            .map_err(|e| BenchError::Unexpected(e.to_string()))?;
        self.sender.ready().await?;
        let response = self.sender.send_request(request).await?;
        let status = response.status();
        response.into_body().collect().await?;
        Ok(status)
    }

    /// `GET path` (a control-plane route); returns status and the whole body.
    ///
    /// # Errors
    /// Transport failures.
    pub async fn get(&mut self, path: &str) -> Result<(StatusCode, Bytes), BenchError> {
        let builder = self.request_to(http::Method::GET, path, None);
        let (status, _, body) = self.exchange(builder, Bytes::new()).await?;
        Ok((status, body))
    }

    /// `POST path` with a JSON `body` (a control-plane route); returns
    /// status and the whole body.
    ///
    /// # Errors
    /// Transport failures.
    pub async fn post_json(
        &mut self,
        path: &str,
        body: Bytes,
    ) -> Result<(StatusCode, Bytes), BenchError> {
        let builder = self
            .request_to(http::Method::POST, path, None)
            .header(http::header::CONTENT_TYPE, "application/json");
        let (status, _, body) = self.exchange(builder, body).await?;
        Ok((status, body))
    }

    /// `DELETE path` (a control-plane route); returns the status.
    ///
    /// # Errors
    /// Transport failures.
    pub async fn delete_path(&mut self, path: &str) -> Result<StatusCode, BenchError> {
        let builder = self.request_to(http::Method::DELETE, path, None);
        let (status, _, _) = self.exchange(builder, Bytes::new()).await?;
        Ok(status)
    }

    /// `GET path` with `Accept: text/event-stream`: the streamed body.
    ///
    /// # Errors
    /// Transport failures or a non-200 status.
    pub async fn get_event_stream(&mut self, path: &str) -> Result<Incoming, BenchError> {
        let builder = self
            .request_to(http::Method::GET, path, None)
            .header(http::header::ACCEPT, "text/event-stream");
        self.open_stream(builder, path).await
    }

    /// Sends the GET `builder` made (for `shown` in errors) and returns its
    /// streamed body.
    ///
    /// # Errors
    /// Transport failures or a non-200 status.
    async fn open_stream(
        &mut self,
        builder: http::request::Builder,
        shown: &str,
    ) -> Result<Incoming, BenchError> {
        let request = builder
            .body(Full::new(Bytes::new()))
            .map_err(|e| BenchError::Unexpected(e.to_string()))?;
        self.sender.ready().await?;
        let response = self.sender.send_request(request).await?;
        if response.status() != StatusCode::OK {
            return Err(BenchError::Unexpected(format!(
                "GET {shown} answered {}",
                response.status()
            )));
        }
        Ok(response.into_body())
    }

    /// Opens the SSE stream (optionally resuming after `last_event_id`).
    ///
    /// # Errors
    /// Transport failures or a non-200 status.
    pub async fn stream(
        &mut self,
        connection_id: &str,
        last_event_id: Option<u64>,
    ) -> Result<Incoming, BenchError> {
        let mut builder = self
            .request(http::Method::GET, Some(connection_id))
            .header(http::header::ACCEPT, "text/event-stream");
        if let Some(id) = last_event_id {
            builder = builder.header("last-event-id", id.to_string());
        }
        self.open_stream(builder, "/v2/rpc").await
    }

    /// `initialize` for `agent`; returns the new connection id.
    ///
    /// # Errors
    /// When no connection id comes back.
    pub async fn initialize(&mut self, agent: &str) -> Result<String, BenchError> {
        let body = serde_json::json!({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": 1, "clientCapabilities": {},
                       "_meta": {"sandboxagent.dev": {"agent": agent}}}
        });
        let (status, headers, body) = self.post(None, Bytes::from(body.to_string())).await?;
        headers
            .get(CONNECTION_ID_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .ok_or_else(|| {
                BenchError::Unexpected(format!(
                    "initialize answered {status}: {}",
                    String::from_utf8_lossy(&body)
                ))
            })
    }

    /// `session/new`; returns the session id.
    ///
    /// # Errors
    /// When the answer has no session id.
    pub async fn new_session(
        &mut self,
        connection_id: &str,
        agent: &str,
    ) -> Result<String, BenchError> {
        let body = serde_json::json!({
            "jsonrpc": "2.0", "id": 0, "method": "session/new",
            "params": {"cwd": "/", "mcpServers": [],
                       "_meta": {"sandboxagent.dev": {"agent": agent}}}
        });
        let (_, _, body) = self
            .post(Some(connection_id), Bytes::from(body.to_string()))
            .await?;
        session_id_of(&body)
    }
}

/// `result.sessionId` of a JSON-RPC response.
///
/// # Errors
/// When missing.
pub fn session_id_of(body: &[u8]) -> Result<String, BenchError> {
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| BenchError::Unexpected(format!("not JSON: {e}")))?;
    value["result"]["sessionId"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| BenchError::Unexpected(format!("no sessionId in {value}")))
}

/// Counts SSE events (frames with an `id:` line) in a byte stream without
/// parsing JSON: the benchmark measures the server, not the client.
#[derive(Debug, Default)]
pub struct EventCounter {
    carry: BytesMut,
    /// Events seen so far.
    pub events: u64,
    /// Highest `id:` seen.
    pub last_id: u64,
}

impl EventCounter {
    /// Feeds one chunk of the SSE body.
    pub fn feed(&mut self, chunk: &[u8]) {
        self.carry.extend_from_slice(chunk);
        let mut consumed = 0;
        while let Some(end) = memchr::memmem::find(&self.carry[consumed..], b"\n\n") {
            let frame = &self.carry[consumed..consumed + end];
            consumed += end + 2;
            let id = frame
                .split(|b| *b == b'\n')
                .find_map(|line| line.strip_prefix(b"id: "))
                .and_then(|id| std::str::from_utf8(id).ok()?.parse::<u64>().ok());
            if let Some(id) = id {
                self.events += 1;
                self.last_id = self.last_id.max(id);
            }
        }
        let _ = self.carry.split_to(consumed);
    }
}

/// Reads an SSE body until `target` events were counted.
///
/// # Errors
/// When the stream ends first.
pub async fn count_events(
    body: &mut Incoming,
    counter: &mut EventCounter,
    target: u64,
) -> Result<(), BenchError> {
    while counter.events < target {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    counter.feed(data);
                }
            }
            Some(Err(error)) => return Err(error.into()),
            None => {
                return Err(BenchError::Unexpected(format!(
                    "stream ended after {} of {target} events",
                    counter.events
                )));
            }
        }
    }
    Ok(())
}

/// The mock agent driven directly over its stdin/stdout: the physical limit.
pub type StdioAgent = LineAgent<ChildStdin, ChildStdout>;

/// The mock agent behind `socat`, which relays lines between a TCP
/// connection and the agent's stdio: what any relay process costs (two
/// more process crossings per round trip), the floor under a server's
/// ratio to stdio.
pub type RelayedAgent = LineAgent<OwnedWriteHalf, OwnedReadHalf>;

/// A mock agent spoken to in newline-delimited JSON-RPC over `W` and `R`.
pub struct LineAgent<W, R> {
    /// The process behind the lines (the agent, or `socat`).
    child: Child,
    /// Lines to the agent.
    pub stdin: BufWriter<W>,
    /// Lines from the agent.
    pub stdout: BufReader<R>,
}

impl StdioAgent {
    /// Starts `program mock-agent`, initializes it and creates a session.
    ///
    /// # Errors
    /// Spawn or protocol failures.
    pub async fn start(program: &std::path::Path) -> Result<(Self, String), BenchError> {
        let mut child = Command::new(program)
            .arg("mock-agent")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(BenchError::Unexpected("mock agent stdio not piped".into()));
        };
        LineAgent::open(child, stdin, stdout).await
    }
}

impl RelayedAgent {
    /// Starts `socat` listening on a free loopback port with `program
    /// mock-agent` behind it, connects (`TCP_NODELAY`, as socat's side),
    /// initializes the agent and creates a session.
    ///
    /// # Errors
    /// No `socat` on `PATH`, spawn, connect (5 s) or protocol failures.
    pub async fn start(program: &std::path::Path) -> Result<(Self, String), BenchError> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = Command::new("socat")
            .arg(format!(
                "TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,nodelay"
            ))
            .arg(format!("EXEC:{} mock-agent", program.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|error| {
                BenchError::Unexpected(format!(
                    "cannot start socat (apt-get install socat): {error}"
                ))
            })?;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let stream = loop {
            match TcpStream::connect(("127.0.0.1", port)).await {
                Ok(stream) => break stream,
                Err(error) if std::time::Instant::now() > deadline => return Err(error.into()),
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
            }
        };
        stream.set_nodelay(true)?;
        let (read, write) = stream.into_split();
        LineAgent::open(child, write, read).await
    }
}

impl<W, R> LineAgent<W, R>
where
    W: AsyncWrite + Unpin,
    R: AsyncRead + Unpin,
{
    /// Initializes the agent behind `stdin`/`stdout` and creates a session.
    async fn open(child: Child, stdin: W, stdout: R) -> Result<(Self, String), BenchError> {
        let mut agent = Self {
            child,
            stdin: BufWriter::new(stdin),
            stdout: BufReader::with_capacity(256 * 1024, stdout),
        };
        agent
            .call(r#"{"jsonrpc":"2.0","id":"init","method":"initialize","params":{"protocolVersion":1,"clientCapabilities":{}}}"#)
            .await?;
        let answer = agent
            .call(r#"{"jsonrpc":"2.0","id":"new","method":"session/new","params":{"cwd":"/","mcpServers":[]}}"#)
            .await?;
        let session = session_id_of(answer.as_bytes())?;
        Ok((agent, session))
    }

    /// Writes one line.
    ///
    /// # Errors
    /// When the agent's stdin is closed.
    pub async fn send(&mut self, line: &str) -> Result<(), BenchError> {
        self.stdin.write_all(line.as_bytes()).await?;
        self.stdin.write_all(b"\n").await?;
        Ok(())
    }

    /// Flushes written lines.
    ///
    /// # Errors
    /// When the agent's stdin is closed.
    pub async fn flush(&mut self) -> Result<(), BenchError> {
        self.stdin.flush().await?;
        Ok(())
    }

    /// Reads one line (without the newline) into `line`.
    ///
    /// # Errors
    /// When stdout closed.
    pub async fn read_line(&mut self, line: &mut String) -> Result<(), BenchError> {
        line.clear();
        if self.stdout.read_line(line).await? == 0 {
            return Err(BenchError::Unexpected("mock agent closed stdout".into()));
        }
        Ok(())
    }

    /// Sends a request line and reads lines until its response (a line with
    /// `"result"` or `"error"` that is not a notification).
    ///
    /// # Errors
    /// I/O failures.
    pub async fn call(&mut self, line: &str) -> Result<String, BenchError> {
        self.send(line).await?;
        self.flush().await?;
        let mut answer = String::new();
        loop {
            self.read_line(&mut answer).await?;
            if is_response(answer.as_bytes()) {
                return Ok(answer);
            }
        }
    }

    /// Stops the agent.
    pub async fn stop(mut self) {
        let _ = self.child.kill().await;
    }
}

/// Whether a JSON-RPC line is a response (cheap check: no `"method"` key).
pub fn is_response(line: &[u8]) -> bool {
    memchr::memmem::find(line, b"\"method\"").is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_events_across_chunks_and_skips_id_less_ones() {
        let mut counter = EventCounter::default();
        counter.feed(b"event: message\nid: 1\ndata: {}\n\nevent: mess");
        counter.feed(b"age\ndata: {\"gap\":1}\n\n: heartbeat\n\nevent: message\nid: 7\nda");
        assert_eq!((counter.events, counter.last_id), (1, 1));
        counter.feed(b"ta: {}\n\n");
        assert_eq!((counter.events, counter.last_id), (2, 7));
    }
}
