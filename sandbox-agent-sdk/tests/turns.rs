//! `SandboxAgentClient` against the real `sandbox-agent` binary: a prompt
//! turn as a stream (`prompt_stream`), the bound on permission requests
//! nobody reads, questions of the agent (ACP elicitation, the mock's `ask
//! question` and `ask url`), the error predicates on real failures, and
//! clones.

mod common;

use common::{TestResult, server_options, within};
use sandbox_agent_sdk::schema::{
    ElicitationAcceptAction, ElicitationAction, ElicitationMode, NewSessionRequest, PromptRequest,
    SessionId, StopReason,
};
use sandbox_agent_sdk::{
    ClientOptions, Error, Event, Events, PermissionDecision, QuestionRequest, SandboxAgentClient,
    StreamExt, TurnEvent, TurnStream,
};
use serde_json::json;
use std::time::{Duration, Instant};
use v2_api_tests::TestServer;

/// The unread-permission bound the tests use.
const SHORT: Duration = Duration::from_millis(400);

/// A client of the mock agent on `server` with `options` adjusted, and a
/// new session.
async fn client_with(
    server: &TestServer,
    adjust: impl FnOnce(ClientOptions) -> ClientOptions,
) -> Result<(SandboxAgentClient, SessionId), Box<dyn std::error::Error + Send + Sync>> {
    let client = within(
        "connect",
        SandboxAgentClient::connect(adjust(server_options(server))),
    )
    .await?;
    let session = client.new_session(NewSessionRequest::new("/tmp")).await?;
    Ok((client, session.session_id.clone()))
}

fn prompt(session: &SessionId, text: &str) -> PromptRequest {
    PromptRequest::new(session.clone(), vec![text.into()])
}

/// Every item of `turn`, to its end.
async fn collect(mut turn: TurnStream) -> Vec<TurnEvent> {
    within("turn stream", async {
        let mut items = Vec::new();
        while let Some(event) = turn.next().await {
            items.push(event);
        }
        items
    })
    .await
}

/// Whether `events` holds a permission request now.
fn has_permission_request(events: &mut Events) -> bool {
    let mut found = false;
    while let Some(event) = events.try_recv() {
        found |= matches!(event, Event::PermissionRequest(_));
    }
    found
}

// ---------------------------------------------------------------------
// No silent hang
// ---------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unread_permission_request_is_cancelled_after_the_bound() -> TestResult {
    let server = TestServer::start(&[]).await;

    // Nobody ever takes the event stream: the turn still ends.
    let (client, session) = client_with(&server, |o| o.unread_permission_timeout(SHORT)).await?;
    let started = Instant::now();
    let done = within(
        "a prompt nobody answers",
        client.prompt(prompt(&session, "please ask permission")),
    )
    .await?;
    assert_eq!(done.stop_reason, StopReason::Cancelled);
    assert!(started.elapsed() >= SHORT, "{:?}", started.elapsed());

    // The stream is held but not read during the turn: the same, and the
    // expired request is not handed out afterwards.
    let mut events = client.take_events().ok_or("events")?;
    let done = within(
        "a prompt whose events are not read",
        client.prompt(prompt(&session, "please ask permission")),
    )
    .await?;
    assert_eq!(done.stop_reason, StopReason::Cancelled);
    assert!(!has_permission_request(&mut events));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permission_request_read_in_time_waits_for_its_answer() -> TestResult {
    let server = TestServer::start(&[]).await;
    let (client, session) = client_with(&server, |o| o.unread_permission_timeout(SHORT)).await?;
    let mut events = client.take_events().ok_or("events")?;
    let turn = client.clone();
    let request = prompt(&session, "please ask permission");
    let running = tokio::spawn(async move { turn.prompt(request).await });
    let permission = within("the permission request", async {
        loop {
            if let Some(Event::PermissionRequest(request)) = events.recv().await {
                break request;
            }
        }
    })
    .await;
    // Read in time: the bound no longer applies.
    tokio::time::sleep(SHORT * 3).await;
    permission.decide(PermissionDecision::Allow)?;
    let done = within("the turn", running).await??;
    assert_eq!(done.stop_reason, StopReason::EndTurn);
    Ok(())
}

// ---------------------------------------------------------------------
// prompt_stream
// ---------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_stream_yields_chunks_before_the_stop_reason_and_ends() -> TestResult {
    let server = TestServer::start(&[]).await;
    let (client, session) = client_with(&server, |o| o).await?;
    let mut turn = client.prompt_stream(prompt(&session, "!slow 3 200"));
    assert_eq!(turn.session_id(), &session);

    // The first chunk arrives while the turn still runs (the next chunks
    // are 200 ms apart).
    let first = within("the first chunk", turn.next()).await;
    assert_eq!(
        first.as_ref().and_then(TurnEvent::text),
        Some("chunk-1 "),
        "{first:?}"
    );
    let rest = collect(turn).await;
    let (last, before) = rest.split_last().ok_or("no stop reason")?;
    assert_eq!(last.stop_reason(), Some(StopReason::EndTurn), "{last:?}");
    let text: String = before.iter().filter_map(TurnEvent::text).collect();
    assert_eq!(text, "chunk-2 chunk-3 ");
    assert!(before.iter().all(|event| !event.is_final()));

    // A plain turn, and the client-wide stream sees the same updates.
    let mut events = client.take_events().ok_or("events")?;
    let items = collect(client.prompt_stream(prompt(&session, "hello"))).await;
    let text: String = items.iter().filter_map(TurnEvent::text).collect();
    assert_eq!(text, "Hello from the mock agent. You said: hello");
    assert!(matches!(items.last(), Some(TurnEvent::Stopped(_))));
    let mut seen = 0;
    while let Some(event) = events.try_recv() {
        seen += usize::from(matches!(event, Event::SessionUpdate(_)));
    }
    assert!(seen >= items.len() - 1, "{seen} updates on Events");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permission_is_answered_through_the_turn_stream() -> TestResult {
    let server = TestServer::start(&[]).await;
    let (client, session) = client_with(&server, |o| o).await?;
    let mut events = client.take_events().ok_or("events")?;
    let mut turn = client.prompt_stream(prompt(&session, "please ask permission"));
    let mut text = String::new();
    let mut asked = Vec::new();
    let mut stop = None;
    within("the turn", async {
        while let Some(event) = turn.next().await {
            match event {
                TurnEvent::PermissionRequest(request) => {
                    asked.push(request.title().to_owned());
                    if let Err(error) = request.decide(PermissionDecision::Allow) {
                        panic!("answering failed: {error}");
                    }
                }
                TurnEvent::MessageChunk(_) => text.push_str(event.text().unwrap_or_default()),
                TurnEvent::Stopped(done) => stop = Some(done.stop_reason),
                TurnEvent::Failed(error) => panic!("the turn failed: {error}"),
                _ => {}
            }
        }
    })
    .await;
    assert_eq!(asked, ["Write to mock.txt"]);
    assert_eq!(stop, Some(StopReason::EndTurn));
    assert!(text.starts_with("Permission granted."), "{text}");
    // The request went to the turn, not to the client-wide stream.
    assert!(!has_permission_request(&mut events));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_stream_without_a_connection_fails_and_ends() -> TestResult {
    let server = TestServer::start(&[]).await;
    let client = SandboxAgentClient::connect(server_options(&server).auto_connect(false)).await?;
    let items = collect(client.prompt_stream(prompt(&SessionId::new("s"), "hello"))).await;
    assert!(
        matches!(items.as_slice(), [TurnEvent::Failed(Error::NotConnected)]),
        "{items:?}"
    );
    Ok(())
}

// ---------------------------------------------------------------------
// Questions (ACP elicitation)
// ---------------------------------------------------------------------

/// The mock's answer to a form question accepted with Ada's values.
const ADA_ANSWERED: &str = "You answered: name=Ada color=green confirm=true";

fn ada() -> serde_json::Value {
    json!({"name": "Ada", "color": "green", "confirm": true})
}

/// What a question turn showed: the agent's text, the completed URL
/// questions' ids, the stop reason.
#[derive(Debug, Default)]
struct QuestionTurn {
    text: String,
    completed: Vec<String>,
    stop: Option<StopReason>,
    questions: usize,
}

/// Runs `text` as a turn stream; each question goes to `answer`.
async fn question_turn(
    client: &SandboxAgentClient,
    session: &SessionId,
    text: &str,
    mut answer: impl FnMut(QuestionRequest),
) -> QuestionTurn {
    let mut turn = client.prompt_stream(prompt(session, text));
    let mut seen = QuestionTurn::default();
    within("the question turn", async {
        while let Some(event) = turn.next().await {
            match event {
                TurnEvent::Question(question) => {
                    seen.questions += 1;
                    answer(question);
                }
                TurnEvent::QuestionCompleted(done) => {
                    seen.completed.push(done.elicitation_id.0.to_string());
                }
                TurnEvent::MessageChunk(_) => seen.text.push_str(event.text().unwrap_or_default()),
                TurnEvent::Stopped(done) => seen.stop = Some(done.stop_reason),
                TurnEvent::Failed(error) => panic!("the turn failed: {error}"),
                _ => {}
            }
        }
    })
    .await;
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_form_question_is_answered_after_a_fixed_mistake() -> TestResult {
    let server = TestServer::start(&[]).await;
    let (client, session) = client_with(&server, |o| o).await?;
    let mut mistakes = Vec::new();
    let turn = question_turn(&client, &session, "ask question", |question| {
        assert_eq!(question.message(), "The mock agent has a question");
        assert_eq!(question.session_id(), Some(&session));
        assert!(question.url().is_none());
        let schema = question.schema().expect("a form");
        assert_eq!(schema.title.as_deref(), Some("About you"));
        // An empty name is refused before anything is sent, naming the
        // field; the question stays open for the fixed answer.
        match question.accept(json!({"name": "", "color": "green"})) {
            Err(error @ Error::InvalidAnswer { .. }) => mistakes.push(error.to_string()),
            other => panic!("an empty name was accepted: {other:?}"),
        }
        match question.accept(json!({"name": "Ada", "color": "purple"})) {
            Err(error @ Error::InvalidAnswer { .. }) => mistakes.push(error.to_string()),
            other => panic!("purple was accepted: {other:?}"),
        }
        if let Err(error) = question.accept(ada()) {
            panic!("the fixed answer failed: {error}");
        }
        // Answered once: a second answer is refused.
        assert!(matches!(
            question.accept(ada()),
            Err(Error::InvalidAnswer { field: None, .. })
        ));
    })
    .await;
    assert_eq!(
        mistakes,
        [
            "invalid answer: field \"name\" must be at least 1 character long (is 0)",
            "invalid answer: field \"color\" must be one of \"red\", \"green\", \"blue\", not \"purple\"",
        ]
    );
    assert_eq!(turn.questions, 1);
    assert_eq!(turn.text, ADA_ANSWERED);
    assert_eq!(turn.stop, Some(StopReason::EndTurn));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_declined_cancelled_or_dropped() -> TestResult {
    let server = TestServer::start(&[]).await;
    let (client, session) = client_with(&server, |o| o).await?;
    let declined = question_turn(&client, &session, "ask question", |question| {
        if let Err(error) = question.decline() {
            panic!("{error}");
        }
    })
    .await;
    assert_eq!(declined.text, "You declined the question.");
    let cancelled = question_turn(&client, &session, "ask question", |question| {
        if let Err(error) = question.cancel() {
            panic!("{error}");
        }
    })
    .await;
    assert_eq!(cancelled.text, "You cancelled the question.");
    // Dropped unanswered: "cancel".
    let dropped = question_turn(&client, &session, "ask question", drop).await;
    assert_eq!(dropped.text, "You cancelled the question.");
    assert_eq!(dropped.stop, Some(StopReason::EndTurn));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_question_is_accepted_then_completed() -> TestResult {
    let server = TestServer::start(&[]).await;
    let (client, session) = client_with(&server, |o| o).await?;
    let mut asked = None;
    let turn = question_turn(&client, &session, "ask url", |question| {
        assert_eq!(question.message(), "Sign in to the mock service");
        assert!(question.schema().is_none());
        assert!(matches!(question.mode(), ElicitationMode::Url(_)));
        let id = question.elicitation_id().map(|id| id.0.to_string());
        let url = question.url().map(str::to_owned);
        // A URL question takes no content.
        assert!(matches!(
            question.accept(json!({"token": "x"})),
            Err(Error::InvalidAnswer { .. })
        ));
        if let Err(error) = question.accept(()) {
            panic!("{error}");
        }
        asked = id.zip(url);
    })
    .await;
    let (id, url) = asked.ok_or("no URL question")?;
    assert!(id.starts_with("mock-elicitation-"), "{id}");
    assert_eq!(
        url,
        format!("https://example.invalid/sandbox-agent/mock/authorize?elicitation={id}")
    );
    assert_eq!(turn.completed, [id]);
    assert_eq!(turn.text, "You completed the sign-in.");
    assert_eq!(turn.stop, Some(StopReason::EndTurn));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn questions_reach_events_when_no_turn_stream_runs() -> TestResult {
    let server = TestServer::start(&[]).await;
    let (client, session) = client_with(&server, |o| o).await?;
    let mut events = client.take_events().ok_or("events")?;
    let turn = client.clone();
    let request = prompt(&session, "ask url");
    let running = tokio::spawn(async move { turn.prompt(request).await });
    let question = common::wait_for(&mut events, "the question", |event| match event {
        Event::Question(question) => Some(question),
        _ => None,
    })
    .await;
    let id = question
        .elicitation_id()
        .cloned()
        .ok_or("not a URL question")?;
    question.accept(())?;
    let completed = common::wait_for(&mut events, "the completion", |event| match event {
        Event::QuestionCompleted(done) => Some(done),
        _ => None,
    })
    .await;
    assert_eq!(completed.elicitation_id, id);
    let done = within("the turn", running).await??;
    assert_eq!(done.stop_reason, StopReason::EndTurn);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unread_question_is_cancelled_after_the_bound() -> TestResult {
    let server = TestServer::start(&[]).await;
    // Nobody takes the event stream.
    let (client, session) = client_with(&server, |o| o.unread_question_timeout(SHORT)).await?;
    let started = Instant::now();
    let done = within(
        "a question nobody reads",
        client.prompt(prompt(&session, "ask question")),
    )
    .await?;
    assert_eq!(done.stop_reason, StopReason::EndTurn);
    assert!(started.elapsed() >= SHORT, "{:?}", started.elapsed());
    // Its reply said so (the updates are on the events, taken now).
    let mut events = client.take_events().ok_or("events")?;
    let mut text = String::new();
    while let Some(event) = events.try_recv() {
        assert!(!matches!(event, Event::Question(_)), "an expired question");
        if let Event::SessionUpdate(update) = event
            && let sandbox_agent_sdk::schema::SessionUpdate::AgentMessageChunk(chunk) =
                update.update
            && let sandbox_agent_sdk::schema::ContentBlock::Text(chunk) = chunk.content
        {
            text.push_str(&chunk.text);
        }
    }
    assert_eq!(text, "You cancelled the question.");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_handler_answers_and_its_answer_is_checked() -> TestResult {
    let server = TestServer::start(&[]).await;
    let accept = |content: serde_json::Value| -> ElicitationAction {
        let content = serde_json::from_value(content).expect("content");
        ElicitationAction::Accept(ElicitationAcceptAction::new().content(Some(content)))
    };
    let (client, session) = client_with(&server, |o| {
        o.question_handler(move |_question| {
            let action = accept(ada());
            async move { action }
        })
    })
    .await?;
    let turn = question_turn(&client, &session, "ask question", |_| {
        panic!("the handler answers")
    })
    .await;
    assert_eq!(turn.text, ADA_ANSWERED);

    // A handler's answer that does not fit is not sent: "cancel".
    let (client, session) = client_with(&server, |o| {
        o.question_handler(|_question| async {
            ElicitationAction::Accept(ElicitationAcceptAction::new())
        })
    })
    .await?;
    let turn = question_turn(&client, &session, "ask question", drop).await;
    assert_eq!(turn.text, "You cancelled the question.");
    Ok(())
}

// ---------------------------------------------------------------------
// Error predicates on real failures
// ---------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_found_is_one_predicate_over_rpc_and_http() -> TestResult {
    let server = TestServer::start(&[]).await;
    let (client, _) = client_with(&server, |o| o).await?;
    // Over the connection: JSON-RPC -32002.
    let over_rpc = client
        .get_session("no-such-session".to_owned())
        .await
        .err()
        .ok_or("found")?;
    assert_eq!(over_rpc.rpc_code(), Some(-32002), "{over_rpc:?}");
    assert!(over_rpc.is_not_found());
    // Over the control plane: HTTP 404.
    let over_http = client
        .session_events("no-such-session".to_owned(), 0, None)
        .await
        .err()
        .ok_or("found")?;
    assert_eq!(
        over_http.status(),
        Some(sandbox_agent_sdk::StatusCode::NOT_FOUND)
    );
    assert!(over_http.is_not_found());
    assert!(!over_http.is_unauthorized() && !over_http.is_connection_lost());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_is_unauthorized_on_both_paths() -> TestResult {
    let server = TestServer::start(&["--token", "right"]).await;
    let wrong = ClientOptions::new("mock")
        .base_url(server.base_url())
        .token("wrong");
    let on_connect = within("connect", SandboxAgentClient::connect(wrong.clone()))
        .await
        .err()
        .ok_or("connected with a wrong token")?;
    assert!(on_connect.is_unauthorized(), "{on_connect:?}");
    let client = SandboxAgentClient::connect(wrong.auto_connect(false)).await?;
    let on_route = client.agents().await.err().ok_or("listed agents")?;
    assert!(on_route.is_unauthorized(), "{on_route:?}");
    assert!(!on_route.is_not_found());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_a_lost_connection_with_its_source() -> TestResult {
    // A port that was free a moment ago: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let options = ClientOptions::new("mock")
        .base_url(format!("http://127.0.0.1:{port}"))
        .auto_connect(false);
    let client = SandboxAgentClient::connect(options).await?;
    let on_route = within("health", client.health())
        .await
        .err()
        .ok_or("healthy")?;
    assert!(on_route.is_connection_lost(), "{on_route:?}");
    assert!(
        std::error::Error::source(&on_route).is_some(),
        "the reqwest error is kept: {on_route:?}"
    );
    let on_open = within("open", client.open()).await.err().ok_or("opened")?;
    assert!(on_open.is_connection_lost(), "{on_open:?}");
    assert!(!on_open.is_timeout() && !on_open.is_not_found());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_over_the_request_timeout_is_a_timeout() -> TestResult {
    let server = TestServer::start(&[]).await;
    // Long enough for `initialize` on a loaded 2-core machine (it is
    // bounded too), short against the turn.
    let limit = Duration::from_millis(1500);
    let (client, session) = client_with(&server, |o| o.request_timeout(limit)).await?;
    let started = Instant::now();
    let error = within(
        "a slow prompt",
        client.prompt(prompt(&session, "!slow 4 1500")),
    )
    .await
    .err()
    .ok_or("the slow turn finished in time")?;
    assert!(error.is_timeout(), "{error:?}");
    assert!(!error.is_connection_lost());
    assert!(started.elapsed() < Duration::from_secs(8));
    match &error {
        Error::Timeout { what, after, .. } => {
            assert_eq!(what, "session/prompt");
            assert_eq!(*after, Some(limit));
        }
        other => panic!("{other:?}"),
    }
    // The same through a turn stream; the timed-out turn was cancelled, so
    // the session takes it.
    let items = collect(client.prompt_stream(prompt(&session, "!slow 4 1500"))).await;
    assert!(
        matches!(items.last(), Some(TurnEvent::Failed(error)) if error.is_timeout()),
        "{items:?}"
    );
    // Without a limit the same turn ends.
    let unlimited =
        SandboxAgentClient::connect(server_options(&server).no_request_timeout()).await?;
    let session = unlimited
        .new_session(NewSessionRequest::new("/tmp"))
        .await?;
    let done = within(
        "the slow turn",
        unlimited.prompt(prompt(&session.session_id, "!slow 2 400")),
    )
    .await?;
    assert_eq!(done.stop_reason, StopReason::EndTurn);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answering_after_the_connection_closed_is_a_lost_connection() -> TestResult {
    let server = TestServer::start(&[]).await;
    let (client, session) = client_with(&server, |o| o).await?;
    let mut turn = client.prompt_stream(prompt(&session, "please ask permission"));
    let request = within("the permission request", async {
        loop {
            match turn.next().await {
                Some(TurnEvent::PermissionRequest(request)) => break Some(request),
                Some(_) => {}
                None => break None,
            }
        }
    })
    .await
    .ok_or("no permission request")?;
    within("close", client.close()).await?;
    let error = request
        .decide(PermissionDecision::Allow)
        .err()
        .ok_or("answered on a closed connection")?;
    assert!(error.is_connection_lost(), "{error:?}");
    Ok(())
}

// ---------------------------------------------------------------------
// Clones
// ---------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clones_share_the_connection_and_work_from_tasks() -> TestResult {
    let server = TestServer::start(&[]).await;
    let (client, session) = client_with(&server, |o| o).await?;
    let id = client.connection_id();
    let clone = client.clone();
    assert_eq!(clone.connection_id(), id);
    let done = tokio::spawn(async move { clone.prompt(prompt(&session, "hello")).await });
    assert_eq!(
        within("the turn", done).await??.stop_reason,
        StopReason::EndTurn
    );
    // Closing through one clone closes it for all.
    let other = client.clone();
    other.close().await?;
    assert!(!client.is_connected());
    Ok(())
}

/// A turn left waiting on a permission when its server is killed: after a
/// restart the session's events page ends with the interrupted turn,
/// typed by `SessionEvent::turn_interrupted` (research/contract.md,
/// "Notifications the runtime sends").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_its_server_died_in_reads_as_interrupted_after_a_restart() -> TestResult {
    let data = v2_api_tests::TempDir::new("sdk-interrupted");
    let dir = data.path().to_str().expect("UTF-8 temp dir").to_owned();
    let mut server = TestServer::start(&["--data-dir", &dir]).await;
    let (client, session) = client_with(&server, |options| options).await?;
    let mut events = client.take_events().expect("events");
    let turn = {
        let client = client.clone();
        let request = prompt(&session, "ask permission");
        tokio::spawn(async move { client.prompt(request).await })
    };
    let request = within("the permission request", async {
        loop {
            if let Some(Event::PermissionRequest(request)) = events.recv().await {
                return request;
            }
        }
    })
    .await;
    server.store_caught_up(Duration::from_secs(30)).await;
    server
        .kill_now(Duration::from_secs(30))
        .await
        .expect("SIGKILL");
    drop(server);
    drop(request);
    turn.abort();

    let server = TestServer::start(&["--data-dir", &dir]).await;
    let reader = within(
        "connect",
        SandboxAgentClient::connect(server_options(&server)),
    )
    .await?;
    let page = reader.session_events(session.clone(), 0, None).await?;
    let last = page.events.last().expect("events");
    let interrupted = last
        .turn_interrupted()
        .expect("the last event is the interruption");
    assert_eq!(interrupted.session_id, *session.0);
    assert_eq!(interrupted.stop_reason, StopReason::Cancelled);
    assert_eq!(interrupted.request_ids.len(), 1, "{interrupted:?}");
    assert!(
        page.events
            .iter()
            .filter(|event| event.turn_interrupted().is_some())
            .count()
            == 1
    );
    Ok(())
}
