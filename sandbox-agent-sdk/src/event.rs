//! One event of the client's stream ([`Event`]) and the permission
//! requests it carries ([`PermissionRequest`], [`PermissionDecision`]): the
//! types both the stream (`events`) and a prompt turn (`turn`) hand out.

use crate::error::Error;
use crate::pending::Pending;
use crate::question::QuestionRequest;
use agent_client_protocol::v1::Responder;
use agent_client_protocol::v1::schema::{
    CompleteElicitationNotification, PermissionOption, PermissionOptionId, PermissionOptionKind,
    RequestPermissionOutcome, RequestPermissionRequest, RequestPermissionResponse,
    SelectedPermissionOutcome, SessionNotification,
};
use ext_methods::{AgentUnparsed, SessionEnded, StreamGap, TurnInterrupted};
use futures::future::BoxFuture;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

/// A permission handler (see
/// [`ClientOptions::permission_handler`](crate::ClientOptions::permission_handler)).
pub type PermissionHandler =
    Arc<dyn Fn(RequestPermissionRequest) -> BoxFuture<'static, PermissionDecision> + Send + Sync>;

/// One thing the agent or the server told this client.
#[derive(Debug)]
#[non_exhaustive]
pub enum Event {
    /// A session update (`session/update`): a chunk of the agent's reply or
    /// thoughts, a tool call and its progress, a plan, a mode change, …
    SessionUpdate(SessionNotification),
    /// The agent asks before doing something (`session/request_permission`).
    /// Answer it with [`PermissionRequest::decide`]; an unanswered request
    /// is answered "cancelled" when it is dropped.
    PermissionRequest(PermissionRequest),
    /// The agent asks the person something (ACP `elicitation/create`): a
    /// form to fill in, or a URL to open. Answer it with
    /// [`QuestionRequest::accept`], [`decline`](QuestionRequest::decline)
    /// or [`cancel`](QuestionRequest::cancel); an unanswered question is
    /// answered "cancel" when it is dropped. Not delivered when
    /// [`ClientOptions::question_handler`](crate::ClientOptions::question_handler)
    /// is set.
    Question(QuestionRequest),
    /// The agent says a URL-mode question is done (ACP
    /// `elicitation/complete`, naming the question's
    /// [`elicitation_id`](QuestionRequest::elicitation_id)): the person
    /// finished what the URL was for.
    QuestionCompleted(CompleteElicitationNotification),
    /// A session ended (`_sandboxagent/session/ended`): terminated on
    /// request, or its agent process exited (with exit code and stderr).
    SessionEnded(SessionEnded),
    /// A prompt turn was running when its server stopped
    /// (`_sandboxagent/turn/interrupted`, recorded in the session's log
    /// when the server started again; heard in an attach's replay of that
    /// log): the turn ended `cancelled` without an answer, and the agent
    /// requests it names can no longer be answered. Read from an events
    /// page with [`SessionEvent::turn_interrupted`](crate::SessionEvent::turn_interrupted).
    TurnInterrupted(TurnInterrupted),
    /// The agent wrote a stdout line that is not JSON-RPC
    /// (`_sandboxagent/agent/unparsed`).
    AgentUnparsed(AgentUnparsed),
    /// The event stream resumed past events the server no longer holds
    /// (`_sandboxagent/stream/gap`): sequence numbers `from..=to` are lost.
    StreamGap(StreamGap),
    /// Any other notification (an agent's own extension, or a
    /// `session/update` this crate's schema cannot read), as sent.
    Notification {
        /// The JSON-RPC method.
        method: String,
        /// Its params (`null` when absent).
        params: Value,
    },
    /// The connection ended without [`disconnect`](crate::SandboxAgentClient::disconnect)
    /// (the server went away, the event stream could not be resumed). Calls
    /// now fail with [`Error::NotConnected`];
    /// [`open`](crate::SandboxAgentClient::open) starts a new connection.
    ConnectionClosed {
        /// Why, when known.
        error: Option<String>,
    },
}

/// How to answer a permission request, in terms of the options the agent
/// offered (ACP `PermissionOptionKind`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PermissionDecision {
    /// The first "allow once" option, else the first "allow always".
    Allow,
    /// The first "allow always" option, else the first "allow once".
    AllowAlways,
    /// The first "reject once" option, else the first "reject always".
    Reject,
    /// The option with this id.
    Select(PermissionOptionId),
    /// No option: the outcome "cancelled" (the agent normally ends the turn
    /// with stop reason `cancelled`).
    Cancel,
}

impl PermissionDecision {
    /// The ACP outcome for `options`. A decision no offered option matches
    /// (no allow option for [`Allow`](Self::Allow), an unknown id) becomes
    /// "cancelled".
    pub fn outcome(&self, options: &[PermissionOption]) -> RequestPermissionOutcome {
        let first = |kinds: &[PermissionOptionKind]| {
            kinds
                .iter()
                .find_map(|kind| options.iter().find(|option| option.kind == *kind))
        };
        let chosen = match self {
            PermissionDecision::Allow => first(&[
                PermissionOptionKind::AllowOnce,
                PermissionOptionKind::AllowAlways,
            ]),
            PermissionDecision::AllowAlways => first(&[
                PermissionOptionKind::AllowAlways,
                PermissionOptionKind::AllowOnce,
            ]),
            PermissionDecision::Reject => first(&[
                PermissionOptionKind::RejectOnce,
                PermissionOptionKind::RejectAlways,
            ]),
            PermissionDecision::Select(id) => options.iter().find(|option| option.option_id == *id),
            PermissionDecision::Cancel => None,
        };
        match chosen {
            Some(option) => RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(
                option.option_id.clone(),
            )),
            None => RequestPermissionOutcome::Cancelled,
        }
    }
}

/// A permission request of the agent, waiting for an answer: it carries
/// its responder.
///
/// Read what is asked with [`request`](Self::request) (the session, the tool
/// call with its title, the options) and answer once with
/// [`decide`](Self::decide). Dropping it unanswered answers "cancelled", so
/// the agent never waits forever. Once handed to you (by [`Events`] or a
/// [`TurnStream`](crate::TurnStream)) it waits for your answer as long as
/// you keep it.
pub struct PermissionRequest {
    request: RequestPermissionRequest,
    pending: Pending<RequestPermissionResponse>,
}

impl PermissionRequest {
    pub(crate) fn new(
        request: RequestPermissionRequest,
        responder: Responder<RequestPermissionResponse>,
    ) -> PermissionRequest {
        PermissionRequest {
            request,
            pending: Pending::new(responder),
        }
    }

    /// Marks the request as handed to a reader; `false` when it was
    /// answered already (expired unread), so it is not worth handing out.
    pub(crate) fn claim(&self) -> bool {
        self.pending.claim()
    }

    /// Answers "cancelled" after `limit` unless a reader claimed the
    /// request by then (or it was answered); logs a warning when it does.
    pub(crate) fn expire_unread_after(&self, limit: Duration) {
        let session = self.request.session_id.clone();
        let title = self.title().to_owned();
        self.pending.expire_unread_after(limit, move |responder| {
            tracing::warn!(
                session = %session,
                permission = %title,
                ?limit,
                "a permission request was not read within the limit and is answered \"cancelled\": \
                 set ClientOptions::permission_handler, or read Events or the turn's TurnStream \
                 (ClientOptions::unread_permission_timeout)"
            );
            if let Err(error) = responder.respond(RequestPermissionResponse::new(
                RequestPermissionOutcome::Cancelled,
            )) {
                tracing::debug!(%error, "answering an expired permission request failed");
            }
        });
    }

    /// What the agent asks: `session_id`, `tool_call` (its `fields.title`
    /// says what the agent wants to do) and `options`.
    pub fn request(&self) -> &RequestPermissionRequest {
        &self.request
    }

    /// A one-line description: the tool call's title, or its id.
    pub fn title(&self) -> &str {
        self.request
            .tool_call
            .fields
            .title
            .as_deref()
            .unwrap_or(&self.request.tool_call.tool_call_id.0)
    }

    /// Answers with `decision` (see [`PermissionDecision::outcome`]).
    ///
    /// # Errors
    /// [`Error::ConnectionLost`] when the answer cannot be sent (the
    /// connection is gone).
    pub fn decide(self, decision: PermissionDecision) -> Result<(), Error> {
        let outcome = decision.outcome(&self.request.options);
        self.respond(outcome)
    }

    fn respond(&self, outcome: RequestPermissionOutcome) -> Result<(), Error> {
        match self.pending.take() {
            // Sending an answer fails only when the connection is gone.
            Some(responder) => responder
                .respond(RequestPermissionResponse::new(outcome))
                .map_err(|error| Error::ConnectionLost {
                    message: format!("cannot answer the permission request: {}", error.message),
                    source: Some(Box::new(error)),
                }),
            None => Ok(()),
        }
    }
}

impl Drop for PermissionRequest {
    fn drop(&mut self) {
        if let Err(error) = self.respond(RequestPermissionOutcome::Cancelled) {
            tracing::debug!(%error, "answering a dropped permission request failed");
        }
    }
}

impl std::fmt::Debug for PermissionRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PermissionRequest")
            .field("request", &self.request)
            .field("answered", &self.pending.is_answered())
            .finish()
    }
}
