//! `/v2/processes…` (research/contract.md, "Processes and terminals"):
//! run to completion, start, list, one, output (a page, or followed over
//! SSE with exact resume by byte offset), stdin, signals, resize, forget;
//! the terminal WebSocket is [`super::terminal`].

use super::body::{Body, HttpRequest, empty, full, read_body};
use super::headers::{accepts, is_json_content, last_event_id};
use super::json_string;
use super::problem::Problem;
use crate::error::Error;
use crate::process::Process;
use crate::process::output::{Page, PageChunk};
use crate::protocol::{APPLICATION_JSON, EVENT_STREAM, X_ACCEL_BUFFERING_HEADER};
use crate::runtime::Runtime;
use bytes::Bytes;
use ext_methods::{
    OutputPage, ProcessInfo, ProcessListParams, ProcessPage, ProcessRequest, ProcessState,
    ResizeBody, RunResult, SignalBody,
};
use http::header::{CACHE_CONTROL, CONTENT_TYPE, LOCATION};
use http::{HeaderValue, Method, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use serde::Serialize;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

/// Largest JSON body of a start, a run, a signal or a resize, in bytes
/// (`stdin` travels in it).
const JSON_BODY_LIMIT: usize = 1024 * 1024;
/// Most processes per page.
const MAX_LIST_LIMIT: usize = ext_methods::MAX_PROCESS_PAGE as usize;
/// Output bytes per page when `limit` is not given, and the most.
const DEFAULT_OUTPUT_LIMIT: usize = 256 * 1024;
const MAX_OUTPUT_LIMIT: usize = 4 * 1024 * 1024;
/// Output bytes one SSE frame carries at most.
const FRAME_BYTES: usize = 256 * 1024;

/// Serves `/v2/processes` (`part` `None`, `id` `None`), `/v2/processes/{id}`
/// and `/v2/processes/{id}/{part}` with `method`.
///
/// # Errors
/// 404 `processes-disabled` with `--no-processes`, `unknown-process`, 405,
/// and each operation's own.
pub async fn serve(
    runtime: &Arc<Runtime>,
    request: &mut HttpRequest,
    id: Option<&str>,
    part: Option<&str>,
    method: &Method,
) -> Result<Response<Body>, Error> {
    let processes = runtime.processes()?.clone();
    let get = method == Method::GET || method == Method::HEAD;
    match (id, part) {
        (None, _) if get => list(runtime, request.uri().query()),
        (None, _) if method == Method::POST => start(runtime, request).await,
        (None, _) => Err(Error::MethodNotAllowed("GET, POST")),
        (Some("run"), None) if method == Method::POST => run(runtime, request).await,
        (Some(id), None) => {
            let id = super::control::decode_segment(id)?;
            match *method {
                Method::GET | Method::HEAD => one(runtime, &id),
                Method::DELETE => forget(&processes, id).await,
                _ => Err(Error::MethodNotAllowed("GET, DELETE")),
            }
        }
        (Some(id), Some(part)) => {
            let id = super::control::decode_segment(id)?;
            let process = runtime.process(&id)?;
            match (part, method) {
                ("output", &Method::GET | &Method::HEAD) => output(runtime, &process, request),
                ("output", _) => Err(Error::MethodNotAllowed("GET")),
                ("input", &Method::POST) => input(runtime, &process, request).await,
                ("signal", &Method::POST) => signal(runtime, &process, request).await,
                ("resize", &Method::POST) => resize(runtime, &process, request).await,
                ("input" | "signal" | "resize", _) => Err(Error::MethodNotAllowed("POST")),
                ("terminal", &Method::GET) => super::terminal::upgrade(runtime, process, request),
                ("terminal", _) => Err(Error::MethodNotAllowed("GET")),
                _ => Err(Error::NotFound(request.uri().path().to_owned())),
            }
        }
    }
}

fn json(status: StatusCode, value: &impl Serialize) -> Result<Response<Body>, Error> {
    let body = serde_json::to_vec(value)
        .map_err(|e| Error::FsIo(format!("cannot serialize the answer: {e}")))?;
    Ok(full(status, APPLICATION_JSON, Bytes::from(body)))
}

/// Reads a JSON body of at most [`JSON_BODY_LIMIT`] bytes into `T`: 400
/// for one that does not decode or names a member twice.
async fn json_body<T: serde::de::DeserializeOwned>(
    runtime: &Runtime,
    request: &mut HttpRequest,
) -> Result<T, Error> {
    if !is_json_content(request.headers()) {
        return Err(Error::UnsupportedMediaType);
    }
    let body = read_body(request, JSON_BODY_LIMIT, runtime.config.read_timeout).await?;
    let value = serde_json::from_slice(&body)
        .map_err(|error| Error::InvalidRequest(format!("invalid request body: {error}")))?;
    // A member named twice (an `env` key, say) is refused, not resolved
    // (research/contract.md, "Edge rules").
    crate::protocol::check_decodable(&body)
        .map_err(|error| Error::InvalidRequest(format!("invalid request body: {error}")))?;
    Ok(value)
}

/// `GET /v2/processes/{id}` → the process.
#[utoipa::path(
    get,
    path = "/v2/processes/{id}",
    summary = "Describe a process.",
    operation_id = "getProcess",
    tag = "processes",
    params(("id" = String, Path, min_length = 1, description = "The process id.")),
    responses(
        (status = 200, description = "The process.", body = ProcessInfo),
        (status = 400, response = Problem),
        (status = 401, response = Problem),
        (status = 404, response = Problem),
    )
)]
fn one(runtime: &Runtime, id: &str) -> Result<Response<Body>, Error> {
    json(StatusCode::OK, &runtime.process(id)?.info())
}

/// `DELETE /v2/processes/{id}` → 204: the process is killed if it runs,
/// and forgotten.
#[utoipa::path(
    delete,
    path = "/v2/processes/{id}",
    summary = "Forget a process.",
    description = "Kills the process if it runs, and forgets it and its output.",
    operation_id = "forgetProcess",
    tag = "processes",
    params(("id" = String, Path, min_length = 1, description = "The process id.")),
    responses(
        (status = 204, description = "Killed if it ran, and forgotten."),
        (status = 400, response = Problem),
        (status = 401, response = Problem),
        (status = 404, response = Problem),
    )
)]
async fn forget(
    processes: &crate::process::Processes,
    id: String,
) -> Result<Response<Body>, Error> {
    if processes.forget_and_wait(&id).await {
        Ok(empty(StatusCode::NO_CONTENT))
    } else {
        Err(Error::UnknownProcess(id))
    }
}

/// `POST /v2/processes` → 201 with the process (and `Location`).
#[utoipa::path(
    post,
    path = "/v2/processes",
    summary = "Start a process.",
    description = "Starts the program (never through a shell), with a terminal when `tty` is set; its output is read with `GET /v2/processes/{id}/output`.",
    operation_id = "startProcess",
    tag = "processes",
    request_body = ProcessRequest,
    responses(
        (status = 201, description = "Started.", body = ProcessInfo,
            headers(("Location" = String, description = "The process's path."))),
        (status = 400, response = Problem),
        (status = 401, response = Problem),
        (status = 403, response = Problem),
        (status = 404, response = Problem),
        (status = 408, response = Problem),
        (status = 409, response = Problem),
        (status = 413, response = Problem),
        (status = 415, response = Problem),
        (status = 429, response = Problem),
        (status = 500, response = Problem),
        (status = 503, response = Problem),
    )
)]
async fn start(runtime: &Runtime, request: &mut HttpRequest) -> Result<Response<Body>, Error> {
    let body: ProcessRequest = json_body(runtime, request).await?;
    let process = runtime.start_process(body).await?;
    let mut response = json(StatusCode::CREATED, &process.info())?;
    if let Ok(location) = HeaderValue::from_str(&format!("/v2/processes/{}", process.id())) {
        response.headers_mut().insert(LOCATION, location);
    }
    Ok(response)
}

/// `POST /v2/processes/run` → the run's result once the process exited.
#[utoipa::path(
    post,
    path = "/v2/processes/run",
    summary = "Run a process to completion.",
    description = "Starts the program, waits for it to exit (or kills it at `timeoutMs` or past `maxOutputBytes`) and answers with its output and exit status.",
    operation_id = "runProcess",
    tag = "processes",
    request_body = ProcessRequest,
    responses(
        (status = 200, description = "The process exited (or was killed at its timeout or output cap).", body = RunResult),
        (status = 400, response = Problem),
        (status = 401, response = Problem),
        (status = 403, response = Problem),
        (status = 404, response = Problem),
        (status = 408, response = Problem),
        (status = 409, response = Problem),
        (status = 413, response = Problem),
        (status = 415, response = Problem),
        (status = 429, response = Problem),
        (status = 500, response = Problem),
        (status = 503, response = Problem),
    )
)]
async fn run(runtime: &Runtime, request: &mut HttpRequest) -> Result<Response<Body>, Error> {
    let body: ProcessRequest = json_body(runtime, request).await?;
    json(StatusCode::OK, &runtime.run_process(body).await?)
}

/// `GET /v2/processes?limit=&cursor=&sessionId=&state=running|exited`.
#[utoipa::path(
    get,
    path = "/v2/processes",
    summary = "List processes.",
    operation_id = "listProcesses",
    tag = "processes",
    params(
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 1000, description = "Processes per page (default 100)."),
        ("cursor" = Option<String>, Query, description = "A previous page's `nextCursor`."),
        ("sessionId" = Option<String>, Query, description = "Only this session's processes."),
        ("state" = Option<ProcessState>, Query, description = "Only running or only exited ones."),
    ),
    responses(
        (status = 200, description = "A page of processes, newest first.", body = ProcessPage),
        (status = 400, response = Problem),
        (status = 401, response = Problem),
        (status = 404, response = Problem),
    )
)]
fn list(runtime: &Runtime, query: Option<&str>) -> Result<Response<Body>, Error> {
    let mut params = ProcessListParams::default();
    for (key, value) in super::query::pairs(query)? {
        match &*key {
            "limit" => {
                let limit = bounded(&key, &value, MAX_LIST_LIMIT)?;
                params.limit = u32::try_from(limit).ok();
            }
            "cursor" => params.cursor = Some(value.into_owned()),
            "sessionId" | "session_id" => params.session_id = Some(value.into_owned()),
            "state" => {
                params.state = Some(match &*value {
                    "running" => ProcessState::Running,
                    "exited" => ProcessState::Exited,
                    other => {
                        return Err(Error::InvalidRequest(format!(
                            "query parameter state must be running or exited, got {other:?}"
                        )));
                    }
                });
            }
            _ => {}
        }
    }
    json(StatusCode::OK, &runtime.list_processes(&params)?)
}

/// `value` as a non-negative integer written in plain digits.
fn digits(value: &str) -> Option<u64> {
    value
        .bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| value.parse().ok())
        .flatten()
}

/// A query parameter that must be an integer from 1 to `max`.
fn bounded(key: &str, value: &str, max: usize) -> Result<usize, Error> {
    value
        .bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| value.parse::<usize>().ok())
        .flatten()
        .filter(|n| (1..=max).contains(n))
        .ok_or_else(|| {
            Error::InvalidRequest(format!(
                "query parameter {key} must be between 1 and {max}, got {value:?}"
            ))
        })
}

/// `GET /v2/processes/{id}/output?offset=&limit=`: a page; with `Accept:
/// text/event-stream`, the output followed (module doc).
#[utoipa::path(
    get,
    path = "/v2/processes/{id}/output",
    summary = "Read or follow a process's output.",
    description = "A page of output from `offset`. With `Accept: text/event-stream`, the output followed as Server-Sent Events: each chunk an event whose `id:` is the offset after it, `event: dropped` when the ring no longer holds what was asked, `event: exit` at the end; `Last-Event-ID` resumes.",
    operation_id = "processOutput",
    tag = "processes",
    params(
        ("id" = String, Path, min_length = 1, description = "The process id."),
        ("offset" = Option<u64>, Query, description = "The byte offset to read from (default 0)."),
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 4194304, description = "Bytes per page (default 262144)."),
        ("Last-Event-ID" = Option<String>, Header, description = "Following: the byte offset to resume from."),
    ),
    responses(
        (status = 200, description = "A page of output; with `Accept: text/event-stream`, the output followed as SSE (`id:` the offset after each chunk, `event: dropped`, `event: exit`).",
            content((OutputPage = "application/json"), (String = "text/event-stream"))),
        (status = 400, response = Problem),
        (status = 401, response = Problem),
        (status = 404, response = Problem),
    )
)]
fn output(
    runtime: &Runtime,
    process: &Arc<Process>,
    request: &HttpRequest,
) -> Result<Response<Body>, Error> {
    let mut offset = 0;
    let mut limit = DEFAULT_OUTPUT_LIMIT;
    for (key, value) in super::query::pairs(request.uri().query())? {
        match &*key {
            "offset" => {
                offset = digits(&value).ok_or_else(|| {
                    Error::InvalidRequest(format!(
                        "query parameter offset must be a byte offset, got {value:?}"
                    ))
                })?;
            }
            "limit" => limit = bounded(&key, &value, MAX_OUTPUT_LIMIT)?,
            _ => {}
        }
    }
    let wants_stream = request
        .headers()
        .get_all(http::header::ACCEPT)
        .iter()
        .any(|value| value.to_str().is_ok_and(|v| v.contains(EVENT_STREAM)))
        && accepts(request.headers(), EVENT_STREAM);
    if !wants_stream {
        let page = process.read(offset, limit);
        return json(
            StatusCode::OK,
            &OutputPage {
                next_offset: page.next_offset,
                dropped: page.dropped,
                chunks: page.chunks.iter().map(PageChunk::to_wire).collect(),
            },
        );
    }
    if let Some(resume) = last_event_id(request.headers())? {
        offset = resume;
    }
    let mut response = Response::new(follow(
        process.clone(),
        offset,
        runtime.config.heartbeat,
        runtime.shutdown.clone(),
    ));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(EVENT_STREAM));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(X_ACCEL_BUFFERING_HEADER, HeaderValue::from_static("no"));
    Ok(response)
}

/// Where a follower is.
struct Follower {
    process: Arc<Process>,
    offset: u64,
    changes: tokio::sync::watch::Receiver<u64>,
    done: bool,
}

/// The SSE body of a followed output: from `offset`, each chunk an event
/// (`id:` the offset after it), `event: dropped` when the ring no longer
/// holds bytes the follower asked for, `event: exit` after the last chunk,
/// heartbeat comments while quiet. Each frame is made when the client
/// reads: a follower that does not read holds no output.
fn follow(
    process: Arc<Process>,
    offset: u64,
    heartbeat: Duration,
    shutdown: tokio_util::sync::CancellationToken,
) -> Body {
    let changes = process.changes();
    let start = Follower {
        process,
        offset,
        changes,
        done: false,
    };
    let frames = futures::stream::unfold(start, move |mut follower| {
        let shutdown = shutdown.clone();
        async move {
            if follower.done {
                return None;
            }
            loop {
                follower.changes.borrow_and_update();
                let exit = follower.process.exit();
                let page = follower.process.read(follower.offset, FRAME_BYTES);
                if page.dropped > 0 || !page.chunks.is_empty() {
                    let frame = frame_page(follower.offset, &page);
                    follower.offset = page.next_offset;
                    return Some((Ok::<_, Infallible>(Frame::data(frame)), follower));
                }
                if let Some(exit) = exit {
                    follower.done = true;
                    let data = serde_json::to_string(&exit).unwrap_or_default();
                    let frame = Bytes::from(format!("event: exit\ndata: {data}\n\n"));
                    return Some((Ok(Frame::data(frame)), follower));
                }
                tokio::select! {
                    changed = follower.changes.changed() => {
                        if changed.is_err() {
                            return None;
                        }
                    }
                    () = tokio::time::sleep(heartbeat) => {
                        let frame = Bytes::from_static(b": heartbeat\n\n");
                        return Some((Ok(Frame::data(frame)), follower));
                    }
                    () = shutdown.cancelled() => return None,
                }
            }
        }
    });
    let opened = futures::stream::once(std::future::ready(Ok::<_, Infallible>(Frame::data(
        Bytes::from_static(b": stream open\n\n"),
    ))));
    StreamBody::new(futures::StreamExt::chain(opened, frames)).boxed_unsync()
}

/// One frame of SSE events: the dropped marker (when bytes after `asked`
/// are gone), then each chunk with its end offset as `id:`. A text chunk's
/// JSON is written here, byte for byte what `serde_json` writes for its
/// [`OutputChunk`](ext_methods::OutputChunk) (`{offset, stream, data}`),
/// with the string escaped in one pass ([`json_string`]); a chunk that is
/// not UTF-8 goes through `serde_json` as base64.
fn frame_page(asked: u64, page: &Page) -> Bytes {
    let text: usize = page.chunks.iter().map(|chunk| chunk.data.len()).sum();
    let mut out = Vec::with_capacity(text * 2 + page.chunks.len() * 96 + 128);
    if page.dropped > 0 {
        out.extend_from_slice(dropped_event(asked, page.dropped).as_bytes());
    }
    let mut number = itoa::Buffer::new();
    for chunk in &page.chunks {
        out.extend_from_slice(b"id: ");
        out.extend_from_slice(number.format(chunk.end()).as_bytes());
        out.extend_from_slice(b"\ndata: ");
        match std::str::from_utf8(&chunk.data) {
            Ok(text) => {
                out.extend_from_slice(b"{\"offset\":");
                out.extend_from_slice(number.format(chunk.offset).as_bytes());
                out.extend_from_slice(b",\"stream\":\"");
                out.extend_from_slice(chunk.stream.as_str().as_bytes());
                out.extend_from_slice(b"\",\"data\":");
                json_string::put(&mut out, text);
                out.push(b'}');
            }
            Err(_) => {
                let _ = serde_json::to_writer(&mut out, &chunk.to_wire());
            }
        }
        out.extend_from_slice(b"\n\n");
    }
    Bytes::from(out)
}

/// The `event: dropped` of a follower that asked for `asked` when the
/// ring had already let `dropped` bytes after it go: `id:` and
/// `nextOffset` are where it goes on.
fn dropped_event(asked: u64, dropped: u64) -> String {
    let resumed = asked + dropped;
    format!(
        "event: dropped\nid: {resumed}\ndata: {{\"offset\":{asked},\"nextOffset\":{resumed},\"dropped\":{dropped}}}\n\n"
    )
}

/// `POST /v2/processes/{id}/input` (raw body; `?eof=true` closes stdin
/// after it) → 204.
#[utoipa::path(
    post,
    path = "/v2/processes/{id}/input",
    summary = "Write to a process's stdin.",
    description = "The raw body goes to stdin as it arrives; `eof=true` closes stdin after it.",
    operation_id = "processInput",
    tag = "processes",
    params(
        ("id" = String, Path, min_length = 1, description = "The process id."),
        ("eof" = Option<bool>, Query, description = "Close stdin after the body."),
    ),
    request_body(content = String, content_type = "application/octet-stream", description = "Bytes for the process's stdin."),
    responses(
        (status = 204, description = "Written."),
        (status = 400, response = Problem),
        (status = 401, response = Problem),
        (status = 404, response = Problem),
        (status = 408, response = Problem),
        (status = 409, response = Problem),
        (status = 504, response = Problem),
    )
)]
async fn input(
    runtime: &Runtime,
    process: &Process,
    request: &mut HttpRequest,
) -> Result<Response<Body>, Error> {
    let mut eof = false;
    for (key, value) in super::query::pairs(request.uri().query())? {
        if key == "eof" {
            eof = match &*value {
                "true" | "1" => true,
                "false" | "0" => false,
                other => {
                    return Err(Error::InvalidRequest(format!(
                        "query parameter eof must be true or false, got {other:?}"
                    )));
                }
            };
        }
    }
    if process.exit().is_some() {
        return Err(Error::ProcessExited(process.id().to_owned()));
    }
    // The body goes to stdin frame by frame as it arrives: the pipe's
    // back-pressure reaches the client, and a body waiting for its turn
    // waits in its socket, not in memory.
    let _turn = process.input_turn().await?;
    if let Some(mut body) = request.body_mut().take() {
        loop {
            let frame = tokio::time::timeout(runtime.config.read_timeout, body.frame())
                .await
                .map_err(|_| Error::RequestTimeout {
                    timeout: runtime.config.read_timeout,
                })?;
            match frame {
                None => break,
                Some(Err(error)) => {
                    return Err(Error::InvalidRequest(format!(
                        "cannot read the request body: {error}"
                    )));
                }
                Some(Ok(frame)) => {
                    if let Ok(bytes) = frame.into_data()
                        && !bytes.is_empty()
                    {
                        process.write_stdin(bytes).await?;
                    }
                }
            }
        }
    }
    if eof {
        process.close_stdin().await?;
    }
    Ok(empty(StatusCode::NO_CONTENT))
}

/// `POST /v2/processes/{id}/signal` `{signal: "SIGINT"}` → 204.
#[utoipa::path(
    post,
    path = "/v2/processes/{id}/signal",
    summary = "Send a signal to a process.",
    description = "`SIGKILL` kills the whole process tree.",
    operation_id = "signalProcess",
    tag = "processes",
    params(("id" = String, Path, min_length = 1, description = "The process id.")),
    request_body = SignalBody,
    responses(
        (status = 204, description = "Sent."),
        (status = 400, response = Problem),
        (status = 401, response = Problem),
        (status = 403, response = Problem),
        (status = 404, response = Problem),
        (status = 408, response = Problem),
        (status = 409, response = Problem),
        (status = 413, response = Problem),
        (status = 415, response = Problem),
    )
)]
async fn signal(
    runtime: &Runtime,
    process: &Arc<Process>,
    request: &mut HttpRequest,
) -> Result<Response<Body>, Error> {
    let body: SignalBody = json_body(runtime, request).await?;
    runtime.signal_process(process, &body.signal).await?;
    Ok(empty(StatusCode::NO_CONTENT))
}

/// `POST /v2/processes/{id}/resize` `{cols, rows}` → 204.
#[utoipa::path(
    post,
    path = "/v2/processes/{id}/resize",
    summary = "Resize a process's terminal.",
    operation_id = "resizeProcess",
    tag = "processes",
    params(("id" = String, Path, min_length = 1, description = "The process id.")),
    request_body = ResizeBody,
    responses(
        (status = 204, description = "Resized."),
        (status = 400, response = Problem),
        (status = 401, response = Problem),
        (status = 404, response = Problem),
        (status = 408, response = Problem),
        (status = 409, response = Problem),
        (status = 413, response = Problem),
        (status = 415, response = Problem),
    )
)]
async fn resize(
    runtime: &Runtime,
    process: &Process,
    request: &mut HttpRequest,
) -> Result<Response<Body>, Error> {
    let body: ResizeBody = json_body(runtime, request).await?;
    runtime
        .resize_process(process, body.cols, body.rows)
        .await?;
    Ok(empty(StatusCode::NO_CONTENT))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::output::Output;
    use ext_methods::OutputStream;

    /// What `frame_page` wrote before it escaped text itself: `serde_json`
    /// for every chunk.
    fn with_serde(asked: u64, page: &Page) -> Vec<u8> {
        let mut out = Vec::new();
        if page.dropped > 0 {
            out.extend_from_slice(dropped_event(asked, page.dropped).as_bytes());
        }
        for chunk in &page.chunks {
            out.extend_from_slice(format!("id: {}\ndata: ", chunk.end()).as_bytes());
            out.extend_from_slice(&serde_json::to_vec(&chunk.to_wire()).expect("serializes"));
            out.extend_from_slice(b"\n\n");
        }
        out
    }

    #[test]
    fn a_frame_is_what_serde_json_would_write() {
        let mut output = Output::new(40);
        output.push(OutputStream::Stdout, Bytes::from_static(b"dropped later"));
        output.push(
            OutputStream::Stdout,
            Bytes::from_static(b"y\ny\n\"q\" \\ \x01\t"),
        );
        output.push(OutputStream::Stderr, Bytes::from("é€😀 warning\r\n"));
        output.push(OutputStream::Tty, Bytes::from_static(&[0xff, 0x00, b'a']));
        output.push(OutputStream::Stdout, Bytes::from_static(b""));
        for asked in [0, 13, 20] {
            let page = output.read(asked, usize::MAX);
            assert_eq!(
                frame_page(asked, &page).as_ref(),
                with_serde(asked, &page).as_slice()
            );
        }
        assert!(output.read(0, usize::MAX).dropped > 0);
    }
}
