//! The SQLite store's files changed under the server (research/contract.md,
//! "Durable sessions"): `sessions.db` deleted, emptied or corrupted, and
//! `sessions.db-wal`/`-shm` that cannot be written. Each test starts the
//! real binary on a real store. The tests run as root, where `chmod` stops
//! nothing: files are made unwritable with `chattr +i` or a read-only bind
//! mount, and a test that cannot do either here says so and stops.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use v2_api_tests::{TempDir, TestServer};

const MOCK: &str = "mock";
const TIMEOUT: Duration = Duration::from_secs(30);

/// `<data>/sessions.db` with `suffix` appended.
fn store_file(data: &TempDir, suffix: &str) -> PathBuf {
    data.path().join(format!("sessions.db{suffix}"))
}

/// Runs `server <args>` until it exits; whether it succeeded, and stderr.
/// `None` if it is still running after `within` (it started).
async fn start_up_outcome(args: &[&str], within: Duration) -> Option<(bool, String)> {
    v2_api_tests::server::start_up_outcome(args, within)
        .await
        .map(|(status, stderr)| (status.success(), stderr))
}

/// Waits up to `within` for `health` to hold on `GET /v2/health`; the last
/// body either way.
async fn health_when(
    server: &TestServer,
    within: Duration,
    wanted: impl Fn(&Value) -> bool,
) -> Result<Value, Value> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let health = server.health().await.json();
        if wanted(&health) {
            return Ok(health);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(health);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Everything written is in the store.
fn settled(health: &Value) -> bool {
    health["store"] == "ok" && health["storeWaiting"] == 0
}

/// `chattr +i` (or `-i`) on `file`; `false` when the file system or this
/// process cannot.
fn chattr(flag: &str, file: &Path) -> bool {
    std::process::Command::new("chattr")
        .arg(flag)
        .arg(file)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// `chattr +i` on a file, undone on drop (else the temp dir cannot be
/// removed).
struct Immutable(PathBuf);

impl Immutable {
    /// `None` (with the reason printed) when `chattr +i` fails here.
    fn set(file: &Path) -> Option<Self> {
        if chattr("+i", file) {
            return Some(Self(file.to_owned()));
        }
        eprintln!(
            "skipped: chattr +i fails on {} (file system or privileges)",
            file.display()
        );
        None
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        chattr("-i", &self.0);
    }
}

/// A read-only bind mount of a file over itself, undone on drop.
struct ReadOnlyMount(PathBuf);

impl ReadOnlyMount {
    /// `None` (with the reason printed) when this process may not mount.
    fn over(file: &Path) -> Option<Self> {
        let mounted = std::process::Command::new("mount")
            .args(["--bind", "-o", "ro"])
            .arg(file)
            .arg(file)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        if mounted {
            return Some(Self(file.to_owned()));
        }
        eprintln!(
            "skipped: cannot bind-mount {} read-only here",
            file.display()
        );
        None
    }
}

impl Drop for ReadOnlyMount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// A store with one session in it, left by a server killed with SIGKILL:
/// `sessions.db-wal` and `sessions.db-shm` stay beside it, as after a
/// crash. Returns the session id.
async fn store_left_by_a_crash(data: &TempDir) -> String {
    let mut server = TestServer::start(&["--data-dir", data.utf8()]).await;
    let conn = server.initialize(MOCK).await;
    let session = server.new_session(&conn).await;
    health_when(&server, TIMEOUT, settled)
        .await
        .expect("the store takes the session");
    server.kill_now(TIMEOUT).await.expect("SIGKILL");
    for suffix in ["-wal", "-shm"] {
        assert!(
            store_file(data, suffix).exists(),
            "a crash leaves sessions.db{suffix}"
        );
    }
    session
}

/// "A store that cannot be opened is a start-up error that names the
/// SQLite file": an immutable or read-only `sessions.db-shm` (SQLite maps
/// it into memory) once let the server start, and the first write through
/// the mapping killed it with SIGBUS and no log line. Now the server
/// refuses to start, naming the file; with the file made writable again
/// it starts and has its session.
#[tokio::test]
async fn an_unwritable_shm_or_wal_file_is_refused_at_start_naming_it() {
    let data = TempDir::new("shm-immutable");
    let session = store_left_by_a_crash(&data).await;
    let mut tried = 0;
    for suffix in ["-shm", "-wal"] {
        let file = store_file(&data, suffix);
        let Some(immutable) = Immutable::set(&file) else {
            continue;
        };
        tried += 1;
        let outcome = start_up_outcome(&["--data-dir", data.utf8()], Duration::from_secs(10)).await;
        drop(immutable);
        let Some((success, stderr)) = outcome else {
            panic!("the server started on an immutable sessions.db{suffix}");
        };
        assert!(!success, "immutable sessions.db{suffix}: {stderr}");
        assert!(
            stderr.contains(&file.display().to_string()) && stderr.contains("not writable"),
            "the error names sessions.db{suffix} and says why: {stderr}"
        );
    }
    let file = store_file(&data, "-shm");
    if let Some(mount) = ReadOnlyMount::over(&file) {
        tried += 1;
        let outcome = start_up_outcome(&["--data-dir", data.utf8()], Duration::from_secs(10)).await;
        drop(mount);
        let Some((success, stderr)) = outcome else {
            panic!("the server started on a read-only sessions.db-shm");
        };
        assert!(!success, "read-only sessions.db-shm: {stderr}");
        assert!(
            stderr.contains(&file.display().to_string()),
            "the error names sessions.db-shm: {stderr}"
        );
    }
    if tried == 0 {
        eprintln!("skipped: no way to make a file unwritable for root here");
        return;
    }
    let server = TestServer::start(&["--data-dir", data.utf8()]).await;
    server
        .get(&format!("/v2/sessions/{session}?agent={MOCK}"))
        .await
        .assert_status(200);
}

/// `chattr +i` on `sessions.db-shm` while the server runs: the next write
/// through SQLite's mapping of it would kill the server with SIGBUS. The
/// server checks before each write: it stays up, says `degraded` naming
/// the file, keeps the writes, and writes them once the file is writable
/// again.
#[tokio::test]
async fn an_shm_file_made_immutable_while_running_holds_writes_instead_of_crashing() {
    let data = TempDir::new("shm-immutable-live");
    let server = TestServer::start(&["--data-dir", data.utf8()]).await;
    let conn = server.initialize(MOCK).await;
    server.new_session(&conn).await;
    health_when(&server, TIMEOUT, settled)
        .await
        .expect("the store takes the session");
    let file = store_file(&data, "-shm");
    let Some(immutable) = Immutable::set(&file) else {
        return;
    };
    // Writes while the file is immutable (each session is several).
    let mut sessions = Vec::new();
    for _ in 0..3 {
        sessions.push(server.new_session(&conn).await);
    }
    let degraded = health_when(&server, TIMEOUT, |h| h["store"] == "degraded").await;
    let alive = server.health().await.status.as_u16() == 200;
    drop(immutable);
    let degraded = degraded.unwrap_or_else(|h| panic!("never degraded: {h}"));
    assert!(alive, "the server died");
    let error = degraded["storeError"].as_str().unwrap_or_default();
    assert!(
        error.contains(&file.display().to_string()),
        "storeError names the file: {degraded}"
    );
    let log = server
        .log_when(|log| log.contains("sessions.db-shm"), TIMEOUT)
        .await;
    assert!(log.contains(&file.display().to_string()), "{log}");
    health_when(&server, TIMEOUT, settled)
        .await
        .expect("writable again: the held writes are written");
    let mut server = server;
    server.send_sigterm();
    server.wait_exit(TIMEOUT).await.expect("SIGTERM stops it");
    drop(server);
    let again = TestServer::start(&["--data-dir", data.utf8()]).await;
    for session in sessions {
        again
            .get(&format!("/v2/sessions/{session}?agent={MOCK}"))
            .await
            .assert_status(200);
    }
}

/// `sessions.db` deleted while the server runs: every later write goes to
/// the deleted file and a restart starts with no sessions, while health
/// said `ok`. Now health says `degraded`, `storeError` and a log line name
/// the file, within a few seconds and with no write needed.
#[tokio::test]
async fn a_store_file_deleted_while_running_is_reported() {
    let data = TempDir::new("deleted-live");
    let server = TestServer::start(&["--data-dir", data.utf8()]).await;
    let conn = server.initialize(MOCK).await;
    server.new_session(&conn).await;
    health_when(&server, TIMEOUT, settled)
        .await
        .expect("the store takes the session");
    let file = store_file(&data, "");
    std::fs::remove_file(&file).expect("delete sessions.db");
    let health = health_when(&server, Duration::from_secs(10), |h| h["store"] != "ok")
        .await
        .unwrap_or_else(|h| panic!("health still says ok 10 s after the deletion: {h}"));
    assert_eq!(health["store"], "degraded", "{health}");
    let error = health["storeError"].as_str().unwrap_or_default();
    assert!(
        error.contains(&file.display().to_string()) && error.contains("deleted"),
        "storeError names the file and says what happened: {health}"
    );
    let log = server
        .log_when(|log| log.contains("deleted"), TIMEOUT)
        .await;
    assert!(
        log.lines()
            .any(|line| line.contains("deleted") && line.contains(&file.display().to_string())),
        "a log line names the file: {log}"
    );
    // The server still serves, and says so on each check.
    server.new_session(&conn).await;
    let health = server.health().await.json();
    assert_eq!(health["store"], "degraded", "{health}");
}

/// `sessions.db` truncated to 0 bytes: the server started with no
/// sessions and said nothing. Now a warning names the file.
#[tokio::test]
async fn an_empty_store_file_at_start_is_said_in_the_log() {
    let data = TempDir::new("empty-file");
    let mut first = TestServer::start(&["--data-dir", data.utf8()]).await;
    let conn = first.initialize(MOCK).await;
    first.new_session(&conn).await;
    first.send_sigterm();
    first.wait_exit(TIMEOUT).await.expect("SIGTERM stops it");
    drop(first);
    let file = store_file(&data, "");
    std::fs::write(&file, b"").expect("truncate sessions.db");
    let second = TestServer::start(&["--data-dir", data.utf8()]).await;
    let sessions = second.get_json("/v2/sessions").await;
    assert_eq!(sessions["sessions"].as_array().map(Vec::len), Some(0));
    let log = second
        .log_when(|log| log.contains("0 bytes"), Duration::from_secs(5))
        .await;
    assert!(
        log.lines()
            .any(|line| line.contains("0 bytes") && line.contains(&file.display().to_string())),
        "a log line says the file is empty and names it: {log}"
    );
    // A new store (no file) is not reported as emptied.
    let fresh = TempDir::new("no-file");
    let third = TestServer::start(&["--data-dir", fresh.utf8()]).await;
    third.get_json("/v2/sessions").await;
    assert!(
        !third.stderr_text().contains("0 bytes"),
        "{}",
        third.stderr_text()
    );
}

/// A store whose header is intact but whose `sessions` table is damaged:
/// the start-up error said only "session store: database disk image is
/// malformed", naming no file. Now it names the file.
#[tokio::test]
async fn a_corrupt_store_file_start_up_error_names_the_file() {
    let data = TempDir::new("corrupt-table");
    let mut first = TestServer::start(&["--data-dir", data.utf8()]).await;
    let conn = first.initialize(MOCK).await;
    first.new_session(&conn).await;
    first.send_sigterm();
    first.wait_exit(TIMEOUT).await.expect("SIGTERM stops it");
    drop(first);
    let file = store_file(&data, "");
    // The page of the sessions table's root, overwritten with garbage, with
    // every page in the file itself (no WAL left to replay).
    sqlx::any::install_default_drivers();
    let url = format!("sqlite://{}?mode=rw", file.display());
    let pool = sqlx::AnyPool::connect(&url).await.expect("open the store");
    sqlx::query("PRAGMA journal_mode = DELETE")
        .execute(&pool)
        .await
        .expect("leave WAL mode");
    let (root, page_size): (i64, i64) = (
        sqlx::query_scalar("SELECT rootpage FROM sqlite_master WHERE name = 'sessions'")
            .fetch_one(&pool)
            .await
            .expect("the sessions table"),
        sqlx::query_scalar("PRAGMA page_size")
            .fetch_one(&pool)
            .await
            .expect("page size"),
    );
    pool.close().await;
    let mut bytes = std::fs::read(&file).expect("read sessions.db");
    let start = usize::try_from((root - 1) * page_size).expect("offset");
    let end = start + usize::try_from(page_size).expect("size");
    assert!(end <= bytes.len(), "page {root} is in the file");
    bytes[start..end].fill(0x5a);
    std::fs::write(&file, bytes).expect("write sessions.db");
    let Some((success, stderr)) =
        start_up_outcome(&["--data-dir", data.utf8()], Duration::from_secs(10)).await
    else {
        panic!("the server started on a corrupt sessions table");
    };
    assert!(!success, "{stderr}");
    assert!(
        stderr.contains(&file.display().to_string()),
        "the error names the file: {stderr}"
    );
}

/// After `sessions.db` was deleted under the server, a restart started
/// with no sessions: they lived only in the deleted file, gone with the
/// process. A SIGTERM stop now saves that file's content beside it
/// (`sessions.db.recovered-<ms>`, named in the log), and the next start,
/// finding no `sessions.db`, puts the copy in its place (logged): every
/// session is back, those created after the deletion too.
#[tokio::test]
async fn a_store_file_deleted_while_running_is_back_after_a_sigterm_restart() {
    let data = TempDir::new("deleted-saved");
    let mut server = TestServer::start(&["--data-dir", data.utf8()]).await;
    let conn = server.initialize(MOCK).await;
    let before = server.new_session(&conn).await;
    health_when(&server, TIMEOUT, settled)
        .await
        .expect("the store takes the session");
    let file = store_file(&data, "");
    std::fs::remove_file(&file).expect("delete sessions.db");
    let after = server.new_session(&conn).await;
    health_when(&server, TIMEOUT, |h| {
        h["store"] == "degraded" && h["storeWaiting"] == 0
    })
    .await
    .expect("degraded, every write done");
    server.send_sigterm();
    server.wait_exit(TIMEOUT).await.expect("SIGTERM stops it");
    let log = server.stderr_text();
    drop(server);
    let copies = saved_copies(&data);
    let [copy] = copies.as_slice() else {
        panic!("one saved copy in the data dir, got {copies:?}: {log}");
    };
    assert!(
        log.contains(&copy.display().to_string()),
        "the log names the copy: {log}"
    );
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(copy).expect("copy").permissions().mode() & 0o777;
        assert_eq!(
            mode, 0o600,
            "the copy holds every session: the owner's alone"
        );
    }
    let again = TestServer::start(&["--data-dir", data.utf8()]).await;
    for session in [before, after] {
        again
            .get(&format!("/v2/sessions/{session}?agent={MOCK}"))
            .await
            .assert_status(200);
    }
    assert!(
        saved_copies(&data).is_empty(),
        "the copy was moved in place"
    );
    assert!(
        again.stderr_text().contains(&copy.display().to_string()),
        "the start names the copy it used: {}",
        again.stderr_text()
    );
}

/// The `sessions.db.recovered-*` files in `data`.
fn saved_copies(data: &TempDir) -> Vec<PathBuf> {
    std::fs::read_dir(data.path())
        .expect("the data dir")
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.starts_with("sessions.db.recovered-"))
        })
        .collect()
}

/// `sessions.db` deleted under a server that is then killed with SIGKILL:
/// SQLite leaves the deleted file's `-wal` and `-shm` behind (it does not
/// remove them once its file is unlinked), and a new `sessions.db` would
/// read that WAL. The next start removes them, saying so, and its new
/// store works: a session created then survives a restart.
#[tokio::test]
async fn the_wal_and_shm_of_a_deleted_store_file_are_removed_at_start() {
    let data = TempDir::new("deleted-killed");
    let mut server = TestServer::start(&["--data-dir", data.utf8()]).await;
    let conn = server.initialize(MOCK).await;
    server.new_session(&conn).await;
    health_when(&server, TIMEOUT, settled)
        .await
        .expect("the store takes the session");
    std::fs::remove_file(store_file(&data, "")).expect("delete sessions.db");
    server.new_session(&conn).await;
    server.kill_now(TIMEOUT).await.expect("SIGKILL");
    drop(server);
    for suffix in ["-wal", "-shm"] {
        assert!(
            store_file(&data, suffix).exists(),
            "sessions.db{suffix} outlives the deleted file"
        );
    }
    let mut second = TestServer::start(&["--data-dir", data.utf8()]).await;
    let log = second.stderr_text();
    for suffix in ["-wal", "-shm"] {
        let orphan = store_file(&data, suffix).display().to_string();
        assert!(
            log.lines()
                .any(|line| line.contains(&orphan) && line.contains("removed")),
            "a log line names the removed {orphan}: {log}"
        );
    }
    let conn = second.initialize(MOCK).await;
    let session = second.new_session(&conn).await;
    health_when(&second, TIMEOUT, settled)
        .await
        .expect("the new store takes the session");
    second.send_sigterm();
    second.wait_exit(TIMEOUT).await.expect("SIGTERM stops it");
    drop(second);
    let third = TestServer::start(&["--data-dir", data.utf8()]).await;
    third
        .get(&format!("/v2/sessions/{session}?agent={MOCK}"))
        .await
        .assert_status(200);
}
