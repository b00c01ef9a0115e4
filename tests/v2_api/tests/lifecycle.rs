//! Connection and server lifecycle: `DELETE /v2/rpc`, the connection cap,
//! idle reaping, and graceful shutdown on SIGTERM with no orphan processes
//! (research/contract.md, "Transport: /v2/rpc", DELETE and the connection
//! lifecycle).

use std::time::{Duration, Instant};

use serde_json::json;
use v2_api_tests::acp::{self, stop_reason};
use v2_api_tests::procfs::{self, ProcessRef};
use v2_api_tests::sse::Next;
use v2_api_tests::{
    EVENT_TIMEOUT, MOCK, REQUEST_TIMEOUT, TestServer, assert_problem, join_within, shell_quote,
};

/// Bound for the server to exit after SIGTERM.
const EXIT_TIMEOUT: Duration = Duration::from_secs(20);

#[tokio::test]
async fn delete_is_idempotent_and_closes_the_connection() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    server.new_session(&conn).await;

    let reply = server.delete(Some(&conn)).await;
    reply.assert_status(204);
    assert!(reply.body.is_empty(), "{reply:?}");
    server.delete(Some(&conn)).await.assert_status(204);
    server
        .delete(Some("no-such-connection"))
        .await
        .assert_status(204);

    let reply = server
        .post(Some(&conn), &acp::request(1, "_mock/echo", json!({})))
        .await;
    assert_problem(&reply, 404, "unknown-connection");
    let reply = server.get_stream_error(Some(&conn), None).await;
    assert_problem(&reply, 404, "unknown-connection");

    let reply = server.delete(None).await;
    assert_problem(&reply, 400, "missing-connection-id");
}

#[tokio::test]
async fn delete_answers_waiting_posts_at_once() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let mut stream = server.open_stream(&conn, None).await;

    let (api, c, s) = (server.api(), conn.clone(), session.clone());
    // 50 chunks 200 ms apart: the turn lasts about 10 s.
    let waiting =
        tokio::spawn(async move { api.prompt(&c, &s, json!("waiting"), "!slow 50 200").await });
    stream
        .next_event_matching(|e| e.agent_text() == Some("chunk-1 "), EVENT_TIMEOUT)
        .await;

    let deleted_at = Instant::now();
    server.delete(Some(&conn)).await.assert_status(204);
    let reply = join_within(waiting, REQUEST_TIMEOUT).await;
    let answered_after = deleted_at.elapsed();
    assert_eq!(reply["id"], "waiting", "{reply}");
    assert_eq!(reply["error"]["code"], -32603, "{reply}");
    assert!(reply.get("result").is_none(), "{reply}");
    assert!(
        answered_after < Duration::from_secs(8),
        "answered {answered_after:?} after DELETE: it waited for the turn instead"
    );
}

#[tokio::test]
async fn sessions_outlive_delete_and_can_be_loaded_elsewhere() {
    let server = TestServer::start(&[]).await;
    let conn_a = server.initialize(MOCK).await;
    let session = server.new_session(&conn_a).await;
    let reply = server
        .prompt(&conn_a, &session, json!(1), "remember the walrus")
        .await;
    assert_eq!(stop_reason(&reply), Some("end_turn"));
    server.delete(Some(&conn_a)).await.assert_status(204);

    let conn_b = server.initialize(MOCK).await;
    let load = acp::request(
        2,
        "session/load",
        json!({"sessionId": session, "cwd": "/tmp", "mcpServers": [], "_meta": acp::agent_meta(MOCK)}),
    );
    let loaded = server.call(&conn_b, &load).await;
    assert!(
        loaded.get("error").is_none(),
        "the session is still alive: {loaded}"
    );

    // The replayed history went to the connection that loaded the session.
    let mut stream = server.open_stream(&conn_b, None).await;
    let user_chunk = stream
        .next_event_matching(
            |e| {
                e.chunk_text("user_message_chunk")
                    .is_some_and(|t| t.contains("walrus"))
            },
            EVENT_TIMEOUT,
        )
        .await;
    assert_eq!(user_chunk.session_id(), Some(session.as_str()));

    let reply = server
        .prompt(&conn_b, &session, json!(3), "still here")
        .await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
    let last = acp::mock_reply_chunks("still here")
        .last()
        .cloned()
        .unwrap_or_default();
    stream
        .next_event_matching(|e| e.agent_text() == Some(last.as_str()), EVENT_TIMEOUT)
        .await;
}

#[tokio::test]
async fn connection_cap_gives_503_until_a_slot_frees() {
    let server = TestServer::start(&["--max-connections", "2"]).await;
    let first = server.initialize(MOCK).await;
    let _second = server.initialize(MOCK).await;

    let reply = server.initialize_reply(MOCK).await;
    assert_problem(&reply, 503, "too-many-connections");
    assert!(
        reply.header("retry-after").is_some(),
        "503 carries Retry-After: {reply:?}"
    );
    assert!(reply.connection_id().is_none(), "{reply:?}");

    server.delete(Some(&first)).await.assert_status(204);
    server.initialize(MOCK).await;
}

#[tokio::test]
async fn idle_connections_are_reaped() {
    let server = TestServer::start(&["--idle-timeout-ms", "500"]).await;
    let idle = server.initialize(MOCK).await;
    let streaming = server.initialize(MOCK).await;
    let busy = server.initialize(MOCK).await;
    let busy_session = server.new_session(&busy).await;
    let mut stream = server.open_stream(&streaming, None).await;

    // A request longer than the idle timeout keeps its connection alive.
    let (api, c, s) = (server.api(), busy.clone(), busy_session.clone());
    let turn = tokio::spawn(async move { api.prompt(&c, &s, json!(1), "!slow 8 300").await });

    // Idleness is the passage of time with nothing happening: any request
    // to check would itself be activity, so this has to be a sleep. 2.5 s
    // is five idle timeouts.
    tokio::time::sleep(Duration::from_millis(2_500)).await;

    let reply = server
        .post(Some(&idle), &acp::request(1, "_mock/echo", json!({})))
        .await;
    assert_problem(&reply, 404, "unknown-connection");

    let echoed = server
        .echo(&streaming, json!(1), json!({"alive": true}))
        .await;
    assert_eq!(
        echoed["result"]["alive"], true,
        "a connection with an open stream is not idle"
    );
    match stream.try_next(Duration::from_millis(1)).await {
        Next::Ended | Next::Failed(_) => {
            panic!("the open stream of a non-idle connection was closed")
        }
        Next::Event(_) | Next::TimedOut => {}
    }

    let reply = join_within(turn, REQUEST_TIMEOUT).await;
    assert_eq!(
        stop_reason(&reply),
        Some("end_turn"),
        "a connection with a request in flight is not idle: {reply}"
    );
}

/// Records every process under the server, asserting at least one whose
/// command line contains `needle`.
fn processes_including(server: &TestServer, needle: &str) -> Vec<ProcessRef> {
    let all = server.descendants();
    assert!(
        all.iter().any(|p| procfs::cmdline(p.pid).contains(needle)),
        "expected a `{needle}` process under the server: {:?}",
        all.iter()
            .map(|p| procfs::cmdline(p.pid))
            .collect::<Vec<_>>()
    );
    all
}

/// Asserts that none of `processes` runs any more; they get a short grace
/// (processes the server signalled may take a moment to die after it
/// exits), polled because no notification exists.
async fn assert_all_gone(processes: &[ProcessRef]) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let alive: Vec<String> = processes
            .iter()
            .filter(|p| procfs::is_alive(p))
            .map(|p| format!("{} {}", p.pid, procfs::cmdline(p.pid)))
            .collect();
        if alive.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "processes left behind by the server: {alive:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn sigterm_stops_agents_and_ends_open_streams() {
    let mut server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let mut stream = server.open_stream(&conn, None).await;
    let reply = server.prompt(&conn, &session, json!(1), "hi").await;
    assert_eq!(stop_reason(&reply), Some("end_turn"));
    let agents = processes_including(&server, "mock-agent");

    server.send_sigterm();
    match stream.drain_to_end(EXIT_TIMEOUT).await {
        Next::Ended => {}
        other => panic!("the open SSE stream must end cleanly on shutdown, got {other:?}"),
    }
    let status = server
        .wait_exit(EXIT_TIMEOUT)
        .await
        .expect("the server exits after SIGTERM");
    assert!(
        status.success(),
        "graceful shutdown exits with success: {status:?}"
    );
    assert_all_gone(&agents).await;
    let stdout = server
        .stdout_after_start_line(Duration::from_secs(5))
        .await
        .expect("stdout closes when the server exits");
    assert!(
        stdout.is_empty(),
        "stdout carries only the start-up line; also got {stdout:?}"
    );
}

#[tokio::test]
async fn sigterm_stops_the_whole_agent_process_tree() {
    // An agent that leaves a child of its own running (as `npx` does).
    let bin = v2_api_tests::server::sandbox_agent_bin();
    let tree = format!(
        "tree=/bin/sh -c \"sleep 300 </dev/null >/dev/null 2>&1 & exec {} mock-agent\"",
        shell_quote(&bin.to_string_lossy())
    );
    let mut server = TestServer::start(&["--agent-command", &tree]).await;
    let conn = server.initialize("tree").await;
    let session = server.new_session_for(&conn, "tree").await;
    let reply = server.prompt(&conn, &session, json!(1), "hi").await;
    assert_eq!(stop_reason(&reply), Some("end_turn"));
    let processes = processes_including(&server, "sleep 300");

    server.send_sigterm();
    let status = server
        .wait_exit(EXIT_TIMEOUT)
        .await
        .expect("the server exits after SIGTERM");
    assert!(status.success(), "{status:?}");
    assert_all_gone(&processes).await;
}
