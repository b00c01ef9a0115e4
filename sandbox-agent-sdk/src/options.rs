//! [`ClientOptions`]: which agent, which server (or an embedded one), and
//! how the client behaves.

use crate::error::Error;
use crate::event::{PermissionDecision, PermissionHandler};
use crate::question::QuestionHandler;
pub use acp_http_client::Transport;
use agent_client_protocol::v1::schema::{
    ClientCapabilities, CreateElicitationRequest, ElicitationAction, ElicitationCapabilities,
    ElicitationFormCapabilities, ElicitationUrlCapabilities, RequestPermissionRequest,
};
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Default limit for an embedded server to become ready
/// (research/contract.md, "The SDK and `sandbox-agent prompt`", embedded mode).
pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(15);

/// Default limit for a permission request that nobody reads (see
/// [`ClientOptions::unread_permission_timeout`]).
pub const DEFAULT_UNREAD_PERMISSION_TIMEOUT: Duration = Duration::from_secs(30);

/// Default limit for a question of the agent that nobody reads (see
/// [`ClientOptions::unread_question_timeout`]).
pub const DEFAULT_UNREAD_QUESTION_TIMEOUT: Duration = Duration::from_secs(30);

/// Default time an embedded server gets between SIGTERM and SIGKILL.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// How the client reaches a server.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Mode {
    /// Server mode when a base URL is set, embedded mode otherwise.
    #[default]
    Auto,
    /// Talk to the server at the base URL; without one,
    /// [`connect`](crate::SandboxAgentClient::connect) fails with
    /// [`Error::InvalidOptions`].
    Server,
    /// Start a private `sandbox-agent server` (a child process on a free
    /// loopback port with a random token); a base URL is an
    /// [`Error::InvalidOptions`].
    Embedded,
}

/// Where an embedded server's log output (its stderr) goes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ServerLogs {
    /// Kept in memory (the last 200 lines) and shown in start-up errors.
    #[default]
    Capture,
    /// Written to this process's stderr.
    Inherit,
}

/// Everything [`SandboxAgentClient::connect`](crate::SandboxAgentClient::connect)
/// needs. Build with [`ClientOptions::new`] and the builder methods.
///
/// ```
/// use sandbox_agent_sdk::{ClientOptions, Mode};
/// use std::time::Duration;
///
/// // Embedded: start a private server (the default without a base URL).
/// let embedded = ClientOptions::new("mock").startup_timeout(Duration::from_secs(30));
/// // Server mode: a running server, with its token.
/// let remote = ClientOptions::new("codex")
///     .base_url("http://10.0.0.5:2468")
///     .token("secret")
///     .mode(Mode::Server);
/// # let _ = (embedded, remote);
/// ```
#[derive(Clone)]
pub struct ClientOptions {
    pub(crate) agent: String,
    pub(crate) base_url: Option<String>,
    pub(crate) token: Option<String>,
    pub(crate) mode: Mode,
    pub(crate) auto_connect: bool,
    pub(crate) client_name: String,
    pub(crate) client_version: String,
    pub(crate) request_timeout: Option<Duration>,
    pub(crate) permission_handler: Option<PermissionHandler>,
    pub(crate) unread_permission_timeout: Duration,
    pub(crate) question_handler: Option<QuestionHandler>,
    pub(crate) unread_question_timeout: Duration,
    /// `clientCapabilities` of `initialize` as the caller gave them.
    pub(crate) client_capabilities: ClientCapabilities,
    /// The elicitation modes declared when `client_capabilities` names
    /// none; `None`: none.
    pub(crate) elicitation: Option<ElicitationCapabilities>,
    pub(crate) transport: Transport,
    /// How the event stream is reopened after a drop (the default
    /// transport and `AcpHttp`).
    pub(crate) reconnect: acp_http_client::ReconnectPolicy,
    pub(crate) embedded: EmbeddedSettings,
}

/// Settings of embedded mode.
#[derive(Debug, Clone)]
pub(crate) struct EmbeddedSettings {
    /// The binary; `None`: look it up (see [`ClientOptions::binary`]).
    pub(crate) binary: Option<PathBuf>,
    pub(crate) startup_timeout: Duration,
    pub(crate) shutdown_grace: Duration,
    /// Extra `sandbox-agent server` arguments.
    pub(crate) args: Vec<OsString>,
    /// Extra environment variables of the server.
    pub(crate) env: Vec<(OsString, OsString)>,
    pub(crate) logs: ServerLogs,
}

impl ClientOptions {
    /// Options for the agent with id `agent` (for example `mock`, `codex`,
    /// `claude`): it is named in `initialize` and every `session/new`
    /// (`_meta["sandboxagent.dev"].agent`). Defaults: [`Mode::Auto`] with no
    /// base URL (embedded mode), auto-connect on, no request timeout, no
    /// permission or question handler, unread permission requests answered
    /// "cancelled" after [`DEFAULT_UNREAD_PERMISSION_TIMEOUT`], unread
    /// questions "cancel" after [`DEFAULT_UNREAD_QUESTION_TIMEOUT`], both
    /// elicitation modes declared ([`elicitation`](Self::elicitation)).
    pub fn new(agent: impl Into<String>) -> ClientOptions {
        ClientOptions {
            agent: agent.into(),
            base_url: None,
            token: None,
            mode: Mode::Auto,
            auto_connect: true,
            client_name: env!("CARGO_PKG_NAME").to_owned(),
            client_version: env!("CARGO_PKG_VERSION").to_owned(),
            request_timeout: None,
            permission_handler: None,
            unread_permission_timeout: DEFAULT_UNREAD_PERMISSION_TIMEOUT,
            question_handler: None,
            unread_question_timeout: DEFAULT_UNREAD_QUESTION_TIMEOUT,
            client_capabilities: ClientCapabilities::new(),
            elicitation: Some(
                ElicitationCapabilities::new()
                    .form(ElicitationFormCapabilities::new())
                    .url(ElicitationUrlCapabilities::new()),
            ),
            transport: Transport::Http,
            reconnect: acp_http_client::ReconnectPolicy::default(),
            embedded: EmbeddedSettings {
                binary: None,
                startup_timeout: DEFAULT_STARTUP_TIMEOUT,
                shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
                args: Vec::new(),
                env: Vec::new(),
                logs: ServerLogs::Capture,
            },
        }
    }

    /// The wire to the server (research/contract.md, "The SDK and
    /// `sandbox-agent prompt`"). Default [`Transport::Http`]: POST on
    /// `/v2/rpc` and a Server-Sent Events stream that resumes after a drop,
    /// so no answer or update is lost. [`Transport::WebSocket`]: one
    /// WebSocket on `/acp`, lower latency, but it cannot resume: a dropped
    /// socket ends the connection and the calls in flight fail
    /// ([`Error::is_connection_lost`]); the sessions live on for
    /// `load_session` on a new connection ([`open`](crate::SandboxAgentClient::open)).
    /// `http://` base URLs only for WebSocket. [`Transport::AcpHttp`]: the
    /// ACP transports RFD's Streamable HTTP on `/acp` (resumable like the
    /// default, but [`close`](crate::SandboxAgentClient::close) ends the
    /// sessions only this client was attached to).
    pub fn transport(mut self, transport: Transport) -> Self {
        self.transport = transport;
        self
    }

    /// Base URL of a running server, e.g. `http://127.0.0.1:2468` (a path
    /// prefix such as `https://host/sandbox/` is kept). Selects server mode
    /// under [`Mode::Auto`].
    pub fn base_url(mut self, url: impl Into<String>) -> Self {
        self.base_url = Some(url.into());
        self
    }

    /// Bearer token of a running server (`--token`). Ignored in embedded
    /// mode, which makes its own.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Forces server or embedded mode (default [`Mode::Auto`]).
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Whether [`connect`](crate::SandboxAgentClient::connect) also opens the
    /// connection to the agent (sends `initialize`). Default `true`; with
    /// `false`, call [`open`](crate::SandboxAgentClient::open) yourself.
    pub fn auto_connect(mut self, auto_connect: bool) -> Self {
        self.auto_connect = auto_connect;
        self
    }

    /// `clientInfo` sent in `initialize`. Default: this crate's name and
    /// version.
    pub fn client_info(mut self, name: impl Into<String>, version: impl Into<String>) -> Self {
        self.client_name = name.into();
        self.client_version = version.into();
        self
    }

    /// How the event stream is reopened after it drops (the default
    /// transport and [`Transport::AcpHttp`]; a WebSocket is not reopened).
    /// Default [`ReconnectPolicy::default`](crate::ReconnectPolicy):
    /// 10 attempts, 250 ms doubling to 10 s apart (about a minute). When
    /// the attempts run out (or the server answers that the connection is
    /// gone, as a restarted server does) the connection ends:
    /// [`Event::ConnectionClosed`](crate::Event::ConnectionClosed), and the
    /// calls in flight fail. A client that must notice a dead server soon
    /// (`sandbox-agent prompt`: within 5 s) gives fewer attempts.
    pub fn reconnect(mut self, policy: acp_http_client::ReconnectPolicy) -> Self {
        self.reconnect = policy;
        self
    }

    /// Limit on each call to the server: a JSON-RPC request on the
    /// connection (including a whole [`prompt`](crate::SandboxAgentClient::prompt)
    /// turn) and a control-plane route. A call over the limit fails with
    /// [`Error::Timeout`] ([`Error::is_timeout`]). Default: no limit
    /// ([`no_request_timeout`](Self::no_request_timeout)), as a prompt turn
    /// may run for many minutes.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = Some(timeout);
        self
    }

    /// No limit on calls (the default): a prompt turn runs as long as the
    /// agent takes.
    pub fn no_request_timeout(mut self) -> Self {
        self.request_timeout = None;
        self
    }

    /// How long a permission request of the agent may wait for a reader
    /// when no [`permission_handler`](Self::permission_handler) is set.
    /// Default [`DEFAULT_UNREAD_PERMISSION_TIMEOUT`] (30 s).
    ///
    /// Such a request goes to the turn's
    /// [`TurnStream`](crate::TurnStream) when the turn runs through
    /// [`prompt_stream`](crate::SandboxAgentClient::prompt_stream), else to
    /// [`Events`](crate::Events). If nobody takes it from there within
    /// `limit` (the stream is not read, or
    /// [`take_events`](crate::SandboxAgentClient::take_events) was never
    /// called) it is answered "cancelled" and a warning is logged
    /// (`tracing`), so a turn cannot hang waiting for an answer nobody will
    /// give; the agent then usually ends the turn with stop reason
    /// `cancelled`. A request taken in time waits for its answer as long as
    /// it is held.
    pub fn unread_permission_timeout(mut self, limit: Duration) -> Self {
        self.unread_permission_timeout = limit;
        self
    }

    /// Answers every permission request of the agent
    /// (`session/request_permission`) with `handler`'s decision. The
    /// handler wins over the event stream: with one set, permission
    /// requests are not delivered as [`Event::PermissionRequest`](crate::Event::PermissionRequest).
    /// It runs on a task of its own, so it may call the client.
    ///
    /// ```
    /// use sandbox_agent_sdk::{ClientOptions, PermissionDecision};
    /// let options = ClientOptions::new("mock")
    ///     .permission_handler(|_request| async { PermissionDecision::Allow });
    /// # let _ = options;
    /// ```
    pub fn permission_handler<F, Fut>(mut self, handler: F) -> Self
    where
        F: Fn(RequestPermissionRequest) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = PermissionDecision> + Send + 'static,
    {
        self.permission_handler = Some(Arc::new(move |request| Box::pin(handler(request))));
        self
    }

    /// `clientCapabilities` sent in `initialize` (ACP
    /// `ClientCapabilities`: `fs`, `terminal`, `auth`, `elicitation`, …).
    /// Default: none but elicitation. When `capabilities` declares no
    /// `elicitation`, the one of [`elicitation`](Self::elicitation) is
    /// added; one it declares is kept as it is.
    ///
    /// Declare only what this client answers: the server hands the
    /// agent's file and terminal requests to connections that declared
    /// `fs` / `terminal` (research/contract.md, "Routing: connections,
    /// sessions, one agent process").
    pub fn client_capabilities(mut self, capabilities: ClientCapabilities) -> Self {
        self.client_capabilities = capabilities;
        self
    }

    /// The elicitation modes declared in `initialize`
    /// (`clientCapabilities.elicitation`), unless
    /// [`client_capabilities`](Self::client_capabilities) declares its own.
    /// Default both, `{"form": {}, "url": {}}`: questions of the agent come
    /// as [`Event::Question`](crate::Event::Question) /
    /// [`TurnEvent::Question`](crate::TurnEvent::Question) (or go to the
    /// [`question_handler`](Self::question_handler)). `None` declares
    /// none: the server then sends this connection no question (ACP
    /// elicitation: an agent asks only clients that declared the mode).
    ///
    /// ```
    /// use sandbox_agent_sdk::ClientOptions;
    /// use sandbox_agent_sdk::schema::{ElicitationCapabilities, ElicitationFormCapabilities};
    /// // Forms only; or `.elicitation(None)` for no questions at all.
    /// let options = ClientOptions::new("mock")
    ///     .elicitation(ElicitationCapabilities::new().form(ElicitationFormCapabilities::new()));
    /// # let _ = options;
    /// ```
    pub fn elicitation(mut self, modes: impl Into<Option<ElicitationCapabilities>>) -> Self {
        self.elicitation = modes.into();
        self
    }

    /// How long a question of the agent (`elicitation/create`) may wait
    /// for a reader when no [`question_handler`](Self::question_handler)
    /// is set. Default [`DEFAULT_UNREAD_QUESTION_TIMEOUT`] (30 s). The
    /// same rule as [`unread_permission_timeout`](Self::unread_permission_timeout):
    /// a question nobody takes from its stream (the turn's
    /// [`TurnStream`](crate::TurnStream) for a question of a session whose
    /// turn runs there, else [`Events`](crate::Events)) within `limit` is
    /// answered "cancel", with a `tracing` warning, and not handed out
    /// afterwards. A question taken in time waits for its answer as long
    /// as it is held.
    pub fn unread_question_timeout(mut self, limit: Duration) -> Self {
        self.unread_question_timeout = limit;
        self
    }

    /// Answers every question of the agent (`elicitation/create`) with
    /// `handler`'s ACP action (`ElicitationAction::Accept` with content,
    /// `Decline`, `Cancel`). An accept's content is checked against the
    /// question as [`QuestionRequest::accept`](crate::QuestionRequest::accept)
    /// does; content that does not fit is not sent, a warning is logged
    /// and the question is answered "cancel". With a handler set, questions
    /// are not delivered as events. It runs on a task of its own, so it may
    /// call the client.
    ///
    /// ```
    /// use sandbox_agent_sdk::ClientOptions;
    /// use sandbox_agent_sdk::schema::ElicitationAction;
    /// let options = ClientOptions::new("mock")
    ///     .question_handler(|_question| async { ElicitationAction::Decline });
    /// # let _ = options;
    /// ```
    pub fn question_handler<F, Fut>(mut self, handler: F) -> Self
    where
        F: Fn(CreateElicitationRequest) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ElicitationAction> + Send + 'static,
    {
        self.question_handler = Some(Arc::new(move |request| Box::pin(handler(request))));
        self
    }

    /// Embedded mode: starts the `sandbox-agent` binary at `path` (its
    /// `server` subcommand) instead of looking for one. Without this call
    /// the binary is looked up, in this order: `$SANDBOX_AGENT_BIN` (when
    /// set, it must exist: a path that does not is
    /// [`Error::BinaryNotFound`], not a fallback), `sandbox-agent` next to
    /// the current executable (and one directory up when that is a cargo
    /// `deps` or `examples` directory, then in the other of cargo's
    /// `debug` and `release` directories, so a debug program finds
    /// `target/release/sandbox-agent`), then `sandbox-agent` on `PATH`.
    pub fn binary(mut self, path: impl Into<PathBuf>) -> Self {
        self.embedded.binary = Some(path.into());
        self
    }

    /// Embedded mode: how long the server may take to print its listening
    /// line and answer `GET /v2/health`. Default 15 s.
    pub fn startup_timeout(mut self, timeout: Duration) -> Self {
        self.embedded.startup_timeout = timeout;
        self
    }

    /// Embedded mode: time between SIGTERM and SIGKILL when the server is
    /// stopped ([`shutdown`](crate::SandboxAgentClient::shutdown), or dropping the last clone).
    /// Default 5 s. The server gets 40 % of it to stop its agents
    /// (`--shutdown-grace-ms`).
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.embedded.shutdown_grace = grace;
        self
    }

    /// Embedded mode: an extra `sandbox-agent server` argument (for example
    /// `--agent-command`). Repeat for several.
    pub fn server_arg(mut self, arg: impl Into<OsString>) -> Self {
        self.embedded.args.push(arg.into());
        self
    }

    /// Embedded mode: an extra environment variable of the server (for
    /// example `SANDBOX_AGENT_DATA_DIR` or an agent's API key).
    pub fn server_env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.embedded.env.push((key.into(), value.into()));
        self
    }

    /// Embedded mode: where the server's logs go. Default
    /// [`ServerLogs::Capture`].
    pub fn server_logs(mut self, logs: ServerLogs) -> Self {
        self.embedded.logs = logs;
        self
    }

    /// The agent id.
    pub fn agent(&self) -> &str {
        &self.agent
    }

    /// The `clientCapabilities` of `initialize`: the caller's, with the
    /// elicitation modes added when they name none.
    pub(crate) fn declared_capabilities(&self) -> ClientCapabilities {
        let mut capabilities = self.client_capabilities.clone();
        if capabilities.elicitation.is_none() {
            capabilities.elicitation = self.elicitation.clone();
        }
        capabilities
    }

    /// The base URL of a running server, when one is set; `None` means
    /// embedded mode (unless [`Mode::Server`] is forced, which then fails).
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] when the mode and the base URL disagree or
    /// the agent id is empty.
    pub(crate) fn resolve_mode(&self) -> Result<Option<&str>, Error> {
        if self.agent.trim().is_empty() {
            return Err(Error::InvalidOptions("the agent id is empty".to_owned()));
        }
        match (self.mode, self.base_url.as_deref()) {
            (Mode::Auto, url) => Ok(url),
            (Mode::Server, Some(url)) => Ok(Some(url)),
            (Mode::Server, None) => Err(Error::InvalidOptions(
                "server mode needs a base URL (ClientOptions::base_url)".to_owned(),
            )),
            (Mode::Embedded, None) => Ok(None),
            (Mode::Embedded, Some(url)) => Err(Error::InvalidOptions(format!(
                "embedded mode starts its own server, but a base URL ({url}) was given"
            ))),
        }
    }
}

impl std::fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientOptions")
            .field("agent", &self.agent)
            .field("base_url", &self.base_url)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("mode", &self.mode)
            .field("auto_connect", &self.auto_connect)
            .field("client_name", &self.client_name)
            .field("request_timeout", &self.request_timeout)
            .field("permission_handler", &self.permission_handler.is_some())
            .field("unread_permission_timeout", &self.unread_permission_timeout)
            .field("question_handler", &self.question_handler.is_some())
            .field("unread_question_timeout", &self.unread_question_timeout)
            .field("client_capabilities", &self.declared_capabilities())
            .field("embedded", &self.embedded)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_resolve_or_refuse() {
        let auto = ClientOptions::new("mock");
        assert!(matches!(auto.resolve_mode(), Ok(None)));
        let auto = auto.base_url("http://h:1");
        assert!(matches!(auto.resolve_mode(), Ok(Some("http://h:1"))));
        assert!(matches!(
            auto.clone().mode(Mode::Embedded).resolve_mode(),
            Err(Error::InvalidOptions(_))
        ));
        assert!(matches!(
            ClientOptions::new("mock").mode(Mode::Server).resolve_mode(),
            Err(Error::InvalidOptions(_))
        ));
        assert!(matches!(
            ClientOptions::new(" ").resolve_mode(),
            Err(Error::InvalidOptions(_))
        ));
    }

    #[test]
    fn elicitation_is_declared_unless_refused_or_given() -> Result<(), serde_json::Error> {
        let declared = |options: ClientOptions| {
            serde_json::to_value(options.declared_capabilities())
                .map(|caps| caps["elicitation"].clone())
        };
        let both = serde_json::json!({"form": {}, "url": {}});
        assert_eq!(declared(ClientOptions::new("mock"))?, both);
        assert_eq!(
            declared(ClientOptions::new("mock").elicitation(None))?,
            serde_json::Value::Null
        );
        // Other capabilities are kept, and the elicitation added to them.
        let with_fs = ClientOptions::new("mock")
            .client_capabilities(ClientCapabilities::new().terminal(true));
        let caps = serde_json::to_value(with_fs.declared_capabilities())?;
        assert_eq!(caps["terminal"], true);
        assert_eq!(caps["elicitation"], both);
        // Their own elicitation wins.
        let form_only = ElicitationCapabilities::new().form(ElicitationFormCapabilities::new());
        let own = ClientOptions::new("mock")
            .client_capabilities(ClientCapabilities::new().elicitation(form_only));
        assert_eq!(declared(own)?, serde_json::json!({"form": {}}));
        Ok(())
    }

    #[test]
    fn debug_hides_the_token() {
        let options = ClientOptions::new("mock").token("very-secret");
        assert!(!format!("{options:?}").contains("very-secret"));
    }
}
