//! Traces over OTLP (research/contract.md, "Traces"): the real server
//! exports its spans to a real OTLP/HTTP receiver started here (POST
//! `/v1/traces`, protobuf bodies decoded with the official definitions,
//! `opentelemetry-proto`). A client's `traceparent` header (on `POST
//! /v2/rpc` and on `POST /acp`) continues its trace through the HTTP and
//! ACP request spans to one `invoke_agent` span
//! per prompt turn (token usage when the agent reports it), with
//! `execute_tool` and permission-wait children; the
//! mock agent reports the `_meta.traceparent` it got, which belongs to the
//! same trace; SIGTERM flushes the batch. Without the variables (or with
//! `OTEL_TRACES_EXPORTER=none`) nothing is sent.

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use v2_api_tests::acp::{self, permission_answer, prompt_params};
use v2_api_tests::{Api, EVENT_TIMEOUT, MOCK, SHUTDOWN_GRACE, SseStream, TestServer};

/// One export the receiver got.
struct Export {
    /// The request line's path.
    path: String,
    /// The `content-type` header.
    content_type: String,
    /// The body, decoded.
    request: ExportTraceServiceRequest,
}

/// An OTLP/HTTP receiver on a loopback port: answers every POST with an
/// empty `ExportTraceServiceResponse` and keeps what it decoded.
struct Receiver {
    addr: SocketAddr,
    exports: Arc<Mutex<Vec<Export>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Receiver {
    async fn start() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local address");
        let exports = Arc::new(Mutex::new(Vec::new()));
        let sink = exports.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, sink.clone()));
            }
        });
        Receiver {
            addr,
            exports,
            task,
        }
    }

    fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far, in arrival order, with its resource's
    /// `service.name`.
    fn spans(&self) -> Vec<(String, Span)> {
        let exports = self.exports.lock().expect("exports");
        let mut spans = Vec::new();
        for export in exports.iter() {
            for resource in &export.request.resource_spans {
                let service = resource
                    .resource
                    .as_ref()
                    .and_then(|r| {
                        r.attributes
                            .iter()
                            .find(|kv| kv.key == "service.name")
                            .and_then(|kv| kv.value.as_ref()?.value.clone())
                    })
                    .map(|value| match value {
                        AnyValue::StringValue(name) => name,
                        other => format!("{other:?}"),
                    })
                    .unwrap_or_default();
                for scope in &resource.scope_spans {
                    for span in &scope.spans {
                        spans.push((service.clone(), span.clone()));
                    }
                }
            }
        }
        spans
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves one HTTP/1.1 connection: requests with a `content-length` body,
/// kept alive until the client closes.
async fn serve(mut stream: TcpStream, sink: Arc<Mutex<Vec<Export>>>) {
    let mut buffer = Vec::new();
    loop {
        let head_end = loop {
            if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            match stream.read_buf(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        };
        let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
        let header = |name: &str| {
            head.lines().skip(1).find_map(|line| {
                let (key, value) = line.split_once(':')?;
                key.trim()
                    .eq_ignore_ascii_case(name)
                    .then(|| value.trim().to_owned())
            })
        };
        let length: usize = header("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        while buffer.len() < head_end + length {
            match stream.read_buf(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
        let body: Vec<u8> = buffer.drain(..head_end + length).skip(head_end).collect();
        let path = head
            .lines()
            .next()
            .and_then(|line| line.split(' ').nth(1))
            .unwrap_or_default()
            .to_owned();
        let request = ExportTraceServiceRequest::decode(body.as_slice())
            .unwrap_or_else(|error| panic!("not an OTLP trace export ({path}): {error}"));
        sink.lock().expect("exports").push(Export {
            path,
            content_type: header("content-type").unwrap_or_default(),
            request,
        });
        let answer =
            "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
        if stream.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// Lower-case hex of `bytes`.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A span's attribute as OTLP typed it.
fn attr_value(span: &Span, key: &str) -> Option<AnyValue> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)?
        .value
        .as_ref()?
        .value
        .clone()
}

/// A span's attribute as text (strings as they are, integers in decimal).
fn attr(span: &Span, key: &str) -> Option<String> {
    let value = attr_value(span, key)?;
    Some(match value {
        AnyValue::StringValue(text) => text,
        AnyValue::IntValue(n) => n.to_string(),
        AnyValue::BoolValue(b) => b.to_string(),
        other => format!("{other:?}"),
    })
}

/// `session/prompt` over `POST /v2/rpc` with the client's `traceparent`.
async fn traced_prompt(
    api: &Api,
    conn: &str,
    session: &str,
    id: i64,
    text: &str,
    tp: &str,
) -> Value {
    let request = acp::request(id, "session/prompt", prompt_params(session, text));
    let reply = Api::send(
        api.rpc_post(Some(conn))
            .header("traceparent", tp)
            .body(request.to_string()),
    )
    .await;
    reply.assert_status(200);
    reply.json()
}

/// The chain of span ids from `span` up through its parents among `spans`;
/// the last entry is the first parent id not among them.
fn ancestry(span: &Span, by_id: &HashMap<Vec<u8>, &Span>) -> Vec<String> {
    let mut chain = Vec::new();
    let mut parent = span.parent_span_id.clone();
    while !parent.is_empty() {
        chain.push(hex(&parent));
        match by_id.get(&parent) {
            Some(next) => parent = next.parent_span_id.clone(),
            None => break,
        }
    }
    chain
}

#[tokio::test]
async fn spans_continue_the_clients_trace_and_reach_the_agent() {
    let receiver = Receiver::start().await;
    let endpoint = receiver.endpoint();
    let mut server = TestServer::start_with_env(
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            // Long enough that the last spans are still in the batch at
            // SIGTERM: the flush on shutdown is what sends them.
            ("OTEL_BSP_SCHEDULE_DELAY", "60000"),
        ],
    )
    .await;
    let trace_id = format!("{:032x}", fastrand::u128(1..));
    let client_span = format!("{:016x}", fastrand::u64(1..));
    let traceparent = format!("00-{trace_id}-{client_span}-01");

    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let api = server.api();

    // Turn 1: a tool call (mock: "tool").
    let answer = traced_prompt(&api, &conn, &session, 10, "use the tool", &traceparent).await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");

    // Turn 2: a permission wait, answered by the client over the stream.
    let mut stream = server.open_stream(&conn, None).await;
    let (c, s, tp) = (conn.clone(), session.clone(), traceparent.clone());
    let turn_api = server.api();
    let turn = tokio::spawn(async move {
        traced_prompt(&turn_api, &c, &s, 11, "may I have permission?", &tp).await
    });
    let request = stream
        .next_event_matching(
            |e| e.method() == Some("session/request_permission"),
            EVENT_TIMEOUT,
        )
        .await;
    server
        .post(
            Some(&conn),
            &permission_answer(request.data["id"].clone(), "allow-once"),
        )
        .await
        .assert_accepted_empty();
    let answer = v2_api_tests::join_within(turn, EVENT_TIMEOUT).await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");

    // Turn 3: the mock says which `_meta.traceparent` it got.
    let answer = traced_prompt(&api, &conn, &session, 12, "echo traceparent", &traceparent).await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let echoed = stream
        .next_event_matching(
            |e| {
                e.agent_text()
                    .is_some_and(|t| t.starts_with("traceparent: "))
            },
            EVENT_TIMEOUT,
        )
        .await;
    let echoed = echoed
        .agent_text()
        .and_then(|t| t.strip_prefix("traceparent: "))
        .expect("the echoed traceparent")
        .to_owned();
    drop(stream);

    // Turn 4: the agent reports its token usage.
    let answer = traced_prompt(&api, &conn, &session, 13, "!usage 12 34", &traceparent).await;
    assert_eq!(answer["result"]["usage"]["inputTokens"], 12, "{answer}");

    // SIGTERM: the batch (held back by the long delay) goes out before exit.
    server.send_sigterm();
    let status = server
        .wait_exit(SHUTDOWN_GRACE)
        .await
        .expect("the server exits on SIGTERM");
    assert!(status.success(), "{status:?}");

    let exports = receiver.exports.lock().expect("exports").len();
    assert!(exports > 0, "nothing was exported");
    for export in receiver.exports.lock().expect("exports").iter() {
        assert_eq!(export.path, "/v1/traces");
        assert_eq!(export.content_type, "application/x-protobuf");
    }
    let spans = receiver.spans();
    assert!(
        spans.iter().all(|(service, _)| service == "sandbox-agent"),
        "service.name defaults to sandbox-agent"
    );
    let spans: Vec<Span> = spans.into_iter().map(|(_, span)| span).collect();
    let by_id: HashMap<Vec<u8>, &Span> = spans.iter().map(|s| (s.span_id.clone(), s)).collect();
    let described = || {
        spans
            .iter()
            .map(|s| {
                format!(
                    "{} {} <- {}",
                    s.name,
                    hex(&s.span_id),
                    hex(&s.parent_span_id)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    };

    // One invoke_agent per turn, in the client's trace, under its span.
    let turns: Vec<&Span> = spans
        .iter()
        .filter(|s| attr(s, "gen_ai.operation.name").as_deref() == Some("invoke_agent"))
        .collect();
    assert_eq!(
        turns.len(),
        4,
        "one invoke_agent per turn:\n{}",
        described()
    );
    for span in &turns {
        assert_eq!(hex(&span.trace_id), trace_id, "{}", described());
        assert_eq!(span.name, "invoke_agent mock");
        assert_eq!(span.kind, SpanKind::Client as i32);
        assert_eq!(attr(span, "gen_ai.agent.name").as_deref(), Some(MOCK));
        assert_eq!(
            attr(span, "gen_ai.conversation.id").as_deref(),
            Some(session.as_str())
        );
        assert_eq!(attr(span, "acp.stop_reason").as_deref(), Some("end_turn"));
        let chain = ancestry(span, &by_id);
        assert_eq!(
            chain.last(),
            Some(&client_span),
            "the chain reaches the client's span:\n{}",
            described()
        );
        // invoke_agent <- the ACP request <- the HTTP request <- the client.
        let rpc = by_id[&span.parent_span_id];
        assert_eq!(attr(rpc, "rpc.method").as_deref(), Some("session/prompt"));
        assert_eq!(
            attr(rpc, "acp.connection.id").as_deref(),
            Some(conn.as_str())
        );
        assert_eq!(
            attr(rpc, "acp.session.id").as_deref(),
            Some(session.as_str())
        );
        let http = by_id[&rpc.parent_span_id];
        assert_eq!(http.name, "POST /v2/rpc");
        assert_eq!(http.kind, SpanKind::Server as i32);
        assert_eq!(attr(http, "http.request.method").as_deref(), Some("POST"));
        assert_eq!(attr(http, "http.route").as_deref(), Some("/v2/rpc"));
        assert_eq!(
            attr(http, "http.response.status_code").as_deref(),
            Some("200")
        );
        assert_eq!(hex(&http.parent_span_id), client_span);
    }
    let (tool_turn, permission_turn, echo_turn, usage_turn) =
        (turns[0], turns[1], turns[2], turns[3]);
    // Integers, as OpenTelemetry's GenAI conventions type them.
    assert_eq!(
        attr_value(usage_turn, "gen_ai.usage.input_tokens"),
        Some(AnyValue::IntValue(12))
    );
    assert_eq!(
        attr_value(usage_turn, "gen_ai.usage.output_tokens"),
        Some(AnyValue::IntValue(34))
    );
    assert_eq!(
        attr(tool_turn, "gen_ai.usage.input_tokens"),
        None,
        "no usage reported"
    );
    // Spans end in order, so the batch lists the turns in turn order;
    // check by their children rather than trust that.
    let children = |parent: &Span| -> Vec<&Span> {
        spans
            .iter()
            .filter(|s| s.parent_span_id == parent.span_id)
            .collect()
    };

    // The tool call of turn 1: an execute_tool child, completed.
    let tools = children(tool_turn);
    assert_eq!(tools.len(), 1, "{}", described());
    let tool = tools[0];
    assert_eq!(tool.name, "execute_tool Reading the mock file");
    assert_eq!(
        attr(tool, "gen_ai.operation.name").as_deref(),
        Some("execute_tool")
    );
    assert_eq!(
        attr(tool, "gen_ai.tool.call.id").as_deref(),
        Some("mock-tool-1")
    );
    assert_eq!(
        attr(tool, "gen_ai.tool.name").as_deref(),
        Some("Reading the mock file")
    );
    assert_eq!(
        attr(tool, "acp.tool_call.status").as_deref(),
        Some("completed")
    );
    assert!(tool.start_time_unix_nano >= tool_turn.start_time_unix_nano);
    assert!(tool.end_time_unix_nano <= tool_turn.end_time_unix_nano);

    // Turn 2: the tool call waits for permission, a child of its span.
    let tools = children(permission_turn);
    assert_eq!(tools.len(), 1, "{}", described());
    let tool = tools[0];
    assert_eq!(tool.name, "execute_tool Write to mock.txt");
    assert_eq!(
        attr(tool, "acp.tool_call.status").as_deref(),
        Some("completed")
    );
    let waits = children(tool);
    assert_eq!(waits.len(), 1, "{}", described());
    assert_eq!(waits[0].name, "session/request_permission");
    assert_eq!(
        attr(waits[0], "gen_ai.tool.call.id").as_deref(),
        Some("mock-tool-1")
    );

    // Turn 3: the agent got a traceparent of this trace, naming the turn.
    assert!(children(echo_turn).is_empty(), "{}", described());
    assert_eq!(
        echoed,
        format!("00-{trace_id}-{}-01", hex(&echo_turn.span_id)),
        "the mock agent's _meta.traceparent"
    );
}

#[tokio::test]
async fn nothing_is_sent_when_traces_are_off() {
    let receiver = Receiver::start().await;
    let endpoint = receiver.endpoint();
    let mut server = TestServer::start_with_env(
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_TRACES_EXPORTER", "none"),
            ("OTEL_BSP_SCHEDULE_DELAY", "10"),
        ],
    )
    .await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let answer = traced_prompt(
        &server.api(),
        &conn,
        &session,
        5,
        "echo traceparent",
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    )
    .await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    // The agent gets no trace context of the runtime's either.
    let events = server.all_events(&session).await;
    assert!(
        events
            .iter()
            .any(|e| e.to_string().contains("traceparent: none")),
        "{events:?}"
    );
    server.send_sigterm();
    server
        .wait_exit(SHUTDOWN_GRACE)
        .await
        .expect("the server exits on SIGTERM");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(receiver.exports.lock().expect("exports").len(), 0);
}

/// `/acp` (research/contract.md, "The /acp profile"): a `POST /acp`
/// answered 202 at once still carries the client's trace to the turn it
/// starts, and the agent gets a traceparent of that trace.
#[tokio::test]
async fn a_post_to_acp_continues_the_trace_too() {
    let receiver = Receiver::start().await;
    let endpoint = receiver.endpoint();
    let mut server = TestServer::start_with_env(
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_SERVICE_NAME", "sandbox-agent-acp"),
        ],
    )
    .await;
    let trace_id = format!("{:032x}", fastrand::u128(1..));
    let client_span = format!("{:016x}", fastrand::u64(1..));
    let traceparent = format!("00-{trace_id}-{client_span}-01");
    let api = server.api();
    let post = |conn: Option<&str>, session: Option<&str>, message: &Value| {
        let mut builder = api
            .request(
                reqwest::Method::POST,
                if conn.is_some() { "/acp" } else { "/acp/mock" },
            )
            .header("content-type", "application/json")
            .header("traceparent", traceparent.as_str())
            .body(message.to_string());
        if let Some(conn) = conn {
            builder = builder.header("acp-connection-id", conn);
        }
        if let Some(session) = session {
            builder = builder.header("acp-session-id", session);
        }
        Api::send(builder)
    };
    let init = acp::request(
        0,
        "initialize",
        json!({"protocolVersion": 1, "clientCapabilities": {}}),
    );
    let reply = post(None, None, &init).await;
    reply.assert_status(200);
    let conn = reply
        .header("acp-connection-id")
        .expect("acp-connection-id")
        .to_owned();
    let stream = |session: Option<&str>| {
        let mut builder = api
            .request(reqwest::Method::GET, "/acp")
            .header("accept", "text/event-stream")
            .header("acp-connection-id", conn.as_str());
        if let Some(session) = session {
            builder = builder.header("acp-session-id", session);
        }
        builder
    };
    let mut connection_stream = SseStream::new(Api::response_head(stream(None)).await);
    let new = acp::request(1, "session/new", json!({"cwd": "/tmp", "mcpServers": []}));
    post(Some(&conn), None, &new).await.assert_status(202);
    let answer = connection_stream
        .next_event_matching(|e| e.is_response_to(&json!(1)), EVENT_TIMEOUT)
        .await;
    let session = answer.data["result"]["sessionId"]
        .as_str()
        .expect("sessionId")
        .to_owned();
    let mut session_stream = SseStream::new(Api::response_head(stream(Some(&session))).await);
    let prompt = acp::request(
        2,
        "session/prompt",
        prompt_params(&session, "echo traceparent"),
    );
    post(Some(&conn), Some(&session), &prompt)
        .await
        .assert_status(202);
    let events = session_stream
        .collect_until(|e| e.is_response_to(&json!(2)), EVENT_TIMEOUT)
        .await;
    let echoed = events
        .iter()
        .find_map(|e| e.agent_text()?.strip_prefix("traceparent: "))
        .expect("the echoed traceparent")
        .to_owned();
    drop((connection_stream, session_stream));

    server.send_sigterm();
    server
        .wait_exit(SHUTDOWN_GRACE)
        .await
        .expect("the server exits on SIGTERM");
    let spans = receiver.spans();
    assert!(
        spans
            .iter()
            .all(|(service, _)| service == "sandbox-agent-acp")
    );
    let spans: Vec<Span> = spans.into_iter().map(|(_, span)| span).collect();
    let by_id: HashMap<Vec<u8>, &Span> = spans.iter().map(|s| (s.span_id.clone(), s)).collect();
    let turns: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name == "invoke_agent mock")
        .collect();
    assert_eq!(turns.len(), 1);
    let turn = turns[0];
    assert_eq!(hex(&turn.trace_id), trace_id);
    assert_eq!(ancestry(turn, &by_id).last(), Some(&client_span));
    let rpc = by_id[&turn.parent_span_id];
    assert_eq!(attr(rpc, "rpc.method").as_deref(), Some("session/prompt"));
    let http = by_id[&rpc.parent_span_id];
    assert_eq!(http.name, "POST /acp");
    assert_eq!(
        attr(http, "http.response.status_code").as_deref(),
        Some("202")
    );
    assert_eq!(echoed, format!("00-{trace_id}-{}-01", hex(&turn.span_id)));
}

/// Bounds and validation (research/contract.md, "Traces"): a `traceparent`
/// that is not of the W3C format starts a trace of its own (its ids are not
/// zero-padded into one), and a long unknown method and session id come out
/// as a span named `other` with attributes of at most 256 bytes.
#[tokio::test]
async fn a_malformed_traceparent_starts_a_trace_and_long_strings_are_capped() {
    let receiver = Receiver::start().await;
    let endpoint = receiver.endpoint();
    let mut server =
        TestServer::start_with_env(&[], &[("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str())])
            .await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let api = server.api();
    let answer = traced_prompt(&api, &conn, &session, 5, "hello", "00-0af7-b7ad-01").await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let long = "m".repeat(1 << 20);
    let request = acp::request(
        6,
        &format!("_vendor/{long}"),
        json!({"sessionId": long.as_str()}),
    );
    // Answered somehow (the agent does not know the method): only the span
    // matters here.
    let _ = Api::send(api.rpc_post(Some(&conn)).body(request.to_string())).await;

    server.send_sigterm();
    server
        .wait_exit(SHUTDOWN_GRACE)
        .await
        .expect("the server exits on SIGTERM");
    let spans: Vec<Span> = receiver.spans().into_iter().map(|(_, s)| s).collect();
    let by_id: HashMap<Vec<u8>, &Span> = spans.iter().map(|s| (s.span_id.clone(), s)).collect();
    let turn = spans
        .iter()
        .find(|s| s.name == "invoke_agent mock")
        .expect("the turn's span");
    assert_ne!(hex(&turn.trace_id), "00000000000000000000000000000af7");
    let rpc = by_id[&turn.parent_span_id];
    let http = by_id[&rpc.parent_span_id];
    assert_eq!(http.name, "POST /v2/rpc");
    assert!(http.parent_span_id.is_empty(), "a trace of its own");

    let other = spans
        .iter()
        .find(|s| attr(s, "rpc.method").is_some_and(|m| m.starts_with("_vendor/")))
        .expect("the long method's span");
    assert_eq!(other.name, "other");
    let method = attr(other, "rpc.method").unwrap_or_default();
    assert!(method.len() <= 256 && method.ends_with('…'), "{method}");
    let session_id = attr(other, "acp.session.id").unwrap_or_default();
    assert!(
        session_id.len() <= 256 && session_id.starts_with("mmm"),
        "{session_id}"
    );
}
