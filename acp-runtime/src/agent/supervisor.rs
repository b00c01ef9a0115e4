//! The supervisor of agent processes: one slot per configured agent id,
//! holding its current process. It starts a process on first use (after a
//! lazy install, unless the server requires preinstalled agents), sends it
//! the runtime's `initialize` once, replaces it on the next use after it
//! exits, installs on request, reports every agent's state and stops them
//! all at shutdown (research/contract.md, "Agents: manifest, installs, lazy
//! install").

use super::install::{InstallError, InstallOptions, Installer, LogProgress, Progress};
use super::process::{self, AgentProcess, LaunchCommand, signal_group};
use super::router::{ReportedHints, RouteTargets};
use super::stdio;
use crate::config::{AgentSpec, Launch};
use crate::error::Error;
use ext_methods::{AgentInfo, AgentInstallResult, AgentSource, ModelInfo};
use nix::sys::signal::Signal;
use parking_lot::{Mutex, RwLock};
use serde_json::value::RawValue;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// After SIGKILL at shutdown, how long to wait for the processes to be reaped.
const EXIT_WAIT: Duration = Duration::from_secs(2);

/// Why an agent could not be made ready.
#[derive(Debug)]
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
}

#[derive(Debug)]
struct AgentSlot {
    spec: AgentSpec,
    /// The running process, if any. Read on every request; written on start and exit.
    current: RwLock<Option<Arc<AgentProcess>>>,
    /// Serializes starts so concurrent first requests start one process.
    starting: tokio::sync::Mutex<()>,
    /// Processes started so far.
    starts: AtomicU64,
    /// Why the last start or process failed.
    last_error: Mutex<Option<String>>,
    /// Models and modes the agent reported in any session (its processes'
    /// routers write it).
    reported: Arc<Mutex<ReportedHints>>,
}

impl AgentSlot {
    /// Forgets `process` if it is still the current one (it exited) and
    /// remembers why.
    fn clear_if_current(&self, process: &Arc<AgentProcess>, reason: String) {
        let mut current = self.current.write();
        if current.as_ref().is_some_and(|c| Arc::ptr_eq(c, process)) {
            *current = None;
        }
        *self.last_error.lock() = Some(reason);
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
                        starting: tokio::sync::Mutex::new(()),
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
        }
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

    /// The running process of `agent`, if any.
    pub fn current(&self, agent: &str) -> Option<Arc<AgentProcess>> {
        let slot = self.slots.get(agent)?;
        let current = slot.current.read();
        current.as_ref().filter(|p| p.is_alive()).cloned()
    }

    /// The running process of `agent`, started and initialized first if
    /// needed; a new process routes to `targets`.
    ///
    /// # Errors
    /// [`StartError`] when the agent is unknown, is not installed and the
    /// server requires preinstalled agents, cannot be installed or started,
    /// or rejects `initialize`.
    pub async fn ensure_running(
        &self,
        targets: &RouteTargets,
        agent: &str,
    ) -> Result<Arc<AgentProcess>, StartError> {
        let slot = self.slots.get(agent).ok_or(StartError::Unknown)?;
        if let Some(process) = self.current(agent) {
            return Ok(process);
        }
        let _starting = slot.starting.lock().await;
        if let Some(process) = self.current(agent) {
            return Ok(process);
        }
        let outcome = self.start(targets, slot).await;
        match &outcome {
            Ok(process) => *slot.current.write() = Some(process.clone()),
            Err(StartError::Failed(reason)) => *slot.last_error.lock() = Some(reason.clone()),
            Err(StartError::Rejected(error)) => {
                *slot.last_error.lock() = Some(format!("initialize rejected: {}", error.get()))
            }
            Err(StartError::Install(error)) => {
                *slot.last_error.lock() = Some(format!("install failed: {error}"))
            }
            Err(StartError::NotInstalled) => {
                *slot.last_error.lock() =
                    Some("not installed (the server requires preinstalled agents)".to_owned())
            }
            Err(StartError::Unknown) => {}
        }
        outcome
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
                            .install(spec, InstallOptions::default(), progress)
                            .await
                            .map_err(StartError::Install)?
                            .installation
                    }
                };
                (installation.program, installation.args, installation.env)
            }
        };
        let mut env = spec.env.clone();
        env.extend(extra_env);
        let env = self.installer.expand_env(&spec.id, &env).map_err(|error| {
            StartError::Failed(format!(
                "cannot create the agent home {}: {error}",
                self.installer.agent_home(&spec.id).display()
            ))
        })?;
        Ok(LaunchCommand { program, args, env })
    }

    /// Installs `agent` (`POST /v2/agents/{agent}/install`). A command agent
    /// (the mock, `--agent-command`, a `local` distribution) needs no
    /// install: the answer describes it with `alreadyInstalled: true`.
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
        let outcome = self
            .installer
            .install(spec, options, progress)
            .await
            .map_err(|error| Error::from_install(agent, error))?;
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
        let spawned = process::spawn(&spec.id, &command, self.max_line_bytes).map_err(|error| {
            StartError::Failed(format!("cannot run {}: {error}", command.program.display()))
        })?;
        let pid = spawned.child.id().unwrap_or(0);
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        slot.starts.fetch_add(1, Ordering::Relaxed);
        let process = Arc::new(AgentProcess::new(
            spec.id.as_str().into(),
            generation,
            pid,
            spawned.stdin,
            spawned.stderr,
            targets.clone(),
            slot.reported.clone(),
        ));
        tracing::info!(agent = %spec.id, pid, generation, "agent process started");
        let (stdout, child, max_line_bytes) = (spawned.stdout, spawned.child, self.max_line_bytes);
        let (exiting, watcher) = (process.clone(), slot.clone());
        tokio::spawn(async move {
            let exit = stdio::read_stdout(&exiting, stdout, child, max_line_bytes).await;
            watcher.clear_if_current(&exiting, format!("process exited ({})", exit.describe()));
        });
        let params = serde_json::json!({
            "protocolVersion": 1,
            "clientCapabilities": spec.client_capabilities,
            "clientInfo": { "name": "sandbox-agent", "version": env!("CARGO_PKG_VERSION") },
        });
        let failed = |reason: String| {
            let stderr = process.stderr.lock().summary();
            let mut reason = reason;
            if let Some(head) = stderr.head {
                reason.push_str("; stderr: ");
                reason.push_str(&head);
            }
            StartError::Failed(reason)
        };
        match tokio::time::timeout(
            self.start_timeout,
            process.router.call("initialize", &params),
        )
        .await
        {
            Ok(Ok(result)) => {
                *process.initialize_result.lock() = Some(result);
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
                signal_group(pid, Signal::SIGKILL);
                Err(failed(format!(
                    "no answer to initialize within {} ms",
                    self.start_timeout.as_millis()
                )))
            }
        }
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
