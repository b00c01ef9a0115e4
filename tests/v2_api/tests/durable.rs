//! Durable sessions (research/contract.md, "Durable sessions"): the real
//! server writes its inventory and event logs to a real SQLite file or a
//! real PostgreSQL server (a private one per test, started here), is killed
//! or stopped, and a new server on the same store shows everything again.
//!
//! Every scenario that makes sense for both backends runs against both:
//! `<scenario>::sqlite` and `<scenario>::postgres`.

use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::migrate::{Migration, MigrationSource, MigrationType, Migrator};
use std::borrow::Cow;
use std::path::Path;
use std::time::Duration;
use v2_api_tests::{PgServer, TempDir, TestServer, acp, path_segment};

const MOCK: &str = "mock";
const TIMEOUT: Duration = Duration::from_secs(20);

/// Where a scenario's servers keep their sessions.
struct Backend {
    /// `--store` (`None`: the default, SQLite in the data dir).
    store: Option<String>,
    /// The private PostgreSQL server, for PostgreSQL scenarios.
    pg: Option<PgServer>,
}

impl Backend {
    fn sqlite() -> Self {
        Self {
            store: None,
            pg: None,
        }
    }

    async fn postgres() -> Self {
        let pg = PgServer::start().await;
        pg.create_database("sessions").await;
        Self {
            store: Some(pg.url("sessions")),
            pg: Some(pg),
        }
    }

    /// Starts a server on `data_dir` with this store and `runtime_id`.
    async fn start(&self, data_dir: &Path, runtime_id: Option<&str>) -> TestServer {
        match runtime_id {
            Some(id) => self.start_with(data_dir, &["--runtime-id", id]).await,
            None => self.start_with(data_dir, &[]).await,
        }
    }

    /// Starts a server on `data_dir` with this store and `extra` arguments.
    async fn start_with(&self, data_dir: &Path, extra: &[&str]) -> TestServer {
        let args = self.args(data_dir, extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        TestServer::start(&args).await
    }

    /// The server arguments for `data_dir`, this store and `extra`.
    fn args(&self, data_dir: &Path, extra: &[&str]) -> Vec<String> {
        let data_dir = data_dir.to_str().expect("UTF-8 temp dir").to_owned();
        let mut args = vec!["--data-dir".to_owned(), data_dir];
        if let Some(store) = &self.store {
            args.extend(["--store".to_owned(), store.clone()]);
        }
        args.extend(extra.iter().map(|arg| (*arg).to_owned()));
        args
    }

    /// The stored events' count and lowest and highest offsets, read from
    /// the database itself (no server running on it).
    async fn stored_offsets(&self, data_dir: &Path) -> (i64, i64, i64) {
        sqlx::any::install_default_drivers();
        let url = match &self.store {
            Some(url) => url.clone(),
            None => format!(
                "sqlite://{}?mode=ro",
                data_dir.join("sessions.db").display()
            ),
        };
        let pool = sqlx::AnyPool::connect(&url).await.expect("open the store");
        let row: (i64, i64, i64) =
            sqlx::query_as("SELECT COUNT(*), MIN(event_offset), MAX(event_offset) FROM events")
                .fetch_one(&pool)
                .await
                .expect("read the events table");
        pool.close().await;
        row
    }
}

/// Runs `$scenario(backend)` once per backend, as `$scenario::sqlite` and
/// `$scenario::postgres`.
macro_rules! on_both_backends {
    ($($scenario:ident),* $(,)?) => {$(
        mod $scenario {
            #[tokio::test]
            async fn sqlite() {
                super::$scenario(super::Backend::sqlite()).await;
            }

            #[tokio::test]
            async fn postgres() {
                super::$scenario(super::Backend::postgres().await).await;
            }
        }
    )*};
}

on_both_backends!(
    killed_mid_turn_then_restarted_the_history_is_back_and_load_continues,
    sigterm_loses_nothing_and_live_sessions_come_back_dormant,
    runtime_ids_see_only_their_own_sessions,
    a_store_at_schema_version_1_is_migrated_at_start,
    a_store_at_schema_version_3_keeps_every_session_and_event,
    a_store_at_schema_version_4_keeps_every_session_and_event,
    a_session_past_its_event_cap_keeps_its_newest_events_stored,
    a_second_server_with_one_runtime_id_is_refused_until_the_first_dies,
);

async fn new_session_with_metadata(server: &TestServer, conn: &str, title: &str) -> String {
    let params = json!({
        "cwd": "/tmp",
        "mcpServers": [],
        "_meta": {"sandboxagent.dev": {"agent": MOCK, "title": title, "labels": {"team": "infra"}}}
    });
    let answer = server.rpc(conn, 1, "session/new", params).await;
    answer["result"]["sessionId"]
        .as_str()
        .unwrap_or_else(|| panic!("session/new failed: {answer}"))
        .to_owned()
}

async fn entry(server: &TestServer, session: &str) -> Value {
    server
        .get_json(&format!(
            "/v2/sessions/{}?agent={MOCK}",
            path_segment(session)
        ))
        .await
}

/// The text of the `agent_message_chunk`s in `events` (event log entries).
fn agent_text(events: &[Value]) -> String {
    events
        .iter()
        .filter(|e| e["message"]["params"]["update"]["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|e| e["message"]["params"]["update"]["content"]["text"].as_str())
        .collect()
}

fn offsets(events: &[Value]) -> Vec<u64> {
    events
        .iter()
        .map(|e| e["offset"].as_u64().expect("offset"))
        .collect()
}

async fn killed_mid_turn_then_restarted_the_history_is_back_and_load_continues(backend: Backend) {
    let data = TempDir::new("kill");
    let mut first = backend.start(data.path(), None).await;
    let conn = first.initialize(MOCK).await;
    let session = new_session_with_metadata(&first, &conn, "Durable one").await;
    let answer = first.prompt(&conn, &session, json!(2), "hello one").await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let settled = first.all_events(&session).await;
    assert!(agent_text(&settled).contains("hello one"), "{settled:?}");

    // A second turn streams slowly; the server is killed in the middle of it.
    let mut stream = first.open_stream(&conn, None).await;
    let api = first.api();
    let (conn2, session2) = (conn.clone(), session.clone());
    let turn = tokio::spawn(async move {
        api.post(
            Some(&conn2),
            &acp::request(
                3,
                "session/prompt",
                acp::prompt_params(&session2, "!slow 200 20"),
            ),
        )
        .await
    });
    let mut chunks_seen = 0;
    while chunks_seen < 10 {
        let event = stream.next_event(TIMEOUT).await;
        if event.update_kind() == Some("agent_message_chunk") {
            chunks_seen += 1;
        }
    }
    let seen_before_kill = first
        .get_json(&format!(
            "/v2/sessions/{}?agent={MOCK}",
            path_segment(&session)
        ))
        .await["_meta"]["sandboxagent.dev"]["eventCount"]
        .as_u64()
        .expect("eventCount");
    // What was recorded before the writer last caught up is committed, and
    // survives SIGKILL (the turn goes on meanwhile: 200 chunks, 20 ms apart).
    // Waiting for the catch-up rather than a fixed time keeps this true on
    // a loaded machine, where a batch can take longer than usual.
    first.store_caught_up(TIMEOUT).await;
    first
        .kill_now(TIMEOUT)
        .await
        .expect("SIGKILL ends the server");
    drop(stream);
    let _ = turn.await;
    drop(first);

    let second = backend.start(data.path(), None).await;
    let restored = entry(&second, &session).await;
    let meta = &restored["_meta"]["sandboxagent.dev"];
    assert_eq!(
        meta["dormant"], true,
        "a live session comes back dormant: {restored}"
    );
    assert_eq!(meta["ended"], false, "{restored}");
    assert_eq!(restored["title"], "Durable one", "{restored}");
    assert_eq!(meta["labels"], json!({"team": "infra"}), "{restored}");
    assert_eq!(restored["cwd"], "/tmp", "{restored}");
    let count = meta["eventCount"].as_u64().expect("eventCount");
    assert!(
        count >= seen_before_kill,
        "events committed before the kill are stored: {count} < {seen_before_kill}"
    );
    let events = second.all_events(&session).await;
    assert_eq!(
        offsets(&events),
        (0..count).collect::<Vec<_>>(),
        "the stored log is whole and in order"
    );
    assert_eq!(
        &events[..settled.len()],
        &settled[..],
        "the first turn reads back byte for byte (offsets, times, directions, messages)"
    );

    // session/load on the dormant session: the agent starts, loads it from
    // its own state and replays; the conversation goes on.
    let conn = second.initialize(MOCK).await;
    let mut stream = second.open_stream(&conn, None).await;
    let load = second
        .rpc(
            &conn,
            10,
            "session/load",
            json!({"sessionId": session, "cwd": "/tmp", "mcpServers": []}),
        )
        .await;
    assert!(load.get("result").is_some(), "session/load failed: {load}");
    let replayed = stream
        .collect_until(
            |e| {
                e.chunk_text("user_message_chunk")
                    .is_some_and(|t| t.contains("hello one"))
            },
            TIMEOUT,
        )
        .await;
    assert!(!replayed.is_empty());
    let answer = second.prompt(&conn, &session, json!(11), "hello two").await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let after = entry(&second, &session).await;
    assert!(
        after["_meta"]["sandboxagent.dev"].get("dormant").is_none(),
        "loaded: no longer dormant: {after}"
    );
    assert_eq!(
        after["title"], "Durable one",
        "metadata kept across the load"
    );
    let events = second.all_events(&session).await;
    let total = events.len() as u64;
    assert_eq!(
        offsets(&events),
        (0..total).collect::<Vec<_>>(),
        "the log goes on after the stored events"
    );
    assert!(total > count);
    assert_eq!(
        events[count as usize]["message"]["method"],
        "session/load",
        "the load request comes first, before the history the agent replays: {:?}",
        &events[count as usize..]
    );
    assert!(agent_text(&events[count as usize..]).contains("hello two"));
}

async fn sigterm_loses_nothing_and_live_sessions_come_back_dormant(backend: Backend) {
    let data = TempDir::new("term");
    let mut first = backend.start(data.path(), None).await;
    let conn = first.initialize(MOCK).await;
    let session = new_session_with_metadata(&first, &conn, "Kept").await;
    for (id, text) in [(2, "first words"), (3, "second words")] {
        let answer = first.prompt(&conn, &session, json!(id), text).await;
        assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    }
    let patch = first
        .rpc(
            &conn,
            4,
            "_sandboxagent/session/set_metadata",
            json!({"sessionId": session, "metadata": {"title": "Renamed", "ticket": 42}}),
        )
        .await;
    assert!(patch.get("result").is_some(), "{patch}");
    let before = first.all_events(&session).await;
    // SIGTERM at once: nothing may be waiting for a batch any more.
    first.send_sigterm();
    first
        .wait_exit(TIMEOUT)
        .await
        .expect("SIGTERM ends the server");
    drop(first);

    let second = backend.start(data.path(), None).await;
    let restored = entry(&second, &session).await;
    let meta = &restored["_meta"]["sandboxagent.dev"];
    assert_eq!(restored["title"], "Renamed", "{restored}");
    assert_eq!(meta["ticket"], 42, "{restored}");
    assert_eq!(meta["dormant"], true, "{restored}");
    assert_eq!(
        meta["ended"], false,
        "a shutdown does not end sessions: {restored}"
    );
    assert_eq!(meta["eventCount"], before.len(), "{restored}");
    assert_eq!(
        second.all_events(&session).await,
        before,
        "every event, exactly"
    );
    let listed = second.get_json("/v2/sessions").await;
    let ids: Vec<&str> = listed["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .filter_map(|s| s["sessionId"].as_str())
        .collect();
    assert_eq!(ids, [session.as_str()]);
    // session/list (answered by the runtime) shows it too.
    let conn = second.initialize(MOCK).await;
    let list = second.rpc(&conn, 5, "session/list", json!({})).await;
    assert_eq!(
        list["result"]["sessions"][0]["sessionId"],
        session.as_str(),
        "{list}"
    );
    // Terminating a dormant session ends it for good: no longer dormant.
    let ended = second
        .rpc(
            &conn,
            6,
            "_sandboxagent/session/terminate",
            json!({"sessionId": session}),
        )
        .await;
    assert_eq!(ended["result"]["alreadyEnded"], false, "{ended}");
    let after = entry(&second, &session).await;
    assert_eq!(after["_meta"]["sandboxagent.dev"]["ended"], true, "{after}");
    assert!(
        after["_meta"]["sandboxagent.dev"].get("dormant").is_none(),
        "{after}"
    );
}

/// A session past `--event-log-events` keeps its newest events in the
/// store, one run of offsets ending at its last: the writer prunes in each
/// batch's transaction, in steps of an eighth of the cap, so the store
/// holds between the cap and the cap plus a step (research/contract.md,
/// "What is stored").
async fn a_session_past_its_event_cap_keeps_its_newest_events_stored(backend: Backend) {
    const CAP: i64 = 800;
    let data = TempDir::new("cap");
    let mut server = backend
        .start_with(data.path(), &["--event-log-events", "800"])
        .await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let answer = server
        .prompt(&conn, &session, json!(2), "!emit 5000 16")
        .await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let count = entry(&server, &session).await["_meta"]["sandboxagent.dev"]["eventCount"]
        .as_i64()
        .expect("an event count");
    assert!(count > 5000, "every update is an event: {count}");
    server.send_sigterm();
    server
        .wait_exit(TIMEOUT)
        .await
        .expect("SIGTERM ends the server");
    drop(server);

    let (rows, first, last) = backend.stored_offsets(data.path()).await;
    assert_eq!(last, count - 1, "the newest event is stored");
    assert_eq!(rows, last - first + 1, "one run of offsets, no hole");
    assert!(
        (count - CAP - CAP / 8 < first) && (first <= count - CAP),
        "{rows} events stored from offset {first} of {count}: the cap ({CAP}) plus less than a step"
    );
}

async fn runtime_ids_see_only_their_own_sessions(backend: Backend) {
    let (dir_a, dir_b, dir_c) = (
        TempDir::new("rid-a"),
        TempDir::new("rid-b"),
        TempDir::new("rid-c"),
    );
    // SQLite: one file both runtimes share; PostgreSQL: one database.
    let shared = TempDir::new("rid-shared");
    let backend = match backend.store {
        Some(_) => backend,
        None => Backend {
            store: Some(format!(
                "sqlite:{}",
                shared.path().join("shared.db").display()
            )),
            pg: None,
        },
    };
    let mut a = backend.start(dir_a.path(), Some("sandbox-a")).await;
    let b = backend.start(dir_b.path(), Some("sandbox-b")).await;
    let conn_a = a.initialize(MOCK).await;
    let conn_b = b.initialize(MOCK).await;
    let session_a = new_session_with_metadata(&a, &conn_a, "of a").await;
    let session_b = new_session_with_metadata(&b, &conn_b, "of b").await;
    a.prompt(&conn_a, &session_a, json!(2), "words of a").await;
    a.store_caught_up(TIMEOUT).await;
    b.store_caught_up(TIMEOUT).await;
    let ids = |listing: &Value| -> Vec<String> {
        listing["sessions"]
            .as_array()
            .expect("sessions")
            .iter()
            .filter_map(|s| s["sessionId"].as_str().map(str::to_owned))
            .collect()
    };
    assert_eq!(ids(&a.get_json("/v2/sessions").await), [session_a.as_str()]);
    assert_eq!(ids(&b.get_json("/v2/sessions").await), [session_b.as_str()]);
    assert_eq!(a.health().await.json()["runtimeId"], "sandbox-a");
    let events_a = a.all_events(&session_a).await;
    a.send_sigterm();
    a.wait_exit(TIMEOUT).await.expect("a stops");
    drop(a);

    // A new sandbox (its own data dir) with a's id sees a's sessions, not b's.
    let c = backend.start(dir_c.path(), Some("sandbox-a")).await;
    assert_eq!(ids(&c.get_json("/v2/sessions").await), [session_a.as_str()]);
    assert_eq!(c.all_events(&session_a).await, events_a);
    // Its mock agent never saw that session: load answers with the agent's
    // own JSON-RPC error, and the entry stays.
    let conn = c.initialize(MOCK).await;
    let load = c
        .rpc(
            &conn,
            3,
            "session/load",
            json!({"sessionId": session_a, "cwd": "/tmp", "mcpServers": []}),
        )
        .await;
    assert!(
        load.get("error").is_some(),
        "the agent cannot load it: {load}"
    );
    assert_eq!(entry(&c, &session_a).await["title"], "of a");
    drop(b);
}

/// The SQL of the first schema versions, as an older binary applied them:
/// `(version, description, sql)`.
#[derive(Debug)]
struct OlderSchema(Vec<(i64, &'static str, &'static str)>);

impl<'s> MigrationSource<'s> for OlderSchema {
    fn resolve(
        self,
    ) -> futures::future::BoxFuture<'s, Result<Vec<Migration>, sqlx::error::BoxDynError>> {
        Box::pin(async move {
            Ok(self
                .0
                .into_iter()
                .map(|(version, description, sql)| {
                    Migration::new(
                        version,
                        Cow::Borrowed(description),
                        MigrationType::Simple,
                        Cow::Borrowed(sql),
                        false,
                    )
                })
                .collect())
        })
    }
}

/// The migrations of schema versions 1 to `version` (3 or 4) of `backend`
/// (`"sqlite"` or `"postgres"`), as the binaries of that version had them.
fn older_schema(backend: &str, version: usize) -> OlderSchema {
    let sql = match backend {
        "postgres" => [
            include_str!("../../../acp-runtime/migrations/postgres/0001_sessions_and_events.sql"),
            include_str!(
                "../../../acp-runtime/migrations/postgres/0002_hints_and_listing_index.sql"
            ),
            include_str!(
                "../../../acp-runtime/migrations/postgres/0003_first_prompt_and_id_index.sql"
            ),
            include_str!("../../../acp-runtime/migrations/postgres/0004_integer_session_keys.sql"),
        ],
        _ => [
            include_str!("../../../acp-runtime/migrations/sqlite/0001_sessions_and_events.sql"),
            include_str!("../../../acp-runtime/migrations/sqlite/0002_hints_and_listing_index.sql"),
            include_str!(
                "../../../acp-runtime/migrations/sqlite/0003_first_prompt_and_id_index.sql"
            ),
            include_str!("../../../acp-runtime/migrations/sqlite/0004_integer_session_keys.sql"),
        ],
    };
    let descriptions = [
        "sessions and events",
        "hints and listing index",
        "first prompt and id index",
        "integer session keys",
    ];
    OlderSchema(
        (1..)
            .zip(descriptions.into_iter().zip(sql))
            .take(version)
            .map(|(number, (description, sql))| (number, description, sql))
            .collect(),
    )
}

async fn a_store_at_schema_version_1_is_migrated_at_start(backend: Backend) {
    let data = TempDir::new("migrate");
    let (url, sql) = match &backend.store {
        Some(url) => (
            url.clone(),
            include_str!("../../../acp-runtime/migrations/postgres/0001_sessions_and_events.sql"),
        ),
        None => (
            format!(
                "sqlite://{}?mode=rwc",
                data.path().join("sessions.db").display()
            ),
            include_str!("../../../acp-runtime/migrations/sqlite/0001_sessions_and_events.sql"),
        ),
    };
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&url).await.expect("open the store");
    Migrator::new(OlderSchema(vec![(1, "sessions and events", sql)]))
        .await
        .expect("version 1 migrator")
        .run(&pool)
        .await
        .expect("schema version 1");
    let placeholders = |n: usize| -> String {
        let mark = if backend.store.is_some() { "$" } else { "?" };
        (1..=n)
            .map(|i| format!("{mark}{i}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let created: i64 = 1_700_000_000_000_000_000;
    sqlx::query(&format!(
        "INSERT INTO sessions (runtime_id, agent, session_id, cwd, created_ns, updated_ns, \
         end_reason, metadata, event_count) VALUES ({})",
        placeholders(9)
    ))
    .bind("old-runtime")
    .bind(MOCK)
    .bind("old-session")
    .bind("/srv")
    .bind(created)
    .bind(created + 1_000_000)
    .bind("completed")
    .bind(r#"{"title":"From v1","labels":{"k":"v"}}"#)
    .bind(2_i64)
    .execute(&pool)
    .await
    .expect("a version 1 session");
    for (offset, direction, message) in [
        (
            0_i64,
            "client_to_agent",
            r#"{"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{"sessionId":"old-session","prompt":[]}}"#,
        ),
        (
            1,
            "agent_to_client",
            r#"{"jsonrpc":"2.0","id":1,"result":{"stopReason":"end_turn"}}"#,
        ),
    ] {
        sqlx::query(&format!(
            "INSERT INTO events (runtime_id, agent, session_id, event_offset, at_ns, direction, \
             message) VALUES ({})",
            placeholders(7)
        ))
        .bind("old-runtime")
        .bind(MOCK)
        .bind("old-session")
        .bind(offset)
        .bind(created + offset)
        .bind(direction)
        .bind(message.as_bytes().to_vec())
        .execute(&pool)
        .await
        .expect("a version 1 event");
    }
    pool.close().await;

    let server = backend.start(data.path(), Some("old-runtime")).await;
    let restored = entry(&server, "old-session").await;
    let meta = &restored["_meta"]["sandboxagent.dev"];
    assert_eq!(restored["cwd"], "/srv", "{restored}");
    assert_eq!(meta["ended"], true, "{restored}");
    assert!(
        meta.get("dormant").is_none(),
        "an ended session is not dormant"
    );
    assert_eq!(meta["createdAt"], "2023-11-14T22:13:20.000Z", "{restored}");
    assert_eq!(meta["eventCount"], 2);
    assert_eq!(meta["labels"], json!({"k": "v"}));
    assert_eq!(
        restored["title"], "From v1",
        "the v1 title (metadata) still shows"
    );
    let events = server.all_events("old-session").await;
    assert_eq!(offsets(&events), [0, 1]);
    assert_eq!(events[1]["message"]["result"]["stopReason"], "end_turn");
    assert_eq!(events[0]["direction"], "client_to_agent");
    // A new session is written with the version 2 columns.
    let conn = server.initialize(MOCK).await;
    let fresh = new_session_with_metadata(&server, &conn, "v2").await;
    assert_eq!(entry(&server, &fresh).await["title"], "v2");
}

/// The text of event `offset` of `session` in the older stores below.
fn old_text(runtime: &str, session: &str, offset: i64) -> String {
    format!("{runtime}/{session} #{offset}")
}

/// Schema version 4 keys events by an integer per session: a version 3
/// store (several sessions, two runtime ids sharing a session id, a pruned
/// log, an entry without events, a log longer than a page) opens, and every
/// session and event is there with its offset, time, direction and bytes.
async fn a_store_at_schema_version_3_keeps_every_session_and_event(backend: Backend) {
    an_older_store_keeps_every_session_and_event(backend, 3).await;
}

/// Schema version 5 (SQLite) keeps events in a rowid table: the same for a
/// version 4 store. PostgreSQL is at version 4: the store opens as it is.
async fn a_store_at_schema_version_4_keeps_every_session_and_event(backend: Backend) {
    an_older_store_keeps_every_session_and_event(backend, 4).await;
}

/// A store at schema `version` (3 or 4), filled as a binary of that version
/// would, opens with every session and event (see the two tests above).
async fn an_older_store_keeps_every_session_and_event(backend: Backend, version: usize) {
    let data = TempDir::new(&format!("migrate-{version}"));
    let (url, kind) = match &backend.store {
        Some(url) => (url.clone(), "postgres"),
        None => (
            format!(
                "sqlite://{}?mode=rwc",
                data.path().join("sessions.db").display()
            ),
            "sqlite",
        ),
    };
    sqlx::any::install_default_drivers();
    let pool = sqlx::AnyPool::connect(&url).await.expect("open the store");
    Migrator::new(older_schema(kind, version))
        .await
        .expect("older migrator")
        .run(&pool)
        .await
        .expect("older schema version");
    let mark = if kind == "postgres" { "$" } else { "?" };
    let placeholders = |n: usize| -> String {
        (1..=n)
            .map(|i| format!("{mark}{i}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let created: i64 = 1_700_000_000_000_000_000;
    // (runtime id, session id, end reason, stored offsets, event count)
    type OldSession<'a> = (&'a str, &'a str, Option<&'a str>, std::ops::Range<i64>, i64);
    let sessions: [OldSession; 4] = [
        ("old-runtime", "long", Some("completed"), 0..1200, 1200),
        ("old-runtime", "pruned", None, 40..60, 60),
        ("old-runtime", "quiet", Some("error"), 0..0, 0),
        ("other-runtime", "long", Some("completed"), 0..3, 3),
    ];
    let mut tx = pool.begin().await.expect("a transaction");
    for (at, (runtime, session, end, offsets, count)) in sessions.iter().enumerate() {
        sqlx::query(&format!(
            "INSERT INTO sessions (runtime_id, agent, session_id, cwd, created_ns, updated_ns, \
             end_reason, metadata, event_count, title) VALUES ({})",
            placeholders(10)
        ))
        .bind(*runtime)
        .bind(MOCK)
        .bind(*session)
        .bind("/srv")
        .bind(created + i64::try_from(at).expect("small") * 1_000_000_000)
        .bind(created + 5_000_000_000)
        .bind(*end)
        .bind("{}")
        .bind(*count)
        .bind(format!("{runtime} {session}"))
        .execute(&mut *tx)
        .await
        .expect("an older session");
        if version >= 4 && !offsets.is_empty() {
            sqlx::query(&format!(
                "INSERT INTO session_keys (runtime_id, agent, session_id) VALUES ({})",
                placeholders(3)
            ))
            .bind(*runtime)
            .bind(MOCK)
            .bind(*session)
            .execute(&mut *tx)
            .await
            .expect("a session key");
        }
        for offset in offsets.clone() {
            let direction = if offset % 3 == 0 {
                "client_to_agent"
            } else {
                "agent_to_client"
            };
            let message = json!({
                "jsonrpc": "2.0",
                "method": "session/update",
                "params": {"sessionId": session, "update": {
                    "sessionUpdate": "agent_message_chunk",
                    "content": {"type": "text", "text": old_text(runtime, session, offset)}
                }}
            });
            let insert = if version >= 4 {
                format!(
                    "INSERT INTO events (session_key, event_offset, at_ns, direction, message) \
                     SELECT session_key, {mark}4, {mark}5, {mark}6, {mark}7 FROM session_keys \
                     WHERE runtime_id = {mark}1 AND agent = {mark}2 AND session_id = {mark}3"
                )
            } else {
                format!(
                    "INSERT INTO events (runtime_id, agent, session_id, event_offset, at_ns, \
                     direction, message) VALUES ({})",
                    placeholders(7)
                )
            };
            sqlx::query(&insert)
                .bind(*runtime)
                .bind(MOCK)
                .bind(*session)
                .bind(offset)
                .bind(created + offset * 1_000_000)
                .bind(direction)
                .bind(message.to_string().into_bytes())
                .execute(&mut *tx)
                .await
                .expect("an older event");
        }
    }
    tx.commit().await.expect("commit the older rows");
    pool.close().await;

    for runtime in ["old-runtime", "other-runtime"] {
        let server = backend.start(data.path(), Some(runtime)).await;
        let listing = server.get_json("/v2/sessions?limit=100").await;
        let mut listed: Vec<&str> = listing["sessions"]
            .as_array()
            .expect("sessions")
            .iter()
            .filter_map(|entry| entry["sessionId"].as_str())
            .collect();
        listed.sort_unstable();
        let mut expected: Vec<&str> = sessions
            .iter()
            .filter(|(r, ..)| *r == runtime)
            .map(|(_, session, ..)| *session)
            .collect();
        expected.sort_unstable();
        assert_eq!(listed, expected, "{runtime}: {listing}");
        for (_, session, end, stored, count) in sessions.iter().filter(|(r, ..)| *r == runtime) {
            let restored = entry(&server, session).await;
            let meta = &restored["_meta"]["sandboxagent.dev"];
            assert_eq!(meta["eventCount"], *count, "{restored}");
            assert_eq!(
                meta["ended"].as_bool().unwrap_or(false),
                end.is_some(),
                "{restored}"
            );
            assert_eq!(restored["title"], format!("{runtime} {session}"));
            let events = server.all_events(session).await;
            let want: Vec<u64> = stored
                .clone()
                .map(|o| u64::try_from(o).expect("offset"))
                .collect();
            assert_eq!(offsets(&events), want, "{runtime}/{session}");
            for event in &events {
                let offset = event["offset"].as_i64().expect("offset");
                assert_eq!(
                    event["message"]["params"]["update"]["content"]["text"],
                    old_text(runtime, session, offset),
                    "{event}"
                );
                let direction = if offset % 3 == 0 {
                    "client_to_agent"
                } else {
                    "agent_to_client"
                };
                assert_eq!(event["direction"], direction, "{event}");
                // created_ns is 2023-11-14T22:13:20Z; event n is n ms later.
                let at = format!(
                    "2023-11-14T22:13:{:02}.{:03}Z",
                    20 + offset / 1000,
                    offset % 1000
                );
                assert_eq!(event["at"], at, "{event}");
            }
        }
    }
    // The upgraded store takes new sessions and events, and keeps them.
    let mut server = backend.start(data.path(), Some("old-runtime")).await;
    let conn = server.initialize(MOCK).await;
    let fresh = new_session_with_metadata(&server, &conn, "after the upgrade").await;
    let answer = server
        .prompt(&conn, &fresh, json!(2), "written after the upgrade")
        .await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    server.store_caught_up(TIMEOUT).await;
    let before = server.all_events(&fresh).await;
    server.kill_now(TIMEOUT).await.expect("SIGKILL");
    drop(server);
    let server = backend.start(data.path(), Some("old-runtime")).await;
    assert_eq!(server.all_events(&fresh).await, before);
    assert!(agent_text(&before).contains("written after the upgrade"));
    assert_eq!(offsets(&server.all_events("long").await).len(), 1200);
}

#[tokio::test]
async fn postgres_stopped_mid_run_the_runtime_serves_on_and_writes_later() {
    let backend = Backend::postgres().await;
    let pg = backend.pg.as_ref().expect("postgres");
    let data = TempDir::new("pg-down");
    let mut first = backend.start(data.path(), None).await;
    let conn = first.initialize(MOCK).await;
    let session = new_session_with_metadata(&first, &conn, "outage").await;
    first.store_caught_up(TIMEOUT).await;

    pg.stop().await;
    let answer = first
        .prompt(
            &conn,
            &session,
            json!(2),
            "said while the database was down",
        )
        .await;
    assert_eq!(
        answer["result"]["stopReason"], "end_turn",
        "serving goes on without the store: {answer}"
    );
    let degraded = first.store_state("degraded", Duration::from_secs(40)).await;
    assert!(degraded["storeError"].is_string(), "{degraded}");
    assert!(degraded["storeWaiting"].as_u64() > Some(0), "{degraded}");
    // Memory still answers the event log while the store is away.
    let during = first.all_events(&session).await;
    assert!(agent_text(&during).contains("said while the database was down"));

    pg.start_again().await;
    let healthy = first.store_state("ok", Duration::from_secs(40)).await;
    assert_eq!(healthy["storeDroppedEvents"], 0, "{healthy}");
    first.store_caught_up(TIMEOUT).await;
    first.kill_now(TIMEOUT).await.expect("SIGKILL");
    drop(first);

    let second = backend.start(data.path(), None).await;
    let events = second.all_events(&session).await;
    assert_eq!(events, during, "what was said during the outage is stored");
}

#[tokio::test]
async fn a_corrupt_or_unwritable_sqlite_file_is_a_clear_start_up_error() {
    let data = TempDir::new("corrupt");
    let file = data.path().join("sessions.db");
    std::fs::write(&file, vec![0x5a_u8; 8192]).expect("write garbage");
    let (status, stderr) = run_server_expecting_exit(&["--data-dir", data.utf8()]).await;
    assert!(!status.success());
    assert!(
        stderr.contains(&file.display().to_string()),
        "the error names the file: {stderr}"
    );
    assert!(stderr.contains("session store"), "{stderr}");

    // A path that cannot be a file: its parent is a regular file.
    let blocker = data.path().join("not-a-dir");
    std::fs::write(&blocker, b"x").expect("write");
    let store = format!("sqlite:{}", blocker.join("sessions.db").display());
    let (status, stderr) =
        run_server_expecting_exit(&["--data-dir", data.utf8(), "--store", &store]).await;
    assert!(!status.success());
    assert!(
        stderr.contains(&blocker.display().to_string()),
        "the error names the path: {stderr}"
    );

    // Not a store URL at all: refused by the command line.
    let (status, stderr) = run_server_expecting_exit(&["--store", "mysql://x/y"]).await;
    assert!(!status.success());
    assert!(stderr.contains("unknown store"), "{stderr}");
}

async fn run_server_expecting_exit(args: &[&str]) -> (std::process::ExitStatus, String) {
    v2_api_tests::server::start_up_outcome(args, TIMEOUT)
        .await
        .expect("the server exits at once")
}

/// SQLite's writer runs on a thread of its own, 10 nice steps below the
/// server's; the pool's threads (reads) keep the server's priority
/// (research/contract.md, "Writes leave the request path").
#[tokio::test]
async fn the_sqlite_writer_thread_runs_ten_nice_steps_lower() {
    let data = TempDir::new("nice");
    let server = Backend::sqlite().start(data.path(), None).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    // An answer waits for its commit: the writer's connection is open.
    let answer = server.prompt(&conn, &session, json!(2), "hello").await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let tasks = std::path::PathBuf::from(format!("/proc/{}/task", server.pid()));
    let nice_of = |task: &Path| -> Option<(String, i64)> {
        let comm = std::fs::read_to_string(task.join("comm")).ok()?;
        let stat = std::fs::read_to_string(task.join("stat")).ok()?;
        // Fields after the parenthesised name: state is field 3, nice 19.
        let after = stat.rsplit_once(") ")?.1;
        let nice = after.split(' ').nth(16)?.parse().ok()?;
        Some((comm.trim().to_owned(), nice))
    };
    let threads: Vec<(String, i64)> = std::fs::read_dir(&tasks)
        .expect("the server's threads")
        .filter_map(|task| nice_of(&task.ok()?.path()))
        .collect();
    let server_nice = nice_of(Path::new(&format!("/proc/{}", server.pid())))
        .expect("the server's nice value")
        .1;
    let sqlite: Vec<i64> = threads
        .iter()
        .filter(|(name, _)| name.starts_with("sqlx-sqlite"))
        .map(|(_, nice)| *nice)
        .collect();
    let lowered = (server_nice + 10).min(19);
    if lowered == server_nice {
        eprintln!("the server runs at nice {server_nice}: nothing lower to check");
        return;
    }
    assert_eq!(
        sqlite.iter().filter(|nice| **nice == lowered).count(),
        1,
        "one SQLite thread (the writer's) at {lowered}: {threads:?}"
    );
    assert!(
        sqlite.iter().filter(|nice| **nice == server_nice).count() >= 1,
        "the pool's SQLite threads at the server's {server_nice}: {threads:?}"
    );
}

#[tokio::test]
async fn with_store_memory_nothing_is_written_and_health_says_so() {
    let data = TempDir::new("memory");
    let server = TestServer::start(&["--data-dir", data.utf8(), "--store", "memory"]).await;
    let health = server.health().await;
    assert_eq!(health.status, StatusCode::OK);
    let health = health.json();
    assert_eq!(health["store"], "memory", "{health}");
    let conn = server.initialize(MOCK).await;
    server.new_session(&conn).await;
    assert!(!data.path().join("sessions.db").exists());
}

/// Servers started at once on one SQLite file, each with its own runtime
/// id, all open and migrate it: SQLite answers "database is locked" at
/// once, without waiting, when two migrations race, so opening takes turns
/// (research/contract.md, "Durable sessions").
#[tokio::test]
async fn servers_started_at_once_on_one_sqlite_file_all_start() {
    let data = TempDir::new("together");
    let dir = data.utf8().to_owned();
    let starts = (0..4).map(|n| {
        let dir = dir.clone();
        tokio::spawn(async move {
            TestServer::start(&["--data-dir", &dir, "--runtime-id", &format!("together-{n}")]).await
        })
    });
    let servers = futures::future::join_all(starts).await;
    for server in servers {
        let server = server.expect("every server starts");
        let health = server.health().await.json();
        assert_eq!(health["store"], "ok", "{health}");
    }
}

/// Servers started at once on a new data dir with its default runtime id:
/// they agree on one id (the first one's file stays), so exactly one runs
/// and the others are refused, naming that id (research/contract.md, "One
/// server per runtime id").
#[tokio::test]
async fn servers_started_at_once_on_a_new_data_dir_agree_on_one_runtime_id() {
    let data = TempDir::new("together-default");
    let starts = (0..3).map(|_| {
        let args = ["--data-dir".to_owned(), data.utf8().to_owned()];
        tokio::spawn(async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            v2_api_tests::server::start_up_outcome(&args, Duration::from_secs(8)).await
        })
    });
    let outcomes: Vec<_> = futures::future::join_all(starts)
        .await
        .into_iter()
        .map(|outcome| outcome.expect("the start-up task"))
        .collect();
    let written = std::fs::read_to_string(data.path().join("runtime-id")).expect("runtime-id");
    let running = outcomes.iter().filter(|o| o.is_none()).count();
    assert_eq!(running, 1, "exactly one server runs: {outcomes:?}");
    for (status, stderr) in outcomes.iter().flatten() {
        assert!(!status.success(), "{stderr}");
        assert!(
            stderr.contains(&format!("runtime id {:?}", written.trim())),
            "refused for the file's id {written:?}: {stderr}"
        );
    }
}

/// A second server with the runtime id of one that runs, on its store, is
/// refused at start with a message naming the runtime id, the data dir and
/// how to run a second server; one with another runtime id starts beside
/// it. The lock dies with its holder: after a SIGKILL of the first server
/// (its agent process still running) a new one starts at once and sees the
/// first one's session (research/contract.md, "One server per runtime id").
async fn a_second_server_with_one_runtime_id_is_refused_until_the_first_dies(backend: Backend) {
    let data = TempDir::new("one-runtime");
    let mut first = backend
        .start_with(data.path(), &["--runtime-id", "rid-1"])
        .await;
    let conn = first.initialize(MOCK).await;
    let session = first.new_session(&conn).await;
    assert!(
        !first.mock_agent_processes().is_empty(),
        "an agent process runs (it must not hold the lock)"
    );

    let args = backend.args(data.path(), &["--runtime-id", "rid-1"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (status, stderr) = run_server_expecting_exit(&args).await;
    assert_eq!(status.code(), Some(1), "{stderr}");
    let listens = format!("listens on {}", first.base_url());
    for part in [
        "another sandbox-agent server runs with runtime id \"rid-1\"",
        data.utf8(),
        listens.as_str(),
        "--url",
        "--data-dir",
        "--runtime-id",
    ] {
        assert!(stderr.contains(part), "{part:?} missing: {stderr}");
    }
    assert_eq!(
        stderr.matches("sandbox-agent: ").count(),
        1,
        "one line, no log of a start-up: {stderr}"
    );

    let other = backend
        .start_with(data.path(), &["--runtime-id", "rid-2"])
        .await;
    assert_eq!(other.health().await.json()["runtimeId"], "rid-2");

    first
        .kill_now(TIMEOUT)
        .await
        .expect("the first server dies");
    let again = backend
        .start_with(data.path(), &["--runtime-id", "rid-1"])
        .await;
    let listed = again.get_json("/v2/sessions?state=dormant").await;
    assert!(
        listed.to_string().contains(&session),
        "the first server's session: {listed}"
    );
}
