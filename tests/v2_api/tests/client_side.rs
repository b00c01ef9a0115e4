//! The agent's client-side files and terminals, served in the sandbox
//! (research/contract.md, "Files and terminals of the agent, served in the
//! sandbox"): the runtime declares the capabilities to its agent and answers
//! `fs/read_text_file`, `fs/write_text_file` and `terminal/*` in the
//! session's `cwd`, under `--fs-root`, never in its own data dir; a
//! connection that opted in answers them itself. Driven by the mock agent's
//! `read file`, `read lines`, `write file` and `use terminal` prompts; real
//! binary, real files.

use serde_json::{Value, json};
use std::path::Path;
use v2_api_tests::acp::{self, stop_reason};
use v2_api_tests::agents::{TempDir, agents_file};
use v2_api_tests::ext::new_session_params;
use v2_api_tests::{
    EVENT_TIMEOUT, MOCK, REQUEST_TIMEOUT, TestServer, join_within, path_segment,
    server::sandbox_agent_bin, shell_quote,
};

/// `session/new` for `agent` on `conn` in `cwd`; the session id.
async fn session_in(server: &TestServer, conn: &str, agent: &str, cwd: &Path) -> String {
    let params = new_session_params(agent, &cwd.to_string_lossy(), &json!({}));
    let reply = server
        .call(conn, &acp::request(1, "session/new", params))
        .await;
    reply["result"]["sessionId"]
        .as_str()
        .unwrap_or_else(|| panic!("session/new failed: {reply}"))
        .to_owned()
}

/// Every logged message of `agent`'s `session` (the `message` of each event).
async fn logged(server: &TestServer, agent: &str, session: &str) -> Vec<Value> {
    let page = server
        .get_json(&format!(
            "/v2/sessions/{}/events?agent={agent}&limit=1000",
            path_segment(session)
        ))
        .await;
    page["events"]
        .as_array()
        .map(|events| events.iter().map(|e| e["message"].clone()).collect())
        .unwrap_or_default()
}

/// Prompts `text` and returns the turn's one reply chunk (every file and
/// terminal turn of the mock replies with one `agent_message_chunk`).
async fn turn(server: &TestServer, conn: &str, agent: &str, session: &str, text: &str) -> String {
    let reply = server.prompt(conn, session, json!(2), text).await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{text}: {reply}");
    let messages = logged(server, agent, session).await;
    messages
        .iter()
        .rev()
        .find_map(|m| {
            (m["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
                .then(|| m["params"]["update"]["content"]["text"].as_str())
                .flatten()
        })
        .unwrap_or_else(|| panic!("no reply chunk for {text}: {messages:#?}"))
        .to_owned()
}

/// `initialize` params for `agent` declaring `capabilities`, with the
/// namespace members of `meta` besides `agent`.
fn initialize_params(agent: &str, capabilities: Value, meta: Value) -> Value {
    let mut params = acp::initialize_params(agent);
    params["clientCapabilities"] = capabilities;
    if let (Some(namespace), Some(extra)) = (
        params["_meta"]["sandboxagent.dev"].as_object_mut(),
        meta.as_object(),
    ) {
        namespace.extend(extra.clone());
    }
    params
}

/// `initialize` with `params`; the new connection's id.
async fn initialize_with(server: &TestServer, params: Value) -> String {
    let reply = server
        .post(None, &acp::request(0, "initialize", params))
        .await;
    reply.assert_status(200);
    reply.connection_id().expect("a connection id")
}

#[tokio::test]
async fn the_mock_writes_and_reads_files_in_its_session_cwd() {
    let root = TempDir::new("client-fs-root");
    let work = root.path().join("work");
    std::fs::create_dir_all(&work).expect("work dir");
    let server = TestServer::start(&["--fs-root", root.utf8()]).await;
    let conn = server.initialize(MOCK).await;
    let session = session_in(&server, &conn, MOCK, &work).await;
    let mut stream = server.open_stream(&conn, None).await;

    // A relative path starts at the session's cwd; parents are made.
    let reply = turn(
        &server,
        &conn,
        MOCK,
        &session,
        "write file notes/today.txt first line",
    )
    .await;
    assert_eq!(reply, "Wrote 10 bytes to notes/today.txt.");
    let written = std::fs::read(work.join("notes/today.txt")).expect("the file was written");
    assert_eq!(written, b"first line");
    let names: Vec<_> = std::fs::read_dir(work.join("notes"))
        .expect("notes")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names, ["today.txt"], "no temp file is left beside it");

    // An absolute path inside the root; `line` and `limit` pick lines.
    std::fs::write(work.join("lines.txt"), "one\ntwo\nthree\n").expect("lines");
    let reply = turn(&server, &conn, MOCK, &session, "read file notes/today.txt").await;
    assert_eq!(reply, "Read 10 bytes:\nfirst line");
    let absolute = work.join("lines.txt");
    let text = format!("read lines 2 1 {}", absolute.display());
    assert_eq!(
        turn(&server, &conn, MOCK, &session, &text).await,
        "Read 4 bytes:\ntwo\n"
    );
    let text = format!("read lines 2 9 {}", absolute.display());
    assert_eq!(
        turn(&server, &conn, MOCK, &session, &text).await,
        "Read 10 bytes:\ntwo\nthree\n"
    );

    // The requests and the runtime's answers are in the session's log, as a
    // client's answers to agent requests are.
    let messages = logged(&server, MOCK, &session).await;
    let request = messages
        .iter()
        .find(|m| m["method"] == "fs/write_text_file")
        .unwrap_or_else(|| panic!("the write request is logged: {messages:#?}"));
    assert_eq!(request["params"]["content"], "first line");
    let answer = messages
        .iter()
        .find(|m| m["id"] == request["id"] && m.get("method").is_none())
        .unwrap_or_else(|| panic!("the answer is logged: {messages:#?}"));
    assert_eq!(answer["result"], json!({}));

    // The connection declared no capability: it never saw the requests.
    stream
        .collect_until(
            |e| e.agent_text() == Some("Read 10 bytes:\ntwo\nthree\n"),
            EVENT_TIMEOUT,
        )
        .await;
    assert!(
        stream
            .history
            .iter()
            .all(|e| !e.method().is_some_and(|m| m.starts_with("fs/"))),
        "{:#?}",
        stream.history
    );
}

#[tokio::test]
async fn paths_outside_the_root_and_in_the_data_dir_are_refused() {
    let root = TempDir::new("client-fs-refused");
    let (work, data) = (root.path().join("work"), root.path().join("data"));
    std::fs::create_dir_all(&work).expect("work dir");
    let outside = TempDir::new("client-fs-outside");
    let secret = outside.write("secret.txt", b"secret");
    let server = TestServer::start(&[
        "--fs-root",
        root.utf8(),
        "--data-dir",
        &data.to_string_lossy(),
    ])
    .await;
    let conn = server.initialize(MOCK).await;
    let session = session_in(&server, &conn, MOCK, &work).await;
    let ask = |text: String| {
        let (server, conn, session) = (&server, &conn, &session);
        async move { turn(server, conn, MOCK, session, &text).await }
    };

    let reply = ask(format!("read file {}", secret.display())).await;
    assert!(
        reply.starts_with("fs error -32602: ") && reply.contains("outside the file system root"),
        "{reply}"
    );
    let reply = ask("read file ../data/runtime-id".to_owned()).await;
    assert!(reply.starts_with("fs error -32602: "), "{reply}");

    // The data dir is inside the root, but no agent request reaches it:
    // not by its path, not through a symlink, not to write.
    let runtime_id = data.join("runtime-id");
    assert!(runtime_id.exists(), "the server made its runtime id");
    let reply = ask(format!("read file {}", runtime_id.display())).await;
    assert!(
        reply.starts_with("fs error -32602: permission denied: ")
            && reply.contains("runtime's own data"),
        "{reply}"
    );
    std::os::unix::fs::symlink(&data, work.join("link")).expect("symlink");
    let reply = ask("read file link/runtime-id".to_owned()).await;
    assert!(reply.contains("runtime's own data"), "{reply}");
    let planted = data.join("homes/planted.txt");
    let reply = ask(format!("write file {} x", planted.display())).await;
    assert!(reply.contains("runtime's own data"), "{reply}");
    assert!(!planted.exists());
    let reply = ask(format!("write file {} x", data.join("new/x.txt").display())).await;
    assert!(reply.contains("runtime's own data"), "{reply}");
    assert!(
        !data.join("new").exists(),
        "no directory made in the data dir"
    );
    let store = data.join("sessions.db");
    let reply = ask(format!("write file {} x", store.display())).await;
    assert!(reply.contains("runtime's own data"), "{reply}");

    // A missing file is ACP's "resource not found".
    let reply = ask("read file missing.txt".to_owned()).await;
    assert!(reply.starts_with("fs error -32002: "), "{reply}");
}

#[tokio::test]
async fn without_a_root_the_data_dir_is_still_refused() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let work = TempDir::new("client-fs-unconfined");
    let session = session_in(&server, &conn, MOCK, work.path()).await;
    let runtime_id = server.data_dir().join("runtime-id");
    let text = format!("read file {}", runtime_id.display());
    let reply = turn(&server, &conn, MOCK, &session, &text).await;
    assert!(reply.contains("runtime's own data"), "{reply}");
    // Elsewhere the agent reads what the server's user can.
    let elsewhere = TempDir::new("client-fs-elsewhere");
    let file = elsewhere.write("a.txt", b"readable");
    let text = format!("read file {}", file.display());
    let reply = turn(&server, &conn, MOCK, &session, &text).await;
    assert_eq!(reply, "Read 8 bytes:\nreadable");
}

#[tokio::test]
async fn a_connection_that_opted_in_answers_them_itself() {
    let server = TestServer::start(&[]).await;
    let work = TempDir::new("client-fs-opted");
    let params = initialize_params(
        MOCK,
        json!({"fs": {"readTextFile": true}}),
        json!({"fsAndTerminal": "client"}),
    );
    let conn = initialize_with(&server, params).await;
    let session = session_in(&server, &conn, MOCK, work.path()).await;
    let mut stream = server.open_stream(&conn, None).await;

    let api = server.api();
    let (c, s) = (conn.clone(), session.clone());
    let prompt = tokio::spawn(async move {
        api.prompt(&c, &s, json!(5), "read file /on/the/client.txt")
            .await
    });
    let request = stream
        .next_event_matching(|e| e.method() == Some("fs/read_text_file"), EVENT_TIMEOUT)
        .await;
    assert_eq!(request.params()["path"], "/on/the/client.txt");
    let answer = acp::response(
        request.data["id"].clone(),
        json!({"content": "from the client"}),
    );
    server
        .post(Some(&conn), &answer)
        .await
        .assert_accepted_empty();
    let reply = join_within(prompt, REQUEST_TIMEOUT).await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
    let text = stream
        .next_event_matching(|e| e.agent_text().is_some(), EVENT_TIMEOUT)
        .await;
    assert_eq!(text.agent_text(), Some("Read 15 bytes:\nfrom the client"));

    // It did not declare writeTextFile: that one the runtime serves.
    let reply = turn(
        &server,
        &conn,
        MOCK,
        &session,
        "write file w.txt by the runtime",
    )
    .await;
    assert_eq!(reply, "Wrote 14 bytes to w.txt.");
    assert_eq!(
        std::fs::read(work.path().join("w.txt")).expect("written"),
        b"by the runtime"
    );

    // A connection that declared fs without opting in does not get them.
    let declared = initialize_params(MOCK, json!({"fs": {"readTextFile": true}}), json!({}));
    let other = initialize_with(&server, declared).await;
    let other_session = session_in(&server, &other, MOCK, work.path()).await;
    let mut other_stream = server.open_stream(&other, None).await;
    let reply = turn(&server, &other, MOCK, &other_session, "read file w.txt").await;
    assert_eq!(reply, "Read 14 bytes:\nby the runtime");
    let events = other_stream
        .collect_until(|e| e.agent_text().is_some(), EVENT_TIMEOUT)
        .await;
    assert!(
        events
            .iter()
            .all(|e| e.method() != Some("fs/read_text_file")),
        "{events:#?}"
    );
}

/// A manifest entry that runs the mock agent and keeps the runtime's
/// `initialize` line in `record` (the line is fed on to the mock).
fn recording_mock(dir: &TempDir, record: &Path, capabilities: Value) -> Value {
    let script = format!(
        "IFS= read -r line\nprintf '%s\\n' \"$line\" > {}\n{{ printf '%s\\n' \"$line\"; exec cat; }} | exec {} mock-agent\n",
        shell_quote(&record.to_string_lossy()),
        shell_quote(&sandbox_agent_bin().to_string_lossy()),
    );
    let path = dir.write("recording-mock.sh", script.as_bytes());
    json!({
        "id": "recorded",
        "distribution": {"local": {"command": "/bin/sh", "args": [path.to_string_lossy()]}},
        "clientCapabilities": capabilities,
    })
}

#[tokio::test]
async fn the_manifest_turns_a_capability_off_and_adds_its_own() {
    let dir = TempDir::new("client-fs-manifest");
    let record = dir.path().join("initialize.json");
    let entry = recording_mock(
        &dir,
        &record,
        json!({"fs": {"writeTextFile": false}, "_meta": {"x": 1}}),
    );
    let file = agents_file(&dir, json!([entry]));
    let server = TestServer::start(&["--agents-file", &file]).await;
    let conn = server.initialize("recorded").await;
    let initialize: Value =
        serde_json::from_slice(&std::fs::read(&record).expect("the runtime's initialize"))
            .expect("JSON");
    let declared = &initialize["params"]["clientCapabilities"];
    assert_eq!(
        declared["fs"],
        json!({"readTextFile": true, "writeTextFile": false}),
        "{initialize}"
    );
    assert_eq!(declared["_meta"], json!({"x": 1}), "{initialize}");

    let work = TempDir::new("client-fs-manifest-work");
    work.write("r.txt", b"served");
    let session = session_in(&server, &conn, "recorded", work.path()).await;
    let reply = turn(&server, &conn, "recorded", &session, "read file r.txt").await;
    assert_eq!(reply, "Read 6 bytes:\nserved");
    // Turned off and declared by no connection: "method not found", as
    // before for every such request.
    let reply = turn(&server, &conn, "recorded", &session, "write file w.txt no").await;
    assert!(reply.starts_with("fs error -32601: "), "{reply}");
    assert!(!work.path().join("w.txt").exists());
}

/// Waits up to [`EVENT_TIMEOUT`] for a process of `session` for which
/// `ready` holds; returns its description.
async fn process_of(server: &TestServer, session: &str, ready: impl Fn(&Value) -> bool) -> Value {
    let deadline = std::time::Instant::now() + EVENT_TIMEOUT;
    loop {
        let page = server
            .get_json(&format!(
                "/v2/processes?sessionId={}",
                v2_api_tests::query_path(session)
            ))
            .await;
        let found = page["processes"]
            .as_array()
            .and_then(|processes| processes.iter().find(|p| ready(p)).cloned());
        if let Some(process) = found {
            return process;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no such process of {session}: {page}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
}

#[tokio::test]
async fn the_terminal_round_trip_runs_in_the_sandbox() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let work = TempDir::new("client-terminal");
    let session = session_in(&server, &conn, MOCK, work.path()).await;

    let reply = turn(
        &server,
        &conn,
        MOCK,
        &session,
        "use terminal pwd; printf 'é' > made-here.txt; exit 3",
    )
    .await;
    let real = work.path().canonicalize().expect("real path");
    assert_eq!(
        reply,
        format!("Terminal exited with code 3:\n{}\n", real.display())
    );
    assert!(
        work.path().join("made-here.txt").exists(),
        "ran in the session's cwd"
    );

    // create → tool call naming the terminal → wait → output → release,
    // each answered by the runtime and logged.
    let messages = logged(&server, MOCK, &session).await;
    let requests: Vec<&str> = messages
        .iter()
        .filter_map(|m| m["method"].as_str())
        .filter(|m| m.starts_with("terminal/"))
        .collect();
    assert_eq!(
        requests,
        [
            "terminal/create",
            "terminal/wait_for_exit",
            "terminal/output",
            "terminal/release"
        ]
    );
    let create = messages
        .iter()
        .find(|m| m["method"] == "terminal/create")
        .expect("create");
    let created = messages
        .iter()
        .find(|m| m["id"] == create["id"] && m.get("method").is_none())
        .expect("the create answer is logged");
    let terminal = created["result"]["terminalId"]
        .as_str()
        .expect("terminalId");
    let call = messages
        .iter()
        .find(|m| m["params"]["update"]["sessionUpdate"] == "tool_call")
        .expect("the tool call");
    assert_eq!(
        call["params"]["update"]["content"],
        json!([{"type": "terminal", "terminalId": terminal}])
    );
    let waited = messages
        .iter()
        .find(|m| m.get("result").is_some() && m["result"].get("exitCode").is_some())
        .expect("the wait answer");
    assert_eq!(waited["result"], json!({"exitCode": 3}));

    // Released: the process is forgotten.
    let gone = server.get(&format!("/v2/processes/{terminal}")).await;
    gone.assert_status(404);
}

/// At `--max-processes`, `terminal/create` is answered as the contract
/// says: `-32603` (a limit of the sandbox, not bad params), with the
/// problem's type `too-many-processes` in `data`.
#[tokio::test]
async fn a_terminal_past_max_processes_is_an_internal_error_naming_the_limit() {
    let server = TestServer::start(&["--max-processes", "1"]).await;
    let started = v2_api_tests::Api::send(
        server
            .api()
            .request(reqwest::Method::POST, "/v2/processes")
            .json(&json!({"command": "sleep", "args": ["100"]})),
    )
    .await;
    started.assert_status(201);
    let conn = server.initialize(MOCK).await;
    let work = TempDir::new("client-terminal-limit");
    let session = session_in(&server, &conn, MOCK, work.path()).await;
    let reply = turn(&server, &conn, MOCK, &session, "use terminal true").await;
    assert!(reply.starts_with("terminal error -32603: "), "{reply}");
    let messages = logged(&server, MOCK, &session).await;
    let create = messages
        .iter()
        .find(|m| m["method"] == "terminal/create")
        .expect("create");
    let answer = messages
        .iter()
        .find(|m| m["id"] == create["id"] && m.get("method").is_none())
        .expect("the create answer is logged");
    assert_eq!(answer["error"]["code"], -32603, "{answer}");
    assert_eq!(
        answer["error"]["data"]["type"], "urn:sandbox-agent:error:too-many-processes",
        "{answer}"
    );
}

#[tokio::test]
async fn an_agent_terminal_is_a_process_followed_live_with_its_session_and_tool_call() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let work = TempDir::new("client-terminal-live");
    let session = session_in(&server, &conn, MOCK, work.path()).await;
    let api = server.api();
    let (c, s) = (conn.clone(), session.clone());
    let prompt = tokio::spawn(async move {
        api.prompt(
            &c,
            &s,
            json!(9),
            "use terminal echo started; while [ ! -e go ]; do sleep 0.05; done; echo done",
        )
        .await
    });

    // While it runs: a process of the session, tagged with the tool call.
    let process = process_of(&server, &session, |p| {
        p["toolCallId"] == "mock-terminal-1" && p["outputBytes"].as_u64() > Some(0)
    })
    .await;
    assert_eq!(process["state"], "running", "{process}");
    assert_eq!(process["sessionId"], session.as_str());
    assert_eq!(process["command"], "sh");
    let id = process["id"].as_str().expect("id");
    let page = server.get_json(&format!("/v2/processes/{id}/output")).await;
    assert_eq!(page["chunks"][0]["data"], "started\n", "{page}");
    work.write("go", b"");

    let reply = join_within(prompt, REQUEST_TIMEOUT).await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
    let text = turn_reply(&server, MOCK, &session).await;
    assert_eq!(text, "Terminal exited with code 0:\nstarted\ndone\n");
}

/// The last reply chunk of `session` (see [`turn`]).
async fn turn_reply(server: &TestServer, agent: &str, session: &str) -> String {
    logged(server, agent, session)
        .await
        .iter()
        .rev()
        .find_map(|m| {
            (m["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
                .then(|| {
                    m["params"]["update"]["content"]["text"]
                        .as_str()
                        .map(str::to_owned)
                })
                .flatten()
        })
        .expect("a reply chunk")
}

#[tokio::test]
async fn an_agent_that_exits_takes_its_terminals_with_it() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let work = TempDir::new("client-terminal-exit");
    let session = session_in(&server, &conn, MOCK, work.path()).await;
    let other = session_in(&server, &conn, MOCK, work.path()).await;
    let api = server.api();
    let (c, s) = (conn.clone(), session.clone());
    let _prompt =
        tokio::spawn(async move { api.prompt(&c, &s, json!(9), "use terminal sleep 600").await });
    let process = process_of(&server, &session, |p| p["pid"].as_u64().is_some()).await;
    let pid = u32::try_from(process["pid"].as_u64().unwrap_or(0)).unwrap_or(0);
    assert!(v2_api_tests::procfs::pid_is_alive(pid));

    // The agent crashes in another session: its terminal dies with it.
    server.prompt(&conn, &other, json!(10), "!crash").await;
    let deadline = std::time::Instant::now() + EVENT_TIMEOUT;
    while v2_api_tests::procfs::pid_is_alive(pid) {
        assert!(
            std::time::Instant::now() < deadline,
            "the terminal outlived its agent"
        );
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    let id = process["id"].as_str().expect("id");
    server
        .get(&format!("/v2/processes/{id}"))
        .await
        .assert_status(404);
}

#[tokio::test]
async fn without_processes_no_terminal_is_declared_or_served() {
    let dir = TempDir::new("client-terminal-off");
    let record = dir.path().join("initialize.json");
    let entry = recording_mock(&dir, &record, json!({}));
    let file = agents_file(&dir, json!([entry]));
    let server = TestServer::start(&["--agents-file", &file, "--no-processes"]).await;
    let conn = server.initialize("recorded").await;
    let initialize: Value =
        serde_json::from_slice(&std::fs::read(&record).expect("the runtime's initialize"))
            .expect("JSON");
    assert_eq!(
        initialize["params"]["clientCapabilities"],
        json!({"fs": {"readTextFile": true, "writeTextFile": true},
            "elicitation": {"form": {}, "url": {}}}),
        "{initialize}"
    );
    let session = session_in(&server, &conn, "recorded", dir.path()).await;
    let reply = turn(&server, &conn, "recorded", &session, "use terminal echo x").await;
    assert!(reply.starts_with("terminal error -32601: "), "{reply}");
}

#[tokio::test]
async fn with_processes_terminal_is_declared_and_an_opted_in_connection_runs_it() {
    let dir = TempDir::new("client-terminal-on");
    let record = dir.path().join("initialize.json");
    let entry = recording_mock(&dir, &record, json!({}));
    let file = agents_file(&dir, json!([entry]));
    let server = TestServer::start(&["--agents-file", &file]).await;
    let params = initialize_params(
        "recorded",
        json!({"terminal": true}),
        json!({"fsAndTerminal": "client"}),
    );
    let conn = initialize_with(&server, params).await;
    let initialize: Value =
        serde_json::from_slice(&std::fs::read(&record).expect("the runtime's initialize"))
            .expect("JSON");
    assert_eq!(
        initialize["params"]["clientCapabilities"],
        json!({"fs": {"readTextFile": true, "writeTextFile": true}, "terminal": true,
            "elicitation": {"form": {}, "url": {}}}),
        "{initialize}"
    );
    let session = session_in(&server, &conn, "recorded", dir.path()).await;
    let mut stream = server.open_stream(&conn, None).await;
    let api = server.api();
    let (c, s) = (conn.clone(), session.clone());
    let prompt =
        tokio::spawn(async move { api.prompt(&c, &s, json!(4), "use terminal echo x").await });
    let request = stream
        .next_event_matching(|e| e.method() == Some("terminal/create"), EVENT_TIMEOUT)
        .await;
    let refusal = json!({"jsonrpc": "2.0", "id": request.data["id"],
        "error": {"code": -32000, "message": "not on this client"}});
    server
        .post(Some(&conn), &refusal)
        .await
        .assert_accepted_empty();
    let reply = join_within(prompt, REQUEST_TIMEOUT).await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
    assert_eq!(
        turn_reply(&server, "recorded", &session).await,
        "terminal error -32000: not on this client"
    );
    let page = server.get_json("/v2/processes").await;
    assert_eq!(page["processes"], json!([]), "the runtime started nothing");
}

#[tokio::test]
async fn a_killed_terminal_keeps_its_output_until_released() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let work = TempDir::new("client-terminal-kill");
    let session = session_in(&server, &conn, MOCK, work.path()).await;
    let reply = turn(
        &server,
        &conn,
        MOCK,
        &session,
        "kill terminal echo before; sleep 600; echo never",
    )
    .await;
    assert_eq!(reply, "Terminal exited killed by signal SIGKILL:\nbefore\n");
    let messages = logged(&server, MOCK, &session).await;
    let methods: Vec<&str> = messages
        .iter()
        .filter_map(|m| m["method"].as_str())
        .filter(|m| m.starts_with("terminal/"))
        .collect();
    let kill = methods
        .iter()
        .position(|m| *m == "terminal/kill")
        .unwrap_or_else(|| panic!("{methods:?}"));
    assert_eq!(
        methods[kill..],
        [
            "terminal/kill",
            "terminal/wait_for_exit",
            "terminal/output",
            "terminal/release"
        ]
    );
    let page = server
        .get_json(&format!(
            "/v2/processes?sessionId={}",
            v2_api_tests::query_path(&session)
        ))
        .await;
    assert_eq!(page["processes"], json!([]), "released");
}
