//! The built-in mock agent (`sandbox-agent mock-agent`), driven as a real
//! process over stdin/stdout with raw JSON-RPC lines. The behaviour checked
//! here is specified in `research/contract.md`, section "The mock agent".

use std::future::Future;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// No test may take longer than this, whatever the agent does.
const TEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs a test body under [`TEST_TIMEOUT`].
async fn within_timeout(test: impl Future<Output = ()>) {
    tokio::time::timeout(TEST_TIMEOUT, test)
        .await
        .expect("the test timed out");
}

/// A running `sandbox-agent mock-agent` process.
struct MockAgent {
    child: Child,
    stdin: ChildStdin,
    stdout: tokio::io::Lines<BufReader<ChildStdout>>,
    /// Everything the agent writes to stderr, once it closes.
    stderr: tokio::task::JoinHandle<String>,
    next_id: u64,
}

impl MockAgent {
    fn spawn(args: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_sandbox-agent"))
            .arg("mock-agent")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn sandbox-agent mock-agent");
        let stdin = child.stdin.take().expect("stdin is piped");
        let stdout = BufReader::new(child.stdout.take().expect("stdout is piped")).lines();
        let mut stderr_pipe = child.stderr.take().expect("stderr is piped");
        // Read stderr all along, so the agent never blocks on a full pipe.
        let stderr = tokio::spawn(async move {
            let mut bytes = Vec::new();
            let _ = stderr_pipe.read_to_end(&mut bytes).await;
            String::from_utf8_lossy(&bytes).into_owned()
        });
        Self {
            child,
            stdin,
            stdout,
            stderr,
            next_id: 0,
        }
    }

    /// Spawns the agent and completes `initialize`.
    async fn initialized(args: &[&str]) -> Self {
        let mut agent = Self::spawn(args);
        let (before, response) = agent
            .call("initialize", json!({"protocolVersion": 1}))
            .await;
        assert!(before.is_empty(), "{before:?}");
        assert!(response.get("result").is_some(), "{response}");
        agent
    }

    async fn send(&mut self, message: &Value) {
        let mut line = message.to_string();
        line.push('\n');
        self.stdin
            .write_all(line.as_bytes())
            .await
            .expect("write to the agent's stdin");
    }

    /// Sends a request and returns its id.
    async fn request(&mut self, method: &str, params: Value) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        id
    }

    async fn notify(&mut self, method: &str, params: Value) {
        self.send(&json!({"jsonrpc": "2.0", "method": method, "params": params}))
            .await;
    }

    /// Answers an agent-initiated request.
    async fn answer(&mut self, request: &Value, result: Value) {
        let id = request
            .get("id")
            .expect("the agent's request has an id")
            .clone();
        self.send(&json!({"jsonrpc": "2.0", "id": id, "result": result}))
            .await;
    }

    async fn read_line(&mut self) -> Option<String> {
        self.stdout
            .next_line()
            .await
            .expect("read the agent's stdout")
    }

    async fn read_message(&mut self) -> Value {
        let line = self.read_line().await.expect("the agent closed stdout");
        serde_json::from_str(&line).unwrap_or_else(|error| panic!("not JSON ({error}): {line:?}"))
    }

    /// Reads messages up to the response to `id`: (the messages before it, the response).
    async fn until_response(&mut self, id: u64) -> (Vec<Value>, Value) {
        let mut before = Vec::new();
        loop {
            let message = self.read_message().await;
            if message.get("id") == Some(&json!(id)) && message.get("method").is_none() {
                return (before, message);
            }
            before.push(message);
        }
    }

    /// Reads messages up to the first agent-initiated request: (the messages before it, the request).
    async fn until_agent_request(&mut self) -> (Vec<Value>, Value) {
        let mut before = Vec::new();
        loop {
            let message = self.read_message().await;
            if message.get("id").is_some() && message.get("method").is_some() {
                return (before, message);
            }
            before.push(message);
        }
    }

    async fn call(&mut self, method: &str, params: Value) -> (Vec<Value>, Value) {
        let id = self.request(method, params).await;
        self.until_response(id).await
    }

    async fn new_session(&mut self) -> String {
        let (_, response) = self
            .call("session/new", json!({"cwd": "/tmp", "mcpServers": []}))
            .await;
        response["result"]["sessionId"]
            .as_str()
            .expect("session/new returns a sessionId")
            .to_owned()
    }

    async fn start_prompt(&mut self, session_id: &str, text: &str) -> u64 {
        self.request(
            "session/prompt",
            json!({"sessionId": session_id, "prompt": [{"type": "text", "text": text}]}),
        )
        .await
    }

    /// Runs one prompt turn: (its updates, its response).
    async fn prompt(&mut self, session_id: &str, text: &str) -> (Vec<Value>, Value) {
        let id = self.start_prompt(session_id, text).await;
        self.until_response(id).await
    }

    async fn cancel(&mut self, session_id: &str) {
        self.notify("session/cancel", json!({"sessionId": session_id}))
            .await;
    }

    /// Kills the process (SIGKILL: nothing runs after) and waits for it.
    async fn kill(mut self) {
        self.child.kill().await.expect("kill the agent");
    }

    /// Closes stdin and waits for the exit: (exit code, everything on stderr).
    async fn exit(mut self) -> (Option<i32>, String) {
        drop(self.stdin);
        let status = self.child.wait().await.expect("wait for the agent");
        let stderr = self.stderr.await.expect("read the agent's stderr");
        (status.code(), stderr)
    }
}

/// The `sessionUpdate` kinds of `session/update` notifications, in order.
fn update_kinds(messages: &[Value]) -> Vec<String> {
    messages
        .iter()
        .map(|message| {
            assert_eq!(message["method"], "session/update", "{message}");
            message["params"]["update"]["sessionUpdate"]
                .as_str()
                .expect("sessionUpdate is a string")
                .to_owned()
        })
        .collect()
}

/// The texts of the `agent_message_chunk` updates, in order.
fn chunk_texts(messages: &[Value]) -> Vec<String> {
    messages
        .iter()
        .filter(|message| message["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
        .map(|message| {
            message["params"]["update"]["content"]["text"]
                .as_str()
                .expect("chunk text")
                .to_owned()
        })
        .collect()
}

fn stop_reason(response: &Value) -> &str {
    response["result"]["stopReason"]
        .as_str()
        .unwrap_or_else(|| panic!("no stop reason in {response}"))
}

/// The chunks of the plain reply to `text`.
fn plain_reply(text: &str) -> Vec<String> {
    let sentence = format!("Hello from the mock agent. You said: {text}");
    let words: Vec<&str> = sentence.split_whitespace().collect();
    let last = words.len() - 1;
    words
        .iter()
        .enumerate()
        .map(|(index, word)| {
            if index == last {
                (*word).to_owned()
            } else {
                format!("{word} ")
            }
        })
        .collect()
}

#[tokio::test]
async fn initialize_result_shape() {
    within_timeout(async {
        let mut agent = MockAgent::spawn(&[]);
        let (before, response) = agent
            .call(
                "initialize",
                json!({"protocolVersion": 1, "clientCapabilities": {}}),
            )
            .await;
        assert!(before.is_empty());
        let result = &response["result"];
        assert_eq!(result["protocolVersion"], 1);
        assert_eq!(result["agentInfo"]["name"], "sandbox-agent-mock");
        assert!(result["agentInfo"]["version"].is_string());
        let capabilities = &result["agentCapabilities"];
        assert_eq!(capabilities["loadSession"], true);
        for capability in ["list", "resume", "fork"] {
            assert!(
                capabilities["sessionCapabilities"][capability].is_object(),
                "{capability} in {capabilities}"
            );
        }
        assert_eq!(result["authMethods"], json!([]));
        assert_eq!(agent.exit().await.0, Some(0));
    })
    .await;
}

#[tokio::test]
async fn requests_sent_without_waiting_for_initialize_are_answered() {
    within_timeout(async {
        let mut agent = MockAgent::spawn(&[]);
        let lines = [
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}}),
            json!({"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": {"cwd": "/tmp", "mcpServers": []}}),
            json!({"jsonrpc": "2.0", "id": 3, "method": "session/list", "params": {}}),
        ];
        let mut batch = String::new();
        for line in &lines {
            batch.push_str(&line.to_string());
            batch.push('\n');
        }
        agent
            .stdin
            .write_all(batch.as_bytes())
            .await
            .expect("write to the agent's stdin");
        for id in 1..=3 {
            let response = agent.read_message().await;
            assert_eq!(response["id"], id);
            assert!(response.get("result").is_some(), "{response}");
        }
    })
    .await;
}

#[tokio::test]
async fn new_session_has_modes_and_model_option() {
    within_timeout(async {
        let mut agent = MockAgent::initialized(&[]).await;
        let (before, response) = agent
            .call("session/new", json!({"cwd": "/tmp", "mcpServers": []}))
            .await;
        assert!(before.is_empty(), "{before:?}");
        let result = &response["result"];
        let session_id = result["sessionId"].as_str().expect("sessionId");
        assert!(session_id.starts_with("mock-"), "{session_id}");
        assert_eq!(result["modes"]["currentModeId"], "default");
        let modes: Vec<&Value> = result["modes"]["availableModes"]
            .as_array()
            .expect("availableModes")
            .iter()
            .map(|mode| &mode["id"])
            .collect();
        assert_eq!(modes, [&json!("default"), &json!("plan")]);
        let option = &result["configOptions"][0];
        assert_eq!(option["id"], "model");
        assert_eq!(option["category"], "model");
        assert_eq!(option["type"], "select");
        assert_eq!(option["currentValue"], "mock-fast");
        let values: Vec<&Value> = option["options"]
            .as_array()
            .expect("options")
            .iter()
            .map(|value| &value["value"])
            .collect();
        assert_eq!(values, [&json!("mock-fast"), &json!("mock-smart")]);
    })
    .await;
}

#[tokio::test]
async fn plain_prompt_streams_one_chunk_per_word() {
    within_timeout(async {
        let mut agent = MockAgent::initialized(&[]).await;
        let session = agent.new_session().await;
        let (updates, response) = agent.prompt(&session, "hi   there").await;
        assert_eq!(stop_reason(&response), "end_turn");
        assert!(
            updates
                .iter()
                .all(|update| update["params"]["sessionId"] == session.as_str())
        );
        assert_eq!(
            chunk_texts(&updates),
            [
                "Hello ", "from ", "the ", "mock ", "agent. ", "You ", "said: ", "hi ", "there"
            ]
        );
        assert_eq!(update_kinds(&updates).len(), 9);
    })
    .await;
}

#[tokio::test]
async fn prompt_text_blocks_are_joined_by_spaces() {
    within_timeout(async {
        let mut agent = MockAgent::initialized(&[]).await;
        let session = agent.new_session().await;
        let id = agent
            .request(
                "session/prompt",
                json!({"sessionId": session, "prompt": [
                    {"type": "text", "text": "one"},
                    {"type": "resource_link", "name": "f", "uri": "file:///f"},
                    {"type": "text", "text": "two"},
                ]}),
            )
            .await;
        let (updates, response) = agent.until_response(id).await;
        assert_eq!(stop_reason(&response), "end_turn");
        assert_eq!(chunk_texts(&updates), plain_reply("one two"));
    })
    .await;
}

#[tokio::test]
async fn prompt_for_unknown_session_is_an_error() {
    within_timeout(async {
        let mut agent = MockAgent::initialized(&[]).await;
        let (updates, response) = agent.prompt("mock-nope", "hi").await;
        assert!(updates.is_empty());
        assert_eq!(response["error"]["code"], -32002, "{response}");
    })
    .await;
}

#[tokio::test]
async fn tool_prompt_reports_a_tool_call() {
    within_timeout(async {
        let mut agent = MockAgent::initialized(&[]).await;
        let session = agent.new_session().await;
        let (updates, response) = agent.prompt(&session, "use a tool").await;
        assert_eq!(stop_reason(&response), "end_turn");
        let call = &updates[0]["params"]["update"];
        assert_eq!(call["sessionUpdate"], "tool_call");
        assert_eq!(call["toolCallId"], "mock-tool-1");
        assert_eq!(call["title"], "Reading the mock file");
        assert_eq!(call["kind"], "read");
        assert_eq!(call["status"], "in_progress");
        let update = &updates[1]["params"]["update"];
        assert_eq!(update["sessionUpdate"], "tool_call_update");
        assert_eq!(update["toolCallId"], "mock-tool-1");
        assert_eq!(update["status"], "completed");
        assert_eq!(chunk_texts(&updates[2..]), plain_reply("use a tool"));
    })
    .await;
}

/// Starts a `permission` turn and reads up to the permission request.
async fn permission_requested(agent: &mut MockAgent, session: &str) -> (u64, Value) {
    let prompt = agent.start_prompt(session, "may I have permission?").await;
    let (before, request) = agent.until_agent_request().await;
    let call = &before[0]["params"]["update"];
    assert_eq!(update_kinds(&before), ["tool_call"]);
    assert_eq!(call["toolCallId"], "mock-tool-1");
    assert_eq!(call["title"], "Write to mock.txt");
    assert_eq!(call["kind"], "edit");
    // `pending` is the schema's default status, which the crate leaves out.
    assert!(
        call["status"] == "pending" || call.get("status").is_none(),
        "{call}"
    );
    assert_eq!(request["method"], "session/request_permission");
    assert_eq!(request["params"]["sessionId"], session);
    assert_eq!(request["params"]["toolCall"]["toolCallId"], "mock-tool-1");
    let options: Vec<(&Value, &Value)> = request["params"]["options"]
        .as_array()
        .expect("options")
        .iter()
        .map(|option| (&option["optionId"], &option["kind"]))
        .collect();
    assert_eq!(
        options,
        [
            (&json!("allow-once"), &json!("allow_once")),
            (&json!("reject-once"), &json!("reject_once"))
        ]
    );
    (prompt, request)
}

#[tokio::test]
async fn permission_allowed() {
    within_timeout(async {
        let mut agent = MockAgent::initialized(&[]).await;
        let session = agent.new_session().await;
        let (prompt, request) = permission_requested(&mut agent, &session).await;
        agent
            .answer(
                &request,
                json!({"outcome": {"outcome": "selected", "optionId": "allow-once"}}),
            )
            .await;
        let (updates, response) = agent.until_response(prompt).await;
        assert_eq!(stop_reason(&response), "end_turn");
        assert_eq!(
            updates[0]["params"]["update"]["sessionUpdate"],
            "tool_call_update"
        );
        assert_eq!(updates[0]["params"]["update"]["status"], "completed");
        assert_eq!(chunk_texts(&updates), ["Permission ", "granted."]);
    })
    .await;
}

#[tokio::test]
async fn permission_rejected() {
    within_timeout(async {
        let mut agent = MockAgent::initialized(&[]).await;
        let session = agent.new_session().await;
        let (prompt, request) = permission_requested(&mut agent, &session).await;
        agent
            .answer(
                &request,
                json!({"outcome": {"outcome": "selected", "optionId": "reject-once"}}),
            )
            .await;
        let (updates, response) = agent.until_response(prompt).await;
        assert_eq!(stop_reason(&response), "end_turn");
        assert_eq!(updates[0]["params"]["update"]["status"], "failed");
        assert_eq!(chunk_texts(&updates), ["Permission ", "denied."]);
    })
    .await;
}

#[tokio::test]
async fn permission_outcome_cancelled() {
    within_timeout(async {
        let mut agent = MockAgent::initialized(&[]).await;
        let session = agent.new_session().await;
        let (prompt, request) = permission_requested(&mut agent, &session).await;
        agent
            .answer(&request, json!({"outcome": {"outcome": "cancelled"}}))
            .await;
        let (updates, response) = agent.until_response(prompt).await;
        assert!(updates.is_empty(), "{updates:?}");
        assert_eq!(stop_reason(&response), "cancelled");
    })
    .await;
}

#[tokio::test]
async fn session_cancel_while_permission_is_pending() {
    within_timeout(async {
        let mut agent = MockAgent::initialized(&[]).await;
        let session = agent.new_session().await;
        let (prompt, request) = permission_requested(&mut agent, &session).await;
        agent.cancel(&session).await;
        let (updates, response) = agent.until_response(prompt).await;
        assert!(updates.is_empty(), "{updates:?}");
        assert_eq!(stop_reason(&response), "cancelled");
        // The client answers the pending request as ACP asks; the agent takes
        // the late answer and carries on.
        agent
            .answer(&request, json!({"outcome": {"outcome": "cancelled"}}))
            .await;
        let (_, response) = agent.prompt(&session, "still there?").await;
        assert_eq!(stop_reason(&response), "end_turn");
    })
    .await;
}

#[tokio::test]
async fn garbage_lines_then_a_normal_turn() {
    within_timeout(async {
        let mut agent = MockAgent::initialized(&[]).await;
        let session = agent.new_session().await;
        let prompt = agent.start_prompt(&session, "!garbage").await;
        let mut raw = Vec::new();
        let mut updates = Vec::new();
        loop {
            let line = agent.read_line().await.expect("the agent closed stdout");
            match serde_json::from_str::<Value>(&line) {
                Ok(message) if message.is_object() => {
                    if message.get("id") == Some(&json!(prompt)) {
                        assert_eq!(stop_reason(&message), "end_turn");
                        break;
                    }
                    updates.push(message);
                }
                _ => {
                    assert!(updates.is_empty(), "raw line {line:?} after an update");
                    raw.push(line);
                }
            }
        }
        assert_eq!(raw, ["this is not json", "\x1b[31mred\x1b[0m", "42"]);
        assert_eq!(chunk_texts(&updates), plain_reply("!garbage"));
        let (_, response) = agent.prompt(&session, "after garbage").await;
        assert_eq!(stop_reason(&response), "end_turn");
    })
    .await;
}

#[tokio::test]
async fn huge_line_then_a_normal_turn() {
    within_timeout(async {
        let mut agent = MockAgent::initialized(&[]).await;
        let session = agent.new_session().await;
        let prompt = agent.start_prompt(&session, "!huge 100000").await;
        let line = agent.read_line().await.expect("the huge line");
        assert_eq!(line.len(), 100_000);
        assert!(serde_json::from_str::<Value>(&line).is_err());
        let (updates, response) = agent.until_response(prompt).await;
        assert_eq!(stop_reason(&response), "end_turn");
        assert_eq!(chunk_texts(&updates), plain_reply("!huge 100000"));
    })
    .await;
}

#[tokio::test]
async fn crash_exits_mid_turn_with_the_code() {
    within_timeout(async {
        let mut agent = MockAgent::initialized(&[]).await;
        let session = agent.new_session().await;
        agent.start_prompt(&session, "!crash 7").await;
        let chunk = agent.read_message().await;
        assert_eq!(chunk_texts(&[chunk]), ["Crashing..."]);
        // The prompt is never answered: the next thing is the end of stdout.
        assert_eq!(agent.read_line().await, None);
        let (code, stderr) = agent.exit().await;
        assert_eq!(code, Some(7));
        assert!(
            stderr.contains("mock agent: crashing on request"),
            "{stderr}"
        );
    })
    .await;
}

#[tokio::test]
async fn crash_without_code_exits_with_3() {
    within_timeout(async {
        let mut agent = MockAgent::initialized(&[]).await;
        let session = agent.new_session().await;
        agent.start_prompt(&session, "!crash").await;
        while agent.read_line().await.is_some() {}
        assert_eq!(agent.exit().await.0, Some(3));
    })
    .await;
}

#[tokio::test]
async fn stall_until_session_cancel() {
    within_timeout(async {
        let mut agent = MockAgent::initialized(&[]).await;
        let session = agent.new_session().await;
        let prompt = agent.start_prompt(&session, "!stall").await;
        // Nothing arrives while the turn stalls.
        let quiet = tokio::time::timeout(Duration::from_millis(200), agent.read_line()).await;
        assert!(quiet.is_err(), "the stalled turn wrote {quiet:?}");
        agent.cancel(&session).await;
        let (updates, response) = agent.until_response(prompt).await;
        assert!(updates.is_empty(), "{updates:?}");
        assert_eq!(stop_reason(&response), "cancelled");
    })
    .await;
}

#[tokio::test]
async fn a_second_prompt_while_a_turn_runs_is_refused() {
    within_timeout(async {
        let mut agent = MockAgent::initialized(&[]).await;
        let session = agent.new_session().await;
        let stalled = agent.start_prompt(&session, "!stall").await;
        let (_, response) = agent.prompt(&session, "hi").await;
        assert_eq!(response["error"]["code"], -32600, "{response}");
        agent.cancel(&session).await;
        let (_, response) = agent.until_response(stalled).await;
        assert_eq!(stop_reason(&response), "cancelled");
    })
    .await;
}

#[tokio::test]
async fn emit_sends_n_chunks_of_k_bytes() {
    within_timeout(async {
        let mut agent = MockAgent::initialized(&[]).await;
        let session = agent.new_session().await;
        let (updates, response) = agent.prompt(&session, "!emit 5 3").await;
        assert_eq!(stop_reason(&response), "end_turn");
        assert_eq!(chunk_texts(&updates), ["xxx"; 5]);
        assert_eq!(updates.len(), 5);
    })
    .await;
}

#[tokio::test]
async fn session_cancel_stops_a_busy_emit() {
    within_timeout(async {
        const CHUNKS: usize = 200_000;
        let mut agent = MockAgent::initialized(&[]).await;
        let session = agent.new_session().await;
        let prompt = agent
            .start_prompt(&session, &format!("!emit {CHUNKS} 1"))
            .await;
        agent.cancel(&session).await;
        let (updates, response) = agent.until_response(prompt).await;
        assert_eq!(stop_reason(&response), "cancelled");
        assert!(updates.len() < CHUNKS, "all {CHUNKS} chunks were sent");
    })
    .await;
}

#[tokio::test]
async fn slow_spaces_its_chunks() {
    within_timeout(async {
        let mut agent = MockAgent::initialized(&[]).await;
        let session = agent.new_session().await;
        let started = Instant::now();
        let (updates, response) = agent.prompt(&session, "!slow 3 10").await;
        assert_eq!(stop_reason(&response), "end_turn");
        assert_eq!(chunk_texts(&updates), ["chunk-1 ", "chunk-2 ", "chunk-3 "]);
        assert!(started.elapsed() >= Duration::from_millis(20));
    })
    .await;
}

#[tokio::test]
async fn malformed_directive_is_invalid_params() {
    within_timeout(async {
        let mut agent = MockAgent::initialized(&[]).await;
        let session = agent.new_session().await;
        let (updates, response) = agent.prompt(&session, "!emit lots").await;
        assert!(updates.is_empty());
        assert_eq!(response["error"]["code"], -32602, "{response}");
    })
    .await;
}

#[tokio::test]
async fn fs_reads_through_the_client() {
    within_timeout(async {
        let mut agent = MockAgent::initialized(&[]).await;
        let session = agent.new_session().await;
        let prompt = agent.start_prompt(&session, "!fs /tmp/mock file.txt").await;
        let (before, request) = agent.until_agent_request().await;
        assert!(before.is_empty(), "{before:?}");
        assert_eq!(request["method"], "fs/read_text_file");
        assert_eq!(
            request["params"],
            json!({"sessionId": session, "path": "/tmp/mock file.txt"})
        );
        agent.answer(&request, json!({"content": "hello"})).await;
        let (updates, response) = agent.until_response(prompt).await;
        assert_eq!(stop_reason(&response), "end_turn");
        assert_eq!(chunk_texts(&updates), ["Read ", "5 ", "bytes."]);

        // An error answer is reported in the reply.
        let prompt = agent.start_prompt(&session, "!fs /nope").await;
        let (_, request) = agent.until_agent_request().await;
        let id = request["id"].clone();
        agent
            .send(&json!({"jsonrpc": "2.0", "id": id,
                "error": {"code": -32601, "message": "Method not found"}}))
            .await;
        let (updates, response) = agent.until_response(prompt).await;
        assert_eq!(stop_reason(&response), "end_turn");
        assert_eq!(
            chunk_texts(&updates),
            ["fs ", "error: ", "Method ", "not ", "found"]
        );
    })
    .await;
}

#[tokio::test]
async fn stderr_lines_then_the_plain_reply() {
    within_timeout(async {
        let mut agent = MockAgent::initialized(&[]).await;
        let session = agent.new_session().await;
        let (updates, response) = agent.prompt(&session, "!stderr 3").await;
        assert_eq!(stop_reason(&response), "end_turn");
        assert_eq!(chunk_texts(&updates), plain_reply("!stderr 3"));
        let (code, stderr) = agent.exit().await;
        assert_eq!(code, Some(0));
        assert!(
            stderr.contains("stderr line 1\nstderr line 2\nstderr line 3\n"),
            "{stderr}"
        );
    })
    .await;
}

#[tokio::test]
async fn load_replays_the_history() {
    within_timeout(async {
        let mut agent = MockAgent::initialized(&[]).await;
        let session = agent.new_session().await;
        agent.prompt(&session, "first").await;
        agent.prompt(&session, "second").await;
        let (updates, response) = agent
            .call(
                "session/load",
                json!({"sessionId": session, "cwd": "/tmp", "mcpServers": []}),
            )
            .await;
        assert_eq!(response["result"]["modes"]["currentModeId"], "default");
        assert_eq!(
            update_kinds(&updates),
            [
                "user_message_chunk",
                "agent_message_chunk",
                "user_message_chunk",
                "agent_message_chunk"
            ]
        );
        let texts: Vec<&Value> = updates
            .iter()
            .map(|update| &update["params"]["update"]["content"]["text"])
            .collect();
        assert_eq!(
            texts,
            [
                &json!("first"),
                &json!("Hello from the mock agent. You said: first"),
                &json!("second"),
                &json!("Hello from the mock agent. You said: second"),
            ]
        );

        let (updates, response) = agent
            .call(
                "session/load",
                json!({"sessionId": "mock-unknown", "cwd": "/tmp", "mcpServers": []}),
            )
            .await;
        assert!(updates.is_empty());
        assert_eq!(response["error"]["code"], -32002, "{response}");
    })
    .await;
}

/// A fresh directory for `--state-dir` tests, removed on drop.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("mock-agent-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the temp dir");
        Self(dir)
    }

    fn arg(&self) -> &str {
        self.0.to_str().expect("the temp dir is UTF-8")
    }

    /// The names of the files in the directory, sorted.
    fn files(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.0)
            .expect("read the state dir")
            .map(|entry| {
                entry
                    .expect("a directory entry")
                    .file_name()
                    .into_string()
                    .expect("a UTF-8 file name")
            })
            .collect();
        names.sort();
        names
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The (kind, text) of replayed message chunks, in order.
fn replayed(updates: &[Value]) -> Vec<(String, String)> {
    updates
        .iter()
        .map(|update| {
            let update = &update["params"]["update"];
            (
                update["sessionUpdate"].as_str().expect("kind").to_owned(),
                update["content"]["text"].as_str().expect("text").to_owned(),
            )
        })
        .collect()
}

fn user(text: &str) -> (String, String) {
    ("user_message_chunk".to_owned(), text.to_owned())
}

fn agent_reply(text: &str) -> (String, String) {
    (
        "agent_message_chunk".to_owned(),
        format!("Hello from the mock agent. You said: {text}"),
    )
}

#[tokio::test]
async fn state_dir_carries_sessions_across_processes() {
    within_timeout(async {
        let dir = TempDir::new("across");
        // An id with a slash, spaces and non-ASCII text: the file name must not care.
        let args = ["--state-dir", dir.arg(), "--session-id-prefix", "a/b c é-"];

        let mut first = MockAgent::initialized(&args).await;
        let session = first.new_session().await;
        let (_, response) = first
            .call(
                "session/set_mode",
                json!({"sessionId": session, "modeId": "plan"}),
            )
            .await;
        assert!(response["result"].is_object(), "{response}");
        first.prompt(&session, "first").await;
        first.kill().await;
        let files = dir.files();
        assert_eq!(
            files.len(),
            1,
            "one file per session, no temp files: {files:?}"
        );
        let name = files[0].strip_suffix(".json").expect("a .json file");
        assert!(
            name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit()),
            "{name}"
        );

        // A new process: resume (no replay) and a new prompt continue it.
        let mut second = MockAgent::initialized(&args).await;
        let (updates, response) = second
            .call(
                "session/resume",
                json!({"sessionId": session, "cwd": "/tmp"}),
            )
            .await;
        assert!(updates.is_empty(), "resume does not replay: {updates:?}");
        assert_eq!(response["result"]["modes"]["currentModeId"], "plan");
        let (_, response) = second.prompt(&session, "second").await;
        assert_eq!(stop_reason(&response), "end_turn");
        second.kill().await;

        // A third process replays the history of both.
        let mut third = MockAgent::initialized(&args).await;
        let (updates, response) = third
            .call(
                "session/load",
                json!({"sessionId": session, "cwd": "/tmp", "mcpServers": []}),
            )
            .await;
        assert_eq!(response["result"]["modes"]["currentModeId"], "plan");
        assert_eq!(
            replayed(&updates),
            [
                user("first"),
                agent_reply("first"),
                user("second"),
                agent_reply("second")
            ]
        );
        assert!(
            updates
                .iter()
                .all(|u| u["params"]["sessionId"] == session.as_str()),
            "{updates:?}"
        );
        let (_, response) = third.call("session/list", json!({})).await;
        assert_eq!(
            response["result"]["sessions"][0]["sessionId"],
            session.as_str()
        );
        assert_eq!(response["result"]["sessions"][0]["cwd"], "/tmp");

        // An id saved nowhere: the usual "session not found".
        let (updates, response) = third
            .call(
                "session/load",
                json!({"sessionId": "mock-unknown", "cwd": "/tmp", "mcpServers": []}),
            )
            .await;
        assert!(updates.is_empty());
        assert_eq!(response["error"]["code"], -32002, "{response}");
        let (_, response) = third
            .call(
                "session/resume",
                json!({"sessionId": "mock-unknown", "cwd": "/tmp"}),
            )
            .await;
        assert_eq!(response["error"]["code"], -32002, "{response}");
        assert_eq!(third.exit().await.0, Some(0));
    })
    .await;
}

#[tokio::test]
async fn state_dir_keeps_the_user_message_of_a_turn_killed_midway() {
    within_timeout(async {
        let dir = TempDir::new("midway");
        let args = ["--state-dir", dir.arg()];
        let mut first = MockAgent::initialized(&args).await;
        let session = first.new_session().await;
        first.prompt(&session, "done").await;
        first.start_prompt(&session, "!slow 50 100").await;
        let message = first.read_message().await;
        assert_eq!(chunk_texts(&[message]), ["chunk-1 "]);
        first.kill().await;

        let mut second = MockAgent::initialized(&args).await;
        let (updates, _) = second
            .call(
                "session/load",
                json!({"sessionId": session, "cwd": "/tmp", "mcpServers": []}),
            )
            .await;
        assert_eq!(
            replayed(&updates),
            [user("done"), agent_reply("done"), user("!slow 50 100")]
        );
        // The session goes on: the next turn answers the new prompt.
        let (_, response) = second.prompt(&session, "again").await;
        assert_eq!(stop_reason(&response), "end_turn");
    })
    .await;
}

#[tokio::test]
async fn state_dir_errors_are_named() {
    within_timeout(async {
        let dir = TempDir::new("errors");
        let args = ["--state-dir", dir.arg()];
        let mut first = MockAgent::initialized(&args).await;
        let session = first.new_session().await;
        first.kill().await;
        let files = dir.files();
        let file = dir.0.join(&files[0]);
        std::fs::write(&file, "{not json").expect("corrupt the state file");

        let mut second = MockAgent::initialized(&args).await;
        let (_, response) = second
            .call(
                "session/load",
                json!({"sessionId": session, "cwd": "/tmp", "mcpServers": []}),
            )
            .await;
        assert_eq!(response["error"]["code"], -32603, "{response}");
        let data = response["error"]["data"].as_str().expect("error data");
        assert!(data.contains(file.to_str().expect("UTF-8")), "{data}");
        second.kill().await;

        // A state dir that cannot be created: the process ends at once, naming it.
        let blocked = dir.0.join(&files[0]).join("sub");
        let agent = MockAgent::spawn(&["--state-dir", blocked.to_str().expect("UTF-8")]);
        let (code, stderr) = agent.exit().await;
        assert_ne!(code, Some(0));
        assert!(stderr.contains("--state-dir"), "{stderr}");
        assert!(
            stderr.contains(blocked.to_str().expect("UTF-8")),
            "{stderr}"
        );
    })
    .await;
}

#[tokio::test]
async fn resume_and_fork() {
    within_timeout(async {
        let mut agent = MockAgent::initialized(&[]).await;
        let session = agent.new_session().await;
        agent.prompt(&session, "remember me").await;

        let (updates, response) = agent
            .call(
                "session/resume",
                json!({"sessionId": session, "cwd": "/tmp"}),
            )
            .await;
        assert!(updates.is_empty(), "resume does not replay: {updates:?}");
        assert!(response["result"].is_object(), "{response}");

        let (_, response) = agent
            .call(
                "session/fork",
                json!({"sessionId": session, "cwd": "/work"}),
            )
            .await;
        let fork = response["result"]["sessionId"]
            .as_str()
            .expect("fork id")
            .to_owned();
        assert_ne!(fork, session);
        let (updates, _) = agent
            .call(
                "session/load",
                json!({"sessionId": fork, "cwd": "/work", "mcpServers": []}),
            )
            .await;
        assert_eq!(updates.len(), 2);
        assert_eq!(updates[0]["params"]["sessionId"], fork.as_str());
        assert_eq!(
            updates[0]["params"]["update"]["content"]["text"],
            "remember me"
        );
    })
    .await;
}

#[tokio::test]
async fn list_sessions() {
    within_timeout(async {
        let mut agent = MockAgent::initialized(&[]).await;
        let first = agent.new_session().await;
        let (_, response) = agent
            .call("session/new", json!({"cwd": "/work", "mcpServers": []}))
            .await;
        let second = response["result"]["sessionId"]
            .as_str()
            .expect("id")
            .to_owned();

        let (_, response) = agent.call("session/list", json!({})).await;
        let sessions = response["result"]["sessions"].as_array().expect("sessions");
        let ids: Vec<&Value> = sessions
            .iter()
            .map(|session| &session["sessionId"])
            .collect();
        assert_eq!(ids, [&json!(first), &json!(second)]);
        assert_eq!(sessions[0]["cwd"], "/tmp");
        assert!(sessions[0]["updatedAt"].is_string());

        let (_, response) = agent.call("session/list", json!({"cwd": "/work"})).await;
        let sessions = response["result"]["sessions"].as_array().expect("sessions");
        assert_eq!(sessions.len(), 1);
        assert_eq!(sessions[0]["sessionId"], second.as_str());
    })
    .await;
}

#[tokio::test]
async fn set_mode_emits_current_mode_update() {
    within_timeout(async {
        let mut agent = MockAgent::initialized(&[]).await;
        let session = agent.new_session().await;
        let (updates, response) = agent
            .call(
                "session/set_mode",
                json!({"sessionId": session, "modeId": "plan"}),
            )
            .await;
        assert_eq!(response["result"], json!({}));
        assert_eq!(update_kinds(&updates), ["current_mode_update"]);
        assert_eq!(updates[0]["params"]["update"]["currentModeId"], "plan");

        let (_, response) = agent
            .call(
                "session/set_mode",
                json!({"sessionId": session, "modeId": "yolo"}),
            )
            .await;
        assert_eq!(response["error"]["code"], -32602, "{response}");

        let (_, response) = agent
            .call(
                "session/resume",
                json!({"sessionId": session, "cwd": "/tmp"}),
            )
            .await;
        assert_eq!(response["result"]["modes"]["currentModeId"], "plan");
    })
    .await;
}

#[tokio::test]
async fn set_model_and_config_option() {
    within_timeout(async {
        let mut agent = MockAgent::initialized(&[]).await;
        let session = agent.new_session().await;
        let (_, response) = agent
            .call(
                "session/set_config_option",
                json!({"sessionId": session, "configId": "model", "value": "mock-smart"}),
            )
            .await;
        assert_eq!(
            response["result"]["configOptions"][0]["currentValue"], "mock-smart",
            "{response}"
        );

        let (_, response) = agent
            .call(
                "session/set_model",
                json!({"sessionId": session, "modelId": "mock-fast"}),
            )
            .await;
        assert_eq!(response["result"], json!({}), "{response}");
        let (_, response) = agent
            .call(
                "session/resume",
                json!({"sessionId": session, "cwd": "/tmp"}),
            )
            .await;
        assert_eq!(
            response["result"]["configOptions"][0]["currentValue"],
            "mock-fast"
        );

        let (_, response) = agent
            .call(
                "session/set_model",
                json!({"sessionId": session, "modelId": "gpt-nothing"}),
            )
            .await;
        assert_eq!(response["error"]["code"], -32602, "{response}");
    })
    .await;
}

#[tokio::test]
async fn echo_answers_with_its_params() {
    within_timeout(async {
        let mut agent = MockAgent::initialized(&[]).await;
        let params =
            json!({"a": [1, 2.5, {"b": null}], "s": "x\ny", "big": 9_007_199_254_740_993_u64});
        let (before, response) = agent.call("_mock/echo", params.clone()).await;
        assert!(before.is_empty());
        assert_eq!(response["result"], params);
    })
    .await;
}

#[tokio::test]
async fn exit_at_start() {
    within_timeout(async {
        let mut agent = MockAgent::spawn(&["--exit-at-start", "5"]);
        assert_eq!(agent.read_line().await, None);
        assert_eq!(agent.exit().await.0, Some(5));
    })
    .await;
}

#[tokio::test]
async fn announce_session_early() {
    within_timeout(async {
        let mut agent = MockAgent::initialized(&["--announce-session-early"]).await;
        let (before, response) = agent
            .call("session/new", json!({"cwd": "/tmp", "mcpServers": []}))
            .await;
        let session = response["result"]["sessionId"].as_str().expect("sessionId");
        assert_eq!(update_kinds(&before), ["session_info_update"]);
        assert_eq!(before[0]["params"]["sessionId"], session);
    })
    .await;
}

#[tokio::test]
async fn stdin_eof_lets_the_running_turn_finish() {
    within_timeout(async {
        let mut agent = MockAgent::initialized(&[]).await;
        let session = agent.new_session().await;
        let prompt = agent.start_prompt(&session, "!slow 3 20").await;
        let MockAgent {
            mut child,
            stdin,
            mut stdout,
            ..
        } = agent;
        drop(stdin);
        let mut last = None;
        while let Some(line) = stdout.next_line().await.expect("read stdout") {
            last = Some(line);
        }
        let last: Value = serde_json::from_str(&last.expect("some output")).expect("JSON");
        assert_eq!(last["id"], prompt);
        assert_eq!(stop_reason(&last), "end_turn");
        assert_eq!(child.wait().await.expect("wait").code(), Some(0));
    })
    .await;
}

#[tokio::test]
async fn exits_when_stdout_is_gone() {
    within_timeout(async {
        let MockAgent {
            mut child,
            mut stdin,
            stdout,
            stderr,
            ..
        } = MockAgent::spawn(&[]);
        drop(stdout);
        let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": 1}});
        stdin
            .write_all(format!("{initialize}\n").as_bytes())
            .await
            .expect("write to the agent's stdin");
        // stdin stays open: the failed write alone ends the agent.
        let status = child.wait().await.expect("wait for the agent");
        assert_eq!(status.code(), Some(1));
        let stderr = stderr.await.expect("read the agent's stderr");
        assert!(stderr.contains("Broken pipe"), "{stderr}");
        drop(stdin);
    })
    .await;
}

/// `!emit 100000 16` through the agent's stdout, timed from the prompt to its
/// response. Run with
/// `cargo test --release -p acp-runtime --test mock_agent -- --ignored --nocapture`.
#[tokio::test]
#[ignore = "benchmark"]
async fn emit_throughput() {
    within_timeout(async {
        const CHUNKS: usize = 100_000;
        let mut agent = MockAgent::initialized(&[]).await;
        let session = agent.new_session().await;
        let started = Instant::now();
        let prompt = agent
            .start_prompt(&session, &format!("!emit {CHUNKS} 16"))
            .await;
        let mut updates = 0;
        loop {
            let line = agent.read_line().await.expect("the agent closed stdout");
            if line.contains("\"session/update\"") {
                updates += 1;
                continue;
            }
            let message: Value = serde_json::from_str(&line).expect("JSON");
            if message["id"] == prompt {
                break;
            }
        }
        let elapsed = started.elapsed();
        assert_eq!(updates, CHUNKS);
        println!(
            "!emit {CHUNKS} 16: {elapsed:?}, {:.0} updates/s",
            CHUNKS as f64 / elapsed.as_secs_f64()
        );
    })
    .await;
}
