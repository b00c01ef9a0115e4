//! The client's lifecycle: reaching or starting the server (`connect`),
//! opening and closing the connection to the agent, shutting down; the
//! client-wide event stream; what the client knows of its server and its
//! connection.

use super::SandboxAgentClient;
use super::handle::Shared;
use crate::connection::{Live, Setup};
use crate::control::ControlPlane;
use crate::embedded::EmbeddedServer;
use crate::error::Error;
use crate::events::{EventSink, Events};
use crate::options::ClientOptions;
use acp_http_client::TransportOptions;
use agent_client_protocol::v1::schema::InitializeResponse;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;

/// How much longer than [`ClientOptions::request_timeout`] the transport
/// waits, so that the client's own limit fires first and is reported as
/// [`Error::Timeout`].
const TRANSPORT_TIMEOUT_MARGIN: Duration = Duration::from_secs(1);

impl SandboxAgentClient {
    /// Reaches the server the options name (server mode), or starts one
    /// (embedded mode; see [`ClientOptions::binary`]), then, unless
    /// `auto_connect(false)`, opens the connection to the agent
    /// (`initialize`).
    ///
    /// # Errors
    /// - [`Error::InvalidOptions`]: mode and base URL disagree, a bad URL or
    ///   token.
    /// - Embedded mode: [`Error::BinaryNotFound`], [`Error::ServerStart`],
    ///   [`Error::StartupTimeout`].
    /// - Opening the connection: as [`open`](Self::open).
    pub async fn connect(options: ClientOptions) -> Result<SandboxAgentClient, Error> {
        let build = |timeout: Option<Duration>| {
            let mut builder = reqwest::Client::builder();
            if let Some(timeout) = timeout {
                builder = builder.timeout(timeout);
            }
            builder
                .build()
                .map_err(|e| Error::InvalidOptions(format!("cannot build the HTTP client: {e}")))
        };
        // The embedded server's readiness checks have their own limit.
        let http = build(None)?;
        let (base_url, token, server) = match options.resolve_mode()? {
            Some(url) => (url.to_owned(), options.token.clone(), None),
            None => {
                let server = EmbeddedServer::start(&options.embedded, &http).await?;
                (
                    server.base_url().to_owned(),
                    Some(server.token().to_owned()),
                    Some(server),
                )
            }
        };
        let control =
            ControlPlane::new(build(options.request_timeout)?, &base_url, token.as_deref())?;
        let (events_tx, rx) = mpsc::unbounded_channel();
        let client = SandboxAgentClient {
            agent: options.agent.clone(),
            control,
            shared: Arc::new(Shared {
                base_url,
                token,
                lifecycle: tokio::sync::Mutex::new(()),
                live: parking_lot::Mutex::new(None),
                events_tx,
                events: parking_lot::Mutex::new(Some(Events { rx })),
                turns: Arc::default(),
                server_pid: server.as_ref().map(EmbeddedServer::pid),
                server: parking_lot::Mutex::new(server),
                disposed: AtomicBool::new(false),
                options,
            }),
        };
        if client.shared.options.auto_connect
            && let Err(error) = client.open().await
        {
            // Stop an embedded server without blocking (drop would).
            client.shutdown().await;
            return Err(error);
        }
        Ok(client)
    }

    /// Opens the connection to the agent: `initialize` with the agent id in
    /// `_meta["sandboxagent.dev"].agent`. Called by
    /// [`connect`](Self::connect) unless `auto_connect(false)`; call it
    /// again after [`close`](Self::close) (or a lost connection) for a new
    /// connection.
    ///
    /// # Errors
    /// - [`Error::AlreadyConnected`]: a connection is live.
    /// - [`Error::Disposed`].
    /// - [`Error::Http`]: the server refused (e.g. 404 `unknown-agent`, 401
    ///   wrong token, 502 the agent could not be started), with its problem
    ///   document.
    /// - [`Error::ConnectionLost`]: the server could not be reached.
    /// - [`Error::Timeout`]: `initialize` took longer than the request
    ///   timeout.
    /// - [`Error::Rpc`]: the agent answered `initialize` with an error.
    pub async fn open(&self) -> Result<(), Error> {
        let shared = &self.shared;
        let _lifecycle = shared.lifecycle.lock().await;
        self.check_disposed()?;
        {
            let mut live = shared.live.lock();
            match live.as_ref() {
                Some(current) if current.is_alive() => return Err(Error::AlreadyConnected),
                // A connection that ended on its own is replaced.
                Some(_) => *live = None,
                None => {}
            }
        }
        // The transport's own limit is a little longer than the one this
        // client applies (`within_timeout`), which thus reports it.
        let mut transport = TransportOptions::new(&shared.base_url)
            .map_err(Error::from_transport)?
            .transport(shared.options.transport)
            .reconnect(shared.options.reconnect)
            .request_timeout(
                shared
                    .options
                    .request_timeout
                    .map(|limit| limit + TRANSPORT_TIMEOUT_MARGIN),
            );
        if let Some(token) = &shared.token {
            transport = transport.token(token);
        }
        let setup = Setup {
            agent: self.agent.clone(),
            client_name: shared.options.client_name.clone(),
            client_version: shared.options.client_version.clone(),
            client_capabilities: shared.options.declared_capabilities(),
            sink: EventSink {
                tx: shared.events_tx.clone(),
                permission_handler: shared.options.permission_handler.clone(),
                question_handler: shared.options.question_handler.clone(),
                turns: Arc::clone(&shared.turns),
                unread_permission_timeout: shared.options.unread_permission_timeout,
                unread_question_timeout: shared.options.unread_question_timeout,
            },
        };
        let live = self
            .within_timeout("initialize", Live::open(transport, setup))
            .await?;
        *shared.live.lock() = Some(live);
        Ok(())
    }

    /// Closes the connection (HTTP DELETE). Sessions live on on the server;
    /// an embedded server keeps running; [`open`](Self::open) starts a new
    /// connection. Idempotent: `Ok(())` when not connected.
    ///
    /// # Errors
    /// None today: a DELETE that fails is logged (the server closes idle
    /// connections itself); the `Result` leaves room for reporting it.
    pub async fn close(&self) -> Result<(), Error> {
        let _lifecycle = self.shared.lifecycle.lock().await;
        let live = self.shared.live.lock().take();
        if let Some(mut live) = live {
            live.close().await;
        }
        Ok(())
    }

    /// The old name of [`close`](Self::close).
    ///
    /// # Errors
    /// As [`close`](Self::close).
    #[deprecated(since = "0.2.0", note = "renamed to `close`")]
    pub async fn disconnect(&self) -> Result<(), Error> {
        self.close().await
    }

    /// Whether a connection is live.
    pub fn is_connected(&self) -> bool {
        self.shared.live.lock().as_ref().is_some_and(Live::is_alive)
    }

    /// Closes the connection and stops an embedded server (SIGTERM, then
    /// SIGKILL after the grace period), waiting without blocking; for every
    /// clone of this client. Later calls fail with [`Error::Disposed`].
    /// Idempotent.
    pub async fn shutdown(&self) {
        let shared = &self.shared;
        let _lifecycle = shared.lifecycle.lock().await;
        shared.disposed.store(true, Ordering::Release);
        let live = shared.live.lock().take();
        if let Some(mut live) = live {
            live.close().await;
        }
        let server = shared.server.lock().take();
        if let Some(mut server) = server {
            server.stop().await;
        }
    }

    /// The old name of [`shutdown`](Self::shutdown).
    #[deprecated(since = "0.2.0", note = "renamed to `shutdown`")]
    pub async fn dispose(&self) {
        self.shutdown().await;
    }

    /// The client-wide event stream, once: the first call (on any clone)
    /// takes it, later calls get `None`. See [`Events`].
    ///
    /// Permission requests (without a
    /// [`permission_handler`](ClientOptions::permission_handler), and
    /// outside a [`prompt_stream`](Self::prompt_stream) turn) arrive here.
    /// Read it *while* a turn runs, not only after
    /// [`prompt`](Self::prompt) returned: a permission request nobody takes
    /// from here within
    /// [`unread_permission_timeout`](ClientOptions::unread_permission_timeout)
    /// (30 s by default) is answered "cancelled", with a warning in the
    /// log, also when this was never called.
    pub fn take_events(&self) -> Option<Events> {
        self.shared.events.lock().take()
    }

    /// The agent id this client is bound to.
    pub fn agent(&self) -> &str {
        &self.agent
    }

    /// The server's base URL (in embedded mode `http://127.0.0.1:PORT`).
    pub fn base_url(&self) -> &str {
        &self.shared.base_url
    }

    /// The embedded server's process id; `None` in server mode.
    pub fn server_pid(&self) -> Option<u32> {
        self.shared.server_pid
    }

    /// The embedded server's last log lines (with
    /// [`ServerLogs::Capture`](crate::ServerLogs::Capture)); `None` in
    /// server mode or after shutdown.
    pub fn server_logs(&self) -> Option<String> {
        self.shared
            .server
            .lock()
            .as_ref()
            .map(EmbeddedServer::stderr_text)
    }

    /// The server's id of the live connection (`x-acp-connection-id`).
    pub fn connection_id(&self) -> Option<String> {
        self.shared
            .live
            .lock()
            .as_ref()
            .and_then(Live::connection_id)
    }

    /// The agent's answer to this connection's `initialize`: protocol
    /// version, `agent_info`, capabilities (with the server's extension
    /// block in `agent_capabilities.meta["sandboxagent.dev"]`). `None` when
    /// not connected.
    pub fn initialize_result(&self) -> Option<InitializeResponse> {
        self.shared
            .live
            .lock()
            .as_ref()
            .filter(|live| live.is_alive())
            .map(|live| live.initialize.clone())
    }

    /// The `_sandboxagent/*` methods the server answers, as it advertised
    /// them in this connection's `initialize` result
    /// (`agentCapabilities._meta["sandboxagent.dev"].extensions.methods`);
    /// empty when not connected.
    pub fn extension_methods(&self) -> Vec<String> {
        let Some(capabilities) = self
            .initialize_result()
            .and_then(|result| serde_json::to_value(result.agent_capabilities).ok())
        else {
            return Vec::new();
        };
        ext_methods::advertised_methods(&capabilities)
    }
}
