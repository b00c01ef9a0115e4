//! A client's requests to the agent and their answers: submitting and
//! forwarding with rewritten ids, the agent's answer relayed (or its error
//! completed with the agent's stderr), the effects an answer has on the
//! session (hints, ends), a turn's traced span.

use super::*;

impl Router {
    /// Sends a request with a fresh agent-side id and files `pending` under
    /// it: the one path for the client's requests and the runtime's own.
    pub(super) async fn submit(
        &self,
        method: &str,
        params: Option<&RawValue>,
        pending: Pending,
    ) -> Result<(), SendError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut line = protocol::agent_request_line(id, method, params);
        line.push(b'\n');
        self.pending.lock().insert(id, pending);
        if self.stdin.send(Bytes::from(line)).await.is_err() || self.exited.is_cancelled() {
            self.pending.lock().remove(&id);
            return Err(SendError::Exited);
        }
        Ok(())
    }

    /// Sends a client's request with a fresh agent-side id. The receiver gets
    /// the agent's answer with the client's id restored (or a JSON-RPC error
    /// if the process exits first). `span` is the request's (research/contract.md,
    /// "Traces"; [`Span::none`] while tracing is off).
    ///
    /// # Errors
    /// [`SendError::Exited`] when the process is gone.
    // The request's members, what its answer does, its session and span:
    // one caller (`Runtime::forward`), which has each at hand.
    #[allow(clippy::too_many_arguments)]
    pub async fn send_request(
        &self,
        connection: &Arc<Connection>,
        client_id: &RawValue,
        method: Method,
        name: &str,
        params: Option<&RawValue>,
        effect: Effect,
        session: Option<Arc<str>>,
        span: &Span,
    ) -> Result<oneshot::Receiver<Bytes>, SendError> {
        let (reply, receiver) = oneshot::channel();
        *self.last_requester.lock() = Arc::downgrade(connection);
        let prompt = method == Method::SessionPrompt;
        let live = if prompt {
            session.as_deref().and_then(|id| self.live_session(id))
        } else {
            None
        };
        let (turn, traced_params) =
            self.trace_request(span, prompt, session.as_deref(), live.as_ref(), params);
        let params = traced_params.as_deref().or(params);
        let request = ClientRequest {
            connection: connection.clone(),
            client_id: client_id.to_owned(),
            reply,
            effect,
            session,
            prompt,
            sent_at: Instant::now(),
            stderr_mark: self.stderr.as_ref().map_or(0, |stderr| stderr.count()),
            hint_on_error: self.root_hint
                && matches!(method, Method::SessionNew | Method::SessionLoad),
            turn,
        };
        if let Some(session) = live {
            session.turn_clock.start();
        }
        self.submit(name, params, Pending::Client(Box::new(request)))
            .await?;
        Ok(receiver)
    }

    /// The spans of a client request about to be forwarded, while tracing
    /// is on (research/contract.md, "Traces"): a prompt's `invoke_agent`
    /// span (under the request's span `span`, and leading `live`'s tool
    /// calls and permission waits), and `params` with the trace context of
    /// that span (any other request: `span`) in `_meta`, for the agent.
    /// `(None, None)` at the cost of one check when tracing is off.
    pub(super) fn trace_request(
        &self,
        span: &Span,
        prompt: bool,
        session: Option<&str>,
        live: Option<&Arc<Session>>,
        params: Option<&RawValue>,
    ) -> (Option<TracedTurn>, Option<Box<RawValue>>) {
        if !spans::enabled() {
            return (None, None);
        }
        if !prompt {
            return (None, spans::with_trace_meta(span, params));
        }
        let span = spans::invoke_agent(span, &self.agent, session);
        let traced_params = spans::with_trace_meta(&span, params);
        if let Some(live) = live {
            live.turn_trace.lock().begin(&span);
        }
        let turn = TracedTurn {
            span,
            session: live.map_or_else(Weak::new, Arc::downgrade),
        };
        (Some(turn), traced_params)
    }

    /// Sends the runtime's own request and waits for the raw result (`Ok`) or
    /// raw error object (`Err(Some)`); `Err(None)` when the process exited.
    pub async fn call(
        &self,
        method: &str,
        params: &impl Serialize,
    ) -> Result<Box<RawValue>, Option<Box<RawValue>>> {
        let params = protocol::raw(params);
        let (reply, receiver) = oneshot::channel();
        if self
            .submit(method, Some(&params), Pending::Runtime(reply))
            .await
            .is_err()
        {
            return Err(None);
        }
        match receiver.await {
            Ok(Ok(result)) => Ok(result),
            Ok(Err(error)) => Err(Some(error)),
            Err(_) => Err(None),
        }
    }

    /// Writes one complete line (a notification, or a client's answer to an
    /// agent request) to the agent's stdin. `line` must be one line of JSON.
    ///
    /// # Errors
    /// [`SendError::Exited`] when the process is gone.
    pub async fn send_line(&self, line: &[u8]) -> Result<(), SendError> {
        let mut bytes = Vec::with_capacity(line.len() + 1);
        bytes.extend_from_slice(line);
        bytes.push(b'\n');
        self.stdin
            .send(Bytes::from(bytes))
            .await
            .map_err(|_| SendError::Exited)
    }

    /// Answers a client's request with `line` (a JSON-RPC response carrying
    /// the client's id): into the session's event log when there is one, then
    /// to the client (see [`deliver`]). A `session/prompt` answer with a
    /// store comes back as a [`DurableAnswer`] to deliver once the turn's
    /// events are committed.
    pub(super) fn settle(
        &self,
        request: ClientRequest,
        line: Vec<u8>,
        session: Option<&Session>,
    ) -> Option<DurableAnswer> {
        if request.prompt {
            let stop_reason = metrics::stop_reason_label(protocol::stop_reason(&line).as_deref());
            self.targets
                .metrics
                .prompt_turn(&self.agent, stop_reason, request.sent_at.elapsed());
            if let Some(turn) = &request.turn {
                spans::end_turn(&turn.span, &line);
            }
        }
        let line = Bytes::from(line);
        if let Some(session) = session {
            session.record(Direction::AgentToClient, line.clone());
            if request.prompt
                && let Some(committed) = session.durable_barrier()
            {
                return Some(DurableAnswer {
                    committed,
                    request,
                    line,
                });
            }
        }
        deliver(request, line);
        None
    }

    pub(super) fn on_response(&self, envelope: &AgentMessage<'_>) -> Option<Deferred> {
        let id = envelope.id.and_then(|id| id.get().parse::<i64>().ok());
        let Some(pending) = id.and_then(|id| self.pending.lock().remove(&id)) else {
            if self.warnings.unknown_id.admit() {
                tracing::warn!(agent = %self.agent, id = ?envelope.id.map(RawValue::get), "agent answered an unknown request id; dropped");
            }
            return None;
        };
        if let (Pending::Client(_), Some(id)) = (&pending, id) {
            self.settle_scoped_questions(id);
        }
        match pending {
            Pending::Runtime(reply) => {
                let outcome = match (envelope.result, envelope.error) {
                    (Some(result), _) => Ok(result.to_owned()),
                    (None, Some(error)) => Err(error.to_owned()),
                    (None, None) => Err(protocol::raw(&RpcError::new(
                        code::INTERNAL_ERROR,
                        "empty response",
                    ))),
                };
                let _ = reply.send(outcome);
                None
            }
            Pending::Client(request) => match (envelope.result, envelope.error) {
                (Some(result), _) => self.answer_client(*request, result).map(Deferred::Durable),
                (None, Some(error)) => self.answer_error(*request, error),
                // A response has one of the two (`AgentMessage::parse`).
                (None, None) => None,
            },
        }
    }

    /// Relays the agent's error answer to a client's request with the
    /// details the runtime adds ([`error_data`]): at once when it has no
    /// stderr to wait for, else as a [`Deferred::AgentError`].
    pub(super) fn answer_error(
        &self,
        request: ClientRequest,
        error: &RawValue,
    ) -> Option<Deferred> {
        if self.stderr.is_some() {
            return Some(Deferred::AgentError(AgentErrorAnswer {
                request,
                error: error.to_owned(),
            }));
        }
        let hint = request.hint_on_error && error_data::may_be_root(error);
        let details = error_data::details(&self.agent, None, 0, hint);
        let error = error_data::with_details(error, &details);
        self.relay_error(request, &error).map(Deferred::Durable)
    }

    /// Completes a held error answer once the stderr reader caught up:
    /// the lines since the request and the hint, then the relay.
    pub(super) async fn complete_error(&self, answer: AgentErrorAnswer) -> Option<DurableAnswer> {
        let AgentErrorAnswer { request, error } = answer;
        if let Some(stderr) = &self.stderr {
            error_data::settle(stderr).await;
        }
        let details = error_data::details(
            &self.agent,
            self.stderr.as_deref(),
            request.stderr_mark,
            request.hint_on_error && error_data::may_be_root(&error),
        );
        let error = error_data::with_details(&error, &details);
        self.relay_error(request, &error)
    }

    /// Relays the agent's successful answer `result` to a client's request,
    /// after applying what it implies (a new or attached session, hints).
    pub(super) fn answer_client(
        &self,
        mut request: ClientRequest,
        result: &RawValue,
    ) -> Option<DurableAnswer> {
        let effect = std::mem::replace(&mut request.effect, Effect::None);
        let session_id = request.session.take();
        let mut result = Cow::Borrowed(result);
        let session = match effect {
            effect @ (Effect::None | Effect::SetHints(_)) => {
                let session = session_id.and_then(|id| self.live_session(&id));
                if let Some(session) = &session {
                    let mut hints = match effect {
                        Effect::SetHints(implied) => implied,
                        _ => Hints::default(),
                    };
                    if let Some(reported) = hints::from_result(&result) {
                        hints.merge(reported);
                    }
                    self.take_hints(session, &hints);
                }
                session
            }
            effect => {
                let created = self.apply_effect(&request.connection, effect, &result);
                if let Some(session) = &created {
                    result = Cow::Owned(with_session_meta(&result, session));
                }
                created
            }
        };
        let line = protocol::response_line(&request.client_id, Some(&result), None);
        self.settle(request, line, session.as_deref())
    }

    /// Relays `error`, the answer to `request`: a failed load undoes its
    /// early attach first.
    pub(super) fn relay_error(
        &self,
        mut request: ClientRequest,
        error: &RawValue,
    ) -> Option<DurableAnswer> {
        let effect = std::mem::replace(&mut request.effect, Effect::None);
        let session = match effect {
            Effect::AttachSession { session, .. } => {
                // The load failed: undo the early attach (see `prepare_attach`).
                if let Some(session) = self.targets.sessions.get(&self.agent, &session) {
                    session.detach(&request.connection);
                }
                None
            }
            _ => request.session.take().and_then(|id| self.live_session(&id)),
        };
        let line = protocol::response_line(&request.client_id, None, Some(error));
        self.settle(request, line, session.as_deref())
    }

    /// Registers and attaches the session a successful `session/new` /
    /// `fork` / `load` / `resume` names, takes its hints, and flushes what was
    /// held for it. Returns the session.
    pub(super) fn apply_effect(
        &self,
        connection: &Arc<Connection>,
        effect: Effect,
        result: &RawValue,
    ) -> Option<Arc<Session>> {
        let load = matches!(effect, Effect::AttachSession { .. });
        let (session_id, cwd, metadata, request) = match effect {
            Effect::None | Effect::SetHints(_) => return None,
            Effect::CreateSession {
                cwd,
                metadata,
                request,
            } => match protocol::session_id_of(result) {
                Some(id) => (id, cwd, metadata, Some(request)),
                None => {
                    if self.warnings.no_session_id.admit() {
                        tracing::warn!(agent = %self.agent, "session answer without a sessionId");
                    }
                    return None;
                }
            },
            Effect::AttachSession {
                session,
                cwd,
                request,
            } => {
                // A live session logged the request when it was forwarded.
                let logged = self.live_session(&session).is_some();
                (session, cwd, Map::new(), (!logged).then_some(request))
            }
        };
        let session = self.targets.sessions.insert(
            &session_id,
            self.agent.clone(),
            self.generation,
            cwd,
            metadata,
            load,
        );
        if let Some(request) = request {
            session.record(Direction::ClientToAgent, request);
        }
        self.take_hints(&session, &hints::from_session_result(result));
        if !connection.is_closed() {
            session.attach(connection);
            let delivered = self.flush_held(&session, connection);
            self.deliver_waiting_requests(&session, connection, &delivered);
        }
        Some(session)
    }

    /// Applies hints to the session and remembers the agent-wide ones.
    pub(super) fn take_hints(&self, session: &Session, hints: &Hints) {
        if !hints.is_empty() {
            session.apply_hints(hints);
            self.reported.lock().take(hints);
        }
    }

    /// Answers this session's pending `session/prompt` requests with stop
    /// reason `cancelled` on the agent's behalf (a terminated session whose
    /// agent did not end the turn); the agent's later answers are dropped.
    /// Returns how many.
    pub fn abandon_prompts(&self, session_id: &str) -> usize {
        let abandoned: Vec<Pending> = {
            let mut pending = self.pending.lock();
            let ids: Vec<i64> = pending
                .iter()
                .filter(|(_, p)| {
                    matches!(p, Pending::Client(request) if request.prompt && request.session.as_deref() == Some(session_id))
                })
                .map(|(id, _)| *id)
                .collect();
            ids.iter().filter_map(|id| pending.remove(id)).collect()
        };
        let count = abandoned.len();
        let session = self.live_session(session_id);
        for pending in abandoned {
            if let Pending::Client(request) = pending {
                let line = protocol::result_response_line(
                    &request.client_id,
                    &serde_json::json!({ "stopReason": "cancelled" }),
                );
                if let Some(answer) = self.settle(*request, line, session.as_deref()) {
                    tokio::spawn(answer.deliver());
                }
            }
        }
        count
    }
}
