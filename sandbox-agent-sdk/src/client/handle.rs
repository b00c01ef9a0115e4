//! The client handle: [`SandboxAgentClient`] and the state its clones
//! share; sending a request, the timeouts, extension requests.

use crate::connection::Live;
use crate::control::ControlPlane;
use crate::embedded::EmbeddedServer;
use crate::error::Error;
use crate::event::Event;
use crate::events::Events;
use crate::options::ClientOptions;
use crate::turn::Turns;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::{Agent, JsonRpcRequest, JsonRpcResponse, UntypedMessage};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;

/// A client of one sandbox-agent server, bound to one agent.
///
/// Created by [`connect`](Self::connect), which reaches a running server
/// (server mode) or starts one (embedded mode), and by default opens the
/// connection to the agent. One connection at a time:
/// [`open`](Self::open) fails with [`Error::AlreadyConnected`] while one is
/// live, calls that need it fail with [`Error::NotConnected`] before
/// `open` and after [`close`](Self::close); `open` after `close` starts a
/// new one. Sessions outlive connections: pick one up again with
/// [`load_session`](Self::load_session) or
/// [`resume_session`](Self::resume_session).
///
/// A prompt turn's events come with the turn from
/// [`prompt_stream`](Self::prompt_stream); everything the agent sends
/// besides answers, for every session, also arrives on one [`Events`]
/// stream ([`take_events`](Self::take_events)).
///
/// Cloning is cheap and shares everything (connection, event stream,
/// embedded server), like `reqwest::Client`: hand clones to tasks.
/// Dropping the last clone closes the connection and stops an embedded
/// server (SIGTERM, SIGKILL after the grace period; this blocks the
/// dropping thread up to the grace period). [`shutdown`](Self::shutdown)
/// does the same at once for every clone, without blocking. Needs a Tokio
/// runtime.
#[derive(Clone)]
pub struct SandboxAgentClient {
    pub(super) agent: String,
    /// Control-plane HTTP access.
    pub(super) control: ControlPlane,
    /// Everything else, shared by the clones.
    pub(super) shared: Arc<Shared>,
}

/// The part of a [`SandboxAgentClient`] its clones share.
pub(super) struct Shared {
    /// Base URL of the server (the embedded one's `http://127.0.0.1:PORT`).
    pub(super) base_url: String,
    /// Its bearer token, if any.
    pub(super) token: Option<String>,
    /// `clientInfo` and the request timeout of each connection.
    pub(super) options: ClientOptions,
    /// Serialises open / close / shutdown.
    pub(super) lifecycle: tokio::sync::Mutex<()>,
    /// The live connection. Declared before `server`: dropped first.
    pub(super) live: parking_lot::Mutex<Option<Live>>,
    /// Feeds [`Events`]; cloned into every connection.
    pub(super) events_tx: mpsc::UnboundedSender<Event>,
    /// Until taken.
    pub(super) events: parking_lot::Mutex<Option<Events>>,
    /// Running turn streams, by session.
    pub(super) turns: Arc<Turns>,
    /// The embedded server, in embedded mode, until shut down.
    pub(super) server: parking_lot::Mutex<Option<EmbeddedServer>>,
    /// The embedded server's pid (kept after shutdown).
    pub(super) server_pid: Option<u32>,
    /// Set by [`shutdown`](SandboxAgentClient::shutdown).
    pub(super) disposed: AtomicBool,
}

impl SandboxAgentClient {
    pub(super) fn check_disposed(&self) -> Result<(), Error> {
        if self.shared.disposed.load(Ordering::Acquire) {
            Err(Error::Disposed)
        } else {
            Ok(())
        }
    }

    /// The live connection's sender.
    pub(super) fn cx(&self) -> Result<ConnectionTo<Agent>, Error> {
        self.check_disposed()?;
        match self.shared.live.lock().as_ref() {
            Some(live) if live.is_alive() => Ok(live.cx.clone()),
            _ => Err(Error::NotConnected),
        }
    }

    /// Sends `request` and waits for its answer.
    pub(super) async fn request<Req: JsonRpcRequest>(
        &self,
        request: Req,
    ) -> Result<Req::Response, Error>
    where
        Req::Response: JsonRpcResponse + Send,
    {
        let cx = self.cx()?;
        let method = request.method().to_owned();
        self.within_timeout(&method, async {
            cx.send_request(request)
                .block_task()
                .await
                .map_err(Error::from_rpc)
        })
        .await
    }

    /// `call`, failing with [`Error::Timeout`] after the request timeout.
    pub(super) async fn within_timeout<T>(
        &self,
        what: &str,
        call: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        within_limit(self.shared.options.request_timeout, what, call).await
    }

    /// A control-plane call; a reqwest timeout is reported with the route
    /// and the limit.
    pub(super) async fn control_call<T>(
        &self,
        what: &str,
        call: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        match call.await {
            Err(Error::Timeout { source, .. }) => Err(Error::Timeout {
                what: what.to_owned(),
                after: self.shared.options.request_timeout,
                source,
            }),
            other => other,
        }
    }

    /// Sends an extension request and reads its result as `R`.
    pub(super) async fn ext_request<P: Serialize, R: DeserializeOwned>(
        &self,
        method: &str,
        params: &P,
    ) -> Result<R, Error> {
        let message = UntypedMessage::new(method, params).map_err(Error::from_rpc)?;
        let value = self.request(message).await?;
        serde_json::from_value(value).map_err(|error| Error::InvalidResponse {
            what: method.to_owned(),
            message: error.to_string(),
        })
    }
}

/// `call`, failing with [`Error::Timeout`] naming `what` after `limit`
/// (none: no limit).
pub(super) async fn within_limit<T>(
    limit: Option<Duration>,
    what: &str,
    call: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    let Some(limit) = limit else {
        return call.await;
    };
    match tokio::time::timeout(limit, call).await {
        Ok(result) => result,
        Err(_) => Err(Error::Timeout {
            what: what.to_owned(),
            after: Some(limit),
            source: None,
        }),
    }
}

impl std::fmt::Debug for SandboxAgentClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxAgentClient")
            .field("agent", &self.agent)
            .field("base_url", &self.shared.base_url)
            .field("server_pid", &self.shared.server_pid)
            .field("connected", &self.is_connected())
            .field("disposed", &self.shared.disposed.load(Ordering::Relaxed))
            .finish()
    }
}
