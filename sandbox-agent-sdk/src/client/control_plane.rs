//! The control plane (plain HTTP; no connection needed) on
//! [`SandboxAgentClient`]: health, agents and installs, the session
//! inventory, pages of a session's recorded events. The routes themselves
//! are `crate::control`.

use super::SandboxAgentClient;
use crate::control::{Health, InstallOptions, InstallResult};
use crate::error::Error;
use crate::meta::SessionEntry;
use agent_client_protocol::v1::schema::SessionId;
use ext_methods::{AgentInfo, SessionEvent, SessionEventsPage};

/// Events per [`session_events`](SandboxAgentClient::session_events) page
/// when no limit is given (the server's default).
const DEFAULT_EVENTS_LIMIT: u32 = 100;

/// The largest `limit` the events route accepts
/// (research/contract.md, "Extension methods and control plane").
const MAX_EVENTS_LIMIT: u32 = 1000;

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

    /// `GET /v2/sessions`: the whole inventory (every agent, ended sessions
    /// included), newest first, in one list and without a connection.
    /// [`list_sessions`](Self::list_sessions) is the paged ACP
    /// `session/list` over the connection.
    ///
    /// # Errors
    /// As [`health`](Self::health).
    pub async fn all_sessions(&self) -> Result<Vec<SessionEntry>, Error> {
        self.check_disposed()?;
        self.control_call("GET /v2/sessions", self.control.sessions())
            .await
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
            self.control.session(&self.agent, &session_id.0),
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
                    .session_events(&self.agent, &session_id.0, offset, Some(asked)),
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
