//! The answering half of an agent request handed to the caller (a
//! permission request, a question): its responder, shared with the timer
//! that answers for the caller when nobody takes the request in time
//! (research/contract.md, "The SDK and `sandbox-agent prompt`").

use agent_client_protocol::JsonRpcResponse;
use agent_client_protocol::v1::Responder;
use std::sync::Arc;
use std::time::Duration;

/// A responder that is answered at most once, by its holder or by the
/// unread-request timer ([`expire_unread_after`](Self::expire_unread_after)).
pub(crate) struct Pending<R: JsonRpcResponse> {
    state: Arc<parking_lot::Mutex<State<R>>>,
}

struct State<R: JsonRpcResponse> {
    /// `None` once answered.
    responder: Option<Responder<R>>,
    /// Handed to a reader: the expiry timer leaves it alone.
    claimed: bool,
}

impl<R: JsonRpcResponse + Send + 'static> Pending<R> {
    pub(crate) fn new(responder: Responder<R>) -> Pending<R> {
        Pending {
            state: Arc::new(parking_lot::Mutex::new(State {
                responder: Some(responder),
                claimed: false,
            })),
        }
    }

    /// Marks the request as handed to a reader; `false` when it was
    /// answered already (expired unread), so it is not worth handing out.
    pub(crate) fn claim(&self) -> bool {
        let mut state = self.state.lock();
        state.claimed = true;
        state.responder.is_some()
    }

    /// The responder, once: `None` when the request was answered already.
    pub(crate) fn take(&self) -> Option<Responder<R>> {
        self.state.lock().responder.take()
    }

    /// Whether the request was answered.
    pub(crate) fn is_answered(&self) -> bool {
        self.state.lock().responder.is_none()
    }

    /// After `limit`, unless a reader claimed the request by then (or it
    /// was answered, or dropped), hands the responder to `expire`, which
    /// answers for nobody (and logs why).
    pub(crate) fn expire_unread_after(
        &self,
        limit: Duration,
        expire: impl FnOnce(Responder<R>) + Send + 'static,
    ) {
        let state = Arc::downgrade(&self.state);
        tokio::spawn(async move {
            tokio::time::sleep(limit).await;
            let Some(state) = state.upgrade() else {
                return;
            };
            let responder = {
                let mut state = state.lock();
                if state.claimed {
                    return;
                }
                state.responder.take()
            };
            if let Some(responder) = responder {
                expire(responder);
            }
        });
    }
}
