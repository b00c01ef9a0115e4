//! `sandbox-agent bridge`, driven through its stdio as an editor
//! drives it, against the real server over real HTTP: a full turn with a
//! permission request, a dropped event stream resumed mid-turn, stdin EOF
//! cleanup, and the failures an editor must be told about.

use std::time::Duration;

use serde_json::{Value, json};
use v2_api_tests::acp::{
    initialize_params, mock_reply_chunks, permission_answer, prompt_params, request, slow_chunks,
    stop_reason, word_chunks,
};
use v2_api_tests::{BridgeProcess, CutProxy, MOCK, TestServer};

/// How long a bridge may take to exit after its stdin closed or after a
/// fatal failure.
const EXIT_TIMEOUT: Duration = Duration::from_secs(20);

/// `initialize` as an editor sends it: no `_meta`, the bridge adds the agent.
fn editor_initialize(id: u64) -> Value {
    request(
        id,
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {"fs": {"readTextFile": false, "writeTextFile": false}, "terminal": false}}),
    )
}

/// `session/new` as an editor sends it: no agent in `_meta`.
fn editor_new_session(id: u64) -> Value {
    request(id, "session/new", json!({"cwd": "/tmp", "mcpServers": []}))
}

/// Initializes and opens a session through the bridge; returns the
/// session id.
async fn open_session(bridge: &mut BridgeProcess) -> String {
    let init = bridge.call(&editor_initialize(1)).await;
    assert_eq!(
        init["result"]["agentInfo"]["name"], "sandbox-agent-mock",
        "{init}"
    );
    let new = bridge.call(&editor_new_session(2)).await;
    let Some(session) = new["result"]["sessionId"].as_str() else {
        panic!("session/new through the bridge: {new}");
    };
    session.to_owned()
}

/// The `agent_message_chunk` texts among `messages`, in order.
fn chunk_texts(messages: &[Value]) -> Vec<String> {
    messages
        .iter()
        .filter(|m| m["method"] == "session/update")
        .filter(|m| m["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|m| m["params"]["update"]["content"]["text"].as_str())
        .map(str::to_owned)
        .collect()
}

/// A port on 127.0.0.1 that nothing listens on.
async fn closed_port() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a probe listener");
    let port = listener.local_addr().expect("probe address").port();
    drop(listener);
    port
}

#[tokio::test]
async fn a_full_turn_with_a_permission_request_answered_through_stdio() {
    let server = TestServer::start(&[]).await;
    let mut bridge = BridgeProcess::start(server.base_url(), MOCK, &[], &[]);

    let init = bridge.call(&editor_initialize(1)).await;
    assert_eq!(init["jsonrpc"], "2.0");
    assert_eq!(init["result"]["protocolVersion"], 1, "{init}");

    // The editor names another agent and keeps its own `_meta` keys: the
    // bridge's agent wins, everything else passes through.
    let new = bridge
        .call(&request(
            2,
            "session/new",
            json!({"cwd": "/tmp", "mcpServers": [],
                   "_meta": {"sandboxagent.dev": {"agent": "codex", "variant": "fast"}, "zed.dev": {"x": 1}}}),
        ))
        .await;
    let meta = &new["result"]["_meta"]["sandboxagent.dev"];
    assert_eq!(meta["agent"], MOCK, "{new}");
    assert_eq!(meta["variant"], "fast", "{new}");
    let session = new["result"]["sessionId"]
        .as_str()
        .unwrap_or_else(|| panic!("no session id: {new}"))
        .to_owned();

    bridge
        .send(&request(
            3,
            "session/prompt",
            prompt_params(&session, "please ask for permission"),
        ))
        .await;
    // The agent's request reaches the editor on stdout, with its own id.
    let mut before = Vec::new();
    let ask = loop {
        let message = bridge.next().await;
        if message["method"] == "session/request_permission" {
            break message;
        }
        assert!(
            message.get("id").is_none(),
            "no answer before the permission: {message}"
        );
        before.push(message);
    };
    assert!(ask.get("id").is_some_and(|id| !id.is_null()), "{ask}");
    assert_eq!(ask["params"]["sessionId"], session.as_str());
    let options: Vec<&str> = ask["params"]["options"]
        .as_array()
        .map(|o| o.iter().filter_map(|o| o["optionId"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(options, ["allow-once", "reject-once"], "{ask}");
    assert!(
        before
            .iter()
            .any(|m| m["params"]["update"]["sessionUpdate"] == "tool_call"),
        "the tool call comes first: {before:?}"
    );

    // The editor's answer goes back through stdin.
    bridge
        .send(&permission_answer(ask["id"].clone(), "allow-once"))
        .await;
    let (done, after) = bridge.until_response(&json!(3)).await;
    assert_eq!(stop_reason(&done), Some("end_turn"), "{done}");
    assert_eq!(chunk_texts(&after), word_chunks("Permission granted."));
    assert!(
        after.iter().any(
            |m| m["params"]["update"]["sessionUpdate"] == "tool_call_update"
                && m["params"]["update"]["status"] == "completed"
        ),
        "{after:?}"
    );

    bridge.close_stdin();
    assert!(bridge.wait_exit(EXIT_TIMEOUT).await.success());
}

#[tokio::test]
async fn a_dropped_stream_resumes_mid_turn_without_lost_or_repeated_updates() {
    let server = TestServer::start(&[]).await;
    let proxy = CutProxy::start(server.addr()).await;
    let mut bridge = BridgeProcess::start(&proxy.url(), MOCK, &[], &[]);
    let session = open_session(&mut bridge).await;

    bridge
        .send(&request(
            3,
            "session/prompt",
            prompt_params(&session, "!slow 30 50"),
        ))
        .await;
    let mut seen = Vec::new();
    let mut cuts = 0;
    let done = loop {
        let message = bridge.next().await;
        if message["id"] == 3 && message.get("method").is_none() {
            break message;
        }
        seen.push(message);
        let chunks = chunk_texts(&seen).len();
        // Cut everything (the event stream and the prompt's own POST) twice
        // mid-turn.
        if (chunks == 5 && cuts == 0) || (chunks == 18 && cuts == 1) {
            assert!(proxy.cut() > 0, "nothing to cut");
            cuts += 1;
        }
    };
    assert_eq!(cuts, 2);
    assert_eq!(stop_reason(&done), Some("end_turn"), "{done}");
    assert_eq!(
        chunk_texts(&seen),
        slow_chunks(30),
        "the editor saw a gap or a repeat"
    );
    let resumes: Vec<_> = proxy
        .heads()
        .into_iter()
        .filter(|h| h.method == "GET" && h.last_event_id.as_deref().is_some_and(|id| id != "0"))
        .collect();
    assert!(
        !resumes.is_empty(),
        "no GET resumed with Last-Event-ID: {:?}",
        proxy.heads()
    );

    bridge.close_stdin();
    assert!(bridge.wait_exit(EXIT_TIMEOUT).await.success());
}

#[tokio::test]
async fn stdin_eof_answers_what_was_asked_closes_the_connection_and_exits_zero() {
    let server = TestServer::start(&[]).await;
    let proxy = CutProxy::start(server.addr()).await;
    let mut bridge = BridgeProcess::start(&proxy.url(), MOCK, &[], &[]);
    let session = open_session(&mut bridge).await;
    let connection = proxy
        .connection_id()
        .unwrap_or_else(|| panic!("no request carried a connection id: {:?}", proxy.heads()));

    // EOF right after a prompt: the turn still reaches stdout, then the
    // bridge closes the connection and exits.
    bridge
        .send(&request(
            3,
            "session/prompt",
            prompt_params(&session, "hello"),
        ))
        .await;
    bridge.close_stdin();
    let (done, updates) = bridge.until_response(&json!(3)).await;
    assert_eq!(stop_reason(&done), Some("end_turn"), "{done}");
    assert_eq!(chunk_texts(&updates), mock_reply_chunks("hello"));
    let status = bridge.wait_exit(EXIT_TIMEOUT).await;
    assert!(status.success(), "{status:?}\n{}", bridge.stderr_text());
    assert_eq!(
        bridge.rest_of_stdout(EXIT_TIMEOUT).await,
        Vec::<String>::new()
    );
    assert!(
        proxy.heads().iter().any(
            |h| h.method == "DELETE" && h.connection_id.as_deref() == Some(connection.as_str())
        ),
        "no DELETE for {connection}: {:?}",
        proxy.heads()
    );
    // The runtime no longer knows the connection.
    server
        .post(Some(&connection), &request(9, "session/list", json!({})))
        .await
        .assert_status(404);
}

#[tokio::test]
async fn sigterm_closes_the_connection_without_waiting_for_the_turn() {
    let server = TestServer::start(&[]).await;
    let proxy = CutProxy::start(server.addr()).await;
    let mut bridge = BridgeProcess::start(&proxy.url(), MOCK, &[], &[]);
    let session = open_session(&mut bridge).await;
    let connection = proxy.connection_id();
    bridge
        .send(&request(
            3,
            "session/prompt",
            prompt_params(&session, "!stall"),
        ))
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    bridge.signal(nix::sys::signal::Signal::SIGTERM);
    let status = bridge.wait_exit(EXIT_TIMEOUT).await;
    assert!(status.success(), "{status:?}\n{}", bridge.stderr_text());
    assert!(
        proxy
            .heads()
            .iter()
            .any(|h| h.method == "DELETE" && h.connection_id == connection),
        "{:?}",
        proxy.heads()
    );
}

#[tokio::test]
async fn an_unreachable_runtime_fails_the_request_with_a_hint_and_exits_non_zero() {
    let url = format!("http://127.0.0.1:{}", closed_port().await);
    let mut bridge = BridgeProcess::start(&url, MOCK, &[], &[]);

    let answer = bridge.call(&editor_initialize(1)).await;
    assert_eq!(answer["error"]["code"], -32603, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert_eq!(
        message,
        format!(
            "cannot reach the sandbox-agent runtime at {url}: connection refused; \
             is `sandbox-agent server` running there?"
        ),
        "{answer}"
    );
    let status = bridge.wait_exit(EXIT_TIMEOUT).await;
    assert!(!status.success(), "{status:?}");
    assert!(
        bridge.stderr_text().contains(message),
        "the exit message is on stderr too"
    );
    assert_eq!(
        bridge.rest_of_stdout(EXIT_TIMEOUT).await,
        Vec::<String>::new()
    );
}

#[tokio::test]
async fn a_url_the_bridge_cannot_use_is_reported_on_the_first_request() {
    let mut bridge = BridgeProcess::start("ftp://example.invalid", MOCK, &[], &[]);
    // Notifications get nothing; the first request gets the reason.
    bridge
        .send(&json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {}}))
        .await;
    let answer = bridge.call(&editor_initialize(7)).await;
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("invalid --url") && message.contains("http or https"),
        "{answer}"
    );
    assert!(!bridge.wait_exit(EXIT_TIMEOUT).await.success());
}

#[tokio::test]
async fn a_rejected_or_missing_token_fails_the_request_with_a_hint_and_exits_non_zero() {
    let server = TestServer::start(&["--token", "s3cret"]).await;

    let mut wrong = BridgeProcess::start(
        server.base_url(),
        MOCK,
        &["--token", "tok-7f3a9c-wrong"],
        &[],
    );
    let answer = wrong.call(&editor_initialize(1)).await;
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("rejected the token (401)") && message.contains("--token"),
        "{answer}"
    );
    assert_eq!(answer["error"]["data"]["httpStatus"], 401, "{answer}");
    assert!(!wrong.wait_exit(EXIT_TIMEOUT).await.success());
    assert!(
        !wrong.stderr_text().contains("tok-7f3a9c"),
        "the token is never logged"
    );

    // Also when stdin closes right after the request.
    let mut missing = BridgeProcess::start(server.base_url(), MOCK, &[], &[]);
    missing.send(&editor_initialize(1)).await;
    missing.close_stdin();
    let answer = missing.next().await;
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("requires a token (401)") && message.contains("SANDBOX_AGENT_TOKEN"),
        "{answer}"
    );
    assert!(!missing.wait_exit(EXIT_TIMEOUT).await.success());

    // The right token, from the environment as an editor's settings pass it.
    let mut right = BridgeProcess::start(
        server.base_url(),
        MOCK,
        &[],
        &[("SANDBOX_AGENT_TOKEN", "s3cret")],
    );
    open_session(&mut right).await;
    right.close_stdin();
    assert!(right.wait_exit(EXIT_TIMEOUT).await.success());
}

#[tokio::test]
async fn a_line_that_is_not_json_gets_a_parse_error_and_the_bridge_goes_on() {
    let server = TestServer::start(&[]).await;
    let mut bridge = BridgeProcess::start(server.base_url(), MOCK, &[], &[]);

    bridge.send_line("this is not json").await;
    let answer = bridge.next().await;
    assert_eq!(answer["jsonrpc"], "2.0");
    assert_eq!(answer["id"], Value::Null, "{answer}");
    assert_eq!(answer["error"]["code"], -32700, "{answer}");

    // JSON, but not a JSON-RPC message: invalid request, with its id.
    bridge.send_line(r#"{"id": 4, "params": {}}"#).await;
    let answer = bridge.next().await;
    assert_eq!(answer["id"], 4, "{answer}");
    assert_eq!(answer["error"]["code"], -32600, "{answer}");

    // Blank lines are ignored; the bridge still works.
    bridge.send_line("").await;
    open_session(&mut bridge).await;
    bridge.close_stdin();
    assert!(bridge.wait_exit(EXIT_TIMEOUT).await.success());
}

#[tokio::test]
async fn refused_requests_carry_the_http_status_and_problem_detail() {
    let server = TestServer::start(&[]).await;

    // An agent the runtime does not have: 404, the detail names the known ones.
    let mut unknown = BridgeProcess::start(server.base_url(), "no-such-agent", &[], &[]);
    let answer = unknown.call(&editor_initialize(1)).await;
    assert_eq!(answer["error"]["code"], -32603, "{answer}");
    assert_eq!(answer["error"]["data"]["httpStatus"], 404, "{answer}");
    assert_eq!(
        answer["error"]["data"]["problem"]["type"],
        "urn:sandbox-agent:error:unknown-agent"
    );
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("no-such-agent") && message.contains(MOCK) && message.contains("--agent"),
        "{answer}"
    );
    // Not fatal: the editor decides; EOF ends the bridge normally.
    unknown.close_stdin();
    assert!(unknown.wait_exit(EXIT_TIMEOUT).await.success());

    // A 400 (a `cwd` longer than a session keeps): status and detail, and
    // the next request works.
    let mut bridge = BridgeProcess::start(server.base_url(), MOCK, &[], &[]);
    let init = bridge
        .call(&request(1, "initialize", initialize_params(MOCK)))
        .await;
    assert!(init["result"].is_object(), "{init}");
    let long_cwd = format!("/{}", "a".repeat(5000));
    let answer = bridge
        .call(&request(
            2,
            "session/new",
            json!({"cwd": long_cwd, "mcpServers": []}),
        ))
        .await;
    assert_eq!(answer["error"]["data"]["httpStatus"], 400, "{answer}");
    let detail = answer["error"]["data"]["problem"]["detail"]
        .as_str()
        .unwrap_or_default();
    assert!(
        !detail.is_empty()
            && answer["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("HTTP 400") && m.contains(detail)),
        "{answer}"
    );
    // By-position params never leave the bridge: its own parse answers
    // them (research/contract.md, "Transport: /v2/rpc").
    let array = bridge
        .call(&request(4, "session/new", json!(["not", "an", "object"])))
        .await;
    assert_eq!(array["error"]["code"], -32600, "{array}");
    let new = bridge.call(&editor_new_session(3)).await;
    assert!(new["result"]["sessionId"].is_string(), "{new}");
    bridge.close_stdin();
    assert!(bridge.wait_exit(EXIT_TIMEOUT).await.success());
}

#[tokio::test]
async fn a_stream_lost_for_good_fails_every_waiting_request_and_exits_non_zero() {
    let server = TestServer::start(&[]).await;
    let proxy = CutProxy::start(server.addr()).await;
    let mut bridge = BridgeProcess::start(&proxy.url(), MOCK, &["--reconnect-attempts", "2"], &[]);
    let first = open_session(&mut bridge).await;
    let second = bridge.call(&editor_new_session(4)).await;
    let second = second["result"]["sessionId"]
        .as_str()
        .unwrap_or_default()
        .to_owned();

    // Two turns that wait until cancelled; then the runtime becomes
    // unreachable for good.
    bridge
        .send(&request(
            3,
            "session/prompt",
            prompt_params(&first, "!stall"),
        ))
        .await;
    bridge
        .send(&request(
            5,
            "session/prompt",
            prompt_params(&second, "!stall"),
        ))
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.refuse(true);
    assert!(proxy.cut() > 0);

    let mut answers = vec![bridge.next().await, bridge.next().await];
    answers.sort_by_key(|a| a["id"].as_u64());
    for (answer, id) in answers.iter().zip([3, 5]) {
        assert_eq!(answer["id"], id, "{answers:?}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("lost the event stream")
                && message.contains("2 reconnect attempts failed")
                && message.contains(&proxy.url()),
            "{answer}"
        );
    }
    let status = bridge.wait_exit(EXIT_TIMEOUT).await;
    assert!(!status.success(), "{status:?}");
    assert_eq!(
        bridge.rest_of_stdout(EXIT_TIMEOUT).await,
        Vec::<String>::new()
    );
}

/// `--transport ws`: the same relay over one WebSocket on `/acp` (token on
/// the upgrade): a full turn with a permission round trip, then stdin EOF
/// closes the socket and the bridge exits 0.
#[tokio::test]
async fn over_websocket_a_full_turn_with_a_permission_round_trip() {
    let server = TestServer::start(&["--token", "ws-secret"]).await;
    let proxy = CutProxy::start(server.addr()).await;
    let mut bridge = BridgeProcess::start(
        &proxy.url(),
        MOCK,
        &["--transport", "ws", "--token", "ws-secret"],
        &[],
    );
    let session = open_session(&mut bridge).await;
    let heads = proxy.heads();
    assert!(
        !heads.is_empty() && heads.iter().all(|h| h.method == "GET"),
        "one upgrade, no POSTs: {heads:?}"
    );

    bridge
        .send(&request(
            3,
            "session/prompt",
            prompt_params(&session, "please ask for permission"),
        ))
        .await;
    let ask = loop {
        let message = bridge.next().await;
        if message["method"] == "session/request_permission" {
            break message;
        }
        assert!(message.get("id").is_none(), "{message}");
    };
    assert_eq!(ask["params"]["sessionId"], session.as_str());
    bridge
        .send(&permission_answer(ask["id"].clone(), "allow-once"))
        .await;
    let (done, after) = bridge.until_response(&json!(3)).await;
    assert_eq!(stop_reason(&done), Some("end_turn"), "{done}");
    assert_eq!(chunk_texts(&after), word_chunks("Permission granted."));

    // A plain turn too, answered in order after its updates.
    bridge
        .send(&request(4, "session/prompt", prompt_params(&session, "hi")))
        .await;
    let (done, updates) = bridge.until_response(&json!(4)).await;
    assert_eq!(stop_reason(&done), Some("end_turn"), "{done}");
    assert_eq!(chunk_texts(&updates), mock_reply_chunks("hi"));

    bridge.close_stdin();
    let status = bridge.wait_exit(EXIT_TIMEOUT).await;
    assert!(status.success(), "{status:?}\n{}", bridge.stderr_text());
    assert_eq!(proxy.heads().len(), 1, "{:?}", proxy.heads());
}

/// A WebSocket cannot resume: a socket cut mid-turn fails every waiting
/// request with a message saying so, and the bridge exits non-zero.
#[tokio::test]
async fn over_websocket_a_cut_socket_is_fatal() {
    let server = TestServer::start(&[]).await;
    let proxy = CutProxy::start(server.addr()).await;
    let mut bridge = BridgeProcess::start(&proxy.url(), MOCK, &["--transport", "ws"], &[]);
    let session = open_session(&mut bridge).await;
    bridge
        .send(&request(
            3,
            "session/prompt",
            prompt_params(&session, "!stall"),
        ))
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(proxy.cut() > 0);
    let answer = bridge.next().await;
    assert_eq!(answer["id"], 3, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("lost the WebSocket") && message.contains(&proxy.url()),
        "{answer}"
    );
    let status = bridge.wait_exit(EXIT_TIMEOUT).await;
    assert!(!status.success(), "{status:?}");
}

/// Agent questions through the bridge (research/contract.md, "Agent
/// questions (ACP elicitation)"): an editor that declares elicitation gets
/// the mock's question on stdout unchanged and answers it on stdin; one
/// that does not declare it never sees it, and the agent is answered
/// `cancel` for it.
#[tokio::test]
async fn a_question_is_relayed_both_ways_to_an_editor_that_declared_it() {
    let server = TestServer::start(&[]).await;
    for (declares, said) in [
        (true, "You answered: name=Grace color=blue confirm=false"),
        (false, "You cancelled the question."),
    ] {
        let mut bridge = BridgeProcess::start(server.base_url(), MOCK, &[], &[]);
        let capabilities = if declares {
            json!({"elicitation": {"form": {}, "url": {}}})
        } else {
            json!({})
        };
        let init = bridge
            .call(&request(
                1,
                "initialize",
                json!({"protocolVersion": 1, "clientCapabilities": capabilities}),
            ))
            .await;
        assert!(init.get("result").is_some(), "{init}");
        let new = bridge.call(&editor_new_session(2)).await;
        let session = new["result"]["sessionId"]
            .as_str()
            .expect("session")
            .to_owned();
        bridge
            .send(&request(
                3,
                "session/prompt",
                prompt_params(&session, "ask question"),
            ))
            .await;
        if declares {
            let ask = loop {
                let message = bridge.next().await;
                if message["method"] == "elicitation/create" {
                    break message;
                }
            };
            assert_eq!(ask["params"]["sessionId"], session.as_str(), "{ask}");
            assert_eq!(ask["params"]["mode"], "form", "{ask}");
            bridge
                .send(&json!({"jsonrpc": "2.0", "id": ask["id"], "result": {
                    "action": "accept",
                    "content": {"name": "Grace", "color": "blue", "confirm": false}}}))
                .await;
        }
        let (done, after) = bridge.until_response(&json!(3)).await;
        assert_eq!(stop_reason(&done), Some("end_turn"), "{done}");
        assert!(
            after.iter().all(|m| m["method"] != "elicitation/create"),
            "{after:?}"
        );
        assert_eq!(chunk_texts(&after).concat(), said);
        bridge.close_stdin();
        assert!(bridge.wait_exit(EXIT_TIMEOUT).await.success());
    }
}
