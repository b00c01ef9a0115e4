//! The process API as `_sandboxagent/process/*` extension methods on
//! `/v2/rpc` (research/contract.md, "Processes and terminals", "The
//! `_sandboxagent/process/*` methods"): the same operations and shapes as
//! the `/v2/processes…` routes, failures as JSON-RPC errors carrying the
//! route's problem (`data.type`, `data.status`), listed in the capability
//! block, and absent with `--no-processes`.

use serde_json::{Value, json};
use std::time::{Duration, Instant};
use v2_api_tests::ext::{
    INVALID_PARAMS, METHOD_NOT_FOUND, PROCESS_GET, PROCESS_INPUT, PROCESS_LIST, PROCESS_METHODS,
    PROCESS_RESIZE, PROCESS_RUN, PROCESS_SIGNAL, PROCESS_START, expect_error, expect_result,
    namespace,
};
use v2_api_tests::{Api, TestServer};

/// Prefix of every problem `type`.
const PROBLEM: &str = "urn:sandbox-agent:error:";

/// The advertised `_sandboxagent/*` methods of an `initialize` answer.
async fn advertised(api: &Api) -> Vec<String> {
    let reply = api.initialize_reply("mock").await;
    reply.assert_status(200);
    let body = reply.json();
    namespace(&body["result"]["agentCapabilities"])["extensions"]["methods"]
        .as_array()
        .unwrap_or_else(|| panic!("no methods list: {body}"))
        .iter()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect()
}

/// Asserts a JSON-RPC error carrying the problem `kind` with `status`;
/// returns its `data`.
fn expect_problem<'a>(response: &'a Value, kind: &str, status: u16) -> &'a Value {
    let error = expect_error(response, INVALID_PARAMS);
    let data = &error["data"];
    assert_eq!(data["type"], format!("{PROBLEM}{kind}"), "{response}");
    assert_eq!(data["status"], status, "{response}");
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{response}"
    );
    data
}

/// Polls `_sandboxagent/process/get` until the process exited; its entry.
async fn exited(api: &Api, conn: &str, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let answer = api
            .rpc(conn, "get", PROCESS_GET, json!({"processId": id}))
            .await;
        let info = expect_result(&answer).clone();
        if info["state"] == "exited" {
            return info;
        }
        assert!(Instant::now() < deadline, "{id} still runs: {info}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every output byte of `id` as text, from its output page (HTTP: bytes
/// stay on the routes).
async fn output_text(api: &Api, id: &str) -> String {
    let page = api.get_json(&format!("/v2/processes/{id}/output")).await;
    page["chunks"]
        .as_array()
        .unwrap_or_else(|| panic!("no chunks: {page}"))
        .iter()
        .map(|chunk| chunk["data"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test]
async fn run_start_input_get_and_list_over_rpc() {
    let server = TestServer::start(&[]).await;
    let api = server.api();
    let methods = advertised(&api).await;
    for method in PROCESS_METHODS {
        assert!(methods.iter().any(|m| m == method), "{method}: {methods:?}");
    }
    let conn = api.initialize("mock").await;

    // run: exit code, both streams, the same shape as POST /v2/processes/run.
    let answer = api
        .rpc(
            &conn,
            1,
            PROCESS_RUN,
            json!({"command": "sh", "args": ["-c", "printf out; printf err >&2; exit 3"]}),
        )
        .await;
    let run = expect_result(&answer);
    assert_eq!(run["exitCode"], 3, "{answer}");
    assert_eq!(run["signal"], Value::Null);
    assert_eq!(run["stdout"], "out");
    assert_eq!(run["stderr"], "err");
    assert_eq!(run["truncated"], false);
    assert_eq!(run["timedOut"], false);
    assert!(run["durationMs"].is_u64(), "{answer}");
    // Bytes that are not UTF-8 come as base64.
    let answer = api
        .rpc(
            &conn,
            2,
            PROCESS_RUN,
            json!({"command": "printf", "args": ["\\377"]}),
        )
        .await;
    assert_eq!(expect_result(&answer)["stdout"], "/w==", "{answer}");
    assert_eq!(expect_result(&answer)["stdoutEncoding"], "base64");
    // A run past its timeout is killed.
    let answer = api
        .rpc(
            &conn,
            3,
            PROCESS_RUN,
            json!({"command": "sleep", "args": ["30"], "timeoutMs": 100}),
        )
        .await;
    assert_eq!(expect_result(&answer)["timedOut"], true, "{answer}");
    assert_eq!(expect_result(&answer)["signal"], "SIGKILL", "{answer}");

    // start, then stdin as text and as base64 (closing it), then get.
    let answer = api
        .rpc(
            &conn,
            4,
            PROCESS_START,
            json!({"command": "cat", "title": "echo"}),
        )
        .await;
    let started = expect_result(&answer);
    let id = started["id"].as_str().unwrap_or_else(|| panic!("{answer}"));
    assert_eq!(started["state"], "running", "{answer}");
    assert_eq!(started["title"], "echo");
    assert_eq!(started["command"], "cat");
    let answer = api
        .rpc(
            &conn,
            5,
            PROCESS_INPUT,
            json!({"processId": id, "data": "hello "}),
        )
        .await;
    assert_eq!(expect_result(&answer), &json!({}), "{answer}");
    // "wörld\n" in base64.
    let answer = api
        .rpc(
            &conn,
            6,
            PROCESS_INPUT,
            json!({"processId": id, "data": "d8O2cmxkCg==", "encoding": "base64", "eof": true}),
        )
        .await;
    assert_eq!(expect_result(&answer), &json!({}), "{answer}");
    let info = exited(&api, &conn, id).await;
    assert_eq!(info["exitCode"], 0, "{info}");
    assert_eq!(info["outputBytes"], "hello wörld\n".len(), "{info}");
    assert_eq!(output_text(&api, id).await, "hello wörld\n");
    // The same entry as the route's.
    let route = api.get_json(&format!("/v2/processes/{id}")).await;
    assert_eq!(route, info);

    // list: pages of one, newest first, the state filter.
    let mut sleepers = Vec::new();
    for n in 0..2 {
        let answer = api
            .rpc(
                &conn,
                10 + n,
                PROCESS_START,
                json!({"command": "sleep", "args": ["30"]}),
            )
            .await;
        sleepers.push(
            expect_result(&answer)["id"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        );
    }
    let answer = api.rpc(&conn, 20, PROCESS_LIST, json!({"limit": 1})).await;
    let page = expect_result(&answer);
    assert_eq!(page["processes"][0]["id"], sleepers[1].as_str(), "{answer}");
    let cursor = page["nextCursor"]
        .as_str()
        .unwrap_or_else(|| panic!("{answer}"));
    let answer = api
        .rpc(
            &conn,
            21,
            PROCESS_LIST,
            json!({"limit": 1, "cursor": cursor}),
        )
        .await;
    assert_eq!(
        expect_result(&answer)["processes"][0]["id"],
        sleepers[0].as_str(),
        "{answer}"
    );
    let answer = api
        .rpc(&conn, 22, PROCESS_LIST, json!({"state": "running"}))
        .await;
    let running: Vec<&str> = expect_result(&answer)["processes"]
        .as_array()
        .map(|list| list.iter().filter_map(|p| p["id"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(
        running,
        [sleepers[1].as_str(), sleepers[0].as_str()],
        "{answer}"
    );
    // No params at all: the first page.
    let answer = api
        .call(
            &conn,
            &json!({"jsonrpc": "2.0", "id": 23, "method": PROCESS_LIST}),
        )
        .await;
    assert_eq!(
        expect_result(&answer)["processes"].as_array().map(Vec::len),
        Some(3)
    );

    // signal: a name with or without SIG.
    let answer = api
        .rpc(
            &conn,
            30,
            PROCESS_SIGNAL,
            json!({"processId": sleepers[0], "signal": "TERM"}),
        )
        .await;
    assert_eq!(expect_result(&answer), &json!({}), "{answer}");
    let info = exited(&api, &conn, &sleepers[0]).await;
    assert_eq!(info["signal"], "SIGTERM", "{info}");
    assert_eq!(info["exitCode"], Value::Null, "{info}");
    let answer = api
        .rpc(
            &conn,
            31,
            PROCESS_SIGNAL,
            json!({"processId": sleepers[1], "signal": "SIGKILL"}),
        )
        .await;
    expect_result(&answer);
    assert_eq!(exited(&api, &conn, &sleepers[1]).await["signal"], "SIGKILL");
}

#[tokio::test]
async fn resize_reaches_the_terminal() {
    let server = TestServer::start(&[]).await;
    let api = server.api();
    let conn = api.initialize("mock").await;
    let answer = api
        .rpc(
            &conn,
            1,
            PROCESS_START,
            json!({"command": "sh", "args": ["-c", "read line; stty size"], "tty": true, "cols": 80, "rows": 24}),
        )
        .await;
    let id = expect_result(&answer)["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{answer}"))
        .to_owned();
    assert_eq!(expect_result(&answer)["tty"], true);
    let answer = api
        .rpc(
            &conn,
            2,
            PROCESS_RESIZE,
            json!({"processId": id, "cols": 100, "rows": 40}),
        )
        .await;
    assert_eq!(expect_result(&answer), &json!({}), "{answer}");
    let answer = api
        .rpc(
            &conn,
            3,
            PROCESS_INPUT,
            json!({"processId": id, "data": "\r"}),
        )
        .await;
    expect_result(&answer);
    let info = exited(&api, &conn, &id).await;
    assert_eq!(info["exitCode"], 0, "{info}");
    let text = output_text(&api, &id).await;
    assert!(
        text.contains("40 100"),
        "stty size after the resize: {text:?}"
    );
}

#[tokio::test]
async fn failures_are_json_rpc_errors_with_the_problem() {
    let server = TestServer::start(&["--max-processes", "1"]).await;
    let api = server.api();
    let conn = api.initialize("mock").await;

    let answer = api
        .rpc(&conn, 1, PROCESS_GET, json!({"processId": "nope"}))
        .await;
    let data = expect_problem(&answer, "unknown-process", 404);
    assert!(
        data["detail"].as_str().is_some_and(|d| d.contains("nope")),
        "{answer}"
    );
    let answer = api
        .rpc(
            &conn,
            2,
            PROCESS_RUN,
            json!({"command": "no-such-program-xyz"}),
        )
        .await;
    expect_problem(&answer, "program-not-found", 400);
    let answer = api
        .rpc(
            &conn,
            3,
            PROCESS_START,
            json!({"command": "cat", "cwd": "/no/such/dir"}),
        )
        .await;
    assert!(
        expect_error(&answer, INVALID_PARAMS)["data"]["type"]
            .as_str()
            .is_some_and(|t| t.starts_with(PROBLEM)),
        "{answer}"
    );
    let answer = api
        .rpc(&conn, 4, PROCESS_START, json!({"command": "cat"}))
        .await;
    let id = expect_result(&answer)["id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    // --max-processes 1: a second one is refused.
    let answer = api
        .rpc(&conn, 5, PROCESS_START, json!({"command": "cat"}))
        .await;
    expect_problem(&answer, "too-many-processes", 429);
    let answer = api
        .rpc(
            &conn,
            6,
            PROCESS_SIGNAL,
            json!({"processId": id, "signal": "SIGNOPE"}),
        )
        .await;
    expect_problem(&answer, "invalid-request", 400);
    let answer = api
        .rpc(
            &conn,
            7,
            PROCESS_RESIZE,
            json!({"processId": id, "cols": 10, "rows": 10}),
        )
        .await;
    expect_problem(&answer, "not-a-tty", 409);
    let answer = api.rpc(&conn, 8, PROCESS_LIST, json!({"limit": 0})).await;
    expect_problem(&answer, "invalid-request", 400);
    // Params of the wrong shape: JSON-RPC's own invalid params.
    let answer = api
        .rpc(
            &conn,
            9,
            PROCESS_START,
            json!({"command": "cat", "bogus": 1}),
        )
        .await;
    expect_error(&answer, INVALID_PARAMS);
    let answer = api
        .rpc(
            &conn,
            10,
            PROCESS_INPUT,
            json!({"processId": id, "data": "!!", "encoding": "base64"}),
        )
        .await;
    expect_error(&answer, INVALID_PARAMS);
    // Input after the process exited.
    let answer = api
        .rpc(
            &conn,
            11,
            PROCESS_INPUT,
            json!({"processId": id, "eof": true}),
        )
        .await;
    expect_result(&answer);
    exited(&api, &conn, &id).await;
    let answer = api
        .rpc(
            &conn,
            12,
            PROCESS_INPUT,
            json!({"processId": id, "data": "late"}),
        )
        .await;
    expect_problem(&answer, "process-exited", 409);
    let answer = api
        .rpc(
            &conn,
            13,
            PROCESS_SIGNAL,
            json!({"processId": id, "signal": "SIGTERM"}),
        )
        .await;
    expect_problem(&answer, "process-exited", 409);
}

#[tokio::test]
async fn no_processes_means_no_process_methods() {
    let server = TestServer::start(&["--no-processes"]).await;
    let api = server.api();
    let methods = advertised(&api).await;
    assert!(
        methods
            .iter()
            .all(|m| !m.starts_with("_sandboxagent/process/")),
        "{methods:?}"
    );
    assert!(
        methods.iter().any(|m| m == "_sandboxagent/fs/stat"),
        "{methods:?}"
    );
    let reply = api.initialize_reply("mock").await;
    let body = reply.json();
    let extensions = &namespace(&body["result"]["agentCapabilities"])["extensions"];
    assert_eq!(extensions["processRun"], false, "{extensions}");
    let conn = api.initialize("mock").await;
    for (n, method) in PROCESS_METHODS.iter().enumerate() {
        let answer = api
            .rpc(
                &conn,
                n,
                method,
                json!({"processId": "x", "command": "true"}),
            )
            .await;
        expect_error(&answer, METHOD_NOT_FOUND);
    }
}
