//! Embedded mode with the real binary: the client starts `sandbox-agent
//! server`, talks to it, and leaves no process behind: after drop, after
//! shutdown, and when the code holding the client panics.

mod common;

use common::{TestResult, embedded_options, run_turn, within};
use sandbox_agent_sdk::schema::{NewSessionRequest, StopReason};
use sandbox_agent_sdk::{ClientOptions, Error, SandboxAgentClient};
use std::time::{Duration, Instant};
use v2_api_tests::TempDir;
use v2_api_tests::procfs::{self, ProcessRef};

/// The embedded server and every process under it (its agents), as seen
/// now.
fn process_tree(client: &SandboxAgentClient) -> Vec<ProcessRef> {
    let Some(pid) = client.server_pid() else {
        panic!("embedded mode has a server pid");
    };
    let mut tree: Vec<ProcessRef> = procfs::process_ref(pid).into_iter().collect();
    tree.extend(procfs::descendants(pid));
    tree
}

/// Waits (bounded) until none of `tree` runs; panics naming the survivors.
async fn assert_all_gone(tree: &[ProcessRef], what: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let alive: Vec<_> = tree.iter().filter(|p| procfs::is_alive(p)).collect();
        if alive.is_empty() {
            return;
        }
        if Instant::now() >= deadline {
            let alive: Vec<String> = alive
                .iter()
                .map(|p| format!("{} ({})", p.pid, procfs::cmdline(p.pid)))
                .collect();
            for process in tree {
                procfs::signal(process, nix_sigkill());
            }
            panic!("{what}: processes left behind: {alive:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn nix_sigkill() -> nix::sys::signal::Signal {
    nix::sys::signal::Signal::SIGKILL
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_mode_runs_a_turn_and_drop_leaves_no_process() -> TestResult {
    let data = TempDir::new("sdk-embedded");
    let client = within(
        "connect",
        SandboxAgentClient::connect(embedded_options(&data)),
    )
    .await?;
    assert!(client.base_url().starts_with("http://127.0.0.1:"));
    assert!(client.is_connected());
    assert_eq!(client.health().await?.status, "ok");

    let mut events = client.take_events().ok_or("events")?;
    let session = client.new_session(NewSessionRequest::new("/tmp")).await?;
    let (result, turn) = run_turn(&client, &mut events, &session.session_id, "hello", |_| {}).await;
    assert_eq!(result?.stop_reason, StopReason::EndTurn);
    assert_eq!(turn.text, "Hello from the mock agent. You said: hello");

    let tree = process_tree(&client);
    assert!(tree.len() >= 2, "server and mock agent: {tree:?}");
    assert!(
        tree.iter()
            .any(|p| procfs::cmdline(p.pid).contains("mock-agent")),
        "the mock agent runs under the embedded server"
    );
    // The embedded server requires its random token.
    let anonymous = reqwest::get(format!("{}/v2/agents", client.base_url())).await?;
    assert_eq!(anonymous.status(), reqwest::StatusCode::UNAUTHORIZED);

    drop(client);
    assert_all_gone(&tree, "after drop").await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_while_holding_the_client_leaves_no_process() -> TestResult {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let data = TempDir::new("sdk-embedded");
        let client = match SandboxAgentClient::connect(embedded_options(&data)).await {
            Ok(client) => client,
            Err(error) => panic!("connect: {error}"),
        };
        if let Err(error) = client.new_session(NewSessionRequest::new("/tmp")).await {
            panic!("new session: {error}");
        }
        let _ = tx.send(process_tree(&client));
        panic!("the code holding the client panics");
    });
    let outcome = within("panicking task", task).await;
    assert!(outcome.is_err_and(|error| error.is_panic()));
    let tree = rx.await?;
    assert!(tree.len() >= 2, "server and mock agent: {tree:?}");
    assert_all_gone(&tree, "after the panic").await;

    // The same under catch_unwind on a plain thread with its own runtime.
    let tree = std::thread::spawn(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        let mut seen = Vec::new();
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            runtime.block_on(async {
                let data = TempDir::new("sdk-embedded");
                let client = match SandboxAgentClient::connect(embedded_options(&data)).await {
                    Ok(client) => client,
                    Err(error) => panic!("connect: {error}"),
                };
                seen = process_tree(&client);
                panic!("panic inside block_on");
            })
        }));
        if caught.is_ok() {
            return Err("no panic".to_owned());
        }
        Ok(seen)
    })
    .join()
    .map_err(|_| "thread panicked")??;
    assert!(!tree.is_empty());
    assert_all_gone(&tree, "after catch_unwind").await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_the_server_and_later_calls_fail() -> TestResult {
    let data = TempDir::new("sdk-embedded");
    let client = within(
        "connect",
        SandboxAgentClient::connect(embedded_options(&data)),
    )
    .await?;
    client.new_session(NewSessionRequest::new("/tmp")).await?;
    let tree = process_tree(&client);
    // A clone shares the server: shutting one down stops it for all.
    let clone = client.clone();
    within("shutdown", clone.shutdown()).await;
    assert_all_gone(&tree, "after shutdown").await;
    assert!(!client.is_connected());
    assert!(matches!(
        client.new_session(NewSessionRequest::new("/tmp")).await,
        Err(Error::Disposed)
    ));
    assert!(matches!(client.open().await, Err(Error::Disposed)));
    assert!(matches!(client.health().await, Err(Error::Disposed)));
    within("shutdown again", client.shutdown()).await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_cannot_start_is_reported_with_its_stderr() -> TestResult {
    // An argument the server rejects: it exits at once with a message.
    let data = TempDir::new("sdk-embedded");
    let options = embedded_options(&data).server_arg("--no-such-option");
    match within("connect", SandboxAgentClient::connect(options)).await {
        Err(Error::ServerStart { message, stderr }) => {
            assert!(message.contains("exited"), "{message}");
            assert!(stderr.contains("--no-such-option"), "{stderr}");
        }
        other => panic!("expected ServerStart, got {other:?}"),
    }
    let missing = ClientOptions::new("mock").binary("/nonexistent/sandbox-agent");
    assert!(matches!(
        SandboxAgentClient::connect(missing).await,
        Err(Error::ServerStart { .. })
    ));
    Ok(())
}

/// Run by [`embedded_mode_finds_the_binary_through_sandbox_agent_bin`] in a
/// child process whose environment names the binary (a test cannot set its
/// own environment without `unsafe`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run by embedded_mode_finds_the_binary_through_sandbox_agent_bin"]
async fn child_connects_without_naming_the_binary() -> TestResult {
    if std::env::var_os(sandbox_agent_sdk::BINARY_ENV).is_none() {
        return Err("SANDBOX_AGENT_BIN is not set".into());
    }
    let client = SandboxAgentClient::connect(ClientOptions::new("mock")).await?;
    let session = client.new_session(NewSessionRequest::new("/tmp")).await?;
    assert!(session.meta.is_some());
    client.shutdown().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_mode_finds_the_binary_through_sandbox_agent_bin() -> TestResult {
    let me = std::env::current_exe()?;
    let bin = v2_api_tests::server::sandbox_agent_bin();
    let data = TempDir::new("sdk-embedded-child");
    let output = tokio::process::Command::new(me)
        .args([
            "child_connects_without_naming_the_binary",
            "--exact",
            "--ignored",
            "--test-threads=1",
        ])
        .env(sandbox_agent_sdk::BINARY_ENV, &bin)
        // The child's embedded server inherits both: a data dir of its own,
        // never the developer's.
        .env("SANDBOX_AGENT_DATA_DIR", data.path())
        .env("XDG_DATA_HOME", v2_api_tests::server::no_default_data_dir())
        .output();
    let output = within("child test", output).await?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "child test failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}
