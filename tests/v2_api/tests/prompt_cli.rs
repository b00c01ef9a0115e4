//! `sandbox-agent prompt`, end to end: the real binary with an embedded
//! server (or `--url` to a running one), piped stdin and a pseudo-terminal
//! (`script`), checking stdout (only the agent's text), stderr (tool calls,
//! permission questions, the agent's questions, errors), the exit status,
//! and that no server process is left behind.

use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use v2_api_tests::server::sandbox_agent_command;
use v2_api_tests::{TempDir, TestServer};

/// Bound on one `prompt` run (it starts a server and an agent).
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// The mock agent's reply to `hello`, as printed.
const HELLO_REPLY: &str = "Hello from the mock agent. You said: hello\n";

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

/// A marker put in the environment of a run (the embedded server inherits
/// it), so the test can find any process of that run left in `/proc`.
fn marker(name: &str) -> String {
    format!("PROMPT_CLI_TEST={name}-{}", std::process::id())
}

/// Runs `sandbox-agent prompt <args>` with `stdin` piped in (`None`: stdin
/// closed at once) and the environment `marker`.
async fn prompt(args: &[&str], stdin: Option<&str>, marker: &str) -> Run {
    prompt_with_env(args, stdin, marker, &[]).await
}

/// [`prompt`] with more environment variables.
async fn prompt_with_env(
    args: &[&str],
    stdin: Option<&str>,
    marker: &str,
    env: &[(&str, &str)],
) -> Run {
    // The embedded server's data dir: its own, unless `env` names one.
    let data = TempDir::new("prompt");
    let mut command = tokio::process::Command::from(sandbox_agent_command());
    let (key, value) = marker.split_once('=').unwrap_or((marker, ""));
    command
        .arg("prompt")
        .args(args)
        .env(key, value)
        .env("SANDBOX_AGENT_DATA_DIR", data.path())
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().expect("spawn sandbox-agent prompt");
    let mut pipe = child.stdin.take().expect("stdin is piped");
    if let Some(text) = stdin {
        pipe.write_all(text.as_bytes()).await.expect("write stdin");
    }
    drop(pipe);
    let output = match tokio::time::timeout(RUN_TIMEOUT, child.wait_with_output()).await {
        Ok(output) => output.expect("run sandbox-agent prompt"),
        Err(_) => panic!("sandbox-agent prompt {args:?} did not finish within {RUN_TIMEOUT:?}"),
    };
    Run {
        status: output.status,
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// Processes whose environment holds `marker` (the embedded server and its
/// agents inherit the prompt's environment).
fn processes_with(marker: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|environ| {
                environ
                    .split(|b| *b == 0)
                    .any(|var| var == marker.as_bytes())
            }) && v2_api_tests::procfs::pid_is_alive(*pid)
        })
        .collect()
}

/// Asserts that no process of the run marked `marker` remains (bounded
/// wait: the last ones may still be exiting).
async fn assert_nothing_left(marker: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = processes_with(marker);
        if left.is_empty() {
            return;
        }
        if Instant::now() >= deadline {
            let described: Vec<String> = left
                .iter()
                .map(|pid| format!("{pid}: {}", v2_api_tests::procfs::cmdline(*pid)))
                .collect();
            for pid in &left {
                if let Some(process) = v2_api_tests::procfs::process_ref(*pid) {
                    v2_api_tests::procfs::signal(&process, nix::sys::signal::Signal::SIGKILL);
                }
            }
            panic!("processes left behind by the prompt run: {described:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_plain_turn_prints_the_reply_on_stdout_and_exits_0() {
    let marker = marker("plain");
    let run = prompt(&["hello"], None, &marker).await;
    assert!(run.status.success(), "{run:?}");
    assert_eq!(run.stdout, HELLO_REPLY, "{run:?}");
    assert!(!run.stderr.contains("sandbox-agent:"), "no error: {run:?}");
    assert!(
        !run.stderr.contains('\u{1b}'),
        "no spinner off a terminal: {run:?}"
    );
    assert_nothing_left(&marker).await;
}

#[tokio::test]
async fn tool_calls_are_shown_on_stderr() {
    let marker = marker("tool");
    let run = prompt(
        &["--agent", "mock", "please", "use", "a", "tool"],
        None,
        &marker,
    )
    .await;
    assert!(run.status.success(), "{run:?}");
    assert_eq!(
        run.stdout,
        "Hello from the mock agent. You said: please use a tool\n"
    );
    assert!(
        run.stderr.contains(
            "[tool] Reading the mock file (in progress)\n[tool] Reading the mock file (completed)"
        ),
        "{run:?}"
    );
    assert_nothing_left(&marker).await;
}

#[tokio::test]
async fn permission_with_yes_allows_and_with_deny_denies() {
    let marker = marker("flags");
    let run = prompt(&["--yes", "ask permission"], None, &marker).await;
    assert!(run.status.success(), "{run:?}");
    assert!(run.stdout.starts_with("Permission granted."), "{run:?}");
    assert!(
        run.stderr
            .contains("[permission] Write to mock.txt: allowed (--yes)"),
        "{run:?}"
    );
    assert!(
        run.stderr.contains("[tool] Write to mock.txt (completed)"),
        "{run:?}"
    );

    let run = prompt(&["--deny", "ask permission"], Some("y\n"), &marker).await;
    assert!(run.status.success(), "{run:?}");
    assert!(run.stdout.starts_with("Permission denied."), "{run:?}");
    assert!(run.stderr.contains("denied (--deny)"), "{run:?}");
    assert!(
        run.stderr.contains("[tool] Write to mock.txt (failed)"),
        "{run:?}"
    );
    assert_nothing_left(&marker).await;
}

#[tokio::test]
async fn permission_answers_come_from_piped_stdin() {
    let marker = marker("piped");
    let run = prompt(&["ask permission"], Some("y\n"), &marker).await;
    assert!(run.status.success(), "{run:?}");
    assert!(run.stdout.starts_with("Permission granted."), "{run:?}");
    assert!(
        run.stderr
            .contains("[permission] Write to mock.txt\n  1) Allow once\n  2) Reject once\n"),
        "{run:?}"
    );

    let run = prompt(&["ask permission"], Some("2\n"), &marker).await;
    assert!(run.stdout.starts_with("Permission denied."), "{run:?}");

    // Closed stdin: denied, and the message says why.
    let run = prompt(&["ask permission"], None, &marker).await;
    assert!(run.status.success(), "{run:?}");
    assert!(run.stdout.starts_with("Permission denied."), "{run:?}");
    assert!(
        run.stderr.contains("no answer (stdin is closed): denying"),
        "{run:?}"
    );

    // An answer that means nothing: denied, not guessed.
    let run = prompt(&["ask permission"], Some("maybe\n"), &marker).await;
    assert!(run.stdout.starts_with("Permission denied."), "{run:?}");
    assert!(
        run.stderr
            .contains("unrecognised answer \"maybe\": denying"),
        "{run:?}"
    );
    assert_nothing_left(&marker).await;
}

/// The mock agent's reply to its form question answered with Ada's values.
const ADA_ANSWERED: &str = "You answered: name=Ada color=green confirm=true\n";

#[tokio::test]
async fn questions_are_asked_field_by_field_from_piped_stdin() {
    let marker = marker("questions");
    // The colour by its number, the boolean as y.
    let run = prompt(&["ask question"], Some("Ada\n2\ny\n"), &marker).await;
    assert!(run.status.success(), "{run:?}");
    assert_eq!(run.stdout, ADA_ANSWERED, "{run:?}");
    assert!(
        run.stderr.contains(
            "[question] The mock agent has a question\n  About you\n  Name (1 to 64 characters): Ada\n"
        ),
        "{run:?}"
    );
    assert!(
        run.stderr.contains(
            "    1) red\n    2) green\n    3) blue\n  Favourite colour (1-3; Enter to skip): 2\n"
        ),
        "{run:?}"
    );
    assert!(
        run.stderr.contains("  Confirm (y/n; Enter to skip): y\n"),
        "{run:?}"
    );

    // Optional fields skipped with an empty line; the colour by its value.
    let run = prompt(&["ask question"], Some("Ada\ngreen\n\n"), &marker).await;
    assert_eq!(
        run.stdout, "You answered: name=Ada color=green confirm=-\n",
        "{run:?}"
    );

    // An answer that does not fit, from a pipe: declined, and said why.
    let run = prompt(&["ask question"], Some("Ada\npurple\n"), &marker).await;
    assert!(run.status.success(), "{run:?}");
    assert_eq!(run.stdout, "You declined the question.\n", "{run:?}");
    assert!(
        run.stderr.contains(
            "[question] invalid answer: field \"color\" must be one of \"red\", \"green\", \"blue\", not \"purple\": declining"
        ),
        "{run:?}"
    );

    // --deny declines unasked.
    let run = prompt(&["--deny", "ask question"], Some("Ada\n"), &marker).await;
    assert!(run.status.success(), "{run:?}");
    assert_eq!(run.stdout, "You declined the question.\n", "{run:?}");
    assert!(
        run.stderr
            .contains("[question] The mock agent has a question: declined (--deny)"),
        "{run:?}"
    );

    // Closed stdin: declined, saying so.
    let run = prompt(&["ask question"], None, &marker).await;
    assert!(run.status.success(), "{run:?}");
    assert_eq!(run.stdout, "You declined the question.\n", "{run:?}");
    assert!(
        run.stderr
            .contains("[question] no answer (stdin is closed): declining"),
        "{run:?}"
    );
    assert_nothing_left(&marker).await;
}

/// A question the agent asks while `--auth-method` authenticates (scoped
/// to the `authenticate` request) is asked like one in a turn.
#[tokio::test]
async fn a_sign_in_question_is_asked_during_authenticate() {
    let marker = marker("sign-in-question");
    let run = prompt(
        &["--auth-method", "mock-ask", "hello"],
        Some("t-1\n"),
        &marker,
    )
    .await;
    assert!(run.status.success(), "{run:?}");
    assert!(
        run.stderr
            .contains("[question] Sign in to the mock agent\n  Mock token: t-1\n"),
        "{run:?}"
    );
    assert!(
        run.stdout.starts_with("Hello from the mock agent."),
        "{run:?}"
    );

    let run = prompt(&["--auth-method", "mock-ask", "hello"], None, &marker).await;
    assert!(!run.status.success(), "{run:?}");
    assert!(
        run.stderr
            .contains("cannot authenticate agent \"mock\" with auth method \"mock-ask\""),
        "{run:?}"
    );
    assert!(run.stderr.contains("mock sign-in declined"), "{run:?}");
    assert_nothing_left(&marker).await;
}

#[tokio::test]
async fn a_url_question_shows_the_link_and_asks_to_go_on() {
    let marker = marker("url-question");
    let run = prompt(&["ask url"], Some("y\n"), &marker).await;
    assert!(run.status.success(), "{run:?}");
    assert_eq!(run.stdout, "You completed the sign-in.\n", "{run:?}");
    assert!(
        run.stderr.contains(
            "[question] Sign in to the mock service\n  open this link: https://example.invalid/sandbox-agent/mock/authorize?elicitation=mock-elicitation-"
        ),
        "{run:?}"
    );
    assert!(
        run.stderr
            .contains("[question] completed: mock-elicitation-"),
        "{run:?}"
    );
    let run = prompt(&["ask url"], Some("n\n"), &marker).await;
    assert_eq!(run.stdout, "You declined the sign-in.\n", "{run:?}");
    assert_nothing_left(&marker).await;
}

#[tokio::test]
async fn a_crashing_agent_exits_non_zero_with_a_clear_message() {
    let marker = marker("crash");
    let run = prompt(&["!crash"], None, &marker).await;
    assert!(!run.status.success(), "{run:?}");
    assert_eq!(run.stdout, "Crashing...\n", "{run:?}");
    assert!(
        run.stderr
            .contains("sandbox-agent: the turn failed: agent process exited (exit code 3)"),
        "{run:?}"
    );
    assert!(
        run.stderr
            .contains("agent stderr: mock agent: crashing on request"),
        "{run:?}"
    );
    assert_nothing_left(&marker).await;
}

/// An agent's error is followed by the stderr lines the agent wrote for
/// that request (research/contract.md, "Agent errors: stderr and hint").
#[tokio::test]
async fn an_agent_error_prints_the_agents_stderr_under_it() {
    let marker = marker("fail");
    let run = prompt(&["!fail 2"], None, &marker).await;
    assert!(!run.status.success(), "{run:?}");
    let want = "sandbox-agent: the turn failed: mock agent: failed on request (JSON-RPC error -32603)\n\
         agent stderr: fail line 1\n\
         agent stderr: fail line 2\n\
         agent stderr: mock agent: failing on request\n";
    assert!(run.stderr.ends_with(want), "{run:?}");
    assert_nothing_left(&marker).await;
}

/// A refused `session/new` prints the agent's line and, with the
/// (embedded) server running as root without `--agent-user`, the hint.
#[tokio::test]
async fn a_refused_session_prints_the_line_and_the_root_hint() {
    let marker = marker("refused");
    let dir = v2_api_tests::TempDir::new("prompt-refused");
    let cwd = dir.path().join("refuse-session");
    std::fs::create_dir_all(&cwd).expect("create the cwd");
    let cwd = cwd.to_str().expect("a UTF-8 path");
    let run = prompt(&["--cwd", cwd, "hello"], None, &marker).await;
    assert!(!run.status.success(), "{run:?}");
    assert!(
        run.stderr.contains(&format!(
            "cannot start a session with agent \"mock\": mock agent: refused to open a session in {cwd} (JSON-RPC error -32603)\n\
             agent stderr: mock agent: refusing session/new in {cwd}\n"
        )),
        "{run:?}"
    );
    let hint = "\nhint: sandbox-agent runs as root and starts agents as root";
    assert_eq!(
        run.stderr.contains(hint),
        nix::unistd::geteuid().is_root(),
        "{run:?}"
    );
    assert_nothing_left(&marker).await;
}

#[tokio::test]
async fn ctrl_c_cancels_the_turn_and_exits_non_zero() {
    let marker = marker("interrupt");
    let data = TempDir::new("prompt-interrupt");
    let mut command = tokio::process::Command::from(sandbox_agent_command());
    command.env("SANDBOX_AGENT_DATA_DIR", data.path());
    let (key, value) = marker.split_once('=').unwrap_or_default();
    let child = command
        .args(["prompt", "!stall"])
        .env(key, value)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn");
    let pid = child
        .id()
        .and_then(|pid| i32::try_from(pid).ok())
        .expect("pid");
    // SIGINT once the turn runs (the mock agent process exists).
    let deadline = Instant::now() + RUN_TIMEOUT;
    while !processes_with(&marker)
        .iter()
        .any(|p| v2_api_tests::procfs::cmdline(*p).contains("mock-agent"))
    {
        assert!(Instant::now() < deadline, "the turn never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGINT,
    );
    let output = tokio::time::timeout(RUN_TIMEOUT, child.wait_with_output())
        .await
        .expect("exits after Ctrl-C")
        .expect("output");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("cancelling the turn"), "{stderr}");
    assert!(stderr.contains("sandbox-agent: interrupted"), "{stderr}");
    assert_nothing_left(&marker).await;
}

#[tokio::test]
async fn a_sigkilled_prompt_leaves_no_server_or_agent_behind() {
    // SIGKILL runs no destructor: the embedded server must notice on its own
    // (its stdin pipe closes with the process that held it).
    let marker = marker("sigkill");
    let data = TempDir::new("prompt-sigkill");
    let mut command = tokio::process::Command::from(sandbox_agent_command());
    command.env("SANDBOX_AGENT_DATA_DIR", data.path());
    let (key, value) = marker.split_once('=').unwrap_or_default();
    let mut child = command
        .args(["prompt", "!stall"])
        .env(key, value)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + RUN_TIMEOUT;
    while !processes_with(&marker)
        .iter()
        .any(|p| v2_api_tests::procfs::cmdline(*p).contains("mock-agent"))
    {
        assert!(Instant::now() < deadline, "the turn never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let servers: Vec<u32> = processes_with(&marker)
        .into_iter()
        .filter(|p| v2_api_tests::procfs::cmdline(*p).contains(" server "))
        .collect();
    assert_eq!(servers.len(), 1, "one embedded server runs");
    child.start_kill().expect("SIGKILL the prompt");
    child.wait().await.expect("reap the prompt");
    assert_nothing_left(&marker).await;
}

/// An agent's hostile text (terminal escapes, a forged line) reaches
/// stderr escaped, and a form with nothing to fill in is asked as a whole:
/// accepted only on a yes, declined when stdin is closed.
#[tokio::test]
async fn hostile_questions_are_escaped_and_empty_forms_confirmed() {
    let script =
        v2_api_tests::server::workspace_root().join("tests/v2_api/fixtures/hostile_asker.mjs");
    let command = format!(
        "hostile=node {}",
        v2_api_tests::shell_quote(&script.to_string_lossy())
    );
    let server = TestServer::start(&["--token", "cli-secret", "--agent-command", &command]).await;
    let marker = marker("hostile");
    let args = [
        "--url",
        server.base_url(),
        "--token",
        "cli-secret",
        "--agent",
        "hostile",
        "hello",
    ];
    let run = prompt(&args, None, &marker).await;
    assert!(run.status.success(), "{run:?}");
    assert_eq!(run.stdout, "answer: decline\n", "{run:?}");
    assert!(
        !run.stderr.contains('\u{1b}') && !run.stderr.contains('\u{7}'),
        "raw control characters on stderr: {run:?}"
    );
    assert!(
        run.stderr
            .contains("[question] \\u{1b}]0;pwned\\u{7}\\u{1b}[2JDelete everything?"),
        "{run:?}"
    );
    assert!(
        !run.stderr
            .lines()
            .any(|line| line.starts_with("[permission] forged")),
        "a forged line: {run:?}"
    );
    assert!(
        run.stderr
            .contains("[question] no answer (stdin is closed): declining"),
        "{run:?}"
    );

    let run = prompt(&args, Some("y\n"), &marker).await;
    assert!(run.status.success(), "{run:?}");
    assert_eq!(run.stdout, "answer: accept\n", "{run:?}");
    assert!(run.stderr.contains("  Accept? (y/n): y"), "{run:?}");
}

#[tokio::test]
async fn url_and_token_reach_a_running_server() {
    let server = TestServer::start(&["--token", "cli-secret"]).await;
    let marker = marker("url");
    let run = prompt(
        &["--url", server.base_url(), "--token", "cli-secret", "hello"],
        None,
        &marker,
    )
    .await;
    assert!(run.status.success(), "{run:?}");
    assert_eq!(run.stdout, HELLO_REPLY);

    let run = prompt(
        &["--url", server.base_url(), "--token", "wrong", "hello"],
        None,
        &marker,
    )
    .await;
    assert!(!run.status.success(), "{run:?}");
    assert!(run.stderr.contains("refused the token"), "{run:?}");
    assert!(run.stdout.is_empty(), "{run:?}");

    let run = prompt(&["--url", "http://127.0.0.1:9", "hello"], None, &marker).await;
    assert!(!run.status.success(), "{run:?}");
    assert!(
        run.stderr
            .contains("cannot reach the server at http://127.0.0.1:9"),
        "{run:?}"
    );

    let run = prompt(&["--agent", "nope", "hello"], None, &marker).await;
    assert!(!run.status.success(), "{run:?}");
    assert!(
        run.stderr.contains("cannot connect to agent \"nope\""),
        "{run:?}"
    );
    assert!(
        run.stderr.contains("unknown") || run.stderr.contains("404"),
        "{run:?}"
    );
    assert_nothing_left(&marker).await;
}

/// The id of the `session: ID` line a run printed on stderr.
fn session_line(run: &Run) -> String {
    let ids: Vec<&str> = run
        .stderr
        .lines()
        .filter_map(|line| line.strip_prefix("session: "))
        .collect();
    assert_eq!(ids.len(), 1, "one session line on stderr: {run:?}");
    assert!(!ids[0].is_empty(), "{run:?}");
    ids[0].to_owned()
}

/// The mock agent's reply to `text`, as printed.
fn reply_to(text: &str) -> String {
    format!("Hello from the mock agent. You said: {text}\n")
}

#[tokio::test]
async fn session_continues_a_stored_session_and_the_id_is_on_stderr() {
    let data = v2_api_tests::TempDir::new("prompt-session");
    let env = [("SANDBOX_AGENT_DATA_DIR", data.utf8())];
    let marker = marker("session");
    let first = prompt_with_env(&["remember the word kiwi"], None, &marker, &env).await;
    assert!(first.status.success(), "{first:?}");
    assert_eq!(first.stdout, reply_to("remember the word kiwi"));
    let session = session_line(&first);

    // The one-shot run's session is dormant now: loaded, then prompted.
    let second = prompt_with_env(&["--session", &session, "which word"], None, &marker, &env).await;
    assert!(second.status.success(), "{second:?}");
    assert_eq!(
        second.stdout,
        reply_to("which word"),
        "only the new turn is printed, not the replayed history: {second:?}"
    );
    assert_eq!(session_line(&second), session, "the same session");

    // Its stored log holds both turns, in one session.
    let mut command = tokio::process::Command::from(sandbox_agent_command());
    let store = format!("sqlite:{}/sessions.db", data.utf8());
    let output = command
        .args(["sessions", "events", &session, "--json", "--store", &store])
        .args(["--data-dir", data.utf8()])
        .output()
        .await
        .expect("run sandbox-agent sessions events");
    let events = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{events}");
    assert!(
        events.contains("remember the word kiwi") && events.contains("which word"),
        "both prompts in one session's log: {events}"
    );

    let unknown = prompt_with_env(&["--session", "no-such", "hi"], None, &marker, &env).await;
    assert!(!unknown.status.success(), "{unknown:?}");
    assert!(
        unknown.stderr.contains("no session \"no-such\""),
        "{unknown:?}"
    );
    let empty = prompt_with_env(&["--session", "", "hi"], None, &marker, &env).await;
    assert!(!empty.status.success(), "{empty:?}");
    assert!(empty.stderr.contains("--session"), "{empty:?}");
    assert_nothing_left(&marker).await;
}

#[tokio::test]
async fn sandbox_agent_url_names_the_server_to_prompt() {
    let server = TestServer::start(&[]).await;
    let marker = marker("url-env");
    let run = prompt_with_env(
        &["hello"],
        None,
        &marker,
        &[("SANDBOX_AGENT_URL", server.base_url())],
    )
    .await;
    assert!(run.status.success(), "{run:?}");
    assert_eq!(run.stdout, HELLO_REPLY);
    // The session is on that server, not on an embedded one.
    let list = server.get_json("/v2/sessions").await;
    let ids: Vec<&str> = list["sessions"]
        .as_array()
        .map(|sessions| {
            sessions
                .iter()
                .filter_map(|entry| entry["sessionId"].as_str())
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(
        ids.len(),
        1,
        "the prompt's session is on the server: {list}"
    );
    assert_eq!(session_line(&run), ids[0]);
    assert_nothing_left(&marker).await;
}

/// The same in a pseudo-terminal, through util-linux `script`: the spinner
/// runs before the first token, and the permission question is answered
/// on the terminal.
#[tokio::test]
async fn in_a_pseudo_terminal_with_spinner_and_question() {
    if !Path::new("/usr/bin/script").is_file() && !Path::new("/bin/script").is_file() {
        eprintln!("skipped: `script` (util-linux) is not installed");
        return;
    }
    let bin = v2_api_tests::server::sandbox_agent_bin();
    let marker = marker("pty");
    let data = TempDir::new("prompt-pty");
    let quoted = v2_api_tests::shell_quote(&bin.to_string_lossy());
    let run_in_pty = async |prompt_text: &str, typed: Option<&str>| {
        let mut command = tokio::process::Command::new("script");
        let (key, value) = marker.split_once('=').unwrap_or_default();
        command
            .args([
                "-qec",
                &format!("{quoted} prompt '{prompt_text}'"),
                "/dev/null",
            ])
            .env(key, value)
            .env("SANDBOX_AGENT_DATA_DIR", data.path())
            .env("XDG_DATA_HOME", v2_api_tests::server::no_default_data_dir())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().expect("spawn script");
        let mut stdin = child.stdin.take().expect("stdin");
        if let Some(typed) = typed {
            // The terminal keeps typed input until the question reads it;
            // Enter sends CR. stdin stays open until the run ends (EOF
            // would end `script`'s session early).
            let _ = stdin.write_all(typed.as_bytes()).await;
        }
        let output = tokio::time::timeout(RUN_TIMEOUT, child.wait_with_output())
            .await
            .expect("script finishes")
            .expect("script output");
        drop(stdin);
        (
            output.status,
            String::from_utf8_lossy(&output.stdout).into_owned(),
        )
    };

    let (status, screen) = run_in_pty("hello", None).await;
    assert!(status.success(), "{screen}");
    assert!(
        screen.contains("Hello from the mock agent. You said: hello"),
        "{screen}"
    );
    assert!(
        screen.contains("\u{1b}[2K"),
        "the spinner line is drawn and cleared: {screen:?}"
    );
    assert!(screen.contains("waiting for mock"), "{screen:?}");

    let (status, screen) = run_in_pty("ask permission", Some("y\r")).await;
    assert!(status.success(), "{screen}");
    assert!(screen.contains("Allow? [y/n or 1-2]: "), "{screen:?}");
    assert!(screen.contains("Permission granted."), "{screen:?}");

    // A form question on the terminal: an empty name is asked again.
    let (status, screen) = run_in_pty("ask question", Some("\rAda\r2\ry\r")).await;
    assert!(status.success(), "{screen}");
    assert!(
        screen.contains("invalid answer: field \"name\" is required"),
        "{screen:?}"
    );
    assert!(
        screen.contains("You answered: name=Ada color=green confirm=true"),
        "{screen:?}"
    );
    assert_nothing_left(&marker).await;
}

/// A password in `SANDBOX_AGENT_URL` is not printed when the server cannot
/// be reached.
#[tokio::test]
async fn an_unreachable_url_is_named_without_its_password() {
    let marker = marker("url-password");
    let run = prompt_with_env(
        &["hello"],
        None,
        &marker,
        &[("SANDBOX_AGENT_URL", "http://agent:s3cretPW@127.0.0.1:1/")],
    )
    .await;
    assert!(!run.status.success(), "{run:?}");
    assert!(run.stderr.contains("127.0.0.1:1"), "{run:?}");
    assert!(!run.stderr.contains("s3cretPW"), "{run:?}");
    assert!(run.stderr.contains("***"), "{run:?}");
}

/// The harness's guard: a run given no data dir of its own (here, the
/// embedded server of `prompt`) fails at once, naming the folder that
/// stands in for the default, and writes nothing into the developer's
/// `~/.local/share/sandbox-agent` (`v2_api_tests::server::no_default_data_dir`).
#[tokio::test]
async fn a_run_without_a_data_dir_of_its_own_fails_instead_of_using_the_users() {
    let marker = marker("no-data-dir");
    let mut command = tokio::process::Command::from(sandbox_agent_command());
    let (key, value) = marker.split_once('=').unwrap_or_default();
    let output = command
        .args(["prompt", "hello"])
        .env(key, value)
        .stdin(Stdio::null())
        .output();
    let output = tokio::time::timeout(RUN_TIMEOUT, output)
        .await
        .expect("prompt ends")
        .expect("run sandbox-agent prompt");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("v2-api-tests-gave-no-data-dir/sandbox-agent"),
        "the error names the stand-in for the default data dir: {stderr}"
    );
    assert_nothing_left(&marker).await;
}

/// The first prompt to an agent that is not installed yet says so on
/// stderr before the install and after it, instead of a silent wait; the
/// turn then runs as usual.
#[tokio::test]
async fn the_first_prompt_to_an_agent_not_installed_says_it_installs_it() {
    use v2_api_tests::agents::{agents_file, mock_agent_script, npm_registry};
    let npm = npm_registry("sa-first-use-agent", "1.0.0", &mock_agent_script()).await;
    let dir = TempDir::new("first-use");
    let manifest = agents_file(
        &dir,
        serde_json::json!([{"id": "npmfirst", "name": "Npm first use", "version": "1.0.0",
                "distribution": {"npx": {"package": "sa-first-use-agent"}}}]),
    );
    let cache = TempDir::new("first-use-cache");
    let registry = npm.registry.url("/");
    let cache_path = cache.path().to_string_lossy().into_owned();
    let server = TestServer::start_with_env(
        &["--token", "cli-secret", "--agents-file", &manifest],
        &[
            ("npm_config_registry", registry.as_str()),
            ("npm_config_cache", cache_path.as_str()),
        ],
    )
    .await;
    let marker = marker("first-use");
    let args = [
        "--url",
        server.base_url(),
        "--token",
        "cli-secret",
        "--agent",
        "npmfirst",
        "hello",
    ];
    let run = prompt(&args, None, &marker).await;
    assert!(run.status.success(), "{run:?}");
    assert_eq!(run.stdout, HELLO_REPLY, "{run:?}");
    let installing = run
        .stderr
        .find("sandbox-agent: installing agent \"npmfirst\" (its first use)")
        .unwrap_or_else(|| panic!("{run:?}"));
    let installed = run
        .stderr
        .find("sandbox-agent: installed agent \"npmfirst\" 1.0.0 in ")
        .unwrap_or_else(|| panic!("{run:?}"));
    let session = run
        .stderr
        .find("session: ")
        .unwrap_or_else(|| panic!("{run:?}"));
    assert!(installing < installed && installed < session, "{run:?}");
    // Installed now: the next prompt says nothing of it.
    let again = prompt(&args, None, &marker).await;
    assert!(again.status.success(), "{again:?}");
    assert!(!again.stderr.contains("install"), "{again:?}");
}

/// Runs `sandbox-agent prompt --url <server> <text>` with stdin kept open,
/// waits until its stderr shows `ready`, SIGKILLs the server, and returns
/// the run and how long the prompt took to exit after the kill.
async fn prompt_while_the_server_dies(text: &str, ready: &str) -> (Run, Duration) {
    let data = TempDir::new("prompt-server-dies");
    let mut server = TestServer::start(&["--data-dir", data.path().to_str().expect("UTF-8")]).await;
    let mut command = tokio::process::Command::from(sandbox_agent_command());
    let mut child = command
        .args(["prompt", "--url", server.base_url(), text])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn");
    // Held open: the prompt must not wait for it to close.
    let _stdin = child.stdin.take().expect("stdin is piped");
    let mut stderr_pipe = child.stderr.take().expect("stderr is piped");
    let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let sink = stderr.clone();
    let reader = tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        let mut buffer = [0_u8; 4096];
        while let Ok(read) = stderr_pipe.read(&mut buffer).await {
            if read == 0 {
                break;
            }
            let text = String::from_utf8_lossy(&buffer[..read]).into_owned();
            sink.lock().expect("stderr buffer").push_str(&text);
        }
    });
    let deadline = Instant::now() + RUN_TIMEOUT;
    while !stderr.lock().expect("stderr buffer").contains(ready) {
        assert!(
            Instant::now() < deadline,
            "never saw {ready:?}: {}",
            stderr.lock().expect("stderr buffer")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server
        .kill_now(RUN_TIMEOUT)
        .await
        .expect("SIGKILL the server");
    let killed = Instant::now();
    let mut stdout = child.stdout.take().expect("stdout is piped");
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the prompt still runs 30 s after its server died: {}",
                stderr.lock().expect("stderr buffer")
            )
        })
        .expect("wait");
    let took = killed.elapsed();
    let _ = reader.await;
    let mut out = String::new();
    let _ = tokio::io::AsyncReadExt::read_to_string(&mut stdout, &mut out).await;
    let stderr = stderr.lock().expect("stderr buffer").clone();
    (
        Run {
            status,
            stdout: out,
            stderr,
        },
        took,
    )
}

/// A permission question waiting on an open stdin when the server at
/// `--url` dies: the prompt says the server went away and exits 1 within
/// 5 s, without waiting for stdin (research/contract.md,
/// "`sandbox-agent prompt`").
#[tokio::test]
async fn a_server_killed_during_a_permission_question_ends_the_prompt_within_5_s() {
    let (run, took) = prompt_while_the_server_dies("ask permission", "Allow?").await;
    assert_eq!(run.status.code(), Some(1), "{run:?}");
    assert!(took < Duration::from_secs(5), "took {took:?}: {run:?}");
    assert!(run.stderr.contains("went away during the turn"), "{run:?}");
}

/// The same while the turn streams (no question open).
#[tokio::test]
async fn a_server_killed_during_a_turn_ends_the_prompt_within_5_s() {
    let (run, took) = prompt_while_the_server_dies("!stall", "session: ").await;
    assert_eq!(run.status.code(), Some(1), "{run:?}");
    assert!(took < Duration::from_secs(5), "took {took:?}: {run:?}");
    assert!(run.stderr.contains("went away during the turn"), "{run:?}");
}
