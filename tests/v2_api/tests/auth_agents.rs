//! Agents that need a credential (research/contract.md, "Agent
//! authentication"): a manifest entry's `auth` maps an environment variable
//! to an ACP auth method; a server with that variable authenticates the
//! agent process itself after `initialize`; without it, `session/new` fails
//! with `-32000` and `sandbox-agent prompt` says what to set, or
//! authenticates with `--auth-method`.
//!
//! The agent is the mock with `--require-auth test-key`: it advertises
//! `authMethods: [{id: "test-key"}]` and answers session requests with
//! `-32000` "Authentication required" until `authenticate {methodId:
//! "test-key"}` came.

use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use v2_api_tests::agents::{TempDir, agent_entry, agents_file};
use v2_api_tests::server::{sandbox_agent_bin, sandbox_agent_command};
use v2_api_tests::{TestServer, acp};

/// The agent id of the locked mock.
const LOCKED: &str = "locked";
/// The variable the manifest maps to the auth method.
const KEY_VAR: &str = "TEST_AGENT_KEY";
/// Bound on one `prompt` run.
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// An agents file with the locked mock, whose `auth` maps `TEST_AGENT_KEY`
/// to `test-key`.
fn locked_agents_file(dir: &TempDir) -> String {
    agents_file(
        dir,
        json!([{
            "id": LOCKED,
            "distribution": {"local": {
                "command": sandbox_agent_bin().to_string_lossy(),
                "args": ["mock-agent", "--require-auth", "test-key"]
            }},
            "auth": [
                {"methodId": "not-offered", "env": "PATH"},
                {"methodId": "test-key", "env": KEY_VAR}
            ]
        }]),
    )
}

/// `session/new` for the locked agent on a new connection; the response.
async fn new_session(server: &TestServer) -> Value {
    let conn = server.initialize(LOCKED).await;
    server
        .call(
            &conn,
            &acp::request(1, "session/new", acp::new_session_params(LOCKED)),
        )
        .await
}

/// Runs `sandbox-agent prompt --url <server> --agent locked <args> hi`;
/// (exit code, stdout, stderr).
async fn prompt(server: &TestServer, args: &[&str]) -> (Option<i32>, String, String) {
    let mut command = tokio::process::Command::from(sandbox_agent_command());
    command
        .args(["prompt", "--url", server.base_url(), "--agent", LOCKED])
        .args(args)
        .arg("hello")
        .env_remove(KEY_VAR)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = command.spawn().expect("spawn sandbox-agent prompt");
    let output = tokio::time::timeout(RUN_TIMEOUT, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("prompt {args:?} did not finish within {RUN_TIMEOUT:?}"))
        .expect("run sandbox-agent prompt");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test]
async fn a_server_with_the_credential_authenticates_the_agent_itself() {
    let dir = TempDir::new("auth-set");
    let file = locked_agents_file(&dir);
    let server =
        TestServer::start_with_env(&["--agents-file", &file], &[(KEY_VAR, "secret")]).await;

    let reply = new_session(&server).await;
    assert!(
        reply["result"]["sessionId"].is_string(),
        "session/new without a client authenticate: {reply}"
    );
    let entry = agent_entry(&server, LOCKED).await;
    assert_eq!(
        entry["auth"][1],
        json!({"methodId": "test-key", "env": KEY_VAR}),
        "{entry}"
    );
    assert!(entry.get("lastError").is_none(), "{entry}");
}

#[tokio::test]
async fn without_the_credential_prompt_names_it_and_auth_method_works() {
    let dir = TempDir::new("auth-unset");
    let file = locked_agents_file(&dir);
    let server = TestServer::start(&["--agents-file", &file]).await;

    let reply = new_session(&server).await;
    assert_eq!(reply["error"]["code"], -32000, "{reply}");
    assert_eq!(
        reply["error"]["message"], "Authentication required",
        "{reply}"
    );
    // Not the root hint (the tests run as root, without --agent-user): the
    // agent said what it needs, and running as root is not it.
    assert!(
        reply["error"]["data"]["sandboxagent.dev"]["hint"].is_null(),
        "{reply}"
    );

    let (code, stdout, stderr) = prompt(&server, &[]).await;
    assert_eq!(code, Some(1), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert!(
        stderr.contains(KEY_VAR) && stderr.contains("--auth-method"),
        "the error names the variable and the option: {stderr}"
    );
    assert!(stderr.contains("test-key"), "{stderr}");

    let (code, stdout, stderr) = prompt(&server, &["--auth-method", "test-key"]).await;
    assert_eq!(code, Some(0), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stdout.contains("You said: hello"), "{stdout}");

    let (code, _, stderr) = prompt(&server, &["--auth-method", "nope"]).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("cannot authenticate") && stderr.contains("nope"),
        "{stderr}"
    );
}

#[tokio::test]
async fn codex_maps_its_api_key_variables_to_auth_methods() {
    let server = TestServer::start(&[]).await;
    let entry = agent_entry(&server, "codex").await;
    assert_eq!(
        entry["auth"],
        json!([
            {"methodId": "codex-api-key", "env": "CODEX_API_KEY"},
            {"methodId": "openai-api-key", "env": "OPENAI_API_KEY"}
        ]),
        "{entry}"
    );
}

/// An agent that reads its credential from the environment itself, with no
/// ACP auth method to match (Claude Code and `ANTHROPIC_API_KEY`): the
/// manifest's `credentialEnv` is listed by `GET /v2/agents` and named by
/// `prompt` when the agent answers "Authentication required"
/// (research/contract.md, "Agent authentication"). Before, prompt named
/// only the agent's interactive method.
#[tokio::test]
async fn a_variable_the_agent_reads_itself_is_named_by_prompt() {
    let dir = TempDir::new("auth-credential-env");
    let file = agents_file(
        &dir,
        json!([{
            "id": LOCKED,
            "distribution": {"local": {
                "command": sandbox_agent_bin().to_string_lossy(),
                "args": ["mock-agent", "--require-auth", "test-key"]
            }},
            "credentialEnv": [KEY_VAR]
        }]),
    );
    let server = TestServer::start(&["--agents-file", &file]).await;
    let entry = agent_entry(&server, LOCKED).await;
    assert_eq!(entry["credentialEnv"], json!([KEY_VAR]), "{entry}");
    assert!(entry.get("auth").is_none(), "{entry}");

    let (code, stdout, stderr) = prompt(&server, &[]).await;
    assert_eq!(code, Some(1), "stdout: {stdout}\nstderr: {stderr}");
    assert!(
        stderr.contains(&format!("set {KEY_VAR} (read by the agent itself)")),
        "the error names the variable: {stderr}"
    );
    assert!(stderr.contains("--auth-method"), "{stderr}");
}

#[tokio::test]
async fn claude_names_the_api_key_it_reads_itself() {
    let server = TestServer::start(&[]).await;
    let entry = agent_entry(&server, "claude").await;
    assert_eq!(
        entry["credentialEnv"],
        json!(["ANTHROPIC_API_KEY"]),
        "{entry}"
    );
    assert!(entry.get("auth").is_none(), "{entry}");
}
