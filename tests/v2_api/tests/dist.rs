//! The release binary (README.md, "A release binary"; scripts/dist) and
//! its install script (README.md, "Install script"; scripts/install.sh):
//! the tarball's layout and checksum, the glibc it needs, `--version`, a
//! server from it answering health and a prompt of the mock agent, and
//! installs from a path and from an http URL, refused on a checksum that
//! does not match.
//!
//! The tarball comes from scripts/dist (scripts/test runs it first); see
//! `v2_api_tests::dist` for where it is looked up.
use std::path::Path;
use std::process::Output;

use serde_json::json;
use v2_api_tests::acp::{self, stop_reason};
use v2_api_tests::agents::{FileServer, TempDir, sha256_hex};
use v2_api_tests::server::{sandbox_agent_bin, workspace_root};
use v2_api_tests::{EVENT_TIMEOUT, MOCK, TestServer, dist};

/// `GLIBC_x.y` → `[x, y]` (and `x.y.z`); `None` for `GLIBC_PRIVATE`.
fn glibc_version(name: &str) -> Option<Vec<u32>> {
    name.strip_prefix("GLIBC_")?
        .split('.')
        .map(|part| part.parse().ok())
        .collect()
}

/// The `GLIBC_` versions `objdump -T` lists for `binary`, newest last.
fn glibc_needs(binary: &Path) -> Vec<(Vec<u32>, String)> {
    let output = std::process::Command::new("objdump")
        .arg("-T")
        .arg(binary)
        .output()
        .expect("run objdump (binutils)");
    assert!(
        output.status.success(),
        "objdump -T {}: {output:?}",
        binary.display()
    );
    let text = String::from_utf8_lossy(&output.stdout);
    let mut needs: Vec<(Vec<u32>, String)> = text
        .lines()
        .filter_map(|line| {
            let start = line.find("GLIBC_")?;
            let version = line[start..].split([' ', ')', '\t']).next()?;
            let symbol = line.split_whitespace().last()?;
            Some((glibc_version(version)?, format!("{symbol} ({version})")))
        })
        .collect();
    needs.sort();
    needs
}

fn dotted(version: &[u32]) -> String {
    version
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(".")
}

fn run(binary: &Path, args: &[&str]) -> Output {
    std::process::Command::new(binary)
        .args(args)
        .output()
        .expect("run sandbox-agent")
}

#[test]
fn tarball_holds_one_folder_with_the_binary_the_license_and_the_readme() {
    let tarball = dist::tarball();
    let bytes = std::fs::read(&tarball).expect("read the tarball");
    let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(bytes.as_slice()));
    let mut entries: Vec<(String, u32)> = archive
        .entries()
        .expect("a tar.gz")
        .map(|entry| {
            let entry = entry.expect("a tar entry");
            let path = entry.path().expect("a path").to_string_lossy().into_owned();
            (
                path.trim_end_matches('/').to_owned(),
                entry.header().mode().expect("a mode"),
            )
        })
        .collect();
    entries.sort();
    let stem = dist::stem();
    let names: Vec<&str> = entries.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names,
        [
            stem.clone(),
            format!("{stem}/LICENSE"),
            format!("{stem}/README.md"),
            format!("{stem}/sandbox-agent"),
        ],
        "{entries:?}"
    );
    assert_eq!(
        entries[3].1 & 0o111,
        0o111,
        "the binary is executable: {entries:?}"
    );

    let name = tarball.file_name().expect("a file name").to_string_lossy();
    let listed = std::fs::read_to_string(format!("{}.sha256", tarball.display()))
        .expect("the .sha256 beside the tarball");
    assert_eq!(listed, format!("{}  {name}\n", sha256_hex(&bytes)));

    let unpacked = dist::unpacked_binary();
    let folder = unpacked.parent().expect("the tarball's folder");
    let license = std::fs::read_to_string(folder.join("LICENSE")).expect("LICENSE");
    assert!(
        license.contains("Apache License") && license.contains("Version 2.0, January 2004"),
        "{license:.200}"
    );
}

#[test]
fn release_binary_needs_no_glibc_above_2_17_and_is_stripped() {
    let binary = dist::unpacked_binary();
    let needs = glibc_needs(&binary);
    assert!(
        !needs.is_empty(),
        "a dynamic binary needs some GLIBC_ version"
    );
    let limit = glibc_version(&format!("GLIBC_{}", dist::GLIBC)).expect("a version");
    let above: Vec<&String> = needs
        .iter()
        .filter(|(version, _)| *version > limit)
        .map(|(_, symbol)| symbol)
        .collect();
    assert!(
        above.is_empty(),
        "symbols above GLIBC_{}: {above:?}",
        dist::GLIBC
    );

    let sections = std::process::Command::new("objdump")
        .arg("-h")
        .arg(&binary)
        .output()
        .expect("objdump -h");
    let sections = String::from_utf8_lossy(&sections.stdout);
    assert!(
        !sections.contains(".symtab"),
        "stripped: no .symtab\n{sections}"
    );
    assert!(
        !sections.contains(".debug_info"),
        "stripped: no DWARF\n{sections}"
    );
}

/// `--version`'s four lines, the glibc one as `objdump -T` reads the same
/// file: 2.17 for the release binary, the build machine's for a plain
/// `cargo build` (which must not claim 2.17).
#[test]
fn version_names_the_commit_the_target_and_the_glibc_the_binary_needs() {
    let version = env!("CARGO_PKG_VERSION");
    for binary in [dist::unpacked_binary(), sandbox_agent_bin()] {
        let output = run(&binary, &["--version"]);
        assert!(output.status.success(), "{output:?}");
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{}: {text}", binary.display());
        assert_eq!(lines[0], format!("sandbox-agent {version}"), "{text}");
        let commit = lines[1]
            .strip_prefix("commit: ")
            .unwrap_or_else(|| panic!("{text}"));
        assert!(
            commit == "unknown"
                || (commit.len() == 12 && commit.chars().all(|c| c.is_ascii_hexdigit())),
            "{text}"
        );
        assert_eq!(lines[2], format!("target: {}", dist::TARGET), "{text}");
        let newest = glibc_needs(&binary).pop().expect("GLIBC_ needs").0;
        assert_eq!(
            lines[3],
            format!("glibc: {} or newer", dotted(&newest)),
            "{text}"
        );

        let short = run(&binary, &["-V"]);
        assert!(short.status.success(), "{short:?}");
        assert_eq!(
            String::from_utf8_lossy(&short.stdout),
            format!("sandbox-agent {version}\n")
        );
    }
    let release = run(&dist::unpacked_binary(), &["--version"]);
    assert!(
        String::from_utf8_lossy(&release.stdout)
            .contains(&format!("glibc: {} or newer", dist::GLIBC)),
        "{release:?}"
    );
}

#[tokio::test]
async fn release_binary_serves_health_and_a_mock_prompt_into_its_sqlite_store() {
    let server = TestServer::start_binary(&dist::unpacked_binary(), &[]).await;
    let health = server.health().await;
    health.assert_status(200);
    let health = health.json();
    assert_eq!(health["status"], "ok", "{health}");
    assert_eq!(health["version"], env!("CARGO_PKG_VERSION"), "{health}");
    assert_eq!(health["store"], "ok", "{health}");

    let conn = server.initialize(MOCK).await;
    let mut stream = server.open_stream(&conn, None).await;
    let session = server.new_session(&conn).await;
    let reply = server
        .prompt(&conn, &session, json!(7), "hello from the release binary")
        .await;
    assert_eq!(stop_reason(&reply), Some("end_turn"), "{reply}");
    let last = acp::mock_reply_chunks("hello from the release binary")
        .last()
        .cloned()
        .unwrap_or_default();
    stream
        .next_event_matching(
            |event| event.agent_text() == Some(last.as_str()),
            EVENT_TIMEOUT,
        )
        .await;
    server.store_caught_up(EVENT_TIMEOUT).await;
    let events = server.all_events(&session).await;
    assert!(
        events
            .iter()
            .any(|event| event.to_string().contains("hello from the release binary")),
        "the prompt is in the store: {events:?}"
    );
    // The mock agent is the server's own binary: the release one.
    let agents = server.mock_agent_processes();
    assert!(!agents.is_empty(), "a mock agent runs");
    for agent in agents {
        let exe = std::fs::read_link(format!("/proc/{}/exe", agent.pid)).expect("its exe");
        assert_eq!(
            exe.canonicalize().ok(),
            dist::unpacked_binary().canonicalize().ok(),
            "the mock agent runs the release binary"
        );
    }
}

/// `sh scripts/install.sh ARGS` (dash on Debian: POSIX sh).
async fn install(args: &[&str]) -> Output {
    tokio::process::Command::new("sh")
        .arg(workspace_root().join("scripts").join("install.sh"))
        .args(args)
        .output()
        .await
        .expect("run scripts/install.sh")
}

fn assert_installed(prefix: &TempDir, output: &Output) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    let installed = prefix.path().join("bin").join("sandbox-agent");
    assert!(
        stdout.contains(&installed.display().to_string()),
        "{stdout}"
    );
    let version = run(&installed, &["--version"]);
    assert!(version.status.success(), "{version:?}");
    assert!(
        String::from_utf8_lossy(&version.stdout)
            .starts_with(&format!("sandbox-agent {}\n", env!("CARGO_PKG_VERSION"))),
        "{version:?}"
    );
    assert_eq!(
        std::fs::read(&installed).expect("the installed binary"),
        std::fs::read(dist::unpacked_binary()).expect("the release binary"),
        "the installed binary is the tarball's"
    );
    let names: Vec<String> = std::fs::read_dir(prefix.path().join("bin"))
        .expect("bin")
        .map(|entry| {
            entry
                .expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert_eq!(names, ["sandbox-agent"], "nothing staged is left behind");
}

fn assert_refused(prefix: &TempDir, output: &Output, why: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "{why}: installed anyway: {stderr}"
    );
    assert!(stderr.contains(why), "{why}: {stderr}");
    if why == "checksum mismatch" {
        assert!(
            stderr.contains("nothing was installed"),
            "the refusal says so: {stderr}"
        );
    }
    assert!(
        !prefix.path().join("bin").exists(),
        "{why}: nothing under the prefix"
    );
}

#[tokio::test]
async fn install_script_installs_from_a_path_and_replaces_an_older_binary() {
    let tarball = dist::tarball();
    let prefix = TempDir::new("install-path");
    let prefix_arg = prefix.utf8();
    let output = install(&["--prefix", prefix_arg, tarball.to_str().expect("UTF-8")]).await;
    assert_installed(&prefix, &output);
    // Again, over the installed one (a running server keeps its file).
    let output = install(&["--prefix", prefix_arg, tarball.to_str().expect("UTF-8")]).await;
    assert_installed(&prefix, &output);
}

/// The release tarball as a download would serve it: its file name, its
/// bytes and its `.sha256` file's bytes.
fn published() -> (String, Vec<u8>, Vec<u8>) {
    let tarball = dist::tarball();
    let name = tarball
        .file_name()
        .expect("a name")
        .to_string_lossy()
        .into_owned();
    let bytes = std::fs::read(&tarball).expect("read the tarball");
    let checksum = std::fs::read(format!("{}.sha256", tarball.display())).expect(".sha256");
    (name, bytes, checksum)
}

#[tokio::test]
async fn install_script_installs_from_an_http_url_with_its_sha256_or_the_given_one() {
    let (name, bytes, checksum) = published();
    let files = FileServer::start(vec![
        (&format!("/release/{name}"), bytes.clone()),
        (&format!("/release/{name}.sha256"), checksum),
        ("/bare/sandbox-agent.tar.gz", bytes.clone()),
    ])
    .await;

    let prefix = TempDir::new("install-url");
    let url = files.url(&format!("/release/{name}"));
    let output = install(&["--prefix", prefix.utf8(), &url]).await;
    assert_installed(&prefix, &output);

    // No .sha256 served beside it: --sha256 gives the expectation.
    let prefix = TempDir::new("install-url-sha");
    let url = files.url("/bare/sandbox-agent.tar.gz");
    let expected = sha256_hex(&bytes).to_uppercase();
    let output = install(&["--prefix", prefix.utf8(), "--sha256", &expected, &url]).await;
    assert_installed(&prefix, &output);

    // Neither: refused, nothing installed.
    let prefix = TempDir::new("install-url-none");
    let output = install(&["--prefix", prefix.utf8(), &url]).await;
    assert_refused(&prefix, &output, "cannot download");
}

#[tokio::test]
async fn install_script_refuses_a_tampered_tarball_or_a_wrong_checksum() {
    let tarball = dist::tarball();
    let (name, bytes, checksum) = published();

    // One byte of the tarball changed, its published .sha256 beside it.
    let folder = TempDir::new("install-tampered");
    let mut tampered = bytes.clone();
    let middle = tampered.len() / 2;
    tampered[middle] ^= 0x01;
    let path = folder.write(&name, &tampered);
    folder.write(&format!("{name}.sha256"), &checksum);
    let prefix = TempDir::new("install-tampered-prefix");
    let output = install(&["--prefix", prefix.utf8(), path.to_str().expect("UTF-8")]).await;
    assert_refused(&prefix, &output, "checksum mismatch");

    // The real tarball, a wrong --sha256.
    let prefix = TempDir::new("install-wrong-sha");
    let wrong = sha256_hex(b"another file");
    let output = install(&[
        "--prefix",
        prefix.utf8(),
        "--sha256",
        &wrong,
        tarball.to_str().expect("UTF-8"),
    ])
    .await;
    assert_refused(&prefix, &output, "checksum mismatch");

    // Over http, the .sha256 served names another tarball's sum.
    let files = FileServer::start(vec![
        (&format!("/r/{name}"), bytes),
        (
            &format!("/r/{name}.sha256"),
            format!("{wrong}  {name}\n").into_bytes(),
        ),
    ])
    .await;
    let prefix = TempDir::new("install-wrong-url-sha");
    let output = install(&["--prefix", prefix.utf8(), &files.url(&format!("/r/{name}"))]).await;
    assert_refused(&prefix, &output, "checksum mismatch");

    // Not a checksum at all.
    let prefix = TempDir::new("install-bad-sha");
    let output = install(&[
        "--prefix",
        prefix.utf8(),
        "--sha256",
        "12ab",
        tarball.to_str().expect("UTF-8"),
    ])
    .await;
    assert!(!output.status.success(), "{output:?}");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("64 hex digits"),
        "{output:?}"
    );
    assert!(!prefix.path().join("bin").exists());
}
