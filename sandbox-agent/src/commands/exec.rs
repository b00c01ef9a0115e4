//! `sandbox-agent exec [--url URL] [--token T] [--cwd DIR] [-t] [-e
//! KEY=VALUE]… -- CMD ARGS…`: runs a program in the sandbox of a running
//! server through its process API and behaves like the program
//! (research/contract.md, "CLI: exec and ps").
//!
//! The program is started, signalled and fed through the SDK's process
//! handle (`sandbox_agent_sdk::ProcessHandle`).
//!
//! - Without `-t` the program gets pipes: its stdout goes to stdout, its
//!   stderr to stderr, followed by the SDK's output stream, which resumes
//!   with `Last-Event-ID` when the connection drops (no byte lost or
//!   repeated while the server's ring holds them; a `dropped` notice on
//!   stderr otherwise). Local stdin is relayed (`POST …/input`), then
//!   closed (`?eof=true`). SIGINT, SIGTERM and SIGHUP are forwarded to the
//!   program.
//! - With `-t` the program gets a terminal of the local terminal's size,
//!   the local terminal is put in raw mode (and restored on every way
//!   out), and bytes go both ways over the terminal WebSocket (which the
//!   SDK does not speak: it is opened here); SIGWINCH becomes a resize, a
//!   dropped socket is resumed at the byte offset reached.
//!
//! The exit status is the program's: its exit code, or 128 + the signal's
//! number when a signal ended it (as a shell reports it). When `exec`
//! itself fails it prints why and exits 125, or 127 when the server has no
//! such program.

use super::args::{Failure, Remote, RemoteArgs, URL_ENV};
use bytes::Bytes;
use clap::Args;
use futures::{SinkExt, StreamExt};
use sandbox_agent_sdk::{
    Exit, OutputChunk, OutputEvent, OutputStream, ProcessHandle, ProcessRequest,
};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::str::FromStr;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::signal::unix::{SignalKind, signal};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{self, Message};

/// Exit status when `exec` itself fails (as `docker exec`).
const FAILED: u8 = 125;
/// Exit status when the server has no such program (as a shell).
const NOT_FOUND: u8 = 127;
/// Most stdin bytes one read takes (one `POST …/input`, one frame).
const STDIN_CHUNK: usize = 64 * 1024;
/// Reconnections of the terminal WebSocket in a row without a byte of
/// progress before giving up (the output stream's are the SDK's).
const MAX_RESUMES: u32 = 10;
/// Pause before the first reconnection (doubled each time, at most 2 s).
const FIRST_PAUSE: Duration = Duration::from_millis(100);
/// The signals `exec` forwards to the program instead of dying of them.
const FORWARDED: [(SignalKind, &str); 3] = [
    (SignalKind::interrupt(), "SIGINT"),
    (SignalKind::terminate(), "SIGTERM"),
    (SignalKind::hangup(), "SIGHUP"),
];

/// `sandbox-agent exec`.
#[derive(Debug, Clone, Args)]
#[command(mut_arg("url", |url| url.env(URL_ENV)))]
pub struct ExecArgs {
    /// `--url` (else $SANDBOX_AGENT_URL) and `--token`.
    #[command(flatten)]
    pub server: RemoteArgs,
    /// The program's working directory in the sandbox (default: the
    /// server's).
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<String>,
    /// Run the program on a terminal and attach the local one (raw mode;
    /// stdin must be a terminal).
    #[arg(short = 't', long = "tty")]
    pub tty: bool,
    /// Set a variable in the program's environment (repeatable).
    #[arg(short = 'e', long = "env", value_name = "KEY=VALUE", value_parser = env_pair)]
    pub env: Vec<(String, String)>,
    /// The program (found on the server's PATH) and its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub command: Vec<String>,
}

/// `KEY=VALUE` as a pair.
fn env_pair(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_owned(), value.to_owned())),
        _ => Err(format!("{text:?} is not KEY=VALUE")),
    }
}

/// Runs `sandbox-agent exec`: the program's exit status as its own
/// (module doc).
pub async fn run(args: ExecArgs) -> ExitCode {
    match exec(args).await {
        Ok(status) => ExitCode::from(status),
        Err(failure) => {
            eprintln!("sandbox-agent: {}", failure.message);
            ExitCode::from(if failure.kind == "program-not-found" {
                NOT_FOUND
            } else {
                FAILED
            })
        }
    }
}

/// A failure of `exec` itself, with `message`.
fn failure(message: impl Into<String>) -> Failure {
    Failure {
        kind: String::new(),
        message: message.into(),
    }
}

async fn exec(args: ExecArgs) -> Result<u8, Failure> {
    let remote = args.server.remote().await.map_err(failure)?;
    let (program, program_args) = args
        .command
        .split_first()
        .ok_or_else(|| failure("name the program to run: exec -- CMD ARGS…"))?;
    let mut env: BTreeMap<String, String> = args.env.iter().cloned().collect();
    let mut request = ProcessRequest::new(program).args(program_args);
    if let Some(cwd) = &args.cwd {
        request = request.cwd(cwd);
    }
    let raw = if args.tty {
        if !std::io::stdin().is_terminal() {
            return Err(failure(
                "-t needs a terminal on stdin (run it in a terminal, or leave -t out)",
            ));
        }
        let size = rustix::termios::tcgetwinsize(std::io::stdin())
            .map_err(|e| failure(format!("cannot read the terminal's size: {e}")))?;
        request = request.tty(size.ws_col.max(1), size.ws_row.max(1));
        // The program draws for the local terminal: tell it which one.
        if let Ok(term) = std::env::var("TERM") {
            env.entry("TERM".to_owned()).or_insert(term);
        }
        // Raw before the start: keys typed meanwhile are not echoed twice.
        Some(RawMode::enter().map_err(|e| failure(format!("cannot set the terminal: {e}")))?)
    } else {
        None
    };
    request.env = env;
    let process = remote.client.start_process(request).await?;
    let forwarding = tokio::spawn(forward_signals(process.clone()));
    let exit = match raw {
        Some(raw) => {
            let exit = attach(&remote, process.id()).await;
            drop(raw);
            exit
        }
        None => {
            let stdin = tokio::spawn(relay_stdin(process.clone()));
            let exit = follow(&process).await;
            stdin.abort();
            exit
        }
    };
    forwarding.abort();
    Ok(status_of(&exit?))
}

/// The shell's status of an exit: the code, or 128 + the signal's number.
fn status_of(exit: &Exit) -> u8 {
    if let Some(code) = exit.exit_code {
        // A shell sees the low 8 bits.
        return (code & 0xff) as u8;
    }
    let number = exit
        .signal
        .as_deref()
        .and_then(|name| nix::sys::signal::Signal::from_str(name).ok())
        .map_or(0, |signal| signal as i32);
    u8::try_from(128 + number).unwrap_or(u8::MAX)
}

/// Forwards SIGINT, SIGTERM and SIGHUP to the program until aborted: the
/// program decides, and its exit becomes `exec`'s.
async fn forward_signals(process: ProcessHandle) {
    let mut streams = Vec::new();
    for (kind, name) in FORWARDED {
        if let Ok(stream) = signal(kind) {
            streams.push(futures::stream::unfold(
                stream,
                move |mut stream| async move { stream.recv().await.map(|()| (name, stream)) },
            ));
        }
    }
    let mut received = futures::stream::select_all(streams.into_iter().map(Box::pin));
    while let Some(name) = received.next().await {
        let _ = process.signal(name).await;
    }
}

/// Relays local stdin to the program, then closes its stdin. Stops early
/// when the program no longer takes input (it exited or closed stdin).
async fn relay_stdin(process: ProcessHandle) {
    let mut stdin = tokio::io::stdin();
    let mut buffer = vec![0; STDIN_CHUNK];
    loop {
        let read = stdin.read(&mut buffer).await.unwrap_or(0);
        let sent = match read {
            0 => process.close_stdin().await,
            _ => {
                process
                    .write_stdin(Bytes::copy_from_slice(&buffer[..read]))
                    .await
            }
        };
        match sent {
            Ok(()) if read > 0 => {}
            Ok(()) => return,
            Err(error) => {
                let failure = Failure::from(error);
                if failure.kind != "process-exited" {
                    eprintln!("sandbox-agent: stdin relay stopped: {}", failure.message);
                }
                return;
            }
        }
    }
}

/// Follows the program's output until its exit (module doc): stdout and
/// stderr chunks to ours. The SDK's stream resumes after a cut; it ends
/// with an error when the server refuses a reopen (404 once forgotten,
/// 401: final, reported as the server says) or cannot be reached again.
async fn follow(process: &ProcessHandle) -> Result<Exit, Failure> {
    let mut stdout = tokio::io::stdout();
    let mut stderr = tokio::io::stderr();
    let mut output = process.output();
    while let Some(event) = output.next().await {
        match event {
            Ok(OutputEvent::Chunk(chunk)) => write_chunk(&chunk, &mut stdout, &mut stderr).await?,
            Ok(OutputEvent::Dropped(gap)) => eprintln!(
                "sandbox-agent: {} bytes of output were lost (the server no longer held them)",
                gap.dropped
            ),
            Ok(OutputEvent::Exit(exit)) => return Ok(exit),
            Err(sandbox_agent_sdk::Error::InvalidResponse { message, .. }) => {
                return Err(failure(format!("a bad output chunk: {message}")));
            }
            Err(error) if error.is_connection_lost() => break,
            Err(error) => return Err(Failure::from(error)),
        }
    }
    Err(failure("lost the output stream and could not resume it"))
}

/// Writes one output chunk to stdout or stderr (a terminal's to stdout).
async fn write_chunk(
    chunk: &OutputChunk,
    stdout: &mut (impl AsyncWrite + Unpin),
    stderr: &mut (impl AsyncWrite + Unpin),
) -> Result<(), Failure> {
    let bytes = chunk
        .bytes()
        .map_err(|e| failure(format!("a bad base64 output chunk: {e}")))?;
    let out: &mut (dyn AsyncWrite + Unpin) = match chunk.stream {
        OutputStream::Stderr => stderr,
        OutputStream::Stdout | OutputStream::Tty => stdout,
    };
    let written = async {
        out.write_all(&bytes).await?;
        out.flush().await
    };
    written
        .await
        .map_err(|e| failure(format!("cannot write the output: {e}")))
}

/// Reconnections of the terminal WebSocket in a row without progress, with
/// a growing pause between them.
#[derive(Default)]
struct Resumes {
    /// Reconnections since the last progress.
    count: u32,
}

impl Resumes {
    /// The stream moved on: the next cut starts counting again.
    fn progress(&mut self) {
        self.count = 0;
    }

    /// Waits before the next reconnection; `Err` after [`MAX_RESUMES`].
    async fn pause(&mut self) -> Result<(), ()> {
        if self.count >= MAX_RESUMES {
            return Err(());
        }
        let pause = (FIRST_PAUSE * 2u32.pow(self.count)).min(Duration::from_secs(2));
        self.count += 1;
        tokio::time::sleep(pause).await;
        Ok(())
    }
}

/// The local terminal in raw mode (no echo, no line editing, no signals
/// from keys: every byte goes to the program's terminal), restored when
/// dropped, whichever way `exec` ends.
struct RawMode {
    /// The settings to restore.
    saved: rustix::termios::Termios,
}

impl RawMode {
    fn enter() -> std::io::Result<Self> {
        let stdin = std::io::stdin();
        let saved = rustix::termios::tcgetattr(&stdin)?;
        let mut raw = saved.clone();
        raw.make_raw();
        rustix::termios::tcsetattr(&stdin, rustix::termios::OptionalActions::Now, &raw)?;
        Ok(Self { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = rustix::termios::tcsetattr(
            std::io::stdin(),
            rustix::termios::OptionalActions::Now,
            &self.saved,
        );
    }
}

/// A WebSocket to the server.
type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Attaches the local terminal to the program's terminal WebSocket until
/// its `exit` frame (module doc).
async fn attach(remote: &Remote, id: &str) -> Result<Exit, Failure> {
    let mut stdout = tokio::io::stdout();
    let (keys, mut typed) = tokio::sync::mpsc::channel::<Bytes>(4);
    let reader = tokio::spawn(read_keys(tokio::io::stdin(), keys));
    let mut resized = signal(SignalKind::window_change())
        .map_err(|e| failure(format!("cannot watch the terminal's size: {e}")))?;
    let mut offset = 0u64;
    let mut resumes = Resumes::default();
    let mut stdin_open = true;
    let exit = 'sockets: loop {
        let socket = match connect(remote, id, offset).await {
            Ok(socket) => socket,
            Err(failure) if !failure.kind.is_empty() => break Err(failure),
            Err(_) => None,
        };
        if let Some(socket) = socket {
            let (mut sink, mut source) = socket.split();
            // The size may have changed while the socket was away.
            let mut open = sink.send(resize_frame()).await.is_ok();
            while open {
                tokio::select! {
                    message = source.next() => match message {
                        Some(Ok(Message::Binary(bytes))) => {
                            offset += bytes.len() as u64;
                            resumes.progress();
                            let written = async {
                                stdout.write_all(&bytes).await?;
                                stdout.flush().await
                            };
                            if let Err(error) = written.await {
                                break 'sockets Err(failure(format!("cannot write the output: {error}")));
                            }
                        }
                        Some(Ok(Message::Text(text))) => {
                            let notice: Value = serde_json::from_str(text.as_str()).unwrap_or_default();
                            match notice["type"].as_str() {
                                Some("exit") => break 'sockets Ok(exit_of(notice)),
                                Some("dropped") => {
                                    offset = notice["nextOffset"].as_u64().unwrap_or(offset);
                                }
                                Some("error") => {
                                    let detail = notice["problem"]["detail"].as_str().unwrap_or("");
                                    eprint!("\r\nsandbox-agent: {detail}\r\n");
                                }
                                _ => {}
                            }
                        }
                        Some(Ok(Message::Close(_)) | Err(_)) | None => open = false,
                        Some(Ok(_)) => {}
                    },
                    key = typed.recv(), if stdin_open => match key {
                        Some(bytes) => {
                            if sink.send(Message::Binary(bytes)).await.is_err() {
                                open = false;
                            }
                        }
                        // Local stdin ended (the terminal hung up): the
                        // program gets its end-of-file character.
                        None => {
                            let _ = sink.send(Message::text(r#"{"type":"eof"}"#)).await;
                            stdin_open = false;
                        }
                    },
                    _ = resized.recv() => {
                        if sink.send(resize_frame()).await.is_err() {
                            open = false;
                        }
                    }
                }
            }
        }
        if resumes.pause().await.is_err() {
            break Err(failure(
                "lost the terminal's connection and could not resume it",
            ));
        }
    };
    reader.abort();
    exit
}

/// How the program ended, from the terminal's `exit` frame `{"type":
/// "exit", exitCode, signal}` (neither when they cannot be read: status
/// 128, as before the SDK).
fn exit_of(notice: Value) -> Exit {
    serde_json::from_value(notice).unwrap_or(Exit {
        exit_code: None,
        signal: None,
    })
}

/// The resize frame of the local terminal's size now (80×24 when it
/// cannot be read).
fn resize_frame() -> Message {
    let (cols, rows) = rustix::termios::tcgetwinsize(std::io::stdin())
        .map_or((80, 24), |size| (size.ws_col.max(1), size.ws_row.max(1)));
    Message::text(json!({"type": "resize", "cols": cols, "rows": rows}).to_string())
}

/// Reads local stdin into `keys` as it comes (a key press is a read).
async fn read_keys(mut stdin: impl AsyncRead + Unpin, keys: tokio::sync::mpsc::Sender<Bytes>) {
    let mut buffer = vec![0; STDIN_CHUNK];
    while let Ok(read) = stdin.read(&mut buffer).await {
        if read == 0
            || keys
                .send(Bytes::copy_from_slice(&buffer[..read]))
                .await
                .is_err()
        {
            return;
        }
    }
}

/// Opens the terminal WebSocket from byte `offset` on: `None` when the
/// server could not be reached (worth another try).
///
/// # Errors
/// The server's refusal (a problem document), or a URL that is not
/// `http://` (the WebSocket client here speaks no TLS).
async fn connect(remote: &Remote, id: &str, offset: u64) -> Result<Option<Socket>, Failure> {
    let Some(rest) = remote.base.strip_prefix("http://") else {
        return Err(Failure {
            kind: "tls".to_owned(),
            message: "exec -t speaks to http:// servers only".to_owned(),
        });
    };
    let url = format!("ws://{rest}/v2/processes/{id}/terminal?offset={offset}");
    let mut request = url
        .into_client_request()
        .map_err(|e| failure(format!("bad terminal URL: {e}")))?;
    if let Some(token) = &remote.token
        && let Ok(value) = http::HeaderValue::from_str(&format!("Bearer {token}"))
    {
        request
            .headers_mut()
            .insert(http::header::AUTHORIZATION, value);
    }
    match tokio_tungstenite::connect_async(request).await {
        Ok((socket, _)) => Ok(Some(socket)),
        Err(tungstenite::Error::Http(response)) => {
            let problem = response
                .body()
                .as_deref()
                .and_then(|body| std::str::from_utf8(body).ok())
                .and_then(sandbox_agent_sdk::Problem::parse);
            let mut refused = Failure::of_http(&sandbox_agent_sdk::HttpFailure {
                status: response.status(),
                problem: problem.map(Box::new),
            });
            if refused.kind.is_empty() {
                refused.kind = "refused".to_owned();
            }
            Err(refused)
        }
        Err(_) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_status_as_a_shell_reports_it() {
        let status = |notice: Value| status_of(&exit_of(notice));
        assert_eq!(status(json!({"exitCode": 0, "signal": null})), 0);
        assert_eq!(status(json!({"exitCode": 3, "signal": null})), 3);
        assert_eq!(status(json!({"exitCode": 256, "signal": null})), 0);
        assert_eq!(status(json!({"exitCode": null, "signal": "SIGKILL"})), 137);
        assert_eq!(status(json!({"exitCode": null, "signal": "SIGINT"})), 130);
        // The terminal's exit frame carries its type; a frame without
        // either is status 128.
        assert_eq!(status(json!({"type": "exit", "exitCode": 4})), 4);
        assert_eq!(status(json!({"type": "exit"})), 128);
    }

    #[test]
    fn env_pairs() {
        assert_eq!(
            env_pair("A=b=c").ok(),
            Some(("A".to_owned(), "b=c".to_owned()))
        );
        assert!(env_pair("=x").is_err());
        assert!(env_pair("A").is_err());
    }
}
