//! `POST /v2/rpc` (research/contract.md, "Transport: /v2/rpc", POST and
//! edge rules): the
//! envelope, the headers, the status codes, and JSON-RPC ids on one
//! connection.

use std::time::Instant;

use futures::StreamExt;
use reqwest::header::{ACCEPT, CONTENT_TYPE};
use serde_json::{Value, json};
use v2_api_tests::acp::{self, stop_reason};
use v2_api_tests::api::echo_body_of_len;
use v2_api_tests::problem::problem_text;
use v2_api_tests::{
    Api, CONNECTION_ID_HEADER, EVENT_TIMEOUT, MOCK, REQUEST_TIMEOUT, TestServer, assert_problem,
    join_within, mock_agent_command,
};

/// Asserts a `200` whose body is a JSON-RPC error response for `id`.
fn assert_jsonrpc_error(body: &Value, id: &Value) -> i64 {
    assert_eq!(&body["id"], id, "{body}");
    assert!(
        body.get("result").is_none(),
        "an error response has no result: {body}"
    );
    let code = body["error"]["code"].as_i64();
    assert!(
        code.is_some(),
        "JSON-RPC error with an integer code expected: {body}"
    );
    assert!(body["error"]["message"].is_string(), "{body}");
    code.unwrap_or_default()
}

#[tokio::test]
async fn initialize_opens_a_connection_and_returns_its_id() {
    let server = TestServer::start(&[]).await;
    let request = acp::request("init-1", "initialize", acp::initialize_params(MOCK));
    let reply = server.post(None, &request).await;
    reply.assert_status(200);
    assert!(
        reply
            .header("content-type")
            .is_some_and(|ct| ct.starts_with("application/json")),
        "{reply:?}"
    );
    let conn = reply
        .connection_id()
        .expect("x-acp-connection-id on initialize");
    assert!(!conn.trim().is_empty());
    let body = reply.json();
    assert_eq!(body["jsonrpc"], "2.0", "{body}");
    assert_eq!(body["id"], "init-1", "{body}");
    assert_eq!(body["result"]["protocolVersion"], 1, "{body}");
    assert_eq!(
        body["result"]["agentInfo"]["name"], "sandbox-agent-mock",
        "{body}"
    );

    let other = server.initialize(MOCK).await;
    assert_ne!(conn, other, "each initialize opens its own connection");

    let echoed = server
        .echo(&conn, json!(1), json!({"hello": "world"}))
        .await;
    assert_eq!(echoed["result"]["hello"], "world", "{echoed}");
}

#[tokio::test]
async fn notification_gets_202_with_an_empty_body() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    server
        .post(Some(&conn), &acp::cancel(&session))
        .await
        .assert_accepted_empty();
    // A client extension notification is forwarded to the agent like any other.
    let notice = acp::notification("_mock/notice", json!({"n": 1}));
    server
        .post(Some(&conn), &notice)
        .await
        .assert_accepted_empty();
    // The connection and the agent are fine afterwards.
    let reply = server
        .prompt(&conn, &session, json!(3), "still there")
        .await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
}

#[tokio::test]
async fn answer_to_an_unknown_agent_request_id_is_accepted_and_dropped() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let unknown_ok = acp::response(json!("never-asked"), json!({}));
    server
        .post(Some(&conn), &unknown_ok)
        .await
        .assert_accepted_empty();
    let unknown_err =
        json!({"jsonrpc": "2.0", "id": 424242, "error": {"code": -32000, "message": "nope"}});
    server
        .post(Some(&conn), &unknown_err)
        .await
        .assert_accepted_empty();
    let echoed = server.echo(&conn, json!(1), json!({"after": true})).await;
    assert_eq!(echoed["result"]["after"], true, "{echoed}");
}

#[tokio::test]
async fn method_level_failure_is_a_jsonrpc_error_inside_a_200() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    server.new_session(&conn).await;

    let load = acp::request(
        7,
        "session/load",
        json!({"sessionId": "mock-no-such-session", "cwd": "/tmp", "mcpServers": [],
               "_meta": acp::agent_meta(MOCK)}),
    );
    let body = server.call(&conn, &load).await;
    assert_jsonrpc_error(&body, &json!(7));

    let prompt = acp::request(
        8,
        "session/prompt",
        acp::prompt_params("mock-no-such-session", "hi"),
    );
    let body = server.call(&conn, &prompt).await;
    assert_jsonrpc_error(&body, &json!(8));
}

#[tokio::test]
async fn ids_round_trip_exactly() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let ids = [
        json!("req-ü \u{1F600} \"quoted\" \\ end"),
        json!("1"),
        json!(1),
        json!(0),
        json!(-7),
        json!(9_007_199_254_740_993_u64),
        json!(-9_007_199_254_740_993_i64),
        json!(i64::MAX),
        json!(i64::MIN),
    ];
    for id in ids {
        let request = acp::request(id.clone(), "_mock/echo", json!({"id_was": id.to_string()}));
        let reply = server.post(Some(&conn), &request).await;
        reply.assert_status(200);
        let body = reply.json();
        // `Value` equality keeps the JSON type (string vs number) and
        // integer vs float apart, so a float round trip fails here.
        assert_eq!(body["id"], id, "id changed on the way: {reply:?}");
        assert_eq!(body["result"]["id_was"], id.to_string(), "{reply:?}");
        if let Some(n) = id.as_u64().or(id.as_i64().map(|n| n.unsigned_abs())) {
            assert!(
                reply.text().contains(&n.to_string()),
                "digits changed: {reply:?}"
            );
        }
    }
}

#[tokio::test]
async fn same_id_twice_in_flight_on_one_connection_rejects_the_second() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let mut stream = server.open_stream(&conn, None).await;

    let api = server.api();
    let (c, s) = (conn.clone(), session.clone());
    let first = tokio::spawn(async move { api.prompt(&c, &s, json!(5), "!slow 10 200").await });
    // The first request is in flight once the agent streams its first chunk.
    stream
        .next_event_matching(|e| e.agent_text() == Some("chunk-1 "), EVENT_TIMEOUT)
        .await;

    let second = server.echo(&conn, json!(5), json!({"second": true})).await;
    let code = assert_jsonrpc_error(&second, &json!(5));
    assert_eq!(code, -32600, "{second}");
    assert!(
        second["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("in flight")),
        "{second}"
    );
    assert!(
        !first.is_finished(),
        "the duplicate must be answered at once, while the first (>= 1.8 s left) is still running"
    );

    let first = join_within(first, REQUEST_TIMEOUT).await;
    assert_eq!(
        stop_reason(&first),
        Some("end_turn"),
        "the first is unaffected: {first}"
    );
    let chunks: Vec<String> = stream
        .collect_until(|e| e.agent_text() == Some("chunk-10 "), EVENT_TIMEOUT)
        .await
        .iter()
        .filter_map(|e| e.agent_text().map(str::to_owned))
        .collect();
    assert_eq!(chunks, acp::slow_chunks(10)[1..].to_vec());

    // Once answered, the id is free again.
    let again = server.echo(&conn, json!(5), json!({"again": true})).await;
    assert_eq!(again["result"]["again"], true, "{again}");
}

#[tokio::test]
async fn thirty_two_requests_in_flight_on_one_connection() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;

    // A slow turn stays in flight the whole time.
    let api = server.api();
    let (c, s) = (conn.clone(), session.clone());
    let turn = tokio::spawn(async move { api.prompt(&c, &s, json!("turn"), "!slow 5 200").await });

    let echoes = futures::stream::iter(0..32_u64)
        .map(|n| {
            let conn = conn.clone();
            let api = server.api();
            async move {
                let params = json!({"n": n, "text": format!("payload-{n}"), "nested": {"n": n}});
                (n, api.echo(&conn, json!(1000 + n), params).await)
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    assert_eq!(echoes.len(), 32);
    for (n, body) in echoes {
        assert_eq!(body["id"], json!(1000 + n), "{body}");
        assert_eq!(body["result"]["n"], n, "{body}");
        assert_eq!(body["result"]["text"], format!("payload-{n}"), "{body}");
        assert_eq!(body["result"]["nested"]["n"], n, "{body}");
    }
    let turn = join_within(turn, REQUEST_TIMEOUT).await;
    assert_eq!(stop_reason(&turn), Some("end_turn"), "{turn}");
}

#[tokio::test]
async fn invalid_envelopes_are_400_invalid_request() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let bodies = [
        r#"{"jsonrpc":"2.0","id":1,"#,
        "not json at all",
        "",
        r#"[{"jsonrpc":"2.0","id":1,"method":"_mock/echo","params":{}}]"#,
        "[]",
        r#""a string""#,
        "42",
        "null",
        r#"{"id":1,"method":"_mock/echo","params":{}}"#,
        r#"{"jsonrpc":"1.0","id":1,"method":"_mock/echo","params":{}}"#,
        r#"{"jsonrpc":"2.0","id":1,"params":{}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":42}"#,
    ];
    for body in bodies {
        let reply = Api::send(server.rpc_post(Some(&conn)).body(body)).await;
        assert_eq!(reply.status.as_u16(), 400, "body {body:?}: {reply:?}");
        assert_problem(&reply, 400, "invalid-request");
    }
    // None of that hurt the connection.
    let echoed = server.echo(&conn, json!(1), json!({"ok": true})).await;
    assert_eq!(echoed["result"]["ok"], true);
}

#[tokio::test]
async fn json_an_agent_cannot_decode_is_400_and_leaves_no_request_behind() {
    // Valid JSON grammar that serde_json (every Rust ACP agent) refuses: the
    // agent would answer `id: null`, and the POST would wait forever.
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let lone_surrogate = format!(
        r#"{{"jsonrpc":"2.0","id":7,"method":"session/prompt","params":{{"sessionId":"{session}","prompt":[{{"type":"text","text":"emoji cut in half: \ud83d"}}]}}}}"#
    );
    let deep = format!(
        r#"{{"jsonrpc":"2.0","id":7,"method":"_mock/echo","params":{{"_meta":{}1{}}}}}"#,
        "[".repeat(130),
        "]".repeat(130)
    );
    let huge = r#"{"jsonrpc":"2.0","id":7,"method":"_mock/echo","params":{"v":1e400}}"#.to_owned();
    for (body, needle) in [
        (lone_surrogate, "surrogate"),
        (deep, "nested deeper"),
        (huge, "out of range"),
    ] {
        let reply = Api::send(server.rpc_post(Some(&conn)).body(body)).await;
        let doc = assert_problem(&reply, 400, "invalid-request");
        assert!(problem_text(&doc).contains(needle), "{doc}");
    }
    // Id 7 is free, and a whole emoji goes through.
    let reply = server.prompt(&conn, &session, json!(7), "\u{1F600}").await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
}

#[tokio::test]
async fn x_acp_agent_header_is_rejected() {
    let server = TestServer::start(&[]).await;
    let init = acp::request(0, "initialize", acp::initialize_params(MOCK));
    let reply = Api::send(
        server
            .rpc_post(None)
            .header("x-acp-agent", MOCK)
            .body(init.to_string()),
    )
    .await;
    assert_problem(&reply, 400, "invalid-request");
    assert!(reply.connection_id().is_none(), "{reply:?}");

    let conn = server.initialize(MOCK).await;
    let echo = acp::request(1, "_mock/echo", json!({}));
    let reply = Api::send(
        server
            .rpc_post(Some(&conn))
            .header("x-acp-agent", MOCK)
            .body(echo.to_string()),
    )
    .await;
    assert_problem(&reply, 400, "invalid-request");
}

#[tokio::test]
async fn only_initialize_goes_without_a_connection_id() {
    let server = TestServer::start(&[]).await;
    let messages = [
        acp::request(1, "session/new", acp::new_session_params(MOCK)),
        acp::request(2, "_mock/echo", json!({})),
        acp::cancel("mock-whatever"),
        acp::response(json!(3), json!({})),
    ];
    for message in messages {
        let reply = server.post(None, &message).await;
        assert_problem(&reply, 400, "missing-connection-id");
    }
}

#[tokio::test]
async fn initialize_and_session_new_need_the_agent_in_meta() {
    let server = TestServer::start(&[]).await;
    for params in [
        json!({"protocolVersion": 1, "clientCapabilities": {}}),
        json!({"protocolVersion": 1, "clientCapabilities": {}, "_meta": {}}),
        json!({"protocolVersion": 1, "clientCapabilities": {}, "_meta": {"sandboxagent.dev": {}}}),
    ] {
        let reply = server
            .post(None, &acp::request(0, "initialize", params.clone()))
            .await;
        assert_problem(&reply, 400, "missing-agent");
        assert!(reply.connection_id().is_none(), "{params}: {reply:?}");
    }

    let conn = server.initialize(MOCK).await;
    let request = acp::request(1, "session/new", json!({"cwd": "/tmp", "mcpServers": []}));
    let reply = server.post(Some(&conn), &request).await;
    assert_problem(&reply, 400, "missing-agent");
}

#[tokio::test]
async fn initialize_for_an_unknown_agent_is_404() {
    let server = TestServer::start(&[]).await;
    let reply = server.initialize_reply("no-such-agent").await;
    let doc = assert_problem(&reply, 404, "unknown-agent");
    assert!(reply.connection_id().is_none(), "{reply:?}");
    assert!(
        problem_text(&doc).contains(MOCK),
        "the detail lists the known ids: {doc}"
    );
}

#[tokio::test]
async fn session_new_naming_another_agent_is_400_agent_mismatch() {
    let second = mock_agent_command("second", "");
    let server = TestServer::start(&["--agent-command", &second]).await;
    let conn = server.initialize(MOCK).await;
    let request = acp::request(1, "session/new", acp::new_session_params("second"));
    let reply = server.post(Some(&conn), &request).await;
    let doc = assert_problem(&reply, 400, "agent-mismatch");
    let text = problem_text(&doc);
    assert!(
        text.contains(MOCK) && text.contains("second"),
        "the problem names both agents: {doc}"
    );

    // The configured agent itself works on a connection bound to it.
    let conn2 = server.initialize("second").await;
    server.new_session_for(&conn2, "second").await;
}

#[tokio::test]
async fn unknown_connection_is_404() {
    let server = TestServer::start(&[]).await;
    let reply = server
        .post(
            Some("no-such-connection"),
            &acp::request(1, "_mock/echo", json!({})),
        )
        .await;
    assert_problem(&reply, 404, "unknown-connection");
}

#[tokio::test]
async fn content_type_must_be_application_json() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let echo = acp::request(1, "_mock/echo", json!({"x": 1})).to_string();
    for content_type in [
        "text/plain",
        "application/x-www-form-urlencoded",
        "text/json",
    ] {
        let builder = server
            .request(reqwest::Method::POST, "/v2/rpc")
            .header(CONNECTION_ID_HEADER, &conn)
            .header(CONTENT_TYPE, content_type)
            .body(echo.clone());
        let reply = Api::send(builder).await;
        assert_eq!(reply.status.as_u16(), 415, "{content_type}: {reply:?}");
        assert_problem(&reply, 415, "unsupported-media-type");
    }
    // No Content-Type at all.
    let builder = server
        .request(reqwest::Method::POST, "/v2/rpc")
        .header(CONNECTION_ID_HEADER, &conn)
        .body(echo.clone());
    assert_problem(&Api::send(builder).await, 415, "unsupported-media-type");

    // Media-type parameters are fine.
    let builder = server
        .request(reqwest::Method::POST, "/v2/rpc")
        .header(CONNECTION_ID_HEADER, &conn)
        .header(CONTENT_TYPE, "application/json; charset=utf-8")
        .body(echo);
    let reply = Api::send(builder).await;
    reply.assert_status(200);
    assert_eq!(reply.json()["result"]["x"], 1);
}

#[tokio::test]
async fn accept_must_allow_application_json() {
    let server = TestServer::start(&[]).await;
    let init = acp::request(0, "initialize", acp::initialize_params(MOCK)).to_string();
    for accept in ["text/html", "text/event-stream"] {
        let reply = Api::send(
            server
                .rpc_post(None)
                .header(ACCEPT, accept)
                .body(init.clone()),
        )
        .await;
        assert_eq!(reply.status.as_u16(), 406, "Accept {accept}: {reply:?}");
        assert_problem(&reply, 406, "not-acceptable");
        assert!(reply.connection_id().is_none(), "{reply:?}");
    }
    for accept in [
        "application/json",
        "*/*",
        "application/*",
        "text/event-stream, application/json",
    ] {
        let reply = Api::send(
            server
                .rpc_post(None)
                .header(ACCEPT, accept)
                .body(init.clone()),
        )
        .await;
        assert_eq!(reply.status.as_u16(), 200, "Accept {accept}: {reply:?}");
        assert!(reply.connection_id().is_some(), "{reply:?}");
    }
    // No Accept header at all (reqwest always sends one, so by hand).
    let raw = server
        .raw_exchange(
            "POST",
            "/v2/rpc",
            &[("Content-Type", "application/json")],
            init.as_bytes(),
        )
        .await;
    assert_eq!(raw.status, 200, "POST without Accept: {raw:?}");
    assert!(raw.header(CONNECTION_ID_HEADER).is_some(), "{raw:?}");
}

#[tokio::test]
async fn body_over_the_limit_is_413() {
    let server = TestServer::start(&["--max-body-bytes", "1024"]).await;
    let conn = server.initialize(MOCK).await;

    // Exactly at the limit: accepted.
    let reply = Api::send(server.rpc_post(Some(&conn)).body(echo_body_of_len(1024))).await;
    reply.assert_status(200);
    assert!(reply.json()["result"]["pad"].is_string(), "{reply:?}");

    // One byte over, with Content-Length.
    let reply = Api::send(server.rpc_post(Some(&conn)).body(echo_body_of_len(1025))).await;
    assert_problem(&reply, 413, "payload-too-large");

    // Over the limit without Content-Length (chunked transfer encoding).
    let body = echo_body_of_len(4096);
    let chunks: Vec<Result<bytes::Bytes, std::io::Error>> = body
        .as_bytes()
        .chunks(512)
        .map(|c| Ok(bytes::Bytes::copy_from_slice(c)))
        .collect();
    let streamed = reqwest::Body::wrap_stream(futures::stream::iter(chunks));
    let reply = Api::send(server.rpc_post(Some(&conn)).body(streamed)).await;
    assert_problem(&reply, 413, "payload-too-large");

    // The server and the connection keep working.
    let echoed = server.echo(&conn, json!(2), json!({"small": true})).await;
    assert_eq!(echoed["result"]["small"], true);
}

#[tokio::test]
async fn prompt_timeout_gives_504() {
    let server = TestServer::start(&["--prompt-timeout-ms", "300"]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let started = Instant::now();
    let request = acp::request(1, "session/prompt", acp::prompt_params(&session, "!stall"));
    let reply = server.post(Some(&conn), &request).await;
    assert_problem(&reply, 504, "timeout");
    assert!(
        started.elapsed().as_millis() >= 300,
        "504 before the 300 ms timeout ran out"
    );
    // Clean up the stalled turn; the server keeps serving.
    server
        .post(Some(&conn), &acp::cancel(&session))
        .await
        .assert_accepted_empty();
    let echoed = server
        .echo(&conn, json!(2), json!({"after": "timeout"}))
        .await;
    assert_eq!(echoed["result"]["after"], "timeout");
}

#[tokio::test]
async fn prompts_are_exempt_from_the_request_timeout() {
    let server = TestServer::start(&["--request-timeout-ms", "2000"]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let started = Instant::now();
    // Five chunks 700 ms apart: at least 2.8 s, longer than the 2 s request
    // timeout.
    let reply = server
        .prompt(&conn, &session, json!(1), "!slow 5 700")
        .await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
    assert!(
        started.elapsed().as_millis() >= 2_800,
        "the turn cannot have been that fast"
    );
}

/// A member named twice in `params` is refused (research/contract.md,
/// "Transport: /v2/rpc"): the runtime reads the first `sessionId`, an agent
/// may keep the last, and a terminated session was prompted that way, its
/// prompt missing from the event log.
#[tokio::test]
async fn a_member_named_twice_in_params_is_refused() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize("mock").await;
    let ended = server.new_session(&conn).await;
    let live = server.new_session(&conn).await;
    let terminated = server
        .rpc(
            &conn,
            1,
            v2_api_tests::ext::TERMINATE,
            json!({"sessionId": ended}),
        )
        .await;
    assert!(terminated.get("result").is_some(), "{terminated}");
    for (id, body) in [
        (
            2,
            format!(
                r#"{{"jsonrpc":"2.0","id":2,"method":"session/prompt","params":{{"sessionId":"x","prompt":[{{"type":"text","text":"hi"}}],"sessionId":"{ended}"}}}}"#
            ),
        ),
        (
            3,
            format!(
                r#"{{"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{{"sessionId":"{live}","prompt":[{{"type":"text","text":"hi"}}],"sessi\u006fnId":"{live}"}}}}"#
            ),
        ),
    ] {
        let reply = Api::send(server.rpc_post(Some(&conn)).body(body.clone())).await;
        let problem = assert_problem(&reply, 400, "invalid-request");
        assert!(
            problem["detail"]
                .as_str()
                .is_some_and(|d| d.contains("sessionId")),
            "request {id}: {problem}"
        );
    }
    // The same value twice, with members after it (the scan of `params`
    // used to stop at the second name and then fail on the rest, which let
    // the message through), and names repeated deeper: in `_meta`, in the
    // runtime's own key of it, in a content block.
    let prompt = r#"[{"type":"text","text":"hi"}]"#;
    for (id, params, member) in [
        (
            4,
            format!(r#"{{"sessionId":"{live}","sessionId":"{live}","prompt":{prompt}}}"#),
            "sessionId",
        ),
        (
            5,
            format!(r#"{{"sessionId":"{live}","prompt":{prompt},"_meta":{{"a":1,"a":1}}}}"#),
            "a",
        ),
        (
            6,
            format!(
                r#"{{"sessionId":"{live}","prompt":{prompt},"_meta":{{"sandboxagent.dev":{{"agent":"mock","agent":"mock"}}}}}}"#
            ),
            "agent",
        ),
        (
            7,
            format!(
                r#"{{"sessionId":"{live}","prompt":[{{"type":"text","text":"a","text":"a"}}]}}"#
            ),
            "text",
        ),
    ] {
        for method in ["session/prompt", "session/set_mode"] {
            let body =
                format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{params}}}"#);
            let reply = Api::send(server.rpc_post(Some(&conn)).body(body)).await;
            let problem = assert_problem(&reply, 400, "invalid-request");
            assert!(
                problem["detail"]
                    .as_str()
                    .is_some_and(|d| d.contains(&format!("{member:?} more than once"))),
                "{method} {id}: {problem}"
            );
        }
    }
    // Neither reached the agent: no turn in either session's log.
    for session in [&ended, &live] {
        let (prompts, events) = prompts_logged(&server, session).await;
        assert_eq!(prompts, 0, "{events}");
    }
    // The connection still works.
    let echoed = server.echo(&conn, json!(9), json!({"ok": true})).await;
    assert_eq!(echoed["result"]["ok"], true);
}

/// By-position `params` are refused (research/contract.md, "Transport:
/// /v2/rpc"): the runtime reads `sessionId` by name, an agent's decoder
/// may read an array by position, so `["<id>", …]` went past the observer
/// and ended-session checks (`sessionId` read as absent) while a serde
/// agent took it as the session's prompt, and an observer changed a
/// session's metadata.
#[tokio::test]
async fn params_by_position_are_refused() {
    let server = TestServer::start(&[]).await;
    let owner = server.initialize("mock").await;
    let session = server.new_session(&owner).await;
    let observer = server.initialize("mock").await;
    let attached = server
        .rpc(
            &observer,
            1,
            v2_api_tests::ext::ATTACH,
            json!({"sessionId": session, "role": "observer", "historyPolicy": "none"}),
        )
        .await;
    assert_eq!(attached["result"]["role"], "observer", "{attached}");
    for (id, method, params) in [
        (
            2,
            "session/prompt",
            format!(r#"["{session}",[{{"type":"text","text":"hi"}}]]"#),
        ),
        (
            3,
            v2_api_tests::ext::SET_METADATA,
            format!(r#"["{session}",{{"title":"by position"}}]"#),
        ),
        (4, "session/set_mode", format!(r#"["{session}","plan"]"#)),
    ] {
        let body =
            format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{params}}}"#);
        let reply = Api::send(server.rpc_post(Some(&observer)).body(body)).await;
        let problem = assert_problem(&reply, 400, "invalid-request");
        assert!(
            problem["detail"]
                .as_str()
                .is_some_and(|d| d.contains("\"params\" must be an object")),
            "{method}: {problem}"
        );
    }
    // Nothing reached the session: no prompt in its log, its title unset.
    let (prompts, events) = prompts_logged(&server, &session).await;
    assert_eq!(prompts, 0, "{events}");
    let entry = server
        .get_json(&format!("/v2/sessions/{session}?agent=mock"))
        .await;
    assert!(entry["title"].is_null(), "{entry}");
    // Named params still pass, from the session's controller.
    let named = server
        .rpc(
            &owner,
            5,
            v2_api_tests::ext::SET_METADATA,
            json!({"sessionId": session, "metadata": {"note": "by name"}}),
        )
        .await;
    assert!(named.get("result").is_some(), "{named}");
}

/// How many `session/prompt` messages the mock's session `session` has in
/// its event log, and the log page they were counted in.
async fn prompts_logged(server: &TestServer, session: &str) -> (usize, Value) {
    let events = server
        .get_json(&format!("/v2/sessions/{session}/events?agent=mock"))
        .await;
    let prompts = events["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|event| event.to_string().contains("session/prompt"))
        .count();
    (prompts, events)
}
