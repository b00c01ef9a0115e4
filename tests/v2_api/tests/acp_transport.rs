//! The transports beyond HTTP/1.1 `/v2/rpc` (research/contract.md, "HTTP/2"
//! and "The /acp profile"): cleartext HTTP/2 on the same port.

use std::sync::{Arc, Mutex};

use agent_client_protocol::Client;
use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    ContentBlock, ContentChunk, InitializeRequest, NewSessionRequest, PermissionOptionKind,
    PromptRequest, RequestPermissionOutcome, RequestPermissionRequest, RequestPermissionResponse,
    SelectedPermissionOutcome, SessionNotification, SessionUpdate, StopReason,
};
use agent_client_protocol_http::HttpClient;
use futures::future::join_all;
use futures::{SinkExt, StreamExt};
use reqwest::header::{ACCEPT, CONTENT_TYPE};
use reqwest::{Method, RequestBuilder};
use serde_json::{Value, json};
use tokio_tungstenite::connect_async;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
use v2_api_tests::acp::{self, stop_reason};
use v2_api_tests::server::workspace_root;
use v2_api_tests::{
    Api, CONNECTION_ID_HEADER, EVENT_TIMEOUT, MOCK, REQUEST_TIMEOUT, SseStream, TestServer,
    assert_problem,
};

/// A client that speaks only HTTP/2, by prior knowledge (RFC 9113 section
/// 3.3), with one pooled TCP connection per host.
fn http2_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .http2_prior_knowledge()
        .build()
        .expect("build the HTTP/2 client")
}

/// POSTs `body` to `/v2/rpc` over `client`; the status, the connection id
/// header and the JSON body.
async fn h2_post(
    client: &reqwest::Client,
    base: &str,
    conn: Option<&str>,
    body: &Value,
) -> (u16, Option<String>, Value) {
    let mut builder = client
        .post(format!("{base}/v2/rpc"))
        .header(CONTENT_TYPE, "application/json")
        .body(body.to_string());
    if let Some(conn) = conn {
        builder = builder.header(CONNECTION_ID_HEADER, conn);
    }
    let exchange = async {
        let response = builder.send().await?;
        assert_eq!(response.version(), reqwest::Version::HTTP_2);
        let status = response.status().as_u16();
        let conn = response
            .headers()
            .get(CONNECTION_ID_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = response.json::<Value>().await?;
        Ok::<_, reqwest::Error>((status, conn, body))
    };
    tokio::time::timeout(REQUEST_TIMEOUT, exchange)
        .await
        .expect("HTTP/2 POST within the bound")
        .expect("HTTP/2 POST")
}

/// One TCP connection carries everything: the server admits exactly one
/// (`--max-http-connections 1`), and over it an SSE stream stays open while
/// 32 POSTs run at once and a prompt streams its updates.
#[tokio::test]
async fn http2_prior_knowledge_multiplexes_a_stream_and_32_posts() {
    let server = TestServer::start(&["--max-http-connections", "1"]).await;
    let base = server.api().base_url().to_owned();
    let client = http2_client();

    let init = acp::request(0, "initialize", acp::initialize_params(MOCK));
    let (status, conn, body) = h2_post(&client, &base, None, &init).await;
    assert_eq!(status, 200, "{body}");
    let conn = conn.expect("initialize answers with a connection id");
    let (status, _, body) = h2_post(
        &client,
        &base,
        Some(&conn),
        &acp::request(1, "session/new", acp::new_session_params(MOCK)),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let session = body["result"]["sessionId"]
        .as_str()
        .expect("session id")
        .to_owned();

    let stream = tokio::time::timeout(
        REQUEST_TIMEOUT,
        client
            .get(format!("{base}/v2/rpc"))
            .header(ACCEPT, "text/event-stream")
            .header(CONNECTION_ID_HEADER, &conn)
            .send(),
    )
    .await
    .expect("stream head within the bound")
    .expect("GET /v2/rpc over HTTP/2");
    assert_eq!(stream.status(), 200);
    assert_eq!(stream.version(), reqwest::Version::HTTP_2);
    let mut stream = SseStream::new(stream);

    let echoes = (0..32).map(|i| {
        let request = acp::request(100 + i, "_mock/echo", json!({"n": i}));
        let (client, base, conn) = (client.clone(), base.clone(), conn.clone());
        async move { h2_post(&client, &base, Some(&conn), &request).await }
    });
    let prompt = acp::request(2, "session/prompt", acp::prompt_params(&session, "over h2"));
    let (answers, (status, _, reply)) = tokio::join!(
        join_all(echoes),
        h2_post(&client, &base, Some(&conn), &prompt)
    );
    for (i, (status, _, body)) in answers.into_iter().enumerate() {
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["id"], json!(100 + i), "{body}");
        assert_eq!(body["result"], json!({"n": i}), "{body}");
    }
    assert_eq!(status, 200, "{reply}");
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");

    let events = stream
        .collect_until(
            |event| event.agent_text().is_some_and(|text| text.contains("h2")),
            EVENT_TIMEOUT,
        )
        .await;
    assert!(
        events.iter().all(|event| event.id.is_some()),
        "every event over HTTP/2 has an id: {events:#?}"
    );
    // The one permitted TCP connection still serves HTTP/2 afterwards.
    let (status, _, _) = h2_post(
        &client,
        &base,
        Some(&conn),
        &acp::request(3, "_mock/echo", json!({})),
    )
    .await;
    assert_eq!(status, 200);
}

/// The official Rust client of the ACP transports RFD
/// (`agent-client-protocol-http`, unchanged) over Streamable HTTP against
/// `/acp/mock`, without any sandbox-agent `_meta`: initialize, session/new,
/// a streamed prompt, a permission round trip, then two sessions prompting
/// at once on the same connection.
#[tokio::test]
async fn official_rust_client_over_streamable_http() {
    let server = TestServer::start(&[]).await;
    official_client_flow(format!("{}/acp/mock", server.api().base_url())).await;
}

/// [`official_rust_client_over_streamable_http`] over the client's
/// WebSocket transport (`ws://`).
#[tokio::test]
async fn official_rust_client_over_websocket() {
    let server = TestServer::start(&[]).await;
    official_client_flow(format!("ws://{}/acp/mock", server.api().addr())).await;
}

/// The official client's flow against `endpoint`.
async fn official_client_flow(endpoint: String) {
    let transport = HttpClient::builder_with_endpoint(&endpoint)
        .configure_http(|http| http.no_proxy())
        .build()
        .expect("build the ACP HTTP client");
    let permissions = Arc::new(Mutex::new(Vec::<String>::new()));
    let chunks = Arc::new(Mutex::new(String::new()));
    let flow = Client
        .v1()
        .name("acp-transport-test")
        .on_receive_notification(
            {
                let chunks = Arc::clone(&chunks);
                async move |notification: SessionNotification, _cx| {
                    if let SessionUpdate::AgentMessageChunk(ContentChunk {
                        content: ContentBlock::Text(text),
                        ..
                    }) = notification.update
                    {
                        chunks.lock().expect("lock").push_str(&text.text);
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
                        .find(|option| option.kind == PermissionOptionKind::AllowOnce)
                        .map(|option| option.option_id.clone());
                    let outcome = match allow {
                        Some(id) => {
                            permissions.lock().expect("lock").push(id.to_string());
                            RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(id))
                        }
                        None => RequestPermissionOutcome::Cancelled,
                    };
                    responder.respond(RequestPermissionResponse::new(outcome))
                }
            },
            agent_client_protocol::on_receive_request!(),
        )
        .connect_with(transport, async |cx| {
            let init = cx
                .send_request(InitializeRequest::new(ProtocolVersion::V1))
                .block_task()
                .await?;
            let name = init.agent_info.map(|info| info.name);
            let session = cx
                .send_request(NewSessionRequest::new("/tmp"))
                .block_task()
                .await?;
            let plain = cx
                .send_request(PromptRequest::new(
                    session.session_id.clone(),
                    vec!["over the RFD".into()],
                ))
                .block_task()
                .await?;
            let asked = cx
                .send_request(PromptRequest::new(
                    session.session_id.clone(),
                    vec!["please ask for permission".into()],
                ))
                .block_task()
                .await?;
            let second = cx
                .send_request(NewSessionRequest::new("/tmp"))
                .block_task()
                .await?;
            let (one, two) = futures::future::try_join(
                cx.send_request(PromptRequest::new(
                    session.session_id.clone(),
                    vec!["!slow 3 50".into()],
                ))
                .block_task(),
                cx.send_request(PromptRequest::new(
                    second.session_id.clone(),
                    vec!["!slow 3 50".into()],
                ))
                .block_task(),
            )
            .await?;
            Ok((
                name,
                [
                    plain.stop_reason,
                    asked.stop_reason,
                    one.stop_reason,
                    two.stop_reason,
                ],
                session.session_id != second.session_id,
            ))
        });
    let (name, stops, distinct) = tokio::time::timeout(REQUEST_TIMEOUT, flow)
        .await
        .expect("the ACP flow within the bound")
        .unwrap_or_else(|error| panic!("the ACP flow failed: {error}"));
    assert_eq!(name.as_deref(), Some("sandbox-agent-mock"));
    assert_eq!(stops, [StopReason::EndTurn; 4]);
    assert!(distinct, "two sessions, two ids");
    assert_eq!(*permissions.lock().expect("lock"), ["allow-once"]);
    // Updates may trail their turn's answer by a moment on another stream.
    let streamed = "Hello from the mock agent. You said: over the RFD";
    for _ in 0..100 {
        if chunks.lock().expect("lock").contains("Permission granted.") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let text = chunks.lock().expect("lock").clone();
    assert!(text.starts_with(streamed), "streamed chunks: {text:?}");
    assert!(
        text.contains("Permission granted."),
        "streamed chunks: {text:?}"
    );
}

/// Header names of the /acp profile (ACP transports RFD, "Identity Model").
const ACP_CONNECTION: &str = "acp-connection-id";
const ACP_SESSION: &str = "acp-session-id";

/// `POST path` with JSON content and the /acp headers given.
fn acp_post(api: &Api, path: &str, conn: Option<&str>, session: Option<&str>) -> RequestBuilder {
    let mut builder = api
        .request(Method::POST, path)
        .header(CONTENT_TYPE, "application/json");
    if let Some(conn) = conn {
        builder = builder.header(ACP_CONNECTION, conn);
    }
    if let Some(session) = session {
        builder = builder.header(ACP_SESSION, session);
    }
    builder
}

/// `GET /acp` for a stream, with the /acp headers and `Last-Event-ID` given.
fn acp_get(
    api: &Api,
    conn: Option<&str>,
    session: Option<&str>,
    last: Option<u64>,
) -> RequestBuilder {
    let mut builder = api
        .request(Method::GET, "/acp")
        .header(ACCEPT, "text/event-stream");
    if let Some(conn) = conn {
        builder = builder.header(ACP_CONNECTION, conn);
    }
    if let Some(session) = session {
        builder = builder.header(ACP_SESSION, session);
    }
    if let Some(last) = last {
        builder = builder.header("last-event-id", last.to_string());
    }
    builder
}

/// Opens a stream that must answer 200.
async fn open(builder: RequestBuilder) -> SseStream {
    let response = Api::response_head(builder).await;
    assert_eq!(response.status(), 200, "{:?}", response.headers());
    SseStream::new(response)
}

/// `initialize` on `/acp/mock`; the connection id.
async fn acp_initialize(api: &Api) -> String {
    let init = acp::request(
        0,
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {}}),
    );
    let reply = Api::send(acp_post(api, "/acp/mock", None, None).body(init.to_string())).await;
    reply.assert_status(200);
    assert!(reply.json()["result"]["agentInfo"].is_object(), "{reply:?}");
    reply
        .header(ACP_CONNECTION)
        .unwrap_or_else(|| panic!("initialize answered without {ACP_CONNECTION}: {reply:?}"))
        .to_owned()
}

/// POSTs `message` on the connection (and session) and asserts 202, empty.
async fn accepted(api: &Api, conn: &str, session: Option<&str>, message: &Value) {
    let reply =
        Api::send(acp_post(api, "/acp", Some(conn), session).body(message.to_string())).await;
    reply.assert_status(202);
    assert!(reply.body.is_empty(), "202 has no body: {reply:?}");
}

/// Every status of the RFD's routing table, as problem+json.
#[tokio::test]
async fn routing_table_statuses() {
    let server = TestServer::start(&[]).await;
    let api = server.api();
    let init = acp::request(
        0,
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {}}),
    );

    // /acp with no agent anywhere: 400 naming the path form.
    let reply = Api::send(acp_post(&api, "/acp", None, None).body(init.to_string())).await;
    let problem = assert_problem(&reply, 400, "invalid-request");
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("/acp/{agent}")),
        "{problem}"
    );
    // ... but `_meta` names it.
    let with_meta = acp::request(0, "initialize", acp::initialize_params(MOCK));
    let reply = Api::send(acp_post(&api, "/acp", None, None).body(with_meta.to_string())).await;
    reply.assert_status(200);
    assert!(reply.header(ACP_CONNECTION).is_some(), "{reply:?}");
    // Unknown agent by path.
    let reply = Api::send(acp_post(&api, "/acp/nope", None, None).body(init.to_string())).await;
    assert_problem(&reply, 404, "unknown-agent");
    // 415, 406, 501, 405.
    let reply = Api::send(
        api.request(Method::POST, "/acp/mock")
            .header(CONTENT_TYPE, "text/plain")
            .body(init.to_string()),
    )
    .await;
    assert_problem(&reply, 415, "unsupported-media-type");
    let reply = Api::send(
        acp_post(&api, "/acp/mock", None, None)
            .header(ACCEPT, "text/html")
            .body(init.to_string()),
    )
    .await;
    assert_problem(&reply, 406, "not-acceptable");
    let reply = Api::send(acp_post(&api, "/acp/mock", None, None).body(format!("[{init}]"))).await;
    assert_problem(&reply, 501, "batch-not-supported");
    // A batch written over several lines is still a batch.
    let reply =
        Api::send(acp_post(&api, "/acp/mock", None, None).body(format!("[\n  {init}\n]"))).await;
    assert_problem(&reply, 501, "batch-not-supported");
    let reply = Api::send(api.request(Method::PUT, "/acp")).await;
    assert_problem(&reply, 405, "method-not-allowed");

    let conn = acp_initialize(&api).await;
    let echo = acp::request(5, "_mock/echo", json!({}));
    // POST: no connection id (not initialize) 400, unknown one 404.
    let reply = Api::send(acp_post(&api, "/acp", None, None).body(echo.to_string())).await;
    assert_problem(&reply, 400, "invalid-request");
    let reply = Api::send(acp_post(&api, "/acp", Some("nope"), None).body(echo.to_string())).await;
    assert_problem(&reply, 404, "unknown-connection");
    // Session-scoped without Acp-Session-Id, or with another one: 400.
    let prompt = acp::request(6, "session/prompt", acp::prompt_params("s-1", "hi"));
    let reply = Api::send(acp_post(&api, "/acp", Some(&conn), None).body(prompt.to_string())).await;
    assert_problem(&reply, 400, "invalid-request");
    let reply =
        Api::send(acp_post(&api, "/acp", Some(&conn), Some("s-2")).body(prompt.to_string())).await;
    assert_problem(&reply, 400, "invalid-request");
    // A member named twice, the same value both times, with members after
    // it: refused before any other check (research/contract.md, "Transport:
    // /v2/rpc", the 400 table), as on /v2/rpc.
    let twice = r#"{"jsonrpc":"2.0","id":7,"method":"session/prompt","params":{"sessionId":"s-1","sessionId":"s-1","prompt":[{"type":"text","text":"hi"}]}}"#;
    let reply = Api::send(acp_post(&api, "/acp", Some(&conn), Some("s-1")).body(twice)).await;
    let problem = assert_problem(&reply, 400, "invalid-request");
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("\"sessionId\" more than once")),
        "{problem}"
    );

    // GET: 406 without event-stream, 400 without a connection, 404 unknown
    // connection or session, 409 for a second connection stream.
    let reply = Api::send(
        api.request(Method::GET, "/acp")
            .header(ACCEPT, "application/json")
            .header(ACP_CONNECTION, &conn),
    )
    .await;
    assert_problem(&reply, 406, "not-acceptable");
    let reply = Api::send_within(acp_get(&api, None, None, None), REQUEST_TIMEOUT).await;
    assert_problem(&reply, 400, "invalid-request");
    let reply = Api::send(acp_get(&api, Some("nope"), None, None)).await;
    assert_problem(&reply, 404, "unknown-connection");
    let reply = Api::send(acp_get(&api, Some(&conn), Some("no-such-session"), None)).await;
    assert_problem(&reply, 404, "unknown-session");
    let _stream = open(acp_get(&api, Some(&conn), None, None)).await;
    let reply = Api::send(acp_get(&api, Some(&conn), None, None)).await;
    assert_problem(&reply, 409, "stream-conflict");

    // DELETE: 400 without a connection, 202, then the connection is gone.
    let reply = Api::send(api.request(Method::DELETE, "/acp")).await;
    assert_problem(&reply, 400, "invalid-request");
    let reply = Api::send(
        api.request(Method::DELETE, "/acp")
            .header(ACP_CONNECTION, &conn),
    )
    .await;
    reply.assert_status(202);
    let reply = Api::send(acp_post(&api, "/acp", Some(&conn), None).body(echo.to_string())).await;
    assert_problem(&reply, 404, "unknown-connection");
}

/// `--default-agent`: a bare `/acp` `initialize` without `_meta` gets the
/// default agent (over POST and over WebSocket); `_meta` still wins; an
/// unknown default is refused at start-up.
#[tokio::test]
async fn default_agent_serves_bare_acp() {
    let server = TestServer::start(&["--default-agent", MOCK]).await;
    let api = server.api();
    let init = acp::request(
        0,
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {}}),
    );
    let reply = Api::send(acp_post(&api, "/acp", None, None).body(init.to_string())).await;
    reply.assert_status(200);
    assert!(reply.json()["result"]["agentInfo"].is_object(), "{reply:?}");
    let conn = reply
        .header(ACP_CONNECTION)
        .expect("connection id")
        .to_owned();
    // The connection is the mock's: its extension method answers.
    let mut stream = open(acp_get(&api, Some(&conn), None, None)).await;
    accepted(
        &api,
        &conn,
        None,
        &acp::request(1, "_mock/echo", json!({"n": 7})),
    )
    .await;
    let answer = stream
        .next_event_matching(|e| e.is_response_to(&json!(1)), EVENT_TIMEOUT)
        .await;
    assert_eq!(answer.data["result"], json!({"n": 7}), "{answer:?}");
    // `_meta` naming an agent still takes precedence (here: an unknown one).
    let named = acp::request(0, "initialize", acp::initialize_params("nope"));
    let reply = Api::send(acp_post(&api, "/acp", None, None).body(named.to_string())).await;
    assert_problem(&reply, 404, "unknown-agent");
    // WebSocket on bare /acp.
    let url = format!("ws://{}/acp", api.addr());
    let (mut socket, _) = tokio::time::timeout(REQUEST_TIMEOUT, connect_async(url))
        .await
        .expect("upgrade within the bound")
        .expect("WebSocket upgrade");
    send_text(&mut socket, init.to_string()).await;
    let answer = next_json(&mut socket).await;
    assert!(answer["result"]["agentInfo"].is_object(), "{answer}");

    // An unknown default agent: the server refuses to start, naming it.
    let output = v2_api_tests::server::sandbox_agent_command()
        .args([
            "server",
            "--no-token",
            "--port",
            "0",
            "--default-agent",
            "nope",
        ])
        .output()
        .expect("run sandbox-agent server");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--default-agent \"nope\""), "{stderr}");
}

/// The bearer token guards `/acp` as it guards `/v2`.
#[tokio::test]
async fn acp_requires_the_bearer_token() {
    let server = TestServer::start(&["--token", "s3cret"]).await;
    let api = server.api();
    let init = acp::request(
        0,
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {}}),
    );
    let reply = Api::send(
        api.http()
            .post(api.url("/acp/mock"))
            .header(CONTENT_TYPE, "application/json")
            .body(init.to_string()),
    )
    .await;
    assert_problem(&reply, 401, "unauthorized");
    acp_initialize(&api).await;
}

/// Answers go to the streams the RFD names: `session/new`'s to the
/// connection stream, a prompt's updates and answer to the session stream
/// (and nothing of the session to the connection stream); a session stream
/// cut mid-turn resumes with `Last-Event-ID` without loss or duplicate; and
/// DELETE ends the session only this connection follows.
#[tokio::test]
async fn session_streams_carry_their_session_and_resume_across_a_cut() {
    let server = TestServer::start(&[]).await;
    let api = server.api();
    let conn = acp_initialize(&api).await;
    let mut connection_stream = open(acp_get(&api, Some(&conn), None, None)).await;
    accepted(
        &api,
        &conn,
        None,
        &acp::request(1, "session/new", json!({"cwd": "/tmp", "mcpServers": []})),
    )
    .await;
    let answer = connection_stream
        .next_event_matching(|event| event.is_response_to(&json!(1)), EVENT_TIMEOUT)
        .await;
    assert!(answer.id.is_some(), "every event has an id: {answer:?}");
    let session = answer.data["result"]["sessionId"]
        .as_str()
        .expect("sessionId")
        .to_owned();

    let mut session_stream = open(acp_get(&api, Some(&conn), Some(&session), None)).await;
    let prompt = acp::request(
        2,
        "session/prompt",
        acp::prompt_params(&session, "!slow 6 150"),
    );
    accepted(&api, &conn, Some(&session), &prompt).await;
    let first = session_stream
        .next_event_matching(
            |event| event.agent_text() == Some("chunk-1 "),
            EVENT_TIMEOUT,
        )
        .await;
    let second = session_stream.next_event(EVENT_TIMEOUT).await;
    assert_eq!(second.agent_text(), Some("chunk-2 "), "{second:?}");
    drop(session_stream);

    let resumed = open(acp_get(&api, Some(&conn), Some(&session), second.id)).await;
    let mut resumed = resumed;
    let rest = resumed
        .collect_until(|event| event.is_response_to(&json!(2)), EVENT_TIMEOUT)
        .await;
    let texts: Vec<_> = rest.iter().filter_map(|e| e.agent_text()).collect();
    assert_eq!(
        texts,
        ["chunk-3 ", "chunk-4 ", "chunk-5 ", "chunk-6 "],
        "{rest:#?}"
    );
    assert_eq!(stop_reason(&rest[rest.len() - 1].data), Some("end_turn"));
    assert!(
        first.id < second.id && rest.iter().all(|e| e.id > second.id),
        "{rest:#?}"
    );

    // Nothing of the session went to the connection stream.
    accepted(
        &api,
        &conn,
        None,
        &acp::request(3, "_mock/echo", json!({"after": true})),
    )
    .await;
    let echo = connection_stream.next_event(EVENT_TIMEOUT).await;
    assert!(
        echo.is_response_to(&json!(3)),
        "next on the connection stream is the echo: {echo:?}"
    );

    // DELETE: 202, the session (followed by this connection only) has ended.
    let reply = Api::send(
        api.request(Method::DELETE, "/acp")
            .header(ACP_CONNECTION, &conn),
    )
    .await;
    reply.assert_status(202);
    resumed.expect_end(EVENT_TIMEOUT).await;
    let other = server.initialize(MOCK).await;
    let load = acp::request(
        9,
        "session/load",
        json!({"sessionId": session, "cwd": "/tmp", "mcpServers": []}),
    );
    let body = server.call(&other, &load).await;
    assert!(
        body["error"].is_object(),
        "a terminated session stays ended: {body}"
    );
}

/// A raw WebSocket client (tokio-tungstenite) on `/acp/mock`; the socket and
/// the connection id of the 101 answer.
async fn raw_socket(server: &TestServer, query: &str) -> (WsClient, String) {
    let url = format!("ws://{}/acp/mock{query}", server.api().addr());
    let (socket, response) = tokio::time::timeout(REQUEST_TIMEOUT, connect_async(url))
        .await
        .expect("upgrade within the bound")
        .expect("WebSocket upgrade");
    assert_eq!(response.status(), 101);
    let id = response
        .headers()
        .get(ACP_CONNECTION)
        .and_then(|v| v.to_str().ok())
        .expect("the 101 names the connection")
        .to_owned();
    (socket, id)
}

type WsClient =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Sends one text frame.
async fn send_text(socket: &mut WsClient, text: String) {
    socket
        .send(WsMessage::text(text))
        .await
        .expect("send a text frame");
}

/// The next JSON text frame (pings and pongs skipped).
async fn next_json(socket: &mut WsClient) -> Value {
    loop {
        let frame = tokio::time::timeout(EVENT_TIMEOUT, socket.next())
            .await
            .expect("a frame within the bound")
            .expect("the socket is open")
            .expect("a valid frame");
        match frame {
            WsMessage::Text(text) => return serde_json::from_str(&text).expect("JSON text frame"),
            WsMessage::Ping(_) | WsMessage::Pong(_) => {}
            other => panic!("expected a text frame, got {other:?}"),
        }
    }
}

/// The next JSON frame matching `pred`, skipping others.
async fn next_json_matching(socket: &mut WsClient, pred: impl Fn(&Value) -> bool) -> Value {
    loop {
        let message = next_json(socket).await;
        if pred(&message) {
            return message;
        }
    }
}

/// The close frame's code, once the server closes (within
/// [`EVENT_TIMEOUT`] overall, whatever else arrives first).
async fn close_code(socket: &mut WsClient) -> Option<u16> {
    let closed = async {
        loop {
            match socket.next().await {
                None | Some(Err(_)) => return None,
                Some(Ok(WsMessage::Close(frame))) => return frame.map(|f| u16::from(f.code)),
                Some(Ok(_)) => {}
            }
        }
    };
    tokio::time::timeout(EVENT_TIMEOUT, closed)
        .await
        .expect("the server closes the socket in time")
}

/// Bad frames: a binary frame is ignored, a text frame that is not JSON
/// gets a JSON-RPC error with id null, a message split over fragments is
/// one message, and a 17 MiB text frame (over the 16 MiB body limit)
/// closes the socket with 1009.
#[tokio::test]
async fn websocket_bad_frames() {
    let server = TestServer::start(&[]).await;
    let (mut socket, _id) = raw_socket(&server, "").await;
    socket
        .send(WsMessage::Binary(vec![1_u8, 2, 3].into()))
        .await
        .expect("send binary");
    send_text(&mut socket, "this is not json".to_owned()).await;
    let error = next_json(&mut socket).await;
    assert!(
        error["id"].is_null() && error["error"]["code"].is_i64(),
        "{error}"
    );
    let init = acp::request(
        0,
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {}}),
    );
    send_text(&mut socket, init.to_string()).await;
    let answer = next_json(&mut socket).await;
    assert_eq!(
        answer["result"]["agentInfo"]["name"], "sandbox-agent-mock",
        "{answer}"
    );

    // One message in two fragments.
    let echo = acp::request(7, "_mock/echo", json!({"fragmented": true})).to_string();
    let (head, tail) = echo.split_at(echo.len() / 2);
    socket
        .send(WsMessage::Frame(Frame::message(
            head.as_bytes().to_vec(),
            OpCode::Data(Data::Text),
            false,
        )))
        .await
        .expect("first fragment");
    socket
        .send(WsMessage::Frame(Frame::message(
            tail.as_bytes().to_vec(),
            OpCode::Data(Data::Continue),
            true,
        )))
        .await
        .expect("last fragment");
    let answer = next_json_matching(&mut socket, |m| m["id"] == json!(7)).await;
    assert_eq!(answer["result"], json!({"fragmented": true}), "{answer}");

    let huge = format!("\"{}\"", "x".repeat(17 * 1024 * 1024));
    let _ = socket.send(WsMessage::text(huge)).await;
    assert_eq!(close_code(&mut socket).await, Some(1009));
    // The server is fine.
    server.api().health().await.assert_status(200);
}

/// A WebSocket dropped mid-turn ends nothing: the session is loaded on a
/// new WebSocket connection and its history replays.
#[tokio::test]
async fn websocket_dropped_mid_turn_then_session_load() {
    let server = TestServer::start(&[]).await;
    let (mut socket, _) = raw_socket(&server, "").await;
    let init = acp::request(
        0,
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {}}),
    );
    send_text(&mut socket, init.to_string()).await;
    next_json(&mut socket).await;
    send_text(
        &mut socket,
        acp::request(1, "session/new", json!({"cwd": "/tmp", "mcpServers": []})).to_string(),
    )
    .await;
    let created = next_json_matching(&mut socket, |m| m["id"] == json!(1)).await;
    let session = created["result"]["sessionId"]
        .as_str()
        .expect("sessionId")
        .to_owned();
    send_text(
        &mut socket,
        acp::request(
            2,
            "session/prompt",
            acp::prompt_params(&session, "!slow 4 100"),
        )
        .to_string(),
    )
    .await;
    next_json_matching(&mut socket, |m| {
        m["params"]["update"]["content"]["text"] == "chunk-1 "
    })
    .await;
    drop(socket);

    let (mut socket, _) = raw_socket(&server, "").await;
    send_text(&mut socket, init.to_string()).await;
    next_json(&mut socket).await;
    let load = acp::request(
        3,
        "session/load",
        json!({"sessionId": session, "cwd": "/tmp", "mcpServers": []}),
    );
    send_text(&mut socket, load.to_string()).await;
    let loaded = next_json_matching(&mut socket, |m| m["id"] == json!(3)).await;
    assert!(loaded["error"].is_null(), "the session lived on: {loaded}");
    // The first turn runs on (its updates reach this connection now);
    // once it is over, the session takes the next prompt.
    next_json_matching(&mut socket, |m| {
        m["params"]["update"]["content"]["text"] == "chunk-4 "
    })
    .await;
    let mut done = Value::Null;
    for id in 4..50 {
        let prompt = acp::request(id, "session/prompt", acp::prompt_params(&session, "again"));
        send_text(&mut socket, prompt.to_string()).await;
        done = next_json_matching(&mut socket, |m| m["id"] == json!(id)).await;
        if done["error"].is_null() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(stop_reason(&done), Some("end_turn"), "{done}");
}

/// With a token: the upgrade needs it, as a bearer header or, for
/// browsers, `?access_token=`; the query is not accepted anywhere else.
#[tokio::test]
async fn websocket_auth_on_the_upgrade() {
    let server = TestServer::start(&["--token", "s3cret"]).await;
    let url = format!("ws://{}/acp/mock", server.api().addr());
    match connect_async(url.clone()).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), 401);
        }
        other => panic!("an upgrade without the token must be refused: {other:?}"),
    }
    let (mut socket, _) = raw_socket(&server, "?access_token=s3cret").await;
    let init = acp::request(
        0,
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {}}),
    );
    send_text(&mut socket, init.to_string()).await;
    assert!(next_json(&mut socket).await["result"].is_object());
    let reply = Api::send(
        server
            .api()
            .http()
            .post(server.api().url("/acp/mock?access_token=s3cret"))
            .header(CONTENT_TYPE, "application/json")
            .body(init.to_string()),
    )
    .await;
    assert_problem(&reply, 401, "unauthorized");
}

/// A WebSocket client that never reads costs the server no more than its
/// replay ring (as an SSE reader): with a 2 MiB ring and a 2 MiB session
/// log, 40 MB of updates later the server grew by less than 16 MiB and
/// still serves.
#[tokio::test]
async fn websocket_client_that_never_reads_stays_bounded() {
    // The ring under test only: the session store's writer holds what it
    // has not written yet, bounded on its own (research/contract.md,
    // "Durable sessions"), which would blur what this measures.
    let server = TestServer::start(&[
        "--store",
        "memory",
        "--heartbeat-ms",
        "500",
        "--replay-buffer-bytes",
        "2097152",
        "--event-log-bytes",
        "2097152",
    ])
    .await;
    let (mut socket, _) = raw_socket(&server, "").await;
    let init = acp::request(
        0,
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {}}),
    );
    send_text(&mut socket, init.to_string()).await;
    next_json(&mut socket).await;
    send_text(
        &mut socket,
        acp::request(1, "session/new", json!({"cwd": "/tmp", "mcpServers": []})).to_string(),
    )
    .await;
    let created = next_json_matching(&mut socket, |m| m["id"] == json!(1)).await;
    let session = created["result"]["sessionId"]
        .as_str()
        .expect("sessionId")
        .to_owned();
    let before = v2_api_tests::procfs::rss_bytes(server.pid()).expect("server RSS");
    send_text(
        &mut socket,
        acp::request(
            2,
            "session/prompt",
            acp::prompt_params(&session, "!emit 4000 10000"),
        )
        .to_string(),
    )
    .await;
    // Never read; give the agent time to write everything.
    tokio::time::sleep(std::time::Duration::from_secs(4)).await;
    let after = v2_api_tests::procfs::rss_bytes(server.pid()).expect("server RSS");
    assert!(
        after < before + 16 * 1024 * 1024,
        "server RSS grew from {before} to {after} bytes for a client that never reads"
    );
    server.api().health().await.assert_status(200);
    drop(socket);
}

/// Runs `tests/v2_api/fixtures/acp_sdk_client.mjs`: the official TypeScript
/// SDK `@agentclientprotocol/sdk` (pinned in `tests/npm/package.json`,
/// installed unchanged by `npm install --prefix tests/npm`) over `transport`
/// (`http` or `ws`) against `/acp/mock`; asserts what it saw.
async fn typescript_sdk_flow(transport: &str) {
    let server = TestServer::start(&[]).await;
    let modules = workspace_root().join("tests/npm/node_modules");
    assert!(
        modules
            .join("@agentclientprotocol/sdk/package.json")
            .is_file(),
        "@agentclientprotocol/sdk not found under {}: install it with `npm install --prefix tests/npm` (.ci/run does)",
        modules.display()
    );
    let endpoint = match transport {
        "ws" => format!("ws://{}/acp/mock", server.api().addr()),
        _ => format!("{}/acp/mock", server.api().base_url()),
    };
    let script = workspace_root().join("tests/v2_api/fixtures/acp_sdk_client.mjs");
    let mut command = tokio::process::Command::new("node");
    // Node 20 has its WebSocket (the SDK's ws-client needs one) behind a flag.
    command
        .arg("--experimental-websocket")
        .arg(&script)
        .arg(&modules)
        .arg(transport)
        .arg(&endpoint)
        .kill_on_drop(true);
    let output = tokio::time::timeout(REQUEST_TIMEOUT, command.output())
        .await
        .expect("the TypeScript SDK flow within the bound")
        .expect("run node");
    assert!(
        output.status.success(),
        "the TypeScript SDK flow over {transport} failed:\n{}\n{}\nserver log:\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
        server.stderr_text()
    );
    let seen: Value = serde_json::from_slice(&output.stdout).expect("one JSON line");
    assert_eq!(seen["agent"], "sandbox-agent-mock", "{seen}");
    assert_eq!(
        seen["streamed"], "Hello from the mock agent. You said: over the sdk",
        "{seen}"
    );
    assert_eq!(seen["granted"], "Permission granted.", "{seen}");
    assert_eq!(seen["permissions"], json!(["allow-once"]), "{seen}");
    assert_eq!(
        seen["parallel"],
        json!(["chunk-1 chunk-2 chunk-3 ", "chunk-1 chunk-2 chunk-3 "]),
        "{seen}"
    );
    assert_ne!(seen["sessions"][0], seen["sessions"][1], "{seen}");
}

/// The TypeScript SDK's `experimental/http-client` (Streamable HTTP).
#[tokio::test]
async fn typescript_sdk_over_streamable_http() {
    typescript_sdk_flow("http").await;
}

/// The TypeScript SDK's `experimental/ws-client` (WebSocket).
#[tokio::test]
async fn typescript_sdk_over_websocket() {
    typescript_sdk_flow("ws").await;
}

/// Telling HTTP/1.1 from HTTP/2 waits for the first bytes; a peer that
/// connects and stays silent, or stops inside the HTTP/2 preface, still
/// loses its connection after `--read-timeout-ms`, so it cannot hold the
/// HTTP connection slots.
#[tokio::test]
async fn silent_peers_are_dropped_after_the_read_timeout() {
    use tokio::io::AsyncWriteExt;
    let server =
        TestServer::start(&["--max-http-connections", "2", "--read-timeout-ms", "300"]).await;
    let addr = server.api().addr().to_owned();
    let silent = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    let mut half = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    half.write_all(b"PRI * HTTP/2.0\r\n")
        .await
        .expect("half a preface");
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    server.api().health().await.assert_status(200);
    drop((silent, half));
}

/// A WebSocket peer that answers no ping (it never reads) is given up:
/// the server closes with 1001 after two heartbeat intervals of silence.
#[tokio::test]
async fn websocket_keep_alive_gives_up_on_a_silent_peer() {
    let server = TestServer::start(&["--heartbeat-ms", "200"]).await;
    let (mut socket, _) = raw_socket(&server, "").await;
    // Not reading means not answering pings.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert_eq!(close_code(&mut socket).await, Some(1001));
}

/// A browser client of `/acp` may send the profile's headers and read
/// `Acp-Connection-Id` (CORS, as on `/v2/rpc`).
#[tokio::test]
async fn cors_allows_and_exposes_the_acp_headers() {
    const ORIGIN: &str = "http://app.example";
    let server = TestServer::start(&["--cors-allow-origin", ORIGIN]).await;
    let api = server.api();
    let reply = Api::send(
        api.http()
            .request(Method::OPTIONS, api.url("/acp/mock"))
            .header("origin", ORIGIN)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "acp-connection-id, acp-session-id",
            ),
    )
    .await;
    reply.assert_status(204);
    let names = |value: Option<&str>| -> Vec<String> {
        value
            .unwrap_or_default()
            .split(',')
            .map(|name| name.trim().to_ascii_lowercase())
            .collect()
    };
    let allowed = names(reply.header("access-control-allow-headers"));
    for name in [ACP_CONNECTION, ACP_SESSION] {
        assert!(
            allowed.iter().any(|a| a == name),
            "{name} not allowed: {reply:?}"
        );
    }
    let init = acp::request(
        0,
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {}}),
    );
    let reply = Api::send(
        acp_post(&api, "/acp/mock", None, None)
            .header("origin", ORIGIN)
            .body(init.to_string()),
    )
    .await;
    reply.assert_status(200);
    let exposed = names(reply.header("access-control-expose-headers"));
    assert!(exposed.iter().any(|e| e == ACP_CONNECTION), "{reply:?}");
}
