//! The npm driver: npm packages are installed with the machine's `npm` into
//! a fresh prefix (never globally, never into the user's npm prefix), so npm
//! resolves platform sub-packages (optional dependencies) as it always does;
//! the agent is the package's `bin`. npm gets bounded network retries and
//! timeouts ([`NPM_NETWORK_DEFAULTS`]), so an unreachable registry fails in
//! seconds; it runs in a process group of its own, killed with its children
//! when the install times out or is dropped. None of the server's secrets
//! reaches it ([`tree::SECRET_ENV`]).
//!
//! Under `--agent-user` ([`AsUser`]) npm, which runs the packages' install
//! scripts, runs as that user through the tree supervisor, as agents do,
//! with `HOME` the agent's home; the prefix it fills is the user's while it
//! runs and is taken back by the server before anything in it is read
//! ([`super::reclaim`]).

use super::layout::make_executable;
use super::manifest::{check_version_dir_name, is_exact_version};
use super::progress::Progress;
use crate::archive;
use crate::os::process_group::signal_group;
use crate::os::tree::{self, TreeSupervisor};
use nix::sys::signal::Signal;
use std::collections::VecDeque;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

/// Largest `package.json` of an installed package read, in bytes.
const MAX_PACKAGE_JSON_BYTES: u64 = 16 << 20;
/// How long a timed-out npm's supervisor gets to kill npm's whole tree
/// (its escapees included) before its process group is killed.
const KILL_NOW_BOUND: Duration = Duration::from_secs(2);

/// npm run as the agents' user (`--agent-user`; research/contract.md,
/// "Agents under an unprivileged user").
#[derive(Debug, Clone)]
pub(super) struct AsUser {
    /// The tree supervisor, whose program (npm) runs as the user (its
    /// `user` is set).
    pub(super) supervisor: TreeSupervisor,
    /// npm's `HOME` (its cache, its logs): the agent's home in the data
    /// dir, the user's.
    pub(super) home: PathBuf,
}

/// Lines of npm output kept for the error message of a failed install.
const OUTPUT_TAIL_LINES: usize = 25;
/// Longest npm output line kept, in bytes.
const OUTPUT_MAX_LINE: usize = 1024;
/// npm's network settings for installs, each unless the server's environment
/// sets it (`npm_config_fetch_retries`, …): npm's own defaults retry an
/// unreachable registry for over a minute (10 s and 60 s apart), which
/// every waiting request would sit through. Two retries 1 s and 2-4 s
/// apart, and at most 60 s per request.
pub const NPM_NETWORK_DEFAULTS: [(&str, &str); 5] = [
    ("fetch-retries", "2"),
    ("fetch-retry-factor", "2"),
    ("fetch-retry-mintimeout", "1000"),
    ("fetch-retry-maxtimeout", "4000"),
    ("fetch-timeout", "60000"),
];

/// Runs `npm install` of `name@version` into the prefix `prefix` (as
/// `as_user` when given; the prefix must then be the user's, and is the
/// server's again, [`super::reclaim`], before anything in it is read);
/// returns the installed version and the program relative to `prefix`.
pub(super) async fn npm_install(
    prefix: &Path,
    name: &str,
    version: &str,
    cmd: Option<&str>,
    as_user: Option<&AsUser>,
    progress: &dyn Progress,
) -> Result<(String, PathBuf), String> {
    let spec = format!("{name}@{version}");
    let mut args: Vec<String> = vec!["install".to_owned(), "--prefix".to_owned()];
    args.push(prefix.to_string_lossy().into_owned());
    args.extend(
        [
            "--no-audit",
            "--no-fund",
            "--no-save",
            "--omit=dev",
            "--global=false",
        ]
        .map(str::to_owned),
    );
    args.push(spec.clone());
    let mut command = npm_command(prefix, &args, as_user)?;
    progress.step(&format!("npm install {spec}"));
    tracing::info!(prefix = %prefix.display(), as_user = as_user.and_then(|a| a.supervisor.user.as_ref()).map(|u| u.name.as_str()), "running npm install {spec}");
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot run npm: {e}"))?;
    let mut group = GroupGuard::new(child.id(), as_user.is_some());
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return Err("npm's output was not piped".to_owned());
    };
    let tail = parking_lot::Mutex::new(VecDeque::new());
    let (status, (), ()) = tokio::join!(
        child.wait(),
        pump(stdout, &tail, progress),
        pump(stderr, &tail, progress)
    );
    group.exited();
    drop(group);
    let status = status.map_err(|e| format!("cannot wait for npm: {e}"))?;
    if !status.success() {
        let tail: Vec<String> = tail.into_inner().into();
        return Err(format!(
            "npm exited with {}; npm said:\n{}",
            exit_text(status),
            tail.join("\n")
        ));
    }
    if as_user.is_some() {
        let owned = prefix.to_owned();
        tokio::task::spawn_blocking(move || super::reclaim::reclaim(&owned))
            .await
            .map_err(|e| format!("the task that takes the install back failed: {e}"))??;
    }
    resolve_npm_bin(prefix, name, cmd)
}

/// `npm args…` (npm found on `PATH`) in `dir`, in a process group of its
/// own (a timeout or a dropped caller stops its children too), with stdin
/// closed, stdout and stderr piped, no update check, none of the server's
/// secrets ([`tree::SECRET_ENV`]), and the network settings of
/// [`NPM_NETWORK_DEFAULTS`] that the environment does not set. With
/// `as_user`, through the tree supervisor as that user, `HOME`, `USER` and
/// `LOGNAME` the user's ([`AsUser`]); `dir` is then entered by npm, as the
/// user.
fn npm_command(
    dir: &Path,
    args: &[String],
    as_user: Option<&AsUser>,
) -> Result<tokio::process::Command, String> {
    let npm = find_on_path("npm").ok_or(
        "npm was not found on PATH; install Node.js (it ships npm) to install npm-based agents",
    )?;
    let mut env = Vec::new();
    for (name, value) in NPM_NETWORK_DEFAULTS {
        let variable = format!("npm_config_{}", name.replace('-', "_"));
        // npm reads its variables in any case.
        let set = std::env::vars_os().any(|(key, _)| {
            key.to_str()
                .is_some_and(|k| k.eq_ignore_ascii_case(&variable))
        });
        if !set {
            env.push((variable, value.to_owned()));
        }
    }
    let mut all = vec!["--update-notifier=false".to_owned()];
    all.extend(args.iter().cloned());
    let supervisor = match as_user {
        Some(as_user) => {
            let Some(user) = &as_user.supervisor.user else {
                return Err(
                    "npm as the agents' user needs a tree supervisor that starts programs as that user".to_owned(),
                );
            };
            env.extend(crate::os::user::login_env(user, &as_user.home));
            Some(&as_user.supervisor)
        }
        None => None,
    };
    let mut command = tree::command(supervisor, false, &npm, &all, Some(dir), &env);
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        // A supervised npm is stopped by its supervisor ([`GroupGuard`]): a
        // SIGKILL to it first would leave npm's escapees behind.
        .kill_on_drop(as_user.is_none());
    Ok(command)
}

/// The concrete version `npm view name@spec version --json` names: the
/// one version, or the newest of those a range matches (run as `as_user`
/// when given).
pub(super) async fn npm_view_version(
    dir: &Path,
    name: &str,
    spec: &str,
    as_user: Option<&AsUser>,
) -> Result<String, String> {
    let package = format!("{name}@{spec}");
    let args = ["view", &package, "version", "--json"].map(str::to_owned);
    let mut command = npm_command(dir, &args, as_user)?;
    tracing::info!("running npm view {package} version");
    let child = command
        .spawn()
        .map_err(|e| format!("cannot run npm: {e}"))?;
    let mut group = GroupGuard::new(child.id(), as_user.is_some());
    let output = child
        .wait_with_output()
        .await
        .map_err(|e| format!("cannot wait for npm: {e}"))?;
    group.exited();
    drop(group);
    if !output.status.success() {
        let said: Vec<&str> = std::str::from_utf8(&output.stderr)
            .unwrap_or_default()
            .lines()
            .chain(
                std::str::from_utf8(&output.stdout)
                    .unwrap_or_default()
                    .lines(),
            )
            .filter(|line| !line.trim().is_empty())
            .collect();
        let tail = &said[said.len().saturating_sub(OUTPUT_TAIL_LINES)..];
        return Err(format!(
            "npm view exited with {}; npm said:\n{}",
            exit_text(output.status),
            tail.join("\n")
        ));
    }
    newest_version(&output.stdout)
        .ok_or_else(|| format!("no published version of {name} matches {spec:?}"))
}

/// The version in `npm view … version --json` output: a JSON string, or
/// the newest exact version of an array (a range matching several).
fn newest_version(json: &[u8]) -> Option<String> {
    let versions = match serde_json::from_slice::<serde_json::Value>(json).ok()? {
        serde_json::Value::String(version) => vec![version],
        serde_json::Value::Array(values) => values
            .into_iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        _ => return None,
    };
    versions
        .into_iter()
        .filter(|v| is_exact_version(v))
        .max_by(|a, b| version_key(a).cmp(&version_key(b)))
}

/// Sort key of an exact version (semver precedence, simplified): the three
/// numbers, then a release above its pre-releases, then the pre-release
/// text; build metadata is ignored.
fn version_key(version: &str) -> (u64, u64, u64, bool, &str) {
    let version = version.split('+').next().unwrap_or(version);
    let (core, pre) = match version.split_once('-') {
        Some((core, pre)) => (core, Some(pre)),
        None => (version, None),
    };
    let mut numbers = core.split('.').map(|n| n.parse::<u64>().unwrap_or(0));
    let mut next = || numbers.next().unwrap_or(0);
    (next(), next(), next(), pre.is_none(), pre.unwrap_or(""))
}

/// An exit status as text: `code N`, or the signal.
fn exit_text(status: std::process::ExitStatus) -> String {
    match status.code() {
        Some(code) => format!("code {code}"),
        None => status.to_string(),
    }
}

/// Reads the installed package's `package.json`: its version and the `bin`
/// to run (`cmd`, else the one named like the package, else the only one).
/// Neither may lead out of `prefix` through a symlink.
fn resolve_npm_bin(
    prefix: &Path,
    name: &str,
    cmd: Option<&str>,
) -> Result<(String, PathBuf), String> {
    let package_dir = Path::new("node_modules").join(name);
    let manifest_path = prefix.join(&package_dir).join("package.json");
    let not_installed = |e: std::io::Error| {
        format!(
            "npm did not install {name} ({}: {e})",
            manifest_path.display()
        )
    };
    let real_manifest = inside(prefix, &manifest_path).map_err(not_installed)?;
    let mut bytes = Vec::new();
    std::fs::File::open(&real_manifest)
        .and_then(|file| {
            if !file.metadata()?.is_file() {
                return Err(std::io::Error::other("not a regular file"));
            }
            file.take(MAX_PACKAGE_JSON_BYTES).read_to_end(&mut bytes)
        })
        .map_err(not_installed)?;
    let package: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| format!("{} is not JSON: {e}", manifest_path.display()))?;
    let version = package
        .get("version")
        .and_then(|v| v.as_str())
        .ok_or_else(|| format!("{} has no version", manifest_path.display()))?
        .to_owned();
    check_version_dir_name(&version)?;
    let unscoped = name.rsplit('/').next().unwrap_or(name);
    let bin = match package.get("bin") {
        Some(serde_json::Value::String(path)) => path.clone(),
        Some(serde_json::Value::Object(bins)) => {
            let pick = cmd.unwrap_or(unscoped);
            match bins.get(pick).and_then(|v| v.as_str()) {
                Some(path) => path.to_owned(),
                None if cmd.is_none() && bins.len() == 1 => bins
                    .values()
                    .next()
                    .and_then(|v| v.as_str())
                    .unwrap_or_default()
                    .to_owned(),
                None => {
                    let names: Vec<&str> = bins.keys().map(String::as_str).collect();
                    return Err(format!(
                        "package {name} has no command {pick:?} (it has: {}); name one with distribution.npx.cmd",
                        names.join(", ")
                    ));
                }
            }
        }
        _ => return Err(format!("package {name} declares no bin to run")),
    };
    let program = package_dir.join(
        archive::safe_relative(Path::new(&bin))
            .map_err(|e| format!("package {name} has an unsafe bin: {e}"))?,
    );
    let missing =
        |e: std::io::Error| format!("the bin {} of {name} is missing ({e})", program.display());
    make_executable(&inside(prefix, &prefix.join(&program)).map_err(missing)?).map_err(missing)?;
    Ok((version, program))
}

/// The real path of `path`, which must be inside `prefix` once every
/// symlink is resolved.
///
/// # Errors
/// As the system's; `PermissionDenied` when it leads outside.
fn inside(prefix: &Path, path: &Path) -> std::io::Result<PathBuf> {
    let real = path.canonicalize()?;
    if !real.starts_with(prefix.canonicalize()?) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("it leads out of the install, to {}", real.display()),
        ));
    }
    Ok(real)
}

/// Copies lines of npm output into `tail` (last [`OUTPUT_TAIL_LINES`]) and
/// `progress`.
async fn pump(
    stream: impl AsyncRead + Unpin,
    tail: &parking_lot::Mutex<VecDeque<String>>,
    progress: &dyn Progress,
) {
    let mut reader = BufReader::new(stream);
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        line.truncate(OUTPUT_MAX_LINE);
        let text = String::from_utf8_lossy(&line).trim_end().to_owned();
        if text.is_empty() {
            continue;
        }
        progress.step(&text);
        let mut tail = tail.lock();
        if tail.len() == OUTPUT_TAIL_LINES {
            tail.pop_front();
        }
        tail.push_back(text);
    }
}

/// Kills npm's process group when dropped (a timed-out npm and its
/// children). A supervised npm's supervisor is asked first to kill npm's
/// whole tree ([`tree::KILL_NOW`]: it also finds what left the group), and
/// its group is killed [`KILL_NOW_BOUND`] later.
struct GroupGuard {
    pid: Option<u32>,
    supervised: bool,
    /// The child was waited for: a supervisor has already killed what was
    /// left of its tree.
    exited: bool,
}

impl GroupGuard {
    fn new(pid: Option<u32>, supervised: bool) -> Self {
        Self {
            pid,
            supervised,
            exited: false,
        }
    }

    /// The child was waited for.
    fn exited(&mut self) {
        self.exited = true;
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        let Some(pid) = self.pid else {
            return;
        };
        if !self.supervised || self.exited {
            signal_group(pid, Signal::SIGKILL);
            return;
        }
        if let Ok(raw) = i32::try_from(pid) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(raw), tree::KILL_NOW);
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    tokio::time::sleep(KILL_NOW_BOUND).await;
                    signal_group(pid, Signal::SIGKILL);
                });
            }
            Err(_) => signal_group(pid, Signal::SIGKILL),
        }
    }
}

/// The first program named `name` on `PATH`.
fn find_on_path(name: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn npm_bins_are_picked_by_cmd_name_or_alone() {
        let prefix =
            std::env::temp_dir().join(format!("npm-bin-test-{}", uuid::Uuid::new_v4().simple()));
        let package = prefix.join("node_modules/@scope/tool");
        std::fs::create_dir_all(package.join("bin")).expect("dirs");
        std::fs::write(package.join("bin/a.js"), "").expect("a");
        std::fs::write(package.join("bin/tool.js"), "").expect("tool");
        let write = |bin: serde_json::Value| {
            std::fs::write(
                package.join("package.json"),
                serde_json::json!({"name": "@scope/tool", "version": "1.2.3", "bin": bin})
                    .to_string(),
            )
            .expect("package.json");
        };
        write(serde_json::json!({"a": "bin/a.js", "tool": "./bin/tool.js"}));
        let (version, program) = resolve_npm_bin(&prefix, "@scope/tool", None).expect("by name");
        assert_eq!(version, "1.2.3");
        assert_eq!(program, Path::new("node_modules/@scope/tool/bin/tool.js"));
        let (_, program) = resolve_npm_bin(&prefix, "@scope/tool", Some("a")).expect("by cmd");
        assert_eq!(program, Path::new("node_modules/@scope/tool/bin/a.js"));
        let error = resolve_npm_bin(&prefix, "@scope/tool", Some("b")).expect_err("no b");
        assert!(error.contains("a, tool"), "{error}");
        write(serde_json::json!("bin/a.js"));
        let (_, program) = resolve_npm_bin(&prefix, "@scope/tool", None).expect("string bin");
        assert_eq!(program, Path::new("node_modules/@scope/tool/bin/a.js"));
        write(serde_json::json!({"x": "../../../etc/passwd"}));
        let error = resolve_npm_bin(&prefix, "@scope/tool", None).expect_err("escape");
        assert!(error.contains("unsafe"), "{error}");
        let _ = std::fs::remove_dir_all(&prefix);
    }

    #[test]
    fn npm_view_output_names_one_version() {
        assert_eq!(newest_version(b"\"0.16.0\"\n").as_deref(), Some("0.16.0"));
        assert_eq!(
            newest_version(br#"["0.9.0","0.10.0","0.10.1-beta.1","0.2.0"]"#).as_deref(),
            Some("0.10.1-beta.1")
        );
        assert_eq!(
            newest_version(br#"["1.0.0-rc.1","1.0.0"]"#).as_deref(),
            Some("1.0.0"),
            "a release is newer than its pre-releases"
        );
        assert_eq!(newest_version(b""), None, "nothing matched");
        assert_eq!(newest_version(br#"["latest"]"#), None);
        assert_eq!(newest_version(br#"{"error":{}}"#), None);
    }

    #[test]
    fn npm_gets_bounded_network_settings_unless_the_environment_sets_them() {
        let dir = std::env::temp_dir();
        let Ok(command) = npm_command(&dir, &[], None) else {
            return; // no npm on this machine
        };
        let env: HashMap<String, String> = command
            .as_std()
            .get_envs()
            .filter_map(|(k, v)| Some((k.to_str()?.to_owned(), v?.to_str()?.to_owned())))
            .collect();
        for (name, value) in NPM_NETWORK_DEFAULTS {
            let variable = format!("npm_config_{}", name.replace('-', "_"));
            let inherited = std::env::vars_os().any(|(key, _)| {
                key.to_str()
                    .is_some_and(|k| k.eq_ignore_ascii_case(&variable))
            });
            assert!(
                inherited || env.get(&variable).map(String::as_str) == Some(value),
                "{variable}: {env:?}"
            );
        }
    }
}
