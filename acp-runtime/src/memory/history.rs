//! A session's history as an attaching connection receives it, made from
//! its event log (research/contract.md, "`_sandboxagent/session/attach`",
//! "The replay"): the recorded agent `session/update`s in order, each
//! client `session/prompt` turned into `user_message_chunk` updates (one per
//! content block) at its place, and a gap marker where the log no longer
//! holds events. Pure: no lock, no I/O.

use crate::protocol::{self, Envelope, Kind, method};
use agent_client_protocol::v1::schema::{
    ContentChunk, PromptRequest, SessionNotification, SessionUpdate,
};
use bytes::Bytes;
use ext_methods::notification::STREAM_GAP;
use ext_methods::{Direction, HistoryGap};
use std::collections::HashSet;

/// Builds a session's replay from its recorded events, oldest first.
#[derive(Debug)]
pub struct History {
    session_id: String,
    /// The next offset expected: a larger one is a gap.
    expected: u64,
    /// Whether a prompt or an update was replayed already.
    has_history: bool,
    /// Raw ids of forwarded `session/load`s whose answer has not come: the
    /// updates in between are the agent's own replay of what came before.
    loads: HashSet<Box<str>>,
    /// The messages for the connection, in order.
    lines: Vec<Bytes>,
}

impl History {
    /// An empty replay of `session_id` starting at log offset `from`.
    pub fn new(session_id: &str, from: u64) -> Self {
        Self {
            session_id: session_id.to_owned(),
            expected: from,
            has_history: false,
            loads: HashSet::new(),
            lines: Vec::new(),
        }
    }

    /// The offset the next event should have: everything before it is in
    /// the replay (or its gap marker).
    pub fn expected(&self) -> u64 {
        self.expected
    }

    /// Takes the event at `offset` (events must come in offset order; one
    /// before [`History::expected`] is ignored).
    pub fn push(&mut self, offset: u64, direction: Direction, message: &Bytes) {
        if offset < self.expected {
            return;
        }
        self.gap_until(offset);
        self.expected = offset + 1;
        let Ok((envelope, kind)) = Envelope::parse(message, false) else {
            return;
        };
        match (direction, kind, envelope.method()) {
            (Direction::ClientToAgent, Kind::Request, method::SESSION_PROMPT) => {
                self.prompt(&envelope);
            }
            (
                Direction::ClientToAgent,
                Kind::Request,
                method::SESSION_LOAD | method::SESSION_RESUME,
            ) if self.has_history => {
                if let Some(id) = envelope.id {
                    self.loads.insert(id.get().into());
                }
            }
            (Direction::AgentToClient, Kind::Response, _) => {
                if let Some(id) = envelope.id {
                    self.loads.remove(id.get());
                }
            }
            (Direction::AgentToClient, Kind::Notification, method::SESSION_UPDATE)
                if self.loads.is_empty() =>
            {
                self.has_history = true;
                self.lines.push(message.clone());
            }
            _ => {}
        }
    }

    /// A gap marker for the offsets from [`History::expected`] up to (not
    /// including) `offset`, if there are any.
    pub fn gap_until(&mut self, offset: u64) {
        if offset <= self.expected {
            return;
        }
        let gap = HistoryGap {
            from: self.expected,
            to: offset - 1,
            session_id: self.session_id.clone(),
        };
        self.lines
            .push(Bytes::from(protocol::notification_line(STREAM_GAP, &gap)));
        self.expected = offset;
    }

    /// The messages for the connection, in order.
    pub fn into_lines(self) -> Vec<Bytes> {
        self.lines
    }

    /// One `user_message_chunk` per content block of a recorded prompt.
    fn prompt(&mut self, envelope: &Envelope<'_>) {
        let Some(request) = envelope
            .params
            .and_then(|params| serde_json::from_str::<PromptRequest>(params.get()).ok())
        else {
            return;
        };
        self.has_history = true;
        for block in request.prompt {
            let update = SessionNotification::new(
                self.session_id.clone(),
                SessionUpdate::UserMessageChunk(ContentChunk::new(block)),
            );
            self.lines.push(Bytes::from(protocol::notification_line(
                method::SESSION_UPDATE,
                &update,
            )));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn line(value: Value) -> Bytes {
        Bytes::from(value.to_string())
    }

    fn update(text: &str) -> Bytes {
        line(
            json!({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": "s",
            "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}}}),
        )
    }

    fn lines(replay: History) -> Vec<Value> {
        replay
            .into_lines()
            .iter()
            .map(|l| serde_json::from_slice(l).unwrap_or(Value::Null))
            .collect()
    }

    #[test]
    fn prompts_become_user_chunks_in_place_and_gaps_are_marked() {
        let mut replay = History::new("s", 0);
        let prompt = line(
            json!({"jsonrpc": "2.0", "id": 4, "method": "session/prompt",
            "params": {"sessionId": "s", "prompt": [{"type": "text", "text": "hi"}, {"type": "text", "text": "there"}]}}),
        );
        replay.push(2, Direction::ClientToAgent, &prompt);
        replay.push(3, Direction::AgentToClient, &update("Hello"));
        replay.push(
            4,
            Direction::AgentToClient,
            &line(json!({"jsonrpc": "2.0", "id": 4, "result": {"stopReason": "end_turn"}})),
        );
        replay.gap_until(5);
        let seen = lines(replay);
        assert_eq!(seen.len(), 4, "{seen:?}");
        assert_eq!(seen[0]["method"], "_sandboxagent/stream/gap");
        assert_eq!(
            seen[0]["params"],
            json!({"from": 0, "to": 1, "sessionId": "s"})
        );
        assert_eq!(
            seen[1]["params"]["update"]["sessionUpdate"],
            "user_message_chunk"
        );
        assert_eq!(seen[1]["params"]["update"]["content"]["text"], "hi");
        assert_eq!(seen[2]["params"]["update"]["content"]["text"], "there");
        assert_eq!(seen[3]["params"]["update"]["content"]["text"], "Hello");
    }

    #[test]
    fn an_agents_own_replay_during_a_load_is_skipped_after_history() {
        let load = line(
            json!({"jsonrpc": "2.0", "id": 9, "method": "session/load", "params": {"sessionId": "s"}}),
        );
        let answered = line(json!({"jsonrpc": "2.0", "id": 9, "result": {}}));
        let mut replay = History::new("s", 0);
        replay.push(0, Direction::AgentToClient, &update("old"));
        replay.push(1, Direction::ClientToAgent, &load);
        replay.push(2, Direction::AgentToClient, &update("old again"));
        replay.push(3, Direction::AgentToClient, &answered);
        replay.push(4, Direction::AgentToClient, &update("new"));
        let texts: Vec<Value> = lines(replay)
            .iter()
            .map(|l| l["params"]["update"]["content"]["text"].clone())
            .collect();
        assert_eq!(texts, [json!("old"), json!("new")]);
        // A log that starts at the load: the agent's replay is the history.
        let mut replay = History::new("s", 1);
        replay.push(1, Direction::ClientToAgent, &load);
        replay.push(2, Direction::AgentToClient, &update("old again"));
        replay.push(3, Direction::AgentToClient, &answered);
        assert_eq!(lines(replay).len(), 1);
    }
}
