//! The control plane (research/contract.md,
//! "Extension methods and control plane"): `GET /v2/sessions`,
//! `GET /v2/sessions/{id}`, `GET /v2/sessions/{id}/events` and the session
//! event log behind it, over real HTTP against the real binary.

use serde_json::{Value, json};
use v2_api_tests::acp::{self, stop_reason};
use v2_api_tests::ext::{
    SESSION_ENDED, SESSION_GET, TERMINATE, expect_result, is_rfc3339, namespace, session_ids,
    session_ref,
};
use v2_api_tests::{
    Api, EVENT_TIMEOUT, MOCK, REQUEST_TIMEOUT, TestServer, assert_problem, join_within,
    mock_agent_command, path_segment,
};

/// `GET /v2/sessions/{session}/events` with `query`; the page.
async fn events(server: &TestServer, session: &str, query: &str) -> Value {
    server
        .get_json(&format!("/v2/sessions/{session}/events{query}"))
        .await
}

/// The `events` array of a page.
fn events_of(page: &Value) -> Vec<Value> {
    page["events"]
        .as_array()
        .cloned()
        .unwrap_or_else(|| panic!("no events array: {page}"))
}

/// The `offset` of every event of a page.
fn offsets(events: &[Value]) -> Vec<u64> {
    events
        .iter()
        .map(|e| {
            e["offset"]
                .as_u64()
                .unwrap_or_else(|| panic!("event without offset: {e}"))
        })
        .collect()
}

/// `_meta["sandboxagent.dev"].eventCount` of `session`.
async fn event_count(server: &TestServer, conn: &str, session: &str) -> u64 {
    let response = server
        .rpc(conn, "count", SESSION_GET, session_ref(session))
        .await;
    namespace(expect_result(&response))["eventCount"]
        .as_u64()
        .unwrap_or_else(|| panic!("no eventCount: {response}"))
}

/// Checks the shape every event has and returns `(direction, message)`.
fn parts(event: &Value) -> (&str, &Value) {
    assert!(
        event["at"].as_str().is_some_and(is_rfc3339),
        "`at` is RFC 3339: {event}"
    );
    let direction = event["direction"]
        .as_str()
        .unwrap_or_else(|| panic!("no direction: {event}"));
    assert!(
        ["client_to_agent", "agent_to_client"].contains(&direction),
        "{event}"
    );
    let message = &event["message"];
    assert_eq!(
        message["jsonrpc"], "2.0",
        "the message is JSON-RPC: {event}"
    );
    (direction, message)
}

#[tokio::test]
async fn session_events_record_a_whole_turn_in_order() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let reply = server.prompt(&conn, &session, json!(7), "hello").await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");

    let page = events(&server, &session, "").await;
    let all = events_of(&page);
    let count = event_count(&server, &conn, &session).await;
    assert_eq!(offsets(&all), (0..count).collect::<Vec<_>>(), "{page}");
    assert_eq!(page["nextOffset"], count, "{page}");

    let chunks = acp::mock_reply_chunks("hello");
    assert_eq!(all.len(), 3 + chunks.len() + 1, "{page}");
    let (direction, message) = parts(&all[0]);
    assert_eq!(
        (direction, &message["method"], &message["id"]),
        ("client_to_agent", &json!("session/new"), &json!(1)),
        "{page}"
    );
    let (direction, message) = parts(&all[1]);
    assert_eq!(direction, "agent_to_client", "{page}");
    assert_eq!(message["id"], 1, "{page}");
    assert_eq!(message["result"]["sessionId"], session.as_str(), "{page}");
    let (direction, message) = parts(&all[2]);
    assert_eq!(direction, "client_to_agent", "{page}");
    assert_eq!(message["method"], "session/prompt", "{page}");
    assert_eq!(message["id"], 7, "ids as the client sent them: {page}");
    assert_eq!(message["params"]["prompt"][0]["text"], "hello", "{page}");
    for (event, chunk) in all[3..3 + chunks.len()].iter().zip(&chunks) {
        let (direction, message) = parts(event);
        assert_eq!(direction, "agent_to_client", "{event}");
        assert_eq!(message["method"], "session/update", "{event}");
        assert_eq!(message["params"]["sessionId"], session.as_str(), "{event}");
        assert_eq!(
            message["params"]["update"]["content"]["text"],
            chunk.as_str(),
            "{event}"
        );
    }
    let (direction, message) = parts(&all[all.len() - 1]);
    assert_eq!(direction, "agent_to_client", "{page}");
    assert_eq!(message["id"], 7, "{page}");
    assert_eq!(message["result"]["stopReason"], "end_turn", "{page}");
    let times: Vec<&str> = all.iter().filter_map(|e| e["at"].as_str()).collect();
    assert!(
        times.windows(2).all(|w| w[0] <= w[1]),
        "in time order: {times:?}"
    );
}

#[tokio::test]
async fn session_events_include_agent_requests_and_client_answers() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let mut stream = server.open_stream(&conn, None).await;
    let (api, c, s) = (server.api(), conn.clone(), session.clone());
    let turn =
        tokio::spawn(async move { api.prompt(&c, &s, json!("p"), "permission please").await });
    let asked = stream
        .next_event_matching(
            |e| e.method() == Some("session/request_permission"),
            EVENT_TIMEOUT,
        )
        .await;
    let request_id = asked.data["id"].clone();
    server
        .post(
            Some(&conn),
            &acp::permission_answer(request_id.clone(), "reject-once"),
        )
        .await
        .assert_accepted_empty();
    let reply = join_within(turn, REQUEST_TIMEOUT).await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");

    let page = events(&server, &session, "?offset=0&limit=1000").await;
    let all = events_of(&page);
    let position = |pred: &dyn Fn(&str, &Value) -> bool| {
        all.iter()
            .position(|e| {
                let (direction, message) = parts(e);
                pred(direction, message)
            })
            .unwrap_or_else(|| panic!("missing event in {page}"))
    };
    let request =
        position(&|d, m| d == "agent_to_client" && m["method"] == "session/request_permission");
    let answer = position(&|d, m| {
        d == "client_to_agent"
            && m["id"] == request_id
            && m["result"]["outcome"]["optionId"] == "reject-once"
    });
    let denied = position(&|d, m| {
        d == "agent_to_client" && m["params"]["update"]["content"]["text"] == "denied."
    });
    let response = position(&|d, m| d == "agent_to_client" && m["id"] == "p");
    assert!(
        request < answer && answer < denied && denied < response,
        "request {request}, answer {answer}, update {denied}, response {response}: {page}"
    );
}

#[tokio::test]
async fn session_events_page_with_offset_and_limit() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let reply = server.prompt(&conn, &session, json!(1), "page me").await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
    let whole = events_of(&events(&server, &session, "?offset=0&limit=1000").await);
    let count = event_count(&server, &conn, &session).await;
    assert_eq!(whole.len() as u64, count);

    let mut paged = Vec::new();
    let mut offset = 0;
    loop {
        let page = events(&server, &session, &format!("?offset={offset}&limit=3")).await;
        let batch = events_of(&page);
        assert!(batch.len() <= 3, "{page}");
        let next = page["nextOffset"]
            .as_u64()
            .unwrap_or_else(|| panic!("no nextOffset: {page}"));
        if batch.is_empty() {
            assert_eq!(next, count, "an empty page points at the end: {page}");
            break;
        }
        assert_eq!(offsets(&batch)[0], offset, "{page}");
        assert_eq!(next, offset + batch.len() as u64, "{page}");
        paged.extend(batch);
        offset = next;
    }
    assert_eq!(paged, whole, "pages put together give the whole log");

    let middle = events(&server, &session, "?offset=4&limit=2").await;
    assert_eq!(offsets(&events_of(&middle)), [4, 5], "{middle}");
    assert_eq!(middle["nextOffset"], 6, "{middle}");
    let beyond = events(&server, &session, "?offset=100000").await;
    assert!(events_of(&beyond).is_empty(), "{beyond}");
    assert_eq!(beyond["nextOffset"], count, "{beyond}");
}

#[tokio::test]
async fn session_ids_are_percent_decoded_in_paths_and_queries_form_decoded() {
    // ACP session ids are arbitrary strings; this agent's hold a space, a `/`,
    // a `%` and non-ASCII text, so a client must percent-encode them.
    let odd = mock_agent_command("odd", "--session-id-prefix 'team a/run 1 100% é '");
    let server = TestServer::start(&["--agent-command", &odd]).await;
    let conn = server.initialize("odd").await;
    let session = server.new_session_for(&conn, "odd").await;
    assert!(session.starts_with("team a/run 1 100% é "), "{session}");
    let reply = server.prompt(&conn, &session, json!(1), "hi").await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");

    let escaped = path_segment(&session);
    let entry = server.get_json(&format!("/v2/sessions/{escaped}")).await;
    assert_eq!(entry["sessionId"], session.as_str(), "{entry}");
    // `%31` is `1`: query values are form-decoded like any URL query.
    let page = events(&server, &escaped, "?offset=0&limit=%31").await;
    assert_eq!(offsets(&events_of(&page)), [0], "{page}");

    let reply = server.get("/v2/sessions/bad%zzescape").await;
    assert_problem(&reply, 400, "invalid-request");
    let reply = server.get("/v2/sessions/not-utf8-%ff").await;
    assert_problem(&reply, 400, "invalid-request");
    for query in ["?limit=+5", "?offset=%2B1", "?limit=1e2"] {
        let reply = server
            .get(&format!("/v2/sessions/{escaped}/events{query}"))
            .await;
        assert_problem(&reply, 400, "invalid-request");
    }
}

/// Every byte outside RFC 3986 `unreserved` as `%XX`.

#[tokio::test]
async fn session_events_errors_are_problems() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let reply = server.get("/v2/sessions/no-such-session/events").await;
    assert_problem(&reply, 404, "unknown-session");
    for query in [
        "?limit=0",
        "?limit=abc",
        "?limit=-1",
        "?limit=1001",
        "?offset=-1",
        "?offset=x",
    ] {
        let reply = server
            .get(&format!("/v2/sessions/{session}/events{query}"))
            .await;
        assert_problem(&reply, 400, "invalid-request");
    }
    let reply = Api::send(server.request(
        reqwest::Method::POST,
        &format!("/v2/sessions/{session}/events"),
    ))
    .await;
    assert_problem(&reply, 405, "method-not-allowed");
}

#[tokio::test]
async fn event_log_cap_shows_as_an_offset_gap() {
    let server = TestServer::start(&["--event-log-events", "5"]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let reply = server
        .prompt(&conn, &session, json!(9), "a longer turn")
        .await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
    let count = event_count(&server, &conn, &session).await;
    assert!(count > 5, "eventCount counts dropped events too: {count}");

    let page = events(&server, &session, "?offset=0").await;
    let kept = events_of(&page);
    assert_eq!(
        offsets(&kept),
        (count - 5..count).collect::<Vec<_>>(),
        "the oldest are dropped and the offsets jump: {page}"
    );
    assert_eq!(page["nextOffset"], count, "{page}");
    let (_, last) = parts(&kept[4]);
    assert_eq!(
        last["id"], 9,
        "the newest event is the prompt's response: {page}"
    );
    let inside_gap = events(&server, &session, "?offset=1&limit=2").await;
    assert_eq!(
        offsets(&events_of(&inside_gap)),
        [count - 5, count - 4],
        "{inside_gap}"
    );
}

#[tokio::test]
async fn get_sessions_lists_the_inventory() {
    let server = TestServer::start(&[]).await;
    let empty = server.get_json("/v2/sessions").await;
    assert_eq!(empty, json!({"sessions": []}));
    let conn_a = server.initialize(MOCK).await;
    let conn_b = server.initialize(MOCK).await;
    let s1 = server.new_session(&conn_a).await;
    let s2 = server.new_session(&conn_b).await;
    let s3 = server.new_session(&conn_a).await;

    let http = server.get_json("/v2/sessions").await;
    assert_eq!(
        session_ids(&http),
        [s3.clone(), s2.clone(), s1.clone()],
        "{http}"
    );
    let list = server.rpc(&conn_b, 1, "session/list", json!({})).await;
    assert_eq!(
        http["sessions"],
        expect_result(&list)["sessions"],
        "entries are shaped like session/list entries"
    );

    let one = server.get_json(&format!("/v2/sessions/{s2}")).await;
    let got = server.rpc(&conn_a, 2, SESSION_GET, session_ref(&s2)).await;
    assert_eq!(
        &one,
        expect_result(&got),
        "GET /v2/sessions/{{id}} equals session/get"
    );
    assert_eq!(namespace(&one)["agent"], MOCK, "{one}");

    let reply = server.get("/v2/sessions/no-such-session").await;
    assert_problem(&reply, 404, "unknown-session");
    let reply = Api::send(server.request(reqwest::Method::DELETE, "/v2/sessions")).await;
    assert_problem(&reply, 405, "method-not-allowed");
    assert_eq!(reply.header("allow"), Some("GET"), "{reply:?}");

    let mut stream = server.open_stream(&conn_a, None).await;
    let response = server.rpc(&conn_b, 3, TERMINATE, session_ref(&s1)).await;
    expect_result(&response);
    stream
        .next_event_matching(|e| e.method() == Some(SESSION_ENDED), EVENT_TIMEOUT)
        .await;
    let ended = server.get_json(&format!("/v2/sessions/{s1}")).await;
    assert_eq!(namespace(&ended)["ended"], true, "{ended}");
    let after = server.get_json("/v2/sessions").await;
    assert_eq!(
        session_ids(&after),
        session_ids(&http),
        "ended sessions stay listed"
    );
}

#[tokio::test]
async fn control_plane_requires_the_token() {
    let server = TestServer::start(&["--token", "s3cret"]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    for path in [
        "/v2/sessions".to_owned(),
        format!("/v2/sessions/{session}"),
        format!("/v2/sessions/{session}/events"),
        "/v2/agents".to_owned(),
    ] {
        let reply = Api::send(server.http().get(server.url(&path))).await;
        assert_problem(&reply, 401, "unauthorized");
        server.get_json(&path).await;
    }
}
