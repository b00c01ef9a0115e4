//! Installing agents into the data dir: the [`Installer`] and what it
//! decides (research/contract.md, "Agents: manifest, installs, lazy
//! install"). Where installs live is [`super::layout`]; npm runs in
//! [`super::npm`], archives come from [`super::download`].
//!
//! One install at a time per agent: an async lock in this process and a file
//! lock across processes sharing the data dir. Every install is staged in a
//! temporary folder and renamed into place, so a failed or interrupted one
//! leaves nothing half-written; an install already present is a no-op.
//! Installs run in their own task: an HTTP caller that hangs up does not cut
//! one short, and the task logs and records how it ended. Callers asking for
//! the same install while it runs share it and its outcome. A failure is
//! remembered (`lastError`), and for a short back-off a lazy install of the
//! agent answers with it instead of running npm again. A version spec that
//! is not exact (`latest`, a range) is resolved with `npm view` first, so a
//! version that is already there is not installed again.

use super::catalog::{AgentSpec, Launch};
use super::download;
use super::layout::{
    CURRENT, Current, Installation, RECEIPT, Receipt, Staging, kind_of, read_installation,
    read_json, remove_leftovers, write_current, write_json,
};
use super::manifest::{AGENT_HOME_PLACEHOLDER, Chosen, check_version_spec, is_exact_version};
use super::npm::{AsUser, npm_install, npm_view_version};
use super::progress::Progress;
use crate::error::Error;
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use nix::fcntl::{Flock, FlockArg};
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// How long after a failed install of an agent its lazy install (on
/// `initialize`) is not tried again, in milliseconds: requests get the
/// failure at once instead of each running npm.
pub const DEFAULT_INSTALL_RETRY_BACKOFF_MS: u64 = 10_000;

/// What `POST /v2/agents/{agent}/install` and `sandbox-agent agents install`
/// ask for.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct InstallOptions {
    /// Install again even when the version is already there.
    pub reinstall: bool,
    /// Another version than the manifest's (npm only; `latest` allowed). It
    /// stays the active version until another install names one.
    pub version: Option<String>,
}

/// The result of an install.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallOutcome {
    /// The active installation afterwards.
    pub installation: Installation,
    /// Nothing was installed by this call: this version was already there,
    /// or the same install, already running for another caller, installed
    /// it.
    pub already_installed: bool,
    /// How long the call took (waiting for the lock included).
    pub duration: Duration,
}

/// Why an install did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InstallError {
    /// The agent has nothing this runtime can install here: a command agent,
    /// no binary for this platform and no npm package, only `uvx`.
    #[error("{0}")]
    NotInstallable(String),
    /// The requested version cannot be used.
    #[error("{0}")]
    InvalidVersion(String),
    /// npm, the download, the checksum, the archive or the file system failed.
    #[error("{0}")]
    Failed(String),
}

impl Error {
    /// The HTTP error for a failed install of `agent`.
    pub fn from_install(agent: &str, error: InstallError) -> Self {
        match error {
            InstallError::NotInstallable(message) => Self::NotInstallable(message),
            InstallError::InvalidVersion(message) => {
                Self::InvalidRequest(format!("agent {agent:?}: {message}"))
            }
            InstallError::Failed(message) => Self::InstallFailed(message),
        }
    }
}

/// An install running in its own task, awaited by everyone who asked for it.
type SharedInstall = Shared<BoxFuture<'static, Result<InstallOutcome, InstallError>>>;

/// The installs running in this process and the failures remembered, under
/// one lock so that a caller either joins a running install or sees how it
/// ended.
#[derive(Default)]
struct InstallState {
    /// Running installs by agent id and options.
    running: HashMap<(String, InstallOptions), SharedInstall>,
    /// The last failed install of each agent, until one succeeds.
    failures: HashMap<String, Failure>,
}

impl std::fmt::Debug for InstallState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InstallState")
            .field("running", &self.running.keys().collect::<Vec<_>>())
            .field("failures", &self.failures)
            .finish()
    }
}

/// A failed install.
#[derive(Debug)]
struct Failure {
    at: Instant,
    error: InstallError,
    /// What the install asked for: only a failure of the default install
    /// holds lazy installs back.
    options: InstallOptions,
}

/// Installs agents into one data dir.
#[derive(Debug)]
pub struct Installer {
    data_dir: PathBuf,
    timeout: Duration,
    /// After a failed install, how long lazy installs answer with the failure.
    retry_backoff: Duration,
    /// One async lock per agent id: one install at a time in this process.
    locks: parking_lot::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Running installs (shared by their callers) and remembered failures.
    state: parking_lot::Mutex<InstallState>,
    /// HTTPS client for archives, built on first use.
    http: OnceLock<reqwest::Client>,
    /// The tree supervisor that becomes the agents' user (`--agent-user`):
    /// npm runs through it, as that user ([`Installer::with_agent_user`]).
    agent_user: Option<crate::os::tree::TreeSupervisor>,
}

impl Installer {
    /// An installer for `data_dir`; each install may take up to `timeout`;
    /// after a failure lazy installs wait
    /// [`DEFAULT_INSTALL_RETRY_BACKOFF_MS`] (see [`Self::with_retry_backoff`]).
    pub fn new(data_dir: PathBuf, timeout: Duration) -> Self {
        Self {
            data_dir,
            timeout,
            retry_backoff: Duration::from_millis(DEFAULT_INSTALL_RETRY_BACKOFF_MS),
            locks: parking_lot::Mutex::new(HashMap::new()),
            state: parking_lot::Mutex::new(InstallState::default()),
            http: OnceLock::new(),
            agent_user: None,
        }
    }

    /// The same installer, whose npm runs (`npm install`, which runs the
    /// packages' scripts, and `npm view`) go through `supervisor` as its
    /// user, when it has one (`--agent-user`; research/contract.md,
    /// "Agents under an unprivileged user"): `HOME` the agent's home, none
    /// of the server's secrets, and the installed files the server's again
    /// before it reads them.
    #[must_use]
    pub fn with_agent_user(mut self, supervisor: Option<crate::os::tree::TreeSupervisor>) -> Self {
        self.agent_user = supervisor.filter(|supervisor| supervisor.user.is_some());
        self
    }

    /// How npm runs for agent `id`: as the server's user, or as the agents'
    /// user with the agent's home (made the user's first) as `HOME`.
    async fn npm_as(&self, id: &str) -> Result<Option<AsUser>, String> {
        let Some(supervisor) = &self.agent_user else {
            return Ok(None);
        };
        let Some(user) = supervisor.user.clone() else {
            return Ok(None);
        };
        let home = self.agent_home(id);
        let made = home.clone();
        tokio::task::spawn_blocking(move || crate::os::user::prepare_home(&user, &made))
            .await
            .map_err(|e| format!("the task that makes the agent home failed: {e}"))?
            .map_err(|e| format!("cannot make the agent home {}: {e}", home.display()))?;
        Ok(Some(AsUser {
            supervisor: supervisor.clone(),
            home,
        }))
    }

    /// The same installer, whose lazy installs answer with the last failure
    /// for `backoff` after it (zero: always try again).
    #[must_use]
    pub fn with_retry_backoff(mut self, backoff: Duration) -> Self {
        self.retry_backoff = backoff;
        self
    }

    /// Whether an install of agent `id` is running in this process.
    pub fn is_installing(&self, id: &str) -> bool {
        self.state
            .lock()
            .running
            .iter()
            .any(|((agent, _), install)| agent == id && install.peek().is_none())
    }

    /// The data dir.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// `agents/<id>` under the data dir.
    pub fn agent_dir(&self, id: &str) -> PathBuf {
        self.data_dir.join("agents").join(id)
    }

    /// `homes/<id>` under the data dir: what `${AGENT_HOME}` stands for.
    pub fn agent_home(&self, id: &str) -> PathBuf {
        self.data_dir.join("homes").join(id)
    }

    /// Expands `${AGENT_HOME}` in `env` for agent `id`, creating the home
    /// folder when a value uses it.
    ///
    /// # Errors
    /// When the home folder cannot be created.
    pub fn expand_env(
        &self,
        id: &str,
        env: &[(String, String)],
    ) -> std::io::Result<Vec<(String, String)>> {
        let home = self.agent_home(id);
        let home_text = home.to_string_lossy();
        let mut created = false;
        let mut expanded = Vec::with_capacity(env.len());
        for (key, value) in env {
            if value.contains(AGENT_HOME_PLACEHOLDER) {
                if !created {
                    std::fs::create_dir_all(&home)?;
                    created = true;
                }
                expanded.push((
                    key.clone(),
                    value.replace(AGENT_HOME_PLACEHOLDER, &home_text),
                ));
            } else {
                expanded.push((key.clone(), value.clone()));
            }
        }
        Ok(expanded)
    }

    /// The active installed version of `spec`, if it is installed: the
    /// version the user pinned, else the manifest's exact version, else the
    /// last one installed (for `latest` and ranges). `None` for agents that
    /// are not installed by the runtime.
    pub fn installed(&self, spec: &AgentSpec) -> Option<Installation> {
        let Launch::Install(entry) = &spec.launch else {
            return None;
        };
        let chosen = entry.choose().ok()?;
        let agent_dir = self.agent_dir(&spec.id);
        let current = read_json::<Current>(&agent_dir.join(CURRENT));
        let version = match (current, concrete_version(&chosen)) {
            (Some(current), _) if current.pinned => current.version,
            (_, Some(version)) => version.to_owned(),
            (Some(current), None) => current.version,
            (None, None) => return None,
        };
        read_installation(&agent_dir, &version, &chosen)
    }

    /// Installs `spec` (see the module documentation). Runs in its own task,
    /// so dropping the returned future does not interrupt the install; a
    /// caller asking for the same install while it runs waits for that one.
    ///
    /// # Errors
    /// [`InstallError`]; the log has the same message.
    pub async fn install(
        self: &Arc<Self>,
        spec: &AgentSpec,
        options: InstallOptions,
        progress: Arc<dyn Progress>,
    ) -> Result<InstallOutcome, InstallError> {
        self.join_or_start(spec, options, progress, false).await
    }

    /// The install a first `initialize` does for an agent that is not
    /// installed: like [`Self::install`] with default options, but within
    /// the retry back-off after a failed install it answers with that
    /// failure at once.
    ///
    /// # Errors
    /// [`InstallError`], or the remembered one.
    pub async fn install_lazily(
        self: &Arc<Self>,
        spec: &AgentSpec,
        progress: Arc<dyn Progress>,
    ) -> Result<InstallOutcome, InstallError> {
        self.join_or_start(spec, InstallOptions::default(), progress, true)
            .await
    }

    /// Joins the running install of `spec` with `options`, or starts one in
    /// its own task (unless `backoff` and a default install failed within
    /// the retry back-off). A caller that joined gets `already_installed`
    /// and its own waiting time.
    async fn join_or_start(
        self: &Arc<Self>,
        spec: &AgentSpec,
        options: InstallOptions,
        progress: Arc<dyn Progress>,
        backoff: bool,
    ) -> Result<InstallOutcome, InstallError> {
        let started = Instant::now();
        let key = (spec.id.clone(), options);
        let (install, joined) = {
            let mut state = self.state.lock();
            match state.running.get(&key).filter(|i| i.peek().is_none()) {
                Some(install) => (install.clone(), true),
                None => {
                    if backoff && let Some(error) = self.backing_off(&state, &spec.id) {
                        return Err(error);
                    }
                    let install = self.spawn_install(spec, key.1.clone(), progress.clone());
                    state.running.insert(key, install.clone());
                    (install, false)
                }
            }
        };
        if joined {
            progress.step("waiting for the same install, already running");
        }
        let outcome = install.await?;
        Ok(if joined {
            InstallOutcome {
                already_installed: true,
                duration: started.elapsed(),
                ..outcome
            }
        } else {
            outcome
        })
    }

    /// The remembered failure of agent `id`'s default install, when it is
    /// more recent than the retry back-off, with a note saying so.
    fn backing_off(&self, state: &InstallState, id: &str) -> Option<InstallError> {
        let failure = state.failures.get(id)?;
        let left = self.retry_backoff.checked_sub(failure.at.elapsed())?;
        if failure.options != InstallOptions::default() || left.is_zero() {
            return None;
        }
        let note = format!(
            "{}; not tried again for another {:.1} s (an explicit install tries at once: POST /v2/agents/{id}/install)",
            failure.error,
            left.as_secs_f64()
        );
        Some(match failure.error {
            InstallError::NotInstallable(_) => InstallError::NotInstallable(note),
            InstallError::InvalidVersion(_) => InstallError::InvalidVersion(note),
            InstallError::Failed(_) => InstallError::Failed(note),
        })
    }

    /// Starts installing `spec` in a task of its own, which logs and
    /// records the outcome and then leaves the running installs.
    fn spawn_install(
        self: &Arc<Self>,
        spec: &AgentSpec,
        options: InstallOptions,
        progress: Arc<dyn Progress>,
    ) -> SharedInstall {
        let installer = self.clone();
        let spec = spec.clone();
        let agent = spec.id.clone();
        let task = tokio::spawn(async move {
            let outcome = installer.install_now(&spec, &options, &*progress).await;
            installer.settle(&spec.id, options, &outcome);
            outcome
        });
        async move {
            task.await.unwrap_or_else(|error| {
                Err(InstallError::Failed(format!(
                    "the install task of agent {agent:?} failed: {error}"
                )))
            })
        }
        .boxed()
        .shared()
    }

    /// Logs a failed install and remembers it (a success forgets the last
    /// failure); then the install leaves the running ones. A bad version
    /// request is the caller's mistake, not the agent's state: not kept.
    fn settle(
        &self,
        id: &str,
        options: InstallOptions,
        outcome: &Result<InstallOutcome, InstallError>,
    ) {
        if let Err(error) = outcome {
            tracing::warn!(agent = id, %error, "agent install failed");
        }
        let mut state = self.state.lock();
        match outcome {
            Ok(_) => {
                state.failures.remove(id);
            }
            Err(InstallError::InvalidVersion(_)) => {}
            Err(error) => {
                let failure = Failure {
                    at: Instant::now(),
                    error: error.clone(),
                    options: options.clone(),
                };
                state.failures.insert(id.to_owned(), failure);
            }
        }
        state.running.remove(&(id.to_owned(), options));
    }

    /// The install, in its own task: check what to install, take the
    /// agent's locks, reuse the version when it is there, else stage it
    /// and move it into place.
    async fn install_now(
        &self,
        spec: &AgentSpec,
        options: &InstallOptions,
        progress: &dyn Progress,
    ) -> Result<InstallOutcome, InstallError> {
        let started = Instant::now();
        let mut plan = Plan::new(spec, options)?;
        self.resolve(&mut plan, progress).await?;
        let agent = self.lock_agent(plan.id, progress).await?;
        if !options.reinstall
            && let Some(installation) = plan.reuse(&agent.dir)?
        {
            return Ok(InstallOutcome {
                installation,
                already_installed: true,
                duration: started.elapsed(),
            });
        }
        let (staging, version) = self.stage(&plan, &agent.dir, progress).await?;
        let (installation, already_installed) =
            plan.activate(&staging, &agent.dir, &version, options.reinstall)?;
        let duration = started.elapsed();
        tracing::info!(
            agent = plan.id,
            version,
            path = %installation.program.display(),
            duration_ms = duration.as_millis() as u64,
            already_installed,
            "agent installed"
        );
        Ok(InstallOutcome {
            installation,
            already_installed,
            duration,
        })
    }

    /// Resolves a version spec that is not exact (`latest`, a range) of an npm
    /// plan to the concrete version it names now (`npm view`), so that a
    /// version already installed is reused and the exact version is what
    /// gets installed.
    async fn resolve(
        &self,
        plan: &mut Plan<'_>,
        progress: &dyn Progress,
    ) -> Result<(), InstallError> {
        let Chosen::Npm { name, .. } = &plan.chosen else {
            return Ok(());
        };
        if is_exact_version(&plan.requested) {
            return Ok(());
        }
        let id = plan.id;
        let dir = self.agent_dir(id);
        std::fs::create_dir_all(&dir)
            .map_err(|e| InstallError::Failed(format!("cannot create {}: {e}", dir.display())))?;
        progress.step(&format!("resolving {name}@{}", plan.requested));
        let as_user = self.npm_as(id).await.map_err(InstallError::Failed)?;
        let viewed = tokio::time::timeout(
            self.timeout,
            npm_view_version(&dir, name, &plan.requested, as_user.as_ref()),
        )
        .await;
        let version = match viewed {
            Ok(Ok(version)) => version,
            Ok(Err(reason)) => {
                return Err(InstallError::Failed(format!(
                    "cannot resolve {name}@{} for agent {id:?}: {reason}",
                    plan.requested
                )));
            }
            Err(_) => {
                return Err(InstallError::Failed(format!(
                    "resolving {name}@{} for agent {id:?} did not finish within {} s",
                    plan.requested,
                    self.timeout.as_secs()
                )));
            }
        };
        tracing::info!(agent = id, spec = %plan.requested, version, "resolved the version to install");
        plan.requested = version;
        Ok(())
    }

    /// Takes agent `id`'s install locks: this process's, then the file lock
    /// across processes (creating the agent's folder); then removes what
    /// interrupted installs left there.
    async fn lock_agent(
        &self,
        id: &str,
        progress: &dyn Progress,
    ) -> Result<AgentLock, InstallError> {
        let lock = self.locks.lock().entry(id.to_owned()).or_default().clone();
        let in_process = lock.lock_owned().await;
        let dir = self.agent_dir(id);
        std::fs::create_dir_all(&dir)
            .map_err(|e| InstallError::Failed(format!("cannot create {}: {e}", dir.display())))?;
        let across_processes = lock_file(dir.join(".lock"), id, progress).await?;
        remove_leftovers(&dir);
        Ok(AgentLock {
            dir,
            _across_processes: across_processes,
            _in_process: in_process,
        })
    }

    /// Fetches the plan's artifact into a new staging folder in
    /// `agent_dir`, within the install timeout, and writes its receipt
    /// there; returns the staging folder and the installed version.
    async fn stage(
        &self,
        plan: &Plan<'_>,
        agent_dir: &Path,
        progress: &dyn Progress,
    ) -> Result<(Staging, String), InstallError> {
        let id = plan.id;
        let artifact = plan.artifact(&plan.requested);
        tracing::info!(agent = id, artifact, "installing agent");
        progress.step(&format!("installing {artifact}"));
        let staging = Staging::new(agent_dir).map_err(InstallError::Failed)?;
        let fetched =
            tokio::time::timeout(self.timeout, self.fetch(plan, &staging, progress)).await;
        let (version, program) = match fetched {
            Ok(Ok(fetched)) => fetched,
            Ok(Err(reason)) => {
                return Err(InstallError::Failed(format!(
                    "installing agent {id:?} from {artifact} failed: {reason}"
                )));
            }
            Err(_) => {
                return Err(InstallError::Failed(format!(
                    "installing agent {id:?} from {artifact} did not finish within {} s",
                    self.timeout.as_secs()
                )));
            }
        };
        let receipt = Receipt {
            agent: id.to_owned(),
            version: version.clone(),
            kind: kind_of(&plan.chosen).to_owned(),
            artifact: plan.artifact(&version),
            program,
            installed_at: crate::time::rfc3339(std::time::SystemTime::now()),
        };
        write_json(&staging.dir.join(RECEIPT), &receipt).map_err(InstallError::Failed)?;
        Ok((staging, version))
    }

    /// Installs the plan's npm package or release archive into
    /// `staging.dir`; returns the installed version and the program,
    /// relative to `staging.dir`.
    async fn fetch(
        &self,
        plan: &Plan<'_>,
        staging: &Staging,
        progress: &dyn Progress,
    ) -> Result<(String, PathBuf), String> {
        match &plan.chosen {
            Chosen::Npm { npx, name, .. } => {
                let as_user = self.npm_as(plan.id).await?;
                if let Some(user) = as_user.as_ref().and_then(|a| a.supervisor.user.as_ref()) {
                    // npm fills the staging folder as the user; it is the
                    // server's again before anything in it is read.
                    std::os::unix::fs::chown(&staging.dir, Some(user.uid), Some(user.gid))
                        .map_err(|e| {
                            format!("cannot hand {} to the user: {e}", staging.dir.display())
                        })?;
                }
                npm_install(
                    &staging.dir,
                    name,
                    &plan.requested,
                    npx.cmd.as_deref(),
                    as_user.as_ref(),
                    progress,
                )
                .await
            }
            Chosen::Binary { target, version } => {
                download::install_archive(&self.http, staging, target, progress)
                    .await
                    .map(|program| ((*version).to_owned(), program))
            }
        }
    }
}

/// One install, decided before anything is touched: which distribution
/// and which version.
struct Plan<'a> {
    /// The agent id.
    id: &'a str,
    /// The manifest's distribution for this platform.
    chosen: Chosen<'a>,
    /// The version (spec) to install: the one asked for, else the
    /// manifest's; an npm spec that is not exact becomes the version it
    /// resolves to ([`Installer::resolve`]).
    requested: String,
    /// `requested` is not the manifest's version: it stays the active
    /// version until another install names one.
    pinned: bool,
}

impl<'a> Plan<'a> {
    /// Checks that `spec` can be installed here in the version `options`
    /// ask for.
    fn new(spec: &'a AgentSpec, options: &'a InstallOptions) -> Result<Self, InstallError> {
        let id = spec.id.as_str();
        let Launch::Install(entry) = &spec.launch else {
            return Err(InstallError::NotInstallable(format!(
                "agent {id:?} runs a fixed command; there is nothing to install"
            )));
        };
        let chosen = entry.choose().map_err(|reason| {
            InstallError::NotInstallable(format!("agent {id:?} cannot be installed here: {reason}"))
        })?;
        let wanted = chosen.version();
        let requested = options.version.as_deref().unwrap_or(wanted);
        check_version_spec(requested).map_err(InstallError::InvalidVersion)?;
        if matches!(chosen, Chosen::Binary { .. }) && requested != wanted {
            return Err(InstallError::InvalidVersion(format!(
                "agent {id:?} comes from a release archive; only its manifest version {wanted} can be installed"
            )));
        }
        Ok(Self {
            id,
            chosen,
            requested: requested.to_owned(),
            pinned: requested != wanted,
        })
    }

    /// What is installed, for the log and the receipt: `npm <name>@<version>`
    /// or the archive URL.
    fn artifact(&self, version: &str) -> String {
        match &self.chosen {
            Chosen::Npm { name, .. } => format!("npm {name}@{version}"),
            Chosen::Binary { target, .. } => target.archive.clone(),
        }
    }

    /// The installation already in `agent_dir` when an exact version is
    /// requested and is there; it becomes the active version.
    fn reuse(&self, agent_dir: &Path) -> Result<Option<Installation>, InstallError> {
        let version = self.requested.as_str();
        if !is_exact_version(version) {
            return Ok(None);
        }
        let Some(installation) = read_installation(agent_dir, version, &self.chosen) else {
            return Ok(None);
        };
        write_current(agent_dir, version, self.pinned).map_err(InstallError::Failed)?;
        tracing::info!(agent = self.id, version, path = %installation.program.display(), "agent already installed");
        Ok(Some(installation))
    }

    /// Moves the staged `version` into place and makes it the active
    /// version; returns the installation and whether a valid install of
    /// that version was already there (the staged copy is then dropped).
    fn activate(
        &self,
        staging: &Staging,
        agent_dir: &Path,
        version: &str,
        reinstall: bool,
    ) -> Result<(Installation, bool), InstallError> {
        let id = self.id;
        let already_installed = staging
            .put_in_place(agent_dir, version, reinstall, &self.chosen)
            .map_err(InstallError::Failed)?;
        write_current(agent_dir, version, self.pinned).map_err(InstallError::Failed)?;
        let installation =
            read_installation(agent_dir, version, &self.chosen).ok_or_else(|| {
                InstallError::Failed(format!(
                    "agent {id:?} {version} was installed but its receipt cannot be read back"
                ))
            })?;
        Ok((installation, already_installed))
    }
}

/// Both install locks of one agent, held while it is installed, and its
/// folder `agents/<id>`.
struct AgentLock {
    dir: PathBuf,
    /// The file lock across processes sharing the data dir; released first
    /// (fields drop in order).
    _across_processes: Flock<File>,
    /// The lock in this process.
    _in_process: tokio::sync::OwnedMutexGuard<()>,
}

/// Takes the agent's install lock file; waits (telling `progress`) while
/// another process holds it.
async fn lock_file(
    path: PathBuf,
    agent: &str,
    progress: &dyn Progress,
) -> Result<Flock<File>, InstallError> {
    let failed = |path: &Path, e: &dyn std::fmt::Display| {
        InstallError::Failed(format!("cannot lock {}: {e}", path.display()))
    };
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| failed(&path, &e))?;
    let file = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => return Ok(lock),
        Err((file, nix::errno::Errno::EWOULDBLOCK)) => file,
        Err((_, errno)) => return Err(failed(&path, &errno)),
    };
    progress.step(&format!(
        "waiting for another sandbox-agent to finish installing {agent}"
    ));
    tracing::info!(agent, lock = %path.display(), "waiting for another process's install");
    tokio::task::spawn_blocking(move || {
        Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, errno)| failed(&path, &errno))
    })
    .await
    .map_err(|e| InstallError::Failed(format!("the lock task failed: {e}")))?
}

/// The version folder the manifest names, when it names exactly one.
fn concrete_version<'a>(chosen: &Chosen<'a>) -> Option<&'a str> {
    match *chosen {
        Chosen::Binary { version, .. } => Some(version),
        Chosen::Npm { version, .. } => is_exact_version(version).then_some(version),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_failed_default_install_holds_lazy_installs_back_for_the_back_off() {
        let installer = Installer::new(std::env::temp_dir(), Duration::from_secs(1))
            .with_retry_backoff(Duration::from_secs(60));
        let failure = |options: InstallOptions| Failure {
            at: Instant::now(),
            error: InstallError::Failed("npm exited with code 1".to_owned()),
            options,
        };
        let mut state = InstallState::default();
        assert!(installer.backing_off(&state, "codex").is_none());
        state
            .failures
            .insert("codex".to_owned(), failure(InstallOptions::default()));
        let error = installer.backing_off(&state, "codex").expect("backing off");
        assert!(
            matches!(&error, InstallError::Failed(text) if text.contains("npm exited with code 1") && text.contains("not tried again")),
            "{error}"
        );
        let pinned = InstallOptions {
            version: Some("0.1.0".to_owned()),
            reinstall: false,
        };
        state.failures.insert("codex".to_owned(), failure(pinned));
        assert!(
            installer.backing_off(&state, "codex").is_none(),
            "another version's failure does not hold the default install back"
        );
        let installer = installer.with_retry_backoff(Duration::ZERO);
        state
            .failures
            .insert("codex".to_owned(), failure(InstallOptions::default()));
        assert!(
            installer.backing_off(&state, "codex").is_none(),
            "no back-off"
        );
    }

    #[test]
    fn agent_home_is_expanded_and_created() {
        let data =
            std::env::temp_dir().join(format!("install-test-{}", uuid::Uuid::new_v4().simple()));
        let installer = Installer::new(data.clone(), Duration::from_secs(1));
        let env = installer
            .expand_env(
                "codex",
                &[
                    ("CODEX_HOME".to_owned(), "${AGENT_HOME}".to_owned()),
                    ("X".to_owned(), "${AGENT_HOME}/x".to_owned()),
                    ("Y".to_owned(), "plain".to_owned()),
                ],
            )
            .expect("expand");
        let home = data.join("homes/codex");
        assert_eq!(env[0].1, home.to_string_lossy());
        assert_eq!(env[1].1, format!("{}/x", home.display()));
        assert_eq!(env[2].1, "plain");
        assert!(home.is_dir());
        let _ = std::fs::remove_dir_all(&data);
    }
}
