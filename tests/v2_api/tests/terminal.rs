//! `GET /v2/processes/{id}/terminal` (research/contract.md, "Terminal
//! WebSocket"), black box: a real shell on a real pseudo-terminal behind
//! the real binary, driven over a real WebSocket (tokio-tungstenite).

use futures::{SinkExt, StreamExt};
use reqwest::Method;
use serde_json::{Value, json};
use std::time::Duration;
use tokio_tungstenite::connect_async;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use v2_api_tests::api::{Api, Reply};
use v2_api_tests::{REQUEST_TIMEOUT, TestServer};

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Bound on waiting for one piece of output.
const OUTPUT_TIMEOUT: Duration = Duration::from_secs(20);

/// `POST /v2/processes` with `body`; the process id.
async fn start(api: &Api, body: Value) -> String {
    let reply = Api::send(api.request(Method::POST, "/v2/processes").json(&body)).await;
    reply.assert_status(201);
    reply.json()["id"]
        .as_str()
        .expect("a process id")
        .to_owned()
}

/// Opens `/v2/processes/{id}/terminal{query}` with the api's token.
async fn open(api: &Api, id: &str, query: &str) -> Socket {
    let url = format!("ws://{}/v2/processes/{id}/terminal{query}", api.addr());
    let mut request = url.into_client_request().expect("a client request");
    if let Some(token) = api.token() {
        request.headers_mut().insert(
            "authorization",
            format!("Bearer {token}").parse().expect("header"),
        );
    }
    let (socket, response) = tokio::time::timeout(REQUEST_TIMEOUT, connect_async(request))
        .await
        .expect("upgrade within the bound")
        .expect("WebSocket upgrade");
    assert_eq!(response.status(), 101);
    socket
}

/// The status of a refused upgrade of `url`.
async fn refused(url: String) -> u16 {
    match connect_async(url).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => response.status().as_u16(),
        other => panic!("the upgrade must be refused: {other:?}"),
    }
}

/// What a client read from a terminal socket.
#[derive(Debug, Default)]
struct Seen {
    /// Every binary byte, in order.
    bytes: Vec<u8>,
    /// Every text frame, parsed.
    notices: Vec<Value>,
    /// The close frame's code, once closed.
    close: Option<CloseCode>,
}

impl Seen {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }
}

/// Reads frames into `seen` until `done(seen)` or the socket ends.
async fn read_until(socket: &mut Socket, seen: &mut Seen, done: impl Fn(&Seen) -> bool) {
    let read = async {
        while !done(seen) {
            match socket.next().await {
                Some(Ok(Message::Binary(bytes))) => seen.bytes.extend_from_slice(&bytes),
                Some(Ok(Message::Text(text))) => {
                    seen.notices
                        .push(serde_json::from_str(&text).expect("JSON text frame"));
                }
                Some(Ok(Message::Close(frame))) => {
                    seen.close = frame.map(|frame| frame.code);
                }
                Some(Ok(_)) => {}
                None | Some(Err(_)) => break,
            }
        }
    };
    if tokio::time::timeout(OUTPUT_TIMEOUT, read).await.is_err() {
        panic!("timed out; seen so far: {seen:?} ({:?})", seen.text());
    }
}

/// Reads until the socket ends.
async fn read_to_end(socket: &mut Socket) -> Seen {
    let mut seen = Seen::default();
    read_until(socket, &mut seen, |_| false).await;
    seen
}

async fn send_bytes(socket: &mut Socket, bytes: &[u8]) {
    socket
        .send(Message::binary(bytes.to_vec()))
        .await
        .expect("send a binary frame");
}

async fn send_text(socket: &mut Socket, value: &Value) {
    socket
        .send(Message::text(value.to_string()))
        .await
        .expect("send a text frame");
}

/// Waits until the process wrote `bytes` bytes of output.
async fn wait_for_output(api: &Api, id: &str, bytes: u64) {
    for _ in 0..200 {
        if api.get_json(&format!("/v2/processes/{id}")).await["outputBytes"]
            .as_u64()
            .is_some_and(|n| n >= bytes)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("process {id} never wrote {bytes} bytes");
}

/// Waits until the process exited.
async fn wait_exited(api: &Api, id: &str, within: Duration) -> Value {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let process = api.get_json(&format!("/v2/processes/{id}")).await;
        if process["state"] == "exited" {
            return process;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "process {id} still runs: {process}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A shell on a terminal: a typed command's output comes back, a resize
/// text frame changes what `stty size` says, and `exit 7` ends with the
/// exit frame and a normal close.
#[tokio::test]
async fn a_shell_over_the_websocket() {
    let server = TestServer::start(&[]).await;
    let api = server.api();
    // `sh` reads no rc file (this machine's ~/.bashrc hangs).
    let id = start(
        &api,
        json!({"command": "sh", "tty": true, "cols": 80, "rows": 24}),
    )
    .await;
    let mut socket = open(&api, &id, "").await;
    let mut seen = Seen::default();
    send_bytes(&mut socket, b"echo hi-$((6*7))\n").await;
    read_until(&mut socket, &mut seen, |seen| seen.text().contains("hi-42")).await;
    send_text(
        &mut socket,
        &json!({"type": "resize", "cols": 100, "rows": 30}),
    )
    .await;
    send_bytes(&mut socket, b"stty size\n").await;
    read_until(&mut socket, &mut seen, |seen| {
        seen.text().contains("30 100")
    })
    .await;
    assert_eq!(
        api.get_json(&format!("/v2/processes/{id}")).await["tty"],
        true
    );
    send_bytes(&mut socket, b"exit 7\n").await;
    read_until(&mut socket, &mut seen, |seen| seen.close.is_some()).await;
    assert_eq!(
        seen.notices.last(),
        Some(&json!({"type": "exit", "exitCode": 7, "signal": null})),
        "{seen:?}"
    );
    assert_eq!(seen.close, Some(CloseCode::Normal));
}

/// A second client that connects later gets the retained output first,
/// then live output; `?offset=` starts where it says; after a DELETE the
/// exit frame names the signal.
#[tokio::test]
async fn retained_output_first_then_live_and_offset() {
    let server = TestServer::start(&[]).await;
    let api = server.api();
    let id = start(
        &api,
        json!({"command": "sh", "args": ["-c", "printf abcdef; read line; printf \"got:$line\"; sleep 100"], "tty": true}),
    )
    .await;
    wait_for_output(&api, &id, 6).await;
    let mut first = open(&api, &id, "").await;
    let mut late = open(&api, &id, "?offset=3").await;
    let mut seen_first = Seen::default();
    let mut seen_late = Seen::default();
    read_until(&mut first, &mut seen_first, |seen| seen.bytes.len() >= 6).await;
    assert_eq!(seen_first.text(), "abcdef");
    read_until(&mut late, &mut seen_late, |seen| seen.bytes.len() >= 3).await;
    assert_eq!(seen_late.text(), "def");
    send_bytes(&mut late, b"xyz\n").await;
    for (socket, seen) in [(&mut first, &mut seen_first), (&mut late, &mut seen_late)] {
        read_until(socket, seen, |seen| seen.text().contains("got:xyz")).await;
    }
    // The terminal echoed the line: both saw the same bytes from their offsets.
    assert_eq!(seen_first.text()[3..], seen_late.text());
    let reply = Api::send(api.request(Method::DELETE, &format!("/v2/processes/{id}"))).await;
    reply.assert_status(204);
    for socket in [&mut first, &mut late] {
        let seen = read_to_end(socket).await;
        assert_eq!(
            seen.notices.last(),
            Some(&json!({"type": "exit", "exitCode": null, "signal": "SIGKILL"})),
            "{seen:?}"
        );
        assert_eq!(seen.close, Some(CloseCode::Normal));
    }
}

/// An exited process's terminal still serves its output, then the exit
/// frame; bytes the ring no longer holds are reported in a `dropped`
/// frame, never skipped silently.
#[tokio::test]
async fn an_exited_process_and_the_dropped_frame() {
    let server = TestServer::start(&["--process-output-bytes", "65536"]).await;
    let api = server.api();
    let id = start(
        &api,
        json!({"command": "sh", "args": ["-c", "head -c 300000 /dev/zero | tr '\\0' a; printf END"]}),
    )
    .await;
    wait_exited(&api, &id, OUTPUT_TIMEOUT).await;
    let mut socket = open(&api, &id, "").await;
    let seen = read_to_end(&mut socket).await;
    let dropped = &seen.notices[0];
    assert_eq!(dropped["type"], "dropped", "{seen:?}");
    let lost = dropped["dropped"].as_u64().expect("dropped bytes");
    assert_eq!(dropped["offset"], 0);
    assert_eq!(dropped["nextOffset"], lost);
    assert_eq!(lost + seen.bytes.len() as u64, 300_003);
    assert!(seen.bytes.len() <= 65536, "at most the ring");
    assert!(seen.text().ends_with("aaaEND"));
    assert_eq!(
        seen.notices.last(),
        Some(&json!({"type": "exit", "exitCode": 0, "signal": null}))
    );
    assert_eq!(seen.close, Some(CloseCode::Normal));
}

/// A process without a terminal works too: stdout and stderr arrive as
/// binary frames, binary frames go to stdin, `{"type":"eof"}` closes it;
/// a resize is refused with an error frame (409 `not-a-tty`) and the socket
/// stays open.
#[tokio::test]
async fn a_process_without_a_terminal() {
    let server = TestServer::start(&[]).await;
    let api = server.api();
    let id = start(
        &api,
        json!({"command": "sh", "args": ["-c", "echo out; echo err >&2; cat; echo done"]}),
    )
    .await;
    let mut socket = open(&api, &id, "").await;
    let mut seen = Seen::default();
    read_until(&mut socket, &mut seen, |seen| {
        seen.text().contains("out\n") && seen.text().contains("err\n")
    })
    .await;
    send_text(
        &mut socket,
        &json!({"type": "resize", "cols": 100, "rows": 30}),
    )
    .await;
    read_until(&mut socket, &mut seen, |seen| !seen.notices.is_empty()).await;
    let error = &seen.notices[0];
    assert_eq!(error["type"], "error", "{seen:?}");
    assert_eq!(error["problem"]["status"], 409);
    assert_eq!(
        error["problem"]["type"],
        "urn:sandbox-agent:error:not-a-tty"
    );
    send_bytes(&mut socket, b"typed\n").await;
    read_until(&mut socket, &mut seen, |seen| {
        seen.text().contains("typed\n")
    })
    .await;
    send_text(&mut socket, &json!({"type": "eof"})).await;
    read_until(&mut socket, &mut seen, |seen| seen.close.is_some()).await;
    assert!(seen.text().ends_with("typed\ndone\n"), "{:?}", seen.text());
    assert_eq!(
        seen.notices.last(),
        Some(&json!({"type": "exit", "exitCode": 0, "signal": null}))
    );
}

/// A text frame that is not one of the two control shapes, member for
/// member, closes the socket with 1003 and a reason naming what is
/// accepted; a resize whose side is an integer out of 1–4096 with 1007
/// (research/contract.md, "Terminal WebSocket"). The process lives on.
#[tokio::test]
async fn an_unknown_text_frame_closes_the_socket() {
    let server = TestServer::start(&[]).await;
    let api = server.api();
    let id = start(
        &api,
        json!({"command": "sleep", "args": ["100"], "tty": true}),
    )
    .await;
    for (frame, code) in [
        ("ls\n", CloseCode::Unsupported),
        (r#"{"type":"eof","x":1}"#, CloseCode::Unsupported),
        (r#"{"type":"eof","type":"eof"}"#, CloseCode::Unsupported),
        (
            r#"{"type":"resize","cols":80,"rows":24,"x":1}"#,
            CloseCode::Unsupported,
        ),
        (
            r#"{"type":"resize","cols":70000,"rows":24}"#,
            CloseCode::Invalid,
        ),
        (
            r#"{"type":"resize","cols":80,"rows":0}"#,
            CloseCode::Invalid,
        ),
    ] {
        let mut socket = open(&api, &id, "").await;
        socket
            .send(Message::text(frame))
            .await
            .expect("send a text frame");
        let read = async {
            loop {
                match socket.next().await {
                    Some(Ok(Message::Close(frame))) => return frame,
                    Some(Ok(_)) => {}
                    other => panic!("want a close frame, got {other:?}"),
                }
            }
        };
        let closed = tokio::time::timeout(OUTPUT_TIMEOUT, read)
            .await
            .expect("closed in time")
            .expect("a close frame with a code");
        assert_eq!(closed.code, code, "{frame}: {}", closed.reason);
        assert!(
            closed.reason.contains("resize"),
            "{frame}: {}",
            closed.reason
        );
    }
    let process = api.get_json(&format!("/v2/processes/{id}")).await;
    assert_eq!(process["state"], "running");
}

/// With a token: no token → 401 on the upgrade; `?access_token=` works (a
/// browser cannot set headers); the header and the query at once → 400.
/// Without an upgrade the route is a 400, an unknown process 404.
#[tokio::test]
async fn auth_and_refusals_on_the_upgrade() {
    let server = TestServer::start(&["--token", "s3cret"]).await;
    let api = server.api();
    let id = start(
        &api,
        json!({"command": "sh", "args": ["-c", "echo hello; sleep 100"], "tty": true}),
    )
    .await;
    let url = format!("ws://{}/v2/processes/{id}/terminal", api.addr());
    assert_eq!(refused(url.clone()).await, 401);
    assert_eq!(refused(format!("{url}?access_token=wrong")).await, 401);
    let (mut socket, _) = connect_async(format!("{url}?access_token=s3cret"))
        .await
        .expect("the query token opens the terminal");
    let mut seen = Seen::default();
    read_until(&mut socket, &mut seen, |seen| seen.text().contains("hello")).await;
    let mut both = format!("{url}?access_token=s3cret")
        .into_client_request()
        .expect("request");
    both.headers_mut()
        .insert("authorization", "Bearer s3cret".parse().expect("header"));
    match connect_async(both).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            assert_eq!(response.status(), 400);
        }
        other => panic!("two credentials must be refused: {other:?}"),
    }
    let plain: Reply =
        Api::send(api.request(Method::GET, &format!("/v2/processes/{id}/terminal"))).await;
    plain.assert_status(400);
    let unknown = format!(
        "ws://{}/v2/processes/nope/terminal?access_token=s3cret",
        api.addr()
    );
    assert_eq!(refused(unknown).await, 404);
    // The query token is good for the upgrade only.
    let reply = Api::send(
        api.http()
            .get(api.url(&format!("/v2/processes/{id}?access_token=s3cret"))),
    )
    .await;
    reply.assert_status(401);
    assert!(
        !server.stderr_text().contains("s3cret"),
        "the token is never logged"
    );
}

/// A client that never reads while the process writes 200 MB: the server
/// holds at most a frame and the socket's buffers, so its memory stays
/// flat.
#[tokio::test]
async fn a_client_that_never_reads_keeps_memory_flat() {
    let server = TestServer::start(&[]).await;
    let api = server.api();
    let id = start(
        &api,
        json!({"command": "sh", "args": ["-c", "read go; yes | head -c 200000000"]}),
    )
    .await;
    let mut socket = open(&api, &id, "").await;
    // Let the server settle after the upgrade before the baseline.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = v2_api_tests::procfs::rss_bytes(server.pid()).expect("server RSS");
    send_bytes(&mut socket, b"go\n").await;
    wait_exited(&api, &id, Duration::from_secs(60)).await;
    let after = v2_api_tests::procfs::rss_bytes(server.pid()).expect("server RSS");
    assert!(
        after < before + 16 * 1024 * 1024,
        "server RSS grew from {before} to {after} bytes for a terminal client that never reads"
    );
    let process = api.get_json(&format!("/v2/processes/{id}")).await;
    assert_eq!(process["outputBytes"], 200_000_000);
    api.health().await.assert_status(200);
    drop(socket);
}

/// The server pings every heartbeat; a client that reads (and so answers
/// the pings) stays, one that goes silent is closed with 1001
/// `keep-alive timeout`.
#[tokio::test]
async fn keep_alive_pings_and_gives_up_on_a_silent_peer() {
    let server = TestServer::start(&["--heartbeat-ms", "200"]).await;
    let api = server.api();
    let id = start(
        &api,
        json!({"command": "sleep", "args": ["100"], "tty": true}),
    )
    .await;
    let mut reading = open(&api, &id, "").await;
    let mut silent = open(&api, &id, "").await;
    let mut pings = 0;
    let listen = async {
        loop {
            match reading.next().await {
                Some(Ok(Message::Ping(_))) => pings += 1,
                Some(Ok(Message::Close(frame))) => panic!("a reading client was closed: {frame:?}"),
                Some(Ok(_)) => {}
                other => panic!("the socket ended: {other:?}"),
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_millis(1500), listen).await;
    assert!(pings >= 3, "pings every heartbeat: {pings}");
    let seen = read_to_end(&mut silent).await;
    assert_eq!(seen.close, Some(CloseCode::Away), "{seen:?}");
    let process = api.get_json(&format!("/v2/processes/{id}")).await;
    assert_eq!(
        process["state"], "running",
        "a closed socket leaves the process"
    );
}

/// Stdin the process does not read holds the socket's input back, but the
/// peer is not taken for silent meanwhile: the socket stays until the
/// process ends.
#[tokio::test]
async fn stdin_the_process_does_not_read_is_not_silence() {
    let server = TestServer::start(&["--heartbeat-ms", "200"]).await;
    let api = server.api();
    let id = start(&api, json!({"command": "sleep", "args": ["100"]})).await;
    let mut socket = open(&api, &id, "").await;
    // More than a pipe holds: the write waits for a reader that never comes.
    send_bytes(&mut socket, &vec![b'x'; 512 * 1024]).await;
    let listen = async {
        loop {
            match socket.next().await {
                Some(Ok(Message::Close(frame))) => panic!("closed while stdin waits: {frame:?}"),
                Some(Ok(_)) => {}
                other => panic!("the socket ended: {other:?}"),
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_millis(1500), listen).await;
    let reply = Api::send(api.request(Method::DELETE, &format!("/v2/processes/{id}"))).await;
    reply.assert_status(204);
    let seen = read_to_end(&mut socket).await;
    assert_eq!(seen.close, Some(CloseCode::Normal), "{seen:?}");
    assert_eq!(
        seen.notices.last().map(|n| &n["type"]),
        Some(&json!("exit"))
    );
}
