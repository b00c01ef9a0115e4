//! Agents and processes under an unprivileged user when the server runs as
//! root (`--agent-user`, research/contract.md, "Agents under an
//! unprivileged user"): the real binary started as root, the real mock
//! agent and real processes, their credentials read from `/proc`, the data
//! dir's modes and owners read from the disk.
//!
//! The tests run as root (as CI does) and create the user they need; run
//! as another user they say so and check nothing.

use serde_json::{Value, json};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use v2_api_tests::acp::{self, stop_reason};
use v2_api_tests::agents::TempDir;
use v2_api_tests::ext::new_session_params;
use v2_api_tests::server::start_up_outcome;
use v2_api_tests::users::{AGENT_USER, EXTRA_GROUP, Ids, agent_user, group_id};
use v2_api_tests::{MOCK, TestServer, path_segment, procfs};

/// The agent user, or `None` (said on stderr) when the tests are not root.
fn user_or_skip(test: &str) -> Option<Ids> {
    let user = agent_user();
    if user.is_none() {
        eprintln!("{test}: not run: only root may start agents as another user");
    }
    user
}

/// A directory the agent user owns (a session's `cwd`).
fn owned_dir(label: &str, user: Ids) -> TempDir {
    let dir = TempDir::new(label);
    std::os::unix::fs::chown(dir.path(), Some(user.uid), Some(user.gid)).expect("chown");
    dir
}

/// `Uid:`/`Gid:`/`Groups:` of `/proc/<pid>/status`: (real uid, real gid,
/// supplementary groups, sorted).
fn credentials(pid: u32) -> (u32, u32, Vec<u32>) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let field = |name: &str| -> Vec<u32> {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|n| n.parse().ok())
            .collect()
    };
    let mut groups = field("Groups:");
    groups.sort_unstable();
    (field("Uid:")[0], field("Gid:")[0], groups)
}

/// `session/new` in `cwd` on `conn`: the whole JSON-RPC answer.
async fn new_session(server: &TestServer, conn: &str, cwd: &Path) -> Value {
    let params = new_session_params(MOCK, &cwd.to_string_lossy(), &json!({}));
    server
        .call(conn, &acp::request(1, "session/new", params))
        .await
}

/// `POST /v2/processes/run` of `sh -c script`: (exit code, stdout, stderr).
async fn run_sh(server: &TestServer, script: &str, cwd: &Path) -> (i64, String, String) {
    let reply = v2_api_tests::Api::send(
        server
            .api()
            .request(reqwest::Method::POST, "/v2/processes/run")
            .json(&json!({"command": "sh", "args": ["-c", script], "cwd": cwd})),
    )
    .await;
    reply.assert_status(200);
    let body = reply.json();
    (
        body["exitCode"].as_i64().unwrap_or(-1),
        body["stdout"].as_str().unwrap_or_default().to_owned(),
        body["stderr"].as_str().unwrap_or_default().to_owned(),
    )
}

/// The mock's one reply chunk of the last turn of `session`.
async fn last_chunk(server: &TestServer, session: &str) -> String {
    let page = server
        .get_json(&format!(
            "/v2/sessions/{}/events?agent={MOCK}&limit=1000",
            path_segment(session)
        ))
        .await;
    page["events"]
        .as_array()
        .into_iter()
        .flatten()
        .rev()
        .find_map(|e| {
            let update = &e["message"]["params"]["update"];
            (update["sessionUpdate"] == "agent_message_chunk")
                .then(|| update["content"]["text"].as_str().map(str::to_owned))
                .flatten()
        })
        .unwrap_or_else(|| panic!("no reply chunk: {page}"))
}

#[tokio::test]
async fn the_agent_runs_as_the_user_with_its_groups_and_its_home_in_the_data_dir() {
    let Some(user) = user_or_skip("agent credentials") else {
        return;
    };
    let extra = group_id(EXTRA_GROUP);
    let server = TestServer::start_with_env(
        &["--agent-user", AGENT_USER],
        &[("SANDBOX_AGENT_TOKEN", "agent-user-secret-token")],
    )
    .await;
    let conn = server.initialize(MOCK).await;
    let work = owned_dir("agent-user-cwd", user);
    let answer = new_session(&server, &conn, work.path()).await;
    assert!(answer["result"]["sessionId"].is_string(), "{answer}");

    let agents = server.mock_agent_processes();
    assert_eq!(agents.len(), 1, "one mock agent: {agents:?}");
    let pid = agents[0].pid;
    let (uid, gid, groups) = credentials(pid);
    assert_eq!((uid, gid), (user.uid, user.gid), "the agent's real ids");
    let mut expected = vec![user.gid, extra];
    expected.sort_unstable();
    assert_eq!(groups, expected, "the user's groups, never root's (0)");

    // Its home: <data>/homes/mock, the user's, closed to others; the
    // server's secrets are not in its environment.
    let home = server.data_dir().join("homes").join(MOCK);
    let environ = procfs::environ(pid);
    let var = |name: &str| {
        environ
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.clone())
    };
    assert_eq!(var("HOME"), Some(home.to_string_lossy().into_owned()));
    assert_eq!(var("USER").as_deref(), Some(AGENT_USER));
    assert_eq!(var("LOGNAME").as_deref(), Some(AGENT_USER));
    assert_eq!(var("SANDBOX_AGENT_TOKEN"), None, "{environ:?}");
    let meta = std::fs::metadata(&home).expect("the agent's home");
    assert_eq!((meta.uid(), meta.gid()), (user.uid, user.gid));
    assert_eq!(meta.permissions().mode() & 0o777, 0o700);
    assert_eq!(
        std::fs::read_link(format!("/proc/{pid}/cwd")).expect("cwd"),
        home,
        "the agent starts in its home"
    );

    // Its tree supervisor is the user too: nothing of the tree is root.
    for process in server.descendants() {
        let (uid, _, _) = credentials(process.pid);
        assert_eq!(uid, user.uid, "{}", procfs::cmdline(process.pid));
    }
}

#[tokio::test]
async fn the_users_processes_cannot_read_the_store_or_list_the_data_dir() {
    let Some(user) = user_or_skip("data dir confinement") else {
        return;
    };
    let server = TestServer::start(&["--agent-user", AGENT_USER]).await;
    let data = server.data_dir().to_owned();
    let work = owned_dir("agent-user-proc", user);
    let store = data.join("sessions.db");
    assert!(store.is_file(), "the SQLite store is on by default");

    let script = format!(
        "id -u; id -G; echo \"HOME=$HOME\"; cat {store} >/dev/null && echo read-store; \
         cat {id} >/dev/null && echo read-id; ls {data} >/dev/null && echo listed; \
         ls {data}/homes >/dev/null && echo listed-homes; ls {data}/agents >/dev/null && echo agents-ok; true",
        store = store.display(),
        id = data.join("runtime-id").display(),
        data = data.display(),
    );
    let (code, stdout, stderr) = run_sh(&server, &script, work.path()).await;
    assert_eq!(code, 0, "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], user.uid.to_string(), "{stdout}");
    let mut groups: Vec<u32> = lines[1]
        .split_whitespace()
        .filter_map(|g| g.parse().ok())
        .collect();
    groups.sort_unstable();
    let mut expected = vec![user.gid, group_id(EXTRA_GROUP)];
    expected.sort_unstable();
    assert_eq!(groups, expected, "{stdout}");
    let home = nix::unistd::User::from_name(AGENT_USER)
        .ok()
        .flatten()
        .expect("the user")
        .dir;
    assert_eq!(lines[2], format!("HOME={}", home.display()), "{stdout}");
    // The installed agents stay reachable; nothing else of the data dir.
    assert_eq!(&lines[3..], ["agents-ok"], "{stdout}\n{stderr}");
    assert_eq!(
        stderr.matches("Permission denied").count(),
        4,
        "store, runtime id, the data dir and homes/: {stderr}"
    );
    for file in ["sessions.db", "sessions.db-wal", "sessions.db-shm"] {
        let mode = std::fs::metadata(data.join(file))
            .map(|m| m.permissions().mode() & 0o777)
            .unwrap_or(0o600);
        assert_eq!(mode, 0o600, "{file}");
    }
    let mode = std::fs::metadata(&data)
        .expect("data dir")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o711, "the data dir is passed through, never listed");
}

#[tokio::test]
async fn a_terminal_process_owns_its_terminal() {
    let Some(user) = user_or_skip("terminal owner") else {
        return;
    };
    let server = TestServer::start(&["--agent-user", AGENT_USER]).await;
    let work = owned_dir("agent-user-tty", user);
    let api = server.api();
    let reply = v2_api_tests::Api::send(api.request(reqwest::Method::POST, "/v2/processes").json(
        &json!({
            "command": "sh",
            "args": ["-c", "stat -c %u \"$(tty)\"; id -u"],
            "cwd": work.path(),
            "tty": true,
            "rows": 24,
            "cols": 80,
        }),
    ))
    .await;
    reply.assert_status(201);
    let id = reply.json()["id"].as_str().unwrap_or_default().to_owned();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let process = api.get_json(&format!("/v2/processes/{id}")).await;
        if process["state"] == "exited" {
            assert_eq!(process["exitCode"], 0, "{process}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{process}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let page = api.get_json(&format!("/v2/processes/{id}/output")).await;
    let output: String = page["chunks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|chunk| chunk["data"].as_str())
        .collect();
    let ids: Vec<&str> = output.split_whitespace().collect();
    let uid = user.uid.to_string();
    assert_eq!(ids, [uid.as_str(), uid.as_str()], "{page}");
}

#[tokio::test]
async fn a_cwd_the_user_cannot_write_is_refused_naming_the_user_and_the_path() {
    let Some(user) = user_or_skip("cwd check") else {
        return;
    };
    let server = TestServer::start(&["--agent-user", AGENT_USER]).await;
    let conn = server.initialize(MOCK).await;
    let closed = TempDir::new("agent-user-closed");
    std::fs::set_permissions(closed.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let answer = new_session(&server, &conn, closed.path()).await;
    let error = &answer["error"];
    assert_eq!(error["code"], -32602, "{answer}");
    let message = error["message"].as_str().unwrap_or_default();
    let shown = closed.path().display().to_string();
    assert!(
        message.contains(AGENT_USER) && message.contains(&shown) && message.contains("chown"),
        "{message}"
    );
    assert_eq!(
        error["data"]["type"], "urn:sandbox-agent:error:cwd-not-writable",
        "{answer}"
    );
    let missing = closed.path().join("not-there");
    let answer = new_session(&server, &conn, &missing).await;
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("does not exist"), "{answer}");

    // The same directory, given to the user: a session.
    std::os::unix::fs::chown(closed.path(), Some(user.uid), Some(user.gid)).expect("chown");
    let answer = new_session(&server, &conn, closed.path()).await;
    assert!(answer["result"]["sessionId"].is_string(), "{answer}");
}

#[tokio::test]
async fn the_agents_file_requests_have_the_users_permissions() {
    let Some(user) = user_or_skip("agent fs requests") else {
        return;
    };
    let server = TestServer::start(&["--agent-user", AGENT_USER]).await;
    let conn = server.initialize(MOCK).await;
    let work = owned_dir("agent-user-fs", user);
    let answer = new_session(&server, &conn, work.path()).await;
    let session = answer["result"]["sessionId"]
        .as_str()
        .unwrap_or_else(|| panic!("{answer}"))
        .to_owned();
    let mut turn_id = 10;
    let mut turn = async |text: &str| {
        turn_id += 1;
        let reply = server.prompt(&conn, &session, json!(turn_id), text).await;
        assert_eq!(stop_reason(&reply), Some("end_turn"), "{text}: {reply}");
        last_chunk(&server, &session).await
    };

    // Written as the user: the file is the user's.
    let reply = turn("write file mine.txt hello").await;
    assert_eq!(reply, "Wrote 5 bytes to mine.txt.");
    let meta = std::fs::metadata(work.path().join("mine.txt")).expect("written");
    assert_eq!((meta.uid(), meta.gid()), (user.uid, user.gid));
    assert_eq!(turn("read file mine.txt").await, "Read 5 bytes:\nhello");

    // A file only root may read, in the user's own directory.
    let secret = work.path().join("root-only.txt");
    std::fs::write(&secret, "root's").expect("write");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let reply = turn(&format!("read file {}", secret.display())).await;
    assert!(reply.starts_with("fs error"), "{reply}");
    assert!(!reply.contains("root's"), "{reply}");
    // /etc/shadow: readable by root and group shadow, not by the user.
    let reply = turn("read file /etc/shadow").await;
    assert!(reply.starts_with("fs error"), "{reply}");

    // A directory only root may write: nothing is created there.
    let closed = TempDir::new("agent-user-fs-closed");
    let target = closed.path().join("planted.txt");
    let reply = turn(&format!("write file {} x", target.display())).await;
    assert!(reply.starts_with("fs error"), "{reply}");
    assert!(!target.exists());
    assert_eq!(
        std::fs::read_dir(closed.path()).expect("dir").count(),
        0,
        "no temp file either"
    );
}

#[tokio::test]
async fn a_bad_agent_user_stops_the_server_at_start_with_the_reason() {
    if user_or_skip("start-up errors").is_none() {
        return;
    }
    let within = std::time::Duration::from_secs(20);
    let (status, stderr) =
        start_up_outcome(&["--agent-user", "no-such-user-sandbox-agent"], within)
            .await
            .expect("the server exits");
    assert!(!status.success());
    assert!(stderr.contains("no such user"), "{stderr}");
    let (status, stderr) = start_up_outcome(&["--agent-user", "root"], within)
        .await
        .expect("the server exits");
    assert!(!status.success());
    assert!(stderr.contains("is root"), "{stderr}");

    // A data dir the user cannot pass through to.
    let closed = TempDir::new("agent-user-closed-data");
    std::fs::set_permissions(closed.path(), std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let data = closed.path().join("data");
    let data_arg = data.to_string_lossy().into_owned();
    let (status, stderr) = start_up_outcome(
        &["--agent-user", AGENT_USER, "--data-dir", &data_arg],
        within,
    )
    .await
    .expect("the server exits");
    assert!(!status.success());
    assert!(
        stderr.contains("cannot reach the data dir") && stderr.contains(closed.utf8()),
        "{stderr}"
    );
}

#[tokio::test]
async fn root_without_an_agent_user_is_warned_once_at_start() {
    if user_or_skip("root warning").is_none() {
        return;
    }
    let server = TestServer::start(&[]).await;
    let log = server
        .log_when(
            |log| log.contains("listening"),
            std::time::Duration::from_secs(10),
        )
        .await;
    assert_eq!(
        log.matches("running as root without --agent-user").count(),
        1,
        "{log}"
    );
    let server = TestServer::start(&["--agent-user", AGENT_USER]).await;
    let log = server
        .log_when(
            |log| log.contains("listening"),
            std::time::Duration::from_secs(10),
        )
        .await;
    assert!(!log.contains("without --agent-user"), "{log}");
}

#[tokio::test]
async fn an_agent_program_closed_to_the_user_fails_to_start_naming_the_folder() {
    if user_or_skip("closed agent program").is_none() {
        return;
    }
    // What an install made with umask 077 looks like to the user.
    let closed = v2_api_tests::agents::TempDir::new("agent-user-closed-program");
    std::fs::set_permissions(closed.path(), std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let program = closed.write("agent", &v2_api_tests::agents::mock_agent_script());
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let command = format!("closed={}", program.display());
    let server =
        TestServer::start(&["--agent-user", AGENT_USER, "--agent-command", &command]).await;
    let reply = v2_api_tests::agents::initialize_within(
        &server.api(),
        "closed",
        std::time::Duration::from_secs(30),
    )
    .await;
    let problem = v2_api_tests::assert_problem(&reply, 502, "agent-start-failed");
    let detail = problem["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("closed to user")
            && detail.contains(AGENT_USER)
            && detail.contains(closed.utf8()),
        "{problem}"
    );
}
