//! `sandbox-agent bridge`: ACP on stdio toward an editor, forwarded to a
//! sandbox-agent runtime over HTTP.
//!
//! Editors (Zed, command-line ACP clients) start an agent as a local
//! program speaking newline-delimited JSON-RPC on stdin/stdout. The bridge
//! is such a program: each line from the editor is POSTed to the runtime's
//! `/v2/rpc` through `acp-http-client`'s raw layer, and everything the
//! runtime sends back (answers, session updates, the agent's own requests
//! such as `session/request_permission`) is written to stdout, one message
//! per line. The transport (connection id, SSE resume with
//! `Last-Event-ID`, de-duplication, answer ordering) is entirely the
//! client crate's; the bridge adds the agent choice and the editor-facing
//! error handling. Logs go to stderr only: stdout is the ACP channel.
//! With `--transport ws` the same relay runs over one WebSocket on `/acp`
//! instead (the client crate's `Transport::WebSocket`): no resume, so a
//! dropped socket is fatal like a lost event stream.
//!
//! # Layout
//! - this file: the arguments and the relay loop.
//! - [`message`]: what to do with one editor line (forward, inject the
//!   agent, answer a parse error); pure.
//! - [`diagnose`]: transport failures as JSON-RPC errors that say what to
//!   fix, and which of them end the bridge; pure.
//! - [`stdio`]: the editor's lines in, the writer task out.
//!
//! # Lifecycle
//! - stdin EOF: the editor sends nothing more. The bridge still relays
//!   until every request already sent is answered (at most
//!   [`CLOSE_GRACE`], so `printf '…' | sandbox-agent bridge …` shows its
//!   answers and errors), then finishes the POSTs of notifications and of
//!   answers to the agent, closes the connection (DELETE) and exits 0.
//! - stdout closed, SIGTERM or SIGINT: nobody reads any more; the same
//!   without waiting for answers.
//! - A fatal failure (runtime unreachable before the connection exists,
//!   token rejected, connection unknown to the runtime, event stream lost
//!   for good): every request still waiting gets a JSON-RPC error that says
//!   what happened and what to fix, the connection is closed, and the
//!   bridge exits non-zero with the same message on stderr.

pub mod diagnose;
pub mod message;
pub mod stdio;

use acp_http_client::{
    HttpConnection, Incoming, ReconnectPolicy, SendError, Transport, TransportOptions,
};
use acp_runtime::agent::framing::Line;
use acp_runtime::protocol::RpcError;
use clap::Args;
use diagnose::Target;
use futures::{Stream, StreamExt};
use message::{EditorLine, RequestInfo, RuntimeMessage};
use std::collections::HashMap;
use std::time::Duration;
use stdio::EditorOut;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::task::{JoinError, JoinSet};

/// Longest line accepted from the editor, in bytes (ACP messages can carry
/// whole files): the runtime's own default limit on agent stdout lines.
pub const MAX_LINE_BYTES: usize = acp_runtime::config::DEFAULT_MAX_LINE_BYTES;

/// How long the bridge waits at stdin EOF for the answers to the requests
/// already sent; then for the POSTs of notifications and responses the
/// editor already wrote; then for the DELETE.
pub const CLOSE_GRACE: Duration = Duration::from_secs(10);

/// How long the DELETE may take after a fatal failure (the runtime is
/// likely unreachable; do not keep the editor waiting for the exit).
const FATAL_CLOSE_GRACE: Duration = Duration::from_secs(3);

/// How long the writer gets to put the last lines on stdout.
const WRITER_GRACE: Duration = Duration::from_secs(5);

/// `sandbox-agent bridge --url URL --agent NAME [--token T]`.
#[derive(Debug, Clone, Args)]
pub struct BridgeArgs {
    /// Base URL of the runtime, e.g. http://127.0.0.1:2468 (`http://` is
    /// assumed when no scheme is given).
    #[arg(long)]
    pub url: String,
    /// Agent id to use on the runtime (injected into `initialize` and
    /// `session/new` as `_meta["sandboxagent.dev"].agent`).
    #[arg(long)]
    pub agent: String,
    /// Bearer token of the runtime.
    #[arg(long, env = "SANDBOX_AGENT_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// Consecutive failed attempts to reopen a dropped event stream before
    /// the bridge gives up (back-off 250 ms doubling to 10 s, jittered).
    #[arg(long, default_value_t = ReconnectPolicy::default().max_attempts)]
    pub reconnect_attempts: u32,
    /// How to reach the runtime: `http` (POST and a resumable event stream
    /// on /v2/rpc) or `ws` (one WebSocket on /acp: lower latency, but a
    /// dropped socket is fatal, nothing is replayed).
    #[arg(long, value_enum, default_value_t = BridgeTransport::Http)]
    pub transport: BridgeTransport,
}

/// `--transport` of the bridge (research/contract.md, "Bridge").
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BridgeTransport {
    /// `/v2/rpc`: POST each message, Server-Sent Events resumed after a drop.
    Http,
    /// `/acp` over WebSocket: one text frame per message, no resume.
    Ws,
}

/// Runs the bridge on this process's stdin and stdout until stdin closes.
///
/// # Errors
/// The message of a fatal failure (see the module docs); the editor has
/// already received it as JSON-RPC errors on its waiting requests.
pub async fn run(args: BridgeArgs) -> Result<(), String> {
    serve(
        args,
        tokio::io::stdin(),
        tokio::io::stdout(),
        termination_signal(),
    )
    .await
}

/// [`run`] over any pair of byte streams: JSON-RPC lines are read from
/// `input` and written to `output`; `stop` resolving counts as the editor
/// being done (like EOF).
///
/// # Errors
/// As [`run`].
pub async fn serve<R, W>(
    args: BridgeArgs,
    input: R,
    output: W,
    stop: impl Future<Output = ()>,
) -> Result<(), String>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (out, writer) = stdio::spawn_writer(output);
    let lines = stdio::editor_lines(input, MAX_LINE_BYTES);
    let target = Target {
        url: base_url(&args.url),
        agent: args.agent.clone(),
        has_token: args.token.as_deref().is_some_and(|t| !t.is_empty()),
    };
    let connection = transport_options(&args).and_then(|options| {
        HttpConnection::new(options).map_err(|e| format!("cannot set up the bridge: {e}"))
    });
    let result = match connection {
        Ok((connection, incoming)) => {
            tracing::debug!(url = args.url, agent = args.agent, "bridge started");
            let bridge = Bridge {
                connection,
                out,
                target,
                pending: HashMap::new(),
                requests: JoinSet::new(),
                acks: JoinSet::new(),
            };
            bridge.relay(lines, incoming, stop).await
        }
        Err(message) => refuse_first_request(lines, out, message).await,
    };
    match tokio::time::timeout(WRITER_GRACE, writer).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(error))) => tracing::debug!(%error, "writing to the editor failed"),
        Ok(Err(error)) => tracing::warn!(%error, "the writer task failed"),
        Err(_) => tracing::warn!("the editor did not read the last messages in time"),
    }
    result
}

/// Resolves at SIGTERM or SIGINT (editors stop their agents with a
/// signal as often as with EOF); never, if the handlers cannot be
/// installed.
async fn termination_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut sigterm) = signal(SignalKind::terminate()) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = sigterm.recv() => tracing::debug!("SIGTERM"),
        _ = tokio::signal::ctrl_c() => tracing::debug!("SIGINT"),
    }
}

/// `--url` with `http://` added when it names no scheme (`host:port`).
fn base_url(url: &str) -> String {
    if url.contains("://") {
        url.to_owned()
    } else {
        format!("http://{url}")
    }
}

/// The client options for `args`: the URL, the token, the reconnect
/// policy.
fn transport_options(args: &BridgeArgs) -> Result<TransportOptions, String> {
    let mut options = TransportOptions::new(&base_url(&args.url))
        .map_err(|e| format!("invalid --url {:?}: {e}", args.url))?
        .reconnect(ReconnectPolicy {
            max_attempts: args.reconnect_attempts,
            ..ReconnectPolicy::default()
        });
    if args.transport == BridgeTransport::Ws {
        options = options.transport(Transport::WebSocket);
    }
    if let Some(token) = args.token.as_deref().filter(|t| !t.is_empty()) {
        options = options.token(token);
    }
    Ok(options)
}

/// The bridge cannot start (bad `--url` or token): answer the editor's
/// first request with `message` so the editor shows it, then fail.
async fn refuse_first_request<L>(
    mut lines: L,
    out: EditorOut,
    message: String,
) -> Result<(), String>
where
    L: Stream<Item = std::io::Result<Line>> + Unpin,
{
    let error = diagnose::invalid_setup(message.clone());
    while let Some(Ok(line)) = lines.next().await {
        let Line::Message(line) = line else { continue };
        match message::read_editor_line(&line, "") {
            EditorLine::Forward {
                request: Some(request),
                ..
            } => {
                out.send(message::error_line_for(&request.id, &error));
                break;
            }
            EditorLine::Reject(answer) => out.send(answer),
            _ => {}
        }
    }
    Err(message)
}

/// Why the relay loop stopped.
enum End {
    /// stdin closed or stdout went away: the editor is done.
    EditorDone,
    /// The bridge cannot go on; every waiting request gets this error.
    Fatal(RpcError),
}

/// A POST that failed, as its task reports it.
struct Failure {
    /// The request it carried, if it was one.
    request: Option<RequestInfo>,
    /// The message's method (`None` for an answer to the agent), for logs.
    method: Option<String>,
    error: SendError,
}

/// The relay between one editor and one runtime connection.
struct Bridge {
    /// The runtime connection (raw layer of `acp-http-client`).
    connection: HttpConnection,
    /// Lines for the editor.
    out: EditorOut,
    /// URL, agent and token presence, for error messages.
    target: Target,
    /// The editor's requests not answered yet: raw id text → how many
    /// (an editor may reuse an id; the runtime answers both).
    pending: HashMap<String, usize>,
    /// POSTs of the editor's requests; each reports its failure, if any.
    requests: JoinSet<Option<Failure>>,
    /// POSTs of notifications and of answers to the agent; finished
    /// before the DELETE at stdin EOF.
    acks: JoinSet<Option<Failure>>,
}

impl Bridge {
    /// Relays until the editor is done or a fatal failure.
    async fn relay<L>(
        mut self,
        mut lines: L,
        mut incoming: Incoming,
        stop: impl Future<Output = ()>,
    ) -> Result<(), String>
    where
        L: Stream<Item = std::io::Result<Line>> + Unpin,
    {
        let mut stop = std::pin::pin!(stop);
        // Set at stdin EOF: from then on the bridge only waits (until this
        // instant) for the answers to the requests already sent.
        let mut draining_until: Option<tokio::time::Instant> = None;
        let drain_deadline = async |until: Option<tokio::time::Instant>| match until {
            Some(until) => tokio::time::sleep_until(until).await,
            None => std::future::pending().await,
        };
        let end = loop {
            if draining_until.is_some() && self.pending.is_empty() {
                break End::EditorDone;
            }
            tokio::select! {
                line = lines.next(), if draining_until.is_none() => match line {
                    Some(Ok(line)) => self.on_editor_line(line),
                    Some(Err(error)) => {
                        tracing::warn!(%error, "reading stdin failed; closing");
                        break End::EditorDone;
                    }
                    None => {
                        tracing::debug!(waiting = self.pending.len(), "stdin closed");
                        draining_until = Some(tokio::time::Instant::now() + CLOSE_GRACE);
                    }
                },
                message = incoming.next() => match message {
                    Some(Ok(message)) => self.on_runtime_message(message),
                    Some(Err(error)) => {
                        break End::Fatal(diagnose::stream_failure(&error, &self.target));
                    }
                    None => {
                        break End::Fatal(RpcError::new(
                            acp_runtime::protocol::code::INTERNAL_ERROR,
                            "the connection to the runtime ended",
                        ));
                    }
                },
                Some(done) = self.requests.join_next(), if !self.requests.is_empty() => {
                    if let Some(fatal) = self.post_done(done) {
                        break End::Fatal(fatal);
                    }
                }
                Some(done) = self.acks.join_next(), if !self.acks.is_empty() => {
                    if let Some(fatal) = self.post_done(done) {
                        break End::Fatal(fatal);
                    }
                }
                () = self.out.closed() => {
                    tracing::debug!("stdout closed");
                    break End::EditorDone;
                }
                () = &mut stop => break End::EditorDone,
                () = drain_deadline(draining_until) => {
                    tracing::warn!(
                        unanswered = self.pending.len(),
                        "stdin closed and requests still unanswered after {CLOSE_GRACE:?}; closing"
                    );
                    break End::EditorDone;
                }
            }
        };
        match end {
            End::EditorDone => {
                self.finish().await;
                Ok(())
            }
            End::Fatal(error) => Err(self.fail(error).await),
        }
    }

    /// One line from the editor.
    fn on_editor_line(&mut self, line: Line) {
        let line = match line {
            Line::Message(line) => line,
            Line::TooLong { length, .. } => {
                self.out.send(message::error_line(
                    None,
                    &RpcError::new(
                        acp_runtime::protocol::code::INVALID_REQUEST,
                        format!(
                            "Invalid Request: a message of {length} bytes is over the bridge's \
                             limit of {MAX_LINE_BYTES} bytes"
                        ),
                    ),
                ));
                return;
            }
        };
        match message::read_editor_line(&line, &self.target.agent) {
            EditorLine::Blank => {}
            EditorLine::Reject(answer) => self.out.send(answer),
            EditorLine::Forward {
                body,
                request,
                method,
            } => {
                let post = self.connection.submit(body);
                let is_request = request.is_some();
                if let Some(request) = &request {
                    *self.pending.entry(request.id.clone()).or_insert(0) += 1;
                }
                let task = async move {
                    post.await.err().map(|error| Failure {
                        request,
                        method,
                        error,
                    })
                };
                if is_request {
                    self.requests.spawn(task);
                } else {
                    self.acks.spawn(task);
                }
            }
        }
    }

    /// One message from the runtime, for the editor.
    fn on_runtime_message(&mut self, message: String) {
        match message::read_runtime_message(&message) {
            RuntimeMessage::Response(id) => {
                self.answered(&id);
            }
            RuntimeMessage::Notification(method)
                if method == ext_methods::notification::STREAM_GAP =>
            {
                tracing::warn!(
                    gap = message,
                    "the runtime's replay buffer no longer held some events; the editor missed them"
                );
            }
            _ => {}
        }
        self.out.send(message);
    }

    /// Takes one waiting request with raw id `id`; `false` if none waits.
    fn answered(&mut self, id: &str) -> bool {
        match self.pending.get_mut(id) {
            Some(count) if *count > 1 => {
                *count -= 1;
                true
            }
            Some(_) => {
                self.pending.remove(id);
                true
            }
            None => false,
        }
    }

    /// A POST task finished. Answers a request the runtime will never
    /// answer; returns the error to end the bridge with when the failure is
    /// fatal.
    fn post_done(&mut self, done: Result<Option<Failure>, JoinError>) -> Option<RpcError> {
        let failure = match done {
            Ok(failure) => failure?,
            Err(error) => {
                tracing::warn!(%error, "a POST task failed");
                return None;
            }
        };
        let connected = self.connection.connection_id().is_some();
        let diagnosis = diagnose::post_failure(&failure.error.error, &self.target, connected);
        tracing::debug!(
            error = %failure.error,
            method = failure.method,
            fatal = diagnosis.fatal,
            "POST failed"
        );
        if diagnosis.fatal {
            return Some(diagnosis.error);
        }
        match (failure.error.released, failure.request) {
            (Some(id), _) => {
                if self.answered(&id) {
                    self.out
                        .send(message::error_line_for(&id, &diagnosis.error));
                }
            }
            (None, Some(request)) => tracing::debug!(
                id = request.id,
                "the request reached the runtime; its answer comes on the event stream"
            ),
            (None, None) => tracing::warn!(method = failure.method, "{}", diagnosis.error.message),
        }
        None
    }

    /// The editor is done: finish the POSTs it does not wait for, close
    /// the connection (DELETE).
    async fn finish(mut self) {
        let drained = tokio::time::timeout(CLOSE_GRACE, async {
            while self.acks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!("messages to the runtime still unsent at exit");
        }
        // The runtime answers the requests still waiting with "connection
        // closed"; nobody reads those answers any more.
        self.requests.abort_all();
        match tokio::time::timeout(CLOSE_GRACE, self.connection.close()).await {
            Ok(Ok(())) => tracing::debug!("connection closed"),
            Ok(Err(error)) => tracing::warn!(%error, "closing the connection failed"),
            Err(_) => tracing::warn!("closing the connection timed out"),
        }
    }

    /// A fatal failure: every waiting request gets `error`, the connection
    /// is closed. Returns the message for the exit.
    async fn fail(mut self, error: RpcError) -> String {
        let pending = std::mem::take(&mut self.pending);
        for (id, count) in pending {
            for _ in 0..count {
                self.out.send(message::error_line_for(&id, &error));
            }
        }
        self.requests.abort_all();
        self.acks.abort_all();
        if let Ok(Err(close_error)) =
            tokio::time::timeout(FATAL_CLOSE_GRACE, self.connection.close()).await
        {
            tracing::debug!(%close_error, "closing the connection failed");
        }
        error.message
    }
}
