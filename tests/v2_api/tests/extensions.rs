//! The `_sandboxagent/*` extension methods and `_meta["sandboxagent.dev"]`
//! (research/contract.md, "Extension methods and control plane"): the
//! capability block in `initialize`, the
//! server-wide `session/list`, metadata, terminate, detach, model listing and
//! the agent list, over real HTTP against the real binary and mock agent.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::{Value, json};
use v2_api_tests::acp::{self, stop_reason};
use v2_api_tests::ext::{
    self, AGENT_INSTALL, AGENT_LIST, ALL_METHODS, ATTACH, DETACH, FS_DELETE_ENTRY, FS_LIST_ENTRIES,
    FS_MKDIR, FS_MOVE, FS_STAT, INVALID_PARAMS, LIST_MODELS, METHOD_NOT_FOUND, PROCESS_GET,
    PROCESS_INPUT, PROCESS_LIST, PROCESS_RESIZE, PROCESS_RUN, PROCESS_SIGNAL, PROCESS_START,
    RESOURCE_NOT_FOUND, SESSION_ENDED, SESSION_GET, SESSION_LIST, SET_METADATA, TERMINATE,
    expect_error, expect_result, namespace, session_ids, session_ref,
};
use v2_api_tests::{
    EVENT_TIMEOUT, MOCK, REQUEST_TIMEOUT, SseEvent, SseStream, TestServer, join_within,
    mock_agent_command,
};

/// Upper bound for a request on an ended session: it must be answered, not
/// hang until the agent does something.
const ENDED_ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// The agent-message chunk texts among `events`.
fn texts(events: &[SseEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| e.agent_text().map(str::to_owned))
        .collect()
}

/// The models the mock agent reports (contract.md: config option `model`).
fn mock_models() -> Value {
    json!([
        {"modelId": "mock-fast", "name": "Mock fast"},
        {"modelId": "mock-smart", "name": "Mock smart"},
    ])
}

/// `_sandboxagent/session/get` for `session`; the entry.
async fn session_get(server: &TestServer, conn: &str, session: &str) -> Value {
    let response = server
        .rpc(conn, "get", SESSION_GET, session_ref(session))
        .await;
    expect_result(&response).clone()
}

/// `session/list` with `params`; the result.
async fn session_list(server: &TestServer, conn: &str, params: Value) -> Value {
    let response = server.rpc(conn, "list", "session/list", params).await;
    expect_result(&response).clone()
}

/// `session/new` on `conn` with `params`; the whole result.
async fn new_session_with(server: &TestServer, conn: &str, params: Value) -> Value {
    let response = server.rpc(conn, 1, "session/new", params).await;
    expect_result(&response).clone()
}

/// Runs a plain prompt `marker` in a fresh session of `conn` and returns
/// every event of `stream` up to the marker's last chunk. Everything the
/// server pushed to `stream` before the marker turn started is among them,
/// so "X is not in the result" proves X was never delivered (one ordered
/// ring per connection; research/contract.md, "Transport: /v2/rpc").
async fn drain_with_marker(
    server: &TestServer,
    conn: &str,
    stream: &mut SseStream,
    marker: &str,
) -> Vec<SseEvent> {
    let session = server.new_session(conn).await;
    let reply = server.prompt(conn, &session, json!("marker"), marker).await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
    stream
        .collect_until(|e| e.agent_text() == Some(marker), EVENT_TIMEOUT)
        .await
}

/// Events of `session` among `events`.
fn of_session<'a>(events: &'a [SseEvent], session: &str) -> Vec<&'a SseEvent> {
    events
        .iter()
        .filter(|e| e.session_id() == Some(session))
        .collect()
}

// ---------------------------------------------------------------------------
// initialize: the capability block
// ---------------------------------------------------------------------------

/// Checks the `agentCapabilities._meta["sandboxagent.dev"]` block of an
/// `initialize` result and returns its `methods`.
fn check_advertisement(result: &Value) -> Vec<String> {
    let capabilities = &result["agentCapabilities"];
    assert_eq!(
        capabilities["loadSession"], true,
        "the agent's own capabilities are kept: {result}"
    );
    let block = namespace(capabilities);
    assert!(
        block.get("methods").is_none(),
        "methods sits inside extensions, not beside it: {block}"
    );
    let methods: Vec<String> = block["extensions"]["methods"]
        .as_array()
        .unwrap_or_else(|| panic!("no extensions.methods list: {result}"))
        .iter()
        .map(|m| m.as_str().unwrap_or_default().to_owned())
        .collect();
    let mut sorted = methods.clone();
    sorted.sort();
    assert_eq!(
        sorted, ALL_METHODS,
        "methods must name exactly the extension methods of the contract: {block}"
    );
    let extensions = block["extensions"]
        .as_object()
        .unwrap_or_else(|| panic!("no extensions object: {block}"));
    assert!(
        extensions
            .iter()
            .all(|(key, value)| key == "methods" || value.is_boolean()),
        "one boolean per extension, and the methods list: {block}"
    );
    for flag in [
        "sessionDetach",
        "sessionTerminate",
        "sessionListModels",
        "sessionSetMetadata",
        "sessionGet",
        "agentList",
        "sessionList",
        "agentInstall",
        "fsListEntries",
        "fsStat",
        "fsMkdir",
        "fsMove",
        "fsDeleteEntry",
        "processRun",
        "processStart",
        "processList",
        "processGet",
        "processSignal",
        "processInput",
        "processResize",
        "sessionEndedNotification",
        "sessionAgentMeta",
        "sessionAttach",
        "requestResolvedNotification",
        "turnInterruptedNotification",
    ] {
        assert_eq!(extensions.get(flag), Some(&json!(true)), "{flag}: {block}");
    }
    methods
}

#[tokio::test]
async fn every_initialize_result_carries_the_extension_block() {
    let server = TestServer::start(&[]).await;
    // The first initialize starts the agent; the second is answered from the
    // cached result; the third is sent on an open connection.
    for _ in 0..2 {
        let reply = server.initialize_reply(MOCK).await;
        reply.assert_status(200);
        check_advertisement(expect_result(&reply.json()));
    }
    let conn = server.initialize(MOCK).await;
    let again = server
        .call(
            &conn,
            &acp::request(5, "initialize", acp::initialize_params(MOCK)),
        )
        .await;
    check_advertisement(expect_result(&again));
}

#[tokio::test]
async fn every_advertised_method_answers() {
    let server = TestServer::start(&[]).await;
    let reply = server.initialize_reply(MOCK).await;
    let conn = reply
        .connection_id()
        .unwrap_or_else(|| panic!("no connection: {reply:?}"));
    let methods = check_advertisement(expect_result(&reply.json()));
    let session = server.new_session(&conn).await;
    let doomed = server.new_session(&conn).await;
    let files = v2_api_tests::agents::TempDir::new("ext-fs");
    let file = |name: &str| files.path().join(name).to_string_lossy().into_owned();
    files.write("moved", b"x");
    files.write("deleted", b"x");
    // A process on a terminal for the methods that name one (resize needs
    // the terminal).
    let started = server
        .rpc(
            &conn,
            "start",
            PROCESS_START,
            json!({"command": "cat", "tty": true}),
        )
        .await;
    let process = expect_result(&started)["id"].clone();
    for (i, method) in methods.iter().enumerate() {
        let params = match method.as_str() {
            ATTACH | DETACH | SESSION_GET | LIST_MODELS => session_ref(&session),
            TERMINATE => session_ref(&doomed),
            SET_METADATA => json!({"sessionId": session, "metadata": {"k": 1}}),
            AGENT_LIST | SESSION_LIST => json!({}),
            AGENT_INSTALL => json!({"agent": MOCK}),
            FS_LIST_ENTRIES | FS_STAT => json!({"path": file("")}),
            FS_MKDIR => json!({"path": file("made")}),
            FS_MOVE => json!({"from": file("moved"), "to": file("moved-to")}),
            FS_DELETE_ENTRY => json!({"path": file("deleted")}),
            PROCESS_GET => json!({"processId": process}),
            PROCESS_INPUT => json!({"processId": process, "data": "x"}),
            PROCESS_LIST => json!({}),
            PROCESS_RESIZE => json!({"processId": process, "cols": 90, "rows": 30}),
            PROCESS_RUN | PROCESS_START => json!({"command": "true"}),
            PROCESS_SIGNAL => json!({"processId": process, "signal": "SIGWINCH"}),
            other => panic!("advertised method {other} has no test params"),
        };
        let response = server.rpc(&conn, i, method, params).await;
        assert_ne!(
            response["error"]["code"].as_i64(),
            Some(METHOD_NOT_FOUND),
            "{method} is advertised but not answered: {response}"
        );
        expect_result(&response);
    }
}

#[tokio::test]
async fn unknown_extension_method_is_method_not_found() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let response = server.rpc(&conn, 1, "_sandboxagent/foo", json!({})).await;
    expect_error(&response, METHOD_NOT_FOUND);
    // As a notification it is accepted and ignored; the connection works on.
    server
        .post(
            Some(&conn),
            &acp::notification("_sandboxagent/foo", json!({})),
        )
        .await
        .assert_accepted_empty();
    let response = server.rpc(&conn, 2, AGENT_LIST, json!({})).await;
    expect_result(&response);
}

// ---------------------------------------------------------------------------
// session/list from the inventory
// ---------------------------------------------------------------------------

#[tokio::test]
async fn session_list_spans_connections_and_agents_newest_first() {
    let other = mock_agent_command("other", "");
    let server = TestServer::start(&["--agent-command", &other]).await;
    let conn_a = server.initialize(MOCK).await;
    let conn_b = server.initialize(MOCK).await;
    let conn_c = server.initialize("other").await;

    let first = new_session_with(
        &server,
        &conn_a,
        ext::new_session_params(MOCK, "/tmp", &json!({"variant": "v1", "skills": ["a"]})),
    )
    .await;
    let meta = namespace(&first);
    assert_eq!(
        meta["agent"], MOCK,
        "session/new result carries _meta: {first}"
    );
    assert_eq!(meta["ended"], false, "{first}");
    assert_eq!(meta["model"], "mock-fast", "{first}");
    assert_eq!(meta["variant"], "v1", "pass-through key: {first}");
    let s1 = first["sessionId"].as_str().unwrap_or_default().to_owned();
    let s2 = server.new_session(&conn_b).await;
    let s3 = server.new_session_for(&conn_c, "other").await;
    let s4 = server.new_session(&conn_a).await;
    let expected = vec![s4.clone(), s3.clone(), s2.clone(), s1.clone()];

    for conn in [&conn_a, &conn_b, &conn_c] {
        let list = session_list(&server, conn, json!({})).await;
        assert_eq!(session_ids(&list), expected, "from {conn}: {list}");
        assert!(list.get("nextCursor").is_none_or(Value::is_null), "{list}");
        let entries = list["sessions"].as_array().cloned().unwrap_or_default();
        let mut previous_created: Option<String> = None;
        for entry in &entries {
            let id = entry["sessionId"].as_str().unwrap_or_default();
            assert_eq!(entry["cwd"], "/tmp", "{entry}");
            assert!(
                entry["updatedAt"].as_str().is_some_and(ext::is_rfc3339),
                "{entry}"
            );
            let meta = namespace(entry);
            let agent = if id == s3 { "other" } else { MOCK };
            assert_eq!(meta["agent"], agent, "{entry}");
            for key in ["createdAt", "updatedAt"] {
                assert!(
                    meta[key].as_str().is_some_and(ext::is_rfc3339),
                    "{key}: {entry}"
                );
            }
            assert_eq!(meta["ended"], false, "{entry}");
            assert!(
                meta["eventCount"].as_u64().is_some_and(|n| n >= 2),
                "session/new request and response are logged: {entry}"
            );
            assert_eq!(meta["model"], "mock-fast", "model hint: {entry}");
            let created = meta["createdAt"].as_str().unwrap_or_default().to_owned();
            if let Some(previous) = &previous_created {
                assert!(created <= *previous, "newest first: {list}");
            }
            previous_created = Some(created);
        }
        let first_entry = entries.iter().find(|e| e["sessionId"] == s1.as_str());
        let first_meta = first_entry.map(namespace).cloned().unwrap_or_default();
        assert_eq!(first_meta["variant"], "v1", "{list}");
        assert_eq!(first_meta["skills"], json!(["a"]), "{list}");
    }
}

#[tokio::test]
async fn session_list_pages_with_a_cursor() {
    const CREATED: usize = 55;
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let mut created = Vec::new();
    for _ in 0..CREATED {
        created.push(server.new_session(&conn).await);
    }
    let newest_first: Vec<String> = created.iter().rev().cloned().collect();

    let page1 = session_list(&server, &conn, json!({})).await;
    let ids1 = session_ids(&page1);
    assert_eq!(ids1.len(), 50, "page size is 50: {page1}");
    let cursor = page1["nextCursor"]
        .as_str()
        .unwrap_or_else(|| panic!("a first page of 50 out of {CREATED} has a nextCursor: {page1}"))
        .to_owned();
    let page2 = session_list(&server, &conn, json!({"cursor": cursor})).await;
    let ids2 = session_ids(&page2);
    assert_eq!(ids2.len(), CREATED - 50, "{page2}");
    assert!(
        page2.get("nextCursor").is_none_or(Value::is_null),
        "the last page has no nextCursor: {page2}"
    );
    let unique: HashSet<&String> = ids1.iter().chain(&ids2).collect();
    assert_eq!(unique.len(), CREATED, "pages overlap");
    let all: Vec<String> = ids1.into_iter().chain(ids2).collect();
    assert_eq!(all, newest_first, "the second page continues the first");

    let bad = server
        .rpc(&conn, 3, "session/list", json!({"cursor": "not-a-cursor"}))
        .await;
    expect_error(&bad, INVALID_PARAMS);
}

#[tokio::test]
async fn session_list_filters_by_cwd() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let mut in_alpha = Vec::new();
    for cwd in ["/tmp/alpha", "/tmp/beta", "/tmp/alpha"] {
        let result = new_session_with(
            &server,
            &conn,
            ext::new_session_params(MOCK, cwd, &json!({})),
        )
        .await;
        if cwd == "/tmp/alpha" {
            in_alpha.push(result["sessionId"].as_str().unwrap_or_default().to_owned());
        }
    }
    in_alpha.reverse();
    let alpha = session_list(&server, &conn, json!({"cwd": "/tmp/alpha"})).await;
    assert_eq!(session_ids(&alpha), in_alpha, "{alpha}");
    assert!(
        alpha["sessions"]
            .as_array()
            .is_some_and(|s| s.iter().all(|e| e["cwd"] == "/tmp/alpha")),
        "{alpha}"
    );
    assert_eq!(
        session_ids(&session_list(&server, &conn, json!({"cwd": "/tmp/beta"})).await).len(),
        1
    );
    let none = session_list(&server, &conn, json!({"cwd": "/tmp/nowhere"})).await;
    assert!(session_ids(&none).is_empty(), "{none}");
}

// ---------------------------------------------------------------------------
// set_metadata
// ---------------------------------------------------------------------------

#[tokio::test]
async fn set_metadata_merges_in_both_param_forms() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let created = new_session_with(
        &server,
        &conn,
        ext::new_session_params(
            MOCK,
            "/tmp",
            &json!({"variant": "v", "labels": {"team": "infra"}}),
        ),
    )
    .await;
    let session = created["sessionId"].as_str().unwrap_or_default().to_owned();
    let created_at = namespace(&created)["createdAt"].clone();

    // Plain form.
    let response = server
        .rpc(
            &conn,
            1,
            SET_METADATA,
            json!({
                "sessionId": session,
                "metadata": {"title": "T1", "labels": {"priority": "high"}, "ticket": "ENG-1"},
            }),
        )
        .await;
    let entry = expect_result(&response);
    assert_eq!(entry["sessionId"], session.as_str(), "{entry}");
    assert_eq!(
        entry["title"], "T1",
        "title side effect on the entry: {entry}"
    );
    let meta = namespace(entry);
    assert_eq!(meta["title"], "T1", "{entry}");
    assert_eq!(
        meta["labels"],
        json!({"team": "infra", "priority": "high"}),
        "objects merge: {entry}"
    );
    assert_eq!(meta["variant"], "v", "pass-through key kept: {entry}");
    assert_eq!(meta["ticket"], "ENG-1", "{entry}");
    assert_eq!(meta["model"], "mock-fast", "{entry}");
    assert_eq!(meta["mode"], "default", "{entry}");

    // `_meta` form: model and mode become the hints.
    let response = server
        .rpc(
            &conn,
            2,
            SET_METADATA,
            json!({
                "sessionId": session,
                "_meta": {"sandboxagent.dev": {"model": "mock-smart", "mode": "plan"}},
            }),
        )
        .await;
    let meta = namespace(expect_result(&response)).clone();
    assert_eq!(meta["model"], "mock-smart", "{response}");
    assert_eq!(meta["mode"], "plan", "{response}");
    assert_eq!(meta["title"], "T1", "earlier keys stay: {response}");
    let models = server
        .rpc(&conn, 3, LIST_MODELS, session_ref(&session))
        .await;
    assert_eq!(
        expect_result(&models)["currentModelId"],
        "mock-smart",
        "the model hint is the current model: {models}"
    );

    // Runtime keys cannot be overwritten.
    let response = server
        .rpc(
            &conn,
            4,
            SET_METADATA,
            json!({
                "sessionId": session,
                "metadata": {"agent": "evil", "ended": true, "eventCount": 0, "createdAt": "x"},
            }),
        )
        .await;
    let meta = namespace(expect_result(&response)).clone();
    assert_eq!(meta["agent"], MOCK, "{response}");
    assert_eq!(meta["ended"], false, "{response}");
    assert!(
        meta["eventCount"].as_u64().is_some_and(|n| n >= 2),
        "{response}"
    );
    assert_eq!(meta["createdAt"], created_at, "{response}");

    // Every view shows the same entry.
    let got = session_get(&server, &conn, &session).await;
    assert_eq!(namespace(&got), &meta, "{got}");
    assert_eq!(got["title"], "T1", "{got}");
    let list = session_list(&server, &conn, json!({})).await;
    assert_eq!(
        list["sessions"][0], got,
        "session/list entry equals session/get"
    );
    let http = server.get_json(&format!("/v2/sessions/{session}")).await;
    assert_eq!(http, got, "GET /v2/sessions/{{id}} equals session/get");
}

#[tokio::test]
async fn set_metadata_null_removes_keys() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let created = new_session_with(
        &server,
        &conn,
        ext::new_session_params(
            MOCK,
            "/tmp",
            &json!({"variant": "v", "labels": {"team": "infra", "tier": "gold"}}),
        ),
    )
    .await;
    let session = created["sessionId"].as_str().unwrap_or_default().to_owned();
    let response = server
        .rpc(
            &conn,
            1,
            SET_METADATA,
            json!({"sessionId": session, "metadata": {"title": "T"}}),
        )
        .await;
    assert_eq!(expect_result(&response)["title"], "T", "{response}");

    // JSON Merge Patch (RFC 7396): null removes, also inside objects.
    let response = server
        .rpc(
            &conn,
            2,
            SET_METADATA,
            json!({
                "sessionId": session,
                "metadata": {"variant": null, "title": null, "labels": {"tier": null}},
            }),
        )
        .await;
    expect_result(&response);
    let got = session_get(&server, &conn, &session).await;
    let meta = namespace(&got);
    assert!(
        meta.get("variant").is_none(),
        "variant: null removes it: {got}"
    );
    assert!(
        meta.get("title").is_none(),
        "title: null clears the title: {got}"
    );
    assert!(got.get("title").is_none_or(Value::is_null), "{got}");
    assert_eq!(meta["labels"], json!({"team": "infra"}), "{got}");
}

#[tokio::test]
async fn set_metadata_as_a_notification() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    server
        .post(
            Some(&conn),
            &acp::notification(
                SET_METADATA,
                json!({"sessionId": session, "metadata": {"title": "from a notification"}}),
            ),
        )
        .await
        .assert_accepted_empty();
    server
        .post(
            Some(&conn),
            &acp::notification(
                SET_METADATA,
                json!({"sessionId": session, "_meta": {"sandboxagent.dev": {"owner": "ci"}}}),
            ),
        )
        .await
        .assert_accepted_empty();
    let got = session_get(&server, &conn, &session).await;
    assert_eq!(got["title"], "from a notification", "{got}");
    assert_eq!(namespace(&got)["title"], "from a notification", "{got}");
    assert_eq!(namespace(&got)["owner"], "ci", "{got}");
}

#[tokio::test]
async fn set_metadata_rejects_wrong_params() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let before = session_get(&server, &conn, &session).await;
    let bad = [
        json!({"sessionId": session, "metadata": "title"}),
        json!({"sessionId": session, "metadata": ["a"]}),
        json!({"sessionId": session, "metadata": 5}),
        json!({"sessionId": session, "_meta": {"sandboxagent.dev": "x"}}),
        json!({"sessionId": session, "_meta": "x"}),
        json!({"sessionId": session}),
        json!({"metadata": {"title": "no session"}}),
        json!({"sessionId": 7, "metadata": {}}),
    ];
    for (i, params) in bad.iter().enumerate() {
        let response = server.rpc(&conn, i, SET_METADATA, params.clone()).await;
        expect_error(&response, INVALID_PARAMS);
        // The same as a notification: 202, and nothing changes.
        server
            .post(
                Some(&conn),
                &acp::notification(SET_METADATA, params.clone()),
            )
            .await
            .assert_accepted_empty();
    }
    let unknown = server
        .rpc(
            &conn,
            "u",
            SET_METADATA,
            json!({"sessionId": "no-such-session", "metadata": {"title": "x"}}),
        )
        .await;
    expect_error(&unknown, RESOURCE_NOT_FOUND);
    let after = session_get(&server, &conn, &session).await;
    assert_eq!(
        namespace(&after).get("title"),
        namespace(&before).get("title"),
        "{after}"
    );
    assert!(after.get("title").is_none_or(Value::is_null), "{after}");
}

/// `_meta["sandboxagent.dev"]` stays with a session for its whole life, in
/// memory and in every store row: at most 64 KiB of it, at `session/new`
/// and after any `set_metadata` (research/contract.md, "`session/new`
/// with metadata"). Before, 40 sessions of 15 MB each took a server to 985 MB
/// that no budget counted, and back there after a restart.
#[tokio::test]
async fn session_metadata_is_bounded() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let too_much = "y".repeat(70 * 1024);
    let new = acp::request(
        1,
        "session/new",
        json!({"cwd": "/tmp", "mcpServers": [],
               "_meta": {"sandboxagent.dev": {"agent": MOCK, "blob": too_much}}}),
    );
    let reply = server.post(Some(&conn), &new).await;
    v2_api_tests::assert_problem(&reply, 400, "invalid-request");
    let session = server.new_session(&conn).await;
    let half = "y".repeat(40 * 1024);
    expect_result(
        &server
            .rpc(
                &conn,
                2,
                SET_METADATA,
                json!({"sessionId": session, "metadata": {"a": half}}),
            )
            .await,
    );
    let over = server
        .rpc(
            &conn,
            3,
            SET_METADATA,
            json!({"sessionId": session, "metadata": {"b": half}}),
        )
        .await;
    expect_error(&over, INVALID_PARAMS);
    // The refused patch changed nothing; a smaller one still applies.
    let after = session_get(&server, &conn, &session).await;
    assert!(namespace(&after).get("b").is_none(), "{after}");
    assert_eq!(
        namespace(&after)["a"].as_str().map(str::len),
        Some(40 * 1024)
    );
    expect_result(
        &server
            .rpc(
                &conn,
                4,
                SET_METADATA,
                json!({"sessionId": session, "metadata": {"a": null, "b": "ok"}}),
            )
            .await,
    );
}

// ---------------------------------------------------------------------------
// terminate
// ---------------------------------------------------------------------------

/// Checks a `_sandboxagent/session/ended` event for a terminate.
fn assert_terminated(event: &SseEvent, session: &str) {
    assert!(event.id.is_some(), "{event:?}");
    let params = event.params();
    assert_eq!(params["sessionId"], session, "{event:?}");
    assert_eq!(params["reason"], "terminated", "{event:?}");
    assert_eq!(params["terminatedBy"], "daemon", "{event:?}");
}

#[tokio::test]
async fn terminate_cancels_a_running_turn() {
    let server = TestServer::start(&[]).await;
    let conn_a = server.initialize(MOCK).await;
    let conn_b = server.initialize(MOCK).await;
    let session = server.new_session(&conn_a).await;
    let mut stream_a = server.open_stream(&conn_a, None).await;

    let (api, c, s) = (server.api(), conn_a.clone(), session.clone());
    let turn = tokio::spawn(async move { api.prompt(&c, &s, json!("p"), "!slow 20 100").await });
    stream_a
        .next_event_matching(|e| e.agent_text() == Some("chunk-2 "), EVENT_TIMEOUT)
        .await;

    let response = server
        .rpc(&conn_b, 1, TERMINATE, session_ref(&session))
        .await;
    assert_eq!(
        expect_result(&response),
        &json!({"sessionId": session, "alreadyEnded": false}),
        "{response}"
    );
    let reply = join_within(turn, REQUEST_TIMEOUT).await;
    assert_eq!(stop_reason(&reply), Some("cancelled"), "{reply}");

    let ended = stream_a
        .next_event_matching(|e| e.method() == Some(SESSION_ENDED), EVENT_TIMEOUT)
        .await;
    assert_terminated(&ended, &session);
    assert!(
        !texts(&stream_a.history).contains(&"chunk-20 ".to_owned()),
        "the turn was cut short: {:#?}",
        stream_a.history
    );

    // The session is over: requests on it are answered at once with -32002.
    for conn in [&conn_a, &conn_b] {
        let request = acp::request(
            "late",
            "session/prompt",
            acp::prompt_params(&session, "still there?"),
        );
        let reply = v2_api_tests::Api::send_within(
            server.rpc_post(Some(conn)).body(request.to_string()),
            ENDED_ANSWER_TIMEOUT,
        )
        .await;
        reply.assert_status(200);
        expect_error(&reply.json(), RESOURCE_NOT_FOUND);
    }
    let got = session_get(&server, &conn_b, &session).await;
    assert_eq!(namespace(&got)["ended"], true, "{got}");
    let list = session_list(&server, &conn_b, json!({})).await;
    assert_eq!(namespace(&list["sessions"][0])["ended"], true, "{list}");
}

#[tokio::test]
async fn terminate_is_idempotent() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let mut stream = server.open_stream(&conn, None).await;

    let first = server.rpc(&conn, 1, TERMINATE, session_ref(&session)).await;
    assert_eq!(expect_result(&first)["alreadyEnded"], false, "{first}");
    let second = server.rpc(&conn, 2, TERMINATE, session_ref(&session)).await;
    assert_eq!(
        expect_result(&second),
        &json!({"sessionId": session, "alreadyEnded": true}),
        "{second}"
    );
    let unknown = server
        .rpc(&conn, 3, TERMINATE, session_ref("no-such-session"))
        .await;
    expect_error(&unknown, RESOURCE_NOT_FOUND);

    let events = drain_with_marker(&server, &conn, &mut stream, "after-terminate").await;
    let ended: Vec<&SseEvent> = events
        .iter()
        .filter(|e| e.method() == Some(SESSION_ENDED))
        .collect();
    assert_eq!(
        ended.len(),
        1,
        "one session/ended for two terminates: {events:#?}"
    );
    assert_terminated(ended[0], &session);
}

#[tokio::test]
async fn terminate_as_a_notification() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let mut stream = server.open_stream(&conn, None).await;
    server
        .post(
            Some(&conn),
            &acp::notification(TERMINATE, session_ref(&session)),
        )
        .await
        .assert_accepted_empty();
    let ended = stream
        .next_event_matching(|e| e.method() == Some(SESSION_ENDED), EVENT_TIMEOUT)
        .await;
    assert_terminated(&ended, &session);
    let got = session_get(&server, &conn, &session).await;
    assert_eq!(namespace(&got)["ended"], true, "{got}");
    let again = server.rpc(&conn, 1, TERMINATE, session_ref(&session)).await;
    assert_eq!(expect_result(&again)["alreadyEnded"], true, "{again}");
}

#[tokio::test]
async fn a_terminated_session_cannot_be_loaded_back() {
    let server = TestServer::start(&[]).await;
    let conn_a = server.initialize(MOCK).await;
    let conn_b = server.initialize(MOCK).await;
    let session = server.new_session(&conn_a).await;
    let mut stream_a = server.open_stream(&conn_a, None).await;
    let mut stream_b = server.open_stream(&conn_b, None).await;
    let reply = server.prompt(&conn_a, &session, json!(1), "history").await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
    let response = server
        .rpc(&conn_a, 2, TERMINATE, session_ref(&session))
        .await;
    expect_result(&response);
    stream_a
        .next_event_matching(|e| e.method() == Some(SESSION_ENDED), EVENT_TIMEOUT)
        .await;

    // A terminated session is over for good: B cannot load it back, and
    // neither A nor B gets anything more of it.
    let load = server
        .rpc(
            &conn_b,
            3,
            "session/load",
            json!({"sessionId": session, "cwd": "/tmp", "mcpServers": []}),
        )
        .await;
    expect_error(&load, -32002);
    let events_a = drain_with_marker(&server, &conn_a, &mut stream_a, "marker-a").await;
    assert!(
        of_session(&events_a, &session).is_empty(),
        "A got messages of its terminated session after session/ended \
         (B's session/load answered {load}): {events_a:#?}"
    );
    let events_b = drain_with_marker(&server, &conn_b, &mut stream_b, "marker-b").await;
    assert!(
        of_session(&events_b, &session).is_empty(),
        "B got messages of a session it could not load: {events_b:#?}"
    );
}

// ---------------------------------------------------------------------------
// detach and load
// ---------------------------------------------------------------------------

#[tokio::test]
async fn detach_then_load_moves_the_next_turn() {
    let server = TestServer::start(&[]).await;
    let conn_a = server.initialize(MOCK).await;
    let session = server.new_session(&conn_a).await;
    let mut stream_a = server.open_stream(&conn_a, None).await;
    let reply = server.prompt(&conn_a, &session, json!(1), "first").await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
    stream_a
        .next_event_matching(|e| e.agent_text() == Some("first"), EVENT_TIMEOUT)
        .await;

    let detached = server.rpc(&conn_a, 2, DETACH, session_ref(&session)).await;
    assert_eq!(expect_result(&detached), &json!({}), "{detached}");
    let got = session_get(&server, &conn_a, &session).await;
    assert_eq!(
        namespace(&got)["ended"],
        false,
        "detach keeps the session: {got}"
    );

    let conn_b = server.initialize(MOCK).await;
    let mut stream_b = server.open_stream(&conn_b, None).await;
    let load = server
        .rpc(
            &conn_b,
            1,
            "session/load",
            json!({"sessionId": session, "cwd": "/tmp", "mcpServers": []}),
        )
        .await;
    let loaded = expect_result(&load);
    assert_eq!(
        namespace(loaded)["agent"],
        MOCK,
        "session/load result carries _meta: {load}"
    );
    assert_eq!(namespace(loaded)["ended"], false, "{load}");
    let reply = server.prompt(&conn_b, &session, json!(2), "second").await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
    let events_b = stream_b
        .collect_until(|e| e.agent_text() == Some("second"), EVENT_TIMEOUT)
        .await;
    let replayed: Vec<&str> = events_b
        .iter()
        .filter_map(|e| e.chunk_text("user_message_chunk"))
        .collect();
    assert_eq!(
        replayed,
        ["first"],
        "load replays the history to B: {events_b:#?}"
    );
    let expected = acp::mock_reply_chunks("second");
    let texts_b = texts(&events_b);
    assert_eq!(
        texts_b[texts_b.len().saturating_sub(expected.len())..],
        expected,
        "B gets the next turn: {events_b:#?}"
    );

    let events_a = drain_with_marker(&server, &conn_a, &mut stream_a, "marker").await;
    assert!(
        of_session(&events_a, &session).is_empty(),
        "A detached: nothing of the session reaches it: {events_a:#?}"
    );
}

#[tokio::test]
async fn detach_hands_a_pending_permission_request_to_the_loading_connection() {
    let server = TestServer::start(&[]).await;
    let conn_a = server.initialize(MOCK).await;
    let session = server.new_session(&conn_a).await;
    let mut stream_a = server.open_stream(&conn_a, None).await;
    let (api, c, s) = (server.api(), conn_a.clone(), session.clone());
    let turn = tokio::spawn(async move {
        api.prompt(&c, &s, json!(10), "may I have permission?")
            .await
    });
    let asked = stream_a
        .next_event_matching(
            |e| e.method() == Some("session/request_permission"),
            EVENT_TIMEOUT,
        )
        .await;
    let request_id = asked.data["id"].clone();

    // Detach as a notification, then B picks the session up.
    server
        .post(
            Some(&conn_a),
            &acp::notification(DETACH, session_ref(&session)),
        )
        .await
        .assert_accepted_empty();
    let conn_b = server.initialize(MOCK).await;
    let mut stream_b = server.open_stream(&conn_b, None).await;
    let load = server
        .rpc(
            &conn_b,
            1,
            "session/load",
            json!({"sessionId": session, "cwd": "/tmp", "mcpServers": []}),
        )
        .await;
    expect_result(&load);
    let handed = stream_b
        .next_event_matching(
            |e| e.method() == Some("session/request_permission"),
            EVENT_TIMEOUT,
        )
        .await;
    assert_eq!(
        handed.data["id"], request_id,
        "the same agent request: {handed:?}"
    );
    assert_eq!(handed.session_id(), Some(session.as_str()), "{handed:?}");

    server
        .post(
            Some(&conn_b),
            &acp::permission_answer(request_id, "allow-once"),
        )
        .await
        .assert_accepted_empty();
    let reply = join_within(turn, REQUEST_TIMEOUT).await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
    let events_b = stream_b
        .collect_until(|e| e.agent_text() == Some("granted."), EVENT_TIMEOUT)
        .await;
    assert_eq!(
        texts(&events_b)
            .into_iter()
            .rev()
            .take(2)
            .collect::<Vec<_>>(),
        ["granted.", "Permission "],
        "{events_b:#?}"
    );
    let events_a = drain_with_marker(&server, &conn_a, &mut stream_a, "marker").await;
    assert!(
        of_session(&events_a, &session).is_empty(),
        "after detaching, A gets nothing of the session: {events_a:#?}"
    );
}

// ---------------------------------------------------------------------------
// list_models, model and mode hints
// ---------------------------------------------------------------------------

#[tokio::test]
async fn list_models_by_session_and_by_agent() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let before = server
        .rpc(&conn, 1, LIST_MODELS, json!({"agent": MOCK}))
        .await;
    assert_eq!(
        expect_result(&before)["availableModels"],
        json!([]),
        "no models before the agent reported any: {before}"
    );

    let session = server.new_session(&conn).await;
    let by_session = server
        .rpc(&conn, 2, LIST_MODELS, session_ref(&session))
        .await;
    assert_eq!(
        expect_result(&by_session),
        &json!({"availableModels": mock_models(), "currentModelId": "mock-fast"}),
        "{by_session}"
    );
    let by_agent = server
        .rpc(&conn, 3, LIST_MODELS, json!({"agent": MOCK}))
        .await;
    let result = expect_result(&by_agent);
    assert_eq!(result["availableModels"], mock_models(), "{by_agent}");
    assert!(
        result.get("currentModelId").is_none_or(Value::is_null),
        "an agent has no current model: {by_agent}"
    );
}

#[tokio::test]
async fn list_models_needs_exactly_one_known_target() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    for (i, params) in [
        json!({"sessionId": session, "agent": MOCK}),
        json!({}),
        json!({"agent": "no-such-agent"}),
        json!({"sessionId": 5}),
    ]
    .into_iter()
    .enumerate()
    {
        let response = server.rpc(&conn, i, LIST_MODELS, params).await;
        expect_error(&response, INVALID_PARAMS);
    }
    let response = server
        .rpc(&conn, "u", LIST_MODELS, session_ref("no-such-session"))
        .await;
    expect_error(&response, RESOURCE_NOT_FOUND);
}

#[tokio::test]
async fn model_hint_follows_set_config_option() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let response = server
        .rpc(
            &conn,
            1,
            "session/set_config_option",
            json!({"sessionId": session, "configId": "model", "value": "mock-smart"}),
        )
        .await;
    let options = expect_result(&response)["configOptions"].clone();
    assert_eq!(options[0]["currentValue"], "mock-smart", "{response}");

    let models = server
        .rpc(&conn, 2, LIST_MODELS, session_ref(&session))
        .await;
    assert_eq!(
        expect_result(&models)["currentModelId"],
        "mock-smart",
        "the agent answered set_config_option with model mock-smart: {models}"
    );
    let got = session_get(&server, &conn, &session).await;
    assert_eq!(namespace(&got)["model"], "mock-smart", "{got}");
}

#[tokio::test]
async fn mode_hint_follows_set_mode() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    assert_eq!(
        namespace(&session_get(&server, &conn, &session).await)["mode"],
        "default"
    );
    let response = server
        .rpc(
            &conn,
            1,
            "session/set_mode",
            json!({"sessionId": session, "modeId": "plan"}),
        )
        .await;
    expect_result(&response);
    let got = session_get(&server, &conn, &session).await;
    assert_eq!(namespace(&got)["mode"], "plan", "{got}");
}

// ---------------------------------------------------------------------------
// agent/list and GET /v2/agents
// ---------------------------------------------------------------------------

/// The `mock` entry of an agent list.
fn mock_entry(list: &Value) -> Value {
    list["agents"]
        .as_array()
        .and_then(|agents| agents.iter().find(|a| a["id"] == MOCK))
        .cloned()
        .unwrap_or_else(|| panic!("no mock agent in {list}"))
}

/// Prompts `!crash` and waits until the session is reported ended.
async fn crash_the_agent(server: &TestServer, conn: &str, stream: &mut SseStream) {
    let session = server.new_session(conn).await;
    let reply = server
        .prompt(conn, &session, json!("crash"), "!crash")
        .await;
    assert!(
        reply.get("error").is_some(),
        "the crashed turn fails: {reply}"
    );
    stream
        .next_event_matching(
            |e| e.method() == Some(SESSION_ENDED) && e.session_id() == Some(session.as_str()),
            EVENT_TIMEOUT,
        )
        .await;
}

#[tokio::test]
async fn agent_list_reports_state_models_and_restarts() {
    let server = TestServer::start(&[]).await;
    let idle = mock_entry(&server.get_json("/v2/agents").await);
    assert_eq!(idle["installed"], true, "{idle}");
    assert_eq!(idle["running"], false, "nothing started yet: {idle}");
    assert_eq!(idle["source"], "builtin", "{idle}");
    assert_eq!(idle["restarts"], 0, "{idle}");
    assert!(
        idle["name"].as_str().is_some_and(|n| !n.is_empty()),
        "{idle}"
    );
    assert!(idle.get("models").is_none_or(Value::is_null), "{idle}");

    let conn = server.initialize(MOCK).await;
    let mut stream = server.open_stream(&conn, None).await;
    server.new_session(&conn).await;
    let http = server.get_json("/v2/agents").await;
    let rpc = server.rpc(&conn, 1, AGENT_LIST, json!({})).await;
    assert_eq!(
        expect_result(&rpc),
        &http,
        "agent/list equals GET /v2/agents"
    );
    let running = mock_entry(&http);
    assert_eq!(running["running"], true, "{running}");
    assert!(running["pid"].as_u64().is_some_and(|p| p > 0), "{running}");
    assert_eq!(running["models"], mock_models(), "{running}");
    let modes: Vec<&str> = running["modes"]
        .as_array()
        .map(|m| m.iter().filter_map(|m| m["id"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(modes, ["default", "plan"], "{running}");
    assert_eq!(running["capabilities"]["loadSession"], true, "{running}");

    crash_the_agent(&server, &conn, &mut stream).await;
    let crashed = mock_entry(&server.get_json("/v2/agents").await);
    assert_eq!(crashed["running"], false, "{crashed}");
    assert_eq!(crashed["restarts"], 0, "{crashed}");
    assert!(
        crashed["lastError"].as_str().is_some_and(|e| !e.is_empty()),
        "{crashed}"
    );

    for restarts in 1..=2 {
        let conn = server.initialize(MOCK).await;
        let mut stream = server.open_stream(&conn, None).await;
        let entry = mock_entry(&server.get_json("/v2/agents").await);
        assert_eq!(entry["running"], true, "{entry}");
        assert_eq!(entry["restarts"], restarts, "{entry}");
        crash_the_agent(&server, &conn, &mut stream).await;
    }
}

/// The seed-era names clients written to seed 001 call: `_sandboxagent/session/list`
/// is `session/list`, `_sandboxagent/agent/install` is
/// `POST /v2/agents/{agent}/install` (a failure carries the same problem type).
#[tokio::test]
async fn seed_era_session_list_and_agent_install() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let first = server.new_session(&conn).await;
    let second = server.new_session(&conn).await;
    let acp_list = server.rpc(&conn, 1, "session/list", json!({})).await;
    let seed_list = server.rpc(&conn, 2, SESSION_LIST, json!({})).await;
    assert_eq!(
        session_ids(expect_result(&seed_list)),
        session_ids(expect_result(&acp_list))
    );
    assert_eq!(session_ids(expect_result(&seed_list)), [second, first]);
    let bad_cursor = server
        .rpc(&conn, 3, SESSION_LIST, json!({"cursor": "nonsense"}))
        .await;
    expect_error(&bad_cursor, INVALID_PARAMS);

    let installed = server
        .rpc(&conn, 4, AGENT_INSTALL, json!({"agent": MOCK}))
        .await;
    let result = expect_result(&installed);
    assert_eq!(result["agent"], MOCK, "{installed}");
    assert_eq!(result["alreadyInstalled"], true, "{installed}");
    let http = server
        .api()
        .request(reqwest::Method::POST, "/v2/agents/mock/install")
        .send()
        .await
        .expect("install over HTTP");
    let http: Value = http.json().await.expect("JSON");
    assert_eq!(result["source"], http["source"], "{http}");

    let unknown = server
        .rpc(&conn, 5, AGENT_INSTALL, json!({"agent": "nope"}))
        .await;
    let error = expect_error(&unknown, INVALID_PARAMS);
    assert_eq!(
        error["data"]["type"], "urn:sandbox-agent:error:unknown-agent",
        "{unknown}"
    );
    assert_eq!(error["data"]["status"], 404, "{unknown}");
    let missing = server.rpc(&conn, 6, AGENT_INSTALL, json!({})).await;
    expect_error(&missing, INVALID_PARAMS);
}
