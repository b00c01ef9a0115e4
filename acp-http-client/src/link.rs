//! The handle a connection keeps of its WebSocket ([`Transport::WebSocket`](crate::Transport)):
//! the queue of outgoing messages and whether the socket task (in
//! `websocket`, started by the first message) has ended. Apart from the
//! task so that the connection's shared state can hold it without the
//! state and the task importing each other.

use crate::error::Error;
use parking_lot::Mutex;
use reqwest::Url;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// How long a close waits for the socket task to send its close frame.
pub(crate) const CLOSE_TIMEOUT: Duration = Duration::from_secs(3);
/// One message on its way to the socket.
pub(crate) struct Outgoing {
    pub(crate) text: String,
    /// Told once the message was written and flushed (or could not be).
    pub(crate) written: oneshot::Sender<Result<(), Error>>,
}

/// The socket side of a connection: the queue of outgoing messages and the
/// task that owns the socket (started by the first message).
pub(crate) struct Link {
    /// The socket URL (`ws://…`).
    pub(crate) url: Url,
    pub(crate) queue: mpsc::UnboundedSender<Outgoing>,
    /// Taken by the socket task when the first message starts it.
    pub(crate) receiver: Mutex<Option<mpsc::UnboundedReceiver<Outgoing>>>,
    /// Cancelled when the socket task has ended.
    pub(crate) done: tokio_util::sync::CancellationToken,
}

impl Link {
    /// A link to the WebSocket at `endpoint` (an `http`/`https` URL whose
    /// scheme becomes `ws`).
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] for `https`: this build has no TLS for
    /// WebSockets (put the runtime behind a plain `http` address, or use
    /// the HTTP transport).
    pub(crate) fn new(endpoint: &Url) -> Result<Link, Error> {
        let mut url = endpoint.clone();
        if url.scheme() != "http" || url.set_scheme("ws").is_err() {
            return Err(Error::InvalidOptions(format!(
                "the WebSocket transport needs an http:// base URL (wss:// is not supported), not {endpoint}"
            )));
        }
        let (queue, receiver) = mpsc::unbounded_channel();
        Ok(Link {
            url,
            queue,
            receiver: Mutex::new(Some(receiver)),
            done: tokio_util::sync::CancellationToken::new(),
        })
    }

    /// Waits (at most [`CLOSE_TIMEOUT`]) for the socket task to finish
    /// after the connection was closed; at once if it never started.
    pub(crate) async fn wait_closed(&self) {
        if self.receiver.lock().is_some() {
            return;
        }
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, self.done.cancelled()).await;
    }
}
