//! The control plane (plain HTTP; no connection needed) on
//! [`SandboxAgentClient`]: health, agents and installs, pages of the
//! session inventory and one entry of it, pages of a session's recorded
//! events (of this client's agent, or of any: `inventory_*`). The routes
//! themselves are `crate::control`.

use super::SandboxAgentClient;
use crate::control::{Health, InstallOptions, InstallResult};
use crate::error::Error;
use crate::meta::SessionEntry;
use agent_client_protocol::v1::schema::SessionId;
use ext_methods::{AgentInfo, SessionEvent, SessionEventsPage, SessionMeta};

/// Events per [`session_events`](SandboxAgentClient::session_events) page
/// when no limit is given (the server's default).
const DEFAULT_EVENTS_LIMIT: u32 = 100;

/// The largest `limit` the events route accepts
/// (research/contract.md, "Extension methods and control plane").
const MAX_EVENTS_LIMIT: u32 = 1000;

/// The largest `limit` of `GET /v2/sessions`
/// (research/contract.md, "Control plane"): the page size
/// [`all_sessions`](SandboxAgentClient::all_sessions) walks with, so a
/// large inventory takes few requests.
const MAX_SESSIONS_LIMIT: u32 = 1000;

/// A session's state as the inventory shows it and filters on it (`state`
/// of `GET /v2/sessions`, research/contract.md, "Control plane").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SessionState {
    /// Hosted by a running agent process.
    Live,
    /// Restored from the session store after a restart and not loaded
    /// since (a `session/load` starts its agent).
    Dormant,
    /// Ended (terminated, its agent exited, …).
    Ended,
}

impl SessionState {
    /// The wire spelling: `live`, `dormant` or `ended`.
    pub fn as_str(self) -> &'static str {
        match self {
            SessionState::Live => "live",
            SessionState::Dormant => "dormant",
            SessionState::Ended => "ended",
        }
    }

    /// The state an entry's metadata says: `ended` wins over `dormant`.
    pub fn of(meta: &SessionMeta) -> SessionState {
        if meta.ended {
            SessionState::Ended
        } else if meta.dormant {
            SessionState::Dormant
        } else {
            SessionState::Live
        }
    }
}

/// Which page of the inventory
/// [`list_session_entries`](SandboxAgentClient::list_session_entries)
/// asks for: the query of `GET /v2/sessions`. Every field is optional;
/// filters combine (AND).
///
/// ```
/// use sandbox_agent_sdk::{SessionEntryQuery, SessionState};
/// let query = SessionEntryQuery::new()
///     .limit(50)
///     .agent("mock")
///     .state(SessionState::Ended)
///     .title_contains("login");
/// assert_eq!(query.limit, Some(50));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionEntryQuery {
    /// Entries per page, 1..=1000 (`limit`); `None`: the server's default,
    /// 100.
    pub limit: Option<u32>,
    /// Where the page starts (`cursor`): the
    /// [`next_cursor`](SessionEntryPage::next_cursor) of the previous page
    /// asked with the same filters; `None`: the first (newest) page.
    pub cursor: Option<String>,
    /// Only this agent's sessions (`agent`).
    pub agent: Option<String>,
    /// Only sessions in this state (`state`).
    pub state: Option<SessionState>,
    /// Only sessions whose title contains this text, ignoring ASCII case
    /// (`q`; the server may scan for it).
    pub title_contains: Option<String>,
}

impl SessionEntryQuery {
    /// The first page at the server's default size, unfiltered.
    pub fn new() -> SessionEntryQuery {
        SessionEntryQuery::default()
    }

    /// Sets [`limit`](Self::limit).
    #[must_use]
    pub fn limit(mut self, limit: u32) -> SessionEntryQuery {
        self.limit = Some(limit);
        self
    }

    /// Sets [`cursor`](Self::cursor).
    #[must_use]
    pub fn cursor(mut self, cursor: impl Into<String>) -> SessionEntryQuery {
        self.cursor = Some(cursor.into());
        self
    }

    /// Sets [`agent`](Self::agent).
    #[must_use]
    pub fn agent(mut self, agent: impl Into<String>) -> SessionEntryQuery {
        self.agent = Some(agent.into());
        self
    }

    /// Sets [`state`](Self::state).
    #[must_use]
    pub fn state(mut self, state: SessionState) -> SessionEntryQuery {
        self.state = Some(state);
        self
    }

    /// Sets [`title_contains`](Self::title_contains).
    #[must_use]
    pub fn title_contains(mut self, text: impl Into<String>) -> SessionEntryQuery {
        self.title_contains = Some(text.into());
        self
    }

    /// The query string's pairs of `GET /v2/sessions`, in the wire's
    /// names (`limit`, `cursor`, `agent`, `state`, `q`), unset ones left out.
    pub fn query_pairs(&self) -> Vec<(&'static str, String)> {
        let mut pairs = Vec::new();
        if let Some(limit) = self.limit {
            pairs.push(("limit", limit.to_string()));
        }
        if let Some(cursor) = &self.cursor {
            pairs.push(("cursor", cursor.clone()));
        }
        if let Some(agent) = &self.agent {
            pairs.push(("agent", agent.clone()));
        }
        if let Some(state) = self.state {
            pairs.push(("state", state.as_str().to_owned()));
        }
        if let Some(text) = &self.title_contains {
            pairs.push(("q", text.clone()));
        }
        pairs
    }
}

/// One page of
/// [`SandboxAgentClient::list_session_entries`].
#[derive(Debug, Clone, PartialEq)]
pub struct SessionEntryPage {
    /// The entries of this page, newest first (by creation time, then
    /// agent, then session id); ended sessions included unless filtered.
    pub sessions: Vec<SessionEntry>,
    /// Pass it back as [`SessionEntryQuery::cursor`], with the same
    /// filters, for the next page; `None` on the last page. Sessions
    /// created while paging are newer: they appear on a new first page,
    /// never shifting later pages.
    pub next_cursor: Option<String>,
}

/// One page of [`SandboxAgentClient::session_events`].
#[derive(Debug, Clone, PartialEq)]
pub struct EventPage {
    /// Recorded messages at or after the requested offset, oldest first.
    pub events: Vec<SessionEvent>,
    /// Pass it back as `offset` for the next page; `None` when this page
    /// reaches the end of what is recorded now.
    pub next_offset: Option<u64>,
    /// The offset after this page, also at the end: a running session
    /// records more later; ask again from here to get only what is new.
    pub offset_after: u64,
}

impl EventPage {
    /// The page for `limit` events from `offset`, out of a wire page that
    /// asked for one more (when the limit allowed): an extra event means
    /// there is more.
    fn from_wire(page: SessionEventsPage, offset: u64, limit: u32) -> EventPage {
        let SessionEventsPage {
            mut events,
            next_offset,
        } = page;
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        if events.len() > limit {
            events.truncate(limit);
            let next = events.last().map_or(offset, |event| event.offset + 1);
            return EventPage {
                events,
                next_offset: Some(next),
                offset_after: next,
            };
        }
        // A full page at the largest limit may have more behind it.
        let full = events.len() == limit && limit == MAX_EVENTS_LIMIT as usize;
        EventPage {
            next_offset: full.then_some(next_offset),
            offset_after: next_offset,
            events,
        }
    }
}

impl SandboxAgentClient {
    /// `GET /v2/health`.
    ///
    /// # Errors
    /// [`Error::ConnectionLost`] when the server cannot be reached,
    /// [`Error::Timeout`] past the request timeout, [`Error::Http`] (a
    /// wrong token on the other routes: [`Error::is_unauthorized`]),
    /// [`Error::Disposed`].
    pub async fn health(&self) -> Result<Health, Error> {
        self.check_disposed()?;
        self.control_call("GET /v2/health", self.control.health())
            .await
    }

    /// `GET /v2/agents`: every agent the server knows, installed or not,
    /// with its source, version, process state, and models / modes once
    /// reported.
    ///
    /// # Errors
    /// As [`health`](Self::health) (401 with a wrong token).
    pub async fn agents(&self) -> Result<Vec<AgentInfo>, Error> {
        self.check_disposed()?;
        self.control_call("GET /v2/agents", self.control.agents())
            .await
    }

    /// `POST /v2/agents/{agent}/install`: installs an agent (idempotent:
    /// `already_installed` says whether anything was done).
    ///
    /// # Errors
    /// As [`health`](Self::health); [`Error::Http`] 404 (unknown agent or a
    /// server without this route), 409 `not-installable`, 502
    /// `install-failed`.
    pub async fn install_agent(
        &self,
        agent: &str,
        options: InstallOptions,
    ) -> Result<InstallResult, Error> {
        self.check_disposed()?;
        self.control_call(
            "POST /v2/agents/{agent}/install",
            self.control.install(agent, &options),
        )
        .await
    }

    /// `GET /v2/sessions?limit=&cursor=&agent=&state=&q=`: one page of the
    /// server's inventory (every agent, ended sessions included unless
    /// filtered), newest first, without a connection. Continue with the
    /// page's [`next_cursor`](SessionEntryPage::next_cursor) (and the same
    /// filters) until it is `None`. [`list_sessions`](Self::list_sessions)
    /// is ACP's `session/list` over the connection, of this client's agent
    /// only.
    ///
    /// ```no_run
    /// # async fn run(client: sandbox_agent_sdk::SandboxAgentClient) -> Result<(), sandbox_agent_sdk::Error> {
    /// use sandbox_agent_sdk::SessionEntryQuery;
    /// let mut query = SessionEntryQuery::new().limit(100).agent("mock");
    /// loop {
    ///     let page = client.list_session_entries(query.clone()).await?;
    ///     for entry in &page.sessions {
    ///         println!("{} {:?}", entry.session_id, entry.title);
    ///     }
    ///     match page.next_cursor {
    ///         Some(cursor) => query.cursor = Some(cursor),
    ///         None => break,
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// A server from before paging ignores the query and answers the whole
    /// inventory as one page (`next_cursor: None`).
    ///
    /// # Errors
    /// As [`health`](Self::health); [`Error::Http`] 400 `invalid-request`
    /// for a `limit` outside 1..=1000 or a cursor the server did not make.
    pub async fn list_session_entries(
        &self,
        query: SessionEntryQuery,
    ) -> Result<SessionEntryPage, Error> {
        self.check_disposed()?;
        let pairs = query.query_pairs();
        let pairs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (sessions, next_cursor) = self
            .control_call("GET /v2/sessions", self.control.sessions(&pairs))
            .await?;
        Ok(SessionEntryPage {
            sessions,
            next_cursor,
        })
    }

    /// The whole inventory (every agent, ended sessions included), newest
    /// first, without a connection:
    /// [`all_session_entries`](Self::all_session_entries) of the unfiltered
    /// query, 1000 entries a request.
    ///
    /// # Errors
    /// As [`all_session_entries`](Self::all_session_entries).
    pub async fn all_sessions(&self) -> Result<Vec<SessionEntry>, Error> {
        self.all_session_entries(SessionEntryQuery::new()).await
    }

    /// Every page of [`list_session_entries`](Self::list_session_entries)
    /// for `query`'s filters, from its cursor (or the first page) to the
    /// last, joined; `query.limit` is the page size (`None`: 1000, the
    /// largest, so a large inventory takes few requests). Sessions created
    /// while it pages may be missing (they are newer than the first page);
    /// none is listed twice.
    ///
    /// # Errors
    /// As [`list_session_entries`](Self::list_session_entries);
    /// [`Error::InvalidResponse`] when the server answers a cursor with
    /// that same cursor (the walk would never end).
    pub async fn all_session_entries(
        &self,
        mut query: SessionEntryQuery,
    ) -> Result<Vec<SessionEntry>, Error> {
        query.limit = query.limit.or(Some(MAX_SESSIONS_LIMIT));
        let mut all = Vec::new();
        loop {
            let page = self.list_session_entries(query.clone()).await?;
            all.extend(page.sessions);
            match page.next_cursor {
                None => return Ok(all),
                Some(next) if query.cursor.as_deref() == Some(next.as_str()) => {
                    return Err(Error::InvalidResponse {
                        what: "GET /v2/sessions".to_owned(),
                        message: format!("the cursor {next:?} names its own page again"),
                    });
                }
                Some(next) => query.cursor = Some(next),
            }
        }
    }

    /// The old name of [`all_sessions`](Self::all_sessions).
    ///
    /// # Errors
    /// As [`all_sessions`](Self::all_sessions).
    #[deprecated(since = "0.2.0", note = "renamed to `all_sessions`")]
    pub async fn sessions(&self) -> Result<Vec<SessionEntry>, Error> {
        self.all_sessions().await
    }

    /// `GET /v2/sessions/{id}?agent=`; now [`get_session`](Self::get_session),
    /// which uses this route when not connected.
    ///
    /// # Errors
    /// As [`get_session`](Self::get_session).
    #[deprecated(
        since = "0.2.0",
        note = "use `get_session`, which works with or without a connection"
    )]
    pub async fn session(&self, session_id: impl Into<SessionId>) -> Result<SessionEntry, Error> {
        self.check_disposed()?;
        let session_id = session_id.into();
        self.control_call(
            "GET /v2/sessions/{id}",
            self.control.session(Some(&self.agent), &session_id.0),
        )
        .await
    }

    /// `GET /v2/sessions/{id}?agent=`: one entry of the server's inventory,
    /// of any agent (where [`get_session`](Self::get_session) reads this
    /// client's agent's), without a connection. Session ids are per agent:
    /// `agent` picks one; `None` finds the one session with that id.
    ///
    /// # Errors
    /// As [`health`](Self::health); an unknown session (of `agent`, or of
    /// any agent) [`Error::is_not_found`] (404 `unknown-session`);
    /// [`Error::Http`] 409 `ambiguous-session` when `agent` is `None` and
    /// several agents have a session with that id (its `detail` names
    /// them); [`Error::InvalidResponse`] when the answer is not an ACP
    /// `SessionInfo`.
    pub async fn inventory_entry(
        &self,
        session_id: impl Into<SessionId>,
        agent: Option<&str>,
    ) -> Result<SessionEntry, Error> {
        self.check_disposed()?;
        let session_id = session_id.into();
        self.control_call(
            "GET /v2/sessions/{id}",
            self.control.session(agent, &session_id.0),
        )
        .await
    }

    /// `GET /v2/sessions/{id}/events?offset=&limit=`: one page of the
    /// session's recorded ACP traffic from `offset` on, oldest first, at
    /// most `limit` events (1..=1000; `None`: 100). Continue with the
    /// page's [`next_offset`](EventPage::next_offset) until it is `None`
    /// (the end of what is recorded now).
    ///
    /// ```no_run
    /// # async fn run(client: sandbox_agent_sdk::SandboxAgentClient, id: sandbox_agent_sdk::schema::SessionId) -> Result<(), sandbox_agent_sdk::Error> {
    /// let mut offset = Some(0);
    /// while let Some(from) = offset {
    ///     let page = client.session_events(id.clone(), from, None).await?;
    ///     for event in &page.events {
    ///         println!("{} {:?} {}", event.offset, event.direction, event.message);
    ///     }
    ///     offset = page.next_offset;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`health`](Self::health); an unknown session
    /// [`Error::is_not_found`] (404 `unknown-session`); [`Error::Http`] 400
    /// for a `limit` out of range.
    pub async fn session_events(
        &self,
        session_id: impl Into<SessionId>,
        offset: u64,
        limit: Option<u32>,
    ) -> Result<EventPage, Error> {
        let agent = self.agent.clone();
        self.inventory_events(session_id, Some(&agent), offset, limit)
            .await
    }

    /// [`session_events`](Self::session_events) of a session of any agent
    /// (`GET /v2/sessions/{id}/events?agent=&offset=&limit=`): `agent`
    /// picks among sessions of several agents that share the id (take it
    /// from [`inventory_entry`](Self::inventory_entry)'s
    /// [`SessionMeta::agent`]); `None` reads the one session with that id.
    /// Pages as `session_events`: at most `limit` events (1..=1000;
    /// `None`: 100) from `offset` on, oldest first.
    ///
    /// # Errors
    /// As [`session_events`](Self::session_events); [`Error::Http`] 409
    /// `ambiguous-session` when `agent` is `None` and several agents share
    /// the id.
    pub async fn inventory_events(
        &self,
        session_id: impl Into<SessionId>,
        agent: Option<&str>,
        offset: u64,
        limit: Option<u32>,
    ) -> Result<EventPage, Error> {
        self.check_disposed()?;
        let session_id = session_id.into();
        let limit = limit.unwrap_or(DEFAULT_EVENTS_LIMIT);
        // One more than asked for, when the server allows it, tells whether
        // the page is the last.
        let asked = if (1..MAX_EVENTS_LIMIT).contains(&limit) {
            limit + 1
        } else {
            limit
        };
        let page = self
            .control_call(
                "GET /v2/sessions/{id}/events",
                self.control
                    .session_events(agent, &session_id.0, offset, Some(asked)),
            )
            .await?;
        Ok(EventPage::from_wire(page, offset, limit))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn wire_page(offsets: std::ops::Range<u64>, next_offset: u64) -> SessionEventsPage {
        SessionEventsPage {
            events: offsets
                .map(|offset| SessionEvent {
                    offset,
                    at: "2026-01-01T00:00:00.000Z".to_owned(),
                    direction: ext_methods::Direction::ClientToAgent,
                    message: Value::Null,
                })
                .collect(),
            next_offset,
        }
    }

    #[test]
    fn an_inventory_query_uses_the_wire_names() {
        assert!(SessionEntryQuery::new().query_pairs().is_empty());
        let query = SessionEntryQuery::new()
            .limit(2)
            .cursor("c")
            .agent("mock")
            .state(SessionState::Dormant)
            .title_contains("login bug");
        let pairs = query.query_pairs();
        let pairs: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (*k, v.as_str())).collect();
        assert_eq!(
            pairs,
            [
                ("limit", "2"),
                ("cursor", "c"),
                ("agent", "mock"),
                ("state", "dormant"),
                ("q", "login bug")
            ]
        );
    }

    #[test]
    fn event_pages_mark_their_end() {
        // One more than asked came back: more to fetch.
        let page = EventPage::from_wire(wire_page(0..3, 3), 0, 2);
        assert_eq!(page.events.len(), 2);
        assert_eq!(page.next_offset, Some(2));
        assert_eq!(page.offset_after, 2);
        // Fewer than asked, or exactly as many (the extra one was missing):
        // the end.
        let page = EventPage::from_wire(wire_page(2..4, 4), 2, 5);
        assert_eq!((page.next_offset, page.offset_after), (None, 4));
        let page = EventPage::from_wire(wire_page(2..4, 4), 2, 2);
        assert_eq!(page.next_offset, None);
        let page = EventPage::from_wire(wire_page(0..0, 7), 7, 10);
        assert_eq!((page.next_offset, page.offset_after), (None, 7));
        // At the server's largest limit nothing extra can be asked for: a
        // full page may have more behind it.
        let page = EventPage::from_wire(wire_page(0..1000, 1000), 0, MAX_EVENTS_LIMIT);
        assert_eq!(page.next_offset, Some(1000));
    }
}
