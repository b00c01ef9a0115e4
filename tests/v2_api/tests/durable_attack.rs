//! Hostile input against durable sessions (research/contract.md, "Durable
//! sessions"): store URLs that carry secrets, rows edited by hand in the
//! SQLite file, and values a client or an agent chooses that PostgreSQL
//! refuses. Each test starts the real binary on a real store.

use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use v2_api_tests::server::{mock_agent_command, sandbox_agent_command};
use v2_api_tests::{PgServer, TempDir, TestServer};

const MOCK: &str = "mock";
const TIMEOUT: Duration = Duration::from_secs(30);

/// Runs `server <args>` until it exits (a start-up error); its stderr.
async fn start_up_error(args: &[&str]) -> String {
    let (status, stderr) = v2_api_tests::server::start_up_outcome(args, TIMEOUT)
        .await
        .expect("the server exits (it cannot reach the store)");
    assert!(!status.success());
    stderr
}

/// "Passwords in a PostgreSQL URL are never logged": libpq-style URLs may
/// carry the password as a `password=` query parameter, and a password
/// with an unescaped `/` ends the authority early.
#[tokio::test]
async fn a_password_anywhere_in_a_postgres_url_is_never_shown() {
    let data = TempDir::new("password");
    for url in [
        "postgres://user@127.0.0.1:1/db?password=hunter2query",
        "postgres://user:hunter2/slash@127.0.0.1:1/db",
    ] {
        let stderr = start_up_error(&["--data-dir", data.utf8(), "--store", url]).await;
        assert!(
            stderr.contains("cannot open the session store"),
            "a start-up error about the store: {stderr}"
        );
        assert!(
            !stderr.contains("hunter2"),
            "the password of {url} is shown: {stderr}"
        );
    }
}

/// Writes rows into the SQLite store of `data` (made by a first start)
/// with `statements`, each bound to this data dir's runtime id as `?1`.
async fn edit_sqlite(data: &Path, statements: &[&str]) {
    let runtime_id = std::fs::read_to_string(data.join("runtime-id"))
        .expect("the runtime-id file")
        .trim()
        .to_owned();
    sqlx::any::install_default_drivers();
    let url = format!("sqlite://{}?mode=rw", data.join("sessions.db").display());
    let pool = sqlx::AnyPool::connect(&url).await.expect("open the store");
    for sql in statements {
        sqlx::query(sql)
            .bind(&runtime_id)
            .execute(&pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    pool.close().await;
}

/// A store made by a first start, then stopped.
async fn fresh_sqlite_store(data: &TempDir) {
    let mut first = TestServer::start(&["--data-dir", data.utf8()]).await;
    first.send_sigterm();
    first.wait_exit(TIMEOUT).await.expect("SIGTERM stops it");
}

/// One row the runtime cannot read (an unknown end reason, a time that is
/// text) must not keep every other session of the runtime from coming back:
/// it is skipped with a warning naming it (the server once refused to start,
/// "unreadable row: unknown end reason", without naming the row).
#[tokio::test]
async fn one_unreadable_session_row_does_not_keep_the_server_down() {
    let data = TempDir::new("bad-session-row");
    fresh_sqlite_store(&data).await;
    edit_sqlite(
        data.path(),
        &[
            "INSERT INTO sessions (runtime_id, agent, session_id, cwd, created_ns, updated_ns, \
             end_reason, metadata, event_count) VALUES (?1, 'mock', 'good', '/tmp', 1, 2, \
             'completed', '{}', 0)",
            "INSERT INTO sessions (runtime_id, agent, session_id, cwd, created_ns, updated_ns, \
             end_reason, metadata, event_count) VALUES (?1, 'mock', 'bad-end', '/tmp', 3, 4, \
             'exploded', '{}', 0)",
            "INSERT INTO sessions (runtime_id, agent, session_id, cwd, created_ns, updated_ns, \
             end_reason, metadata, event_count) VALUES (?1, 'mock', 'bad-time', '/tmp', 'abc', 4, \
             NULL, '{}', 0)",
        ],
    )
    .await;
    let mut command = sandbox_agent_command();
    command
        .args(["server", "--no-token", "--host", "127.0.0.1", "--port", "0"])
        .args(["--data-dir", data.utf8()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let child = tokio::process::Command::from(command)
        .kill_on_drop(true)
        .spawn()
        .expect("spawn the server");
    if let Ok(output) = tokio::time::timeout(Duration::from_secs(5), child.wait_with_output()).await
    {
        let output = output.expect("its output");
        panic!(
            "one bad row stopped the server from starting ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let server = TestServer::start(&["--data-dir", data.utf8()]).await;
    let good = server.get("/v2/sessions/good?agent=mock").await;
    good.assert_status(200);
}

/// A stored event row the runtime cannot read (an unknown direction, a
/// message stored as text) answers every page that touches it with 503
/// "cannot be read right now", forever, hiding the good events around it.
#[tokio::test]
async fn one_unreadable_event_row_does_not_hide_the_rest_of_the_log() {
    let data = TempDir::new("bad-event-row");
    fresh_sqlite_store(&data).await;
    edit_sqlite(
        data.path(),
        &[
            "INSERT INTO sessions (runtime_id, agent, session_id, cwd, created_ns, updated_ns, \
             end_reason, metadata, event_count) VALUES (?1, 'mock', 's', '/tmp', 1, 2, \
             'completed', '{}', 3)",
            "INSERT INTO session_keys (runtime_id, agent, session_id) VALUES (?1, 'mock', 's')",
            // Schema version 5: the event id is session_key * 2^32 + offset.
            "INSERT INTO events (event_id, at_ns, direction, message) \
             SELECT session_key * 4294967296 + 0, 10, 'client_to_agent', \
             CAST('{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"x\"}' AS BLOB) \
             FROM session_keys WHERE runtime_id = ?1 AND session_id = 's'",
            "INSERT INTO events (event_id, at_ns, direction, message) \
             SELECT session_key * 4294967296 + 1, 11, 'sideways', CAST('{}' AS BLOB) \
             FROM session_keys WHERE runtime_id = ?1 AND session_id = 's'",
            "INSERT INTO events (event_id, at_ns, direction, message) \
             SELECT session_key * 4294967296 + 2, 12, 'agent_to_client', 'text' \
             FROM session_keys WHERE runtime_id = ?1 AND session_id = 's'",
        ],
    )
    .await;
    let server = TestServer::start(&["--data-dir", data.utf8()]).await;
    let page = server
        .get("/v2/sessions/s/events?agent=mock&offset=0&limit=10")
        .await;
    assert_eq!(
        page.status.as_u16(),
        200,
        "the good event at offset 0 is readable: {}",
        page.text()
    );
    let page = page.json();
    assert_eq!(page["events"][0]["offset"], 0, "{page}");
}

/// A turn left open behind 300 unreadable rows (more than one read of the
/// start-up scan) is still found and recorded as interrupted: the scan
/// once moved back only past rows it could read, so it read the same
/// unreadable tail again and again, gave up after 20,000 reads ("not checked
/// further") and recorded nothing.
#[tokio::test]
async fn an_open_turn_behind_unreadable_rows_is_recorded_as_interrupted() {
    let data = TempDir::new("interrupted-behind-bad-rows");
    fresh_sqlite_store(&data).await;
    edit_sqlite(
        data.path(),
        &[
            "INSERT INTO sessions (runtime_id, agent, session_id, cwd, created_ns, updated_ns, \
             end_reason, metadata, event_count) VALUES (?1, 'mock', 's', '/tmp', 1, 2, \
             NULL, '{}', 301)",
            "INSERT INTO session_keys (runtime_id, agent, session_id) VALUES (?1, 'mock', 's')",
            "INSERT INTO events (event_id, at_ns, direction, message) \
             SELECT session_key * 4294967296 + 0, 10, 'client_to_agent', \
             CAST('{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"session/prompt\",\
             \"params\":{\"sessionId\":\"s\",\"prompt\":[]}}' AS BLOB) \
             FROM session_keys WHERE runtime_id = ?1 AND session_id = 's'",
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 300) \
             INSERT INTO events (event_id, at_ns, direction, message) \
             SELECT session_key * 4294967296 + i, 10 + i, 'sideways', CAST('{}' AS BLOB) \
             FROM session_keys, n WHERE runtime_id = ?1 AND session_id = 's'",
        ],
    )
    .await;
    let server = TestServer::start(&["--data-dir", data.utf8()]).await;
    let page = server
        .get_json("/v2/sessions/s/events?agent=mock&offset=301&limit=10")
        .await;
    assert_eq!(page["events"][0]["offset"], 301, "{page}");
    assert_eq!(
        page["events"][0]["message"],
        json!({"jsonrpc": "2.0", "method": "_sandboxagent/turn/interrupted", "params": {
            "sessionId": "s",
            "reason": "server-stopped",
            "stopReason": "cancelled",
            "promptId": 7,
            "requestIds": [],
        }}),
        "{page}"
    );
}

/// Waits up to `within` for `"store": "ok"` with nothing waiting.
async fn store_settles(server: &TestServer, within: Duration) -> Result<(), Value> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let health = server.health().await.json();
        if health["store"] == "ok" && health["storeWaiting"] == 0 {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(health);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A write PostgreSQL refuses for good is retried for ever as part of the
/// same batch: every later write of every session waits behind it (store
/// "degraded", then events dropped). `params` is the `session/new` (on
/// `conn_agent`) whose session carries the value a client or an agent chose.
async fn after_a_refused_value_the_store_goes_on(
    pg: &PgServer,
    server: &TestServer,
    conn_agent: &str,
    params: Value,
) {
    let conn = server.initialize(conn_agent).await;
    let answer = server.rpc(&conn, 1, "session/new", params).await;
    let hostile = answer["result"]["sessionId"]
        .as_str()
        .unwrap_or_else(|| panic!("session/new: {answer}"))
        .to_owned();
    let mock = server.initialize(MOCK).await;
    let later = server.new_session(&mock).await;
    let settled = store_settles(server, Duration::from_secs(10)).await;
    let stored = pg
        .psql(
            "sessions",
            &format!("SELECT count(*) FROM sessions WHERE session_id = '{later}'"),
        )
        .await;
    assert!(
        settled.is_ok() && stored.trim() == "1",
        "a later session ({later}) is not stored because of {:.60}…: {settled:?}, rows: {stored}",
        hostile
    );
}

/// PostgreSQL's `text` cannot hold U+0000; a client's title can.
#[tokio::test]
async fn a_title_with_nul_does_not_stall_the_postgres_store() {
    let pg = PgServer::start().await;
    pg.create_database("sessions").await;
    let data = TempDir::new("pg-nul");
    let server =
        TestServer::start(&["--data-dir", data.utf8(), "--store", &pg.url("sessions")]).await;
    let params = json!({
        "cwd": "/tmp",
        "mcpServers": [],
        "_meta": {"sandboxagent.dev": {"agent": MOCK, "title": "nul\u{0}here"}}
    });
    after_a_refused_value_the_store_goes_on(&pg, &server, MOCK, params).await;
}

/// A B-tree entry of PostgreSQL holds at most ~2.7 kB: an agent's session
/// id longer than that (incompressible) cannot be a key.
#[tokio::test]
async fn a_very_long_session_id_does_not_stall_the_postgres_store() {
    let pg = PgServer::start().await;
    pg.create_database("sessions").await;
    let data = TempDir::new("pg-long-id");
    let long_id: String = (0..600u32)
        .map(|i| format!("{:08x}", i.wrapping_mul(2_654_435_761)))
        .collect();
    let agent = mock_agent_command("longid", &format!("--session-id {long_id}"));
    let server = TestServer::start(&[
        "--data-dir",
        data.utf8(),
        "--store",
        &pg.url("sessions"),
        "--agent-command",
        &agent,
    ])
    .await;
    let params = json!({
        "cwd": "/tmp",
        "mcpServers": [],
        "_meta": {"sandboxagent.dev": {"agent": "longid"}}
    });
    after_a_refused_value_the_store_goes_on(&pg, &server, "longid", params).await;
}

/// "At most 200,000 writes or 64 MiB of event messages wait": inventory
/// entries are never dropped and each change queues a whole copy of the
/// entry, metadata included. While the store is down, small patches to a
/// session with large metadata grew the queue without bound. A session's
/// metadata is at most 64 KiB now, so the entry here is just under that,
/// and 1,500 patches would queue ~90 MB of copies, past the 48 MiB the
/// test allows, if each change still queued a copy.
#[tokio::test]
async fn entry_changes_while_the_store_is_down_stay_within_the_waiting_bytes() {
    let pg = PgServer::start().await;
    pg.create_database("sessions").await;
    let data = TempDir::new("pg-entry-copies");
    let server =
        TestServer::start(&["--data-dir", data.utf8(), "--store", &pg.url("sessions")]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let blob: String = (0..60_000u32)
        .map(|i| char::from(b'a' + u8::try_from(i % 26).expect("< 26")))
        .collect();
    let answer = server
        .rpc(
            &conn,
            2,
            "_sandboxagent/session/set_metadata",
            json!({"sessionId": session, "metadata": {"blob": blob}}),
        )
        .await;
    assert!(answer.get("result").is_some(), "{answer}");
    store_settles(&server, Duration::from_secs(10))
        .await
        .expect("the store takes the entry");
    pg.stop().await;
    // One write fails: degraded.
    let answer = server
        .rpc(
            &conn,
            3,
            "_sandboxagent/session/set_metadata",
            json!({"sessionId": session, "metadata": {"n": 0}}),
        )
        .await;
    assert!(answer.get("result").is_some(), "{answer}");
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while server.health().await.json()["store"] != "degraded" {
        assert!(tokio::time::Instant::now() < deadline, "never degraded");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let before = v2_api_tests::procfs::rss_bytes(server.pid()).expect("rss");
    for n in 1..=1500 {
        let answer = server
            .rpc(
                &conn,
                10 + n,
                "_sandboxagent/session/set_metadata",
                json!({"sessionId": session, "metadata": {"n": n}}),
            )
            .await;
        assert!(answer.get("result").is_some(), "{answer}");
    }
    let after = v2_api_tests::procfs::rss_bytes(server.pid()).expect("rss");
    let health = server.health().await.json();
    let grown = after.saturating_sub(before);
    assert!(
        grown < 48 << 20,
        "1,500 small patches queued {} MiB while the store was down: {health}",
        grown >> 20
    );
    pg.start_again().await;
}

/// A read-only bind mount over a folder, undone on drop.
struct ReadOnlyMount(PathBuf);

impl ReadOnlyMount {
    /// `None` when this process may not mount (not root, no CAP_SYS_ADMIN).
    fn over(path: &Path) -> Option<Self> {
        let status = std::process::Command::new("mount")
            .args(["--bind", "-o", "ro"])
            .arg(path)
            .arg(path)
            .stderr(Stdio::null())
            .status()
            .ok()?;
        status.success().then(|| Self(path.to_owned()))
    }
}

impl Drop for ReadOnlyMount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// An existing SQLite store on a read-only file system (root cannot write
/// it either) is "a start-up error that names the SQLite file", at once and
/// saying why (the pool once retried the failing connect for 10 s and then
/// said only "pool timed out while waiting for an open connection").
#[tokio::test]
async fn a_sqlite_store_on_a_read_only_file_system_is_a_prompt_clear_error() {
    let data = TempDir::new("ro-mount");
    let folder = data.path().join("store");
    std::fs::create_dir_all(&folder).expect("store folder");
    let file = folder.join("sessions.db");
    let store = format!("sqlite:{}", file.display());
    let mut first = TestServer::start(&["--data-dir", data.utf8(), "--store", &store]).await;
    first.send_sigterm();
    first.wait_exit(TIMEOUT).await.expect("SIGTERM stops it");
    let Some(_mount) = ReadOnlyMount::over(&folder) else {
        eprintln!("skipped: cannot bind-mount read-only here");
        return;
    };
    let started = std::time::Instant::now();
    let stderr = start_up_error(&["--data-dir", data.utf8(), "--store", &store]).await;
    let took = started.elapsed();
    assert!(stderr.contains(&file.display().to_string()), "{stderr}");
    assert!(
        took < Duration::from_secs(5) && !stderr.contains("pool timed out"),
        "after {took:?}, the error does not say why: {stderr}"
    );
}

/// A PostgreSQL URL whose port refuses connections is a start-up error
/// that says so at once ("connection refused"), not after the pool's 10 s
/// as "pool timed out".
#[tokio::test]
async fn a_refused_postgres_port_is_said_at_once() {
    let data = TempDir::new("pg-refused");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    let url = format!("postgres://sandbox@127.0.0.1:{port}/db");
    let started = std::time::Instant::now();
    let stderr = start_up_error(&["--data-dir", data.utf8(), "--store", &url]).await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(5)
            && stderr.to_lowercase().contains("connection refused")
            && !stderr.contains("pool timed out"),
        "after {took:?}: {stderr}"
    );
}

/// The default runtime id comes from `<data-dir>/runtime-id`, under the
/// rules of `--runtime-id` ("1–200 characters, no control characters"). A
/// file with a control character (or megabytes of text: PostgreSQL cannot
/// index that key) must be refused at start-up or replaced, never used.
#[tokio::test]
async fn a_runtime_id_file_breaking_the_id_rules_is_not_used() {
    for (what, text) in [
        ("control", "bad\u{1}id\n".to_owned()),
        ("huge", "x".repeat(100_000)),
    ] {
        let data = TempDir::new(what);
        std::fs::write(data.path().join("runtime-id"), &text).expect("write runtime-id");
        let mut command = sandbox_agent_command();
        command
            .args(["server", "--no-token", "--host", "127.0.0.1", "--port", "0"])
            .args(["--data-dir", data.utf8()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let child = tokio::process::Command::from(command)
            .kill_on_drop(true)
            .spawn()
            .expect("spawn the server");
        if let Ok(output) =
            tokio::time::timeout(Duration::from_secs(5), child.wait_with_output()).await
        {
            // Refused at start-up: the message names the file.
            let stderr = String::from_utf8_lossy(&output.expect("output").stderr).into_owned();
            assert!(stderr.contains("runtime-id"), "{what}: {stderr}");
            continue;
        }
        let server = TestServer::start(&["--data-dir", data.utf8()]).await;
        let health = server.health().await.json();
        let id = health["runtimeId"].as_str().expect("runtimeId");
        assert!(
            (1..=200).contains(&id.chars().count()) && !id.chars().any(char::is_control),
            "{what}: the runtime id in use breaks the rules: {:?}…",
            id.chars().take(40).collect::<String>()
        );
    }
}

/// The runtime id file is read as a regular file only: a symlink there is
/// not followed (it could name a file elsewhere whose first line would
/// become the id) and a FIFO does not hang the start; both are refused at
/// start-up, naming the file.
#[tokio::test]
async fn a_runtime_id_file_that_is_a_symlink_or_a_fifo_is_refused_at_start() {
    let elsewhere = TempDir::new("runtime-id-elsewhere");
    let target = elsewhere.write("id", b"an-id-from-elsewhere\n");
    for what in ["symlink", "fifo"] {
        let data = TempDir::new(what);
        let file = data.path().join("runtime-id");
        if what == "symlink" {
            std::os::unix::fs::symlink(&target, &file).expect("symlink");
        } else {
            let made = std::process::Command::new("mkfifo")
                .arg(&file)
                .status()
                .expect("run mkfifo");
            assert!(made.success(), "mkfifo");
        }
        let stderr = start_up_error(&["--data-dir", data.utf8()]).await;
        assert!(
            stderr.contains("runtime-id") && stderr.contains("not a regular file"),
            "{what}: {stderr}"
        );
    }
}

/// A hard link planted where the runtime lock goes is refused at start:
/// the holder writes its URL into the lock file, which would overwrite
/// the linked file's bytes (attack review).
#[tokio::test]
async fn a_hard_link_at_the_runtime_lock_path_is_refused_and_left_unchanged() {
    let data = TempDir::new("lock-hard-link");
    std::fs::write(data.path().join("runtime-id"), "rid-linked\n").expect("runtime-id");
    let precious = data.write("precious.txt", b"precious\n");
    std::fs::hard_link(
        &precious,
        data.path().join("sessions.db.runtime-rid-linked.lock"),
    )
    .expect("hard link");
    let stderr = start_up_error(&["--data-dir", data.utf8()]).await;
    assert!(
        stderr.contains("hard links") && stderr.contains("rid-linked.lock"),
        "{stderr}"
    );
    assert_eq!(std::fs::read(&precious).expect("read"), b"precious\n");
}

/// "On success [of `session/load` or `session/resume`] the entry is
/// revived"; "a session id reused after its session ended replaces the old
/// entry, and the old events are deleted with it". A `session/new` whose
/// id collides with a dormant entry is a new session, not a load: it must
/// not revive the dormant entry (the new session once showed the old one's
/// creation time and history at offsets 0..).
#[tokio::test]
async fn a_new_session_reusing_a_dormant_id_does_not_inherit_its_history() {
    let data = TempDir::new("reuse-dormant");
    let agent = mock_agent_command("fixed", "--session-id fixedid");
    let mut first =
        TestServer::start(&["--data-dir", data.utf8(), "--agent-command", &agent]).await;
    let conn = first.initialize("fixed").await;
    let old = first.new_session_for(&conn, "fixed").await;
    let answer = first.prompt(&conn, &old, json!(2), "first life").await;
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    first.send_sigterm();
    first.wait_exit(TIMEOUT).await.expect("SIGTERM stops it");

    let second = TestServer::start(&["--data-dir", data.utf8(), "--agent-command", &agent]).await;
    let dormant = second.get_json("/v2/sessions/fixedid?agent=fixed").await;
    assert_eq!(
        dormant["_meta"]["sandboxagent.dev"]["dormant"], true,
        "{dormant}"
    );
    let conn = second.initialize("fixed").await;
    let new = second.new_session_for(&conn, "fixed").await;
    assert_eq!(new, "fixedid");
    let page = second
        .get_json("/v2/sessions/fixedid/events?agent=fixed&offset=0&limit=1000")
        .await;
    assert!(
        !page.to_string().contains("first life"),
        "the new session's log holds the old session's turn: {page}"
    );
    let entry = second.get_json("/v2/sessions/fixedid?agent=fixed").await;
    assert_ne!(
        entry["_meta"]["sandboxagent.dev"]["createdAt"],
        dormant["_meta"]["sandboxagent.dev"]["createdAt"],
        "the new session keeps the old one's creation time: {entry}"
    );
}

/// Peak resident memory (`VmHWM`) of `pid`, in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .expect("VmHWM")
        * 1024
}

/// Memory pages are bounded by `--event-log-bytes`, and so are pages read
/// from the store, which keeps `--event-log-events` events of any size:
/// one `GET …/events?limit=1000` of a session with large messages must not
/// load them all at once (three times over: rows, JSON values, the
/// answer) and let a client make the server allocate many times
/// `--event-log-bytes` per request.
#[tokio::test]
async fn a_page_read_from_the_store_is_bounded_in_bytes() {
    let data = TempDir::new("big-page");
    let server =
        TestServer::start(&["--data-dir", data.utf8(), "--event-log-bytes", "1048576"]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    let text: String = "0123456789abcdef".repeat(256 * 1024);
    for id in 0..10 {
        let answer = server.prompt(&conn, &session, json!(10 + id), &text).await;
        assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    }
    store_settles(&server, TIMEOUT)
        .await
        .expect("the store takes the events");
    let before = peak_rss(server.pid());
    let page = server
        .get(&format!(
            "/v2/sessions/{session}/events?agent={MOCK}&offset=0&limit=1000"
        ))
        .await;
    page.assert_status(200);
    let body = page.text().len();
    let grown = peak_rss(server.pid()).saturating_sub(before);
    assert!(
        grown < 80 << 20,
        "one page ({} MiB of JSON) raised the server's peak memory by {} MiB \
         (--event-log-bytes is 1 MiB)",
        body >> 20,
        grown >> 20
    );
}
