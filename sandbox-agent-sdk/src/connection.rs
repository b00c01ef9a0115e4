//! One live connection to the agent: an `agent-client-protocol` client
//! connection over `acp-http-client`'s [`HttpTransport`], driven by a task
//! of its own, with handlers that turn what arrives into events.
//!
//! The handlers never wait for anything (they run in the SDK's dispatch
//! loop; see agent-client-protocol's `concepts::ordering`): they push to
//! the event channel, or start a task for the permission or question
//! handler.

use crate::error::Error;
use crate::events::EventSink;
use crate::meta::with_agent;
use acp_http_client::{HttpTransport, TransportHandle, TransportOptions};
use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    ClientCapabilities, CreateElicitationRequest, CreateElicitationResponse, Implementation,
    InitializeRequest, InitializeResponse, RequestPermissionRequest, RequestPermissionResponse,
};
use agent_client_protocol::v1::{ConnectionTo, Responder};
use agent_client_protocol::{
    Agent, Client, UntypedMessage, on_receive_notification, on_receive_request,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How long [`Live::close`] waits for the connection task to finish (it
/// sends DELETE on its way out).
const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// What a connection needs besides the transport options.
pub(crate) struct Setup {
    /// The agent id, named in `initialize`.
    pub(crate) agent: String,
    /// `clientInfo` of `initialize`.
    pub(crate) client_name: String,
    pub(crate) client_version: String,
    /// `clientCapabilities` of `initialize` (elicitation declared unless
    /// the options say not to).
    pub(crate) client_capabilities: ClientCapabilities,
    /// Where events go.
    pub(crate) sink: EventSink,
}

/// A live connection: the typed handle for sending, the transport handle,
/// and the task that drives both.
pub(crate) struct Live {
    /// Sends requests and notifications to the agent.
    pub(crate) cx: ConnectionTo<Agent>,
    /// The agent's `initialize` result (with the server's extension block).
    pub(crate) initialize: InitializeResponse,
    /// The HTTP connection (its id; closing it).
    handle: TransportHandle,
    /// Ends the connection task's main function.
    stop: Option<oneshot::Sender<()>>,
    /// Set before a deliberate close, so the task reports no
    /// [`Event::ConnectionClosed`](crate::Event::ConnectionClosed).
    closing: Arc<AtomicBool>,
    /// The task running the connection.
    task: Option<JoinHandle<()>>,
}

impl Live {
    /// Opens a connection: starts the connection task and sends
    /// `initialize` naming the agent.
    ///
    /// # Errors
    /// Building the transport ([`Error::InvalidOptions`]), or `initialize`
    /// failing ([`Error::Http`] with the server's problem, e.g. an unknown
    /// agent; [`Error::ConnectionLost`]; [`Error::Rpc`]).
    pub(crate) async fn open(options: TransportOptions, setup: Setup) -> Result<Live, Error> {
        let transport = HttpTransport::new(options).map_err(Error::from_transport)?;
        let handle = transport.handle();
        let closing = Arc::new(AtomicBool::new(false));
        let (cx_tx, cx_rx) = oneshot::channel();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();

        let permissions = setup.sink.clone();
        let questions = setup.sink.clone();
        let notifications = setup.sink.clone();
        let builder = Client
            .v1()
            .name(setup.client_name.clone())
            .on_receive_request(
                async move |request: RequestPermissionRequest,
                            responder: Responder<RequestPermissionResponse>,
                            _cx| {
                    permissions.permission(request, responder);
                    Ok(())
                },
                on_receive_request!(),
            )
            .on_receive_request(
                async move |request: CreateElicitationRequest,
                            responder: Responder<CreateElicitationResponse>,
                            _cx| {
                    questions.question(request, responder);
                    Ok(())
                },
                on_receive_request!(),
            )
            .on_receive_notification(
                async move |message: UntypedMessage, _cx| {
                    notifications.notification(message);
                    Ok(())
                },
                on_receive_notification!(),
            );
        let task_closing = Arc::clone(&closing);
        let sink = setup.sink.clone();
        let task = tokio::spawn(async move {
            let result = builder
                .connect_with(transport, async move |cx: ConnectionTo<Agent>| {
                    let _ = cx_tx.send(cx.clone());
                    tokio::select! {
                        _ = stop_rx => {}
                        () = cx.incoming_closed() => {}
                    }
                    Ok(())
                })
                .await;
            if !task_closing.load(Ordering::Acquire) {
                sink.closed(result.err().map(|error| error.message));
            }
        });

        let Ok(cx) = cx_rx.await else {
            // The connection failed before its main function ran.
            let error = match task.await {
                Err(join) => join.to_string(),
                Ok(()) => "the connection ended at once".to_owned(),
            };
            return Err(Error::connection_lost(error));
        };
        let mut live = Live {
            cx,
            initialize: InitializeResponse::new(ProtocolVersion::V1),
            handle,
            stop: Some(stop_tx),
            closing,
            task: Some(task),
        };
        let initialize = InitializeRequest::new(ProtocolVersion::V1)
            .client_capabilities(setup.client_capabilities)
            .client_info(Implementation::new(setup.client_name, setup.client_version))
            .meta(with_agent(None, &setup.agent));
        match live.cx.send_request(initialize).block_task().await {
            Ok(result) => {
                live.initialize = result;
                Ok(live)
            }
            Err(error) => {
                live.close().await;
                Err(Error::from_rpc(error))
            }
        }
    }

    /// Whether the connection is still running.
    pub(crate) fn is_alive(&self) -> bool {
        self.task.as_ref().is_some_and(|task| !task.is_finished()) && !self.handle.is_closed()
    }

    /// The server's id for this connection.
    pub(crate) fn connection_id(&self) -> Option<String> {
        self.handle.connection_id()
    }

    /// Ends the connection: stops the task (the transport sends DELETE) and
    /// waits for it, at most [`CLOSE_TIMEOUT`]. Sessions on the server live
    /// on (research/contract.md, "Transport: /v2/rpc", DELETE).
    pub(crate) async fn close(&mut self) {
        self.closing.store(true, Ordering::Release);
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // The task delivers queued notifications, then sends DELETE.
        if let Some(mut task) = self.task.take()
            && tokio::time::timeout(CLOSE_TIMEOUT, &mut task)
                .await
                .is_err()
        {
            task.abort();
        }
        if let Err(error) = self.handle.close().await {
            tracing::debug!(%error, "closing the connection failed");
        }
    }
}

impl Drop for Live {
    /// Without [`close`](Self::close): stop the task; the transport closes
    /// the connection in the background if a runtime is still there.
    fn drop(&mut self) {
        self.closing.store(true, Ordering::Release);
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}
