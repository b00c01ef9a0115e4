//! Misbehaving agents (research/contract.md,
//! "Routing: connections, sessions, one agent process": agent stdout and
//! process exit): a crash mid-turn, garbage
//! and overlong stdout lines, stderr noise, agents that cannot start, and a
//! client that never reads its stream.

use std::time::{Duration, Instant};

use serde_json::json;
use v2_api_tests::acp::{self, stop_reason};
use v2_api_tests::agents::{SH_ANSWER_INITIALIZE, TempDir, agent_entry, sh_agent};
use v2_api_tests::problem::problem_text;
use v2_api_tests::procfs::{self, ProcessRef};
use v2_api_tests::{
    EVENT_TIMEOUT, MOCK, SseEvent, TestServer, assert_problem, join_within, mock_agent_command,
};

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
    // The ring under test only: the session store's writer holds what it
    // has not written yet (bounded on its own: research/contract.md,
    // "Durable sessions"), which would blur what this measures.
    let server = TestServer::start(&["--replay-buffer", "8", "--store", "memory"]).await;
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

#[tokio::test]
async fn concurrent_starts_of_a_mute_agent_share_one_attempt() {
    // Reads its stdin, never writes: the runtime's initialize times out.
    let server = TestServer::start(&[
        "--agent-command",
        "mute=/bin/sh -c 'exec cat >/dev/null'",
        "--request-timeout-ms",
        "2000",
    ])
    .await;
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let api = server.api();
            tokio::spawn(async move {
                let started = Instant::now();
                let reply = api.initialize_reply("mute").await;
                (reply, started.elapsed())
            })
        })
        .collect();
    for task in tasks {
        let (reply, took) = join_within(task, EVENT_TIMEOUT).await;
        let doc = assert_problem(&reply, 502, "agent-start-failed");
        assert!(
            problem_text(&doc).contains("initialize within 2000 ms"),
            "the shared attempt's own failure: {doc}"
        );
        // One attempt of 2 s for all four, not four in turn (2, 4, 6, 8 s).
        assert!(
            took < Duration::from_millis(3500),
            "answered after {took:?}"
        );
    }
    let entry = agent_entry(&server, "mute").await;
    assert_eq!(entry["restarts"], 0, "one process was started: {entry}");
    assert!(
        entry["lastError"]
            .as_str()
            .is_some_and(|e| e.contains("initialize")),
        "{entry}"
    );
    // The next use after a failure tries afresh.
    let reply = server.initialize_reply("mute").await;
    assert_problem(&reply, 502, "agent-start-failed");
    let entry = agent_entry(&server, "mute").await;
    assert_eq!(entry["restarts"], 1, "a second attempt: {entry}");
}

/// Updates the flood agent writes for a session nobody owns.
const FLOOD: u64 = 200_000;
/// Messages the runtime holds for unknown sessions (research/contract.md,
/// "Routing: connections, sessions, one agent process"): the rest of a
/// flood is dropped.
const HELD_MAX: u64 = 256;
/// The warning for one dropped held message, and its rate-limited summary.
const DROPPED_ONE: &str = "dropping a message held for a session nobody owns";
const DROPPED_SUMMARY: &str = "dropped messages held for sessions nobody owns: ";

/// Full warnings and the counts of the summaries in `log`.
fn dropped_in(log: &str) -> (u64, u64) {
    let full = log.matches(DROPPED_ONE).count() as u64;
    let summed = log
        .lines()
        .filter_map(|line| line.split_once(DROPPED_SUMMARY))
        .filter_map(|(_, rest)| rest.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    (full, summed)
}

#[tokio::test]
async fn a_flood_for_an_unknown_session_is_logged_as_counts() {
    let dir = TempDir::new("flood");
    let update = r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"nobody-owns-this","update":{"sessionUpdate":"agent_message_chunk","content":{"type":"text","text":"x"}}}}"#;
    let script =
        format!("{SH_ANSWER_INITIALIZE}yes '{update}' | head -n {FLOOD}\nexec cat >/dev/null\n");
    let flood = sh_agent(&dir, "flood", &script);
    let server = TestServer::start(&["--agent-command", &flood]).await;
    server.initialize("flood").await;
    // The summary comes at the end of the warning interval (10 s).
    let log = server
        .log_when(
            |log| {
                let (full, summed) = dropped_in(log);
                full + summed >= FLOOD - HELD_MAX
            },
            Duration::from_secs(60),
        )
        .await;
    let (full, summed) = dropped_in(&log);
    assert!(
        full < 50,
        "{full} warning lines for {FLOOD} dropped messages; want a few and a count"
    );
    assert!(summed > 0, "a summary with the count: {full} full lines");
    assert!(
        (FLOOD - HELD_MAX..=FLOOD).contains(&(full + summed)),
        "every dropped message is counted once: {full} + {summed}"
    );
    // The server still serves.
    let conn = server.initialize(MOCK).await;
    server.new_session(&conn).await;
}
