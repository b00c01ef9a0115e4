//! Release archives: downloaded over HTTPS (plain HTTP only from a loopback
//! host), at most [`MAX_DOWNLOAD_BYTES`], checked against their SHA-256 when
//! the manifest gives one, and unpacked by [`crate::archive`].

use super::layout::{Staging, make_executable};
use super::manifest::BinaryTarget;
use super::progress::Progress;
use crate::archive;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

/// Largest archive download accepted, in bytes (2 GiB): an untrusted server
/// must not fill the disk. Agent releases today are a few hundred MiB at most.
const MAX_DOWNLOAD_BYTES: u64 = 2 << 30;
/// How often download progress is reported.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);
/// Downloads, checks and unpacks a release archive into `staging.dir`;
/// returns the program's path relative to it.
pub(super) async fn install_archive(
    http: &OnceLock<reqwest::Client>,
    staging: &Staging,
    target: &BinaryTarget,
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
    let digest = download(http, &url, &staging.download, progress).await?;
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
    http: &OnceLock<reqwest::Client>,
    url: &reqwest::Url,
    path: &Path,
    progress: &dyn Progress,
) -> Result<String, String> {
    let client = http_client(http)?;
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

fn http_client(http: &OnceLock<reqwest::Client>) -> Result<&reqwest::Client, String> {
    if let Some(client) = http.get() {
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
    Ok(http.get_or_init(|| client))
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
}
