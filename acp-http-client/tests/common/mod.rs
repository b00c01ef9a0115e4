//! Shared test helpers: options for a test server, the `_meta` that names
//! the mock agent, a `_mock/echo` request type, waiting with a deadline, and
//! a loopback TCP proxy whose connections the test can cut.

#![allow(dead_code)]

use acp_http_client::{ReconnectPolicy, TransportOptions};
use agent_client_protocol::{JsonRpcRequest, JsonRpcResponse};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use v2_api_tests::TestServer;

/// Upper bound for one step of a test (an ACP call, a wait for updates).
pub const STEP: Duration = Duration::from_secs(30);

/// `_meta` naming `agent` for sandbox-agent (contract.md): the caller's
/// business, not the transport's.
pub fn agent_meta(agent: &str) -> Option<serde_json::Map<String, serde_json::Value>> {
    v2_api_tests::acp::agent_meta(agent).as_object().cloned()
}

/// A reconnect policy quick enough for tests.
pub fn quick_reconnect() -> ReconnectPolicy {
    ReconnectPolicy {
        initial_delay: Duration::from_millis(50),
        max_delay: Duration::from_millis(500),
        max_attempts: 5,
    }
}

/// Options for `base_url` with the test reconnect policy.
pub fn options_for(base_url: &str) -> TransportOptions {
    match TransportOptions::new(base_url) {
        Ok(options) => options.reconnect(quick_reconnect()),
        Err(error) => panic!("options for {base_url}: {error}"),
    }
}

/// Options for `server` (with its token, if it has one).
pub fn options(server: &TestServer) -> TransportOptions {
    let options = options_for(server.base_url());
    match server.token() {
        Some(token) => options.token(token),
        None => options,
    }
}

/// `future`, or a panic naming `what` after `limit`.
pub async fn within<T>(limit: Duration, what: &str, future: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, future).await {
        Ok(value) => value,
        Err(_) => panic!("{what}: not done within {limit:?}"),
    }
}

/// Polls `done` every 10 ms until it holds; panics naming `what` after
/// `limit`.
pub async fn wait_until(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    within(limit, what, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// The mock agent's `_mock/echo`: answers with its params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonRpcRequest)]
#[request(method = "_mock/echo", response = EchoResponse)]
pub struct EchoRequest {
    /// Which of the concurrent requests this is.
    pub n: u64,
    /// Some payload to carry back.
    pub text: String,
}

/// The echoed params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonRpcResponse)]
pub struct EchoResponse {
    /// As sent.
    pub n: u64,
    /// As sent.
    pub text: String,
}

/// A loopback TCP proxy in front of the server. `cut()` drops every
/// connection open at that moment (both sides see the TCP connection
/// close); `hold(true)` makes new connections wait before they reach the
/// server.
#[derive(Clone)]
pub struct CutProxy {
    addr: SocketAddr,
    state: Arc<ProxyState>,
}

struct ProxyState {
    upstream: String,
    /// Forwarding tasks of the open connections.
    connections: parking_lot::Mutex<Vec<JoinHandle<()>>>,
    /// One line per GET seen: `GET last-event-id=<value or none>`.
    gets: parking_lot::Mutex<Vec<String>>,
    /// While `true`, new connections wait before being forwarded.
    hold: watch::Sender<bool>,
    /// While `true`, new connections are closed at once.
    refuse: std::sync::atomic::AtomicBool,
    accepted: std::sync::atomic::AtomicUsize,
}

impl CutProxy {
    /// A proxy to `upstream` (`127.0.0.1:PORT`).
    pub async fn start(upstream: &str) -> CutProxy {
        let listener = match TcpListener::bind("127.0.0.1:0").await {
            Ok(listener) => listener,
            Err(error) => panic!("bind the proxy: {error}"),
        };
        let addr = match listener.local_addr() {
            Ok(addr) => addr,
            Err(error) => panic!("proxy address: {error}"),
        };
        let state = Arc::new(ProxyState {
            upstream: upstream.to_owned(),
            connections: parking_lot::Mutex::new(Vec::new()),
            gets: parking_lot::Mutex::new(Vec::new()),
            hold: watch::Sender::new(false),
            refuse: std::sync::atomic::AtomicBool::new(false),
            accepted: std::sync::atomic::AtomicUsize::new(0),
        });
        let accept_state = Arc::clone(&state);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                accept_state
                    .accepted
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if accept_state
                    .refuse
                    .load(std::sync::atomic::Ordering::Relaxed)
                {
                    drop(client);
                    continue;
                }
                let task = tokio::spawn(forward(Arc::clone(&accept_state), client));
                let mut connections = accept_state.connections.lock();
                connections.retain(|task| !task.is_finished());
                connections.push(task);
            }
        });
        CutProxy { addr, state }
    }

    /// `http://127.0.0.1:PORT` of the proxy.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Drops every connection open now; returns how many.
    pub fn cut(&self) -> usize {
        let tasks: Vec<_> = self.state.connections.lock().drain(..).collect();
        let open = tasks.iter().filter(|task| !task.is_finished()).count();
        for task in tasks {
            task.abort();
        }
        open
    }

    /// Holds (or releases) connections accepted from now on.
    pub fn hold(&self, hold: bool) {
        self.state.hold.send_replace(hold);
    }

    /// Closes (or stops closing) connections accepted from now on as soon
    /// as they arrive.
    pub fn refuse(&self, refuse: bool) {
        self.state
            .refuse
            .store(refuse, std::sync::atomic::Ordering::Relaxed);
    }

    /// The GET requests seen so far, as `GET last-event-id=<v|none>`.
    pub fn gets(&self) -> Vec<String> {
        self.state.gets.lock().clone()
    }

    /// TCP connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.state
            .accepted
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

async fn forward(state: Arc<ProxyState>, mut client: TcpStream) {
    let mut hold = state.hold.subscribe();
    if hold.wait_for(|held| !*held).await.is_err() {
        return;
    }
    let Ok(mut server) = TcpStream::connect(&state.upstream).await else {
        return;
    };
    let (mut client_read, mut client_write) = client.split();
    let (mut server_read, mut server_write) = server.split();
    let upstream = async {
        let mut buf = vec![0_u8; 64 * 1024];
        loop {
            let n = match client_read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            record_gets(&state, &buf[..n]);
            if server_write.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = server_write.shutdown().await;
    };
    let downstream = async {
        let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
        let _ = client_write.shutdown().await;
    };
    tokio::join!(upstream, downstream);
}

/// Notes each GET request head in `bytes` with its `Last-Event-ID`.
fn record_gets(state: &ProxyState, bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    let mut lines = text.split("\r\n");
    while let Some(line) = lines.next() {
        if !line.starts_with("GET ") {
            continue;
        }
        let mut last_event_id = "none".to_owned();
        for header in lines.by_ref() {
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':')
                && name.trim().eq_ignore_ascii_case("last-event-id")
            {
                last_event_id = value.trim().to_owned();
            }
        }
        state
            .gets
            .lock()
            .push(format!("GET last-event-id={last_event_id}"));
    }
}
