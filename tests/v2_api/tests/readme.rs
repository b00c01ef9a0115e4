//! The README's examples, run as a new user would run them: the shell
//! blocks with `sandbox-agent` on `PATH` (only the port and the scratch
//! paths changed, so tests do not collide), the TypeScript snippet with
//! the SDK version the README pins, and `scripts/test`'s last line.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use v2_api_tests::server::{sandbox_agent_bin, workspace_root};
use v2_api_tests::{TempDir, TestServer};

/// Bound on one example's run.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

/// README.md's text.
fn readme() -> String {
    std::fs::read_to_string(workspace_root().join("README.md")).expect("read README.md")
}

/// The first fenced block of language `lang` after the line `heading`.
fn block_after(text: &str, heading: &str, lang: &str) -> String {
    let start = text
        .lines()
        .position(|line| line == heading)
        .unwrap_or_else(|| panic!("README.md has no heading {heading:?}"));
    let mut lines = text.lines().skip(start);
    let fence = format!("```{lang}");
    lines
        .by_ref()
        .find(|line| *line == fence)
        .unwrap_or_else(|| panic!("no {fence} block after {heading:?}"));
    lines
        .take_while(|line| *line != "```")
        .collect::<Vec<_>>()
        .join("\n")
}

/// A directory holding `sandbox-agent`, a link to the binary under test.
fn bin_dir() -> TempDir {
    let dir = TempDir::new("readme-bin");
    std::os::unix::fs::symlink(sandbox_agent_bin(), dir.path().join("sandbox-agent"))
        .expect("link the binary");
    dir
}

/// The port `server` listens on, as README's examples name it.
fn port_of(server: &TestServer) -> String {
    server
        .base_url()
        .rsplit(':')
        .next()
        .expect("a port")
        .to_owned()
}

/// A loopback port that was free a moment ago.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("a free port")
}

/// What a shell example printed.
struct Ran {
    success: bool,
    stdout: String,
    stderr: String,
}

/// Runs `script` with bash in `cwd`, `bin` first on `PATH`, no inherited
/// `SANDBOX_AGENT_*`, and `env`, in a process group of its own that is
/// stopped once bash exits (the example leaves a server running, holding
/// its output: so the output goes to files, not pipes).
async fn run_shell(script: &str, cwd: &Path, bin: &Path, env: &[(&str, String)]) -> Ran {
    let output = TempDir::new("readme-output");
    let out = output.path().join("stdout");
    let err = output.path().join("stderr");
    let mut command = Command::new("bash");
    command
        .arg("-c")
        .arg(script)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).expect("stdout file"))
        .stderr(std::fs::File::create(&err).expect("stderr file"))
        .process_group(0);
    for (key, _) in std::env::vars_os() {
        if key
            .to_str()
            .is_some_and(|k| k.starts_with("SANDBOX_AGENT_"))
        {
            command.env_remove(key);
        }
    }
    // A command of the README run without a data dir fails here, instead
    // of writing into the developer's own.
    command.env("XDG_DATA_HOME", v2_api_tests::server::no_default_data_dir());
    let path = std::env::var("PATH").unwrap_or_default();
    command.env("PATH", format!("{}:{path}", bin.display()));
    for (key, value) in env {
        command.env(key, value);
    }
    let mut child = tokio::process::Command::from(command)
        .kill_on_drop(true)
        .spawn()
        .expect("spawn bash");
    let group = nix::unistd::Pid::from_raw(
        i32::try_from(child.id().expect("a pid")).expect("a pid fits in i32"),
    );
    let status = tokio::time::timeout(RUN_TIMEOUT, child.wait()).await;
    // What the example left running: SIGTERM (the server stops its agents),
    // then SIGKILL for anything still there.
    let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGTERM);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
    let read = |file: &Path| std::fs::read_to_string(file).unwrap_or_default();
    let (stdout, stderr) = (read(&out), read(&err));
    let status = status.unwrap_or_else(|_| {
        panic!("the example did not finish within {RUN_TIMEOUT:?}:\n{script}\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}")
    });
    Ran {
        success: status.expect("wait for bash").success(),
        stdout,
        stderr,
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test]
async fn the_restart_example_runs_as_written() {
    let block = block_after(&readme(), "### Sessions survive restarts", "sh");
    let session_set = block.find("SESSION=").expect("the example sets SESSION");
    let session_used = block.find("$SESSION").expect("the example uses $SESSION");
    assert!(
        session_set < session_used,
        "SESSION is set before use:\n{block}"
    );

    let port = free_port();
    let script = block.replace("2468", &port.to_string());
    let bin = bin_dir();
    let scratch = TempDir::new("readme-restart");
    let env = [
        ("SANDBOX_AGENT_PORT", port.to_string()),
        (
            "SANDBOX_AGENT_DATA_DIR",
            scratch.path().join("data").display().to_string(),
        ),
    ];
    let ran = run_shell(&script, scratch.path(), bin.path(), &env).await;
    let (stdout, stderr) = (&ran.stdout, &ran.stderr);
    let report = format!("{script}\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}");
    assert!(ran.success, "{report}");
    let log = std::fs::read_to_string(scratch.path().join("prompt.log")).unwrap_or_default();
    let session = log
        .lines()
        .find_map(|line| line.strip_prefix("session: "))
        .unwrap_or_else(|| panic!("prompt printed its session id: {log}\n{report}"));
    assert!(
        stdout
            .lines()
            .any(|line| line.starts_with(session) && line.contains("dormant")),
        "sessions list shows the session dormant: {report}"
    );
    assert!(
        stdout.contains("remember the word kiwi"),
        "sessions events shows the conversation: {report}"
    );
    assert!(
        stdout.contains("You said: which word was it?"),
        "prompt --session went on with it: {report}"
    );
}

#[tokio::test]
async fn files_in_and_out_runs_from_an_empty_directory() {
    let server = TestServer::start(&[]).await;
    let port = port_of(&server);
    let block = block_after(&readme(), "## Files in and out", "sh");
    let scratch = TempDir::new("readme-files");
    let work = scratch.path().join("work");
    let script = format!(
        "set -euo pipefail\n{}",
        block
            .replace("2468", &port)
            .replace("/tmp/work", &work.display().to_string())
    );
    let cwd = scratch.path().join("here");
    std::fs::create_dir_all(&cwd).expect("an empty directory");
    let bin = bin_dir();
    let ran = run_shell(&script, &cwd, bin.path(), &[]).await;
    let (stdout, stderr) = (&ran.stdout, &ran.stderr);
    let report = format!("{script}\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}");
    assert!(ran.success, "{report}");
    assert!(
        stdout.contains("\"entryType\"") && stdout.contains("\"entry_type\""),
        "the listing carries both spellings, as the README says: {report}"
    );
    let stored = std::fs::read_to_string(work.join("project/NOTES.txt")).unwrap_or_default();
    assert_eq!(stored, "check the tests first\n", "{report}");
    let downloaded = std::fs::read_to_string(cwd.join("Cargo.toml")).unwrap_or_default();
    assert!(downloaded.starts_with("[package]"), "{report}");
}

#[tokio::test]
async fn the_typescript_example_runs_with_the_sdk_version_it_pins() {
    let text_of_readme = readme();
    let manifest: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(workspace_root().join("tests/npm/package.json"))
            .expect("tests/npm/package.json"),
    )
    .expect("JSON");
    let version = manifest["dependencies"]["@agentclientprotocol/sdk"]
        .as_str()
        .expect("tests/npm pins the SDK");
    assert!(
        text_of_readme.contains(&format!("npm install @agentclientprotocol/sdk@{version}")),
        "the README pins the SDK version the tests use ({version})"
    );
    let block = block_after(&text_of_readme, "## Use it from any ACP SDK", "js");
    assert!(
        block.starts_with("// hello.mjs"),
        "the snippet is named as an ES module file:\n{block}"
    );

    let server = TestServer::start(&[]).await;
    let script = block.replace("http://127.0.0.1:2468", server.base_url());
    // In tests/npm, so `import` finds the SDK installed there.
    let file: PathBuf = workspace_root()
        .join("tests/npm")
        .join(format!("readme-hello-{}.mjs", std::process::id()));
    std::fs::write(&file, script).expect("write the snippet");
    let output = tokio::process::Command::new("node")
        .arg(&file)
        .output()
        .await;
    let _ = std::fs::remove_file(&file);
    let output = output.expect("run node (the tests need Node.js; scripts/test checks)");
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("Hello from the mock agent. You said: hello"),
        "{stdout}\n{stderr}"
    );
}

#[test]
fn scripts_test_ends_with_one_line_for_the_whole_run() {
    let root = workspace_root();
    let log = "\
running 2 tests
test result: ok. 2 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.10s
running 4 tests
test result: FAILED. 1 passed; 3 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.00s
   Doc-tests acp_runtime
test result: ok. 7 passed; 0 failed; 2 ignored; 0 measured; 0 filtered out; finished in 0.50s
";
    let mut child = Command::new(root.join("scripts/test-summary"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run scripts/test-summary");
    std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), log.as_bytes())
        .expect("write");
    let output = child.wait_with_output().expect("wait");
    assert!(output.status.success());
    assert_eq!(
        text(&output.stdout),
        "== 10 passed, 3 failed, 3 ignored (3 test binaries)\n"
    );
    let script = std::fs::read_to_string(root.join("scripts/test")).expect("scripts/test");
    assert!(
        script.contains("--no-fail-fast") && script.contains("scripts/test-summary"),
        "scripts/test runs every test binary and ends with the summary"
    );
}

#[tokio::test]
async fn run_commands_runs_as_written() {
    let server = TestServer::start(&[]).await;
    let port = port_of(&server);
    let block = block_after(&readme(), "## Run commands", "sh");
    let script = format!("set -euo pipefail\n{}", block.replace("2468", &port));
    let scratch = TempDir::new("readme-processes");
    let bin = bin_dir();
    let ran = run_shell(&script, scratch.path(), bin.path(), &[]).await;
    let (stdout, stderr) = (&ran.stdout, &ran.stderr);
    let report = format!("{script}\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}");
    assert!(ran.success, "{report}");
    assert!(
        stdout.contains("\"exitCode\":3") && stdout.contains("\"stdout\":\"built\\n\""),
        "the run answers as shown: {report}"
    );
    assert!(
        stdout.contains("\ndata: {\"offset\":0,\"stream\":\"stdout\",\"data\":\"got one\\n")
            && (stdout.contains("id: 8\n") || stdout.contains("id: 16\n")),
        "the follow shows offsets as ids: {report}"
    );
    assert!(
        stdout.contains("event: exit\ndata: {\"exitCode\":0,\"signal\":null}"),
        "{report}"
    );
    assert!(
        stdout.contains("{\"chunks\":[{\"offset\":8,\"stream\":\"stdout\",\"data\":\"got two\\n\"}],\"nextOffset\":16,\"dropped\":0}"),
        "{report}"
    );
    assert!(stdout.contains("\"title\":\"reader\""), "{report}");
    assert!(
        stdout.contains("hi\nexit status 5\n"),
        "exec relays stdin and keeps the exit status: {report}"
    );
    let left = server.get_json("/v2/processes").await;
    let titles: Vec<&serde_json::Value> = left["processes"]
        .as_array()
        .map(|all| all.iter().map(|p| &p["title"]).collect())
        .unwrap_or_default();
    assert!(
        !titles.contains(&&serde_json::json!("reader")),
        "DELETE forgot it: {left}"
    );
}
