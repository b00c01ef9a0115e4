//! The [`Store`] handle (its pool, backend, runtime id and files), its
//! small accessors and close, and the encodings every part of the store
//! shares: times, cursors, event ids.

use super::rows::*;
use super::{file, tls};

use sqlx::AnyPool;
use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The file the SQLite store has in the data dir by default.
pub const DEFAULT_SQLITE_FILE: &str = "sessions.db";
/// The file in the data dir that holds the default runtime id.
pub const RUNTIME_ID_FILE: &str = "runtime-id";
/// Longest a connection attempt may take at start-up and on each retry.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Entries per multi-row upsert of `sessions` rows (14 parameters each:
/// 896) and per `UPDATE` of their counts.
pub(crate) const ENTRIES_PER_STATEMENT: usize = 64;
/// Rows per multi-row `INSERT` of events (at most 5 parameters each: 1280,
/// within SQLite's 32766 and PostgreSQL's 65535 bound parameters).
pub(crate) const EVENTS_PER_INSERT: usize = 256;
/// Bits of a SQLite `event_id` below the session key: the offset's.
pub(crate) const OFFSET_BITS: u32 = 32;

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
pub(crate) enum Backend {
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
pub(crate) fn event_id(key: i64, offset: u64) -> Option<i64> {
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
    pub(crate) pool: AnyPool,
    pub(crate) backend: Backend,
    pub(crate) runtime_id: Arc<str>,
    pub(crate) what: Arc<str>,
    /// The SQLite file as opened, checked before writes and while idle
    /// (`None` for PostgreSQL).
    pub(crate) file: Option<Arc<file::SqliteFile>>,
    /// PostgreSQL's TLS settings, to name a failed check in errors
    /// (`None` for SQLite).
    pub(crate) tls: Option<Arc<tls::Settings>>,
    /// The URL the SQLite writer opens its own connection with (`None`
    /// for PostgreSQL, whose writer takes one from the pool).
    pub(crate) writer_url: Option<Arc<str>>,
    /// SQLite: the writer's connection, opened with the pool at start (on
    /// the file as found then) and taken by the writer on its first batch.
    pub(crate) writer_first: Arc<parking_lot::Mutex<Option<sqlx::AnyConnection>>>,
}

impl Store {
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
    pub(crate) fn sql<'a>(&self, sql: &'a str) -> Cow<'a, str> {
        match self.backend {
            Backend::Postgres => Cow::Borrowed(sql),
            Backend::Sqlite => Cow::Owned(sql.replace('$', "?")),
        }
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
    pub(crate) async fn save_copy(&self, copy: &Path) {
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
