//! Durable sessions: the session inventory and every session's event log in
//! SQLite (the default, `<data-dir>/sessions.db`) or PostgreSQL, behind one
//! small interface (research/contract.md, "Durable sessions").
//!
//! Memory stays the serving layer: the runtime answers from its own
//! inventory and logs, and `writer` copies every change to the store off
//! the request path. The store is read at start-up (the inventory of this
//! runtime id) and when a client pages events older than what memory holds.
//!
//! Entries are keyed by (runtime id, agent, session id); events by an
//! integer per session (`session_keys`, which maps the two) and their
//! offset (SQLite: both in one integer, the rowid; see [`event_id`]). Both
//! backends go
//! through one `sqlx` `Any` pool; the SQL is written once with `$N`
//! placeholders and rewritten to SQLite's `?N` form.

mod connection;
mod file;
mod interrupted;
mod keys;
mod rows;
pub(crate) mod runtime_lock;
pub(crate) mod share;
mod tls;
pub(crate) mod writer;
use connection::WriterConnection;
use keys::SessionKeys;
pub use rows::{EventRow, PageQuery, SessionRow, StoreError};
use rows::{Key, Pruning, RowSnapshot, Write, row_of};

use bytes::Bytes;
use ext_methods::{Direction, EndReason};

use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::migrate::{Migration, MigrationSource, MigrationType, Migrator};
use sqlx::{AnyPool, Connection as _, Row};
use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The file the SQLite store has in the data dir by default.
pub const DEFAULT_SQLITE_FILE: &str = "sessions.db";
/// The file in the data dir that holds the default runtime id.
pub const RUNTIME_ID_FILE: &str = "runtime-id";
/// Longest a connection attempt may take at start-up and on each retry.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Entries per multi-row upsert of `sessions` rows (14 parameters each:
/// 896) and per `UPDATE` of their counts.
const ENTRIES_PER_STATEMENT: usize = 64;
/// Rows per multi-row `INSERT` of events (at most 5 parameters each: 1280,
/// within SQLite's 32766 and PostgreSQL's 65535 bound parameters).
const EVENTS_PER_INSERT: usize = 256;
/// Bits of a SQLite `event_id` below the session key: the offset's.
const OFFSET_BITS: u32 = 32;

/// Where sessions are kept (`--store`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// Nothing is written; a restart forgets every session.
    Memory,
    /// A SQLite file, created when missing.
    Sqlite(PathBuf),
    /// A PostgreSQL database, `postgres://user[:password]@host[:port]/db[?…]`,
    /// over TLS as its `sslmode` and `sslrootcert` say (libpq's rules).
    Postgres(String),
}

impl StoreUrl {
    /// Parses `memory`, `sqlite:PATH` (or `sqlite://PATH`) and
    /// `postgres://…` / `postgresql://…`.
    ///
    /// A PostgreSQL URL is taken as it is: its `sslmode` and `sslrootcert`
    /// are checked when the store is opened, whose error shows the URL
    /// redacted (a parser's error would quote it, password and all).
    ///
    /// # Errors
    /// A message naming the accepted forms.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text == "memory" {
            return Ok(Self::Memory);
        }
        if let Some(path) = text
            .strip_prefix("sqlite://")
            .or_else(|| text.strip_prefix("sqlite:"))
        {
            if path.is_empty() {
                return Err("sqlite: needs a file path, as in sqlite:/data/sessions.db".into());
            }
            return Ok(Self::Sqlite(PathBuf::from(path)));
        }
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            return Ok(Self::Postgres(text.to_owned()));
        }
        Err(format!(
            "unknown store {text:?}: use memory, sqlite:PATH or postgres://USER@HOST:PORT/DB"
        ))
    }

    /// The default: `sqlite:<data_dir>/sessions.db`.
    pub fn default_for(data_dir: &Path) -> Self {
        Self::Sqlite(data_dir.join(DEFAULT_SQLITE_FILE))
    }

    /// The backend's name as `GET /v2/health` shows it.
    pub fn backend(&self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Sqlite(_) => "sqlite",
            Self::Postgres(_) => "postgres",
        }
    }

    /// The URL with any password replaced by `***`, for logs and errors.
    pub fn redacted(&self) -> String {
        match self {
            Self::Memory => "memory".into(),
            Self::Sqlite(path) => format!("sqlite:{}", path.display()),
            Self::Postgres(url) => redact_password(url),
        }
    }
}

/// `url` with the password (in the user info or a `password=` query
/// parameter) replaced by `***`; a URL that does not parse shows only its
/// scheme, since a password may be anywhere in it.
fn redact_password(url: &str) -> String {
    let Ok(mut parsed) = reqwest::Url::parse(url) else {
        let scheme = url
            .split_once("://")
            .map_or("postgres", |(scheme, _)| scheme);
        return format!("{scheme}://*** (unparsable URL, not shown)");
    };
    if parsed.password().is_some() {
        let _ = parsed.set_password(Some("***"));
    }
    // Rebuilt only when it holds a password: rebuilding re-encodes every
    // value, and `sslrootcert=/etc/ca.pem` should read as typed.
    if parsed
        .query_pairs()
        .any(|(key, _)| key.eq_ignore_ascii_case("password"))
    {
        let pairs: Vec<(String, String)> = parsed
            .query_pairs()
            .map(|(key, value)| {
                let secret = key.eq_ignore_ascii_case("password");
                (
                    key.into_owned(),
                    if secret {
                        "***".to_owned()
                    } else {
                        value.into_owned()
                    },
                )
            })
            .collect();
        parsed.query_pairs_mut().clear().extend_pairs(pairs);
    }
    parsed.to_string()
}

/// The rules of a runtime id (`--runtime-id` and `<data-dir>/runtime-id`):
/// 1 to 200 characters, not only white space, no control characters.
///
/// # Errors
/// A message saying which rule `id` breaks.
pub fn check_runtime_id(id: &str) -> Result<(), String> {
    let length = id.chars().count();
    if !(1..=200).contains(&length) || id.trim().is_empty() {
        return Err(format!(
            "a runtime id is 1 to 200 characters, not only white space (got {length})"
        ));
    }
    if id.chars().any(char::is_control) {
        return Err("a runtime id has no control characters".to_owned());
    }
    Ok(())
}

/// Nanoseconds since the Unix epoch (0 before it; saturates in 2262).
pub fn nanos(time: SystemTime) -> i64 {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// The cursor naming an entry's place in the listing order (newest first:
/// `created_ns`, agent, session id): `{created_ns}:{agent}:{id}` (agent ids
/// have no `:`, session ids may). The one spelling of `nextCursor`, for the
/// server and for the CLI reading a store (research/contract.md, "Control
/// plane").
pub fn cursor(created_ns: i64, agent: &str, id: &str) -> String {
    format!("{created_ns}:{agent}:{id}")
}

/// The place a [`cursor`] names: `(created_ns, agent, id)`; `None` when it
/// does not parse (a negative or too large time included).
pub fn parse_cursor(cursor: &str) -> Option<(i64, String, String)> {
    let (nanos, rest) = cursor.split_once(':')?;
    let (agent, id) = rest.split_once(':')?;
    let nanos = i64::try_from(nanos.parse::<u64>().ok()?).ok()?;
    Some((nanos, agent.to_owned(), id.to_owned()))
}

/// The point in time `nanos` after the Unix epoch (negative: the epoch).
pub fn time_of(nanos: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(u64::try_from(nanos).unwrap_or(0))
}

/// Which database a [`Store`] talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Sqlite,
    Postgres,
}

/// What a batch did: the sessions it pruned (and below which offset), and
/// how many of its events SQLite could not store (see [`event_id`]).
#[derive(Debug)]
pub(crate) struct Applied {
    pub(crate) pruned: Vec<(Key, u64)>,
    pub(crate) unstorable: u64,
}

/// A SQLite event's `event_id` (schema version 5): `key * 2^32 + offset`,
/// the table's rowid, so a session's events are one range of it in offset
/// order and a burst appends at the table's end (research/decisions.md,
/// "The writer's cost per event"). `None` past what it holds: a key from
/// 2^31, an offset from 2^32.
fn event_id(key: i64, offset: u64) -> Option<i64> {
    let offset = i64::try_from(offset)
        .ok()
        .filter(|offset| *offset < 1 << OFFSET_BITS)?;
    (0..1 << (63 - OFFSET_BITS))
        .contains(&key)
        .then_some((key << OFFSET_BITS) | offset)
}

/// An open store, migrated to this binary's schema, scoped to one runtime id.
#[derive(Debug, Clone)]
pub struct Store {
    pool: AnyPool,
    backend: Backend,
    runtime_id: Arc<str>,
    what: Arc<str>,
    /// The SQLite file as opened, checked before writes and while idle
    /// (`None` for PostgreSQL).
    file: Option<Arc<file::SqliteFile>>,
    /// PostgreSQL's TLS settings, to name a failed check in errors
    /// (`None` for SQLite).
    tls: Option<Arc<tls::Settings>>,
    /// The URL the SQLite writer opens its own connection with (`None`
    /// for PostgreSQL, whose writer takes one from the pool).
    writer_url: Option<Arc<str>>,
    /// SQLite: the writer's connection, opened with the pool at start (on
    /// the file as found then) and taken by the writer on its first batch.
    writer_first: Arc<parking_lot::Mutex<Option<sqlx::AnyConnection>>>,
}

/// The embedded migrations of one backend (`acp-runtime/migrations/<backend>/`).
#[derive(Debug)]
struct Embedded(&'static [(i64, &'static str, &'static str)]);

const SQLITE_MIGRATIONS: Embedded = Embedded(&[
    (
        1,
        "sessions and events",
        include_str!("../../migrations/sqlite/0001_sessions_and_events.sql"),
    ),
    (
        2,
        "hints and listing index",
        include_str!("../../migrations/sqlite/0002_hints_and_listing_index.sql"),
    ),
    (
        3,
        "first prompt and id index",
        include_str!("../../migrations/sqlite/0003_first_prompt_and_id_index.sql"),
    ),
    (
        4,
        "integer session keys",
        include_str!("../../migrations/sqlite/0004_integer_session_keys.sql"),
    ),
    (
        5,
        "events as a rowid table",
        include_str!("../../migrations/sqlite/0005_events_as_a_rowid_table.sql"),
    ),
]);

// PostgreSQL stays at version 4: its events table is a heap, which appends
// cheaply as it is (research/decisions.md, "The writer's cost per event").
const POSTGRES_MIGRATIONS: Embedded = Embedded(&[
    (
        1,
        "sessions and events",
        include_str!("../../migrations/postgres/0001_sessions_and_events.sql"),
    ),
    (
        2,
        "hints and listing index",
        include_str!("../../migrations/postgres/0002_hints_and_listing_index.sql"),
    ),
    (
        3,
        "first prompt and id index",
        include_str!("../../migrations/postgres/0003_first_prompt_and_id_index.sql"),
    ),
    (
        4,
        "integer session keys",
        include_str!("../../migrations/postgres/0004_integer_session_keys.sql"),
    ),
]);

impl<'s> MigrationSource<'s> for &'s Embedded {
    fn resolve(
        self,
    ) -> futures::future::BoxFuture<'s, Result<Vec<Migration>, sqlx::error::BoxDynError>> {
        Box::pin(async move {
            Ok(self
                .0
                .iter()
                .map(|(version, description, sql)| {
                    Migration::new(
                        *version,
                        Cow::Borrowed(*description),
                        MigrationType::Simple,
                        Cow::Borrowed(*sql),
                        false,
                    )
                })
                .collect())
        })
    }
}

/// The SQL of the schema versions this binary knows, per backend
/// (`"sqlite"` or `"postgres"`): `(version, description, sql)` in order.
/// Tests use it to build a database at an older version.
pub fn migrations(backend: &str) -> &'static [(i64, &'static str, &'static str)] {
    match backend {
        "postgres" => POSTGRES_MIGRATIONS.0,
        _ => SQLITE_MIGRATIONS.0,
    }
}

/// The text of the runtime id file at `path`: a regular file, opened
/// without following a symlink and without waiting on a FIFO, read up to
/// 4 KiB (an id is at most 200 characters: [`check_runtime_id`]).
///
/// # Errors
/// The file's `io::Error`; `InvalidData` for a symlink (`ELOOP`), a FIFO, a
/// device or a directory there.
fn read_runtime_id_file(path: &Path) -> std::io::Result<String> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let not_a_file = || {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not a regular file; remove it (a new id is made when it is missing)",
        )
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(nix::libc::ELOOP) {
                not_a_file()
            } else {
                e
            }
        })?;
    if !file.metadata()?.is_file() {
        return Err(not_a_file());
    }
    let mut text = String::new();
    file.take(4096).read_to_string(&mut text)?;
    Ok(text)
}

/// Reads `<data_dir>/runtime-id`, writing a new random id there first when
/// it is missing: the default runtime id is stable per data dir.
///
/// # Errors
/// When the file cannot be read or written.
pub fn default_runtime_id(data_dir: &Path) -> Result<String, StoreError> {
    let path = data_dir.join(RUNTIME_ID_FILE);
    let io = |e: std::io::Error| StoreError::Io(format!("{}: {e}", path.display()));
    match read_runtime_id_file(&path) {
        Ok(text) if !text.trim().is_empty() => {
            let id = text.trim();
            check_runtime_id(id).map_err(|rule| {
                StoreError::Io(format!(
                    "{}: {rule}; fix or delete the file (a new id is made when it is missing)",
                    path.display()
                ))
            })?;
            return Ok(id.to_owned());
        }
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    std::fs::create_dir_all(data_dir).map_err(io)?;
    let id = uuid::Uuid::new_v4().to_string();
    let temporary = data_dir.join(format!(".{RUNTIME_ID_FILE}.{}", std::process::id()));
    // Readable by the server's user alone, like the store: an agent run as
    // another user (`--agent-user`) has no business with it.
    {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&temporary)
            .map_err(io)?;
        file.write_all(format!("{id}\n").as_bytes()).map_err(io)?;
    }
    // A hard link, not a rename: of servers started at once on a new data
    // dir, the first one's id stays and the others read it.
    let linked = std::fs::hard_link(&temporary, &path);
    let _ = std::fs::remove_file(&temporary);
    match linked {
        Ok(()) => Ok(id),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let text = read_runtime_id_file(&path).map_err(io)?;
            let id = text.trim();
            check_runtime_id(id)
                .map_err(|rule| StoreError::Io(format!("{}: {rule}", path.display())))?;
            Ok(id.to_owned())
        }
        Err(e) => Err(io(e)),
    }
}

impl Store {
    /// Opens (SQLite: creates) the store at `url`, runs the migrations this
    /// binary has, and scopes every read and write to `runtime_id`.
    /// `Ok(None)` for [`StoreUrl::Memory`].
    ///
    /// # Errors
    /// [`StoreError::Open`] naming the file or (redacted) URL when it cannot
    /// be opened, is not a database or is not writable;
    /// [`StoreError::Tls`] naming the TLS check PostgreSQL's connection
    /// failed (or the bad `sslmode` / `sslrootcert`);
    /// [`StoreError::Migrate`] when the schema cannot be brought up to date.
    pub async fn open(url: &StoreUrl, runtime_id: &str) -> Result<Option<Self>, StoreError> {
        sqlx::any::install_default_drivers();
        let what = url.redacted();
        let mut tls = None;
        let (connect, backend, pool_size) = match url {
            StoreUrl::Memory => return Ok(None),
            StoreUrl::Sqlite(path) => {
                if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                    std::fs::create_dir_all(parent)
                        .map_err(|e| StoreError::Io(format!("{}: {e}", parent.display())))?;
                }
                let path = path.to_str().ok_or_else(|| {
                    StoreError::Io(format!("{}: the path is not UTF-8", path.display()))
                })?;
                let encoded = percent_encoding::utf8_percent_encode(path, SQLITE_PATH).to_string();
                (format!("sqlite://{encoded}?mode=rwc"), Backend::Sqlite, 4)
            }
            StoreUrl::Postgres(url) => {
                let settings = tls::Settings::from_url(url)
                    .and_then(|settings| settings.check_root_file().map(|()| settings))
                    .map_err(|reason| StoreError::Tls {
                        what: what.clone(),
                        reason,
                    })?;
                let connect = settings.connect_url(url);
                tls = Some(Arc::new(settings));
                (connect, Backend::Postgres, 4)
            }
        };
        // A failed TLS check is told as the check that failed, not as the
        // driver's I/O error (research/contract.md, "PostgreSQL over TLS").
        let open_error = |source: sqlx::Error| match tls.as_ref().and_then(|t| t.explain(&source)) {
            Some(reason) => StoreError::Tls {
                what: what.clone(),
                reason,
            },
            None => StoreError::Open {
                what: what.clone(),
                source,
            },
        };
        // Servers started at once on one SQLite file take turns to open and
        // migrate it: SQLite answers "database is locked" at once (no busy
        // wait) when two migrating transactions both upgrade to writing.
        let _open_lock = match url {
            StoreUrl::Sqlite(path) => Some(open_lock(path).await?),
            _ => None,
        };
        // Before SQLite opens the file in this process: the check opens and
        // closes the files, which would drop SQLite's POSIX locks on them.
        let found = match url {
            StoreUrl::Sqlite(path) => Some(file::check_before_open(path)?),
            _ => None,
        };
        if backend == Backend::Sqlite {
            // One plain connection first: the pool retries a failing open
            // until its timeout and then reports only the timeout.
            let mut probe = sqlx::AnyConnection::connect(&connect)
                .await
                .map_err(open_error)?;
            prepare(&mut probe, backend).await.map_err(open_error)?;
            // SQLite opens a file it cannot write read-only, silently: a
            // write of the header (the same user_version back) says so now.
            let version: i64 = sqlx::query_scalar("PRAGMA user_version")
                .fetch_one(&mut probe)
                .await
                .map_err(open_error)?;
            sqlx::query(&format!("PRAGMA user_version = {version}"))
                .execute(&mut probe)
                .await
                .map_err(open_error)?;
            let _ = sqlx::Connection::close(probe).await;
            if let StoreUrl::Sqlite(path) = url {
                file::owner_only(path)?;
            }
        } else {
            // PostgreSQL likewise: a refused port or a bad password is said
            // at once as the driver's own error ("connection refused"), not
            // after the pool's 10 s as "pool timed out".
            let probe =
                tokio::time::timeout(CONNECT_TIMEOUT, sqlx::AnyConnection::connect(&connect))
                    .await
                    .unwrap_or(Err(sqlx::Error::Io(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("no answer within {CONNECT_TIMEOUT:?}"),
                    ))))
                    .map_err(open_error)?;
            let _ = sqlx::Connection::close(probe).await;
        }
        let mut options = AnyPoolOptions::new()
            .max_connections(pool_size)
            .acquire_timeout(CONNECT_TIMEOUT)
            .after_connect(move |connection, _| Box::pin(prepare(connection, backend)));
        let mut pool_connect = connect.clone();
        if backend == Backend::Sqlite {
            // Every connection of the pool is opened now and kept for the
            // life of the server, without creating the file (`mode=rw`): a
            // connection opened later to a `sessions.db` deleted meanwhile
            // would create an empty file in its place and split the store
            // in two (research/contract.md, "Durable sessions").
            options = options
                .min_connections(pool_size)
                .idle_timeout(None)
                .max_lifetime(None);
            pool_connect = connect.replace("mode=rwc", "mode=rw");
        }
        let pool = options.connect(&pool_connect).await.map_err(open_error)?;
        let writer_url: Option<Arc<str>> =
            (backend == Backend::Sqlite).then(|| Arc::from(pool_connect.as_str()));
        let writer_first = match &writer_url {
            Some(url) => Some(
                connection::open_lowered(url.to_string())
                    .await
                    .map_err(open_error)?,
            ),
            None => None,
        };
        if backend == Backend::Sqlite {
            // `min_connections` is reached in the background; hold them all
            // at once so each is open before the server serves.
            let mut held = Vec::with_capacity(pool_size as usize);
            for _ in 0..pool_size {
                held.push(pool.acquire().await.map_err(open_error)?);
            }
        }
        let migrations = match backend {
            Backend::Sqlite => &SQLITE_MIGRATIONS,
            Backend::Postgres => &POSTGRES_MIGRATIONS,
        };
        let migrator = Migrator::new(migrations)
            .await
            .map_err(|source| StoreError::Migrate {
                what: what.clone(),
                source,
            })?;
        migrator
            .run(&pool)
            .await
            .map_err(|source| StoreError::Migrate {
                what: what.clone(),
                source,
            })?;
        let file = match url {
            StoreUrl::Sqlite(path) => Some(Arc::new(file::SqliteFile::opened(path)?)),
            _ => None,
        };
        if found == Some(file::Found::Empty) {
            tracing::warn!(
                store = what,
                "the session store file is empty (0 bytes): starting with no sessions"
            );
        }
        Ok(Some(Self {
            pool,
            backend,
            runtime_id: runtime_id.into(),
            what: what.into(),
            file,
            tls,
            writer_url,
            writer_first: Arc::new(parking_lot::Mutex::new(writer_first)),
        }))
    }

    /// The store as logs name it (password redacted).
    pub fn describe(&self) -> &str {
        &self.what
    }

    /// Whether the SQLite file is still the one opened and can be written
    /// (`Ok` for PostgreSQL); see [`file::Problem`].
    pub(crate) fn check_file(&self) -> Result<(), file::Problem> {
        self.file.as_ref().map_or(Ok(()), |file| file.check())
    }

    /// `error` as the degraded state and logs show it: a failed TLS check
    /// named as such, else the driver's text.
    pub(crate) fn error_text(&self, error: &sqlx::Error) -> String {
        self.tls
            .as_ref()
            .and_then(|tls| tls.explain(error))
            .unwrap_or_else(|| error.to_string())
    }

    /// Whether this is a PostgreSQL store (else SQLite).
    pub(crate) fn is_postgres(&self) -> bool {
        self.backend == Backend::Postgres
    }

    /// The runtime id every row read or written here carries.
    pub fn runtime_id(&self) -> &str {
        &self.runtime_id
    }

    /// `sql` in this backend's placeholder form.
    fn sql<'a>(&self, sql: &'a str) -> Cow<'a, str> {
        match self.backend {
            Backend::Postgres => Cow::Borrowed(sql),
            Backend::Sqlite => Cow::Owned(sql.replace('$', "?")),
        }
    }

    /// One page of this runtime id's inventory, newest first (by
    /// `created_ns`, agent, session id, all descending: the
    /// `sessions_newest_first` index, so a page costs the same at any size),
    /// after `query.after` and matching its filters; a row this runtime
    /// cannot read is skipped with a warning.
    ///
    /// # Errors
    /// [`StoreError::Read`] naming the store when the query fails.
    pub async fn page(&self, query: &PageQuery) -> Result<Vec<SessionRow>, StoreError> {
        Ok(self.page_extent(query).await?.0)
    }

    /// [`Self::page`], with how many rows the query returned (readable or
    /// not) and the listing place of the last one: where the next page
    /// starts, so an unreadable row is a gap, not the end of the listing.
    ///
    /// # Errors
    /// [`StoreError::Read`] naming the store when the query fails.
    pub async fn page_extent(
        &self,
        query: &PageQuery,
    ) -> Result<(Vec<SessionRow>, usize, Option<(i64, String, String)>), StoreError> {
        let mut sql = format!("SELECT {SESSION_COLUMNS} FROM sessions WHERE runtime_id = $1");
        let mut next = 2;
        let mut param = |sql: &mut String, clause: &str| {
            sql.push_str(&clause.replace('?', &format!("${next}")));
            next += 1;
        };
        if query.agent.is_some() {
            param(&mut sql, " AND agent = ?");
        }
        if query.cwd.is_some() {
            param(&mut sql, " AND cwd = ?");
        }
        match query.ended {
            Some(true) => sql.push_str(" AND end_reason IS NOT NULL"),
            Some(false) => sql.push_str(" AND end_reason IS NULL"),
            None => {}
        }
        if query.title.is_some() {
            // ASCII letters in either case, every other character exactly:
            // SQLite's LIKE folds ASCII only; PostgreSQL's LIKE folds
            // nothing, so ASCII is folded by hand (its lower() would fold
            // every script).
            param(
                &mut sql,
                match self.backend {
                    Backend::Sqlite => " AND title LIKE ? ESCAPE '\\'",
                    Backend::Postgres => {
                        " AND translate(title, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ', \
                         'abcdefghijklmnopqrstuvwxyz') LIKE ? ESCAPE '\\'"
                    }
                },
            );
        }
        if query.after.is_some() {
            let (a, b, c) = (next, next + 1, next + 2);
            sql.push_str(&format!(
                " AND (created_ns < ${a} OR (created_ns = ${a} AND (agent < ${b} \
                 OR (agent = ${b} AND session_id < ${c}))))"
            ));
            next += 3;
        }
        sql.push_str(&format!(
            " ORDER BY created_ns DESC, agent DESC, session_id DESC LIMIT ${next}"
        ));
        let sql = self.sql(&sql).into_owned();
        let mut select = sqlx::query(&sql).bind(&*self.runtime_id);
        if let Some(agent) = &query.agent {
            select = select.bind(agent.as_str());
        }
        if let Some(cwd) = &query.cwd {
            select = select.bind(cwd.as_str());
        }
        if let Some(title) = &query.title {
            select = select.bind(like_pattern(title));
        }
        if let Some((created_ns, agent, session)) = &query.after {
            select = select
                .bind(*created_ns)
                .bind(agent.as_str())
                .bind(session.as_str());
        }
        let rows = select
            .bind(i64::try_from(query.limit).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .bounded()
            .await
            .map_err(|source| self.read_error(source))?;
        let last = rows.last().and_then(|row| {
            Some((
                row.try_get::<i64, _>("created_ns").ok()?,
                row.try_get::<String, _>("agent").ok()?,
                row.try_get::<String, _>("session_id").ok()?,
            ))
        });
        Ok((self.readable(&rows), rows.len(), last))
    }

    /// The entries of session `id` (of `agent` only, when given): one per
    /// agent that has the id, read through the `sessions_by_id` index.
    ///
    /// # Errors
    /// [`StoreError::Read`] naming the store when the query fails.
    pub async fn entries_of(
        &self,
        agent: Option<&str>,
        id: &str,
    ) -> Result<Vec<SessionRow>, StoreError> {
        let mut sql = format!(
            "SELECT {SESSION_COLUMNS} FROM sessions WHERE runtime_id = $1 AND session_id = $2"
        );
        if agent.is_some() {
            sql.push_str(" AND agent = $3");
        }
        let sql = self.sql(&sql).into_owned();
        let mut select = sqlx::query(&sql).bind(&*self.runtime_id).bind(id);
        if let Some(agent) = agent {
            select = select.bind(agent);
        }
        let rows = select
            .fetch_all(&self.pool)
            .bounded()
            .await
            .map_err(|source| self.read_error(source))?;
        Ok(self.readable(&rows))
    }

    /// How many entries this runtime id has: `(not ended, ended)`, the
    /// dormant and ended entries of a listing made before any session is
    /// loaded (research/contract.md, "Metrics": `sessions{state}`).
    ///
    /// # Errors
    /// [`StoreError::Read`] naming the store when the query fails.
    pub async fn count_sessions(&self) -> Result<(u64, u64), StoreError> {
        let sql = self.sql(
            "SELECT count(*) AS n, count(end_reason) AS ended FROM sessions WHERE runtime_id = $1",
        );
        let row = sqlx::query(&sql)
            .bind(&*self.runtime_id)
            .fetch_one(&self.pool)
            .bounded()
            .await
            .map_err(|source| self.read_error(source))?;
        let count =
            |column: &str| u64::try_from(row.try_get::<i64, _>(column).unwrap_or(0)).unwrap_or(0);
        let ended = count("ended");
        Ok((count("n").saturating_sub(ended), ended))
    }

    /// The keys (agent, session id) of this runtime id's entries past the
    /// newest `keep`, at most `at_most` of them, oldest last, each with
    /// whether it ended: what retention (`--ended-sessions`) deletes, once
    /// the caller has spared the live ones.
    ///
    /// # Errors
    /// [`StoreError::Read`] naming the store when the query fails.
    pub async fn keys_past(
        &self,
        keep: u64,
        at_most: usize,
    ) -> Result<Vec<(String, String, bool)>, StoreError> {
        let sql = self.sql(
            "SELECT agent, session_id, \
             CAST(CASE WHEN end_reason IS NULL THEN 0 ELSE 1 END AS BIGINT) AS ended FROM sessions \
             WHERE runtime_id = $1 \
             ORDER BY created_ns DESC, agent DESC, session_id DESC LIMIT $3 OFFSET $2",
        );
        let rows = sqlx::query(&sql)
            .bind(&*self.runtime_id)
            .bind(i64::try_from(keep).unwrap_or(i64::MAX))
            .bind(i64::try_from(at_most).unwrap_or(i64::MAX))
            .fetch_all(&self.pool)
            .bounded()
            .await
            .map_err(|source| self.read_error(source))?;
        Ok(rows
            .iter()
            .filter_map(|row| {
                Some((
                    row.try_get::<String, _>("agent").ok()?,
                    row.try_get::<String, _>("session_id").ok()?,
                    row.try_get::<i64, _>("ended").ok()? != 0,
                ))
            })
            .collect())
    }

    /// A failed read, naming the store.
    fn read_error(&self, source: sqlx::Error) -> StoreError {
        StoreError::Read {
            what: self.what.to_string(),
            source,
        }
    }

    /// The rows this runtime can read (a row it cannot is skipped with a
    /// warning naming it).
    fn readable(&self, rows: &[AnyRow]) -> Vec<SessionRow> {
        rows.iter()
            .filter_map(|row| match session_row(row) {
                Ok(session) => Some(session),
                Err(error) => {
                    let name = |column| row.try_get::<String, _>(column).unwrap_or_default();
                    tracing::warn!(
                        store = self.describe(),
                        agent = name("agent"),
                        session = name("session_id"),
                        %error,
                        "skipping a session the store holds but this runtime cannot read"
                    );
                    None
                }
            })
            .collect()
    }

    /// Up to `limit` events of (`agent`, `session_id`) at or after `offset`,
    /// in order, and no more message bytes than `max_bytes` (the first event
    /// always comes, whatever its size). Pruned events are skipped (the
    /// first offset is then larger); a row this runtime cannot read is
    /// skipped too, with a warning (a gap, not a failed page).
    ///
    /// # Errors
    /// A failed query.
    pub async fn events(
        &self,
        agent: &str,
        session_id: &str,
        offset: u64,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<EventRow>, StoreError> {
        // Read in small steps, so a page of large messages stops at the
        // byte budget instead of loading `limit` of them at once.
        const STEP: usize = 64;
        let sql = match self.backend {
            Backend::Postgres => Cow::Borrowed(
                "SELECT event_offset, at_ns, direction, message FROM events \
                 WHERE session_key = (SELECT session_key FROM session_keys \
                 WHERE runtime_id = $1 AND agent = $2 AND session_id = $3) AND event_offset >= $4 \
                 ORDER BY event_offset LIMIT $5",
            ),
            // One range of the rowid (see `event_id`).
            Backend::Sqlite => self.sql(
                "SELECT e.event_offset, e.at_ns, e.direction, e.message \
                 FROM session_keys k JOIN events e \
                 ON e.event_id >= k.session_key * 4294967296 + $4 \
                 AND e.event_id < (k.session_key + 1) * 4294967296 \
                 WHERE k.runtime_id = $1 AND k.agent = $2 AND k.session_id = $3 \
                 AND k.session_key BETWEEN 0 AND 2147483647 \
                 ORDER BY e.event_id LIMIT $5",
            ),
        };
        let mut events = Vec::new();
        let mut bytes = 0_usize;
        let mut next = self.offset_bound(offset);
        while events.len() < limit {
            let step = STEP.min(limit - events.len());
            let rows = sqlx::query(&sql)
                .bind(&*self.runtime_id)
                .bind(agent)
                .bind(session_id)
                .bind(next)
                .bind(i64::try_from(step).unwrap_or(i64::MAX))
                .fetch_all(&self.pool)
                .bounded()
                .await?;
            let fetched = rows.len();
            let before = next;
            for row in &rows {
                if let Ok(offset) = row.try_get::<i64, _>("event_offset") {
                    next = next.max(offset.saturating_add(1));
                }
                match event_row(row) {
                    Ok(event) => {
                        if !events.is_empty() && bytes + event.message.len() > max_bytes {
                            return Ok(events);
                        }
                        bytes += event.message.len();
                        events.push(event);
                    }
                    Err(error) => tracing::warn!(
                        store = self.describe(),
                        agent,
                        session = session_id,
                        %error,
                        "skipping an event the store holds but this runtime cannot read"
                    ),
                }
            }
            // The end, or rows whose offsets cannot be read: no progress.
            if fetched < step || next == before {
                break;
            }
        }
        Ok(events)
    }

    /// Writes `batch` in one transaction, in order, and in the same
    /// transaction prunes each session `pruning` says is past its cap;
    /// returns what it pruned and the events not stored for want of a
    /// SQLite event id. An entry change is written
    /// with its row in `rows` (the newest, see [`writer`]), or skipped when
    /// `rows` has none of its sequence number (removed or superseded).
    /// `keys` holds the sessions' integer keys the writer knows; the ones
    /// this batch makes are known once it commits.
    ///
    /// `connection` is the writer's own connection, taken on first use and
    /// kept (see [`connection`]): SQLite's page cache is per connection
    /// and is dropped when another connection has written, so a batch on
    /// whichever connection the pool hands out re-reads the pages the last
    /// batch wrote. A pool connection is given back after a failure;
    /// SQLite's own is kept (the writer drops it when a batch times out).
    async fn apply(
        &self,
        connection: &mut Option<WriterConnection>,
        batch: &[Write],
        rows: &RowSnapshot,
        keys: &mut SessionKeys,
        pruning: &Pruning<'_>,
    ) -> Result<Applied, sqlx::Error> {
        let held = match connection {
            Some(held) => held,
            None => connection.insert(self.writer_connection().await?),
        };
        let written = self.write_batch(held, batch, rows, keys, pruning).await;
        // A pool connection goes back after a failure (a new one next
        // time); SQLite's own stays: it is on the file opened at start,
        // and its failed transaction is rolled back before its next use.
        if written.is_err() && held.is_pooled() {
            *connection = None;
        }
        written
    }

    /// A connection for the writer: SQLite's own at a lower CPU priority
    /// (the one opened at start, else a new one while the file is the one
    /// opened then), else one from the pool (PostgreSQL, or a SQLite file
    /// deleted or replaced: the pool's connections hold the file opened at
    /// start, and a new one would open another); see [`connection`].
    async fn writer_connection(&self) -> Result<WriterConnection, sqlx::Error> {
        if let Some(first) = self.writer_first.lock().take() {
            return Ok(WriterConnection::Own(first));
        }
        match &self.writer_url {
            Some(url) if self.check_file().is_ok() => Ok(WriterConnection::Own(
                connection::open_lowered(url.to_string()).await?,
            )),
            _ => Ok(WriterConnection::Pooled(self.pool.acquire().await?)),
        }
    }

    /// [`Self::apply`] on `connection`.
    async fn write_batch(
        &self,
        connection: &mut sqlx::AnyConnection,
        batch: &[Write],
        rows: &RowSnapshot,
        keys: &mut SessionKeys,
        pruning: &Pruning<'_>,
    ) -> Result<Applied, sqlx::Error> {
        keys.begin();
        // SQLite: take the write lock at the start. A deferred `BEGIN`
        // whose first statement reads (a session key lookup) gets
        // SQLITE_BUSY at once, without `busy_timeout`'s wait, when another
        // server on the same file commits before its first write.
        let mut tx = match self.backend {
            Backend::Sqlite => connection.begin_with("BEGIN IMMEDIATE").await?,
            Backend::Postgres => connection.begin().await?,
        };
        // Events and entry rows are gathered and written a few statements
        // per batch (each statement is a round trip to SQLite's thread):
        // the two tables are independent, so only a removal orders them.
        let mut counts: Vec<(Arc<str>, Arc<str>, u64, i64)> = Vec::new();
        let mut events: Vec<&Write> = Vec::new();
        let mut entries: Vec<&SessionRow> = Vec::new();
        let mut unstorable = 0;
        for write in batch {
            match write {
                Write::Event { .. } => events.push(write),
                Write::Session {
                    agent,
                    session,
                    seq,
                } => {
                    // Only the newest change of an entry has its row.
                    if let Some(row) = row_of(rows, agent, session, *seq) {
                        entries.push(row);
                    }
                }
                Write::Remove { agent, session } => {
                    self.insert_events(&mut tx, &mut events, &mut counts, keys, &mut unstorable)
                        .await?;
                    self.upsert(&mut tx, &mut entries).await?;
                    counts.retain(|(a, s, _, _)| !(a == agent && s == session));
                    keys.forget(&(agent.clone(), session.clone()));
                    self.delete_events(&mut tx, agent, session, None).await?;
                    for sql in [
                        "DELETE FROM session_keys WHERE runtime_id = $1 AND agent = $2 AND session_id = $3",
                        "DELETE FROM sessions WHERE runtime_id = $1 AND agent = $2 AND session_id = $3",
                    ] {
                        sqlx::query(&self.sql(sql))
                            .bind(&*self.runtime_id)
                            .bind(&**agent)
                            .bind(&**session)
                            .execute(&mut *tx)
                            .await?;
                    }
                }
                Write::Flush(_) | Write::Barrier(_) => {}
            }
        }
        self.insert_events(&mut tx, &mut events, &mut counts, keys, &mut unstorable)
            .await?;
        self.upsert(&mut tx, &mut entries).await?;
        self.raise_counts(&mut tx, &counts).await?;
        // The prune rides the batch: one commit, on the writer's own
        // connection (a commit may run SQLite's checkpoint, two fsyncs).
        let mut pruned = Vec::new();
        for (agent, session, count, _) in counts {
            let key = (agent, session);
            if let Some(below) = pruning.below(&key, count) {
                self.delete_events(&mut tx, &key.0, &key.1, Some(below))
                    .await?;
                pruned.push((key, below));
            }
        }
        tx.commit().await?;
        keys.committed();
        Ok(Applied { pruned, unstorable })
    }

    /// The integer key of (`agent`, `session`)'s events: known to the
    /// writer, else read from `session_keys`, else made there.
    async fn session_key(
        &self,
        tx: &mut sqlx::Transaction<'_, sqlx::Any>,
        keys: &mut SessionKeys,
        agent: &Arc<str>,
        session: &Arc<str>,
    ) -> Result<i64, sqlx::Error> {
        let id: Key = (agent.clone(), session.clone());
        if let Some(key) = keys.get(&id) {
            return Ok(key);
        }
        let insert = self.sql(
            "INSERT INTO session_keys (runtime_id, agent, session_id) VALUES ($1, $2, $3) \
             ON CONFLICT (runtime_id, agent, session_id) DO NOTHING",
        );
        sqlx::query(&insert)
            .bind(&*self.runtime_id)
            .bind(&**agent)
            .bind(&**session)
            .execute(&mut **tx)
            .await?;
        let select = self.sql(
            "SELECT session_key FROM session_keys \
             WHERE runtime_id = $1 AND agent = $2 AND session_id = $3",
        );
        let key: i64 = sqlx::query_scalar(&select)
            .bind(&*self.runtime_id)
            .bind(&**agent)
            .bind(&**session)
            .fetch_one(&mut **tx)
            .await?;
        keys.add(id, key);
        Ok(key)
    }

    /// Inserts the gathered events (multi-row `INSERT`s) and notes each
    /// session's new count and latest time. An event SQLite's `event_id`
    /// cannot hold is not inserted; it is counted in `unstorable`.
    async fn insert_events(
        &self,
        tx: &mut sqlx::Transaction<'_, sqlx::Any>,
        events: &mut Vec<&Write>,
        counts: &mut Vec<(Arc<str>, Arc<str>, u64, i64)>,
        keys: &mut SessionKeys,
        unstorable: &mut u64,
    ) -> Result<(), sqlx::Error> {
        let sqlite = self.backend == Backend::Sqlite;
        let mut rows = Vec::with_capacity(events.len().min(EVENTS_PER_INSERT));
        for chunk in events.chunks(EVENTS_PER_INSERT) {
            rows.clear();
            for write in chunk {
                if let Write::Event {
                    agent,
                    session,
                    event,
                    ..
                } = write
                {
                    let key = self.session_key(tx, keys, agent, session).await?;
                    let offset = i64::try_from(event.offset).unwrap_or(i64::MAX);
                    if !sqlite {
                        rows.push((key, offset, event));
                    } else if let Some(id) = event_id(key, event.offset) {
                        rows.push((id, offset, event));
                    } else {
                        *unstorable += 1;
                    }
                    let count = event.offset + 1;
                    match counts
                        .iter_mut()
                        .find(|(a, s, _, _)| a == agent && s == session)
                    {
                        Some(entry) => {
                            entry.2 = entry.2.max(count);
                            entry.3 = entry.3.max(event.at_ns);
                        }
                        None => counts.push((agent.clone(), session.clone(), count, event.at_ns)),
                    }
                }
            }
            if rows.is_empty() {
                continue;
            }
            let sql = self.insert_sql(rows.len());
            let mut query = sqlx::query(&sql);
            for (key, offset, event) in &rows {
                // SQLite: `key` is the event id, which holds the offset.
                query = query.bind(*key);
                if !sqlite {
                    query = query.bind(*offset);
                }
                query = query
                    .bind(event.at_ns)
                    .bind(direction_text(event.direction))
                    .bind(&*event.message);
            }
            query.execute(&mut **tx).await?;
        }
        events.clear();
        Ok(())
    }

    /// `INSERT INTO events … VALUES` for `rows` rows; an event already
    /// stored at its key and offset is left as it is.
    fn insert_sql(&self, rows: usize) -> String {
        let (columns, per_row) = match self.backend {
            Backend::Postgres => (
                "INSERT INTO events (session_key, event_offset, at_ns, direction, message) VALUES ",
                5,
            ),
            Backend::Sqlite => (
                "INSERT INTO events (event_id, at_ns, direction, message) VALUES ",
                4,
            ),
        };
        self.values_sql(columns, rows, per_row, " ON CONFLICT DO NOTHING")
    }

    /// `prefix`, then `rows` parenthesised lists of `per_row` parameters,
    /// then `suffix` (which takes no parameters).
    fn values_sql(&self, prefix: &str, rows: usize, per_row: usize, suffix: &str) -> String {
        let mut sql = String::with_capacity(prefix.len() + suffix.len() + rows * per_row * 6);
        sql.push_str(prefix);
        // SQLite: bare `?`s. A numbered parameter costs a linear scan
        // of the statement's parameter names at every bind (SQLite's
        // `sqlite3_bind_parameter_name`), quadratic in a 1280-parameter
        // statement: it was a third of the server's CPU under load.
        let numbered = self.backend == Backend::Postgres;
        for row in 0..rows {
            if row > 0 {
                sql.push(',');
            }
            sql.push('(');
            for column in 0..per_row {
                if column > 0 {
                    sql.push(',');
                }
                if numbered {
                    sql.push('$');
                    sql.push_str(itoa::Buffer::new().format(row * per_row + column + 1));
                } else {
                    sql.push('?');
                }
            }
            sql.push(')');
        }
        sql.push_str(suffix);
        sql
    }

    /// Writes the gathered entry rows (multi-row upserts, at most one row
    /// per entry: the writer keeps only an entry's newest row).
    async fn upsert(
        &self,
        tx: &mut sqlx::Transaction<'_, sqlx::Any>,
        entries: &mut Vec<&SessionRow>,
    ) -> Result<(), sqlx::Error> {
        for chunk in entries.chunks(ENTRIES_PER_STATEMENT) {
            let sql = self.values_sql(
                "INSERT INTO sessions (runtime_id, agent, session_id, cwd, created_ns, updated_ns, \
                 end_reason, metadata, event_count, title, model, mode, models, first_prompt) VALUES ",
                chunk.len(),
                14,
                " ON CONFLICT (runtime_id, agent, session_id) DO UPDATE SET cwd = excluded.cwd, \
                 created_ns = excluded.created_ns, updated_ns = excluded.updated_ns, \
                 end_reason = excluded.end_reason, metadata = excluded.metadata, \
                 event_count = excluded.event_count, title = excluded.title, \
                 model = excluded.model, mode = excluded.mode, models = excluded.models, \
                 first_prompt = excluded.first_prompt",
            );
            let mut query = sqlx::query(&sql);
            for row in chunk {
                query = query
                    .bind(&*self.runtime_id)
                    .bind(&*row.agent)
                    .bind(&*row.session_id)
                    .bind(row.cwd.as_deref().map(text))
                    .bind(row.created_ns)
                    .bind(row.updated_ns)
                    .bind(row.end_reason.map(end_reason_text))
                    .bind(serde_json::to_string(&row.metadata).unwrap_or_else(|_| "{}".into()))
                    .bind(i64::try_from(row.event_count).unwrap_or(i64::MAX))
                    .bind(row.title.as_deref().map(text))
                    .bind(row.model.as_deref().map(text))
                    .bind(row.mode.as_deref().map(text))
                    .bind(
                        row.models
                            .as_ref()
                            .and_then(|models| serde_json::to_string(models).ok()),
                    )
                    .bind(row.first_prompt.as_deref().map(text));
            }
            query.execute(&mut **tx).await?;
        }
        entries.clear();
        Ok(())
    }

    /// Raises each entry's `event_count` (and `updated_ns`) to what the
    /// batch's events reached, never lowering it (`counts`: agent, session,
    /// count, latest event time in ns); one statement per
    /// [`ENTRIES_PER_STATEMENT`] entries.
    async fn raise_counts(
        &self,
        tx: &mut sqlx::Transaction<'_, sqlx::Any>,
        counts: &[(Arc<str>, Arc<str>, u64, i64)],
    ) -> Result<(), sqlx::Error> {
        for chunk in counts.chunks(ENTRIES_PER_STATEMENT) {
            // `VALUES` columns are `column1`… in both SQLite and PostgreSQL.
            let sql = self.values_sql(
                "UPDATE sessions SET event_count = v.column4, updated_ns = v.column5 FROM (VALUES ",
                chunk.len(),
                5,
                ") AS v WHERE sessions.runtime_id = v.column1 AND sessions.agent = v.column2 \
                 AND sessions.session_id = v.column3 AND sessions.event_count < v.column4",
            );
            let mut query = sqlx::query(&sql);
            for (agent, session, count, updated) in chunk {
                query = query
                    .bind(&*self.runtime_id)
                    .bind(&**agent)
                    .bind(&**session)
                    .bind(i64::try_from(*count).unwrap_or(i64::MAX))
                    .bind(*updated);
            }
            query.execute(&mut **tx).await?;
        }
        Ok(())
    }

    /// Deletes the events of (`agent`, `session`) at offsets below `below`
    /// (`None`: all of them).
    async fn delete_events(
        &self,
        connection: &mut sqlx::AnyConnection,
        agent: &str,
        session: &str,
        below: Option<u64>,
    ) -> Result<(), sqlx::Error> {
        if self.backend == Backend::Postgres {
            // No bound: every offset is below `i64::MAX`.
            sqlx::query(
                "DELETE FROM events WHERE session_key = (SELECT session_key \
                 FROM session_keys WHERE runtime_id = $1 AND agent = $2 AND session_id = $3) \
                 AND event_offset < $4",
            )
            .bind(&*self.runtime_id)
            .bind(agent)
            .bind(session)
            .bind(self.offset_bound(below.unwrap_or(u64::MAX)))
            .execute(&mut *connection)
            .await?;
            return Ok(());
        }
        // SQLite: the key first, then one range of event ids given as
        // numbers. With a subquery in its WHERE, SQLite's DELETE gathers
        // the rowids first and finds each one again from the root; without,
        // it deletes as it scans (research/decisions.md, "The writer's cost
        // per event").
        let key: Option<i64> = sqlx::query_scalar(
            "SELECT session_key FROM session_keys \
             WHERE runtime_id = ?1 AND agent = ?2 AND session_id = ?3",
        )
        .bind(&*self.runtime_id)
        .bind(agent)
        .bind(session)
        .fetch_optional(&mut *connection)
        .await?;
        // A key past what an event id holds has no events stored.
        let Some(first) = key.and_then(|key| event_id(key, 0)) else {
            return Ok(());
        };
        let count = self.offset_bound(below.unwrap_or(u64::MAX));
        if count == 0 {
            return Ok(());
        }
        sqlx::query("DELETE FROM events WHERE event_id BETWEEN ?1 AND ?2")
            .bind(first)
            .bind(first + (count - 1))
            .execute(&mut *connection)
            .await?;
        Ok(())
    }

    /// An offset as bound in an event query: SQLite's event ids hold
    /// offsets below 2^32, so a larger one is 2^32 there (past every
    /// stored offset, and no overflow in `key * 2^32 + offset`).
    fn offset_bound(&self, offset: u64) -> i64 {
        let offset = match self.backend {
            Backend::Postgres => offset,
            Backend::Sqlite => offset.min(1 << OFFSET_BITS),
        };
        i64::try_from(offset).unwrap_or(i64::MAX)
    }

    /// Closes the pool (waits for connections in use to come back; the
    /// SQLite writer closes its own once the queue is empty at shutdown). A
    /// SQLite file deleted or replaced while open is first copied, whole, to
    /// `<file>.recovered-<ms since the epoch>` (logged), since its content
    /// is gone with the last connection.
    pub async fn close(&self) {
        if let Some(file) = &self.file
            && let Err(file::Problem::Gone(_)) = file.check()
        {
            self.save_copy(&file.recovery_path()).await;
        }
        self.pool.close().await;
    }

    /// Writes the whole database to `copy` (`VACUUM INTO`), and logs where.
    async fn save_copy(&self, copy: &Path) {
        let Some(target) = copy.to_str() else {
            tracing::warn!(
                store = self.describe(),
                "no copy saved: the path is not UTF-8"
            );
            return;
        };
        // Made empty first, readable by the server's user alone (VACUUM
        // INTO takes an empty file): the copy holds every session.
        {
            use std::os::unix::fs::OpenOptionsExt as _;
            if let Err(error) = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(copy)
            {
                tracing::warn!(store = self.describe(), copy = target, %error, "no copy saved");
                return;
            }
        }
        match sqlx::query("VACUUM INTO ?1")
            .bind(target)
            .execute(&self.pool)
            .await
        {
            Ok(_) => tracing::warn!(
                store = self.describe(),
                copy = target,
                "the session store file was deleted or replaced while the server ran: its \
                 content is saved in the copy, which a start that finds no session store file \
                 puts in its place"
            ),
            Err(error) => tracing::warn!(
                store = self.describe(),
                copy = target,
                %error,
                "the session store file was deleted or replaced while the server ran, and \
                 saving a copy failed: its sessions are lost"
            ),
        }
    }
}

/// An exclusive `flock` on `<file>.lock`, held while a SQLite store is
/// opened and migrated; released when dropped.
///
/// # Errors
/// When the lock file cannot be created or locked.
async fn open_lock(file: &Path) -> Result<nix::fcntl::Flock<std::fs::File>, StoreError> {
    let mut name = file.as_os_str().to_owned();
    name.push(".lock");
    let path = PathBuf::from(name);
    let failed = |e: String| StoreError::Io(format!("{}: {e}", path.display()));
    let lock_file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| failed(e.to_string()))?;
    tokio::task::spawn_blocking(move || {
        nix::fcntl::Flock::lock(lock_file, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, errno)| errno.to_string())
    })
    .await
    .map_err(|e| failed(e.to_string()))?
    .map_err(failed)
}

/// Per-connection settings (see [`connection::prepare_sqlite`]; none for
/// PostgreSQL).
async fn prepare(
    connection: &mut sqlx::AnyConnection,
    backend: Backend,
) -> Result<(), sqlx::Error> {
    match backend {
        Backend::Sqlite => connection::prepare_sqlite(connection).await,
        Backend::Postgres => Ok(()),
    }
}

/// Characters of a SQLite path escaped in its URL (`%`, `?`, `#`: the URL
/// parser would take them as an escape, the query or a fragment).
const SQLITE_PATH: &percent_encoding::AsciiSet =
    &percent_encoding::CONTROLS.add(b'%').add(b'?').add(b'#');

/// Text for a `TEXT` column: PostgreSQL refuses NUL in text, so it becomes
/// U+FFFD (SQLite would keep it; one rule for both).
fn text(value: &str) -> String {
    value.replace('\0', "\u{FFFD}")
}

fn direction_text(direction: Direction) -> &'static str {
    match direction {
        Direction::AgentToClient => "agent_to_client",
        Direction::ClientToAgent => "client_to_agent",
    }
}

fn end_reason_text(reason: EndReason) -> &'static str {
    match reason {
        EndReason::Completed => "completed",
        EndReason::Error => "error",
        EndReason::Terminated => "terminated",
    }
}

/// Longest a read of the store may take (a lock held elsewhere, a slow
/// disk): then it fails like an unreachable store (503), never hangs a
/// request for as long as someone holds a lock.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// A read bounded by [`READ_TIMEOUT`] (`sqlx::Error::PoolTimedOut` past it).
trait Bounded<T>: std::future::Future<Output = Result<T, sqlx::Error>> + Sized {
    async fn bounded(self) -> Result<T, sqlx::Error> {
        tokio::time::timeout(READ_TIMEOUT, self)
            .await
            .unwrap_or(Err(sqlx::Error::PoolTimedOut))
    }
}

impl<T, F: std::future::Future<Output = Result<T, sqlx::Error>>> Bounded<T> for F {}

/// The columns of an inventory entry, as [`session_row`] reads them.
const SESSION_COLUMNS: &str = "agent, session_id, cwd, created_ns, updated_ns, end_reason, \
     metadata, event_count, title, model, mode, models, first_prompt";

/// A `LIKE` pattern matching `text` anywhere, lower case, its `%`, `_` and
/// `\` escaped (with `ESCAPE '\'`).
fn like_pattern(text: &str) -> String {
    let mut pattern = String::with_capacity(text.len() + 2);
    pattern.push('%');
    for c in text.to_ascii_lowercase().chars() {
        if matches!(c, '%' | '_' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push('%');
    pattern
}

fn session_row(row: &AnyRow) -> Result<SessionRow, StoreError> {
    let bad = |e: sqlx::Error| StoreError::Row(e.to_string());
    let end_reason = match row
        .try_get::<Option<String>, _>("end_reason")
        .map_err(bad)?
    {
        None => None,
        Some(text) => Some(match text.as_str() {
            "completed" => EndReason::Completed,
            "error" => EndReason::Error,
            "terminated" => EndReason::Terminated,
            other => return Err(StoreError::Row(format!("unknown end reason {other:?}"))),
        }),
    };
    let metadata: String = row.try_get("metadata").map_err(bad)?;
    let models: Option<String> = row.try_get("models").map_err(bad)?;
    let agent: String = row.try_get("agent").map_err(bad)?;
    let session_id: String = row.try_get("session_id").map_err(bad)?;
    Ok(SessionRow {
        agent: agent.into(),
        session_id: session_id.into(),
        cwd: row.try_get("cwd").map_err(bad)?,
        created_ns: row.try_get("created_ns").map_err(bad)?,
        updated_ns: row.try_get("updated_ns").map_err(bad)?,
        end_reason,
        metadata: serde_json::from_str(&metadata).unwrap_or_default(),
        event_count: u64::try_from(row.try_get::<i64, _>("event_count").map_err(bad)?).unwrap_or(0),
        title: row.try_get("title").map_err(bad)?,
        model: row.try_get("model").map_err(bad)?,
        mode: row.try_get("mode").map_err(bad)?,
        models: models.and_then(|text| serde_json::from_str(&text).ok()),
        first_prompt: row.try_get("first_prompt").map_err(bad)?,
    })
}

fn event_row(row: &AnyRow) -> Result<EventRow, StoreError> {
    let bad = |e: sqlx::Error| StoreError::Row(e.to_string());
    let direction: String = row.try_get("direction").map_err(bad)?;
    let direction = match direction.as_str() {
        "agent_to_client" => Direction::AgentToClient,
        "client_to_agent" => Direction::ClientToAgent,
        other => return Err(StoreError::Row(format!("unknown direction {other:?}"))),
    };
    let message: Vec<u8> = row.try_get("message").map_err(bad)?;
    Ok(EventRow {
        offset: u64::try_from(row.try_get::<i64, _>("event_offset").map_err(bad)?).unwrap_or(0),
        at_ns: row.try_get("at_ns").map_err(bad)?,
        direction,
        message: Bytes::from(message),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_urls() {
        assert_eq!(StoreUrl::parse("memory"), Ok(StoreUrl::Memory));
        assert_eq!(
            StoreUrl::parse("sqlite:/d/s.db"),
            Ok(StoreUrl::Sqlite("/d/s.db".into()))
        );
        assert_eq!(
            StoreUrl::parse("sqlite:///d/s.db"),
            Ok(StoreUrl::Sqlite("/d/s.db".into()))
        );
        assert!(StoreUrl::parse("sqlite:").is_err());
        assert!(StoreUrl::parse("mysql://x").is_err());
        let url = StoreUrl::parse("postgres://u:secret@h:5432/db").expect("postgres");
        assert_eq!(url.redacted(), "postgres://u:***@h:5432/db");
        assert_eq!(
            StoreUrl::parse("postgresql://u@h/db")
                .expect("postgresql")
                .redacted(),
            "postgresql://u@h/db"
        );
        let url =
            StoreUrl::parse("postgres://u@h/db?sslmode=verify-full&sslrootcert=/ca.pem&password=p")
                .expect("postgres");
        assert_eq!(
            url.redacted(),
            "postgres://u@h/db?sslmode=verify-full&sslrootcert=%2Fca.pem&password=***"
        );
        let url = StoreUrl::parse("postgres://u@h/db?sslmode=verify-full&sslrootcert=/ca.pem")
            .expect("postgres");
        assert_eq!(
            url.redacted(),
            "postgres://u@h/db?sslmode=verify-full&sslrootcert=/ca.pem"
        );
    }

    #[test]
    fn sqlite_event_ids_hold_a_key_below_2_31_and_an_offset_below_2_32() {
        assert_eq!(event_id(0, 0), Some(0));
        assert_eq!(event_id(1, 0), Some(1 << 32));
        assert_eq!(event_id(3, 7), Some(3 * (1 << 32) + 7));
        let last_offset = (1_u64 << 32) - 1;
        assert_eq!(
            event_id(1, last_offset),
            Some((1 << 32) + i64::try_from(last_offset).expect("small"))
        );
        // Offsets of one key never reach the next key's ids.
        assert!(event_id(1, last_offset) < event_id(2, 0));
        assert_eq!(event_id(1, 1 << 32), None);
        assert_eq!(event_id(1, u64::MAX), None);
        let last_key = (1_i64 << 31) - 1;
        assert_eq!(event_id(last_key, last_offset), Some(i64::MAX));
        assert_eq!(event_id(1 << 31, 0), None);
        assert_eq!(event_id(-1, 0), None);
    }
}
