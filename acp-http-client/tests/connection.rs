//! The raw layer: `HttpConnection` and its `Incoming` stream against the
//! real `sandbox-agent` binary.

mod common;

use acp_http_client::{Direction, Error, HttpConnection, Incoming, TransportOptions};
use common::{STEP, options, options_for, within};
use parking_lot::Mutex;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use v2_api_tests::acp::{
    initialize_params, new_session_params, prompt_params, request, slow_chunks, stop_reason,
};
use v2_api_tests::{MOCK, TestServer};

fn connect(options: TransportOptions) -> (HttpConnection, Incoming) {
    match HttpConnection::new(options) {
        Ok(pair) => pair,
        Err(error) => panic!("connection: {error}"),
    }
}

/// Sends `message` (within [`STEP`]) and returns what `send` returned.
async fn try_send(connection: &HttpConnection, message: &Value) -> Result<(), Error> {
    within(STEP, "send", connection.send(message.to_string())).await
}

async fn next_message(incoming: &mut Incoming) -> Value {
    match within(STEP, "an incoming message", incoming.recv()).await {
        Some(Ok(text)) => serde_json::from_str(&text).unwrap_or(Value::Null),
        Some(Err(error)) => panic!("incoming error: {error}"),
        None => panic!("incoming ended"),
    }
}

/// Reads until the response with `id`; returns it and what came before.
async fn until_response(incoming: &mut Incoming, id: u64) -> (Value, Vec<Value>) {
    let mut before = Vec::new();
    loop {
        let message = next_message(incoming).await;
        if message["id"] == id && message.get("method").is_none() {
            return (message, before);
        }
        before.push(message);
    }
}

#[tokio::test]
async fn pipelined_messages_wait_for_the_connection_id() {
    let server = TestServer::start(&[]).await;
    let (connection, mut incoming) = connect(options(&server));

    // session/new is sent without waiting for initialize's answer: it
    // waits inside the transport for the connection id.
    let init = connection.send(request(1, "initialize", initialize_params(MOCK)).to_string());
    let new = connection.send(request(2, "session/new", new_session_params(MOCK)).to_string());
    let (init, new) = within(STEP, "pipelined sends", async { tokio::join!(init, new) }).await;
    assert!(init.is_ok() && new.is_ok(), "{init:?} {new:?}");

    let mut answers = vec![next_message(&mut incoming).await];
    answers.push(next_message(&mut incoming).await);
    answers.sort_by_key(|m| m["id"].as_u64());
    assert_eq!(
        answers[0]["result"]["agentInfo"]["name"],
        "sandbox-agent-mock"
    );
    assert!(answers[1]["result"]["sessionId"].is_string(), "{answers:?}");
    assert!(connection.connection_id().is_some());
    let _ = connection.close().await;
}

#[tokio::test]
async fn a_message_before_initialize_is_not_connected() {
    let server = TestServer::start(&[]).await;
    let (connection, _incoming) = connect(options(&server));
    let early = try_send(
        &connection,
        &request(1, "session/new", new_session_params(MOCK)),
    )
    .await;
    assert!(matches!(early, Err(Error::NotConnected)), "{early:?}");
    let invalid = within(STEP, "send", connection.send("[1, 2]".to_owned())).await;
    assert!(
        matches!(invalid, Err(Error::InvalidMessage(_))),
        "{invalid:?}"
    );
}

#[tokio::test]
async fn submitted_messages_keep_call_order_across_tasks() {
    let server = TestServer::start(&[]).await;
    let (connection, mut incoming) = connect(options(&server));

    // Recorded in call order; the session/new future runs first, on its own
    // task, and still finds the initialize counted and waits for it.
    let init = connection.submit(request(1, "initialize", initialize_params(MOCK)).to_string());
    let new = connection.submit(request(2, "session/new", new_session_params(MOCK)).to_string());
    let new = tokio::spawn(new);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let init = tokio::spawn(init);
    let init = v2_api_tests::join_within(init, STEP).await;
    let new = v2_api_tests::join_within(new, STEP).await;
    assert!(init.is_ok() && new.is_ok(), "{init:?} {new:?}");
    let (answer, _) = until_response(&mut incoming, 2).await;
    assert!(answer["result"]["sessionId"].is_string(), "{answer}");
    let _ = connection.close().await;
}

#[tokio::test]
async fn submit_names_the_requests_that_will_never_be_answered() {
    let server = TestServer::start(&[]).await;

    // No initialize yet: not sent, released.
    let (connection, _incoming) = connect(options(&server));
    let early = connection.submit(request(7, "session/new", new_session_params(MOCK)).to_string());
    let failure = within(STEP, "submit", early).await.err();
    assert!(
        matches!(
            &failure,
            Some(acp_http_client::SendError { error: Error::NotConnected, released: Some(id) }) if id == "7"
        ),
        "{failure:?}"
    );

    // Refused by the server (404 unknown agent): released, with the problem.
    let unknown =
        connection.submit(request("a", "initialize", initialize_params("nope")).to_string());
    let failure = within(STEP, "submit", unknown).await.err();
    let Some(failure) = failure else {
        panic!("initialize of an unknown agent succeeded");
    };
    assert_eq!(failure.released.as_deref(), Some(r#""a""#));
    assert_eq!(failure.error.status().map(|s| s.as_u16()), Some(404));

    // A notification has nothing to release.
    let (closed, _incoming) = connect(options(&server));
    let _ = closed.close().await;
    let note = closed.submit(json!({"jsonrpc": "2.0", "method": "x"}).to_string());
    let failure = within(STEP, "submit", note).await.err();
    assert!(
        matches!(
            &failure,
            Some(acp_http_client::SendError {
                error: Error::Closed,
                released: None
            })
        ),
        "{failure:?}"
    );
}

#[tokio::test]
async fn problem_documents_come_back_with_their_status() {
    let server = TestServer::start(&[]).await;
    let (connection, _incoming) = connect(options(&server));
    let unknown = try_send(
        &connection,
        &request(1, "initialize", initialize_params("no-such-agent")),
    )
    .await;
    let Err(error) = unknown else {
        panic!("initialize of an unknown agent succeeded");
    };
    assert_eq!(error.status().map(|s| s.as_u16()), Some(404), "{error}");
    let problem = error
        .problem()
        .unwrap_or_else(|| panic!("no problem: {error}"));
    assert_eq!(
        problem.problem_type,
        "urn:sandbox-agent:error:unknown-agent"
    );
    assert_eq!(problem.status, Some(404));
    assert!(
        problem.detail.as_deref().is_some_and(|d| d.contains(MOCK)),
        "{problem:?}"
    );

    let guarded = TestServer::start(&["--token", "secret"]).await;
    let (anonymous, _incoming) = connect(options_for(guarded.base_url()));
    let denied = try_send(
        &anonymous,
        &request(1, "initialize", initialize_params(MOCK)),
    )
    .await;
    let Err(error) = denied else {
        panic!("initialize without the token succeeded");
    };
    assert_eq!(error.status().map(|s| s.as_u16()), Some(401), "{error}");
    assert_eq!(
        error.problem().map(|p| p.problem_type.as_str()),
        Some("urn:sandbox-agent:error:unauthorized")
    );

    let (wrong, _incoming) = connect(options_for(guarded.base_url()).token("not-the-secret"));
    let denied = try_send(&wrong, &request(1, "initialize", initialize_params(MOCK))).await;
    assert_eq!(
        denied.err().and_then(|e| e.status()).map(|s| s.as_u16()),
        Some(401)
    );

    let (right, mut incoming) = connect(options_for(guarded.base_url()).token("secret"));
    let accepted = try_send(&right, &request(1, "initialize", initialize_params(MOCK))).await;
    assert!(accepted.is_ok(), "{accepted:?}");
    let (answer, _) = until_response(&mut incoming, 1).await;
    assert!(answer["result"].is_object(), "{answer}");
    let _ = right.close().await;
}

#[tokio::test]
async fn close_sends_delete_and_is_idempotent() {
    let server = TestServer::start(&[]).await;
    let (connection, mut incoming) = connect(options(&server));
    within(
        STEP,
        "initialize",
        connection.send(request(1, "initialize", initialize_params(MOCK)).to_string()),
    )
    .await
    .unwrap_or_else(|error| panic!("initialize: {error}"));
    let _ = until_response(&mut incoming, 1).await;
    let Some(id) = connection.connection_id() else {
        panic!("no connection id");
    };

    let closed = within(STEP, "close", connection.close()).await;
    assert!(closed.is_ok(), "{closed:?}");
    assert!(connection.is_closed());
    let echo = request(2, "_mock/echo", json!({}));
    v2_api_tests::assert_problem(
        &server.post(Some(&id), &echo).await,
        404,
        "unknown-connection",
    );

    assert!(
        within(STEP, "second close", connection.close())
            .await
            .is_ok()
    );
    let after = try_send(&connection, &echo).await;
    assert!(matches!(after, Err(Error::Closed)), "{after:?}");
    assert!(
        within(STEP, "end", incoming.recv()).await.is_none(),
        "incoming ended"
    );
}

#[tokio::test]
async fn the_observer_sees_every_message_sent_and_delivered() {
    let server = TestServer::start(&[]).await;
    let seen = Arc::new(Mutex::new(Vec::<(Direction, Value)>::new()));
    let observer = {
        let seen = Arc::clone(&seen);
        move |direction: Direction, text: &str| {
            let value = serde_json::from_str(text).unwrap_or(Value::Null);
            seen.lock().push((direction, value));
        }
    };
    let (connection, mut incoming) = connect(options(&server).observer(observer));
    let init = request(1, "initialize", initialize_params(MOCK));
    let echo = request("two", "_mock/echo", json!({"x": 1}));
    for message in [&init, &echo] {
        within(STEP, "send", connection.send(message.to_string()))
            .await
            .unwrap_or_else(|error| panic!("send: {error}"));
    }
    let (echoed, _) = loop {
        let message = next_message(&mut incoming).await;
        if message["id"] == "two" {
            break (message, ());
        }
    };
    assert_eq!(echoed["result"], json!({"x": 1}));

    let seen = seen.lock().clone();
    let sent: Vec<&Value> = seen
        .iter()
        .filter(|(d, _)| *d == Direction::Outgoing)
        .map(|(_, v)| v)
        .collect();
    assert_eq!(sent, [&init, &echo]);
    let delivered: Vec<&Value> = seen
        .iter()
        .filter(|(d, _)| *d == Direction::Incoming)
        .map(|(_, v)| &v["id"])
        .collect();
    assert_eq!(delivered, [&json!(1), &json!("two")]);
    let _ = connection.close().await;
}

#[tokio::test]
async fn a_response_whose_post_timed_out_arrives_once_on_the_stream() {
    let server = TestServer::start(&[]).await;
    // The POST gives up long before the 5 x 100 ms turn ends; the server
    // keeps the request and moves its answer to the event stream.
    let options = options(&server).request_timeout(Some(Duration::from_millis(200)));
    let (connection, mut incoming) = connect(options);
    within(
        STEP,
        "initialize",
        connection.send(request(1, "initialize", initialize_params(MOCK)).to_string()),
    )
    .await
    .unwrap_or_else(|error| panic!("initialize: {error}"));
    let _ = until_response(&mut incoming, 1).await;
    within(
        STEP,
        "session/new",
        connection.send(request(2, "session/new", new_session_params(MOCK)).to_string()),
    )
    .await
    .unwrap_or_else(|error| panic!("session/new: {error}"));
    let (created, _) = until_response(&mut incoming, 2).await;
    let session = created["result"]["sessionId"].as_str().unwrap_or_default();

    let prompt = request(3, "session/prompt", prompt_params(session, "!slow 5 100"));
    let timed_out = within(STEP, "the prompt POST", connection.send(prompt.to_string())).await;
    match timed_out {
        Err(Error::Request(error)) => assert!(error.is_timeout(), "{error}"),
        other => panic!("the POST should time out: {other:?}"),
    }
    let (answer, before) = until_response(&mut incoming, 3).await;
    assert_eq!(stop_reason(&answer), Some("end_turn"), "{answer}");
    let chunks: Vec<&str> = before
        .iter()
        .filter_map(|m| m["params"]["update"]["content"]["text"].as_str())
        .collect();
    assert_eq!(
        chunks,
        slow_chunks(5),
        "updates before the answer, in order"
    );

    // Nothing else comes for id 3.
    let quiet = tokio::time::timeout(Duration::from_millis(300), incoming.recv()).await;
    assert!(quiet.is_err(), "nothing more expected: {quiet:?}");
    let _ = connection.close().await;
}

#[tokio::test]
async fn an_answer_never_overtakes_the_updates_of_its_turn() {
    // The server names its newest event id on each POST answer
    // (`x-acp-last-event-id`); the client holds the answer until the
    // stream delivered that far. Plain turns race the two paths hardest.
    let server = TestServer::start(&[]).await;
    let (connection, mut incoming) = connect(options(&server));
    try_send(
        &connection,
        &request(1, "initialize", initialize_params(MOCK)),
    )
    .await
    .unwrap_or_else(|error| panic!("initialize: {error}"));
    let _ = until_response(&mut incoming, 1).await;
    try_send(
        &connection,
        &request(2, "session/new", new_session_params(MOCK)),
    )
    .await
    .unwrap_or_else(|error| panic!("session/new: {error}"));
    let (created, _) = until_response(&mut incoming, 2).await;
    let session = created["result"]["sessionId"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    // "Hello from the mock agent. You said: hi" is 8 chunks.
    for turn in 0..40_u64 {
        let id = 100 + turn;
        try_send(
            &connection,
            &request(id, "session/prompt", prompt_params(&session, "hi")),
        )
        .await
        .unwrap_or_else(|error| panic!("prompt {turn}: {error}"));
        let (answer, before) = until_response(&mut incoming, id).await;
        assert_eq!(stop_reason(&answer), Some("end_turn"), "{answer}");
        let chunks = before
            .iter()
            .filter(|m| m["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
            .count();
        assert_eq!(
            chunks, 8,
            "turn {turn}: the answer came after {chunks} of 8 chunks"
        );
    }
    let _ = connection.close().await;
}

/// A server that answers every request with `status 200` and `body`, then
/// closes: stands in for a runtime that is not one (or a hostile one).
async fn answering_with(body: Vec<u8>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let body = body.clone();
            tokio::spawn(async move {
                let mut request = [0_u8; 4096];
                let _ = socket.read(&mut request).await;
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-acp-connection-id: c1\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = socket.write_all(head.as_bytes()).await;
                let _ = socket.write_all(&body).await;
            });
        }
    });
    format!("http://{address}")
}

#[tokio::test]
async fn answers_that_are_not_one_json_rpc_message_fail_the_request() {
    let initialize = request(1, "initialize", initialize_params(MOCK));
    let cases: [(Vec<u8>, &str); 3] = [
        (b"<html><body>hello</body></html>".to_vec(), "<html>"),
        (b"[1, 2]".to_vec(), "[1, 2]"),
        (vec![b'{'; 2048], "over 1024 bytes"),
    ];
    for (body, needle) in cases {
        let url = answering_with(body).await;
        let options = TransportOptions::new(&url)
            .expect("options")
            .max_message_bytes(1024);
        let (connection, _incoming) = connect(options);
        match try_send(&connection, &initialize).await {
            Err(Error::InvalidResponse(detail)) => {
                assert!(detail.contains(needle), "{detail}");
            }
            other => panic!("expected InvalidResponse, got {other:?}"),
        }
    }
}
