//! The agent's requests to clients (permissions, questions, the
//! client-side `fs/*` and `terminal/*` the runtime serves): which client is
//! asked, the pending table, answers taken back and announced, requests
//! dismissed when their session or turn ends.

use super::*;

impl Router {
    /// Takes agent request `raw_id` if it is still unanswered, returning its
    /// session; `None` when it was answered already or never existed (the
    /// caller drops the answer: exactly one answer reaches the agent).
    pub fn take_agent_request(&self, raw_id: &str) -> Option<Option<Arc<str>>> {
        self.take_request(raw_id).map(|request| request.session)
    }

    pub(super) fn take_request(&self, raw_id: &str) -> Option<AgentRequest> {
        let mut requests = self.agent_requests.lock();
        let key = requests
            .iter()
            .find(|(_, (id, _))| &**id == raw_id)
            .map(|(seq, _)| *seq)?;
        requests.remove(&key).map(|(_, request)| request)
    }

    /// Takes agent request `raw_id` for `connection`'s answer: the first
    /// answer wins (research/contract.md, "Routing"). `None` when it was
    /// answered already, never existed, was not sent to `connection`, or
    /// `connection` is attached to its session as an observer: the caller
    /// drops the answer.
    pub fn take_answered(&self, raw_id: &str, connection: &Connection) -> Option<Answered> {
        let mut requests = self.agent_requests.lock();
        // Only a connection the request went to answers it: an agent may use
        // one id in two sessions, and another client never saw it.
        let (key, request) = requests
            .iter()
            .find(|(_, (id, request))| {
                &**id == raw_id
                    && request
                        .targets
                        .iter()
                        .any(|target| std::ptr::eq(target.as_ref(), connection))
            })
            .map(|(seq, (_, request))| (*seq, request))?;
        let observer = request
            .session
            .as_deref()
            .and_then(|id| self.live_session(id))
            .and_then(|session| session.role_of(connection))
            == Some(Role::Observer);
        if observer {
            return None;
        }
        let (raw_id, request) = requests.remove(&key)?;
        Some(Answered {
            session: request.session,
            raw_id,
        })
    }

    /// Tells every connection attached to the request's session except
    /// `answerer` that the request is resolved
    /// (`_sandboxagent/request/resolved`), so their UIs remove the
    /// question. `answer` is the winning JSON-RPC response.
    pub fn announce_resolved(&self, answered: &Answered, answerer: &Connection, answer: &[u8]) {
        let Some(session) = answered
            .session
            .as_deref()
            .and_then(|id| self.live_session(id))
        else {
            return;
        };
        let others: Vec<_> = session
            .attached()
            .into_iter()
            .filter(|c| !std::ptr::eq(c.as_ref(), answerer))
            .collect();
        if others.is_empty() {
            return;
        }
        let notice = resolved_line(&session.id, &answered.raw_id, outcome_of(answer));
        for connection in others {
            connection.push(notice.clone(), Some(&session.id));
        }
    }

    /// Answers every open agent request of `session_id` on the clients'
    /// behalf, as cancelled, because the session ended: a permission gets
    /// the ACP outcome `cancelled`, a question the action `cancel`, any
    /// other request the error `-32800` (request cancelled). The
    /// connections that got one hear `_sandboxagent/request/resolved`.
    /// Returns how many.
    pub fn cancel_session_requests(&self, session_id: &str) -> usize {
        self.dismiss_requests(session_id, |_| true)
    }

    /// Answers the open permission requests and questions of `session_id`
    /// on the clients' behalf, as cancelled, because a client cancelled the
    /// turn (`session/cancel`; ACP: the client answers them `cancelled`
    /// then, and several clients may hold them). Returns how many.
    pub fn cancel_turn_requests(&self, session_id: &str) -> usize {
        self.dismiss_requests(session_id, |method| {
            elicitation::cancelled_with_turn(method)
        })
    }

    /// Takes the open agent requests of `session_id` whose method `which`
    /// picks and answers each as cancelled ([`Router::dismiss`]).
    pub(super) fn dismiss_requests(&self, session_id: &str, which: impl Fn(&str) -> bool) -> usize {
        let dismissed: Vec<(Box<str>, AgentRequest)> = {
            let mut requests = self.agent_requests.lock();
            let keys: Vec<u64> = requests
                .iter()
                .filter(|(_, (_, request))| {
                    request.session.as_deref() == Some(session_id) && which(&request.method)
                })
                .map(|(seq, _)| *seq)
                .collect();
            keys.iter().filter_map(|key| requests.remove(key)).collect()
        };
        for (raw_id, request) in &dismissed {
            self.dismiss(raw_id, request);
        }
        dismissed.len()
    }

    /// Answers agent request `raw_id` (taken from the open requests) on the
    /// clients' behalf, as cancelled: a permission `cancelled`, a question
    /// `cancel`, any other request `-32800`. The answer is recorded in the
    /// session's log; the connections that got the request hear
    /// `_sandboxagent/request/resolved`.
    pub(super) fn dismiss(&self, raw_id: &str, request: &AgentRequest) {
        let Ok(id) = RawValue::from_string(raw_id.to_owned()) else {
            return;
        };
        let session_id = request.session.as_deref();
        let mut line = match elicitation::dismissed_result(&request.method) {
            Some(result) => protocol::result_response_line(&id, &result),
            None => {
                let why = match session_id {
                    Some(session) => format!("request cancelled: session {session} ended"),
                    None => "request cancelled".to_owned(),
                };
                protocol::error_response_line(&id, &RpcError::new(code::REQUEST_CANCELLED, why))
            }
        };
        if let Some(session) = session_id.and_then(|id| self.targets.sessions.get(&self.agent, id))
        {
            session.record(Direction::ClientToAgent, Bytes::from(line.clone()));
        }
        line.push(b'\n');
        // Every dismissed request gets its answer, even past the stdin
        // queue (at most `AGENT_REQUESTS_MAX` of them wait in tasks).
        match self.stdin.try_send(Bytes::from(line)) {
            Err(mpsc::error::TrySendError::Full(line)) => {
                let stdin = self.stdin.clone();
                tokio::spawn(async move {
                    let _ = stdin.send(line).await;
                });
            }
            Err(mpsc::error::TrySendError::Closed(_)) | Ok(()) => {}
        }
        if let Some(session_id) = session_id {
            let notice = resolved_line(
                session_id,
                raw_id,
                elicitation::dismissed_outcome(&request.method),
            );
            for connection in &request.targets {
                connection.push(notice.clone(), Some(session_id));
            }
        }
    }

    /// The agent-side id of `connection`'s in-flight request `client_id`
    /// (raw JSON text), to translate a client's `$/cancel_request`.
    pub fn agent_id_of(&self, connection: &Connection, client_id: &str) -> Option<i64> {
        self.pending
            .lock()
            .iter()
            .find_map(|(id, pending)| match pending {
                Pending::Client(request)
                    if std::ptr::eq(request.connection.as_ref(), connection)
                        && request.client_id.get() == client_id =>
                {
                    Some(*id)
                }
                _ => None,
            })
    }

    pub(super) fn on_agent_request(&self, envelope: &AgentMessage<'_>, line: &Bytes) {
        let Some(raw_id) = envelope.id.map(|id| Box::<str>::from(id.get())) else {
            return;
        };
        let method = envelope.method();
        if self.agent_requests.lock().len() >= AGENT_REQUESTS_MAX {
            if self.warnings.too_many_requests.admit() {
                tracing::warn!(agent = %self.agent, max = AGENT_REQUESTS_MAX, "agent has too many open requests; answering new ones as cancelled");
            }
            self.answer_dismissed(envelope, method, "too many open agent requests");
            return;
        }
        let question = elicitation::is_question(method).then(|| Question::read(raw_params(line)));
        let mode = match &question {
            Some(Question { mode: None, .. }) => {
                let error = RpcError::new(
                    code::INVALID_PARAMS,
                    "invalid params: elicitation/create needs mode \"form\" or \"url\" (an \
                     http or https url) and one scope (sessionId, or the requestId of a \
                     request this agent was sent)",
                );
                self.answer_agent(envelope, &error);
                return;
            }
            Some(question) => question.mode,
            None => None,
        };
        if let Some(request_id) = question.as_ref().and_then(|q| q.request_id) {
            self.ask_requester(envelope, raw_id, line, request_id, question.as_ref());
            return;
        }
        let session_id: Option<Arc<str>> = envelope.session_id().map(Into::into);
        if let (Some(session), Some(id)) = (
            &session_id,
            question.as_ref().and_then(|q| q.elicitation_id.clone()),
        ) {
            self.url_questions
                .lock()
                .remember(id, CompleteTarget::Session(session.clone()));
        }
        let Some(session_id) = session_id else {
            // No session: exactly one connection, the most recent requester.
            let target = self
                .last_requester
                .lock()
                .upgrade()
                .filter(|c| !c.is_closed());
            match target {
                Some(connection) if self.takes(&connection, method, mode) => {
                    // Filed first: an answer may come as soon as it is pushed.
                    self.remember_agent_request(
                        &raw_id,
                        None,
                        (method, mode, None),
                        line.clone(),
                        vec![connection.clone()],
                    );
                    connection.push(line.clone(), None);
                }
                // Files and terminals live in a session's directory.
                _ if self.runtime_serves(method) => self.answer_agent(
                    envelope,
                    &RpcError::new(
                        code::INVALID_PARAMS,
                        format!("invalid params: {method} needs a sessionId"),
                    ),
                ),
                _ => self.answer_method_not_found(envelope, method),
            }
            return;
        };
        let Some(session) = self.live_session(&session_id) else {
            self.remember_agent_request(
                &raw_id,
                Some(session_id.clone()),
                (method, mode, None),
                line.clone(),
                Vec::new(),
            );
            self.hold(session_id, line, Some(raw_id));
            return;
        };
        if session.is_ended() {
            // Nobody attaches to an ended session, and the runtime does
            // not act for it any more (no file or terminal): answered at
            // once.
            let why = format!("request cancelled: session {session_id} ended");
            self.answer_dismissed(envelope, method, &why);
            return;
        }
        // Pushed and filed under one lock: a connection attaching meanwhile
        // (`deliver_waiting_requests`) sees it either filed with its
        // targets or not at all, so it never gets it twice.
        let mut requests = self.agent_requests.lock();
        let controllers = session.record_and_controllers(Direction::AgentToClient, line.clone());
        let allowed: Vec<Arc<Connection>> = controllers
            .iter()
            .filter(|c| self.takes(c, method, mode))
            .cloned()
            .collect();
        if allowed.is_empty() && self.runtime_serves(method) {
            drop(requests);
            self.serve(raw_id, method, line.clone(), session);
            return;
        }
        if !controllers.is_empty() && allowed.is_empty() {
            drop(requests);
            self.refuse(envelope, method, Some(&session));
            return;
        }
        // With no controller attached it waits until one attaches.
        for connection in &allowed {
            connection.push(line.clone(), Some(&session_id));
        }
        let seq = self.agent_request_seq.fetch_add(1, Ordering::Relaxed);
        requests.insert(
            seq,
            (
                raw_id,
                AgentRequest {
                    session: Some(session_id),
                    method: method.into(),
                    mode,
                    scope: None,
                    line: line.clone(),
                    _span: self.trace_permission(method, &session, line),
                    targets: allowed,
                    _pending: self.count_pending(method),
                },
            ),
        );
    }

    /// A question scoped to a request (`requestId`, one of this router's
    /// ids of a client's request): it goes to the connection that sent that
    /// request, with the client's own id in `requestId`. When that request
    /// is not pending, or its connection is closed or did not declare the
    /// question's mode, the runtime answers `cancel`.
    pub(super) fn ask_requester(
        &self,
        envelope: &AgentMessage<'_>,
        raw_id: Box<str>,
        line: &Bytes,
        request_id: i64,
        question: Option<&Question>,
    ) {
        let mode = question.and_then(|q| q.mode);
        let requester = match self.pending.lock().get(&request_id) {
            Some(Pending::Client(request)) => {
                Some((request.connection.clone(), request.client_id.clone()))
            }
            _ => None,
        };
        let target = requester.filter(|(connection, _)| {
            !connection.is_closed() && self.takes(connection, elicitation::CREATE, mode)
        });
        let rewritten = target.and_then(|(connection, client_id)| {
            elicitation::with_request_id(line, &client_id).map(|line| (connection, line))
        });
        let Some((connection, line)) = rewritten else {
            self.answer_agent_result(envelope, &elicitation::cancelled());
            return;
        };
        if let Some(id) = question.and_then(|q| q.elicitation_id.clone()) {
            self.url_questions
                .lock()
                .remember(id, CompleteTarget::Connection(connection.clone()));
        }
        // Filed first: an answer may come as soon as it is pushed.
        self.remember_agent_request(
            &raw_id,
            None,
            (elicitation::CREATE, mode, Some(request_id)),
            line.clone(),
            vec![connection.clone()],
        );
        connection.push(line, None);
    }

    /// Refuses an agent request none of the session's attached controllers
    /// can take: a question is answered `cancel` (recorded in the session's
    /// log, since the runtime declared questions to the agent), any other
    /// request `-32601`.
    pub(super) fn refuse(
        &self,
        envelope: &AgentMessage<'_>,
        method: &str,
        session: Option<&Session>,
    ) {
        if elicitation::is_question(method) {
            let answer = self.answer_agent_result(envelope, &elicitation::cancelled());
            if let (Some(session), Some(answer)) = (session, answer) {
                session.record(Direction::ClientToAgent, answer);
            }
        } else {
            self.answer_method_not_found(envelope, method);
        }
    }

    /// Whether the runtime answers agent request `method` itself when no
    /// connection takes it: a file or terminal request it declared
    /// (research/contract.md, "Files and terminals of the agent, served in
    /// the sandbox").
    pub(super) fn runtime_serves(&self, method: &str) -> bool {
        ClientCapabilities::covers(method) && self.served.allows(method)
    }

    /// Whether `connection` gets agent request `method`: it declared the
    /// capability, and for a request the runtime serves it also opted to
    /// serve it itself (`fsAndTerminal: "client"`).
    /// A question goes only to connections that declared its `mode`.
    pub(super) fn takes(
        &self,
        connection: &Connection,
        method: &str,
        mode: Option<elicitation::Mode>,
    ) -> bool {
        let capabilities = &connection.capabilities;
        if elicitation::is_question(method) {
            return mode.is_some_and(|mode| capabilities.asks(mode));
        }
        capabilities.allows(method)
            && (capabilities.serves_fs_and_terminal || !self.runtime_serves(method))
    }

    /// Answers the agent's file or terminal request `line` in the sandbox,
    /// in a task of its own (a `terminal/wait_for_exit` may wait long; the
    /// stdout loop goes on). The request is in the session's log already;
    /// the answer goes there too (`client_to_agent`, as a client's would),
    /// then to the agent. Nothing is sent once the process is gone.
    pub(super) fn serve(&self, raw_id: Box<str>, method: &str, line: Bytes, session: Arc<Session>) {
        let Some(client_side) = self.targets.client_side.clone() else {
            return;
        };
        let (stdin, exited, method) = (self.stdin.clone(), self.exited.clone(), method.to_owned());
        let generation = self.generation;
        tokio::spawn(async move {
            #[derive(serde::Deserialize)]
            struct Params<'a> {
                #[serde(borrow, default)]
                params: Option<&'a RawValue>,
            }
            let params = serde_json::from_slice::<Params<'_>>(&line)
                .ok()
                .and_then(|request| request.params);
            let answer = tokio::select! {
                answer = client_side.answer(&method, params, &session, generation) => answer,
                () = exited.cancelled() => return,
            };
            let Ok(id) = RawValue::from_string(raw_id.into_string()) else {
                return;
            };
            let mut line = match answer {
                Ok(result) => protocol::result_response_line(&id, &result),
                Err(error) => protocol::error_response_line(&id, &error),
            };
            session.record(Direction::ClientToAgent, Bytes::from(line.clone()));
            line.push(b'\n');
            if stdin.send(Bytes::from(line)).await.is_err() {
                tracing::debug!(
                    method,
                    "answer to an agent request dropped: agent process exited"
                );
            }
        });
    }

    /// Files an open agent request of `(method, question mode, request
    /// scope)`.
    pub(super) fn remember_agent_request(
        &self,
        raw_id: &str,
        session: Option<Arc<str>>,
        (method, mode, scope): (&str, Option<elicitation::Mode>, Option<i64>),
        line: Bytes,
        targets: Vec<Arc<Connection>>,
    ) {
        let seq = self.agent_request_seq.fetch_add(1, Ordering::Relaxed);
        self.agent_requests.lock().insert(
            seq,
            (
                raw_id.into(),
                AgentRequest {
                    session,
                    method: method.into(),
                    mode,
                    scope,
                    line,
                    targets,
                    _pending: self.count_pending(method),
                    _span: tracing::Span::none(),
                },
            ),
        );
    }

    /// A count in `permission_requests_pending` for an agent request of
    /// `method`, when it is a permission request.
    pub(super) fn count_pending(&self, method: &str) -> Option<GaugeGuard> {
        (method == method::SESSION_REQUEST_PERMISSION)
            .then(|| GaugeGuard::new(self.targets.metrics.permission_requests_pending()))
    }

    /// The span of agent request `line` of `method` in `session` while it
    /// waits for an answer, when it is a permission request and tracing is
    /// on (research/contract.md, "Traces").
    pub(super) fn trace_permission(
        &self,
        method: &str,
        session: &Session,
        line: &[u8],
    ) -> tracing::Span {
        if method != method::SESSION_REQUEST_PERMISSION || !spans::enabled() {
            return tracing::Span::none();
        }
        session.turn_trace.lock().permission(line)
    }

    /// Answers an agent request with "method not found" on the client's
    /// behalf: no attached client declared the capability
    /// (research/contract.md, "Routing: connections, sessions, one agent
    /// process").
    pub(super) fn answer_method_not_found(&self, envelope: &AgentMessage<'_>, method: &str) {
        let error = RpcError::new(
            code::METHOD_NOT_FOUND,
            format!("method not found: {method} (no attached client declared this capability)"),
        );
        self.answer_agent(envelope, &error);
    }

    /// Answers agent request `envelope` with `error` on the clients' behalf.
    pub(super) fn answer_agent(&self, envelope: &AgentMessage<'_>, error: &RpcError) {
        let Some(id) = envelope.id else { return };
        self.send_answer(protocol::error_response_line(id, error));
    }

    /// Answers agent request `envelope` with `result` on the clients'
    /// behalf; returns the answer (without its line feed) for the log.
    pub(super) fn answer_agent_result(
        &self,
        envelope: &AgentMessage<'_>,
        result: &Value,
    ) -> Option<Bytes> {
        let id = envelope.id?;
        let line = protocol::result_response_line(id, result);
        let answer = Bytes::from(line.clone());
        self.send_answer(line);
        Some(answer)
    }

    /// Answers agent request `envelope` at once, on the clients' behalf,
    /// as cancelled: a permission `cancelled`, a question `cancel`, any
    /// other request `-32800` with `why`.
    pub(super) fn answer_dismissed(&self, envelope: &AgentMessage<'_>, method: &str, why: &str) {
        match elicitation::dismissed_result(method) {
            Some(result) => {
                self.answer_agent_result(envelope, &result);
            }
            None => self.answer_agent(envelope, &RpcError::new(code::REQUEST_CANCELLED, why)),
        }
    }

    /// Queues one answer line for the agent's stdin.
    pub(super) fn send_answer(&self, mut line: Vec<u8>) {
        line.push(b'\n');
        if self.stdin.try_send(Bytes::from(line)).is_err() && self.warnings.stdin_full.admit() {
            tracing::warn!(agent = %self.agent, "cannot answer agent request: stdin queue full or closed");
        }
    }

    /// The client request the agent knows as `agent_id` was answered: its
    /// request-scoped questions still open are answered `cancel`.
    pub(super) fn settle_scoped_questions(&self, agent_id: i64) {
        let scoped: Vec<(Box<str>, AgentRequest)> = {
            let mut requests = self.agent_requests.lock();
            if requests.is_empty() {
                return;
            }
            let keys: Vec<u64> = requests
                .iter()
                .filter(|(_, (_, request))| request.scope == Some(agent_id))
                .map(|(seq, _)| *seq)
                .collect();
            keys.iter().filter_map(|key| requests.remove(key)).collect()
        };
        for (raw_id, request) in &scoped {
            self.dismiss(raw_id, request);
        }
    }

    /// Delivers the unanswered agent requests of `session` to a connection
    /// that just attached, except those in `skip`. One it cannot take is
    /// refused (`-32601`) only when no attached connection can: another may
    /// hold it already.
    pub(super) fn deliver_waiting_requests(
        &self,
        session: &Session,
        connection: &Arc<Connection>,
        skip: &HashSet<Box<str>>,
    ) {
        // Observers get no agent requests (research/contract.md,
        // "`_sandboxagent/session/attach`").
        if session.role_of(connection) != Some(Role::Controller) {
            return;
        }
        let mut refused = Vec::new();
        {
            let mut requests = self.agent_requests.lock();
            for (id, request) in requests.values_mut() {
                if request.session.as_deref() != Some(&*session.id)
                    || request.targets.iter().any(|c| Arc::ptr_eq(c, connection))
                {
                    continue;
                }
                if skip.contains(id) {
                    // Flushed with the held messages already.
                    request.targets.push(connection.clone());
                } else if self.takes(connection, &request.method, request.mode) {
                    connection.push(request.line.clone(), request.session.as_deref());
                    request.targets.push(connection.clone());
                } else {
                    refused.push((request.line.clone(), request.mode));
                }
            }
        }
        let attached = session.controllers();
        for (line, mode) in refused {
            if let Ok((envelope, _)) = AgentMessage::parse(&line) {
                if attached
                    .iter()
                    .any(|c| self.takes(c, envelope.method(), mode))
                {
                    continue;
                }
                if let Some(id) = envelope.id {
                    self.take_agent_request(id.get());
                }
                self.refuse(&envelope, envelope.method(), Some(session));
            }
        }
    }
}
