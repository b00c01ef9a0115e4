//! The npm driver: npm packages are installed with the machine's `npm` into
//! a fresh prefix (never globally, never into the user's npm prefix), so npm
//! resolves platform sub-packages (optional dependencies) as it always does;
//! the agent is the package's `bin`. npm gets bounded network retries and
//! timeouts ([`NPM_NETWORK_DEFAULTS`]), so an unreachable registry fails in
//! seconds; it runs in a process group of its own, killed with its children
//! when the install times out or is dropped.

use super::layout::make_executable;
use super::manifest::{check_version_dir_name, is_exact_version};
use super::progress::Progress;
use crate::archive;
use crate::process_group::signal_group;
use nix::sys::signal::Signal;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};

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

/// Runs `npm install` of `name@version` into the prefix `prefix`; returns the
/// installed version and the program relative to `prefix`.
pub(super) async fn npm_install(
    prefix: &Path,
    name: &str,
    version: &str,
    cmd: Option<&str>,
    progress: &dyn Progress,
) -> Result<(String, PathBuf), String> {
    let spec = format!("{name}@{version}");
    let mut command = npm_command(prefix)?;
    command
        .arg("install")
        .arg("--prefix")
        .arg(prefix)
        .args([
            "--no-audit",
            "--no-fund",
            "--no-save",
            "--omit=dev",
            "--global=false",
        ])
        .arg(&spec);
    progress.step(&format!("npm install {spec}"));
    tracing::info!(prefix = %prefix.display(), "running npm install {spec}");
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot run npm: {e}"))?;
    let group = GroupGuard(child.id());
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return Err("npm's output was not piped".to_owned());
    };
    let tail = parking_lot::Mutex::new(VecDeque::new());
    let (status, (), ()) = tokio::join!(
        child.wait(),
        pump(stdout, &tail, progress),
        pump(stderr, &tail, progress)
    );
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
    resolve_npm_bin(prefix, name, cmd)
}

/// `npm` (found on `PATH`) in `dir`, in a process group of its own (a
/// timeout or a dropped caller stops its children too), with stdin closed,
/// stdout and stderr piped, no update check, and the network settings of
/// [`NPM_NETWORK_DEFAULTS`] that the environment does not set.
fn npm_command(dir: &Path) -> Result<tokio::process::Command, String> {
    let npm = find_on_path("npm").ok_or(
        "npm was not found on PATH; install Node.js (it ships npm) to install npm-based agents",
    )?;
    let mut command = tokio::process::Command::new(npm);
    command
        .arg("--update-notifier=false")
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    for (name, value) in NPM_NETWORK_DEFAULTS {
        let variable = format!("npm_config_{}", name.replace('-', "_"));
        // npm reads its variables in any case.
        let set = std::env::vars_os().any(|(key, _)| {
            key.to_str()
                .is_some_and(|k| k.eq_ignore_ascii_case(&variable))
        });
        if !set {
            command.env(variable, value);
        }
    }
    Ok(command)
}

/// The concrete version `npm view name@spec version --json` names: the
/// one version, or the newest of those a range matches.
pub(super) async fn npm_view_version(dir: &Path, name: &str, spec: &str) -> Result<String, String> {
    let package = format!("{name}@{spec}");
    let mut command = npm_command(dir)?;
    command.args(["view", &package, "version", "--json"]);
    tracing::info!("running npm view {package} version");
    let child = command
        .spawn()
        .map_err(|e| format!("cannot run npm: {e}"))?;
    let group = GroupGuard(child.id());
    let output = child
        .wait_with_output()
        .await
        .map_err(|e| format!("cannot wait for npm: {e}"))?;
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
fn resolve_npm_bin(
    prefix: &Path,
    name: &str,
    cmd: Option<&str>,
) -> Result<(String, PathBuf), String> {
    let package_dir = Path::new("node_modules").join(name);
    let manifest_path = prefix.join(&package_dir).join("package.json");
    let package: serde_json::Value = std::fs::read(&manifest_path)
        .map_err(|e| {
            format!(
                "npm did not install {name} ({}: {e})",
                manifest_path.display()
            )
        })
        .and_then(|bytes| {
            serde_json::from_slice(&bytes)
                .map_err(|e| format!("{} is not JSON: {e}", manifest_path.display()))
        })?;
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
    make_executable(&prefix.join(&program))
        .map_err(|e| format!("the bin {} of {name} is missing ({e})", program.display()))?;
    Ok((version, program))
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

/// Kills a process group when dropped (a timed-out npm and its children).
struct GroupGuard(Option<u32>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            signal_group(pid, Signal::SIGKILL);
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
        let Ok(command) = npm_command(&dir) else {
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
