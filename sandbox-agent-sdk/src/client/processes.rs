//! The process API on [`SandboxAgentClient`] (research/contract.md,
//! "Processes and terminals"): run a program to completion, start one and
//! hold a [`ProcessHandle`] (output as a resumable [`ProcessOutput`]
//! stream, stdin, signals, resize, wait), list and look up processes. All
//! plain HTTP on `/v2/processes…`; none needs the connection to an agent.
//!
//! The output stream follows `GET /v2/processes/{id}/output` over
//! Server-Sent Events. Each event's `id:` is the byte offset after it; when
//! the connection breaks, the stream reopens with `Last-Event-ID` set to
//! the last offset it handed out, so every byte the server still holds
//! arrives exactly once. Bytes the server's ring dropped before they were
//! read arrive as one [`OutputEvent::Dropped`] with their count, never as a
//! silent gap.

use super::SandboxAgentClient;
use crate::error::Error;
use acp_http_client::{ReconnectPolicy, SseEvent};
use bytes::Bytes;
use ext_methods::{
    Exit, OUTPUT_EVENT_DROPPED, OUTPUT_EVENT_EXIT, OutputChunk, OutputDropped, ProcessInfo,
    ProcessListParams, ProcessPage, ProcessRequest, ResizeBody, RunResult, SignalBody,
};
use futures::{Stream, StreamExt};
use reqwest::Method;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// Stands for "no total limit" on a followed output (reqwest's
/// per-request timeout replaces the client's and cannot be turned off):
/// 100 years.
const FOLLOW_TIMEOUT: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// How a broken output stream is reopened: the first reopen after 50 ms,
/// doubling to 2 s; after 8 failed opens (or streams that ended) in a row
/// without an event between them, the stream gives up.
pub const OUTPUT_RECONNECT: ReconnectPolicy = ReconnectPolicy {
    initial_delay: Duration::from_millis(50),
    max_delay: Duration::from_secs(2),
    max_attempts: 8,
};

/// One item of a [`ProcessOutput`] stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutputEvent {
    /// Output bytes, in order; [`OutputChunk::bytes`] decodes them (text,
    /// or base64 for bytes that are not UTF-8).
    Chunk(OutputChunk),
    /// Bytes `offset..nextOffset` left the server's output ring before
    /// they were read; the stream goes on after them.
    Dropped(OutputDropped),
    /// The process exited and every byte before it was handed out: the
    /// stream's last item.
    Exit(Exit),
}

/// The output of a process, followed live: a [`Stream`] of
/// [`OutputEvent`]s that reconnects itself (see the module doc) and ends
/// after [`OutputEvent::Exit`]. An error item ends it too: the server
/// answered the reopen with an error (the process was forgotten: 404), or
/// it could not be reached [`OUTPUT_RECONNECT`]`.max_attempts` times in a
/// row.
pub struct ProcessOutput {
    events: Pin<Box<dyn Stream<Item = Result<OutputEvent, Error>> + Send>>,
}

impl std::fmt::Debug for ProcessOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessOutput").finish_non_exhaustive()
    }
}

impl Stream for ProcessOutput {
    type Item = Result<OutputEvent, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.events.as_mut().poll_next(cx)
    }
}

/// A process started by [`SandboxAgentClient::start_process`] (or named
/// by [`SandboxAgentClient::process_handle`]). Holds a clone of the
/// client; cheap to clone itself. Dropping it leaves the process running:
/// [`kill`](Self::kill) or [`forget`](Self::forget) it.
#[derive(Debug, Clone)]
pub struct ProcessHandle {
    client: SandboxAgentClient,
    id: String,
    info: Option<ProcessInfo>,
}

impl ProcessHandle {
    /// The process API's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The process as the start answered it (`None` for a handle made
    /// from an id); [`refresh`](Self::refresh) asks again.
    pub fn started(&self) -> Option<&ProcessInfo> {
        self.info.as_ref()
    }

    /// `GET /v2/processes/{id}`: the process now.
    ///
    /// # Errors
    /// As [`SandboxAgentClient::get_process`].
    pub async fn refresh(&self) -> Result<ProcessInfo, Error> {
        self.client.get_process(&self.id).await
    }

    /// Its output from the first byte the server holds, followed live
    /// until it exits.
    pub fn output(&self) -> ProcessOutput {
        self.output_from(0)
    }

    /// Its output from byte `offset` on (an earlier chunk's
    /// [`end`](OutputChunk::end), or a [`ProcessInfo::output_bytes`] to
    /// see only what comes next).
    pub fn output_from(&self, offset: u64) -> ProcessOutput {
        self.client.follow_output(&self.id, offset)
    }

    /// `POST /v2/processes/{id}/input`: writes `bytes` to its stdin (on a
    /// terminal: types them). Returns once the process took them.
    ///
    /// # Errors
    /// [`Error::Http`] 409 `process-exited` (exited, or stdin closed), 404
    /// `unknown-process`, 504 when the process does not read within 30 s;
    /// as [`SandboxAgentClient::health`] otherwise.
    pub async fn write_stdin(&self, bytes: impl Into<Bytes>) -> Result<(), Error> {
        self.client
            .process_input(&self.id, bytes.into(), false)
            .await
    }

    /// `POST /v2/processes/{id}/input?eof=true`: closes its stdin (on a
    /// terminal: sends `^D`).
    ///
    /// # Errors
    /// As [`write_stdin`](Self::write_stdin).
    pub async fn close_stdin(&self) -> Result<(), Error> {
        self.client
            .process_input(&self.id, Bytes::new(), true)
            .await
    }

    /// `POST /v2/processes/{id}/signal`: sends the signal named `signal`
    /// (`"SIGINT"`, `"TERM"`, …). `SIGKILL` kills the whole tree.
    ///
    /// # Errors
    /// [`Error::Http`] 400 `invalid-request` for a name that is not a
    /// signal, 409 `process-exited`, 404 `unknown-process`.
    pub async fn signal(&self, signal: &str) -> Result<(), Error> {
        let body = SignalBody {
            signal: signal.to_owned(),
        };
        self.client.process_post(&self.id, "signal", &body).await
    }

    /// `SIGKILL` to the whole tree (every descendant, a `setsid` one
    /// included).
    ///
    /// # Errors
    /// As [`signal`](Self::signal).
    pub async fn kill(&self) -> Result<(), Error> {
        self.signal("SIGKILL").await
    }

    /// `POST /v2/processes/{id}/resize`: the terminal's new size in cells.
    ///
    /// # Errors
    /// [`Error::Http`] 409 `not-a-tty` for a process without a terminal,
    /// 400 for a side outside 1..=4096.
    pub async fn resize(&self, cols: u16, rows: u16) -> Result<(), Error> {
        let body = ResizeBody { cols, rows };
        self.client.process_post(&self.id, "resize", &body).await
    }

    /// Waits until the process exited; how it ended. Follows its output
    /// from the end known now (a resumed stream, so a broken connection
    /// does not end the wait) and throws the bytes away.
    ///
    /// # Errors
    /// As [`SandboxAgentClient::get_process`]; the output stream's errors.
    pub async fn wait(&self) -> Result<Exit, Error> {
        let info = self.refresh().await?;
        let mut output = self.output_from(info.output_bytes);
        while let Some(event) = output.next().await {
            if let OutputEvent::Exit(exit) = event? {
                return Ok(exit);
            }
        }
        Err(Error::InvalidResponse {
            what: format!("GET /v2/processes/{}/output", self.id),
            message: "the output ended without an exit event".to_owned(),
        })
    }

    /// `DELETE /v2/processes/{id}`: kills it if it runs, and the server
    /// forgets it (its output is gone).
    ///
    /// # Errors
    /// [`Error::Http`] 404 `unknown-process` when it is already forgotten.
    pub async fn forget(self) -> Result<(), Error> {
        self.client.forget_process(&self.id).await
    }
}

impl SandboxAgentClient {
    /// `POST /v2/processes/run`: runs `request`'s program to completion
    /// and answers its exit, stdout and stderr (each at most
    /// `maxOutputBytes`, default 1 MiB). The server kills it at
    /// `timeoutMs` (`timed_out`) or past the output cap (`truncated`).
    /// The client waits at most the request timeout plus `timeoutMs`.
    ///
    /// ```no_run
    /// # async fn run(client: sandbox_agent_sdk::SandboxAgentClient) -> Result<(), sandbox_agent_sdk::Error> {
    /// use sandbox_agent_sdk::ProcessRequest;
    /// let result = client
    ///     .run_process(ProcessRequest::new("git").args(["status", "--short"]).cwd("/work"))
    ///     .await?;
    /// println!("{:?} {}", result.exit_code, result.stdout);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::Http`] with the problem type: 400 `program-not-found`,
    /// `invalid-request`; 403 `outside-root`; 404 `unknown-session`,
    /// `processes-disabled`; 429 `too-many-processes`; as
    /// [`health`](Self::health) otherwise.
    pub async fn run_process(&self, request: ProcessRequest) -> Result<RunResult, Error> {
        self.check_disposed()?;
        let what = "POST /v2/processes/run";
        let body =
            serde_json::to_vec(&request).map_err(|e| Error::InvalidOptions(e.to_string()))?;
        let limit = self
            .shared
            .options
            .request_timeout
            .map(|limit| limit + Duration::from_millis(request.timeout_ms.unwrap_or(0)));
        let call = async {
            let response = crate::control::ControlPlane::exchange(
                self.process_request(Method::POST, &["run"], &[])
                    .timeout(FOLLOW_TIMEOUT)
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(body),
            )
            .await?;
            crate::control::ControlPlane::json(response, what).await
        };
        super::handle::within_limit(limit, what, call).await
    }

    /// `POST /v2/processes`: starts `request`'s program and answers a
    /// handle to it (follow its output, write its stdin, signal it, wait).
    ///
    /// ```no_run
    /// # async fn run(client: sandbox_agent_sdk::SandboxAgentClient) -> Result<(), sandbox_agent_sdk::Error> {
    /// use sandbox_agent_sdk::{OutputEvent, ProcessRequest, StreamExt};
    /// let process = client
    ///     .start_process(ProcessRequest::new("npm").args(["test"]).cwd("/work"))
    ///     .await?;
    /// let mut output = process.output();
    /// while let Some(event) = output.next().await {
    ///     match event? {
    ///         OutputEvent::Chunk(chunk) => print!("{}", chunk.data),
    ///         OutputEvent::Dropped(gap) => eprintln!("[{} bytes dropped]", gap.dropped),
    ///         OutputEvent::Exit(exit) => eprintln!("[exit {:?}]", exit.exit_code),
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`run_process`](Self::run_process).
    pub async fn start_process(&self, request: ProcessRequest) -> Result<ProcessHandle, Error> {
        let body =
            serde_json::to_vec(&request).map_err(|e| Error::InvalidOptions(e.to_string()))?;
        let info: ProcessInfo = self
            .process_json(Method::POST, "POST /v2/processes", &[], &[], Some(body))
            .await?;
        Ok(ProcessHandle {
            client: self.clone(),
            id: info.id.clone(),
            info: Some(info),
        })
    }

    /// A handle to the process `id` (one listed, or started by another
    /// client), without asking the server.
    pub fn process_handle(&self, id: impl Into<String>) -> ProcessHandle {
        ProcessHandle {
            client: self.clone(),
            id: id.into(),
            info: None,
        }
    }

    /// `GET /v2/processes/{id}`.
    ///
    /// # Errors
    /// [`Error::Http`] 404 `unknown-process` (never started, forgotten, or
    /// a finished run), `processes-disabled`.
    pub async fn get_process(&self, id: &str) -> Result<ProcessInfo, Error> {
        self.process_json(Method::GET, "GET /v2/processes/{id}", &[id], &[], None)
            .await
    }

    /// `GET /v2/processes?limit=&cursor=&sessionId=&state=`: one page of
    /// processes, newest first. Continue with the page's `next_cursor` (as
    /// `params.cursor`, with the same filters) until it is `None`.
    ///
    /// ```no_run
    /// # async fn run(client: sandbox_agent_sdk::SandboxAgentClient) -> Result<(), sandbox_agent_sdk::Error> {
    /// use sandbox_agent_sdk::{ProcessListParams, ProcessState};
    /// let mut params = ProcessListParams { state: Some(ProcessState::Running), ..Default::default() };
    /// loop {
    ///     let page = client.list_processes(params.clone()).await?;
    ///     for process in &page.processes {
    ///         println!("{} {} {:?}", process.id, process.command, process.state);
    ///     }
    ///     match page.next_cursor {
    ///         Some(cursor) => params.cursor = Some(cursor),
    ///         None => break,
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`Error::Http`] 400 `invalid-request` for a `limit` outside
    /// 1..=1000 or a cursor the server did not make.
    pub async fn list_processes(&self, params: ProcessListParams) -> Result<ProcessPage, Error> {
        let limit = params.limit.map(|limit| limit.to_string());
        let mut query = Vec::new();
        if let Some(limit) = &limit {
            query.push(("limit", limit.as_str()));
        }
        if let Some(cursor) = &params.cursor {
            query.push(("cursor", cursor.as_str()));
        }
        if let Some(session) = &params.session_id {
            query.push(("sessionId", session.as_str()));
        }
        if let Some(state) = params.state {
            query.push(("state", state.as_str()));
        }
        self.process_json(Method::GET, "GET /v2/processes", &[], &query, None)
            .await
    }

    /// `POST /v2/processes/{id}/input` with `bytes` (`?eof=true` when
    /// `eof`).
    async fn process_input(&self, id: &str, bytes: Bytes, eof: bool) -> Result<(), Error> {
        self.check_disposed()?;
        let query: &[(&str, &str)] = if eof { &[("eof", "true")] } else { &[] };
        let request = self
            .process_request(Method::POST, &[id, "input"], query)
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .body(bytes);
        self.control_call(
            "POST /v2/processes/{id}/input",
            crate::control::ControlPlane::exchange(request),
        )
        .await
        .map(drop)
    }

    /// `POST /v2/processes/{id}/{part}` with a JSON `body`, answered 204.
    async fn process_post(
        &self,
        id: &str,
        part: &str,
        body: &impl serde::Serialize,
    ) -> Result<(), Error> {
        self.check_disposed()?;
        let body = serde_json::to_vec(body).map_err(|e| Error::InvalidOptions(e.to_string()))?;
        let request = self
            .process_request(Method::POST, &[id, part], &[])
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body);
        self.control_call(
            "POST /v2/processes/{id}/…",
            crate::control::ControlPlane::exchange(request),
        )
        .await
        .map(drop)
    }

    /// `DELETE /v2/processes/{id}`.
    async fn forget_process(&self, id: &str) -> Result<(), Error> {
        self.check_disposed()?;
        let request = self.process_request(Method::DELETE, &[id], &[]);
        self.control_call(
            "DELETE /v2/processes/{id}",
            crate::control::ControlPlane::exchange(request),
        )
        .await
        .map(drop)
    }

    /// A JSON exchange with `/v2/processes/{segments…}`.
    async fn process_json<T: serde::de::DeserializeOwned>(
        &self,
        method: Method,
        what: &str,
        segments: &[&str],
        query: &[(&str, &str)],
        body: Option<Vec<u8>>,
    ) -> Result<T, Error> {
        self.check_disposed()?;
        let mut request = self
            .process_request(method, segments, query)
            .header(reqwest::header::ACCEPT, "application/json");
        if let Some(body) = body {
            request = request
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body);
        }
        let call = async {
            let response = crate::control::ControlPlane::exchange(request).await?;
            crate::control::ControlPlane::json(response, what).await
        };
        self.control_call(what, call).await
    }

    /// A request to `/v2/processes/{segments…}` with auth.
    fn process_request(
        &self,
        method: Method,
        segments: &[&str],
        query: &[(&str, &str)],
    ) -> reqwest::RequestBuilder {
        let mut path = vec!["v2", "processes"];
        path.extend_from_slice(segments);
        self.control.request(method, &path, query)
    }

    /// The followed output of `id` from `offset` (see [`ProcessOutput`]).
    fn follow_output(&self, id: &str, offset: u64) -> ProcessOutput {
        let follow = Follow {
            client: self.clone(),
            id: id.to_owned(),
            offset,
            events: None,
            failures: 0,
            done: false,
        };
        ProcessOutput {
            events: Box::pin(futures::stream::unfold(follow, Follow::next)),
        }
    }
}

/// Most bytes of one line, and of one event's data, on an output stream:
/// a chunk event's `data:` line (a chunk of at most 64 KiB, JSON-escaped
/// or base64) fits many times over.
const MAX_OUTPUT_EVENT: usize = 4 << 20;

/// The parsed SSE events of one open output stream.
type SseEvents = Pin<Box<dyn Stream<Item = Result<SseEvent, std::io::Error>> + Send>>;

/// Where a [`ProcessOutput`] is: the offset after the last byte handed
/// out (the `Last-Event-ID` of a reopen) and the open stream, if any.
struct Follow {
    client: SandboxAgentClient,
    id: String,
    offset: u64,
    events: Option<SseEvents>,
    /// Opens that failed, or streams that ended, in a row without an
    /// event between them.
    failures: u32,
    done: bool,
}

impl Follow {
    /// The next item: reads the open stream, reopening it from `offset`
    /// when it broke or ended before the exit.
    async fn next(mut self) -> Option<(Result<OutputEvent, Error>, Self)> {
        if self.done {
            return None;
        }
        loop {
            let Some(events) = self.events.as_mut() else {
                if self.failures > 0 {
                    if self.failures > OUTPUT_RECONNECT.max_attempts {
                        self.done = true;
                        let error = Error::ConnectionLost {
                            message: format!(
                                "the output of process {} broke off {} times in a row without an event",
                                self.id, self.failures
                            ),
                            source: None,
                        };
                        return Some((Err(error), self));
                    }
                    tokio::time::sleep(OUTPUT_RECONNECT.base_delay(self.failures - 1)).await;
                }
                match open(&self.client, &self.id, self.offset).await {
                    Ok(events) => self.events = Some(events),
                    Err(error) if error.is_connection_lost() => self.failures += 1,
                    Err(error) => {
                        self.done = true;
                        return Some((Err(error), self));
                    }
                }
                continue;
            };
            match events.next().await {
                Some(Ok(event)) => {
                    self.failures = 0;
                    match self.handle(&event) {
                        Ok(Some(item)) => return Some((Ok(item), self)),
                        Ok(None) => {}
                        Err(error) => {
                            self.done = true;
                            return Some((Err(error), self));
                        }
                    }
                }
                // Broken off, or ended before the exit: reopen from `offset`.
                Some(Err(_)) | None => {
                    self.events = None;
                    self.failures += 1;
                }
            }
        }
    }

    /// One SSE event as an item (`None` for an event to skip: a chunk
    /// wholly before `offset`).
    fn handle(&mut self, event: &SseEvent) -> Result<Option<OutputEvent>, Error> {
        let invalid = |message: String| Error::InvalidResponse {
            what: format!("GET /v2/processes/{}/output", self.id),
            message,
        };
        let id = || {
            event
                .id
                .parse::<u64>()
                .map_err(|_| invalid(format!("event id {:?} is not a byte offset", event.id)))
        };
        match event.event.as_str() {
            OUTPUT_EVENT_EXIT => {
                let exit: Exit =
                    serde_json::from_slice(&event.data).map_err(|e| invalid(e.to_string()))?;
                self.done = true;
                Ok(Some(OutputEvent::Exit(exit)))
            }
            OUTPUT_EVENT_DROPPED => {
                let dropped: OutputDropped =
                    serde_json::from_slice(&event.data).map_err(|e| invalid(e.to_string()))?;
                self.offset = self.offset.max(dropped.next_offset);
                Ok(Some(OutputEvent::Dropped(dropped)))
            }
            _ => {
                let end = id()?;
                if end <= self.offset {
                    return Ok(None);
                }
                let chunk =
                    super::output_chunk::decode(&event.data).map_err(|e| invalid(e.to_string()))?;
                self.offset = end;
                Ok(Some(OutputEvent::Chunk(chunk)))
            }
        }
    }
}

/// Opens the output of process `id` from `offset` (`Last-Event-ID`): a
/// free function, so the open future borrows no [`Follow`] (whose stream
/// is not `Sync`).
async fn open(client: &SandboxAgentClient, id: &str, offset: u64) -> Result<SseEvents, Error> {
    client.check_disposed()?;
    let request = client
        .process_request(Method::GET, &[id, "output"], &[])
        .timeout(FOLLOW_TIMEOUT)
        .header(reqwest::header::ACCEPT, "text/event-stream")
        .header("last-event-id", offset.to_string());
    let exchange = crate::control::ControlPlane::exchange(request);
    let response =
        match client.shared.options.request_timeout {
            Some(limit) => tokio::time::timeout(limit, exchange).await.map_err(|_| {
                Error::ConnectionLost {
                    message: format!("the output stream did not open within {limit:?}"),
                    source: None,
                }
            })??,
            None => exchange.await?,
        };
    // Each byte is searched once and a chunk's data stays a slice of what
    // was read (`sse_events`); the chunk's JSON is decoded in one pass
    // (`output_chunk`).
    let bytes = response
        .bytes_stream()
        .map(|item| item.map_err(std::io::Error::other));
    let events = acp_http_client::sse_events(bytes, MAX_OUTPUT_EVENT, |max| {
        std::io::Error::other(format!("an event of the output stream is over {max} bytes"))
    });
    Ok(Box::pin(events))
}
