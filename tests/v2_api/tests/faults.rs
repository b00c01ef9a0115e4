//! Misbehaving agents (research/contract.md,
//! "Routing: connections, sessions, one agent process": agent stdout and
//! process exit): a crash mid-turn, garbage
//! and overlong stdout lines, stderr noise, agents that cannot start, and a
//! client that never reads its stream.

use std::time::Duration;

use serde_json::json;
use v2_api_tests::acp::{self, stop_reason};
use v2_api_tests::procfs::{self, ProcessRef};
use v2_api_tests::{EVENT_TIMEOUT, MOCK, SseEvent, TestServer, assert_problem, mock_agent_command};

const UNPARSED: &str = "_sandboxagent/agent/unparsed";

/// The agent-message chunk texts among `events`.
fn texts(events: &[SseEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| e.agent_text().map(str::to_owned))
        .collect()
}

/// The one running mock-agent process.
fn the_mock_agent(server: &TestServer) -> ProcessRef {
    let processes = server.mock_agent_processes();
    assert_eq!(
        processes.len(),
        1,
        "expected one mock-agent process: {processes:?}"
    );
    processes[0]
}

/// Waits (bounded) until `process` is gone; there is no exit notification
/// for a process we are not the parent of, so this polls.
async fn wait_gone(process: &ProcessRef, timeout: Duration) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    while procfs::is_alive(process) {
        if std::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

#[tokio::test]
async fn agent_crash_mid_turn() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let mut stream = server.open_stream(&conn, None).await;
    let crashed = the_mock_agent(&server);

    // The pending prompt fails with a JSON-RPC error inside a 200.
    let reply = server.prompt(&conn, &session, json!(3), "!crash").await;
    assert!(reply.get("result").is_none(), "{reply}");
    assert!(reply["error"]["code"].is_i64(), "a JSON-RPC error: {reply}");

    let ended = stream
        .next_event_matching(
            |e| e.method() == Some("_sandboxagent/session/ended"),
            EVENT_TIMEOUT,
        )
        .await;
    assert!(ended.id.is_some(), "{ended:?}");
    let params = ended.params();
    assert_eq!(params["sessionId"], session.as_str(), "{ended:?}");
    assert_eq!(params["exitCode"], 3, "{ended:?}");
    assert!(
        ["completed", "error", "terminated"]
            .contains(&params["reason"].as_str().unwrap_or_default()),
        "{ended:?}"
    );
    assert!(
        ["agent", "daemon"].contains(&params["terminatedBy"].as_str().unwrap_or_default()),
        "{ended:?}"
    );
    let stderr = &params["stderr"];
    assert!(stderr["truncated"].is_boolean(), "{ended:?}");
    assert!(
        stderr
            .to_string()
            .contains("mock agent: crashing on request"),
        "the agent's stderr (head/tail) names the crash: {ended:?}"
    );
    assert!(
        texts(&stream.history).contains(&"Crashing...".to_owned()),
        "the chunk written before the crash was delivered: {:#?}",
        stream.history
    );
    assert!(
        wait_gone(&crashed, Duration::from_secs(10)).await,
        "the crashed agent is gone"
    );

    // The next initialize works and starts a new agent process.
    let conn2 = server.initialize(MOCK).await;
    let session2 = server.new_session(&conn2).await;
    let reply = server
        .prompt(&conn2, &session2, json!(4), "after the crash")
        .await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
    let restarted = the_mock_agent(&server);
    assert_ne!(restarted, crashed, "a new process");

    // The old connection still reaches the agent (the new process).
    let echoed = server
        .echo(&conn, json!(5), json!({"old": "connection"}))
        .await;
    assert_eq!(echoed["result"]["old"], "connection", "{echoed}");
}

#[tokio::test]
async fn non_json_agent_lines_become_unparsed_notifications() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let mut stream = server.open_stream(&conn, None).await;
    let agent = the_mock_agent(&server);

    let reply = server.prompt(&conn, &session, json!(1), "!garbage").await;
    assert_eq!(
        stop_reason(&reply),
        Some("end_turn"),
        "the turn completes: {reply}"
    );
    let expected = acp::mock_reply_chunks("!garbage");
    let last = expected.last().cloned().unwrap_or_default();
    let events = stream
        .collect_until(|e| e.agent_text() == Some(last.as_str()), EVENT_TIMEOUT)
        .await;
    assert_eq!(texts(&events), expected);

    let unparsed: Vec<&SseEvent> = events
        .iter()
        .filter(|e| e.method() == Some(UNPARSED))
        .collect();
    let raws: Vec<&str> = unparsed
        .iter()
        .filter_map(|e| e.params()["raw"].as_str())
        .collect();
    assert_eq!(
        raws,
        ["this is not json", "\u{1b}[31mred\u{1b}[0m", "42"],
        "one notice per line, raw line as written, in order: {events:#?}"
    );
    for event in &unparsed {
        assert!(event.id.is_some(), "{event:?}");
        assert_eq!(event.params()["agent"], MOCK, "{event:?}");
        assert!(
            event.params()["error"]
                .as_str()
                .is_some_and(|e| !e.is_empty()),
            "{event:?}"
        );
    }
    // The lines were written before the reply, and the runtime numbers
    // messages in the order the agent wrote them.
    let first_chunk = events.iter().position(|e| e.agent_text().is_some());
    let last_unparsed = events.iter().rposition(|e| e.method() == Some(UNPARSED));
    assert!(last_unparsed < first_chunk, "{events:#?}");

    assert_eq!(
        the_mock_agent(&server),
        agent,
        "the agent process keeps running"
    );
    let echoed = server.echo(&conn, json!(2), json!({"still": "fine"})).await;
    assert_eq!(echoed["result"]["still"], "fine");
}

#[tokio::test]
async fn overlong_agent_line_is_reported_and_discarded() {
    let server = TestServer::start(&["--max-line-bytes", "4096"]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let mut stream = server.open_stream(&conn, None).await;
    let agent = the_mock_agent(&server);

    let reply = server
        .prompt(&conn, &session, json!(1), "!huge 100000")
        .await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
    let expected = acp::mock_reply_chunks("!huge 100000");
    let last = expected.last().cloned().unwrap_or_default();
    let events = stream
        .collect_until(|e| e.agent_text() == Some(last.as_str()), EVENT_TIMEOUT)
        .await;
    assert_eq!(
        texts(&events),
        expected,
        "the lines after the long one are framed correctly"
    );

    let unparsed: Vec<&SseEvent> = events
        .iter()
        .filter(|e| e.method() == Some(UNPARSED))
        .collect();
    assert_eq!(
        unparsed.len(),
        1,
        "one report for the long line: {events:#?}"
    );
    let params = unparsed[0].params();
    assert_eq!(params["agent"], MOCK);
    assert!(
        params["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{params}"
    );
    let raw = params["raw"].as_str().expect("raw is a string");
    assert!(
        raw.len() < 100_000,
        "the long line is discarded, not relayed ({} bytes)",
        raw.len()
    );

    assert_eq!(
        the_mock_agent(&server),
        agent,
        "the agent process keeps running"
    );
    let reply = server.prompt(&conn, &session, json!(2), "next").await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
}

#[tokio::test]
async fn a_long_unparsable_line_is_reported_cut_to_its_first_kib() {
    // 100 KB is under the line limit, so the line is read whole; the report
    // goes to every connection of the agent, so only its head is relayed.
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let mut stream = server.open_stream(&conn, None).await;
    let reply = server
        .prompt(&conn, &session, json!(1), "!huge 100000")
        .await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
    let report = stream
        .collect_until(|e| e.method() == Some(UNPARSED), EVENT_TIMEOUT)
        .await;
    let params = report.last().expect("a report").params();
    let raw = params["raw"].as_str().expect("raw is a string");
    assert!(raw.ends_with('…'), "{raw}");
    assert!(
        raw.len() <= 1024 + '…'.len_utf8(),
        "raw is {} bytes",
        raw.len()
    );
    let error = params["error"].as_str().expect("error is a string");
    assert!(error.contains("100000 bytes"), "{error}");
}

#[tokio::test]
async fn agent_stderr_never_reaches_the_stream() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let mut stream = server.open_stream(&conn, None).await;
    let reply = server.prompt(&conn, &session, json!(1), "!stderr 5").await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
    let expected = acp::mock_reply_chunks("!stderr 5");
    let last = expected.last().cloned().unwrap_or_default();
    let events = stream
        .collect_until(|e| e.agent_text() == Some(last.as_str()), EVENT_TIMEOUT)
        .await;
    assert_eq!(texts(&events), expected);
    for event in &events {
        assert!(
            !event.data.to_string().contains("stderr line"),
            "stderr leaked: {event:?}"
        );
    }
}

#[tokio::test]
async fn agents_that_cannot_start_are_502() {
    let exits_at_start = mock_agent_command("dies", "--exit-at-start 3");
    let server = TestServer::start(&[
        "--agent-command",
        r#"broken=/bin/sh -c "exit 3""#,
        "--agent-command",
        &exits_at_start,
        "--agent-command",
        "missing=/nonexistent/sandbox-agent-test/agent",
    ])
    .await;
    for agent in ["broken", "dies", "missing", "broken"] {
        let reply = server.initialize_reply(agent).await;
        assert_problem(&reply, 502, "agent-start-failed");
        assert!(reply.connection_id().is_none(), "{agent}: {reply:?}");
    }
    // Other agents are unaffected.
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let reply = server.prompt(&conn, &session, json!(1), "hi").await;
    assert_eq!(stop_reason(&reply), Some("end_turn"));
}

#[tokio::test]
async fn a_client_that_never_reads_its_stream_costs_bounded_memory() {
    let server = TestServer::start(&["--replay-buffer", "8"]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    // Warm up the agent, the HTTP stack and the allocator.
    let reply = server
        .prompt(&conn, &session, json!(1), "!emit 20 100000")
        .await;
    assert_eq!(stop_reason(&reply), Some("end_turn"));
    // Open the stream and never read it.
    let unread = server.open_stream(&conn, None).await;
    let before = procfs::rss_bytes(server.pid()).expect("server RSS");

    // 400 updates of 100 kB each: 40 MB through the server, which would stay
    // resident if the unread stream buffered without bound (the ring keeps 8;
    // a bounded server grows by well under 1 MiB here).
    let reply = server
        .prompt(&conn, &session, json!(2), "!emit 400 100000")
        .await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
    let after = procfs::rss_bytes(server.pid()).expect("server RSS");
    let growth = after.saturating_sub(before);
    assert!(
        growth < 20 * 1024 * 1024,
        "server RSS grew by {} MiB for an unread stream with an 8-event ring",
        growth / (1024 * 1024)
    );
    drop(unread);

    // The server still serves.
    let echoed = server.echo(&conn, json!(3), json!({"ok": true})).await;
    assert_eq!(echoed["result"]["ok"], true);
}
