//! An agent's JSON-RPC error carries the lines the agent wrote to stderr
//! since that request was forwarded, bounded and with secrets masked, and,
//! on a failed `session/new` of a server running as root without
//! `--agent-user`, a hint (research/contract.md, "Agent errors: stderr and
//! hint"). Over `/v2/rpc` and `/acp` alike; the mock agent's `!fail`
//! directive and its refused `cwd` (`refuse-session…`) make the errors.

use reqwest::Method;
use reqwest::header::{ACCEPT, CONTENT_TYPE};
use serde_json::{Value, json};
use v2_api_tests::acp::{self, stop_reason};
use v2_api_tests::{
    Api, EVENT_TIMEOUT, META_KEY, MOCK, SseStream, TempDir, TestServer, mock_agent_command,
};

/// What the mock's `!fail` writes last to stderr.
const FAILING_LINE: &str = "mock agent: failing on request";
/// The variable whose value `!fail` writes to stderr.
const SECRET_ENV: &str = "SANDBOX_AGENT_TEST_SECRET_KEY";
/// A value the server must mask (the variable's name holds KEY and SECRET).
const SECRET: &str = "s3cr3t-value-0123456789";

/// `error.data["sandboxagent.dev"]` of a JSON-RPC answer.
fn added(answer: &Value) -> &Value {
    &answer["error"]["data"][META_KEY]
}

/// The `stderr` entries the runtime added to an error answer.
fn stderr_lines(answer: &Value) -> Vec<String> {
    added(answer)["stderr"]
        .as_array()
        .unwrap_or_else(|| panic!("no stderr lines in {answer}"))
        .iter()
        .map(|line| line.as_str().expect("a line is a string").to_owned())
        .collect()
}

/// Whether this test process runs as root (so the server it starts does).
fn root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// `session/new` params in a directory the mock refuses (`NAME` under a
/// fresh temp dir); the directory is created.
fn refused_session_params(dir: &TempDir, name: &str) -> Value {
    let cwd = dir.path().join(name);
    std::fs::create_dir_all(&cwd).expect("create the refused cwd");
    json!({"cwd": cwd, "mcpServers": [], "_meta": acp::agent_meta(MOCK)})
}

/// Lines written in an earlier request (by the same process, for the same
/// session) are not in a later request's error; the agent's own `data`
/// object is kept beside the runtime's key.
#[tokio::test]
async fn an_error_over_v2_rpc_carries_only_the_lines_since_its_request() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let earlier = server.prompt(&conn, &session, json!(2), "!stderr 3").await;
    assert_eq!(stop_reason(&earlier), Some("end_turn"), "{earlier}");

    let answer = server.prompt(&conn, &session, json!(3), "!fail").await;
    assert_eq!(answer["error"]["code"], -32603, "{answer}");
    assert_eq!(answer["error"]["message"], "mock agent: failed on request");
    assert_eq!(answer["error"]["data"]["directive"], "!fail", "{answer}");
    assert_eq!(stderr_lines(&answer), [FAILING_LINE], "{answer}");
    assert!(
        added(&answer).get("hint").is_none(),
        "no hint on a prompt: {answer}"
    );

    // The session's event log holds the answer as the client got it.
    let events = server.all_events(&session).await;
    let logged = events
        .iter()
        .find(|event| event["message"]["id"] == json!(3) && event["message"].get("error").is_some())
        .unwrap_or_else(|| panic!("the error answer is in the log: {events:?}"));
    assert_eq!(stderr_lines(&logged["message"]), [FAILING_LINE]);
}

/// At most the last 20 lines, and at most 4 KiB in all, with a first entry
/// counting the lines left out.
#[tokio::test]
async fn the_lines_are_bounded_to_20_and_4_kib() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;

    // 30 filler lines and the failing line: the last 20, 11 left out.
    let answer = server.prompt(&conn, &session, json!(2), "!fail 30").await;
    let lines = stderr_lines(&answer);
    let mut want = vec!["… 11 earlier lines dropped".to_owned()];
    want.extend((12..=30).map(|i| format!("fail line {i}")));
    want.push(FAILING_LINE.to_owned());
    assert_eq!(lines, want, "{answer}");

    // 10 lines of 1000 bytes: only the newest fit in 4 KiB.
    let answer = server
        .prompt(&conn, &session, json!(3), "!fail 10 1000")
        .await;
    let lines = stderr_lines(&answer);
    let bytes: usize = lines.iter().map(String::len).sum();
    assert!(bytes <= 4096, "{bytes} bytes: {lines:?}");
    assert_eq!(lines.last().map(String::as_str), Some(FAILING_LINE));
    let kept = lines.len() - 2;
    assert!(kept >= 3, "as many 1000-byte lines as fit: {lines:?}");
    assert_eq!(
        lines[0],
        format!("… {} earlier lines dropped", 10 - kept),
        "{lines:?}"
    );
    assert!(
        lines[1..=kept]
            .iter()
            .all(|line| line.len() == 1000 && line.starts_with("fail line ")),
        "{lines:?}"
    );
}

/// A value of the server's environment whose variable name says it is a
/// secret never leaves in an error: it reads `***`.
#[tokio::test]
async fn secrets_of_the_servers_environment_are_masked() {
    let server = TestServer::start_with_env(&[], &[(SECRET_ENV, SECRET)]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let reply = server
        .post(
            Some(&conn),
            &acp::request(2, "session/prompt", acp::prompt_params(&session, "!fail")),
        )
        .await;
    reply.assert_status(200);
    assert!(!reply.text().contains(SECRET), "{reply:?}");
    assert_eq!(
        stderr_lines(&reply.json()),
        [FAILING_LINE, "mock agent: using key ***"]
    );
}

/// The stderr excerpt of an agent that exited (`_sandboxagent/session/ended`
/// in every session's log) is masked the same way.
#[tokio::test]
async fn the_exit_excerpt_is_masked_too() {
    let server = TestServer::start_with_env(&[], &[(SECRET_ENV, SECRET)]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    for (id, text) in [(2, "!fail"), (3, "!crash")] {
        server
            .post(
                Some(&conn),
                &acp::request(id, "session/prompt", acp::prompt_params(&session, text)),
            )
            .await
            .assert_status(200);
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let ended = loop {
        let page = server
            .get_json(&format!(
                "/v2/sessions/{session}/events?agent={MOCK}&limit=1000"
            ))
            .await;
        let found = page["events"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["message"]["method"] == "_sandboxagent/session/ended");
        if let Some(event) = found {
            break event.clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no session/ended: {page}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let text = ended.to_string();
    assert!(!text.contains(SECRET), "{text}");
    assert!(text.contains("using key ***"), "{text}");
}

/// Over `/acp` (Streamable HTTP: answers on the connection's stream) the
/// same rule holds: only the lines since the request.
#[tokio::test]
async fn an_error_over_acp_carries_only_the_lines_since_its_request() {
    let server = TestServer::start(&[]).await;
    let api = server.api();
    let init = acp::request(
        0,
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {}}),
    );
    let reply = Api::send(acp_post(&api, "/acp/mock", None, None).body(init.to_string())).await;
    reply.assert_status(200);
    let conn = reply
        .header("acp-connection-id")
        .expect("connection id")
        .to_owned();
    let stream = Api::response_head(
        api.request(Method::GET, "/acp")
            .header(ACCEPT, "text/event-stream")
            .header("acp-connection-id", &conn),
    )
    .await;
    assert_eq!(stream.status(), 200);
    let mut stream = SseStream::new(stream);

    let new = acp::request(1, "session/new", json!({"cwd": "/tmp", "mcpServers": []}));
    let answer = acp_request(&api, &mut stream, &conn, None, &new).await;
    let session = answer["result"]["sessionId"]
        .as_str()
        .expect("sessionId")
        .to_owned();
    let earlier = acp::request(
        2,
        "session/prompt",
        acp::prompt_params(&session, "!stderr 2"),
    );
    let answer = acp_request(&api, &mut stream, &conn, Some(&session), &earlier).await;
    assert_eq!(stop_reason(&answer), Some("end_turn"), "{answer}");
    let failing = acp::request(3, "session/prompt", acp::prompt_params(&session, "!fail 1"));
    let answer = acp_request(&api, &mut stream, &conn, Some(&session), &failing).await;
    assert_eq!(
        stderr_lines(&answer),
        ["fail line 1", FAILING_LINE],
        "{answer}"
    );
}

/// `POST /acp` with the profile's headers.
fn acp_post(
    api: &Api,
    path: &str,
    conn: Option<&str>,
    session: Option<&str>,
) -> reqwest::RequestBuilder {
    let mut builder = api
        .request(Method::POST, path)
        .header(CONTENT_TYPE, "application/json");
    if let Some(conn) = conn {
        builder = builder.header("acp-connection-id", conn);
    }
    if let Some(session) = session {
        builder = builder.header("acp-session-id", session);
    }
    builder
}

/// Posts `request` on `/acp` (202) and returns its answer from `stream`.
async fn acp_request(
    api: &Api,
    stream: &mut SseStream,
    conn: &str,
    session: Option<&str>,
    request: &Value,
) -> Value {
    let reply =
        Api::send(acp_post(api, "/acp", Some(conn), session).body(request.to_string())).await;
    reply.assert_status(202);
    stream
        .next_event_matching(|event| event.is_response_to(&request["id"]), EVENT_TIMEOUT)
        .await
        .data
}

/// A refused `session/new` carries the agent's line and, when the server
/// runs as root without `--agent-user` (as these tests do in CI), the hint;
/// a line that mentions root names Claude Code's refusal.
#[tokio::test]
async fn a_refused_session_new_carries_the_root_hint() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let dir = TempDir::new("refused");
    let answer = server
        .rpc(
            &conn,
            1,
            "session/new",
            refused_session_params(&dir, "refuse-session"),
        )
        .await;
    let cwd = dir.path().join("refuse-session");
    assert_eq!(
        stderr_lines(&answer),
        [format!(
            "mock agent: refusing session/new in {}",
            cwd.display()
        )],
        "{answer}"
    );
    let hint = added(&answer)["hint"].as_str();
    if !root() {
        assert_eq!(hint, None, "not root, no hint: {answer}");
        return;
    }
    let hint = hint.unwrap_or_else(|| panic!("a hint as root: {answer}"));
    assert!(hint.contains("runs as root"), "{hint}");
    assert!(hint.contains("--agent-user USER"), "{hint}");
    assert!(hint.contains("some agents refuse to run as root"), "{hint}");

    let answer = server
        .rpc(
            &conn,
            2,
            "session/new",
            refused_session_params(&dir, "refuse-session-as-root"),
        )
        .await;
    let hint = added(&answer)["hint"].as_str().unwrap_or_default();
    assert!(
        hint.contains("Claude Code refuses to run as root"),
        "{answer}"
    );
}

/// With `--agent-user` (which needs root) the agents do not run as root:
/// no hint.
#[tokio::test]
async fn no_hint_with_an_agent_user() {
    if !root() {
        eprintln!("skipped: --agent-user needs the server to run as root");
        return;
    }
    // An `--agent-command` mock: no state dir in the root-owned data dir.
    let command = mock_agent_command("unprivileged", "");
    // `--agent-user` needs a token.
    let server = TestServer::start_with_env(
        &["--agent-user", "nobody", "--agent-command", &command],
        &[("SANDBOX_AGENT_TOKEN", "agent-errors-token")],
    )
    .await;
    let conn = server.initialize("unprivileged").await;
    let dir = TempDir::new("refused-as-nobody");
    let mut params = refused_session_params(&dir, "refuse-session");
    params["_meta"] = acp::agent_meta("unprivileged");
    // The user must be able to write the cwd (else the runtime refuses it
    // before the agent sees it).
    let nobody = nix::unistd::User::from_name("nobody")
        .ok()
        .flatten()
        .expect("user nobody");
    std::os::unix::fs::chown(
        dir.path().join("refuse-session"),
        Some(nobody.uid.as_raw()),
        Some(nobody.gid.as_raw()),
    )
    .expect("chown");
    let answer = server.rpc(&conn, 1, "session/new", params).await;
    assert_eq!(stderr_lines(&answer).len(), 1, "{answer}");
    assert!(added(&answer).get("hint").is_none(), "{answer}");
}
