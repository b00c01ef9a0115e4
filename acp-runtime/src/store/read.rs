//! Reads: pages of the inventory, counts, retention's keys and events,
//! each bounded in time, and the rows they are made of.

use super::handle::*;
use super::rows::*;
use bytes::Bytes;
use ext_methods::{Direction, EndReason};
use sqlx::Row;
use sqlx::any::AnyRow;
use std::borrow::Cow;
use std::time::Duration;

impl Store {
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
    pub(crate) fn read_error(&self, source: sqlx::Error) -> StoreError {
        StoreError::Read {
            what: self.what.to_string(),
            source,
        }
    }

    /// The rows this runtime can read (a row it cannot is skipped with a
    /// warning naming it).
    pub(crate) fn readable(&self, rows: &[AnyRow]) -> Vec<SessionRow> {
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
}

/// Longest a read of the store may take (a lock held elsewhere, a slow
/// disk): then it fails like an unreachable store (503), never hangs a
/// request for as long as someone holds a lock.
pub(crate) const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// A read bounded by [`READ_TIMEOUT`] (`sqlx::Error::PoolTimedOut` past it).
pub(crate) trait Bounded<T>:
    std::future::Future<Output = Result<T, sqlx::Error>> + Sized
{
    async fn bounded(self) -> Result<T, sqlx::Error> {
        tokio::time::timeout(READ_TIMEOUT, self)
            .await
            .unwrap_or(Err(sqlx::Error::PoolTimedOut))
    }
}

impl<T, F: std::future::Future<Output = Result<T, sqlx::Error>>> Bounded<T> for F {}

/// The columns of an inventory entry, as [`session_row`] reads them.
pub(crate) const SESSION_COLUMNS: &str = "agent, session_id, cwd, created_ns, updated_ns, end_reason, \
     metadata, event_count, title, model, mode, models, first_prompt";

/// A `LIKE` pattern matching `text` anywhere, lower case, its `%`, `_` and
/// `\` escaped (with `ESCAPE '\'`).
pub(crate) fn like_pattern(text: &str) -> String {
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

pub(crate) fn session_row(row: &AnyRow) -> Result<SessionRow, StoreError> {
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

pub(crate) fn event_row(row: &AnyRow) -> Result<EventRow, StoreError> {
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
