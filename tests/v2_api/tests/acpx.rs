//! `sandbox-agent bridge` under a real ACP client that nobody on this team
//! wrote: `acpx`, a headless ACP command-line client from npm, starts the
//! bridge as its agent (`--agent "<cmd>"`) and runs a one-shot prompt
//! against a real runtime.
//!
//! `acpx` is pinned in `tests/npm/package.json` (lock file next to it) and
//! installed into `tests/npm/node_modules` by `.ci/run` with
//! `npm install --prefix tests/npm`. `ACPX_BIN` points the test at another copy.
//! Without either the test fails and says how to install it; it never
//! downloads anything itself.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::process::Command;
use v2_api_tests::server::{sandbox_agent_bin, workspace_root};
use v2_api_tests::{CutProxy, MOCK, TestServer, shell_quote};

/// Upper bound on one acpx run (node start-up, the bridge, a turn).
const ACPX_TIMEOUT: Duration = Duration::from_secs(120);

/// The `acpx` executable: `$ACPX_BIN`, else the copy `.ci/run` installs.
///
/// # Panics
/// If it is not there, with the command that installs it.
fn acpx_bin() -> PathBuf {
    let bin = match std::env::var_os("ACPX_BIN") {
        Some(bin) => PathBuf::from(bin),
        None => workspace_root()
            .join("tests")
            .join("npm")
            .join("node_modules")
            .join(".bin")
            .join("acpx"),
    };
    assert!(
        bin.is_file(),
        "acpx not found at {}: install it with `npm install --prefix tests/npm` from the workspace \
         root (Node.js and npm needed; .ci/run does this), or set ACPX_BIN",
        bin.display()
    );
    bin
}

/// What one acpx run printed.
struct Run {
    success: bool,
    stdout: String,
    stderr: String,
}

/// Runs `acpx <global options> --agent "<bridge to url>" exec <prompt>` in
/// a scratch HOME and working directory.
async fn acpx_exec(url: &str, options: &[&str], prompt: &str) -> Run {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let scratch = std::env::temp_dir().join(format!(
        "acpx-test-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&scratch).expect("create acpx's scratch dir");
    let agent = format!(
        "{} bridge --url {} --agent {MOCK}",
        shell_quote(&sandbox_agent_bin().to_string_lossy()),
        shell_quote(url)
    );
    let mut command = Command::new(acpx_bin());
    command
        .args(options)
        .args(["--agent", &agent, "exec", prompt])
        .current_dir(&scratch)
        .env("HOME", &scratch)
        .env_remove("SANDBOX_AGENT_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let output = match tokio::time::timeout(ACPX_TIMEOUT, command.output()).await {
        Ok(Ok(output)) => output,
        Ok(Err(error)) => panic!("running acpx failed: {error}"),
        Err(_) => panic!("acpx did not finish within {ACPX_TIMEOUT:?}"),
    };
    let _ = std::fs::remove_dir_all(&scratch);
    Run {
        success: output.status.success(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

#[tokio::test]
async fn acpx_gets_the_mock_agents_reply_through_the_bridge() {
    let server = TestServer::start(&[]).await;
    // The proxy only watches: which requests reached the runtime.
    let proxy = CutProxy::start(server.addr()).await;

    let run = acpx_exec(&proxy.url(), &["--format", "quiet"], "hello").await;
    assert!(
        run.success,
        "acpx failed\n--- stdout ---\n{}\n--- stderr ---\n{}",
        run.stdout, run.stderr
    );
    assert_eq!(
        run.stdout.trim(),
        "Hello from the mock agent. You said: hello",
        "--- stderr ---\n{}",
        run.stderr
    );

    // acpx ending the bridge closed the connection on the runtime.
    let connection = proxy.connection_id();
    assert!(connection.is_some(), "{:?}", proxy.heads());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while !proxy
        .heads()
        .iter()
        .any(|h| h.method == "DELETE" && h.connection_id == connection)
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no DELETE reached the runtime: {:?}",
            proxy.heads()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn acpx_answers_a_permission_request_through_the_bridge() {
    let server = TestServer::start(&[]).await;
    let run = acpx_exec(
        server.base_url(),
        &["--approve-all"],
        "write it, with permission",
    )
    .await;
    assert!(
        run.success,
        "acpx failed\n--- stdout ---\n{}\n--- stderr ---\n{}",
        run.stdout, run.stderr
    );
    assert!(
        run.stdout.contains("session/request_permission")
            && run.stdout.contains("Permission granted."),
        "--- stdout ---\n{}\n--- stderr ---\n{}",
        run.stdout,
        run.stderr
    );
}
