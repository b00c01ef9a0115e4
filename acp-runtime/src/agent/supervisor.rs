//! The supervisor of agent processes: one slot per configured agent id,
//! holding its current process. It starts a process on first use (after a
//! lazy install, unless the server requires preinstalled agents), sends it
//! the runtime's `initialize` once, replaces it on the next use after it
//! exits, installs on request, reports every agent's state and stops them
//! all at shutdown (research/contract.md, "Agents: manifest, installs, lazy
//! install").

use super::agent_process::{self, AgentProcess, LaunchCommand};
use super::router::{ReportedHints, RouteTargets};
use crate::error::Error;
use crate::install::{AgentSpec, Launch};
use crate::install::{InstallError, InstallOptions, Installer, LogProgress, Progress};
use crate::memory::connection::ClientCapabilities;
use crate::metrics::Metrics;
use crate::os::process_group::signal_group;
use crate::os::tree::TreeSupervisor;
use crate::os::user;
use ext_methods::{AgentInfo, AgentInstallResult, AgentSource, AuthEnv, ModelInfo};
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use nix::sys::signal::Signal;
use parking_lot::{Mutex, RwLock};
use serde_json::value::RawValue;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// After SIGKILL at shutdown, how long to wait for the processes to be reaped.
const EXIT_WAIT: Duration = Duration::from_secs(2);
/// How much longer than the start timeout a request waits for a start
/// attempt: an attempt that fails its `initialize` after the start timeout
/// reports that failure rather than "still starting".
const START_WAIT_GRACE: Duration = Duration::from_millis(500);

/// Why an agent could not be made ready.
#[derive(Debug, Clone)]
pub enum StartError {
    /// Not configured.
    Unknown,
    /// Could not be spawned, exited, or did not answer `initialize` in time.
    Failed(String),
    /// Answered the runtime's `initialize` with this JSON-RPC error object.
    Rejected(Box<RawValue>),
    /// Not installed, and the server requires preinstalled agents.
    NotInstalled,
    /// The lazy install failed.
    Install(InstallError),
}

/// All configured agents and their current processes.
#[derive(Debug)]
pub struct Agents {
    slots: BTreeMap<String, Arc<AgentSlot>>,
    generation: AtomicU64,
    max_line_bytes: usize,
    start_timeout: Duration,
    /// Installs agents into the data dir (lazily, or on request).
    installer: Arc<Installer>,
    /// `--require-preinstall`: never install on first use.
    require_preinstall: bool,
    /// Starts each agent under a tree supervisor; `None`: directly, with a
    /// keeper (a library user without the `sandbox-agent` binary).
    tree_supervisor: Option<TreeSupervisor>,
    /// Where finished installs are counted (`None`: uncounted).
    metrics: Option<Arc<Metrics>>,
}

#[derive(Debug)]
struct AgentSlot {
    spec: AgentSpec,
    /// The running process, if any. Read on every request; written on start and exit.
    current: RwLock<Option<Arc<AgentProcess>>>,
    /// The start attempt in progress, if any: everyone who needs the process
    /// while it starts waits for this one attempt and gets its outcome.
    starting: Mutex<Option<StartAttempt>>,
    /// Processes started so far.
    starts: AtomicU64,
    /// Why the last start or process failed.
    last_error: Mutex<Option<String>>,
    /// Models and modes the agent reported in any session (its processes'
    /// routers write it).
    reported: Arc<Mutex<ReportedHints>>,
}

/// A start attempt (install if needed, spawn, `initialize`) running in a
/// task of its own, so a request that gives up does not cut it short.
type SharedStart = Shared<BoxFuture<'static, Result<Arc<AgentProcess>, StartError>>>;

/// [`SharedStart`] in a slot.
struct StartAttempt(SharedStart);

impl std::fmt::Debug for StartAttempt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StartAttempt")
    }
}

impl AgentSlot {
    /// Takes the outcome of a start attempt: the new current process, or
    /// why the agent could not be started.
    fn settle_start(&self, outcome: &Result<Arc<AgentProcess>, StartError>) {
        let reason = match outcome {
            Ok(process) => {
                *self.current.write() = Some(process.clone());
                return;
            }
            Err(StartError::Failed(reason)) => reason.clone(),
            Err(StartError::Rejected(error)) => format!("initialize rejected: {}", error.get()),
            Err(StartError::Install(error)) => format!("install failed: {error}"),
            Err(StartError::NotInstalled) => {
                "not installed (the server requires preinstalled agents)".to_owned()
            }
            Err(StartError::Unknown) => return,
        };
        *self.last_error.lock() = Some(reason);
    }

    /// Forgets `process` if it is still the current one (it exited) and
    /// remembers why. A process that never became current failed its start,
    /// and the start's failure is the better reason.
    fn clear_if_current(&self, process: &Arc<AgentProcess>, reason: String) {
        let mut current = self.current.write();
        if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, process)) {
            *current = None;
            *self.last_error.lock() = Some(reason);
        }
    }
}

impl Agents {
    /// Agents from `specs`, installed by `installer`; nothing is started yet.
    pub fn new(
        specs: &BTreeMap<String, AgentSpec>,
        max_line_bytes: usize,
        start_timeout: Duration,
        installer: Arc<Installer>,
        require_preinstall: bool,
    ) -> Self {
        let slots = specs
            .iter()
            .map(|(id, spec)| {
                (
                    id.clone(),
                    Arc::new(AgentSlot {
                        spec: spec.clone(),
                        current: RwLock::new(None),
                        starting: Mutex::new(None),
                        starts: AtomicU64::new(0),
                        last_error: Mutex::new(None),
                        reported: Arc::default(),
                    }),
                )
            })
            .collect();
        Self {
            slots,
            generation: AtomicU64::new(0),
            max_line_bytes,
            start_timeout,
            installer,
            require_preinstall,
            tree_supervisor: None,
            metrics: None,
        }
    }

    /// Starts every agent under `supervisor` (research/contract.md, "Agent
    /// process trees and a server that dies").
    #[must_use]
    pub fn with_tree_supervisor(mut self, supervisor: Option<TreeSupervisor>) -> Self {
        self.tree_supervisor = supervisor;
        self
    }

    /// Counts every finished install in `agent_installs_total`
    /// (research/contract.md, "Metrics").
    pub(crate) fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Whether agents start as root: the server runs as root and no
    /// `--agent-user` is set (a tree supervisor without a user). Their
    /// failed `session/new` and `session/load` then carry a hint
    /// (research/contract.md, "Agent errors: stderr and hint").
    fn root_hint(&self) -> bool {
        nix::unistd::geteuid().is_root()
            && self
                .tree_supervisor
                .as_ref()
                .is_none_or(|supervisor| supervisor.user.is_none())
    }

    /// The installer (and so the data dir) these agents use.
    pub fn installer(&self) -> &Arc<Installer> {
        &self.installer
    }

    /// Whether `agent` is configured.
    pub fn is_known(&self, agent: &str) -> bool {
        self.slots.contains_key(agent)
    }

    /// The configured ids, comma-separated (for error messages).
    pub fn known_ids(&self) -> String {
        self.slots.keys().cloned().collect::<Vec<_>>().join(", ")
    }

    /// Per configured agent, for the metrics: its id, whether a process
    /// runs, and how many processes started after the first (restarts).
    /// Constant time per agent.
    pub(crate) fn process_counts(&self) -> Vec<(Arc<str>, bool, u64)> {
        self.slots
            .iter()
            .map(|(id, slot)| {
                let running = slot.current.read().as_ref().is_some_and(|p| p.is_alive());
                let restarts = slot.starts.load(Ordering::Relaxed).saturating_sub(1);
                (Arc::from(id.as_str()), running, restarts)
            })
            .collect()
    }

    /// The running process of `agent`, if any.
    pub fn current(&self, agent: &str) -> Option<Arc<AgentProcess>> {
        let slot = self.slots.get(agent)?;
        let current = slot.current.read();
        current.as_ref().filter(|p| p.is_alive()).cloned()
    }

    /// The running process of `agent`, started and initialized first if
    /// needed; a new process routes to `targets`. Concurrent callers share
    /// one start attempt and its outcome (a failure too; the next call after
    /// it tries afresh). The attempt runs in its own task: a caller waits
    /// for it at most the start timeout (plus a short grace), and the
    /// attempt goes on when the caller gives up or hangs up, recording how
    /// it ended (research/contract.md, "Routing: connections, sessions, one
    /// agent process").
    ///
    /// # Errors
    /// [`StartError`] when the agent is unknown, is not installed and the
    /// server requires preinstalled agents, cannot be installed or started,
    /// rejects `initialize`, or is still being installed or started when
    /// the caller's wait ends.
    pub async fn ensure_running(
        self: &Arc<Self>,
        targets: &RouteTargets,
        agent: &str,
    ) -> Result<Arc<AgentProcess>, StartError> {
        let slot = self.slots.get(agent).ok_or(StartError::Unknown)?;
        if let Some(process) = self.current(agent) {
            return Ok(process);
        }
        let attempt = {
            let mut starting = slot.starting.lock();
            if let Some(process) = self.current(agent) {
                return Ok(process);
            }
            // A finished attempt still here is one whose task died.
            match starting.as_ref().filter(|a| a.0.peek().is_none()) {
                Some(attempt) => attempt.0.clone(),
                None => {
                    let attempt = self.spawn_start(targets, slot);
                    *starting = Some(StartAttempt(attempt.clone()));
                    attempt
                }
            }
        };
        let wait = self.start_timeout + START_WAIT_GRACE;
        match tokio::time::timeout(wait, attempt).await {
            Ok(outcome) => outcome,
            Err(_) => {
                let doing = if self.installer.is_installing(agent) {
                    "being installed"
                } else {
                    "starting"
                };
                Err(StartError::Failed(format!(
                    "still {doing} after {} ms; that goes on in the background (GET /v2/agents shows how it ended): retry later",
                    wait.as_millis()
                )))
            }
        }
    }

    /// Starts `slot`'s agent in a task of its own, which records the outcome
    /// in the slot and then clears the slot's attempt.
    fn spawn_start(self: &Arc<Self>, targets: &RouteTargets, slot: &Arc<AgentSlot>) -> SharedStart {
        let (agents, targets, slot) = (self.clone(), targets.clone(), slot.clone());
        let agent = slot.spec.id.clone();
        let task = tokio::spawn(async move {
            let outcome = agents.start(&targets, &slot).await;
            let mut starting = slot.starting.lock();
            slot.settle_start(&outcome);
            *starting = None;
            outcome
        });
        async move {
            task.await.unwrap_or_else(|error| {
                Err(StartError::Failed(format!(
                    "the start task of agent {agent:?} failed: {error}"
                )))
            })
        }
        .boxed()
        .shared()
    }

    /// What to run for `spec`: its fixed command, or its installed version
    /// (installed now if it is missing, unless preinstalling is required),
    /// with the manifest's environment expanded.
    async fn launch_command(&self, spec: &AgentSpec) -> Result<LaunchCommand, StartError> {
        let (program, args, extra_env) = match &spec.launch {
            Launch::Command { program, args } => (program.clone(), args.clone(), Vec::new()),
            Launch::Install(_) => {
                let installation = match self.installer.installed(spec) {
                    Some(installation) => installation,
                    None if self.require_preinstall => {
                        tracing::warn!(agent = %spec.id, "agent not installed; not installing it on first use (--require-preinstall)");
                        return Err(StartError::NotInstalled);
                    }
                    None => {
                        tracing::info!(agent = %spec.id, "agent not installed yet; installing it on first use");
                        let progress = Arc::new(LogProgress {
                            agent: spec.id.clone(),
                        });
                        self.installer
                            .install_lazily(spec, progress)
                            .await
                            .map_err(StartError::Install)?
                            .installation
                    }
                };
                (installation.program, installation.args, installation.env)
            }
        };
        let mut env = Vec::new();
        let mut cwd = None;
        let home = self.installer.agent_home(&spec.id);
        let cannot_make_home = |error: std::io::Error| {
            StartError::Failed(format!(
                "cannot create the agent home {}: {error}",
                home.display()
            ))
        };
        // An agent run as another user lives in its home in the data dir,
        // owned by that user (research/contract.md, "Agents under an
        // unprivileged user"); the agent's own variables may still name
        // another HOME.
        if let Some(user) = self.tree_supervisor.as_ref().and_then(|s| s.user.as_ref()) {
            // An installed agent under a closed folder (installed with a
            // umask of 077) would fail as "permission denied" from node:
            // say which folder instead.
            if program.is_absolute()
                && let Some(step) = user::unreachable_step(user, &program)
            {
                return Err(StartError::Failed(format!(
                    "agent {}'s program {} is closed to user {} (--agent-user) at {}: make the folder searchable by it (chmod o+rx), or reinstall with umask 022",
                    spec.id,
                    program.display(),
                    user.name,
                    step.display()
                )));
            }
            user::prepare_home(user, &home).map_err(cannot_make_home)?;
            env.extend(user::login_env(user, &home));
            cwd = Some(home.clone());
        }
        env.extend(spec.env.iter().cloned());
        env.extend(extra_env);
        let env = self
            .installer
            .expand_env(&spec.id, &env)
            .map_err(cannot_make_home)?;
        Ok(LaunchCommand {
            program,
            args,
            env,
            cwd,
        })
    }

    /// Installs `agent` (`POST /v2/agents/{agent}/install`). A command agent
    /// (the mock, `--agent-command`, a `local` distribution) needs no
    /// install: the answer describes it with `alreadyInstalled: true`.
    ///
    /// A failed install is the agent's `lastError`, recorded even when the
    /// caller hangs up before it ends.
    ///
    /// # Errors
    /// 404 `unknown-agent`, 400 for an unusable version, 409
    /// `not-installable` (nothing for this platform, a command that is not
    /// there), 502 `install-failed`.
    pub async fn install(
        &self,
        agent: &str,
        options: InstallOptions,
        progress: Arc<dyn Progress>,
    ) -> Result<AgentInstallResult, Error> {
        let slot = self.slots.get(agent).ok_or_else(|| Error::UnknownAgent {
            agent: agent.to_owned(),
            known: self.known_ids(),
        })?;
        let spec = &slot.spec;
        if let Launch::Command { program, .. } = &spec.launch {
            if !spec.is_runnable() {
                tracing::warn!(agent, program = %program.display(), "cannot install a command agent whose program is missing");
                return Err(Error::NotInstallable(format!(
                    "agent {agent:?} runs the command {}, which is not there; the runtime installs only manifest agents with an npx or binary distribution",
                    program.display()
                )));
            }
            let version = match spec.source {
                AgentSource::Builtin => Some(env!("CARGO_PKG_VERSION").to_owned()),
                _ => self.running_version(slot),
            };
            return Ok(AgentInstallResult {
                agent: agent.to_owned(),
                version,
                source: spec.source,
                path: Some(program.display().to_string()),
                already_installed: true,
                duration_ms: 0,
            });
        }
        let (installer, recorder, spec) = (self.installer.clone(), slot.clone(), spec.clone());
        let metrics = self.metrics.clone();
        let task = tokio::spawn(async move {
            let outcome = installer.install(&spec, options, progress).await;
            if let Some(metrics) = &metrics {
                let label = if outcome.is_ok() {
                    "installed"
                } else {
                    "failed"
                };
                metrics.agent_install(&spec.id, label);
            }
            if let Err(error) = &outcome
                && !matches!(error, InstallError::InvalidVersion(_))
            {
                *recorder.last_error.lock() = Some(format!("install failed: {error}"));
            }
            outcome
        });
        let outcome = task
            .await
            .map_err(|error| {
                Error::InstallFailed(format!(
                    "the install task of agent {agent:?} failed: {error}"
                ))
            })?
            .map_err(|error| Error::from_install(agent, error))?;
        let spec = &slot.spec;
        Ok(AgentInstallResult {
            agent: agent.to_owned(),
            version: Some(outcome.installation.version),
            source: spec.source,
            path: Some(outcome.installation.program.display().to_string()),
            already_installed: outcome.already_installed,
            duration_ms: u64::try_from(outcome.duration.as_millis()).unwrap_or(u64::MAX),
        })
    }

    /// `agentInfo.version` of the running process, if any.
    fn running_version(&self, slot: &AgentSlot) -> Option<String> {
        let current = slot.current.read().clone().filter(|p| p.is_alive())?;
        let raw = current.initialize_result.lock().clone()?;
        let result: serde_json::Value = serde_json::from_str(raw.get()).ok()?;
        result["agentInfo"]["version"].as_str().map(str::to_owned)
    }

    /// Spawns `slot`'s agent, starts its stdout loop and sends it the
    /// runtime's `initialize` (bounded by the start timeout).
    async fn start(
        &self,
        targets: &RouteTargets,
        slot: &Arc<AgentSlot>,
    ) -> Result<Arc<AgentProcess>, StartError> {
        let spec = &slot.spec;
        let command = self.launch_command(spec).await?;
        let spawned = agent_process::spawn(
            &spec.id,
            &command,
            self.max_line_bytes,
            self.installer.data_dir(),
            self.tree_supervisor.as_ref(),
        )
        .map_err(|error| {
            StartError::Failed(format!("cannot run {}: {error}", command.program.display()))
        })?;
        let pid = spawned.child.id().unwrap_or(0);
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        let (client_capabilities, served) = match &targets.client_side {
            Some(client_side) => client_side.declare(&spec.client_capabilities),
            None => (
                questions_declared(&spec.client_capabilities),
                ClientCapabilities::default(),
            ),
        };
        slot.starts.fetch_add(1, Ordering::Relaxed);
        let process = Arc::new(
            AgentProcess::new(
                spec.id.as_str().into(),
                generation,
                pid,
                spawned.stdin,
                spawned.stderr,
                targets.clone(),
                slot.reported.clone(),
            )
            .serving(served)
            .with_root_hint(self.root_hint())
            .with_group_record(spawned.group_record)
            .with_supervisor(spawned.supervised),
        );
        tracing::info!(agent = %spec.id, pid, generation, "agent process started");
        let (stdout, child, max_line_bytes) = (spawned.stdout, spawned.child, self.max_line_bytes);
        let (exiting, watcher) = (process.clone(), slot.clone());
        tokio::spawn(async move {
            let exit = agent_process::read_stdout(&exiting, stdout, child, max_line_bytes).await;
            watcher.clear_if_current(&exiting, format!("process exited ({})", exit.describe()));
        });
        let params = serde_json::json!({
            "protocolVersion": 1,
            "clientCapabilities": client_capabilities,
            "clientInfo": { "name": "sandbox-agent", "version": env!("CARGO_PKG_VERSION") },
        });
        let failed = |reason: String| {
            let stderr = process.stderr.summary();
            let mut reason = reason;
            if let Some(head) = stderr.head {
                reason.push_str("; stderr: ");
                reason.push_str(&head);
            }
            StartError::Failed(reason)
        };
        // `initialize` and `authenticate` share one start timeout.
        let deadline = tokio::time::Instant::now() + self.start_timeout;
        match tokio::time::timeout_at(deadline, process.router.call("initialize", &params)).await {
            Ok(Ok(result)) => {
                let method = auth_method_to_use(&spec.auth, &command.env, &result);
                *process.initialize_result.lock() = Some(result);
                if let Some(method) = method {
                    self.authenticate(slot, &process, method, deadline).await;
                }
                Ok(process)
            }
            Ok(Err(Some(error))) => {
                signal_group(pid, Signal::SIGTERM);
                Err(StartError::Rejected(error))
            }
            Ok(Err(None)) => {
                // Let the exit handler record the status and stderr.
                process.exited.cancelled().await;
                let exit = process.exit.lock().unwrap_or_default();
                Err(failed(format!(
                    "the process exited during initialize ({})",
                    exit.describe()
                )))
            }
            Err(_) => {
                process.kill_tree_now();
                Err(failed(format!(
                    "no answer to initialize within {} ms",
                    self.start_timeout.as_millis()
                )))
            }
        }
    }

    /// Sends a new process `authenticate {methodId}` for `auth`, answered
    /// by `deadline` (the end of the start timeout). A failure is logged and
    /// kept as the agent's `lastError`; the process serves anyway (a client
    /// may still authenticate it; research/contract.md, "Agent
    /// authentication").
    async fn authenticate(
        &self,
        slot: &AgentSlot,
        process: &AgentProcess,
        auth: &AuthEnv,
        deadline: tokio::time::Instant,
    ) {
        let agent = &slot.spec.id;
        let params = serde_json::json!({ "methodId": auth.method_id });
        let failure = match tokio::time::timeout_at(
            deadline,
            process.router.call("authenticate", &params),
        )
        .await
        {
            Ok(Ok(_)) => {
                tracing::info!(agent = %agent, method = %auth.method_id, env = %auth.env, "agent authenticated");
                return;
            }
            Ok(Err(Some(error))) => format!("the agent answered {}", error.get()),
            Ok(Err(None)) => "the process exited".to_owned(),
            Err(_) => format!(
                "no answer within the start timeout ({} ms)",
                self.start_timeout.as_millis()
            ),
        };
        let reason = format!(
            "authenticate {:?} (from {}) failed: {failure}",
            auth.method_id, auth.env
        );
        tracing::warn!(agent = %agent, "{reason}");
        *slot.last_error.lock() = Some(reason);
    }

    /// The models `agent` reported, if it did.
    pub fn reported_models(&self, agent: &str) -> Option<Vec<ModelInfo>> {
        self.slots.get(agent)?.reported.lock().models.clone()
    }

    /// What `GET /v2/agents` and `_sandboxagent/agent/list` say about every
    /// configured agent now.
    pub fn infos(&self) -> Vec<AgentInfo> {
        self.slots
            .values()
            .map(|slot| {
                let current = slot.current.read().clone().filter(|p| p.is_alive());
                let initialize: Option<serde_json::Value> = current
                    .as_ref()
                    .and_then(|p| p.initialize_result.lock().clone())
                    .and_then(|raw| serde_json::from_str(raw.get()).ok());
                let field = |name: &str| initialize.as_ref().and_then(|i| i.get(name)).cloned();
                let agent_info = field("agentInfo");
                let reported = slot.reported.lock();
                let spec = &slot.spec;
                let running_version = agent_info
                    .as_ref()
                    .and_then(|i| i.get("version"))
                    .and_then(|v| v.as_str())
                    .map(str::to_owned);
                let (installed, version, path) = match &spec.launch {
                    Launch::Command { program, .. } => (
                        spec.source == AgentSource::Builtin || spec.is_runnable(),
                        running_version,
                        Some(program.display().to_string()),
                    ),
                    Launch::Install(_) => match self.installer.installed(spec) {
                        Some(installation) => (
                            true,
                            Some(installation.version),
                            Some(installation.program.display().to_string()),
                        ),
                        None => (false, None, None),
                    },
                };
                AgentInfo {
                    id: spec.id.clone(),
                    name: spec.name.clone(),
                    installed,
                    version,
                    source: spec.source,
                    path,
                    running: current.is_some(),
                    pid: current.as_ref().map(|p| p.pid),
                    restarts: slot.starts.load(Ordering::Relaxed).saturating_sub(1),
                    last_error: slot.last_error.lock().clone(),
                    capabilities: field("agentCapabilities"),
                    agent_info,
                    models: reported.models.clone(),
                    modes: reported.modes.clone(),
                    auth: spec.auth.clone(),
                    credential_env: spec.credential_env.clone(),
                }
            })
            .collect()
    }

    /// Stops every agent process: SIGTERM to its process group, SIGKILL after
    /// `grace`, and waits until each is reaped.
    pub async fn shutdown(&self, grace: Duration) {
        let running: Vec<_> = self
            .slots
            .values()
            .filter_map(|slot| slot.current.read().clone())
            .collect();
        for process in &running {
            tracing::info!(agent = %process.agent, pid = process.pid, "stopping agent process");
            signal_group(process.pid, Signal::SIGTERM);
        }
        let all_exited = futures::future::join_all(running.iter().map(|p| p.exited.cancelled()));
        if tokio::time::timeout(grace, all_exited).await.is_err() {
            for process in running.iter().filter(|p| p.is_alive()) {
                tracing::warn!(agent = %process.agent, pid = process.pid, "agent ignored SIGTERM; killing it");
                signal_group(process.pid, Signal::SIGKILL);
            }
            let all_exited =
                futures::future::join_all(running.iter().map(|p| p.exited.cancelled()));
            let _ = tokio::time::timeout(EXIT_WAIT, all_exited).await;
        }
    }
}

/// The first of `auth` whose environment variable is set (in the agent's
/// launch environment `env`, else the server's) and whose method the agent
/// advertised in `authMethods` of its `initialize` result.
fn auth_method_to_use<'a>(
    auth: &'a [AuthEnv],
    env: &[(String, String)],
    initialize_result: &RawValue,
) -> Option<&'a AuthEnv> {
    if auth.is_empty() {
        return None;
    }
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Advertised {
        #[serde(default)]
        auth_methods: Vec<serde_json::Value>,
    }
    let advertised: Advertised = serde_json::from_str(initialize_result.get()).ok()?;
    let offered = |id: &str| {
        advertised
            .auth_methods
            .iter()
            .any(|method| method.get("id").and_then(|v| v.as_str()) == Some(id))
    };
    let is_set = |name: &str| match env.iter().rev().find(|(key, _)| key == name) {
        Some((_, value)) => !value.is_empty(),
        None => std::env::var_os(name).is_some_and(|value| !value.is_empty()),
    };
    auth.iter()
        .find(|auth| is_set(&auth.env) && offered(&auth.method_id))
}

/// The client capabilities declared to an agent when the runtime does not
/// serve files and terminals: the questions its clients answer
/// (`elicitation`, form and URL), with the manifest's object merged over
/// them as a JSON Merge Patch (research/contract.md, "Agent questions (ACP
/// elicitation)").
fn questions_declared(manifest: &serde_json::Value) -> serde_json::Value {
    let mut declared = serde_json::json!({ "elicitation": crate::elicitation::declared() });
    if let (Some(object), Some(patch)) = (declared.as_object_mut(), manifest.as_object()) {
        ext_methods::meta::merge(object, patch);
    }
    declared
}
