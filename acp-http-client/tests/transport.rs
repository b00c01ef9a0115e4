//! The typed layer: `HttpTransport` under `agent-client-protocol`'s
//! `Client.v1()`, against the real `sandbox-agent` binary and its mock agent.

mod common;

use acp_http_client::{HttpTransport, http_failure};
use agent_client_protocol::Client;
use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    ContentBlock, ContentChunk, InitializeRequest, NewSessionRequest, PermissionOptionKind,
    PromptRequest, RequestPermissionOutcome, RequestPermissionRequest, RequestPermissionResponse,
    SelectedPermissionOutcome, SessionNotification, SessionUpdate, StopReason,
};
use common::{EchoRequest, EchoResponse, STEP, agent_meta, options, wait_until, within};
use parking_lot::Mutex;
use std::sync::Arc;
use v2_api_tests::{MOCK, TestServer};

fn transport(server: &TestServer) -> HttpTransport {
    match HttpTransport::new(options(server)) {
        Ok(transport) => transport,
        Err(error) => panic!("transport: {error}"),
    }
}

/// The text of an `agent_message_chunk` update.
fn chunk_text(notification: &SessionNotification) -> Option<String> {
    match &notification.update {
        SessionUpdate::AgentMessageChunk(ContentChunk {
            content: ContentBlock::Text(text),
            ..
        }) => Some(text.text.clone()),
        _ => None,
    }
}

#[tokio::test]
async fn full_turn_with_permission_callback() {
    let server = TestServer::start(&[]).await;
    let transport = transport(&server);
    let handle = transport.handle();
    let chunks = Arc::new(Mutex::new(Vec::<String>::new()));
    let permissions = Arc::new(Mutex::new(Vec::<String>::new()));

    let stop_reason = within(
        STEP * 2,
        "the permission turn",
        Client
            .v1()
            .name("acp-http-client-test")
            .on_receive_notification(
                {
                    let chunks = Arc::clone(&chunks);
                    async move |notification: SessionNotification, _cx| {
                        if let Some(text) = chunk_text(&notification) {
                            chunks.lock().push(text);
                        }
                        Ok(())
                    }
                },
                agent_client_protocol::on_receive_notification!(),
            )
            .on_receive_request(
                {
                    let permissions = Arc::clone(&permissions);
                    async move |request: RequestPermissionRequest, responder, _cx| {
                        let allow = request
                            .options
                            .iter()
                            .find(|option| option.kind == PermissionOptionKind::AllowOnce);
                        let Some(allow) = allow else {
                            return responder.respond(RequestPermissionResponse::new(
                                RequestPermissionOutcome::Cancelled,
                            ));
                        };
                        permissions.lock().push(allow.option_id.to_string());
                        responder.respond(RequestPermissionResponse::new(
                            RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(
                                allow.option_id.clone(),
                            )),
                        ))
                    }
                },
                agent_client_protocol::on_receive_request!(),
            )
            .connect_with(transport, async |cx| {
                let init = InitializeRequest::new(ProtocolVersion::V1).meta(agent_meta(MOCK));
                let init = cx.send_request(init).block_task().await?;
                assert_eq!(
                    init.agent_info.map(|info| info.name).as_deref(),
                    Some("sandbox-agent-mock")
                );
                let session = cx
                    .send_request(NewSessionRequest::new("/tmp").meta(agent_meta(MOCK)))
                    .block_task()
                    .await?;
                let prompt = PromptRequest::new(
                    session.session_id,
                    vec!["please ask for permission".into()],
                );
                let done = cx.send_request(prompt).block_task().await?;
                // Updates sent before the response may still be on their
                // way on the stream (see the crate docs): wait for them.
                let chunks = Arc::clone(&chunks);
                wait_until(STEP, "the granted reply", move || {
                    chunks.lock().concat().len() >= "Permission granted.".len()
                })
                .await;
                Ok(done.stop_reason)
            }),
    )
    .await;

    match stop_reason {
        Ok(reason) => assert_eq!(reason, StopReason::EndTurn),
        Err(error) => panic!("the turn failed: {error}"),
    }
    assert_eq!(*permissions.lock(), ["allow-once"]);
    let text = chunks.lock().concat();
    assert_eq!(text, "Permission granted.", "chunks: {:?}", chunks.lock());
    assert!(handle.is_closed(), "the ACP connection ended, so did ours");
}

#[tokio::test]
async fn sixteen_concurrent_requests_each_get_their_own_answer() {
    let server = TestServer::start(&[]).await;
    let transport = transport(&server);

    let answers = within(
        STEP * 2,
        "16 concurrent echoes",
        Client.v1().connect_with(transport, async |cx| {
            let init = InitializeRequest::new(ProtocolVersion::V1).meta(agent_meta(MOCK));
            cx.send_request(init).block_task().await?;
            let sent: Vec<_> = (0..16_u64)
                .map(|n| {
                    cx.send_request(EchoRequest {
                        n,
                        text: format!("payload {n} {}", "x".repeat(n as usize * 100)),
                    })
                })
                .collect();
            futures::future::try_join_all(sent.into_iter().map(|request| request.block_task()))
                .await
        }),
    )
    .await;

    let answers: Vec<EchoResponse> = match answers {
        Ok(answers) => answers,
        Err(error) => panic!("an echo failed: {error}"),
    };
    assert_eq!(answers.len(), 16);
    for (n, answer) in answers.iter().enumerate() {
        assert_eq!(answer.n, n as u64, "answer {n} belongs to another request");
        assert_eq!(
            answer.text,
            format!("payload {n} {}", "x".repeat(n * 100)),
            "answer {n}"
        );
    }
}

#[tokio::test]
async fn ending_the_acp_connection_deletes_the_http_connection() {
    let server = TestServer::start(&[]).await;
    let transport = transport(&server);
    let handle = transport.handle();
    assert_eq!(handle.connection_id(), None, "nothing sent yet");

    let seen_open = within(
        STEP,
        "initialize",
        Client.v1().connect_with(transport, async |cx| {
            let init = InitializeRequest::new(ProtocolVersion::V1).meta(agent_meta(MOCK));
            cx.send_request(init).block_task().await?;
            Ok(handle.connection_id())
        }),
    )
    .await;
    let id = match seen_open {
        Ok(Some(id)) => id,
        other => panic!("no connection id while connected: {other:?}"),
    };
    assert!(handle.is_closed());
    assert_eq!(handle.connection_id().as_deref(), Some(id.as_str()));

    // The server no longer knows the connection.
    let echo = v2_api_tests::acp::request(1, "_mock/echo", serde_json::json!({}));
    let reply = server.post(Some(&id), &echo).await;
    v2_api_tests::assert_problem(&reply, 404, "unknown-connection");
    // Closing again is a no-op.
    assert!(handle.close().await.is_ok());
}

#[tokio::test]
async fn closing_the_handle_mid_connection_releases_waiting_requests() {
    let server = TestServer::start(&[]).await;
    let transport = transport(&server);
    let handle = transport.handle();

    let result = within(
        STEP,
        "a stalled prompt released by close",
        Client.v1().connect_with(transport, async |cx| {
            let init = InitializeRequest::new(ProtocolVersion::V1).meta(agent_meta(MOCK));
            cx.send_request(init).block_task().await?;
            let session = cx
                .send_request(NewSessionRequest::new("/tmp").meta(agent_meta(MOCK)))
                .block_task()
                .await?;
            let stalled = cx.send_request(PromptRequest::new(
                session.session_id,
                vec!["!stall".into()],
            ));
            let close = async {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                handle.close().await
            };
            let (answer, closed) = tokio::join!(stalled.block_task(), close);
            assert!(closed.is_ok(), "DELETE: {closed:?}");
            Ok(answer.map(|done| done.stop_reason))
        }),
    )
    .await;
    match result {
        Ok(Err(error)) => {
            // Either the server's "connection closed" answer or the
            // SDK's own end-of-input error: the caller is not left waiting.
            assert_eq!(i32::from(error.code), -32603, "{error}");
        }
        other => panic!("the stalled prompt should fail: {other:?}"),
    }
}

#[tokio::test]
async fn an_unknown_agent_surfaces_as_a_404_problem_on_the_request() {
    let server = TestServer::start(&[]).await;
    let transport = transport(&server);

    let result = within(
        STEP,
        "initialize naming an unknown agent",
        Client.v1().connect_with(transport, async |cx| {
            let init =
                InitializeRequest::new(ProtocolVersion::V1).meta(agent_meta("no-such-agent"));
            cx.send_request(init).block_task().await
        }),
    )
    .await;
    let error = match result {
        Ok(init) => panic!("initialize succeeded: {init:?}"),
        Err(error) => error,
    };
    let Some(failure) = http_failure(&error) else {
        panic!("not an HTTP failure: {error}");
    };
    assert_eq!(failure.status.as_u16(), 404);
    let problem = failure
        .problem
        .unwrap_or_else(|| panic!("no problem: {error}"));
    assert_eq!(
        problem.problem_type,
        "urn:sandbox-agent:error:unknown-agent"
    );
    assert_eq!(problem.status, Some(404));
    assert!(error.message.contains("404"), "{}", error.message);
}

#[tokio::test]
async fn the_token_is_sent_and_a_missing_one_is_a_401() {
    let server = TestServer::start(&["--token", "secret"]).await;

    // With the token (options(&server) carries it): a working connection.
    let transport = transport(&server);
    let echoed = within(
        STEP,
        "echo with the token",
        Client.v1().connect_with(transport, async |cx| {
            let init = InitializeRequest::new(ProtocolVersion::V1).meta(agent_meta(MOCK));
            cx.send_request(init).block_task().await?;
            cx.send_request(EchoRequest {
                n: 1,
                text: "authorized".into(),
            })
            .block_task()
            .await
        }),
    )
    .await;
    match echoed {
        Ok(answer) => assert_eq!(answer.text, "authorized"),
        Err(error) => panic!("echo with the token: {error}"),
    }

    // Without it: 401 on the first request.
    let anonymous = match HttpTransport::new(common::options_for(server.base_url())) {
        Ok(transport) => transport,
        Err(error) => panic!("transport: {error}"),
    };
    let result = within(
        STEP,
        "initialize without the token",
        Client.v1().connect_with(anonymous, async |cx| {
            let init = InitializeRequest::new(ProtocolVersion::V1).meta(agent_meta(MOCK));
            cx.send_request(init).block_task().await
        }),
    )
    .await;
    let error = match result {
        Ok(_) => panic!("initialize without the token succeeded"),
        Err(error) => error,
    };
    let failure = http_failure(&error).unwrap_or_else(|| panic!("not an HTTP failure: {error}"));
    assert_eq!(failure.status.as_u16(), 401);
    assert_eq!(
        failure.problem.map(|p| p.problem_type).as_deref(),
        Some("urn:sandbox-agent:error:unauthorized")
    );
}

#[tokio::test]
async fn streamed_updates_of_a_plain_turn_arrive_in_order() {
    let server = TestServer::start(&[]).await;
    let transport = transport(&server);
    let chunks = Arc::new(Mutex::new(Vec::<String>::new()));

    let result = within(
        STEP,
        "a plain turn",
        Client
            .v1()
            .on_receive_notification(
                {
                    let chunks = Arc::clone(&chunks);
                    async move |notification: SessionNotification, _cx| {
                        if let Some(text) = chunk_text(&notification) {
                            chunks.lock().push(text);
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
                let prompt = PromptRequest::new(session.session_id, vec!["hello".into()]);
                let done = cx.send_request(prompt).block_task().await?;
                // Updates sent before the response may still be on their
                // way on the stream (see the crate docs): wait for them.
                let expected = v2_api_tests::acp::mock_reply_chunks("hello");
                let chunks = Arc::clone(&chunks);
                wait_until(STEP, "all chunks", move || {
                    chunks.lock().len() >= expected.len()
                })
                .await;
                Ok(done.stop_reason)
            }),
    )
    .await;
    assert!(matches!(result, Ok(StopReason::EndTurn)), "{result:?}");
    assert_eq!(
        *chunks.lock(),
        v2_api_tests::acp::mock_reply_chunks("hello")
    );
}
