//! Shared test helpers: options for a test server, the `_meta` that names
//! the mock agent, a `_mock/echo` request type, waiting with a deadline, and
//! the GETs seen by the shared loopback [`CutProxy`].

#![allow(dead_code)]

use acp_http_client::{ReconnectPolicy, TransportOptions};
use agent_client_protocol::{JsonRpcRequest, JsonRpcResponse};
use serde::{Deserialize, Serialize};
use std::time::Duration;
pub use v2_api_tests::CutProxy;
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

/// The proxy's GET requests as `GET last-event-id=<value or none>`, in order.
pub fn gets(proxy: &CutProxy) -> Vec<String> {
    proxy
        .heads()
        .into_iter()
        .filter(|head| head.method == "GET")
        .map(|head| {
            let last = head.last_event_id.unwrap_or_else(|| "none".to_owned());
            format!("GET last-event-id={last}")
        })
        .collect()
}
