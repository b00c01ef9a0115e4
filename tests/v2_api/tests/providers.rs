//! The SDK's sandbox providers (sandbox-agent-sdk: `SandboxAgent`, `local`,
//! `docker`) as a user drives them: `SandboxAgent::start` → `create_session`
//! → `prompt` → `destroy_sandbox`, against the real binary (local) and real
//! containers of the repository's image through podman's Docker Engine API
//! (`podman system service` on a socket of each test's own,
//! tests/v2_api/src/podman.rs).
//!
//! Checked: the round trip per provider; the generated token in the
//! container's environment only (not in `Config.Cmd`/`Entrypoint`, the
//! container's output, or an error); a sandbox that never becomes healthy
//! fails at the health step within its timeout, with what it printed, and
//! leaves no container; eight sandboxes at once all answer and are all
//! removed; a client killed mid-turn leaves its containers, which
//! `cleanup(fleet)` removes without touching another fleet's.
//!
//! The container tests run one at a time ([`SERIAL`]: they share podman's
//! store with tests/container.rs's). Where podman cannot run at all they
//! say so in one line and check nothing.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::query_parameters::{ListContainersOptionsBuilder, LogsOptionsBuilder};
use futures::StreamExt;
use sandbox_agent_sdk::docker::{DockerProvider, FLEET_LABEL, docker};
use sandbox_agent_sdk::schema::StopReason;
use sandbox_agent_sdk::{
    Error, Metadata, SandboxAgent, SandboxStep, SessionOptions, StartOptions, TurnEvent, local,
};
use v2_api_tests::podman::{EngineService, Podman, podman};
use v2_api_tests::server::{sandbox_agent_bin, workspace_root};
use v2_api_tests::{MOCK, TempDir};

/// One container test at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A sandbox's limit from create to healthy here (measured: about a
/// second; the machine is shared).
const HEALTHY_WITHIN: Duration = Duration::from_secs(60);

/// Everything logged in this process (every level, every crate: the
/// SDK, reqwest, hyper, bollard), from the first [`captured_logs`] on.
static LOGS: std::sync::Mutex<Vec<u8>> = std::sync::Mutex::new(Vec::new());

/// Where the subscriber writes: [`LOGS`].
struct Capture;

impl std::io::Write for Capture {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        LOGS.lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Installs the capturing subscriber (once), and returns what it has
/// captured so far.
fn captured_logs() -> String {
    let _ = tracing_subscriber::fmt()
        .with_max_level(tracing_subscriber::filter::LevelFilter::TRACE)
        .with_ansi(false)
        .with_writer(|| Capture)
        .try_init();
    String::from_utf8_lossy(&LOGS.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
}

/// Removes the containers of its fleets with `podman rm` when dropped: a
/// test that fails half-way leaves nothing running.
struct Leftovers {
    podman: &'static Podman,
    fleets: Vec<String>,
}

impl Leftovers {
    fn new(podman: &'static Podman) -> Leftovers {
        Leftovers {
            podman,
            fleets: Vec::new(),
        }
    }

    /// A new fleet id ([`fleet`]), removed on drop.
    fn fleet(&mut self, name: &str) -> String {
        let id = fleet(name);
        self.fleets.push(id.clone());
        id
    }
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        for fleet in &self.fleets {
            let filter = format!("label={FLEET_LABEL}={fleet}");
            let listed = self.podman.output(&["ps", "-aq", "--filter", &filter]);
            for id in String::from_utf8_lossy(&listed.stdout).split_whitespace() {
                let _ = self.podman.output(&["rm", "-f", "-v", "-t", "0", id]);
            }
        }
    }
}

/// A fleet id no other test (or test process) uses.
fn fleet(name: &str) -> String {
    format!(
        "test-{}-{name}-{:08x}",
        std::process::id(),
        fastrand::u32(..)
    )
}

/// podman, its Engine API service, and an engine client on it; `None`
/// (said once) where podman cannot run.
fn engine() -> Option<(&'static Podman, EngineService, Docker)> {
    let podman = podman()?;
    podman.image(); // built (or found in the cache) before any clock starts
    let service = podman.service();
    let docker = Docker::connect_with_host(&service.docker_host()).expect("engine client");
    Some((podman, service, docker))
}

/// The image on `service`, labelled with `fleet`.
fn provider(service: &EngineService, fleet: &str) -> DockerProvider {
    docker(v2_api_tests::podman::IMAGE)
        .host(service.docker_host())
        .fleet(fleet)
        .timeout(HEALTHY_WITHIN)
}

/// The ids of the containers (running or not) labelled with `fleet`.
async fn containers_of(engine: &Docker, fleet: &str) -> Vec<String> {
    let filters = HashMap::from([("label", vec![format!("{FLEET_LABEL}={fleet}")])]);
    let listed = engine
        .list_containers(Some(
            ListContainersOptionsBuilder::new()
                .all(true)
                .filters(&filters)
                .build(),
        ))
        .await
        .expect("list containers");
    listed.into_iter().filter_map(|c| c.id).collect()
}

/// A container's output, stdout and stderr.
async fn output_of(engine: &Docker, id: &str) -> String {
    let options = LogsOptionsBuilder::new().stdout(true).stderr(true).build();
    let mut stream = engine.logs(id, Some(options));
    let mut text = String::new();
    while let Some(Ok(chunk)) = stream.next().await {
        text.push_str(&chunk.to_string());
    }
    text
}

/// Whether `text` holds a run of 48 hex digits: the shape of a generated
/// token, for errors of sandboxes whose token the test never saw.
fn has_token_shape(text: &str) -> bool {
    let mut run = 0;
    for c in text.chars() {
        run = if c.is_ascii_hexdigit() { run + 1 } else { 0 };
        if run >= 48 {
            return true;
        }
    }
    false
}

/// One turn of the mock agent on `sdk`: a session with metadata, a
/// streamed prompt (its text and stop reason), a plain prompt.
async fn mock_turns(sdk: &SandboxAgent, cwd: &str) {
    let session = sdk
        .create_session(SessionOptions {
            agent: None,
            cwd: Some(cwd.to_owned()),
            metadata: Some(Metadata::new().title("provider test")),
        })
        .await
        .expect("create_session");
    let entry = sdk
        .get_session(session.id.clone())
        .await
        .expect("the session's entry");
    assert_eq!(
        entry.meta.as_ref().and_then(|meta| meta.title.as_deref()),
        Some("provider test"),
        "{entry:?}"
    );
    let mut turn = session.prompt_stream("hello");
    let mut text = String::new();
    let mut stopped = None;
    while let Some(event) = turn.next().await {
        if let Some(chunk) = event.text() {
            text.push_str(chunk);
        }
        match event {
            TurnEvent::Stopped(done) => stopped = Some(done.stop_reason),
            TurnEvent::Failed(error) => panic!("the turn failed: {error}"),
            _ => {}
        }
    }
    assert_eq!(stopped, Some(StopReason::EndTurn));
    assert!(
        text.contains("hello"),
        "the mock echoes the prompt: {text:?}"
    );
    assert_eq!(
        session.prompt("again").await.expect("prompt"),
        StopReason::EndTurn
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_sandbox_starts_prompts_and_is_destroyed() {
    let data = TempDir::new("provider-local");
    let provider = local()
        .binary(sandbox_agent_bin())
        .env("SANDBOX_AGENT_DATA_DIR", data.path())
        .timeout(HEALTHY_WITHIN);
    let sdk = SandboxAgent::start(StartOptions::new(MOCK).sandbox(provider))
        .await
        .expect("start a local sandbox");
    let id = sdk.sandbox_id().expect("a sandbox id").to_owned();
    let pid = id.strip_prefix("local-").expect("local-PID").to_owned();
    assert!(
        sdk.base_url().starts_with("http://127.0.0.1:"),
        "{}",
        sdk.base_url()
    );
    assert_eq!(sdk.fleet(), None);
    // The token is required: a request without it is refused.
    let refused = reqwest::get(format!("{}/v2/sessions", sdk.base_url()))
        .await
        .expect("GET /v2/sessions");
    assert_eq!(refused.status(), 401);
    mock_turns(&sdk, data.utf8()).await;

    let base_url = sdk.base_url().to_owned();
    sdk.destroy_sandbox().await.expect("destroy_sandbox");
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "the server process {pid} still runs"
    );
    assert!(reqwest::get(format!("{base_url}/v2/health")).await.is_err());
    // Twice is fine.
    sdk.destroy_sandbox().await.expect("destroy_sandbox again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_sandbox_that_cannot_start_names_the_step_and_prints_its_output() {
    let provider = local()
        .binary(sandbox_agent_bin())
        .arg("--no-such-flag")
        .timeout(Duration::from_secs(20));
    let started = Instant::now();
    let error = SandboxAgent::start(StartOptions::new(MOCK).sandbox(provider))
        .await
        .expect_err("a bad flag cannot start");
    let Error::Sandbox {
        provider,
        step,
        logs,
        ..
    } = &error
    else {
        panic!("{error:?}");
    };
    assert_eq!((*provider, *step), ("local", SandboxStep::Start), "{error}");
    assert!(logs.contains("--no-such-flag"), "{error}");
    assert!(
        error.to_string().starts_with("local sandbox: start failed"),
        "{error}"
    );
    assert!(started.elapsed() < Duration::from_secs(20));
    assert!(!has_token_shape(&error.to_string()), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_sandbox_starts_prompts_and_is_destroyed_with_the_token_only_in_its_environment() {
    let _serial = SERIAL.lock().await;
    let Some((podman, service, engine)) = engine() else {
        return;
    };
    let mut leftovers = Leftovers::new(podman);
    captured_logs(); // from here on, everything logged is kept
    let fleet = leftovers.fleet("round-trip");
    let sdk = SandboxAgent::start(StartOptions::new(MOCK).sandbox(provider(&service, &fleet)))
        .await
        .expect("start a docker sandbox");
    let id = sdk.sandbox_id().expect("a container id").to_owned();
    assert_eq!(sdk.fleet(), Some(fleet.as_str()));
    assert_eq!(
        containers_of(&engine, &fleet).await,
        std::slice::from_ref(&id)
    );
    assert!(
        sdk.base_url().starts_with("http://127.0.0.1:"),
        "{}",
        sdk.base_url()
    );

    mock_turns(&sdk, "/home/agent").await;
    // What was logged up to here (this test's own inspect below logs the
    // answer, environment included).
    let logged = captured_logs();
    let inspected = engine.inspect_container(&id, None).await.expect("inspect");
    let config = inspected.config.expect("Config");
    let env = config.env.unwrap_or_default();
    let token = env
        .iter()
        .find_map(|pair| pair.strip_prefix("SANDBOX_AGENT_TOKEN="))
        .expect("the token in the container's environment")
        .to_owned();
    assert_eq!(token.len(), 48, "a generated token");
    let cmd = config.cmd.unwrap_or_default();
    let entrypoint = config.entrypoint.unwrap_or_default();
    assert_eq!(cmd, ["server"], "the image's own command");
    assert!(!cmd.concat().contains(&token) && !entrypoint.concat().contains(&token));
    let labels = config.labels.unwrap_or_default();
    assert_eq!(labels.get(FLEET_LABEL), Some(&fleet));
    let bindings = inspected
        .host_config
        .and_then(|host| host.port_bindings)
        .and_then(|mut ports| ports.remove("2468/tcp").flatten())
        .unwrap_or_default();
    assert_eq!(
        bindings.first().and_then(|b| b.host_ip.as_deref()),
        Some("127.0.0.1"),
        "published on loopback only: {bindings:?}"
    );
    let refused = reqwest::get(format!("{}/v2/sessions", sdk.base_url()))
        .await
        .expect("GET /v2/sessions");
    assert_eq!(refused.status(), 401, "the runtime requires the token");

    let output = output_of(&engine, &id).await;
    assert!(
        !output.contains(&token),
        "the token in the container's output:\n{output}"
    );
    // Captured: the SDK's lines and bollard's (which logs request and
    // answer bodies at DEBUG; the provider mutes the calls that hold the
    // environment).
    assert!(
        logged.contains("docker sandbox healthy") && logged.contains("bollard::"),
        "the log is not captured"
    );
    let leaks: Vec<&str> = logged.lines().filter(|l| l.contains(&token)).collect();
    assert!(
        leaks.is_empty(),
        "the token in the client's log: {leaks:#?}"
    );

    sdk.destroy_sandbox().await.expect("destroy_sandbox");
    assert!(
        containers_of(&engine, &fleet).await.is_empty(),
        "the container is removed"
    );
    assert!(engine.inspect_container(&id, None).await.is_err());
    sdk.destroy_sandbox().await.expect("destroy_sandbox again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_sandboxes_get_their_environment_and_keep_files_on_a_named_volume() {
    let _serial = SERIAL.lock().await;
    let Some((podman, service, engine)) = engine() else {
        return;
    };
    let mut leftovers = Leftovers::new(podman);
    let volume = podman.volume();
    // Mounted on the image's /home/agent (the `agent` user's, whom agents
    // and the file API run as): a new volume takes its owner from there.
    let fleet = leftovers.fleet("volume");
    let with_volume = || {
        provider(&service, &fleet)
            .env("PROVIDER_TEST_KEY", "value-123")
            .volume(format!("{}:/home/agent", volume.name))
    };
    let first = SandboxAgent::start(StartOptions::new(MOCK).sandbox(with_volume()))
        .await
        .expect("start the first sandbox");
    let id = first.sandbox_id().expect("an id").to_owned();
    let config = engine
        .inspect_container(&id, None)
        .await
        .expect("inspect")
        .config
        .expect("Config");
    assert!(
        config
            .env
            .unwrap_or_default()
            .contains(&"PROVIDER_TEST_KEY=value-123".to_owned())
    );
    first
        .write_fs_file("/home/agent/note.txt", "kept")
        .await
        .expect("write into the volume");
    first.destroy_sandbox().await.expect("destroy the first");

    let second = SandboxAgent::start(StartOptions::new(MOCK).sandbox(with_volume()))
        .await
        .expect("start the second sandbox");
    let read = second
        .read_fs_file("/home/agent/note.txt")
        .await
        .expect("read from the volume");
    assert_eq!(read, b"kept");
    second.destroy_sandbox().await.expect("destroy the second");
    assert!(containers_of(&engine, &fleet).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_that_never_becomes_healthy_fails_at_health_within_its_timeout_and_is_removed() {
    let _serial = SERIAL.lock().await;
    let Some((podman, service, engine)) = engine() else {
        return;
    };
    let mut leftovers = Leftovers::new(podman);
    let fleet_id = leftovers.fleet("never-healthy");
    let timeout = Duration::from_secs(4);
    let provider = provider(&service, &fleet_id)
        .entrypoint(["/bin/sh", "-c", "echo waiting for nothing; exec sleep 600"])
        .timeout(timeout);
    let started = Instant::now();
    let error = SandboxAgent::start(StartOptions::new(MOCK).sandbox(provider))
        .await
        .expect_err("never healthy");
    let took = started.elapsed();
    let Error::Sandbox {
        provider,
        step,
        logs,
        ..
    } = &error
    else {
        panic!("{error:?}");
    };
    assert_eq!(
        (*provider, *step),
        ("docker", SandboxStep::Health),
        "{error}"
    );
    assert!(logs.contains("waiting for nothing"), "{error}");
    assert!(
        error
            .to_string()
            .starts_with("docker sandbox: health failed"),
        "{error}"
    );
    assert!(
        took >= timeout && took < timeout + Duration::from_secs(10),
        "{took:?}"
    );
    assert!(!has_token_shape(&error.to_string()), "{error}");
    assert!(
        containers_of(&engine, &fleet_id).await.is_empty(),
        "a container is left"
    );

    // One that exits at once fails at start, without waiting for the timeout.
    let fleet = leftovers.fleet("exits");
    let started = Instant::now();
    let error =
        SandboxAgent::start(StartOptions::new(MOCK).sandbox(provider_for_exit(&service, &fleet)))
            .await
            .expect_err("exits");
    let Error::Sandbox {
        step,
        logs,
        message,
        ..
    } = &error
    else {
        panic!("{error:?}");
    };
    assert_eq!(*step, SandboxStep::Start, "{error}");
    assert!(message.contains("exited"), "{error}");
    assert!(logs.contains("no-such-command"), "{error}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    assert!(
        containers_of(&engine, &fleet).await.is_empty(),
        "a container is left"
    );

    // An image that does not exist fails at create.
    let error = SandboxAgent::start(
        StartOptions::new(MOCK).sandbox(
            docker("localhost/no-such-image:never")
                .host(service.docker_host())
                .fleet(&fleet),
        ),
    )
    .await
    .expect_err("no image");
    assert!(
        matches!(
            error,
            Error::Sandbox {
                step: SandboxStep::Create,
                ..
            }
        ),
        "{error}"
    );
    assert!(error.to_string().contains("no-such-image"), "{error}");
}

/// The image running `sandbox-agent no-such-command`: it exits at once.
fn provider_for_exit(service: &EngineService, fleet: &str) -> DockerProvider {
    provider(service, fleet).command(["no-such-command"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_sandboxes_at_once_all_answer_and_are_all_removed() {
    let _serial = SERIAL.lock().await;
    let Some((podman, service, engine)) = engine() else {
        return;
    };
    let mut leftovers = Leftovers::new(podman);
    let fleet = leftovers.fleet("eight");
    let started = Instant::now();
    let runs = (0..8).map(|n| {
        let provider = provider(&service, &fleet);
        async move {
            let begun = Instant::now();
            let sdk = SandboxAgent::start(StartOptions::new(MOCK).sandbox(provider)).await?;
            let healthy = begun.elapsed();
            let session = sdk.create_session(SessionOptions::default()).await;
            let outcome = match session {
                Ok(session) => session.prompt(format!("sandbox {n}")).await,
                Err(error) => Err(error),
            };
            let destroyed = sdk.destroy_sandbox().await;
            let stop = outcome?;
            destroyed?;
            Ok::<_, Error>((
                sdk.sandbox_id().unwrap_or_default().to_owned(),
                healthy,
                stop,
            ))
        }
    });
    let results = futures::future::join_all(runs).await;
    eprintln!(
        "8 sandboxes: started, prompted and destroyed in {:.1?}",
        started.elapsed()
    );
    let mut ids = Vec::new();
    for result in results {
        let (id, healthy, stop) = result.unwrap_or_else(|error| panic!("{error}"));
        eprintln!("  {id:.12}: healthy after {healthy:.2?}");
        assert_eq!(stop, StopReason::EndTurn);
        ids.push(id);
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 8, "eight distinct containers");
    assert!(
        containers_of(&engine, &fleet).await.is_empty(),
        "containers are left"
    );
}

/// The docker example (sandbox-agent-sdk/examples/docker_sandbox.rs) built
/// by `cargo build -p sandbox-agent-sdk --features docker --examples`.
fn example() -> std::path::PathBuf {
    let bin = v2_api_tests::server::binary_path()
        .parent()
        .expect("target/debug")
        .join("examples")
        .join("docker_sandbox");
    assert!(
        bin.is_file(),
        "{} is missing: cargo build -p sandbox-agent-sdk --features docker --examples",
        bin.display()
    );
    bin
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_example_runs_and_cleanup_removes_what_a_killed_client_left_and_only_that() {
    let _serial = SERIAL.lock().await;
    let Some((podman, service, engine)) = engine() else {
        return;
    };
    let mut leftovers = Leftovers::new(podman);
    let example = example();
    let readme = std::fs::read_to_string(workspace_root().join("README.md")).expect("README.md");
    for line in [
        "let sdk = SandboxAgent::start(StartOptions::new(\"mock\").sandbox(provider)).await?;",
        "let session = sdk.create_session(SessionOptions::default()).await?;",
        "sdk.destroy_sandbox().await?;",
    ] {
        assert!(
            readme.contains(line),
            "README.md's Rust example lacks {line:?}"
        );
        let source = std::fs::read_to_string(
            workspace_root().join("sandbox-agent-sdk/examples/docker_sandbox.rs"),
        )
        .expect("the example's source");
        assert!(
            source.contains(line.trim_end_matches('?').trim_end_matches(".await")),
            "{line}"
        );
    }

    // As written: start, prompt, destroy.
    let fleet_a = leftovers.fleet("example");
    let ran = tokio::process::Command::new(&example)
        .arg("hello")
        .env("DOCKER_HOST", service.docker_host())
        .env("SANDBOX_AGENT_IMAGE", v2_api_tests::podman::IMAGE)
        .env("SANDBOX_AGENT_FLEET", &fleet_a)
        .kill_on_drop(true)
        .output();
    let ran = tokio::time::timeout(Duration::from_secs(120), ran)
        .await
        .expect("the example within 120 s")
        .expect("run the example");
    let stdout = String::from_utf8_lossy(&ran.stdout);
    assert!(
        ran.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&ran.stderr)
    );
    assert!(stdout.contains(&format!("(fleet {fleet_a})")), "{stdout}");
    assert!(
        stdout.contains("stop reason: EndTurn\ndestroyed"),
        "{stdout}"
    );
    assert!(containers_of(&engine, &fleet_a).await.is_empty());

    // Killed mid-turn (`!stall`: the mock answers nothing until cancelled):
    // its container stays, next to another fleet's.
    let other = SandboxAgent::start(
        StartOptions::new(MOCK).sandbox(provider(&service, &leftovers.fleet("bystander"))),
    )
    .await
    .expect("another fleet's sandbox");
    let bystander = other.fleet().expect("a fleet").to_owned();
    let mut child = tokio::process::Command::new(&example)
        .arg("!stall")
        .env("DOCKER_HOST", service.docker_host())
        .env("SANDBOX_AGENT_IMAGE", v2_api_tests::podman::IMAGE)
        .env("SANDBOX_AGENT_FLEET", &fleet_a)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the example");
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(
        child.stdout.take().expect("its stdout"),
    ));
    let session_line = tokio::time::timeout(Duration::from_secs(90), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.starts_with("session ") {
                return line;
            }
        }
        panic!("the example ended before its session");
    })
    .await
    .expect("a session within 90 s");
    tokio::time::sleep(Duration::from_millis(300)).await; // the prompt is sent
    child.start_kill().expect("SIGKILL the example");
    child.wait().await.expect("reap the example");
    let left = containers_of(&engine, &fleet_a).await;
    assert_eq!(
        left.len(),
        1,
        "the killed client's container ({session_line}) stays"
    );

    let cleaner = provider(&service, &fleet_a);
    let removed = cleaner.cleanup(&fleet_a).await.expect("cleanup");
    assert_eq!(removed, left);
    assert!(containers_of(&engine, &fleet_a).await.is_empty());
    assert!(
        cleaner
            .cleanup(&fleet_a)
            .await
            .expect("cleanup again")
            .is_empty()
    );
    // The other fleet's sandbox was not touched: it still answers.
    assert_eq!(containers_of(&engine, &bystander).await.len(), 1);
    other.health().await.expect("the bystander still answers");
    assert!(matches!(
        cleaner.cleanup("").await,
        Err(Error::InvalidOptions(_))
    ));
    other
        .destroy_sandbox()
        .await
        .expect("destroy the bystander");
    assert!(containers_of(&engine, &bystander).await.is_empty());
}
