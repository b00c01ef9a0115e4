//! The server-wide session inventory: which agent process hosts each session
//! and which connections are attached to it (DESIGN.md section 4).

use crate::connection::Connection;
use dashmap::DashMap;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::SystemTime;

/// One ACP session known to the runtime.
#[derive(Debug)]
pub struct Session {
    /// The agent's session id.
    pub id: Arc<str>,
    /// The agent id that hosts it.
    pub agent: Arc<str>,
    /// Generation of the agent process that hosts it; its exit ends the session.
    pub process_generation: u64,
    /// When the runtime first saw it.
    pub created_at: SystemTime,
    state: Mutex<SessionState>,
}

#[derive(Debug)]
struct SessionState {
    cwd: Option<String>,
    attached: Vec<Arc<Connection>>,
    updated_at: SystemTime,
    ended: bool,
}

impl Session {
    /// The connections that receive this session's updates and agent requests.
    pub fn attached(&self) -> Vec<Arc<Connection>> {
        self.state.lock().attached.clone()
    }

    /// Attaches `connection` (idempotent).
    pub fn attach(&self, connection: &Arc<Connection>) {
        let mut state = self.state.lock();
        if !state.attached.iter().any(|c| Arc::ptr_eq(c, connection)) {
            state.attached.push(connection.clone());
        }
        drop(state);
        connection.attach_session(self.id.clone());
    }

    /// Stops delivery to `connection`.
    pub fn detach(&self, connection: &Connection) {
        self.state
            .lock()
            .attached
            .retain(|c| !std::ptr::eq(c.as_ref(), connection));
        connection.detach_session(&self.id);
    }

    /// Marks the session ended and returns the connections that were attached,
    /// or `None` if it had already ended.
    pub fn end(&self) -> Option<Vec<Arc<Connection>>> {
        let mut state = self.state.lock();
        if state.ended {
            return None;
        }
        state.ended = true;
        state.updated_at = SystemTime::now();
        Some(state.attached.clone())
    }

    /// Whether the session ended.
    pub fn is_ended(&self) -> bool {
        self.state.lock().ended
    }

    /// Records activity (a prompt, an update).
    pub fn touch(&self) {
        self.state.lock().updated_at = SystemTime::now();
    }

    /// The working directory given at creation, if known.
    pub fn cwd(&self) -> Option<String> {
        self.state.lock().cwd.clone()
    }

    /// Last activity.
    pub fn updated_at(&self) -> SystemTime {
        self.state.lock().updated_at
    }
}

/// All sessions of this server, by session id.
#[derive(Debug, Default)]
pub struct Sessions {
    map: DashMap<Arc<str>, Arc<Session>>,
}

impl Sessions {
    /// Looks a session up.
    pub fn get(&self, id: &str) -> Option<Arc<Session>> {
        self.map.get(id).map(|entry| entry.value().clone())
    }

    /// Registers a session (or replaces an ended one with the same id; DESIGN.md
    /// section 3: a reused id replaces the ended entry). A live entry with the
    /// same id is kept and returned.
    pub fn insert(
        &self,
        id: &str,
        agent: Arc<str>,
        process_generation: u64,
        cwd: Option<String>,
    ) -> Arc<Session> {
        let make = || {
            let now = SystemTime::now();
            Arc::new(Session {
                id: id.into(),
                agent: agent.clone(),
                process_generation,
                created_at: now,
                state: Mutex::new(SessionState {
                    cwd: cwd.clone(),
                    attached: Vec::new(),
                    updated_at: now,
                    ended: false,
                }),
            })
        };
        let mut entry = self.map.entry(id.into()).or_insert_with(make);
        let existing = entry.value().clone();
        if existing.is_ended() || existing.process_generation != process_generation {
            let fresh = make();
            *entry.value_mut() = fresh.clone();
            return fresh;
        }
        existing
    }

    /// Live sessions hosted by this agent process generation.
    pub fn live_of_process(&self, agent: &str, generation: u64) -> Vec<Arc<Session>> {
        self.map
            .iter()
            .filter(|entry| {
                let session = entry.value();
                &*session.agent == agent
                    && session.process_generation == generation
                    && !session.is_ended()
            })
            .map(|entry| entry.value().clone())
            .collect()
    }

    /// Every session, in no particular order.
    pub fn all(&self) -> Vec<Arc<Session>> {
        self.map.iter().map(|entry| entry.value().clone()).collect()
    }
}
