//! Where installs live under the data dir, and the files that describe
//! them.
//!
//! Layout, under the data dir:
//!
//! ```text
//! agents/<id>/<version>/              one installed version (npm prefix or unpacked archive)
//! agents/<id>/<version>/.sandbox-agent-install.json   its receipt: kind, artifact, program
//! agents/<id>/current.json            the active version, and whether the user pinned it
//! agents/<id>/.lock                   advisory lock (flock) held while installing
//! agents/<id>/.tmp-<uuid>/            an install in progress, renamed into place when done
//! homes/<id>/                         ${AGENT_HOME}: the agent's own config and state
//! ```

use super::manifest::{Chosen, check_version_dir_name};
use crate::archive;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// File name of an install's receipt inside its version folder.
pub(super) const RECEIPT: &str = ".sandbox-agent-install.json";
/// File name of the active-version record in an agent's folder.
pub(super) const CURRENT: &str = "current.json";
/// Prefix of staging folders (installs in progress).
const STAGING_PREFIX: &str = ".tmp-";
/// Prefix of replaced versions waiting to be removed.
const OLD_PREFIX: &str = ".old-";
/// An installed version of an agent, ready to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installation {
    /// The concrete version (the folder name).
    pub version: String,
    /// The version's folder.
    pub dir: PathBuf,
    /// The program to run (inside `dir`).
    pub program: PathBuf,
    /// Arguments after the program, from the manifest.
    pub args: Vec<String>,
    /// The distribution's environment, from the manifest (unexpanded).
    pub env: Vec<(String, String)>,
    /// What was installed: `npm @scope/name@1.2.3` or the archive URL.
    pub artifact: String,
}

/// The receipt written into each installed version's folder.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Receipt {
    pub(super) agent: String,
    pub(super) version: String,
    /// `npm` or `binary`.
    pub(super) kind: String,
    pub(super) artifact: String,
    /// The program, relative to the version folder.
    pub(super) program: PathBuf,
    pub(super) installed_at: String,
}

/// `agents/<id>/current.json`.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Current {
    pub(super) version: String,
    /// Chosen by the user (`--version`), not the manifest: kept even when the
    /// manifest's version changes.
    pub(super) pinned: bool,
}

/// A staging folder `agents/<id>/.tmp-<uuid>/` (and its download file),
/// removed on drop unless it was renamed into place.
pub(super) struct Staging {
    pub(super) dir: PathBuf,
    pub(super) download: PathBuf,
}

impl Staging {
    pub(super) fn new(agent_dir: &Path) -> Result<Self, String> {
        let name = format!("{STAGING_PREFIX}{}", uuid::Uuid::new_v4().simple());
        let dir = agent_dir.join(&name);
        std::fs::create_dir(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        Ok(Self {
            download: agent_dir.join(format!("{name}.download")),
            dir,
        })
    }

    /// Renames the staged install to `agents/<id>/<version>`. Returns `true`
    /// (and discards the staged copy) when a valid install of that version is
    /// already there and `reinstall` is off.
    pub(super) fn put_in_place(
        &self,
        agent_dir: &Path,
        version: &str,
        reinstall: bool,
        chosen: &Chosen<'_>,
    ) -> Result<bool, String> {
        check_version_dir_name(version)?;
        let target = agent_dir.join(version);
        if target.symlink_metadata().is_ok() {
            if !reinstall && read_installation(agent_dir, version, chosen).is_some() {
                return Ok(true);
            }
            let old = agent_dir.join(format!("{OLD_PREFIX}{}", uuid::Uuid::new_v4().simple()));
            std::fs::rename(&target, &old)
                .map_err(|e| format!("cannot move the old {} aside: {e}", target.display()))?;
            let placed = std::fs::rename(&self.dir, &target);
            if let Err(error) = std::fs::remove_dir_all(&old) {
                tracing::warn!(path = %old.display(), %error, "cannot remove the replaced install");
            }
            placed.map_err(|e| format!("cannot move the install into place: {e}"))?;
        } else {
            std::fs::rename(&self.dir, &target)
                .map_err(|e| format!("cannot move the install into place: {e}"))?;
        }
        Ok(false)
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if self.dir.exists()
            && let Err(error) = std::fs::remove_dir_all(&self.dir)
        {
            tracing::warn!(path = %self.dir.display(), %error, "cannot remove a staging folder");
        }
        let _ = std::fs::remove_file(&self.download);
    }
}

/// Removes staging folders and replaced versions left by an interrupted
/// install. Only called with the agent's file lock held, so none is in use.
pub(super) fn remove_leftovers(agent_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(agent_dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if !name.starts_with(STAGING_PREFIX) && !name.starts_with(OLD_PREFIX) {
            continue;
        }
        let path = entry.path();
        let removed = if path.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        match removed {
            Ok(()) => {
                tracing::info!(path = %path.display(), "removed the leftovers of an interrupted install")
            }
            Err(error) => tracing::warn!(path = %path.display(), %error, "cannot remove leftovers"),
        }
    }
}

/// The installation of `version` in `agent_dir`, if its receipt is there,
/// matches the chosen distribution's kind, and its program exists.
pub(super) fn read_installation(
    agent_dir: &Path,
    version: &str,
    chosen: &Chosen<'_>,
) -> Option<Installation> {
    check_version_dir_name(version).ok()?;
    let dir = agent_dir.join(version);
    let receipt = read_json::<Receipt>(&dir.join(RECEIPT))?;
    if receipt.kind != kind_of(chosen) || receipt.version != version {
        return None;
    }
    let program = dir.join(archive::safe_relative(&receipt.program).ok()?);
    if !program.is_file() {
        return None;
    }
    Some(Installation {
        version: version.to_owned(),
        program,
        args: chosen.args().to_vec(),
        env: chosen.env().clone().into_iter().collect(),
        artifact: receipt.artifact,
        dir,
    })
}

pub(super) fn kind_of(chosen: &Chosen<'_>) -> &'static str {
    match chosen {
        Chosen::Npm { .. } => "npm",
        Chosen::Binary { .. } => "binary",
    }
}

pub(super) fn write_current(agent_dir: &Path, version: &str, pinned: bool) -> Result<(), String> {
    write_json(
        &agent_dir.join(CURRENT),
        &Current {
            version: version.to_owned(),
            pinned,
        },
    )
}

pub(super) fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Option<T> {
    let bytes = std::fs::read(path).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Writes `value` as JSON to `path` atomically (a temporary file renamed over it).
pub(super) fn write_json(path: &Path, value: &impl Serialize) -> Result<(), String> {
    let bytes = serde_json::to_vec_pretty(value).map_err(|e| format!("cannot encode JSON: {e}"))?;
    let temporary = path.with_extension(format!("tmp-{}", uuid::Uuid::new_v4().simple()));
    std::fs::write(&temporary, bytes)
        .and_then(|()| std::fs::rename(&temporary, path))
        .map_err(|e| {
            let _ = std::fs::remove_file(&temporary);
            format!("cannot write {}: {e}", path.display())
        })
}

/// Adds the execute bits (for whoever may read) to a regular file.
pub(super) fn make_executable(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let metadata = std::fs::metadata(path)?;
    if !metadata.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    let mode = metadata.permissions().mode();
    let wanted = mode | ((mode & 0o444) >> 2) | 0o100;
    if wanted != mode {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(wanted))?;
    }
    Ok(())
}
