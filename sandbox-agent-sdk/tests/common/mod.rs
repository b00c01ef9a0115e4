//! Shared helpers of the SDK tests: options for a test server or an
//! embedded one, a prompt turn that collects its events, bounded waits.

#![allow(dead_code)]

use sandbox_agent_sdk::schema::{
    ContentBlock, PromptRequest, PromptResponse, SessionId, SessionUpdate, ToolCallStatus,
};
use sandbox_agent_sdk::{
    ClientOptions, Error, Event, Events, PermissionRequest, SandboxAgentClient,
};
use std::time::Duration;
use v2_api_tests::{TempDir, TestServer};

/// Upper bound on one step of a test (a call, a turn, a wait for events).
pub const STEP: Duration = Duration::from_secs(60);

/// The boxed error of a test.
pub type TestResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// Options for the mock agent on `server` (with its token, if any).
pub fn server_options(server: &TestServer) -> ClientOptions {
    let options = ClientOptions::new("mock").base_url(server.base_url());
    match server.token() {
        Some(token) => options.token(token),
        None => options,
    }
}

/// Options for the mock agent on an embedded server started from the
/// workspace's binary (`$SANDBOX_AGENT_BIN` or `target/debug`), with `data`
/// as its data dir: never the developer's own (a server given none stops
/// at start; see `v2_api_tests::server::no_default_data_dir`).
pub fn embedded_options(data: &TempDir) -> ClientOptions {
    ClientOptions::new("mock")
        .binary(v2_api_tests::server::sandbox_agent_bin())
        .startup_timeout(Duration::from_secs(30))
        .server_env("SANDBOX_AGENT_DATA_DIR", data.path())
        .server_env("XDG_DATA_HOME", v2_api_tests::server::no_default_data_dir())
}

/// `future`, or a panic naming `what` after [`STEP`].
pub async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    match tokio::time::timeout(STEP, future).await {
        Ok(value) => value,
        Err(_) => panic!("{what}: not done within {STEP:?}"),
    }
}

/// What one prompt turn produced.
#[derive(Debug, Default)]
pub struct Turn {
    /// The agent's text (its `agent_message_chunk`s, joined).
    pub text: String,
    /// `(title, status)` of every tool call and tool call update.
    pub tools: Vec<(String, ToolCallStatus)>,
    /// Titles of the permission requests seen on the stream.
    pub permissions: Vec<String>,
    /// Every other event.
    pub other: Vec<Event>,
}

/// Runs one prompt turn of `text` in `session`, reading `events` while it
/// runs; each permission request on the stream goes to `on_permission`.
/// Events still queued when the prompt returns belong to the turn (the
/// answer is held until its updates arrived) and are drained too.
pub async fn run_turn(
    client: &SandboxAgentClient,
    events: &mut Events,
    session: &SessionId,
    text: &str,
    mut on_permission: impl FnMut(PermissionRequest),
) -> (Result<PromptResponse, Error>, Turn) {
    let mut turn = Turn::default();
    let prompt = client.prompt(PromptRequest::new(session.clone(), vec![text.into()]));
    tokio::pin!(prompt);
    let result = within("prompt turn", async {
        loop {
            tokio::select! {
                result = &mut prompt => break result,
                Some(event) = events.recv() => record(&mut turn, event, &mut on_permission),
            }
        }
    })
    .await;
    while let Some(event) = events.try_recv() {
        record(&mut turn, event, &mut on_permission);
    }
    (result, turn)
}

fn record(turn: &mut Turn, event: Event, on_permission: &mut impl FnMut(PermissionRequest)) {
    match event {
        Event::SessionUpdate(notification) => match notification.update {
            SessionUpdate::AgentMessageChunk(chunk) => {
                if let ContentBlock::Text(text) = chunk.content {
                    turn.text.push_str(&text.text);
                }
            }
            SessionUpdate::ToolCall(call) => turn.tools.push((call.title, call.status)),
            SessionUpdate::ToolCallUpdate(update) => turn.tools.push((
                update.fields.title.unwrap_or_default(),
                update.fields.status.unwrap_or_default(),
            )),
            other => turn.other.push(Event::SessionUpdate(
                sandbox_agent_sdk::schema::SessionNotification::new(notification.session_id, other),
            )),
        },
        Event::PermissionRequest(request) => {
            turn.permissions.push(request.title().to_owned());
            on_permission(request);
        }
        other => turn.other.push(other),
    }
}

/// Waits until `events` yields an event `pick` accepts; panics naming
/// `what` after [`STEP`].
pub async fn wait_for<T>(
    events: &mut Events,
    what: &str,
    mut pick: impl FnMut(Event) -> Option<T>,
) -> T {
    within(what, async {
        loop {
            match events.recv().await {
                Some(event) => {
                    if let Some(found) = pick(event) {
                        return found;
                    }
                }
                None => panic!("{what}: the event stream ended"),
            }
        }
    })
    .await
}
