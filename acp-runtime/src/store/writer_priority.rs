//! The writer's connection (research/decisions.md, "The SQLite writer runs
//! at a lower CPU priority").
//!
//! - SQLite: a connection of its own, outside the pool, whose thread runs
//!   at a nice value [`WRITER_NICE`] above the server's. sqlx runs each
//!   SQLite connection on a thread it spawns when the connection opens, and
//!   Linux gives a new thread the nice value of the thread that spawned it
//!   (a per-thread attribute: `setpriority(2)`, "BUGS"), so the connection
//!   is opened from a short-lived thread lowered first. On a busy machine
//!   the live path (agent stdout to SSE) then goes first and the writer
//!   catches up after; on an idle one it runs as fast as before.
//! - PostgreSQL: a connection of the pool (its work is the database
//!   server's, not this process's).

use sqlx::pool::PoolConnection;
use sqlx::{AnyConnection, Connection as _};
use std::ops::{Deref, DerefMut};

/// How much lower (in nice steps, 0–19) the SQLite writer's thread runs
/// than the thread that opens it. Ten steps weigh it about a tenth of a
/// normal thread when both want the CPU (CFS weights 1024 vs 110).
pub(crate) const WRITER_NICE: i32 = 10;

/// The connection [`super::Store::apply`] writes batches on.
#[derive(Debug)]
pub(crate) enum WriterConnection {
    /// SQLite: opened by [`open_lowered`] at start, kept until a batch
    /// times out or the server stops.
    Own(AnyConnection),
    /// PostgreSQL (or a SQLite file deleted or replaced since the start):
    /// taken from the pool, given back while idle.
    Pooled(PoolConnection<sqlx::Any>),
}

impl WriterConnection {
    /// Whether it is the pool's: given back while idle (the pool tests a
    /// connection before handing it out; one a server closed is replaced)
    /// and after a failed batch.
    pub(crate) fn is_pooled(&self) -> bool {
        matches!(self, Self::Pooled(_))
    }
}

impl Deref for WriterConnection {
    type Target = AnyConnection;

    fn deref(&self) -> &AnyConnection {
        match self {
            Self::Own(connection) => connection,
            Self::Pooled(connection) => connection,
        }
    }
}

impl DerefMut for WriterConnection {
    fn deref_mut(&mut self) -> &mut AnyConnection {
        match self {
            Self::Own(connection) => connection,
            Self::Pooled(connection) => connection,
        }
    }
}

/// SQLite's settings for every connection: WAL (readers never wait for the
/// writer), `synchronous = NORMAL` (a power cut may lose the last commits,
/// never corrupt the file; SQLite docs, "WAL mode"), and a busy timeout.
///
/// # Errors
/// The database's error for a pragma it refuses.
pub(super) async fn prepare_sqlite(connection: &mut AnyConnection) -> Result<(), sqlx::Error> {
    // The busy timeout first: switching to WAL takes a lock another
    // process may hold for a moment.
    for pragma in [
        "PRAGMA busy_timeout = 5000",
        "PRAGMA journal_mode = WAL",
        "PRAGMA synchronous = NORMAL",
    ] {
        sqlx::query(pragma).execute(&mut *connection).await?;
    }
    Ok(())
}

/// Opens `url` (a SQLite URL) from a new thread whose nice value is raised
/// by [`WRITER_NICE`] first, with [`prepare_sqlite`]'s settings; the
/// thread sqlx spawns for the connection inherits the lowered priority.
/// A nice value that cannot be raised (a seccomp filter, say) is logged
/// at debug and the connection opens at the normal priority.
///
/// # Errors
/// The open's or the settings' error; [`sqlx::Error::Io`] when the opening
/// thread cannot be started or dies.
pub(crate) async fn open_lowered(url: String) -> Result<AnyConnection, sqlx::Error> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("store-writer-open".into())
        .spawn(move || {
            lower_this_thread();
            let opened = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(sqlx::Error::Io)
                .and_then(|runtime| {
                    runtime.block_on(async {
                        let mut connection = AnyConnection::connect(&url).await?;
                        prepare_sqlite(&mut connection).await?;
                        Ok(connection)
                    })
                });
            let _ = tx.send(opened);
        })
        .map_err(sqlx::Error::Io)?;
    rx.await.map_err(|_| {
        sqlx::Error::Io(std::io::Error::other(
            "the thread opening the store writer's connection died",
        ))
    })?
}

/// Raises the calling thread's nice value by [`WRITER_NICE`] (at most 19).
fn lower_this_thread() {
    let thread = Some(rustix::thread::gettid());
    let lowered = rustix::process::getpriority_process(thread).and_then(|nice| {
        rustix::process::setpriority_process(thread, nice.saturating_add(WRITER_NICE).min(19))
    });
    if let Err(error) = lowered {
        tracing::debug!(%error, "the store writer runs at the normal CPU priority");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The thread sqlx spawns for the connection runs `WRITER_NICE` above
    /// the process (found in /proc by its name), and the connection has
    /// the store's settings.
    #[tokio::test]
    async fn the_writer_connection_thread_runs_lowered() {
        let dir = std::env::temp_dir().join(format!("writer-nice-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temp dir");
        let url = format!("sqlite://{}/w.db?mode=rwc", dir.display());
        sqlx::any::install_default_drivers();
        let own = rustix::process::getpriority_process(None).expect("our nice value");
        let before = sqlite_threads();
        let mut connection = open_lowered(url)
            .await
            .expect("the writer's connection opens");
        // A listing of /proc/self/task can skip a thread while others exit
        // (other tests' threads do): several listings, merged.
        let mut opened: Vec<i32> = (0..8)
            .flat_map(|_| sqlite_threads())
            .filter(|thread| !before.contains(thread))
            .map(|(tid, _)| tid)
            .collect();
        opened.sort_unstable();
        opened.dedup();
        // Other tests may open connections meanwhile: one of the new
        // threads is this connection's.
        let nices: Vec<i32> = opened
            .iter()
            .filter_map(|&tid| {
                rustix::process::getpriority_process(rustix::process::Pid::from_raw(tid)).ok()
            })
            .collect();
        assert!(
            nices.contains(&(own + WRITER_NICE).min(19)),
            "new sqlx threads {opened:?} run at {nices:?}, the test at {own}"
        );
        let one: i64 = sqlx::query_scalar("SELECT 1")
            .fetch_one(&mut connection)
            .await
            .expect("a query on it");
        assert_eq!(one, 1);
        let journal: String = sqlx::query_scalar("PRAGMA journal_mode")
            .fetch_one(&mut connection)
            .await
            .expect("its journal mode");
        assert_eq!(journal, "wal");
        drop(connection);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Thread ids of this process's sqlx SQLite threads.
    /// This process's sqlx SQLite threads as (thread id, start time in
    /// clock ticks): a thread id another test's thread just gave up can be
    /// the new connection's (ids are reused once the pid space wrapped, as
    /// on a machine that ran many processes), the pair tells them apart.
    fn sqlite_threads() -> Vec<(i32, u64)> {
        std::fs::read_dir("/proc/self/task")
            .expect("this process's threads")
            .filter_map(|task| {
                let task = task.ok()?;
                let name = std::fs::read_to_string(task.path().join("comm")).ok()?;
                if !name.starts_with("sqlx-sqlite") {
                    return None;
                }
                let tid = task.file_name().to_str()?.parse().ok()?;
                let stat = std::fs::read_to_string(task.path().join("stat")).ok()?;
                // Field 22, counted after the parenthesised name.
                let after_name = stat.rsplit_once(')')?.1;
                let start = after_name.split_whitespace().nth(19)?.parse().ok()?;
                Some((tid, start))
            })
            .collect()
    }
}
