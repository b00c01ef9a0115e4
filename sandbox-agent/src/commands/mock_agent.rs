//! The built-in mock agent (`sandbox-agent mock-agent`, agent id `mock`).
//!
//! A real ACP agent (protocol v1, agent side of the `agent-client-protocol`
//! crate) speaking newline-delimited JSON-RPC on stdin/stdout. It is
//! deterministic: the same prompt gives the same updates in the same order.
//! Its behaviour is specified in `research/contract.md`, section "The mock
//! agent"; [`Behaviour::from_prompt`] is the one place that maps prompt text to
//! what a prompt turn does.
//!
//! How it is put together:
//! - stdin is read by tokio and handed to the SDK's [`Lines`] transport;
//! - stdout has exactly one writer, fed by one buffer of whole lines
//!   ([`Stdout`]): the SDK's serialized messages and the raw lines of
//!   `!garbage` / `!huge` go through the same buffer, so a raw line can never
//!   split a JSON line;
//! - request handlers run in the SDK's dispatch loop and never wait for the
//!   client; each prompt turn runs in a task spawned with `cx.spawn`, so
//!   `session/cancel` is handled while a turn runs;
//! - sessions live in one shared map ([`MockAgent::sessions`]); with
//!   `--state-dir` each is also kept in a file of its own ([`StateDir`]), so
//!   `session/load` in a later process (after a runtime restart) finds it.

use std::borrow::Cow;
use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    AgentCapabilities, AuthMethod, AuthMethodAgent, AuthenticateRequest, AuthenticateResponse,
    CancelNotification, ContentBlock, ContentChunk, CurrentModeUpdate, ForkSessionRequest,
    ForkSessionResponse, Implementation, InitializeRequest, InitializeResponse,
    ListSessionsRequest, ListSessionsResponse, LoadSessionRequest, LoadSessionResponse,
    NewSessionRequest, NewSessionResponse, PermissionOption, PermissionOptionKind, PromptRequest,
    PromptResponse, ReadTextFileRequest, RequestPermissionOutcome, RequestPermissionRequest,
    ResumeSessionRequest, ResumeSessionResponse, SessionCapabilities, SessionConfigOption,
    SessionConfigOptionCategory, SessionConfigSelectOption, SessionConfigValueId,
    SessionForkCapabilities, SessionId, SessionInfo, SessionInfoUpdate, SessionListCapabilities,
    SessionMode, SessionModeId, SessionModeState, SessionNotification, SessionResumeCapabilities,
    SessionUpdate, SetSessionConfigOptionRequest, SetSessionConfigOptionResponse,
    SetSessionModeRequest, SetSessionModeResponse, StopReason, ToolCall, ToolCallStatus,
    ToolCallUpdate, ToolCallUpdateFields, ToolKind,
};
use agent_client_protocol::v1::{self, ConnectionTo, Responder};
use agent_client_protocol::{
    Agent, Client, ConnectTo, Error, ErrorCode, HandleDispatchFrom, JsonRpcRequest,
    JsonRpcResponse, Lines, on_receive_notification, on_receive_request,
};
use clap::Args;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Knobs of `sandbox-agent mock-agent` that make it misbehave from the start.
#[derive(Debug, Clone, Args)]
pub struct MockAgentArgs {
    /// Exit with this code before reading anything (an agent that dies at once).
    #[arg(long, value_name = "CODE")]
    pub exit_at_start: Option<i32>,
    /// Announce each new session with a `session/update` before answering `session/new`.
    #[arg(long)]
    pub announce_session_early: bool,
    /// Session ids are this text followed by a UUID. ACP session ids are
    /// arbitrary strings; this makes ones with `/`, spaces or non-ASCII text.
    #[arg(long, value_name = "TEXT", default_value = "mock-")]
    pub session_id_prefix: String,
    /// Answer every `session/new` with this session id (an agent whose ids
    /// collide with another agent's; a later session replaces an earlier one).
    #[arg(long, value_name = "ID", conflicts_with = "session_id_prefix")]
    pub session_id: Option<String>,
    /// Advertise the auth method METHOD and answer session requests with
    /// `-32000` "Authentication required" until `authenticate {methodId:
    /// METHOD}` came (an agent that needs a credential).
    #[arg(long, value_name = "METHOD")]
    pub require_auth: Option<String>,
    /// Keep every session (id, cwd, mode, model, the history `session/load`
    /// replays) in DIR, one JSON file per session, so a later process can
    /// load a session of an earlier one. Created when missing.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
}

/// `agentInfo.name` in the `initialize` result.
const AGENT_NAME: &str = "sandbox-agent-mock";
/// The session modes: (id, name). The first is the current mode of a new session.
const MODES: [(&str, &str); 2] = [("default", "Default"), ("plan", "Plan")];
/// The id of the model config option.
const MODEL_CONFIG_ID: &str = "model";
/// The models: (id, name). The first is the current model of a new session.
const MODELS: [(&str, &str); 2] = [("mock-fast", "Mock fast"), ("mock-smart", "Mock smart")];
/// The tool call id used by the `tool` and `permission` turns.
const TOOL_CALL_ID: &str = "mock-tool-1";
/// The id of the permission option that grants the `permission` turn's
/// write; any other answer denies it.
const ALLOW_OPTION_ID: &str = "allow-once";
/// What `!garbage` writes to stdout: plain text, ANSI escapes, a bare number.
const GARBAGE_LINES: [&str; 3] = ["this is not json", "\x1b[31mred\x1b[0m", "42"];
/// Exit code of `!crash` without an argument.
const DEFAULT_CRASH_CODE: i32 = 3;
/// Bytes buffered for stdout before senders wait for the writer.
const STDOUT_HIGH_WATER_BYTES: usize = 1024 * 1024;
/// Buffer for reading stdin, in bytes.
const STDIN_BUFFER_BYTES: usize = 64 * 1024;
/// `!emit` lets the connection write what it has queued every this many
/// chunks. Short queues are faster: 16 to 256 measure alike, 4096 is 3x slower.
const EMIT_YIELD_EVERY: usize = 32;
/// How long `!crash` waits for stdout to be written before exiting anyway.
const CRASH_DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs the mock agent on this process's stdin/stdout until stdin closes.
///
/// With `--exit-at-start CODE` the process exits with CODE before reading
/// anything. When stdin closes, prompt turns still running are allowed to
/// finish (a turn waiting for the client ends, since the client is gone), then
/// this returns. `!crash [CODE]` ends the process with CODE, after everything
/// queued for stdout has been written; it does not return.
///
/// # Errors
/// An I/O error of stdin or stdout, or a failure of the ACP connection
/// (reported by the SDK, wrapped as [`io::ErrorKind::Other`]).
pub async fn run(args: MockAgentArgs) -> io::Result<()> {
    if let Some(code) = args.exit_at_start {
        std::process::exit(code);
    }
    if let Some(dir) = &args.state_dir {
        std::fs::create_dir_all(dir).map_err(|error| {
            io::Error::new(
                error.kind(),
                format!("--state-dir {}: {error}", dir.display()),
            )
        })?;
    }
    let (stdout, writer) = Stdout::new();
    // The writer runs in a task of its own, so writing overlaps serializing.
    let writer = tokio::spawn(writer);
    let (crash_tx, crash_rx) = tokio::sync::mpsc::unbounded_channel();
    let agent = Arc::new(MockAgent::new(&args, stdout.clone(), crash_tx));
    let transport = Lines::new(stdout.sink(), stdin_lines());

    let ending = serve(agent, transport, crash_rx).await;
    // The connection has queued its last line: write out the rest and stop.
    stdout.close();
    if let Ok(Ending::Crash(code)) = ending {
        exit_once_written(code, writer).await;
    }
    // A write error explains a failed connection better than the connection's error.
    writer
        .await
        .unwrap_or_else(|error| Err(io::Error::other(error)))?;
    ending.map_err(io::Error::other)?;
    Ok(())
}

/// `!crash`: exits with `code` once the writer has written everything, or
/// after [`CRASH_DRAIN_TIMEOUT`] if stdout is stuck (nobody reading).
async fn exit_once_written(code: i32, writer: tokio::task::JoinHandle<io::Result<()>>) -> ! {
    match tokio::time::timeout(CRASH_DRAIN_TIMEOUT, writer).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(error))) => eprintln!("mock agent: writing stdout failed: {error}"),
        Ok(Err(error)) => eprintln!("mock agent: the stdout writer failed: {error}"),
        Err(_) => eprintln!("mock agent: stdout not written after {CRASH_DRAIN_TIMEOUT:?}"),
    }
    std::process::exit(code)
}

/// Why the connection ended.
enum Ending {
    /// stdin reached EOF and every prompt turn has finished.
    StdinClosed,
    /// A `!crash` turn asked for the process to exit with this code.
    Crash(i32),
}

/// Runs the ACP connection: the handlers, and a foreground that ends on a
/// crash request, on stdin EOF once the running turns are done, or when
/// stdout fails. When the
/// foreground ends, the SDK writes out everything already queued and closes
/// the transport before this returns.
async fn serve(
    agent: Arc<MockAgent>,
    transport: impl ConnectTo<Agent> + 'static,
    crash_rx: tokio::sync::mpsc::UnboundedReceiver<i32>,
) -> Result<Ending, Error> {
    let turns = agent.turns.clone();
    let stdout = agent.stdout.clone();
    handlers(&agent)
        .connect_with(transport, async move |cx: ConnectionTo<Client>| {
            foreground(cx, crash_rx, turns, stdout).await
        })
        .await
}

/// Every request and notification handler of the agent, in dispatch order;
/// each body is one call into [`MockAgent`].
///
/// One builder chain in one non-generic function on purpose: a chain split
/// across functions that take and return `impl HandleDispatchFrom` names
/// every closure after the whole chain so far, and the debug info of those
/// type names grew the debug binary to 3.5 GB.
fn handlers(agent: &Arc<MockAgent>) -> v1::Builder<Agent, impl HandleDispatchFrom<Client>> {
    Agent
        .v1()
        .name(AGENT_NAME)
        .on_receive_request(
            {
                let agent = agent.clone();
                async move |request: InitializeRequest, responder: Responder<_>, _cx| {
                    responder.respond(agent.initialize(&request))?;
                    // The SDK counts the connection as initialized only once its
                    // outgoing side has taken this answer. Yield (holding the
                    // dispatch loop) so that happens before the next message is
                    // dispatched: a client that does not wait for the answer
                    // (`printf ... | sandbox-agent mock-agent`) is not refused.
                    tokio::task::yield_now().await;
                    Ok(())
                }
            },
            on_receive_request!(),
        )
        .on_receive_request(
            {
                let agent = agent.clone();
                async move |request: AuthenticateRequest, responder: Responder<_>, _cx| {
                    responder.respond_with_result(agent.authenticate(&request))
                }
            },
            on_receive_request!(),
        )
        .on_receive_request(
            {
                let agent = agent.clone();
                async move |request: NewSessionRequest, responder: Responder<_>, cx| {
                    responder.respond_with_result(agent.new_session(request, &cx))
                }
            },
            on_receive_request!(),
        )
        .on_receive_request(
            {
                let agent = agent.clone();
                async move |request: LoadSessionRequest, responder: Responder<_>, cx| {
                    responder.respond_with_result(agent.load_session(&request, &cx))
                }
            },
            on_receive_request!(),
        )
        .on_receive_request(
            {
                let agent = agent.clone();
                async move |request: ResumeSessionRequest, responder: Responder<_>, _cx| {
                    responder.respond_with_result(agent.resume_session(&request))
                }
            },
            on_receive_request!(),
        )
        .on_receive_request(
            {
                let agent = agent.clone();
                async move |request: ForkSessionRequest, responder: Responder<_>, _cx| {
                    responder.respond_with_result(agent.fork_session(request))
                }
            },
            on_receive_request!(),
        )
        .on_receive_request(
            {
                let agent = agent.clone();
                async move |request: ListSessionsRequest, responder: Responder<_>, _cx| {
                    responder.respond(agent.list_sessions(&request))
                }
            },
            on_receive_request!(),
        )
        .on_receive_request(
            {
                let agent = agent.clone();
                async move |request: SetSessionModeRequest, responder: Responder<_>, cx| {
                    responder.respond_with_result(agent.set_mode(&request, &cx))
                }
            },
            on_receive_request!(),
        )
        .on_receive_request(
            {
                let agent = agent.clone();
                async move |request: SetSessionConfigOptionRequest, responder: Responder<_>, _cx| {
                    responder.respond_with_result(agent.set_config_option(&request))
                }
            },
            on_receive_request!(),
        )
        .on_receive_request(
            {
                let agent = agent.clone();
                async move |request: SetModelRequest, responder: Responder<_>, _cx| {
                    responder.respond_with_result(agent.set_model(&request))
                }
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |request: EchoRequest, responder: Responder<_>, _cx| {
                responder.respond(EchoResponse(request.0))
            },
            on_receive_request!(),
        )
        .on_receive_request(
            {
                let agent = agent.clone();
                async move |request: PromptRequest, responder: Responder<_>, cx| {
                    agent.start_turn(request, responder, cx)
                }
            },
            on_receive_request!(),
        )
        .on_receive_notification(
            {
                let agent = agent.clone();
                async move |notification: CancelNotification, _cx| {
                    agent.cancel_turn(&notification.session_id);
                    Ok(())
                }
            },
            on_receive_notification!(),
        )
}

/// The connection's foreground: ends on a crash request, on stdin EOF once
/// the running turns are done, or when stdout fails.
async fn foreground(
    cx: ConnectionTo<Client>,
    mut crash_rx: tokio::sync::mpsc::UnboundedReceiver<i32>,
    turns: TaskTracker,
    stdout: Stdout,
) -> Result<Ending, Error> {
    tokio::select! {
        Some(code) = crash_rx.recv() => Ok(Ending::Crash(code)),
        () = async {
            cx.incoming_closed().await;
            turns.close();
            turns.wait().await;
        } => Ok(Ending::StdinClosed),
        // Nothing can reach the client any more.
        () = stdout.failed() => Err(Error::into_internal_error(writer_stopped())),
    }
}
// ---------------------------------------------------------------------------
// Transport: stdin lines in, one stdout writer out
// ---------------------------------------------------------------------------

/// The incoming side of the transport: stdin split into lines.
///
/// Line ends (`\n`, `\r\n`) are stripped and blank lines skipped. Bytes that
/// are not UTF-8 are replaced (U+FFFD) instead of ending the connection; a
/// line that is then not JSON gets the SDK's parse error.
fn stdin_lines() -> impl futures::Stream<Item = io::Result<String>> + Send + 'static {
    let reader = tokio::io::BufReader::with_capacity(STDIN_BUFFER_BYTES, tokio::io::stdin());
    futures::stream::try_unfold((reader, Vec::new()), |(mut reader, mut bytes)| async move {
        loop {
            bytes.clear();
            if reader.read_until(b'\n', &mut bytes).await? == 0 {
                return Ok(None);
            }
            let line = String::from_utf8_lossy(&bytes);
            let line = line.trim_end_matches(['\n', '\r']);
            if !line.trim().is_empty() {
                let line = line.to_owned();
                return Ok(Some((line, (reader, bytes))));
            }
        }
    })
}

/// The only way to stdout: one buffer of whole lines, emptied by one writer.
///
/// The SDK's transport (through [`Stdout::sink`]) and the raw-line directives
/// (through [`Stdout::write_raw_line`]) append whole lines to the same buffer
/// under its lock, so lines never interleave and go out in the order they
/// were added. Lines are copied in by the thread that made them and the
/// writer takes the buffer a batch at a time: no allocation crosses threads
/// and a burst costs few writes. Clones share the buffer.
#[derive(Clone)]
struct Stdout {
    shared: Arc<StdoutShared>,
}

struct StdoutShared {
    pending: Mutex<PendingLines>,
    /// Wakes the writer when lines are added or the buffer is closed.
    changed: tokio::sync::Notify,
    /// Cancelled when the writer stops on an error.
    failed: CancellationToken,
}

/// What the writer has not taken yet.
#[derive(Default)]
struct PendingLines {
    /// Whole lines, each ending in `\n`.
    bytes: Vec<u8>,
    /// Set by [`Stdout::close`]: the writer ends once `bytes` is written.
    closed: bool,
    /// Set when the writer stopped on an error: adding lines fails from then on.
    failed: bool,
    /// Senders waiting for `bytes` to drop below [`STDOUT_HIGH_WATER_BYTES`].
    waiting_for_room: Vec<Waker>,
}

impl Stdout {
    /// The buffer and its writer, a future to poll until it ends: after
    /// [`Stdout::close`] once everything added is written and flushed, or at
    /// the first write error.
    fn new() -> (Self, impl Future<Output = io::Result<()>>) {
        let stdout = Self {
            shared: Arc::new(StdoutShared {
                pending: Mutex::default(),
                changed: tokio::sync::Notify::new(),
                failed: CancellationToken::new(),
            }),
        };
        let writer = write_out(stdout.shared.clone());
        (stdout, writer)
    }

    /// The outgoing side of the SDK's [`Lines`] transport.
    fn sink(&self) -> StdoutSink {
        StdoutSink(self.clone())
    }

    /// Adds one raw line (not JSON-RPC); `line` has no line end.
    async fn write_raw_line(&self, line: &str) -> io::Result<()> {
        std::future::poll_fn(|cx| self.poll_room(cx)).await?;
        self.push_line(line)
    }

    /// Completes when the writer has stopped on an error (stdout is gone).
    async fn failed(&self) {
        self.shared.failed.cancelled().await;
    }

    /// No more lines: the writer ends once everything added is written.
    fn close(&self) {
        self.shared.pending.lock().closed = true;
        self.shared.changed.notify_one();
    }

    /// Ready when the buffer has room for another line.
    fn poll_room(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut pending = self.shared.pending.lock();
        if pending.failed {
            return Poll::Ready(Err(writer_stopped()));
        }
        if pending.bytes.len() < STDOUT_HIGH_WATER_BYTES {
            return Poll::Ready(Ok(()));
        }
        pending.waiting_for_room.push(cx.waker().clone());
        Poll::Pending
    }

    fn push_line(&self, line: &str) -> io::Result<()> {
        {
            let mut pending = self.shared.pending.lock();
            if pending.failed {
                return Err(writer_stopped());
            }
            pending.bytes.extend_from_slice(line.as_bytes());
            pending.bytes.push(b'\n');
        }
        self.shared.changed.notify_one();
        Ok(())
    }
}

/// [`Stdout`] as the `Sink<String>` of the SDK's [`Lines`] transport.
///
/// A line counts as sent once it is in the buffer: `poll_flush` does not wait
/// for the writer, which flushes on its own whenever the buffer runs empty.
/// `run` waits for the writer after the connection ends.
struct StdoutSink(Stdout);

impl futures::Sink<String> for StdoutSink {
    type Error = io::Error;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.0.poll_room(cx)
    }

    fn start_send(self: Pin<&mut Self>, line: String) -> io::Result<()> {
        self.0.push_line(&line)
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_close(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

fn writer_stopped() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "the stdout writer has stopped")
}

/// The writer: takes everything buffered, writes it, and flushes whenever the
/// buffer is empty, so a single message goes out at once and a burst of
/// lines costs one write per batch.
async fn write_out(shared: Arc<StdoutShared>) -> io::Result<()> {
    let mut out = tokio::io::stdout();
    let mut batch = Vec::with_capacity(STDOUT_HIGH_WATER_BYTES);
    let result = loop {
        let (closed, waiting) = {
            let mut pending = shared.pending.lock();
            std::mem::swap(&mut batch, &mut pending.bytes);
            (
                pending.closed,
                std::mem::take(&mut pending.waiting_for_room),
            )
        };
        waiting.into_iter().for_each(Waker::wake);
        if batch.is_empty() {
            if let Err(error) = out.flush().await {
                break Err(error);
            }
            if closed {
                break Ok(());
            }
            // `notify_one` keeps a permit, so a line added since the swap is not missed.
            shared.changed.notified().await;
            continue;
        }
        if let Err(error) = out.write_all(&batch).await {
            break Err(error);
        }
        batch.clear();
    };
    if result.is_err() {
        let waiting = {
            let mut pending = shared.pending.lock();
            pending.failed = true;
            std::mem::take(&mut pending.waiting_for_room)
        };
        waiting.into_iter().for_each(Waker::wake);
        shared.failed.cancel();
    }
    result
}

// ---------------------------------------------------------------------------
// Methods outside the v1 schema
// ---------------------------------------------------------------------------

/// `session/set_model {sessionId, modelId}`: the model selector of agents
/// that predate config options. Not in the v1 schema.
#[derive(Debug, Clone, Serialize, Deserialize, agent_client_protocol::JsonRpcRequest)]
#[serde(rename_all = "camelCase")]
#[request(method = "session/set_model", response = SetModelResponse)]
struct SetModelRequest {
    session_id: SessionId,
    model_id: SessionConfigValueId,
}

/// The result of `session/set_model`: `{}`.
#[derive(Debug, Clone, Serialize, Deserialize, agent_client_protocol::JsonRpcResponse)]
struct SetModelResponse {}

/// `_mock/echo`: any params, answered as the result (the `roundtrip` benchmark).
#[derive(Debug, Clone, Serialize, Deserialize, agent_client_protocol::JsonRpcRequest)]
#[request(method = "_mock/echo", response = EchoResponse)]
struct EchoRequest(serde_json::Value);

/// The result of `_mock/echo`: the request's params.
#[derive(Debug, Clone, Serialize, Deserialize, agent_client_protocol::JsonRpcResponse)]
struct EchoResponse(serde_json::Value);

// ---------------------------------------------------------------------------
// Agent state and the session methods
// ---------------------------------------------------------------------------

/// The agent: its sessions and what prompt turns need to reach the outside.
struct MockAgent {
    /// `--announce-session-early`: `session/new` sends a `session_info_update`
    /// for the new session before its answer.
    announce_session_early: bool,
    /// `--session-id-prefix`: what every session id starts with.
    session_id_prefix: String,
    /// `--session-id`: every new session gets this id.
    fixed_session_id: Option<String>,
    /// Every session this process knows, shared by handlers and turn tasks.
    /// Never held across an `.await`.
    sessions: Mutex<Sessions>,
    /// For the raw (non-JSON) lines of `!garbage` and `!huge`.
    stdout: Stdout,
    /// A `!crash` turn sends its exit code here; the connection's foreground
    /// receives it and ends the connection.
    crash: tokio::sync::mpsc::UnboundedSender<i32>,
    /// The running prompt turns, so stdin EOF can wait for them.
    turns: TaskTracker,
    /// `--require-auth`: the auth method session requests wait for.
    require_auth: Option<String>,
    /// Whether `authenticate` with that method came.
    authenticated: AtomicBool,
    /// `--state-dir`: where sessions are kept for later processes.
    state: Option<StateDir>,
}

/// The session map, with a counter that orders sessions by creation.
#[derive(Default)]
struct Sessions {
    by_id: HashMap<SessionId, Session>,
    created: u64,
    turns_started: u64,
}

/// One session.
struct Session {
    /// Creation order, for a stable `session/list`.
    created: u64,
    cwd: PathBuf,
    mode: SessionModeId,
    model: SessionConfigValueId,
    /// What `session/load` replays, in order.
    history: Vec<Message>,
    updated_at: SystemTime,
    /// The prompt turn in progress, if any.
    turn: Option<RunningTurn>,
}

/// A message of a session's history (in a state file: `{"from": "user" |
/// "agent", "text": …}`).
#[derive(Clone, Serialize, Deserialize)]
struct Message {
    from: Speaker,
    text: String,
}

#[derive(Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Speaker {
    User,
    Agent,
}

/// The handle of a running prompt turn.
#[derive(Clone)]
struct RunningTurn {
    /// Tells the turn apart from a later one of the same session.
    id: u64,
    /// Cancelled by `session/cancel`.
    cancel: CancellationToken,
}

/// What the answers to `session/new`, `load`, `resume` and `fork` report
/// about a session.
struct SessionState {
    modes: SessionModeState,
    config_options: Vec<SessionConfigOption>,
}

impl MockAgent {
    fn new(
        args: &MockAgentArgs,
        stdout: Stdout,
        crash: tokio::sync::mpsc::UnboundedSender<i32>,
    ) -> Self {
        Self {
            announce_session_early: args.announce_session_early,
            session_id_prefix: args.session_id_prefix.clone(),
            fixed_session_id: args.session_id.clone(),
            sessions: Mutex::default(),
            stdout,
            crash,
            turns: TaskTracker::new(),
            require_auth: args.require_auth.clone(),
            authenticated: AtomicBool::new(false),
            state: args.state_dir.clone().map(|dir| StateDir { dir }),
        }
    }

    fn initialize(&self, _request: &InitializeRequest) -> InitializeResponse {
        let sessions = SessionCapabilities::new()
            .list(SessionListCapabilities::new())
            .resume(SessionResumeCapabilities::new())
            .fork(SessionForkCapabilities::new());
        let auth_methods = self
            .require_auth
            .iter()
            .map(|id| {
                AuthMethod::Agent(
                    AuthMethodAgent::new(id.clone(), "Mock credential")
                        .description("The mock agent's --require-auth method".to_owned()),
                )
            })
            .collect();
        InitializeResponse::new(ProtocolVersion::V1)
            .agent_capabilities(
                AgentCapabilities::new()
                    .load_session(true)
                    .session_capabilities(sessions),
            )
            .auth_methods(auth_methods)
            .agent_info(Implementation::new(AGENT_NAME, env!("CARGO_PKG_VERSION")))
    }

    /// Accepts the `--require-auth` method; any other is invalid params.
    fn authenticate(&self, request: &AuthenticateRequest) -> Result<AuthenticateResponse, Error> {
        if self.require_auth.as_deref() != Some(&*request.method_id.0) {
            return Err(Error::invalid_params()
                .data(format!("unknown auth method {:?}", request.method_id.0)));
        }
        self.authenticated.store(true, Ordering::Release);
        Ok(AuthenticateResponse::new())
    }

    /// `-32000` "Authentication required" while `--require-auth` waits for
    /// its `authenticate`.
    fn check_authenticated(&self) -> Result<(), Error> {
        if self.require_auth.is_some() && !self.authenticated.load(Ordering::Acquire) {
            return Err(Error::auth_required());
        }
        Ok(())
    }

    fn new_session(
        &self,
        request: NewSessionRequest,
        cx: &ConnectionTo<Client>,
    ) -> Result<NewSessionResponse, Error> {
        self.check_authenticated()?;
        let session = Session::new(request.cwd);
        let (state, updated_at) = (session.state(), session.updated_at);
        let session_id = self.add_session(session);
        if self.announce_session_early {
            let update = SessionInfoUpdate::new().updated_at(rfc3339(updated_at));
            notify(cx, &session_id, SessionUpdate::SessionInfoUpdate(update))?;
        }
        Ok(NewSessionResponse::new(session_id)
            .modes(state.modes)
            .config_options(state.config_options))
    }

    fn load_session(
        &self,
        request: &LoadSessionRequest,
        cx: &ConnectionTo<Client>,
    ) -> Result<LoadSessionResponse, Error> {
        self.check_authenticated()?;
        self.restore(&request.session_id)?;
        let (history, state) = self.with_session(&request.session_id, |session| {
            (session.history.clone(), session.state())
        })?;
        for message in &history {
            notify(cx, &request.session_id, message.replay())?;
        }
        Ok(LoadSessionResponse::new()
            .modes(state.modes)
            .config_options(state.config_options))
    }

    fn resume_session(
        &self,
        request: &ResumeSessionRequest,
    ) -> Result<ResumeSessionResponse, Error> {
        self.check_authenticated()?;
        self.restore(&request.session_id)?;
        let state = self.with_session(&request.session_id, |session| session.state())?;
        Ok(ResumeSessionResponse::new()
            .modes(state.modes)
            .config_options(state.config_options))
    }

    fn fork_session(&self, request: ForkSessionRequest) -> Result<ForkSessionResponse, Error> {
        self.check_authenticated()?;
        self.restore(&request.session_id)?;
        let fork = self.with_session(&request.session_id, |parent| parent.fork(request.cwd))?;
        let state = fork.state();
        let session_id = self.add_session(fork);
        Ok(ForkSessionResponse::new(session_id)
            .modes(state.modes)
            .config_options(state.config_options))
    }

    fn list_sessions(&self, request: &ListSessionsRequest) -> ListSessionsResponse {
        let sessions = self.sessions.lock();
        let mut listed: Vec<(&SessionId, &Session)> = sessions
            .by_id
            .iter()
            .filter(|(_, session)| request.cwd.as_ref().is_none_or(|cwd| &session.cwd == cwd))
            .collect();
        listed.sort_by_key(|(_, session)| session.created);
        ListSessionsResponse::new(
            listed
                .into_iter()
                .map(|(id, session)| {
                    SessionInfo::new(id.clone(), session.cwd.clone())
                        .updated_at(rfc3339(session.updated_at))
                })
                .collect(),
        )
    }

    /// Answers after queueing `current_mode_update`, so a client holding the
    /// answer has the update too.
    fn set_mode(
        &self,
        request: &SetSessionModeRequest,
        cx: &ConnectionTo<Client>,
    ) -> Result<SetSessionModeResponse, Error> {
        let mode = known_id(&MODES, &request.mode_id.0, "mode")?;
        self.with_session(&request.session_id, |session| {
            session.mode = SessionModeId::new(mode);
            session.updated_at = SystemTime::now();
            self.save(&request.session_id, session);
        })?;
        let update = CurrentModeUpdate::new(SessionModeId::new(mode));
        notify(
            cx,
            &request.session_id,
            SessionUpdate::CurrentModeUpdate(update),
        )?;
        Ok(SetSessionModeResponse::new())
    }

    fn set_config_option(
        &self,
        request: &SetSessionConfigOptionRequest,
    ) -> Result<SetSessionConfigOptionResponse, Error> {
        if request.config_id.0.as_ref() != MODEL_CONFIG_ID {
            return Err(Error::invalid_params().data(format!(
                "unknown config option `{}`; the mock agent has `{MODEL_CONFIG_ID}`",
                request.config_id.0
            )));
        }
        let Some(value) = request.value.as_value_id() else {
            return Err(Error::invalid_params().data("the `model` option takes a value id"));
        };
        let state = self.select_model(&request.session_id, value)?;
        Ok(SetSessionConfigOptionResponse::new(state.config_options))
    }

    fn set_model(&self, request: &SetModelRequest) -> Result<SetModelResponse, Error> {
        self.select_model(&request.session_id, &request.model_id)?;
        Ok(SetModelResponse {})
    }

    fn select_model(
        &self,
        session_id: &SessionId,
        model: &SessionConfigValueId,
    ) -> Result<SessionState, Error> {
        let model = known_id(&MODELS, &model.0, "model")?;
        self.with_session(session_id, |session| {
            session.model = SessionConfigValueId::new(model);
            session.updated_at = SystemTime::now();
            self.save(session_id, session);
            session.state()
        })
    }

    /// Stores a session under a new id (`mock-<uuid>`, or the fixed
    /// `--session-id`) and returns the id.
    fn add_session(&self, mut session: Session) -> SessionId {
        let session_id = SessionId::new(match &self.fixed_session_id {
            Some(id) => id.clone(),
            None => format!("{}{}", self.session_id_prefix, uuid::Uuid::new_v4()),
        });
        let mut sessions = self.sessions.lock();
        sessions.created += 1;
        session.created = sessions.created;
        self.save(&session_id, &session);
        sessions.by_id.insert(session_id.clone(), session);
        session_id
    }

    /// Makes a session of an earlier process known again: when `id` is not
    /// in memory, reads it from `--state-dir` (if set). A session in neither
    /// place is left to the caller's "session not found".
    ///
    /// # Errors
    /// Internal error (`-32603`) naming the file when it exists but cannot
    /// be read or parsed.
    fn restore(&self, id: &SessionId) -> Result<(), Error> {
        let Some(state) = &self.state else {
            return Ok(());
        };
        if self.sessions.lock().by_id.contains_key(id) {
            return Ok(());
        }
        // Read without the lock: a long history is a large file.
        let mut session = match state.load(id) {
            Ok(Some(session)) => session,
            Ok(None) => return Ok(()),
            Err(error) => {
                return Err(Error::internal_error().data(format!(
                    "cannot read session {:?} from {}: {error}",
                    id.0,
                    state.path(id).display()
                )));
            }
        };
        let mut sessions = self.sessions.lock();
        sessions.created += 1;
        session.created = sessions.created;
        // A `session/load` that raced this one restored it first.
        sessions.by_id.entry(id.clone()).or_insert(session);
        Ok(())
    }

    /// Writes a session to `--state-dir`, if set, after each change of it
    /// (called with the session map locked, so writes of one session land
    /// in order). A failure is reported on stderr; the session goes on in
    /// memory.
    fn save(&self, id: &SessionId, session: &Session) {
        if let Some(state) = &self.state
            && let Err(error) = state.save(id, session)
        {
            eprintln!(
                "mock agent: cannot save session {:?} to {}: {error}",
                id.0,
                state.path(id).display()
            );
        }
    }

    /// Runs `f` on a session, or returns the ACP "session not found" error (`-32002`).
    fn with_session<T>(
        &self,
        id: &SessionId,
        f: impl FnOnce(&mut Session) -> T,
    ) -> Result<T, Error> {
        match self.sessions.lock().by_id.get_mut(id) {
            Some(session) => Ok(f(session)),
            None => Err(session_not_found(id)),
        }
    }
}

impl Session {
    /// A new session in the first mode with the first model.
    fn new(cwd: PathBuf) -> Self {
        Self {
            created: 0,
            cwd,
            mode: SessionModeId::new(MODES[0].0),
            model: SessionConfigValueId::new(MODELS[0].0),
            history: Vec::new(),
            updated_at: SystemTime::now(),
            turn: None,
        }
    }

    /// A new session with this one's history, mode and model.
    fn fork(&self, cwd: PathBuf) -> Self {
        Self {
            mode: self.mode.clone(),
            model: self.model.clone(),
            history: self.history.clone(),
            ..Self::new(cwd)
        }
    }

    fn state(&self) -> SessionState {
        let modes = MODES
            .iter()
            .map(|(id, name)| SessionMode::new(*id, *name))
            .collect();
        let models: Vec<SessionConfigSelectOption> = MODELS
            .iter()
            .map(|(id, name)| SessionConfigSelectOption::new(*id, *name))
            .collect();
        let model =
            SessionConfigOption::select(MODEL_CONFIG_ID, "Model", self.model.clone(), models)
                .category(SessionConfigOptionCategory::Model);
        SessionState {
            modes: SessionModeState::new(self.mode.clone(), modes),
            config_options: vec![model],
        }
    }
}

impl Message {
    /// The update that replays this message in `session/load`.
    fn replay(&self) -> SessionUpdate {
        let chunk = ContentChunk::new(ContentBlock::from(self.text.clone()));
        match self.from {
            Speaker::User => SessionUpdate::UserMessageChunk(chunk),
            Speaker::Agent => SessionUpdate::AgentMessageChunk(chunk),
        }
    }
}

/// `--state-dir`: one JSON file per session, `<sha256 of the id, hex>.json`
/// (a name safe for any session id), holding a [`SavedSession`]. Each write
/// goes to a temp file first and is renamed over the old one, so a process
/// killed mid-write leaves the previous version whole.
struct StateDir {
    dir: PathBuf,
}

/// A session as kept in its state file (`Cow`, so saving borrows the
/// session and loading owns what it reads).
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SavedSession<'a> {
    /// The session's id, checked on load.
    session_id: Cow<'a, SessionId>,
    cwd: Cow<'a, Path>,
    mode: Cow<'a, SessionModeId>,
    model: Cow<'a, SessionConfigValueId>,
    /// Milliseconds since the Unix epoch.
    updated_at_ms: u64,
    /// What `session/load` replays, in order.
    history: Cow<'a, [Message]>,
}

impl StateDir {
    /// The state file of session `id`.
    fn path(&self, id: &SessionId) -> PathBuf {
        let digest = Sha256::digest(id.0.as_bytes());
        let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
        self.dir.join(format!("{hex}.json"))
    }

    fn save(&self, id: &SessionId, session: &Session) -> io::Result<()> {
        let saved = SavedSession {
            session_id: Cow::Borrowed(id),
            cwd: Cow::Borrowed(&session.cwd),
            mode: Cow::Borrowed(&session.mode),
            model: Cow::Borrowed(&session.model),
            updated_at_ms: session
                .updated_at
                .duration_since(UNIX_EPOCH)
                .map_or(0, |since| {
                    u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
                }),
            history: Cow::Borrowed(&session.history),
        };
        let bytes = serde_json::to_vec(&saved).map_err(io::Error::other)?;
        let path = self.path(id);
        let mut temp = path.clone().into_os_string();
        temp.push(format!(".{}.tmp", std::process::id()));
        let temp = PathBuf::from(temp);
        let written = std::fs::write(&temp, bytes).and_then(|()| std::fs::rename(&temp, &path));
        if written.is_err() {
            let _ = std::fs::remove_file(&temp);
        }
        written
    }

    /// The saved session `id`, or `None` when it has no state file.
    fn load(&self, id: &SessionId) -> io::Result<Option<Session>> {
        let bytes = match std::fs::read(self.path(id)) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(error),
        };
        let saved: SavedSession<'static> = serde_json::from_slice(&bytes)
            .map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error))?;
        if saved.session_id.as_ref() != id {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the file holds session {:?}", saved.session_id.0),
            ));
        }
        Ok(Some(Session {
            created: 0,
            cwd: saved.cwd.into_owned(),
            mode: saved.mode.into_owned(),
            model: saved.model.into_owned(),
            history: saved.history.into_owned(),
            updated_at: UNIX_EPOCH + Duration::from_millis(saved.updated_at_ms),
            turn: None,
        }))
    }
}

/// The ACP "session not found" error: `-32002` with `data.sessionId`.
fn session_not_found(id: &SessionId) -> Error {
    agent_client_protocol::v1::schema::Error::session_not_found(id.clone()).into()
}

/// `id` if it is one of `known` (pairs of id and name), else invalid params.
fn known_id(known: &[(&'static str, &str)], id: &str, what: &str) -> Result<&'static str, Error> {
    known
        .iter()
        .map(|(known, _)| *known)
        .find(|known| *known == id)
        .ok_or_else(|| {
            let names: Vec<&str> = known.iter().map(|(id, _)| *id).collect();
            Error::invalid_params().data(format!(
                "unknown {what} `{id}`; the mock agent has {}",
                names.join(", ")
            ))
        })
}

/// Sends one `session/update` notification.
fn notify(
    cx: &ConnectionTo<Client>,
    session_id: &SessionId,
    update: SessionUpdate,
) -> Result<(), Error> {
    cx.send_notification(SessionNotification::new(session_id.clone(), update))
}

/// A timestamp as RFC 3339 (seconds), as ACP's `updatedAt` fields want.
fn rfc3339(time: SystemTime) -> String {
    humantime::format_rfc3339_seconds(time).to_string()
}

// ---------------------------------------------------------------------------
// Prompt turns
// ---------------------------------------------------------------------------

/// What a prompt turn does; decided from the prompt text by [`Behaviour::from_prompt`].
#[derive(Debug, Clone, PartialEq, Eq)]
enum Behaviour {
    /// The plain reply, one chunk per word.
    Reply,
    /// A completed `read` tool call, then the plain reply.
    Tool,
    /// An `edit` tool call that needs `session/request_permission`.
    Permission,
    /// `!crash [CODE]`.
    Crash { code: i32 },
    /// `!garbage`: non-JSON lines on stdout, then the plain reply.
    Garbage,
    /// `!stall`: nothing until `session/cancel`.
    Stall,
    /// `!emit N K`: N chunks of K bytes.
    Emit { chunks: usize, bytes: usize },
    /// `!slow N MS`: N chunks, MS apart.
    Slow { chunks: usize, interval: Duration },
    /// `!huge BYTES`: one non-JSON stdout line of BYTES bytes, then the plain reply.
    Huge { bytes: usize },
    /// `!fs PATH`: `fs/read_text_file` to the client.
    Fs { path: PathBuf },
    /// `!stderr N`: N lines on stderr, then the plain reply.
    Stderr { lines: usize },
}

impl Behaviour {
    /// The one place that maps a prompt's text to what the turn does.
    ///
    /// Text starting with `!` is a directive; an unknown directive name gets
    /// the plain reply, a known one with wrong arguments is an invalid-params
    /// error naming its usage. Otherwise `permission` anywhere in the text
    /// wins over `tool` (plain substrings, case-sensitive: `tools` counts).
    fn from_prompt(text: &str) -> Result<Self, Error> {
        let Some(directive) = text.strip_prefix('!') else {
            return Ok(if text.contains("permission") {
                Self::Permission
            } else if text.contains("tool") {
                Self::Tool
            } else {
                Self::Reply
            });
        };
        let directive = directive.trim();
        let (name, rest) = directive
            .split_once(char::is_whitespace)
            .unwrap_or((directive, ""));
        let usage = match name {
            "crash" => "!crash [CODE]",
            "garbage" => "!garbage",
            "stall" => "!stall",
            "emit" => "!emit N K",
            "slow" => "!slow N MS",
            "huge" => "!huge BYTES",
            "fs" => "!fs PATH",
            "stderr" => "!stderr N",
            _ => return Ok(Self::Reply),
        };
        let wrong = || Error::invalid_params().data(format!("usage: {usage} (got `{text}`)"));
        let args: Vec<&str> = rest.split_whitespace().collect();
        Ok(match (name, args.as_slice()) {
            ("crash", []) => Self::Crash {
                code: DEFAULT_CRASH_CODE,
            },
            ("crash", [code]) => Self::Crash {
                code: parse_arg(code, wrong)?,
            },
            ("garbage", []) => Self::Garbage,
            ("stall", []) => Self::Stall,
            ("emit", [chunks, bytes]) => Self::Emit {
                chunks: parse_arg(chunks, wrong)?,
                bytes: parse_arg(bytes, wrong)?,
            },
            ("slow", [chunks, millis]) => Self::Slow {
                chunks: parse_arg(chunks, wrong)?,
                interval: Duration::from_millis(parse_arg(millis, wrong)?),
            },
            ("huge", [bytes]) => Self::Huge {
                bytes: parse_arg(bytes, wrong)?,
            },
            // The path is the rest of the text, spaces included.
            ("fs", [_, ..]) => Self::Fs {
                path: PathBuf::from(rest.trim()),
            },
            ("stderr", [lines]) => Self::Stderr {
                lines: parse_arg(lines, wrong)?,
            },
            _ => return Err(wrong()),
        })
    }
}

/// One numeric directive argument, or the directive's usage error.
fn parse_arg<T: std::str::FromStr>(arg: &str, wrong: impl Fn() -> Error) -> Result<T, Error> {
    arg.parse().map_err(|_| wrong())
}

/// The prompt's text: all text content blocks joined by spaces.
fn prompt_text(prompt: &[ContentBlock]) -> String {
    let texts: Vec<&str> = prompt
        .iter()
        .filter_map(|block| match block {
            ContentBlock::Text(text) => Some(text.text.as_str()),
            _ => None,
        })
        .collect();
    texts.join(" ")
}

impl MockAgent {
    /// `session/prompt`: registers the turn and runs it in a spawned task,
    /// which answers the prompt when the turn ends. Returns at once, so the
    /// dispatch loop stays free for `session/cancel` and the client's answers.
    fn start_turn(
        self: &Arc<Self>,
        request: PromptRequest,
        responder: Responder<PromptResponse>,
        cx: ConnectionTo<Client>,
    ) -> Result<(), Error> {
        let text = prompt_text(&request.prompt);
        let behaviour = match Behaviour::from_prompt(&text) {
            Ok(behaviour) => behaviour,
            Err(error) => return responder.respond_with_error(error),
        };
        let running = match self.begin_turn(&request.session_id, &text) {
            Ok(running) => running,
            Err(error) => return responder.respond_with_error(error),
        };
        let turn = Turn {
            agent: self.clone(),
            cx: cx.clone(),
            session_id: request.session_id,
        };
        let request_cancelled = responder.cancellation();
        let task = self.turns.track_future(async move {
            let result = tokio::select! {
                biased;
                () = running.cancel.cancelled() => Ok(StopReason::Cancelled),
                // `$/cancel_request` for the prompt request itself.
                () = request_cancelled.cancelled() => Ok(StopReason::Cancelled),
                result = turn.play(behaviour, &text) => result,
            };
            turn.agent.end_turn(&turn.session_id, running.id);
            // Fails only when the connection is gone.
            responder.respond_with_result(result.map(PromptResponse::new))
        });
        cx.spawn(task)
    }

    /// Marks a turn as running in the session and records the user's message.
    fn begin_turn(&self, session_id: &SessionId, text: &str) -> Result<RunningTurn, Error> {
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
        self.save(session_id, session);
        Ok(running)
    }

    /// Marks the turn as over and saves the session with the agent's reply
    /// (the reply's chunks are not saved one by one: `!emit` sends 100,000).
    fn end_turn(&self, session_id: &SessionId, turn_id: u64) {
        let mut sessions = self.sessions.lock();
        if let Some(session) = sessions.by_id.get_mut(session_id)
            && session.turn.as_ref().is_some_and(|turn| turn.id == turn_id)
        {
            session.turn = None;
            session.updated_at = SystemTime::now();
            self.save(session_id, session);
        }
    }

    /// `session/cancel`: ends the session's running turn, if any, with stop
    /// reason `cancelled`.
    fn cancel_turn(&self, session_id: &SessionId) {
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

/// One prompt turn in its spawned task. Dropping it at any `.await` (on
/// `session/cancel`) is safe: requests to the client are awaited in their own
/// tasks (see [`Turn::ask_client`]).
struct Turn {
    agent: Arc<MockAgent>,
    cx: ConnectionTo<Client>,
    session_id: SessionId,
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
            Behaviour::Stderr { lines } => {
                for line in 1..=lines {
                    eprintln!("stderr line {line}");
                }
                self.reply(text)
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

    async fn read_file(&self, path: &Path) -> Result<StopReason, Error> {
        let request = ReadTextFileRequest::new(self.session_id.clone(), path);
        match self.ask_client(request).await {
            Ok(file) => self.say(&format!("Read {} bytes.", file.content.len()))?,
            Err(error) => self.say(&format!("fs error: {}", error.message))?,
        }
        Ok(StopReason::EndTurn)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_and_keywords() {
        assert_eq!(Behaviour::from_prompt("hi").ok(), Some(Behaviour::Reply));
        assert_eq!(
            Behaviour::from_prompt("use a tool").ok(),
            Some(Behaviour::Tool)
        );
        assert_eq!(
            Behaviour::from_prompt("tool with permission").ok(),
            Some(Behaviour::Permission)
        );
        assert_eq!(
            Behaviour::from_prompt("!unknown").ok(),
            Some(Behaviour::Reply)
        );
    }

    #[test]
    fn directives() {
        assert_eq!(
            Behaviour::from_prompt("!crash").ok(),
            Some(Behaviour::Crash { code: 3 })
        );
        assert_eq!(
            Behaviour::from_prompt("!crash 7").ok(),
            Some(Behaviour::Crash { code: 7 })
        );
        assert_eq!(
            Behaviour::from_prompt("!emit 100000 16").ok(),
            Some(Behaviour::Emit {
                chunks: 100_000,
                bytes: 16
            })
        );
        assert_eq!(
            Behaviour::from_prompt("!slow 3 10").ok(),
            Some(Behaviour::Slow {
                chunks: 3,
                interval: Duration::from_millis(10)
            })
        );
        assert_eq!(
            Behaviour::from_prompt("!fs /tmp/a file.txt").ok(),
            Some(Behaviour::Fs {
                path: PathBuf::from("/tmp/a file.txt")
            })
        );
    }

    #[test]
    fn malformed_directives_are_invalid_params() {
        for text in [
            "!emit 5",
            "!emit a b",
            "!crash x",
            "!fs",
            "!stall now",
            "!huge -1",
        ] {
            let error = Behaviour::from_prompt(text).err();
            assert_eq!(
                error.map(|error| error.code),
                Some(ErrorCode::INVALID_PARAMS),
                "{text}"
            );
        }
    }

    #[test]
    fn prompt_text_joins_text_blocks() {
        let blocks = vec![ContentBlock::from("a"), ContentBlock::from("b c")];
        assert_eq!(prompt_text(&blocks), "a b c");
    }
}
