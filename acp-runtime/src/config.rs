//! Server configuration: validated settings and their defaults.

use crate::install::AgentSpec;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

/// Checks an `--allowed-host` value: a host name or IP literal, optionally
/// with `:port` (an HTTP `Host` value, RFC 9110 section 7.2).
///
/// # Errors
/// A message saying what the value must look like.
pub fn check_allowed_host(value: &str) -> Result<(), String> {
    let valid = !value.is_empty()
        && !value.contains('@')
        && value
            .parse::<http::uri::Authority>()
            .is_ok_and(|authority| !authority.host().is_empty());
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{value:?} is not a Host value; give a name or address, optionally with :PORT (e.g. sandbox.example or sandbox.example:8443)"
        ))
    }
}

/// The data dir when neither `--data-dir` nor `SANDBOX_AGENT_DATA_DIR` is
/// given: `$XDG_DATA_HOME/sandbox-agent`, else
/// `$HOME/.local/share/sandbox-agent` (XDG Base Directory specification);
/// `None` when neither variable is set to an absolute path.
pub fn default_data_dir() -> Option<PathBuf> {
    let absolute = |name: &str| {
        std::env::var_os(name)
            .map(PathBuf::from)
            .filter(|path| path.is_absolute())
    };
    absolute("XDG_DATA_HOME")
        .or_else(|| absolute("HOME").map(|home| home.join(".local").join("share")))
        .map(|base| base.join("sandbox-agent"))
}

// The defaults of the server's settings, stated once: [`ServerConfig::new`]
// starts from them and the `sandbox-agent server` options show them.

/// Address the server listens on by default: loopback only.
pub const DEFAULT_HOST: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);
/// Port the server listens on by default.
pub const DEFAULT_PORT: u16 = 2468;
/// How long a POST waits for the agent's answer before 504, in milliseconds.
pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 120_000;
/// Events kept per connection for `Last-Event-ID` replay.
pub const DEFAULT_REPLAY_BUFFER_EVENTS: usize = 2048;
/// Bytes kept per connection for replay (64 MiB).
pub const DEFAULT_REPLAY_BUFFER_BYTES: usize = 64 * 1024 * 1024;
/// Interval of SSE heartbeat comments, in milliseconds.
pub const DEFAULT_HEARTBEAT_MS: u64 = 15_000;
/// Largest accepted request body, in bytes (16 MiB).
pub const DEFAULT_MAX_BODY_BYTES: usize = 16 * 1024 * 1024;
/// Longest agent stdout line, in bytes (64 MiB).
pub const DEFAULT_MAX_LINE_BYTES: usize = 64 * 1024 * 1024;
/// Most open connections at once.
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Most TCP connections served at once.
pub const DEFAULT_MAX_HTTP_CONNECTIONS: usize = 16_384;
/// Longest a client may take to send a request's headers, and then its
/// body, in milliseconds.
pub const DEFAULT_READ_TIMEOUT_MS: u64 = 30_000;
/// How long a connection with no stream and no request is kept, in
/// milliseconds (15 minutes).
pub const DEFAULT_IDLE_TIMEOUT_MS: u64 = 15 * 60 * 1000;
/// Time agents get between SIGTERM and SIGKILL at shutdown, in milliseconds.
pub const DEFAULT_SHUTDOWN_GRACE_MS: u64 = 5_000;
/// Events kept per session in its event log.
pub const DEFAULT_EVENT_LOG_EVENTS: usize = 10_000;
/// Bytes kept per session in its event log (16 MiB).
pub const DEFAULT_EVENT_LOG_BYTES: usize = 16 * 1024 * 1024;
/// Default `--memory-budget-bytes`: 512 MiB for every event log and replay
/// ring together (research/contract.md, "Memory budget").
pub const DEFAULT_MEMORY_BUDGET_BYTES: usize = 512 * 1024 * 1024;
/// Ended sessions kept in the inventory.
pub const DEFAULT_ENDED_SESSIONS: usize = 1000;
/// How long a terminated session's agent gets to end its turn, in
/// milliseconds.
pub const DEFAULT_TERMINATE_GRACE_MS: u64 = 2_000;
/// Longest an agent install may take, in milliseconds (15 minutes).
pub const DEFAULT_INSTALL_TIMEOUT_MS: u64 = 15 * 60 * 1000;
pub use crate::install::DEFAULT_INSTALL_RETRY_BACKOFF_MS;
pub use crate::process::ProcessLimits;
/// Largest body `PUT /v2/fs/file` or `POST /v2/fs/upload-batch` accepts, as
/// sent, in bytes (4 GiB: a repository or a build output, on a sandbox disk).
pub const DEFAULT_MAX_UPLOAD_BYTES: u64 = 4 << 30;
/// Most bytes of file content one upload-batch archive may unpack to (8 GiB:
/// twice the body cap, as a compressed repository needs; a gzip bomb stops
/// there).
pub const DEFAULT_MAX_UNPACKED_BYTES: u64 = 8 << 30;
/// Most entries one `POST /v2/fs/upload-batch` archive may hold.
pub const DEFAULT_MAX_UPLOAD_ENTRIES: usize = 100_000;

/// Validated server settings. The `sandbox-agent server` command builds
/// them from its options.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Address to bind; port 0 picks a free port.
    pub listen: SocketAddr,
    /// Bearer token every `/v2/*` route except `/v2/health` requires; `None` disables auth.
    pub token: Option<String>,
    /// How long a POST waits for the agent's answer before 504.
    pub request_timeout: Duration,
    /// Timeout for `session/prompt`; `None`: no timeout (agent turns can take many minutes).
    pub prompt_timeout: Option<Duration>,
    /// Events kept per connection for `Last-Event-ID` replay.
    pub replay_buffer_events: usize,
    /// Bytes kept per connection for replay; the oldest events go first past this.
    pub replay_buffer_bytes: usize,
    /// Interval of SSE heartbeat comments.
    pub heartbeat: Duration,
    /// Largest accepted request body, in bytes (413 past it).
    pub max_body_bytes: usize,
    /// Longest agent stdout line, in bytes; longer lines are reported and discarded.
    pub max_line_bytes: usize,
    /// Most open connections at once (503 past it).
    pub max_connections: usize,
    /// Most TCP connections served at once (the rest get 503 and are closed).
    pub max_http_connections: usize,
    /// Longest a client may take to send a request's headers, and then its body.
    pub read_timeout: Duration,
    /// A connection with no stream and no request for this long is closed.
    pub idle_timeout: Duration,
    /// Origins allowed by CORS; empty: CORS off. A browser request whose
    /// `Origin` is another site's is refused unless listed here
    /// (research/contract.md, "Auth and CORS").
    pub cors_allow_origins: Vec<String>,
    /// `GET /metrics` needs no token (`--metrics-public`): for a scraper
    /// that cannot send one, on a network that keeps others out
    /// (research/contract.md, "Metrics").
    pub metrics_public: bool,
    /// Metrics are recorded and `GET /metrics` serves them (the default);
    /// `--no-metrics` turns both off: requests, turns and file bytes are
    /// not counted, and `/metrics` answers 404 (research/contract.md,
    /// "Metrics").
    pub metrics: bool,
    /// Host names (`host` for any port, `host:port` for one) served on a
    /// loopback connection besides the loopback names, for a proxy in front
    /// that keeps its own `Host` (research/contract.md, "Auth and CORS");
    /// each passes [`check_allowed_host`].
    pub allowed_hosts: Vec<String>,
    /// How long agents get between SIGTERM and SIGKILL at shutdown.
    pub shutdown_grace: Duration,
    /// Events kept per session in its event log.
    pub event_log_events: usize,
    /// Bytes kept per session in its event log.
    pub event_log_bytes: usize,
    /// Ended sessions kept in the inventory (oldest forgotten first), in
    /// memory and in the store.
    pub ended_sessions: usize,
    /// Bytes every event log and replay ring may hold together; past it the
    /// oldest in-memory events are evicted, ended and dormant sessions'
    /// first (research/contract.md, "Memory budget").
    pub memory_budget_bytes: usize,
    /// Where sessions and their event logs are kept; `None`: the default,
    /// `sqlite:<data_dir>/sessions.db` (research/contract.md, "Durable
    /// sessions").
    pub store: Option<crate::store::StoreUrl>,
    /// The runtime id stored rows carry; `None`: the one in
    /// `<data_dir>/runtime-id`, made on first start.
    pub runtime_id: Option<String>,
    /// How long a terminated session's agent gets to end its turn before the
    /// runtime answers the pending prompt itself (stop reason `cancelled`).
    pub terminate_grace: Duration,
    /// Known agents by id.
    pub agents: BTreeMap<String, AgentSpec>,
    /// Where agents are installed (`agents/<id>/<version>/`) and keep their
    /// homes (`homes/<id>/`).
    pub data_dir: PathBuf,
    /// Refuse to install agents lazily on their first `initialize` (409
    /// `agent-not-installed` instead).
    pub require_preinstall: bool,
    /// Longest an install (npm, or download and unpack) may take.
    pub install_timeout: Duration,
    /// After a failed install, how long lazy installs of that agent answer
    /// with the failure instead of installing again (explicit installs
    /// always run).
    pub install_retry_backoff: Duration,
    /// Shut down when stdin reaches end of file (the parent closed its pipe
    /// or died).
    pub exit_on_stdin_eof: bool,
    /// Confines the host file system API to this directory, checked after
    /// symlinks are resolved (403 outside); `None`: the whole file system
    /// the server's user can reach (research/contract.md, "Host file system").
    /// Resolved to a real path once, when the runtime is built; a root
    /// replaced by a symlink later is not followed.
    pub fs_root: Option<PathBuf>,
    /// `--fs-root` as the operator wrote it (absolute), when it names the
    /// root through a symlink: client paths may start with it too.
    pub fs_root_as_given: Option<PathBuf>,
    /// Largest upload body as sent (`PUT /v2/fs/file`, upload-batch), in
    /// bytes (413 past it).
    pub max_upload_bytes: u64,
    /// Most bytes of file content one upload-batch archive may unpack to
    /// (413 past it).
    pub max_unpacked_bytes: u64,
    /// Starts each agent process under a tree supervisor (this binary
    /// re-run; research/contract.md, "Agent process trees and a server that
    /// dies"); `None` starts agents directly, with a keeper.
    pub tree_supervisor: Option<crate::os::tree::TreeSupervisor>,
    /// Most entries one upload-batch archive may hold (413 past it).
    pub max_upload_entries: usize,
    /// The agent a bare `/acp` connection gets when `initialize` names none
    /// in `_meta` (research/contract.md, "The /acp profile"); `None`: such an
    /// `initialize` is 400. Must be a known agent id.
    pub default_agent: Option<String>,
    /// The process API's bounds (research/contract.md, "Processes and
    /// terminals"); `None`: the API is off (`--no-processes`, 404 on every
    /// route).
    pub processes: Option<ProcessLimits>,
    /// The user agents and processes run as when the server runs as root
    /// (`--agent-user`, research/contract.md, "Agents under an unprivileged
    /// user"); the tree supervisor switches to it. `None`: the server's own
    /// user.
    pub agent_user: Option<crate::os::user::AgentUser>,
}

impl ServerConfig {
    /// Defaults as research/contract.md states them: 120 s request timeout,
    /// no prompt timeout, 2048 events of replay, 15 s heartbeat, 16 MiB
    /// bodies ("Transport: /v2/rpc"); 64 MiB agent lines
    /// ("Routing: connections, sessions, one agent process"); event logs of
    /// 10,000 events / 16 MiB per session, 1000 ended sessions kept
    /// ("Extension methods and control plane"); lazy installs of at most 15
    /// minutes into `data_dir` ("Agents: manifest, installs, lazy install").
    pub fn new(listen: SocketAddr, agents: BTreeMap<String, AgentSpec>, data_dir: PathBuf) -> Self {
        Self {
            listen,
            token: None,
            request_timeout: Duration::from_millis(DEFAULT_REQUEST_TIMEOUT_MS),
            prompt_timeout: None,
            replay_buffer_events: DEFAULT_REPLAY_BUFFER_EVENTS,
            replay_buffer_bytes: DEFAULT_REPLAY_BUFFER_BYTES,
            heartbeat: Duration::from_millis(DEFAULT_HEARTBEAT_MS),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_line_bytes: DEFAULT_MAX_LINE_BYTES,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_http_connections: DEFAULT_MAX_HTTP_CONNECTIONS,
            read_timeout: Duration::from_millis(DEFAULT_READ_TIMEOUT_MS),
            idle_timeout: Duration::from_millis(DEFAULT_IDLE_TIMEOUT_MS),
            cors_allow_origins: Vec::new(),
            metrics_public: false,
            metrics: true,
            allowed_hosts: Vec::new(),
            shutdown_grace: Duration::from_millis(DEFAULT_SHUTDOWN_GRACE_MS),
            event_log_events: DEFAULT_EVENT_LOG_EVENTS,
            event_log_bytes: DEFAULT_EVENT_LOG_BYTES,
            memory_budget_bytes: DEFAULT_MEMORY_BUDGET_BYTES,
            ended_sessions: DEFAULT_ENDED_SESSIONS,
            store: None,
            runtime_id: None,
            terminate_grace: Duration::from_millis(DEFAULT_TERMINATE_GRACE_MS),
            agents,
            data_dir,
            require_preinstall: false,
            install_timeout: Duration::from_millis(DEFAULT_INSTALL_TIMEOUT_MS),
            install_retry_backoff: Duration::from_millis(DEFAULT_INSTALL_RETRY_BACKOFF_MS),
            exit_on_stdin_eof: false,
            fs_root: None,
            fs_root_as_given: None,
            max_upload_bytes: DEFAULT_MAX_UPLOAD_BYTES,
            max_unpacked_bytes: DEFAULT_MAX_UNPACKED_BYTES,
            tree_supervisor: None,
            max_upload_entries: DEFAULT_MAX_UPLOAD_ENTRIES,
            default_agent: None,
            processes: Some(ProcessLimits::default()),
            agent_user: None,
        }
    }
}
