//! `SandboxAgentClient` in server mode against the real `sandbox-agent`
//! binary on a real port: connection guards, prompt turns with permission
//! requests, metadata, extension events, session methods, control plane.

mod common;

use common::{TestResult, embedded_options, run_turn, server_options, wait_for, within};
use sandbox_agent_sdk::schema::{
    ForkSessionRequest, ListSessionsRequest, LoadSessionRequest, NewSessionRequest,
    ResumeSessionRequest, SessionUpdate, SetSessionConfigOptionRequest, SetSessionModeRequest,
    StopReason, ToolCallStatus,
};
use sandbox_agent_sdk::{
    ClientOptions, EndReason, Error, Event, HistoryPolicy, HttpFailure, InstallOptions, Metadata,
    ModelsTarget, PermissionDecision, Role, SandboxAgentClient, SessionEntryQuery, SessionState,
    SetSessionModelRequest, StatusCode, TerminatedBy, sandbox_meta,
};
use serde_json::json;
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use v2_api_tests::TestServer;

/// A client of the mock agent on `server`, its events, and a new session
/// (cwd `/tmp`).
async fn mock_session(
    server: &TestServer,
) -> Result<
    (
        SandboxAgentClient,
        sandbox_agent_sdk::Events,
        sandbox_agent_sdk::WithMeta<sandbox_agent_sdk::schema::NewSessionResponse>,
    ),
    Box<dyn std::error::Error + Send + Sync>,
> {
    let client = within(
        "connect",
        SandboxAgentClient::connect(server_options(server)),
    )
    .await?;
    let events = client.take_events().ok_or("events taken")?;
    let session = client.new_session(NewSessionRequest::new("/tmp")).await?;
    Ok((client, events, session))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_mode_with_a_token_runs_a_plain_turn() -> TestResult {
    let server = TestServer::start(&["--token", "sdk-secret"]).await;
    let client = within(
        "connect",
        SandboxAgentClient::connect(server_options(&server)),
    )
    .await?;
    assert!(client.is_connected());
    assert!(client.connection_id().is_some());
    assert_eq!(client.server_pid(), None, "server mode starts nothing");
    let init = client.initialize_result().ok_or("no initialize result")?;
    assert_eq!(
        init.agent_info.map(|info| info.name).as_deref(),
        Some("sandbox-agent-mock")
    );
    // The advertised methods, read from `extensions.methods`.
    let methods = client.extension_methods();
    for expected in [
        "_sandboxagent/session/get",
        "_sandboxagent/session/list",
        "_sandboxagent/agent/install",
    ] {
        assert!(methods.iter().any(|m| m == expected), "{methods:?}");
    }

    let mut events = client.take_events().ok_or("events")?;
    assert!(client.take_events().is_none(), "the stream is taken once");
    let session = client.new_session(NewSessionRequest::new("/tmp")).await?;
    let (result, turn) = run_turn(&client, &mut events, &session.session_id, "hello", |_| {}).await;
    assert_eq!(result?.stop_reason, StopReason::EndTurn);
    assert_eq!(turn.text, "Hello from the mock agent. You said: hello");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_or_an_unknown_agent_is_an_http_problem() -> TestResult {
    let server = TestServer::start(&["--token", "right"]).await;
    let wrong = ClientOptions::new("mock")
        .base_url(server.base_url())
        .token("wrong");
    match within("connect", SandboxAgentClient::connect(wrong)).await {
        Err(Error::Http(HttpFailure { status, problem })) => {
            assert_eq!(status, StatusCode::UNAUTHORIZED);
            assert_eq!(
                problem.map(|p| p.problem_type).as_deref(),
                Some("urn:sandbox-agent:error:unauthorized")
            );
        }
        other => panic!("expected 401, got {other:?}"),
    }

    let unknown = ClientOptions::new("nope")
        .base_url(server.base_url())
        .token("right")
        .auto_connect(false);
    let client = SandboxAgentClient::connect(unknown).await?;
    let error = client
        .open()
        .await
        .err()
        .ok_or("open of an unknown agent succeeded")?;
    assert_eq!(error.status(), Some(StatusCode::NOT_FOUND), "{error}");
    assert_eq!(
        error.problem().map(|p| p.problem_type.as_str()),
        Some("urn:sandbox-agent:error:unknown-agent")
    );
    assert!(!client.is_connected());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_connect_off_defers_and_both_guards_hold() -> TestResult {
    let server = TestServer::start(&[]).await;
    let client = SandboxAgentClient::connect(server_options(&server).auto_connect(false)).await?;
    assert!(!client.is_connected());
    assert!(client.initialize_result().is_none());
    assert!(matches!(
        client.new_session(NewSessionRequest::new("/tmp")).await,
        Err(Error::NotConnected)
    ));
    assert!(matches!(client.cancel("s").await, Err(Error::NotConnected)));
    assert!(matches!(
        client.terminate_session("s").await,
        Err(Error::NotConnected)
    ));
    // The control plane needs no connection.
    assert_eq!(client.health().await?.status, "ok");

    client.open().await?;
    assert!(client.is_connected());
    assert!(matches!(client.open().await, Err(Error::AlreadyConnected)));
    let first = client.connection_id().ok_or("connection id")?;
    let session = client.new_session(NewSessionRequest::new("/tmp")).await?;

    client.close().await?;
    assert!(!client.is_connected());
    client.close().await?; // idempotent
    assert!(matches!(
        client.list_sessions(ListSessionsRequest::new()).await,
        Err(Error::NotConnected)
    ));

    // Reconnecting works, on a new connection; the session lived on.
    client.open().await?;
    let second = client.connection_id().ok_or("connection id")?;
    assert_ne!(first, second);
    let entry = client.get_session(session.session_id.clone()).await?;
    assert_eq!(entry.session_id, session.session_id);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_auto_connect_the_first_connection_is_already_open() -> TestResult {
    let server = TestServer::start(&[]).await;
    let client = SandboxAgentClient::connect(server_options(&server)).await?;
    assert!(client.is_connected());
    assert!(matches!(client.open().await, Err(Error::AlreadyConnected)));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permission_turn_answered_through_the_event_stream() -> TestResult {
    let server = TestServer::start(&[]).await;
    let (client, mut events, session) = mock_session(&server).await?;

    let (result, turn) = run_turn(
        &client,
        &mut events,
        &session.session_id,
        "please ask permission",
        |request| {
            assert_eq!(request.request().options.len(), 2);
            if let Err(error) = request.decide(PermissionDecision::Allow) {
                panic!("answering failed: {error}");
            }
        },
    )
    .await;
    assert_eq!(result?.stop_reason, StopReason::EndTurn);
    assert_eq!(turn.permissions, ["Write to mock.txt"]);
    assert!(
        turn.text.starts_with("Permission granted."),
        "{}",
        turn.text
    );
    assert_eq!(
        turn.tools.last().map(|(_, status)| *status),
        Some(ToolCallStatus::Completed)
    );

    // Rejected this time.
    let (result, turn) = run_turn(
        &client,
        &mut events,
        &session.session_id,
        "permission again",
        |request| {
            let _ = request.decide(PermissionDecision::Reject);
        },
    )
    .await;
    assert_eq!(result?.stop_reason, StopReason::EndTurn);
    assert!(turn.text.starts_with("Permission denied."), "{}", turn.text);
    assert_eq!(
        turn.tools.last().map(|(_, status)| *status),
        Some(ToolCallStatus::Failed)
    );

    // Dropped unanswered: the agent hears "cancelled".
    let (result, _) = run_turn(
        &client,
        &mut events,
        &session.session_id,
        "permission, ignored",
        drop,
    )
    .await;
    assert_eq!(result?.stop_reason, StopReason::Cancelled);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permission_turn_answered_by_the_handler() -> TestResult {
    let server = TestServer::start(&[]).await;
    let asked = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&asked);
    let options = server_options(&server).permission_handler(move |request| {
        counter.fetch_add(1, Ordering::SeqCst);
        let title = request.tool_call.fields.title.clone();
        async move {
            assert_eq!(title.as_deref(), Some("Write to mock.txt"));
            PermissionDecision::Reject
        }
    });
    let client = SandboxAgentClient::connect(options).await?;
    let mut events = client.take_events().ok_or("events")?;
    let session = client.new_session(NewSessionRequest::new("/tmp")).await?;
    let (result, turn) = run_turn(
        &client,
        &mut events,
        &session.session_id,
        "permission please",
        |_| panic!("the handler wins over the stream"),
    )
    .await;
    assert_eq!(result?.stop_reason, StopReason::EndTurn);
    assert_eq!(asked.load(Ordering::SeqCst), 1);
    assert!(turn.permissions.is_empty());
    assert!(turn.text.starts_with("Permission denied."), "{}", turn.text);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_written_comes_back_as_typed_fields_everywhere() -> TestResult {
    let server = TestServer::start(&[]).await;
    let client = SandboxAgentClient::connect(server_options(&server)).await?;
    let request = NewSessionRequest::new("/work/app").meta(sandbox_meta(
        Metadata::new()
            .set("variant", "fast")
            .set("labels", json!({"team": "infra"})),
    ));
    let created = client.new_session(request).await?;
    let meta = created
        .meta
        .clone()
        .ok_or("typed metadata on session/new")?;
    assert_eq!(meta.agent, "mock");
    assert!(!meta.ended);
    assert_eq!(meta.model.as_deref(), Some("mock-fast"));
    assert_eq!(meta.mode.as_deref(), Some("default"));
    assert_eq!(meta.extra.get("variant"), Some(&json!("fast")));

    let written = client
        .set_metadata(
            created.session_id.clone(),
            json!({
                "title": "Fix the login bug", "model": "mock-smart", "mode": "plan",
                "ticket": "ENG-42", "labels": {"priority": "high"}
            }),
        )
        .await?;
    let check = |what: &str, entry: &sandbox_agent_sdk::SessionEntry| {
        let Some(meta) = entry.meta.as_ref() else {
            panic!("{what}: no typed metadata");
        };
        assert_eq!(meta.agent, "mock", "{what}");
        assert_eq!(meta.title.as_deref(), Some("Fix the login bug"), "{what}");
        assert_eq!(meta.model.as_deref(), Some("mock-smart"), "{what}");
        assert_eq!(meta.mode.as_deref(), Some("plan"), "{what}");
        assert_eq!(meta.extra.get("ticket"), Some(&json!("ENG-42")), "{what}");
        assert_eq!(
            meta.extra.get("labels"),
            Some(&json!({"team": "infra", "priority": "high"})),
            "{what}"
        );
        assert_eq!(meta.extra.get("variant"), Some(&json!("fast")), "{what}");
        assert!(!meta.created_at.is_empty() && !meta.updated_at.is_empty());
        // The wire's RFC 3339 text reads as a time.
        let created = meta.created_time().ok_or("createdAt is RFC 3339");
        let updated = meta.updated_time().ok_or("updatedAt is RFC 3339");
        assert!(
            matches!((created, updated), (Ok(c), Ok(u)) if u >= c),
            "{what}"
        );
        assert_eq!(entry.title.as_deref(), Some("Fix the login bug"), "{what}");
    };
    check("set_metadata", &written);
    check(
        "get_session",
        &client.get_session(created.session_id.clone()).await?,
    );
    let listed = client.list_sessions(ListSessionsRequest::new()).await?;
    let entry = listed
        .sessions
        .iter()
        .find(|entry| entry.session_id == created.session_id)
        .ok_or("listed")?;
    check("list_sessions", entry);
    let id = created.session_id.0.to_string();
    client.close().await?;
    check(
        "GET /v2/sessions/{id} (get_session without a connection)",
        &client.get_session(id).await?,
    );
    let all = client.all_sessions().await?;
    check(
        "GET /v2/sessions",
        all.iter()
            .find(|entry| entry.session_id == created.session_id)
            .ok_or("in the inventory")?,
    );
    Ok(())
}

/// Sessions the inventory tests create: more than two pages of 100.
const MANY_SESSIONS: usize = 250;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inventory_pages_without_repeats_or_gaps() -> TestResult {
    let server = TestServer::start(&[]).await;
    let client = within(
        "connect",
        SandboxAgentClient::connect(server_options(&server)),
    )
    .await?;
    let mut created = Vec::new();
    for _ in 0..MANY_SESSIONS {
        let session = client.new_session(NewSessionRequest::new("/tmp")).await?;
        created.push(session.session_id.0.to_string());
    }

    // Pages of 100, newest first; sessions created after the first page
    // (newer) shift nothing on the later ones.
    let mut query = SessionEntryQuery::new().limit(100);
    let mut sizes = Vec::new();
    let mut listed = Vec::new();
    loop {
        let page = client.list_session_entries(query.clone()).await?;
        sizes.push(page.sessions.len());
        assert!(sizes.len() <= 5, "too many pages: {sizes:?}");
        for entry in &page.sessions {
            let meta = entry.meta.as_ref().ok_or("entry without metadata")?;
            let created_at = meta.created_time().ok_or("createdAt is RFC 3339")?;
            listed.push((created_at, entry.session_id.0.to_string()));
        }
        if sizes.len() == 1 {
            for _ in 0..3 {
                client.new_session(NewSessionRequest::new("/tmp")).await?;
            }
        }
        match page.next_cursor {
            Some(cursor) => query.cursor = Some(cursor),
            None => break,
        }
    }
    assert_eq!(sizes, [100, 100, 50], "page sizes");
    let ids: Vec<&str> = listed.iter().map(|(_, id)| id.as_str()).collect();
    let unique: HashSet<&str> = ids.iter().copied().collect();
    assert_eq!(unique.len(), ids.len(), "an entry listed twice");
    let wanted: HashSet<&str> = created.iter().map(String::as_str).collect();
    assert_eq!(
        unique, wanted,
        "the pages hold exactly the sessions created"
    );
    assert!(
        listed.windows(2).all(|pair| pair[0].0 >= pair[1].0),
        "newest first"
    );
    // The newest sessions come first: the last one created leads the walk.
    assert_eq!(ids.last().copied(), created.first().map(String::as_str));

    // The walk follows the cursors too, at any page size.
    let walked = client
        .all_session_entries(SessionEntryQuery::new().limit(70))
        .await?;
    assert_eq!(walked.len(), MANY_SESSIONS + 3, "every session once");
    let all = client.all_sessions().await?;
    assert_eq!(all.len(), MANY_SESSIONS + 3, "every session once");

    // Filters: state, title (ASCII case ignored), agent; with a cursor.
    for id in &created[..3] {
        client.terminate_session(id.clone()).await?;
    }
    client
        .set_metadata(
            created[10].clone(),
            Metadata::new().title("Fix the login bug"),
        )
        .await?;
    client
        .set_metadata(created[20].clone(), Metadata::new().title("Login page"))
        .await?;
    let ended = client
        .all_session_entries(SessionEntryQuery::new().state(SessionState::Ended).limit(2))
        .await?;
    let mut ended: Vec<String> = ended.iter().map(|e| e.session_id.0.to_string()).collect();
    ended.sort();
    let mut terminated = created[..3].to_vec();
    terminated.sort();
    assert_eq!(ended, terminated, "state=ended");
    let titled = client
        .list_session_entries(SessionEntryQuery::new().title_contains("LOGIN"))
        .await?;
    let titles: HashSet<Option<&str>> = titled
        .sessions
        .iter()
        .map(|entry| entry.title.as_deref())
        .collect();
    assert_eq!(
        titles,
        HashSet::from([Some("Fix the login bug"), Some("Login page")]),
        "q"
    );
    let none = client
        .list_session_entries(SessionEntryQuery::new().agent("no-such-agent"))
        .await?;
    assert!(none.sessions.is_empty() && none.next_cursor.is_none());
    let live = client
        .list_session_entries(
            SessionEntryQuery::new()
                .state(SessionState::Live)
                .agent("mock")
                .limit(1000),
        )
        .await?;
    assert_eq!(
        live.sessions.len(),
        MANY_SESSIONS,
        "live: all but the ended"
    );
    assert!(
        live.sessions
            .iter()
            .all(|e| e.meta.as_ref().map(SessionState::of) == Some(SessionState::Live))
    );

    // An untitled session's entry carries its first prompt's text.
    let answer = client
        .prompt(sandbox_agent_sdk::schema::PromptRequest::new(
            created[30].clone(),
            vec!["remember the tulips".into()],
        ))
        .await?;
    assert_eq!(answer.stop_reason, StopReason::EndTurn);
    let page = client
        .list_session_entries(SessionEntryQuery::new().limit(1000))
        .await?;
    let prompted = page
        .sessions
        .iter()
        .find(|entry| entry.session_id.0.as_ref() == created[30])
        .and_then(|entry| entry.meta.as_ref())
        .ok_or("the prompted session is listed")?;
    assert_eq!(
        prompted.first_prompt.as_deref(),
        Some("remember the tulips")
    );
    assert_eq!(prompted.title, None);

    // A limit out of range and a made-up cursor are the server's 400s.
    for query in [
        SessionEntryQuery::new().limit(0),
        SessionEntryQuery::new().limit(1001),
        SessionEntryQuery::new().cursor("not-a-cursor"),
    ] {
        match client.list_session_entries(query.clone()).await {
            Err(Error::Http(failure)) => assert_eq!(failure.status, 400, "{query:?}"),
            other => panic!("{query:?}: {other:?}"),
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminate_session_yields_a_typed_ended_event() -> TestResult {
    let server = TestServer::start(&[]).await;
    let (client, mut events, session) = mock_session(&server).await?;
    let id = session.session_id.0.to_string();

    let result = client.terminate_session(session.session_id.clone()).await?;
    assert_eq!(result.session_id, id);
    assert!(!result.already_ended);
    let ended = wait_for(&mut events, "session ended", |event| match event {
        Event::SessionEnded(ended) => Some(ended),
        _ => None,
    })
    .await;
    assert_eq!(ended.session_id, id);
    assert_eq!(ended.reason, EndReason::Terminated);
    assert_eq!(ended.terminated_by, TerminatedBy::Daemon);
    assert!(
        client
            .terminate_session(session.session_id.clone())
            .await?
            .already_ended
    );
    let entry = client.get_session(session.session_id.clone()).await?;
    assert!(entry.meta.as_ref().is_some_and(|meta| meta.ended));
    // Requests on an ended session are answered by the server: -32002.
    let (result, _) = run_turn(&client, &mut events, &session.session_id, "hello", |_| {}).await;
    assert_eq!(result.err().and_then(|e| e.rpc_code()), Some(-32002));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_output_that_is_not_json_becomes_typed_unparsed_events() -> TestResult {
    let server = TestServer::start(&[]).await;
    let (client, mut events, session) = mock_session(&server).await?;
    let (result, turn) = run_turn(
        &client,
        &mut events,
        &session.session_id,
        "!garbage",
        |_| {},
    )
    .await;
    assert_eq!(result?.stop_reason, StopReason::EndTurn);
    let unparsed: Vec<_> = turn
        .other
        .iter()
        .filter_map(|event| match event {
            Event::AgentUnparsed(unparsed) => Some(unparsed),
            _ => None,
        })
        .collect();
    let raw: Vec<&str> = unparsed.iter().map(|u| u.raw.as_str()).collect();
    assert_eq!(raw, ["this is not json", "\u{1b}[31mred\u{1b}[0m", "42"]);
    assert!(
        unparsed
            .iter()
            .all(|u| u.agent == "mock" && !u.error.is_empty())
    );
    assert_eq!(turn.text, "Hello from the mock agent. You said: !garbage");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_crash_fails_the_turn_and_ends_the_session() -> TestResult {
    let server = TestServer::start(&[]).await;
    let (client, mut events, session) = mock_session(&server).await?;
    let (result, turn) = run_turn(
        &client,
        &mut events,
        &session.session_id,
        "!crash 7",
        |_| {},
    )
    .await;
    let error = result.err().ok_or("a crashed turn succeeded")?;
    assert!(matches!(error, Error::Rpc(_)), "{error}");
    let ended = match turn.other.iter().find_map(|event| match event {
        Event::SessionEnded(ended) => Some(ended.clone()),
        _ => None,
    }) {
        Some(ended) => ended,
        None => {
            wait_for(&mut events, "session ended", |event| match event {
                Event::SessionEnded(ended) => Some(ended),
                _ => None,
            })
            .await
        }
    };
    assert_eq!(ended.reason, EndReason::Error);
    assert_eq!(ended.exit_code, Some(7));
    // The connection survives the agent; the next session starts a new process.
    let again = client.new_session(NewSessionRequest::new("/tmp")).await?;
    let (result, _) = run_turn(&client, &mut events, &again.session_id, "hello", |_| {}).await;
    assert_eq!(result?.stop_reason, StopReason::EndTurn);
    Ok(())
}

/// An agent's error names the stderr lines the agent wrote for that
/// request, in its text and through `agent_stderr`; a refused
/// `session/new` of a server running as root without `--agent-user`
/// carries the hint (research/contract.md, "Agent errors: stderr and
/// hint").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_error_carries_its_stderr_and_hint() -> TestResult {
    let server = TestServer::start(&[]).await;
    let (client, mut events, session) = mock_session(&server).await?;
    let (result, _) = run_turn(&client, &mut events, &session.session_id, "!fail 1", |_| {}).await;
    let error = result.err().ok_or("a failing turn succeeded")?;
    assert_eq!(
        error.agent_stderr(),
        ["fail line 1", "mock agent: failing on request"]
    );
    assert_eq!(error.agent_hint(), None);
    assert_eq!(
        error.to_string(),
        r#"JSON-RPC error -32603: mock agent: failed on request ({"directive":"!fail"}) (agent stderr: fail line 1 | mock agent: failing on request)"#
    );

    let dir = v2_api_tests::TempDir::new("sdk-refused");
    let cwd = dir.path().join("refuse-session");
    std::fs::create_dir_all(&cwd)?;
    let error = client
        .new_session(NewSessionRequest::new(cwd.clone()))
        .await
        .err()
        .ok_or("a refused session/new succeeded")?;
    let line = format!("mock agent: refusing session/new in {}", cwd.display());
    assert_eq!(error.agent_stderr(), std::slice::from_ref(&line));
    assert!(
        error
            .to_string()
            .contains(&format!("(agent stderr: {line})")),
        "{error}"
    );
    let root = nix::unistd::geteuid().is_root();
    assert_eq!(error.agent_hint().is_some(), root, "{error}");
    if root {
        assert!(
            error
                .to_string()
                .contains("(hint: sandbox-agent runs as root"),
            "{error}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_methods_under_their_names() -> TestResult {
    let server = TestServer::start(&[]).await;
    let (client, mut events, session) = mock_session(&server).await?;
    let id = session.session_id.clone();

    // Mode, config option, model.
    client
        .set_session_mode(SetSessionModeRequest::new(id.clone(), "plan"))
        .await?;
    let mode = wait_for(&mut events, "mode update", |event| match event {
        Event::SessionUpdate(n) => match n.update {
            SessionUpdate::CurrentModeUpdate(update) => Some(update.current_mode_id),
            _ => None,
        },
        _ => None,
    })
    .await;
    assert_eq!(mode.0.as_ref(), "plan");
    let options = client
        .set_session_config_option(SetSessionConfigOptionRequest::new(
            id.clone(),
            "model",
            "mock-smart",
        ))
        .await?;
    assert!(!options.config_options.is_empty());
    client
        .set_session_model(SetSessionModelRequest::new(id.clone(), "mock-fast"))
        .await?;

    // Models, by session and by agent.
    let models = client
        .list_models(ModelsTarget::Session(id.0.to_string()))
        .await?;
    let ids: Vec<&str> = models
        .available_models
        .iter()
        .map(|m| m.model_id.as_str())
        .collect();
    assert_eq!(ids, ["mock-fast", "mock-smart"]);
    assert_eq!(models.current_model_id.as_deref(), Some("mock-fast"));
    let by_agent = client
        .list_models(ModelsTarget::Agent("mock".into()))
        .await?;
    assert_eq!(by_agent.available_models.len(), 2);

    // A turn, then fork, detach, load (with replay), resume.
    let (result, _) = run_turn(&client, &mut events, &id, "hello", |_| {}).await;
    assert_eq!(result?.stop_reason, StopReason::EndTurn);
    let fork = client
        .fork_session(ForkSessionRequest::new(id.clone(), "/tmp"))
        .await?;
    assert_ne!(fork.session_id, id);
    assert_eq!(fork.meta.as_ref().map(|m| m.agent.as_str()), Some("mock"));
    client.detach_session(id.clone()).await?;
    let loaded = client
        .load_session(LoadSessionRequest::new(id.clone(), "/tmp"))
        .await?;
    assert!(loaded.meta.is_some());
    let mut replayed = String::new();
    while let Some(event) = events.try_recv() {
        if let Event::SessionUpdate(n) = event
            && let SessionUpdate::AgentMessageChunk(chunk) = n.update
            && let sandbox_agent_sdk::schema::ContentBlock::Text(text) = chunk.content
        {
            replayed.push_str(&text.text);
        }
    }
    assert!(replayed.contains("You said: hello"), "replay: {replayed:?}");
    // As an observer the client watches but may not prompt; as a
    // controller again it may.
    let watching = client
        .attach_session(id.clone(), Role::Observer, HistoryPolicy::None)
        .await?;
    assert_eq!((watching.role, watching.replayed), (Role::Observer, 0));
    let refused = client
        .prompt(sandbox_agent_sdk::schema::PromptRequest::new(
            id.clone(),
            vec!["may I?".into()],
        ))
        .await;
    assert_eq!(
        refused.as_ref().err().and_then(|e| e.rpc_code()),
        Some(-32003),
        "{refused:?}"
    );
    client
        .attach_session(id.clone(), Role::Controller, HistoryPolicy::None)
        .await?;
    let resumed = client
        .resume_session(ResumeSessionRequest::new(id.clone(), "/tmp"))
        .await?;
    assert!(resumed.meta.is_some());

    // Cancel a stalled turn.
    let stalled = {
        let prompt = client.prompt(sandbox_agent_sdk::schema::PromptRequest::new(
            id.clone(),
            vec!["!stall".into()],
        ));
        tokio::pin!(prompt);
        // Let the turn start, then cancel it.
        let early = tokio::time::timeout(std::time::Duration::from_millis(300), &mut prompt).await;
        assert!(early.is_err(), "a stalled turn ended by itself");
        client.cancel(id.clone()).await?;
        within("cancelled turn", prompt).await?
    };
    assert_eq!(stalled.stop_reason, StopReason::Cancelled);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_plane_is_typed() -> TestResult {
    let server = TestServer::start(&[]).await;
    let client = SandboxAgentClient::connect(server_options(&server)).await?;
    let health = client.health().await?;
    assert_eq!(health.status, "ok");
    assert!(health.version.is_some());
    let agents = client.agents().await?;
    let mock = agents.iter().find(|a| a.id == "mock").ok_or("mock agent")?;
    assert!(mock.installed && mock.running);

    let mut events = client.take_events().ok_or("events")?;
    let session = client.new_session(NewSessionRequest::new("/tmp")).await?;
    let (result, _) = run_turn(&client, &mut events, &session.session_id, "hello", |_| {}).await;
    result?;
    let id = session.session_id.0.to_string();
    let page = client.session_events(id.clone(), 0, Some(2)).await?;
    assert_eq!(page.events.len(), 2);
    assert_eq!(page.events[0].offset, 0);
    assert_eq!(page.events[0].message["method"], "session/new");
    assert!(page.events.iter().all(|event| event.time().is_some()));
    assert_eq!(page.next_offset, Some(2));
    let next = page.next_offset.ok_or("more pages")?;
    let rest = client.session_events(id.clone(), next, None).await?;
    assert!(
        rest.events
            .iter()
            .any(|e| e.message["method"] == "session/prompt")
    );
    // The last page says so: no empty page to fetch.
    assert_eq!(rest.next_offset, None, "{rest:?}");
    let last = rest.events.last().ok_or("events")?;
    assert_eq!(rest.offset_after, last.offset + 1);
    // Pages of exactly the remaining size end too.
    let remaining = u32::try_from(rest.events.len())?;
    let exact = client
        .session_events(id.clone(), next, Some(remaining))
        .await?;
    assert_eq!(exact.events.len(), rest.events.len());
    assert_eq!(exact.next_offset, None);

    client.close().await?;
    match client.get_session("no-such-session".to_owned()).await {
        Err(error) => {
            assert!(error.is_not_found(), "{error:?}");
            assert_eq!(error.status(), Some(StatusCode::NOT_FOUND));
            assert_eq!(
                error.problem().map(|p| p.problem_type.as_str()),
                Some("urn:sandbox-agent:error:unknown-session")
            );
        }
        Ok(entry) => panic!("an unknown session was found: {entry:?}"),
    }
    match client.session_events(id, 0, Some(0)).await {
        Err(error) => assert_eq!(error.status(), Some(StatusCode::BAD_REQUEST)),
        Ok(page) => panic!("limit 0 was accepted: {page:?}"),
    }
    Ok(())
}

/// `POST /v2/agents/{agent}/install`: a server without the route answers
/// 404 `not-found`; on one with it, installing the built-in mock agent is a
/// no-op that says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_agent_calls_the_install_route() -> TestResult {
    let server = TestServer::start(&[]).await;
    let client = SandboxAgentClient::connect(server_options(&server).auto_connect(false)).await?;
    match client
        .install_agent("mock", InstallOptions::default())
        .await
    {
        Ok(result) => {
            assert_eq!(result.agent, "mock");
            assert!(result.already_installed);
        }
        Err(error) => {
            assert_eq!(error.status(), Some(StatusCode::NOT_FOUND), "{error}");
            assert_eq!(
                error.problem().map(|p| p.problem_type.as_str()),
                Some("urn:sandbox-agent:error:not-found"),
                "only a missing route may fail: {error}"
            );
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forcing_a_mode_against_the_options_is_refused() -> TestResult {
    let data = v2_api_tests::TempDir::new("sdk-embedded");
    let embedded_with_url = embedded_options(&data)
        .base_url("http://127.0.0.1:9")
        .mode(sandbox_agent_sdk::Mode::Embedded);
    assert!(matches!(
        SandboxAgentClient::connect(embedded_with_url).await,
        Err(Error::InvalidOptions(_))
    ));
    let server_without_url = ClientOptions::new("mock").mode(sandbox_agent_sdk::Mode::Server);
    assert!(matches!(
        SandboxAgentClient::connect(server_without_url).await,
        Err(Error::InvalidOptions(_))
    ));
    // Nothing listens on port 9: server mode reports the transport failure.
    let nobody = ClientOptions::new("mock").base_url("http://127.0.0.1:9");
    let error = within("connect", SandboxAgentClient::connect(nobody))
        .await
        .err()
        .ok_or("connected to nothing")?;
    assert!(error.is_connection_lost(), "{error:?}");
    Ok(())
}

/// `ClientOptions::transport(Transport::WebSocket)`: the same client over
/// one WebSocket on `/acp` (token on the upgrade), a plain turn and a
/// permission turn; closing it closes the connection on the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_websocket_transport_runs_turns_with_permissions() -> TestResult {
    turns_over(sandbox_agent_sdk::Transport::WebSocket).await
}

/// `ClientOptions::transport(Transport::AcpHttp)`: the same over the RFD's
/// Streamable HTTP on `/acp` (202s, answers on the event stream,
/// `Acp-Session-Id` on the prompts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_acp_http_transport_runs_turns_with_permissions() -> TestResult {
    turns_over(sandbox_agent_sdk::Transport::AcpHttp).await
}

/// A plain turn and a permission turn over `transport`, then close: the
/// server no longer knows the connection.
async fn turns_over(transport: sandbox_agent_sdk::Transport) -> TestResult {
    let server = TestServer::start(&["--token", "ws-secret"]).await;
    let options = server_options(&server).transport(transport);
    let client = within("connect", SandboxAgentClient::connect(options)).await?;
    let connection = client
        .connection_id()
        .ok_or("the 101 names the connection")?;
    let mut events = client.take_events().ok_or("events")?;
    let session = client.new_session(NewSessionRequest::new("/tmp")).await?;

    let (result, turn) = run_turn(&client, &mut events, &session.session_id, "hello", |_| {}).await;
    assert_eq!(result?.stop_reason, StopReason::EndTurn);
    assert_eq!(turn.text, "Hello from the mock agent. You said: hello");

    let (result, turn) = run_turn(
        &client,
        &mut events,
        &session.session_id,
        "please ask permission",
        |request| {
            if let Err(error) = request.decide(PermissionDecision::Allow) {
                panic!("answering failed: {error}");
            }
        },
    )
    .await;
    assert_eq!(result?.stop_reason, StopReason::EndTurn);
    assert_eq!(turn.permissions, ["Write to mock.txt"]);
    assert!(
        turn.text.starts_with("Permission granted."),
        "{}",
        turn.text
    );

    // Closing the socket closes the connection; the session lives on.
    client.close().await?;
    let reply = server
        .api()
        .post(
            Some(&connection),
            &json!({"jsonrpc": "2.0", "id": 1, "method": "session/list", "params": {}}),
        )
        .await;
    reply.assert_status(404);
    Ok(())
}

/// A WebSocket cannot resume: a socket cut mid-turn fails the prompt with
/// a lost connection, and the session lives on for `load_session` on a new
/// connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_websocket_fails_the_turn_and_the_session_can_be_loaded() -> TestResult {
    let server = TestServer::start(&[]).await;
    let proxy = v2_api_tests::CutProxy::start(server.addr()).await;
    let options = ClientOptions::new("mock")
        .base_url(proxy.url())
        .transport(sandbox_agent_sdk::Transport::WebSocket);
    let client = within("connect", SandboxAgentClient::connect(options)).await?;
    let session = client.new_session(NewSessionRequest::new("/tmp")).await?;
    let request = sandbox_agent_sdk::schema::PromptRequest::new(
        session.session_id.clone(),
        vec!["!stall".into()],
    );
    let turn = tokio::spawn({
        let client = client.clone();
        async move { client.prompt(request).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(proxy.cut() > 0);
    let outcome = within("the cut turn", turn).await?;
    let error = outcome.err().ok_or("the turn survived a cut socket")?;
    assert!(error.is_connection_lost(), "{error:?}");

    client.open().await?;
    client
        .load_session(LoadSessionRequest::new(session.session_id.clone(), "/tmp"))
        .await?;
    Ok(())
}
