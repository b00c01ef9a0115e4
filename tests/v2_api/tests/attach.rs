//! Several clients on one session (research/contract.md,
//! "`_sandboxagent/session/attach`"): the history of a live session goes to
//! the attaching (or loading) connection only, from the event log, with no
//! gap and no duplicate before the live updates; observers get updates but
//! no agent requests and cannot prompt; an agent request goes to every
//! controller, the first answer wins and the others hear
//! `_sandboxagent/request/resolved`; a session that ends answers its open
//! agent requests. One client is always the official ACP TypeScript SDK
//! (`tests/v2_api/fixtures/acp_sdk_peer.mjs`), the other a raw `/v2/rpc`
//! client.

use serde_json::{Value, json};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};
use v2_api_tests::acp::{self, stop_reason};
use v2_api_tests::server::workspace_root;
use v2_api_tests::sse::Next;
use v2_api_tests::{EVENT_TIMEOUT, SseEvent, SseStream, TestServer, shell_quote};

const ATTACH: &str = "_sandboxagent/session/attach";
const RESOLVED: &str = "_sandboxagent/request/resolved";

/// One client of the official TypeScript SDK on `/acp/{agent}`, driven by
/// line commands (see the fixture's header).
struct SdkPeer {
    child: Child,
    stdin: ChildStdin,
    lines: Lines<BufReader<ChildStdout>>,
    /// Everything it reported, in order.
    seen: Vec<Value>,
}

impl SdkPeer {
    async fn start(server: &TestServer, agent: &str) -> SdkPeer {
        let modules = workspace_root().join("tests/npm/node_modules");
        assert!(
            modules
                .join("@agentclientprotocol/sdk/package.json")
                .is_file(),
            "@agentclientprotocol/sdk not found under {}: npm install --prefix tests/npm",
            modules.display()
        );
        let script = workspace_root().join("tests/v2_api/fixtures/acp_sdk_peer.mjs");
        let mut child = tokio::process::Command::new("node")
            .arg(&script)
            .arg(&modules)
            .arg(format!("{}/acp/{agent}", server.api().base_url()))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("run node");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let mut peer = SdkPeer {
            child,
            stdin,
            lines: BufReader::new(stdout).lines(),
            seen: Vec::new(),
        };
        peer.until(|e| e["type"] == "ready").await;
        peer
    }

    async fn send(&mut self, command: Value) {
        let line = format!("{command}\n");
        self.stdin
            .write_all(line.as_bytes())
            .await
            .expect("write to the SDK peer");
    }

    /// Sends a request and waits for its answer (`response` or `error`).
    async fn request(&mut self, method: &str, params: Value) -> Value {
        self.send(json!({"op": "request", "method": method, "params": params}))
            .await;
        self.until(|e| (e["type"] == "response" || e["type"] == "error") && e["method"] == method)
            .await
    }

    /// The next report matching `pred` (earlier ones stay in `seen`).
    async fn until(&mut self, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + EVENT_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = tokio::time::timeout(left, self.lines.next_line())
                .await
                .unwrap_or_else(|_| panic!("SDK peer: nothing matching; seen {:#?}", self.seen))
                .expect("read the SDK peer")
                .unwrap_or_else(|| panic!("SDK peer exited; seen {:#?}", self.seen));
            let event: Value = serde_json::from_str(&line).expect("one JSON line");
            self.seen.push(event.clone());
            if pred(&event) {
                return event;
            }
        }
    }

    /// Reads what comes within `quiet` (nothing more expected).
    async fn settle(&mut self, quiet: Duration) {
        while let Ok(Ok(Some(line))) = tokio::time::timeout(quiet, self.lines.next_line()).await {
            let event: Value = serde_json::from_str(&line).expect("one JSON line");
            self.seen.push(event);
        }
    }

    /// The `session/update` notifications seen so far.
    fn updates(&self) -> Vec<&Value> {
        self.seen
            .iter()
            .filter(|e| e["type"] == "notification" && e["method"] == "session/update")
            .map(|e| &e["params"]["update"])
            .collect()
    }

    async fn exit(mut self) {
        self.send(json!({"op": "exit"})).await;
        let _ = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await;
    }
}

/// The text of a content chunk update of `kind`.
fn chunk_text<'a>(update: &'a Value, kind: &str) -> Option<&'a str> {
    (update["sessionUpdate"] == kind)
        .then(|| update["content"]["text"].as_str())
        .flatten()
}

/// The agent text of `updates`, joined.
fn agent_text<'a>(updates: impl IntoIterator<Item = &'a Value>) -> String {
    updates
        .into_iter()
        .filter_map(|u| chunk_text(u, "agent_message_chunk"))
        .collect()
}

/// `session/load` params for the mock.
fn load_params(session: &str) -> Value {
    json!({"sessionId": session, "cwd": "/tmp", "mcpServers": []})
}

/// Events of `stream` that arrive within `quiet`.
async fn quiet_events(stream: &mut SseStream, quiet: Duration) -> Vec<SseEvent> {
    let mut events = Vec::new();
    while let Next::Event(event) = stream.try_next(quiet).await {
        events.push(event);
    }
    events
}

/// A `session/load` of a live session from a second connection (the
/// TypeScript SDK) is answered by the runtime: the history, prompts as
/// `user_message_chunk`s, goes to the loading connection only, before the
/// answer, which carries the session's modes and config options; the first
/// client does not receive the history again, and later live updates reach
/// both exactly once.
#[tokio::test]
async fn a_second_load_replays_the_history_to_the_loader_only() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize("mock").await;
    let session = server.new_session(&conn).await;
    let mut stream = server.open_stream(&conn, None).await;
    let reply = server
        .prompt(&conn, &session, json!(5), "hello there")
        .await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
    let first_turn = stream
        .collect_until(
            |e| {
                e.agent_text()
                    == Some(
                        acp::mock_reply_chunks("hello there")
                            .last()
                            .map_or("", |s| s),
                    )
            },
            EVENT_TIMEOUT,
        )
        .await;
    assert!(!first_turn.is_empty());

    let mut peer = SdkPeer::start(&server, "mock").await;
    let loaded = peer.request("session/load", load_params(&session)).await;
    assert_eq!(loaded["type"], "response", "{loaded}");
    let result = &loaded["result"];
    assert_eq!(result["modes"]["currentModeId"], "default", "{result}");
    assert_eq!(result["configOptions"][0]["id"], "model", "{result}");
    assert_eq!(
        result["_meta"]["sandboxagent.dev"]["agent"], "mock",
        "{result}"
    );
    // The history came once: the prompt, then the reply. (It is pushed
    // before the answer, but the answer and the stream are two HTTP
    // exchanges, so the peer may read the answer first.)
    let reply_seen = |updates: Vec<&Value>| {
        updates
            .iter()
            .any(|u| u["sessionUpdate"] == "agent_message_chunk")
    };
    if !reply_seen(peer.updates()) {
        peer.until(|e| {
            e["type"] == "notification"
                && e["params"]["update"]["sessionUpdate"] == "agent_message_chunk"
        })
        .await;
    }
    peer.settle(Duration::from_millis(300)).await;
    let history: Vec<Value> = peer.updates().into_iter().cloned().collect();
    assert_eq!(
        chunk_text(&history[0], "user_message_chunk"),
        Some("hello there"),
        "{history:#?}"
    );
    assert_eq!(
        agent_text(&history),
        acp::mock_reply("hello there"),
        "{history:#?}"
    );
    assert_eq!(
        history
            .iter()
            .filter(|u| u["sessionUpdate"] == "user_message_chunk")
            .count(),
        1,
        "{history:#?}"
    );
    // The first client got nothing of it.
    let replayed_to_first = quiet_events(&mut stream, Duration::from_millis(800)).await;
    assert!(
        replayed_to_first.iter().all(|e| e.update_kind().is_none()),
        "the first client received the history again: {replayed_to_first:#?}"
    );

    // Live updates reach both, once.
    let reply = server.prompt(&conn, &session, json!(6), "again").await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
    let last = acp::mock_reply_chunks("again")
        .last()
        .cloned()
        .unwrap_or_default();
    let live = stream
        .collect_until(|e| e.agent_text() == Some(last.as_str()), EVENT_TIMEOUT)
        .await;
    let live_text: String = live.iter().filter_map(|e| e.agent_text()).collect();
    assert_eq!(live_text, acp::mock_reply("again"));
    peer.until(|e| e["params"]["update"]["content"]["text"] == last.as_str())
        .await;
    peer.settle(Duration::from_millis(300)).await;
    let updates: Vec<Value> = peer.updates().into_iter().cloned().collect();
    assert_eq!(
        agent_text(&updates[history.len()..]),
        acp::mock_reply("again"),
        "{updates:#?}"
    );
    peer.exit().await;
}

/// `_sandboxagent/session/attach` while a turn streams (the SDK client
/// attaches mid-turn): the replay and the live updates join with no gap
/// and no duplicate; `none` replays nothing; `{sinceOffset}` replays from
/// that log offset; bad params and unknown sessions get clear errors. The
/// method is advertised in `initialize`.
#[tokio::test]
async fn attach_mid_turn_joins_history_and_live_without_gap_or_duplicate() {
    let server = TestServer::start(&[]).await;
    let reply = server.initialize_reply("mock").await;
    let extensions =
        &reply.json()["result"]["agentCapabilities"]["_meta"]["sandboxagent.dev"]["extensions"];
    assert_eq!(extensions["sessionAttach"], true, "{extensions}");
    assert_eq!(
        extensions["requestResolvedNotification"], true,
        "{extensions}"
    );
    assert!(
        extensions["methods"]
            .as_array()
            .is_some_and(|m| m.contains(&json!(ATTACH))),
        "{extensions}"
    );
    let conn = reply.connection_id().expect("connection id");
    let session = server.new_session(&conn).await;
    let mut stream = server.open_stream(&conn, None).await;
    let (api, c, s) = (server.api(), conn.clone(), session.clone());
    let turn = tokio::spawn(async move { api.prompt(&c, &s, json!(7), "!slow 40 60").await });
    stream
        .next_event_matching(|e| e.agent_text() == Some("chunk-3 "), EVENT_TIMEOUT)
        .await;

    let mut peer = SdkPeer::start(&server, "mock").await;
    let attached = peer
        .request(
            ATTACH,
            json!({"sessionId": session, "role": "controller", "historyPolicy": "full"}),
        )
        .await;
    assert_eq!(attached["type"], "response", "{attached}");
    assert_eq!(attached["result"]["role"], "controller");
    assert_eq!(attached["result"]["modes"]["currentModeId"], "default");
    assert!(
        attached["result"]["replayed"]
            .as_u64()
            .is_some_and(|n| n >= 4),
        "{attached}"
    );
    let reply = v2_api_tests::join_within(turn, EVENT_TIMEOUT).await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
    peer.until(|e| e["params"]["update"]["content"]["text"] == "chunk-40 ")
        .await;
    peer.settle(Duration::from_millis(300)).await;
    let updates: Vec<Value> = peer.updates().into_iter().cloned().collect();
    assert_eq!(
        chunk_text(&updates[0], "user_message_chunk"),
        Some("!slow 40 60")
    );
    assert_eq!(
        agent_text(&updates),
        acp::slow_chunks(40).concat(),
        "history then live, each chunk once: {updates:#?}"
    );

    // `none`: nothing replayed, the next offset is the log's end.
    let conn_b = server.initialize("mock").await;
    let mut stream_b = server.open_stream(&conn_b, None).await;
    let none = server
        .rpc(
            &conn_b,
            1,
            ATTACH,
            json!({"sessionId": session, "historyPolicy": "none"}),
        )
        .await;
    let count = server
        .get_json(&format!("/v2/sessions/{session}"))
        .await["_meta"]["sandboxagent.dev"]["eventCount"]
        .as_u64()
        .expect("eventCount");
    assert_eq!(none["result"]["replayed"], 0, "{none}");
    assert_eq!(none["result"]["nextOffset"], count, "{none}");
    assert!(
        quiet_events(&mut stream_b, Duration::from_millis(500))
            .await
            .is_empty()
    );

    // `{sinceOffset}`: only the turn that starts there.
    let reply = server
        .prompt(&conn, &session, json!(8), "second turn")
        .await;
    assert_eq!(stop_reason(&reply), Some("end_turn"));
    let log = server
        .get_json(&format!("/v2/sessions/{session}/events?limit=1000"))
        .await;
    let since = log["events"]
        .as_array()
        .and_then(|events| {
            events.iter().find(|e| {
                e["message"]["method"] == "session/prompt"
                    && e["message"]["params"]["prompt"][0]["text"] == "second turn"
            })
        })
        .map(|e| e["offset"].clone())
        .expect("the second prompt in the log");
    let conn_c = server.initialize("mock").await;
    let mut stream_c = server.open_stream(&conn_c, None).await;
    let partial = server
        .rpc(
            &conn_c,
            1,
            ATTACH,
            json!({"sessionId": session, "historyPolicy": {"sinceOffset": since}}),
        )
        .await;
    assert_eq!(
        partial["result"]["nextOffset"], log["nextOffset"],
        "{partial}"
    );
    let replay = quiet_events(&mut stream_c, Duration::from_millis(500)).await;
    let kinds: Vec<&str> = replay.iter().filter_map(|e| e.update_kind()).collect();
    assert_eq!(kinds.first(), Some(&"user_message_chunk"), "{replay:#?}");
    let text: String = replay.iter().filter_map(|e| e.agent_text()).collect();
    assert_eq!(text, acp::mock_reply("second turn"), "{replay:#?}");

    // Clear errors for bad input.
    for (params, code) in [
        (
            json!({"sessionId": session, "historyPolicy": "sometimes"}),
            -32602,
        ),
        (json!({"sessionId": session, "role": "admin"}), -32602),
        (
            json!({"sessionId": session, "historyPolicy": {"sinceOffset": -1}}),
            -32602,
        ),
        (json!({"role": "observer"}), -32602),
        (json!({"sessionId": "no-such-session"}), -32002),
    ] {
        let answer = server.rpc(&conn_c, 2, ATTACH, params.clone()).await;
        assert_eq!(answer["error"]["code"], code, "{params} → {answer}");
    }
    peer.exit().await;
}

/// A log that dropped its oldest events (`--event-log-events 6`): the
/// replay starts with the gap marker naming the missing offsets.
#[tokio::test]
async fn a_capped_log_replays_from_a_gap_marker() {
    let server = TestServer::start(&["--event-log-events", "6"]).await;
    let conn = server.initialize("mock").await;
    let session = server.new_session(&conn).await;
    let reply = server
        .prompt(&conn, &session, json!(5), "one two three four five six")
        .await;
    assert_eq!(stop_reason(&reply), Some("end_turn"));
    let log = server
        .get_json(&format!("/v2/sessions/{session}/events"))
        .await;
    let first_kept = log["events"][0]["offset"].as_u64().expect("an event");
    assert!(first_kept > 0, "{log}");
    let conn_b = server.initialize("mock").await;
    let mut stream_b = server.open_stream(&conn_b, None).await;
    let attached = server
        .rpc(&conn_b, 1, ATTACH, json!({"sessionId": session}))
        .await;
    assert!(attached.get("result").is_some(), "{attached}");
    let first = stream_b.next_event(EVENT_TIMEOUT).await;
    assert_eq!(
        first.method(),
        Some("_sandboxagent/stream/gap"),
        "{first:?}"
    );
    assert_eq!(
        first.params(),
        &json!({"from": 0, "to": first_kept - 1, "sessionId": session})
    );
    let second = stream_b.next_event(EVENT_TIMEOUT).await;
    assert_eq!(
        second.update_kind(),
        Some("agent_message_chunk"),
        "{second:?}"
    );
}

/// Observers (the SDK client) receive every update but no agent request;
/// their prompt, config and metadata changes get `-32003` naming the role,
/// and their notifications that would steer (`session/cancel`, terminate,
/// set_metadata) are dropped; the controller's permission round trip is
/// unaffected.
#[tokio::test]
async fn observers_see_updates_but_get_no_requests_and_cannot_steer() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize("mock").await;
    let session = server.new_session(&conn).await;
    let mut stream = server.open_stream(&conn, None).await;
    let mut peer = SdkPeer::start(&server, "mock").await;
    let attached = peer
        .request(
            ATTACH,
            json!({"sessionId": session, "role": "observer", "historyPolicy": "none"}),
        )
        .await;
    assert_eq!(attached["result"]["role"], "observer", "{attached}");

    let (api, c, s) = (server.api(), conn.clone(), session.clone());
    let turn = tokio::spawn(async move { api.prompt(&c, &s, json!(9), "permission please").await });
    let request = stream
        .next_event_matching(
            |e| e.method() == Some("session/request_permission"),
            EVENT_TIMEOUT,
        )
        .await;
    peer.until(|e| e["params"]["update"]["sessionUpdate"] == "tool_call")
        .await;
    for (method, params) in [
        ("session/prompt", acp::prompt_params(&session, "may I?")),
        (
            "session/set_mode",
            json!({"sessionId": session, "modeId": "plan"}),
        ),
        (
            "_sandboxagent/session/set_metadata",
            json!({"sessionId": session, "metadata": {"title": "mine"}}),
        ),
    ] {
        let refused = peer.request(method, params).await;
        assert_eq!(refused["type"], "error", "{refused}");
        assert_eq!(refused["error"]["code"], -32003, "{refused}");
        assert_eq!(refused["error"]["data"]["role"], "observer", "{refused}");
        assert_eq!(refused["error"]["data"]["method"], method, "{refused}");
    }
    // Notifications have no answer: the observer's are dropped.
    for method in [
        "session/cancel",
        "_sandboxagent/session/terminate",
        "_sandboxagent/session/set_metadata",
    ] {
        peer.send(json!({"op": "notify", "method": method,
            "params": {"sessionId": session, "metadata": {"title": "mine"}}}))
            .await;
        peer.until(|e| e["type"] == "notified" && e["method"] == method)
            .await;
    }
    server
        .post(
            Some(&conn),
            &acp::permission_answer(request.data["id"].clone(), "allow-once"),
        )
        .await
        .assert_status(202);
    let reply = v2_api_tests::join_within(turn, EVENT_TIMEOUT).await;
    assert_eq!(
        stop_reason(&reply),
        Some("end_turn"),
        "the observer's cancel was dropped: {reply}"
    );
    peer.until(|e| e["params"]["update"]["content"]["text"] == "granted.")
        .await;
    peer.settle(Duration::from_millis(300)).await;
    assert!(
        !peer.seen.iter().any(|e| e["type"] == "permission"),
        "the observer got the agent's request: {:#?}",
        peer.seen
    );
    let entry = server.get_json(&format!("/v2/sessions/{session}")).await;
    assert_ne!(entry["title"], "mine", "{entry}");
    assert_eq!(
        entry["_meta"]["sandboxagent.dev"]["ended"], false,
        "{entry}"
    );
    peer.exit().await;
}

/// An agent request goes to every controller (a `/v2/rpc` client and the
/// SDK client, which attached with `session/load`); the SDK client answers
/// first and wins; the other gets `_sandboxagent/request/resolved` with the
/// outcome, and its late answer is dropped.
#[tokio::test]
async fn the_first_answer_wins_and_the_other_controllers_hear_resolved() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize("mock").await;
    let session = server.new_session(&conn).await;
    let mut stream = server.open_stream(&conn, None).await;
    let mut peer = SdkPeer::start(&server, "mock").await;
    let loaded = peer.request("session/load", load_params(&session)).await;
    assert_eq!(loaded["type"], "response", "{loaded}");

    let (api, c, s) = (server.api(), conn.clone(), session.clone());
    let turn =
        tokio::spawn(async move { api.prompt(&c, &s, json!(11), "permission please").await });
    let request = stream
        .next_event_matching(
            |e| e.method() == Some("session/request_permission"),
            EVENT_TIMEOUT,
        )
        .await;
    let asked = peer.until(|e| e["type"] == "permission").await;
    assert_eq!(asked["params"]["sessionId"], session.as_str());
    peer.send(json!({"op": "answer", "optionId": "allow-once"}))
        .await;
    let resolved = stream
        .next_event_matching(|e| e.method() == Some(RESOLVED), EVENT_TIMEOUT)
        .await;
    assert_eq!(
        resolved.params(),
        &json!({"sessionId": session, "requestId": request.data["id"], "outcome": {"outcome": "selected", "optionId": "allow-once"}})
    );
    // Too late: dropped, the agent got exactly one answer.
    server
        .post(
            Some(&conn),
            &acp::permission_answer(request.data["id"].clone(), "reject-once"),
        )
        .await
        .assert_status(202);
    let reply = v2_api_tests::join_within(turn, EVENT_TIMEOUT).await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
    let log = server
        .get_json(&format!("/v2/sessions/{session}/events?limit=1000"))
        .await;
    let answers: Vec<&Value> = log["events"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| {
            e["direction"] == "client_to_agent"
                && e["message"]["id"] == request.data["id"]
                && e["message"].get("method").is_none()
        })
        .collect();
    assert_eq!(answers.len(), 1, "{answers:#?}");
    assert_eq!(
        answers[0]["message"]["result"]["outcome"]["optionId"],
        "allow-once"
    );
    let text: String = log["events"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["message"]["params"]["update"]["content"]["text"].as_str())
        .collect();
    assert!(text.contains("Permission granted."), "{text}");
    peer.settle(Duration::from_millis(300)).await;
    assert!(
        !peer.seen.iter().any(|e| e["method"] == RESOLVED),
        "the winner heard resolved: {:#?}",
        peer.seen
    );
    peer.exit().await;
}

/// A session that ends (terminate) while its permission request is open:
/// the runtime answers the agent `cancelled` (in the log) instead of
/// leaving it waiting, and both controllers hear `request/resolved`.
#[tokio::test]
async fn an_ended_session_answers_its_open_agent_requests() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize("mock").await;
    let session = server.new_session(&conn).await;
    let mut stream = server.open_stream(&conn, None).await;
    let mut peer = SdkPeer::start(&server, "mock").await;
    let loaded = peer.request("session/load", load_params(&session)).await;
    assert_eq!(loaded["type"], "response", "{loaded}");
    let (api, c, s) = (server.api(), conn.clone(), session.clone());
    let turn =
        tokio::spawn(async move { api.prompt(&c, &s, json!(12), "permission please").await });
    let request = stream
        .next_event_matching(
            |e| e.method() == Some("session/request_permission"),
            EVENT_TIMEOUT,
        )
        .await;
    peer.until(|e| e["type"] == "permission").await;
    let terminated = server
        .rpc(
            &conn,
            13,
            "_sandboxagent/session/terminate",
            json!({"sessionId": session}),
        )
        .await;
    assert_eq!(terminated["result"]["alreadyEnded"], false, "{terminated}");
    let resolved = stream
        .next_event_matching(|e| e.method() == Some(RESOLVED), EVENT_TIMEOUT)
        .await;
    assert_eq!(
        resolved.params(),
        &json!({"sessionId": session, "requestId": request.data["id"], "outcome": {"outcome": "cancelled"}})
    );
    let heard = peer.until(|e| e["method"] == RESOLVED).await;
    assert_eq!(
        heard["params"]["outcome"]["outcome"], "cancelled",
        "{heard}"
    );
    let reply = v2_api_tests::join_within(turn, EVENT_TIMEOUT).await;
    assert_eq!(stop_reason(&reply), Some("cancelled"), "{reply}");
    let log = server
        .get_json(&format!("/v2/sessions/{session}/events?limit=1000"))
        .await;
    let answered = log["events"].as_array().into_iter().flatten().any(|e| {
        e["direction"] == "client_to_agent"
            && e["message"]["id"] == request.data["id"]
            && e["message"]["result"]["outcome"]["outcome"] == "cancelled"
    });
    assert!(answered, "the runtime answered the request: {log:#}");
    peer.exit().await;
}

/// An agent that withdraws a request without a session
/// (`$/cancel_request`): the cancel goes to the connection that received
/// the request, not to whoever sent the agent a request since.
#[tokio::test]
async fn a_session_less_cancel_goes_to_the_connection_that_got_the_request() {
    let script = workspace_root().join("tests/v2_api/fixtures/asking_agent.mjs");
    let command = format!("asker=node {}", shell_quote(&script.to_string_lossy()));
    let server = TestServer::start(&["--agent-command", &command]).await;
    let conn_a = server.initialize("asker").await;
    let mut stream_a = server.open_stream(&conn_a, None).await;
    let asked = server.rpc(&conn_a, 1, "_fake/ask", json!({})).await;
    assert!(asked.get("result").is_some(), "{asked}");
    let request = stream_a
        .next_event_matching(|e| e.method() == Some("_fake/question"), EVENT_TIMEOUT)
        .await;
    let conn_b = server.initialize("asker").await;
    let mut stream_b = server.open_stream(&conn_b, None).await;
    let withdrawn = server.rpc(&conn_b, 2, "_fake/withdraw", json!({})).await;
    assert!(withdrawn.get("result").is_some(), "{withdrawn}");
    let cancel = stream_a
        .next_event_matching(|e| e.method() == Some("$/cancel_request"), EVENT_TIMEOUT)
        .await;
    assert_eq!(cancel.params()["requestId"], request.data["id"]);
    let at_b = quiet_events(&mut stream_b, Duration::from_millis(500)).await;
    assert!(
        at_b.iter().all(|e| e.method() != Some("$/cancel_request")),
        "the cancel went to the latest requester: {at_b:#?}"
    );
}

/// The seam under a flood: a client attaches (`full`) while the agent
/// writes 20,000 updates as fast as it can; it gets each of them exactly
/// once (history, then live) and no gap marker.
#[tokio::test]
async fn attach_during_a_flood_gets_every_update_once() {
    const UPDATES: usize = 20_000;
    let server =
        TestServer::start(&["--event-log-events", "100000", "--replay-buffer", "100000"]).await;
    let conn = server.initialize("mock").await;
    let session = server.new_session(&conn).await;
    let mut stream = server.open_stream(&conn, None).await;
    let conn_b = server.initialize("mock").await;
    let mut stream_b = server.open_stream(&conn_b, None).await;
    let (api, c, s) = (server.api(), conn.clone(), session.clone());
    let text = format!("!emit {UPDATES} 8");
    let turn = tokio::spawn(async move { api.prompt(&c, &s, json!(3), &text).await });
    stream
        .next_event_matching(
            |e| e.update_kind() == Some("agent_message_chunk"),
            EVENT_TIMEOUT,
        )
        .await;
    let attached = server
        .rpc(&conn_b, 1, ATTACH, json!({"sessionId": session}))
        .await;
    let replayed = attached["result"]["replayed"].as_u64().expect("replayed");
    let reply = v2_api_tests::join_within(turn, EVENT_TIMEOUT).await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
    let (mut chunks, mut prompts, mut gaps) = (0, 0, 0);
    while chunks < UPDATES {
        match stream_b.try_next(Duration::from_secs(5)).await {
            Next::Event(event) => match (event.method(), event.update_kind()) {
                (_, Some("agent_message_chunk")) => chunks += 1,
                (_, Some("user_message_chunk")) => prompts += 1,
                (Some("_sandboxagent/stream/gap"), _) => gaps += 1,
                _ => {}
            },
            other => panic!("after {chunks} chunks: {other:?}"),
        }
    }
    let extra = quiet_events(&mut stream_b, Duration::from_millis(500)).await;
    assert!(
        extra
            .iter()
            .all(|e| e.update_kind() != Some("agent_message_chunk")),
        "duplicates after {UPDATES}: {} more",
        extra.len()
    );
    assert_eq!((prompts, gaps), (1, 0));
    assert!(
        replayed > 1 && replayed < UPDATES as u64,
        "attached mid-flood: {replayed} replayed"
    );
}

/// What memory no longer holds comes from the store (SQLite, the default):
/// with `--event-log-bytes 20000` memory keeps a few of a turn's 400
/// updates, and an attach still replays every one, in order, with no gap
/// marker.
#[tokio::test]
async fn the_replay_reads_what_memory_dropped_from_the_store() {
    const UPDATES: usize = 400;
    let server = TestServer::start(&["--event-log-bytes", "20000"]).await;
    let conn = server.initialize("mock").await;
    let session = server.new_session(&conn).await;
    let reply = server
        .prompt(&conn, &session, json!(3), &format!("!emit {UPDATES} 500"))
        .await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
    // Wait until the writer has stored the turn.
    let deadline = Instant::now() + EVENT_TIMEOUT;
    loop {
        let health = server.get_json("/v2/health").await;
        if health["storeWaiting"] == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the store did not catch up: {health}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let conn_b = server.initialize("mock").await;
    let mut stream_b = server.open_stream(&conn_b, None).await;
    let attached = server
        .rpc(&conn_b, 1, ATTACH, json!({"sessionId": session}))
        .await;
    assert!(attached.get("result").is_some(), "{attached}");
    let replay = quiet_events(&mut stream_b, Duration::from_millis(800)).await;
    assert_eq!(
        replay.first().and_then(SseEvent::update_kind),
        Some("user_message_chunk"),
        "{:#?}",
        replay.first()
    );
    let chunks = replay
        .iter()
        .filter(|e| e.update_kind() == Some("agent_message_chunk"))
        .count();
    let gaps = replay
        .iter()
        .filter(|e| e.method() == Some("_sandboxagent/stream/gap"))
        .count();
    assert_eq!((chunks, gaps), (UPDATES, 0));
    assert_eq!(attached["result"]["replayed"], UPDATES + 1);
}
