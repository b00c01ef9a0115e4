//! `sandbox-agent exec` and `sandbox-agent ps` (research/contract.md, "CLI:
//! exec and ps"), end to end: the real binary against a real server, with
//! piped stdio or (for `-t`) on a real pseudo-terminal (pty-process).

use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use v2_api_tests::TestServer;
use v2_api_tests::api::Api;
use v2_api_tests::proxy::CutProxy;
use v2_api_tests::server::sandbox_agent_command;

/// Bound on one `exec` or `ps` run.
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// What one run printed.
struct Run {
    status: ExitStatus,
    stdout_bytes: Vec<u8>,
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

/// Runs `sandbox-agent <args>` with `stdin` piped in and `env` set.
async fn cli(args: &[&str], stdin: &[u8], env: &[(&str, &str)]) -> Run {
    let mut command = tokio::process::Command::from(sandbox_agent_command());
    command
        .args(args)
        .env_remove("SANDBOX_AGENT_URL")
        .env_remove("SANDBOX_AGENT_TOKEN")
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().expect("spawn sandbox-agent");
    let mut pipe = child.stdin.take().expect("stdin is piped");
    let stdin = stdin.to_vec();
    let writer = tokio::spawn(async move {
        let _ = pipe.write_all(&stdin).await;
    });
    let output = match tokio::time::timeout(RUN_TIMEOUT, child.wait_with_output()).await {
        Ok(output) => output.expect("run sandbox-agent"),
        Err(_) => panic!("sandbox-agent {args:?} did not finish within {RUN_TIMEOUT:?}"),
    };
    let _ = writer.await;
    Run {
        status: output.status,
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stdout_bytes: output.stdout,
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// `sandbox-agent exec --url <server> <args>`.
async fn exec(server: &TestServer, args: &[&str], stdin: &[u8]) -> Run {
    let url = server.api().base_url().to_owned();
    let mut all = vec!["exec", "--url", &url];
    all.extend_from_slice(args);
    cli(&all, stdin, &[]).await
}

/// The exit status of the program is `exec`'s; stdout and stderr stay
/// apart; a program the server cannot find is 127.
#[tokio::test]
async fn exit_status_and_streams() {
    let server = TestServer::start(&[]).await;
    let run = exec(
        &server,
        &["--", "sh", "-c", "echo out; echo err >&2; exit 3"],
        b"",
    )
    .await;
    assert_eq!(run.status.code(), Some(3), "{run:?}");
    assert_eq!(run.stdout, "out\n", "{run:?}");
    assert_eq!(run.stderr, "err\n", "{run:?}");
    let run = exec(&server, &["true"], b"").await;
    assert_eq!(run.status.code(), Some(0), "{run:?}");
    // A signal: 128 + its number, as a shell says.
    let run = exec(&server, &["sh", "-c", "kill -TERM $$"], b"").await;
    assert_eq!(run.status.code(), Some(128 + 15), "{run:?}");
    let run = exec(&server, &["--", "no-such-program-here"], b"").await;
    assert_eq!(run.status.code(), Some(127), "{run:?}");
    assert!(run.stderr.contains("no-such-program-here"), "{run:?}");
    // Output that is not text arrives byte for byte.
    let run = exec(&server, &["sh", "-c", "printf 'a\\377b'"], b"").await;
    assert_eq!(run.status.code(), Some(0), "{run:?}");
    assert_eq!(run.stdout_bytes, b"a\xffb", "{run:?}");
}

/// Local stdin goes to the program, then its end of file: `cat` echoes it
/// and exits; 300 kB take several input requests, in order.
#[tokio::test]
async fn stdin_is_relayed_then_closed() {
    let server = TestServer::start(&[]).await;
    let run = exec(&server, &["--", "cat"], b"hello\nworld\n").await;
    assert_eq!(run.status.code(), Some(0), "{run:?}");
    assert_eq!(run.stdout, "hello\nworld\n");
    let big: Vec<u8> = (0..300_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let run = exec(&server, &["--", "sha256sum"], &big).await;
    let local = exec(
        &server,
        &["--", "sh", "-c", "head -c 300000 /dev/stdin | sha256sum"],
        &big,
    )
    .await;
    assert_eq!(run.status.code(), Some(0), "{run:?}");
    assert_eq!(run.stdout, local.stdout);
    let run = exec(&server, &["--", "wc", "-c"], &big).await;
    assert_eq!(run.stdout.trim(), "300000", "{run:?}");
}

/// `--url` and `--token` from the environment, `-e` and `--cwd`; a wrong
/// token is exec's own failure (125) with the server's reason.
#[tokio::test]
async fn url_token_env_and_cwd() {
    let server = TestServer::start(&["--token", "s3cret"]).await;
    let url = server.api().base_url().to_owned();
    let env = [
        ("SANDBOX_AGENT_URL", url.as_str()),
        ("SANDBOX_AGENT_TOKEN", "s3cret"),
    ];
    let run = cli(
        &[
            "exec",
            "-e",
            "GREETING=hi there",
            "--cwd",
            "/tmp",
            "--",
            "sh",
            "-c",
            "echo \"$GREETING\"; pwd",
        ],
        b"",
        &env,
    )
    .await;
    assert_eq!(run.status.code(), Some(0), "{run:?}");
    assert_eq!(run.stdout, "hi there\n/tmp\n", "{run:?}");
    let env = [
        ("SANDBOX_AGENT_URL", url.as_str()),
        ("SANDBOX_AGENT_TOKEN", "wrong"),
    ];
    let run = cli(&["exec", "true"], b"", &env).await;
    assert_eq!(run.status.code(), Some(125), "{run:?}");
    assert!(run.stderr.contains("401"), "{run:?}");
    let run = cli(&["exec", "true"], b"", &[]).await;
    assert_eq!(run.status.code(), Some(125), "no --url: {run:?}");
}

/// Cut connections in the middle of the output: `exec` resumes with
/// `Last-Event-ID` and prints every line exactly once.
#[tokio::test]
async fn output_resumes_after_a_cut() {
    let server = TestServer::start(&[]).await;
    let proxy = CutProxy::start(server.api().addr()).await;
    let url = proxy.url();
    let script = "for i in $(seq 1 60); do echo line$i; sleep 0.03; done";
    let run = tokio::spawn(async move {
        cli(&["exec", "--url", &url, "--", "sh", "-c", script], b"", &[]).await
    });
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        proxy.cut();
    }
    let run = run.await.expect("the exec task");
    assert_eq!(run.status.code(), Some(0), "{run:?}");
    let want: String = (1..=60).map(|i| format!("line{i}\n")).collect();
    assert_eq!(run.stdout, want, "{run:?}");
    assert!(
        proxy
            .heads()
            .iter()
            .any(|head| head.method == "GET" && head.last_event_id.is_some()),
        "a resumed GET carries Last-Event-ID: {:?}",
        proxy.heads()
    );
}

/// The running processes of the server.
async fn running(api: &Api) -> Vec<Value> {
    api.get_json("/v2/processes?state=running").await["processes"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// SIGINT to `exec` goes to the program, whose end is exec's (130).
#[tokio::test]
async fn signals_are_forwarded() {
    let server = TestServer::start(&[]).await;
    let mut command = tokio::process::Command::from(sandbox_agent_command());
    command
        .args([
            "exec",
            "--url",
            server.api().base_url(),
            "--",
            "sleep",
            "100",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().expect("spawn exec");
    let api = server.api();
    for _ in 0..100 {
        if !running(&api).await.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(running(&api).await.len(), 1);
    // Its handler is installed once the process runs; give it a moment.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let pid = nix::unistd::Pid::from_raw(child.id().expect("pid") as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).expect("send SIGINT");
    let status = tokio::time::timeout(RUN_TIMEOUT, child.wait())
        .await
        .expect("exec ends")
        .expect("exec status");
    assert_eq!(status.code(), Some(130));
    assert!(running(&api).await.is_empty());
}

/// `sandbox-agent exec --url <url> -t -- <program>` on a pseudo-terminal of
/// 100×30 the test holds, and what it drew so far.
struct Attached {
    child: tokio::process::Child,
    pty: pty_process::Pty,
    /// The child's terminal, kept to read its mode afterwards.
    pts: pty_process::Pts,
    /// Every byte drawn so far.
    screen: Vec<u8>,
}

impl Attached {
    fn start(url: &str, program: &[&str]) -> Attached {
        let (pty, pts) = pty_process::open().expect("open a pty");
        pty.resize(pty_process::Size::new(30, 100))
            .expect("size the pty");
        let mut command = sandbox_agent_command();
        command
            .args(["exec", "--url", url, "-t", "--"])
            .args(program);
        let mut command =
            pty_process::Command::from(tokio::process::Command::from(command)).kill_on_drop(true);
        let child = command
            .spawn_borrowed(&pts)
            .expect("spawn exec -t on the pty");
        Attached {
            child,
            pty,
            pts,
            screen: Vec::new(),
        }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.screen).into_owned()
    }

    /// Reads until one of `wants` is on the screen.
    async fn read_until(&mut self, wants: &[&str]) {
        let wait = async {
            while !wants.iter().any(|want| self.text().contains(want)) {
                let mut buffer = [0; 4096];
                match self.pty.read(&mut buffer).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => self.screen.extend_from_slice(&buffer[..n]),
                }
            }
        };
        if tokio::time::timeout(RUN_TIMEOUT, wait).await.is_err() {
            panic!("no {wants:?} on the screen: {:?}", self.text());
        }
    }

    async fn type_keys(&mut self, keys: &[u8]) {
        self.pty.write_all(keys).await.expect("type");
    }

    /// Waits for exec's end: its exit code.
    async fn wait(&mut self) -> Option<i32> {
        tokio::time::timeout(RUN_TIMEOUT, self.child.wait())
            .await
            .expect("exec -t ends")
            .expect("exec -t status")
            .code()
    }
}

/// `exec -t` on a real pseudo-terminal: the program gets a terminal of the
/// local one's size, typed keys reach it raw, its exit status is exec's,
/// and the local terminal is back in its own mode afterwards.
#[tokio::test]
async fn exec_t_attaches_the_local_terminal() {
    use nix::sys::termios::{LocalFlags, tcgetattr};
    let server = TestServer::start(&[]).await;
    let mut attached = Attached::start(server.api().base_url(), &["sh"]);
    let before = tcgetattr(&attached.pts).expect("termios").local_flags;
    assert!(before.contains(LocalFlags::ECHO | LocalFlags::ICANON));
    // The shell's prompt: exec is attached and the local terminal raw.
    attached.read_until(&["$ ", "# "]).await;
    attached.type_keys(b"stty size; echo hi-$((6*7))\r").await;
    attached.read_until(&["hi-42"]).await;
    let text = attached.text();
    assert!(text.contains("30 100"), "{text:?}");
    // Raw: the typed line was echoed once, by the remote terminal.
    assert_eq!(text.matches("stty size; echo").count(), 1, "{text:?}");
    attached.type_keys(b"exit 4\r").await;
    assert_eq!(attached.wait().await, Some(4), "{:?}", attached.text());
    let after = tcgetattr(&attached.pts).expect("termios").local_flags;
    assert_eq!(after, before, "the local terminal is restored");
}

/// `exec -t` through a proxy that cuts the connection: exec reconnects
/// from the byte offset it reached, so nothing is drawn twice or lost.
#[tokio::test]
async fn exec_t_resumes_after_a_cut() {
    let server = TestServer::start(&[]).await;
    let proxy = CutProxy::start(server.api().addr()).await;
    let mut attached = Attached::start(&proxy.url(), &["sh"]);
    attached.read_until(&["$ ", "# "]).await;
    attached.type_keys(b"echo one-$((1+1))\r").await;
    attached.read_until(&["one-2"]).await;
    assert!(proxy.cut() > 0, "the terminal's connection was open");
    // Output while exec is away, then a key once it is back.
    tokio::time::sleep(Duration::from_millis(500)).await;
    attached.type_keys(b"echo two-$((1+2))\r").await;
    attached.read_until(&["two-3"]).await;
    attached.type_keys(b"exit 6\r").await;
    assert_eq!(attached.wait().await, Some(6), "{:?}", attached.text());
    let text = attached.text();
    assert_eq!(text.matches("one-2").count(), 1, "{text:?}");
    assert_eq!(text.matches("two-3").count(), 1, "{text:?}");
    let terminals = proxy
        .heads()
        .into_iter()
        .filter(|head| head.method == "GET")
        .count();
    assert!(terminals >= 2, "exec reconnected: {:?}", proxy.heads());
}

/// `ps`: the running processes by default, `--all` and `--state exited`.
#[tokio::test]
async fn ps_lists_processes() {
    let server = TestServer::start(&[]).await;
    let api = server.api();
    let start = |body: Value| {
        let api = api.clone();
        async move {
            let reply = Api::send(api.request(Method::POST, "/v2/processes").json(&body)).await;
            reply.assert_status(201);
            reply.json()["id"].as_str().expect("id").to_owned()
        }
    };
    let sleeping = start(json!({"command": "sleep", "args": ["100"]})).await;
    let done = start(json!({"command": "sh", "args": ["-c", "exit 9"]})).await;
    for _ in 0..100 {
        if api.get_json(&format!("/v2/processes/{done}")).await["state"] == "exited" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let url = api.base_url().to_owned();
    let run = cli(&["ps", "--url", &url], b"", &[]).await;
    assert_eq!(run.status.code(), Some(0), "{run:?}");
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{run:?}");
    assert!(lines[0].starts_with("ID "), "{run:?}");
    let cells: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(cells[0], sleeping);
    assert_eq!(&cells[2..], ["running", "-", "sleep", "100"], "{run:?}");
    let run = cli(&["ps", "--url", &url, "--state", "exited"], b"", &[]).await;
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{run:?}");
    assert!(lines[1].starts_with(&done), "{run:?}");
    assert!(
        lines[1].contains(" exited ") && lines[1].contains(" 9 "),
        "{run:?}"
    );
    assert!(lines[1].ends_with("sh -c 'exit 9'"), "{run:?}");
    let run = cli(&["ps", "--url", &url, "--all"], b"", &[]).await;
    assert_eq!(run.stdout.lines().count(), 3, "{run:?}");
}
