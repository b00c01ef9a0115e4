//! `GET /v2/rpc` (research/contract.md, "Transport: /v2/rpc", its GET and
//! edge rules): framing, sequence ids, replay with
//! `Last-Event-ID`, the gap notice, one live stream per connection,
//! heartbeats, and late responses of dropped POSTs.

use std::time::{Duration, Instant};

use reqwest::header::ACCEPT;
use serde_json::json;
use v2_api_tests::acp::{self, stop_reason};
use v2_api_tests::sse::{Next, read_comment_lines};
use v2_api_tests::{
    Api, CONNECTION_ID_HEADER, EVENT_TIMEOUT, MOCK, REQUEST_TIMEOUT, SseEvent, SseStream,
    TestServer, assert_problem, join_within,
};

/// The agent-message chunk texts among `events`.
fn texts(events: &[SseEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| e.agent_text().map(str::to_owned))
        .collect()
}

/// Asserts every event has an id and the ids run `first, first + 1, ...`.
fn assert_consecutive_ids(events: &[SseEvent], first: u64) {
    for (offset, event) in (0_u64..).zip(events) {
        assert_eq!(
            event.id,
            Some(first + offset),
            "ids must run from {first} by 1 with no gap or duplicate: {events:#?}"
        );
    }
}

/// Connection + mock session + a plain prompt `text` answered, with no
/// stream open; returns (connection, session).
async fn connection_with_one_turn(server: &TestServer, text: &str) -> (String, String) {
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let reply = server.prompt(&conn, &session, json!(1), text).await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
    (conn, session)
}

#[tokio::test]
async fn stream_response_headers() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let stream = server.open_stream(&conn, None).await;
    assert!(
        stream
            .header("content-type")
            .is_some_and(|ct| ct.starts_with("text/event-stream")),
        "{:?}",
        stream.headers
    );
    assert!(
        stream
            .header("cache-control")
            .is_some_and(|cc| cc.contains("no-cache")),
        "{:?}",
        stream.headers
    );
    assert_eq!(
        stream.header("x-accel-buffering"),
        Some("no"),
        "{:?}",
        stream.headers
    );
}

#[tokio::test]
async fn first_stream_starts_at_the_oldest_event_and_ids_count_from_one() {
    let server = TestServer::start(&[]).await;
    // The whole turn happens before any stream is open.
    let (conn, session) = connection_with_one_turn(&server, "hi").await;
    let expected = acp::mock_reply_chunks("hi");
    let last = expected.last().cloned().unwrap_or_default();

    let mut stream = server.open_stream(&conn, None).await;
    let events = stream
        .collect_until(|e| e.agent_text() == Some(last.as_str()), EVENT_TIMEOUT)
        .await;
    assert_consecutive_ids(&events, 1);
    assert_eq!(texts(&events), expected, "every chunk, in order, once");
    for event in &events {
        assert_eq!(event.event, "message", "{event:?}");
        assert_eq!(event.data["jsonrpc"], "2.0", "{event:?}");
        if event.update().is_some() {
            assert_eq!(event.session_id(), Some(session.as_str()), "{event:?}");
        }
    }

    // Live events continue the same numbering.
    let next_first = events.len() as u64 + 1;
    let reply = server.prompt(&conn, &session, json!(2), "again").await;
    assert_eq!(stop_reason(&reply), Some("end_turn"));
    let expected = acp::mock_reply_chunks("again");
    let last = expected.last().cloned().unwrap_or_default();
    let events = stream
        .collect_until(|e| e.agent_text() == Some(last.as_str()), EVENT_TIMEOUT)
        .await;
    assert_consecutive_ids(&events, next_first);
    assert_eq!(texts(&events), expected);
}

#[tokio::test]
async fn replay_resumes_exactly_after_last_event_id_across_the_live_seam() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let mut first = server.open_stream(&conn, None).await;

    // 40 chunks, 20 ms apart: the agent keeps writing while we reconnect.
    let api = server.api();
    let (c, s) = (conn.clone(), session.clone());
    let turn = tokio::spawn(async move { api.prompt(&c, &s, json!("slow"), "!slow 40 20").await });

    let mut before = Vec::new();
    while texts(&before).len() < 10 {
        before.push(first.next_event(EVENT_TIMEOUT).await);
    }
    let resume_at = before.last().and_then(|e| e.id).expect("events carry ids");
    first.close();

    let mut second = server.open_stream(&conn, Some(resume_at)).await;
    let after = second
        .collect_until(|e| e.agent_text() == Some("chunk-40 "), EVENT_TIMEOUT)
        .await;
    assert_consecutive_ids(&after, resume_at + 1);

    let mut all = texts(&before);
    all.extend(texts(&after));
    assert_eq!(
        all,
        acp::slow_chunks(40),
        "no chunk lost or repeated at the seam"
    );

    let reply = join_within(turn, REQUEST_TIMEOUT).await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
}

#[tokio::test]
async fn last_event_id_at_the_newest_event_replays_nothing_then_goes_live() {
    let server = TestServer::start(&[]).await;
    let (conn, session) = connection_with_one_turn(&server, "hi").await;
    let last = acp::mock_reply_chunks("hi")
        .last()
        .cloned()
        .unwrap_or_default();
    let mut stream = server.open_stream(&conn, Some(0)).await;
    let events = stream
        .collect_until(|e| e.agent_text() == Some(last.as_str()), EVENT_TIMEOUT)
        .await;
    assert_consecutive_ids(&events, 1);
    let newest = events.last().and_then(|e| e.id).expect("ids");
    stream.close();

    let mut resumed = server.open_stream(&conn, Some(newest)).await;
    let reply = server.prompt(&conn, &session, json!(2), "again").await;
    assert_eq!(stop_reason(&reply), Some("end_turn"));
    let first_live = resumed.next_event(EVENT_TIMEOUT).await;
    assert_eq!(
        first_live.id,
        Some(newest + 1),
        "nothing replayed, no gap: {first_live:?}"
    );
    assert_eq!(first_live.agent_text(), Some("Hello "), "{first_live:?}");
}

#[tokio::test]
async fn gap_notice_when_resuming_past_the_ring() {
    let server = TestServer::start(&["--replay-buffer", "8"]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let reply = server.prompt(&conn, &session, json!(1), "!emit 20 4").await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");

    // No Last-Event-ID counts as 0: everything before the ring is missing.
    let mut stream = server.open_stream(&conn, None).await;
    let gap = stream.next_event(EVENT_TIMEOUT).await;
    let oldest = assert_gap(&gap, 1);
    let replayed = read_n(&mut stream, 8).await;
    assert_consecutive_ids(&replayed, oldest);
    assert_eq!(
        texts(&replayed),
        vec!["xxxx".to_owned(); 8],
        "the ring holds the last 8 chunks"
    );
    let newest = oldest + 7;
    stream.close();

    // The ring really ends there: one past the newest is rejected.
    let past = (newest + 1).to_string();
    let reply = server.get_stream_error(Some(&conn), Some(&past)).await;
    assert_problem(&reply, 400, "invalid-last-event-id");

    // Resuming from an id older than the ring: gap from the next id on.
    let mut stream = server.open_stream(&conn, Some(3)).await;
    let gap = stream.next_event(EVENT_TIMEOUT).await;
    assert_eq!(assert_gap(&gap, 4), oldest, "same ring, same oldest event");
    let replayed = read_n(&mut stream, 8).await;
    assert_consecutive_ids(&replayed, oldest);
    stream.close();

    // Resuming inside the ring: no gap notice.
    let mut stream = server.open_stream(&conn, Some(newest - 2)).await;
    let replayed = read_n(&mut stream, 2).await;
    assert_consecutive_ids(&replayed, newest - 1);
}

/// Checks a gap notice (no `id:`, `{from, to}` with `from` as given) and
/// returns the first id that follows it (`to + 1`).
fn assert_gap(event: &SseEvent, from: u64) -> u64 {
    assert_eq!(
        event.method(),
        Some("_sandboxagent/stream/gap"),
        "{event:?}"
    );
    assert_eq!(event.id, None, "the gap notice has no id: line: {event:?}");
    assert!(
        event.data.get("id").is_none(),
        "the gap notice is a notification: {event:?}"
    );
    assert_eq!(event.params()["from"].as_u64(), Some(from), "{event:?}");
    let to = event.params()["to"].as_u64().expect("gap `to`");
    assert!(to >= from, "{event:?}");
    to + 1
}

/// Reads exactly `n` events.
async fn read_n(stream: &mut SseStream, n: usize) -> Vec<SseEvent> {
    let mut events = Vec::new();
    for _ in 0..n {
        events.push(stream.next_event(EVENT_TIMEOUT).await);
    }
    events
}

#[tokio::test]
async fn bad_last_event_id_is_400() {
    let server = TestServer::start(&[]).await;

    // A fresh connection has no events: 0 is fine, 1 is past the newest.
    let fresh = server.initialize(MOCK).await;
    let stream = server.open_stream(&fresh, Some(0)).await;
    stream.close();
    let reply = server.get_stream_error(Some(&fresh), Some("1")).await;
    assert_problem(&reply, 400, "invalid-last-event-id");

    let (conn, _) = connection_with_one_turn(&server, "hi").await;
    let last = acp::mock_reply_chunks("hi")
        .last()
        .cloned()
        .unwrap_or_default();
    let mut stream = server.open_stream(&conn, None).await;
    let events = stream
        .collect_until(|e| e.agent_text() == Some(last.as_str()), EVENT_TIMEOUT)
        .await;
    let newest = events.last().and_then(|e| e.id).expect("ids");
    stream.close();
    let too_new = (newest + 1).to_string();
    for value in [
        "abc",
        "-1",
        "1.5",
        "1e3",
        "0x10",
        "18446744073709551616",
        too_new.as_str(),
    ] {
        let reply = server.get_stream_error(Some(&conn), Some(value)).await;
        assert_eq!(
            reply.status.as_u16(),
            400,
            "Last-Event-ID {value:?}: {reply:?}"
        );
        assert_problem(&reply, 400, "invalid-last-event-id");
    }
}

#[tokio::test]
async fn get_requires_a_known_connection_id() {
    let server = TestServer::start(&[]).await;
    let reply = server.get_stream_error(None, None).await;
    assert_problem(&reply, 400, "missing-connection-id");
    let reply = server
        .get_stream_error(Some("no-such-connection"), None)
        .await;
    assert_problem(&reply, 404, "unknown-connection");
}

#[tokio::test]
async fn get_accept_must_allow_event_stream() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let get = |accept: &str| {
        server
            .request(reqwest::Method::GET, "/v2/rpc")
            .header(CONNECTION_ID_HEADER, &conn)
            .header(ACCEPT, accept)
            // Each accepted GET takes over from the previous one.
            .header("last-event-id", "0")
    };
    let response = Api::response_head(get("application/json")).await;
    assert_eq!(response.status().as_u16(), 406, "Accept application/json");
    assert_problem(
        &v2_api_tests::api::read_bounded(response).await,
        406,
        "not-acceptable",
    );

    for accept in [
        "text/event-stream",
        "*/*",
        "text/*",
        "application/json, text/event-stream",
    ] {
        let response = Api::response_head(get(accept)).await;
        assert_eq!(response.status().as_u16(), 200, "Accept {accept}");
        drop(response);
    }
}

#[tokio::test]
async fn second_live_stream_is_409_until_the_first_client_drops() {
    // Heartbeats make the server write to the dropped stream, so it notices
    // the closed socket quickly.
    let server = TestServer::start(&["--heartbeat-ms", "200"]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let first = server.open_stream(&conn, None).await;

    let reply = server.get_stream_error(Some(&conn), None).await;
    assert_problem(&reply, 409, "stream-conflict");

    first.close();
    // There is no event telling the client that the server noticed the drop:
    // retry until the slot is free (bounded).
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut second = loop {
        let response = server.get_stream(Some(&conn), None).await;
        match response.status().as_u16() {
            200 => break SseStream::new(response),
            409 => {
                assert!(
                    Instant::now() < deadline,
                    "the slot never freed after the client dropped"
                );
                drop(response);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => panic!("unexpected status {other}"),
        }
    };

    let reply = server.prompt(&conn, &session, json!(1), "hi").await;
    assert_eq!(stop_reason(&reply), Some("end_turn"));
    let last = acp::mock_reply_chunks("hi")
        .last()
        .cloned()
        .unwrap_or_default();
    let events = second
        .collect_until(|e| e.agent_text() == Some(last.as_str()), EVENT_TIMEOUT)
        .await;
    assert_eq!(texts(&events), acp::mock_reply_chunks("hi"));
}

#[tokio::test]
async fn get_with_last_event_id_takes_over_a_live_stream() {
    let server = TestServer::start(&[]).await;
    let (conn, session) = connection_with_one_turn(&server, "hi").await;
    let mut old = server.open_stream(&conn, None).await;
    let last = acp::mock_reply_chunks("hi")
        .last()
        .cloned()
        .unwrap_or_default();
    let events = old
        .collect_until(|e| e.agent_text() == Some(last.as_str()), EVENT_TIMEOUT)
        .await;
    let newest = events.last().and_then(|e| e.id).expect("ids");

    let mut new = server.open_stream(&conn, Some(newest)).await;
    match old.expect_end(EVENT_TIMEOUT).await {
        Next::Ended | Next::Failed(_) => {}
        other => panic!("the old stream must be closed, got {other:?}"),
    }

    let reply = server.prompt(&conn, &session, json!(2), "again").await;
    assert_eq!(stop_reason(&reply), Some("end_turn"));
    let first_live = new.next_event(EVENT_TIMEOUT).await;
    assert_eq!(first_live.id, Some(newest + 1), "{first_live:?}");
}

#[tokio::test]
async fn heartbeat_comments_on_a_quiet_stream() {
    let server = TestServer::start(&["--heartbeat-ms", "200"]).await;
    let conn = server.initialize(MOCK).await;
    let response = server.get_stream(Some(&conn), None).await;
    assert_eq!(response.status().as_u16(), 200);
    // The stream opens with a comment of its own; two heartbeats follow.
    let comments = read_comment_lines(response, 3, Duration::from_secs(10)).await;
    let heartbeats = comments.iter().filter(|c| *c == ": heartbeat").count();
    assert_eq!(
        heartbeats, 2,
        "two heartbeat comments within 10 s at 200 ms: {comments:?}"
    );
}

#[tokio::test]
async fn response_of_a_dropped_post_arrives_on_the_stream() {
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let mut stream = server.open_stream(&conn, None).await;

    let api = server.api();
    let (c, s) = (conn.clone(), session.clone());
    let post =
        tokio::spawn(async move { api.prompt(&c, &s, json!("dropped-1"), "!slow 5 500").await });
    // The first chunk proves the request reached the agent; then the HTTP
    // caller goes away (aborting the task drops the request future, which
    // closes its TCP connection: pooling is off).
    stream
        .next_event_matching(|e| e.agent_text() == Some("chunk-1 "), EVENT_TIMEOUT)
        .await;
    assert!(
        !post.is_finished(),
        "the turn (2 s left) ended before the POST could be dropped"
    );
    post.abort();
    assert!(
        post.await.is_err_and(|e| e.is_cancelled()),
        "the POST was dropped"
    );

    let id = json!("dropped-1");
    let events = stream
        .collect_until(|e| e.is_response_to(&id), EVENT_TIMEOUT)
        .await;
    let response = events.last().expect("the response event");
    assert!(
        response.id.is_some(),
        "a late response is a numbered event: {response:?}"
    );
    assert_eq!(response.data["jsonrpc"], "2.0");
    assert_eq!(
        stop_reason(&response.data),
        Some("end_turn"),
        "{response:?}"
    );
    assert_eq!(
        texts(&events),
        acp::slow_chunks(5)[1..].to_vec(),
        "the response comes after every chunk of its turn"
    );
}

#[tokio::test]
async fn post_answers_name_the_newest_event_id_of_their_connection() {
    // `x-acp-last-event-id` on a prompt's answer is at least the id of the
    // turn's last update: a client can hold the answer until its stream
    // got that far.
    let server = TestServer::start(&[]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let mut stream = server.open_stream(&conn, None).await;
    let reply = server
        .post(
            Some(&conn),
            &acp::request(7, "session/prompt", acp::prompt_params(&session, "hi")),
        )
        .await;
    assert_eq!(reply.status, 200);
    let named: u64 = reply
        .headers
        .get("x-acp-last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no x-acp-last-event-id: {:?}", reply.headers));
    let events = stream
        .collect_until(|e| e.agent_text() == Some("hi"), EVENT_TIMEOUT)
        .await;
    let last = events.last().and_then(|e| e.id).expect("numbered update");
    assert_eq!(named, last, "the answer names the turn's last update");
    // initialize answers (no stream yet) carry none.
    let init = server
        .post(
            None,
            &acp::request(1, "initialize", acp::initialize_params(MOCK)),
        )
        .await;
    assert!(init.headers.get("x-acp-last-event-id").is_none());
}
