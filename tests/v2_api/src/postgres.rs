//! A private PostgreSQL server for the store's tests: its own `initdb`
//! directory, a loopback port, a non-root OS user, stopped and removed on
//! drop. No docker and no shared database: each [`PgServer`] is a real
//! `postgres` process that only its test talks to.
//!
//! The binaries come from Debian's `postgresql` package (`scripts/test`
//! installs it when missing): the newest `/usr/lib/postgresql/<major>/bin`,
//! else `PATH`. `initdb` and `postgres` refuse to run as root, so they run
//! as the `postgres` OS user when it exists, else as `nobody`, with the
//! data and socket directories owned by that user. Clients (`psql`, the
//! runtime under test) connect over TCP to `127.0.0.1` as the database
//! superuser `sandbox`, with trust authentication.
//!
//! [`PgServer::start_with_tls`] starts one with `ssl=on` and a certificate
//! the test made; clients may then connect with or without TLS.

use std::fs::File;
use std::net::TcpListener;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use nix::sys::signal::{self, Signal};
use nix::unistd::{Gid, Pid, Uid, User, chown};

/// How long the server may take to accept connections after it was started
/// (crash recovery after [`PgServer::stop`] included).
pub const PG_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long `initdb` may take (it writes and syncs a whole cluster).
const INITDB_TIMEOUT: Duration = Duration::from_secs(120);

/// How long a stopping server gets before it is killed.
const PG_STOP_TIMEOUT: Duration = Duration::from_secs(15);

/// How long one `psql` run may take.
const PSQL_TIMEOUT: Duration = Duration::from_secs(30);

/// The database superuser `initdb` creates; clients connect as this user.
pub const PG_USER: &str = "sandbox";

/// Per-process counter so parallel tests get distinct directories.
static NEXT_SERVER: AtomicUsize = AtomicUsize::new(0);

/// One private PostgreSQL server, stopped and its directory removed when
/// dropped.
///
/// Cloning is not offered; the async methods run the blocking work (process
/// waits, `psql`) on tokio's blocking pool, so the state is shared with an
/// [`Arc`].
pub struct PgServer {
    inner: Arc<Inner>,
}

/// The server's state, shared with blocking tasks.
struct Inner {
    /// The PostgreSQL binaries (`initdb`, `postgres`, `psql`).
    bin: Binaries,
    /// `<temp dir>/v2-api-pg-<pid>-<n>`: everything of this server, removed on drop.
    root: PathBuf,
    /// `root/data`: the cluster, owned by [`Inner::owner`].
    data_dir: PathBuf,
    /// `root/socket`: the Unix socket directory (`-k`), owned by [`Inner::owner`].
    socket_dir: PathBuf,
    /// `root/postgres.log`: what `initdb` and `postgres` wrote (appended).
    log: PathBuf,
    /// The loopback TCP port, the same across [`PgServer::stop`] and
    /// [`PgServer::start_again`].
    port: u16,
    /// The non-root OS user the server runs as.
    owner: (Uid, Gid),
    /// The running `postgres` (postmaster) process; `None` while stopped.
    postmaster: Mutex<Option<Child>>,
}

/// The server's certificate and key, copied into the server's directory.
const TLS_CERT: &str = "server.crt";
/// See [`TLS_CERT`].
const TLS_KEY: &str = "server.key";

/// Paths of the PostgreSQL programs this harness runs.
struct Binaries {
    initdb: PathBuf,
    postgres: PathBuf,
    psql: PathBuf,
}

impl PgServer {
    /// Creates a cluster (`initdb --auth=trust -U sandbox`) in a new temp
    /// directory and starts `postgres` on a free port of `127.0.0.1`
    /// (`-c fsync=off`), waiting up to [`PG_READY_TIMEOUT`] until it
    /// answers `SELECT 1`.
    ///
    /// # Panics
    /// When the PostgreSQL binaries are missing (the message says to run
    /// `scripts/test`, which installs them), when neither the `postgres` nor
    /// the `nobody` OS user exists, or when `initdb` or the server fails or
    /// is not ready in time (the message includes the server's log).
    pub async fn start() -> PgServer {
        PgServer {
            inner: Arc::new(blocking(|| Inner::create(None)).await),
        }
    }

    /// Like [`PgServer::start`], with TLS on (`ssl = on` in the cluster's
    /// `postgresql.conf`, so `ALTER SYSTEM SET ssl = off` and a reload can
    /// turn it off): `cert` (PEM, the chain the server presents) and `key`
    /// (its PEM private key) are copied into the server's directory, owned
    /// by the server's user, the key with mode 0600 as PostgreSQL requires.
    /// Clients choose TLS or not (no `hostssl` rule); `pg_stat_ssl` shows
    /// which they chose.
    ///
    /// # Panics
    /// As [`PgServer::start`]; also when the files cannot be copied.
    pub async fn start_with_tls(cert: &Path, key: &Path) -> PgServer {
        let files = (cert.to_owned(), key.to_owned());
        PgServer {
            inner: Arc::new(blocking(move || Inner::create(Some(files))).await),
        }
    }

    /// Replaces the certificate and key of a server started with
    /// [`PgServer::start_with_tls`] and reloads its configuration
    /// (`pg_reload_conf()`): new connections get the new certificate,
    /// open ones keep theirs.
    ///
    /// # Panics
    /// When the files cannot be copied or `psql` fails.
    pub async fn replace_tls_files(&self, cert: &Path, key: &Path) {
        let inner = Arc::clone(&self.inner);
        let (cert, key) = (cert.to_owned(), key.to_owned());
        blocking(move || inner.install_tls_files(&cert, &key)).await;
        self.psql("postgres", "SELECT pg_reload_conf()").await;
    }

    /// The connection URL of database `db`:
    /// `postgres://sandbox@127.0.0.1:PORT/db`.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://{PG_USER}@127.0.0.1:{}/{db}", self.inner.port)
    }

    /// The server's TCP port on `127.0.0.1`.
    pub fn port(&self) -> u16 {
        self.inner.port
    }

    /// Everything the server (and `initdb`) logged so far.
    pub fn log(&self) -> String {
        self.inner.log_text()
    }

    /// Creates database `name` (`CREATE DATABASE`, the name quoted as an
    /// identifier).
    ///
    /// # Panics
    /// When `psql` fails (for example, the database exists or the server is
    /// stopped), with its output and the server's log.
    pub async fn create_database(&self, name: &str) {
        let sql = format!("CREATE DATABASE \"{}\"", name.replace('"', "\"\""));
        self.psql("postgres", &sql).await;
    }

    /// Runs `sql` in database `db` with `psql` and returns its output
    /// (unaligned, tuples only: one line per row, columns separated by `|`).
    ///
    /// # Panics
    /// When `psql` fails or takes longer than 30 s, with its output and the
    /// server's log.
    pub async fn psql(&self, db: &str, sql: &str) -> String {
        match self.try_psql(db, sql).await {
            Ok(output) => output,
            Err(error) => panic!("{error}\n--- PostgreSQL log ---\n{}", self.log()),
        }
    }

    /// Like [`PgServer::psql`], returning `psql`'s failure (exit status and
    /// stderr) instead of panicking.
    ///
    /// # Errors
    /// A message with `psql`'s exit status and stderr.
    pub async fn try_psql(&self, db: &str, sql: &str) -> Result<String, String> {
        let inner = Arc::clone(&self.inner);
        let (db, sql) = (db.to_owned(), sql.to_owned());
        blocking(move || inner.psql(&db, &sql)).await
    }

    /// Stops the server (fast shutdown: clients are disconnected, then the
    /// postmaster exits), keeping its data; killed if it is not gone after
    /// 15 s. Does nothing when it is stopped already.
    pub async fn stop(&self) {
        let inner = Arc::clone(&self.inner);
        blocking(move || inner.stop(Signal::SIGINT)).await;
    }

    /// Starts the server again on the same port with the same data, after
    /// [`PgServer::stop`], waiting up to [`PG_READY_TIMEOUT`].
    ///
    /// # Panics
    /// When it is running already, or does not come up in time (with the
    /// server's log; the port may have been taken meanwhile).
    pub async fn start_again(&self) {
        let inner = Arc::clone(&self.inner);
        blocking(move || {
            assert!(
                inner.postmaster().is_none(),
                "PgServer::start_again: the server is running"
            );
            inner.spawn_postmaster();
            inner.wait_ready();
        })
        .await;
    }
}

impl Inner {
    /// Finds the binaries, runs `initdb` as the non-root user and starts the
    /// server on a free port (trying a few ports, in case another process
    /// takes the chosen one first).
    fn create(tls: Option<(PathBuf, PathBuf)>) -> Inner {
        const PORT_ATTEMPTS: usize = 3;
        let bin = Binaries::find();
        let owner = server_user();
        let root = std::env::temp_dir().join(format!(
            "v2-api-pg-{}-{}",
            std::process::id(),
            NEXT_SERVER.fetch_add(1, Ordering::Relaxed)
        ));
        // A leftover of an earlier run with the same pid.
        let _ = std::fs::remove_dir_all(&root);
        let data_dir = root.join("data");
        let socket_dir = root.join("socket");
        for dir in [&data_dir, &socket_dir] {
            std::fs::create_dir_all(dir)
                .unwrap_or_else(|error| panic!("create {}: {error}", dir.display()));
            chown(dir, Some(owner.0), Some(owner.1))
                .unwrap_or_else(|error| panic!("chown {}: {error}", dir.display()));
        }
        let mut inner = Inner {
            bin,
            log: root.join("postgres.log"),
            root,
            data_dir,
            socket_dir,
            port: 0,
            owner,
            postmaster: Mutex::new(None),
        };
        inner.initdb();
        if let Some((cert, key)) = tls {
            inner.install_tls_files(&cert, &key);
            inner.enable_tls();
        }
        for attempt in 1..=PORT_ATTEMPTS {
            inner.port = free_port();
            inner.spawn_postmaster();
            match inner.wait_ready_or_exit() {
                Ok(()) => return inner,
                Err(error) if attempt < PORT_ATTEMPTS => {
                    eprintln!(
                        "PostgreSQL on port {} did not start ({error}); retrying",
                        inner.port
                    );
                }
                Err(error) => inner.fail(&error),
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    /// `initdb -D data --auth=trust -U sandbox`, as the server's user.
    fn initdb(&self) {
        let mut command = self.as_owner(&self.bin.initdb);
        command
            .arg("-D")
            .arg(&self.data_dir)
            .args([
                "--auth=trust",
                "-U",
                PG_USER,
                "--encoding=UTF8",
                "--locale=C",
            ])
            .arg("--no-sync");
        let mut child = command
            .spawn()
            .unwrap_or_else(|error| panic!("spawn {}: {error}", self.bin.initdb.display()));
        match wait_bounded(&mut child, INITDB_TIMEOUT) {
            Some(status) if status.success() => {}
            Some(status) => self.fail(&format!("initdb failed ({status})")),
            None => self.fail(&format!("initdb still running after {INITDB_TIMEOUT:?}")),
        }
    }

    /// Starts `postgres` on `127.0.0.1:port`, its output appended to the log.
    fn spawn_postmaster(&self) {
        let mut command = self.as_owner(&self.bin.postgres);
        command
            .arg("-D")
            .arg(&self.data_dir)
            .arg("-k")
            .arg(&self.socket_dir)
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-c", "fsync=off", "-c", "shared_buffers=16MB"]);
        let child = command
            .spawn()
            .unwrap_or_else(|error| panic!("spawn {}: {error}", self.bin.postgres.display()));
        *self.postmaster() = Some(child);
    }

    /// Copies `cert` and `key` to `root/tls/`, owned by the server's user
    /// (the key readable by it alone: PostgreSQL refuses a wider one).
    fn install_tls_files(&self, cert: &Path, key: &Path) {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = self.root.join("tls");
        let fail = |what: &Path, error: std::io::Error| -> ! {
            panic!("TLS files: {}: {error}", what.display())
        };
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| fail(&dir, e));
        chown(&dir, Some(self.owner.0), Some(self.owner.1))
            .unwrap_or_else(|e| fail(&dir, e.into()));
        for (from, name, mode) in [(cert, TLS_CERT, 0o644), (key, TLS_KEY, 0o600)] {
            let to = dir.join(name);
            std::fs::copy(from, &to).unwrap_or_else(|e| fail(from, e));
            std::fs::set_permissions(&to, std::fs::Permissions::from_mode(mode))
                .unwrap_or_else(|e| fail(&to, e));
            chown(&to, Some(self.owner.0), Some(self.owner.1))
                .unwrap_or_else(|e| fail(&to, e.into()));
        }
    }

    /// Appends `ssl = on` and the certificate files to `postgresql.conf`.
    fn enable_tls(&self) {
        use std::io::Write as _;
        let conf = self.data_dir.join("postgresql.conf");
        let path = |name: &str| self.root.join("tls").join(name).display().to_string();
        let lines = format!(
            "\nssl = on\nssl_cert_file = '{}'\nssl_key_file = '{}'\n",
            path(TLS_CERT),
            path(TLS_KEY)
        );
        File::options()
            .append(true)
            .open(&conf)
            .and_then(|mut file| file.write_all(lines.as_bytes()))
            .unwrap_or_else(|error| panic!("{}: {error}", conf.display()));
    }

    /// A command for `program` as the server's user, in the server's
    /// directory, its output appended to the log.
    fn as_owner(&self, program: &Path) -> Command {
        let log = File::options()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap_or_else(|error| panic!("open {}: {error}", self.log.display()));
        let log_too = log
            .try_clone()
            .unwrap_or_else(|error| panic!("dup the log file: {error}"));
        let mut command = Command::new(program);
        command
            .uid(self.owner.0.as_raw())
            .gid(self.owner.1.as_raw())
            .current_dir(&self.root)
            .env_remove("PGDATA")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_too);
        command
    }

    /// Waits for the server to answer, panicking with the log on failure.
    fn wait_ready(&self) {
        if let Err(error) = self.wait_ready_or_exit() {
            self.fail(&error);
        }
    }

    /// Polls `SELECT 1` until it works, the postmaster exits, or
    /// [`PG_READY_TIMEOUT`] passes.
    fn wait_ready_or_exit(&self) -> Result<(), String> {
        let deadline = Instant::now() + PG_READY_TIMEOUT;
        loop {
            if let Some(status) = self.reap_exited() {
                return Err(format!("postgres exited during start-up ({status})"));
            }
            let last = match self.psql("postgres", "SELECT 1") {
                Ok(_) => return Ok(()),
                Err(error) => error,
            };
            if Instant::now() >= deadline {
                self.stop(Signal::SIGQUIT);
                return Err(format!(
                    "PostgreSQL not ready on 127.0.0.1:{} after {PG_READY_TIMEOUT:?}; last try: {last}",
                    self.port
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `psql -X -tA -v ON_ERROR_STOP=1 -c SQL` against database `db`.
    fn psql(&self, db: &str, sql: &str) -> Result<String, String> {
        let mut child = Command::new(&self.bin.psql)
            .args(["-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1"])
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                PG_USER,
            ])
            .args(["-d", db, "-c", sql])
            .env("PGCONNECT_TIMEOUT", "5")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|error| format!("spawn {}: {error}", self.bin.psql.display()))?;
        // Read the pipes on threads so a chatty psql cannot block on them.
        let stdout = child.stdout.take().map(read_in_thread);
        let stderr = child.stderr.take().map(read_in_thread);
        let status = wait_bounded(&mut child, PSQL_TIMEOUT);
        if status.is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let text = |pipe: Option<std::thread::JoinHandle<Vec<u8>>>| {
            let bytes = pipe.and_then(|t| t.join().ok()).unwrap_or_default();
            String::from_utf8_lossy(&bytes).trim_end().to_owned()
        };
        match status {
            Some(status) if status.success() => Ok(text(stdout)),
            Some(status) => Err(format!(
                "psql -d {db} -c {sql:?}: {status}: {}",
                text(stderr)
            )),
            None => Err(format!(
                "psql -d {db} -c {sql:?}: still running after {PSQL_TIMEOUT:?}"
            )),
        }
    }

    /// Sends `signal` to the postmaster (SIGINT: fast shutdown, SIGQUIT:
    /// immediate) and waits for it, killing it after [`PG_STOP_TIMEOUT`].
    fn stop(&self, signal: Signal) {
        let Some(mut child) = self.postmaster().take() else {
            return;
        };
        let pid = Pid::from_raw(i32::try_from(child.id()).expect("pid fits in i32"));
        let _ = signal::kill(pid, signal);
        if wait_bounded(&mut child, PG_STOP_TIMEOUT).is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The postmaster's exit status if it has exited (it is forgotten then).
    fn reap_exited(&self) -> Option<ExitStatus> {
        let mut postmaster = self.postmaster();
        let status = postmaster.as_mut()?.try_wait().ok()??;
        *postmaster = None;
        Some(status)
    }

    fn postmaster(&self) -> MutexGuard<'_, Option<Child>> {
        self.postmaster
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn log_text(&self) -> String {
        std::fs::read(&self.log)
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .unwrap_or_else(|error| format!("(cannot read {}: {error})", self.log.display()))
    }

    /// Panics with `what` and the server's log.
    fn fail(&self, what: &str) -> ! {
        panic!(
            "private PostgreSQL server in {}: {what}\n--- PostgreSQL log ---\n{}",
            self.root.display(),
            self.log_text()
        )
    }
}

impl Drop for Inner {
    /// Immediate shutdown (no checkpoint: the data is thrown away), then the
    /// directory goes.
    fn drop(&mut self) {
        self.stop(Signal::SIGQUIT);
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

impl Binaries {
    /// The newest `/usr/lib/postgresql/<major>/bin` that has `initdb`, else
    /// the programs on `PATH`.
    ///
    /// # Panics
    /// When `initdb`, `postgres` or `psql` is not found, telling to run
    /// `scripts/test` (which installs Debian's `postgresql`).
    fn find() -> Binaries {
        let debian = newest_debian_bin_dir();
        let find = |name: &str| -> PathBuf {
            debian
                .as_ref()
                .map(|dir| dir.join(name))
                .filter(|path| path.is_file())
                .or_else(|| on_path(name))
                .unwrap_or_else(|| {
                    panic!(
                        "PostgreSQL's `{name}` was not found (looked in /usr/lib/postgresql/*/bin \
                         and PATH). The store's tests need a real PostgreSQL server: run \
                         scripts/test, which installs Debian's `postgresql` package when it is \
                         missing (or apt-get install postgresql)."
                    )
                })
        };
        Binaries {
            initdb: find("initdb"),
            postgres: find("postgres"),
            psql: find("psql"),
        }
    }
}

/// The `bin` directory of the highest PostgreSQL major version under
/// `/usr/lib/postgresql` that has `initdb`.
fn newest_debian_bin_dir() -> Option<PathBuf> {
    let entries = std::fs::read_dir("/usr/lib/postgresql").ok()?;
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let major: u32 = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").is_file().then_some((major, bin))
        })
        .max_by_key(|(major, _)| *major)
        .map(|(_, bin)| bin)
}

/// `name` found in one of `PATH`'s directories.
fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// The OS user the server runs as: `postgres` if it exists, else `nobody`.
///
/// # Panics
/// When neither exists.
fn server_user() -> (Uid, Gid) {
    ["postgres", "nobody"]
        .iter()
        .find_map(|name| User::from_name(name).ok().flatten())
        .map(|user| (user.uid, user.gid))
        .expect("neither the `postgres` nor the `nobody` OS user exists: PostgreSQL refuses to run as root")
}

/// A loopback port that was free a moment ago.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("bind a free loopback port")
}

/// Waits for `child` at most `timeout`; `None` when it is still running.
fn wait_bounded(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) | Err(_) => return None,
        }
    }
}

/// Reads a pipe to its end on a thread of its own.
fn read_in_thread(
    mut pipe: impl std::io::Read + Send + 'static,
) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        bytes
    })
}

/// Runs blocking `work` on tokio's blocking pool; a panic in it is resumed
/// here, so the test fails with the original message.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(work).await {
        Ok(value) => value,
        Err(error) => match error.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(error) => panic!("PostgreSQL harness task: {error}"),
        },
    }
}
