//! Params and results of the process API (research/contract.md, "Processes
//! and terminals"): the JSON bodies of the `/v2/processes…` routes and the
//! `_sandboxagent/process/*` methods, which are the same shapes. Output
//! bytes and following stay on HTTP (`GET /v2/processes/{id}/output`); the
//! methods carry everything else.
//!
//! Bytes that are valid UTF-8 travel as text; other bytes as base64 with
//! `encoding: "base64"` beside them ([`Encoding`]). Output chunks, a run's
//! `stdout`/`stderr` and the `input` method's `data` follow that one rule.

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// How bytes are written in a JSON string: absent for UTF-8 text,
/// `"base64"` (RFC 4648 section 4, padded) otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// Standard base64 with padding.
    Base64,
}

/// `bytes` as `(text, None)` when they are UTF-8, else as
/// `(base64, Some(Base64))`.
pub fn encode_bytes(bytes: &[u8]) -> (String, Option<Encoding>) {
    match std::str::from_utf8(bytes) {
        Ok(text) => (text.to_owned(), None),
        Err(_) => (
            base64::engine::general_purpose::STANDARD.encode(bytes),
            Some(Encoding::Base64),
        ),
    }
}

/// The bytes of `data` written with `encoding`.
///
/// # Errors
/// [`InvalidBase64`] when `encoding` is base64 and `data` is not.
pub fn decode_bytes(data: &str, encoding: Option<Encoding>) -> Result<Vec<u8>, InvalidBase64> {
    match encoding {
        None => Ok(data.as_bytes().to_vec()),
        Some(Encoding::Base64) => base64::engine::general_purpose::STANDARD
            .decode(data)
            .map_err(|error| InvalidBase64(error.to_string())),
    }
}

/// A string that says it is base64 and is not.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("data is not valid base64: {0}")]
pub struct InvalidBase64(pub String);

/// What to run: the body of `POST /v2/processes` (start) and
/// `POST /v2/processes/run` (run to completion), and the params of
/// `_sandboxagent/process/start` and `_sandboxagent/process/run`.
/// Unknown fields are refused (400 `invalid-request`, JSON-RPC `-32602`).
///
/// `tty`, `cols` and `rows` belong to a start; `timeoutMs` and
/// `maxOutputBytes` to a run (the other operation refuses them).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProcessRequest {
    /// The program: a name looked up on `PATH`, or a path. Never a shell
    /// line (run `sh` with `-c` for one).
    pub command: String,
    /// Its arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Its working directory: absolute, or relative to the session's `cwd`
    /// (else the server's); under `--fs-root` when that is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Variables set on top of the server's environment (minus its own
    /// secrets). A name must not contain `=` or NUL; a value no NUL.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Start it on a pseudo-terminal (start only).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tty: bool,
    /// Terminal columns (default 80, 1 to 4096; with `tty` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cols: Option<u16>,
    /// Terminal rows (default 24, 1 to 4096; with `tty` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<u16>,
    /// Text written to stdin first (a run closes stdin after it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    /// A label for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// The session it belongs to (also the base of a relative `cwd`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// Run only: killed (tree and all) after this many milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Run only: most bytes kept of stdout and of stderr each (default
    /// 1 MiB, at most 16 MiB); past it the process is killed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_bytes: Option<u64>,
}

impl ProcessRequest {
    /// `command` with nothing else set.
    pub fn new(command: impl Into<String>) -> Self {
        Self {
            command: command.into(),
            ..Self::default()
        }
    }

    /// Appends one argument.
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Appends arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets the working directory.
    pub fn cwd(mut self, cwd: impl Into<String>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }

    /// Sets one environment variable.
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(name.into(), value.into());
        self
    }

    /// A terminal of `cols` × `rows` cells (start only).
    pub fn tty(mut self, cols: u16, rows: u16) -> Self {
        self.tty = true;
        self.cols = Some(cols);
        self.rows = Some(rows);
        self
    }

    /// Text written to stdin first.
    pub fn stdin(mut self, text: impl Into<String>) -> Self {
        self.stdin = Some(text.into());
        self
    }

    /// A label for people.
    pub fn title(mut self, title: impl Into<String>) -> Self {
        self.title = Some(title.into());
        self
    }

    /// The session it belongs to.
    pub fn session(mut self, session_id: impl Into<String>) -> Self {
        self.session_id = Some(session_id.into());
        self
    }

    /// Run only: the time limit (whole milliseconds, rounded down).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout_ms = Some(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX));
        self
    }

    /// Run only: most bytes kept of stdout and of stderr each.
    pub fn max_output_bytes(mut self, bytes: u64) -> Self {
        self.max_output_bytes = Some(bytes);
        self
    }
}

/// Whether a process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ProcessState {
    /// Running (or starting).
    Running,
    /// Exited; `exitCode` or `signal` says how.
    Exited,
}

impl ProcessState {
    /// `running` or `exited`, as on the wire (and in the list's `state`
    /// filter).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Exited => "exited",
        }
    }
}

/// A process: the answer of a start, `GET /v2/processes/{id}` and
/// `_sandboxagent/process/get`, and each entry of a list:
/// `{id, pid, command, args, cwd, tty, title, sessionId, toolCallId, state,
/// exitCode, signal, startedAt, endedAt, outputBytes}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProcessInfo {
    /// The process API's id (not the operating system's pid).
    pub id: String,
    /// The program's operating-system pid (`null` until seen).
    pub pid: Option<i32>,
    /// The program as asked for.
    pub command: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Its working directory (absolute).
    pub cwd: String,
    /// Whether it runs on a terminal.
    pub tty: bool,
    /// The label given at start.
    pub title: Option<String>,
    /// Its session, if any.
    pub session_id: Option<String>,
    /// The tool call that shows it (an agent's terminal), if any.
    #[serde(default)]
    pub tool_call_id: Option<String>,
    /// `running` or `exited`.
    pub state: ProcessState,
    /// The exit code, once it exited on its own.
    pub exit_code: Option<i32>,
    /// The signal that ended it (`SIGKILL`), once a signal did.
    pub signal: Option<String>,
    /// When it started, RFC 3339 (UTC).
    pub started_at: String,
    /// When it exited, RFC 3339 (UTC).
    pub ended_at: Option<String>,
    /// Every byte of output so far: the offset the next byte gets.
    pub output_bytes: u64,
}

/// One page of processes: the answer of `GET /v2/processes` and
/// `_sandboxagent/process/list`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProcessPage {
    /// Newest first (by start).
    pub processes: Vec<ProcessInfo>,
    /// Pass as `cursor` (with the same filters) for the next page; absent
    /// on the last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// Params of `_sandboxagent/process/list` (the query of
/// `GET /v2/processes`): every field may be left out.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProcessListParams {
    /// Processes per page, 1 to [`MAX_PROCESS_PAGE`] (default
    /// [`DEFAULT_PROCESS_PAGE`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// A previous page's `nextCursor`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
    /// Only this session's processes.
    #[serde(alias = "session_id", default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// Only running or only exited ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<ProcessState>,
}

/// Processes per list page when `limit` is not given.
pub const DEFAULT_PROCESS_PAGE: u32 = 100;
/// Most processes per list page.
pub const MAX_PROCESS_PAGE: u32 = 1000;

/// `{processId}`: params of `_sandboxagent/process/get`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProcessRef {
    /// The process API's id.
    pub process_id: String,
}

/// `{processId, signal}`: params of `_sandboxagent/process/signal` (the
/// route's body is `{signal}`). `signal` is a name in any case, with or
/// without `SIG` (`"SIGINT"`, `"term"`); `SIGKILL` kills the whole tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProcessSignalParams {
    /// The process API's id.
    pub process_id: String,
    /// The signal's name.
    pub signal: String,
}

/// `{processId, data?, encoding?, eof?}`: params of
/// `_sandboxagent/process/input`. `data` is text, or base64 with
/// `encoding: "base64"` (the rule of output chunks); `eof: true` closes
/// stdin after it (on a terminal: sends its end-of-file character, `^D`).
/// The route takes the raw bytes as its body and `?eof=true`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProcessInputParams {
    /// The process API's id.
    pub process_id: String,
    /// The bytes to write, as text or base64.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub data: String,
    /// `"base64"` when `data` is base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<Encoding>,
    /// Close stdin after `data`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub eof: bool,
}

impl ProcessInputParams {
    /// Input of `bytes` (as text when they are UTF-8, else base64) for
    /// `process_id`; `eof` closes stdin after them.
    pub fn new(process_id: impl Into<String>, bytes: &[u8], eof: bool) -> Self {
        let (data, encoding) = encode_bytes(bytes);
        Self {
            process_id: process_id.into(),
            data,
            encoding,
            eof,
        }
    }

    /// The bytes to write.
    ///
    /// # Errors
    /// [`InvalidBase64`] for base64 `data` that is not.
    pub fn bytes(&self) -> Result<Vec<u8>, InvalidBase64> {
        decode_bytes(&self.data, self.encoding)
    }
}

/// `{processId, cols, rows}`: params of `_sandboxagent/process/resize` (the
/// route's body is `{cols, rows}`), in character cells, 1 to 4096 each.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProcessResizeParams {
    /// The process API's id.
    pub process_id: String,
    /// Columns.
    pub cols: u16,
    /// Rows.
    pub rows: u16,
}

/// `{signal}`: the body of `POST /v2/processes/{id}/signal`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SignalBody {
    /// The signal's name (as in [`ProcessSignalParams`]).
    pub signal: String,
}

/// `{cols, rows}`: the body of `POST /v2/processes/{id}/resize`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResizeBody {
    /// Columns.
    pub cols: u16,
    /// Rows.
    pub rows: u16,
}

/// How a process ended: `{exitCode, signal}`, the data of the followed
/// output's `event: exit`. One of them is set (both `null` when the server
/// could not learn it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Exit {
    /// The exit code, when it exited on its own.
    pub exit_code: Option<i32>,
    /// The signal's name (`SIGKILL`), when a signal ended it.
    pub signal: Option<String>,
}

impl Exit {
    /// Whether it exited on its own with code 0.
    pub fn success(&self) -> bool {
        self.exit_code == Some(0)
    }
}

/// The answer of a run to completion (`POST /v2/processes/run`,
/// `_sandboxagent/process/run`): `{exitCode, signal, stdout,
/// stdoutEncoding?, stderr, stderrEncoding?, truncated, timedOut,
/// durationMs}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunResult {
    /// The exit code, when it exited on its own.
    pub exit_code: Option<i32>,
    /// The signal that ended it (`SIGKILL` after the timeout or the cap).
    pub signal: Option<String>,
    /// Standard output, at most `maxOutputBytes`.
    pub stdout: String,
    /// `"base64"` when `stdout` is base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout_encoding: Option<Encoding>,
    /// Standard error, at most `maxOutputBytes`.
    pub stderr: String,
    /// `"base64"` when `stderr` is base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_encoding: Option<Encoding>,
    /// Whether output passed the cap (the process was killed then).
    pub truncated: bool,
    /// Whether the timeout passed (the process was killed then).
    pub timed_out: bool,
    /// From start to exit, in milliseconds.
    pub duration_ms: u64,
}

impl RunResult {
    /// The bytes of standard output.
    ///
    /// # Errors
    /// [`InvalidBase64`] when the server sent broken base64.
    pub fn stdout_bytes(&self) -> Result<Vec<u8>, InvalidBase64> {
        decode_bytes(&self.stdout, self.stdout_encoding)
    }

    /// The bytes of standard error.
    ///
    /// # Errors
    /// [`InvalidBase64`] when the server sent broken base64.
    pub fn stderr_bytes(&self) -> Result<Vec<u8>, InvalidBase64> {
        decode_bytes(&self.stderr, self.stderr_encoding)
    }
}

/// Where a chunk of output came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum OutputStream {
    /// Standard output (a process without a terminal).
    Stdout,
    /// Standard error (a process without a terminal).
    Stderr,
    /// The terminal: output and error merged, as a terminal shows them.
    Tty,
}

impl OutputStream {
    /// The name it has on the wire (`"stdout"`, `"stderr"`, `"tty"`), as
    /// serde writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stdout => "stdout",
            Self::Stderr => "stderr",
            Self::Tty => "tty",
        }
    }
}

/// One chunk of output: `{offset, stream, data, encoding?}`, an element of
/// an output page and the data of each followed output event (whose SSE
/// `id:` is [`OutputChunk::end`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OutputChunk {
    /// Offset of the chunk's first byte in the process's output (bytes
    /// since its start, every stream counted).
    pub offset: u64,
    /// Its stream.
    pub stream: OutputStream,
    /// The bytes, as text or base64.
    pub data: String,
    /// `"base64"` when `data` is base64.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<Encoding>,
}

impl OutputChunk {
    /// The chunk of `bytes` at `offset` (text when they are UTF-8).
    pub fn of(offset: u64, stream: OutputStream, bytes: &[u8]) -> Self {
        let (data, encoding) = encode_bytes(bytes);
        Self {
            offset,
            stream,
            data,
            encoding,
        }
    }

    /// The offset after the chunk's last byte, given its length in bytes.
    pub fn end(&self, length: usize) -> u64 {
        self.offset + length as u64
    }

    /// The chunk's bytes.
    ///
    /// # Errors
    /// [`InvalidBase64`] when `data` says base64 and is not.
    pub fn bytes(&self) -> Result<Vec<u8>, InvalidBase64> {
        decode_bytes(&self.data, self.encoding)
    }
}

/// A page of output: the answer of `GET /v2/processes/{id}/output`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct OutputPage {
    /// The chunks from the asked offset on.
    pub chunks: Vec<OutputChunk>,
    /// The offset to ask from next.
    pub next_offset: u64,
    /// Bytes after the asked offset that the ring no longer holds (0 when
    /// none were missed).
    pub dropped: u64,
}

/// `{offset, nextOffset, dropped}`: the data of a followed output's
/// `event: dropped`: the bytes from `offset` to `nextOffset` left the ring
/// before the follower read them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutputDropped {
    /// Where the follower was.
    pub offset: u64,
    /// Where it goes on (the oldest byte still held).
    pub next_offset: u64,
    /// `nextOffset - offset`, in bytes.
    pub dropped: u64,
}

/// SSE event name of a followed output's dropped marker.
pub const OUTPUT_EVENT_DROPPED: &str = "dropped";
/// SSE event name of a followed output's last event.
pub const OUTPUT_EVENT_EXIT: &str = "exit";

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_request_writes_only_what_is_set_and_refuses_unknown_fields() {
        let request = ProcessRequest::new("sh").arg("-c").arg("true");
        assert_eq!(
            serde_json::to_value(&request).ok(),
            Some(json!({"command": "sh", "args": ["-c", "true"]}))
        );
        let unknown = serde_json::from_value::<ProcessRequest>(json!({"command": "x", "y": 1}));
        assert!(unknown.is_err());
        let run: ProcessRequest = serde_json::from_value(
            json!({"command": "x", "timeoutMs": 5, "maxOutputBytes": 9, "sessionId": "s"}),
        )
        .unwrap_or_default();
        assert_eq!(run.timeout_ms, Some(5));
        assert_eq!(run.max_output_bytes, Some(9));
        assert_eq!(run.session_id.as_deref(), Some("s"));
    }

    #[test]
    fn bytes_are_text_or_base64_both_ways() {
        let chunk = OutputChunk::of(3, OutputStream::Stdout, &[0xff, 0x00]);
        assert_eq!(
            serde_json::to_value(&chunk).ok(),
            Some(json!({"offset": 3, "stream": "stdout", "data": "/wA=", "encoding": "base64"}))
        );
        assert_eq!(chunk.bytes(), Ok(vec![0xff, 0x00]));
        assert_eq!(chunk.end(2), 5);
        let text = OutputChunk::of(0, OutputStream::Tty, b"hi");
        assert_eq!(
            serde_json::to_string(&text).ok().as_deref(),
            Some(r#"{"offset":0,"stream":"tty","data":"hi"}"#)
        );
        let input = ProcessInputParams::new("p", b"\x03", true);
        assert_eq!(input.encoding, None);
        assert_eq!(
            ProcessInputParams::new("p", &[0xc3], false).bytes(),
            Ok(vec![0xc3])
        );
        let broken = ProcessInputParams {
            process_id: "p".into(),
            data: "!".into(),
            encoding: Some(Encoding::Base64),
            eof: false,
        };
        assert!(broken.bytes().is_err());
    }

    #[test]
    fn the_list_state_reads_its_wire_names() {
        let params: ProcessListParams =
            serde_json::from_value(json!({"state": "exited", "limit": 2})).unwrap_or_default();
        assert_eq!(params.state, Some(ProcessState::Exited));
        assert_eq!(ProcessState::Running.as_str(), "running");
        for stream in [
            OutputStream::Stdout,
            OutputStream::Stderr,
            OutputStream::Tty,
        ] {
            assert_eq!(
                serde_json::to_value(stream).ok(),
                Some(json!(stream.as_str()))
            );
        }
        assert!(serde_json::from_value::<ProcessListParams>(json!({"state": "gone"})).is_err());
    }
}
