//! The event stream dropping and coming back: cut through a loopback proxy
//! mid-turn, resumed with `Last-Event-ID` with nothing lost or repeated; a
//! gap reported by the server; a connection gone; a stream that cannot be
//! reopened.

mod common;

use acp_http_client::{Error, HttpConnection, HttpTransport, Incoming};
use agent_client_protocol::Client;
use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    ContentBlock, ContentChunk, InitializeRequest, NewSessionRequest, PromptRequest,
    SessionNotification, SessionUpdate, StopReason,
};
use common::{CutProxy, STEP, agent_meta, gets, options_for, wait_until, within};
use parking_lot::Mutex;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use v2_api_tests::acp::{
    initialize_params, new_session_params, prompt_params, request, slow_chunks,
};
use v2_api_tests::{MOCK, TestServer};

#[tokio::test]
async fn a_stream_cut_mid_turn_resumes_without_lost_or_repeated_updates() {
    let server = TestServer::start(&[]).await;
    let proxy = CutProxy::start(server.addr()).await;
    let transport = match HttpTransport::new(options_for(&proxy.url())) {
        Ok(transport) => transport,
        Err(error) => panic!("transport: {error}"),
    };
    let chunks = Arc::new(Mutex::new(Vec::<String>::new()));
    let cut = Arc::new(Mutex::new(None::<usize>));

    let result = within(
        STEP * 2,
        "a 30-chunk turn with a cut",
        Client
            .v1()
            .on_receive_notification(
                {
                    let chunks = Arc::clone(&chunks);
                    let cut = Arc::clone(&cut);
                    let proxy = proxy.clone();
                    async move |notification: SessionNotification, _cx| {
                        if let SessionUpdate::AgentMessageChunk(ContentChunk {
                            content: ContentBlock::Text(text),
                            ..
                        }) = notification.update
                        {
                            let mut chunks = chunks.lock();
                            chunks.push(text.text);
                            if chunks.len() == 10 {
                                // Both the event stream and the prompt's
                                // POST go down here.
                                *cut.lock() = Some(proxy.cut());
                            }
                        }
                        Ok(())
                    }
                },
                agent_client_protocol::on_receive_notification!(),
            )
            .connect_with(transport, async |cx| {
                let init = InitializeRequest::new(ProtocolVersion::V1).meta(agent_meta(MOCK));
                cx.send_request(init).block_task().await?;
                let session = cx
                    .send_request(NewSessionRequest::new("/tmp").meta(agent_meta(MOCK)))
                    .block_task()
                    .await?;
                let prompt = PromptRequest::new(session.session_id, vec!["!slow 30 50".into()]);
                let done = cx.send_request(prompt).block_task().await?;
                let seen = Arc::clone(&chunks);
                wait_until(STEP, "30 chunks", move || seen.lock().len() >= 30).await;
                // Anything repeated would come right behind the last chunk.
                tokio::time::sleep(Duration::from_millis(300)).await;
                Ok(done.stop_reason)
            }),
    )
    .await;

    match result {
        Ok(reason) => assert_eq!(reason, StopReason::EndTurn),
        Err(error) => panic!("the turn failed: {error}"),
    }
    assert_eq!(
        *chunks.lock(),
        slow_chunks(30),
        "every chunk exactly once, in order"
    );
    let cut = *cut.lock();
    assert!(
        cut.is_some_and(|open| open >= 1),
        "the proxy cut live connections: {cut:?}"
    );
    let gets = gets(&proxy);
    assert!(
        gets.len() >= 2 && gets[1..].iter().all(|get| get != "GET last-event-id=none"),
        "the stream was reopened with Last-Event-ID: {gets:?}"
    );
}

/// A raw connection through `base_url`, initialized, with a session.
async fn raw_session(base_url: &str) -> (HttpConnection, Incoming, String) {
    let (connection, mut incoming) = match HttpConnection::new(options_for(base_url)) {
        Ok(pair) => pair,
        Err(error) => panic!("connection: {error}"),
    };
    send(
        &connection,
        request(1, "initialize", initialize_params(MOCK)),
    )
    .await;
    next_response(&mut incoming, 1).await;
    send(
        &connection,
        request(2, "session/new", new_session_params(MOCK)),
    )
    .await;
    let created = next_response(&mut incoming, 2).await;
    let Some(session) = created["result"]["sessionId"].as_str() else {
        panic!("no session id: {created}");
    };
    (connection, incoming, session.to_owned())
}

async fn send(connection: &HttpConnection, message: Value) {
    if let Err(error) = within(STEP, "send", connection.send(message.to_string())).await {
        panic!("send {message}: {error}");
    }
}

/// The next incoming message, parsed.
async fn next_message(incoming: &mut Incoming) -> Value {
    match within(STEP, "an incoming message", incoming.recv()).await {
        Some(Ok(text)) => serde_json::from_str(&text).unwrap_or(Value::Null),
        Some(Err(error)) => panic!("incoming error: {error}"),
        None => panic!("incoming ended"),
    }
}

/// Reads until the response with `id`, skipping everything else.
async fn next_response(incoming: &mut Incoming, id: u64) -> Value {
    loop {
        let message = next_message(incoming).await;
        if message["id"] == id && message.get("method").is_none() {
            return message;
        }
    }
}

/// The `agent_message_chunk` text of a `session/update`, if it is one.
fn chunk_of(message: &Value) -> Option<&str> {
    let update = &message["params"]["update"];
    (message["method"] == "session/update" && update["sessionUpdate"] == "agent_message_chunk")
        .then(|| update["content"]["text"].as_str())
        .flatten()
}

#[tokio::test]
async fn a_gap_reported_by_the_server_is_delivered() {
    let server = TestServer::start(&["--replay-buffer", "4"]).await;
    let proxy = CutProxy::start(server.addr()).await;
    let (connection, mut incoming, session) = raw_session(&proxy.url()).await;

    let prompt = request(3, "session/prompt", prompt_params(&session, "!slow 12 40"));
    let sender = connection.clone();
    // The POST is cut below; its answer then comes on the stream.
    let post = tokio::spawn(async move { sender.send(prompt.to_string()).await });
    loop {
        let message = next_message(&mut incoming).await;
        if chunk_of(&message) == Some("chunk-2 ") {
            break;
        }
    }
    proxy.hold(true);
    proxy.cut();
    let _ = within(STEP, "the cut POST", post).await;
    // The turn goes on without us and overflows the 4-event ring.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    proxy.hold(false);

    let mut after = Vec::new();
    loop {
        let message = next_message(&mut incoming).await;
        let done = message["id"] == 3;
        after.push(message);
        if done {
            break;
        }
    }
    let gap = after
        .iter()
        .find(|m| m["method"] == "_sandboxagent/stream/gap")
        .unwrap_or_else(|| panic!("no gap notice among {after:#?}"));
    assert!(gap["params"]["from"].as_u64().is_some(), "{gap}");
    let chunks: Vec<&str> = after.iter().filter_map(chunk_of).collect();
    assert!(
        chunks.last() == Some(&"chunk-12 "),
        "the newest updates came: {chunks:?}"
    );
    assert!(
        !chunks.contains(&"chunk-1 ") && !chunks.contains(&"chunk-2 "),
        "nothing delivered twice: {chunks:?}"
    );
    assert_eq!(
        after.iter().filter(|m| m["id"] == 3).count(),
        1,
        "the prompt's answer exactly once"
    );
    assert_eq!(
        v2_api_tests::acp::stop_reason(after.last().unwrap_or(&Value::Null)),
        Some("end_turn")
    );
    let _ = connection.close().await;
}

#[tokio::test]
async fn a_connection_the_server_dropped_ends_incoming_with_404() {
    let server = TestServer::start(&[]).await;
    let (connection, mut incoming, _session) = raw_session(server.base_url()).await;
    let Some(id) = connection.connection_id() else {
        panic!("no connection id after initialize");
    };
    // Someone else closes it: our stream ends, the reconnect gets 404.
    server.delete(Some(&id)).await.assert_status(204);
    let end = loop {
        match within(STEP, "the stream's end", incoming.recv()).await {
            Some(Ok(_)) => continue,
            Some(Err(error)) => break error,
            None => panic!("incoming ended without an error"),
        }
    };
    assert_eq!(end.status().map(|s| s.as_u16()), Some(404), "{end}");
    assert_eq!(
        end.problem().map(|p| p.problem_type.as_str()),
        Some("urn:sandbox-agent:error:unknown-connection")
    );
    assert!(within(STEP, "end", incoming.recv()).await.is_none());
}

#[tokio::test]
async fn a_stream_that_cannot_be_reopened_gives_up_after_max_attempts() {
    let server = TestServer::start(&[]).await;
    let proxy = CutProxy::start(server.addr()).await;
    let (_connection, mut incoming, _session) = raw_session(&proxy.url()).await;

    proxy.refuse(true);
    let before = proxy.accepted();
    proxy.cut();
    let end = loop {
        match within(STEP, "giving up", incoming.recv()).await {
            Some(Ok(_)) => continue,
            Some(Err(error)) => break error,
            None => panic!("incoming ended without an error"),
        }
    };
    match &end {
        Error::StreamLost { attempts, .. } => {
            assert_eq!(*attempts, common::quick_reconnect().max_attempts);
        }
        other => panic!("expected StreamLost, got {other}"),
    }
    let tries = proxy.accepted() - before;
    // Not one per attempt: an attempt can also fail on a pooled connection
    // the cut already killed, without reaching the proxy.
    assert!(tries >= 1, "the reconnect attempts reached the proxy");
    assert!(within(STEP, "end", incoming.recv()).await.is_none());
}
