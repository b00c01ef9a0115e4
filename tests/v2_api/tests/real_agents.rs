//! Real agents nobody on this team wrote, end to end through the runtime over
//! real HTTP, each installed from the npm registry by the runtime itself and
//! taken to `session/new` (research/contract.md, "Real agents as
//! observed"):
//!
//! - codex-acp: `initialize`, `authenticate` with a dummy `OPENAI_API_KEY`,
//!   `session/new` and its own `session/update` on the SSE stream;
//! - OpenCode: `initialize` and `session/new`, no key at all;
//! - Gemini CLI: without `GEMINI_API_KEY`, `session/new` is the agent's
//!   "authentication required" naming the key; with a dummy one (the runtime
//!   authenticates the process), a session;
//! - Claude Code: installed on the first `initialize`; as root it refuses
//!   `session/new` and the error carries its stderr line saying so; under
//!   `--agent-user` it opens a session. Both need root (CI runs as root);
//!   otherwise they say why and check nothing.
//!
//! Installs go to `<target dir>/agent-cache` (passed as `--data-dir`), so
//! later runs reuse them; the `--agent-user` case has a data dir of its own
//! beside it: Claude Code run as root by the test beside it, at the same
//! time, creates root-owned folders in its home (`debug/`, mode 0755),
//! where Claude Code under the user then cannot write and exits (EACCES).
//! The server hands every root entry of a home over at each start of the
//! agent (research/contract.md, "Agents under an unprivileged user"), but
//! not while another server writes into it. Nothing depends on an earlier
//! run.
//! No prompt is ever sent: there is no network to the model providers here,
//! and none is needed to prove the wiring. Needs `npm` (Node.js) on `PATH`
//! and the npm registry.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use v2_api_tests::agents::{INSTALL_TIMEOUT, TempDir, agent_entry, install_within};
use v2_api_tests::ext::{expect_error, expect_result, namespace};
use v2_api_tests::server::binary_path;
use v2_api_tests::users::{AGENT_USER, Ids, agent_user, is_root};
use v2_api_tests::{Api, META_KEY, TestServer, acp};

/// How long a real agent may take to answer a request (its start-up included).
const AGENT_TIMEOUT: Duration = Duration::from_secs(120);

/// A key of the right shape for codex-acp's `openai-api-key` method; never
/// sent anywhere (no prompt).
const DUMMY_OPENAI_KEY: &str = "sk-sandbox-agent-test-dummy-key";
/// The same for Gemini CLI's `gemini-api-key` method.
const DUMMY_GEMINI_KEY: &str = "sandbox-agent-test-dummy-gemini-key";

/// `<target dir>/<name>`, created: a data dir shared by these tests and kept
/// between runs.
fn target_dir(name: &str) -> String {
    let target = binary_path()
        .parent()
        .and_then(|debug| debug.parent())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("target"));
    let dir = target.join(name);
    std::fs::create_dir_all(&dir).expect("create the agent cache");
    dir.to_string_lossy().into_owned()
}

/// `<target dir>/agent-cache`: the data dir of every server here that runs
/// agents as its own user.
fn agent_cache() -> String {
    target_dir("agent-cache")
}

/// A server on the agent cache, with `env` added to its environment. The
/// tests here run at once on the one cache: `--store memory`, since servers
/// with one runtime id on one store refuse each other (research/contract.md,
/// "One server per runtime id"), and a cache kept across runs must not pile
/// up sessions.
async fn server_with_env(env: &[(&str, &str)]) -> TestServer {
    TestServer::start_with_env(&["--data-dir", &agent_cache(), "--store", "memory"], env).await
}

/// A server on the agent cache, with a dummy OpenAI key in its environment
/// (enough for codex-acp's `openai-api-key` auth method; it is never used).
async fn server() -> TestServer {
    server_with_env(&[("OPENAI_API_KEY", DUMMY_OPENAI_KEY)]).await
}

/// `initialize` for `agent` without a connection, waiting up to `timeout`
/// (a lazy install happens inside it).
async fn initialize_within(api: &Api, agent: &str, timeout: Duration) -> v2_api_tests::Reply {
    let request = acp::request(0, "initialize", acp::initialize_params(agent));
    Api::send_within(api.rpc_post(None).body(request.to_string()), timeout).await
}

/// `POST /v2/agents/{agent}/install` (npm, or found in the data dir), its
/// time printed; checks the answer names the agent's folder in the data
/// dir. Returns the installed version.
async fn install(server: &TestServer, agent: &str, data_dir: &str) -> String {
    let started = Instant::now();
    let reply = install_within(server, agent, None, INSTALL_TIMEOUT).await;
    reply.assert_status(200);
    let installed = reply.json();
    eprintln!(
        "{agent} install: {:.1} s (alreadyInstalled: {}, durationMs: {})",
        started.elapsed().as_secs_f64(),
        installed["alreadyInstalled"],
        installed["durationMs"]
    );
    assert_eq!(installed["agent"], agent, "{installed}");
    assert_eq!(installed["source"], "registry", "{installed}");
    let version = installed["version"]
        .as_str()
        .unwrap_or_else(|| panic!("no version: {installed}"))
        .to_owned();
    let path = installed["path"].as_str().unwrap_or_default();
    assert!(
        path.starts_with(&format!(
            "{data_dir}/agents/{agent}/{version}/node_modules/"
        )),
        "installed into the data dir: {installed}"
    );
    version
}

/// `initialize` for an installed `agent`: its connection id and result.
async fn initialize(server: &TestServer, agent: &str) -> (String, Value) {
    let reply = initialize_within(server, agent, AGENT_TIMEOUT).await;
    reply.assert_status(200);
    let conn = reply
        .connection_id()
        .unwrap_or_else(|| panic!("no connection: {reply:?}"));
    let body = reply.json();
    let result = expect_result(&body).clone();
    assert_eq!(result["protocolVersion"], 1, "{body}");
    assert!(
        result["agentCapabilities"]["_meta"][META_KEY]["extensions"].is_object(),
        "the runtime's extension block: {body}"
    );
    (conn, result)
}

/// The ids of an `initialize` result's `authMethods`.
fn auth_method_ids(result: &Value) -> Vec<&str> {
    result["authMethods"]
        .as_array()
        .map(|m| m.iter().filter_map(|m| m["id"].as_str()).collect())
        .unwrap_or_default()
}

/// `session/new` for `agent` in `cwd` on `conn`, answered within
/// [`AGENT_TIMEOUT`]: the whole JSON-RPC answer.
async fn new_session(server: &TestServer, conn: &str, agent: &str, cwd: &Path) -> Value {
    let request = acp::request(
        2,
        "session/new",
        json!({"cwd": cwd, "mcpServers": [], "_meta": acp::agent_meta(agent)}),
    );
    let reply = Api::send_within(
        server.rpc_post(Some(conn)).body(request.to_string()),
        AGENT_TIMEOUT,
    )
    .await;
    reply.assert_status(200);
    reply.json()
}

/// The session id of a successful `session/new` answer, checked to be the
/// agent's own (not the mock's) and filed under `agent`.
fn session_id(answer: &Value, agent: &str) -> String {
    let result = expect_result(answer);
    let session = result["sessionId"]
        .as_str()
        .unwrap_or_else(|| panic!("no sessionId: {answer}"))
        .to_owned();
    assert!(
        !session.is_empty() && !session.starts_with("mock-"),
        "{session}"
    );
    assert_eq!(namespace(result)["agent"], agent, "{answer}");
    session
}

/// Whether `text` is a UUID in its hyphenated form.
fn is_uuid(text: &str) -> bool {
    let groups: Vec<&str> = text.split('-').collect();
    groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && groups
            .iter()
            .all(|g| g.chars().all(|c| c.is_ascii_hexdigit()))
}

/// The agent's `available_commands_update` for `session` on `stream`.
async fn commands_update(
    stream: &mut v2_api_tests::SseStream,
    session: &str,
) -> v2_api_tests::SseEvent {
    stream
        .next_event_matching(
            |e| {
                e.method() == Some("session/update")
                    && e.session_id() == Some(session)
                    && e.update_kind() == Some("available_commands_update")
            },
            AGENT_TIMEOUT,
        )
        .await
}

#[tokio::test]
async fn codex_installs_from_npm_and_speaks_acp_through_the_runtime() {
    let server = server().await;
    let cache = agent_cache();
    let version = install(&server, "codex", &cache).await;

    // initialize: codex-acp's own result, with the runtime's block added.
    let (conn, result) = initialize(&server, "codex").await;
    assert_eq!(result["agentInfo"]["name"], "codex-acp", "{result}");
    assert_eq!(result["agentInfo"]["version"], version.as_str(), "{result}");
    let auth_ids = auth_method_ids(&result);
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
    let answer = new_session(&server, &conn, "codex", workdir.path()).await;
    let session = session_id(&answer, "codex");
    assert!(is_uuid(&session), "{answer}");
    let update = commands_update(&mut stream, &session).await;
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
async fn opencode_installs_from_npm_and_opens_a_session_without_any_key() {
    let server = server_with_env(&[]).await;
    let cache = agent_cache();
    let version = install(&server, "opencode", &cache).await;

    let (conn, result) = initialize(&server, "opencode").await;
    assert_eq!(result["agentInfo"]["name"], "OpenCode", "{result}");
    assert_eq!(result["agentInfo"]["version"], version.as_str(), "{result}");
    // Its only auth method is an interactive login, which a session does
    // not need.
    assert_eq!(auth_method_ids(&result), ["opencode-login"], "{result}");
    assert_eq!(result["agentCapabilities"]["loadSession"], true, "{result}");

    let workdir = TempDir::new("opencode-cwd");
    let answer = new_session(&server, &conn, "opencode", workdir.path()).await;
    let session = session_id(&answer, "opencode");
    assert!(
        session.starts_with("ses_"),
        "OpenCode's own id form: {answer}"
    );
    let options = expect_result(&answer)["configOptions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let model = options
        .iter()
        .find(|o| o["category"] == "model")
        .unwrap_or_else(|| panic!("a model option: {answer}"));
    assert!(
        model["options"].as_array().is_some_and(|o| !o.is_empty()),
        "OpenCode offers models without a key: {answer}"
    );
    assert!(
        options.iter().any(|o| o["category"] == "mode"),
        "and modes: {answer}"
    );

    // The XDG variables of the manifest keep its state in its home.
    assert!(
        PathBuf::from(&cache)
            .join("homes/opencode/data/opencode")
            .is_dir(),
        "OpenCode keeps its data in <data>/homes/opencode/data"
    );
    server.delete(Some(&conn)).await;
}

#[tokio::test]
async fn gemini_needs_its_api_key_for_a_session_and_opens_one_with_it() {
    let cache = agent_cache();
    // Without a key (emptied, in case the developer's environment has one:
    // the runtime and Gemini CLI both take empty for unset).
    let server = server_with_env(&[("GEMINI_API_KEY", ""), ("GOOGLE_API_KEY", "")]).await;
    let version = install(&server, "gemini", &cache).await;
    let (conn, result) = initialize(&server, "gemini").await;
    assert_eq!(result["agentInfo"]["name"], "gemini-cli", "{result}");
    assert_eq!(result["agentInfo"]["title"], "Gemini CLI", "{result}");
    assert_eq!(result["agentInfo"]["version"], version.as_str(), "{result}");
    let auth_ids = auth_method_ids(&result);
    assert!(auth_ids.contains(&"gemini-api-key"), "{auth_ids:?}");
    let workdir = TempDir::new("gemini-cwd");
    let answer = new_session(&server, &conn, "gemini", workdir.path()).await;
    // The agent's own "authentication required", naming what is missing.
    let error = expect_error(&answer, -32000);
    assert_eq!(
        error["message"], "Gemini API key is missing or not configured.",
        "{answer}"
    );
    server.delete(Some(&conn)).await;
    drop(server);

    // With a dummy key the runtime authenticates the process (the manifest's
    // gemini-api-key ← GEMINI_API_KEY) and the agent takes it without
    // checking it over the network.
    let server = server_with_env(&[("GEMINI_API_KEY", DUMMY_GEMINI_KEY)]).await;
    let (conn, _) = initialize(&server, "gemini").await;
    let entry = agent_entry(&server, "gemini").await;
    assert!(
        entry["lastError"].is_null(),
        "the runtime's authenticate was accepted: {entry}"
    );
    let answer = new_session(&server, &conn, "gemini", workdir.path()).await;
    let session = session_id(&answer, "gemini");
    assert!(is_uuid(&session), "{answer}");
    let result = expect_result(&answer);
    assert!(
        result["modes"]["availableModes"]
            .as_array()
            .is_some_and(|m| !m.is_empty()),
        "Gemini CLI's modes: {answer}"
    );
    assert!(
        result["models"]["availableModels"]
            .as_array()
            .is_some_and(|m| !m.is_empty()),
        "Gemini CLI's models: {answer}"
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
    // Its only auth method is an interactive login (`claude /login`).
    assert_eq!(auth_method_ids(result), ["claude-login"], "{body}");
    let entry = agent_entry(&server, "claude").await;
    assert_eq!(entry["installed"], true, "{entry}");
    assert_eq!(entry["source"], "registry", "{entry}");
    assert_eq!(entry["version"], info["version"], "{entry}");
}

/// The line Claude Code writes to stderr when it is started as root (its
/// ACP adapter always passes `--dangerously-skip-permissions`).
const CLAUDE_ROOT_REFUSAL: &str =
    "--dangerously-skip-permissions cannot be used with root/sudo privileges";

#[tokio::test]
async fn claude_code_as_root_refuses_a_session_and_the_error_carries_why() {
    if !is_root() {
        eprintln!(
            "claude as root: not run: Claude Code refuses sessions only as root, and this test runs as uid {}",
            nix::unistd::geteuid()
        );
        return;
    }
    let server = server_with_env(&[]).await;
    let reply = initialize_within(&server, "claude", INSTALL_TIMEOUT).await;
    reply.assert_status(200);
    let conn = reply
        .connection_id()
        .unwrap_or_else(|| panic!("no connection: {reply:?}"));
    let workdir = TempDir::new("claude-root-cwd");
    let answer = new_session(&server, &conn, "claude", workdir.path()).await;
    // The adapter's own error says nothing useful ("Query closed before
    // response received"); the runtime adds the agent's stderr lines
    // (research/contract.md, "Agent errors: stderr and hint").
    let error = expect_error(&answer, -32603);
    let added = &error["data"][META_KEY];
    let stderr: Vec<&str> = added["stderr"]
        .as_array()
        .map(|lines| lines.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    assert!(
        stderr.iter().any(|line| line.contains(CLAUDE_ROOT_REFUSAL)),
        "the error carries Claude Code's refusal: {answer}"
    );
    assert!(
        added["hint"]
            .as_str()
            .is_some_and(|hint| hint.contains("--agent-user")),
        "and the hint to run agents as another user: {answer}"
    );
    server.delete(Some(&conn)).await;
}

#[tokio::test]
async fn claude_code_opens_a_session_under_the_agent_user() {
    let Some(user) = agent_user() else {
        eprintln!(
            "claude under --agent-user: not run: only root may create {AGENT_USER} and start agents as another user, and this test runs as uid {}",
            nix::unistd::geteuid()
        );
        return;
    };
    // A data dir of its own (root's, like the agent cache): see the module
    // doc.
    let data_dir = target_dir("agent-cache-agent-user");
    let server = TestServer::start_with_env(
        &["--data-dir", &data_dir, "--agent-user", AGENT_USER],
        &[("SANDBOX_AGENT_TOKEN", "real-agents-token")],
    )
    .await;
    let started = Instant::now();
    let reply = initialize_within(&server, "claude", INSTALL_TIMEOUT).await;
    eprintln!(
        "claude initialize under --agent-user (install included when not cached): {:.1} s",
        started.elapsed().as_secs_f64()
    );
    reply.assert_status(200);
    let conn = reply
        .connection_id()
        .unwrap_or_else(|| panic!("no connection: {reply:?}"));

    let mut stream = server.open_stream(&conn, None).await;
    let workdir = owned_dir("claude-user-cwd", user);
    let answer = new_session(&server, &conn, "claude", workdir.path()).await;
    let session = session_id(&answer, "claude");
    assert!(is_uuid(&session), "{answer}");
    let result = expect_result(&answer);
    assert!(
        result["modes"]["availableModes"]
            .as_array()
            .is_some_and(|m| !m.is_empty()),
        "Claude Code's modes: {answer}"
    );
    let update = commands_update(&mut stream, &session).await;
    assert!(
        update
            .update()
            .and_then(|u| u["availableCommands"].as_array())
            .is_some_and(|c| !c.is_empty()),
        "Claude Code lists its commands: {update:?}"
    );
    // Its home (CLAUDE_CONFIG_DIR) is the user's.
    let home = std::fs::metadata(Path::new(&data_dir).join("homes/claude")).expect("the home");
    assert_eq!(
        (home.uid(), home.gid()),
        (user.uid, user.gid),
        "<data>/homes/claude belongs to {AGENT_USER}"
    );
    server.delete(Some(&conn)).await;
}

/// A directory `user` owns (a session's `cwd` must be writable by the
/// agent user: research/contract.md, "Agents under an unprivileged user").
fn owned_dir(label: &str, user: Ids) -> TempDir {
    let dir = TempDir::new(label);
    std::os::unix::fs::chown(dir.path(), Some(user.uid), Some(user.gid)).expect("chown");
    dir
}
