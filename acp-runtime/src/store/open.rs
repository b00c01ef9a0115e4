//! Opening a store: the file lock, one probe connection, the pool, the
//! writer's own connection (SQLite) and the migrations.

use super::handle::*;
use super::migrations::*;
use super::rows::*;
use super::url::StoreUrl;
use super::{file, tls, writer_priority};
use sqlx::Connection as _;
use sqlx::any::AnyPoolOptions;
use sqlx::migrate::Migrator;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Characters of a SQLite path escaped in its URL (`%`, `?`, `#`: the URL
/// parser would take them as an escape, the query or a fragment).
pub(crate) const SQLITE_PATH: &percent_encoding::AsciiSet =
    &percent_encoding::CONTROLS.add(b'%').add(b'?').add(b'#');

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
                writer_priority::open_lowered(url.to_string())
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
}

/// An exclusive `flock` on `<file>.lock`, held while a SQLite store is
/// opened and migrated; released when dropped.
///
/// # Errors
/// When the lock file cannot be created or locked.
pub(crate) async fn open_lock(file: &Path) -> Result<nix::fcntl::Flock<std::fs::File>, StoreError> {
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

/// Per-connection settings (see [`writer_priority::prepare_sqlite`]; none for
/// PostgreSQL).
pub(crate) async fn prepare(
    connection: &mut sqlx::AnyConnection,
    backend: Backend,
) -> Result<(), sqlx::Error> {
    match backend {
        Backend::Sqlite => writer_priority::prepare_sqlite(connection).await,
        Backend::Postgres => Ok(()),
    }
}
