//! The client's event stream, [`Events`], of [`Event`]s, and permission requests
//! ([`PermissionRequest`], [`PermissionDecision`]), with the rule that an
//! unread permission request is answered "cancelled" (an unread question,
//! [`QuestionRequest`], "cancel") after a limit.

use crate::event::{Event, PermissionHandler, PermissionRequest};
use crate::question::{QuestionHandler, QuestionRequest};
use crate::turn::Turns;
use agent_client_protocol::JsonRpcMessage;
use agent_client_protocol::UntypedMessage;
use agent_client_protocol::v1::Responder;
use agent_client_protocol::v1::schema::{
    CompleteElicitationNotification, CreateElicitationRequest, CreateElicitationResponse,
    ElicitationMode, RequestPermissionRequest, RequestPermissionResponse, SessionNotification,
};
use ext_methods::notification;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::mpsc;

/// The client's events: everything the agent (or the server) sent on this
/// client's connections that is not an answer, for every session, in the
/// order it arrived. Take it once with
/// [`take_events`](crate::SandboxAgentClient::take_events); for one prompt
/// turn, [`prompt_stream`](crate::SandboxAgentClient::prompt_stream) is
/// usually handier.
///
/// `acp-http-client` holds each answer until the updates the agent wrote
/// before it were delivered, so when a call such as
/// [`prompt`](crate::SandboxAgentClient::prompt) returns, every update of
/// that turn is already queued here.
///
/// Read it with [`recv`](Self::recv), [`try_recv`](Self::try_recv), or as a
/// [`Stream`](crate::Stream) (with [`StreamExt`](crate::StreamExt)'s
/// `next()`, re-exported by this crate).
///
/// Unbounded: events wait here until read. Permission requests and
/// questions are the exception: a permission request that is not read
/// from here within
/// [`ClientOptions::unread_permission_timeout`](crate::ClientOptions::unread_permission_timeout)
/// (default 30 s) is answered "cancelled", a question not read within
/// [`ClientOptions::unread_question_timeout`](crate::ClientOptions::unread_question_timeout)
/// (default 30 s) is answered "cancel"; either is logged as a warning and
/// not delivered, so a turn never waits for a reader that is not there.
/// Drop it if you do not want events; permission requests and questions
/// are then answered at once (unless a handler answers them). Ends when
/// the client is dropped.
#[derive(Debug)]
pub struct Events {
    pub(crate) rx: mpsc::UnboundedReceiver<Event>,
}

impl Events {
    /// The next event; `None` once the client is gone.
    pub async fn recv(&mut self) -> Option<Event> {
        std::future::poll_fn(|cx| self.poll_event(cx)).await
    }

    /// The next event if one is queued now.
    pub fn try_recv(&mut self) -> Option<Event> {
        loop {
            let event = self.rx.try_recv().ok()?;
            if let Some(event) = claimed(event) {
                return Some(event);
            }
        }
    }

    fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        loop {
            match self.rx.poll_recv(cx) {
                Poll::Ready(Some(event)) => {
                    if let Some(event) = claimed(event) {
                        return Poll::Ready(Some(event));
                    }
                }
                other => return other,
            }
        }
    }
}

/// `event` as handed to a reader: a permission request or a question is
/// claimed (its expiry no longer applies), or skipped (`None`) when it
/// expired unread.
fn claimed(event: Event) -> Option<Event> {
    match event {
        Event::PermissionRequest(request) if !request.claim() => None,
        Event::Question(question) if !question.claim() => None,
        other => Some(other),
    }
}

impl futures::Stream for Events {
    type Item = Event;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        self.poll_event(cx)
    }
}

/// Where the connection's handlers put what arrives: the permission
/// handler if one was given, the turn stream of the session if one runs,
/// and the client's event channel.
#[derive(Clone)]
pub(crate) struct EventSink {
    pub(crate) tx: mpsc::UnboundedSender<Event>,
    pub(crate) permission_handler: Option<PermissionHandler>,
    pub(crate) question_handler: Option<QuestionHandler>,
    /// Running [`prompt_stream`](crate::SandboxAgentClient::prompt_stream)s.
    pub(crate) turns: Arc<Turns>,
    /// How long a permission request may wait unread.
    pub(crate) unread_permission_timeout: Duration,
    /// How long a question may wait unread.
    pub(crate) unread_question_timeout: Duration,
}

impl EventSink {
    /// A permission request: to the handler (on a task of its own, so it may
    /// call the client), else to its session's turn stream, else onto the
    /// client's event stream. Answered "cancelled" at once when nobody
    /// holds the stream it went to, and after the unread-permission limit
    /// when nobody read it by then.
    pub(crate) fn permission(
        &self,
        request: RequestPermissionRequest,
        responder: Responder<RequestPermissionResponse>,
    ) {
        if let Some(handler) = &self.permission_handler {
            let decision = handler(request.clone());
            tokio::spawn(async move {
                let decision = decision.await;
                let pending = PermissionRequest::new(request, responder);
                if let Err(error) = pending.decide(decision) {
                    tracing::debug!(%error, "answering a permission request failed");
                }
            });
            return;
        }
        let session = request.session_id.clone();
        let pending = PermissionRequest::new(request, responder);
        pending.expire_unread_after(self.unread_permission_timeout);
        // Given back when no turn takes it; a closed channel hands it back
        // too, and dropping it answers "cancelled".
        if let Some(event) = self
            .turns
            .request(&session, Event::PermissionRequest(pending))
        {
            drop(self.tx.send(event));
        }
    }

    /// A question (`elicitation/create`): to the question handler (on a
    /// task of its own), else to its session's turn stream (a
    /// session-scoped question whose session runs one), else onto the
    /// client's event stream. Answered "cancel" at once when nobody holds
    /// the stream it went to, and after the unread-question limit when
    /// nobody read it by then.
    pub(crate) fn question(
        &self,
        request: CreateElicitationRequest,
        responder: Responder<CreateElicitationResponse>,
    ) {
        if let Some(handler) = &self.question_handler {
            let action = handler(request.clone());
            tokio::spawn(async move {
                let action = action.await;
                let question = QuestionRequest::new(request, responder);
                // A rejected answer is dropped with the question: "cancel".
                if let Err(error) = question.respond(action) {
                    tracing::warn!(%error, "the question handler's answer was not sent; answering \"cancel\"");
                }
            });
            return;
        }
        let question = QuestionRequest::new(request, responder);
        question.expire_unread_after(self.unread_question_timeout);
        let Some(session) = question.session_id().cloned() else {
            drop(self.tx.send(Event::Question(question)));
            return;
        };
        if let ElicitationMode::Url(url) = question.mode() {
            self.turns
                .expect_completion(url.elicitation_id.clone(), session.clone());
        }
        if let Some(event) = self.turns.request(&session, Event::Question(question)) {
            drop(self.tx.send(event));
        }
    }

    /// A notification, converted to its typed event: to the turn stream of
    /// its session (a copy) and to the client's event stream.
    pub(crate) fn notification(&self, message: UntypedMessage) {
        let event = convert_notification(message);
        self.turns.event(&event);
        let _ = self.tx.send(event);
    }

    /// The connection ended on its own.
    pub(crate) fn closed(&self, error: Option<String>) {
        let _ = self.tx.send(Event::ConnectionClosed { error });
    }
}

/// The typed event for one notification; anything unreadable stays a raw
/// [`Event::Notification`].
pub(crate) fn convert_notification(message: UntypedMessage) -> Event {
    let UntypedMessage { method, params } = message;
    let typed = if SessionNotification::matches_method(&method) {
        SessionNotification::parse_message(&method, &params)
            .ok()
            .map(Event::SessionUpdate)
    } else if CompleteElicitationNotification::matches_method(&method) {
        CompleteElicitationNotification::parse_message(&method, &params)
            .ok()
            .map(Event::QuestionCompleted)
    } else if method == notification::SESSION_ENDED {
        serde_json::from_value(params.clone())
            .ok()
            .map(Event::SessionEnded)
    } else if method == notification::TURN_INTERRUPTED {
        serde_json::from_value(params.clone())
            .ok()
            .map(Event::TurnInterrupted)
    } else if method == notification::AGENT_UNPARSED {
        serde_json::from_value(params.clone())
            .ok()
            .map(Event::AgentUnparsed)
    } else if method == notification::STREAM_GAP {
        serde_json::from_value(params.clone())
            .ok()
            .map(Event::StreamGap)
    } else {
        None
    };
    typed.unwrap_or(Event::Notification { method, params })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::PermissionDecision;
    use agent_client_protocol::v1::schema::{
        PermissionOption, PermissionOptionKind, RequestPermissionOutcome,
    };
    use ext_methods::{EndReason, StreamGap, TerminatedBy};
    use serde_json::Value;
    use serde_json::json;

    fn untyped(method: &str, params: Value) -> UntypedMessage {
        UntypedMessage {
            method: method.to_owned(),
            params,
        }
    }

    #[test]
    fn extension_notifications_become_typed_events() {
        let ended = convert_notification(untyped(
            notification::SESSION_ENDED,
            json!({"sessionId": "s", "reason": "terminated", "terminatedBy": "daemon", "message": "terminated on request"}),
        ));
        match ended {
            Event::SessionEnded(ended) => {
                assert_eq!(ended.session_id, "s");
                assert_eq!(ended.reason, EndReason::Terminated);
                assert_eq!(ended.terminated_by, TerminatedBy::Daemon);
            }
            other => panic!("unexpected {other:?}"),
        }
        let unparsed = convert_notification(untyped(
            notification::AGENT_UNPARSED,
            json!({"agent": "mock", "raw": "42", "error": "not a JSON object"}),
        ));
        assert!(matches!(unparsed, Event::AgentUnparsed(u) if u.raw == "42"));
        let gap = convert_notification(untyped(
            notification::STREAM_GAP,
            json!({"from": 3, "to": 4}),
        ));
        assert!(matches!(
            gap,
            Event::StreamGap(StreamGap { from: 3, to: 4 })
        ));
        let interrupted = convert_notification(untyped(
            notification::TURN_INTERRUPTED,
            json!({"sessionId": "s", "reason": "server-stopped", "stopReason": "cancelled",
                   "promptId": 2, "requestIds": ["r1"]}),
        ));
        match interrupted {
            Event::TurnInterrupted(turn) => {
                assert_eq!(turn.session_id, "s");
                assert_eq!(turn.reason, ext_methods::InterruptReason::ServerStopped);
                assert_eq!(
                    turn.stop_reason,
                    agent_client_protocol::v1::schema::StopReason::Cancelled
                );
                assert_eq!(turn.prompt_id, json!(2));
                assert_eq!(turn.request_ids, vec![json!("r1")]);
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn session_updates_are_typed_and_unknown_ones_stay_raw() {
        let update = convert_notification(untyped(
            "session/update",
            json!({"sessionId": "s", "update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "Hi"}}}),
        ));
        assert!(matches!(update, Event::SessionUpdate(n) if n.session_id.0.as_ref() == "s"));
        let odd = convert_notification(untyped(
            "session/update",
            json!({"sessionId": "s", "update": {"sessionUpdate": "from_the_future"}}),
        ));
        assert!(matches!(odd, Event::Notification { method, .. } if method == "session/update"));
        let vendor = convert_notification(untyped("_vendor/ping", Value::Null));
        assert!(matches!(vendor, Event::Notification { method, .. } if method == "_vendor/ping"));
        let bad_ended = convert_notification(untyped(notification::SESSION_ENDED, json!({})));
        assert!(matches!(bad_ended, Event::Notification { .. }));
    }

    #[test]
    fn decisions_pick_options_by_kind() {
        let options = vec![
            PermissionOption::new("allow-once", "Allow once", PermissionOptionKind::AllowOnce),
            PermissionOption::new(
                "reject-once",
                "Reject once",
                PermissionOptionKind::RejectOnce,
            ),
        ];
        let selected = |decision: PermissionDecision| match decision.outcome(&options) {
            RequestPermissionOutcome::Selected(selected) => Some(selected.option_id.0.to_string()),
            _ => None,
        };
        assert_eq!(
            selected(PermissionDecision::Allow).as_deref(),
            Some("allow-once")
        );
        assert_eq!(
            selected(PermissionDecision::AllowAlways).as_deref(),
            Some("allow-once")
        );
        assert_eq!(
            selected(PermissionDecision::Reject).as_deref(),
            Some("reject-once")
        );
        assert_eq!(
            selected(PermissionDecision::Select("reject-once".into())).as_deref(),
            Some("reject-once")
        );
        assert_eq!(selected(PermissionDecision::Select("nope".into())), None);
        assert_eq!(selected(PermissionDecision::Cancel), None);
        assert_eq!(
            PermissionDecision::Allow.outcome(&[]),
            RequestPermissionOutcome::Cancelled
        );
    }
}
