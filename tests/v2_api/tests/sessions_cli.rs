//! `sandbox-agent sessions list|show|events`, end to end (research/contract.md,
//! "Durable sessions", "CLI: sandbox-agent sessions"): the real binary as a
//! child process against a real server (`--url`), and against the server's
//! SQLite file once the server stopped (`--store`), checking stdout, stderr
//! and the exit status.

use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use v2_api_tests::ext::{SET_METADATA, TERMINATE, expect_result, session_ref};
use v2_api_tests::server::sandbox_agent_command;
use v2_api_tests::{SHUTDOWN_GRACE, TestServer};

/// Bound on one `sessions` run.
const RUN_TIMEOUT: Duration = Duration::from_secs(30);
/// Bound on `events --follow` showing an event that is recorded.
const FOLLOW_TIMEOUT: Duration = Duration::from_secs(15);

/// What one run printed.
struct Run {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.status, self.stdout, self.stderr
        )
    }
}

/// Runs `sandbox-agent sessions <args>` to its end.
async fn sessions(args: &[&str]) -> Run {
    let mut command = tokio::process::Command::from(sandbox_agent_command());
    command
        .arg("sessions")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = command.spawn().expect("spawn sandbox-agent sessions");
    let output = match tokio::time::timeout(RUN_TIMEOUT, child.wait_with_output()).await {
        Ok(output) => output.expect("run sandbox-agent sessions"),
        Err(_) => panic!("sandbox-agent sessions {args:?} did not finish within {RUN_TIMEOUT:?}"),
    };
    Run {
        status: output.status,
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Like [`sessions`], asserting exit status 0 and no error message.
async fn sessions_ok(args: &[&str]) -> Run {
    let run = sessions(args).await;
    assert!(run.status.success(), "sessions {args:?}: {run:?}");
    assert!(!run.stderr.contains("sandbox-agent:"), "no error: {run:?}");
    run
}

/// A mock session on `server` with one finished prompt turn of `text`;
/// returns (connection id, session id).
async fn session_with_turn(server: &TestServer, text: &str) -> (String, String) {
    let conn = server.initialize("mock").await;
    let session = server.new_session(&conn).await;
    let reply = server.prompt(&conn, &session, json!(2), text).await;
    assert_eq!(
        reply["result"]["stopReason"], "end_turn",
        "the turn ends: {reply}"
    );
    (conn, session)
}

/// The `list` line of `session`, asserting there is exactly one.
fn list_line<'a>(run: &'a Run, session: &str) -> &'a str {
    let lines: Vec<&str> = run
        .stdout
        .lines()
        .filter(|line| line.starts_with(session))
        .collect();
    assert_eq!(lines.len(), 1, "one line for {session}: {run:?}");
    lines[0]
}

/// The whitespace-separated columns of a `list` line.
fn columns(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

#[tokio::test]
async fn list_show_and_events_read_a_server_and_then_its_store() {
    let mut server = TestServer::start(&[]).await;
    let url = server.base_url().to_owned();
    let (_conn, session) = session_with_turn(&server, "remember the tulips").await;

    // list: a header line, then the session: id, agent, state, events.
    let run = sessions_ok(&["list", "--url", &url]).await;
    let header = run.stdout.lines().next().unwrap_or_default();
    assert_eq!(
        columns(header),
        [
            "ID", "AGENT", "STATE", "EVENTS", "UPDATED", "(UTC)", "TITLE"
        ],
        "{run:?}"
    );
    let line = list_line(&run, &session);
    let cells = columns(line);
    assert_eq!(cells[1], "mock", "{run:?}");
    assert_eq!(cells[2], "live", "{run:?}");
    let listed_count: u64 = cells[3].parse().expect("an event count");
    assert!(
        listed_count >= 4,
        "new, its result, prompt, result: {run:?}"
    );
    // Columns are aligned: the agent column starts where its header does.
    assert_eq!(line.find(" mock "), header.find(" AGENT"), "{run:?}");

    // --json: the control plane's body.
    let run = sessions_ok(&["list", "--url", &url, "--json"]).await;
    let body: Value = serde_json::from_str(&run.stdout).expect("list --json is JSON");
    let entry = body["sessions"]
        .as_array()
        .and_then(|all| all.iter().find(|e| e["sessionId"] == session.as_str()))
        .unwrap_or_else(|| panic!("the session in list --json: {body}"));
    assert_eq!(entry["_meta"]["sandboxagent.dev"]["agent"], "mock");

    // show: one field per line.
    let run = sessions_ok(&["show", &session, "--url", &url]).await;
    let field = |name: &str| {
        run.stdout
            .lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ').map(str::trim))
            .unwrap_or_else(|| panic!("show has {name}: {run:?}"))
            .to_owned()
    };
    assert_eq!(field("id"), session);
    assert_eq!(field("agent"), "mock");
    assert_eq!(field("state"), "live");
    assert_eq!(field("events"), listed_count.to_string());

    // events: the prompt (client to agent), the reply chunks and the result
    // (agent to client), offsets from 0 in order.
    let run = sessions_ok(&["events", &session, "--url", &url]).await;
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len() as u64, listed_count, "{run:?}");
    let offsets: Vec<u64> = lines
        .iter()
        .map(|line| columns(line)[0].parse().expect("an offset"))
        .collect();
    assert_eq!(offsets, (0..listed_count).collect::<Vec<_>>(), "{run:?}");
    let prompt = lines
        .iter()
        .find(|line| line.contains("session/prompt"))
        .unwrap_or_else(|| panic!("a session/prompt line: {run:?}"));
    assert!(prompt.contains('→'), "{run:?}");
    assert!(prompt.contains("\"remember the tulips\""), "{run:?}");
    assert!(
        lines
            .iter()
            .any(|line| line.contains('←') && line.contains("agent_message_chunk \"tulips\"")),
        "the reply's last chunk: {run:?}"
    );
    assert!(
        lines
            .iter()
            .any(|line| line.contains("result #2") && line.contains("end_turn")),
        "the prompt's result: {run:?}"
    );
    // --from skips what was seen.
    let from = (listed_count - 1).to_string();
    let run = sessions_ok(&["events", &session, "--url", &url, "--from", &from]).await;
    assert_eq!(run.stdout.lines().count(), 1, "{run:?}");

    // After a graceful stop, the store holds the same session, dormant.
    server.send_sigterm();
    assert!(
        server.wait_exit(SHUTDOWN_GRACE).await.is_some(),
        "the server stops on SIGTERM"
    );
    let data_dir = server.data_dir().to_string_lossy().into_owned();
    let store = format!("sqlite:{data_dir}/sessions.db");
    let offline = ["--store", store.as_str(), "--data-dir", data_dir.as_str()];
    let run = sessions_ok(&[&["list"][..], &offline].concat()).await;
    let cells = columns(list_line(&run, &session)).join(" ");
    assert!(
        cells.starts_with(&format!("{session} mock dormant {listed_count} ")),
        "{run:?}"
    );
    let run = sessions_ok(&[&["events", session.as_str()][..], &offline].concat()).await;
    assert_eq!(run.stdout.lines().count() as u64, listed_count, "{run:?}");
    assert!(
        run.stdout.contains("\"remember the tulips\""),
        "the prompt from the store: {run:?}"
    );
    let run = sessions_ok(&[&["show", session.as_str(), "--json"][..], &offline].concat()).await;
    let entry: Value = serde_json::from_str(&run.stdout).expect("show --json is JSON");
    assert_eq!(entry["sessionId"], session.as_str());
    assert_eq!(entry["_meta"]["sandboxagent.dev"]["dormant"], true);

    // An unknown id in the store.
    let run = sessions(&[&["show", "no-such-session"][..], &offline].concat()).await;
    assert!(!run.status.success(), "{run:?}");
    assert!(
        run.stderr
            .contains("no session with id \"no-such-session\""),
        "{run:?}"
    );
}

/// The ids of a `list` table's lines, in order (the header skipped).
fn listed_ids(run: &Run) -> Vec<String> {
    run.stdout
        .lines()
        .skip(1)
        .map(|line| columns(line)[0].to_owned())
        .collect()
}

/// The cursor `list` printed on stderr for the next page, if any.
fn printed_cursor(run: &Run) -> Option<String> {
    let line = run
        .stderr
        .lines()
        .find_map(|line| line.strip_prefix("next page: --cursor "))?;
    // Printed as one shell word: in single quotes when it needs them.
    let word = match line.strip_prefix('\'').and_then(|l| l.strip_suffix('\'')) {
        Some(quoted) => quoted.replace("'\\''", "'"),
        None => line.to_owned(),
    };
    Some(word)
}

#[tokio::test]
async fn list_pages_with_limit_and_cursor_and_walks_them_with_all() {
    let mut server = TestServer::start(&[]).await;
    let url = server.base_url().to_owned();
    let conn = server.initialize("mock").await;
    let mut created = Vec::new();
    for _ in 0..5 {
        created.push(server.new_session(&conn).await);
    }
    // The newest has a first prompt and no title; an older one a title.
    let reply = server
        .prompt(&conn, &created[4], json!(2), "remember the tulips")
        .await;
    assert_eq!(reply["result"]["stopReason"], "end_turn", "{reply}");
    let titled = server
        .rpc(
            &conn,
            3,
            SET_METADATA,
            json!({"sessionId": created[1], "metadata": {"title": "Fix the login bug"}}),
        )
        .await;
    expect_result(&titled);
    let newest_first: Vec<String> = created.iter().rev().cloned().collect();

    // Pages of 2, each naming the next on stderr, until the last.
    let mut cursor: Option<String> = None;
    let mut paged = Vec::new();
    let mut sizes = Vec::new();
    loop {
        let mut args = vec!["list", "--url", &url, "--limit", "2"];
        if let Some(cursor) = &cursor {
            args.extend(["--cursor", cursor.as_str()]);
        }
        let run = sessions_ok(&args).await;
        let ids = listed_ids(&run);
        sizes.push(ids.len());
        paged.extend(ids);
        cursor = printed_cursor(&run);
        if cursor.is_none() {
            break;
        }
        assert!(sizes.len() < 5, "too many pages: {sizes:?}");
    }
    assert_eq!(sizes, [2, 2, 1], "pages of 2");
    assert_eq!(paged, newest_first, "each session once, newest first");

    // The title column: the title, else the first prompt, quoted.
    let run = sessions_ok(&["list", "--url", &url]).await;
    assert!(printed_cursor(&run).is_none(), "one page: {run:?}");
    assert!(
        list_line(&run, &created[4]).ends_with("\"remember the tulips\""),
        "{run:?}"
    );
    assert!(
        list_line(&run, &created[1]).ends_with("  Fix the login bug"),
        "{run:?}"
    );
    // --json: the server's page, cursor included.
    let run = sessions_ok(&["list", "--url", &url, "--limit", "3", "--json"]).await;
    let body: Value = serde_json::from_str(&run.stdout).expect("list --json is JSON");
    assert_eq!(body["sessions"].as_array().map(Vec::len), Some(3), "{body}");
    assert!(body["nextCursor"].is_string(), "{body}");

    // --all walks every page into one table, no cursor left.
    let run = sessions_ok(&["list", "--url", &url, "--all", "--limit", "2"]).await;
    assert_eq!(listed_ids(&run), newest_first, "{run:?}");
    assert!(printed_cursor(&run).is_none(), "{run:?}");
    let run = sessions_ok(&["list", "--url", &url, "--all", "--json"]).await;
    let body: Value = serde_json::from_str(&run.stdout).expect("list --all --json is JSON");
    assert_eq!(body["sessions"].as_array().map(Vec::len), Some(5), "{body}");
    assert!(body.get("nextCursor").is_none(), "{body}");

    // Filters: state, title text (any case), agent.
    let ended = server
        .rpc(&conn, 4, TERMINATE, session_ref(&created[0]))
        .await;
    expect_result(&ended);
    let run = sessions_ok(&["list", "--url", &url, "--state", "ended"]).await;
    assert_eq!(listed_ids(&run), [created[0].clone()], "{run:?}");
    let run = sessions_ok(&["list", "--url", &url, "--state", "live", "--limit", "3"]).await;
    assert_eq!(listed_ids(&run), newest_first[..3], "{run:?}");
    let run = sessions_ok(&["list", "--url", &url, "-q", "LOGIN"]).await;
    assert_eq!(listed_ids(&run), [created[1].clone()], "{run:?}");
    let run = sessions_ok(&["list", "--url", &url, "--agent", "nobody"]).await;
    assert!(run.stdout.is_empty(), "{run:?}");
    assert_eq!(run.stderr.trim(), "no sessions", "{run:?}");

    // Out of range, refused before asking; a made-up cursor, by the server.
    let run = sessions(&["list", "--url", &url, "--limit", "0"]).await;
    assert_eq!(run.status.code(), Some(2), "{run:?}");
    let run = sessions(&["list", "--url", &url, "--cursor", "nope"]).await;
    assert_eq!(run.status.code(), Some(1), "{run:?}");
    assert!(run.stderr.contains("cursor"), "{run:?}");

    // The stopped server's store pages alike (every session dormant or
    // ended there).
    server.send_sigterm();
    assert!(
        server.wait_exit(SHUTDOWN_GRACE).await.is_some(),
        "the server stops on SIGTERM"
    );
    let data_dir = server.data_dir().to_string_lossy().into_owned();
    let store = format!("sqlite:{data_dir}/sessions.db");
    let offline = ["--store", store.as_str(), "--data-dir", data_dir.as_str()];
    let run = sessions_ok(&[&["list", "--limit", "3"][..], &offline].concat()).await;
    assert_eq!(listed_ids(&run), newest_first[..3], "{run:?}");
    let cursor = printed_cursor(&run).unwrap_or_else(|| panic!("a cursor: {run:?}"));
    let run = sessions_ok(&[&["list", "--cursor", cursor.as_str()][..], &offline].concat()).await;
    assert_eq!(listed_ids(&run), newest_first[3..], "{run:?}");
    assert!(printed_cursor(&run).is_none(), "{run:?}");
    let run = sessions_ok(&[&["list", "--all", "--limit", "2"][..], &offline].concat()).await;
    assert_eq!(listed_ids(&run), newest_first, "{run:?}");
    assert!(
        list_line(&run, &created[4]).ends_with("\"remember the tulips\""),
        "the first prompt from the store: {run:?}"
    );
    let run = sessions_ok(&[&["list", "--state", "ended"][..], &offline].concat()).await;
    assert_eq!(listed_ids(&run), [created[0].clone()], "{run:?}");
    let run = sessions_ok(&[&["list", "-q", "login"][..], &offline].concat()).await;
    assert_eq!(listed_ids(&run), [created[1].clone()], "{run:?}");
}

#[tokio::test]
async fn an_unknown_session_fails_with_the_servers_detail() {
    let server = TestServer::start(&[]).await;
    let url = server.base_url().to_owned();
    for command in ["show", "events"] {
        let run = sessions(&[command, "no/such session", "--url", &url]).await;
        assert_eq!(run.status.code(), Some(1), "{command}: {run:?}");
        assert_eq!(
            run.stderr.trim(),
            "sandbox-agent: no session with id \"no/such session\"",
            "{command}: {run:?}"
        );
        assert!(run.stdout.is_empty(), "{command}: {run:?}");
    }
}

#[tokio::test]
async fn a_missing_token_and_an_unreachable_server_are_clear_errors() {
    let server = TestServer::start(&["--token", "s3cret"]).await;
    let url = server.base_url().to_owned();
    let run = sessions(&["list", "--url", &url]).await;
    assert_eq!(run.status.code(), Some(1), "{run:?}");
    assert!(run.stderr.starts_with("sandbox-agent: "), "{run:?}");
    assert!(!run.stderr.contains("panicked"), "{run:?}");
    sessions_ok(&["list", "--url", &url, "--token", "s3cret"]).await;

    // A port nothing listens on: the server's own, once it stopped.
    drop(server);
    let run = sessions(&["list", "--url", &url]).await;
    assert_eq!(run.status.code(), Some(1), "{run:?}");
    assert!(
        run.stderr.contains(&format!("cannot reach {url}")),
        "{run:?}"
    );
}

#[tokio::test]
async fn events_follow_prints_a_later_turn_as_it_is_recorded() {
    let server = TestServer::start(&[]).await;
    let url = server.base_url().to_owned();
    let (conn, session) = session_with_turn(&server, "first turn").await;

    let mut command = tokio::process::Command::from(sandbox_agent_command());
    command
        .args(["sessions", "events", &session, "--follow", "--url", &url])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().expect("spawn sessions events --follow");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout is piped")).lines();
    let mut seen = Vec::new();
    let mut read_until = async |text: &str, seen: &mut Vec<String>| {
        let deadline = Instant::now() + FOLLOW_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, lines.next_line()).await {
                Ok(Ok(Some(line))) => {
                    let found = line.contains(text);
                    seen.push(line);
                    if found {
                        return;
                    }
                }
                other => {
                    panic!("no line with {text:?} within {FOLLOW_TIMEOUT:?} ({other:?}): {seen:#?}")
                }
            }
        }
    };
    read_until("\"first turn\"", &mut seen).await;
    server
        .prompt(&conn, &session, json!(3), "second turn")
        .await;
    read_until("\"second turn\"", &mut seen).await;
    read_until("result #3", &mut seen).await;

    // Still running (it follows until stopped), then stopped by a signal.
    assert!(
        child.try_wait().expect("poll the child").is_none(),
        "--follow keeps running: {seen:#?}"
    );
    child.kill().await.expect("kill sessions events --follow");

    // Every event once, in order.
    let offsets: Vec<u64> = seen
        .iter()
        .map(|line| columns(line)[0].parse().expect("an offset"))
        .collect();
    assert_eq!(
        offsets,
        (0..offsets.len() as u64).collect::<Vec<_>>(),
        "{seen:#?}"
    );
}

#[tokio::test]
async fn follow_needs_a_server() {
    let server = TestServer::start(&[]).await;
    let data_dir = server.data_dir().to_string_lossy().into_owned();
    let store = format!("sqlite:{data_dir}/sessions.db");
    let run = sessions(&[
        "events",
        "any",
        "--follow",
        "--store",
        &store,
        "--data-dir",
        &data_dir,
    ])
    .await;
    assert_eq!(run.status.code(), Some(1), "{run:?}");
    assert!(run.stderr.contains("--follow needs a server"), "{run:?}");
}

#[tokio::test]
async fn agent_picks_among_sessions_that_share_an_id() {
    let a = v2_api_tests::mock_agent_command("alpha", "--session-id shared");
    let b = v2_api_tests::mock_agent_command("beta", "--session-id shared");
    let server = TestServer::start(&["--agent-command", &a, "--agent-command", &b]).await;
    let url = server.base_url().to_owned();
    for agent in ["alpha", "beta"] {
        let conn = server.initialize(agent).await;
        assert_eq!(server.new_session_for(&conn, agent).await, "shared");
    }

    let run = sessions(&["show", "shared", "--url", &url]).await;
    assert_eq!(run.status.code(), Some(1), "{run:?}");
    assert!(run.stderr.contains("alpha"), "{run:?}");
    assert!(run.stderr.contains("beta"), "{run:?}");
    assert!(run.stderr.contains("--agent picks one"), "{run:?}");

    let run = sessions_ok(&["show", "shared", "--agent", "beta", "--url", &url]).await;
    assert!(
        run.stdout
            .lines()
            .any(|line| columns(line) == ["agent", "beta"]),
        "{run:?}"
    );
    let run = sessions_ok(&["events", "shared", "--agent", "alpha", "--url", &url]).await;
    assert!(run.stdout.contains("session/new"), "{run:?}");

    let run = sessions_ok(&["list", "--agent", "alpha", "--url", &url]).await;
    let agents: Vec<&str> = run.stdout.lines().skip(1).map(|l| columns(l)[1]).collect();
    assert_eq!(agents, ["alpha"], "{run:?}");
}

#[tokio::test]
async fn an_empty_session_id_is_refused_as_such() {
    let server = TestServer::start(&[]).await;
    let (_, session) = session_with_turn(&server, "hello").await;
    for command in ["show", "events"] {
        let run = sessions(&[command, "", "--url", server.base_url()]).await;
        assert!(!run.status.success(), "{run:?}");
        assert!(
            run.stderr.contains("<ID>") && !run.stderr.contains("\"events\""),
            "sessions {command} \"\" names the empty id, not another session: {run:?}"
        );
        assert!(!run.stderr.contains("serde"), "{run:?}");
    }
    // Over HTTP, an empty id names no session: `events` does not move into
    // the id's place.
    let reply = server.get("/v2/sessions//events").await;
    reply.assert_status(404);
    assert!(
        !reply.text().contains("\"events\""),
        "not read as session \"events\": {}",
        reply.text()
    );
    // A real id still works.
    sessions_ok(&["events", &session, "--url", server.base_url()]).await;
}

#[tokio::test]
async fn top_level_help_names_every_command() {
    let output = sandbox_agent_command()
        .arg("--help")
        .output()
        .expect("run sandbox-agent --help");
    let help = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{help}");
    let about = help.lines().next().unwrap_or_default();
    for command in [
        "server",
        "prompt",
        "sessions",
        "fs",
        "bridge",
        "agents",
        "bench",
        "mock-agent",
    ] {
        assert!(
            about
                .split(|c: char| !c.is_alphanumeric() && c != '-')
                .any(|word| word == command),
            "the first line of --help names {command}: {about:?}"
        );
    }
}
