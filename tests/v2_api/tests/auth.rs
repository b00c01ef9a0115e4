//! Bearer-token auth (research/contract.md: "Transport: /v2/rpc", auth;
//! "Server start-up"; the 401 row of "Problem types").

use std::process::Stdio;
use std::time::{Duration, Instant};

use reqwest::Method;
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use v2_api_tests::acp;
use v2_api_tests::server::sandbox_agent_command;
use v2_api_tests::{
    Api, CONNECTION_ID_HEADER, MOCK, Reply, STARTUP_TIMEOUT, TestServer, assert_problem,
};

const TOKEN: &str = "s3cr3t-token-4f1c2a9e";

/// Asserts a 401 problem that invites Bearer auth.
fn assert_unauthorized(reply: &Reply) {
    assert_problem(reply, 401, "unauthorized");
    let challenge = reply.header("www-authenticate").unwrap_or_default();
    assert!(
        challenge.to_ascii_lowercase().starts_with("bearer"),
        "401 needs `WWW-Authenticate: Bearer`: {reply:?}"
    );
    assert!(
        reply.connection_id().is_none(),
        "no connection on a 401: {reply:?}"
    );
}

/// `initialize` on `/v2/rpc` with the given `Authorization` value (none
/// when `None`).
async fn initialize_with_authorization(server: &TestServer, authorization: Option<&str>) -> Reply {
    let body = acp::request(0, "initialize", acp::initialize_params(MOCK));
    let mut builder = server
        .http()
        .post(server.url("/v2/rpc"))
        .header(CONTENT_TYPE, "application/json")
        .body(body.to_string());
    if let Some(value) = authorization {
        builder = builder.header(AUTHORIZATION, value);
    }
    Api::send(builder).await
}

#[tokio::test]
async fn token_is_required_on_every_v2_rpc_verb() {
    let server = TestServer::start(&["--token", TOKEN]).await;

    // POST: missing, wrong, wrong scheme.
    assert_unauthorized(&initialize_with_authorization(&server, None).await);
    assert_unauthorized(&initialize_with_authorization(&server, Some("Bearer wrong-token")).await);
    assert_unauthorized(
        &initialize_with_authorization(&server, Some(&format!("Bearer {TOKEN}x"))).await,
    );
    assert_unauthorized(
        &initialize_with_authorization(&server, Some(&format!("Basic {TOKEN}"))).await,
    );

    // The right token works.
    let reply = initialize_with_authorization(&server, Some(&format!("Bearer {TOKEN}"))).await;
    reply.assert_status(200);
    let conn = reply
        .connection_id()
        .expect("initialize with the right token opens a connection");

    // A routed POST, the GET and the DELETE need it too.
    let echo = acp::request(1, "_mock/echo", serde_json::json!({"x": 1}));
    let routed = server
        .http()
        .post(server.url("/v2/rpc"))
        .header(CONTENT_TYPE, "application/json")
        .header(CONNECTION_ID_HEADER, &conn)
        .body(echo.to_string());
    assert_unauthorized(&Api::send(routed).await);

    let get = server
        .http()
        .get(server.url("/v2/rpc"))
        .header(ACCEPT, "text/event-stream")
        .header(CONNECTION_ID_HEADER, &conn);
    let response = Api::response_head(get).await;
    assert_eq!(response.status().as_u16(), 401, "GET without a token");
    assert_unauthorized(&v2_api_tests::api::read_bounded(response).await);

    let delete = server
        .http()
        .request(Method::DELETE, server.url("/v2/rpc"))
        .header(CONNECTION_ID_HEADER, &conn);
    assert_unauthorized(&Api::send(delete).await);

    // Nothing above closed the connection; with the token all of it works.
    let body = server
        .echo(&conn, serde_json::json!(2), serde_json::json!({"x": 2}))
        .await;
    assert_eq!(body["result"]["x"], 2);
    let stream = server.open_stream(&conn, None).await;
    stream.close();
    server.delete(Some(&conn)).await.assert_status(204);
}

#[tokio::test]
async fn health_needs_no_token() {
    let server = TestServer::start(&["--token", TOKEN]).await;
    let reply = server.health().await;
    reply.assert_status(200);
    assert_eq!(reply.json()["status"], "ok");
}

#[tokio::test]
async fn token_can_come_from_the_environment() {
    let server = TestServer::start_with_env(&[], &[("SANDBOX_AGENT_TOKEN", TOKEN)]).await;
    assert_unauthorized(&initialize_with_authorization(&server, None).await);
    // `server` authenticates with the env token.
    let conn = server.initialize(MOCK).await;
    server.new_session(&conn).await;
}

#[tokio::test]
async fn no_token_mode_needs_no_authorization() {
    let server = TestServer::start(&["--no-token"]).await;
    let reply = initialize_with_authorization(&server, None).await;
    reply.assert_status(200);
    let conn = reply.connection_id().expect("connection id");
    server.new_session(&conn).await;
    server.health().await.assert_status(200);
}

#[tokio::test]
async fn token_never_appears_in_the_logs() {
    let server = TestServer::start_with_env(&["--token", TOKEN], &[("RUST_LOG", "debug")]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let mut stream = server.open_stream(&conn, None).await;
    let reply = server
        .prompt(&conn, &session, serde_json::json!(2), "hi")
        .await;
    assert_eq!(acp::stop_reason(&reply), Some("end_turn"));
    stream
        .next_event_matching(
            |e| e.agent_text() == Some("hi"),
            v2_api_tests::EVENT_TIMEOUT,
        )
        .await;
    assert_unauthorized(&initialize_with_authorization(&server, Some("Bearer wrong-token")).await);
    server.delete(Some(&conn)).await.assert_status(204);
    let logs = server.stderr_text();
    assert!(
        !logs.contains(TOKEN),
        "the token appears in the server's stderr:\n{logs}"
    );
}

#[tokio::test]
async fn server_refuses_to_start_without_an_auth_choice() {
    let data_dir = std::env::temp_dir().join(format!("v2-api-tests-noauth-{}", std::process::id()));
    let mut child = sandbox_agent_command()
        .args(["server", "--host", "127.0.0.1", "--port", "0"])
        .env("SANDBOX_AGENT_DATA_DIR", &data_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sandbox-agent server");
    let deadline = Instant::now() + STARTUP_TIMEOUT;
    let status = loop {
        // No async exit notification for a std child: poll.
        if let Some(status) = child.try_wait().expect("try_wait") {
            break Some(status);
        }
        if Instant::now() >= deadline {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    if status.is_none() {
        let _ = child.kill();
    }
    let output = child.wait_with_output().expect("collect output");
    let _ = std::fs::remove_dir_all(&data_dir);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let status = status.unwrap_or_else(|| {
        panic!("server without --token/--no-token kept running; stderr:\n{stderr}")
    });
    assert!(
        !status.success(),
        "must exit with failure; stderr:\n{stderr}"
    );
    assert!(
        !stdout.contains("listening"),
        "must not start listening: {stdout}"
    );
    assert!(
        stderr.contains("--token") && stderr.contains("--no-token"),
        "the message must name both options; stderr:\n{stderr}"
    );
}

/// Two credentials of one kind are refused with 400, whichever of them is
/// right: a proxy in front may have checked the other one
/// (research/contract.md, "Auth and CORS").
#[tokio::test]
async fn two_authorization_headers_or_two_access_tokens_are_refused() {
    let server = TestServer::start(&["--token", TOKEN]).await;
    let good = format!("Bearer {TOKEN}");
    for (first, second) in [
        (good.as_str(), good.as_str()),
        (good.as_str(), "Bearer wrong-token"),
        ("Bearer wrong-token", good.as_str()),
    ] {
        for (method, path) in [
            (Method::GET, "/v2/sessions"),
            (Method::GET, "/v2/fs/stat?path=/"),
            (Method::POST, "/acp/mock"),
        ] {
            // reqwest appends a repeated header: two field lines go out.
            let reply = Api::send(
                server
                    .http()
                    .request(method.clone(), server.url(path))
                    .header(AUTHORIZATION, first)
                    .header(AUTHORIZATION, second)
                    .header(CONTENT_TYPE, "application/json")
                    .body("{}"),
            )
            .await;
            let problem = assert_problem(&reply, 400, "invalid-request");
            assert!(
                problem["detail"]
                    .as_str()
                    .unwrap_or_default()
                    .contains("Authorization"),
                "{method} {path}: {problem}"
            );
        }
    }
    // One is fine.
    let one = Api::send(
        server
            .http()
            .get(server.url("/v2/sessions"))
            .header(AUTHORIZATION, &good),
    )
    .await;
    one.assert_status(200);

    // The WebSocket upgrade: two `access_token` values, even equal ones.
    let no_auth = Api::new(server.base_url().to_owned(), None);
    let upgrade = [
        ("Upgrade", "websocket"),
        ("Connection", "Upgrade"),
        ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="),
        ("Sec-WebSocket-Version", "13"),
    ];
    for query in [
        format!("access_token={TOKEN}&access_token={TOKEN}"),
        format!("access_token={TOKEN}&access_token=wrong"),
    ] {
        let reply = no_auth
            .raw_exchange("GET", &format!("/acp/mock?{query}"), &upgrade, b"")
            .await;
        assert_eq!(reply.status, 400, "{query}: {}", reply.head);
        let body = String::from_utf8_lossy(&reply.body);
        assert!(body.contains("access_token"), "{query}: {body}");
    }
    // A header and a query value together, whichever of them is right.
    for (query, header) in [
        (TOKEN.to_owned(), "Bearer wrong".to_owned()),
        ("wrong".to_owned(), format!("Bearer {TOKEN}")),
    ] {
        let mut with_header = upgrade.to_vec();
        with_header.push(("Authorization", header.as_str()));
        let reply = no_auth
            .raw_exchange(
                "GET",
                &format!("/acp/mock?access_token={query}"),
                &with_header,
                b"",
            )
            .await;
        assert_eq!(reply.status, 400, "{query} and {header}: {}", reply.head);
    }
    // (One `access_token` still opens the socket: acp_transport.rs,
    // `websocket_auth_on_the_upgrade`.)
}
