//! The server's log (research/contract.md, "Logs"): `--log-format json`
//! writes one JSON object per line, and no log line, in either format,
//! holds a credential a client sent (the bearer token, a wrong one, an
//! `access_token` query value).

use reqwest::Method;
use reqwest::header::AUTHORIZATION;
use serde_json::Value;
use std::time::Duration;
use tokio_tungstenite::connect_async;
use v2_api_tests::agents::TempDir;
use v2_api_tests::{Api, MOCK, REQUEST_TIMEOUT, TestServer, query_path};

const TOKEN: &str = "log-test-token-7d2e91b4";
/// A credential that fails: it must not be logged either.
const WRONG_TOKEN: &str = "wrong-password-c81f03aa";

/// Drives every kind of request the log should see: authorized reads, a
/// file write, a prompt turn with the mock agent, refused credentials, and
/// WebSocket upgrades carrying `?access_token=`.
async fn drive(server: &TestServer, root: &TempDir) {
    server.health().await.assert_status(200);
    server.get("/v2/agents").await.assert_status(200);

    let file = root.path().join("notes.txt");
    let put = Api::send(
        server
            .request(
                Method::PUT,
                &format!("/v2/fs/file?path={}", query_path(&file.to_string_lossy())),
            )
            .body("hello"),
    )
    .await;
    put.assert_status(200);

    let connection = server.initialize(MOCK).await;
    let session = server.new_session(&connection).await;
    let answer = server
        .prompt(&connection, &session, 7.into(), "hello log")
        .await;
    assert!(answer.get("result").is_some(), "prompt failed: {answer}");
    server.get("/v2/sessions").await.assert_status(200);

    // Refused: a wrong bearer token, a wrong `access_token` on an upgrade.
    let refused = Api::send(
        server
            .http()
            .get(server.url("/v2/sessions"))
            .header(AUTHORIZATION, format!("Bearer {WRONG_TOKEN}")),
    )
    .await;
    refused.assert_status(401);
    let ws = server.url("/acp/mock").replacen("http://", "ws://", 1);
    let wrong = connect_async(format!("{ws}?access_token={WRONG_TOKEN}")).await;
    assert!(wrong.is_err(), "a wrong access_token must be refused");
    // Accepted: the right token in the query, then the socket closed.
    let (mut socket, _) = tokio::time::timeout(
        REQUEST_TIMEOUT,
        connect_async(format!("{ws}?access_token={TOKEN}")),
    )
    .await
    .expect("WebSocket upgrade in time")
    .expect("WebSocket upgrade with ?access_token");
    socket.close(None).await.ok();
    // Let the server log what follows the last request.
    tokio::time::sleep(Duration::from_millis(300)).await;
}

/// Asserts no line of `log` holds a credential the test sent.
fn assert_no_credential(log: &str) {
    for secret in [TOKEN, WRONG_TOKEN] {
        if let Some(line) = log.lines().find(|line| line.contains(secret)) {
            panic!("a log line holds the credential {secret:?}: {line}");
        }
    }
}

async fn start(format: &str, root: &TempDir) -> TestServer {
    let root = root.path().to_string_lossy().into_owned();
    // debug: the per-request line too, and everything below it.
    TestServer::start_with_env(
        &["--token", TOKEN, "--log-format", format, "--fs-root", &root],
        &[("RUST_LOG", "debug")],
    )
    .await
}

#[tokio::test]
async fn json_log_is_one_object_per_line_without_credentials() {
    let root = TempDir::new("logs-json");
    let server = start("json", &root).await;
    drive(&server, &root).await;

    let log = server.stderr_text();
    assert!(
        log.lines().count() > 3,
        "the debug log is nearly empty:\n{log}"
    );
    for line in log.lines() {
        let object: Value = serde_json::from_str(line)
            .unwrap_or_else(|error| panic!("not one JSON object ({error}): {line}"));
        for key in ["level", "fields", "timestamp"] {
            assert!(object.get(key).is_some(), "no `{key}` in log line: {line}");
        }
    }
    assert!(
        log.lines()
            .any(|line| line.contains("\"path\":\"/v2/fs/file\"")),
        "no request line for the file write:\n{log}"
    );
    assert_no_credential(&log);
}

#[tokio::test]
async fn text_log_has_no_credentials() {
    let root = TempDir::new("logs-text");
    let server = start("text", &root).await;
    drive(&server, &root).await;

    let log = server.stderr_text();
    assert!(
        log.contains("/v2/fs/file"),
        "no request line for the file write:\n{log}"
    );
    assert!(
        serde_json::from_str::<Value>(log.lines().next().unwrap_or_default()).is_err(),
        "text is the default shape, not JSON:\n{log}"
    );
    assert_no_credential(&log);
}

/// The error that stops the server is a JSON line too (level `ERROR`), not
/// plain text among the JSON.
#[tokio::test]
async fn a_fatal_error_is_a_json_line() {
    let output = tokio::process::Command::from(v2_api_tests::server::sandbox_agent_command())
        .args([
            "server",
            "--no-token",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--data-dir",
            "/proc/nonexistent/sandbox-agent",
            "--log-format",
            "json",
        ])
        .output();
    let output = tokio::time::timeout(REQUEST_TIMEOUT, output)
        .await
        .expect("the server gives up at once")
        .expect("run sandbox-agent server");
    assert!(!output.status.success(), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<Value> = stderr
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|_| panic!("not JSON: {line:?}")))
        .collect();
    let last = lines.last().expect("a log line");
    assert_eq!(last["level"], "ERROR", "{stderr}");
    assert!(
        last["fields"]["error"]
            .as_str()
            .is_some_and(|error| error.contains("/proc/nonexistent/sandbox-agent")),
        "{stderr}"
    );
}
