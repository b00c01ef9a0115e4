//! The release tarball scripts/dist makes (README.md, "A release binary"),
//! found in one place and unpacked once for the tests that run it.
//!
//! Where: `$SANDBOX_AGENT_DIST_TARBALL` when set, else
//! `<workspace>/dist/sandbox-agent-<version>-x86_64-unknown-linux-gnu.tar.gz`
//! (`<version>`: the workspace's). Inside: one folder
//! `sandbox-agent-<version>-x86_64-unknown-linux-gnu/` with `sandbox-agent`,
//! `LICENSE` and `README.md`; beside it `….tar.gz.sha256` in sha256sum's
//! format. scripts/test runs scripts/dist before `cargo test`.
use std::fs::File;
use std::path::PathBuf;
use std::sync::OnceLock;

use flate2::read::GzDecoder;
use sha2::{Digest, Sha256};

use crate::server::workspace_root;

/// The target triple of the release binary.
pub const TARGET: &str = "x86_64-unknown-linux-gnu";

/// The newest glibc the release binary may need (scripts/dist links
/// against glibc 2.17's symbol versions).
pub const GLIBC: &str = "2.17";

/// `sandbox-agent-<version>-x86_64-unknown-linux-gnu`: the tarball's name
/// without `.tar.gz`, and its one top-level folder.
pub fn stem() -> String {
    format!("sandbox-agent-{}-{TARGET}", env!("CARGO_PKG_VERSION"))
}

/// The release tarball's path.
///
/// # Panics
/// If it does not exist: "run scripts/dist first (scripts/test does)".
pub fn tarball() -> PathBuf {
    let path = match std::env::var_os("SANDBOX_AGENT_DIST_TARBALL") {
        Some(path) => PathBuf::from(path),
        None => workspace_root()
            .join("dist")
            .join(format!("{}.tar.gz", stem())),
    };
    assert!(
        path.is_file(),
        "no release tarball at {}: run scripts/dist first (scripts/test does)",
        path.display()
    );
    path
}

/// The `sandbox-agent` binary of [`tarball`], unpacked once per tarball
/// content into `<target dir>/dist-unpacked/<sha256 prefix>/` (test
/// binaries run at once: each unpacks beside it and renames into place,
/// the first rename wins).
///
/// # Panics
/// If the tarball cannot be read or unpacked, or holds no
/// `<stem>/sandbox-agent`.
pub fn unpacked_binary() -> PathBuf {
    static UNPACKED: OnceLock<PathBuf> = OnceLock::new();
    UNPACKED.get_or_init(unpack).clone()
}

fn unpack() -> PathBuf {
    let tarball = tarball();
    let bytes = std::fs::read(&tarball).expect("read the release tarball");
    let digest: String = Sha256::digest(&bytes)[..8]
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => workspace_root().join(dir),
        None => workspace_root().join("target"),
    };
    let base = target.join("dist-unpacked");
    let done = base.join(&digest);
    let binary = done.join(stem()).join("sandbox-agent");
    if !binary.is_file() {
        let partial = base.join(format!(".{digest}.{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&partial);
        std::fs::create_dir_all(&partial).expect("create the unpack folder");
        tar::Archive::new(GzDecoder::new(
            File::open(&tarball).expect("open the tarball"),
        ))
        .unpack(&partial)
        .expect("unpack the release tarball");
        if std::fs::rename(&partial, &done).is_err() {
            // Another test binary got there first.
            let _ = std::fs::remove_dir_all(&partial);
        }
    }
    assert!(
        binary.is_file(),
        "{} holds no {}/sandbox-agent",
        tarball.display(),
        stem()
    );
    binary
}
