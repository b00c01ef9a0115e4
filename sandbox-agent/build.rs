//! Build facts `sandbox-agent --version` prints (src/version.rs): the git
//! commit the binary was built from and the target triple.
//!
//! - `SANDBOX_AGENT_COMMIT`: `$SANDBOX_AGENT_COMMIT` when set (a build from
//!   a source archive without `.git`), else `git rev-parse --short=12 HEAD`,
//!   else `unknown`. The commit is HEAD's: edits not yet committed are not
//!   in it (scripts/dist says so when the tree is dirty).
//! - `SANDBOX_AGENT_TARGET`: cargo's `TARGET` (cargo-zigbuild's
//!   `x86_64-unknown-linux-gnu.2.17` reaches rustc, and so this script, as
//!   `x86_64-unknown-linux-gnu`: the glibc a binary needs is read from the
//!   binary itself at run time, never claimed here).
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=SANDBOX_AGENT_COMMIT");
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let commit = std::env::var("SANDBOX_AGENT_COMMIT")
        .ok()
        .filter(|commit| !commit.trim().is_empty())
        .or_else(|| git_commit(&manifest_dir))
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=SANDBOX_AGENT_COMMIT={}", commit.trim());
    let target = std::env::var("TARGET").unwrap_or_else(|_| "unknown".to_owned());
    println!("cargo:rustc-env=SANDBOX_AGENT_TARGET={target}");
}

/// HEAD's short hash, and the files whose change moves it (HEAD, the
/// branch's ref, packed-refs) as rerun triggers.
fn git_commit(dir: &Path) -> Option<String> {
    let commit = git(dir, &["rev-parse", "--short=12", "HEAD"])?;
    let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    if let Some(branch) = git(dir, &["symbolic-ref", "-q", "HEAD"]) {
        watched.push(branch);
    }
    for name in watched {
        if let Some(path) = git(dir, &["rev-parse", "--git-path", &name]) {
            let path = dir.join(path);
            // A path that does not exist would rerun this script on every
            // build.
            if path.exists() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
    }
    Some(commit)
}

fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let output = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .ok()?;
    let text = String::from_utf8(output.stdout).ok()?;
    (output.status.success() && !text.trim().is_empty()).then(|| text.trim().to_owned())
}
