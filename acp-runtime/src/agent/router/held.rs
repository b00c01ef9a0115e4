//! The agent's notifications, and what is held for a session no client is
//! attached to yet: routed, held (bounded, timed), flushed on attach.

use super::*;

impl Router {
    /// A connection attached to `session` without the agent being asked
    /// (`_sandboxagent/session/attach`, or a `session/load` the runtime
    /// answered): as a controller it gets the session's open agent requests
    /// it has not had yet.
    pub fn attached(&self, session: &Session, connection: &Arc<Connection>) {
        self.deliver_waiting_requests(session, connection, &HashSet::new());
    }

    /// Attaches `connection` to a known live session of this process before a
    /// `session/load` / `session/resume` is answered, so the history the agent
    /// replays during the load reaches it. Undone if the load fails.
    pub fn prepare_attach(&self, connection: &Arc<Connection>, session: &str) {
        if let Some(session) = self.live_session(session)
            && !session.is_ended()
        {
            session.attach(connection);
        }
    }

    pub(super) fn on_notification(&self, envelope: &AgentMessage<'_>, line: &Bytes) {
        if envelope.method() == method::CANCEL_REQUEST {
            self.on_agent_cancel(envelope, line);
            return;
        }
        if envelope.method() == elicitation::COMPLETE && self.on_question_complete(line) {
            return;
        }
        let Some(session_id) = envelope.session_id() else {
            for connection in self.targets.connections.of_agent(&self.agent) {
                connection.push(line.clone(), None);
            }
            return;
        };
        match self.live_session(session_id) {
            Some(session) => {
                if envelope.method() == method::SESSION_UPDATE
                    && let Some(kind) = envelope.update_kind()
                {
                    if let Some(hints) = hints::from_update(kind, line) {
                        self.take_hints(&session, &hints);
                    }
                    if let Some(client_side) = &self.targets.client_side {
                        client_side.tag_terminals(&session, kind, line);
                    }
                    if let Some(took) = session.turn_clock.first_update() {
                        self.targets.metrics.first_update(&self.agent, took);
                    }
                    if spans::enabled() {
                        session.turn_trace.lock().on_update(kind, line);
                    }
                }
                session.record_and_deliver(Direction::AgentToClient, line.clone());
            }
            None => self.hold(session_id.into(), line, None),
        }
    }

    /// `elicitation/complete` of a URL-mode question this process asked:
    /// recorded in its session's log and delivered to the session's
    /// connections, or (request-scoped) delivered to the connection the
    /// question went to. `false` for an id it does not know (the notice
    /// then goes where any notification without a session goes).
    pub(super) fn on_question_complete(&self, line: &Bytes) -> bool {
        let Some(id) = elicitation::completed_id(raw_params(line)) else {
            return false;
        };
        let Some(target) = self.url_questions.lock().take(&id) else {
            return false;
        };
        match target {
            CompleteTarget::Session(session_id) => match self.live_session(&session_id) {
                Some(session) => session.record_and_deliver(Direction::AgentToClient, line.clone()),
                None => self.hold(session_id, line, None),
            },
            CompleteTarget::Connection(connection) => {
                connection.push(line.clone(), None);
            }
        }
        true
    }

    /// The agent withdraws one of its requests: only the connections that got
    /// it hear about it, and a later answer is dropped.
    pub(super) fn on_agent_cancel(&self, envelope: &AgentMessage<'_>, line: &Bytes) {
        let Some(request_id) = envelope.cancelled_request_id() else {
            return;
        };
        let Some(request) = self.take_request(request_id.get()) else {
            return;
        };
        if let Some(session) = request
            .session
            .as_deref()
            .and_then(|id| self.live_session(id))
        {
            session.record(Direction::AgentToClient, line.clone());
        }
        // Exactly the connections that got the request: for one without a
        // session, the connection it went to, whoever asked last since.
        for connection in &request.targets {
            connection.push(line.clone(), request.session.as_deref());
        }
    }

    /// The session if this process hosts it.
    pub(super) fn live_session(&self, id: &str) -> Option<Arc<Session>> {
        self.targets.sessions.live(id, self.generation)
    }

    pub(super) fn hold(&self, session: Arc<str>, line: &Bytes, request_id: Option<Box<str>>) {
        let mut held = self.held.lock();
        let now = Instant::now();
        while let Some(front) = held.front() {
            if held.len() < HELD_MAX && now.duration_since(front.at) < HELD_TTL {
                break;
            }
            if self.warnings.held_dropped.admit() {
                tracing::warn!(agent = %self.agent, session = %front.session, "dropping a message held for a session nobody owns");
            }
            if let Some(dropped) = held.pop_front() {
                self.forget_dropped(&dropped);
            }
        }
        held.push_back(Held {
            at: now,
            session,
            line: line.clone(),
            request_id,
        });
    }

    /// Delivers held messages of `session` to `connection` in their original
    /// order; returns the raw ids of the agent requests among them.
    pub(super) fn flush_held(
        &self,
        session: &Session,
        connection: &Connection,
    ) -> HashSet<Box<str>> {
        let mut held = self.held.lock();
        if held.is_empty() {
            return HashSet::new();
        }
        let now = Instant::now();
        let mut delivered = HashSet::new();
        held.retain_mut(|message| {
            if *message.session != *session.id {
                return true;
            }
            if now.duration_since(message.at) < HELD_TTL {
                session.record(Direction::AgentToClient, message.line.clone());
                // An agent request goes only to a connection that can take
                // it; `deliver_waiting_requests` settles the others.
                let takes = message.request_id.as_deref().is_none_or(|id| {
                    self.held_request_kind(id, &session.id)
                        .is_some_and(|(method, mode)| self.takes(connection, &method, mode))
                });
                if takes {
                    connection.push(message.line.clone(), Some(&message.session));
                    if let Some(id) = message.request_id.take() {
                        delivered.insert(id);
                    }
                }
            } else {
                self.forget_dropped(message);
            }
            false
        });
        delivered
    }

    /// The method and question mode of open agent request `raw_id` of
    /// session `session`.
    pub(super) fn held_request_kind(
        &self,
        raw_id: &str,
        session: &str,
    ) -> Option<(Box<str>, Option<elicitation::Mode>)> {
        self.agent_requests
            .lock()
            .values()
            .find(|(id, request)| &**id == raw_id && request.session.as_deref() == Some(session))
            .map(|(_, request)| (request.method.clone(), request.mode))
    }

    /// A held agent request dropped past the cap or the TTL is never
    /// delivered: it leaves the unanswered-requests table too.
    /// A permission request or question among them is answered as
    /// cancelled, so the agent does not wait for ever.
    pub(super) fn forget_dropped(&self, dropped: &Held) {
        if let Some(id) = &dropped.request_id
            && let Some(request) = self.take_request(id)
            && elicitation::dismissed_result(&request.method).is_some()
        {
            self.dismiss(id, &request);
        }
    }
}
