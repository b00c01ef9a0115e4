//! Memory has a ceiling: what sessions and connections held comes back
//! when they end and close (research/decisions.md, "Memory has a ceiling").

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
/// [`RETURN_WITHIN`] has passed; returns the last reading.
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
/// `--event-log-bytes` says, kept for `/v2/sessions/{id}/events`), plus
/// allocator metadata and thread caches, a few MiB.
const KEPT_AFTER_ROUND: u64 = 16 << 20;

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
        let after = rss_settles_below(&server, before + KEPT_AFTER_ROUND).await;
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
