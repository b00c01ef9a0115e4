//! An answer a client has seen is durable, and a flood loses nothing
//! (research/contract.md, "Durable sessions"): the real server, a real
//! SQLite file (and the harness's real PostgreSQL), killed with SIGKILL the
//! moment an answer arrives, then started again on the same store.

use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;
use v2_api_tests::{PgServer, TempDir, TestServer, path_segment};

const MOCK: &str = "mock";
const TIMEOUT: Duration = Duration::from_secs(60);
/// Chunks of the turn that is answered and then killed.
const TURN_CHUNKS: usize = 2000;

/// Starts a server on `data_dir` with `--store store` (`None`: SQLite in
/// the data dir) and `extra` arguments.
async fn start(data_dir: &Path, store: Option<&str>, extra: &[&str]) -> TestServer {
    let mut args = vec!["--data-dir", data_dir.to_str().expect("UTF-8 temp dir")];
    if let Some(store) = store {
        args.extend(["--store", store]);
    }
    args.extend_from_slice(extra);
    TestServer::start(&args).await
}

/// How many of `events` are the agent's `agent_message_chunk` updates.
fn chunks(events: &[Value]) -> usize {
    events
        .iter()
        .filter(|event| {
            event["message"]["params"]["update"]["sessionUpdate"] == "agent_message_chunk"
        })
        .count()
}

/// Runs `runs` times: a turn of [`TURN_CHUNKS`] chunks is answered, the
/// server is killed with SIGKILL at once, and a new server on the same
/// store must show the whole turn, its answer included, offsets unbroken.
async fn answered_turns_survive_sigkill(store: Option<&str>, runs: usize) {
    let data = TempDir::new("answered");
    for run in 0..runs {
        let mut server = start(data.path(), store, &[]).await;
        let conn = server.initialize(MOCK).await;
        let session = server.new_session(&conn).await;
        let answer = server
            .prompt(
                &conn,
                &session,
                json!(2),
                &format!("!emit {TURN_CHUNKS} 64"),
            )
            .await;
        assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
        server.kill_now(TIMEOUT).await.expect("SIGKILL ends it");
        drop(server);

        let server = start(data.path(), store, &[]).await;
        let events = server.all_events(&session).await;
        let offsets: Vec<u64> = events
            .iter()
            .map(|event| event["offset"].as_u64().expect("offset"))
            .collect();
        assert_eq!(
            offsets,
            (0..events.len() as u64).collect::<Vec<_>>(),
            "run {run}: the stored log is unbroken"
        );
        assert_eq!(
            chunks(&events),
            TURN_CHUNKS,
            "run {run}: every update of the answered turn is stored"
        );
        let last = events.last().expect("events");
        assert_eq!(
            last["message"],
            json!({"jsonrpc": "2.0", "id": 2, "result": {"stopReason": "end_turn"}}),
            "run {run}: the answer the client saw is stored, last"
        );
        drop(server);
    }
}

#[tokio::test]
async fn an_answered_turn_survives_sigkill_sqlite_50_runs() {
    answered_turns_survive_sigkill(None, 50).await;
}

#[tokio::test]
async fn an_answered_turn_survives_sigkill_postgres_10_runs() {
    let pg = PgServer::start().await;
    pg.create_database("sessions").await;
    answered_turns_survive_sigkill(Some(&pg.url("sessions")), 10).await;
}

/// `_sandboxagent/session/terminate` answered: the end is stored, so the
/// session comes back ended, not dormant, after SIGKILL.
#[tokio::test]
async fn a_terminated_session_is_still_ended_after_sigkill() {
    let data = TempDir::new("terminated");
    for run in 0..10 {
        let mut server = start(data.path(), None, &[]).await;
        let conn = server.initialize(MOCK).await;
        let session = server.new_session(&conn).await;
        let answer = server
            .prompt(&conn, &session, json!(2), "!emit 500 64")
            .await;
        assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
        let ended = server
            .rpc(
                &conn,
                3,
                "_sandboxagent/session/terminate",
                json!({"sessionId": session}),
            )
            .await;
        assert_eq!(ended["result"]["alreadyEnded"], false, "{ended}");
        server.kill_now(TIMEOUT).await.expect("SIGKILL ends it");
        drop(server);

        let server = start(data.path(), None, &[]).await;
        let entry = server
            .get_json(&format!(
                "/v2/sessions/{}?agent={MOCK}",
                path_segment(&session)
            ))
            .await;
        let meta = &entry["_meta"]["sandboxagent.dev"];
        assert_eq!(meta["ended"], true, "run {run}: {entry}");
        assert_ne!(meta["dormant"], true, "run {run}: {entry}");
        let events = server.all_events(&session).await;
        assert!(
            events
                .iter()
                .any(|event| event["message"]["method"] == "_sandboxagent/session/ended"),
            "run {run}: the end notice is stored"
        );
    }
}

/// Four sessions of one agent flood it with 80 MB of updates while the
/// store cannot write (a test transaction holds PostgreSQL's `events` table
/// locked): reading the agent waits for the writer (`/v2/health` names the
/// agent meanwhile), and once the lock goes every event is stored,
/// `storeDroppedEvents` 0. Before, the writes past the 64 MiB queue cap
/// were dropped from the stored log.
#[tokio::test]
async fn a_flood_while_the_store_is_slow_waits_and_stores_every_event() {
    const SESSIONS: usize = 4;
    const CHUNKS: usize = 2_500;
    let pg = PgServer::start().await;
    pg.create_database("sessions").await;
    let url = pg.url("sessions");
    let data = TempDir::new("flood");
    let server = start(data.path(), Some(&url), &["--event-log-events", "20000"]).await;
    let conn = server.initialize(MOCK).await;
    let mut sessions = Vec::new();
    for _ in 0..SESSIONS {
        sessions.push(server.new_session(&conn).await);
    }
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&url).await.expect("open the store");
    let mut lock = pool.begin().await.expect("begin");
    sqlx::query("LOCK TABLE events IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .expect("lock the events table");

    let turns = sessions.iter().enumerate().map(|(index, session)| {
        let api = server.api();
        let (conn, session) = (conn.clone(), session.clone());
        async move {
            api.prompt(
                &conn,
                &session,
                json!(10 + index),
                &format!("!emit {CHUNKS} 8192"),
            )
            .await
        }
    });
    let turns = tokio::spawn(futures::future::join_all(turns));
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let health = server.get_json("/v2/health").await;
        if health["storePausedAgents"] == json!([MOCK]) {
            assert_eq!(
                health["store"], "ok",
                "a slow store is not degraded: {health}"
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the agent's reader never waited for the locked store: {health}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    lock.rollback().await.expect("unlock");

    for answer in turns.await.expect("turns") {
        assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    }
    let health = server.store_caught_up(TIMEOUT).await;
    assert_eq!(health["storeDroppedEvents"], 0, "{health}");
    assert!(
        health["storePauses"].as_u64().is_some_and(|n| n > 0),
        "{health}"
    );
    // How long is whole milliseconds: a pause the writer ended within one
    // reads 0 (seen once with the smaller shares of the budgeted queue).
    assert!(health["storePausedMs"].as_u64().is_some(), "{health}");
    assert_eq!(health["storePausedAgents"], json!([]), "{health}");
    for session in &sessions {
        let entry = server
            .get_json(&format!(
                "/v2/sessions/{}?agent={MOCK}",
                path_segment(session)
            ))
            .await;
        let count = entry["_meta"]["sandboxagent.dev"]["eventCount"]
            .as_u64()
            .expect("eventCount");
        let stored: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM events JOIN session_keys USING (session_key) \
                 WHERE agent = $1 AND session_id = $2",
        )
        .bind(MOCK)
        .bind(session.as_str())
        .fetch_one(&pool)
        .await
        .expect("count the stored events");
        assert_eq!(
            u64::try_from(stored).ok(),
            Some(count),
            "every event of {session} is in PostgreSQL"
        );
        assert!(count > CHUNKS as u64, "{entry}");
    }
}

/// A read of the store waits at most 10 s for a lock held elsewhere, then
/// fails as 503 `store-unavailable` (it waited as long as the lock before);
/// a live session memory holds is still answered by id meanwhile.
#[tokio::test]
async fn a_read_blocked_by_a_lock_fails_after_ten_seconds() {
    let pg = PgServer::start().await;
    pg.create_database("sessions").await;
    let url = pg.url("sessions");
    let data = TempDir::new("read-lock");
    let server = start(data.path(), Some(&url), &[]).await;
    let conn = server.initialize(MOCK).await;
    let live = server.new_session(&conn).await;
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&url).await.expect("open the store");
    let mut lock = pool.begin().await.expect("begin");
    sqlx::query("LOCK TABLE sessions IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .expect("lock the sessions table");
    let started = std::time::Instant::now();
    let reply = server.get("/v2/sessions?limit=5").await;
    let waited = started.elapsed();
    reply.assert_status(503);
    assert!(
        waited < Duration::from_secs(20),
        "gave up after the read timeout, not the lock: {waited:?}"
    );
    server
        .get(&format!("/v2/sessions/{}", path_segment(&live)))
        .await
        .assert_status(200);
    lock.rollback().await.expect("unlock");
    server.get("/v2/sessions?limit=5").await.assert_status(200);
}

/// The runtime's error answer to a prompt whose agent crashed is in the
/// session's event log, after the end notice, like every answer.
#[tokio::test]
async fn a_crashed_turns_error_answer_is_in_the_log() {
    let data = TempDir::new("crash-log");
    let server = start(data.path(), None, &[]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let answer = server.prompt(&conn, &session, json!(7), "!crash").await;
    assert_eq!(answer["error"]["code"], -32603, "{answer}");
    let events = server.all_events(&session).await;
    let ended = events
        .iter()
        .position(|e| e["message"]["method"] == "_sandboxagent/session/ended")
        .expect("the end notice is logged");
    let error = events
        .iter()
        .position(|e| e["message"]["id"] == 7 && e["message"]["error"].is_object())
        .unwrap_or_else(|| panic!("the error answer is logged: {events:#?}"));
    assert!(ended < error, "the end notice comes first");
    assert_eq!(events[error]["message"]["error"], answer["error"]);
}

/// A turn waiting on a permission when the server is killed: the next
/// start records `_sandboxagent/turn/interrupted` as the session's last
/// event, naming the prompt and the permission request; a further start
/// does not record it again (research/contract.md, "Restart semantics").
async fn a_killed_turn_is_recorded_as_interrupted_once(store: Option<&str>) {
    let data = TempDir::new("interrupted");
    let mut server = start(data.path(), store, &[]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let mut stream = server.open_stream(&conn, None).await;
    // The prompt's POST never gets an answer: the server dies under it.
    let post = server
        .api()
        .rpc_post(Some(&conn))
        .json(&v2_api_tests::acp::request(
            "p7",
            "session/prompt",
            v2_api_tests::acp::prompt_params(&session, "ask permission"),
        ));
    let _turn = tokio::spawn(post.send());
    let asked = stream
        .next_event_matching(
            |e| e.method() == Some("session/request_permission"),
            TIMEOUT,
        )
        .await;
    let request_id = asked.data["id"].clone();
    server.store_caught_up(TIMEOUT).await;
    server.kill_now(TIMEOUT).await.expect("SIGKILL ends it");
    drop(server);

    let server = start(data.path(), store, &[]).await;
    let events = server.all_events(&session).await;
    let last = events.last().expect("events");
    assert_eq!(last["direction"], "agent_to_client", "{last}");
    assert_eq!(
        last["message"],
        json!({"jsonrpc": "2.0", "method": "_sandboxagent/turn/interrupted", "params": {
            "sessionId": session,
            "reason": "server-stopped",
            "stopReason": "cancelled",
            "promptId": "p7",
            "requestIds": [request_id],
        }}),
        "the interruption is the last event"
    );
    let offsets: Vec<u64> = events
        .iter()
        .map(|event| event["offset"].as_u64().expect("offset"))
        .collect();
    assert_eq!(offsets, (0..events.len() as u64).collect::<Vec<_>>());
    let count = events.len();
    drop(server);

    let server = start(data.path(), store, &[]).await;
    let again = server.all_events(&session).await;
    assert_eq!(again.len(), count, "a second start records nothing more");
    let entry = server
        .get_json(&format!(
            "/v2/sessions/{}?agent={MOCK}",
            path_segment(&session)
        ))
        .await;
    assert_eq!(
        entry["_meta"]["sandboxagent.dev"]["dormant"], true,
        "{entry}"
    );
}

#[tokio::test]
async fn a_turn_killed_on_a_pending_permission_is_recorded_as_interrupted_sqlite() {
    a_killed_turn_is_recorded_as_interrupted_once(None).await;
}

#[tokio::test]
async fn a_turn_killed_on_a_pending_permission_is_recorded_as_interrupted_postgres() {
    let pg = PgServer::start().await;
    pg.create_database("sessions").await;
    a_killed_turn_is_recorded_as_interrupted_once(Some(&pg.url("sessions"))).await;
}

/// A turn waiting on a permission, then a second prompt the agent refuses
/// (-32600, a turn is already running), then SIGKILL: the next start
/// records the turn that was running as interrupted, not nothing because
/// the log's last prompt was answered (research/contract.md,
/// "`_sandboxagent/turn/interrupted`").
#[tokio::test]
async fn a_refused_second_prompt_does_not_hide_the_interrupted_turn() {
    let data = TempDir::new("interrupted-refused");
    let mut server = start(data.path(), None, &[]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let mut stream = server.open_stream(&conn, None).await;
    let post = server
        .api()
        .rpc_post(Some(&conn))
        .json(&v2_api_tests::acp::request(
            "A",
            "session/prompt",
            v2_api_tests::acp::prompt_params(&session, "ask permission"),
        ));
    let _turn = tokio::spawn(post.send());
    let asked = stream
        .next_event_matching(
            |e| e.method() == Some("session/request_permission"),
            TIMEOUT,
        )
        .await;
    let request_id = asked.data["id"].clone();
    let refused = server.prompt(&conn, &session, json!("B"), "hello").await;
    assert_eq!(refused["error"]["code"], -32600, "{refused}");
    server.store_caught_up(TIMEOUT).await;
    server.kill_now(TIMEOUT).await.expect("SIGKILL ends it");
    drop(server);

    let server = start(data.path(), None, &[]).await;
    let events = server.all_events(&session).await;
    let last = events.last().expect("events");
    assert_eq!(
        last["message"],
        json!({"jsonrpc": "2.0", "method": "_sandboxagent/turn/interrupted", "params": {
            "sessionId": session,
            "reason": "server-stopped",
            "stopReason": "cancelled",
            "promptId": "A",
            "requestIds": [request_id],
        }}),
        "turn A is recorded as interrupted, after B's refusal: {events:#?}"
    );
}
