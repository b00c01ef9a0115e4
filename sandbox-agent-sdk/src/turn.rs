//! One prompt turn as a stream: [`TurnEvent`], [`TurnStream`], and the
//! registry ([`Turns`]) that routes a session's events to the turn stream
//! running in it.

use crate::error::Error;
use crate::event::{Event, PermissionRequest};
use crate::question::QuestionRequest;
use agent_client_protocol::v1::schema::{
    CompleteElicitationNotification, ContentBlock, ContentChunk, ElicitationId, Plan,
    PromptResponse, SessionId, SessionUpdate, StopReason, ToolCall, ToolCallUpdate,
};
use ext_methods::SessionEnded;
use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// One thing that happened during a prompt turn, as
/// [`prompt_stream`](crate::SandboxAgentClient::prompt_stream) yields it.
///
/// The last item is always [`Stopped`](TurnEvent::Stopped) or
/// [`Failed`](TurnEvent::Failed); the stream ends after it.
#[derive(Debug)]
#[non_exhaustive]
pub enum TurnEvent {
    /// A chunk of the agent's reply (`agent_message_chunk`). Its text, if
    /// it is text: [`TurnEvent::text`].
    MessageChunk(ContentChunk),
    /// A chunk of the agent's reasoning (`agent_thought_chunk`).
    ThoughtChunk(ContentChunk),
    /// A tool call starts (`tool_call`): id, title, kind, status.
    ToolCall(ToolCall),
    /// Progress of a tool call (`tool_call_update`): only the changed
    /// fields are set.
    ToolCallUpdate(ToolCallUpdate),
    /// The agent's plan (`plan`), complete each time.
    Plan(Plan),
    /// Any other session update of the turn's session (mode change,
    /// available commands, usage, …).
    Update(SessionUpdate),
    /// The agent asks before doing something; answer with
    /// [`PermissionRequest::decide`]. Not yielded when
    /// [`ClientOptions::permission_handler`](crate::ClientOptions::permission_handler)
    /// is set (the handler answers).
    PermissionRequest(PermissionRequest),
    /// The agent asks the person something (ACP `elicitation/create`,
    /// scoped to the turn's session): answer with
    /// [`QuestionRequest::accept`], [`decline`](QuestionRequest::decline)
    /// or [`cancel`](QuestionRequest::cancel). Not yielded when
    /// [`ClientOptions::question_handler`](crate::ClientOptions::question_handler)
    /// is set.
    Question(QuestionRequest),
    /// The agent says a URL-mode question of this turn is done (ACP
    /// `elicitation/complete`). Also on [`Events`](crate::Events).
    QuestionCompleted(CompleteElicitationNotification),
    /// The session ended during the turn (terminated, or its agent process
    /// exited); [`Failed`](TurnEvent::Failed) follows.
    SessionEnded(SessionEnded),
    /// The turn ended: the agent's answer with its stop reason. Last item.
    Stopped(PromptResponse),
    /// The turn could not run or did not end normally (not connected, the
    /// connection lost, a timeout, the agent's JSON-RPC error). Last item.
    Failed(Error),
}

impl TurnEvent {
    /// The text of a [`MessageChunk`](TurnEvent::MessageChunk) with text
    /// content.
    pub fn text(&self) -> Option<&str> {
        match self {
            TurnEvent::MessageChunk(ContentChunk {
                content: ContentBlock::Text(text),
                ..
            }) => Some(&text.text),
            _ => None,
        }
    }

    /// The stop reason of [`Stopped`](TurnEvent::Stopped).
    pub fn stop_reason(&self) -> Option<StopReason> {
        match self {
            TurnEvent::Stopped(response) => Some(response.stop_reason),
            _ => None,
        }
    }

    /// Whether this is the last item ([`Stopped`](TurnEvent::Stopped) or
    /// [`Failed`](TurnEvent::Failed)).
    pub fn is_final(&self) -> bool {
        matches!(self, TurnEvent::Stopped(_) | TurnEvent::Failed(_))
    }

    /// The turn event for a session update.
    fn from_update(update: SessionUpdate) -> TurnEvent {
        match update {
            SessionUpdate::AgentMessageChunk(chunk) => TurnEvent::MessageChunk(chunk),
            SessionUpdate::AgentThoughtChunk(chunk) => TurnEvent::ThoughtChunk(chunk),
            SessionUpdate::ToolCall(call) => TurnEvent::ToolCall(call),
            SessionUpdate::ToolCallUpdate(update) => TurnEvent::ToolCallUpdate(update),
            SessionUpdate::Plan(plan) => TurnEvent::Plan(plan),
            other => TurnEvent::Update(other),
        }
    }
}

/// The events of one prompt turn, a [`Stream`](crate::Stream) of
/// [`TurnEvent`]s; made by
/// [`prompt_stream`](crate::SandboxAgentClient::prompt_stream).
///
/// Every update of the turn arrives before the final
/// [`Stopped`](TurnEvent::Stopped) / [`Failed`](TurnEvent::Failed), after
/// which the stream ends. The same updates also go to the client-wide
/// [`Events`](crate::Events) (for dashboards); permission requests and
/// questions of the turn's session come here only. Dropping the stream stops waiting for the turn, not the turn
/// itself: to end it, call the client's
/// [`cancel`](crate::SandboxAgentClient::cancel) with
/// [`session_id`](TurnStream::session_id) (`client.cancel(turn.session_id().clone())`).
#[derive(Debug)]
pub struct TurnStream {
    session_id: SessionId,
    rx: mpsc::UnboundedReceiver<TurnEvent>,
    /// Removes the registration when the stream ends or is dropped.
    registration: Option<Registration>,
    /// Sends the prompt and queues its answer.
    task: Option<JoinHandle<()>>,
    /// The final item was yielded.
    done: bool,
}

impl TurnStream {
    /// A stream for a turn in `session_id`, registered in `turns`, whose
    /// request `send` (given the sender to queue the final item on) is
    /// started at once.
    pub(crate) fn start<F>(turns: &Arc<Turns>, session_id: SessionId, send: F) -> TurnStream
    where
        F: FnOnce(mpsc::UnboundedSender<TurnEvent>) -> JoinHandle<()>,
    {
        let (tx, rx) = mpsc::unbounded_channel();
        // Registered before the request leaves, so no update is missed.
        let registration = turns.register(&session_id, tx.clone());
        let task = send(tx);
        TurnStream {
            session_id,
            rx,
            registration: Some(registration),
            task: Some(task),
            done: false,
        }
    }

    /// A stream that yields `error` and ends.
    pub(crate) fn failed(session_id: SessionId, error: Error) -> TurnStream {
        let (tx, rx) = mpsc::unbounded_channel();
        let _ = tx.send(TurnEvent::Failed(error));
        TurnStream {
            session_id,
            rx,
            registration: None,
            task: None,
            done: false,
        }
    }

    /// The session of the turn.
    pub fn session_id(&self) -> &SessionId {
        &self.session_id
    }

    /// The next event; `None` after the final one.
    pub async fn recv(&mut self) -> Option<TurnEvent> {
        std::future::poll_fn(|cx| self.poll_event(cx)).await
    }

    fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Option<TurnEvent>> {
        if self.done {
            return Poll::Ready(None);
        }
        loop {
            match self.rx.poll_recv(cx) {
                // Expired unread: answered already, not handed out.
                Poll::Ready(Some(TurnEvent::PermissionRequest(request))) => {
                    if request.claim() {
                        return Poll::Ready(Some(TurnEvent::PermissionRequest(request)));
                    }
                }
                Poll::Ready(Some(TurnEvent::Question(question))) => {
                    if question.claim() {
                        return Poll::Ready(Some(TurnEvent::Question(question)));
                    }
                }
                Poll::Ready(Some(event)) => {
                    if event.is_final() {
                        self.done = true;
                        self.registration = None;
                    }
                    return Poll::Ready(Some(event));
                }
                Poll::Ready(None) => {
                    self.done = true;
                    return Poll::Ready(None);
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl futures::Stream for TurnStream {
    type Item = TurnEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<TurnEvent>> {
        self.poll_event(cx)
    }
}

impl Drop for TurnStream {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// How many URL-mode questions [`Turns`] remembers the session of (for
/// their `elicitation/complete`, which names no session); the oldest is
/// forgotten first, and a question declined is never completed.
const EXPECTED_COMPLETIONS: usize = 64;

/// The turn streams running on a client, by session id: one per session
/// (a newer one replaces an older one).
#[derive(Debug, Default)]
pub(crate) struct Turns {
    streams: parking_lot::Mutex<HashMap<SessionId, (u64, mpsc::UnboundedSender<TurnEvent>)>>,
    next_id: AtomicU64,
    /// The session of each recent URL-mode question, at most
    /// [`EXPECTED_COMPLETIONS`].
    completions: parking_lot::Mutex<VecDeque<(ElicitationId, SessionId)>>,
}

impl Turns {
    /// Routes `session_id`'s events to `tx` until the registration is
    /// dropped.
    fn register(
        self: &Arc<Self>,
        session_id: &SessionId,
        tx: mpsc::UnboundedSender<TurnEvent>,
    ) -> Registration {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.streams.lock().insert(session_id.clone(), (id, tx));
        Registration {
            turns: Arc::clone(self),
            session_id: session_id.clone(),
            id,
        }
    }

    /// A copy of `event` to the turn stream of its session, if one runs.
    pub(crate) fn event(&self, event: &Event) {
        let streams = self.streams.lock();
        if streams.is_empty() {
            return;
        }
        match event {
            Event::SessionUpdate(notification) => {
                if let Some((_, tx)) = streams.get(&notification.session_id) {
                    let _ = tx.send(TurnEvent::from_update(notification.update.clone()));
                }
            }
            Event::SessionEnded(ended) => {
                let session = SessionId::new(ended.session_id.as_str());
                if let Some((_, tx)) = streams.get(&session) {
                    let _ = tx.send(TurnEvent::SessionEnded(ended.clone()));
                }
            }
            Event::QuestionCompleted(completed) => {
                let mut completions = self.completions.lock();
                let Some(at) = completions
                    .iter()
                    .position(|(id, _)| *id == completed.elicitation_id)
                else {
                    return;
                };
                let Some((_, session)) = completions.remove(at) else {
                    return;
                };
                if let Some((_, tx)) = streams.get(&session) {
                    let _ = tx.send(TurnEvent::QuestionCompleted(completed.clone()));
                }
            }
            _ => {}
        }
    }

    /// Remembers that the URL-mode question `id` belongs to `session`, so
    /// its `elicitation/complete` goes to that session's turn stream.
    pub(crate) fn expect_completion(&self, id: ElicitationId, session: SessionId) {
        let mut completions = self.completions.lock();
        if completions.len() == EXPECTED_COMPLETIONS {
            completions.pop_front();
        }
        completions.push_back((id, session));
    }

    /// Hands an agent request (`Event::PermissionRequest` or
    /// `Event::Question`) to the turn stream of `session`; gives it back
    /// (`Some`) when none runs or it is closed.
    pub(crate) fn request(&self, session: &SessionId, event: Event) -> Option<Event> {
        let streams = self.streams.lock();
        let Some((_, tx)) = streams.get(session) else {
            return Some(event);
        };
        let event = match event {
            Event::PermissionRequest(request) => TurnEvent::PermissionRequest(request),
            Event::Question(question) => TurnEvent::Question(question),
            other => return Some(other),
        };
        match tx.send(event) {
            Ok(()) => None,
            Err(mpsc::error::SendError(TurnEvent::PermissionRequest(request))) => {
                Some(Event::PermissionRequest(request))
            }
            Err(mpsc::error::SendError(TurnEvent::Question(question))) => {
                Some(Event::Question(question))
            }
            // Only the two kinds above are sent.
            Err(_) => None,
        }
    }
}

/// A turn stream's place in [`Turns`]; removed when dropped.
#[derive(Debug)]
struct Registration {
    turns: Arc<Turns>,
    session_id: SessionId,
    id: u64,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut streams = self.turns.streams.lock();
        if streams
            .get(&self.session_id)
            .is_some_and(|(id, _)| *id == self.id)
        {
            streams.remove(&self.session_id);
        }
    }
}
