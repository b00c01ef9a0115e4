//! Real agents nobody on this team wrote, end to end through the runtime over
//! real HTTP: codex-acp installed from the npm registry, then
//! `initialize`, `authenticate`, `session/new` and its own `session/update`
//! on the SSE stream; Claude Code's `initialize`, installed lazily.
//!
//! Installs go to `<target dir>/agent-cache` (passed as `--data-dir`), so
//! later runs reuse them. No prompt is ever sent: there is no network to the
//! model providers here, and none is needed to prove the wiring. Needs `npm`
//! (Node.js) on `PATH` and the npm registry.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use v2_api_tests::agents::{INSTALL_TIMEOUT, TempDir, agent_entry, install_within};
use v2_api_tests::ext::{expect_result, namespace};
use v2_api_tests::server::binary_path;
use v2_api_tests::{Api, META_KEY, TestServer, acp};

/// How long a real agent may take to answer a request (its start-up included).
const AGENT_TIMEOUT: Duration = Duration::from_secs(120);

/// `<target dir>/agent-cache`: the data dir shared by these tests and kept
/// between runs.
fn agent_cache() -> String {
    let target = binary_path()
        .parent()
        .and_then(|debug| debug.parent())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target"));
    let cache = target.join("agent-cache");
    std::fs::create_dir_all(&cache).expect("create the agent cache");
    cache.to_string_lossy().into_owned()
}

/// A server on the agent cache, with a dummy OpenAI key in its environment
/// (enough for codex-acp's `openai-api-key` auth method; it is never used).
async fn server() -> TestServer {
    let cache = agent_cache();
    TestServer::start_with_env(
        &["--data-dir", &cache],
        &[("OPENAI_API_KEY", "sk-sandbox-agent-test-dummy-key")],
    )
    .await
}

/// `initialize` for `agent` without a connection, waiting up to `timeout`
/// (a lazy install happens inside it).
async fn initialize_within(api: &Api, agent: &str, timeout: Duration) -> v2_api_tests::Reply {
    let request = acp::request(0, "initialize", acp::initialize_params(agent));
    Api::send_within(api.rpc_post(None).body(request.to_string()), timeout).await
}

#[tokio::test]
async fn codex_installs_from_npm_and_speaks_acp_through_the_runtime() {
    let server = server().await;

    // Install from the npm registry (or find it in the cache).
    let started = Instant::now();
    let reply = install_within(&server, "codex", None, INSTALL_TIMEOUT).await;
    reply.assert_status(200);
    let installed = reply.json();
    eprintln!(
        "codex install: {:.1} s (alreadyInstalled: {}, durationMs: {})",
        started.elapsed().as_secs_f64(),
        installed["alreadyInstalled"],
        installed["durationMs"]
    );
    assert_eq!(installed["agent"], "codex", "{installed}");
    assert_eq!(installed["source"], "registry", "{installed}");
    let version = installed["version"]
        .as_str()
        .unwrap_or_else(|| panic!("no version: {installed}"))
        .to_owned();
    let cache = agent_cache();
    let path = installed["path"].as_str().unwrap_or_default();
    assert!(
        path.starts_with(&format!("{cache}/agents/codex/{version}/node_modules/")),
        "installed into the data dir: {installed}"
    );

    // initialize: codex-acp's own result, with the runtime's block added.
    let reply = initialize_within(&server, "codex", AGENT_TIMEOUT).await;
    reply.assert_status(200);
    let conn = reply
        .connection_id()
        .unwrap_or_else(|| panic!("no connection: {reply:?}"));
    let body = reply.json();
    let result = expect_result(&body);
    assert_eq!(result["agentInfo"]["name"], "codex-acp", "{body}");
    assert_eq!(result["agentInfo"]["version"], version.as_str(), "{body}");
    assert_eq!(result["protocolVersion"], 1, "{body}");
    let block = &result["agentCapabilities"]["_meta"][META_KEY];
    assert!(
        block["extensions"].is_object() && block["extensions"]["methods"].is_array(),
        "the runtime's extension block: {body}"
    );
    let auth_ids: Vec<&str> = result["authMethods"]
        .as_array()
        .map(|m| m.iter().filter_map(|m| m["id"].as_str()).collect())
        .unwrap_or_default();
    assert!(auth_ids.contains(&"openai-api-key"), "{auth_ids:?}");

    // authenticate with the API key from the server's environment.
    let response = server
        .rpc(
            &conn,
            1,
            "authenticate",
            json!({"methodId": "openai-api-key"}),
        )
        .await;
    expect_result(&response);

    // session/new: a real codex session id; its own session/update on SSE.
    let mut stream = server.open_stream(&conn, None).await;
    let workdir = TempDir::new("codex-cwd");
    let response = server
        .rpc(
            &conn,
            2,
            "session/new",
            json!({"cwd": workdir.path(), "mcpServers": [], "_meta": acp::agent_meta("codex")}),
        )
        .await;
    let result = expect_result(&response);
    let session = result["sessionId"]
        .as_str()
        .unwrap_or_else(|| panic!("no sessionId: {response}"))
        .to_owned();
    assert!(
        !session.is_empty() && !session.starts_with("mock-"),
        "{session}"
    );
    assert_eq!(namespace(result)["agent"], "codex", "{response}");
    let update = stream
        .next_event_matching(
            |e| {
                e.method() == Some("session/update")
                    && e.session_id() == Some(session.as_str())
                    && e.update_kind() == Some("available_commands_update")
            },
            AGENT_TIMEOUT,
        )
        .await;
    let commands = update.update().map(|u| u["availableCommands"].clone());
    assert!(
        commands
            .as_ref()
            .and_then(Value::as_array)
            .is_some_and(|c| !c.is_empty()),
        "codex-acp lists its commands: {update:?}"
    );

    let entry = agent_entry(&server, "codex").await;
    assert_eq!(entry["installed"], true, "{entry}");
    assert_eq!(entry["running"], true, "{entry}");
    assert_eq!(entry["version"], version.as_str(), "{entry}");
    assert_eq!(entry["agentInfo"]["name"], "codex-acp", "{entry}");
    // CODEX_HOME is the agent's home in the data dir (from the manifest).
    assert!(
        PathBuf::from(&cache).join("homes/codex").is_dir(),
        "codex keeps its state in <data>/homes/codex"
    );
    server.delete(Some(&conn)).await;
}

#[tokio::test]
async fn claude_code_installs_on_first_initialize_and_answers_it() {
    let server = server().await;
    let started = Instant::now();
    let reply = initialize_within(&server, "claude", INSTALL_TIMEOUT).await;
    eprintln!(
        "claude initialize (install included when not cached): {:.1} s",
        started.elapsed().as_secs_f64()
    );
    reply.assert_status(200);
    assert!(reply.connection_id().is_some(), "{reply:?}");
    let body = reply.json();
    let result = expect_result(&body);
    let info = &result["agentInfo"];
    assert_eq!(info["title"], "Claude Code", "{body}");
    assert!(
        info["name"]
            .as_str()
            .is_some_and(|n| n.contains("claude-code-acp")),
        "{body}"
    );
    assert!(
        result["agentCapabilities"]["_meta"][META_KEY]["extensions"].is_object(),
        "{body}"
    );
    let entry = agent_entry(&server, "claude").await;
    assert_eq!(entry["installed"], true, "{entry}");
    assert_eq!(entry["source"], "registry", "{entry}");
    assert_eq!(entry["version"], info["version"], "{entry}");
}
