//! `sandbox-agent fs …`: the host file system API of a running server
//! (research/contract.md, "Host file system") from the command line, through
//! the SDK. Transfers show a progress bar on stderr when it is a terminal.

use super::args::{RemoteArgs, URL_ENV, client};
use bytes::Bytes;
use clap::{Args, Subcommand};
use futures::StreamExt;
use indicatif::{ProgressBar, ProgressStyle};
use sandbox_agent_sdk::{FsEntry, FsEntryType, FsPath, SandboxAgentClient};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use tokio::io::{AsyncSeekExt, AsyncWriteExt};

/// `sandbox-agent fs`.
#[derive(Debug, Clone, Args)]
#[command(mut_arg("url", |url| url.env(URL_ENV)))]
pub struct FsArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: FsCommand,
    /// `--url` (else $SANDBOX_AGENT_URL) and `--token`.
    #[command(flatten)]
    pub server: RemoteArgs,
    /// Relative paths start at this session's working directory (else the
    /// server's).
    #[arg(long, global = true, value_name = "ID")]
    pub session: Option<String>,
}

/// The `fs` subcommands. Remote paths are absolute, or relative as
/// `--session` says.
#[derive(Debug, Clone, Subcommand)]
pub enum FsCommand {
    /// List a directory (default: the working directory).
    Ls {
        /// Remote directory.
        path: Option<String>,
        /// Print the JSON answer.
        #[arg(long)]
        json: bool,
    },
    /// Show one entry as JSON.
    Stat {
        /// Remote path.
        path: String,
    },
    /// Download a file (to stdout without LOCAL, or with LOCAL `-`).
    Get {
        /// Remote file.
        remote: String,
        /// Local file to write.
        local: Option<PathBuf>,
    },
    /// Upload a file (LOCAL `-` reads stdin); the remote file is replaced whole.
    Put {
        /// Local file.
        local: PathBuf,
        /// Remote file.
        remote: String,
    },
    /// Upload a directory tree (tarred on the fly), or a .tar / .tar.gz
    /// archive, into a remote directory.
    Upload {
        /// Local directory or archive.
        local: PathBuf,
        /// Remote directory (created).
        remote: String,
    },
    /// Delete a file, symlink or empty directory.
    Rm {
        /// Remote path.
        path: String,
        /// Delete a directory with everything in it.
        #[arg(short, long)]
        recursive: bool,
    },
    /// Move or rename.
    Mv {
        /// Remote source.
        from: String,
        /// Remote destination.
        to: String,
        /// Replace an existing destination.
        #[arg(long)]
        overwrite: bool,
    },
    /// Create a directory and its parents.
    Mkdir {
        /// Remote directory.
        path: String,
    },
}

/// Runs `sandbox-agent fs …`.
///
/// # Errors
/// A message for the user: no `--url`, the server's problem detail, a local
/// file that cannot be read or written.
pub async fn run(args: FsArgs) -> Result<(), String> {
    let url = args
        .server
        .url
        .as_deref()
        .ok_or("--url is required (the server to talk to, e.g. http://127.0.0.1:2468)")?;
    let client = client(url, args.server.token.as_deref(), None).await?;
    let remote = |path: &str| {
        let path = FsPath::from(path);
        match &args.session {
            Some(session) => path.in_session(session),
            None => path,
        }
    };
    let failed = |e: sandbox_agent_sdk::Error| e.to_string();
    match &args.command {
        FsCommand::Ls { path, json } => {
            let entries = client
                .list_fs_entries(remote(path.as_deref().unwrap_or(".")))
                .await
                .map_err(failed)?;
            if *json {
                print_json(&serde_json::json!({ "entries": entries }))?;
            } else {
                for entry in &entries {
                    println!("{}", listing_line(entry));
                }
            }
        }
        FsCommand::Stat { path } => {
            print_json(&client.stat_fs(remote(path)).await.map_err(failed)?)?;
        }
        FsCommand::Get {
            remote: path,
            local,
        } => {
            let local = local.as_deref().filter(|local| *local != Path::new("-"));
            get(&client, remote(path), local).await?;
        }
        FsCommand::Put {
            local,
            remote: path,
        } => {
            let written = if local == Path::new("-") {
                client
                    .write_fs_file_from(remote(path), tokio::io::stdin())
                    .await
            } else {
                let (reader, bar) = local_reader(local).await?;
                let written = client.write_fs_file_from(remote(path), reader).await;
                bar.finish_and_clear();
                written
            }
            .map_err(failed)?;
            println!("{} ({} bytes)", written.path, written.bytes_written);
        }
        FsCommand::Upload {
            local,
            remote: path,
        } => {
            let uploaded = if local.is_dir() {
                client.upload_fs_dir(remote(path), local.clone()).await
            } else {
                let (reader, bar) = local_reader(local).await?;
                let uploaded = client.upload_fs_batch(remote(path), reader).await;
                bar.finish_and_clear();
                uploaded
            }
            .map_err(failed)?;
            for path in &uploaded.paths {
                println!("{path}");
            }
            if uploaded.truncated {
                eprintln!("(more entries were unpacked than listed)");
            }
        }
        FsCommand::Rm { path, recursive } => {
            let removed = client
                .delete_fs_entry(remote(path), *recursive)
                .await
                .map_err(failed)?;
            println!("{removed}");
        }
        FsCommand::Mv {
            from,
            to,
            overwrite,
        } => {
            let moved = client
                .move_fs(remote(from), to, *overwrite)
                .await
                .map_err(failed)?;
            println!("{} -> {}", moved.from, moved.to);
        }
        FsCommand::Mkdir { path } => {
            println!("{}", client.mkdir_fs(remote(path)).await.map_err(failed)?);
        }
    }
    Ok(())
}

/// `fs get`: downloads `remote` to `local` (stdout when `None`). A download
/// that breaks off is resumed with `If-Range` (research/contract.md, "Host
/// file system"): the rest of the same version is appended; when the file
/// changed meanwhile the server sends the whole new one, and the local file
/// is truncated and written again, so it never holds two versions. Stdout
/// cannot be rewound: there a changed file is an error.
async fn get(
    client: &SandboxAgentClient,
    remote: FsPath,
    local: Option<&Path>,
) -> Result<(), String> {
    let failed = |e: sandbox_agent_sdk::Error| e.to_string();
    let mut download = client
        .read_fs_file_stream(remote.clone())
        .await
        .map_err(failed)?;
    let bar = progress(download.content_length());
    let mut out = match local {
        Some(local) => Output::File(
            tokio::fs::File::create(local)
                .await
                .map_err(|e| format!("{}: {e}", local.display()))?,
            local.to_owned(),
        ),
        None => Output::Stdout(tokio::io::stdout()),
    };
    let mut written = 0u64;
    let mut resumes = 0;
    while let Some(chunk) = download.next().await {
        let error = match chunk {
            Ok(chunk) => {
                out.write_all(&chunk).await?;
                written += chunk.len() as u64;
                bar.inc(chunk.len() as u64);
                continue;
            }
            Err(error) => error,
        };
        download = client
            .continue_fs_download(remote.clone(), &download, error, written, &mut resumes)
            .await
            .map_err(failed)?;
        if download.offset() != written {
            out.start_over().await?;
            written = 0;
            bar.set_position(0);
            if let Some(length) = download.content_length() {
                bar.set_length(length);
            }
        }
    }
    out.flush().await?;
    bar.finish_and_clear();
    Ok(())
}

/// Where `fs get` writes.
enum Output {
    File(tokio::fs::File, PathBuf),
    Stdout(tokio::io::Stdout),
}

impl Output {
    async fn write_all(&mut self, bytes: &[u8]) -> Result<(), String> {
        match self {
            Self::File(file, path) => file
                .write_all(bytes)
                .await
                .map_err(|e| format!("{}: {e}", path.display())),
            Self::Stdout(stdout) => stdout.write_all(bytes).await.map_err(|e| e.to_string()),
        }
    }

    async fn flush(&mut self) -> Result<(), String> {
        match self {
            Self::File(file, path) => file
                .flush()
                .await
                .map_err(|e| format!("{}: {e}", path.display())),
            Self::Stdout(stdout) => stdout.flush().await.map_err(|e| e.to_string()),
        }
    }

    /// Empties what was written so far, for the whole new version.
    async fn start_over(&mut self) -> Result<(), String> {
        match self {
            Self::File(file, path) => {
                let failed = |e: std::io::Error| format!("{}: {e}", path.display());
                file.flush().await.map_err(failed)?;
                file.set_len(0).await.map_err(failed)?;
                file.seek(std::io::SeekFrom::Start(0))
                    .await
                    .map(drop)
                    .map_err(failed)
            }
            Self::Stdout(_) => Err(
                "the file changed on the server while it was downloading, and what was written to stdout cannot be taken back; run the download again (or download to a file)"
                    .to_owned(),
            ),
        }
    }
}

/// `d  4096  2026-01-01T00:00:00Z  name` style line of `fs ls`.
fn listing_line(entry: &FsEntry) -> String {
    let kind = match entry.entry_type {
        FsEntryType::Directory => 'd',
        FsEntryType::Symlink => 'l',
        FsEntryType::File => '-',
    };
    let name = match &entry.symlink_target {
        Some(target) => format!("{} -> {target}", entry.name),
        None => entry.name.clone(),
    };
    format!(
        "{kind} {:>12}  {}  {name}",
        entry.size,
        entry.modified.as_deref().unwrap_or("-")
    )
}

fn print_json(value: &impl serde::Serialize) -> Result<(), String> {
    let text = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
    println!("{text}");
    Ok(())
}

/// A progress bar of `total` bytes on stderr, hidden when stderr is not a
/// terminal.
fn progress(total: Option<u64>) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = match total {
        Some(total) => ProgressBar::new(total),
        None => ProgressBar::new_spinner(),
    };
    if let Ok(style) = ProgressStyle::with_template(
        "{bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
    ) {
        bar.set_style(style);
    }
    bar
}

/// `local` opened for reading, counted on a progress bar as it is read.
async fn local_reader(
    local: &Path,
) -> Result<(impl tokio::io::AsyncRead + Send + 'static, ProgressBar), String> {
    let file = tokio::fs::File::open(local)
        .await
        .map_err(|e| format!("{}: {e}", local.display()))?;
    let size = file.metadata().await.ok().map(|m| m.len());
    let bar = progress(size);
    let counted = bar.clone();
    let chunks = tokio_util::io::ReaderStream::with_capacity(file, 256 * 1024).map(
        move |chunk: std::io::Result<Bytes>| {
            if let Ok(chunk) = &chunk {
                counted.inc(chunk.len() as u64);
            }
            chunk
        },
    );
    Ok((tokio_util::io::StreamReader::new(chunks), bar))
}
