//! The inventory at scale (research/contract.md, "Control plane" and
//! "Durable sessions"): `GET /v2/sessions` pages newest first with a cursor
//! that stays valid while sessions are created, filters by agent, state and
//! title, shows a first prompt; with a store, a restarted server lists,
//! reads and loads sessions it holds only in the store.

use serde_json::{Value, json};
use std::collections::HashSet;
use std::path::Path;
use v2_api_tests::{TempDir, TestServer, acp, path_segment};

const MOCK: &str = "mock";

async fn start(data_dir: &Path, extra: &[&str]) -> TestServer {
    let mut args = vec!["--data-dir", data_dir.to_str().expect("UTF-8 temp dir")];
    args.extend_from_slice(extra);
    TestServer::start(&args).await
}

/// `session/new` for the mock with `title` (none for `None`); the id.
async fn new_session(server: &TestServer, conn: &str, title: Option<&str>) -> String {
    let mut meta = json!({"agent": MOCK});
    if let Some(title) = title {
        meta["title"] = json!(title);
    }
    let params = json!({"cwd": "/tmp", "mcpServers": [], "_meta": {"sandboxagent.dev": meta}});
    let answer = server.rpc(conn, 1, "session/new", params).await;
    answer["result"]["sessionId"]
        .as_str()
        .unwrap_or_else(|| panic!("session/new failed: {answer}"))
        .to_owned()
}

/// `GET /v2/sessions?{query}`: the ids of the page and its `nextCursor`.
async fn page(server: &TestServer, query: &str) -> (Vec<String>, Option<String>) {
    let body = server.get_json(&format!("/v2/sessions?{query}")).await;
    let ids = body["sessions"]
        .as_array()
        .unwrap_or_else(|| panic!("no sessions array: {body}"))
        .iter()
        .map(|s| s["sessionId"].as_str().expect("sessionId").to_owned())
        .collect();
    (ids, body["nextCursor"].as_str().map(str::to_owned))
}

/// Every id, following `nextCursor` from the first page of `query`.
async fn walk(server: &TestServer, query: &str) -> Vec<String> {
    let mut all = Vec::new();
    let (ids, mut next) = page(server, query).await;
    all.extend(ids);
    while let Some(cursor) = next {
        let (ids, following) =
            page(server, &format!("{query}&cursor={}", path_segment(&cursor))).await;
        assert!(
            !ids.is_empty(),
            "a page with a nextCursor before it is not empty"
        );
        all.extend(ids);
        next = following;
    }
    all
}

#[tokio::test]
async fn sessions_page_newest_first_and_a_cursor_survives_new_sessions() {
    let data = TempDir::new("pages");
    let server = start(data.path(), &[]).await;
    let conn = server.initialize(MOCK).await;
    let mut created = Vec::new();
    for n in 0..230 {
        let title = (n % 10 == 0).then(|| format!("Release {n} Notes"));
        created.push(new_session(&server, &conn, title.as_deref()).await);
    }
    let newest_first: Vec<String> = created.iter().rev().cloned().collect();

    // The default page is 100, newest first.
    let (first, next) = page(&server, "").await;
    assert_eq!(first, newest_first[..100]);
    let next = next.expect("a nextCursor after the first page");
    // Sessions created between pages are newer: the cursor's next page is
    // unchanged by them.
    let later = new_session(&server, &conn, None).await;
    let (second, next) = page(&server, &format!("cursor={}", path_segment(&next))).await;
    assert_eq!(second, newest_first[100..200]);
    let (third, last) = page(
        &server,
        &format!("cursor={}", path_segment(&next.expect("third page"))),
    )
    .await;
    assert_eq!(third, newest_first[200..]);
    assert_eq!(last, None, "no nextCursor on the last page");

    // limit, and a walk sees every session once.
    let (two, _) = page(&server, "limit=2").await;
    assert_eq!(two, vec![later.clone(), newest_first[0].clone()]);
    let walked = walk(&server, "limit=7").await;
    assert_eq!(walked.len(), 231);
    assert_eq!(
        walked.iter().collect::<HashSet<_>>().len(),
        231,
        "no repeats"
    );

    // Filters.
    let (titled, _) = page(&server, "q=release%20%3f&limit=1000").await;
    assert!(
        titled.is_empty(),
        "q matches text, not patterns: {titled:?}"
    );
    let titled = walk(&server, "q=RELEASE&limit=5").await;
    let expected: Vec<String> = newest_first
        .iter()
        .enumerate()
        .filter(|(n, _)| (229 - n) % 10 == 0)
        .map(|(_, id)| id.clone())
        .collect();
    assert_eq!(titled, expected, "q on the title, case-insensitive");
    assert_eq!(walk(&server, "agent=other").await, Vec::<String>::new());
    assert_eq!(walk(&server, "agent=mock&limit=1000").await.len(), 231);
    let ended = server
        .rpc(
            &conn,
            5,
            "_sandboxagent/session/terminate",
            json!({"sessionId": created[3]}),
        )
        .await;
    assert_eq!(ended["result"]["alreadyEnded"], false, "{ended}");
    assert_eq!(walk(&server, "state=ended").await, vec![created[3].clone()]);
    assert_eq!(walk(&server, "state=live&limit=1000").await.len(), 230);
    assert_eq!(walk(&server, "state=dormant").await, Vec::<String>::new());

    // A first prompt shows for an untitled session.
    let answer = server
        .prompt(
            &conn,
            &created[1],
            json!(6),
            "fix the flaky login test please",
        )
        .await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let entry = server
        .get_json(&format!(
            "/v2/sessions/{}?agent={MOCK}",
            path_segment(&created[1])
        ))
        .await;
    assert_eq!(
        entry["_meta"]["sandboxagent.dev"]["firstPrompt"], "fix the flaky login test please",
        "{entry}"
    );
}

#[tokio::test]
async fn bad_listing_parameters_are_400_naming_the_parameter() {
    let data = TempDir::new("pages-bad");
    let server = start(data.path(), &[]).await;
    for (query, names) in [
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("limit=ten", "limit"),
        ("limit=-1", "limit"),
        ("cursor=nope", "cursor"),
        ("state=asleep", "state"),
    ] {
        let reply = server.get(&format!("/v2/sessions?{query}")).await;
        reply.assert_status(400);
        let problem: Value = reply.json();
        assert_eq!(
            problem["type"], "urn:sandbox-agent:error:invalid-request",
            "{query}: {problem}"
        );
        assert!(
            problem["detail"]
                .as_str()
                .is_some_and(|d| d.contains(names)),
            "{query}: {problem}"
        );
    }
}

/// A restarted server holds its inventory in the store: it lists every
/// stored session across pages, reads one by id and its events, and loads
/// a dormant one, though none was read into memory at start.
#[tokio::test]
async fn a_restarted_server_pages_gets_and_loads_sessions_from_the_store() {
    const SESSIONS: usize = 1_200;
    // Past the default `--ended-sessions` (1,000), which counts dormant ones.
    const KEEP: &[&str] = &["--ended-sessions", "5000"];
    let data = TempDir::new("pages-restart");
    let mut server = start(data.path(), KEEP).await;
    let conn = server.initialize(MOCK).await;
    let mut created = Vec::new();
    for _ in 0..SESSIONS {
        created.push(new_session(&server, &conn, None).await);
    }
    let answer = server
        .prompt(&conn, &created[0], json!(2), "hello from the oldest")
        .await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    server.send_sigterm();
    server.wait_exit(std::time::Duration::from_secs(30)).await;
    drop(server);

    let server = start(data.path(), KEEP).await;
    let walked = walk(&server, "limit=1000").await;
    let newest_first: Vec<String> = created.iter().rev().cloned().collect();
    assert_eq!(walked, newest_first, "every stored session, newest first");
    assert_eq!(
        walk(&server, "state=dormant&limit=1000").await.len(),
        SESSIONS
    );
    assert_eq!(walk(&server, "state=live").await, Vec::<String>::new());

    // The oldest: by id, with its first prompt, and its events.
    let entry = server
        .get_json(&format!("/v2/sessions/{}", path_segment(&created[0])))
        .await;
    let meta = &entry["_meta"]["sandboxagent.dev"];
    assert_eq!(meta["dormant"], true, "{entry}");
    assert_eq!(meta["firstPrompt"], "hello from the oldest", "{entry}");
    let events = server
        .get_json(&format!(
            "/v2/sessions/{}/events?agent={MOCK}&limit=1000",
            path_segment(&created[0])
        ))
        .await;
    let count = meta["eventCount"].as_u64().expect("eventCount");
    assert_eq!(
        events["events"].as_array().map(Vec::len),
        Some(count as usize),
        "{events}"
    );

    // session/load on it: the agent loads it, the history goes on.
    let conn = server.initialize(MOCK).await;
    let load = server
        .rpc(
            &conn,
            3,
            "session/load",
            json!({"sessionId": created[0], "cwd": "/tmp", "mcpServers": []}),
        )
        .await;
    assert!(load.get("result").is_some(), "session/load: {load}");
    let answer = server
        .call(
            &conn,
            &acp::request(
                4,
                "session/prompt",
                acp::prompt_params(&created[0], "again"),
            ),
        )
        .await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let entry = server
        .get_json(&format!(
            "/v2/sessions/{}?agent={MOCK}",
            path_segment(&created[0])
        ))
        .await;
    let meta = &entry["_meta"]["sandboxagent.dev"];
    assert_ne!(meta["dormant"], true, "loaded: {entry}");
    assert!(
        meta["eventCount"].as_u64().is_some_and(|n| n > count),
        "the log goes on after the stored events: {entry}"
    );
    assert_eq!(walk(&server, "state=live").await, vec![created[0].clone()]);
}

/// Every (id, ended) of the listing of `query`, following `nextCursor`.
async fn walk_states(server: &TestServer, query: &str) -> Vec<(String, bool)> {
    let mut all = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(cursor) => format!("/v2/sessions?{query}&cursor={}", path_segment(cursor)),
            None => format!("/v2/sessions?{query}"),
        };
        let body = server.get_json(&path).await;
        let entries = body["sessions"]
            .as_array()
            .unwrap_or_else(|| panic!("no sessions array: {body}"));
        for entry in entries {
            let meta = &entry["_meta"]["sandboxagent.dev"];
            assert_ne!(meta["dormant"], true, "nothing is dormant here: {entry}");
            all.push((
                entry["sessionId"].as_str().expect("sessionId").to_owned(),
                meta["ended"]
                    .as_bool()
                    .unwrap_or_else(|| panic!("no ended flag: {entry}")),
            ));
        }
        match body["nextCursor"].as_str() {
            Some(next) => {
                assert!(!entries.is_empty(), "an empty page before a nextCursor");
                cursor = Some(next.to_owned());
            }
            None => return all,
        }
    }
}

/// A server that made and ended more sessions than memory caches (1,000)
/// lists them all while it runs, newest first, each with its state, right
/// after the last end and after memory dropped the ended ones it no longer
/// needs (the store answers for them).
#[tokio::test]
async fn sessions_ended_in_the_running_server_list_in_order_with_their_state() {
    const SESSIONS: usize = 1_200;
    let data = TempDir::new("pages-ended");
    let server = start(data.path(), &["--ended-sessions", "5000"]).await;
    let conn = server.initialize(MOCK).await;
    let mut expected = Vec::new();
    for n in 0..SESSIONS {
        let id = new_session(&server, &conn, None).await;
        // Every hundredth stays live.
        let ended = n % 100 != 7;
        if ended {
            let answer = server
                .rpc(
                    &conn,
                    5,
                    "_sandboxagent/session/terminate",
                    json!({"sessionId": id}),
                )
                .await;
            assert_eq!(answer["result"]["alreadyEnded"], false, "{answer}");
        }
        expected.push((id, ended));
    }
    expected.reverse();
    let live: Vec<String> = expected
        .iter()
        .filter(|(_, ended)| !ended)
        .map(|(id, _)| id.clone())
        .collect();
    let ended: Vec<String> = expected
        .iter()
        .filter(|(_, ended)| *ended)
        .map(|(id, _)| id.clone())
        .collect();
    for moment in [
        "right after the last end",
        "after memory dropped ended entries",
    ] {
        if moment != "right after the last end" {
            // The cache is trimmed once a second.
            tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
        }
        assert_eq!(
            walk_states(&server, "limit=100").await,
            expected,
            "{moment}: every session, newest first, with its state"
        );
        assert_eq!(
            walk(&server, "state=ended&limit=100").await,
            ended,
            "{moment}"
        );
        assert_eq!(walk(&server, "state=live").await, live, "{moment}");
        let (first, next) = page(&server, "limit=100").await;
        assert_eq!(first.len(), 100, "{moment}");
        assert!(
            next.is_some(),
            "{moment}: a nextCursor after the first page"
        );
    }
    // The oldest ended one, by id: ended, from the store.
    let (oldest, _) = expected.last().expect("sessions");
    let entry = server
        .get_json(&format!("/v2/sessions/{}", path_segment(oldest)))
        .await;
    assert_eq!(entry["_meta"]["sandboxagent.dev"]["ended"], true, "{entry}");
}

/// With a store, `--ended-sessions` is kept in the store: past it the
/// oldest stored sessions go (rows and events), live ones never.
#[tokio::test]
async fn retention_deletes_the_oldest_stored_sessions_past_the_limit() {
    let data = TempDir::new("pages-retention");
    let mut server = start(data.path(), &["--ended-sessions", "1000"]).await;
    let conn = server.initialize(MOCK).await;
    let mut created = Vec::new();
    for _ in 0..30 {
        created.push(new_session(&server, &conn, None).await);
    }
    server.send_sigterm();
    server.wait_exit(std::time::Duration::from_secs(30)).await;
    drop(server);

    let server = start(data.path(), &["--ended-sessions", "10"]).await;
    let newest: Vec<String> = created.iter().rev().take(10).cloned().collect();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let walked = walk(&server, "limit=1000").await;
        if walked == newest {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the 10 newest stay: {} listed",
            walked.len()
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    server
        .get(&format!("/v2/sessions/{}", path_segment(&created[0])))
        .await
        .assert_status(404);
    // The sessions gauge counts what the listing shows, the forgotten ones
    // no more (research/contract.md, "Metrics"), also after the next
    // retention pass has seen the deleted rows.
    for pass in 0..2 {
        if pass > 0 {
            tokio::time::sleep(std::time::Duration::from_secs(11)).await;
        }
        let metrics = server.get("/metrics").await.text();
        assert!(
            metrics.contains("\nsandbox_agent_sessions{state=\"dormant\"} 10\n"),
            "{metrics}"
        );
    }
}

/// What the inventory keeps per entry is bounded, and what a store cannot
/// hold is refused up front: a `cwd` over 4,096 bytes, a NUL in a listing
/// parameter.
#[tokio::test]
async fn oversized_cwds_and_nul_parameters_are_refused() {
    let data = TempDir::new("pages-bounds");
    let server = start(data.path(), &[]).await;
    let conn = server.initialize(MOCK).await;
    let long = format!("/{}", "d".repeat(4096));
    let params =
        json!({"cwd": long, "mcpServers": [], "_meta": {"sandboxagent.dev": {"agent": MOCK}}});
    let reply = server
        .post(Some(&conn), &acp::request(1, "session/new", params))
        .await;
    reply.assert_status(400);
    let problem: Value = reply.json();
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("cwd")),
        "{problem}"
    );
    for query in ["q=a%00b", "agent=mo%00ck", "cursor=1%3Amock%3Aa%00b"] {
        let reply = server.get(&format!("/v2/sessions?{query}")).await;
        reply.assert_status(400);
        let problem: Value = reply.json();
        assert!(
            problem["detail"]
                .as_str()
                .is_some_and(|d| d.contains("NUL")),
            "{query}: {problem}"
        );
    }
    // An id with a NUL was never stored: 404, not a store error.
    server.get("/v2/sessions/a%00b").await.assert_status(404);
    // A title search past 1024 characters is the client's error (SQLite
    // would refuse the LIKE pattern past 50,000 bytes: it was a 503 that
    // named the store's file); 1024 is served.
    let reply = server
        .get(&format!("/v2/sessions?q={}", "a".repeat(50_000)))
        .await;
    reply.assert_status(400);
    let problem: Value = reply.json();
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("1024")),
        "{problem}"
    );
    server
        .get(&format!("/v2/sessions?q={}", "é".repeat(1024)))
        .await
        .assert_status(200);
}

/// A root certificate "file" that is a device or a FIFO is refused before
/// anything reads it (reading /dev/zero filled memory; a FIFO hung the start).
#[tokio::test]
async fn an_sslrootcert_that_is_not_a_regular_file_is_a_start_up_error() {
    let data = TempDir::new("pages-root");
    let dir = data.path().to_str().expect("UTF-8").to_owned();
    let store = "postgres://agent@127.0.0.1:1/sessions?sslmode=verify-ca&sslrootcert=/dev/zero";
    let Some((status, stderr)) = v2_api_tests::server::start_up_outcome(
        &["--data-dir", &dir, "--store", store],
        std::time::Duration::from_secs(20),
    )
    .await
    else {
        panic!("the server started (or hung) with sslrootcert=/dev/zero");
    };
    assert!(!status.success(), "{stderr}");
    assert!(stderr.contains("not a regular file"), "{stderr}");
}
