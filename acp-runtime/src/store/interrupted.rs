//! Turns a stopped server left open (research/contract.md, "Restart
//! semantics"): when the store is opened, each session of this runtime id
//! that is not ended and whose log ends inside a `session/prompt` turn (the
//! request logged, its answer not) gets one `_sandboxagent/turn/interrupted`
//! event appended, naming the agent requests the turn left unanswered.
//!
//! The turn that was running is the newest prompt with no answer, not the
//! newest prompt: a prompt answered with an error (the agent refused it, as
//! one sent while a turn runs is refused) ran no turn, so the scan reads on
//! past it; a prompt answered with a result ran one and closes the scan.
//!
//! Runs before the writer starts and before the server serves, so nothing
//! else writes those logs meanwhile. Bounded: at most [`MOST_SESSIONS`]
//! sessions (the newest changed first) and [`MOST_EVENTS`] events read back
//! from the end of each log; a turn whose request lies further back is not
//! found (a long turn's interruption then goes unrecorded, logged as such).

use super::{Backend, Bounded as _, Store, StoreError, direction_text, event_id, event_row};
use crate::protocol::{self, method};
use ext_methods::notification::{SESSION_ENDED, TURN_INTERRUPTED};
use ext_methods::{Direction, InterruptReason, TurnInterrupted};
use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;
use sqlx::Row as _;
use std::time::SystemTime;

/// Most not-ended sessions checked at one start-up (retention keeps fewer:
/// `--ended-sessions`, 1,000 by default).
const MOST_SESSIONS: i64 = 10_000;
/// Most events read back from the end of one log to find its last turn.
const MOST_EVENTS: usize = 20_000;
/// Events read per query, newest first.
const STEP: i64 = 256;

/// The parts of a logged JSON-RPC message the scan looks at.
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    method: Option<&'a str>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
}

/// What the scan has learnt from a log read newest first.
#[derive(Debug, Default)]
pub(crate) struct Scan {
    /// Ids (as JSON text) of client requests the agent answered with a
    /// result.
    answered_by_agent: Vec<String>,
    /// Ids (as JSON text) of client requests answered with an error: a
    /// prompt among them ran no turn (or ended one that closed nothing
    /// older), so the scan reads on past it.
    refused_by_agent: Vec<String>,
    /// Ids (as JSON text) of agent requests a client answered.
    answered_by_client: Vec<String>,
    /// Agent requests not answered, newest first.
    unanswered: Vec<Value>,
}

/// The verdict on one log.
#[derive(Debug, PartialEq)]
pub(crate) enum Turn {
    /// Not decided yet: read older events.
    Unknown,
    /// No open turn (the last one was answered, the session ended, or its
    /// interruption is recorded already).
    Closed,
    /// The newest `session/prompt` with no answer (`prompt_id`), none newer
    /// answered with a result; `requests` are the agent requests after it
    /// with no answer, oldest first.
    Open {
        prompt_id: Value,
        requests: Vec<Value>,
    },
}

impl Scan {
    /// Takes in the next older event; anything but [`Turn::Unknown`] ends
    /// the scan. A message that does not parse is skipped.
    pub(crate) fn older(&mut self, direction: Direction, message: &[u8]) -> Turn {
        let Ok(envelope) = serde_json::from_slice::<Envelope<'_>>(message) else {
            return Turn::Unknown;
        };
        let id = envelope.id.map(|id| id.get().to_owned());
        match (direction, envelope.method, id) {
            (Direction::AgentToClient, Some(TURN_INTERRUPTED | SESSION_ENDED), None) => {
                Turn::Closed
            }
            (Direction::AgentToClient, None, Some(id)) => {
                if envelope.error.is_some() {
                    self.refused_by_agent.push(id);
                } else {
                    self.answered_by_agent.push(id);
                }
                Turn::Unknown
            }
            (Direction::ClientToAgent, None, Some(id)) => {
                self.answered_by_client.push(id);
                Turn::Unknown
            }
            (Direction::AgentToClient, Some(_), Some(id)) => {
                if !self.answered_by_client.contains(&id)
                    && let Ok(value) = serde_json::from_str(&id)
                {
                    self.unanswered.push(value);
                }
                Turn::Unknown
            }
            (Direction::ClientToAgent, Some(method::SESSION_PROMPT), Some(id)) => {
                if self.answered_by_agent.contains(&id) {
                    return Turn::Closed;
                }
                if self.refused_by_agent.contains(&id) {
                    // No turn ran for it: the one running may be older
                    // (research/contract.md, "`_sandboxagent/turn/interrupted`").
                    return Turn::Unknown;
                }
                let mut requests = std::mem::take(&mut self.unanswered);
                requests.reverse();
                Turn::Open {
                    prompt_id: serde_json::from_str(&id).unwrap_or(Value::Null),
                    requests,
                }
            }
            _ => Turn::Unknown,
        }
    }
}

impl Store {
    /// Appends `_sandboxagent/turn/interrupted` to the log of every
    /// not-ended session of this runtime id whose running prompt turn has no
    /// answer (see the module doc); returns how many it appended. A session
    /// whose log cannot be read or written is skipped with a warning.
    ///
    /// # Errors
    /// [`StoreError::Read`] when the sessions cannot be listed.
    pub(crate) async fn record_interrupted_turns(&self) -> Result<usize, StoreError> {
        let sql = self.sql(
            "SELECT agent, session_id, event_count FROM sessions \
             WHERE runtime_id = $1 AND end_reason IS NULL \
             ORDER BY updated_ns DESC LIMIT $2",
        );
        let rows = sqlx::query(&sql)
            .bind(&*self.runtime_id)
            .bind(MOST_SESSIONS)
            .fetch_all(&self.pool)
            .bounded()
            .await
            .map_err(|source| self.read_error(source))?;
        let mut recorded = 0;
        for row in rows {
            let (Ok(agent), Ok(session), Ok(count)) = (
                row.try_get::<String, _>("agent"),
                row.try_get::<String, _>("session_id"),
                row.try_get::<i64, _>("event_count"),
            ) else {
                continue;
            };
            match self.interrupt_if_open(&agent, &session, count).await {
                Ok(true) => {
                    recorded += 1;
                    tracing::info!(
                        agent,
                        session,
                        "a prompt turn was running when the server stopped: recorded as interrupted"
                    );
                }
                Ok(false) => {}
                Err(error) => tracing::warn!(
                    store = self.describe(),
                    agent,
                    session,
                    %error,
                    "could not check the session's last turn at start-up"
                ),
            }
        }
        Ok(recorded)
    }

    /// Scans (`agent`, `session`)'s log back from its end and, when a turn
    /// is open, appends the interrupted event at the next offset.
    async fn interrupt_if_open(
        &self,
        agent: &str,
        session: &str,
        count: i64,
    ) -> Result<bool, sqlx::Error> {
        let mut scan = Scan::default();
        let mut before = self.offset_bound(u64::try_from(count).unwrap_or(0));
        let mut next_offset: Option<u64> = None;
        let mut read = 0;
        let turn = 'scan: loop {
            let rows = self.events_before(agent, session, before).await?;
            if rows.is_empty() {
                break Turn::Closed;
            }
            for row in &rows {
                read += 1;
                // An unreadable row (a direction this runtime does not
                // know, say) is passed over, but the scan still moves back
                // past it: re-reading the same rows would stall the start.
                let Ok(offset) = row.try_get::<i64, _>("event_offset") else {
                    break 'scan Turn::Closed;
                };
                next_offset.get_or_insert(u64::try_from(offset).unwrap_or(0) + 1);
                before = offset.max(0);
                let Ok(event) = event_row(row) else { continue };
                match scan.older(event.direction, &event.message) {
                    Turn::Unknown => {}
                    decided => break 'scan decided,
                }
            }
            if read >= MOST_EVENTS || before == 0 {
                if read >= MOST_EVENTS {
                    tracing::warn!(
                        agent,
                        session,
                        events = read,
                        "no prompt request found near the end of the log: not checked further"
                    );
                }
                break Turn::Closed;
            }
        };
        let Turn::Open {
            prompt_id,
            requests,
        } = turn
        else {
            return Ok(false);
        };
        let offset = next_offset
            .unwrap_or(0)
            .max(u64::try_from(count).unwrap_or(0));
        let notice = TurnInterrupted {
            session_id: session.to_owned(),
            reason: InterruptReason::ServerStopped,
            stop_reason: agent_client_protocol::v1::schema::StopReason::Cancelled,
            prompt_id,
            request_ids: requests,
        };
        let line = protocol::notification_line(TURN_INTERRUPTED, &notice);
        self.append_event(agent, session, offset, &line).await?;
        Ok(true)
    }

    /// Up to [`STEP`] events of (`agent`, `session`) below offset `before`,
    /// newest first.
    async fn events_before(
        &self,
        agent: &str,
        session: &str,
        before: i64,
    ) -> Result<Vec<sqlx::any::AnyRow>, sqlx::Error> {
        let sql = match self.backend {
            Backend::Postgres => self.sql(
                "SELECT event_offset, at_ns, direction, message FROM events \
                 WHERE session_key = (SELECT session_key FROM session_keys \
                 WHERE runtime_id = $1 AND agent = $2 AND session_id = $3) AND event_offset < $4 \
                 ORDER BY event_offset DESC LIMIT $5",
            ),
            Backend::Sqlite => self.sql(
                "SELECT e.event_offset, e.at_ns, e.direction, e.message \
                 FROM session_keys k JOIN events e \
                 ON e.event_id >= k.session_key * 4294967296 \
                 AND e.event_id < k.session_key * 4294967296 + $4 \
                 WHERE k.runtime_id = $1 AND k.agent = $2 AND k.session_id = $3 \
                 AND k.session_key BETWEEN 0 AND 2147483647 \
                 ORDER BY e.event_id DESC LIMIT $5",
            ),
        };
        sqlx::query(&sql)
            .bind(&*self.runtime_id)
            .bind(agent)
            .bind(session)
            .bind(before)
            .bind(STEP)
            .fetch_all(&self.pool)
            .bounded()
            .await
    }

    /// Appends one runtime event (`agent_to_client`) at `offset` of
    /// (`agent`, `session`)'s log and raises its entry's event count, in
    /// one transaction.
    async fn append_event(
        &self,
        agent: &str,
        session: &str,
        offset: u64,
        message: &[u8],
    ) -> Result<(), sqlx::Error> {
        let at_ns = super::nanos(SystemTime::now());
        let direction = direction_text(Direction::AgentToClient);
        let mut tx = self.pool.begin().await?;
        let key: Option<i64> = sqlx::query_scalar(&self.sql(
            "SELECT session_key FROM session_keys \
             WHERE runtime_id = $1 AND agent = $2 AND session_id = $3",
        ))
        .bind(&*self.runtime_id)
        .bind(agent)
        .bind(session)
        .fetch_optional(&mut *tx)
        .await?;
        // Events were read, so the key exists; a log SQLite cannot extend
        // (offset 2^32) is left as it is.
        let Some(key) = key else { return Ok(()) };
        match self.backend {
            Backend::Postgres => {
                sqlx::query(
                    "INSERT INTO events (session_key, event_offset, at_ns, direction, message) \
                     VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
                )
                .bind(key)
                .bind(i64::try_from(offset).unwrap_or(i64::MAX))
                .bind(at_ns)
                .bind(direction)
                .bind(message)
                .execute(&mut *tx)
                .await?;
            }
            Backend::Sqlite => {
                let Some(id) = event_id(key, offset) else {
                    return Ok(());
                };
                sqlx::query(
                    "INSERT INTO events (event_id, at_ns, direction, message) \
                     VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING",
                )
                .bind(id)
                .bind(at_ns)
                .bind(direction)
                .bind(message)
                .execute(&mut *tx)
                .await?;
            }
        }
        sqlx::query(&self.sql(
            "UPDATE sessions SET event_count = $4, updated_ns = $5 \
             WHERE runtime_id = $1 AND agent = $2 AND session_id = $3 AND event_count < $4",
        ))
        .bind(&*self.runtime_id)
        .bind(agent)
        .bind(session)
        .bind(i64::try_from(offset + 1).unwrap_or(i64::MAX))
        .bind(at_ns)
        .execute(&mut *tx)
        .await?;
        tx.commit().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The verdict on `log` (oldest first).
    fn verdict(log: &[(Direction, Value)]) -> Turn {
        let mut scan = Scan::default();
        for (direction, message) in log.iter().rev() {
            match scan.older(*direction, message.to_string().as_bytes()) {
                Turn::Unknown => {}
                decided => return decided,
            }
        }
        // The start of the log without a verdict: no open turn.
        Turn::Closed
    }

    const C: Direction = Direction::ClientToAgent;
    const A: Direction = Direction::AgentToClient;

    fn prompt(id: u64) -> Value {
        json!({"jsonrpc": "2.0", "id": id, "method": "session/prompt", "params": {}})
    }

    #[test]
    fn an_answered_turn_is_closed() {
        let log = [
            (C, prompt(2)),
            (
                A,
                json!({"jsonrpc": "2.0", "method": "session/update", "params": {}}),
            ),
            (
                A,
                json!({"jsonrpc": "2.0", "id": 2, "result": {"stopReason": "end_turn"}}),
            ),
        ];
        assert_eq!(verdict(&log), Turn::Closed);
    }

    #[test]
    fn a_turn_waiting_on_a_permission_is_open_and_names_it() {
        let log = [
            (C, prompt(2)),
            (
                A,
                json!({"jsonrpc": "2.0", "id": 0, "method": "session/request_permission"}),
            ),
            (C, json!({"jsonrpc": "2.0", "id": 0, "result": {}})),
            (
                A,
                json!({"jsonrpc": "2.0", "id": "q", "method": "session/request_permission"}),
            ),
            (
                A,
                json!({"jsonrpc": "2.0", "method": "session/update", "params": {}}),
            ),
        ];
        assert_eq!(
            verdict(&log),
            Turn::Open {
                prompt_id: json!(2),
                requests: vec![json!("q")]
            }
        );
    }

    #[test]
    fn a_refused_prompt_does_not_hide_the_running_turn() {
        let log = [
            (C, prompt(2)),
            (
                A,
                json!({"jsonrpc": "2.0", "id": "q", "method": "session/request_permission"}),
            ),
            (C, prompt(3)),
            (
                A,
                json!({"jsonrpc": "2.0", "id": 3, "error": {"code": -32600, "message": "busy"}}),
            ),
        ];
        assert_eq!(
            verdict(&log),
            Turn::Open {
                prompt_id: json!(2),
                requests: vec![json!("q")]
            }
        );
    }

    #[test]
    fn a_turn_that_failed_closes_the_scan_when_nothing_older_is_open() {
        let log = [
            (C, prompt(2)),
            (
                A,
                json!({"jsonrpc": "2.0", "id": 2, "result": {"stopReason": "end_turn"}}),
            ),
            (C, prompt(3)),
            (
                A,
                json!({"jsonrpc": "2.0", "id": 3, "error": {"code": -32603, "message": "failed"}}),
            ),
        ];
        assert_eq!(verdict(&log), Turn::Closed);
    }

    #[test]
    fn a_recorded_interruption_or_end_closes_the_turn() {
        for last in [TURN_INTERRUPTED, SESSION_ENDED] {
            let log = [
                (C, prompt(2)),
                (A, json!({"jsonrpc": "2.0", "method": last, "params": {}})),
            ];
            assert_eq!(verdict(&log), Turn::Closed, "{last}");
        }
    }
}
