//! The inventory at scale (research/contract.md, "Control plane" and
//! "Durable sessions"): with a store, memory holds the live sessions and a
//! bounded cache of others; a listing pages the store through its index and
//! lays memory's newer entries over it, and a session asked for by id is
//! read from the store into memory first ([`Runtime::recall`]).

use super::Runtime;
use crate::error::Error;
use crate::memory::session::Session;
use crate::memory::sessions::{
    ListFilter, ListPage, ListState, SortKey, cursor_of, parse_cursor, sort_key,
};
use crate::store::PageQuery;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

/// How often stored entries past `--ended-sessions` are deleted.
const RETENTION_INTERVAL: Duration = Duration::from_secs(10);
/// Most stored entries one retention pass deletes.
const RETENTION_BATCH: usize = 1_000;

impl Runtime {
    /// Reads session `id` (of `agent`, or of every agent for `None`) from
    /// the store into memory when memory does not hold it, so the lookups
    /// that follow find it (a dormant or ended session dropped from memory,
    /// or one from before a restart). Nothing to do without a store.
    ///
    /// # Errors
    /// 503 `store-unavailable` when the store cannot be read.
    pub async fn recall(&self, agent: Option<&str>, id: &str) -> Result<(), Error> {
        let Some(store) = &self.store else {
            return Ok(());
        };
        // Memory's entry wins; the store is not asked (it may be down:
        // a session memory holds is served from memory). An id or agent
        // with a NUL was never stored (PostgreSQL text cannot hold one).
        if self.sessions.holds(agent, id)
            || id.contains('\0')
            || agent.is_some_and(|agent| agent.contains('\0'))
        {
            return Ok(());
        }
        let rows = store
            .entries_of(agent, id)
            .await
            .map_err(|e| Error::StoreUnavailable(e.to_string()))?;
        if !rows.is_empty() {
            self.sessions.restore(rows);
        }
        Ok(())
    }

    /// One page of the inventory, newest first: at most `limit` entries
    /// `filter` admits, after `cursor`. With a store, the page is read
    /// through the store's index and memory's entries (live ones, and
    /// newer states of cached ones) replace or join the stored rows of the
    /// same range, so a page costs about the same at any inventory size.
    ///
    /// # Errors
    /// 400 `invalid-request` for a cursor this server did not make; 503
    /// `store-unavailable` when the store cannot be read.
    pub async fn inventory_page(
        &self,
        filter: &ListFilter,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<ListPage, Error> {
        let limit = limit.max(1);
        let after = cursor
            .map(parse_cursor)
            .transpose()
            .map_err(Error::InvalidRequest)?;
        let mut sessions = self
            .sessions
            .page_in_memory(filter, after.as_ref(), limit + 1);
        if let Some(store) = self
            .store
            .as_ref()
            .filter(|_| filter.state != Some(ListState::Live))
        {
            let mut query = PageQuery {
                limit: limit + 1,
                after: after.as_ref().map(stored_place),
                agent: filter.agent.clone(),
                cwd: filter.cwd.clone(),
                ended: match filter.state {
                    Some(ListState::Ended) => Some(true),
                    Some(ListState::Dormant) => Some(false),
                    _ => None,
                },
                title: filter.title.clone(),
            };
            // Rows memory holds are memory's to show (or to leave out): the
            // store is read until `limit + 1` others came, or it ran out.
            let mut wanted = limit + 1;
            loop {
                let (rows, read, last) = store
                    .page_extent(&query)
                    .await
                    .map_err(|e| Error::StoreUnavailable(e.to_string()))?;
                // Counted as read, unreadable rows too: one is a gap, not
                // the end of the listing.
                let exhausted = read < query.limit;
                if last.is_some() {
                    query.after = last;
                }
                for row in rows {
                    if wanted == 0 {
                        break;
                    }
                    if let Some(held) = self.sessions.get(&row.agent, &row.session_id) {
                        // Memory's entry (perhaps recalled since the memory
                        // page was taken): shown if it passes the filter;
                        // a duplicate of the memory page goes at the dedup.
                        // It takes a place of the page like a stored row
                        // (memory's page holds it, or holds `limit + 1`
                        // newer ones): the store is read `limit + 1` places
                        // deep, not past every entry memory holds.
                        if filter.admits(&held) {
                            sessions.push(held);
                            wanted -= 1;
                        }
                        continue;
                    }
                    sessions.push(self.sessions.entry_of_row(row));
                    wanted -= 1;
                }
                if exhausted || wanted == 0 {
                    break;
                }
            }
            sessions.sort_by_key(|s| std::cmp::Reverse(sort_key(s)));
            sessions.dedup_by(|a, b| a.agent == b.agent && a.id == b.id);
        }
        let next_cursor = (sessions.len() > limit).then(|| {
            sessions.truncate(limit);
            cursor_of(&sort_key(&sessions[limit - 1]))
        });
        Ok(ListPage {
            sessions,
            next_cursor,
        })
    }

    /// Deletes the stored entries (and their events) past the newest
    /// `--ended-sessions` that no agent process hosts, every
    /// [`RETENTION_INTERVAL`] until shutdown: with a store, retention is
    /// the store's (memory holds only a cache).
    pub(crate) async fn retain_stored(self: Arc<Self>) {
        let (Some(store), Some(persist)) = (self.store.clone(), self.persist.clone()) else {
            return;
        };
        loop {
            // Not while writes fail: the deletes would only queue up.
            if persist.health().error.is_none() {
                self.retain_once(&store).await;
            }
            tokio::select! {
                () = self.shutdown.cancelled() => return,
                () = tokio::time::sleep(RETENTION_INTERVAL) => {}
            }
        }
    }

    /// One retention pass: at most [`RETENTION_BATCH`] of the oldest
    /// stored entries past the limit are forgotten (a removal already
    /// queued is not queued again).
    async fn retain_once(&self, store: &crate::store::Store) {
        {
            let live: HashSet<(Arc<str>, Arc<str>)> = self
                .sessions
                .page_in_memory(
                    &ListFilter {
                        state: Some(ListState::Live),
                        ..ListFilter::default()
                    },
                    None,
                    usize::MAX,
                )
                .iter()
                .map(|s: &Arc<Session>| (s.agent.clone(), s.id.clone()))
                .collect();
            let keep = (self.config.ended_sessions + live.len()) as u64;
            match store.keys_past(keep, RETENTION_BATCH).await {
                Ok(keys) => {
                    for (agent, id, ended) in keys {
                        if !live.contains(&(Arc::from(agent.as_str()), Arc::from(id.as_str()))) {
                            self.sessions.forget(&agent, &id, ended);
                        }
                    }
                }
                Err(error) => tracing::debug!(%error, "session retention could not read the store"),
            }
        }
    }
}

/// A listing place as the store's page query takes it.
fn stored_place(key: &SortKey) -> (i64, String, String) {
    (
        i64::try_from(key.0).unwrap_or(i64::MAX),
        key.1.to_string(),
        key.2.to_string(),
    )
}
