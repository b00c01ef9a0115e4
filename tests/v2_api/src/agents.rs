//! Helpers for the agent install tests (research/contract.md,
//! "Agents: manifest, installs, lazy install"): agents files, release
//! archives, a loopback file server to download them from, and the install
//! endpoint.
//!
//! The file server speaks just enough HTTP/1.1 for one `GET` per connection;
//! it listens on 127.0.0.1 only (the runtime allows plain `http://` archive
//! URLs for loopback hosts: research/contract.md,
//! "Agents: manifest, installs, lazy install", manifest format).

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use reqwest::Method;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::api::{Api, Reply};
use crate::server::{sandbox_agent_bin, shell_quote};

/// Upper bound for an install over the network (npm on a small machine).
pub const INSTALL_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// A folder removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    /// A new empty folder under the system temp dir, named after `label`.
    ///
    /// # Panics
    /// If it cannot be created.
    pub fn new(label: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let path = std::env::temp_dir().join(format!(
            "v2-api-{label}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&path).expect("create a temp dir");
        TempDir(path)
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Its path as text, for a command-line argument.
    ///
    /// # Panics
    /// If the temp dir's path is not UTF-8.
    pub fn utf8(&self) -> &str {
        self.0.to_str().expect("UTF-8 temp dir")
    }

    /// Writes `contents` to `name` inside it; returns the file's path.
    ///
    /// # Panics
    /// If the file cannot be written.
    pub fn write(&self, name: &str, contents: &[u8]) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, contents).expect("write a temp file");
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes `agents` (a JSON array of manifest entries) as an agents file
/// `{"agents": [...]}` into `dir`; returns its path as a string for
/// `--agents-file`.
pub fn agents_file(dir: &TempDir, agents: Value) -> String {
    let body = serde_json::json!({ "version": "1", "agents": agents });
    dir.write("agents.json", body.to_string().as_bytes())
        .to_string_lossy()
        .into_owned()
}

/// Shell lines that answer the runtime's own `initialize` (the first line a
/// fake agent reads) with protocol version 1 and no capabilities: the start
/// of fake agents written in `sh`.
pub const SH_ANSWER_INITIALIZE: &str = r#"IFS= read -r line
id=$(printf '%s' "$line" | sed -n 's/.*"id":\([0-9][0-9]*\).*/\1/p')
printf '{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":1,"agentCapabilities":{}}}\n' "$id"
"#;

/// An `--agent-command` value that runs `script` with `/bin/sh` as agent
/// `name` (the script is written into `dir`).
pub fn sh_agent(dir: &TempDir, name: &str, script: &str) -> String {
    let path = dir.write(&format!("{name}.sh"), script.as_bytes());
    format!("{name}=/bin/sh {}", shell_quote(&path.to_string_lossy()))
}

/// `initialize` for `agent` without a connection, answered within `timeout`.
pub async fn initialize_within(api: &Api, agent: &str, timeout: Duration) -> Reply {
    let request = crate::acp::request(0, "initialize", crate::acp::initialize_params(agent));
    Api::send_within(api.rpc_post(None).body(request.to_string()), timeout).await
}

/// A shell script that runs the built-in mock agent: what a release archive
/// of a "real" agent contains in these tests.
pub fn mock_agent_script() -> Vec<u8> {
    let bin = sandbox_agent_bin();
    format!(
        "#!/bin/sh\nexec {} mock-agent \"$@\"\n",
        shell_quote(&bin.to_string_lossy())
    )
    .into_bytes()
}

/// A fake npm registry on loopback with one package, `name` at `version`,
/// whose only bin (also `name`) is `script`: the registry document at
/// `/<name>` (dist-tag `latest` → `version`) and the package tarball, each
/// from its own [`FileServer`]. Point npm at it with `npm_config_registry`
/// set to `registry.url("/")`.
pub async fn npm_registry(name: &str, version: &str, script: &[u8]) -> NpmRegistry {
    npm_registry_with_scripts(name, version, script, None).await
}

/// [`npm_registry`] with `scripts` (npm's `scripts` object: `install`,
/// `postinstall`, …) in the package's `package.json` and its registry
/// document (`hasInstallScript`), so `npm install` runs them.
pub async fn npm_registry_with_scripts(
    name: &str,
    version: &str,
    script: &[u8],
    scripts: Option<serde_json::Value>,
) -> NpmRegistry {
    let mut package = serde_json::json!({
        "name": name, "version": version, "bin": { name: "bin/agent" }
    });
    let mut entry = serde_json::json!({
        "name": name, "version": version, "bin": { name: "bin/agent" }
    });
    if let Some(scripts) = scripts {
        package["scripts"] = scripts.clone();
        entry["scripts"] = scripts;
        entry["hasInstallScript"] = serde_json::Value::Bool(true);
    }
    let package_json = package.to_string();
    let tarball = tar_gz(&[
        ("package/package.json", package_json.as_bytes(), 0o644),
        ("package/bin/agent", script, 0o755),
    ]);
    let tarball_path = format!("/{name}-{version}.tgz");
    let tarballs = FileServer::start(vec![(tarball_path.as_str(), tarball)]).await;
    entry["dist"] = serde_json::json!({ "tarball": tarballs.url(&tarball_path) });
    let document = serde_json::json!({
        "name": name,
        "dist-tags": { "latest": version },
        "versions": { version: entry },
    })
    .to_string();
    let registry =
        FileServer::start(vec![(format!("/{name}").as_str(), document.into_bytes())]).await;
    NpmRegistry { registry, tarballs }
}

/// What [`npm_registry`] serves.
pub struct NpmRegistry {
    /// The registry documents (`npm view`, the first step of `npm install`).
    pub registry: FileServer,
    /// The package tarballs (only `npm install` fetches them).
    pub tarballs: FileServer,
}

/// A gzip-compressed tar of `files` (`(path, contents, mode)`), built with
/// ordinary headers.
///
/// # Panics
/// If the archive cannot be built.
pub fn tar_gz(files: &[(&str, &[u8], u32)]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, contents, mode) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(contents.len() as u64);
        header.set_mode(*mode);
        header.set_entry_type(tar::EntryType::Regular);
        builder
            .append_data(&mut header, path, *contents)
            .expect("append to the tar");
    }
    let tar = builder.into_inner().expect("finish the tar");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar).expect("gzip");
    gz.finish().expect("finish gzip")
}

/// A tar.gz holding one entry whose raw name is `path` (unchecked, so it can
/// be `../escape`) and a symlink `link` → `target`.
///
/// # Panics
/// If the archive cannot be built.
pub fn evil_tar_gz(path: &str, link: Option<(&str, &str)>) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    let name = &mut header.as_old_mut().name;
    name[..path.len()].copy_from_slice(path.as_bytes());
    header.set_size(3);
    header.set_mode(0o755);
    header.set_entry_type(tar::EntryType::Regular);
    header.set_cksum();
    builder.append(&header, &b"bad"[..]).expect("append");
    if let Some((link, target)) = link {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Symlink);
        header.set_size(0);
        header.set_mode(0o777);
        builder
            .append_link(&mut header, link, target)
            .expect("append a symlink");
    }
    let tar = builder.into_inner().expect("finish the tar");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar).expect("gzip");
    gz.finish().expect("finish gzip")
}

/// SHA-256 of `bytes`, lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The platform key the runtime looks up in `distribution.binary`
/// (`linux-x86_64`, `darwin-aarch64`, …).
pub fn platform_key() -> String {
    let os = match std::env::consts::OS {
        "macos" => "darwin",
        other => other,
    };
    format!("{os}-{}", std::env::consts::ARCH)
}

/// A binary manifest entry for this platform: `archive` at `url`, the
/// program `cmd`, and `sha256` when given.
pub fn binary_entry(id: &str, version: &str, url: &str, cmd: &str, sha256: Option<&str>) -> Value {
    let mut target = serde_json::json!({ "archive": url, "cmd": cmd });
    if let Some(sha256) = sha256 {
        target["sha256"] = Value::from(sha256);
    }
    serde_json::json!({
        "id": id,
        "name": format!("Test agent {id}"),
        "version": version,
        "distribution": { "binary": { platform_key(): target } }
    })
}

/// `POST /v2/agents/{agent}/install` with `body` (none: empty body), within
/// `timeout`.
pub async fn install_within(
    api: &Api,
    agent: &str,
    body: Option<&Value>,
    timeout: Duration,
) -> Reply {
    let mut builder = api.request(Method::POST, &format!("/v2/agents/{agent}/install"));
    if let Some(body) = body {
        builder = builder
            .header("content-type", "application/json")
            .body(body.to_string());
    }
    Api::send_within(builder, timeout).await
}

/// The entry of `agent` in `GET /v2/agents`.
///
/// # Panics
/// If there is none.
pub async fn agent_entry(api: &Api, agent: &str) -> Value {
    let list = api.get_json("/v2/agents").await;
    list["agents"]
        .as_array()
        .and_then(|agents| agents.iter().find(|a| a["id"] == agent))
        .cloned()
        .unwrap_or_else(|| panic!("no agent {agent} in {list}"))
}

/// Names in `dir` (empty when it does not exist), sorted.
pub fn names_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// A loopback HTTP server with fixed files; stopped when dropped.
pub struct FileServer {
    base_url: String,
    hits: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl FileServer {
    /// Serves `files` (URL path → body) on 127.0.0.1; other paths get 404.
    ///
    /// # Panics
    /// If no port can be bound.
    pub async fn start(files: Vec<(&str, Vec<u8>)>) -> FileServer {
        Self::start_slow(files, Duration::ZERO).await
    }

    /// Like [`FileServer::start`], waiting `delay` before each answer (so
    /// concurrent downloads overlap).
    ///
    /// # Panics
    /// If no port can be bound.
    pub async fn start_slow(files: Vec<(&str, Vec<u8>)>, delay: Duration) -> FileServer {
        let files: Arc<HashMap<String, Vec<u8>>> = Arc::new(
            files
                .into_iter()
                .map(|(path, body)| (path.to_owned(), body))
                .collect(),
        );
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the file server");
        let address = listener.local_addr().expect("file server address");
        let hits = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&hits);
        let task = tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let files = Arc::clone(&files);
                let counter = Arc::clone(&counter);
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0_u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 * 1024 {
                        match socket.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    counter.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(delay).await;
                    let text = String::from_utf8_lossy(&head);
                    let path = text.split_whitespace().nth(1).unwrap_or("/").to_owned();
                    let (status, body) = match files.get(&path) {
                        Some(body) => ("200 OK", body.clone()),
                        None => ("404 Not Found", b"not found".to_vec()),
                    };
                    let response = format!(
                        "HTTP/1.1 {status}\r\ncontent-length: {}\r\ncontent-type: application/octet-stream\r\nconnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = socket.write_all(response.as_bytes()).await;
                    let _ = socket.write_all(&body).await;
                    let _ = socket.shutdown().await;
                });
            }
        });
        FileServer {
            base_url: format!("http://{address}"),
            hits,
            task,
        }
    }

    /// The URL of `path` (which starts with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }

    /// Requests served so far.
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::Relaxed)
    }
}

impl Drop for FileServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
