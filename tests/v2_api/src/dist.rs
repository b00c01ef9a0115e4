//! The release tarball `scripts/dist` makes, as the deploy tests find it.
//!
//! `dist/sandbox-agent-<version>-x86_64-unknown-linux-gnu.tar.gz` under the
//! workspace root (version: the workspace's), or `$SANDBOX_AGENT_DIST_TARBALL`
//! when set. Inside: one folder `sandbox-agent-<version>-x86_64-unknown-linux-gnu/`
//! with `sandbox-agent`, `LICENSE` and `README.md`. `scripts/test` makes it
//! before `cargo test`.

use std::path::PathBuf;
use std::sync::OnceLock;

use crate::server::workspace_root;

/// The target triple of the release tarball.
pub const TARGET: &str = "x86_64-unknown-linux-gnu";

/// The tarball's file name (and, less `.tar.gz`, its top folder):
/// `sandbox-agent-<version>-<target>`.
pub fn stem() -> String {
    format!("sandbox-agent-{}-{TARGET}", env!("CARGO_PKG_VERSION"))
}

/// The release tarball: `$SANDBOX_AGENT_DIST_TARBALL`, else
/// `<workspace>/dist/<stem>.tar.gz`.
///
/// # Panics
/// If it does not exist, saying how to make it.
pub fn tarball() -> PathBuf {
    let path = match std::env::var_os("SANDBOX_AGENT_DIST_TARBALL") {
        Some(path) => PathBuf::from(path),
        None => workspace_root()
            .join("dist")
            .join(format!("{}.tar.gz", stem())),
    };
    assert!(
        path.is_file(),
        "release tarball {} not found: run scripts/dist first (scripts/test does)",
        path.display()
    );
    path
}

/// The `sandbox-agent` of [`tarball`], unpacked once per test process into
/// `<workspace>/target/dist-unpacked/<pid>/<stem>/sandbox-agent`.
///
/// # Panics
/// If the tarball is missing or does not hold `<stem>/sandbox-agent`.
pub fn unpacked_binary() -> PathBuf {
    static UNPACKED: OnceLock<PathBuf> = OnceLock::new();
    UNPACKED
        .get_or_init(|| {
            let tarball = tarball();
            let into = workspace_root()
                .join("target")
                .join("dist-unpacked")
                .join(std::process::id().to_string());
            let _ = std::fs::remove_dir_all(&into);
            std::fs::create_dir_all(&into).expect("create target/dist-unpacked");
            let file = std::fs::File::open(&tarball).expect("open the release tarball");
            tar::Archive::new(flate2::read::GzDecoder::new(file))
                .unpack(&into)
                .unwrap_or_else(|e| panic!("unpack {}: {e}", tarball.display()));
            let binary = into.join(stem()).join("sandbox-agent");
            assert!(
                binary.is_file(),
                "{} holds no {}/sandbox-agent",
                tarball.display(),
                stem()
            );
            binary
        })
        .clone()
}
