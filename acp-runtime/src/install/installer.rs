//! Installing agents into the data dir
//! (research/contract.md, "Agents: manifest, installs, lazy install").
//!
//! Layout, under the data dir:
//!
//! ```text
//! agents/<id>/<version>/              one installed version (npm prefix or unpacked archive)
//! agents/<id>/<version>/.sandbox-agent-install.json   its receipt: kind, artifact, program
//! agents/<id>/current.json            the active version, and whether the user pinned it
//! agents/<id>/.lock                   advisory lock (flock) held while installing
//! agents/<id>/.tmp-<uuid>/            an install in progress, renamed into place when done
//! homes/<id>/                         ${AGENT_HOME}: the agent's own config and state
//! ```
//!
//! npm packages are installed with the machine's `npm` into a fresh prefix
//! (never globally, never into the user's npm prefix), so npm resolves
//! platform sub-packages (optional dependencies) as it always does; the agent
//! is the package's `bin`. Release archives are downloaded over HTTPS (plain
//! HTTP only from a loopback host), checked against their SHA-256 when the
//! manifest gives one, and unpacked by [`crate::archive`].
//!
//! One install at a time per agent: an async lock in this process and a file
//! lock across processes sharing the data dir. Every install is staged in a
//! temporary folder and renamed into place, so a failed or interrupted one
//! leaves nothing half-written; an install already present is a no-op.
//! Installs run in their own task: an HTTP caller that hangs up does not cut
//! one short, and the task logs and records how it ended. Callers asking for
//! the same install while it runs share it and its outcome. A failure is
//! remembered (`lastError`), and for a short back-off a lazy install of the
//! agent answers with it instead of running npm again. npm gets bounded
//! network retries and timeouts ([`NPM_NETWORK_DEFAULTS`]), so an
//! unreachable registry fails in seconds. A version spec that is not exact
//! (`latest`, a range) is resolved with `npm view` first, so a version that
//! is already there is not installed again.

use super::manifest::{
    self, AGENT_HOME_PLACEHOLDER, Chosen, check_version_dir_name, check_version_spec,
    is_exact_version,
};
use crate::archive;
use crate::config::{AgentSpec, DEFAULT_INSTALL_RETRY_BACKOFF_MS, Launch};
use crate::process_group::signal_group;
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use nix::fcntl::{Flock, FlockArg};
use nix::sys::signal::Signal;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};

/// File name of an install's receipt inside its version folder.
const RECEIPT: &str = ".sandbox-agent-install.json";
/// File name of the active-version record in an agent's folder.
const CURRENT: &str = "current.json";
/// Prefix of staging folders (installs in progress).
const STAGING_PREFIX: &str = ".tmp-";
/// Prefix of replaced versions waiting to be removed.
const OLD_PREFIX: &str = ".old-";
/// Lines of npm output kept for the error message of a failed install.
const OUTPUT_TAIL_LINES: usize = 25;
/// Longest npm output line kept, in bytes.
const OUTPUT_MAX_LINE: usize = 1024;
/// Largest archive download accepted, in bytes (2 GiB): an untrusted server
/// must not fill the disk. Agent releases today are a few hundred MiB at most.
const MAX_DOWNLOAD_BYTES: u64 = 2 << 30;
/// How often download progress is reported.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);
/// npm's network settings for installs, each unless the server's environment
/// sets it (`npm_config_fetch_retries`, …): npm's own defaults retry an
/// unreachable registry for over a minute (10 s and 60 s apart), which
/// every waiting request would sit through. Two retries 1 s and 2-4 s
/// apart, and at most 60 s per request.
pub const NPM_NETWORK_DEFAULTS: [(&str, &str); 5] = [
    ("fetch-retries", "2"),
    ("fetch-retry-factor", "2"),
    ("fetch-retry-mintimeout", "1000"),
    ("fetch-retry-maxtimeout", "4000"),
    ("fetch-timeout", "60000"),
];

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

/// An installed version of an agent, ready to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installation {
    /// The concrete version (the folder name).
    pub version: String,
    /// The version's folder.
    pub dir: PathBuf,
    /// The program to run (inside `dir`).
    pub program: PathBuf,
    /// Arguments after the program, from the manifest.
    pub args: Vec<String>,
    /// The distribution's environment, from the manifest (unexpanded).
    pub env: Vec<(String, String)>,
    /// What was installed: `npm @scope/name@1.2.3` or the archive URL.
    pub artifact: String,
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

/// Receives progress lines while an install runs (the CLI shows them in a
/// spinner; the server logs them at debug level).
pub trait Progress: Send + Sync {
    /// One step or one line of npm output.
    fn step(&self, message: &str);
}

/// [`Progress`] into the log, at debug level.
#[derive(Debug)]
pub struct LogProgress {
    /// The agent being installed.
    pub agent: String,
}

impl Progress for LogProgress {
    fn step(&self, message: &str) {
        tracing::debug!(agent = %self.agent, "install: {message}");
    }
}

/// The receipt written into each installed version's folder.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Receipt {
    agent: String,
    version: String,
    /// `npm` or `binary`.
    kind: String,
    artifact: String,
    /// The program, relative to the version folder.
    program: PathBuf,
    installed_at: String,
}

/// `agents/<id>/current.json`.
#[derive(Debug, Serialize, Deserialize)]
struct Current {
    version: String,
    /// Chosen by the user (`--version`), not the manifest: kept even when the
    /// manifest's version changes.
    pinned: bool,
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
        }
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
        let viewed =
            tokio::time::timeout(self.timeout, npm_view_version(&dir, name, &plan.requested)).await;
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
                npm_install(
                    &staging.dir,
                    name,
                    &plan.requested,
                    npx.cmd.as_deref(),
                    progress,
                )
                .await
            }
            Chosen::Binary { target, version } => self
                .install_archive(staging, target, progress)
                .await
                .map(|program| ((*version).to_owned(), program)),
        }
    }

    /// Downloads, checks and unpacks a release archive into `staging.dir`;
    /// returns the program's path relative to it.
    async fn install_archive(
        &self,
        staging: &Staging,
        target: &manifest::BinaryTarget,
        progress: &dyn Progress,
    ) -> Result<PathBuf, String> {
        let url = reqwest::Url::parse(&target.archive)
            .map_err(|e| format!("bad archive URL {:?}: {e}", target.archive))?;
        if !url_allowed(&url) {
            return Err(format!(
                "archive URL {url} must use https (plain http only from a loopback host)"
            ));
        }
        let format = archive::format_of(url.path())?;
        let program = archive::safe_relative(Path::new(&target.cmd))
            .map_err(|e| format!("bad cmd {:?}: {e}", target.cmd))?;
        let digest = self.download(&url, &staging.download, progress).await?;
        if let Some(expected) = &target.sha256
            && !expected.eq_ignore_ascii_case(&digest)
        {
            return Err(format!(
                "sha256 mismatch for {url}: the manifest expects {expected}, the download is {digest}"
            ));
        }
        progress.step("unpacking");
        let (download, dir, bare) = (
            staging.download.clone(),
            staging.dir.clone(),
            program.clone(),
        );
        tokio::task::spawn_blocking(move || {
            archive::unpack(format, &download, &dir, &bare, archive::Limits::DEFAULT)
        })
        .await
        .map_err(|e| format!("the unpack task failed: {e}"))??;
        make_executable(&staging.dir.join(&program))
            .map_err(|e| format!("the archive has no program {} ({e})", program.display()))?;
        Ok(program)
    }

    /// Streams `url` into `path`; returns the SHA-256 of what was written, hex.
    async fn download(
        &self,
        url: &reqwest::Url,
        path: &Path,
        progress: &dyn Progress,
    ) -> Result<String, String> {
        let client = self.http_client()?;
        progress.step(&format!("downloading {url}"));
        let mut response = client
            .get(url.clone())
            .send()
            .await
            .map_err(|e| format!("cannot download {url}: {}", error_chain(&e)))?;
        let status = response.status();
        if !status.is_success() {
            return Err(format!("downloading {url} failed: HTTP {status}"));
        }
        let total = response.content_length();
        if let Some(total) = total.filter(|&total| total > MAX_DOWNLOAD_BYTES) {
            return Err(format!(
                "{url} is {}, more than the {} an agent download may be",
                mib(total),
                mib(MAX_DOWNLOAD_BYTES)
            ));
        }
        let mut file = tokio::fs::File::create(path)
            .await
            .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        let mut hasher = Sha256::new();
        let mut received: u64 = 0;
        let mut reported = Instant::now();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| format!("downloading {url} broke off: {}", error_chain(&e)))?
        {
            hasher.update(&chunk);
            file.write_all(&chunk)
                .await
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            received += chunk.len() as u64;
            if received > MAX_DOWNLOAD_BYTES {
                return Err(format!(
                    "{url} is more than the {} an agent download may be",
                    mib(MAX_DOWNLOAD_BYTES)
                ));
            }
            if reported.elapsed() >= PROGRESS_EVERY {
                reported = Instant::now();
                progress.step(&match total {
                    Some(total) => format!("downloaded {} of {}", mib(received), mib(total)),
                    None => format!("downloaded {}", mib(received)),
                });
            }
        }
        file.flush()
            .await
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        if total.is_some_and(|total| total != received) {
            return Err(format!("downloading {url} ended early ({received} bytes)"));
        }
        Ok(hasher
            .finalize()
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect())
    }

    fn http_client(&self) -> Result<&reqwest::Client, String> {
        if let Some(client) = self.http.get() {
            return Ok(client);
        }
        let policy = reqwest::redirect::Policy::custom(|attempt| {
            if attempt.previous().len() >= 10 {
                attempt.error("too many redirects")
            } else if url_allowed(attempt.url()) {
                attempt.follow()
            } else {
                attempt.error("redirect to a URL that is not https")
            }
        });
        let client = reqwest::Client::builder()
            .redirect(policy)
            .connect_timeout(Duration::from_secs(30))
            .user_agent(concat!("sandbox-agent/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {}", error_chain(&e)))?;
        Ok(self.http.get_or_init(|| client))
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

/// A staging folder `agents/<id>/.tmp-<uuid>/` (and its download file),
/// removed on drop unless it was renamed into place.
struct Staging {
    dir: PathBuf,
    download: PathBuf,
}

impl Staging {
    fn new(agent_dir: &Path) -> Result<Self, String> {
        let name = format!("{STAGING_PREFIX}{}", uuid::Uuid::new_v4().simple());
        let dir = agent_dir.join(&name);
        std::fs::create_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        Ok(Self {
            download: agent_dir.join(format!("{name}.download")),
            dir,
        })
    }

    /// Renames the staged install to `agents/<id>/<version>`. Returns `true`
    /// (and discards the staged copy) when a valid install of that version is
    /// already there and `reinstall` is off.
    fn put_in_place(
        &self,
        agent_dir: &Path,
        version: &str,
        reinstall: bool,
        chosen: &Chosen<'_>,
    ) -> Result<bool, String> {
        check_version_dir_name(version)?;
        let target = agent_dir.join(version);
        if target.symlink_metadata().is_ok() {
            if !reinstall && read_installation(agent_dir, version, chosen).is_some() {
                return Ok(true);
            }
            let old = agent_dir.join(format!("{OLD_PREFIX}{}", uuid::Uuid::new_v4().simple()));
            std::fs::rename(&target, &old)
                .map_err(|e| format!("cannot move the old {} aside: {e}", target.display()))?;
            let placed = std::fs::rename(&self.dir, &target);
            if let Err(error) = std::fs::remove_dir_all(&old) {
                tracing::warn!(path = %old.display(), %error, "cannot remove the replaced install");
            }
            placed.map_err(|e| format!("cannot move the install into place: {e}"))?;
        } else {
            std::fs::rename(&self.dir, &target)
                .map_err(|e| format!("cannot move the install into place: {e}"))?;
        }
        Ok(false)
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if self.dir.exists()
            && let Err(error) = std::fs::remove_dir_all(&self.dir)
        {
            tracing::warn!(path = %self.dir.display(), %error, "cannot remove a staging folder");
        }
        let _ = std::fs::remove_file(&self.download);
    }
}

/// Runs `npm install` of `name@version` into the prefix `prefix`; returns the
/// installed version and the program relative to `prefix`.
async fn npm_install(
    prefix: &Path,
    name: &str,
    version: &str,
    cmd: Option<&str>,
    progress: &dyn Progress,
) -> Result<(String, PathBuf), String> {
    let spec = format!("{name}@{version}");
    let mut command = npm_command(prefix)?;
    command
        .arg("install")
        .arg("--prefix")
        .arg(prefix)
        .args([
            "--no-audit",
            "--no-fund",
            "--no-save",
            "--omit=dev",
            "--global=false",
        ])
        .arg(&spec);
    progress.step(&format!("npm install {spec}"));
    tracing::info!(prefix = %prefix.display(), "running npm install {spec}");
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot run npm: {e}"))?;
    let group = GroupGuard(child.id());
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return Err("npm's output was not piped".to_owned());
    };
    let tail = parking_lot::Mutex::new(VecDeque::new());
    let (status, (), ()) = tokio::join!(
        child.wait(),
        pump(stdout, &tail, progress),
        pump(stderr, &tail, progress)
    );
    drop(group);
    let status = status.map_err(|e| format!("cannot wait for npm: {e}"))?;
    if !status.success() {
        let tail: Vec<String> = tail.into_inner().into();
        return Err(format!(
            "npm exited with {}; npm said:\n{}",
            exit_text(status),
            tail.join("\n")
        ));
    }
    resolve_npm_bin(prefix, name, cmd)
}

/// `npm` (found on `PATH`) in `dir`, in a process group of its own (a
/// timeout or a dropped caller stops its children too), with stdin closed,
/// stdout and stderr piped, no update check, and the network settings of
/// [`NPM_NETWORK_DEFAULTS`] that the environment does not set.
fn npm_command(dir: &Path) -> Result<tokio::process::Command, String> {
    let npm = find_on_path("npm").ok_or(
        "npm was not found on PATH; install Node.js (it ships npm) to install npm-based agents",
    )?;
    let mut command = tokio::process::Command::new(npm);
    command
        .arg("--update-notifier=false")
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    for (name, value) in NPM_NETWORK_DEFAULTS {
        let variable = format!("npm_config_{}", name.replace('-', "_"));
        // npm reads its variables in any case.
        let set = std::env::vars_os().any(|(key, _)| {
            key.to_str()
                .is_some_and(|k| k.eq_ignore_ascii_case(&variable))
        });
        if !set {
            command.env(variable, value);
        }
    }
    Ok(command)
}

/// The concrete version `npm view name@spec version --json` names: the
/// one version, or the newest of those a range matches.
async fn npm_view_version(dir: &Path, name: &str, spec: &str) -> Result<String, String> {
    let package = format!("{name}@{spec}");
    let mut command = npm_command(dir)?;
    command.args(["view", &package, "version", "--json"]);
    tracing::info!("running npm view {package} version");
    let child = command
        .spawn()
        .map_err(|e| format!("cannot run npm: {e}"))?;
    let group = GroupGuard(child.id());
    let output = child
        .wait_with_output()
        .await
        .map_err(|e| format!("cannot wait for npm: {e}"))?;
    drop(group);
    if !output.status.success() {
        let said: Vec<&str> = std::str::from_utf8(&output.stderr)
            .unwrap_or_default()
            .lines()
            .chain(
                std::str::from_utf8(&output.stdout)
                    .unwrap_or_default()
                    .lines(),
            )
            .filter(|line| !line.trim().is_empty())
            .collect();
        let tail = &said[said.len().saturating_sub(OUTPUT_TAIL_LINES)..];
        return Err(format!(
            "npm view exited with {}; npm said:\n{}",
            exit_text(output.status),
            tail.join("\n")
        ));
    }
    newest_version(&output.stdout)
        .ok_or_else(|| format!("no published version of {name} matches {spec:?}"))
}

/// The version in `npm view … version --json` output: a JSON string, or
/// the newest exact version of an array (a range matching several).
fn newest_version(json: &[u8]) -> Option<String> {
    let versions = match serde_json::from_slice::<serde_json::Value>(json).ok()? {
        serde_json::Value::String(version) => vec![version],
        serde_json::Value::Array(values) => values
            .into_iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        _ => return None,
    };
    versions
        .into_iter()
        .filter(|v| is_exact_version(v))
        .max_by(|a, b| version_key(a).cmp(&version_key(b)))
}

/// Sort key of an exact version (semver precedence, simplified): the three
/// numbers, then a release above its pre-releases, then the pre-release
/// text; build metadata is ignored.
fn version_key(version: &str) -> (u64, u64, u64, bool, &str) {
    let version = version.split('+').next().unwrap_or(version);
    let (core, pre) = match version.split_once('-') {
        Some((core, pre)) => (core, Some(pre)),
        None => (version, None),
    };
    let mut numbers = core.split('.').map(|n| n.parse::<u64>().unwrap_or(0));
    let mut next = || numbers.next().unwrap_or(0);
    (next(), next(), next(), pre.is_none(), pre.unwrap_or(""))
}

/// An exit status as text: `code N`, or the signal.
fn exit_text(status: std::process::ExitStatus) -> String {
    match status.code() {
        Some(code) => format!("code {code}"),
        None => status.to_string(),
    }
}

/// Reads the installed package's `package.json`: its version and the `bin`
/// to run (`cmd`, else the one named like the package, else the only one).
fn resolve_npm_bin(
    prefix: &Path,
    name: &str,
    cmd: Option<&str>,
) -> Result<(String, PathBuf), String> {
    let package_dir = Path::new("node_modules").join(name);
    let manifest_path = prefix.join(&package_dir).join("package.json");
    let package: serde_json::Value = std::fs::read(&manifest_path)
        .map_err(|e| {
            format!(
                "npm did not install {name} ({}: {e})",
                manifest_path.display()
            )
        })
        .and_then(|bytes| {
            serde_json::from_slice(&bytes)
                .map_err(|e| format!("{} is not JSON: {e}", manifest_path.display()))
        })?;
    let version = package
        .get("version")
        .and_then(|v| v.as_str())
        .ok_or_else(|| format!("{} has no version", manifest_path.display()))?
        .to_owned();
    check_version_dir_name(&version)?;
    let unscoped = name.rsplit('/').next().unwrap_or(name);
    let bin = match package.get("bin") {
        Some(serde_json::Value::String(path)) => path.clone(),
        Some(serde_json::Value::Object(bins)) => {
            let pick = cmd.unwrap_or(unscoped);
            match bins.get(pick).and_then(|v| v.as_str()) {
                Some(path) => path.to_owned(),
                None if cmd.is_none() && bins.len() == 1 => bins
                    .values()
                    .next()
                    .and_then(|v| v.as_str())
                    .unwrap_or_default()
                    .to_owned(),
                None => {
                    let names: Vec<&str> = bins.keys().map(String::as_str).collect();
                    return Err(format!(
                        "package {name} has no command {pick:?} (it has: {}); name one with distribution.npx.cmd",
                        names.join(", ")
                    ));
                }
            }
        }
        _ => return Err(format!("package {name} declares no bin to run")),
    };
    let program = package_dir.join(
        archive::safe_relative(Path::new(&bin))
            .map_err(|e| format!("package {name} has an unsafe bin: {e}"))?,
    );
    make_executable(&prefix.join(&program))
        .map_err(|e| format!("the bin {} of {name} is missing ({e})", program.display()))?;
    Ok((version, program))
}

/// Copies lines of npm output into `tail` (last [`OUTPUT_TAIL_LINES`]) and
/// `progress`.
async fn pump(
    stream: impl AsyncRead + Unpin,
    tail: &parking_lot::Mutex<VecDeque<String>>,
    progress: &dyn Progress,
) {
    let mut reader = BufReader::new(stream);
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        line.truncate(OUTPUT_MAX_LINE);
        let text = String::from_utf8_lossy(&line).trim_end().to_owned();
        if text.is_empty() {
            continue;
        }
        progress.step(&text);
        let mut tail = tail.lock();
        if tail.len() == OUTPUT_TAIL_LINES {
            tail.pop_front();
        }
        tail.push_back(text);
    }
}

/// Kills a process group when dropped (a timed-out npm and its children).
struct GroupGuard(Option<u32>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            signal_group(pid, Signal::SIGKILL);
        }
    }
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

/// Removes staging folders and replaced versions left by an interrupted
/// install. Only called with the agent's file lock held, so none is in use.
fn remove_leftovers(agent_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(agent_dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if !name.starts_with(STAGING_PREFIX) && !name.starts_with(OLD_PREFIX) {
            continue;
        }
        let path = entry.path();
        let removed = if path.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        match removed {
            Ok(()) => {
                tracing::info!(path = %path.display(), "removed the leftovers of an interrupted install")
            }
            Err(error) => tracing::warn!(path = %path.display(), %error, "cannot remove leftovers"),
        }
    }
}

/// The installation of `version` in `agent_dir`, if its receipt is there,
/// matches the chosen distribution's kind, and its program exists.
fn read_installation(agent_dir: &Path, version: &str, chosen: &Chosen<'_>) -> Option<Installation> {
    check_version_dir_name(version).ok()?;
    let dir = agent_dir.join(version);
    let receipt = read_json::<Receipt>(&dir.join(RECEIPT))?;
    if receipt.kind != kind_of(chosen) || receipt.version != version {
        return None;
    }
    let program = dir.join(archive::safe_relative(&receipt.program).ok()?);
    if !program.is_file() {
        return None;
    }
    Some(Installation {
        version: version.to_owned(),
        program,
        args: chosen.args().to_vec(),
        env: chosen.env().clone().into_iter().collect(),
        artifact: receipt.artifact,
        dir,
    })
}

fn kind_of(chosen: &Chosen<'_>) -> &'static str {
    match chosen {
        Chosen::Npm { .. } => "npm",
        Chosen::Binary { .. } => "binary",
    }
}

/// The version folder the manifest names, when it names exactly one.
fn concrete_version<'a>(chosen: &Chosen<'a>) -> Option<&'a str> {
    match *chosen {
        Chosen::Binary { version, .. } => Some(version),
        Chosen::Npm { version, .. } => is_exact_version(version).then_some(version),
    }
}

fn write_current(agent_dir: &Path, version: &str, pinned: bool) -> Result<(), String> {
    write_json(
        &agent_dir.join(CURRENT),
        &Current {
            version: version.to_owned(),
            pinned,
        },
    )
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Option<T> {
    let bytes = std::fs::read(path).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Writes `value` as JSON to `path` atomically (a temporary file renamed over it).
fn write_json(path: &Path, value: &impl Serialize) -> Result<(), String> {
    let bytes = serde_json::to_vec_pretty(value).map_err(|e| format!("cannot encode JSON: {e}"))?;
    let temporary = path.with_extension(format!("tmp-{}", uuid::Uuid::new_v4().simple()));
    std::fs::write(&temporary, bytes)
        .and_then(|()| std::fs::rename(&temporary, path))
        .map_err(|e| {
            let _ = std::fs::remove_file(&temporary);
            format!("cannot write {}: {e}", path.display())
        })
}

/// Adds the execute bits (for whoever may read) to a regular file.
fn make_executable(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let metadata = std::fs::metadata(path)?;
    if !metadata.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mode = metadata.permissions().mode();
    let wanted = mode | ((mode & 0o444) >> 2) | 0o100;
    if wanted != mode {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(wanted))?;
    }
    Ok(())
}

/// `https`, or `http` to a loopback host (tests, local mirrors).
fn url_allowed(url: &reqwest::Url) -> bool {
    match url.scheme() {
        "https" => true,
        "http" => url.host_str().is_some_and(|host| {
            let host = host.trim_start_matches('[').trim_end_matches(']');
            host.eq_ignore_ascii_case("localhost")
                || host
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        }),
        _ => false,
    }
}

/// The first program named `name` on `PATH`.
fn find_on_path(name: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
}

/// An error and its sources, joined (reqwest's own message names only the URL).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_https_or_loopback_http_is_downloaded() {
        let allowed = |url: &str| url_allowed(&reqwest::Url::parse(url).expect("url"));
        assert!(allowed("https://github.com/a/b.tar.gz"));
        assert!(allowed("http://127.0.0.1:8080/a.tar.gz"));
        assert!(allowed("http://127.1.2.3/a.tar.gz"));
        assert!(allowed("http://[::1]:9/a.zip"));
        assert!(allowed("http://localhost/a.zip"));
        assert!(!allowed("http://example.com/a.zip"));
        assert!(!allowed("http://10.0.0.1/a.zip"));
        assert!(!allowed("ftp://127.0.0.1/a.zip"));
        assert!(!allowed("file:///etc/passwd"));
    }

    #[test]
    fn npm_bins_are_picked_by_cmd_name_or_alone() {
        let prefix =
            std::env::temp_dir().join(format!("npm-bin-test-{}", uuid::Uuid::new_v4().simple()));
        let package = prefix.join("node_modules/@scope/tool");
        std::fs::create_dir_all(package.join("bin")).expect("dirs");
        std::fs::write(package.join("bin/a.js"), "").expect("a");
        std::fs::write(package.join("bin/tool.js"), "").expect("tool");
        let write = |bin: serde_json::Value| {
            std::fs::write(
                package.join("package.json"),
                serde_json::json!({"name": "@scope/tool", "version": "1.2.3", "bin": bin})
                    .to_string(),
            )
            .expect("package.json");
        };
        write(serde_json::json!({"a": "bin/a.js", "tool": "./bin/tool.js"}));
        let (version, program) = resolve_npm_bin(&prefix, "@scope/tool", None).expect("by name");
        assert_eq!(version, "1.2.3");
        assert_eq!(program, Path::new("node_modules/@scope/tool/bin/tool.js"));
        let (_, program) = resolve_npm_bin(&prefix, "@scope/tool", Some("a")).expect("by cmd");
        assert_eq!(program, Path::new("node_modules/@scope/tool/bin/a.js"));
        let error = resolve_npm_bin(&prefix, "@scope/tool", Some("b")).expect_err("no b");
        assert!(error.contains("a, tool"), "{error}");
        write(serde_json::json!("bin/a.js"));
        let (_, program) = resolve_npm_bin(&prefix, "@scope/tool", None).expect("string bin");
        assert_eq!(program, Path::new("node_modules/@scope/tool/bin/a.js"));
        write(serde_json::json!({"x": "../../../etc/passwd"}));
        let error = resolve_npm_bin(&prefix, "@scope/tool", None).expect_err("escape");
        assert!(error.contains("unsafe"), "{error}");
        let _ = std::fs::remove_dir_all(&prefix);
    }

    #[test]
    fn npm_view_output_names_one_version() {
        assert_eq!(newest_version(b"\"0.16.0\"\n").as_deref(), Some("0.16.0"));
        assert_eq!(
            newest_version(br#"["0.9.0","0.10.0","0.10.1-beta.1","0.2.0"]"#).as_deref(),
            Some("0.10.1-beta.1")
        );
        assert_eq!(
            newest_version(br#"["1.0.0-rc.1","1.0.0"]"#).as_deref(),
            Some("1.0.0"),
            "a release is newer than its pre-releases"
        );
        assert_eq!(newest_version(b""), None, "nothing matched");
        assert_eq!(newest_version(br#"["latest"]"#), None);
        assert_eq!(newest_version(br#"{"error":{}}"#), None);
    }

    #[test]
    fn npm_gets_bounded_network_settings_unless_the_environment_sets_them() {
        let dir = std::env::temp_dir();
        let Ok(command) = npm_command(&dir) else {
            return; // no npm on this machine
        };
        let env: HashMap<String, String> = command
            .as_std()
            .get_envs()
            .filter_map(|(k, v)| Some((k.to_str()?.to_owned(), v?.to_str()?.to_owned())))
            .collect();
        for (name, value) in NPM_NETWORK_DEFAULTS {
            let variable = format!("npm_config_{}", name.replace('-', "_"));
            let inherited = std::env::vars_os().any(|(key, _)| {
                key.to_str()
                    .is_some_and(|k| k.eq_ignore_ascii_case(&variable))
            });
            assert!(
                inherited || env.get(&variable).map(String::as_str) == Some(value),
                "{variable}: {env:?}"
            );
        }
    }

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
