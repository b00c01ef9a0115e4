//! What a web page on another site can do to a `--no-token` server
//! (research/contract.md, "Auth and CORS"): nothing. A foreign `Origin` is
//! refused on every request and WebSocket upgrade, a foreign `Host` on a
//! loopback connection (DNS rebinding) is refused, and upload-batch takes
//! only archive content types. `curl`-style clients (no `Origin`) and the
//! server's own pages keep working.
//!
//! Plain HTTP checks here; the same attacks from a real page in headless
//! Chromium are at the end (`tests/v2_api/fixtures/cross_site.mjs`).

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use futures::StreamExt;
use reqwest::Method;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio_tungstenite::connect_async;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use v2_api_tests::browser::{chromium, puppeteer};
use v2_api_tests::server::{sandbox_agent_command, workspace_root};
use v2_api_tests::{
    Api, REQUEST_TIMEOUT, Reply, STARTUP_TIMEOUT, TempDir, TestServer, assert_problem,
};

const EVIL: &str = "http://evil.example";

/// `POST path` with `Origin: origin` (when given), a `text/plain` body: a
/// "simple" request a page may send cross-site without a preflight.
async fn simple_post(api: &Api, path: &str, origin: Option<&str>) -> Reply {
    let mut builder = api
        .request(Method::POST, path)
        .header("content-type", "text/plain")
        .body("x");
    if let Some(origin) = origin {
        builder = builder.header("origin", origin);
    }
    Api::send(builder).await
}

fn encoded(path: &Path) -> String {
    v2_api_tests::path_segment(&path.to_string_lossy())
}

/// A one-file tar archive.
fn tar_of(name: &str, data: &[u8]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(data.len() as u64);
    header.set_mode(0o644);
    header.set_cksum();
    builder
        .append_data(&mut header, name, data)
        .expect("append");
    builder.into_inner().expect("tar")
}

#[tokio::test]
async fn a_foreign_origin_is_refused_and_nothing_happens() {
    let server = TestServer::start(&[]).await;
    let dir = TempDir::new("xsite-origin");
    let target = dir.path().join("made-by-a-page");
    let q = encoded(&target);
    for path in [
        format!("/v2/fs/mkdir?path={q}"),
        format!("/v2/fs/upload-batch?path={q}"),
        "/v2/agents/mock/install".to_owned(),
        "/v2/rpc".to_owned(),
        "/acp/mock".to_owned(),
        "/v2/health".to_owned(),
    ] {
        let reply = simple_post(&server, &path, Some(EVIL)).await;
        assert_problem(&reply, 403, "forbidden-origin");
        // A sandboxed page or a file: URL sends "null".
        let reply = simple_post(&server, &path, Some("null")).await;
        assert_problem(&reply, 403, "forbidden-origin");
    }
    // Another port of the same host is another origin.
    let port = server.addr().rsplit(':').next().expect("port");
    let other_port = format!(
        "http://127.0.0.1:{}",
        port.parse::<u16>().expect("port") ^ 1
    );
    let reply = simple_post(
        &server,
        &format!("/v2/fs/mkdir?path={q}"),
        Some(&other_port),
    )
    .await;
    assert_problem(&reply, 403, "forbidden-origin");
    // A form's multipart POST to upload-batch, with a real archive in it.
    let reply = Api::send(
        server
            .request(Method::POST, &format!("/v2/fs/upload-batch?path={q}"))
            .header("origin", EVIL)
            .header("content-type", "application/x-tar")
            .body(tar_of("authorized_keys", b"ssh-ed25519 AAAA attacker")),
    )
    .await;
    assert_problem(&reply, 403, "forbidden-origin");
    assert!(!target.exists(), "a refused request created {target:?}");
    let sessions = server.get_json("/v2/sessions").await;
    assert_eq!(sessions["sessions"], json!([]), "{sessions}");
}

#[tokio::test]
async fn a_foreign_origin_is_refused_on_the_websocket_upgrade() {
    let server = TestServer::start(&[]).await;
    let url = format!("ws://{}/acp/mock", server.addr());
    let mut request = url.clone().into_client_request().expect("request");
    request
        .headers_mut()
        .insert("origin", HeaderValue::from_static(EVIL));
    match tokio::time::timeout(REQUEST_TIMEOUT, connect_async(request)).await {
        Ok(Err(tokio_tungstenite::tungstenite::Error::Http(response))) => {
            assert_eq!(response.status(), 403);
            let content_type = response
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok());
            assert_eq!(content_type, Some("application/problem+json"));
            let body: serde_json::Value =
                serde_json::from_slice(response.body().as_deref().unwrap_or_default())
                    .expect("problem body");
            assert_eq!(body["type"], "urn:sandbox-agent:error:forbidden-origin");
        }
        other => panic!("a foreign-origin upgrade must be refused with 403: {other:?}"),
    }
    // The server's own origin (what a page it serves sends) upgrades.
    let mut request = url.into_client_request().expect("request");
    let own = format!("http://{}", server.addr());
    request
        .headers_mut()
        .insert("origin", HeaderValue::from_str(&own).expect("origin"));
    let (mut socket, response) = tokio::time::timeout(REQUEST_TIMEOUT, connect_async(request))
        .await
        .expect("upgrade in time")
        .expect("same-origin upgrade");
    assert_eq!(response.status(), 101);
    let _ = socket.close(None).await;
    let _ = tokio::time::timeout(Duration::from_secs(2), socket.next()).await;
}

#[tokio::test]
async fn the_servers_own_origin_and_allowed_origins_are_served() {
    let server = TestServer::start(&["--cors-allow-origin", "https://app.example"]).await;
    let dir = TempDir::new("xsite-own");
    let own = format!("http://{}", server.addr());
    // Behind a TLS proxy the page's origin is https:// with the same host
    // and port: the scheme is not compared.
    let tls = format!("https://{}", server.addr());
    for (n, origin) in [own.as_str(), tls.as_str(), "https://app.example"]
        .into_iter()
        .enumerate()
    {
        let made = dir.path().join(format!("d{n}"));
        let reply = simple_post(
            &server,
            &format!("/v2/fs/mkdir?path={}", encoded(&made)),
            Some(origin),
        )
        .await;
        reply.assert_status(200);
        assert!(made.is_dir(), "Origin {origin}: {reply:?}");
    }
    // No Origin at all (curl, the SDK): served as before.
    let made = dir.path().join("curl");
    let reply = simple_post(
        &server,
        &format!("/v2/fs/mkdir?path={}", encoded(&made)),
        None,
    )
    .await;
    reply.assert_status(200);
    assert!(made.is_dir());
}

/// `GET path` with `Host: host`.
async fn get_with_host(api: &Api, path: &str, host: &str) -> Reply {
    Api::send(api.request(Method::GET, path).header("host", host)).await
}

#[tokio::test]
async fn a_foreign_host_on_a_loopback_connection_is_refused() {
    let server = TestServer::start(&[
        "--allowed-host",
        "sandbox.example",
        "--allowed-host",
        "proxy.example:8443",
    ])
    .await;
    let dir = TempDir::new("xsite-host");
    let secret = dir.write("secret.txt", b"private key material");
    let read = format!("/v2/fs/file?path={}", encoded(&secret));
    for host in [
        "attacker.example",
        "attacker.example:2468",
        "proxy.example:9999",
        "localhost.attacker.example",
    ] {
        let reply = get_with_host(&server, &read, host).await;
        assert_problem(&reply, 403, "forbidden-host");
        assert!(!String::from_utf8_lossy(&reply.body).contains("private key"));
        let reply = get_with_host(&server, "/v2/health", host).await;
        assert_problem(&reply, 403, "forbidden-host");
    }
    // Loopback names at any port (ssh -L, kubectl port-forward), and the
    // --allowed-host values.
    for host in [
        "localhost:9999",
        "localhost",
        "127.0.0.1:1",
        "[::1]:2468",
        "sandbox.example",
        "sandbox.example:1234",
        "proxy.example:8443",
    ] {
        let reply = get_with_host(&server, &read, host).await;
        reply.assert_status(200);
        assert_eq!(&reply.body[..], b"private key material", "Host {host}");
    }
    // The Origin rule compares with the Host sent: a proxy's page is
    // same-origin under its own name.
    let made = dir.path().join("via-proxy");
    let reply = Api::send(
        server
            .request(
                Method::POST,
                &format!("/v2/fs/mkdir?path={}", encoded(&made)),
            )
            .header("host", "sandbox.example")
            .header("origin", "https://sandbox.example"),
    )
    .await;
    reply.assert_status(200);
}

#[tokio::test]
async fn a_bad_allowed_host_is_refused_at_start() {
    let output = Command::from(sandbox_agent_command())
        .args([
            "server",
            "--no-token",
            "--port",
            "0",
            "--allowed-host",
            "http://x/",
        ])
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run sandbox-agent");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--allowed-host") && stderr.contains("is not a Host value"),
        "{stderr}"
    );
}

/// A `--no-token` server on an address of the test's choosing (the
/// harness binds `127.0.0.1:0` only); killed on drop.
struct BoundServer {
    _child: Child,
    port: u16,
    _data_dir: TempDir,
}

impl BoundServer {
    async fn start(host: &str, port: u16) -> Self {
        Self::start_in(None, host, port).await
    }

    /// The server in the network namespace `netns` (`ip netns exec`), or
    /// in the test's own.
    async fn start_in(netns: Option<&TestHost>, host: &str, port: u16) -> Self {
        let data_dir = TempDir::new("xsite-bound");
        let port = port.to_string();
        let mut command = match netns {
            Some(netns) => {
                let mut command = Command::new("ip");
                command
                    .args(["netns", "exec", &netns.name])
                    .arg(v2_api_tests::server::sandbox_agent_bin());
                for (key, _) in std::env::vars_os() {
                    if key
                        .to_str()
                        .is_some_and(|k| k.starts_with("SANDBOX_AGENT_"))
                    {
                        command.env_remove(key);
                    }
                }
                command
            }
            None => Command::from(sandbox_agent_command()),
        };
        let mut child = command
            .args(["server", "--no-token", "--host", host, "--port", &port])
            .env("SANDBOX_AGENT_DATA_DIR", data_dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn sandbox-agent server");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        tokio::time::timeout(STARTUP_TIMEOUT, BufReader::new(stdout).read_line(&mut line))
            .await
            .expect("start-up line in time")
            .expect("read the start-up line");
        let port = line
            .trim()
            .rsplit(':')
            .next()
            .and_then(|port| port.parse().ok())
            .unwrap_or_else(|| panic!("no port in the start-up line {line:?}"));
        Self {
            _child: child,
            port,
            _data_dir: data_dir,
        }
    }
}

/// A test host: a network namespace this test makes, joined to the test's
/// own by a veth pair (`10.213.N.1` here, `10.213.N.2` there), so a
/// connection reaches the server on a non-loopback address without leaving
/// this machine. Removed on drop.
struct TestHost {
    name: String,
    /// Our end of the veth pair.
    link: String,
    /// The namespace's address, as the test reaches it.
    address: IpAddr,
}

impl TestHost {
    /// Needs root and iproute2; the reason when it cannot be made.
    fn create() -> Result<Self, String> {
        let id = std::process::id() % 250 + 1;
        let name = format!("sa-xsite-{}", std::process::id());
        let (here, there) = (format!("sa-xa{id}"), format!("sa-xb{id}"));
        let ip = |args: &[&str]| -> Result<(), String> {
            let output = std::process::Command::new("ip")
                .args(args)
                .output()
                .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
            if output.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "ip {}: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&output.stderr).trim()
                ))
            }
        };
        ip(&["netns", "add", &name])?;
        // From here on, dropping `host` removes what was made.
        let host = Self {
            name: name.clone(),
            link: here.clone(),
            address: IpAddr::from([10, 213, u8::try_from(id).unwrap_or(1), 2]),
        };
        let ours = format!("10.213.{id}.1/30");
        let theirs = format!("10.213.{id}.2/30");
        ip(&["link", "add", &here, "type", "veth", "peer", "name", &there])?;
        ip(&["link", "set", &there, "netns", &name])?;
        ip(&["addr", "add", &ours, "dev", &here])?;
        ip(&["link", "set", &here, "up"])?;
        ip(&[
            "netns", "exec", &name, "ip", "addr", "add", &theirs, "dev", &there,
        ])?;
        ip(&["netns", "exec", &name, "ip", "link", "set", &there, "up"])?;
        ip(&["netns", "exec", &name, "ip", "link", "set", "lo", "up"])?;
        Ok(host)
    }
}

impl Drop for TestHost {
    fn drop(&mut self) {
        // Deleting the namespace deletes its end of the veth pair, and so
        // the pair.
        let _ = std::process::Command::new("ip")
            .args(["netns", "delete", &self.name])
            .output();
        // Left when moving the peer into the namespace failed.
        let _ = std::process::Command::new("ip")
            .args(["link", "delete", &self.link])
            .output();
    }
}

/// `GET /v2/health` with `Host: attacker.example`, raw, to `address`.
async fn health_with_foreign_host(address: SocketAddr) -> u16 {
    raw_get(
        &address.to_string(),
        "/v2/health",
        "Host: attacker.example\r\n",
    )
    .await
    .0
}

/// The `Host` rule follows the address the connection reached, not the
/// bind address: a `0.0.0.0` server checks it on loopback, and serves any
/// name on a public address (a sandbox platform's proxy).
#[tokio::test]
async fn a_connection_on_a_public_address_serves_any_host() {
    let server = BoundServer::start("0.0.0.0", 0).await;
    let loopback = SocketAddr::from(([127, 0, 0, 1], server.port));
    assert_eq!(health_with_foreign_host(loopback).await, 403);
    // The same on a test host: a 0.0.0.0 server reached on its
    // non-loopback address serves any name, and still checks loopback.
    match TestHost::create() {
        Ok(host) => {
            let server = BoundServer::start_in(Some(&host), "0.0.0.0", 0).await;
            let public = SocketAddr::new(host.address, server.port);
            assert_eq!(health_with_foreign_host(public).await, 200, "via {public}");
        }
        Err(why) => {
            eprintln!("SKIPPED the public-address half of this test (no test host): {why}");
        }
    }
}

#[tokio::test]
async fn upload_batch_takes_only_archive_content_types() {
    let server = TestServer::start(&[]).await;
    let dir = TempDir::new("xsite-upload");
    let archive = tar_of("authorized_keys", b"ssh-ed25519 AAAA attacker");
    for content_type in [
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=xyz"),
        Some("application/octet-stream"),
        None,
    ] {
        let target = dir.path().join("refused");
        let mut builder = server
            .request(
                Method::POST,
                &format!("/v2/fs/upload-batch?path={}", encoded(&target)),
            )
            .body(archive.clone());
        if let Some(content_type) = content_type {
            builder = builder.header("content-type", content_type);
        }
        let reply = Api::send(builder).await;
        assert_problem(&reply, 415, "unsupported-media-type");
        assert!(!target.exists(), "Content-Type {content_type:?} unpacked");
    }
    let mut gzipped = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gzipped, &archive).expect("gzip");
    let gzipped = gzipped.finish().expect("gzip");
    for (content_type, body) in [
        ("application/x-tar", archive.clone()),
        ("application/gzip", gzipped),
    ] {
        let target = dir.path().join(content_type.replace('/', "-"));
        let reply = Api::send(
            server
                .request(
                    Method::POST,
                    &format!("/v2/fs/upload-batch?path={}", encoded(&target)),
                )
                .header("content-type", content_type)
                .body(body),
        )
        .await;
        reply.assert_status(200);
        assert!(target.join("authorized_keys").is_file(), "{content_type}");
    }
}

// ---------------------------------------------------------------------------
// The same attacks from a real page: Debian's Chromium, headless, through
// puppeteer-core from tests/npm (as tests/inspector.rs).

/// Upper bound on one browser run.
const BROWSER_TIMEOUT: Duration = Duration::from_secs(180);

/// `node cross_site.mjs FLOW` with Chromium and puppeteer-core; killed on
/// drop.
fn browser(flow: &str) -> Command {
    let mut command = Command::new("node");
    command
        .arg(workspace_root().join("tests/v2_api/fixtures/cross_site.mjs"))
        .arg(flow)
        .env("CHROMIUM", chromium())
        .env("PUPPETEER_CORE", puppeteer())
        .kill_on_drop(true);
    command
}

/// Serves `page` as `text/html` to every request on a loopback port of its
/// own (the attacker's site), until dropped.
struct AttackerSite {
    url: String,
    port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl AttackerSite {
    async fn start(fixture: &str) -> Self {
        let page =
            std::fs::read_to_string(workspace_root().join("tests/v2_api/fixtures").join(fixture))
                .expect("read the attacker's page");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the attacker's site");
        let port = listener.local_addr().expect("address").port();
        let url = format!("http://127.0.0.1:{port}");
        let task = tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let page = page.clone();
                tokio::spawn(async move {
                    let mut head = [0_u8; 4096];
                    let _ =
                        tokio::time::timeout(Duration::from_secs(5), socket.read(&mut head)).await;
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: text/html; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{page}",
                        page.len()
                    );
                    let _ = socket.write_all(answer.as_bytes()).await;
                    let _ = socket.shutdown().await;
                });
            }
        });
        Self { url, port, task }
    }
}

impl Drop for AttackerSite {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A page on another localhost port tries every attack on a `--no-token`
/// server: a `text/plain` fetch POST to mkdir and upload-batch, a form
/// POST (multipart, with a tar in it) to upload-batch, an install, and a
/// WebSocket on `/acp/mock` that would run `session/new`. Nothing reaches
/// the disk or the agent, the browser saw 403s, and the page learnt nothing.
#[tokio::test]
async fn a_page_on_another_port_gets_nothing() {
    let server = TestServer::start(&[]).await;
    let dir = TempDir::new("xsite-browser");
    let site = AttackerSite::start("cross_site.html").await;
    let target = dir.path().join("pwned");
    // A file a page would love to run as its own script: `<script src>`
    // sends no Origin.
    std::fs::write(
        target.with_extension("js"),
        "window.leakedSecret = 'ssh-ed25519 secret';",
    )
    .expect("secret script");
    let mut command = browser("cross-origin");
    command.arg(&site.url).arg(server.base_url()).arg(&target);
    let output = tokio::time::timeout(BROWSER_TIMEOUT, command.output())
        .await
        .expect("the browser run finished in time")
        .expect("run node");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the browser run failed:\n{stdout}\n{}\nserver log:\n{}",
        String::from_utf8_lossy(&output.stderr),
        server.stderr_text()
    );
    let report: serde_json::Value = serde_json::from_str(
        stdout
            .lines()
            .rev()
            .find(|line| line.starts_with('{'))
            .unwrap_or_else(|| panic!("no report from the browser run:\n{stdout}")),
    )
    .expect("the report is JSON");
    eprintln!("browser report: {report:#}");

    // On disk and in the server: nothing.
    assert!(!target.exists(), "the page created {target:?}");
    assert!(!target.with_extension("batch").exists());
    assert!(!target.with_extension("form").exists());
    let sessions = server.get_json("/v2/sessions").await;
    assert_eq!(sessions["sessions"], json!([]), "{sessions}");

    // What the browser saw of each request to the server: 403, where it
    // shows the answer at all (a `no-cors` fetch's answer, with
    // `Cross-Origin-Resource-Policy: same-origin`, is withheld from the
    // page as a network error).
    let statuses = report["statuses"].as_object().expect("statuses");
    for attack in ["form", "websocket"] {
        assert_eq!(
            statuses.get(attack).and_then(serde_json::Value::as_u64),
            Some(403),
            "the browser's status for {attack}: {report:#}"
        );
    }
    for attack in ["mkdir", "batch", "install", "script"] {
        let status = statuses.get(attack).and_then(serde_json::Value::as_u64);
        assert!(
            status.is_none_or(|status| status == 403),
            "the browser's status for {attack}: {report:#}"
        );
    }
    // What the page itself learnt: nothing readable, no open socket, no
    // script of the server run.
    let page = &report["page"];
    for attack in ["mkdir", "batch", "install"] {
        let seen = page[attack].as_str().unwrap_or_default();
        assert!(
            seen == "opaque" || seen.starts_with("failed"),
            "{attack}: {report:#}"
        );
    }
    assert_eq!(page["websocket"], "closed before open", "{report:#}");
    assert_eq!(page["script"], "error", "{report:#}");

    // The same requests, as the page sent them, answered by the server.
    let reply = simple_post(
        &server,
        &format!("/v2/fs/mkdir?path={}", encoded(&target)),
        Some(&site.url),
    )
    .await;
    assert_problem(&reply, 403, "forbidden-origin");
}

/// DNS rebinding in the browser: a page loaded from
/// `http://attacker.example:PORT` (the name resolves to 127.0.0.1) keeps
/// polling its own origin; the site behind it goes away and a `--no-token`
/// server takes the same address and port. The page is same-origin with the
/// server now, but its requests say `Host: attacker.example:PORT`: 403, and
/// the page reads no file.
#[tokio::test]
async fn a_rebound_page_reads_no_file() {
    let dir = TempDir::new("xsite-rebinding");
    let secret = dir.write("id_ed25519", b"-----BEGIN OPENSSH PRIVATE KEY----- secret");
    let site = AttackerSite::start("rebinding.html").await;
    let port = site.port;
    let url = format!("http://attacker.example:{port}/?path={}", encoded(&secret));
    let mut node = browser("rebinding")
        .arg(&url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run node");
    let mut lines = BufReader::new(node.stdout.take().expect("stdout")).lines();
    let loaded = tokio::time::timeout(BROWSER_TIMEOUT, lines.next_line())
        .await
        .expect("the page loaded in time")
        .expect("read the browser's output");
    assert_eq!(loaded.as_deref(), Some("loaded"));
    // The rebinding: the attacker's site stops, the server takes its port.
    drop(site);
    let _server = BoundServer::start("127.0.0.1", port).await;
    let report = tokio::time::timeout(BROWSER_TIMEOUT, lines.next_line())
        .await
        .expect("the page reported in time")
        .expect("read the browser's output")
        .unwrap_or_default();
    let status = tokio::time::timeout(BROWSER_TIMEOUT, node.wait()).await;
    let report: serde_json::Value = serde_json::from_str(&report)
        .unwrap_or_else(|_| panic!("no report from the page: {report:?} (node: {status:?})"));
    eprintln!("page report: {report}");
    let body = report["body"].as_str().unwrap_or_default();
    assert!(
        !body.contains("PRIVATE KEY"),
        "the page read the file: {report}"
    );
    assert_eq!(report["status"], 403, "{report}");
    assert!(body.contains("forbidden-host"), "{report}");
}

/// `GET` of `path` with raw `headers` (one `Name: value` per line), over a
/// plain TCP connection to `address`: the status and the head.
async fn raw_get(address: &str, path: &str, headers: &str) -> (u16, String) {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(address).await?;
        let request = format!("GET {path} HTTP/1.1\r\n{headers}Connection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await?;
        Ok::<_, std::io::Error>(raw)
    };
    let raw = tokio::time::timeout(REQUEST_TIMEOUT, exchange)
        .await
        .expect("answer in time")
        .expect("exchange");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|status| status.parse().ok())
        .unwrap_or_else(|| panic!("no status in {text:?}"));
    (status, text)
}

#[tokio::test]
async fn another_sites_subresource_requests_are_refused_and_nothing_embeds() {
    let server = TestServer::start(&[]).await;
    let dir = TempDir::new("xsite-fetch-metadata");
    let file = dir.write("secret.js", b"window.leakedSecret = 1;");
    let path = format!("/v2/fs/file?path={}", encoded(&file));
    let host = format!("Host: {}\r\n", server.addr());
    // A `<script src>` or `<img>` of another site's page: no Origin. And
    // navigations to anything but the inspector: a download in an iframe
    // or a new window, against an error page, would tell the page the file
    // exists.
    for fetch in [
        "Sec-Fetch-Site: same-site\r\nSec-Fetch-Mode: navigate\r\nSec-Fetch-Dest: iframe\r\n",
        "Sec-Fetch-Site: cross-site\r\nSec-Fetch-Mode: navigate\r\nSec-Fetch-Dest: document\r\n",
        "Sec-Fetch-Site: CROSS-SITE\r\nSec-Fetch-Mode: no-cors\r\n",
    ] {
        let (status, head) = raw_get(server.addr(), &path, &format!("{host}{fetch}")).await;
        assert_eq!(status, 403, "{fetch:?}: {head}");
    }
    let (status, head) = raw_get(
        server.addr(),
        "/ui/",
        &format!("{host}Sec-Fetch-Site: cross-site\r\nSec-Fetch-Mode: navigate\r\nSec-Fetch-Dest: iframe\r\n"),
    )
    .await;
    assert_eq!(
        status, 403,
        "the inspector in another site's iframe: {head}"
    );
    let (status, head) = raw_get(
        server.addr(),
        "/ui/",
        &format!("{host}Sec-Fetch-Site: cross-site\r\nSec-Fetch-Mode: navigate\r\nSec-Fetch-Dest: document\r\n"),
    )
    .await;
    assert_eq!(status, 200, "a link to the inspector: {head}");
    for site in ["cross-site", "same-site"] {
        let (status, head) = raw_get(
            server.addr(),
            &path,
            &format!("{host}Sec-Fetch-Site: {site}\r\nSec-Fetch-Mode: no-cors\r\nSec-Fetch-Dest: script\r\n"),
        )
        .await;
        assert_eq!(status, 403, "{site}: {head}");
        assert!(head.contains("forbidden-origin"), "{head}");
    }
    // A person typing the URL, or the server's own page.
    for fetch in [
        "Sec-Fetch-Site: none\r\nSec-Fetch-Mode: navigate\r\n",
        "Sec-Fetch-Site: same-origin\r\nSec-Fetch-Mode: cors\r\n",
        "",
    ] {
        let (status, head) = raw_get(server.addr(), &path, &format!("{host}{fetch}")).await;
        assert_eq!(status, 200, "{fetch:?}: {head}");
        let lower = head.to_ascii_lowercase();
        assert!(
            lower.contains("cross-origin-resource-policy: same-origin")
                && lower.contains("x-content-type-options: nosniff"),
            "every answer forbids embedding elsewhere: {head}"
        );
    }
    // Two Host fields: refused, never one of them picked.
    let (status, head) = raw_get(
        server.addr(),
        "/v2/health",
        "Host: 127.0.0.1\r\nHost: attacker.example\r\n",
    )
    .await;
    assert_eq!(status, 400, "{head}");
}
