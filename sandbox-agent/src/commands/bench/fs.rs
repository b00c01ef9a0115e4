//! The `fs` scenario: the host file system API against the tools a user
//! would otherwise run on the same disk (research/benchmarks.md). A 1 GiB
//! `GET /v2/fs/file` against `cat FILE > /dev/null`, a 1 GiB
//! `PUT /v2/fs/file` (fsynced) against `dd if=FILE of=COPY bs=1M
//! conv=fsync`, and a 1000-file `POST /v2/fs/upload-batch` against
//! `tar -xf` of the same archive; the server's RSS is sampled throughout.
//! The server must run on this machine (the files are in a local temp dir).

use super::client::BenchError;
use super::report::ScenarioResult;
use super::{BenchOptions, Target};
use futures::StreamExt;
use sandbox_agent_sdk::{ClientOptions, SandboxAgentClient};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

/// Size of the big file, in bytes.
const BIG_FILE_BYTES: u64 = 1 << 30;
/// Files in the upload-batch archive, and the size of each.
const BATCH_FILES: usize = 1000;
const BATCH_FILE_BYTES: usize = 4096;

/// A temp dir removed when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs the scenario. Results: `fs GET`, `fs cat`, `fs PUT`, `fs dd`,
/// `fs upload-batch`, `fs tar -x`; `count` is bytes (files for the batch
/// pair), `seconds` the wall time; the GET and PUT results carry the
/// server's RSS before and at its peak.
///
/// # Errors
/// A server that cannot be reached, a failing tool or transfer.
pub async fn fs(
    target: &Target,
    _options: &BenchOptions,
) -> Result<Vec<ScenarioResult>, BenchError> {
    let scratch = Scratch(
        std::env::temp_dir().join(format!("sandbox-agent-bench-fs-{}", std::process::id())),
    );
    std::fs::create_dir_all(&scratch.0)?;
    let big = scratch.0.join("big.bin");
    write_big_file(&big).await?;
    let mut options = ClientOptions::new("mock")
        .base_url(format!("http://{}", target.address))
        .auto_connect(false)
        .no_request_timeout();
    if let Some(token) = &target.token {
        options = options.token(token);
    }
    let client = SandboxAgentClient::connect(options)
        .await
        .map_err(|e| BenchError::Unexpected(e.to_string()))?;
    let failed = |e: sandbox_agent_sdk::Error| BenchError::Unexpected(e.to_string());
    let mut results = Vec::new();

    // Read: cat, then GET (the page cache is warm for both).
    let cat = timed_tool("cat", &[&big], Some(Path::new("/dev/null"))).await?;
    results.push(bytes_result("fs cat 1 GiB", cat, BIG_FILE_BYTES));
    let peak = RssSampler::start(target);
    let started = Instant::now();
    let mut download = client
        .read_fs_file_stream(big.as_path())
        .await
        .map_err(failed)?;
    let mut received = 0u64;
    while let Some(chunk) = download.next().await {
        received += chunk.map_err(failed)?.len() as u64;
    }
    let mut get = bytes_result("fs GET 1 GiB", started.elapsed(), received);
    peak.finish(&mut get);
    results.push(get);

    // Write: dd with fsync, then PUT (which fsyncs too).
    let copy = scratch.0.join("copy.bin");
    let dd = timed_tool(
        "dd",
        &[
            Path::new(&format!("if={}", big.display())),
            Path::new(&format!("of={}", copy.display())),
            Path::new("bs=1M"),
            Path::new("conv=fsync"),
            Path::new("status=none"),
        ],
        None,
    )
    .await?;
    results.push(bytes_result("fs dd 1 GiB", dd, BIG_FILE_BYTES));
    let peak = RssSampler::start(target);
    let started = Instant::now();
    let file = tokio::fs::File::open(&big).await?;
    let written = client
        .write_fs_file_from(scratch.0.join("put.bin"), file)
        .await
        .map_err(failed)?;
    let mut put = bytes_result("fs PUT 1 GiB", started.elapsed(), written.bytes_written);
    peak.finish(&mut put);
    results.push(put);

    // A tree: tar -x of a 1000-file archive, then the same archive uploaded.
    let tree = scratch.0.join("tree");
    for n in 0..BATCH_FILES {
        let dir = tree.join(format!("d{}", n % 20));
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join(format!("f{n}")), vec![b'x'; BATCH_FILE_BYTES])?;
    }
    let archive = scratch.0.join("tree.tar");
    let made = tokio::process::Command::new("tar")
        .arg("-cf")
        .arg(&archive)
        .arg("-C")
        .arg(&tree)
        .arg(".")
        .status()
        .await?;
    if !made.success() {
        return Err(BenchError::Unexpected("tar -c failed".into()));
    }
    let unpacked = scratch.0.join("tar-x");
    std::fs::create_dir_all(&unpacked)?;
    let tar_x = timed_tool(
        "tar",
        &[Path::new("-xf"), &archive, Path::new("-C"), &unpacked],
        None,
    )
    .await?;
    results.push(bytes_result(
        "fs tar -x 1000 files",
        tar_x,
        BATCH_FILES as u64,
    ));
    let started = Instant::now();
    let file = tokio::fs::File::open(&archive).await?;
    let uploaded = client
        .upload_fs_batch(scratch.0.join("batch"), file)
        .await
        .map_err(failed)?;
    let mut batch = bytes_result(
        "fs upload-batch 1000 files",
        started.elapsed(),
        BATCH_FILES as u64,
    );
    batch.note(format!(
        "{} entries listed, truncated: {}",
        uploaded.paths.len(),
        uploaded.truncated
    ));
    results.push(batch);
    let _ = client.shutdown().await;
    Ok(results)
}

/// Writes `BIG_FILE_BYTES` of non-zero data to `path` (not timed).
async fn write_big_file(path: &Path) -> Result<(), BenchError> {
    let mut file = tokio::fs::File::create(path).await?;
    let chunk: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 251) as u8).collect();
    for _ in 0..BIG_FILE_BYTES >> 20 {
        file.write_all(&chunk).await?;
    }
    file.sync_all().await?;
    Ok(())
}

/// Runs `program args` (stdout to `stdout` or discarded) and times it.
async fn timed_tool(
    program: &str,
    args: &[&Path],
    stdout: Option<&Path>,
) -> Result<Duration, BenchError> {
    let mut command = tokio::process::Command::new(program);
    command.args(args);
    command.stdout(match stdout {
        Some(path) => std::process::Stdio::from(std::fs::File::create(path)?),
        None => std::process::Stdio::null(),
    });
    let started = Instant::now();
    let status = command.status().await?;
    if !status.success() {
        return Err(BenchError::Unexpected(format!(
            "{program} failed: {status}"
        )));
    }
    Ok(started.elapsed())
}

/// A result of `count` units (bytes or files) in `elapsed`; the rate is
/// in `events_per_sec`.
fn bytes_result(name: &str, elapsed: Duration, count: u64) -> ScenarioResult {
    ScenarioResult::events(name, elapsed, count, 0)
}

/// Samples the server's RSS every 20 ms until finished.
pub(super) struct RssSampler {
    before: Option<u64>,
    peak: Arc<AtomicU64>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl RssSampler {
    pub(super) fn start(target: &Target) -> Self {
        let before = target.rss();
        let peak = Arc::new(AtomicU64::new(before.unwrap_or(0)));
        let task = target.pid.map(|pid| {
            let peak = peak.clone();
            tokio::spawn(async move {
                loop {
                    if let Some(rss) = super::rss_bytes(pid) {
                        peak.fetch_max(rss, Ordering::Relaxed);
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
        });
        Self { before, peak, task }
    }

    pub(super) fn finish(self, result: &mut ScenarioResult) {
        if let Some(task) = self.task {
            task.abort();
        }
        result.rss_before = self.before;
        result.rss_after = self.before.map(|_| self.peak.load(Ordering::Relaxed));
        result.note("rss_after is the peak during the transfer".to_owned());
    }
}
