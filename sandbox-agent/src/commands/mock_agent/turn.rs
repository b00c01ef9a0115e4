//! Prompt turns: `session/prompt` starts one in a task of its own,
//! `session/cancel` ends it, and [`Turn`] plays what its
//! [`Behaviour`] says, requests to the client included.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use agent_client_protocol::v1::schema::{
    BooleanPropertySchema, CompleteElicitationNotification, ContentBlock, ContentChunk,
    CreateElicitationRequest, CreateTerminalRequest, ElicitationAction, ElicitationContentValue,
    ElicitationFormMode, ElicitationMode, ElicitationSchema, ElicitationSessionScope,
    ElicitationUrlMode, KillTerminalRequest, PermissionOption, PermissionOptionKind, PromptRequest,
    PromptResponse, ReadTextFileRequest, ReleaseTerminalRequest, RequestPermissionOutcome,
    RequestPermissionRequest, SessionId, SessionUpdate, StopReason, StringPropertySchema, Terminal,
    TerminalExitStatus, TerminalId, TerminalOutputRequest, ToolCall, ToolCallContent,
    ToolCallStatus, ToolCallUpdate, ToolCallUpdateFields, ToolKind, Usage,
    WaitForTerminalExitRequest, WriteTextFileRequest,
};
use agent_client_protocol::v1::{ConnectionTo, Responder};
use agent_client_protocol::{Client, Error, ErrorCode, JsonRpcRequest, JsonRpcResponse};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::agent::{MockAgent, notify, session_not_found};
use super::behaviour::{Behaviour, prompt_text};
use super::session::{Message, RunningTurn, Speaker};
use super::state_dir::Encoded;

/// The variable whose value `!fail` writes to stderr: a secret the
/// runtime masks in the error (research/contract.md, "Agent errors: stderr
/// and hint").
const TEST_SECRET_ENV: &str = "SANDBOX_AGENT_TEST_SECRET_KEY";
/// The tool call id used by the `tool` and `permission` turns.
const TOOL_CALL_ID: &str = "mock-tool-1";
/// The tool call id of the `use terminal` turn's tool call.
const TERMINAL_TOOL_CALL_ID: &str = "mock-terminal-1";
/// `kill terminal` reads the output at most this many times …
const KILL_POLLS: usize = 500;
/// … this far apart, waiting for the first output before the kill.
const KILL_POLL_INTERVAL: Duration = Duration::from_millis(20);
/// The id of the permission option that grants the `permission` turn's
/// write; any other answer denies it.
const ALLOW_OPTION_ID: &str = "allow-once";
/// What `!garbage` writes to stdout: plain text, ANSI escapes, a bare number.
const GARBAGE_LINES: [&str; 3] = ["this is not json", "\x1b[31mred\x1b[0m", "42"];
/// The id of the `ask url` turn's URL-mode elicitation (per session, the
/// turn number appended).
const URL_ELICITATION_PREFIX: &str = "mock-elicitation-";
/// Where the `ask url` turn sends the person: a reserved name, so nothing
/// is ever fetched from it.
const URL_ELICITATION_TARGET: &str = "https://example.invalid/sandbox-agent/mock/authorize";
/// `!emit` lets the connection write what it has queued every this many
/// chunks. Short queues are faster: 16 to 256 measure alike, 4096 is 3x slower.
const EMIT_YIELD_EVERY: usize = 32;

impl MockAgent {
    /// `session/prompt`: registers the turn and runs it in a spawned task,
    /// which answers the prompt when the turn ends. Returns at once, so the
    /// dispatch loop stays free for `session/cancel` and the client's answers.
    pub(super) fn start_turn(
        self: &Arc<Self>,
        request: PromptRequest,
        responder: Responder<PromptResponse>,
        cx: ConnectionTo<Client>,
    ) -> Result<(), Error> {
        let text = prompt_text(&request.prompt);
        let mut behaviour = match Behaviour::from_prompt(&text) {
            Ok(behaviour) => behaviour,
            Err(error) => return responder.respond_with_error(error),
        };
        if let Behaviour::EchoTraceparent { traceparent } = &mut behaviour {
            *traceparent = request
                .meta
                .as_ref()
                .and_then(|meta| meta.get("traceparent"))
                .and_then(|value| value.as_str())
                .map(str::to_owned);
        }
        let (running, begun) = match self.begin_turn(&request.session_id, &text) {
            Ok(running) => running,
            Err(error) => return responder.respond_with_error(error),
        };
        // ACP's token usage, reported by `!usage` only.
        let usage = match behaviour {
            Behaviour::Usage { input, output } => {
                Some(Usage::new(input.saturating_add(output), input, output))
            }
            _ => None,
        };
        let turn = Turn {
            agent: self.clone(),
            cx: cx.clone(),
            session_id: request.session_id,
            turn_id: running.id,
        };
        let request_cancelled = responder.cancellation();
        let task = self.turns.track_future(async move {
            // The state file is written off the connection's thread (a
            // rename over a file can wait on the disk), before the turn
            // plays and before it is answered, as if inline.
            turn.agent.write_saved_off_thread(begun).await;
            let result = tokio::select! {
                biased;
                () = running.cancel.cancelled() => Ok(StopReason::Cancelled),
                // `$/cancel_request` for the prompt request itself.
                () = request_cancelled.cancelled() => Ok(StopReason::Cancelled),
                result = turn.play(behaviour, &text) => result,
            };
            let ended = turn.agent.end_turn(&turn.session_id, running.id);
            turn.agent.write_saved_off_thread(ended).await;
            // Fails only when the connection is gone.
            responder.respond_with_result(
                result.map(|stop_reason| PromptResponse::new(stop_reason).usage(usage)),
            )
        });
        cx.spawn(task)
    }

    /// Marks a turn as running in the session and records the user's
    /// message; returns the turn and the session's save to write.
    fn begin_turn(
        &self,
        session_id: &SessionId,
        text: &str,
    ) -> Result<(RunningTurn, Option<Encoded>), Error> {
        let mut sessions = self.sessions.lock();
        sessions.turns_started += 1;
        let id = sessions.turns_started;
        let Some(session) = sessions.by_id.get_mut(session_id) else {
            return Err(session_not_found(session_id));
        };
        if session.turn.is_some() {
            return Err(Error::new(
                ErrorCode::INVALID_REQUEST,
                "a prompt turn is already running in this session",
            ));
        }
        let running = RunningTurn {
            id,
            cancel: CancellationToken::new(),
        };
        session.turn = Some(running.clone());
        session.updated_at = SystemTime::now();
        session.history.push(Message {
            from: Speaker::User,
            text: text.to_owned(),
        });
        let saved = self.save(session_id, session);
        Ok((running, saved))
    }

    /// Marks the turn as over; returns the session's save to write, with
    /// the agent's reply (the reply's chunks are not saved one by one:
    /// `!emit` sends 100,000).
    fn end_turn(&self, session_id: &SessionId, turn_id: u64) -> Option<Encoded> {
        let mut sessions = self.sessions.lock();
        let mut saved = None;
        if let Some(session) = sessions.by_id.get_mut(session_id)
            && session.turn.as_ref().is_some_and(|turn| turn.id == turn_id)
        {
            session.turn = None;
            session.updated_at = SystemTime::now();
            saved = self.save(session_id, session);
        }
        saved
    }

    /// `session/cancel`: ends the session's running turn, if any, with stop
    /// reason `cancelled`.
    pub(super) fn cancel_turn(&self, session_id: &SessionId) {
        if let Some(session) = self.sessions.lock().by_id.get(session_id)
            && let Some(turn) = &session.turn
        {
            turn.cancel.cancel();
        }
    }

    /// Appends agent text to the session's history (one message per turn).
    fn record_agent_text(&self, session_id: &SessionId, text: &str) {
        if let Some(session) = self.sessions.lock().by_id.get_mut(session_id) {
            match session.history.last_mut() {
                Some(last) if last.from == Speaker::Agent => last.text.push_str(text),
                _ => session.history.push(Message {
                    from: Speaker::Agent,
                    text: text.to_owned(),
                }),
            }
        }
    }
}

/// `!fail [N [BYTES]]`: writes N lines `fail line <i>` (padded with a space
/// and `x`s to BYTES bytes when shorter), then `mock agent: failing on request` and,
/// when [`TEST_SECRET_ENV`] is set, `mock agent: using key <its value>`, to
/// stderr; returns the prompt's error: `-32603` "mock agent: failed on
/// request" with data `{"directive": "!fail"}`.
fn fail_with_stderr(lines: usize, bytes: usize) -> Error {
    use std::io::Write;
    let mut stderr = std::io::stderr().lock();
    for index in 1..=lines {
        let mut line = format!("fail line {index}");
        if bytes > line.len() {
            line.push(' ');
            line.push_str(&"x".repeat(bytes.saturating_sub(line.len())));
        }
        let _ = writeln!(stderr, "{line}");
    }
    let _ = writeln!(stderr, "mock agent: failing on request");
    if let Ok(secret) = std::env::var(TEST_SECRET_ENV) {
        let _ = writeln!(stderr, "mock agent: using key {secret}");
    }
    let _ = stderr.flush();
    Error::new(ErrorCode::INTERNAL_ERROR, "mock agent: failed on request")
        .data(serde_json::json!({ "directive": "!fail" }))
}

/// One prompt turn in its spawned task. Dropping it at any `.await` (on
/// `session/cancel`) is safe: requests to the client are awaited in their own
/// tasks (see [`Turn::ask_client`]).
struct Turn {
    agent: Arc<MockAgent>,
    cx: ConnectionTo<Client>,
    session_id: SessionId,
    /// The turn's number in this process (1 for its first turn).
    turn_id: u64,
}

impl Turn {
    /// Runs the turn and returns its stop reason; an error becomes the
    /// prompt's JSON-RPC error.
    async fn play(&self, behaviour: Behaviour, text: &str) -> Result<StopReason, Error> {
        match behaviour {
            Behaviour::Reply => self.reply(text),
            Behaviour::Tool => {
                self.read_tool_call()?;
                self.reply(text)
            }
            Behaviour::Permission => self.ask_permission().await,
            Behaviour::Crash { code } => self.crash(code).await,
            Behaviour::Garbage => {
                for line in GARBAGE_LINES {
                    self.write_raw_line(line).await?;
                }
                self.reply(text)
            }
            Behaviour::Stall => {
                // Only `session/cancel` ends it, or the client going away.
                self.cx.incoming_closed().await;
                Ok(StopReason::Cancelled)
            }
            Behaviour::Emit { chunks, bytes } => self.emit(chunks, bytes).await,
            Behaviour::Slow { chunks, interval } => self.slow(chunks, interval).await,
            Behaviour::Huge { bytes } => {
                self.write_raw_line(&"x".repeat(bytes)).await?;
                self.reply(text)
            }
            Behaviour::Fs { path } => self.read_file(&path).await,
            Behaviour::ReadFile { path, line, limit } => self.read_text(&path, line, limit).await,
            Behaviour::WriteFile { path, text } => self.write_text(&path, text).await,
            Behaviour::Terminal { line, kill } => self.run_in_terminal(&line, kill).await,
            Behaviour::Stderr { lines } => {
                for line in 1..=lines {
                    eprintln!("stderr line {line}");
                }
                self.reply(text)
            }
            Behaviour::Fail { lines, bytes } => Err(fail_with_stderr(lines, bytes)),
            Behaviour::AskQuestion => self.ask_question().await,
            Behaviour::AskUrl => self.ask_url().await,
            Behaviour::Usage { .. } => self.reply(text),
            Behaviour::EchoTraceparent { traceparent } => {
                let traceparent = traceparent.as_deref().unwrap_or("none");
                self.chunk(format!("traceparent: {traceparent}"))?;
                Ok(StopReason::EndTurn)
            }
        }
    }

    /// The plain reply: `Hello from the mock agent. You said: <text>`.
    fn reply(&self, text: &str) -> Result<StopReason, Error> {
        self.say(&format!("Hello from the mock agent. You said: {text}"))?;
        Ok(StopReason::EndTurn)
    }

    /// Streams `sentence` as one `agent_message_chunk` per word, each word
    /// followed by a space except the last.
    fn say(&self, sentence: &str) -> Result<(), Error> {
        let words: Vec<&str> = sentence.split_whitespace().collect();
        let last = words.len().saturating_sub(1);
        for (index, word) in words.iter().enumerate() {
            let chunk = if index == last {
                (*word).to_owned()
            } else {
                format!("{word} ")
            };
            self.chunk(chunk)?;
        }
        Ok(())
    }

    /// Sends one `agent_message_chunk` and records it for `session/load`.
    fn chunk(&self, text: String) -> Result<(), Error> {
        self.agent.record_agent_text(&self.session_id, &text);
        self.update(SessionUpdate::AgentMessageChunk(ContentChunk::new(
            ContentBlock::from(text),
        )))
    }

    fn update(&self, update: SessionUpdate) -> Result<(), Error> {
        notify(&self.cx, &self.session_id, update)
    }

    fn read_tool_call(&self) -> Result<(), Error> {
        let call = ToolCall::new(TOOL_CALL_ID, "Reading the mock file")
            .kind(ToolKind::Read)
            .status(ToolCallStatus::InProgress);
        self.update(SessionUpdate::ToolCall(call))?;
        self.tool_call_status(ToolCallStatus::Completed)
    }

    fn tool_call_status(&self, status: ToolCallStatus) -> Result<(), Error> {
        let fields = ToolCallUpdateFields::new().status(status);
        self.update(SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(
            TOOL_CALL_ID,
            fields,
        )))
    }

    async fn ask_permission(&self) -> Result<StopReason, Error> {
        const TITLE: &str = "Write to mock.txt";
        let call = ToolCall::new(TOOL_CALL_ID, TITLE)
            .kind(ToolKind::Edit)
            .status(ToolCallStatus::Pending);
        self.update(SessionUpdate::ToolCall(call))?;
        let fields = ToolCallUpdateFields::new()
            .title(TITLE)
            .kind(ToolKind::Edit)
            .status(ToolCallStatus::Pending);
        let options = vec![
            PermissionOption::new(
                ALLOW_OPTION_ID,
                "Allow once",
                PermissionOptionKind::AllowOnce,
            ),
            PermissionOption::new(
                "reject-once",
                "Reject once",
                PermissionOptionKind::RejectOnce,
            ),
        ];
        let request = RequestPermissionRequest::new(
            self.session_id.clone(),
            ToolCallUpdate::new(TOOL_CALL_ID, fields),
            options,
        );
        let granted = match self.ask_client(request).await?.outcome {
            RequestPermissionOutcome::Cancelled => return Ok(StopReason::Cancelled),
            RequestPermissionOutcome::Selected(selected) => {
                selected.option_id.0.as_ref() == ALLOW_OPTION_ID
            }
            // An outcome this schema version does not know: not a grant.
            _ => false,
        };
        if granted {
            self.tool_call_status(ToolCallStatus::Completed)?;
            self.say("Permission granted.")?;
        } else {
            self.tool_call_status(ToolCallStatus::Failed)?;
            self.say("Permission denied.")?;
        }
        Ok(StopReason::EndTurn)
    }

    /// `ask question`: a form elicitation with `name` (string, required),
    /// `color` (red, green or blue) and `confirm` (boolean); the reply names
    /// the answer (`-` for a field left out), or says it was declined or
    /// cancelled.
    async fn ask_question(&self) -> Result<StopReason, Error> {
        let schema = question_form();
        let mode = ElicitationMode::Form(ElicitationFormMode::new(
            ElicitationSessionScope::new(self.session_id.clone()),
            schema,
        ));
        let request = CreateElicitationRequest::new(mode, "The mock agent has a question");
        let answer = self.ask_client(request).await?.action;
        let reply = match answer {
            ElicitationAction::Accept(accepted) => {
                let content = accepted.content.unwrap_or_default();
                let field = |name: &str| content.get(name).map_or_else(|| "-".to_owned(), shown);
                format!(
                    "You answered: name={} color={} confirm={}",
                    field("name"),
                    field("color"),
                    field("confirm")
                )
            }
            ElicitationAction::Decline => "You declined the question.".to_owned(),
            ElicitationAction::Cancel => "You cancelled the question.".to_owned(),
            _ => "The answer was not one the mock knows.".to_owned(),
        };
        self.say(&reply)?;
        Ok(StopReason::EndTurn)
    }

    /// `ask url`: a URL-mode elicitation (id `mock-elicitation-<turn>`);
    /// after an accept, `elicitation/complete` for it, then the reply.
    async fn ask_url(&self) -> Result<StopReason, Error> {
        let id = format!("{URL_ELICITATION_PREFIX}{}", self.turn_id);
        let url = format!("{URL_ELICITATION_TARGET}?elicitation={id}");
        let mode = ElicitationMode::Url(ElicitationUrlMode::new(
            ElicitationSessionScope::new(self.session_id.clone()),
            id.clone(),
            url,
        ));
        let request = CreateElicitationRequest::new(mode, "Sign in to the mock service");
        let reply = match self.ask_client(request).await?.action {
            ElicitationAction::Accept(_) => {
                self.cx
                    .send_notification(CompleteElicitationNotification::new(id))?;
                "You completed the sign-in."
            }
            ElicitationAction::Decline => "You declined the sign-in.",
            ElicitationAction::Cancel => "You cancelled the sign-in.",
            _ => "The answer was not one the mock knows.",
        };
        self.say(reply)?;
        Ok(StopReason::EndTurn)
    }

    async fn read_file(&self, path: &Path) -> Result<StopReason, Error> {
        let request = ReadTextFileRequest::new(self.session_id.clone(), path);
        match self.ask_client(request).await {
            Ok(file) => self.say(&format!("Read {} bytes.", file.content.len()))?,
            Err(error) => self.say(&format!("fs error: {}", error.message))?,
        }
        Ok(StopReason::EndTurn)
    }

    /// `read file` / `read lines`: one chunk, `Read N bytes:` and a line
    /// feed, then the text; or `fs error CODE: MESSAGE`.
    async fn read_text(
        &self,
        path: &Path,
        line: Option<u32>,
        limit: Option<u32>,
    ) -> Result<StopReason, Error> {
        let request = ReadTextFileRequest::new(self.session_id.clone(), path)
            .line(line)
            .limit(limit);
        let reply = match self.ask_client(request).await {
            Ok(file) => format!("Read {} bytes:\n{}", file.content.len(), file.content),
            Err(error) => format!("fs error {}: {}", i32::from(error.code), error.message),
        };
        self.chunk(reply)?;
        Ok(StopReason::EndTurn)
    }

    /// `write file`: one chunk, `Wrote N bytes to PATH.` or
    /// `fs error CODE: MESSAGE`.
    async fn write_text(&self, path: &Path, text: String) -> Result<StopReason, Error> {
        let bytes = text.len();
        let request = WriteTextFileRequest::new(self.session_id.clone(), path, text);
        let reply = match self.ask_client(request).await {
            Ok(_) => format!("Wrote {bytes} bytes to {}.", path.display()),
            Err(error) => format!("fs error {}: {}", i32::from(error.code), error.message),
        };
        self.chunk(reply)?;
        Ok(StopReason::EndTurn)
    }

    /// `use terminal LINE`: `terminal/create` (`sh -c LINE`, no cwd: the
    /// session's), a `tool_call` whose content names the terminal,
    /// `terminal/wait_for_exit`, `terminal/output`, the tool call's update
    /// (`completed` for exit code 0, else `failed`), `terminal/release`,
    /// then one chunk: `Terminal exited with code C:` (or `killed by
    /// signal S:`, ` (output truncated)` when it was), a line feed and the
    /// output. A failed request ends it with one chunk
    /// `terminal error CODE: MESSAGE`. With `kill`, before the wait:
    /// `terminal/output` every 20 ms until it holds output (at most 10 s),
    /// then `terminal/kill`.
    async fn run_in_terminal(&self, line: &str, kill: bool) -> Result<StopReason, Error> {
        let reply = match self.terminal_round_trip(line, kill).await? {
            Ok(reply) => reply,
            Err(error) => format!(
                "terminal error {}: {}",
                i32::from(error.code),
                error.message
            ),
        };
        self.chunk(reply)?;
        Ok(StopReason::EndTurn)
    }

    /// The requests of [`Turn::run_in_terminal`]: the outer error ends the
    /// turn (the client connection is gone), the inner one is the client's
    /// answer to report.
    async fn terminal_round_trip(
        &self,
        line: &str,
        kill: bool,
    ) -> Result<Result<String, Error>, Error> {
        let create = CreateTerminalRequest::new(self.session_id.clone(), "sh")
            .args(vec!["-c".to_owned(), line.to_owned()]);
        let terminal = match self.ask_client(create).await {
            Ok(created) => created.terminal_id,
            Err(error) => return Ok(Err(error)),
        };
        let call = ToolCall::new(TERMINAL_TOOL_CALL_ID, line)
            .kind(ToolKind::Execute)
            .status(ToolCallStatus::InProgress)
            .content(vec![ToolCallContent::Terminal(Terminal::new(
                terminal.clone(),
            ))]);
        self.update(SessionUpdate::ToolCall(call))?;
        if kill && let Err(error) = self.kill_once_it_wrote(&terminal).await {
            return Ok(Err(error));
        }
        let wait = WaitForTerminalExitRequest::new(self.session_id.clone(), terminal.clone());
        let exit = match self.ask_client(wait).await {
            Ok(exited) => exited.exit_status,
            Err(error) => return Ok(Err(error)),
        };
        let read = TerminalOutputRequest::new(self.session_id.clone(), terminal.clone());
        let output = match self.ask_client(read).await {
            Ok(output) => output,
            Err(error) => return Ok(Err(error)),
        };
        let status = if exit.exit_code == Some(0) {
            ToolCallStatus::Completed
        } else {
            ToolCallStatus::Failed
        };
        self.update(SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(
            TERMINAL_TOOL_CALL_ID,
            ToolCallUpdateFields::new().status(status),
        )))?;
        let release = ReleaseTerminalRequest::new(self.session_id.clone(), terminal);
        if let Err(error) = self.ask_client(release).await {
            return Ok(Err(error));
        }
        let truncated = if output.truncated {
            " (output truncated)"
        } else {
            ""
        };
        Ok(Ok(format!(
            "Terminal exited {}{truncated}:\n{}",
            describe_exit(&exit),
            output.output
        )))
    }

    /// Polls `terminal/output` until the terminal wrote something (at most
    /// [`KILL_POLLS`] times, [`KILL_POLL_INTERVAL`] apart), then sends
    /// `terminal/kill`.
    async fn kill_once_it_wrote(&self, terminal: &TerminalId) -> Result<(), Error> {
        for _ in 0..KILL_POLLS {
            let read = TerminalOutputRequest::new(self.session_id.clone(), terminal.clone());
            if !self.ask_client(read).await?.output.is_empty() {
                break;
            }
            tokio::time::sleep(KILL_POLL_INTERVAL).await;
        }
        let kill = KillTerminalRequest::new(self.session_id.clone(), terminal.clone());
        self.ask_client(kill).await.map(|_| ())
    }

    /// `!crash`: the chunk, the stderr line, then the connection's foreground
    /// ends it and `run` exits the process once stdout is written. The prompt
    /// is never answered: this future never completes, and a responder
    /// dropped while the connection shuts down sends nothing.
    async fn crash(&self, code: i32) -> Result<StopReason, Error> {
        self.chunk("Crashing...".to_owned())?;
        eprintln!("mock agent: crashing on request");
        if self.agent.crash.send(code).is_err() {
            // The foreground is gone already; nothing would flush stdout.
            std::process::exit(code);
        }
        std::future::pending().await
    }

    async fn emit(&self, chunks: usize, bytes: usize) -> Result<StopReason, Error> {
        let text = "x".repeat(bytes);
        for index in 0..chunks {
            self.chunk(text.clone())?;
            // The connection's actors run in this same task: let them write
            // what is queued, and let a cancellation in.
            if index % EMIT_YIELD_EVERY == EMIT_YIELD_EVERY - 1 {
                tokio::task::yield_now().await;
            }
        }
        Ok(StopReason::EndTurn)
    }

    async fn slow(&self, chunks: usize, interval: Duration) -> Result<StopReason, Error> {
        for index in 1..=chunks {
            if index > 1 {
                tokio::time::sleep(interval).await;
            }
            self.chunk(format!("chunk-{index} "))?;
        }
        Ok(StopReason::EndTurn)
    }

    async fn write_raw_line(&self, line: &str) -> Result<(), Error> {
        self.agent
            .stdout
            .write_raw_line(line)
            .await
            .map_err(Error::into_internal_error)
    }

    /// Sends a request to the client and waits for its answer.
    ///
    /// The answer is awaited in a task of its own: if the turn is dropped
    /// (cancelled), the request stays pending, and the SDK does not send
    /// `$/cancel_request` for it. After `session/cancel` the client answers
    /// such requests itself (ACP: permission outcome `cancelled`).
    async fn ask_client<Req>(&self, request: Req) -> Result<Req::Response, Error>
    where
        Req: JsonRpcRequest,
        Req::Response: JsonRpcResponse + Send,
    {
        let (answer_tx, answer_rx) = oneshot::channel();
        let sent = self.cx.send_request(request);
        self.cx.spawn(async move {
            // The turn may be gone; its answer then goes nowhere.
            let _ = answer_tx.send(sent.block_task().await);
            Ok(())
        })?;
        answer_rx
            .await
            .map_err(|_| Error::internal_error().data("the connection closed"))?
    }
}

/// The form of the `ask question` turn: `name` (string, 1 to 64
/// characters, required), `color` (red, green or blue), `confirm`
/// (boolean), titled `About you` (research/contract.md, "The mock agent").
pub(crate) fn question_form() -> ElicitationSchema {
    ElicitationSchema::new()
        .title("About you".to_owned())
        .property(
            "name",
            StringPropertySchema::new()
                .title("Name".to_owned())
                .min_length(1)
                .max_length(64),
            true,
        )
        .property(
            "color",
            StringPropertySchema::new()
                .title("Favourite colour".to_owned())
                .enum_values(vec!["red".into(), "green".into(), "blue".into()]),
            false,
        )
        .property(
            "confirm",
            BooleanPropertySchema::new().title("Confirm".to_owned()),
            false,
        )
}

/// An answered field as the `ask question` reply shows it.
fn shown(value: &ElicitationContentValue) -> String {
    match value {
        ElicitationContentValue::String(text) => text.clone(),
        ElicitationContentValue::Integer(number) => number.to_string(),
        ElicitationContentValue::Number(number) => number.to_string(),
        ElicitationContentValue::Boolean(flag) => flag.to_string(),
        ElicitationContentValue::StringArray(items) => items.join(","),
        _ => "?".to_owned(),
    }
}

/// `with code C`, `killed by signal S`, or `without a status` (neither).
fn describe_exit(exit: &TerminalExitStatus) -> String {
    match (&exit.exit_code, &exit.signal) {
        (Some(code), _) => format!("with code {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => "without a status".to_owned(),
    }
}
