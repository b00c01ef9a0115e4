//! The release binary in containers (README.md, "Deploy it" → "Container
//! image"; research/decisions.md, "Container image"): the tarball of
//! `scripts/dist` in a bare Debian 12 (no Rust, no Node.js), and the image
//! the repository's `Dockerfile` builds, run as a user runs it: with a
//! token in the environment, a volume, a published port, `podman stop`.
//!
//! Real podman (runc), real images, the real server over the published
//! port. The tests share one machine-wide podman and one image, so they run
//! one at a time ([`SERIAL`]). Where podman cannot run at all they say so in
//! one line and check nothing (tests/v2_api/src/podman.rs).

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use v2_api_tests::acp::{self, stop_reason};
use v2_api_tests::podman::{Container, Podman, podman};
use v2_api_tests::{Api, MOCK, dist, path_segment};

/// One test at a time: they share podman's store and the image.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The token the containers here get in `SANDBOX_AGENT_TOKEN`.
const TOKEN: &str = "container-test-token-5f0c2a";

/// Longest a container may take from `podman run` to a `200` from
/// `/v2/health` (measured: well under a second; the machine is shared).
const HEALTHY_WITHIN: Duration = Duration::from_secs(30);

/// The data dir inside the image (its `SANDBOX_AGENT_DATA_DIR` and volume).
const DATA_DIR: &str = "/var/lib/sandbox-agent";

/// One mock turn through `api`: `initialize`, `session/new` (cwd `/tmp`),
/// `session/prompt "hello"`; checks the reply and returns the session id.
async fn mock_turn(api: &Api) -> String {
    let conn = api.initialize(MOCK).await;
    let session = api.new_session(&conn).await;
    let mut stream = api.open_stream(&conn, None).await;
    let answer = api.prompt(&conn, &session, json!(2), "hello").await;
    assert_eq!(stop_reason(&answer), Some("end_turn"), "{answer}");
    let mut said = String::new();
    let want = acp::mock_reply("hello");
    while said != want {
        let event = stream.next_event(v2_api_tests::EVENT_TIMEOUT).await;
        if event.session_id() == Some(session.as_str()) {
            said.push_str(event.agent_text().unwrap_or_default());
        }
        assert!(want.starts_with(&said), "the mock's reply so far: {said:?}");
    }
    session
}

/// What the agents' user can read of every process: its uid and name, its
/// environment, every command line, and every environment it may read
/// (the root processes' it may not), the mock agent's marked.
const READ_PROC: &str = r#"id -u; id -un; env
for p in /proc/[0-9]*; do
    line=$(tr '\0' ' ' < $p/cmdline 2>/dev/null); echo "$line"
    environ=$(tr '\0' '\n' < $p/environ 2>/dev/null) || continue
    case $line in *"sandbox-agent mock-agent"*) echo "environ of the mock agent, running as $(stat -c %U $p):";; esac
    echo "$environ"
done
exit 0"#;

/// The session ids `GET /v2/sessions` lists.
async fn listed_sessions(api: &Api) -> Vec<String> {
    let listed: Value = api.get_json("/v2/sessions").await;
    listed["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .filter_map(|s| s["sessionId"].as_str().map(str::to_owned))
        .collect()
}

/// The image with [`TOKEN`] and `volume` on the data dir.
fn start_image(podman: &'static Podman, volume: &str) -> Container {
    let mount = format!("{volume}:{DATA_DIR}");
    podman.start(
        podman.image(),
        &["-v", &mount],
        &[("SANDBOX_AGENT_TOKEN", TOKEN)],
        &[],
    )
}

#[tokio::test]
async fn release_binary_runs_in_a_bare_debian_without_rust_or_node() {
    let _serial = SERIAL.lock().await;
    let Some(podman) = podman() else { return };
    let base = podman.base_image();
    let binary = dist::unpacked_binary();
    let mount = format!(
        "{}:/usr/local/bin/sandbox-agent:ro",
        binary.to_str().expect("UTF-8 path")
    );

    // Nothing of a build or an agent runtime in the base.
    let output = podman.output(&[
        "run",
        "--rm",
        base,
        "sh",
        "-c",
        "for tool in cargo rustc node npm; do command -v $tool; done; exit 0",
    ]);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "",
        "tools in the base"
    );

    let version = podman.run_ok(&[
        "run",
        "--rm",
        "-v",
        &mount,
        base,
        "sandbox-agent",
        "--version",
    ]);
    assert!(
        version.starts_with(&format!("sandbox-agent {}", env!("CARGO_PKG_VERSION"))),
        "{version}"
    );

    let container = podman.start(
        base,
        &["-v", &mount],
        &[("SANDBOX_AGENT_TOKEN", TOKEN)],
        &[
            "sandbox-agent",
            "server",
            "--host",
            "0.0.0.0",
            "--port",
            "2468",
            "--data-dir",
            "/tmp/sandbox-agent",
        ],
    );
    let (api, _) = container.healthy(Some(TOKEN), HEALTHY_WITHIN).await;
    let health = api.health().await;
    health.assert_status(200);
    mock_turn(&api).await;
}

#[tokio::test]
async fn image_serves_with_a_token_keeps_sessions_on_its_volume_and_stops_on_sigterm() {
    let _serial = SERIAL.lock().await;
    let Some(podman) = podman() else { return };
    let volume = podman.volume();
    podman.image(); // built (or found in the cache) before the clock starts

    let started = Instant::now();
    let first = start_image(podman, &volume.name);
    let ran = started.elapsed();
    let (api, polled) = first.healthy(Some(TOKEN), HEALTHY_WITHIN).await;
    eprintln!(
        "podman run -d: {ran:.2?}, then healthy in {polled:.2?} (scripts/container-startup measures it)"
    );

    // The image's HEALTHCHECK (kept by --format docker) passes.
    assert!(
        first
            .inspect("{{.Config.Healthcheck}}")
            .contains("/v2/health"),
        "no HEALTHCHECK in the image"
    );
    let check = podman.output(&["healthcheck", "run", &first.name]);
    assert!(check.status.success(), "podman healthcheck run: {check:?}");

    // The token is required on every route but /v2/health.
    let anonymous = first.api(None);
    anonymous.health().await.assert_status(200);
    let refused = Api::send(anonymous.request(reqwest::Method::GET, "/v2/sessions")).await;
    refused.assert_status(401);
    let wrong = first.api(Some("not-the-token"));
    Api::send(wrong.request(reqwest::Method::GET, "/v2/sessions"))
        .await
        .assert_status(401);

    let session = mock_turn(&api).await;

    // A process of the process API runs as the image's unprivileged user,
    // and nothing it can read holds the token: not its environment, not
    // any command line, not the environment of any process it may read
    // (the mock agent's among them: its connection is still open).
    let (code, stdout, stderr) = api.run_sh(READ_PROC, "/tmp").await;
    assert_eq!(code, 0, "{stderr}");
    let mut lines = stdout.lines();
    let uid: u32 = lines.next().and_then(|l| l.parse().ok()).expect("a uid");
    assert_ne!(uid, 0, "the process runs as root");
    assert_eq!(lines.next(), Some("agent"), "{stdout}");
    assert!(
        stdout.contains("environ of the mock agent, running as agent:"),
        "the mock agent's environment was not read:\n{stdout}"
    );
    assert!(
        !stdout.contains(TOKEN) && !stdout.contains("SANDBOX_AGENT_TOKEN"),
        "the agents' user can read the token:\n{stdout}"
    );

    // An orphan reaches PID 1 (tini), which reaps it when it exits: a
    // `sleep` left behind by `podman exec` ends and leaves no zombie.
    podman.run_ok(&["exec", &first.name, "sh", "-c", "(sleep 1 &); true"]);
    let orphan = podman.run_ok(&[
        "exec",
        &first.name,
        "sh",
        "-c",
        "grep -l '^Name:.*sleep' /proc/[0-9]*/status | xargs grep -h '^PPid:'",
    ]);
    assert_eq!(
        orphan.split_whitespace().collect::<Vec<_>>(),
        ["PPid:", "1"]
    );
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let states = podman.run_ok(&["exec", &first.name, "sh", "-c", "cat /proc/[0-9]*/status"]);
    assert!(
        !states
            .lines()
            .any(|l| l.starts_with("Name:") && l.contains("sleep")),
        "the orphan still runs:\n{states}"
    );
    assert!(
        !states
            .lines()
            .any(|l| l.starts_with("State:") && l.contains("zombie")),
        "a zombie is left:\n{states}"
    );

    // Removed and started again on the same volume: the session is listed
    // (the store and the runtime id live on the volume).
    let stop = podman.output(&["stop", "-t", "10", &first.name]);
    assert!(stop.status.success(), "{stop:?}");
    assert_eq!(
        first.exit_code(Duration::from_secs(5)).await,
        0,
        "{}",
        first.logs()
    );
    drop(first);
    let second = start_image(podman, &volume.name);
    let (api, _) = second.healthy(Some(TOKEN), HEALTHY_WITHIN).await;
    assert_eq!(listed_sessions(&api).await, [session.as_str()]);
    let entry = api
        .get_json(&format!(
            "/v2/sessions/{}?agent={MOCK}",
            path_segment(&session)
        ))
        .await;
    assert_eq!(entry["sessionId"], session.as_str(), "{entry}");
    mock_turn(&api).await;

    // SIGTERM (podman stop): the server stops within the 10 s, exits 0 (tini
    // passes its status on), and says the store was flushed.
    let stopping = Instant::now();
    let stop = podman.output(&["stop", "-t", "10", &second.name]);
    let took = stopping.elapsed();
    assert!(stop.status.success(), "{stop:?}");
    let logs = second.logs();
    assert_eq!(second.exit_code(Duration::from_secs(5)).await, 0, "{logs}");
    assert!(
        took < Duration::from_secs(10),
        "podman stop took {took:?}: {logs}"
    );
    assert!(logs.contains("SIGTERM: shutting down"), "{logs}");
    assert!(logs.contains("session store flushed"), "{logs}");
}

#[tokio::test]
async fn image_without_a_token_exits_saying_how_to_set_one() {
    let _serial = SERIAL.lock().await;
    let Some(podman) = podman() else { return };
    let container = podman.start(podman.image(), &[], &[], &[]);
    let code = container.exit_code(Duration::from_secs(30)).await;
    let logs = container.logs();
    // 64 (EX_USAGE) from scripts/container-entrypoint, passed on by tini.
    assert_eq!(code, 64, "{logs}");
    assert!(logs.contains("SANDBOX_AGENT_TOKEN"), "{logs}");
    assert!(logs.contains("-e SANDBOX_AGENT_TOKEN"), "{logs}");

    // An empty one is no token either.
    let container = podman.start(podman.image(), &[], &[("SANDBOX_AGENT_TOKEN", "")], &[]);
    assert_eq!(container.exit_code(Duration::from_secs(30)).await, 64);
}

/// The `n`-th (from 0) fenced `sh` block after the line `heading` of
/// README.md.
fn readme_sh_block(heading: &str, n: usize) -> String {
    let text = std::fs::read_to_string(v2_api_tests::server::workspace_root().join("README.md"))
        .expect("read README.md");
    let mut lines = text.lines().skip_while(|line| *line != heading);
    assert!(lines.next().is_some(), "README.md has no {heading:?}");
    for _ in 0..n {
        lines.by_ref().find(|line| *line == "```sh");
        lines.by_ref().find(|line| *line == "```");
    }
    lines
        .by_ref()
        .find(|line| *line == "```sh")
        .unwrap_or_else(|| panic!("no sh block {n} after {heading:?}"));
    lines
        .take_while(|line| *line != "```")
        .collect::<Vec<_>>()
        .join("\n")
}

/// `text` with `from` replaced by `to`.
///
/// # Panics
/// If `text` has no `from` (README.md's example changed).
fn replaced(text: &str, from: &str, to: &str) -> String {
    assert!(
        text.contains(from),
        "README.md's example has no {from:?}:\n{text}"
    );
    text.replace(from, to)
}

#[tokio::test]
async fn readme_runs_the_image_as_written() {
    let _serial = SERIAL.lock().await;
    let Some(podman) = podman() else { return };
    let image = podman.image();
    // README's commands with only the names and the port changed, so they
    // touch nothing of a user's (a container, a volume, port 2468).
    let name = format!("sandbox-agent-readme-{}", std::process::id());
    let volume = podman.named_volume(format!("{name}-data"));
    let container = podman.container(name.clone());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let script = readme_sh_block("### Container image", 1);
    let script = replaced(&script, "--name sandbox-agent ", &format!("--name {name} "));
    let script = replaced(
        &script,
        "podman stop sandbox-agent",
        &format!("podman stop {name}"),
    );
    let script = replaced(
        &script,
        "-p 2468:2468",
        &format!("-p 127.0.0.1:{port}:2468"),
    );
    let script = replaced(&script, "localhost:2468", &format!("localhost:{port}"));
    let script = replaced(
        &script,
        "sandbox-agent-data:/var/lib/sandbox-agent sandbox-agent\n",
        &format!("{}:/var/lib/sandbox-agent {image}\n", volume.name),
    );
    let output = tokio::process::Command::new("bash")
        .args(["-euo", "pipefail", "-c", &script])
        .env("CONTAINERS_CONF", podman.containers_conf())
        .env_remove("SANDBOX_AGENT_TOKEN")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(120), output)
        .await
        .expect("README's commands end within 2 minutes")
        .expect("run bash");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "README's commands failed: {}\n{script}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    // The health answer, then the (empty) session list behind the token:
    // curl's bodies end with no newline, so they share a line.
    let bodies: Vec<Value> = stdout
        .lines()
        .filter_map(|line| line.find('{').map(|start| &line[start..]))
        .flat_map(|json| serde_json::Deserializer::from_str(json).into_iter::<Value>())
        .map_while(Result::ok)
        .collect();
    assert!(
        bodies
            .iter()
            .any(|body| body.get("storeDroppedEvents").is_some()),
        "no health answer in:\n{stdout}"
    );
    let listing = bodies
        .iter()
        .find(|body| body.get("sessions").is_some())
        .unwrap_or_else(|| panic!("no session list in:\n{stdout}"));
    assert_eq!(listing["sessions"], json!([]), "{listing}");
    assert_eq!(
        container.exit_code(Duration::from_secs(5)).await,
        0,
        "{}",
        container.logs()
    );
}
