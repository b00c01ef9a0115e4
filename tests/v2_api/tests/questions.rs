//! Agent questions (research/contract.md, "Agent questions (ACP
//! elicitation)"): the mock's `elicitation/create` reaches the connections
//! that declared its mode and no other, the first answer reaches the agent,
//! decline and cancel behave, a question nobody can answer, one of a
//! cancelled turn and one of an ended session are answered `cancel` for the
//! agent (in the event log), URL mode's `elicitation/complete` is relayed
//! and logged, and a request-scoped question goes to the connection that
//! sent the request, naming that client's own id.

use serde_json::{Value, json};
use std::time::Duration;
use v2_api_tests::acp::{self, stop_reason};
use v2_api_tests::sse::Next;
use v2_api_tests::{EVENT_TIMEOUT, MOCK, SseEvent, SseStream, TestServer, join_within};

const CREATE: &str = "elicitation/create";
const COMPLETE: &str = "elicitation/complete";
const RESOLVED: &str = "_sandboxagent/request/resolved";

/// `initialize` for the mock declaring `elicitation` (e.g. `{"form": {}}`);
/// returns the connection id.
async fn initialize_asking(server: &TestServer, elicitation: Value) -> String {
    let mut params = acp::initialize_params(MOCK);
    params["clientCapabilities"] = json!({ "elicitation": elicitation });
    let reply = server
        .post(None, &acp::request(0, "initialize", params))
        .await;
    reply.assert_status(200);
    reply.connection_id().expect("connection id")
}

/// Both modes.
fn both() -> Value {
    json!({"form": {}, "url": {}})
}

/// Starts a prompt with `text` in a task; returns the task (the JSON-RPC
/// answer).
fn prompt(
    server: &TestServer,
    conn: &str,
    session: &str,
    id: i64,
    text: &str,
) -> tokio::task::JoinHandle<Value> {
    let (api, c, s, t) = (
        server.api(),
        conn.to_owned(),
        session.to_owned(),
        text.to_owned(),
    );
    tokio::spawn(async move { api.prompt(&c, &s, json!(id), &t).await })
}

/// The next `elicitation/create` on `stream`.
async fn question(stream: &mut SseStream) -> SseEvent {
    stream
        .next_event_matching(|e| e.method() == Some(CREATE), EVENT_TIMEOUT)
        .await
}

/// A server, a connection that declared both modes, its session and
/// stream, a turn running `text` (prompt id 5), and the question it asked.
struct Asked {
    server: TestServer,
    conn: String,
    session: String,
    stream: SseStream,
    turn: tokio::task::JoinHandle<Value>,
    asked: SseEvent,
}

async fn asked(text: &str) -> Asked {
    let server = TestServer::start(&[]).await;
    let conn = initialize_asking(&server, both()).await;
    let session = server.new_session(&conn).await;
    let mut stream = server.open_stream(&conn, None).await;
    let turn = prompt(&server, &conn, &session, 5, text);
    let asked = question(&mut stream).await;
    Asked {
        server,
        conn,
        session,
        stream,
        turn,
        asked,
    }
}

/// The agent's text on `stream`, up to and including the chunk `last`.
async fn text_until(stream: &mut SseStream, last: &str) -> String {
    stream
        .collect_until(|e| e.agent_text() == Some(last), EVENT_TIMEOUT)
        .await
        .iter()
        .filter_map(SseEvent::agent_text)
        .collect()
}

/// What arrives within `quiet` (nothing more expected).
async fn quiet_events(stream: &mut SseStream, quiet: Duration) -> Vec<SseEvent> {
    let mut events = Vec::new();
    while let Next::Event(event) = stream.try_next(quiet).await {
        events.push(event);
    }
    events
}

/// The logged entries of `session` whose message has `id` (the agent's id
/// of a question): the question and the answer the agent got.
async fn logged_with_id(server: &TestServer, session: &str, id: &Value) -> Vec<Value> {
    server
        .all_events(session)
        .await
        .into_iter()
        .filter(|e| &e["message"]["id"] == id)
        .collect()
}

#[tokio::test]
async fn a_form_question_reaches_a_declaring_connection_and_its_answer_the_agent() {
    let Asked {
        server,
        conn,
        session,
        mut stream,
        turn,
        asked,
    } = asked("ask question").await;
    let params = asked.params();
    assert_eq!(params["mode"], "form", "{params}");
    assert_eq!(params["sessionId"], session.as_str(), "{params}");
    assert_eq!(params["message"], "The mock agent has a question");
    let schema = &params["requestedSchema"];
    assert_eq!(schema["required"], json!(["name"]), "{schema}");
    assert_eq!(
        schema["properties"]["color"]["enum"],
        json!(["red", "green", "blue"])
    );
    assert_eq!(schema["properties"]["confirm"]["type"], "boolean");
    let id = asked.data["id"].clone();
    let answer =
        json!({"action": "accept", "content": {"name": "Ada", "color": "green", "confirm": true}});
    server
        .post(Some(&conn), &acp::response(id.clone(), answer.clone()))
        .await
        .assert_accepted_empty();
    // A second answer is dropped: exactly one reaches the agent.
    server
        .post(
            Some(&conn),
            &acp::response(id.clone(), json!({"action": "decline"})),
        )
        .await
        .assert_accepted_empty();
    let text = text_until(&mut stream, "confirm=true").await;
    assert_eq!(text, "You answered: name=Ada color=green confirm=true");
    let reply = join_within(turn, EVENT_TIMEOUT).await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
    // Both are in the session's event log: the question as the agent asked
    // it, the first answer as the agent got it.
    let logged = logged_with_id(&server, &session, &id).await;
    assert_eq!(logged.len(), 2, "{logged:#?}");
    assert_eq!(logged[0]["direction"], "agent_to_client");
    assert_eq!(logged[0]["message"]["method"], CREATE);
    assert_eq!(logged[1]["direction"], "client_to_agent");
    assert_eq!(logged[1]["message"]["result"], answer);
}

#[tokio::test]
async fn decline_and_cancel_reach_the_agent() {
    let server = TestServer::start(&[]).await;
    let conn = initialize_asking(&server, json!({"form": {}})).await;
    let session = server.new_session(&conn).await;
    let mut stream = server.open_stream(&conn, None).await;
    for (turn_id, action, last, said) in [
        (5, "decline", "question.", "You declined the question."),
        (6, "cancel", "question.", "You cancelled the question."),
    ] {
        let turn = prompt(&server, &conn, &session, turn_id, "ask question");
        let asked = question(&mut stream).await;
        server
            .post(
                Some(&conn),
                &acp::response(asked.data["id"].clone(), json!({"action": action})),
            )
            .await
            .assert_accepted_empty();
        assert_eq!(text_until(&mut stream, last).await, said);
        let reply = join_within(turn, EVENT_TIMEOUT).await;
        assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
    }
}

/// Only connections that declared the question's mode get it; the others
/// hear that it was resolved. A session whose attached controllers
/// declared nothing answers the agent `cancel` at once.
#[tokio::test]
async fn a_connection_without_the_capability_never_receives_a_question() {
    let server = TestServer::start(&[]).await;
    let asker = initialize_asking(&server, both()).await;
    let session = server.new_session(&asker).await;
    let mut asker_stream = server.open_stream(&asker, None).await;
    let plain = server.initialize(MOCK).await;
    let form_only = initialize_asking(&server, json!({"form": {}})).await;
    for conn in [&plain, &form_only] {
        let attached = server
            .rpc(
                conn,
                2,
                "_sandboxagent/session/attach",
                json!({"sessionId": session, "role": "controller", "historyPolicy": "none"}),
            )
            .await;
        assert!(attached.get("result").is_some(), "{attached}");
    }
    let mut plain_stream = server.open_stream(&plain, None).await;
    let mut form_stream = server.open_stream(&form_only, None).await;

    // A URL question: only the connection that declared `url` gets it.
    let turn = prompt(&server, &plain, &session, 5, "ask url");
    let asked = question(&mut asker_stream).await;
    assert_eq!(asked.params()["mode"], "url");
    let id = asked.data["id"].clone();
    server
        .post(
            Some(&asker),
            &acp::response(id.clone(), json!({"action": "decline"})),
        )
        .await
        .assert_accepted_empty();
    let reply = join_within(turn, EVENT_TIMEOUT).await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
    for stream in [&mut plain_stream, &mut form_stream] {
        let events = stream
            .collect_until(|e| e.agent_text() == Some("sign-in."), EVENT_TIMEOUT)
            .await;
        assert!(
            events.iter().all(|e| e.method() != Some(CREATE)),
            "a connection without `url` got the question: {events:#?}"
        );
        let resolved = events
            .iter()
            .find(|e| e.method() == Some(RESOLVED))
            .unwrap_or_else(|| panic!("no {RESOLVED}: {events:#?}"));
        assert_eq!(
            resolved.params(),
            &json!({"sessionId": session, "requestId": id, "outcome": {"action": "decline"}})
        );
    }

    // Nobody attached can answer: the runtime answers `cancel` for them.
    let alone = server.initialize(MOCK).await;
    let session = server.new_session(&alone).await;
    let mut stream = server.open_stream(&alone, None).await;
    let turn = prompt(&server, &alone, &session, 6, "ask question");
    let events = stream
        .collect_until(|e| e.agent_text() == Some("question."), EVENT_TIMEOUT)
        .await;
    assert!(
        events.iter().all(|e| e.method() != Some(CREATE)),
        "{events:#?}"
    );
    let text: String = events.iter().filter_map(SseEvent::agent_text).collect();
    assert_eq!(text, "You cancelled the question.");
    let reply = join_within(turn, EVENT_TIMEOUT).await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
    let log = server.all_events(&session).await;
    let cancelled = log.iter().any(|e| {
        e["direction"] == "client_to_agent" && e["message"]["result"] == json!({"action": "cancel"})
    });
    assert!(cancelled, "the runtime's answer is logged: {log:#?}");
}

/// A session ended mid-question (terminate) answers the agent `cancel`,
/// logged, and the connection that held the question hears it resolved.
#[tokio::test]
async fn a_session_ended_mid_question_answers_the_agent_cancel() {
    let Asked {
        server,
        conn,
        session,
        mut stream,
        turn,
        asked,
    } = asked("ask question").await;
    let id = asked.data["id"].clone();
    let terminated = server
        .rpc(
            &conn,
            6,
            "_sandboxagent/session/terminate",
            json!({"sessionId": session}),
        )
        .await;
    assert_eq!(terminated["result"]["alreadyEnded"], false, "{terminated}");
    let resolved = stream
        .next_event_matching(|e| e.method() == Some(RESOLVED), EVENT_TIMEOUT)
        .await;
    assert_eq!(
        resolved.params(),
        &json!({"sessionId": session, "requestId": id, "outcome": {"action": "cancel"}})
    );
    let reply = join_within(turn, EVENT_TIMEOUT).await;
    assert_eq!(stop_reason(&reply), Some("cancelled"), "{reply}");
    let logged = logged_with_id(&server, &session, &id).await;
    assert_eq!(logged.len(), 2, "{logged:#?}");
    assert_eq!(logged[1]["direction"], "client_to_agent");
    assert_eq!(logged[1]["message"]["result"], json!({"action": "cancel"}));
    // A late answer from the client is dropped.
    server
        .post(
            Some(&conn),
            &acp::response(id.clone(), json!({"action": "decline"})),
        )
        .await
        .assert_accepted_empty();
    assert_eq!(logged_with_id(&server, &session, &id).await.len(), 2);
}

/// `session/cancel` during a question: the runtime answers it `cancel`
/// for the clients, once, and they hear it resolved.
#[tokio::test]
async fn a_cancelled_turn_answers_its_question_cancel() {
    let Asked {
        server,
        conn,
        session,
        mut stream,
        turn,
        asked,
    } = asked("ask question").await;
    let id = asked.data["id"].clone();
    server
        .post(Some(&conn), &acp::cancel(&session))
        .await
        .assert_accepted_empty();
    let resolved = stream
        .next_event_matching(|e| e.method() == Some(RESOLVED), EVENT_TIMEOUT)
        .await;
    assert_eq!(resolved.params()["outcome"], json!({"action": "cancel"}));
    assert_eq!(resolved.params()["requestId"], id);
    let reply = join_within(turn, EVENT_TIMEOUT).await;
    assert_eq!(stop_reason(&reply), Some("cancelled"), "{reply}");
    let logged = logged_with_id(&server, &session, &id).await;
    assert_eq!(logged.len(), 2, "{logged:#?}");
    assert_eq!(logged[1]["message"]["result"], json!({"action": "cancel"}));
}

/// URL mode: the link goes to the client; after the accept the agent's
/// `elicitation/complete` reaches it (and the log) before the reply.
#[tokio::test]
async fn a_url_question_is_completed_through_the_runtime() {
    let server = TestServer::start(&[]).await;
    let conn = initialize_asking(&server, json!({"url": {}})).await;
    let session = server.new_session(&conn).await;
    let mut stream = server.open_stream(&conn, None).await;
    let turn = prompt(&server, &conn, &session, 5, "ask url");
    let asked = question(&mut stream).await;
    let params = asked.params().clone();
    let elicitation_id = params["elicitationId"]
        .as_str()
        .expect("elicitationId")
        .to_owned();
    assert!(elicitation_id.starts_with("mock-elicitation-"), "{params}");
    assert_eq!(
        params["url"],
        format!(
            "https://example.invalid/sandbox-agent/mock/authorize?elicitation={elicitation_id}"
        )
    );
    server
        .post(
            Some(&conn),
            &acp::response(asked.data["id"].clone(), json!({"action": "accept"})),
        )
        .await
        .assert_accepted_empty();
    let events = stream
        .collect_until(|e| e.agent_text() == Some("sign-in."), EVENT_TIMEOUT)
        .await;
    let complete = events
        .iter()
        .position(|e| e.method() == Some(COMPLETE))
        .unwrap_or_else(|| panic!("no {COMPLETE}: {events:#?}"));
    assert_eq!(
        events[complete].params()["elicitationId"],
        elicitation_id.as_str()
    );
    let first_text = events
        .iter()
        .position(|e| e.agent_text().is_some())
        .expect("text");
    assert!(complete < first_text, "{events:#?}");
    let text: String = events.iter().filter_map(SseEvent::agent_text).collect();
    assert_eq!(text, "You completed the sign-in.");
    let reply = join_within(turn, EVENT_TIMEOUT).await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
    let log = server.all_events(&session).await;
    assert!(
        log.iter().any(|e| e["direction"] == "agent_to_client"
            && e["message"]["method"] == COMPLETE
            && e["message"]["params"]["elicitationId"] == elicitation_id.as_str()),
        "{log:#?}"
    );
}

/// A question scoped to a request (`authenticate` with `mock-ask`) goes to
/// the connection that sent that request, naming the client's own id; a
/// connection that did not declare questions gets none, and the agent gets
/// `cancel`.
#[tokio::test]
async fn a_request_scoped_question_goes_to_its_requester_with_its_own_id() {
    let server = TestServer::start(&[]).await;
    let asker = initialize_asking(&server, both()).await;
    let mut stream = server.open_stream(&asker, None).await;
    let other = initialize_asking(&server, both()).await;
    let mut other_stream = server.open_stream(&other, None).await;
    let (api, c) = (server.api(), asker.clone());
    let signing_in = tokio::spawn(async move {
        api.call(
            &c,
            &acp::request("sign-in-1", "authenticate", json!({"methodId": "mock-ask"})),
        )
        .await
    });
    let asked = question(&mut stream).await;
    assert_eq!(asked.params()["requestId"], "sign-in-1", "{:?}", asked.data);
    assert_eq!(asked.params()["mode"], "form");
    server
        .post(
            Some(&asker),
            &acp::response(
                asked.data["id"].clone(),
                json!({"action": "accept", "content": {"token": "t-1"}}),
            ),
        )
        .await
        .assert_accepted_empty();
    let answer = join_within(signing_in, EVENT_TIMEOUT).await;
    assert_eq!(answer["id"], "sign-in-1");
    assert!(answer.get("result").is_some(), "{answer}");
    let at_other = quiet_events(&mut other_stream, Duration::from_millis(300)).await;
    assert!(
        at_other.iter().all(|e| e.method() != Some(CREATE)),
        "{at_other:#?}"
    );

    let plain = server.initialize(MOCK).await;
    let refused = server
        .call(
            &plain,
            &acp::request(7, "authenticate", json!({"methodId": "mock-ask"})),
        )
        .await;
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    assert_eq!(
        refused["error"]["data"], "mock sign-in cancelled",
        "{refused}"
    );
}
