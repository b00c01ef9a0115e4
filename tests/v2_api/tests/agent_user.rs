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

/// The bearer token of the servers here: `--agent-user` needs one.
const TOKEN_ENV: (&str, &str) = ("SANDBOX_AGENT_TOKEN", "agent-user-test-token");

/// A server with `--agent-user` [`AGENT_USER`] (and a token) and `extra`.
async fn as_user(extra: &[&str]) -> TestServer {
    let mut args = vec!["--agent-user", AGENT_USER];
    args.extend_from_slice(extra);
    TestServer::start_with_env(&args, &[TOKEN_ENV]).await
}

/// The stderr of a server started with `args` that refused to start.
async fn refused(args: &[&str]) -> String {
    let (status, stderr) = start_up_outcome(args, std::time::Duration::from_secs(20))
        .await
        .expect("the server exits");
    assert!(!status.success(), "{args:?}: {stderr}");
    stderr
}

/// [`refused`] with a token and `--agent-user` [`AGENT_USER`] before
/// `extra`.
async fn refused_as_user(extra: &[&str]) -> String {
    let mut args = vec!["--token", "t", "--agent-user", AGENT_USER];
    args.extend_from_slice(extra);
    refused(&args).await
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

    // Its tree supervisor stays root (no process of the user may signal
    // it); everything below it is the user's.
    for process in server.descendants() {
        let (uid, _, _) = credentials(process.pid);
        let command = procfs::cmdline(process.pid);
        let expected = if command.contains(" supervise ") {
            0
        } else {
            user.uid
        };
        assert_eq!(uid, expected, "{command}");
    }
}

#[tokio::test]
async fn the_users_processes_cannot_read_the_store_or_list_the_data_dir() {
    let Some(user) = user_or_skip("data dir confinement") else {
        return;
    };
    let server = as_user(&[]).await;
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
    let (code, stdout, stderr) = server.api().run_sh(&script, work.path()).await;
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
    let server = as_user(&[]).await;
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
    let server = as_user(&[]).await;
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
    let server = as_user(&[]).await;
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
    let stderr = refused(&["--token", "t", "--agent-user", "no-such-user-sandbox-agent"]).await;
    assert!(stderr.contains("no such user"), "{stderr}");
    let stderr = refused(&["--token", "t", "--agent-user", "root"]).await;
    assert!(stderr.contains("is root"), "{stderr}");

    // A data dir the user cannot pass through to.
    let closed = TempDir::new("agent-user-closed-data");
    std::fs::set_permissions(closed.path(), std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let data = closed.path().join("data");
    let data_arg = data.to_string_lossy().into_owned();
    let stderr = refused_as_user(&["--data-dir", &data_arg]).await;
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
    let server = as_user(&[]).await;
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
    let server = as_user(&["--agent-command", &command]).await;
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

/// `POST /v2/processes` of `body`; the new process's id (201 checked).
async fn start_process(server: &TestServer, body: &Value) -> String {
    let reply = v2_api_tests::Api::send(
        server
            .api()
            .request(reqwest::Method::POST, "/v2/processes")
            .json(body),
    )
    .await;
    reply.assert_status(201);
    reply.json()["id"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn the_supervisor_gets_none_of_the_programs_variables_while_it_is_root() {
    let Some(user) = user_or_skip("sealed environment") else {
        return;
    };
    let server = as_user(&[]).await;
    let work = owned_dir("agent-user-env", user);
    // LD_PRELOAD naming a missing file: the loader of a root process that
    // saw it would print an error on stderr; the program sees it as a
    // plain variable.
    let id = start_process(
        &server,
        &json!({
            "command": "sleep",
            "args": ["30"],
            "cwd": work.path(),
            "env": {"PROBE": "for-the-program", "LD_PRELOAD": "/nonexistent/x.so"},
        }),
    )
    .await;
    // The program runs once it has become the user (`as-user`, then exec).
    let (supervisor, program) = supervisor_of(&server, "30").await;
    let names = |pid: u32| -> Vec<String> {
        procfs::environ(pid)
            .into_iter()
            .map(|(key, _)| key)
            .collect()
    };
    let supervisor_env = names(supervisor.pid);
    assert!(
        supervisor_env
            .iter()
            .all(|key| key.starts_with("SANDBOX_AGENT_SUPERVISED_ENV_")),
        "the supervisor's own environment is the sealed one alone: {supervisor_env:?}"
    );
    let program_env = procfs::environ(program.pid);
    let value = |name: &str| {
        program_env
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    };
    assert_eq!(value("PROBE"), Some("for-the-program"));
    assert_eq!(value("LD_PRELOAD"), Some("/nonexistent/x.so"));
    assert!(
        !program_env.iter().any(|(key, _)| {
            key.starts_with("SANDBOX_AGENT_SUPERVISED_ENV_") || key == "SANDBOX_AGENT_TOKEN"
        }),
        "{program_env:?}"
    );
    assert_eq!(
        std::fs::read_link(format!("/proc/{}/cwd", program.pid)).expect("cwd"),
        work.path()
    );
    let forget = server
        .api()
        .request(reqwest::Method::DELETE, &format!("/v2/processes/{id}"));
    v2_api_tests::Api::send(forget).await.assert_status(204);
}

#[tokio::test]
async fn a_cwd_behind_a_closed_folder_is_entered_as_the_user_or_not_at_all() {
    let Some(user) = user_or_skip("process cwd") else {
        return;
    };
    let server = as_user(&[]).await;
    // root-only/open: an open folder behind a closed one.
    let closed = TempDir::new("agent-user-closed-cwd");
    std::fs::set_permissions(closed.path(), std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let open = closed.path().join("open");
    std::fs::create_dir(&open).expect("mkdir");
    std::fs::write(open.join("secret"), "behind a closed folder").expect("write");
    let reply = v2_api_tests::Api::send(
        server
            .api()
            .request(reqwest::Method::POST, "/v2/processes/run")
            .json(&json!({"command": "cat", "args": ["secret"], "cwd": open})),
    )
    .await;
    let problem = v2_api_tests::assert_problem(&reply, 403, "permission-denied");
    let detail = problem["detail"].as_str().unwrap_or_default();
    assert!(detail.contains(AGENT_USER), "{problem}");

    // The same folder through the user's own symlink: the real path is
    // checked. (Swapped in after the check, the program would still enter
    // it as the user, and could not.)
    let work = owned_dir("agent-user-link", user);
    let link = work.path().join("link");
    std::os::unix::fs::symlink(&open, &link).expect("symlink");
    std::os::unix::fs::lchown(&link, Some(user.uid), Some(user.gid)).expect("lchown");
    let reply = v2_api_tests::Api::send(
        server
            .api()
            .request(reqwest::Method::POST, "/v2/processes/run")
            .json(&json!({"command": "cat", "args": ["secret"], "cwd": link})),
    )
    .await;
    v2_api_tests::assert_problem(&reply, 403, "permission-denied");

    // What is behind the closed folder, or is not, is not told apart: a
    // missing entry and a file there get the same 403 as the open folder
    // (looked up as root, they were 404 and 409: an oracle).
    std::fs::write(closed.path().join("a-file"), "root's").expect("write");
    for cwd in [
        closed.path().join("not-there"),
        closed.path().join("a-file"),
    ] {
        let reply = v2_api_tests::Api::send(
            server
                .api()
                .request(reqwest::Method::POST, "/v2/processes/run")
                .json(&json!({"command": "true", "cwd": cwd})),
        )
        .await;
        v2_api_tests::assert_problem(&reply, 403, "permission-denied");
    }
}

#[tokio::test]
async fn the_servers_own_groups_lend_the_agents_file_requests_nothing() {
    let Some(user) = user_or_skip("server groups") else {
        return;
    };
    // Docker gives root supplementary groups (adm, disk, …): here adm (4).
    let server = TestServer::start_via(
        &["setpriv", "--groups", "4", "--"],
        &["--agent-user", AGENT_USER],
        &[TOKEN_ENV],
    )
    .await;
    let conn = server.initialize(MOCK).await;
    let work = owned_dir("agent-user-groups", user);
    let answer = new_session(&server, &conn, work.path()).await;
    let session = answer["result"]["sessionId"]
        .as_str()
        .unwrap_or_else(|| panic!("{answer}"))
        .to_owned();
    // A folder only root and group adm may enter, with a readable file in
    // it, and a folder group adm may write.
    let adm = TempDir::new("agent-user-adm");
    std::os::unix::fs::chown(adm.path(), Some(0), Some(4)).expect("chown");
    std::fs::set_permissions(adm.path(), std::fs::Permissions::from_mode(0o770)).expect("chmod");
    std::fs::write(adm.path().join("public.txt"), "adm only").expect("write");
    let mut turn_id = 10;
    let mut turn = async |text: String| {
        turn_id += 1;
        let reply = server.prompt(&conn, &session, json!(turn_id), &text).await;
        assert_eq!(stop_reason(&reply), Some("end_turn"), "{text}: {reply}");
        last_chunk(&server, &session).await
    };
    let reply = turn(format!("read file {}/public.txt", adm.path().display())).await;
    assert!(reply.starts_with("fs error"), "{reply}");
    let reply = turn(format!(
        "write file {}/new/x.txt planted",
        adm.path().display()
    ))
    .await;
    assert!(reply.starts_with("fs error"), "{reply}");
    assert!(!adm.path().join("new").exists(), "no folder was made");
    // /proc is the server's own: closed to the agent's requests.
    let reply = turn("read file /proc/self/maps".to_owned()).await;
    assert!(reply.starts_with("fs error"), "{reply}");
}

#[tokio::test]
async fn a_data_dir_the_user_could_change_is_refused_at_start() {
    let Some(user) = user_or_skip("data dir owner") else {
        return;
    };
    // Made by the user (as under /tmp): its files would be the user's.
    let planted = owned_dir("agent-user-planted-data", user);
    let stderr = refused_as_user(&["--data-dir", planted.utf8()]).await;
    assert!(
        stderr.contains(&format!("belongs to uid {}", user.uid)),
        "{stderr}"
    );

    // A root folder, but in one the user may change (not sticky).
    let shared = owned_dir("agent-user-shared-parent", user);
    let data = shared.path().join("data");
    std::fs::create_dir(&data).expect("mkdir");
    let stderr = refused_as_user(&["--data-dir", &data.to_string_lossy()]).await;
    assert!(stderr.contains("which the user may change"), "{stderr}");

    // Writable by others.
    let open = TempDir::new("agent-user-open-data");
    std::fs::set_permissions(open.path(), std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let stderr = refused_as_user(&["--data-dir", open.utf8()]).await;
    assert!(stderr.contains("writable by others"), "{stderr}");
}

#[tokio::test]
async fn files_a_root_run_left_in_an_agent_home_are_handed_to_the_user_at_the_next_start() {
    let Some(user) = user_or_skip("home handover") else {
        return;
    };
    let data = TempDir::new("agent-user-handover");
    let work = owned_dir("agent-user-handover-cwd", user);
    // With the option, without it (the mock writes its session state into
    // its home as root), with it again.
    for with_user in [true, false, true] {
        let server = if with_user {
            as_user(&["--data-dir", data.utf8()]).await
        } else {
            TestServer::start(&["--data-dir", data.utf8()]).await
        };
        let conn = server.initialize(MOCK).await;
        let answer = new_session(&server, &conn, work.path()).await;
        assert!(answer["result"]["sessionId"].is_string(), "{answer}");
    }
    let home = data.path().join("homes").join(MOCK);
    let mut pending = vec![home.clone()];
    let mut seen = 0;
    while let Some(path) = pending.pop() {
        let meta = std::fs::symlink_metadata(&path).expect("entry");
        assert_eq!(meta.uid(), user.uid, "{} is not the user's", path.display());
        seen += 1;
        if meta.is_dir() {
            pending.extend(
                std::fs::read_dir(&path)
                    .expect("dir")
                    .map(|e| e.expect("entry").path()),
            );
        }
    }
    assert!(
        seen > 3,
        "the mock kept its sessions in its home ({seen} entries)"
    );
}

#[tokio::test]
async fn without_a_token_or_through_the_users_symlinks_the_server_does_not_start() {
    let Some(user) = user_or_skip("start-up refusals") else {
        return;
    };
    // No token: the user could drive this root server's API.
    let stderr = refused(&["--agent-user", AGENT_USER]).await;
    assert!(stderr.contains("needs a token"), "{stderr}");

    // A root data dir reached through the user's symlink (the user could
    // point it anywhere, at start or later).
    let root_dir = TempDir::new("agent-user-real-data");
    let links = TempDir::new("agent-user-links");
    let link = links.path().join("data");
    std::os::unix::fs::symlink(root_dir.path(), &link).expect("symlink");
    std::os::unix::fs::lchown(&link, Some(user.uid), Some(user.gid)).expect("lchown");
    for given in [
        link.to_string_lossy().into_owned(),
        format!("{}/", link.display()),
    ] {
        let stderr = refused_as_user(&["--data-dir", &given]).await;
        assert!(stderr.contains("a symlink of uid"), "{given}: {stderr}");
    }

    // A store file in a folder the user owns.
    let folder = owned_dir("agent-user-store-folder", user);
    let store = format!("sqlite:{}/s.db", folder.path().display());
    let stderr = refused_as_user(&["--data-dir", root_dir.utf8(), "--store", &store]).await;
    assert!(stderr.contains("store's folder"), "{stderr}");
    assert!(
        !folder.path().join("s.db").exists(),
        "nothing was created there"
    );
}

#[tokio::test]
async fn a_symlink_in_an_agent_home_is_handed_over_itself_never_its_target() {
    let Some(user) = user_or_skip("home symlinks") else {
        return;
    };
    let data = TempDir::new("agent-user-home-links");
    let home = data.path().join("homes").join(MOCK);
    std::fs::create_dir_all(&home).expect("home");
    // What root's files outside look like; a symlink and a folder in the
    // home pointing there, as an agent could leave them.
    let outside = TempDir::new("agent-user-outside");
    std::fs::write(outside.path().join("root.txt"), "root's").expect("write");
    std::os::unix::fs::symlink(outside.path(), home.join("link")).expect("symlink");
    let server = as_user(&["--data-dir", data.utf8()]).await;
    server.initialize(MOCK).await;
    let link = std::fs::symlink_metadata(home.join("link")).expect("link");
    assert_eq!(link.uid(), user.uid, "the symlink itself is handed over");
    for path in [outside.path().to_owned(), outside.path().join("root.txt")] {
        let meta = std::fs::metadata(&path).expect("outside");
        assert_eq!(meta.uid(), 0, "{} stays root's", path.display());
    }
}

/// `request` of the host file system API (`/v2/fs/{route}?path=PATH`)
/// with `body`.
async fn fs_request(
    server: &TestServer,
    method: reqwest::Method,
    route: &str,
    path: &Path,
    body: Option<(&str, Vec<u8>)>,
) -> v2_api_tests::Reply {
    let url = format!(
        "/v2/fs/{route}?path={}",
        v2_api_tests::query_path(&path.to_string_lossy())
    );
    let mut request = server.api().request(method, &url);
    if let Some((content_type, bytes)) = body {
        request = request.header("content-type", content_type).body(bytes);
    }
    v2_api_tests::Api::send(request).await
}

/// (owner uid, owner gid) of `path` itself (a symlink not followed).
fn owner(path: &Path) -> (u32, u32) {
    let meta = std::fs::symlink_metadata(path)
        .unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    (meta.uid(), meta.gid())
}

/// A tar of a small project: `README.md`, `src/` and `src/main.rs`.
fn project_tar() -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut add = |path: &str, kind: tar::EntryType, mode: u32, data: &[u8]| {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(kind);
        header.set_mode(mode);
        header.set_size(data.len() as u64);
        builder
            .append_data(&mut header, path, data)
            .expect("append");
    };
    add("README.md", tar::EntryType::Regular, 0o644, b"# project\n");
    add("src/", tar::EntryType::Directory, 0o755, b"");
    add(
        "src/main.rs",
        tar::EntryType::Regular,
        0o644,
        b"fn main() {}\n",
    );
    builder.into_inner().expect("tar")
}

#[tokio::test]
async fn what_the_file_api_makes_is_the_users_and_an_uploaded_project_can_be_worked_in() {
    let Some(user) = user_or_skip("file API owners") else {
        return;
    };
    let server = as_user(&[]).await;
    let work = owned_dir("agent-user-file-api", user);
    let theirs = (user.uid, user.gid);

    // PUT, with a parent it makes.
    let put = work.path().join("put/new.txt");
    let reply = fs_request(
        &server,
        reqwest::Method::PUT,
        "file",
        &put,
        Some(("application/octet-stream", b"hello".to_vec())),
    )
    .await;
    reply.assert_status(200);
    assert_eq!(owner(&put), theirs, "the PUT file");
    assert_eq!(owner(&work.path().join("put")), theirs, "its parent");

    // mkdir, parents too; and on /v2/rpc.
    let made = work.path().join("made/deep");
    fs_request(&server, reqwest::Method::POST, "mkdir", &made, None)
        .await
        .assert_status(200);
    assert_eq!(owner(&made), theirs);
    assert_eq!(owner(&work.path().join("made")), theirs);
    let conn = server.initialize(MOCK).await;
    let by_rpc = work.path().join("by-rpc");
    let answer = server
        .call(
            &conn,
            &acp::request(2, "_sandboxagent/fs/mkdir", json!({"path": by_rpc})),
        )
        .await;
    v2_api_tests::ext::expect_result(&answer);
    assert_eq!(owner(&by_rpc), theirs);

    // upload-batch: a project, every entry the user's.
    let project = work.path().join("project");
    fs_request(
        &server,
        reqwest::Method::POST,
        "upload-batch",
        &project,
        Some(("application/x-tar", project_tar())),
    )
    .await
    .assert_status(200);
    for entry in ["", "README.md", "src", "src/main.rs"] {
        assert_eq!(owner(&project.join(entry)), theirs, "{entry:?}");
    }

    // README: "upload a project, then prompt in it".
    let answer = new_session(&server, &conn, &project).await;
    let session = answer["result"]["sessionId"]
        .as_str()
        .unwrap_or_else(|| panic!("session/new in the uploaded project: {answer}"))
        .to_owned();
    let reply = server
        .prompt(&conn, &session, json!(3), "write file README.md edited")
        .await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
    assert_eq!(
        last_chunk(&server, &session).await,
        "Wrote 6 bytes to README.md."
    );
    assert_eq!(
        std::fs::read_to_string(project.join("README.md")).expect("read"),
        "edited"
    );

    // Move and delete in the user's folder work as the user.
    let reply = v2_api_tests::Api::send(
        server
            .api()
            .request(reqwest::Method::POST, "/v2/fs/move")
            .json(&json!({"from": project.join("src/main.rs"), "to": project.join("main.rs")})),
    )
    .await;
    reply.assert_status(200);
    fs_request(
        &server,
        reqwest::Method::DELETE,
        "entry",
        &project.join("src"),
        None,
    )
    .await
    .assert_status(200);
    assert!(!project.join("src").exists());
}

#[tokio::test]
async fn the_file_api_does_not_follow_the_users_links_into_what_the_user_cannot_reach() {
    let Some(user) = user_or_skip("file API links") else {
        return;
    };
    let root = TempDir::new("agent-user-fs-root");
    let server = as_user(&["--fs-root", root.utf8()]).await;
    // A folder only root may enter, inside the root.
    let closed = root.path().join("closed");
    std::fs::create_dir(&closed).expect("mkdir");
    std::fs::write(closed.join("secret.txt"), "root's secret").expect("write");
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    // The user's folder, and the user's links into the closed one.
    let mine = root.path().join("mine");
    std::fs::create_dir(&mine).expect("mkdir");
    std::os::unix::fs::chown(&mine, Some(user.uid), Some(user.gid)).expect("chown");
    let plant = |name: &str, target: &Path| {
        let link = mine.join(name);
        std::os::unix::fs::symlink(target, &link).expect("symlink");
        std::os::unix::fs::lchown(&link, Some(user.uid), Some(user.gid)).expect("lchown");
        link
    };
    let to_dir = plant("to-dir", &closed);
    let to_file = plant("to-file", Path::new("../closed/secret.txt"));

    // Reads through either link: 403, no byte of the secret.
    for path in [to_dir.join("secret.txt"), to_file.clone()] {
        let reply = fs_request(&server, reqwest::Method::GET, "file", &path, None).await;
        v2_api_tests::assert_problem(&reply, 403, "permission-denied");
        assert!(!reply.text().contains("root's secret"), "{}", reply.text());
    }
    // Writes through them: 403, nothing lands in the closed folder, the
    // secret is unchanged.
    let planted = to_dir.join("planted.txt");
    let reply = fs_request(
        &server,
        reqwest::Method::PUT,
        "file",
        &planted,
        Some(("application/octet-stream", b"planted".to_vec())),
    )
    .await;
    v2_api_tests::assert_problem(&reply, 403, "permission-denied");
    let reply = fs_request(
        &server,
        reqwest::Method::PUT,
        "file",
        &to_file,
        Some(("application/octet-stream", b"replaced".to_vec())),
    )
    .await;
    v2_api_tests::assert_problem(&reply, 403, "permission-denied");
    let reply = fs_request(
        &server,
        reqwest::Method::POST,
        "upload-batch",
        &to_dir.join("unpacked"),
        Some(("application/x-tar", project_tar())),
    )
    .await;
    v2_api_tests::assert_problem(&reply, 403, "permission-denied");
    let reply = fs_request(
        &server,
        reqwest::Method::POST,
        "mkdir",
        &to_dir.join("made"),
        None,
    )
    .await;
    v2_api_tests::assert_problem(&reply, 403, "permission-denied");
    let mut names: Vec<String> = std::fs::read_dir(&closed)
        .expect("list")
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["secret.txt"],
        "nothing was made in the closed folder"
    );
    assert_eq!(
        std::fs::read_to_string(closed.join("secret.txt")).expect("read"),
        "root's secret"
    );
    // Listing and deleting through the link are refused too, on both
    // surfaces.
    let reply = fs_request(&server, reqwest::Method::GET, "entries", &to_dir, None).await;
    v2_api_tests::assert_problem(&reply, 403, "permission-denied");
    let reply = fs_request(
        &server,
        reqwest::Method::DELETE,
        "entry",
        &to_dir.join("secret.txt"),
        None,
    )
    .await;
    v2_api_tests::assert_problem(&reply, 403, "permission-denied");
    assert!(closed.join("secret.txt").exists());
    let conn = server.initialize(MOCK).await;
    let answer = server
        .call(
            &conn,
            &acp::request(2, "_sandboxagent/fs/list_entries", json!({"path": to_dir})),
        )
        .await;
    let error = v2_api_tests::ext::expect_error(&answer, -32602);
    assert_eq!(
        error["data"]["type"], "urn:sandbox-agent:error:permission-denied",
        "{answer}"
    );
    // The user's own folder stays usable.
    fs_request(
        &server,
        reqwest::Method::PUT,
        "file",
        &mine.join("ok.txt"),
        Some(("application/octet-stream", b"ok".to_vec())),
    )
    .await
    .assert_status(200);
    assert_eq!(owner(&mine.join("ok.txt")), (user.uid, user.gid));
}

#[tokio::test]
async fn an_npm_install_runs_as_the_user_under_the_supervisor_without_the_servers_secrets() {
    use v2_api_tests::agents::{
        INSTALL_TIMEOUT, agents_file, install_within, mock_agent_script, npm_registry_with_scripts,
    };
    let Some(user) = user_or_skip("npm install as the user") else {
        return;
    };
    // The package's install script writes what it ran as into a folder of
    // the user's: its uid, its environment, and the command lines of its
    // ancestors.
    let record = owned_dir("agent-user-npm-record", user);
    let at = v2_api_tests::shell_quote(record.utf8());
    let script = format!(
        "id -u > {at}/uid; env > {at}/env; p=$$; while [ \"$p\" -gt 1 ]; do \
         tr '\\0' ' ' < /proc/$p/cmdline; echo; \
         p=$(sed -n 's/^PPid:[[:space:]]*//p' /proc/$p/status); done > {at}/ancestry"
    );
    let npm = npm_registry_with_scripts(
        "sa-user-agent",
        "1.0.0",
        &mock_agent_script(),
        Some(json!({ "install": script })),
    )
    .await;
    let dir = TempDir::new("agent-user-npm");
    let manifest = agents_file(
        &dir,
        json!([{"id": "npmuser", "name": "Npm as the user", "version": "1.0.0",
                "distribution": {"npx": {"package": "sa-user-agent"}}}]),
    );
    let registry = npm.registry.url("/");
    let server = TestServer::start_with_env(
        &["--agent-user", AGENT_USER, "--agents-file", &manifest],
        &[
            TOKEN_ENV,
            ("SANDBOX_AGENT_STORE", "memory"),
            ("npm_config_registry", &registry),
        ],
    )
    .await;
    let reply = install_within(&server.api(), "npmuser", None, INSTALL_TIMEOUT).await;
    reply.assert_status(200);

    let read = |name: &str| {
        std::fs::read_to_string(record.path().join(name))
            .unwrap_or_else(|error| panic!("the install script wrote no {name}: {error}"))
    };
    assert_eq!(
        read("uid").trim(),
        user.uid.to_string(),
        "npm ran as the user"
    );
    let env = read("env");
    for secret in ["SANDBOX_AGENT_TOKEN=", "SANDBOX_AGENT_STORE="] {
        assert!(
            !env.lines().any(|line| line.starts_with(secret)),
            "{secret} reached npm:\n{env}"
        );
    }
    assert!(!env.contains(TOKEN_ENV.1), "the token reached npm:\n{env}");
    let home = server.data_dir().join("homes").join("npmuser");
    assert!(
        env.lines()
            .any(|line| line == format!("HOME={}", home.display())),
        "npm's HOME is the agent's home:\n{env}"
    );
    let ancestry = read("ancestry");
    assert!(
        ancestry
            .lines()
            .any(|line| line.contains(" supervise ") && line.contains("--user")),
        "npm ran under the tree supervisor:\n{ancestry}"
    );

    // What npm made is root's again, and nobody else may change it.
    let installed = server.data_dir().join("agents/npmuser/1.0.0");
    let mut folders = vec![installed.clone()];
    let mut seen = 0;
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).expect("list") {
            let path = entry.expect("entry").path();
            let meta = std::fs::symlink_metadata(&path).expect("lstat");
            seen += 1;
            assert_eq!((meta.uid(), meta.gid()), (0, 0), "{}", path.display());
            if !meta.file_type().is_symlink() {
                assert_eq!(
                    meta.mode() & 0o7022,
                    0,
                    "{} mode {:o}",
                    path.display(),
                    meta.mode()
                );
            }
            if meta.is_dir() {
                folders.push(path);
            }
        }
    }
    assert!(seen > 3, "the install has files");
    // The installed agent runs (as the user).
    server.initialize("npmuser").await;
}

/// The four uids of `/proc/<pid>/status` (real, effective, saved, file
/// system).
fn uids(pid: u32) -> Vec<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|n| n.parse().ok())
        .collect()
}

/// The tree supervisor among the server's descendants with a
/// `sleep <marker>` below it, and that `sleep`, once both run.
async fn supervisor_of(
    server: &TestServer,
    marker: &str,
) -> (procfs::ProcessRef, procfs::ProcessRef) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        for supervisor in server
            .descendants()
            .into_iter()
            .filter(|p| procfs::cmdline(p.pid).contains(" supervise "))
        {
            if let Some(sleep) = procfs::descendants(supervisor.pid)
                .into_iter()
                .find(|p| procfs::cmdline(p.pid) == format!("sleep {marker}"))
            {
                return (supervisor, sleep);
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "sleep {marker} never ran"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn no_program_can_signal_a_tree_supervisor_which_stays_root() {
    let Some(user) = user_or_skip("root supervisor") else {
        return;
    };
    let mut server = as_user(&[]).await;
    let work = owned_dir("agent-user-supervisor", user);
    // Tree A: a program with a `setsid` daemon, which only its supervisor
    // reaches (research/contract.md, "Process trees, bounds, shutdown").
    let id = start_process(
        &server,
        &json!({"command": "sh", "args": ["-c", "setsid sleep 1001 </dev/null >/dev/null 2>&1 & sleep 1000"],
                "cwd": work.path()}),
    )
    .await;
    let (supervisor, program) = supervisor_of(&server, "1000").await;
    let (_, daemon) = supervisor_of(&server, "1001").await;

    // Tree B, same user, cannot signal A's supervisor.
    let (code, stdout, stderr) = server
        .api()
        .run_sh(
            &format!(
                "kill -9 {0}; echo $?; kill -STOP {0}; echo $?",
                supervisor.pid
            ),
            work.path(),
        )
        .await;
    assert_eq!(code, 0, "{stderr}");
    let answers: Vec<&str> = stdout.split_whitespace().collect();
    assert!(
        answers.len() == 2 && answers.iter().all(|code| *code != "0"),
        "the kills failed: {stdout} {stderr}"
    );
    assert!(
        stderr.contains("ermitted"),
        "EPERM (Operation not permitted): {stderr}"
    );
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(procfs::is_alive(&supervisor), "A's supervisor survived B");
    assert_eq!(
        procfs::stat(supervisor.pid).map(|stat| stat.state),
        Some('S'),
        "and is not stopped"
    );
    assert_eq!(uids(supervisor.pid), [0, 0, 0, 0], "the supervisor is root");
    assert_eq!(uids(program.pid), [user.uid; 4], "the program is the user");
    assert_eq!(uids(daemon.pid), [user.uid; 4], "the daemon is the user");

    // DELETE still ends the whole tree, the daemon included.
    let delete = server
        .api()
        .request(reqwest::Method::DELETE, &format!("/v2/processes/{id}"));
    v2_api_tests::Api::send(delete).await.assert_status(204);
    for process in [supervisor, program, daemon] {
        assert!(!procfs::is_alive(&process), "{process:?} outlived DELETE");
    }

    // So does the server's shutdown.
    start_process(
        &server,
        &json!({"command": "sh", "args": ["-c", "setsid sleep 1003 </dev/null >/dev/null 2>&1 & sleep 1002"],
                "cwd": work.path()}),
    )
    .await;
    let (supervisor, program) = supervisor_of(&server, "1002").await;
    let (_, daemon) = supervisor_of(&server, "1003").await;
    server.send_sigterm();
    assert!(
        server
            .wait_exit(std::time::Duration::from_secs(20))
            .await
            .is_some(),
        "the server stopped"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while [supervisor, program, daemon].iter().any(procfs::is_alive) {
        assert!(
            std::time::Instant::now() < deadline,
            "the tree outlived the server"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_terminal_program_cannot_quit_or_stop_its_supervisor_from_the_keyboard() {
    let Some(user) = user_or_skip("terminal signals") else {
        return;
    };
    let server = as_user(&[]).await;
    let work = owned_dir("agent-user-tty-signals", user);
    // The program makes the supervisor's group the terminal's foreground
    // group and types ^\ and ^Z into the terminal (TIOCSTI, 0x5412): the
    // kernel sends SIGQUIT and SIGTSTP to that group, with no permission
    // check.
    let script = r#"use POSIX;
        open(my $t, "+<", "/dev/tty") or die "tty: $!";
        my $group = getpgrp(getppid());
        POSIX::tcsetpgrp(fileno($t), $group) or die "tcsetpgrp: $!";
        for my $key ("\x1c", "\x1a") { my $byte = $key; ioctl($t, 0x5412, $byte) or die "tiocsti: $!\n" }
        print "typed\n";
        exec "sleep", "1000";"#;
    let id = start_process(
        &server,
        &json!({"command": "sh", "args": ["-c", "sleep 0.5; exec perl -e \"$0\"", script],
                "cwd": work.path(), "tty": true}),
    )
    .await;
    // The one supervisor of this server (it runs no agent), found before
    // the keys are typed.
    let (supervisor, _) = supervisor_of(&server, "0.5").await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let output = loop {
        let page = server
            .api()
            .get_json(&format!("/v2/processes/{id}/output"))
            .await;
        let output: String = page["chunks"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|chunk| chunk["data"].as_str())
            .collect();
        if output.contains("typed") || output.contains(": ") || output.contains(" at -e ") {
            break output;
        }
        assert!(std::time::Instant::now() < deadline, "{page}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    if output.contains("tiocsti:") {
        eprintln!("terminal signals: not run: this kernel refuses TIOCSTI: {output}");
        return;
    }
    assert!(output.contains("typed"), "{output}");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(procfs::is_alive(&supervisor), "the supervisor survived ^\\");
    assert_ne!(
        procfs::stat(supervisor.pid).map(|stat| stat.state),
        Some('T'),
        "the supervisor is not stopped by ^Z"
    );
    let delete = server
        .api()
        .request(reqwest::Method::DELETE, &format!("/v2/processes/{id}"));
    v2_api_tests::Api::send(delete).await.assert_status(204);
    assert!(!procfs::is_alive(&supervisor));
}

/// Under `--agent-user`, `/proc` is out of the host file API's and the
/// process API's reach, as it is for the agents' own file requests: the
/// server's threads act with the user's file system ids but keep
/// CAP_SYS_PTRACE, so the kernel showed the links and descriptors of
/// root's processes (and `/proc/self` is the server's own) that the user
/// cannot see itself (attack review).
#[tokio::test]
async fn proc_is_out_of_reach_of_the_file_and_process_apis() {
    if user_or_skip("proc").is_none() {
        return;
    }
    let server = as_user(&[]).await;
    let root_pid = std::process::id();
    for path in [
        format!("/proc/{root_pid}/exe"),
        "/proc/self/fd".to_owned(),
        "/proc".to_owned(),
    ] {
        let reply = server.api().get(&format!("/v2/fs/stat?path={path}")).await;
        reply.assert_status(403);
        let reply = server
            .api()
            .get(&format!("/v2/fs/entries?path={path}"))
            .await;
        reply.assert_status(403);
    }
    let reply = v2_api_tests::Api::send(
        server
            .api()
            .request(reqwest::Method::POST, "/v2/processes/run")
            .json(&json!({"command": "true", "cwd": format!("/proc/{root_pid}/cwd")})),
    )
    .await;
    reply.assert_status(403);
}
