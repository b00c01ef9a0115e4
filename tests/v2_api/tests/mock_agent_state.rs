//! The mock agent's `--state-dir` (research/contract.md, "The mock agent"),
//! spoken to directly over stdio as an ACP client would: what one process
//! saved, a later process lists in `session/list` and can `session/load`.

use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout};
use v2_api_tests::TempDir;
use v2_api_tests::server::sandbox_agent_command;

/// Bound on one answer of the mock agent.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(20);

/// One `sandbox-agent mock-agent --state-dir DIR` process.
struct MockAgent {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
}

impl MockAgent {
    async fn start(state_dir: &TempDir) -> MockAgent {
        let mut command = tokio::process::Command::from(sandbox_agent_command());
        let mut child = command
            .args(["mock-agent", "--state-dir", state_dir.utf8()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn the mock agent");
        let stdin = child.stdin.take().expect("stdin is piped");
        let stdout = BufReader::new(child.stdout.take().expect("stdout is piped")).lines();
        let mut agent = MockAgent {
            child,
            stdin,
            stdout,
        };
        let answer = agent
            .call(
                0,
                "initialize",
                json!({"protocolVersion": 1, "clientCapabilities": {}}),
            )
            .await;
        assert!(answer["result"].is_object(), "{answer}");
        agent
    }

    /// Sends request `id` and returns its answer (notifications before it
    /// are skipped).
    async fn call(&mut self, id: u64, method: &str, params: Value) -> Value {
        let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .expect("write to the mock agent");
        let answer = async {
            loop {
                let line = self
                    .stdout
                    .next_line()
                    .await
                    .expect("read the mock agent")
                    .expect("the mock agent closed stdout");
                let message: Value = serde_json::from_str(&line).expect("JSON");
                if message["id"] == id && message.get("method").is_none() {
                    return message;
                }
            }
        };
        tokio::time::timeout(ANSWER_TIMEOUT, answer)
            .await
            .unwrap_or_else(|_| panic!("no answer to {method} within {ANSWER_TIMEOUT:?}"))
    }

    /// Closes stdin and waits for the process to exit.
    async fn stop(mut self) {
        drop(self.stdin);
        tokio::time::timeout(ANSWER_TIMEOUT, self.child.wait())
            .await
            .expect("the mock agent exits at stdin EOF")
            .expect("wait");
    }
}

/// The session ids of a `session/list` answer, in order.
fn listed(answer: &Value) -> Vec<String> {
    answer["result"]["sessions"]
        .as_array()
        .unwrap_or_else(|| panic!("a session list: {answer}"))
        .iter()
        .map(|session| session["sessionId"].as_str().unwrap_or("?").to_owned())
        .collect()
}

#[tokio::test]
async fn session_list_shows_what_the_state_dir_holds_and_load_can_load() {
    let state = TempDir::new("mock-state");
    let mut first = MockAgent::start(&state).await;
    let mut ids = Vec::new();
    for (n, cwd) in [(1, "/tmp"), (2, "/")] {
        let answer = first
            .call(n, "session/new", json!({"cwd": cwd, "mcpServers": []}))
            .await;
        let id = answer["result"]["sessionId"].as_str().expect("an id");
        ids.push(id.to_owned());
    }
    let answer = first
        .call(
            3,
            "session/prompt",
            json!({"sessionId": ids[0], "prompt": [{"type": "text", "text": "hello"}]}),
        )
        .await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    first.stop().await;

    // A new process holds no session in memory: the list comes from the
    // state dir, with each session's cwd.
    let mut second = MockAgent::start(&state).await;
    let answer = second.call(1, "session/list", json!({})).await;
    let mut got = listed(&answer);
    got.sort();
    let mut want = ids.clone();
    want.sort();
    assert_eq!(got, want, "{answer}");
    let answer = second.call(2, "session/list", json!({"cwd": "/tmp"})).await;
    assert_eq!(
        listed(&answer),
        vec![ids[0].clone()],
        "cwd filter: {answer}"
    );

    // What is listed loads, and is then listed once.
    let answer = second
        .call(
            3,
            "session/load",
            json!({"sessionId": ids[0], "cwd": "/tmp", "mcpServers": []}),
        )
        .await;
    assert!(answer["result"].is_object(), "{answer}");
    let answer = second.call(4, "session/list", json!({})).await;
    assert_eq!(listed(&answer).len(), 2, "no duplicate: {answer}");

    // A file that is not a state file is not listed.
    std::fs::write(state.path().join("junk.json"), b"{}").expect("write");
    let answer = second.call(5, "session/list", json!({})).await;
    assert_eq!(listed(&answer).len(), 2, "{answer}");
    second.stop().await;
}
