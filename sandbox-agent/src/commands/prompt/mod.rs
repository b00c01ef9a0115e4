//! `sandbox-agent prompt`: the quick start. One prompt turn through the SDK
//! (`sandbox-agent-sdk`), with the agent's reply streamed to the terminal.
//!
//! - Without `--url` (or `$SANDBOX_AGENT_URL`) it starts an embedded server
//!   from this very executable (a private `sandbox-agent server` on a free
//!   loopback port with a random token) and stops it at the end.
//! - A new session each time, or `--session ID` to continue a stored one
//!   (a one-shot run's session is dormant afterwards: `session/load`, its
//!   replayed history not shown, then the prompt). The session id goes to
//!   stderr as `session: ID` before the turn starts.
//! - stdout carries only the agent's text, as it streams (so it can be
//!   piped); everything else goes to stderr: tool calls (`[tool] Reading
//!   the mock file (completed)`), permission questions, a spinner while
//!   waiting for the first output (only when stderr is a terminal), errors.
//! - Permission requests: `--yes` allows, `--deny` denies; otherwise the
//!   question is asked on stderr and the answer read from stdin, a line per
//!   question (`y`/`n`, an option number or an option id), whether stdin is
//!   a terminal or a pipe. When stdin is closed (or the answer is not
//!   understood and stdin is not a terminal) the request is denied, and the
//!   message says why.
//! - Questions of the agent (ACP elicitation; [`question`]): a form is
//!   asked field by field the same way, a URL question shows the link and
//!   asks y/n to go on; `--deny` declines them, a closed stdin too.
//! - Exit status 0 when the turn ends with `end_turn`; otherwise 1 with a
//!   message naming the stop reason (`cancelled`, `max_tokens`, …) or the
//!   error (an agent that crashed, a server that cannot be reached). An
//!   agent's error is followed by the stderr lines the agent wrote for
//!   that request (`agent stderr: …`) and the server's hint (`hint: …`). Ctrl-C
//!   cancels the turn (`session/cancel`); a second Ctrl-C gives up at once.
//! - A server that goes away during the turn (its event stream cannot be
//!   reopened: 4 attempts within about 3 s, or at once when a restarted
//!   server no longer knows the connection) ends the run within 5 s with
//!   `the server at URL went away during the turn` and status 1, also
//!   while a permission request or a question waits on stdin (it is not
//!   waited for: nobody could answer it).
//! - `--auth-method ID` sends ACP `authenticate` before the session. An
//!   agent's "Authentication required" (`-32000`) names what would satisfy
//!   it: the environment variables the server's manifest maps to auth
//!   methods, and the methods the agent offers.

use super::args::URL_ENV;
use clap::Args;
use sandbox_agent_sdk::schema::{
    ContentBlock, LoadSessionRequest, NewSessionRequest, PromptRequest, SessionId,
    SessionNotification, SessionUpdate, StopReason, ToolCallStatus,
};
use sandbox_agent_sdk::{
    AgentSource, ClientOptions, Error, Event, InstallOptions, Mode, PermissionDecision,
    PermissionRequest, ReconnectPolicy, SandboxAgentClient, SessionEnded,
};
use std::borrow::Cow;
use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Duration;
use tokio::task::JoinHandle;

mod question;

/// Spinner frames (braille dots), one every [`SPINNER_FRAME`].
const SPINNER_FRAMES: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];
/// Time between spinner frames.
const SPINNER_FRAME: Duration = Duration::from_millis(80);
/// What precedes the session id on stderr (scripts read the line).
const SESSION_LINE: &str = "session: ";
/// How often a wait for the user checks that the connection still lives.
const CONNECTION_CHECK: Duration = Duration::from_millis(100);
/// The event stream's reopening after a drop: 4 attempts, 250 ms doubling
/// to 1 s apart (at most 2.75 s, jittered), so a server that is gone is
/// noticed within 5 s of the stream closing (research/contract.md,
/// "`sandbox-agent prompt`"), and a server that restarts meanwhile (which
/// answers 404 for the old connection) at once.
const RECONNECT: ReconnectPolicy = ReconnectPolicy {
    initial_delay: Duration::from_millis(250),
    max_delay: Duration::from_secs(1),
    max_attempts: 4,
};

/// `sandbox-agent prompt [--agent mock] [--url URL] [--token T] [--session ID] [--yes|--deny] "text"`.
#[derive(Debug, Clone, Args)]
pub struct PromptArgs {
    /// Agent id to prompt.
    #[arg(long, default_value = "mock")]
    pub agent: String,
    /// Base URL of a running server (e.g. http://127.0.0.1:2468); without it
    /// (and without $SANDBOX_AGENT_URL) an embedded server is started and
    /// stopped afterwards.
    #[arg(long, value_name = "URL", env = URL_ENV)]
    pub url: Option<String>,
    /// Continue this session (one listed by `sandbox-agent sessions list`)
    /// instead of starting a new one: it is loaded, then prompted.
    #[arg(long, value_name = "ID", value_parser = clap::builder::NonEmptyStringValueParser::new())]
    pub session: Option<String>,
    /// Bearer token of the server at --url.
    #[arg(long, env = "SANDBOX_AGENT_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Allow every permission request of the agent.
    #[arg(long, conflicts_with = "deny")]
    pub yes: bool,
    /// Deny every permission request and decline every question of the
    /// agent.
    #[arg(long)]
    pub deny: bool,
    /// Working directory of the session (default: the current directory).
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<PathBuf>,
    /// Authenticate the agent with this auth method (one of the
    /// `authMethods` it advertises) before starting the session.
    #[arg(long, value_name = "ID")]
    pub auth_method: Option<String>,
    /// The prompt (several words are joined with spaces).
    #[arg(required = true)]
    pub text: Vec<String>,
}

/// Runs one prompt turn; `Ok` only when it ends with `end_turn`.
///
/// # Errors
/// A message for the user: the stop reason when it is not `end_turn`, or
/// why the turn could not run.
pub async fn run(args: PromptArgs) -> Result<(), String> {
    let terminal = Terminal::detect();
    let mut spinner = Spinner::new(terminal.stderr);
    let mut options = ClientOptions::new(&args.agent)
        .client_info("sandbox-agent prompt", env!("CARGO_PKG_VERSION"))
        .reconnect(RECONNECT);
    match &args.url {
        Some(url) => {
            spinner.show(format!("connecting to {url}"));
            options = options.base_url(url).mode(Mode::Server);
            if let Some(token) = &args.token {
                options = options.token(token);
            }
        }
        None => {
            spinner.show("starting sandbox-agent".to_owned());
            let me = std::env::current_exe()
                .map_err(|e| format!("cannot locate this executable: {e}"))?;
            options = options.binary(me).mode(Mode::Embedded);
        }
    }
    // The connection is opened after a missing agent is installed, so the
    // install (npm, a minute for some agents) is said, not silent.
    let client = match SandboxAgentClient::connect(options.auto_connect(false)).await {
        Ok(client) => client,
        Err(error) => {
            spinner.stop();
            return Err(describe_connect_error(&args, &error));
        }
    };
    let opened = match install_first(&client, &args, terminal, &mut spinner).await {
        Ok(()) => client
            .open()
            .await
            .map_err(|error| describe_connect_error(&args, &error)),
        Err(message) => Err(message),
    };
    if let Err(message) = opened {
        spinner.stop();
        client.shutdown().await;
        return Err(message);
    }
    let result = one_turn(&client, &args, terminal, &mut spinner).await;
    spinner.stop();
    client.shutdown().await;
    // The message carries the agent's own words (its error, its stderr).
    result.map_err(|message| terminal_safe(&message, true).into_owned())
}

/// Installs `args.agent` first when the server lists it as not installed
/// and installable from its registry (research/contract.md, "sandbox-agent
/// prompt"): on a terminal the spinner says so, otherwise one line on
/// stderr before and one after, so the wait is never silent. An agent the
/// server does not list, or a listing that fails, is left to `initialize`
/// to report.
///
/// # Errors
/// The install's failure, for the user.
async fn install_first(
    client: &SandboxAgentClient,
    args: &PromptArgs,
    terminal: Terminal,
    spinner: &mut Spinner,
) -> Result<(), String> {
    let Ok(agents) = client.agents().await else {
        return Ok(());
    };
    let missing = agents.iter().any(|agent| {
        agent.id == args.agent && !agent.installed && agent.source == AgentSource::Registry
    });
    if !missing {
        return Ok(());
    }
    let what = format!("installing agent {:?} (its first use)", args.agent);
    if terminal.stderr {
        spinner.show(format!("{what}…"));
    } else {
        eprintln!("sandbox-agent: {what}…");
    }
    let installed = client
        .install_agent(&args.agent, InstallOptions::default())
        .await
        .map_err(|error| format!("cannot install agent {:?}: {error}", args.agent))?;
    let version = installed
        .version
        .map(|version| format!(" {version}"))
        .unwrap_or_default();
    let done = format!(
        "installed agent {:?}{version} in {:.1} s",
        args.agent,
        installed.duration_ms as f64 / 1000.0
    );
    if terminal.stderr {
        spinner.show(done);
    } else {
        eprintln!("sandbox-agent: {done}");
    }
    Ok(())
}

/// `text` with what a terminal would act on made visible: control
/// characters (C0 except a line feed when `keep_newlines`, DEL, C1) and the
/// Unicode bidirectional controls become `\u{…}` escapes. Everything this
/// command writes to stderr passes through it: an agent's titles, questions
/// and errors could otherwise clear the screen, retitle the window or
/// redraw a prompt.
pub(super) fn terminal_safe(text: &str, keep_newlines: bool) -> Cow<'_, str> {
    let unsafe_char = |c: char| {
        (c.is_control() && !(keep_newlines && c == '\n'))
            || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !text.chars().any(unsafe_char) {
        return Cow::Borrowed(text);
    }
    let mut safe = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unsafe_char(c) {
            safe.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            safe.push(c);
        }
    }
    Cow::Owned(safe)
}

/// An agent's text meant for one line of stderr: [`terminal_safe`], line
/// feeds escaped too (a forged `[permission] …: allowed` line otherwise).
pub(super) fn one_line(text: &str) -> Cow<'_, str> {
    terminal_safe(text, false)
}

/// Which of the standard streams are terminals.
#[derive(Debug, Clone, Copy)]
struct Terminal {
    stdin: bool,
    stdout: bool,
    stderr: bool,
}

impl Terminal {
    fn detect() -> Terminal {
        Terminal {
            stdin: std::io::stdin().is_terminal(),
            stdout: std::io::stdout().is_terminal(),
            stderr: std::io::stderr().is_terminal(),
        }
    }
}

/// The session, the prompt, and the event loop of one turn.
async fn one_turn(
    client: &SandboxAgentClient,
    args: &PromptArgs,
    terminal: Terminal,
    spinner: &mut Spinner,
) -> Result<(), String> {
    let Some(mut events) = client.take_events() else {
        return Err("internal error: the event stream is gone".to_owned());
    };
    let cwd = match &args.cwd {
        Some(cwd) => cwd.clone(),
        None => std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/")),
    };
    if let Some(method) = &args.auth_method {
        spinner.show(format!("authenticating {}", args.agent));
        // The agent may ask a question about the sign-in (scoped to the
        // `authenticate` request): it is asked as in a turn.
        let mut view = TurnView::new(args, terminal, SessionId::new(""));
        let mut interrupts = Interrupts::listen(client);
        let authenticating = client.authenticate(method.clone());
        tokio::pin!(authenticating);
        let gone = interrupts.server_gone();
        tokio::pin!(gone);
        let authenticated = loop {
            tokio::select! {
                result = &mut authenticating => break result,
                Some(event) = events.recv() => {
                    if matches!(event, Event::Question(_)) {
                        match view.handle(event, spinner, &mut interrupts).await {
                            Flow::Continue => {}
                            Flow::Interrupted => {
                                spinner.stop();
                                return Err("interrupted".to_owned());
                            }
                            Flow::ServerGone => {
                                spinner.stop();
                                return Err(server_gone(args, &view));
                            }
                        }
                    }
                }
                () = interrupts.next() => {
                    spinner.stop();
                    return Err("interrupted".to_owned());
                }
                () = &mut gone => {
                    spinner.stop();
                    return Err(server_gone(args, &view));
                }
            }
        };
        if let Err(error) = authenticated {
            spinner.stop();
            return Err(format!(
                "cannot authenticate agent {:?} with auth method {method:?}: {error}{}",
                args.agent,
                auth_advice(client, args).await
            ));
        }
    }
    // Events other than the replay that came while loading, for the view.
    let mut held = Vec::new();
    let session_id = match &args.session {
        Some(id) => {
            spinner.show(format!("loading session {id}"));
            load(client, args, id, cwd)
                .await
                .inspect_err(|_| spinner.stop())?;
            // The agent replayed the history before answering: it was
            // shown when it happened, so only the new turn is printed.
            while let Some(event) = events.try_recv() {
                if !matches!(event, Event::SessionUpdate(_)) {
                    held.push(event);
                }
            }
            SessionId::new(id.as_str())
        }
        None => match client.new_session(NewSessionRequest::new(cwd)).await {
            Ok(session) => session.session_id.clone(),
            Err(error) => {
                spinner.stop();
                let advice = if error.is_auth_required() {
                    auth_advice(client, args).await
                } else {
                    String::new()
                };
                return Err(format!(
                    "cannot start a session with agent {:?}: {}{advice}",
                    args.agent,
                    describe_error(&error)
                ));
            }
        },
    };
    spinner.clear();
    eprintln!("{SESSION_LINE}{}", session_id.0);
    spinner.show(format!("waiting for {}", args.agent));

    let mut view = TurnView::new(args, terminal, session_id.clone());
    let mut interrupts = Interrupts::listen(client);
    for event in held {
        view.handle(event, spinner, &mut interrupts).await;
    }
    let prompt = client.prompt(PromptRequest::new(
        session_id.clone(),
        vec![args.text.join(" ").into()],
    ));
    tokio::pin!(prompt);
    let mut interrupted = false;
    // The connection closed under the turn: its answer will not come.
    let mut gone = false;
    let closed = interrupts.server_gone();
    tokio::pin!(closed);
    // `None`: given up on the turn (a second Ctrl-C, or the server gone).
    let outcome = loop {
        tokio::select! {
            result = &mut prompt => break Some(result),
            Some(event) = events.recv() => {
                match view.handle(event, spinner, &mut interrupts).await {
                    Flow::Continue => {}
                    Flow::Interrupted => {
                        interrupted = true;
                        break None;
                    }
                    Flow::ServerGone => {
                        gone = true;
                        break None;
                    }
                }
            }
            () = &mut closed => {
                gone = true;
                break None;
            }
            () = interrupts.next() => {
                spinner.stop();
                if interrupted {
                    break None;
                }
                interrupted = true;
                view.note("^C: cancelling the turn (press Ctrl-C again to quit)");
                if let Err(error) = client.cancel(session_id.clone()).await {
                    view.note(&format!("cancelling failed: {error}"));
                }
            }
        }
    };
    // The answer is held until the turn's updates arrived: show the rest.
    while !gone && let Some(event) = events.try_recv() {
        match view.handle(event, spinner, &mut interrupts).await {
            Flow::Continue => {}
            Flow::Interrupted => interrupted = true,
            Flow::ServerGone => gone = true,
        }
    }
    spinner.stop();
    view.end_text();
    match outcome {
        _ if gone => Err(server_gone(args, &view)),
        None => Err("interrupted".to_owned()),
        Some(Ok(response)) if response.stop_reason == StopReason::EndTurn => Ok(()),
        Some(_) if interrupted => Err("interrupted: the turn was cancelled".to_owned()),
        Some(Ok(response)) => Err(format!(
            "the turn ended with stop reason {}",
            stop_reason_name(response.stop_reason)
        )),
        Some(Err(error)) if error.is_connection_lost() || view.connection_closed.is_some() => {
            Err(server_gone(args, &view))
        }
        Some(Err(error)) if error.is_auth_required() => Err(format!(
            "{}{}",
            view.describe_failure(&error),
            auth_advice(client, args).await
        )),
        Some(Err(error)) => Err(view.describe_failure(&error)),
    }
}

/// The message for a turn whose server went away (the connection closed
/// under it): names the server and says what the client saw.
fn server_gone(args: &PromptArgs, view: &TurnView) -> String {
    let server = match &args.url {
        Some(url) => format!("the server at {url}"),
        None => "the embedded server".to_owned(),
    };
    let mut message = format!("{server} went away during the turn");
    if let Some(why) = &view.connection_closed {
        message.push_str(&format!(" (the connection closed: {why})"));
    }
    message.push_str(
        "; the turn's answer is lost (a restarted server records the turn as interrupted in the session's log)",
    );
    message
}

/// `session/load` of the stored session `id`, in `--cwd` if given, else in
/// the cwd it was created with (an agent may keep its sessions by cwd).
///
/// # Errors
/// A message naming the session: unknown to the server, or refused by the
/// agent.
async fn load(
    client: &SandboxAgentClient,
    args: &PromptArgs,
    id: &str,
    cwd: PathBuf,
) -> Result<(), String> {
    let cwd = match (&args.cwd, client.get_session(id.to_owned()).await) {
        (Some(_), _) => cwd,
        (None, Ok(entry)) => entry.value.cwd,
        (None, Err(error)) if error.is_not_found() => {
            return Err(format!(
                "no session {id:?} of agent {:?} on this server (sandbox-agent sessions list shows them)",
                args.agent
            ));
        }
        (None, Err(_)) => cwd,
    };
    match client
        .load_session(LoadSessionRequest::new(id.to_owned(), cwd))
        .await
    {
        Ok(_) => Ok(()),
        Err(error) => {
            let advice = if error.is_auth_required() {
                auth_advice(client, args).await
            } else {
                String::new()
            };
            Err(format!(
                "cannot continue session {id:?} of agent {:?}: {}{advice}",
                args.agent,
                describe_error(&error)
            ))
        }
    }
}

/// What satisfies the agent's "Authentication required", as lines to append
/// to the error: the environment variables the agent reads itself and those
/// the server's manifest maps to the agent's auth methods (`GET
/// /v2/agents`, `credentialEnv` and `auth`), then the methods the agent
/// offers for `--auth-method` (its `initialize` result).
async fn auth_advice(client: &SandboxAgentClient, args: &PromptArgs) -> String {
    let mut advice = String::new();
    let methods = client
        .initialize_result()
        .map(|result| result.auth_methods)
        .unwrap_or_default();
    let (mut mapped, read_by_agent) = match client.agents().await {
        Ok(agents) => agents
            .into_iter()
            .find(|agent| agent.id == args.agent)
            .map(|agent| (agent.auth, agent.credential_env))
            .unwrap_or_default(),
        Err(_) => (Vec::new(), Vec::new()),
    };
    // Only variables for methods the agent offers (when it says which).
    if !methods.is_empty() {
        mapped.retain(|auth| methods.iter().any(|m| *m.id().0 == *auth.method_id));
    }
    // The variables the agent reads itself first: they need no method.
    let names: Vec<String> = read_by_agent
        .iter()
        .map(|env| format!("{env} (read by the agent itself)"))
        .chain(
            mapped
                .iter()
                .map(|auth| format!("{} (auth method {})", auth.env, auth.method_id)),
        )
        .collect();
    if !names.is_empty() {
        let whose = match &args.url {
            Some(url) => format!("the environment of the server at {url} (and restart it)"),
            None => "the environment".to_owned(),
        };
        advice.push_str(&format!(
            "
agent {:?} needs a credential: set {} in {whose}",
            args.agent,
            names.join(" or ")
        ));
    }
    let offered: Vec<String> = methods
        .iter()
        .map(|method| match method.description() {
            Some(description) => format!("{} ({description})", method.id()),
            None => method.id().to_string(),
        })
        .collect();
    if !offered.is_empty() {
        advice.push_str(&format!(
            "
or authenticate with --auth-method ID; the agent offers: {}",
            offered.join(", ")
        ));
    }
    if advice.is_empty() {
        advice.push_str(&format!(
            "
agent {:?} needs authentication and names no auth method; see its documentation",
            args.agent
        ));
    }
    advice
}

/// What ends a wait for the user: Ctrl-C presses (SIGINT), from the
/// moment the turn starts, and the connection to the server closing.
/// Listening replaces SIGINT's default action (exit), so the turn can be
/// cancelled cleanly and the embedded server stopped.
struct Interrupts {
    signal: Option<tokio::signal::unix::Signal>,
    /// The client whose connection is watched.
    client: SandboxAgentClient,
}

impl Interrupts {
    fn listen(client: &SandboxAgentClient) -> Interrupts {
        let signal = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt());
        Interrupts {
            signal: signal.ok(),
            client: client.clone(),
        }
    }

    /// Resolves once the connection to the server has closed (its event
    /// stream could not be reopened), checked every [`CONNECTION_CHECK`].
    /// Borrows nothing, so it can be awaited beside [`Self::next`].
    fn server_gone(&self) -> impl Future<Output = ()> + use<> {
        let client = self.client.clone();
        async move {
            while client.is_connected() {
                tokio::time::sleep(CONNECTION_CHECK).await;
            }
        }
    }

    /// The next Ctrl-C (never, if listening failed).
    async fn next(&mut self) {
        match &mut self.signal {
            Some(signal) => {
                if signal.recv().await.is_none() {
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending::<()>().await,
        }
    }
}

/// Whether the event loop goes on.
#[derive(Debug, PartialEq, Eq)]
enum Flow {
    Continue,
    /// Ctrl-C while a permission request or a question waited for its
    /// answer.
    Interrupted,
    /// The connection to the server closed (while a permission request or
    /// a question waited, or the closing was the event): the turn's answer
    /// will not come.
    ServerGone,
}

/// What the terminal shows of one turn, and what it learned on the way.
struct TurnView {
    terminal: Terminal,
    session_id: SessionId,
    /// The `--yes` / `--deny` answer, if given.
    preset: Option<PermissionDecision>,
    /// `--deny`: questions of the agent are declined unasked.
    deny_questions: bool,
    /// stdout ended without a newline (agent text is mid-line).
    mid_line: bool,
    /// stderr ended without a newline (a question waits for its answer).
    question_open: bool,
    /// Titles of the tool calls seen, by id (updates may omit the title).
    tool_titles: HashMap<String, String>,
    /// The session's end notice, if it came (explains a failed turn).
    ended: Option<SessionEnded>,
    /// Why the connection closed, if it did.
    connection_closed: Option<String>,
}

impl TurnView {
    fn new(args: &PromptArgs, terminal: Terminal, session_id: SessionId) -> TurnView {
        let preset = if args.yes {
            Some(PermissionDecision::Allow)
        } else if args.deny {
            Some(PermissionDecision::Reject)
        } else {
            None
        };
        TurnView {
            terminal,
            session_id,
            preset,
            deny_questions: args.deny,
            mid_line: false,
            question_open: false,
            tool_titles: HashMap::new(),
            ended: None,
            connection_closed: None,
        }
    }

    /// Shows (or answers) one event; `Interrupted` when Ctrl-C came while
    /// a permission request or a question waited.
    async fn handle(
        &mut self,
        event: Event,
        spinner: &mut Spinner,
        interrupts: &mut Interrupts,
    ) -> Flow {
        match event {
            Event::SessionUpdate(notification) if notification.session_id == self.session_id => {
                self.update(notification, spinner);
            }
            Event::PermissionRequest(request) => {
                spinner.stop();
                return self.permission(request, interrupts).await;
            }
            Event::Question(question) => {
                spinner.stop();
                return self.question(question, interrupts).await;
            }
            Event::QuestionCompleted(completed) => {
                self.note(&format!(
                    "[question] completed: {}",
                    one_line(&completed.elicitation_id.0)
                ));
            }
            Event::SessionEnded(ended) if ended.session_id == *self.session_id.0 => {
                self.ended = Some(ended);
            }
            Event::ConnectionClosed { error } => {
                self.connection_closed = Some(error.unwrap_or_else(|| "closed".to_owned()));
                return Flow::ServerGone;
            }
            _ => {}
        }
        Flow::Continue
    }

    /// A session update of our session: text to stdout, tool calls to stderr.
    fn update(&mut self, notification: SessionNotification, spinner: &mut Spinner) {
        match notification.update {
            SessionUpdate::AgentMessageChunk(chunk) => {
                if let ContentBlock::Text(text) = chunk.content {
                    spinner.stop();
                    self.text(&text.text);
                }
            }
            SessionUpdate::ToolCall(call) => {
                spinner.stop();
                self.tool_titles
                    .insert(call.tool_call_id.0.to_string(), call.title.clone());
                self.note(&format!(
                    "[tool] {} ({})",
                    one_line(&call.title),
                    status_name(call.status)
                ));
            }
            SessionUpdate::ToolCallUpdate(update) => {
                let id = update.tool_call_id.0.to_string();
                if let Some(title) = &update.fields.title {
                    self.tool_titles.insert(id.clone(), title.clone());
                }
                if let Some(status) = update.fields.status {
                    spinner.stop();
                    let title = self.tool_titles.get(&id).cloned().unwrap_or(id);
                    self.note(&format!(
                        "[tool] {} ({})",
                        one_line(&title),
                        status_name(status)
                    ));
                }
            }
            _ => {}
        }
    }

    /// Agent text to stdout, as it comes.
    fn text(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        let mut stdout = std::io::stdout().lock();
        let _ = stdout.write_all(text.as_bytes());
        let _ = stdout.flush();
        self.mid_line = !text.ends_with('\n');
    }

    /// A line on stderr. On a terminal, agent text that is mid-line is
    /// ended first so the two do not run together.
    fn note(&mut self, line: &str) {
        self.end_text_before_stderr();
        let mut stderr = std::io::stderr().lock();
        if self.question_open {
            // Nothing ended the question's line (stdin closed, Ctrl-C).
            let _ = writeln!(stderr);
            self.question_open = false;
        }
        let _ = writeln!(stderr, "{}", terminal_safe(line, true));
        let _ = stderr.flush();
    }

    /// Ends the agent's text with a newline, if it has none.
    fn end_text(&mut self) {
        if self.mid_line {
            let mut stdout = std::io::stdout().lock();
            let _ = stdout.write_all(b"\n");
            let _ = stdout.flush();
            self.mid_line = false;
        }
    }

    /// When stdout and stderr are both terminals, ends agent text that
    /// is mid-line so that what goes to stderr next does not run into it.
    fn end_text_before_stderr(&mut self) {
        if self.terminal.stdout && self.terminal.stderr {
            self.end_text();
        }
    }

    /// Answers a permission request: the preset, or the user's answer.
    async fn permission(
        &mut self,
        request: PermissionRequest,
        interrupts: &mut Interrupts,
    ) -> Flow {
        let title = one_line(request.title()).into_owned();
        let options: Vec<(String, String)> = request
            .request()
            .options
            .iter()
            .map(|option| {
                (
                    option.option_id.0.to_string(),
                    one_line(&option.name).into_owned(),
                )
            })
            .collect();
        if let Some(decision) = self.preset.clone() {
            let flag = if decision == PermissionDecision::Allow {
                "--yes"
            } else {
                "--deny"
            };
            let verb = if flag == "--yes" { "allowed" } else { "denied" };
            self.note(&format!("[permission] {title}: {verb} ({flag})"));
            self.answer(request, decision);
            return Flow::Continue;
        }
        let mut question = format!("[permission] {title}");
        for (index, (_, name)) in options.iter().enumerate() {
            question.push_str(&format!("\n  {}) {name}", index + 1));
        }
        question.push_str(&format!("\nAllow? [y/n or 1-{}]: ", options.len().max(1)));
        loop {
            self.ask(&question);
            let gone = interrupts.server_gone();
            let line = tokio::select! {
                line = read_stdin_line() => line,
                () = interrupts.next() => {
                    self.note("^C: cancelling the permission request and the turn");
                    self.answer(request, PermissionDecision::Cancel);
                    return Flow::Interrupted;
                }
                // Nobody can answer it now: not waiting for stdin.
                () = gone => {
                    self.note("[permission] no answer can reach the agent: the server went away");
                    drop(request);
                    return Flow::ServerGone;
                }
            };
            let Some(line) = line else {
                self.note("[permission] no answer (stdin is closed): denying");
                self.answer(request, PermissionDecision::Reject);
                return Flow::Continue;
            };
            // The user's Enter ended the question's line on a terminal; a
            // piped answer is not echoed, so show it after the question.
            self.question_open = false;
            if !self.terminal.stdin {
                self.note(line.trim());
            }
            match parse_answer(&line, &options) {
                Some(decision) => {
                    self.answer(request, decision);
                    return Flow::Continue;
                }
                None if self.terminal.stdin => {
                    self.note("please answer y, n, or an option number");
                }
                None => {
                    self.note(&format!(
                        "[permission] unrecognised answer {:?}: denying",
                        line.trim()
                    ));
                    self.answer(request, PermissionDecision::Reject);
                    return Flow::Continue;
                }
            }
        }
    }

    /// Writes a question (no final newline) to stderr.
    fn ask(&mut self, question: &str) {
        self.end_text_before_stderr();
        let mut stderr = std::io::stderr().lock();
        let _ = stderr.write_all(terminal_safe(question, true).as_bytes());
        let _ = stderr.flush();
        self.question_open = true;
    }

    fn answer(&mut self, request: PermissionRequest, decision: PermissionDecision) {
        if let Err(error) = request.decide(decision) {
            self.note(&format!("[permission] could not send the answer: {error}"));
        }
    }

    /// The message for a turn that failed with `error`, with what the
    /// session's end notice says (an agent that crashed, its stderr).
    fn describe_failure(&self, error: &Error) -> String {
        let mut message = match error {
            // The data repeats what the end notice below says more readably.
            Error::Rpc(rpc) => format!(
                "the turn failed: {} (JSON-RPC error {})",
                rpc.message,
                i32::from(rpc.code)
            ),
            other => format!("the turn failed: {other}"),
        };
        message.push_str(&agent_lines(error));
        if let Some(ended) = &self.ended {
            if let Some(text) = &ended.message
                && !message.contains(text.as_str())
            {
                message.push_str(&format!("\nthe session ended: {text}"));
            }
            if let Some(stderr) = &ended.stderr {
                let lines = [stderr.head.as_deref(), stderr.tail.as_deref()];
                for text in lines.into_iter().flatten() {
                    for line in text.lines() {
                        message.push_str(&format!("\nagent stderr: {line}"));
                    }
                }
            }
        }
        if let Some(closed) = &self.connection_closed {
            message.push_str(&format!("\nthe connection to the server closed: {closed}"));
        }
        message
    }
}

/// `error` for the user. An agent's error that carries its stderr or a
/// hint (research/contract.md, "Agent errors: stderr and hint") reads as
/// its message, with those lines under it ([`agent_lines`]); any other as
/// the SDK words it.
fn describe_error(error: &Error) -> String {
    let lines = agent_lines(error);
    match error {
        Error::Rpc(rpc) if !lines.is_empty() => format!(
            "{} (JSON-RPC error {}){lines}",
            rpc.message,
            i32::from(rpc.code)
        ),
        other => other.to_string(),
    }
}

/// The agent's stderr lines the server added to its error, one
/// `agent stderr: …` line each, and the server's hint as `hint: …`, each
/// line led by a line feed; empty when there are none.
fn agent_lines(error: &Error) -> String {
    let mut text = String::new();
    for line in error.agent_stderr() {
        text.push_str(&format!("\nagent stderr: {line}"));
    }
    if let Some(hint) = error.agent_hint() {
        text.push_str(&format!("\nhint: {hint}"));
    }
    text
}

/// What the user's answer `line` means, for `options` as `(id, name)`.
fn parse_answer(line: &str, options: &[(String, String)]) -> Option<PermissionDecision> {
    let answer = line.trim();
    match answer.to_ascii_lowercase().as_str() {
        "y" | "yes" | "allow" => return Some(PermissionDecision::Allow),
        "n" | "no" | "deny" | "reject" => return Some(PermissionDecision::Reject),
        _ => {}
    }
    if let Ok(number) = answer.parse::<usize>() {
        return number
            .checked_sub(1)
            .and_then(|index| options.get(index))
            .map(|(id, _)| PermissionDecision::Select(id.clone().into()));
    }
    options
        .iter()
        .find(|(id, _)| id == answer)
        .map(|(id, _)| PermissionDecision::Select(id.clone().into()))
}

/// One line of stdin, without blocking the runtime; `None` at end of input.
async fn read_stdin_line() -> Option<String> {
    let read = tokio::task::spawn_blocking(|| {
        let mut line = String::new();
        match std::io::stdin().read_line(&mut line) {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(line),
        }
    });
    read.await.ok().flatten()
}

/// The message for a client that could not connect. A password in the
/// URL (`http://user:pw@host`) is shown as `***`, in the URL and in the
/// error's own words.
fn describe_connect_error(args: &PromptArgs, error: &Error) -> String {
    let password = args
        .url
        .as_deref()
        .and_then(|url| reqwest::Url::parse(url).ok())
        .and_then(|url| url.password().map(str::to_owned))
        .filter(|password| !password.is_empty());
    let hide = |text: String| match &password {
        Some(password) => text.replace(password.as_str(), "***"),
        None => text,
    };
    hide(match (&args.url, error) {
        (Some(url), error) if error.is_connection_lost() || error.is_timeout() => {
            format!("cannot reach the server at {url}: {error}")
        }
        (Some(url), error) if error.is_unauthorized() => format!(
            "the server at {url} refused the token (give the right one with --token or SANDBOX_AGENT_TOKEN): {error}"
        ),
        _ => format!("cannot connect to agent {:?}: {error}", args.agent),
    })
}

/// The wire name of a stop reason (ACP schema, `snake_case`).
fn stop_reason_name(reason: StopReason) -> String {
    serde_json::to_value(reason)
        .ok()
        .and_then(|value| value.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{reason:?}"))
}

/// A tool call status in words.
fn status_name(status: ToolCallStatus) -> &'static str {
    match status {
        ToolCallStatus::Pending => "pending",
        ToolCallStatus::InProgress => "in progress",
        ToolCallStatus::Completed => "completed",
        ToolCallStatus::Failed => "failed",
        _ => "updated",
    }
}

/// A one-line spinner on stderr while waiting (only when stderr is a
/// terminal). Stopped for good at the first output.
struct Spinner {
    enabled: bool,
    task: Option<JoinHandle<()>>,
}

impl Spinner {
    fn new(enabled: bool) -> Spinner {
        Spinner {
            enabled,
            task: None,
        }
    }

    /// Shows `message` with the spinner (replacing the previous one).
    fn show(&mut self, message: String) {
        if !self.enabled {
            return;
        }
        if let Some(task) = self.task.take() {
            task.abort();
        }
        self.task = Some(tokio::spawn(async move {
            for frame in SPINNER_FRAMES.iter().cycle() {
                {
                    let mut stderr = std::io::stderr().lock();
                    let _ = write!(stderr, "\r\x1b[2K{frame} {message}…");
                    let _ = stderr.flush();
                }
                tokio::time::sleep(SPINNER_FRAME).await;
            }
        }));
    }

    /// Clears the spinner's line for a line of text; a later
    /// [`show`](Self::show) starts it again.
    fn clear(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
            let mut stderr = std::io::stderr().lock();
            let _ = write!(stderr, "\r\x1b[2K");
            let _ = stderr.flush();
        }
    }

    /// Clears the spinner's line; later [`show`](Self::show) calls do
    /// nothing (the spinner is only for the wait before the first output).
    fn stop(&mut self) {
        self.clear();
        self.enabled = false;
    }
}

impl Drop for Spinner {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn agent_text_reaches_the_terminal_without_control_characters() {
        let hostile = "a\x1b[2J\x07b\rc\0d\x7fe\u{9b}f\u{202e}g\nh";
        assert_eq!(
            super::terminal_safe(hostile, true),
            "a\\u{1b}[2J\\u{7}b\\u{d}c\\u{0}d\\u{7f}e\\u{9b}f\\u{202e}g\nh"
        );
        assert_eq!(
            super::one_line("[tool] x\n[permission] forged: allowed"),
            "[tool] x\\u{a}[permission] forged: allowed"
        );
        assert!(matches!(
            super::terminal_safe("plain text, ünïcödé", false),
            std::borrow::Cow::Borrowed(_)
        ));
    }

    use super::*;

    fn options() -> Vec<(String, String)> {
        vec![
            ("allow-once".to_owned(), "Allow once".to_owned()),
            ("reject-once".to_owned(), "Reject once".to_owned()),
        ]
    }

    #[test]
    fn answers_are_words_numbers_or_option_ids() {
        let options = options();
        assert_eq!(
            parse_answer("y\n", &options),
            Some(PermissionDecision::Allow)
        );
        assert_eq!(
            parse_answer(" No ", &options),
            Some(PermissionDecision::Reject)
        );
        assert_eq!(
            parse_answer("2", &options),
            Some(PermissionDecision::Select("reject-once".into()))
        );
        assert_eq!(
            parse_answer("allow-once", &options),
            Some(PermissionDecision::Select("allow-once".into()))
        );
        assert_eq!(parse_answer("3", &options), None);
        assert_eq!(parse_answer("0", &options), None);
        assert_eq!(parse_answer("maybe", &options), None);
        assert_eq!(parse_answer("", &options), None);
    }

    #[test]
    fn stop_reasons_use_their_wire_names() {
        assert_eq!(stop_reason_name(StopReason::MaxTokens), "max_tokens");
        assert_eq!(stop_reason_name(StopReason::Cancelled), "cancelled");
    }
}
