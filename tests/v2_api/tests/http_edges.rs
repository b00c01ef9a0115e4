//! HTTP edges around `/v2/rpc` that real clients and proxies run into: the
//! first bytes of a quiet stream, keep-alive after an early error, `Accept`
//! precedence, the headers CORS exposes, and the 404 of an expired
//! connection (research/contract.md, "Transport: /v2/rpc" and "Auth and
//! CORS").

use std::time::{Duration, Instant};

use futures::StreamExt;
use reqwest::header::ACCEPT;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use v2_api_tests::acp;
use v2_api_tests::api::read_bounded;
use v2_api_tests::problem::problem_text;
use v2_api_tests::{Api, CONNECTION_ID_HEADER, MOCK, TestServer, assert_problem};

/// The answer-ordering response header (research/contract.md, "Answer
/// ordering header").
const LAST_EVENT_ID_HEADER: &str = "x-acp-last-event-id";

#[tokio::test]
async fn a_new_stream_starts_with_a_comment_at_once() {
    // Default heartbeat (15 s): anything within the wait below is not one.
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let response = server.get_stream(Some(&conn), None).await;
    assert_eq!(response.status().as_u16(), 200);
    let mut bytes = Box::pin(response.bytes_stream());
    let first = match tokio::time::timeout(Duration::from_secs(3), bytes.next()).await {
        Ok(Some(Ok(chunk))) => chunk,
        Ok(other) => panic!("the stream ended or failed before its first bytes: {other:?}"),
        Err(_) => panic!("no body bytes within 3 s of opening a quiet stream"),
    };
    let text = String::from_utf8_lossy(&first);
    assert!(
        text.starts_with(':') && text.ends_with("\n\n"),
        "the first bytes must be one SSE comment: {text:?}"
    );
    assert!(
        !text.contains("heartbeat"),
        "the opening comment comes before any heartbeat: {text:?}"
    );
}

/// One request whose body arrives in a later TCP segment than its head,
/// followed on the same TCP connection by `GET /v2/health`.
struct SplitRequest {
    /// Request line and headers up to (not including) the blank line.
    head: String,
    /// The body, sent 200 ms after the head.
    body: Vec<u8>,
    /// The status the first request gets.
    status: u16,
}

/// Sends `request` as described in [`SplitRequest`] and returns everything
/// the server wrote until it closed the connection (at most 10 s).
async fn send_split(server: &TestServer, request: &SplitRequest) -> String {
    let mut stream = tokio::net::TcpStream::connect(server.addr())
        .await
        .expect("connect");
    let head = format!(
        "{}\r\nHost: {}\r\nContent-Length: {}\r\n\r\n",
        request.head,
        server.addr(),
        request.body.len()
    );
    let second = format!(
        "GET /v2/health HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        server.addr()
    );
    stream.write_all(head.as_bytes()).await.expect("write head");
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The server may have closed already: write errors are part of the result.
    let _ = stream.write_all(&request.body).await;
    let _ = stream.write_all(second.as_bytes()).await;
    let mut raw = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut buffer = [0_u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.read(&mut buffer)).await {
            Ok(Ok(read)) if read > 0 => raw.extend_from_slice(&buffer[..read]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&raw).into_owned()
}

#[tokio::test]
async fn early_errors_keep_the_http_connection_usable_or_say_close() {
    let server = TestServer::start(&["--max-body-bytes", "1024"]).await;
    let json_body = acp::request(0, "initialize", acp::initialize_params(MOCK))
        .to_string()
        .into_bytes();
    let cases = [
        SplitRequest {
            head: "POST /v2/rpc HTTP/1.1\r\nContent-Type: text/plain".to_owned(),
            body: json_body.clone(),
            status: 415,
        },
        SplitRequest {
            head: "POST /v2/rpc HTTP/1.1\r\nContent-Type: application/json\r\nAccept: text/html"
                .to_owned(),
            body: json_body.clone(),
            status: 406,
        },
        SplitRequest {
            head: "PUT /v2/rpc HTTP/1.1\r\nContent-Type: application/json".to_owned(),
            body: json_body.clone(),
            status: 405,
        },
        SplitRequest {
            head: "POST /v1/rpc HTTP/1.1\r\nContent-Type: application/json".to_owned(),
            body: json_body.clone(),
            status: 410,
        },
        SplitRequest {
            head: "POST /v2/rpc HTTP/1.1\r\nContent-Type: application/json\r\nx-acp-agent: mock"
                .to_owned(),
            body: json_body.clone(),
            status: 400,
        },
        SplitRequest {
            head: "POST /v2/rpc HTTP/1.1\r\nContent-Type: application/json".to_owned(),
            body: vec![b' '; 2048],
            status: 413,
        },
    ];
    for request in &cases {
        let raw = send_split(&server, request).await;
        let first_line = raw.lines().next().unwrap_or_default();
        assert!(
            first_line.starts_with(&format!("HTTP/1.1 {}", request.status)),
            "{:?}: {raw}",
            request.head
        );
        let first_head = raw.split("\r\n\r\n").next().unwrap_or_default();
        let says_close = first_head.lines().any(|line| {
            line.split_once(':').is_some_and(|(name, value)| {
                name.trim().eq_ignore_ascii_case("connection")
                    && value.trim().eq_ignore_ascii_case("close")
            })
        });
        let second_answered = raw.matches("HTTP/1.1 200").count() == 1;
        assert!(
            says_close || second_answered,
            "{:?}: the server closed the connection without saying Connection: close: {raw}",
            request.head
        );
        if request.status == 413 {
            assert!(says_close, "a 413 leaves the body unread: {raw}");
        }
    }
}

#[tokio::test]
async fn the_most_specific_accept_range_decides() {
    let server = TestServer::start(&[]).await;
    let init = acp::request(0, "initialize", acp::initialize_params(MOCK)).to_string();
    let post = |accept: &str| {
        server
            .rpc_post(None)
            .header(ACCEPT, accept)
            .body(init.clone())
    };
    for accept in [
        "application/json;q=0, */*",
        "application/*;q=0, */*",
        "*/*, application/json; q=0.000",
    ] {
        let reply = Api::send(post(accept)).await;
        assert_problem(&reply, 406, "not-acceptable");
    }
    for accept in [
        "*/*;q=0, application/json",
        "application/json;q=0.1, */*;q=0",
        "Application/JSON; charset=utf-8",
    ] {
        let reply = Api::send(post(accept)).await;
        assert_eq!(reply.status.as_u16(), 200, "Accept {accept}: {reply:?}");
    }

    let conn = server.initialize(MOCK).await;
    let get = |accept: &str| {
        server
            .request(reqwest::Method::GET, "/v2/rpc")
            .header(CONNECTION_ID_HEADER, &conn)
            .header(ACCEPT, accept)
            // Each accepted GET takes over from the previous one.
            .header("last-event-id", "0")
    };
    for accept in ["text/event-stream;q=0, text/*", "text/*;q=0, */*"] {
        let response = Api::response_head(get(accept)).await;
        assert_eq!(response.status().as_u16(), 406, "Accept {accept}");
        assert_problem(&read_bounded(response).await, 406, "not-acceptable");
    }
    for accept in ["text/*;q=0, text/event-stream;q=0.5", "*/*;q=0, text/*"] {
        let response = Api::response_head(get(accept)).await;
        assert_eq!(response.status().as_u16(), 200, "Accept {accept}");
    }
}

#[tokio::test]
async fn cors_exposes_the_connection_id_and_the_last_event_id() {
    const ORIGIN: &str = "http://app.example";
    let server = TestServer::start(&["--cors-allow-origin", ORIGIN]).await;
    let init = acp::request(0, "initialize", acp::initialize_params(MOCK)).to_string();
    let reply = Api::send(server.rpc_post(None).header("origin", ORIGIN).body(init)).await;
    reply.assert_status(200);
    let conn = reply.connection_id().expect("connection id");
    let echo = acp::request(1, "_mock/echo", json!({})).to_string();
    let reply = Api::send(
        server
            .rpc_post(Some(&conn))
            .header("origin", ORIGIN)
            .body(echo),
    )
    .await;
    reply.assert_status(200);
    assert!(reply.header(LAST_EVENT_ID_HEADER).is_some(), "{reply:?}");
    assert_eq!(reply.header("access-control-allow-origin"), Some(ORIGIN));
    let exposed: Vec<String> = reply
        .headers
        .get_all("access-control-expose-headers")
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(|name| name.trim().to_ascii_lowercase())
        .collect();
    for name in [CONNECTION_ID_HEADER, LAST_EVENT_ID_HEADER] {
        assert!(
            exposed.iter().any(|exposed| exposed == name),
            "{name} is not exposed: {reply:?}"
        );
    }
}

#[tokio::test]
async fn an_idle_reaped_connection_404_says_it_expired_and_after_how_long() {
    let server = TestServer::start(&["--idle-timeout-ms", "300"]).await;
    let reaped = server.initialize(MOCK).await;
    let deleted = server.initialize(MOCK).await;
    server.delete(Some(&deleted)).await.assert_status(204);
    // Idleness is time passing with nothing happening, so this is a sleep:
    // five idle timeouts.
    tokio::time::sleep(Duration::from_millis(1_500)).await;

    let echo = acp::request(1, "_mock/echo", json!({}));
    let reply = server.post(Some(&reaped), &echo).await;
    let text = problem_text(&assert_problem(&reply, 404, "unknown-connection"));
    assert!(
        text.contains("expired") && text.contains("300 ms"),
        "the 404 must say the connection expired after 300 ms idle: {text}"
    );
    let reply = server.get_stream_error(Some(&reaped), None).await;
    let text = problem_text(&assert_problem(&reply, 404, "unknown-connection"));
    assert!(text.contains("expired"), "GET: {text}");

    // A connection closed by DELETE, or never opened, did not expire.
    for conn in [deleted.as_str(), "no-such-connection"] {
        let reply = server.post(Some(conn), &echo).await;
        let text = problem_text(&assert_problem(&reply, 404, "unknown-connection"));
        assert!(!text.contains("expired"), "{conn}: {text}");
    }
}

/// Query strings and the headers the runtime reads are taken as sent or
/// refused: a parameter or a header given twice, or a query that is not
/// UTF-8 once percent-decoded, is 400, never resolved to one of the values
/// (research/contract.md, "Edge rules"). Before, `?path=A&path=B` read B,
/// `%FF` became U+FFFD, and the second connection id header was ignored.
#[tokio::test]
async fn a_repeated_query_parameter_or_header_is_refused_not_resolved() {
    let server = TestServer::start(&[]).await;
    let dir = v2_api_tests::TempDir::new("query-twice");
    let a = dir.write("a", b"A");
    let b = dir.write("b", b"B");
    let api = server.api();
    for path in [
        format!("/v2/fs/file?path={}&path={}", a.display(), b.display()),
        format!("/v2/fs/file?path={}&p%61th={}", a.display(), b.display()),
        format!("/v2/fs/stat?path={}%FF", a.display()),
        format!("/v2/fs/stat?path={}&sessionId=x&session_id=y", a.display()),
        "/v2/processes?limit=1&limit=2".to_owned(),
    ] {
        let reply = api.get(&path).await;
        let problem = assert_problem(&reply, 400, "invalid-request");
        let detail = problem["detail"].as_str().unwrap_or_default();
        assert!(
            detail.contains("more than once") || detail.contains("not UTF-8"),
            "{path}: {problem}"
        );
    }
    // One of each still reads.
    let reply = api.get(&format!("/v2/fs/file?path={}", a.display())).await;
    reply.assert_status(200);
    assert_eq!(reply.text(), "A");

    let conn = server.initialize(MOCK).await;
    let twice = api
        .request(reqwest::Method::POST, "/v2/rpc")
        .header(CONNECTION_ID_HEADER, &conn)
        .header(CONNECTION_ID_HEADER, "another")
        .json(&json!({"jsonrpc": "2.0", "id": 2, "method": "session/list", "params": {}}));
    let reply = Api::send(twice).await;
    assert_problem(&reply, 400, "invalid-request");

    // A JSON body's member named twice: the second `env` value of PATH
    // would otherwise win unseen.
    let start = api
        .request(reqwest::Method::POST, "/v2/processes/run")
        .header(reqwest::header::CONTENT_TYPE, "application/json");
    let reply = Api::send(start.body(r#"{"command":"true","env":{"X":"one","X":"two"}}"#)).await;
    assert_problem(&reply, 400, "invalid-request");
}

/// A message body of megabytes is parsed off the async thread: while it is
/// parsed, `/v2/health` answers as usual (before, every route waited for
/// the parse; the server runs one async thread by default).
#[tokio::test]
async fn a_large_message_does_not_hold_up_other_exchanges() {
    let server = TestServer::start(&[]).await;
    let api = server.api();
    // About 14 MB of small tokens: the costliest shape to parse per byte.
    let mut body = String::from(r#"{"jsonrpc":"2.0","id":1,"method":"x/y","params":{"n":["#);
    body.push_str(&"0,".repeat(7_000_000));
    body.push_str("0]}}");
    let big = api
        .request(reqwest::Method::POST, "/v2/rpc")
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .header(CONNECTION_ID_HEADER, "no-such-connection")
        .body(body);
    let started = Instant::now();
    let post = tokio::spawn(async move {
        let reply = Api::send_within(big, Duration::from_secs(120)).await;
        (reply, started.elapsed())
    });
    let mut slowest = Duration::ZERO;
    while !post.is_finished() {
        let asked = Instant::now();
        server.health().await.assert_status(200);
        slowest = slowest.max(asked.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (reply, took) = post.await.expect("the POST task");
    // Parsed in full, then the connection is looked up: 404.
    assert_problem(&reply, 404, "unknown-connection");
    if took < Duration::from_millis(500) {
        eprintln!("the POST took {took:?}: too fast here to tell a stall apart");
        return;
    }
    assert!(
        slowest < took / 2,
        "a health check waited {slowest:?} while the large message took {took:?}"
    );
}
