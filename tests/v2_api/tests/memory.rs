//! Memory has a ceiling (research/contract.md, "Memory budget"): what
//! sessions and connections held comes back when they end and close, one
//! server-wide budget bounds every event log and replay ring, and `GET
//! /v2/health` reports it.

use serde_json::{Value, json};
use std::time::Duration;
use v2_api_tests::{TestServer, procfs};

/// How long the allocator may take to give freed memory back: its background
/// threads purge pages a second after they were freed (`.cargo/config.toml`),
/// checked with some slack for a loaded machine.
const RETURN_WITHIN: Duration = Duration::from_secs(20);

/// Opens a `/v2/rpc` connection to the mock agent, makes a session on it and
/// has the agent stream `chunks` chunks of `bytes` bytes into it; the client
/// never opens the stream, so everything stays in the connection's replay
/// ring (and the session's log). Returns (connection, session).
async fn chatty_session(server: &TestServer, chunks: usize, bytes: usize) -> (String, String) {
    let api = server.api();
    let conn = api.initialize("mock").await;
    let session = api.new_session(&conn).await;
    let done = api
        .prompt(
            &conn,
            &session,
            json!(2),
            &format!("!emit {chunks} {bytes}"),
        )
        .await;
    assert_eq!(done["result"]["stopReason"], "end_turn", "{done}");
    (conn, session)
}

/// Ends `session` with `_sandboxagent/session/terminate` on `conn`.
async fn terminate(server: &TestServer, conn: &str, session: &str) {
    let answer = server
        .api()
        .rpc(
            conn,
            9,
            "_sandboxagent/session/terminate",
            json!({"sessionId": session}),
        )
        .await;
    assert!(answer.get("result").is_some(), "{answer}");
}

/// Polls the server's RSS until it is at most `ceiling` bytes or
/// [`RETURN_WITHIN`] has passed; returns the last reading. (jemalloc purges
/// gradually over its decay time, so a reading just under a looser bound
/// may still be falling: callers wait for half their bound.)
async fn rss_settles_below(server: &TestServer, ceiling: u64) -> u64 {
    let deadline = tokio::time::Instant::now() + RETURN_WITHIN;
    loop {
        let rss = procfs::rss_bytes(server.pid()).expect("server RSS");
        if rss <= ceiling || tokio::time::Instant::now() >= deadline {
            return rss;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// What the server may keep after a round of chatty sessions ended and their
/// connections closed: the four ended sessions' logs (1 MiB each, as
/// `--event-log-bytes` says, kept for `/v2/sessions/{id}/events`; 64 KiB
/// each with a store), allocator metadata and thread caches, pages jemalloc
/// has not purged yet. glibc's malloc kept 74 MiB of the round's 86.
const KEPT_AFTER_ROUND: u64 = 24 << 20;

/// The same with the SQLite store on, which adds its page caches (up to
/// 2 MiB per pooled connection) and what the writer allocated while 120 MB
/// of events went through it: measured 23 MiB over the baseline, against
/// 89 MiB while the ended sessions' logs stayed whole.
const KEPT_WITH_STORE: u64 = 32 << 20;

#[tokio::test]
async fn memory_returns_after_sessions_end_and_connections_close() {
    // The allocator under test only: with a store, the writer's queue would
    // blur what this measures.
    let server = TestServer::start(&["--store", "memory", "--event-log-bytes", "1048576"]).await;
    // One small round first, so every lazily made thing (agent process,
    // allocator arenas, thread pools) exists before the baseline.
    let (conn, session) = chatty_session(&server, 10, 1000).await;
    terminate(&server, &conn, &session).await;
    server.api().delete(Some(&conn)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = procfs::rss_bytes(server.pid()).expect("server RSS");
    let mut peak = before;
    for round in 0..2 {
        let mut opened = Vec::new();
        for _ in 0..4 {
            // 30 MB each, all held in the connection's ring (64 MiB by default).
            opened.push(chatty_session(&server, 3000, 10_000).await);
        }
        peak = peak.max(procfs::rss_bytes(server.pid()).expect("server RSS"));
        for (conn, session) in &opened {
            terminate(&server, conn, session).await;
            server.api().delete(Some(conn)).await.assert_status(204);
        }
        let after = rss_settles_below(&server, before + KEPT_AFTER_ROUND / 2).await;
        eprintln!(
            "round {round}: RSS before {} MiB, peak {} MiB, after {} MiB",
            before >> 20,
            peak >> 20,
            after >> 20
        );
        assert!(
            peak > before + (64 << 20),
            "the round did not hold its events ({before} → {peak} bytes): it measures nothing"
        );
        assert!(
            after <= before + KEPT_AFTER_ROUND,
            "RSS did not come back: {} MiB before, {} MiB at the peak, {} MiB {}s after the sessions ended and the connections closed",
            before >> 20,
            peak >> 20,
            after >> 20,
            RETURN_WITHIN.as_secs()
        );
    }
    let health: Value = server.api().health().await.json();
    assert_eq!(health["status"], "ok", "{health}");
}

/// Polls `GET /v2/health` until `memoryUsedBytes` is at most the budget, for
/// up to [`RETURN_WITHIN`]; returns the last health body.
async fn health_within_budget(server: &TestServer) -> Value {
    let deadline = tokio::time::Instant::now() + RETURN_WITHIN;
    loop {
        let health: Value = server.api().health().await.json();
        let within = health["memoryUsedBytes"]
            .as_u64()
            .zip(health["memoryBudgetBytes"].as_u64())
            .is_some_and(|(used, budget)| used <= budget);
        if within || tokio::time::Instant::now() >= deadline {
            return health;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// 8 MiB for every log and ring together.
const SMALL_BUDGET: u64 = 8 << 20;

#[tokio::test]
async fn memory_budget_evicts_the_oldest_and_reports_in_health() {
    // The default store (SQLite in the data dir): what is evicted stays
    // readable from it.
    let budget = SMALL_BUDGET.to_string();
    let server = TestServer::start(&["--memory-budget-bytes", &budget]).await;
    let health: Value = server.api().health().await.json();
    assert_eq!(health["memoryBudgetBytes"], SMALL_BUDGET, "{health}");
    assert_eq!(health["memoryEvictedEvents"], 0, "{health}");

    // One session that ends: its log is the first to go.
    let (ended_conn, ended) = chatty_session(&server, 2000, 2000).await;
    terminate(&server, &ended_conn, &ended).await;
    server
        .api()
        .delete(Some(&ended_conn))
        .await
        .assert_status(204);
    // Three live ones whose clients never read: 4 MB each in the log and
    // in the ring, 24 MB in all against 8 MiB.
    let mut live = Vec::new();
    for _ in 0..3 {
        live.push(chatty_session(&server, 2000, 2000).await);
    }
    let health = health_within_budget(&server).await;
    eprintln!("health after four chatty sessions: {health}");
    let used = health["memoryUsedBytes"].as_u64().expect("memoryUsedBytes");
    assert!(
        used <= SMALL_BUDGET,
        "{used} bytes held against a budget of {SMALL_BUDGET}: {health}"
    );
    let evicted = health["memoryEvictedEvents"]
        .as_u64()
        .expect("memoryEvictedEvents");
    assert!(evicted > 0, "nothing evicted: {health}");

    // The ended session's log went from memory, not from the store: its
    // first events page from there.
    let page = server
        .api()
        .get_json(&format!("/v2/sessions/{ended}/events?offset=0&limit=3"))
        .await;
    let offsets: Vec<u64> = page["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter_map(|e| e["offset"].as_u64())
        .collect();
    assert_eq!(offsets, [0, 1, 2], "{page}");

    // A live connection's ring lost its oldest events: resuming from the
    // start says so with a gap notice before the first event it still has.
    let (conn, _) = &live[0];
    let mut stream = server.api().open_stream(conn, Some(0)).await;
    let first = stream.next_event(Duration::from_secs(10)).await;
    assert_eq!(
        first.method(),
        Some("_sandboxagent/stream/gap"),
        "the ring was evicted, so the stream starts with a gap: {first:?}"
    );
    assert_eq!(first.params()["from"], 1, "{first:?}");
    stream.close();
}

/// The store's queue is charged to the same budget and sized by it
/// (research/contract.md, "Memory budget"): under 8 MiB an agent's share of
/// the queue is 512 KiB, so a flood waits for the writer instead of growing
/// the queue (`storePauses`), and nothing is lost: every event is stored
/// and pages back without a gap (pages of 1000 events of 2 kB, cut at
/// 1 MiB by `--event-log-bytes`, across the seam of store and memory).
#[tokio::test]
async fn under_a_small_budget_the_store_queue_waits_and_loses_nothing() {
    let budget = SMALL_BUDGET.to_string();
    let server = TestServer::start(&[
        "--memory-budget-bytes",
        &budget,
        "--event-log-bytes",
        "1048576",
    ])
    .await;
    let mut sessions = Vec::new();
    for _ in 0..3 {
        // 4 MB each, from one agent: eight times its share.
        sessions.push(chatty_session(&server, 2000, 2000).await);
    }
    let deadline = tokio::time::Instant::now() + RETURN_WITHIN;
    let health = loop {
        let health: Value = server.api().health().await.json();
        if health["storeWaiting"] == 0 || tokio::time::Instant::now() >= deadline {
            break health;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(health["storeWaiting"], 0, "the writer caught up: {health}");
    assert_eq!(health["storeDroppedEvents"], 0, "{health}");
    assert!(
        health["storePauses"].as_u64().is_some_and(|n| n > 0),
        "the agent's output waited for the writer: {health}"
    );
    let health = health_within_budget(&server).await;
    assert!(
        health["memoryUsedBytes"]
            .as_u64()
            .is_some_and(|used| used <= SMALL_BUDGET),
        "{health}"
    );
    for (_, session) in &sessions {
        let mut offset = 0u64;
        loop {
            let page = server
                .api()
                .get_json(&format!(
                    "/v2/sessions/{session}/events?offset={offset}&limit=1000"
                ))
                .await;
            let events = page["events"].as_array().expect("events");
            if events.is_empty() {
                break;
            }
            for event in events {
                assert_eq!(event["offset"].as_u64(), Some(offset), "a gap: {event}");
                offset += 1;
            }
        }
        assert!(
            offset > 2000,
            "only {offset} events of {session} were readable"
        );
    }
}

/// (research/contract.md, "Durable sessions": a client's message is stored
/// or refused, never dropped): 24 prompts of 4 MB at once, one per session,
/// under a 1 MB budget (a queue of 250 kB). Each is either answered and in
/// its session's stored log at offset 2, or refused with a 503
/// `store-behind` and never forwarded (no prompt, no reply in the log);
/// the store drops nothing.
#[tokio::test]
async fn client_messages_past_the_store_queue_wait_or_are_refused_never_dropped() {
    const PROMPTS: usize = 24;
    const PROMPT_BYTES: usize = 4_000_000;
    let server = TestServer::start(&["--memory-budget-bytes", "1000000"]).await;
    let api = server.api();
    let conn = api.initialize("mock").await;
    let mut sessions = Vec::new();
    for _ in 0..PROMPTS {
        sessions.push(api.new_session(&conn).await);
    }
    let text = "x".repeat(PROMPT_BYTES);
    let requests: Vec<Value> = sessions
        .iter()
        .zip(1..)
        .map(|(session, id)| {
            v2_api_tests::acp::request(
                id,
                "session/prompt",
                v2_api_tests::acp::prompt_params(session, &text),
            )
        })
        .collect();
    let replies = futures::future::join_all(
        requests
            .iter()
            .map(|request| api.post(Some(&conn), request)),
    )
    .await;
    let health = api.store_caught_up(RETURN_WITHIN).await;
    assert_eq!(
        health["storeDroppedEvents"],
        0,
        "{health}\n{}",
        server.stderr_text()
    );
    let mut answered = 0;
    for (session, reply) in sessions.iter().zip(&replies) {
        let events = api.all_events(session).await;
        let prompts: Vec<&Value> = events
            .iter()
            .filter(|event| event["message"]["method"] == "session/prompt")
            .collect();
        if reply.status == 503 {
            v2_api_tests::problem::assert_problem(reply, 503, "store-behind");
            assert!(prompts.is_empty(), "a refused prompt was forwarded");
            assert_eq!(events.len(), 2, "the agent ran a refused prompt");
        } else {
            let body = reply.json();
            assert_eq!(body["result"]["stopReason"], "end_turn", "{body}");
            assert_eq!(prompts.len(), 1, "{session}: the prompt is not stored");
            assert_eq!(prompts[0]["offset"], 2);
            assert_eq!(prompts[0]["direction"], "client_to_agent");
            answered += 1;
        }
    }
    assert!(answered > 0, "every prompt was refused");
}

#[tokio::test]
async fn memory_budget_without_a_store_evicts_into_the_offset_gap() {
    let budget = SMALL_BUDGET.to_string();
    let server = TestServer::start(&["--store", "memory", "--memory-budget-bytes", &budget]).await;
    let (conn, ended) = chatty_session(&server, 2000, 2000).await;
    terminate(&server, &conn, &ended).await;
    server.api().delete(Some(&conn)).await.assert_status(204);
    for _ in 0..3 {
        chatty_session(&server, 2000, 2000).await;
    }
    let health = health_within_budget(&server).await;
    let used = health["memoryUsedBytes"].as_u64().expect("memoryUsedBytes");
    assert!(used <= SMALL_BUDGET, "{health}");
    // Nothing else holds the ended session's events: what went is gone, and
    // the page starts after the gap.
    let page = server
        .api()
        .get_json(&format!("/v2/sessions/{ended}/events?offset=0&limit=3"))
        .await;
    let first = page["events"][0]["offset"].as_u64().unwrap_or(u64::MAX);
    let next = page["nextOffset"].as_u64().expect("nextOffset");
    assert!(
        first > 0 || page["events"].as_array().is_some_and(|e| e.is_empty()) && next > 0,
        "the evicted events show as an offset gap: {page}"
    );
}

#[tokio::test]
async fn ended_sessions_keep_only_a_tail_in_memory_with_a_store() {
    // The default store (SQLite) and budget (512 MiB, not reached here).
    let server = TestServer::start(&[]).await;
    let (conn, session) = chatty_session(&server, 10, 1000).await;
    terminate(&server, &conn, &session).await;
    server.api().delete(Some(&conn)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = procfs::rss_bytes(server.pid()).expect("server RSS");
    let mut ended = Vec::new();
    for _ in 0..4 {
        // 30 MB each: the log keeps its 16 MiB (`--event-log-bytes`).
        ended.push(chatty_session(&server, 3000, 10_000).await);
    }
    let peak = procfs::rss_bytes(server.pid()).expect("server RSS");
    for (conn, session) in &ended {
        terminate(&server, conn, session).await;
        server.api().delete(Some(conn)).await.assert_status(204);
    }
    // Four tails of 64 KiB, and a little for entries still arriving.
    let tails = 1u64 << 20;
    let deadline = tokio::time::Instant::now() + RETURN_WITHIN;
    let health = loop {
        let health: Value = server.api().health().await.json();
        let used = health["memoryUsedBytes"].as_u64().unwrap_or(u64::MAX);
        if used <= tails || tokio::time::Instant::now() >= deadline {
            break health;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let used = health["memoryUsedBytes"].as_u64().unwrap_or(u64::MAX);
    let after = rss_settles_below(&server, before + KEPT_WITH_STORE / 2).await;
    eprintln!(
        "RSS before {} MiB, peak {} MiB, after {} MiB; logs hold {used} bytes: {health}",
        before >> 20,
        peak >> 20,
        after >> 20
    );
    assert!(
        used <= tails,
        "the ended sessions' logs still hold {used} bytes in memory: {health}"
    );
    assert!(
        after <= before + KEPT_WITH_STORE,
        "RSS did not come back: {} MiB before, {} MiB at the peak, {} MiB after",
        before >> 20,
        peak >> 20,
        after >> 20
    );
    // Every event stays readable: the head from the store, the tail from
    // memory, the seam between them without a gap.
    let (_, session) = &ended[0];
    let mut offset = 0u64;
    loop {
        let page = server
            .api()
            .get_json(&format!(
                "/v2/sessions/{session}/events?offset={offset}&limit=1000"
            ))
            .await;
        let events = page["events"].as_array().expect("events");
        if events.is_empty() {
            break;
        }
        for event in events {
            assert_eq!(
                event["offset"].as_u64(),
                Some(offset),
                "a gap at {offset}: {event}"
            );
            offset += 1;
        }
        assert_eq!(page["nextOffset"].as_u64(), Some(offset), "{page}");
    }
    assert!(offset > 3000, "only {offset} events were readable");
}

/// Polls `GET /v2/health` until `memoryEvictedEvents` stays the same for
/// half a second (the evictor's passes after the last push are done), for
/// up to [`RETURN_WITHIN`].
async fn evictions_settle(server: &TestServer) {
    let deadline = tokio::time::Instant::now() + RETURN_WITHIN;
    let mut last = None;
    let mut still = 0;
    while still < 5 && tokio::time::Instant::now() < deadline {
        let health: Value = server.api().health().await.json();
        let evicted = health["memoryEvictedEvents"].as_u64();
        still = if evicted == last { still + 1 } else { 0 };
        last = evicted;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A budget over for good (kept process records hold more than it) evicts
/// a connection's ring to empty as events arrive: a resume behind them,
/// and a first GET (it counts as `Last-Event-ID: 0`), still start with
/// `_sandboxagent/stream/gap` naming the ids that went (research/contract.md,
/// "Transport: /v2/rpc", GET). Before, an empty ring sent nothing at all.
#[tokio::test]
async fn a_ring_the_budget_emptied_still_starts_a_resume_with_a_gap() {
    const BUDGET: u64 = 1_000_000;
    let budget = BUDGET.to_string();
    let server =
        TestServer::start(&["--max-processes", "8", "--memory-budget-bytes", &budget]).await;
    let api = server.api();
    let arg = "a".repeat(60_000);
    for _ in 0..20 {
        let reply = v2_api_tests::Api::send(
            api.request(reqwest::Method::POST, "/v2/processes")
                .json(&json!({"command": "true", "args": [arg]})),
        )
        .await;
        reply.assert_status(201);
    }
    let health: Value = api.health().await.json();
    let used = health["memoryUsedBytes"].as_u64().expect("memoryUsedBytes");
    assert!(
        used > BUDGET,
        "the process records alone are over: {health}"
    );

    let served = &server;
    let ring = |conn: String| async move {
        let session = served.new_session(&conn).await;
        for id in 0..3 {
            let answer = served.prompt(&conn, &session, json!(id), "hello").await;
            assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
        }
        evictions_settle(served).await;
        (conn, session)
    };
    let (conn, session) = ring(server.initialize("mock").await).await;

    // Resume after event 1: everything after it went.
    let mut stream = api.open_stream(&conn, Some(1)).await;
    let gap = stream.next_event(Duration::from_secs(10)).await;
    assert_eq!(gap.method(), Some("_sandboxagent/stream/gap"), "{gap:?}");
    assert_eq!(gap.id, None, "a notice has no id: {gap:?}");
    assert_eq!(gap.params()["from"], 2, "{gap:?}");
    let to = gap.params()["to"].as_u64().expect("to");
    assert!(to > 2, "three turns went: {gap:?}");
    // What comes next follows the gap's end with no hole between: the next
    // event, or (the evictor can be first again) a gap starting there.
    let answer = server.prompt(&conn, &session, json!(9), "hello").await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let next = stream.next_event(Duration::from_secs(10)).await;
    let next_id = match next.method() {
        Some("_sandboxagent/stream/gap") => next.params()["from"].as_u64(),
        _ => next.id,
    };
    assert_eq!(next_id, Some(to + 1), "{next:?}");
    stream.close();

    // A first GET on another such connection starts with the gap from 1.
    let (other, _) = ring(server.initialize("mock").await).await;
    let mut first = api.open_stream(&other, None).await;
    let gap = first.next_event(Duration::from_secs(10)).await;
    assert_eq!(gap.method(), Some("_sandboxagent/stream/gap"), "{gap:?}");
    assert_eq!(gap.params()["from"], 1, "{gap:?}");
    first.close();
}
