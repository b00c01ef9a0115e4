//! The process API (research/contract.md, "Processes and terminals"):
//! `/v2/processes…` over real HTTP against the real binary, with real
//! processes, real pseudo-terminals and real process trees in `/proc`.

use futures::StreamExt;
use reqwest::Method;
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use v2_api_tests::agents::TempDir;
use v2_api_tests::procfs;
use v2_api_tests::{Api, Reply, TestServer, assert_problem};

/// Bound for a process to reach a state the test waits for.
const WAIT: Duration = Duration::from_secs(20);

async fn post_json(api: &Api, path: &str, body: &Value) -> Reply {
    Api::send(api.request(Method::POST, path).json(body)).await
}

/// `POST /v2/processes/{id}/signal` `{signal}`.
async fn signal(api: &Api, id: &str, name: &str) -> Reply {
    post_json(
        api,
        &format!("/v2/processes/{id}/signal"),
        &json!({"signal": name}),
    )
    .await
}

/// `POST /v2/processes/{id}/input`, raw `body` (`query`: `?eof=true` or
/// empty).
async fn input(api: &Api, id: &str, query: &str, body: impl Into<reqwest::Body>) -> Reply {
    Api::send(
        api.request(Method::POST, &format!("/v2/processes/{id}/input{query}"))
            .body(body),
    )
    .await
}

/// `DELETE /v2/processes/{id}`.
async fn forget(api: &Api, id: &str) -> Reply {
    Api::send(api.request(Method::DELETE, &format!("/v2/processes/{id}"))).await
}

/// Starts a process and returns its description (201 checked).
async fn start(api: &Api, body: &Value) -> Value {
    let reply = post_json(api, "/v2/processes", body).await;
    reply.assert_status(201);
    let process = reply.json();
    assert_eq!(
        reply.header("location"),
        Some(format!("/v2/processes/{}", process["id"].as_str().unwrap_or("")).as_str())
    );
    process
}

async fn run(api: &Api, body: &Value) -> Value {
    let reply = post_json(api, "/v2/processes/run", body).await;
    reply.assert_status(200);
    reply.json()
}

/// Waits until the process exited and returns its description.
async fn exited(api: &Api, id: &str) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let process = api.get_json(&format!("/v2/processes/{id}")).await;
        if process["state"] == "exited" {
            return process;
        }
        assert!(
            Instant::now() < deadline,
            "process {id} still runs: {process}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every output byte of a process from `offset` on, read page by page.
async fn all_output(api: &Api, id: &str) -> Vec<u8> {
    let mut offset = 0u64;
    let mut bytes = Vec::new();
    loop {
        let page = api
            .get_json(&format!("/v2/processes/{id}/output?offset={offset}"))
            .await;
        assert_eq!(page["dropped"], 0, "{page}");
        let chunks = page["chunks"].as_array().cloned().unwrap_or_default();
        if chunks.is_empty() {
            return bytes;
        }
        for chunk in &chunks {
            assert_eq!(chunk["offset"], offset);
            let data = chunk_bytes(chunk);
            offset += data.len() as u64;
            bytes.extend(data);
        }
        assert_eq!(page["nextOffset"], offset);
    }
}

fn chunk_bytes(chunk: &Value) -> Vec<u8> {
    use base64::Engine as _;
    let data = chunk["data"].as_str().unwrap_or_default();
    match chunk["encoding"].as_str() {
        Some("base64") => base64::engine::general_purpose::STANDARD
            .decode(data)
            .unwrap_or_default(),
        _ => data.as_bytes().to_vec(),
    }
}

/// One SSE event of a followed output.
#[derive(Debug, Clone)]
struct Event {
    name: String,
    id: Option<u64>,
    data: Value,
}

/// A followed output: `GET …/output` with `Accept: text/event-stream`.
struct Follow {
    stream: futures::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    buffer: Vec<u8>,
}

impl Follow {
    async fn open(api: &Api, id: &str, last_event_id: Option<u64>) -> Follow {
        let mut request = api
            .request(Method::GET, &format!("/v2/processes/{id}/output"))
            .header("accept", "text/event-stream");
        if let Some(last) = last_event_id {
            request = request.header("last-event-id", last.to_string());
        }
        let response = request.send().await.expect("open the output stream");
        assert_eq!(response.status(), 200);
        assert_eq!(
            response
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok()),
            Some("text/event-stream")
        );
        Follow {
            stream: response.bytes_stream().boxed(),
            buffer: Vec::new(),
        }
    }

    /// The next event (comments skipped); `None` when the stream ended.
    async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(end) = self.buffer.windows(2).position(|w| w == b"\n\n") {
                let block: Vec<u8> = self.buffer.drain(..end + 2).collect();
                let text = String::from_utf8(block).expect("SSE is UTF-8");
                let mut event = Event {
                    name: "message".to_owned(),
                    id: None,
                    data: Value::Null,
                };
                let mut any = false;
                for line in text.lines() {
                    if let Some(name) = line.strip_prefix("event: ") {
                        event.name = name.to_owned();
                        any = true;
                    } else if let Some(id) = line.strip_prefix("id: ") {
                        event.id = Some(id.parse().expect("numeric id"));
                    } else if let Some(data) = line.strip_prefix("data: ") {
                        event.data = serde_json::from_str(data).expect("JSON data");
                        any = true;
                    }
                }
                if any {
                    return Some(event);
                }
                continue;
            }
            let chunk = tokio::time::timeout(WAIT, self.stream.next())
                .await
                .expect("an event within the wait")?;
            self.buffer.extend_from_slice(&chunk.ok()?);
        }
    }
}

fn new_marker() -> String {
    format!("{}", 100_000 + fastrand::u32(0..800_000))
}

/// Pids whose command line is exactly `sleep <marker>`.
fn sleepers(marker: &str) -> Vec<u32> {
    let wanted = format!("sleep {marker}");
    std::fs::read_dir("/proc")
        .map(|dir| {
            dir.filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
                .filter(|pid| procfs::cmdline(*pid) == wanted)
                .collect()
        })
        .unwrap_or_default()
}

async fn until_no_sleepers(marker: &str, after: &str) {
    let deadline = Instant::now() + WAIT;
    while !sleepers(marker).is_empty() {
        assert!(
            Instant::now() < deadline,
            "sleep {marker} outlived its process ({after}): {:?}",
            sleepers(marker)
                .into_iter()
                .map(|pid| (pid, procfs::stat(pid)))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn until_sleeper(marker: &str) {
    let deadline = Instant::now() + WAIT;
    while sleepers(marker).is_empty() {
        assert!(Instant::now() < deadline, "sleep {marker} never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A process whose `setsid` grandchild `sleep <marker>` left its process
/// group and session.
fn with_escapee(marker: &str) -> Value {
    json!({
        "command": "sh",
        "args": ["-c", format!("setsid sleep {marker} </dev/null >/dev/null 2>&1 & echo ready; wait")],
    })
}

#[tokio::test]
async fn run_returns_exit_code_and_separate_streams() {
    let server = TestServer::start(&[]).await;
    let result = run(
        &server,
        &json!({"command": "sh", "args": ["-c", "printf out; printf err >&2; exit 3"]}),
    )
    .await;
    assert_eq!(result["exitCode"], 3);
    assert_eq!(result["signal"], Value::Null);
    assert_eq!(result["stdout"], "out");
    assert_eq!(result["stderr"], "err");
    assert_eq!(result["truncated"], false);
    assert!(result["durationMs"].as_u64().is_some());

    // stdin is written and closed; env and cwd apply.
    let dir = TempDir::new("process-run");
    let result = run(
        &server,
        &json!({
            "command": "sh",
            "args": ["-c", "cat; printf \" $GREETING \"; pwd"],
            "stdin": "from stdin",
            "env": {"GREETING": "hello"},
            "cwd": dir.path().to_string_lossy(),
        }),
    )
    .await;
    let real = dir.path().canonicalize().expect("temp dir");
    assert_eq!(
        result["stdout"],
        format!("from stdin hello {}\n", real.display())
    );
    // A run is forgotten once it returned.
    let list = server.get_json("/v2/processes").await;
    assert_eq!(list["processes"], json!([]));
}

#[tokio::test]
async fn run_kills_at_the_timeout_and_at_the_output_cap() {
    let server = TestServer::start(&[]).await;
    let marker = new_marker();
    let started = Instant::now();
    let result = run(
        &server,
        &json!({
            "command": "sh",
            "args": ["-c", format!("setsid sleep {marker} & sleep {marker}")],
            "timeoutMs": 300,
        }),
    )
    .await;
    assert_eq!(result["signal"], "SIGKILL", "{result}");
    assert_eq!(result["exitCode"], Value::Null);
    assert_eq!(result["timedOut"], true);
    assert!(started.elapsed() < Duration::from_secs(10));
    until_no_sleepers(&marker, "run timeout").await;

    // A client that goes away before the answer takes its run with it.
    let abandoned = new_marker();
    let gone = server
        .request(Method::POST, "/v2/processes/run")
        .json(&json!({"command": "sh", "args": ["-c", format!("setsid sleep {abandoned} & wait")]}))
        .timeout(Duration::from_millis(1500))
        .send()
        .await;
    assert!(gone.is_err(), "the run never answers: {gone:?}");
    until_no_sleepers(&abandoned, "the client went away").await;
    assert_eq!(
        server.get_json("/v2/processes").await["processes"],
        json!([])
    );

    let result = run(
        &server,
        &json!({"command": "sh", "args": ["-c", "yes"], "maxOutputBytes": 10000}),
    )
    .await;
    assert_eq!(result["truncated"], true, "{result}");
    assert_eq!(result["signal"], "SIGKILL");
    assert_eq!(result["stdout"].as_str().map(str::len), Some(10000));
}

#[tokio::test]
async fn bad_starts_are_clear_problems() {
    let root = TempDir::new("process-root");
    let root_arg = root.path().to_string_lossy().into_owned();
    let server = TestServer::start(&["--fs-root", &root_arg]).await;
    let reply = post_json(
        &server,
        "/v2/processes",
        &json!({"command": "no-such-program-xyz"}),
    )
    .await;
    let problem = assert_problem(&reply, 400, "program-not-found");
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("no-such-program-xyz")),
        "{problem}"
    );
    let reply = post_json(
        &server,
        "/v2/processes/run",
        &json!({"command": "./missing"}),
    )
    .await;
    assert_problem(&reply, 400, "program-not-found");
    let reply = post_json(
        &server,
        "/v2/processes",
        &json!({"command": "true", "cwd": "/"}),
    )
    .await;
    assert_problem(&reply, 403, "outside-root");
    let reply = post_json(
        &server,
        "/v2/processes",
        &json!({"command": "true", "cwd": "../x"}),
    )
    .await;
    assert_eq!(reply.status.as_u16(), 400, "{reply:?}");
    let reply = post_json(&server, "/v2/processes", &json!({"cmd": "true"})).await;
    assert_problem(&reply, 400, "invalid-request");
    let reply = post_json(
        &server,
        "/v2/processes",
        &json!({"command": "true", "env": {"A=B": "c"}}),
    )
    .await;
    assert_problem(&reply, 400, "invalid-request");
    let reply = Api::send(
        server
            .request(Method::POST, "/v2/processes")
            .body("{\"command\":\"true\"}"),
    )
    .await;
    assert_problem(&reply, 415, "unsupported-media-type");
    // Without a cwd, a confined server starts in its root.
    let result = run(&server, &json!({"command": "pwd"})).await;
    let real = root.path().canonicalize().expect("root");
    assert_eq!(result["stdout"], format!("{}\n", real.display()));
    let reply = server.get("/v2/processes/nope").await;
    assert_problem(&reply, 404, "unknown-process");
    let reply = forget(&server, "nope").await;
    assert_problem(&reply, 404, "unknown-process");
}

#[tokio::test]
async fn output_is_followed_and_resumed_exactly_once_under_load() {
    let server = TestServer::start(&["--process-output-bytes", "16000000"]).await;
    let count = 300_000;
    let process = start(
        &server,
        &json!({"command": "seq", "args": ["1", count.to_string()]}),
    )
    .await;
    let id = process["id"].as_str().expect("id").to_owned();
    let mut expected = String::new();
    for n in 1..=count {
        expected.push_str(&n.to_string());
        expected.push('\n');
    }
    let mut got = Vec::new();
    let mut last: Option<u64> = None;
    let mut cuts = 0;
    let exit;
    'streams: loop {
        let mut follow = Follow::open(&server, &id, last).await;
        let mut events = 0;
        while let Some(event) = follow.next().await {
            match event.name.as_str() {
                "message" => {
                    assert_eq!(event.data["offset"].as_u64(), Some(last.unwrap_or(0)));
                    let bytes = chunk_bytes(&event.data);
                    got.extend_from_slice(&bytes);
                    assert_eq!(event.id, Some(last.unwrap_or(0) + bytes.len() as u64));
                    last = event.id;
                    events += 1;
                    // Cut the stream mid-way, a few times.
                    if cuts < 5 && events == 3 {
                        cuts += 1;
                        continue 'streams;
                    }
                }
                "exit" => {
                    exit = Some(event.data);
                    break 'streams;
                }
                other => panic!("unexpected event {other}: {event:?}"),
            }
        }
        panic!("the stream ended without an exit event");
    }
    assert_eq!(cuts, 5, "the output was too short to cut five times");
    assert_eq!(got.len(), expected.len());
    assert!(got == expected.as_bytes(), "the bytes differ");
    assert_eq!(exit, Some(json!({"exitCode": 0, "signal": null})));
    // After the exit, a resume from the end gets the exit at once.
    let mut follow = Follow::open(&server, &id, last).await;
    let event = follow.next().await.expect("exit");
    assert_eq!(event.name, "exit");
    assert!(follow.next().await.is_none(), "the stream ends after exit");
    // The pages say the same.
    assert!(all_output(&server, &id).await == expected.as_bytes());
    let info = exited(&server, &id).await;
    assert_eq!(info["outputBytes"], expected.len());
    assert_eq!(info["exitCode"], 0);
}

#[tokio::test]
async fn output_past_the_ring_is_reported_dropped_and_memory_stays_flat() {
    let server = TestServer::start(&["--process-output-bytes", "65536"]).await;
    let before = procfs::rss_bytes(server.pid()).expect("server RSS");
    // 256 MiB through a 64 KiB ring, with a follower that never reads.
    let process = start(
        &server,
        &json!({"command": "sh", "args": ["-c", "head -c 268435456 /dev/zero | tr '\\0' x"]}),
    )
    .await;
    let id = process["id"].as_str().expect("id").to_owned();
    let idle = server
        .request(Method::GET, &format!("/v2/processes/{id}/output"))
        .header("accept", "text/event-stream")
        .send()
        .await
        .expect("an idle follower");
    let info = exited(&server, &id).await;
    assert_eq!(info["outputBytes"], 268_435_456u64);
    let after = procfs::rss_bytes(server.pid()).expect("server RSS");
    assert!(
        after < before + 24 * 1024 * 1024,
        "server RSS grew from {before} to {after}"
    );
    drop(idle);
    let page = server
        .get_json(&format!("/v2/processes/{id}/output?offset=0"))
        .await;
    let retained = 268_435_456u64 - page["dropped"].as_u64().expect("dropped");
    assert!(retained <= 65536, "{retained} retained");
    assert_eq!(page["chunks"][0]["offset"], page["dropped"]);
    // A follower from 0 gets the marker first, with an id to resume from.
    let mut follow = Follow::open(&server, &id, Some(0)).await;
    let event = follow.next().await.expect("dropped marker");
    assert_eq!(event.name, "dropped");
    assert_eq!(event.data["offset"], 0);
    assert_eq!(event.data["dropped"], page["dropped"]);
    assert_eq!(event.id, page["dropped"].as_u64());
}

#[tokio::test]
async fn pages_carry_offsets_and_base64_for_bytes_that_are_not_text() {
    let server = TestServer::start(&[]).await;
    let process = start(
        &server,
        &json!({"command": "sh", "args": ["-c", "printf 'abcdef'; printf '\\377\\000' >&2"]}),
    )
    .await;
    let id = process["id"].as_str().expect("id").to_owned();
    exited(&server, &id).await;
    let page = server
        .get_json(&format!("/v2/processes/{id}/output?offset=2&limit=3"))
        .await;
    assert_eq!(
        page["chunks"],
        json!([{"offset": 2, "stream": "stdout", "data": "cde"}])
    );
    assert_eq!(page["nextOffset"], 5);
    let page = server
        .get_json(&format!("/v2/processes/{id}/output?offset=6"))
        .await;
    assert_eq!(
        page["chunks"],
        json!([{"offset": 6, "stream": "stderr", "data": "/wA=", "encoding": "base64"}])
    );
    let reply = server
        .get(&format!("/v2/processes/{id}/output?offset=x"))
        .await;
    assert_problem(&reply, 400, "invalid-request");
}

#[tokio::test]
async fn stdin_signals_and_resize() {
    let server = TestServer::start(&[]).await;
    let cat = start(&server, &json!({"command": "cat"})).await;
    let id = cat["id"].as_str().expect("id").to_owned();
    assert!(cat["pid"].as_i64().is_some_and(|pid| pid > 0), "{cat}");
    // The pid is the program's: once its supervisor's fork has run `exec`
    // (the 201 may come first on a loaded machine), /proc shows `cat`.
    let pid = u32::try_from(cat["pid"].as_i64().unwrap_or(0)).unwrap_or(0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while procfs::cmdline(pid) != "cat" && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(procfs::cmdline(pid), "cat");
    let reply = input(&server, &id, "", "line one\n").await;
    reply.assert_status(204);
    let reply = input(&server, &id, "?eof=true", "line two\n").await;
    reply.assert_status(204);
    let info = exited(&server, &id).await;
    assert_eq!(info["exitCode"], 0);
    assert_eq!(all_output(&server, &id).await, b"line one\nline two\n");
    let reply = input(&server, &id, "", "late").await;
    assert_problem(&reply, 409, "process-exited");
    let reply = signal(&server, &id, "SIGTERM").await;
    assert_problem(&reply, 409, "process-exited");

    let sleeper = start(&server, &json!({"command": "sleep", "args": ["300"]})).await;
    let id = sleeper["id"].as_str().expect("id").to_owned();
    let reply = signal(&server, &id, "SIGNOPE").await;
    assert_problem(&reply, 400, "invalid-request");
    let reply = post_json(
        &server,
        &format!("/v2/processes/{id}/resize"),
        &json!({"cols": 100, "rows": 30}),
    )
    .await;
    assert_problem(&reply, 409, "not-a-tty");
    let reply = signal(&server, &id, "TERM").await;
    reply.assert_status(204);
    let info = exited(&server, &id).await;
    assert_eq!(info["signal"], "SIGTERM");
    assert_eq!(info["exitCode"], Value::Null);
    assert!(info["endedAt"].as_str().is_some());
}

#[tokio::test]
async fn a_terminal_runs_a_shell_at_its_size() {
    let server = TestServer::start(&[]).await;
    let shell = start(
        &server,
        &json!({"command": "sh", "tty": true, "cols": 91, "rows": 17, "title": "a shell"}),
    )
    .await;
    assert_eq!(shell["tty"], true);
    assert_eq!(shell["title"], "a shell");
    let id = shell["id"].as_str().expect("id").to_owned();
    input(&server, &id, "", "stty size; tty\n")
        .await
        .assert_status(204);
    // The shell answers before the terminal changes size.
    let deadline = Instant::now() + WAIT;
    while !String::from_utf8_lossy(&all_output(&server, &id).await).contains("/dev/pts/") {
        assert!(Instant::now() < deadline, "the shell never answered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let reply = post_json(
        &server,
        &format!("/v2/processes/{id}/resize"),
        &json!({"cols": 120, "rows": 40}),
    )
    .await;
    reply.assert_status(204);
    input(&server, &id, "", "stty size; exit 7\n")
        .await
        .assert_status(204);
    let info = exited(&server, &id).await;
    assert_eq!(info["exitCode"], 7);
    let text = String::from_utf8_lossy(&all_output(&server, &id).await).into_owned();
    assert!(text.contains("17 91\r\n"), "{text:?}");
    assert!(text.contains("/dev/pts/"), "{text:?}");
    assert!(text.contains("40 120\r\n"), "{text:?}");
    let page = server.get_json(&format!("/v2/processes/{id}/output")).await;
    assert_eq!(page["chunks"][0]["stream"], "tty");
    let reply = post_json(
        &server,
        "/v2/processes",
        &json!({"command": "sh", "cols": 10}),
    )
    .await;
    assert_problem(&reply, 400, "invalid-request");
}

#[tokio::test]
async fn a_tree_dies_on_delete_and_on_sigkill() {
    let server = TestServer::start(&[]).await;
    for how in ["delete", "sigkill"] {
        let marker = new_marker();
        let process = start(&server, &with_escapee(&marker)).await;
        let id = process["id"].as_str().expect("id").to_owned();
        until_sleeper(&marker).await;
        if how == "delete" {
            let reply = forget(&server, &id).await;
            reply.assert_status(204);
            assert_problem(
                &server.get(&format!("/v2/processes/{id}")).await,
                404,
                "unknown-process",
            );
        } else {
            let reply = signal(&server, &id, "SIGKILL").await;
            reply.assert_status(204);
            let info = exited(&server, &id).await;
            assert_eq!(info["signal"], "SIGKILL");
        }
        until_no_sleepers(&marker, how).await;
    }
}

#[tokio::test]
async fn no_process_outlives_the_server() {
    for how in ["shutdown", "kill -9"] {
        let mut server = TestServer::start(&[]).await;
        let marker = new_marker();
        start(&server, &with_escapee(&marker)).await;
        let shell = start(
            &server,
            &json!({"command": "sh", "args": ["-c", format!("setsid sleep {marker}; :")], "tty": true}),
        )
        .await;
        assert_eq!(shell["tty"], true);
        let deadline = Instant::now() + WAIT;
        while sleepers(&marker).len() < 2 {
            assert!(Instant::now() < deadline, "both sleepers never started");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if how == "shutdown" {
            server.send_sigterm();
            assert!(server.wait_exit(WAIT).await.is_some(), "the server stopped");
        } else {
            assert!(server.kill_now(WAIT).await.is_some(), "the server died");
        }
        until_no_sleepers(&marker, how).await;
    }
}

#[tokio::test]
async fn list_pages_newest_first_with_filters() {
    let server = TestServer::start(&[]).await;
    let mut ids = Vec::new();
    for n in 0..5 {
        let process = start(
            &server,
            &json!({"command": "sleep", "args": [if n % 2 == 0 { "300" } else { "0" }], "sessionId": null}),
        )
        .await;
        ids.push(process["id"].as_str().expect("id").to_owned());
    }
    for id in ids.iter().skip(1).step_by(2) {
        exited(&server, id).await;
    }
    let mut seen = Vec::new();
    let mut path = "/v2/processes?limit=2".to_owned();
    loop {
        let page = server.get_json(&path).await;
        let processes = page["processes"].as_array().cloned().unwrap_or_default();
        assert!(processes.len() <= 2);
        seen.extend(
            processes
                .iter()
                .map(|p| p["id"].as_str().unwrap_or("").to_owned()),
        );
        match page["nextCursor"].as_str() {
            Some(cursor) => path = format!("/v2/processes?limit=2&cursor={cursor}"),
            None => break,
        }
    }
    let newest_first: Vec<String> = ids.iter().rev().cloned().collect();
    assert_eq!(seen, newest_first);
    let running = server.get_json("/v2/processes?state=running").await;
    let running: Vec<&str> = running["processes"]
        .as_array()
        .map(|all| all.iter().filter_map(|p| p["id"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(running, [ids[4].as_str(), ids[2].as_str(), ids[0].as_str()]);
    for query in ["limit=0", "limit=x", "state=done", "cursor=zz"] {
        let reply = server.get(&format!("/v2/processes?{query}")).await;
        assert_problem(&reply, 400, "invalid-request");
    }
}

#[tokio::test]
async fn max_processes_is_a_429_and_exited_ones_free_the_slot() {
    let server = TestServer::start(&["--max-processes", "1"]).await;
    let first = start(&server, &json!({"command": "sleep", "args": ["300"]})).await;
    let reply = post_json(&server, "/v2/processes", &json!({"command": "true"})).await;
    assert_problem(&reply, 429, "too-many-processes");
    let reply = post_json(&server, "/v2/processes/run", &json!({"command": "true"})).await;
    assert_problem(&reply, 429, "too-many-processes");
    let id = first["id"].as_str().expect("id");
    forget(&server, id).await.assert_status(204);
    let deadline = Instant::now() + WAIT;
    loop {
        let reply = post_json(&server, "/v2/processes/run", &json!({"command": "true"})).await;
        if reply.status.as_u16() == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the slot never came back: {reply:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn the_environment_holds_no_runtime_secret() {
    let dir = TempDir::new("process-secrets");
    let store = format!("sqlite:{}", dir.path().join("s.db").display());
    let server = TestServer::start_with_env(
        &[],
        &[
            ("SANDBOX_AGENT_TOKEN", "very-secret-token"),
            ("SANDBOX_AGENT_STORE", &store),
            // The collector's credentials (research/contract.md, "Traces").
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "authorization=Basic b3RlbC1zZWNyZXQ=",
            ),
            (
                "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
                "x-api-key=otel-traces-secret",
            ),
        ],
    )
    .await;
    let result = run(&server, &json!({"command": "env"})).await;
    let env = result["stdout"].as_str().expect("env output");
    assert!(env.contains("PATH="), "{env}");
    assert!(!env.contains("very-secret-token"), "{env}");
    assert!(!env.contains("SANDBOX_AGENT_STORE"), "{env}");
    assert!(!env.contains("OTEL_EXPORTER_OTLP_HEADERS"), "{env}");
    assert!(!env.contains("otel-traces-secret"), "{env}");
}

#[tokio::test]
async fn every_route_needs_the_token_and_no_processes_turns_them_off() {
    let server = TestServer::start(&["--token", "tok"]).await;
    let process = start(&server, &json!({"command": "sleep", "args": ["300"]})).await;
    let id = process["id"].as_str().expect("id").to_owned();
    let routes = [
        (Method::GET, "/v2/processes".to_owned()),
        (Method::POST, "/v2/processes".to_owned()),
        (Method::POST, "/v2/processes/run".to_owned()),
        (Method::GET, format!("/v2/processes/{id}")),
        (Method::DELETE, format!("/v2/processes/{id}")),
        (Method::GET, format!("/v2/processes/{id}/output")),
        (Method::POST, format!("/v2/processes/{id}/input")),
        (Method::POST, format!("/v2/processes/{id}/signal")),
        (Method::POST, format!("/v2/processes/{id}/resize")),
        (Method::GET, format!("/v2/processes/{id}/terminal")),
    ];
    for (method, path) in &routes {
        let reply = Api::send(
            server
                .http()
                .request(method.clone(), server.url(path))
                .json(&json!({"command": "true"})),
        )
        .await;
        assert_problem(&reply, 401, "unauthorized");
    }
    // Still running: nothing without the token reached it.
    assert_eq!(
        server.get_json(&format!("/v2/processes/{id}")).await["state"],
        "running"
    );

    let off = TestServer::start(&["--no-processes"]).await;
    for (method, path) in &routes {
        let reply = Api::send(
            off.request(method.clone(), path)
                .json(&json!({"command": "true"})),
        )
        .await;
        assert_problem(&reply, 404, "processes-disabled");
    }
}

#[tokio::test]
async fn exited_processes_are_kept_within_their_count_and_bytes() {
    let server = TestServer::start(&[
        "--kept-processes",
        "2",
        "--process-output-bytes",
        "20000000",
    ])
    .await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        let process = start(&server, &json!({"command": "true"})).await;
        let id = process["id"].as_str().expect("id").to_owned();
        exited(&server, &id).await;
        ids.push(id);
    }
    assert_problem(
        &server.get(&format!("/v2/processes/{}", ids[0])).await,
        404,
        "unknown-process",
    );
    exited(&server, &ids[1]).await;
    exited(&server, &ids[2]).await;

    // 64 MiB of retained output, together: the fourth 17 MB process
    // pushes the oldest out.
    let server = TestServer::start(&["--process-output-bytes", "20000000"]).await;
    let mut ids = Vec::new();
    for _ in 0..4 {
        let process = start(
            &server,
            &json!({"command": "head", "args": ["-c", "17000000", "/dev/zero"]}),
        )
        .await;
        let id = process["id"].as_str().expect("id").to_owned();
        exited(&server, &id).await;
        ids.push(id);
    }
    assert_problem(
        &server.get(&format!("/v2/processes/{}", ids[0])).await,
        404,
        "unknown-process",
    );
    for id in &ids[1..] {
        assert_eq!(exited(&server, id).await["outputBytes"], 17_000_000);
    }
}

/// Pipes the server holds open (`/proc/<pid>/fd` links to `pipe:`).
fn open_pipes(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| {
            dir.filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
                .filter(|target| target.to_string_lossy().starts_with("pipe:"))
                .count()
        })
        .unwrap_or(0)
}

#[tokio::test]
async fn a_kill_right_after_the_start_still_takes_the_whole_tree() {
    let server = TestServer::start(&["--max-processes", "4"]).await;
    let marker = new_marker();
    let program = json!({
        "command": "sh",
        "args": ["-c", format!("setsid sleep {marker} & sleep {marker}")],
    });
    for tty in [false, true] {
        for _ in 0..10 {
            let mut body = program.clone();
            body["tty"] = json!(tty);
            let process = start(&server, &body).await;
            let id = process["id"].as_str().expect("id");
            let reply = forget(&server, id).await;
            reply.assert_status(204);
        }
    }
    for timeout in [0, 1, 2, 5, 10] {
        let mut body = program.clone();
        body["timeoutMs"] = json!(timeout);
        let result = run(&server, &body).await;
        assert_eq!(result["signal"], "SIGKILL", "{result}");
    }
    until_no_sleepers(&marker, "kills right after starts").await;
    // Every slot is free again: four starts at once fit.
    for _ in 0..4 {
        start(&server, &json!({"command": "sleep", "args": ["300"]})).await;
    }
}

#[tokio::test]
async fn a_program_that_kills_its_supervisor_takes_its_group_with_it() {
    let server = TestServer::start(&[]).await;
    let marker = new_marker();
    let process = start(
        &server,
        &json!({"command": "sh", "args": ["-c", format!("sleep {marker} & kill -9 $PPID; sleep {marker}")]}),
    )
    .await;
    let id = process["id"].as_str().expect("id");
    exited(&server, id).await;
    until_no_sleepers(&marker, "the supervisor was killed").await;
}

#[tokio::test]
async fn stdin_bodies_stream_and_exited_processes_hold_no_pipes() {
    let server = TestServer::start(&[]).await;
    let sleeper = start(&server, &json!({"command": "sleep", "args": ["300"]})).await;
    let id = sleeper["id"].as_str().expect("id").to_owned();
    let before = procfs::rss_bytes(server.pid()).expect("server RSS");
    // Twenty 16 MiB bodies for a process that never reads.
    let body = vec![b'x'; 16 * 1024 * 1024];
    let mut writers = Vec::new();
    for _ in 0..20 {
        let request = server
            .request(Method::POST, &format!("/v2/processes/{id}/input"))
            .body(body.clone());
        writers.push(tokio::spawn(async move { Api::send(request).await }));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let during = procfs::rss_bytes(server.pid()).expect("server RSS");
    assert!(
        during < before + 48 * 1024 * 1024,
        "20 unread stdin bodies took RSS from {before} to {during}"
    );
    forget(&server, &id).await.assert_status(204);
    for writer in writers {
        let reply = writer.await.expect("writer");
        assert!(
            [409, 404].contains(&reply.status.as_u16()),
            "a write to a forgotten process: {reply:?}"
        );
    }

    let pipes = open_pipes(server.pid());
    for _ in 0..5 {
        let process = start(&server, &json!({"command": "true"})).await;
        exited(&server, process["id"].as_str().expect("id")).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        open_pipes(server.pid()),
        pipes,
        "exited processes keep pipes open"
    );
}

#[tokio::test]
async fn a_signal_to_a_terminal_reaches_its_foreground_job() {
    let server = TestServer::start(&[]).await;
    let marker = new_marker();
    let shell = start(
        &server,
        &json!({"command": "sh", "args": ["-i"], "tty": true}),
    )
    .await;
    let id = shell["id"].as_str().expect("id").to_owned();
    input(&server, &id, "", format!("sleep {marker}\n"))
        .await
        .assert_status(204);
    until_sleeper(&marker).await;
    let reply = signal(&server, &id, "int").await;
    reply.assert_status(204);
    until_no_sleepers(&marker, "SIGINT to the terminal").await;
    assert_eq!(
        server.get_json(&format!("/v2/processes/{id}")).await["state"],
        "running",
        "the shell itself stays"
    );
}

#[tokio::test]
async fn limits_of_the_system_and_of_parsing_are_400s() {
    let server = TestServer::start(&[]).await;
    let huge = "x".repeat(200 * 1024);
    let reply = post_json(
        &server,
        "/v2/processes/run",
        &json!({"command": "true", "args": [huge]}),
    )
    .await;
    assert_problem(&reply, 400, "invalid-request");
    let process = start(&server, &json!({"command": "true"})).await;
    let id = process["id"].as_str().expect("id");
    let reply = server
        .get(&format!("/v2/processes/{id}/output?offset=%2B1"))
        .await;
    assert_problem(&reply, 400, "invalid-request");
}

/// `memoryUsedBytes` of `GET /v2/health`.
async fn memory_used(api: &Api) -> u64 {
    api.get_json("/v2/health").await["memoryUsedBytes"]
        .as_u64()
        .expect("memoryUsedBytes")
}

/// What a process record may hold is bounded (research/contract.md,
/// "Process trees, bounds, shutdown"): `title` 1 KiB, `command`, `args`
/// and `env` 64 KiB together, `sessionId` 1 KiB, 400 past each (checked
/// before the session is looked up); one list
/// page stops at 4 MiB of JSON with a cursor to the rest; and the records
/// are charged to the memory budget while they are kept.
#[tokio::test]
async fn process_records_are_bounded_and_counted_in_the_memory_budget() {
    let server = TestServer::start(&[]).await;
    let api = server.api();
    for (body, member) in [
        (
            json!({"command": "true", "title": "t".repeat(1025)}),
            "title",
        ),
        (
            json!({"command": "true", "args": ["a".repeat(40_000), "b".repeat(30_000)]}),
            "args",
        ),
        (
            json!({"command": "true", "env": {"BIG": "v".repeat(70_000)}}),
            "env",
        ),
        (
            json!({"command": "true", "sessionId": "s".repeat(1025)}),
            "sessionId",
        ),
    ] {
        for path in ["/v2/processes", "/v2/processes/run"] {
            let reply = post_json(&api, path, &body).await;
            let problem = assert_problem(&reply, 400, "invalid-request");
            assert!(
                problem["detail"]
                    .as_str()
                    .is_some_and(|d| d.contains(member)),
                "{path} {member}: {problem}"
            );
        }
    }
    let page = api.get_json("/v2/processes").await;
    assert_eq!(page["processes"], json!([]), "nothing refused was kept");

    // Records at the bounds: each about 62 KiB of strings.
    let before = memory_used(&api).await;
    let args: Vec<String> = (0..30)
        .map(|n| format!("{n:02}{}", "x".repeat(2_000)))
        .collect();
    let mut started = Vec::new();
    for _ in 0..40 {
        let process = start(
            &api,
            &json!({"command": "true", "args": args, "title": "t".repeat(1024)}),
        )
        .await;
        started.push(process["id"].as_str().expect("id").to_owned());
    }
    let charged = memory_used(&api).await - before;
    assert!(
        charged >= 40 * 61_000,
        "40 records of ~62 KiB are in the budget: {charged} bytes charged"
    );

    // One page stays under 4 MiB; the cursor reaches every process once.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &cursor {
            Some(cursor) => format!("/v2/processes?limit=1000&cursor={cursor}"),
            None => "/v2/processes?limit=1000".to_owned(),
        };
        let reply = api.get(&path).await;
        reply.assert_status(200);
        assert!(
            reply.body.len() <= 4 << 20,
            "a page of {} bytes",
            reply.body.len()
        );
        let page = reply.json();
        let processes = page["processes"].as_array().expect("processes");
        assert!(!processes.is_empty(), "{page}");
        seen.extend(
            processes
                .iter()
                .map(|p| p["id"].as_str().unwrap_or("").to_owned()),
        );
        pages += 1;
        match page["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    assert!(pages > 1, "40 records of ~62 KiB do not fit one 4 MiB page");
    seen.sort();
    started.sort();
    assert_eq!(seen, started);

    // Forgotten, they leave the budget.
    for id in &started {
        forget(&api, id).await.assert_status(204);
    }
    let deadline = Instant::now() + WAIT;
    loop {
        let after = memory_used(&api).await;
        if after <= before {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "released: {before} before, {after} after"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A program that stops its own supervisor (`kill -STOP $PPID`: same user)
/// does not make its tree unkillable: DELETE ends it and frees its slot
/// under `--max-processes`, and a run's `timeoutMs` still answers
/// (research/contract.md, "Process trees, bounds, shutdown").
#[tokio::test]
async fn a_stopped_supervisor_does_not_keep_its_tree_or_its_slot() {
    let server = TestServer::start(&["--max-processes", "1"]).await;
    let api = server.api();
    let marker = new_marker();
    let body = json!({
        "command": "sh",
        "args": ["-c", format!("kill -STOP $PPID; exec sleep {marker}")],
    });
    let process = start(&api, &body).await;
    let id = process["id"].as_str().expect("id").to_owned();
    until_sleeper(&marker).await;
    let started = Instant::now();
    forget(&api, &id).await.assert_status(204);
    until_no_sleepers(&marker, "DELETE of a tree whose supervisor was stopped").await;
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    // The slot is free again.
    let next = run(&api, &json!({"command": "true"})).await;
    assert_eq!(next["exitCode"], 0, "{next}");

    // A run whose program stops its supervisor still times out.
    let marker = new_marker();
    let started = Instant::now();
    let body = json!({
        "command": "sh",
        "args": ["-c", format!("kill -STOP $PPID; exec sleep {marker}")],
        "timeoutMs": 500,
    });
    let reply = Api::send_within(
        api.request(Method::POST, "/v2/processes/run").json(&body),
        WAIT,
    )
    .await;
    reply.assert_status(200);
    assert_eq!(reply.json()["timedOut"], true, "{:?}", reply.json());
    assert!(started.elapsed() < Duration::from_secs(10));
    until_no_sleepers(&marker, "a run past its timeout").await;
}
