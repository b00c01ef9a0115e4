//! Writes: one batch of the writer in one transaction (entries, events,
//! counts, pruning), in the multi-row statements each backend takes.

use super::handle::*;
use super::keys::SessionKeys;
use super::rows::*;
use super::writer_priority;
use super::writer_priority::WriterConnection;
use ext_methods::{Direction, EndReason};
use sqlx::Connection as _;
use std::sync::Arc;

impl Store {
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
    pub(crate) async fn apply(
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
    pub(crate) async fn writer_connection(&self) -> Result<WriterConnection, sqlx::Error> {
        if let Some(first) = self.writer_first.lock().take() {
            return Ok(WriterConnection::Own(first));
        }
        match &self.writer_url {
            Some(url) if self.check_file().is_ok() => Ok(WriterConnection::Own(
                writer_priority::open_lowered(url.to_string()).await?,
            )),
            _ => Ok(WriterConnection::Pooled(self.pool.acquire().await?)),
        }
    }

    /// [`Self::apply`] on `connection`.
    pub(crate) async fn write_batch(
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
    pub(crate) async fn session_key(
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
    pub(crate) async fn insert_events(
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
    pub(crate) fn insert_sql(&self, rows: usize) -> String {
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
    pub(crate) fn values_sql(
        &self,
        prefix: &str,
        rows: usize,
        per_row: usize,
        suffix: &str,
    ) -> String {
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
    pub(crate) async fn upsert(
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
    pub(crate) async fn raise_counts(
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
    pub(crate) async fn delete_events(
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
    pub(crate) fn offset_bound(&self, offset: u64) -> i64 {
        let offset = match self.backend {
            Backend::Postgres => offset,
            Backend::Sqlite => offset.min(1 << OFFSET_BITS),
        };
        i64::try_from(offset).unwrap_or(i64::MAX)
    }
}

/// Text for a `TEXT` column: PostgreSQL refuses NUL in text, so it becomes
/// U+FFFD (SQLite would keep it; one rule for both).
pub(crate) fn text(value: &str) -> String {
    value.replace('\0', "\u{FFFD}")
}

pub(crate) fn direction_text(direction: Direction) -> &'static str {
    match direction {
        Direction::AgentToClient => "agent_to_client",
        Direction::ClientToAgent => "client_to_agent",
    }
}

pub(crate) fn end_reason_text(reason: EndReason) -> &'static str {
    match reason {
        EndReason::Completed => "completed",
        EndReason::Error => "error",
        EndReason::Terminated => "terminated",
    }
}
