//! Routing inside the runtime (research/contract.md,
//! "Routing: connections, sessions, one agent process"): shared agent
//! processes, id rewriting across connections, session ownership, and
//! agent-initiated requests answered by the client (permissions) or on its
//! behalf.

use std::time::Instant;

use serde_json::{Value, json};
use v2_api_tests::acp::{self, stop_reason};
use v2_api_tests::{
    EVENT_TIMEOUT, MOCK, REQUEST_TIMEOUT, SseEvent, SseStream, TestServer, join_within,
};

/// The agent-message chunk texts among `events`.
fn texts(events: &[SseEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| e.agent_text().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn same_jsonrpc_id_on_two_connections_at_once() {
    let server = TestServer::start(&[]).await;
    let (conn_a, conn_b) = (server.initialize(MOCK).await, server.initialize(MOCK).await);
    let session_a = server.new_session(&conn_a).await;
    let session_b = server.new_session(&conn_b).await;
    let mut stream_a = server.open_stream(&conn_a, None).await;
    let mut stream_b = server.open_stream(&conn_b, None).await;

    // Both connections run a turn under the same id "p"; A's takes >= 700 ms
    // (8 chunks 100 ms apart), B's about 100 ms.
    let started = Instant::now();
    let (api, c, s) = (server.api(), conn_a.clone(), session_a.clone());
    let turn_a = tokio::spawn(async move {
        let reply = api.prompt(&c, &s, json!("p"), "!slow 8 100").await;
        (reply, started.elapsed())
    });
    let (api, c, s) = (server.api(), conn_b.clone(), session_b.clone());
    let turn_b = tokio::spawn(async move { api.prompt(&c, &s, json!("p"), "!slow 2 100").await });

    // Meanwhile, id 1 on both connections at the same moment, many times.
    for round in 0..16 {
        let (a, b) = tokio::join!(
            server.echo(&conn_a, json!(1), json!({"who": "A", "round": round})),
            server.echo(&conn_b, json!(1), json!({"who": "B", "round": round})),
        );
        assert_eq!(
            (&a["result"]["who"], &a["result"]["round"]),
            (&json!("A"), &json!(round)),
            "{a}"
        );
        assert_eq!(
            (&b["result"]["who"], &b["result"]["round"]),
            (&json!("B"), &json!(round)),
            "{b}"
        );
    }

    let reply_b = join_within(turn_b, REQUEST_TIMEOUT).await;
    assert_eq!(stop_reason(&reply_b), Some("end_turn"), "{reply_b}");
    let (reply_a, elapsed_a) = join_within(turn_a, REQUEST_TIMEOUT).await;
    assert_eq!(stop_reason(&reply_a), Some("end_turn"), "{reply_a}");
    assert!(
        elapsed_a.as_millis() >= 700,
        "A got an answer after {elapsed_a:?}, before its own turn could end (B's answer?)"
    );

    // Each connection saw exactly its own session's updates.
    let events_a = stream_a
        .collect_until(|e| e.agent_text() == Some("chunk-8 "), EVENT_TIMEOUT)
        .await;
    let events_b = stream_b
        .collect_until(|e| e.agent_text() == Some("chunk-2 "), EVENT_TIMEOUT)
        .await;
    assert_eq!(texts(&events_a), acp::slow_chunks(8));
    assert_eq!(texts(&events_b), acp::slow_chunks(2));
    for (events, own) in [(&events_a, &session_a), (&events_b, &session_b)] {
        for event in events.iter().filter(|e| e.update().is_some()) {
            assert_eq!(
                event.session_id(),
                Some(own.as_str()),
                "foreign update: {event:?}"
            );
        }
        assert!(
            events.iter().all(|e| e.data.get("result").is_none()),
            "no stray response: {events:#?}"
        );
    }
}

#[tokio::test]
async fn connections_of_one_agent_share_one_process() {
    let server = TestServer::start(&[]).await;
    for text in ["first", "second", "third"] {
        let conn = server.initialize(MOCK).await;
        let session = server.new_session(&conn).await;
        let reply = server.prompt(&conn, &session, json!(1), text).await;
        assert_eq!(stop_reason(&reply), Some("end_turn"));
    }
    let processes = server.mock_agent_processes();
    assert_eq!(
        processes.len(),
        1,
        "one mock-agent process for all connections: {processes:?}"
    );
}

/// Starts a prompt containing "permission" in a task and waits for the
/// agent's `session/request_permission` on `stream`; returns the prompt
/// task and the request event.
async fn prompt_until_permission_request(
    server: &TestServer,
    conn: &str,
    session: &str,
    stream: &mut SseStream,
) -> (tokio::task::JoinHandle<Value>, SseEvent) {
    let (api, c, s) = (server.api(), conn.to_owned(), session.to_owned());
    let turn = tokio::spawn(async move {
        api.prompt(&c, &s, json!(10), "may I have permission?")
            .await
    });
    let request = stream
        .next_event_matching(
            |e| e.method() == Some("session/request_permission"),
            EVENT_TIMEOUT,
        )
        .await;
    assert!(request.id.is_some(), "{request:?}");
    assert!(
        request.data.get("id").is_some_and(|id| !id.is_null()),
        "an agent request has an id: {request:?}"
    );
    assert_eq!(request.session_id(), Some(session), "{request:?}");
    let options: Vec<&str> = request.params()["options"]
        .as_array()
        .map(|o| o.iter().filter_map(|o| o["optionId"].as_str()).collect())
        .unwrap_or_default();
    assert!(
        options.contains(&"allow-once") && options.contains(&"reject-once"),
        "{request:?}"
    );
    // The pending tool call was announced before the question.
    let tool_call = stream
        .history
        .iter()
        .find(|e| e.update_kind() == Some("tool_call"))
        .unwrap_or_else(|| {
            panic!(
                "no tool_call before the permission request: {:#?}",
                stream.history
            )
        });
    // `pending` is ACP's default tool-call status, which serializers may omit.
    let status = tool_call.update().map(|u| &u["status"]);
    assert!(
        matches!(status, Some(Value::Null)) || status == Some(&json!("pending")),
        "{tool_call:?}"
    );
    (turn, request)
}

#[tokio::test]
async fn permission_round_trip() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let mut stream = server.open_stream(&conn, None).await;
    let (turn, request) =
        prompt_until_permission_request(&server, &conn, &session, &mut stream).await;
    let asked_at = request.id.expect("numbered");
    let agent_id = request.data["id"].clone();

    server
        .post(
            Some(&conn),
            &acp::permission_answer(agent_id.clone(), "allow-once"),
        )
        .await
        .assert_accepted_empty();
    // A second answer to the same agent request is dropped (still 202).
    server
        .post(
            Some(&conn),
            &acp::permission_answer(agent_id, "reject-once"),
        )
        .await
        .assert_accepted_empty();

    let reply = join_within(turn, REQUEST_TIMEOUT).await;
    assert_eq!(reply["id"], 10);
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");

    // The response was released only after the turn's remaining updates
    // (tool_call_update, "Permission ", "granted.": three events) were in the
    // connection's buffer, so resuming from the newest of them is valid now.
    let newest = (asked_at + 3).to_string();
    let response = server.get_stream(Some(&conn), Some(&newest)).await;
    assert_eq!(
        response.status().as_u16(),
        200,
        "updates of the turn were not buffered when its response was released"
    );
    drop(response);

    let mut replay = server.open_stream(&conn, Some(asked_at)).await;
    let events = replay
        .collect_until(|e| e.agent_text() == Some("granted."), EVENT_TIMEOUT)
        .await;
    assert_eq!(events.len(), 3, "{events:#?}");
    assert_eq!(
        events[0].update_kind(),
        Some("tool_call_update"),
        "{events:#?}"
    );
    assert_eq!(
        events[0].update().map(|u| &u["status"]),
        Some(&json!("completed"))
    );
    assert_eq!(texts(&events), acp::word_chunks("Permission granted."));
}

#[tokio::test]
async fn permission_rejected() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let mut stream = server.open_stream(&conn, None).await;
    let (turn, request) =
        prompt_until_permission_request(&server, &conn, &session, &mut stream).await;
    server
        .post(
            Some(&conn),
            &acp::permission_answer(request.data["id"].clone(), "reject-once"),
        )
        .await
        .assert_accepted_empty();
    let reply = join_within(turn, REQUEST_TIMEOUT).await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
    let events = stream
        .collect_until(|e| e.agent_text() == Some("denied."), EVENT_TIMEOUT)
        .await;
    let update = events
        .iter()
        .find(|e| e.update_kind() == Some("tool_call_update"));
    assert_eq!(
        update.and_then(|e| e.update()).map(|u| &u["status"]),
        Some(&json!("failed"))
    );
    assert_eq!(texts(&events), acp::word_chunks("Permission denied."));
}

#[tokio::test]
async fn cancel_during_a_pending_permission_ends_the_turn_cancelled() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let mut stream = server.open_stream(&conn, None).await;
    let (turn, _request) =
        prompt_until_permission_request(&server, &conn, &session, &mut stream).await;
    server
        .post(Some(&conn), &acp::cancel(&session))
        .await
        .assert_accepted_empty();
    let reply = join_within(turn, REQUEST_TIMEOUT).await;
    assert_eq!(reply["id"], 10);
    assert_eq!(stop_reason(&reply), Some("cancelled"), "{reply}");

    // The session takes new turns afterwards.
    let reply = server
        .prompt(&conn, &session, json!(11), "after cancel")
        .await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
}

/// Since the runtime serves the agent's files in the sandbox
/// (research/contract.md, "Files and terminals of the agent, served in the
/// sandbox"), a request no connection declared is answered by the runtime
/// with the file, and still never reaches the client. (What no one serves
/// gets `-32601`: `client_side.rs`, the manifest test.)
#[tokio::test]
async fn fs_request_for_a_client_without_fs_capability_is_answered_on_its_behalf() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let mut stream = server.open_stream(&conn, None).await;
    // Our initialize declared `clientCapabilities: {}`: no fs.
    let reply = server
        .prompt(&conn, &session, json!(1), "!fs /etc/hostname")
        .await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
    let expected = std::fs::read_to_string("/etc/hostname").expect("/etc/hostname");
    let answer = acp::word_chunks(&format!("Read {} bytes.", expected.len()));
    let last = answer.last().cloned().unwrap_or_default();
    let events = stream
        .collect_until(|e| e.agent_text() == Some(last.as_str()), EVENT_TIMEOUT)
        .await;
    assert_eq!(texts(&events), answer, "the runtime answered with the file");
    assert!(
        events
            .iter()
            .all(|e| e.method() != Some("fs/read_text_file")),
        "the request must not reach a client that did not declare fs: {events:#?}"
    );
}

/// Two agents that both name their session `s-1` (research/contract.md,
/// "Routing: connections, sessions, one agent process": sessions are named
/// by agent and session id). Each connection reaches its own agent's `s-1`;
/// the control plane lists both and asks which one when a path is ambiguous.
#[tokio::test]
async fn sessions_of_two_agents_with_one_id_stay_apart() {
    use v2_api_tests::ext::{SESSION_GET, TERMINATE, expect_result, session_ref};
    use v2_api_tests::{assert_problem, mock_agent_command};
    let a = mock_agent_command("a", "--session-id s-1");
    let b = mock_agent_command("b", "--session-id s-1");
    let server = TestServer::start(&["--agent-command", &a, "--agent-command", &b]).await;
    let (conn_a, conn_b) = (server.initialize("a").await, server.initialize("b").await);
    assert_eq!(server.new_session_for(&conn_a, "a").await, "s-1");
    assert_eq!(server.new_session_for(&conn_b, "b").await, "s-1");
    let mut stream_a = server.open_stream(&conn_a, None).await;
    let mut stream_b = server.open_stream(&conn_b, None).await;

    // A's prompt streams to A, not B.
    let reply = server.prompt(&conn_a, "s-1", json!(7), "hello").await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
    let events = stream_a
        .collect_until(
            |e| e.is_response_to(&json!(7)) || e.agent_text().is_some(),
            EVENT_TIMEOUT,
        )
        .await;
    assert!(
        events.iter().any(|e| e.agent_text().is_some()),
        "A's stream got A's reply: {events:?}"
    );

    // The inventory has both, each under its agent.
    let list = server.get_json("/v2/sessions").await;
    let mut agents: Vec<&str> = list["sessions"]
        .as_array()
        .expect("sessions array")
        .iter()
        .filter(|s| s["sessionId"] == "s-1")
        .filter_map(|s| s["_meta"]["sandboxagent.dev"]["agent"].as_str())
        .collect();
    agents.sort_unstable();
    assert_eq!(agents, ["a", "b"], "{list}");

    // On a connection, the id resolves within the connection's agent.
    let got = server
        .call(&conn_b, &acp::request(8, SESSION_GET, session_ref("s-1")))
        .await;
    assert_eq!(
        expect_result(&got)["_meta"]["sandboxagent.dev"]["agent"],
        "b",
        "{got}"
    );

    // The control plane: ambiguous without ?agent=, exact with it.
    let ambiguous = server.get("/v2/sessions/s-1").await;
    let problem = assert_problem(&ambiguous, 409, "ambiguous-session");
    let detail = problem["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("a") && detail.contains("b"), "{problem}");
    assert_problem(
        &server.get("/v2/sessions/s-1/events").await,
        409,
        "ambiguous-session",
    );
    let entry = server.get_json("/v2/sessions/s-1?agent=b").await;
    assert_eq!(entry["_meta"]["sandboxagent.dev"]["agent"], "b", "{entry}");
    let events_a = server.get_json("/v2/sessions/s-1/events?agent=a").await;
    let logged_prompt = events_a["events"]
        .as_array()
        .expect("events")
        .iter()
        .any(|e| e["message"]["method"] == "session/prompt");
    assert!(logged_prompt, "a's log has a's prompt: {events_a}");
    let events_b = server.get_json("/v2/sessions/s-1/events?agent=b").await;
    let b_prompted = events_b["events"]
        .as_array()
        .expect("events")
        .iter()
        .any(|e| e["message"]["method"] == "session/prompt");
    assert!(!b_prompted, "b's log has no prompt: {events_b}");
    assert_problem(
        &server.get("/v2/sessions/s-1?agent=zzz").await,
        404,
        "unknown-session",
    );

    // A terminates its s-1: A hears it, B's s-1 lives on.
    let terminated = server
        .call(&conn_a, &acp::request(9, TERMINATE, session_ref("s-1")))
        .await;
    expect_result(&terminated);
    let ended = stream_a
        .next_event_matching(
            |e| e.method() == Some("_sandboxagent/session/ended"),
            EVENT_TIMEOUT,
        )
        .await;
    assert_eq!(ended.session_id(), Some("s-1"));
    let reply = server.prompt(&conn_b, "s-1", json!(10), "still here").await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
    let after = stream_b
        .collect_until(|e| e.agent_text().is_some(), EVENT_TIMEOUT)
        .await;
    assert!(
        after
            .iter()
            .all(|e| e.method() != Some("_sandboxagent/session/ended")),
        "B never heard of A's terminate: {after:?}"
    );
    let entry_b = server.get_json("/v2/sessions/s-1?agent=b").await;
    assert_eq!(
        entry_b["_meta"]["sandboxagent.dev"]["ended"], false,
        "{entry_b}"
    );
}

/// An agent's answer counts only as a JSON-RPC 2.0 response
/// (research/contract.md, "Routing: connections, sessions, one agent
/// process"): objects that carry the request's id and a `result` without
/// `"jsonrpc": "2.0"` are reported as `agent/unparsed` and settle nothing.
#[tokio::test]
async fn agent_answers_that_are_not_json_rpc_2_0_settle_nothing() {
    let script =
        v2_api_tests::server::workspace_root().join("tests/v2_api/fixtures/lying_agent.mjs");
    let liar = format!(
        "liar=node {}",
        v2_api_tests::shell_quote(&script.to_string_lossy())
    );
    let server = TestServer::start(&["--agent-command", &liar]).await;
    let conn = server.initialize("liar").await;
    assert_eq!(server.new_session_for(&conn, "liar").await, "s-1");
    let mut stream = server.open_stream(&conn, None).await;
    let reply = server.prompt(&conn, "s-1", json!(5), "hello").await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
    let unparsed = stream
        .collect_until(
            |e| {
                e.method() == Some("_sandboxagent/agent/unparsed")
                    && e.params()["raw"]
                        .as_str()
                        .is_some_and(|r| r.contains("logged"))
            },
            EVENT_TIMEOUT,
        )
        .await
        .into_iter()
        .filter(|e| e.method() == Some("_sandboxagent/agent/unparsed"))
        .count();
    assert_eq!(unparsed, 3, "{:#?}", stream.history);
}

/// A second request with an id already in flight on the connection gets
/// -32600 whoever would answer it, the agent or the runtime
/// (research/contract.md, "Transport: /v2/rpc", edge rules).
#[tokio::test]
async fn an_id_in_flight_is_refused_for_runtime_answered_requests_too() {
    use v2_api_tests::ext::{SESSION_GET, expect_error, expect_result, session_ref};
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let mut stream = server.open_stream(&conn, None).await;
    // `prompt_until_permission_request` sends the prompt as id 10.
    let (turn, request) =
        prompt_until_permission_request(&server, &conn, &session, &mut stream).await;
    for (method, params) in [
        ("session/list", json!({})),
        (SESSION_GET, session_ref(&session)),
        ("initialize", acp::initialize_params(MOCK)),
        ("_mock/echo", json!({"x": 1})),
    ] {
        let dup = server.call(&conn, &acp::request(10, method, params)).await;
        assert_eq!(dup["id"], 10, "{dup}");
        expect_error(&dup, -32600);
    }
    server
        .post(
            Some(&conn),
            &acp::permission_answer(request.data["id"].clone(), "allow-once"),
        )
        .await
        .assert_accepted_empty();
    let reply = join_within(turn, REQUEST_TIMEOUT).await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
    // The id is free again, and a runtime-answered request frees it at once.
    for _ in 0..2 {
        let list = server
            .call(&conn, &acp::request(10, "session/list", json!({})))
            .await;
        expect_result(&list);
    }
}
