//! Agents (research/contract.md,
//! "Agents: manifest, installs, lazy install"): the manifest, installs into
//! the data dir, lazy install on the first `initialize`,
//! `--require-preinstall`, the
//! install endpoint, `sandbox-agent agents list|install`, and every kind of
//! bad input (unknown agent, no distribution for this platform, broken
//! archives, an npm failure, an agent that exits at once). Each failure must
//! be a clear problem in the HTTP answer and in the log, and the server must
//! keep serving other agents.
//!
//! Release archives are served by a loopback file server (plain `http://` is
//! allowed for loopback hosts only); the npm failure asks the real npm
//! registry for a package that does not exist.

use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use v2_api_tests::acp::stop_reason;
use v2_api_tests::agents::{
    FileServer, INSTALL_TIMEOUT, TempDir, agent_entry, agents_file, binary_entry, evil_tar_gz,
    initialize_within, install_within, mock_agent_script, names_in, npm_registry, platform_key,
    sha256_hex, tar_gz,
};
use v2_api_tests::problem::problem_text;
use v2_api_tests::server::sandbox_agent_command;
use v2_api_tests::{Api, MOCK, REQUEST_TIMEOUT, TestServer, assert_problem, procfs};

const BUILT_IN: [&str; 5] = ["claude", "codex", "gemini", "mock", "opencode"];

/// How long a log line may trail the HTTP answer it belongs to.
const LOG_TIMEOUT: Duration = Duration::from_secs(5);

/// `POST /v2/agents/{agent}/install` with the usual request bound.
async fn install(server: &TestServer, agent: &str, body: Option<&Value>) -> v2_api_tests::Reply {
    install_within(server, agent, body, REQUEST_TIMEOUT).await
}

/// The mock agent still answers a whole prompt turn.
async fn mock_still_serves(server: &TestServer) {
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let reply = server.prompt(&conn, &session, json!("still"), "hi").await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
}

/// A release archive holding `bin/agent`, a script that runs the mock agent.
fn mock_release() -> Vec<u8> {
    tar_gz(&[
        ("bin/agent", &mock_agent_script(), 0o755),
        ("README", b"a test agent\n", 0o644),
    ])
}

#[tokio::test]
async fn the_built_in_manifest_lists_the_real_agents_uninstalled() {
    let server = TestServer::start(&[]).await;
    let list = server.get_json("/v2/agents").await;
    let agents = list["agents"].as_array().cloned().unwrap_or_default();
    let ids: Vec<&str> = agents.iter().filter_map(|a| a["id"].as_str()).collect();
    assert_eq!(ids, BUILT_IN, "{list}");
    for agent in &agents {
        let id = agent["id"].as_str().unwrap_or_default();
        assert!(
            agent["name"].as_str().is_some_and(|n| !n.is_empty()),
            "{agent}"
        );
        if id == MOCK {
            assert_eq!(agent["source"], "builtin", "{agent}");
            assert_eq!(agent["installed"], true, "{agent}");
            continue;
        }
        assert_eq!(agent["source"], "registry", "{agent}");
        assert_eq!(agent["installed"], false, "fresh data dir: {agent}");
        assert!(agent.get("path").is_none(), "{agent}");
        assert!(agent.get("version").is_none(), "{agent}");
    }
}

#[tokio::test]
async fn unknown_agents_are_404_naming_the_known_ones() {
    let server = TestServer::start(&[]).await;
    let reply = server.initialize_reply("no-such-agent").await;
    let doc = assert_problem(&reply, 404, "unknown-agent");
    let text = problem_text(&doc);
    for id in BUILT_IN {
        assert!(text.contains(id), "the detail names {id}: {doc}");
    }
    let reply = install(&server, "no-such-agent", None).await;
    let doc = assert_problem(&reply, 404, "unknown-agent");
    assert!(problem_text(&doc).contains("codex"), "{doc}");
    mock_still_serves(&server).await;
}

#[tokio::test]
async fn a_release_archive_installs_lazily_on_first_initialize() {
    let release = mock_release();
    let files = FileServer::start(vec![("/packed-1.2.3-linux.tar.gz", release.clone())]).await;
    let dir = TempDir::new("lazy");
    let mut entry = binary_entry(
        "packed",
        "1.2.3",
        &files.url("/packed-1.2.3-linux.tar.gz"),
        "./bin/agent",
        Some(&sha256_hex(&release)),
    );
    entry["env"] = json!({"PACKED_HOME": "${AGENT_HOME}/state", "PACKED_MODE": "test"});
    let manifest = agents_file(&dir, json!([entry]));
    let server = TestServer::start_with_env(
        &["--agents-file", &manifest],
        &[("OPENAI_API_KEY", "sk-passed-through")],
    )
    .await;

    let before = agent_entry(&server, "packed").await;
    assert_eq!(before["installed"], false, "{before}");
    assert_eq!(before["source"], "registry", "{before}");

    // The first initialize installs it, then starts it.
    let conn = server.initialize("packed").await;
    assert_eq!(files.hits(), 1, "one download");
    let session = server.new_session_for(&conn, "packed").await;
    let reply = server.prompt(&conn, &session, json!(1), "hello").await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");

    let data = server.data_dir();
    let program = data.join("agents/packed/1.2.3/bin/agent");
    let after = agent_entry(&server, "packed").await;
    assert_eq!(after["installed"], true, "{after}");
    assert_eq!(after["version"], "1.2.3", "{after}");
    assert_eq!(after["source"], "registry", "{after}");
    assert_eq!(after["path"], program.to_string_lossy().as_ref(), "{after}");
    assert_eq!(after["running"], true, "{after}");
    assert_eq!(
        names_in(&data.join("agents/packed")),
        [".lock", "1.2.3", "current.json"],
        "nothing half-written is left"
    );

    // The agent inherits the server's environment plus the manifest's, with
    // ${AGENT_HOME} expanded to <data>/homes/<id> (created).
    let agent = server
        .mock_agent_processes()
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("no agent process under the server"));
    let env = procfs::environ(agent.pid);
    let var = |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
    let home = data.join("homes/packed");
    assert_eq!(var("OPENAI_API_KEY").as_deref(), Some("sk-passed-through"));
    assert_eq!(
        var("PACKED_HOME"),
        Some(format!("{}/state", home.display()))
    );
    assert_eq!(var("PACKED_MODE").as_deref(), Some("test"));
    assert!(home.is_dir(), "the agent home is created");

    // Installing what is there is a no-op that says so; reinstall downloads again.
    let reply = install(&server, "packed", None).await;
    reply.assert_status(200);
    let body = reply.json();
    assert_eq!(body["agent"], "packed", "{body}");
    assert_eq!(body["alreadyInstalled"], true, "{body}");
    assert_eq!(body["version"], "1.2.3", "{body}");
    assert_eq!(body["source"], "registry", "{body}");
    assert_eq!(body["path"], program.to_string_lossy().as_ref(), "{body}");
    assert!(body["durationMs"].is_u64(), "{body}");
    assert_eq!(files.hits(), 1, "no download for an installed version");

    let reply = install(&server, "packed", Some(&json!({"reinstall": true}))).await;
    reply.assert_status(200);
    assert_eq!(reply.json()["alreadyInstalled"], false, "{reply:?}");
    assert_eq!(files.hits(), 2, "reinstall downloads again");
    assert_eq!(
        names_in(&data.join("agents/packed")),
        [".lock", "1.2.3", "current.json"]
    );

    let log = server
        .log_when(|log| log.contains("agent installed"), LOG_TIMEOUT)
        .await;
    assert!(
        log.contains("installing agent"),
        "install start is logged:\n{log}"
    );
    assert!(
        log.contains("agent installed") && log.contains("duration_ms"),
        "install finish is logged with its duration:\n{log}"
    );
}

#[tokio::test]
async fn require_preinstall_refuses_until_the_agent_is_installed() {
    let release = mock_release();
    let files = FileServer::start(vec![("/a.tar.gz", release.clone())]).await;
    let dir = TempDir::new("preinstall");
    let manifest = agents_file(
        &dir,
        json!([binary_entry(
            "packed",
            "2.0.0",
            &files.url("/a.tar.gz"),
            "bin/agent",
            None
        )]),
    );
    let server = TestServer::start(&["--agents-file", &manifest, "--require-preinstall"]).await;

    let reply = server.initialize_reply("packed").await;
    let doc = assert_problem(&reply, 409, "agent-not-installed");
    assert!(reply.connection_id().is_none(), "{reply:?}");
    assert!(
        problem_text(&doc).contains(&format!(
            "sandbox-agent agents install packed --data-dir {}",
            server.data_dir().display()
        )),
        "the detail names the install command for this server's data dir: {doc}"
    );
    assert_eq!(files.hits(), 0, "nothing was downloaded");
    let entry = agent_entry(&server, "packed").await;
    assert!(
        entry["lastError"]
            .as_str()
            .is_some_and(|e| e.contains("not installed")),
        "{entry}"
    );

    let reply = install(&server, "packed", None).await;
    reply.assert_status(200);
    assert_eq!(reply.json()["alreadyInstalled"], false, "{reply:?}");
    let conn = server.initialize("packed").await;
    let session = server.new_session_for(&conn, "packed").await;
    assert!(session.starts_with("mock-"), "{session}");
}

#[tokio::test]
async fn broken_archives_fail_cleanly_and_the_server_keeps_serving() {
    let good = mock_release();
    let files = FileServer::start(vec![
        ("/garbage.tar.gz", b"this is not a gzip stream".to_vec()),
        ("/good.tar.gz", good.clone()),
        ("/escape.tar.gz", evil_tar_gz("../escaped", None)),
        ("/symlink.tar.gz", evil_tar_gz("ok", Some(("etc", "/etc")))),
        ("/nocmd.tar.gz", tar_gz(&[("other", b"x", 0o755)])),
        ("/truncated.tar.gz", good[..good.len() / 2].to_vec()),
    ])
    .await;
    let wrong_sum = "0".repeat(64);
    // (agent id, URL path, sha256, words the problem detail must contain)
    let cases: [(&str, &str, Option<&str>, &[&str]); 7] = [
        ("garbage", "/garbage.tar.gz", None, &["tar"]),
        (
            "wrongsum",
            "/good.tar.gz",
            Some(&wrong_sum),
            &["sha256", &wrong_sum],
        ),
        ("escape", "/escape.tar.gz", None, &["unsafe", "escaped"]),
        ("symlink", "/symlink.tar.gz", None, &["unsafe", "symlink"]),
        ("nocmd", "/nocmd.tar.gz", None, &["bin/agent"]),
        ("truncated", "/truncated.tar.gz", None, &["tar"]),
        ("gone", "/missing.tar.gz", None, &["404"]),
    ];
    let dir = TempDir::new("broken");
    let entries: Vec<Value> = cases
        .iter()
        .map(|(id, path, sum, _)| binary_entry(id, "1.0.0", &files.url(path), "bin/agent", *sum))
        .collect();
    let manifest = agents_file(&dir, Value::Array(entries));
    let server = TestServer::start(&["--agents-file", &manifest]).await;

    for (id, _, _, words) in cases {
        let reply = install(&server, id, None).await;
        let doc = assert_problem(&reply, 502, "install-failed");
        let text = problem_text(&doc);
        for word in words {
            assert!(
                text.contains(word),
                "{id}: the detail mentions {word:?}: {doc}"
            );
        }
        // initialize tries the lazy install and fails the same way.
        let reply = server.initialize_reply(id).await;
        assert_problem(&reply, 502, "install-failed");
        assert!(reply.connection_id().is_none(), "{id}: {reply:?}");
        let left = names_in(&server.data_dir().join("agents").join(id));
        assert_eq!(left, [".lock"], "{id}: nothing half-written is left");
        let entry = agent_entry(&server, id).await;
        assert_eq!(entry["installed"], false, "{entry}");
        assert!(
            entry["lastError"]
                .as_str()
                .is_some_and(|e| e.contains("install failed")),
            "{entry}"
        );
    }
    assert!(
        !server.data_dir().join("agents/escaped").exists()
            && !server.data_dir().join("escaped").exists(),
        "nothing was written outside the install folder"
    );
    let log = server
        .log_when(
            |log| log.matches("agent install failed").count() >= cases.len(),
            LOG_TIMEOUT,
        )
        .await;
    assert!(
        log.matches("agent install failed").count() >= cases.len(),
        "every failure is in the log:\n{log}"
    );
    mock_still_serves(&server).await;
}

#[tokio::test]
async fn entries_with_nothing_for_this_platform_are_409() {
    let dir = TempDir::new("platform");
    let manifest = agents_file(
        &dir,
        json!([
            {"id": "elsewhere", "name": "Elsewhere", "version": "1.0.0",
             "distribution": {"binary": {
                "plan9-mips": {"archive": "https://example.invalid/a.tar.gz", "cmd": "a"}}}},
            {"id": "python", "name": "Python agent", "version": "1.0.0",
             "distribution": {"uvx": {"package": "some-agent"}}}
        ]),
    );
    let server = TestServer::start(&["--agents-file", &manifest]).await;
    let reply = install(&server, "elsewhere", None).await;
    let doc = assert_problem(&reply, 409, "not-installable");
    let text = problem_text(&doc);
    assert!(
        text.contains(&platform_key()) && text.contains("plan9-mips"),
        "names this platform and the ones offered: {doc}"
    );
    let reply = server.initialize_reply("elsewhere").await;
    assert_problem(&reply, 409, "not-installable");
    let reply = install(&server, "python", None).await;
    let doc = assert_problem(&reply, 409, "not-installable");
    assert!(problem_text(&doc).contains("uvx"), "{doc}");
    let log = server
        .log_when(|log| log.contains("agent install failed"), LOG_TIMEOUT)
        .await;
    assert!(log.contains("agent install failed"), "logged:\n{log}");
    mock_still_serves(&server).await;
}

#[tokio::test]
async fn npm_failures_are_502_with_npm_output() {
    let dir = TempDir::new("npm");
    let manifest = agents_file(
        &dir,
        json!([{"id": "ghost", "name": "Ghost", "version": "1.0.0",
                "distribution": {"npx": {"package": "@sandbox-agent/does-not-exist-xyz"}}}]),
    );
    let server = TestServer::start(&["--agents-file", &manifest]).await;
    let reply = install_within(&server, "ghost", None, INSTALL_TIMEOUT).await;
    let doc = assert_problem(&reply, 502, "install-failed");
    let text = problem_text(&doc);
    assert!(
        text.contains("@sandbox-agent/does-not-exist-xyz@1.0.0"),
        "names the package: {doc}"
    );
    assert!(
        text.contains("npm") && (text.contains("E404") || text.contains("404")),
        "carries npm's own error: {doc}"
    );
    assert_eq!(
        names_in(&server.data_dir().join("agents/ghost")),
        [".lock"],
        "the staging folder is removed"
    );
    let log = server
        .log_when(
            |log| log.contains("agent install failed") && log.contains("E404"),
            LOG_TIMEOUT,
        )
        .await;
    assert!(
        log.contains("agent install failed") && log.contains("E404"),
        "{log}"
    );
    mock_still_serves(&server).await;
}

#[tokio::test]
async fn agents_that_exit_at_once_are_502_and_others_keep_working() {
    let dies = v2_api_tests::mock_agent_command("dies", "--exit-at-start 7");
    let server = TestServer::start(&[
        "--agent-command",
        "broken=/bin/false",
        "--agent-command",
        &dies,
        "--agent-command",
        "gone=/nonexistent/sandbox-agent-test/agent",
    ])
    .await;
    for agent in ["broken", "dies"] {
        let reply = server.initialize_reply(agent).await;
        let doc = assert_problem(&reply, 502, "agent-start-failed");
        assert!(problem_text(&doc).contains("exit"), "{agent}: {doc}");
        let entry = agent_entry(&server, agent).await;
        assert_eq!(entry["source"], "fallback", "{entry}");
        assert!(
            entry["lastError"].as_str().is_some_and(|e| !e.is_empty()),
            "{entry}"
        );
    }
    // A command agent needs no install; a missing one cannot be installed.
    let reply = install(&server, "broken", None).await;
    reply.assert_status(200);
    let body = reply.json();
    assert_eq!(body["alreadyInstalled"], true, "{body}");
    assert_eq!(body["source"], "fallback", "{body}");
    assert_eq!(body["path"], "/bin/false", "{body}");
    let reply = install(&server, "gone", None).await;
    assert_problem(&reply, 409, "not-installable");
    let reply = install(&server, MOCK, None).await;
    reply.assert_status(200);
    assert_eq!(reply.json()["source"], "builtin", "{reply:?}");
    let log = server
        .log_when(|log| log.contains("agent process exited"), LOG_TIMEOUT)
        .await;
    assert!(log.contains("agent process exited"), "{log}");
    mock_still_serves(&server).await;
}

#[tokio::test]
async fn install_requests_are_checked() {
    let files = FileServer::start(vec![("/a.tar.gz", mock_release())]).await;
    let dir = TempDir::new("options");
    let manifest = agents_file(
        &dir,
        json!([binary_entry(
            "packed",
            "1.0.0",
            &files.url("/a.tar.gz"),
            "bin/agent",
            None
        )]),
    );
    let server = TestServer::start(&["--agents-file", &manifest]).await;
    let post = |body: &'static str, content_type: &'static str| {
        server
            .request(reqwest::Method::POST, "/v2/agents/packed/install")
            .header("content-type", content_type)
            .body(body)
    };
    let reply = Api::send(post("{not json", "application/json")).await;
    assert_problem(&reply, 400, "invalid-request");
    let reply = Api::send(post(r#"{"reinstal": true}"#, "application/json")).await;
    let doc = assert_problem(&reply, 400, "invalid-request");
    assert!(
        problem_text(&doc).contains("reinstal"),
        "names the unknown field: {doc}"
    );
    let reply = Api::send(post(r#"{"reinstall": true}"#, "text/plain")).await;
    assert_problem(&reply, 415, "unsupported-media-type");
    let reply = Api::send(post(r#"{"version": "9.9.9"}"#, "application/json")).await;
    let doc = assert_problem(&reply, 400, "invalid-request");
    assert!(problem_text(&doc).contains("1.0.0"), "{doc}");
    let reply = Api::send(post("[]", "application/json")).await;
    let doc = assert_problem(&reply, 400, "invalid-request");
    assert!(problem_text(&doc).contains("object"), "{doc}");
    // npm would install these from somewhere else than the registry package
    // the manifest names, running its install scripts: refused before npm runs.
    for version in [
        "file:/tmp/evil.tgz",
        "git+https://example.com/evil.git",
        "https://example.com/evil.tgz",
        "npm:evil@1.0.0",
        "user/repo",
    ] {
        let reply = install(&server, "codex", Some(&json!({ "version": version }))).await;
        let doc = assert_problem(&reply, 400, "invalid-request");
        assert!(
            problem_text(&doc).contains("registry version"),
            "{version}: {doc}"
        );
    }
    let reply = server.get("/v2/agents/packed/install").await;
    assert_problem(&reply, 405, "method-not-allowed");
    assert_eq!(reply.header("allow"), Some("POST"));
    assert_eq!(files.hits(), 0, "nothing was installed");
}

#[tokio::test]
async fn one_install_at_a_time_even_across_servers_sharing_a_data_dir() {
    let release = mock_release();
    // Slow answers: without the locks, all four installs would download.
    let files = FileServer::start_slow(vec![("/a.tar.gz", release)], Duration::from_secs(1)).await;
    let dir = TempDir::new("shared");
    let manifest = agents_file(
        &dir,
        json!([binary_entry(
            "packed",
            "3.1.4",
            &files.url("/a.tar.gz"),
            "bin/agent",
            None
        )]),
    );
    let data = TempDir::new("shared-data");
    let data_arg = data.path().to_string_lossy().into_owned();
    let args = [
        "--agents-file",
        manifest.as_str(),
        "--data-dir",
        data_arg.as_str(),
    ];
    let first = TestServer::start(&args).await;
    // Its own runtime id: two servers with one runtime id on one store
    // refuse each other (research/contract.md, "One server per runtime id").
    let second = TestServer::start(&[&args[..], &["--runtime-id", "second"]].concat()).await;
    let apis = [first.api(), second.api(), first.api(), second.api()];
    let tasks: Vec<_> = apis
        .into_iter()
        .map(|api| {
            tokio::spawn(async move { install_within(&api, "packed", None, REQUEST_TIMEOUT).await })
        })
        .collect();
    let mut fresh = 0;
    for task in tasks {
        let reply = v2_api_tests::join_within(task, REQUEST_TIMEOUT).await;
        reply.assert_status(200);
        if reply.json()["alreadyInstalled"] == false {
            fresh += 1;
        }
    }
    assert_eq!(fresh, 1, "exactly one call installed");
    assert_eq!(files.hits(), 1, "exactly one download");
    assert_eq!(
        names_in(&data.path().join("agents/packed")),
        [".lock", "3.1.4", "current.json"]
    );
    // Both servers run the installed agent.
    for server in [&first, &second] {
        let conn = server.initialize("packed").await;
        server.new_session_for(&conn, "packed").await;
    }
}

#[tokio::test]
async fn the_cli_lists_and_installs_without_a_server() {
    let release = mock_release();
    let files = FileServer::start(vec![("/a.tar.gz", release.clone())]).await;
    let dir = TempDir::new("cli");
    let manifest = agents_file(
        &dir,
        json!([binary_entry(
            "packed",
            "4.0.0",
            &files.url("/a.tar.gz"),
            "bin/agent",
            Some(&sha256_hex(&release))
        )]),
    );
    let data = TempDir::new("cli-data");
    let cli = |args: &[&str]| {
        let mut command = sandbox_agent_command();
        command
            .arg("agents")
            .args(args)
            .args(["--agents-file", manifest.as_str()])
            .env("SANDBOX_AGENT_DATA_DIR", data.path())
            .stdin(Stdio::null());
        command
    };
    let run = |args: &'static [&'static str]| {
        let mut command = cli(args);
        async move {
            tokio::task::spawn_blocking(move || command.output())
                .await
                .expect("join the CLI")
                .expect("run the CLI")
        }
    };

    let listed = run(&["list", "--json"]).await;
    assert!(listed.status.success(), "{listed:?}");
    let list: Value = serde_json::from_slice(&listed.stdout).expect("list --json is JSON");
    let packed = list["agents"]
        .as_array()
        .and_then(|a| a.iter().find(|e| e["id"] == "packed"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(packed["installed"], false, "{list}");

    let installed = run(&["install", "packed"]).await;
    let stdout = String::from_utf8_lossy(&installed.stdout);
    let stderr = String::from_utf8_lossy(&installed.stderr);
    assert!(installed.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("installed packed 4.0.0"), "{stdout}");
    assert!(
        stderr.contains("packed: installing"),
        "progress as plain lines when stderr is not a terminal: {stderr}"
    );
    let again = run(&["install", "packed"]).await;
    assert!(again.status.success(), "{again:?}");
    assert!(
        String::from_utf8_lossy(&again.stdout).contains("packed 4.0.0 is already installed"),
        "{again:?}"
    );
    assert_eq!(files.hits(), 1);

    let table = run(&["list"]).await;
    let text = String::from_utf8_lossy(&table.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("packed "))
        .unwrap_or_else(|| panic!("no packed line in\n{text}"));
    assert!(
        line.contains("registry") && line.contains("4.0.0"),
        "{text}"
    );
    let codex = text
        .lines()
        .find(|l| l.starts_with("codex "))
        .unwrap_or_default();
    assert!(
        codex.contains("@zed-industries/codex-acp@"),
        "says what it would install: {text}"
    );

    let unknown = run(&["install", "nope"]).await;
    assert!(!unknown.status.success());
    assert!(
        String::from_utf8_lossy(&unknown.stderr).contains("unknown agent \"nope\""),
        "{unknown:?}"
    );

    // A server on that data dir finds the agent installed, even when it
    // refuses lazy installs.
    let data_arg = data.path().to_string_lossy().into_owned();
    let server = TestServer::start(&[
        "--agents-file",
        &manifest,
        "--data-dir",
        &data_arg,
        "--require-preinstall",
    ])
    .await;
    let conn = server.initialize("packed").await;
    server.new_session_for(&conn, "packed").await;
    assert_eq!(files.hits(), 1);
}

/// Lines the installer logs per npm run it starts.
const NPM_INSTALL_RUN: &str = "running npm install";

#[tokio::test]
async fn concurrent_lazy_installs_share_one_npm_run_and_a_failure_backs_off() {
    // An unreachable registry and an empty npm cache: npm fails (after its
    // bounded retries, a few seconds), and nothing can come from a cache.
    let cache = TempDir::new("npm-cache");
    let cache_path = cache.path().to_string_lossy().into_owned();
    let server = TestServer::start_with_env(
        &[
            "--request-timeout-ms",
            "1500",
            "--install-retry-backoff-ms",
            "120000",
        ],
        &[
            ("npm_config_registry", "http://127.0.0.1:9/"),
            ("npm_config_cache", &cache_path),
        ],
    )
    .await;
    let bound = Duration::from_secs(5);
    let waiters: Vec<_> = (0..3)
        .map(|_| {
            let api = server.api();
            tokio::spawn(async move {
                let started = Instant::now();
                let reply = initialize_within(&api, "claude", bound).await;
                (reply, started.elapsed())
            })
        })
        .collect();
    // A client that hangs up while the install runs.
    let api = server.api();
    let hangs_up = tokio::spawn(async move {
        let request = v2_api_tests::acp::request(
            0,
            "initialize",
            v2_api_tests::acp::initialize_params("claude"),
        );
        api.rpc_post(None)
            .timeout(Duration::from_millis(300))
            .body(request.to_string())
            .send()
            .await
            .is_err()
    });
    for waiter in waiters {
        let (reply, took) = v2_api_tests::join_within(waiter, bound * 2).await;
        // Still installing when the request's wait ends (1.5 s), or npm
        // already failed: either way a 502 within the request timeout.
        let still = reply.json()["type"] == "urn:sandbox-agent:error:agent-start-failed";
        let kind = if still {
            "agent-start-failed"
        } else {
            "install-failed"
        };
        let text = problem_text(&assert_problem(&reply, 502, kind));
        let expected = if still {
            "still being installed"
        } else {
            "ECONNREFUSED"
        };
        assert!(text.contains(expected), "{text}");
        assert!(took < Duration::from_secs(4), "answered after {took:?}");
    }
    assert!(
        v2_api_tests::join_within(hangs_up, bound).await,
        "the client gave up"
    );

    // The install goes on without any waiting request; its failure is
    // logged and recorded.
    let deadline = Instant::now() + Duration::from_secs(60);
    let entry = loop {
        let entry = agent_entry(&server, "claude").await;
        if entry["lastError"]
            .as_str()
            .is_some_and(|e| e.contains("install failed"))
            || Instant::now() > deadline
        {
            break entry;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let last_error = entry["lastError"].as_str().unwrap_or_default();
    assert!(
        last_error.contains("install failed") && last_error.contains("ECONNREFUSED"),
        "{entry}"
    );
    let log = server
        .log_when(|log| log.contains("agent install failed"), LOG_TIMEOUT)
        .await;
    assert!(log.contains("agent install failed"), "{log}");
    assert_eq!(
        log.matches(NPM_INSTALL_RUN).count(),
        1,
        "one npm run for four requests:\n{log}"
    );

    // Within the back-off the failure is the answer, at once, without npm.
    let started = Instant::now();
    let reply = initialize_within(&server, "claude", bound).await;
    let doc = assert_problem(&reply, 502, "install-failed");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    let text = problem_text(&doc);
    assert!(
        text.contains("ECONNREFUSED") && text.contains("not tried again"),
        "{doc}"
    );
    assert_eq!(
        server.stderr_text().matches(NPM_INSTALL_RUN).count(),
        1,
        "no npm run in the back-off"
    );

    // An explicit install tries at once; its failure is lastError too.
    let reply = install_within(&server, "codex", None, Duration::from_secs(30)).await;
    assert_problem(&reply, 502, "install-failed");
    let entry = agent_entry(&server, "codex").await;
    assert!(
        entry["lastError"]
            .as_str()
            .is_some_and(|e| e.contains("install failed") && e.contains("ECONNREFUSED")),
        "{entry}"
    );
    mock_still_serves(&server).await;
}

#[tokio::test]
async fn installing_a_dist_tag_resolves_it_before_running_npm() {
    // A loopback npm registry with sa-fake-agent 1.0.0 (dist-tag latest),
    // and an npm cache of this test's own.
    let npm = npm_registry("sa-fake-agent", "1.0.0", &mock_agent_script()).await;
    let dir = TempDir::new("dist-tag");
    let manifest = agents_file(
        &dir,
        json!([{"id": "npmfake", "name": "Npm fake", "version": "1.0.0",
                "distribution": {"npx": {"package": "sa-fake-agent"}}}]),
    );
    let data = TempDir::new("dist-tag-data");
    let cache = TempDir::new("dist-tag-cache");
    let registry = npm.registry.url("/");
    let run = |args: &[&str]| {
        let mut command = sandbox_agent_command();
        command
            .arg("agents")
            .args(["--agents-file", manifest.as_str(), "install", "npmfake"])
            .args(args)
            .env("SANDBOX_AGENT_DATA_DIR", data.path())
            .env("npm_config_registry", &registry)
            .env("npm_config_cache", cache.path())
            .stdin(Stdio::null());
        async move {
            let output = tokio::time::timeout(
                REQUEST_TIMEOUT,
                tokio::task::spawn_blocking(move || command.output()),
            )
            .await
            .expect("the CLI finishes")
            .expect("join the CLI")
            .expect("run the CLI");
            let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
            let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
            assert!(output.status.success(), "{stdout}\n{stderr}");
            (stdout, stderr)
        }
    };
    let (stdout, stderr) = run(&[]).await;
    assert!(stdout.contains("installed npmfake 1.0.0"), "{stdout}");
    assert!(
        stderr.contains("npm install sa-fake-agent@1.0.0"),
        "{stderr}"
    );
    assert_eq!(npm.tarballs.hits(), 1);

    for version in ["latest", "^1.0"] {
        let (stdout, stderr) = run(&["--version", version]).await;
        assert!(
            stdout.contains("npmfake 1.0.0 is already installed"),
            "{version}: {stdout}"
        );
        assert!(
            stderr.contains(&format!("resolving sa-fake-agent@{version}")),
            "{version}: {stderr}"
        );
        assert!(
            !stderr.contains("npm install"),
            "{version}: resolved first, so npm install does not run: {stderr}"
        );
    }
    assert_eq!(npm.tarballs.hits(), 1, "no second download");
}
