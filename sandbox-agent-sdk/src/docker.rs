//! The `docker` sandbox provider (cargo feature `docker`): each sandbox is
//! a container made through the Docker Engine API on its unix socket
//! (Docker, or podman's compatible `podman system service`), with
//! [`bollard`]; no CLI is run.
//!
//! - The image holds the runtime (the repository's `Dockerfile`: the
//!   release binary, its entrypoint runs `sandbox-agent server` on port
//!   2468). The container runs the image's own command unless
//!   [`DockerProvider::command`] says otherwise.
//! - The token is generated per start and given as `SANDBOX_AGENT_TOKEN`
//!   in the container's environment: never in `Config.Cmd`, a log line or
//!   an error.
//! - Port 2468 is published on `127.0.0.1` (a port the engine picks) unless
//!   [`DockerProvider::publish_ip`] says otherwise.
//! - Every container carries the labels [`MANAGED_LABEL`] and
//!   [`FLEET_LABEL`] (the fleet id given with [`DockerProvider::fleet`], or
//!   one generated per start), so [`DockerProvider::cleanup`] removes one
//!   fleet's containers and nothing else.
//! - bollard logs request and response bodies at DEBUG/TRACE; the create
//!   request and the inspect answer hold the container's environment, so
//!   those calls run with logging muted (`muted`): the token is in no log
//!   line, whatever the program's log filter.
//! - The engine is `DOCKER_HOST` (`unix://…`), else
//!   `unix:///var/run/docker.sock`, unless [`DockerProvider::host`] names
//!   one.

use crate::embedded::random_token;
use crate::error::{Error, SandboxStep};
use crate::provider::{DEFAULT_SANDBOX_TIMEOUT, Sandbox, SandboxProvider, redact};
use bollard::Docker;
use bollard::models::{ContainerCreateBody, ContainerStateStatusEnum, HostConfig, PortBinding};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, ListContainersOptionsBuilder, LogsOptionsBuilder,
    RemoveContainerOptionsBuilder,
};
use futures::StreamExt;
use futures::future::BoxFuture;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use tracing::instrument::WithSubscriber;

/// The label naming a container's fleet.
pub const FLEET_LABEL: &str = "dev.sandboxagent.fleet";

/// The label every container of this provider carries (value `true`).
pub const MANAGED_LABEL: &str = "dev.sandboxagent.managed";

/// The port the runtime listens on in the image (its `SANDBOX_AGENT_PORT`).
pub const CONTAINER_PORT: u16 = 2468;

/// The working directory of the image (its `WORKDIR`), the sessions'
/// default `cwd`.
const IMAGE_WORKDIR: &str = "/home/agent";

/// Lines of the container's output kept for an error.
const LOG_TAIL: &str = "40";

/// How often health (and whether the container still runs) is polled.
const POLL: Duration = Duration::from_millis(100);

/// Makes sandboxes as containers of one image. Build with [`docker()`].
#[derive(Debug, Clone)]
pub struct DockerProvider {
    /// The image (holding the runtime).
    image: String,
    /// `KEY=VALUE` pairs for the container (API keys for the agents).
    env: Vec<String>,
    /// Binds, `SOURCE:TARGET[:OPTIONS]` (a host path or a volume name).
    volumes: Vec<String>,
    /// The fleet id; `None`: one generated per start.
    fleet: Option<String>,
    /// More labels.
    labels: HashMap<String, String>,
    /// The engine's address; `None`: `DOCKER_HOST`, else the default socket.
    host: Option<String>,
    /// The host address the runtime's port is published on.
    publish_ip: String,
    /// The container's command instead of the image's (`Cmd`).
    command: Option<Vec<String>>,
    /// The container's entrypoint instead of the image's.
    entrypoint: Option<Vec<String>>,
    /// Limit from create to healthy.
    timeout: Duration,
}

/// A [`DockerProvider`] for `image` with the defaults: no extra env or
/// volumes, a fleet generated per start, the port on `127.0.0.1`, the
/// image's own command, [`DEFAULT_SANDBOX_TIMEOUT`].
///
/// ```no_run
/// use sandbox_agent_sdk::docker::docker;
/// let provider = docker("localhost/sandbox-agent:test")
///     .env("OPENAI_API_KEY", "sk-…")
///     .volume("work:/home/agent") // the agents' home, kept on a volume
///     .fleet("nightly-eval");
/// # let _ = provider;
/// ```
pub fn docker(image: impl Into<String>) -> DockerProvider {
    DockerProvider {
        image: image.into(),
        env: Vec::new(),
        volumes: Vec::new(),
        fleet: None,
        labels: HashMap::new(),
        host: None,
        publish_ip: "127.0.0.1".to_owned(),
        command: None,
        entrypoint: None,
        timeout: DEFAULT_SANDBOX_TIMEOUT,
    }
}

impl DockerProvider {
    /// One more environment variable of the container (and its agents).
    /// `SANDBOX_AGENT_TOKEN` is set by the provider and cannot be given.
    pub fn env(mut self, key: impl AsRef<str>, value: impl AsRef<str>) -> Self {
        self.env
            .push(format!("{}={}", key.as_ref(), value.as_ref()));
        self
    }

    /// One more bind: `SOURCE:TARGET[:OPTIONS]`, `SOURCE` a host path or a
    /// volume name (`work:/home/agent`, `/data:/data:ro`). Agents and the
    /// file API run as the image's `agent` user (uid 1000): a path they
    /// write must be that user's (a new volume on `/home/agent` is).
    pub fn volume(mut self, bind: impl Into<String>) -> Self {
        self.volumes.push(bind.into());
        self
    }

    /// The fleet id the containers are labelled with (else one generated
    /// per start): what [`cleanup`](Self::cleanup) takes.
    pub fn fleet(mut self, fleet: impl Into<String>) -> Self {
        self.fleet = Some(fleet.into());
        self
    }

    /// One more label on the containers.
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// The engine's address, `unix:///path/to.sock` (else `DOCKER_HOST`,
    /// else `unix:///var/run/docker.sock`).
    pub fn host(mut self, host: impl Into<String>) -> Self {
        self.host = Some(host.into());
        self
    }

    /// The host address the runtime's port is published on (default
    /// `127.0.0.1`; `0.0.0.0` exposes it to the network).
    pub fn publish_ip(mut self, ip: impl Into<String>) -> Self {
        self.publish_ip = ip.into();
        self
    }

    /// The container's command instead of the image's `CMD` (the image's
    /// entrypoint runs it: `["server", "--log-level", "debug"]`).
    pub fn command<I, S>(mut self, command: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.command = Some(command.into_iter().map(Into::into).collect());
        self
    }

    /// The container's entrypoint instead of the image's.
    pub fn entrypoint<I, S>(mut self, entrypoint: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.entrypoint = Some(entrypoint.into_iter().map(Into::into).collect());
        self
    }

    /// How long a sandbox may take from create to healthy.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The engine client.
    fn engine(&self, step: SandboxStep) -> Result<Docker, Error> {
        let connected = match &self.host {
            Some(host) => Docker::connect_with_host(host),
            None => Docker::connect_with_defaults(),
        };
        connected.map_err(|error| {
            failed(
                step,
                format!("cannot reach the Docker engine: {error}"),
                String::new(),
            )
        })
    }

    /// Removes every container (running or not) labelled with `fleet`, and
    /// its anonymous volumes: what a program that crashed before
    /// [`destroy_sandbox`](crate::SandboxAgent::destroy_sandbox) left. The
    /// ids removed.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] for an empty fleet id; [`Error::Sandbox`]
    /// with step [`SandboxStep::Cleanup`] when the engine cannot be reached
    /// or refuses.
    pub async fn cleanup(&self, fleet: &str) -> Result<Vec<String>, Error> {
        if fleet.is_empty() {
            return Err(Error::InvalidOptions(
                "cleanup: the fleet id is empty".to_owned(),
            ));
        }
        let engine = self.engine(SandboxStep::Cleanup)?;
        let filters = HashMap::from([(
            "label",
            vec![
                format!("{MANAGED_LABEL}=true"),
                format!("{FLEET_LABEL}={fleet}"),
            ],
        )]);
        let listed = engine
            .list_containers(Some(
                ListContainersOptionsBuilder::new()
                    .all(true)
                    .filters(&filters)
                    .build(),
            ))
            .await
            .map_err(|error| {
                failed(
                    SandboxStep::Cleanup,
                    format!("listing containers: {error}"),
                    String::new(),
                )
            })?;
        let mut removed = Vec::new();
        for container in listed {
            // The engine filtered; check again, as removing another fleet's
            // container must not happen even on an engine that ignores a filter.
            let labels = container.labels.unwrap_or_default();
            if labels.get(FLEET_LABEL).map(String::as_str) != Some(fleet) {
                continue;
            }
            let Some(id) = container.id else { continue };
            remove(&engine, &id).await.map_err(|error| {
                failed(
                    SandboxStep::Cleanup,
                    format!("removing {id}: {error}"),
                    String::new(),
                )
            })?;
            removed.push(id);
        }
        Ok(removed)
    }

    /// Create, start, healthy: the sandbox, or the error with the
    /// container already removed.
    async fn start_container(&self) -> Result<DockerSandbox, Error> {
        let started = Instant::now();
        let engine = self.engine(SandboxStep::Create)?;
        let token = random_token()?;
        let fleet = match &self.fleet {
            Some(fleet) if fleet.is_empty() => {
                return Err(Error::InvalidOptions(
                    "docker: the fleet id is empty".to_owned(),
                ));
            }
            Some(fleet) => fleet.clone(),
            None => format!("fleet-{}", &random_token()?[..12]),
        };
        if self
            .env
            .iter()
            .any(|pair| pair.starts_with("SANDBOX_AGENT_TOKEN="))
        {
            return Err(Error::InvalidOptions(
                "docker: SANDBOX_AGENT_TOKEN is set by the provider (a token generated per start)"
                    .to_owned(),
            ));
        }
        let mut labels = self.labels.clone();
        labels.insert(MANAGED_LABEL.to_owned(), "true".to_owned());
        labels.insert(FLEET_LABEL.to_owned(), fleet.clone());
        let mut env = self.env.clone();
        env.push(format!("SANDBOX_AGENT_TOKEN={token}"));
        let port = format!("{CONTAINER_PORT}/tcp");
        let body = ContainerCreateBody {
            image: Some(self.image.clone()),
            env: Some(env),
            cmd: self.command.clone(),
            entrypoint: self.entrypoint.clone(),
            labels: Some(labels),
            exposed_ports: Some(vec![port.clone()]),
            host_config: Some(HostConfig {
                binds: (!self.volumes.is_empty()).then(|| self.volumes.clone()),
                port_bindings: Some(HashMap::from([(
                    port.clone(),
                    Some(vec![PortBinding {
                        host_ip: Some(self.publish_ip.clone()),
                        host_port: Some(String::new()),
                    }]),
                )])),
                ..Default::default()
            }),
            ..Default::default()
        };
        let name = format!("sandbox-agent-{fleet}-{}", &random_token()?[..8]);
        let created = muted(engine.create_container(
            Some(CreateContainerOptionsBuilder::new().name(&name).build()),
            body,
        ))
        .await
        .map_err(|error| {
            failed(
                SandboxStep::Create,
                redact(&format!("image {}: {error}", self.image), &token),
                String::new(),
            )
        })?;
        // From here on the container is removed on every failure.
        let mut sandbox = DockerSandbox {
            engine,
            id: created.id,
            fleet,
            base_url: String::new(),
            token,
            removed: false,
        };
        match sandbox
            .run(&port, self.timeout.saturating_sub(started.elapsed()))
            .await
        {
            Ok(()) => {
                tracing::debug!(id = %sandbox.id, url = %sandbox.base_url, elapsed = ?started.elapsed(), "docker sandbox healthy");
                Ok(sandbox)
            }
            Err(error) => {
                let _ = remove(&sandbox.engine, &sandbox.id).await;
                sandbox.removed = true;
                Err(error)
            }
        }
    }
}

impl SandboxProvider for DockerProvider {
    fn name(&self) -> &'static str {
        "docker"
    }

    fn start(&self) -> BoxFuture<'_, Result<Box<dyn Sandbox>, Error>> {
        Box::pin(async move {
            let sandbox: Box<dyn Sandbox> = Box::new(self.start_container().await?);
            Ok(sandbox)
        })
    }
}

/// A container of [`DockerProvider`].
#[derive(Debug)]
pub struct DockerSandbox {
    /// The engine it was made on.
    engine: Docker,
    /// The container id.
    id: String,
    /// Its [`FLEET_LABEL`].
    fleet: String,
    /// `http://IP:PORT` of the published port.
    base_url: String,
    /// The runtime's token (in the container's environment).
    token: String,
    /// Set once removed.
    removed: bool,
}

impl DockerSandbox {
    /// Starts the container, reads its published port and waits for
    /// `GET /v2/health` within `limit`.
    async fn run(&mut self, port: &str, limit: Duration) -> Result<(), Error> {
        let deadline = Instant::now() + limit;
        self.engine
            .start_container(&self.id, None)
            .await
            .map_err(|error| {
                failed(
                    SandboxStep::Start,
                    redact(&error.to_string(), &self.token),
                    String::new(),
                )
            })?;
        let inspected = match muted(self.engine.inspect_container(&self.id, None)).await {
            Ok(inspected) => inspected,
            Err(error) if is_unreadable_state(&error) => {
                return Err(self
                    .failure(
                        SandboxStep::Start,
                        format!(
                            "the container exited before it served (the engine names its \
                             state outside Docker's set: {error})"
                        ),
                    )
                    .await);
            }
            Err(error) => {
                return Err(self
                    .failure(
                        SandboxStep::Start,
                        format!("inspecting the container: {error}"),
                    )
                    .await);
            }
        };
        let published = inspected
            .network_settings
            .and_then(|settings| settings.ports)
            .and_then(|mut ports| ports.remove(port).flatten())
            .and_then(|bindings| bindings.into_iter().next());
        let Some(binding) = published else {
            return Err(self
                .failure(
                    SandboxStep::Start,
                    format!(
                        "the engine published no host port for {port} (did the container exit?)"
                    ),
                )
                .await);
        };
        let ip = match binding.host_ip.as_deref() {
            None | Some("" | "0.0.0.0") => "127.0.0.1".to_owned(),
            Some("::") => "[::1]".to_owned(),
            Some(ip) if ip.contains(':') => format!("[{ip}]"),
            Some(ip) => ip.to_owned(),
        };
        let host_port = binding.host_port.unwrap_or_default();
        self.base_url = format!("http://{ip}:{host_port}");
        let http = reqwest::Client::new();
        let health = format!("{}/v2/health", self.base_url);
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(self
                    .failure(
                        SandboxStep::Health,
                        format!("GET /v2/health did not answer 200 within {limit:?}"),
                    )
                    .await);
            }
            let answer = http
                .get(&health)
                .timeout(remaining.min(Duration::from_secs(2)))
                .send()
                .await;
            if answer.is_ok_and(|response| response.status().is_success()) {
                return Ok(());
            }
            let stopped = match muted(self.engine.inspect_container(&self.id, None)).await {
                Ok(inspected) => inspected.state.and_then(|state| {
                    matches!(
                        state.status,
                        Some(ContainerStateStatusEnum::EXITED | ContainerStateStatusEnum::DEAD)
                    )
                    .then(|| format!("status {}", state.exit_code.unwrap_or_default()))
                }),
                Err(error) if is_unreadable_state(&error) => Some(error.to_string()),
                Err(_) => None,
            };
            if let Some(how) = stopped {
                return Err(self
                    .failure(
                        SandboxStep::Start,
                        format!("the container exited ({how}) before it served"),
                    )
                    .await);
            }
            tokio::time::sleep(POLL.min(deadline.saturating_duration_since(Instant::now()))).await;
        }
    }

    /// [`Error::Sandbox`] at `step` with the container's last output lines.
    async fn failure(&self, step: SandboxStep, message: String) -> Error {
        failed(step, message, self.logs().await)
    }

    /// The last 40 lines of the container's stdout and stderr,
    /// the token replaced by `[token]`.
    pub async fn logs(&self) -> String {
        let options = LogsOptionsBuilder::new()
            .stdout(true)
            .stderr(true)
            .tail(LOG_TAIL)
            .build();
        let mut stream = self.engine.logs(&self.id, Some(options));
        let mut text = String::new();
        while let Some(Ok(chunk)) = stream.next().await {
            text.push_str(&chunk.to_string());
        }
        redact(&text, &self.token)
    }
}

impl Sandbox for DockerSandbox {
    fn id(&self) -> &str {
        &self.id
    }

    fn fleet(&self) -> Option<&str> {
        Some(&self.fleet)
    }

    fn base_url(&self) -> &str {
        &self.base_url
    }

    fn token(&self) -> &str {
        &self.token
    }

    fn default_cwd(&self) -> String {
        IMAGE_WORKDIR.to_owned()
    }

    fn destroy(&mut self) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(async move {
            if self.removed {
                return Ok(());
            }
            remove(&self.engine, &self.id).await.map_err(|error| {
                failed(
                    SandboxStep::Destroy,
                    format!("removing {}: {error}", self.id),
                    String::new(),
                )
            })?;
            self.removed = true;
            Ok(())
        })
    }
}

/// `DELETE /containers/ID?force=true&v=true`: stopped at once (the runtime
/// holds nothing the caller still needs once it is destroyed) and removed
/// with its anonymous volumes; a container already gone counts as removed.
async fn remove(engine: &Docker, id: &str) -> Result<(), bollard::errors::Error> {
    let options = RemoveContainerOptionsBuilder::new()
        .force(true)
        .v(true)
        .build();
    match engine.remove_container(id, Some(options)).await {
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => Ok(()),
        other => other,
    }
}

/// `future` with no subscriber while it runs: nothing it logs is recorded.
/// For the engine calls whose bodies hold the token (module doc).
fn muted<F: std::future::Future>(future: F) -> tracing::instrument::WithDispatch<F> {
    future.with_subscriber(tracing::subscriber::NoSubscriber::default())
}

/// [`Error::Sandbox`] of the docker provider.
fn failed(step: SandboxStep, message: String, logs: String) -> Error {
    Error::Sandbox {
        provider: "docker",
        step,
        message,
        logs,
    }
}

/// Whether `error` is an inspection the client could not read because the
/// engine named the container's state outside Docker's set: podman 4's
/// Docker-compatible service answers `stopped` for a container that exited
/// (Docker says `exited`), which bollard's typed answer refuses whole.
fn is_unreadable_state(error: &bollard::errors::Error) -> bool {
    matches!(error, bollard::errors::Error::JsonDataError { message, .. } if message.contains("unknown variant"))
}
