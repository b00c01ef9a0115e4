//! Containers for the deploy tests: podman with this machine's settings, a
//! Debian 12 base image made without a registry, the repository's
//! `Dockerfile` built once per test process, and containers that remove
//! themselves when dropped.
//!
//! - Settings on every command ([`Podman::command`]): `CONTAINERS_CONF`
//!   pointing at a `containers.conf` with `[containers] default_ulimits = []`
//!   (podman's default ulimits exceed the hard limit here) and
//!   `--runtime runc` (crun fails on this kernel's mixed cgroups; the same
//!   file says `[engine] runtime = "runc"` for a plain `podman`).
//! - The base ([`Podman::base_image`]): `docker.io/library/debian:bookworm-slim`
//!   as it is when present, else made once on the machine with
//!   `debootstrap --variant=minbase bookworm` and `podman import` (no image
//!   can be pulled here; Debian's mirror is reachable), by
//!   `scripts/test-image --base` under a file lock, so two test processes
//!   never make it at once.
//! - The image ([`Podman::image`]): `scripts/test-image`, a `podman build
//!   --pull=never --format docker` of the workspace's `Dockerfile` (the OCI
//!   format drops `HEALTHCHECK`), once per test process; `scripts/test`
//!   runs it before the tests, so podman's layer cache answers here.
//! - [`Container`]: `podman run -d` with the container port 2468 published
//!   on a loopback port podman picks (`-p 127.0.0.1::2468`), read back with
//!   `podman port`; removed (`podman rm -f`) on drop. [`Volume`]: a named
//!   volume, removed on drop.
//!
//! - [`EngineService`]: `podman system service` with the same settings on
//!   a unix socket of its own: the Docker Engine API for clients that speak
//!   it (the SDK's `docker` sandbox provider), stopped on drop.
//!
//! Where podman cannot run at all (not installed, `podman info` fails),
//! [`podman`] prints one line saying so and the tests return early.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::api::Api;
use crate::server::workspace_root;

/// The name the `FROM` line of the `Dockerfile` resolves to.
pub const BASE_IMAGE: &str = "docker.io/library/debian:bookworm-slim";

/// The tag of the image built from the `Dockerfile` by [`Podman::image`].
pub const IMAGE: &str = "localhost/sandbox-agent:test";

/// The port the server listens on inside the container (the image's
/// `SANDBOX_AGENT_PORT`).
pub const CONTAINER_PORT: u16 = 2468;

/// Longest a `podman build` of the image may take: the first one installs
/// Node.js and npm from Debian's mirror.
const BUILD_TIMEOUT: Duration = Duration::from_secs(900);

/// podman on this machine, with the settings above.
#[derive(Debug)]
pub struct Podman {
    /// `target/podman/containers.conf`, given as `CONTAINERS_CONF`.
    conf: PathBuf,
}

/// podman with this machine's settings, or `None` (said once on stderr)
/// where it cannot run at all.
pub fn podman() -> Option<&'static Podman> {
    static PODMAN: OnceLock<Option<Podman>> = OnceLock::new();
    PODMAN
        .get_or_init(|| {
            let dir = workspace_root().join("target").join("podman");
            std::fs::create_dir_all(&dir).expect("create target/podman");
            let conf = dir.join("containers.conf");
            // `[engine] runtime` too, so a plain `podman` with this
            // CONTAINERS_CONF (README's commands, run as written) uses runc.
            // Written beside, then renamed: test binaries run at once.
            let temporary = dir.join(format!(".containers.conf.{}", std::process::id()));
            std::fs::write(
                &temporary,
                "[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = \"runc\"\n",
            )
            .expect("write target/podman/containers.conf");
            std::fs::rename(&temporary, &conf).expect("place target/podman/containers.conf");
            let podman = Podman { conf };
            match podman.command().arg("info").output() {
                Ok(output) if output.status.success() => Some(podman),
                Ok(output) => {
                    eprintln!(
                        "container tests: not run: `podman info` failed ({}): {}",
                        output.status,
                        String::from_utf8_lossy(&output.stderr).trim()
                    );
                    None
                }
                Err(error) => {
                    eprintln!(
                        "container tests: not run: podman cannot be started ({error}); \
                         scripts/test installs it (Debian: podman runc debootstrap)"
                    );
                    None
                }
            }
        })
        .as_ref()
}

impl Podman {
    /// The `containers.conf` of these settings: give it as `CONTAINERS_CONF`
    /// to a plain `podman` (its `[engine] runtime` is runc).
    pub fn containers_conf(&self) -> &Path {
        &self.conf
    }

    /// `podman --runtime runc` with `CONTAINERS_CONF` set.
    pub fn command(&self) -> Command {
        let mut command = Command::new("podman");
        command
            .env("CONTAINERS_CONF", &self.conf)
            .args(["--runtime", "runc"]);
        command
    }

    /// Runs `podman ARGS…` to its end: its output, whatever its status.
    ///
    /// # Panics
    /// If podman cannot be started.
    pub fn output(&self, args: &[&str]) -> Output {
        self.command()
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("podman {args:?}: {e}"))
    }

    /// Runs `podman ARGS…`: its stdout, trimmed.
    ///
    /// # Panics
    /// If it exits unsuccessfully (with its stderr).
    pub fn run_ok(&self, args: &[&str]) -> String {
        let output = self.output(args);
        assert!(
            output.status.success(),
            "podman {args:?}: {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    /// [`BASE_IMAGE`], made on the first call on this machine when absent
    /// (module doc): `scripts/test-image --base`, the one place that makes
    /// it; the later calls find it.
    ///
    /// # Panics
    /// If debootstrap or the import fails (with the script's output).
    pub fn base_image(&self) -> &'static str {
        static MADE: OnceLock<()> = OnceLock::new();
        MADE.get_or_init(|| test_image(&["--base"]));
        BASE_IMAGE
    }

    /// [`IMAGE`], built from the workspace's `Dockerfile` on
    /// [`Self::base_image`] and the release tarball
    /// ([`crate::dist::tarball`]) once per test process, by
    /// `scripts/test-image` (the one place that builds it; `scripts/test`
    /// runs it before the tests, so here podman's layer cache answers).
    ///
    /// # Panics
    /// If the `Dockerfile`'s `ARG VERSION` is not the workspace's version,
    /// or the build fails (with its output).
    pub fn image(&self) -> &'static str {
        static BUILT: OnceLock<()> = OnceLock::new();
        BUILT.get_or_init(|| {
            let text = std::fs::read_to_string(workspace_root().join("Dockerfile"))
                .expect("read Dockerfile");
            let version = format!("ARG VERSION={}", env!("CARGO_PKG_VERSION"));
            assert!(
                text.lines().any(|line| line.trim() == version),
                "the Dockerfile's `{version}` is missing: its default must be the workspace's version"
            );
            test_image(&[]);
        });
        IMAGE
    }

    /// `podman run -d` of `image` with `args` before it (`-e`, `-v`, …) and
    /// `command` after it, port 2468 published on a loopback port, the
    /// environment variables `env` given to podman (passed on with
    /// `-e NAME`, so a value never shows on a command line).
    ///
    /// # Panics
    /// If the container does not start.
    pub fn start(
        &'static self,
        image: &str,
        args: &[&str],
        env: &[(&str, &str)],
        command: &[&str],
    ) -> Container {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "sandbox-agent-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let port = format!("127.0.0.1::{CONTAINER_PORT}");
        let mut run = self.command();
        run.args(["run", "-d", "--name", &name, "-p", &port]);
        for (key, value) in env {
            run.env(key, value).args(["-e", key]);
        }
        run.args(args).arg(image).args(command);
        let output = run.stdin(Stdio::null()).output().expect("start podman run");
        // Removed on drop from here on, even if it did not start.
        let container = Container { podman: self, name };
        assert!(
            output.status.success(),
            "podman run {image}: {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
        container
    }

    /// The container `name` that something else starts (README's commands
    /// run as written), removed on drop.
    pub fn container(&'static self, name: String) -> Container {
        Container { podman: self, name }
    }

    /// `podman system service --time=0 unix:///tmp/…sock` with these
    /// settings (`CONTAINERS_CONF`, so its containers run on runc without
    /// the default ulimits): the Docker Engine API on a socket of its own,
    /// ready (the socket accepts connections) when this returns.
    ///
    /// # Panics
    /// If it does not start, or its socket does not accept within 20 s.
    pub fn service(&'static self) -> EngineService {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let socket = std::env::temp_dir().join(format!(
            "sandbox-agent-test-engine-{}-{}.sock",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_file(&socket);
        let child = Command::new("podman")
            .env("CONTAINERS_CONF", &self.conf)
            .args(["system", "service", "--time=0"])
            .arg(format!("unix://{}", socket.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start podman system service");
        // Stopped on drop from here on, even if it never listens.
        let service = EngineService { child, socket };
        let started = Instant::now();
        while std::os::unix::net::UnixStream::connect(&service.socket).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "podman system service: no socket at {} within 20 s",
                service.socket.display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        service
    }

    /// The volume `name` that something else makes, removed on drop.
    pub fn named_volume(&'static self, name: String) -> Volume {
        Volume { podman: self, name }
    }

    /// A new named volume, removed on drop.
    pub fn volume(&'static self) -> Volume {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "sandbox-agent-test-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        self.run_ok(&["volume", "create", &name]);
        Volume { podman: self, name }
    }
}

/// A container of [`Podman::start`]; `podman rm -f -v` on drop (`-v`: with
/// the anonymous volume the image's `VOLUME` makes when no `-v` names one).
#[derive(Debug)]
pub struct Container {
    podman: &'static Podman,
    /// Its `--name`.
    pub name: String,
}

impl Container {
    /// The loopback port podman published the container's port 2468 on.
    ///
    /// # Panics
    /// If it has none (the container is not running).
    pub fn host_port(&self) -> u16 {
        let mapping = self
            .podman
            .run_ok(&["port", &self.name, &format!("{CONTAINER_PORT}/tcp")]);
        mapping
            .lines()
            .next()
            .and_then(|line| line.rsplit(':').next())
            .and_then(|port| port.parse().ok())
            .unwrap_or_else(|| panic!("podman port {}: {mapping:?}", self.name))
    }

    /// An [`Api`] on the published port with `token`.
    pub fn api(&self, token: Option<&str>) -> Api {
        Api::new(
            format!("http://127.0.0.1:{}", self.host_port()),
            token.map(str::to_owned),
        )
    }

    /// Polls `GET /v2/health` on the published port until it answers `200`:
    /// the [`Api`] (with `token`) and how long it took from this call.
    ///
    /// # Panics
    /// If it does not within `within` (with the container's log).
    pub async fn healthy(&self, token: Option<&str>, within: Duration) -> (Api, Duration) {
        let api = self.api(token);
        let started = Instant::now();
        loop {
            let answer = api.http().get(api.url("/v2/health")).send().await;
            if matches!(&answer, Ok(response) if response.status() == 200) {
                return (api, started.elapsed());
            }
            assert!(
                started.elapsed() < within,
                "{}: /v2/health not 200 within {within:?} (last: {answer:?}); log:\n{}",
                self.name,
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// `podman logs`: its stdout and stderr, together.
    pub fn logs(&self) -> String {
        let output = self.podman.output(&["logs", &self.name]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    }

    /// `podman inspect --format FORMAT`, trimmed.
    pub fn inspect(&self, format: &str) -> String {
        self.podman
            .run_ok(&["inspect", "--format", format, &self.name])
    }

    /// Waits for the container to stop: its exit code.
    ///
    /// # Panics
    /// If it still runs after `within`.
    pub async fn exit_code(&self, within: Duration) -> i32 {
        let started = Instant::now();
        loop {
            if self.inspect("{{.State.Status}}") == "exited" {
                return self
                    .inspect("{{.State.ExitCode}}")
                    .parse()
                    .expect("an exit code");
            }
            assert!(
                started.elapsed() < within,
                "{} still runs after {within:?}",
                self.name
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = self
            .podman
            .command()
            .args(["rm", "-f", "-v", "-t", "0", &self.name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// A `podman system service` of [`Podman::service`]: SIGTERM, then
/// SIGKILL after 5 s, and its socket removed, on drop. Containers made
/// through it stay (they are podman's, not the service's).
#[derive(Debug)]
pub struct EngineService {
    child: std::process::Child,
    /// Its unix socket.
    pub socket: PathBuf,
}

impl EngineService {
    /// `unix:///tmp/…sock`: the value for `DOCKER_HOST`.
    pub fn docker_host(&self) -> String {
        format!("unix://{}", self.socket.display())
    }
}

impl Drop for EngineService {
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// A named volume of [`Podman::volume`]; removed on drop.
#[derive(Debug)]
pub struct Volume {
    podman: &'static Podman,
    /// Its name (for `-v NAME:/path`).
    pub name: String,
}

impl Drop for Volume {
    fn drop(&mut self) {
        let _ = self
            .podman
            .command()
            .args(["volume", "rm", "-f", &self.name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Runs `scripts/test-image ARGS…` on [`crate::dist::tarball`], killed
/// past [`BUILD_TIMEOUT`].
///
/// # Panics
/// If it fails (with its output).
fn test_image(args: &[&str]) {
    let root = workspace_root();
    let started = Instant::now();
    let mut command = Command::new(root.join("scripts/test-image"));
    command.args(args);
    if args.is_empty() {
        command.env("SANDBOX_AGENT_DIST_TARBALL", crate::dist::tarball());
    }
    let output = run_within(command, BUILD_TIMEOUT);
    assert!(
        output.status.success(),
        "scripts/test-image {args:?}: {}\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    eprintln!(
        "container tests: scripts/test-image {args:?} in {:.1?}",
        started.elapsed()
    );
}

/// Runs `command` to its end, killed past `timeout`: its output.
fn run_within(mut command: Command, timeout: Duration) -> Output {
    let child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start podman");
    let started = Instant::now();
    let pid = child.id();
    let watchdog = std::thread::spawn(move || {
        while started.elapsed() < timeout {
            std::thread::sleep(Duration::from_millis(200));
            if !Path::new(&format!("/proc/{pid}")).exists() {
                return;
            }
        }
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    });
    let output = child.wait_with_output().expect("wait for podman");
    let _ = watchdog.join();
    output
}
