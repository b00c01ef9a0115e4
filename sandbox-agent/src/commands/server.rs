//! `sandbox-agent server`: the runtime itself, `acp_runtime::server::run`
//! with the settings from the command line.

use super::args::CatalogArgs;
use acp_runtime::config::{self, ProcessLimits, ServerConfig};
use clap::Args;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

/// `sandbox-agent server`. Every option also reads an environment variable.
#[derive(Debug, Clone, Args)]
pub struct ServerArgs {
    /// Address to listen on.
    #[arg(long, env = "SANDBOX_AGENT_HOST", default_value_t = config::DEFAULT_HOST)]
    pub host: IpAddr,
    /// Port to listen on; 0 picks a free port (printed on stdout).
    #[arg(long, env = "SANDBOX_AGENT_PORT", default_value_t = config::DEFAULT_PORT)]
    pub port: u16,
    /// Bearer token required on every /v2 route except /v2/health.
    #[arg(
        long,
        env = "SANDBOX_AGENT_TOKEN",
        hide_env_values = true,
        conflicts_with = "no_token"
    )]
    pub token: Option<String>,
    /// Run without authentication.
    #[arg(long, env = "SANDBOX_AGENT_NO_TOKEN")]
    pub no_token: bool,
    /// How long a request waits for the agent before 504, in milliseconds.
    #[arg(
        long,
        env = "SANDBOX_AGENT_ACP_REQUEST_TIMEOUT_MS",
        default_value_t = config::DEFAULT_REQUEST_TIMEOUT_MS
    )]
    pub request_timeout_ms: u64,
    /// Timeout for session/prompt in milliseconds; unset: prompts never time out.
    #[arg(long, env = "SANDBOX_AGENT_PROMPT_TIMEOUT_MS")]
    pub prompt_timeout_ms: Option<u64>,
    /// Events kept per connection for Last-Event-ID replay.
    #[arg(
        long,
        env = "SANDBOX_AGENT_REPLAY_BUFFER",
        default_value_t = config::DEFAULT_REPLAY_BUFFER_EVENTS
    )]
    pub replay_buffer: usize,
    /// Bytes kept per connection for replay (oldest events dropped first).
    #[arg(
        long,
        env = "SANDBOX_AGENT_REPLAY_BUFFER_BYTES",
        default_value_t = config::DEFAULT_REPLAY_BUFFER_BYTES
    )]
    pub replay_buffer_bytes: usize,
    /// Interval of SSE heartbeat comments, in milliseconds.
    #[arg(long, env = "SANDBOX_AGENT_HEARTBEAT_MS", default_value_t = config::DEFAULT_HEARTBEAT_MS)]
    pub heartbeat_ms: u64,
    /// Largest request body in bytes (413 past it).
    #[arg(
        long,
        env = "SANDBOX_AGENT_MAX_BODY_BYTES",
        default_value_t = config::DEFAULT_MAX_BODY_BYTES
    )]
    pub max_body_bytes: usize,
    /// Longest agent stdout line in bytes; longer lines are reported and dropped.
    #[arg(
        long,
        env = "SANDBOX_AGENT_MAX_LINE_BYTES",
        default_value_t = config::DEFAULT_MAX_LINE_BYTES
    )]
    pub max_line_bytes: usize,
    /// Most open connections (503 past it).
    #[arg(
        long,
        env = "SANDBOX_AGENT_MAX_CONNECTIONS",
        default_value_t = config::DEFAULT_MAX_CONNECTIONS
    )]
    pub max_connections: usize,
    /// Longest a client may take to send a request's headers, and then its
    /// body, in milliseconds (408 past it for a body).
    #[arg(
        long,
        env = "SANDBOX_AGENT_READ_TIMEOUT_MS",
        default_value_t = config::DEFAULT_READ_TIMEOUT_MS
    )]
    pub read_timeout_ms: u64,
    /// Most TCP connections served at once; past it a new one gets 503 and is
    /// closed. Capped by the open-file limit, less room for agent processes.
    #[arg(
        long,
        env = "SANDBOX_AGENT_MAX_HTTP_CONNECTIONS",
        default_value_t = config::DEFAULT_MAX_HTTP_CONNECTIONS
    )]
    pub max_http_connections: usize,
    /// Close connections idle (no stream, no request) this long, in milliseconds.
    #[arg(
        long,
        env = "SANDBOX_AGENT_IDLE_TIMEOUT_MS",
        default_value_t = config::DEFAULT_IDLE_TIMEOUT_MS
    )]
    pub idle_timeout_ms: u64,
    /// Origins allowed by CORS (repeat or comma-separate; "*" for any). Off by default.
    #[arg(long, env = "SANDBOX_AGENT_CORS_ALLOW_ORIGIN", value_delimiter = ',')]
    pub cors_allow_origin: Vec<String>,
    /// Serve GET /metrics without the bearer token (for a Prometheus that
    /// cannot send one; keep the port off untrusted networks).
    #[arg(long, env = "SANDBOX_AGENT_METRICS_PUBLIC")]
    pub metrics_public: bool,
    /// Record no metrics and answer GET /metrics with 404 (the baseline
    /// the benchmarks compare against; recording costs an atomic add).
    #[arg(
        long,
        env = "SANDBOX_AGENT_NO_METRICS",
        conflicts_with = "metrics_public"
    )]
    pub no_metrics: bool,
    /// Host names served on a loopback connection besides localhost,
    /// 127.0.0.1 and [::1] (repeat or comma-separate; NAME for any port,
    /// NAME:PORT for one): for a proxy in front that keeps its own Host.
    /// Other names are refused there with 403 (DNS rebinding protection).
    #[arg(long, env = "SANDBOX_AGENT_ALLOWED_HOST", value_delimiter = ',')]
    pub allowed_host: Vec<String>,
    /// Time agents get between SIGTERM and SIGKILL at shutdown, in milliseconds.
    #[arg(
        long,
        env = "SANDBOX_AGENT_SHUTDOWN_GRACE_MS",
        default_value_t = config::DEFAULT_SHUTDOWN_GRACE_MS
    )]
    pub shutdown_grace_ms: u64,
    /// Events kept in each session's event log (GET /v2/sessions/{id}/events).
    #[arg(
        long,
        env = "SANDBOX_AGENT_EVENT_LOG_EVENTS",
        default_value_t = config::DEFAULT_EVENT_LOG_EVENTS
    )]
    pub event_log_events: usize,
    /// Bytes kept in each session's event log.
    #[arg(
        long,
        env = "SANDBOX_AGENT_EVENT_LOG_BYTES",
        default_value_t = config::DEFAULT_EVENT_LOG_BYTES
    )]
    pub event_log_bytes: usize,
    /// Bytes every session's event log and every connection's replay ring
    /// may hold together; past it the oldest events in memory are evicted,
    /// ended and dormant sessions' first (with a store they stay readable
    /// from it).
    #[arg(
        long,
        env = "SANDBOX_AGENT_MEMORY_BUDGET_BYTES",
        default_value_t = config::DEFAULT_MEMORY_BUDGET_BYTES
    )]
    pub memory_budget_bytes: usize,
    /// Ended sessions kept in the inventory and the store, dormant ones (restored
    /// after a restart, not loaded since) counted with them; the oldest are
    /// forgotten first.
    #[arg(
        long,
        env = "SANDBOX_AGENT_ENDED_SESSIONS",
        default_value_t = config::DEFAULT_ENDED_SESSIONS
    )]
    pub ended_sessions: usize,
    /// Where sessions and their event logs are kept, so a restart loses no
    /// history: `sqlite:PATH`, `postgres://USER[:PASSWORD]@HOST[:PORT]/DB`
    /// (a fleet: sandboxes come and go, their history stays; TLS as libpq:
    /// `?sslmode=verify-full&sslrootcert=CA.pem`, default sslmode=prefer),
    /// or `memory` (nothing written). Default: sqlite:<data-dir>/sessions.db.
    #[arg(
        long,
        env = "SANDBOX_AGENT_STORE",
        hide_env_values = true,
        value_name = "URL",
        value_parser = acp_runtime::store::StoreUrl::parse
    )]
    pub store: Option<acp_runtime::store::StoreUrl>,
    /// The id this runtime's rows carry in the store. A new sandbox started
    /// with the id of an old one (and the same PostgreSQL) sees the old
    /// one's sessions. Default: the id in <data-dir>/runtime-id, made on the
    /// first start.
    #[arg(long, env = "SANDBOX_AGENT_RUNTIME_ID", value_name = "ID")]
    pub runtime_id: Option<String>,
    /// After _sandboxagent/session/terminate, how long the agent gets to end
    /// the turn before the runtime answers the prompt itself, in milliseconds.
    #[arg(
        long,
        env = "SANDBOX_AGENT_TERMINATE_GRACE_MS",
        default_value_t = config::DEFAULT_TERMINATE_GRACE_MS
    )]
    pub terminate_grace_ms: u64,
    /// Threads of the async runtime. 1 (the default) runs everything on one
    /// thread: the server relays I/O, and on a small machine one thread
    /// avoids cross-thread wake-ups on every message (research/benchmarks.md).
    #[arg(long, env = "SANDBOX_AGENT_WORKER_THREADS", default_value_t = 1)]
    pub worker_threads: usize,
    /// Agent sources and the data dir.
    #[command(flatten)]
    pub catalog: CatalogArgs,
    /// Never install an agent on first use: `initialize` for one that is not
    /// installed fails with 409 agent-not-installed.
    #[arg(long, env = "SANDBOX_AGENT_REQUIRE_PREINSTALL")]
    pub require_preinstall: bool,
    /// Longest an agent install may take, in milliseconds. npm's network
    /// retries and timeouts come from npm_config_fetch_retries,
    /// npm_config_fetch_timeout, … in the environment (defaults: 2 retries
    /// 1-4 s apart, 60 s per request), so an unreachable registry fails in
    /// seconds.
    #[arg(
        long,
        env = "SANDBOX_AGENT_INSTALL_TIMEOUT_MS",
        default_value_t = config::DEFAULT_INSTALL_TIMEOUT_MS
    )]
    pub install_timeout_ms: u64,
    /// After a failed install of an agent, how long initialize answers with
    /// that failure instead of installing it again, in milliseconds (an
    /// explicit install retries at once).
    #[arg(
        long,
        env = "SANDBOX_AGENT_INSTALL_RETRY_BACKOFF_MS",
        default_value_t = config::DEFAULT_INSTALL_RETRY_BACKOFF_MS
    )]
    pub install_retry_backoff_ms: u64,
    /// Shut down gracefully when stdin reaches end of file. A parent that
    /// holds a pipe to the server's stdin stops it by closing the pipe, or by
    /// dying in any way, SIGKILL included (the SDK's embedded mode does this).
    #[arg(long)]
    pub exit_on_stdin_eof: bool,
    /// Confine the file system API (/v2/fs/*, _sandboxagent/fs/*) to this
    /// directory: every path must resolve, symlinks followed, inside it (403
    /// otherwise). Without it the API reaches what the server's user can.
    #[arg(long, env = "SANDBOX_AGENT_FS_ROOT", value_name = "DIR")]
    pub fs_root: Option<PathBuf>,
    /// Largest upload body as sent, in bytes: a file (PUT /v2/fs/file) or an
    /// upload-batch archive, compressed or not (413 past it).
    #[arg(
        long,
        env = "SANDBOX_AGENT_MAX_UPLOAD_BYTES",
        default_value_t = config::DEFAULT_MAX_UPLOAD_BYTES
    )]
    pub max_upload_bytes: u64,
    /// Most bytes of file content one upload-batch archive may unpack to
    /// (413 past it): what stops a small gzip that inflates to fill the disk.
    #[arg(
        long,
        env = "SANDBOX_AGENT_MAX_UNPACKED_BYTES",
        default_value_t = config::DEFAULT_MAX_UNPACKED_BYTES
    )]
    pub max_unpacked_bytes: u64,
    /// The agent a client of bare /acp gets when its initialize names none in
    /// params._meta["sandboxagent.dev"].agent (an official ACP SDK pointed at
    /// /acp). Without it such a client must use /acp/{agent}.
    #[arg(long, env = "SANDBOX_AGENT_DEFAULT_AGENT", value_name = "ID")]
    pub default_agent: Option<String>,
    /// Turn the process API off (/v2/processes…: 404 on every route).
    #[arg(long, env = "SANDBOX_AGENT_NO_PROCESSES")]
    pub no_processes: bool,
    /// Most processes of the process API running at once (429 past it).
    #[arg(
        long,
        env = "SANDBOX_AGENT_MAX_PROCESSES",
        default_value_t = ProcessLimits::default().max_running
    )]
    pub max_processes: usize,
    /// Output kept per process, in bytes: a ring; older bytes are dropped
    /// and reported as `dropped` to a reader that asks for them.
    #[arg(
        long,
        env = "SANDBOX_AGENT_PROCESS_OUTPUT_BYTES",
        default_value_t = ProcessLimits::default().output_bytes
    )]
    pub process_output_bytes: usize,
    /// Exited processes kept for reading; past it the oldest is forgotten.
    #[arg(
        long,
        env = "SANDBOX_AGENT_KEPT_PROCESSES",
        default_value_t = ProcessLimits::default().kept_exited
    )]
    pub kept_processes: usize,
    /// Run agents and processes as this user (a name or a uid) when the
    /// server runs as root: its uid, primary group and supplementary
    /// groups, HOME the agent's home in the data dir (owned by the user),
    /// and no access to the data dir's store or runtime id. Claude Code
    /// refuses to start a session as root without it.
    #[arg(long, env = "SANDBOX_AGENT_AGENT_USER", value_name = "USER")]
    pub agent_user: Option<String>,
    /// How log lines on stderr are written: `text` for a person, `json` (one
    /// object per line: `timestamp`, `level`, `target`, `fields`) for a log
    /// collector. The level comes from `RUST_LOG` (default `info`).
    #[arg(long, env = "SANDBOX_AGENT_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// The shape of the server's log lines (`--log-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One human-readable line per event (ANSI colours on a terminal).
    Text,
    /// One JSON object per line (tracing-subscriber's JSON format).
    Json,
}

impl ServerArgs {
    /// Validates the arguments into a [`ServerConfig`].
    ///
    /// # Errors
    /// A message for the user: no auth choice, a bad `--agent-command` or
    /// agents file, no data dir, a zero limit.
    pub fn into_config(self) -> Result<ServerConfig, String> {
        if self.token.is_none() && !self.no_token {
            return Err(
                "choose authentication: --token TOKEN (or SANDBOX_AGENT_TOKEN) to require a bearer token, or --no-token to run without one".to_owned(),
            );
        }
        if self.token.as_deref() == Some("") {
            return Err("--token must not be empty".to_owned());
        }
        if self.replay_buffer == 0
            || self.max_connections == 0
            || self.max_line_bytes == 0
            || self.max_http_connections == 0
        {
            return Err(
                "--replay-buffer, --max-connections, --max-http-connections and --max-line-bytes must be at least 1"
                    .to_owned(),
            );
        }
        let agents = self.catalog.agents()?;
        let data_dir = self.catalog.data_dir()?;
        if let Some(id) = &self.default_agent
            && !agents.contains_key(id)
        {
            let known: Vec<&str> = agents.keys().map(String::as_str).collect();
            return Err(format!(
                "--default-agent {id:?} is not a known agent (known agents: {})",
                known.join(", ")
            ));
        }
        let mut config = ServerConfig::new(SocketAddr::new(self.host, self.port), agents, data_dir);
        config.require_preinstall = self.require_preinstall;
        config.exit_on_stdin_eof = self.exit_on_stdin_eof;
        config.max_upload_bytes = self.max_upload_bytes;
        config.max_unpacked_bytes = self.max_unpacked_bytes;
        config.default_agent = self.default_agent;
        if let Some(root) = &self.fs_root {
            config.fs_root_as_given = std::path::absolute(root).ok();
            let root = root
                .canonicalize()
                .map_err(|error| format!("--fs-root {}: {error}", root.display()))?;
            if !root.is_dir() {
                return Err(format!("--fs-root {} is not a directory", root.display()));
            }
            config.fs_root = Some(root);
        }
        config.install_timeout = Duration::from_millis(self.install_timeout_ms.max(1));
        config.install_retry_backoff = Duration::from_millis(self.install_retry_backoff_ms);
        config.token = self.token;
        config.request_timeout = Duration::from_millis(self.request_timeout_ms);
        config.prompt_timeout = self.prompt_timeout_ms.map(Duration::from_millis);
        config.replay_buffer_events = self.replay_buffer;
        config.replay_buffer_bytes = self.replay_buffer_bytes;
        config.heartbeat = Duration::from_millis(self.heartbeat_ms.max(1));
        config.max_body_bytes = self.max_body_bytes;
        config.max_line_bytes = self.max_line_bytes;
        config.max_connections = self.max_connections;
        config.max_http_connections = self.max_http_connections;
        config.read_timeout = Duration::from_millis(self.read_timeout_ms.max(1));
        config.idle_timeout = Duration::from_millis(self.idle_timeout_ms);
        config.cors_allow_origins = self.cors_allow_origin;
        config.metrics_public = self.metrics_public;
        config.metrics = !self.no_metrics;
        for host in &self.allowed_host {
            config::check_allowed_host(host).map_err(|rule| format!("--allowed-host: {rule}"))?;
        }
        config.allowed_hosts = self.allowed_host;
        config.shutdown_grace = Duration::from_millis(self.shutdown_grace_ms);
        // Each agent runs under this binary's tree supervisor, which reaches
        // escapees before the server's own SIGKILL at the end of its grace.
        // `/proc/self/exe` runs this very binary even after an upgrade
        // replaced (or removed) the file it was started from.
        let own = std::path::Path::new("/proc/self/exe");
        let binary = if own.exists() {
            Some(own.to_owned())
        } else {
            std::env::current_exe().ok()
        };
        if let Some(spec) = &self.agent_user {
            if !nix::unistd::geteuid().is_root() {
                return Err(format!(
                    "--agent-user {spec}: the server must run as root to start agents as another user"
                ));
            }
            if config.token.is_none() {
                return Err(format!(
                    "--agent-user {spec} needs a token (--token or SANDBOX_AGENT_TOKEN): without one the agents' user could drive this root server's API (its file API reads and writes as root)"
                ));
            }
            config.agent_user = Some(acp_runtime::os::user::AgentUser::resolve(spec)?);
        }
        if config.agent_user.is_some() && binary.is_none() {
            return Err(
                "--agent-user needs the tree supervisor (this binary re-run), and the binary's path is unknown"
                    .to_owned(),
            );
        }
        config.tree_supervisor = binary.map(|binary| acp_runtime::os::tree::TreeSupervisor {
            binary,
            grace: config.shutdown_grace / 2,
            user: config.agent_user.clone(),
        });
        config.event_log_events = self.event_log_events.max(1);
        config.event_log_bytes = self.event_log_bytes;
        config.memory_budget_bytes = self.memory_budget_bytes;
        config.ended_sessions = self.ended_sessions;
        config.store = self.store;
        if let Some(id) = &self.runtime_id {
            acp_runtime::store::check_runtime_id(id)
                .map_err(|rule| format!("--runtime-id: {rule}"))?;
        }
        config.runtime_id = self.runtime_id;
        config.terminate_grace = Duration::from_millis(self.terminate_grace_ms);
        if self.max_processes == 0 || self.process_output_bytes == 0 {
            return Err("--max-processes and --process-output-bytes must be at least 1".to_owned());
        }
        config.processes = (!self.no_processes).then_some(ProcessLimits {
            max_running: self.max_processes,
            output_bytes: self.process_output_bytes,
            kept_exited: self.kept_processes,
        });
        Ok(config)
    }
}

/// Runs the server until SIGINT/SIGTERM (or stdin EOF with
/// `--exit-on-stdin-eof`).
///
/// # Errors
/// Invalid settings, or a server that cannot bind or fails while serving.
pub async fn run(args: ServerArgs) -> Result<(), String> {
    let config = args.into_config()?;
    if nix::unistd::geteuid().is_root() && config.agent_user.is_none() {
        // Said once, at start (research/contract.md, "Agents under an
        // unprivileged user").
        tracing::warn!(
            "running as root without --agent-user: agents and processes run as root, and Claude Code refuses to open a session as root; pass --agent-user USER"
        );
    }
    if config.fs_root.is_none() {
        // Said once, at start (research/contract.md, "Host file system").
        tracing::warn!(
            "no --fs-root: the file system API (/v2/fs/*, _sandboxagent/fs/*) reaches every file this server's user can; pass --fs-root DIR to confine it"
        );
    }
    let shutdown = tokio_util::sync::CancellationToken::new();
    let steps = acp_runtime::server::graceful_steps(config.shutdown_grace);
    crate::signals::watch(shutdown.clone(), steps)
        .await
        .map_err(|e| format!("cannot take SIGINT and SIGTERM: {e}"))?;
    acp_runtime::server::run(config, shutdown)
        .await
        .map_err(|e| format!("server failed: {e}"))
}
