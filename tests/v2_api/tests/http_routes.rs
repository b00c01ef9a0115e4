//! Routes around `/v2/rpc`: `GET /v2/health`, unknown routes (404), wrong
//! verbs (405) and the removed v1 API (410). research/contract.md,
//! "Problem types" and "Extension methods and control plane".

use reqwest::Method;
use reqwest::header::CONTENT_TYPE;
use v2_api_tests::problem::problem_text;
use v2_api_tests::{Api, TestServer, assert_problem};

#[tokio::test]
async fn health_answers_status_ok_and_version() {
    let server = TestServer::start(&[]).await;
    let reply = server.health().await;
    reply.assert_status(200);
    assert!(
        reply
            .header("content-type")
            .is_some_and(|ct| ct.starts_with("application/json")),
        "{reply:?}"
    );
    let body = reply.json();
    assert_eq!(body["status"], "ok", "{reply:?}");
    assert!(
        body.get("version").is_some_and(|v| !v.is_null()),
        "{reply:?}"
    );
}

#[tokio::test]
async fn unknown_routes_are_404_not_found() {
    let server = TestServer::start(&[]).await;
    for (method, path) in [
        (Method::GET, "/"),
        (Method::GET, "/v2/nope"),
        (Method::POST, "/v2/rpcx"),
        (Method::GET, "/v2/rpc/extra"),
        (Method::GET, "/v3/rpc"),
    ] {
        let reply = Api::send(server.request(method.clone(), path)).await;
        let doc = assert_problem(&reply, 404, "not-found");
        assert!(doc.is_object(), "{method} {path}");
    }
}

#[tokio::test]
async fn wrong_verb_on_a_known_path_is_405_with_allow() {
    let server = TestServer::start(&[]).await;
    for method in [Method::PUT, Method::PATCH] {
        let reply = Api::send(
            server
                .request(method.clone(), "/v2/rpc")
                .header(CONTENT_TYPE, "application/json")
                .body("{}"),
        )
        .await;
        assert_problem(&reply, 405, "method-not-allowed");
        let allow = allowed_methods(reply.header("allow"));
        for verb in ["GET", "POST", "DELETE"] {
            assert!(
                allow.iter().any(|a| a == verb),
                "{method} /v2/rpc: Allow lacks {verb}: {reply:?}"
            );
        }
    }

    let reply = Api::send(server.request(Method::POST, "/v2/health")).await;
    assert_problem(&reply, 405, "method-not-allowed");
    let allow = allowed_methods(reply.header("allow"));
    assert!(
        allow.iter().any(|a| a == "GET"),
        "POST /v2/health: Allow lacks GET: {reply:?}"
    );
}

#[tokio::test]
async fn every_v1_path_is_410_gone() {
    let server = TestServer::start(&[]).await;
    for (method, path) in [
        (Method::GET, "/v1/health"),
        (Method::GET, "/v1/agents"),
        (Method::POST, "/v1/sessions"),
        (Method::POST, "/v1/sessions/abc/messages"),
        (Method::DELETE, "/v1/sessions/abc"),
        (Method::GET, "/v1/sessions/abc/events?offset=0"),
        (Method::POST, "/v1/rpc"),
    ] {
        let mut builder = server.request(method.clone(), path);
        if method == Method::POST {
            builder = builder.header(CONTENT_TYPE, "application/json").body("{}");
        }
        let reply = Api::send(builder).await;
        let doc = assert_problem(&reply, 410, "gone");
        assert!(
            problem_text(&doc).contains("/v2"),
            "{method} {path}: the problem should point to /v2: {reply:?}"
        );
    }
}

/// The comma-separated tokens of an `Allow` header, upper-cased.
fn allowed_methods(allow: Option<&str>) -> Vec<String> {
    allow
        .unwrap_or_default()
        .split(',')
        .map(|m| m.trim().to_ascii_uppercase())
        .filter(|m| !m.is_empty())
        .collect()
}

/// Reads what the server sends on `stream` until it closes, within 10 s.
async fn read_until_closed(stream: &mut tokio::net::TcpStream) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut raw = Vec::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        stream.read_to_end(&mut raw),
    )
    .await
    .expect("the server closes the connection in time")
    .expect("read");
    raw
}

#[tokio::test]
async fn a_body_that_never_arrives_is_408_and_the_connection_closes() {
    use tokio::io::AsyncWriteExt;
    let server = TestServer::start(&["--read-timeout-ms", "300"]).await;
    // Headers promise 100 bytes; one arrives.
    let mut stream = tokio::net::TcpStream::connect(server.addr())
        .await
        .expect("connect");
    let head = format!(
        "POST /v2/rpc HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nAccept: application/json\r\nContent-Length: 100\r\n\r\n{{",
        server.addr()
    );
    stream.write_all(head.as_bytes()).await.expect("write");
    let reply = v2_api_tests::api::RawReply::parse(&read_until_closed(&mut stream).await);
    assert_eq!(reply.status, 408, "{}", reply.head);
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json"),
        "{}",
        reply.head
    );
    let body = String::from_utf8_lossy(&reply.body);
    assert!(
        body.contains("urn:sandbox-agent:error:request-timeout"),
        "{body}"
    );

    // A client that connects and sends nothing is closed too.
    let mut silent = tokio::net::TcpStream::connect(server.addr())
        .await
        .expect("connect");
    read_until_closed(&mut silent).await;
    server.health().await.assert_status(200);
}

#[tokio::test]
async fn http_connections_past_the_limit_get_503_until_one_closes() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const LIMIT: usize = 3;
    let server = TestServer::start(&["--max-http-connections", &LIMIT.to_string()]).await;
    let request = format!("GET /v2/health HTTP/1.1\r\nHost: {}\r\n\r\n", server.addr());
    // Kept-alive connections that completed a request hold their slots.
    let mut held = Vec::new();
    for _ in 0..LIMIT {
        let mut stream = tokio::net::TcpStream::connect(server.addr())
            .await
            .expect("connect");
        stream.write_all(request.as_bytes()).await.expect("write");
        let mut buffer = [0_u8; 512];
        let read = stream.read(&mut buffer).await.expect("read");
        assert!(
            buffer[..read].starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&buffer[..read])
        );
        held.push(stream);
    }
    let mut extra = tokio::net::TcpStream::connect(server.addr())
        .await
        .expect("connect");
    let _ = extra.write_all(request.as_bytes()).await;
    let reply = v2_api_tests::api::RawReply::parse(&read_until_closed(&mut extra).await);
    assert_eq!(reply.status, 503, "{}", reply.head);
    assert_eq!(reply.header("retry-after"), Some("1"), "{}", reply.head);
    let body = String::from_utf8_lossy(&reply.body);
    assert!(
        body.contains("urn:sandbox-agent:error:too-many-http-connections"),
        "{body}"
    );

    // Closing one frees its slot (released once the server sees the close).
    held.pop();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let reply = server.health().await;
        if reply.status.as_u16() == 200 {
            break;
        }
        assert_eq!(reply.status.as_u16(), 503, "{reply:?}");
        assert!(tokio::time::Instant::now() < deadline, "no slot came free");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
