//! The agent manifest: which agents exist and where each one comes from, in
//! the shape of the public ACP agent registry (its `FORMAT.md`):
//!
//! ```json
//! {"version": "1", "agents": [
//!   {"id": "codex", "name": "Codex", "version": "0.16.0",
//!    "distribution": {"npx": {"package": "@zed-industries/codex-acp", "args": []}},
//!    "env": {"CODEX_HOME": "${AGENT_HOME}"},
//!    "auth": [{"methodId": "openai-api-key", "env": "OPENAI_API_KEY"}]}
//! ]}
//! ```
//!
//! Distributions: `npx` (an npm package, installed with npm), `binary` (one
//! release archive per platform, `linux-x86_64`, `darwin-aarch64`, …), and
//! `local` (a command already on this machine; not in the public registry).
//! Additions to the registry format, all optional: `env`,
//! `clientCapabilities` and `auth` on an entry, `sha256` on a binary target. Members this
//! runtime does not use (`description`, `authors`, `icon`, a `uvx`
//! distribution, …) are accepted and ignored, so a registry file can be used
//! as it is. The reference is `research/contract.md`,
//! "Agents: manifest, installs, lazy install" (manifest format).

pub use ext_methods::AuthEnv;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;

/// The manifest shipped inside the binary (`builtin.json` next to this file):
/// codex, claude, gemini and opencode. The mock agent is added in code.
pub const BUILTIN: &str = include_str!("builtin.json");

/// The placeholder in `env` values replaced by the agent's home directory
/// (`<data dir>/homes/<id>`, created before the agent starts).
pub const AGENT_HOME_PLACEHOLDER: &str = "${AGENT_HOME}";

/// One agent of a manifest.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManifestEntry {
    /// Agent id, as clients name it in `_meta["sandboxagent.dev"].agent`.
    pub id: String,
    /// Display name; the id when absent.
    #[serde(default)]
    pub name: Option<String>,
    /// The version to install. For `npx` it may also be given in the package
    /// spec (`pkg@1.2.3`), which wins; `latest` or a range is allowed there.
    #[serde(default)]
    pub version: Option<String>,
    /// Where the agent comes from.
    pub distribution: Distribution,
    /// Environment for the agent process (every distribution); values may use
    /// `${AGENT_HOME}`. A variable already set in the server's environment is
    /// left as the server has it.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Client capabilities the runtime declares to this agent; none when
    /// absent (research/contract.md,
    /// "Routing: connections, sessions, one agent process").
    #[serde(default)]
    pub client_capabilities: Option<serde_json::Value>,
    /// Auth methods an environment variable satisfies, in order of
    /// preference: after starting the agent the runtime sends
    /// `authenticate` for the first one whose variable is set and which the
    /// agent advertises (research/contract.md, "Agent authentication").
    #[serde(default)]
    pub auth: Vec<AuthEnv>,
    /// Environment variables the agent reads itself as its credential,
    /// with no ACP auth method to match (Claude Code reads
    /// `ANTHROPIC_API_KEY` and offers only an interactive login): the
    /// runtime sends nothing for them; they are named to whoever the agent
    /// answers "Authentication required" (research/contract.md, "Agent
    /// authentication").
    #[serde(default)]
    pub credential_env: Vec<String>,
}

/// The ways an agent can be obtained. Several may be given; the runtime
/// prefers `local`, then a `binary` for this platform, then `npx`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
pub struct Distribution {
    /// An npm package.
    #[serde(default)]
    pub npx: Option<NpxDistribution>,
    /// Release archives by platform key (`linux-x86_64`, `darwin-aarch64`, …).
    #[serde(default)]
    pub binary: Option<BTreeMap<String, BinaryTarget>>,
    /// A command already installed on this machine.
    #[serde(default)]
    pub local: Option<LocalDistribution>,
    /// Distribution kinds this runtime does not install (such as `uvx`),
    /// kept to name them in errors.
    #[serde(flatten)]
    pub other: BTreeMap<String, serde_json::Value>,
}

/// `distribution.npx`: an npm package whose `bin` is the agent.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct NpxDistribution {
    /// Package name, optionally with a version: `@scope/name` or `name@1.2.3`.
    pub package: String,
    /// Which of the package's `bin` commands to run, when it has several.
    #[serde(default)]
    pub cmd: Option<String>,
    /// Arguments after the command.
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment for the agent process (over the entry's `env`).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// One platform of `distribution.binary`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct BinaryTarget {
    /// Archive URL: `https://` (or `http://` to a loopback host). `.tar.gz`,
    /// `.tgz`, `.tar`, `.zip`, or a bare executable.
    pub archive: String,
    /// The program inside the unpacked archive, relative (`./bin/agent`).
    pub cmd: String,
    /// Arguments after the command.
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment for the agent process (over the entry's `env`).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Expected SHA-256 of the archive, hex; checked when given.
    #[serde(default)]
    pub sha256: Option<String>,
}

/// `distribution.local`: run a command that is already installed.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct LocalDistribution {
    /// Program: a path, or a name looked up on `PATH`.
    pub command: String,
    /// Arguments after the program.
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment for the agent process (over the entry's `env`).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// The distribution [`ManifestEntry::choose`] picked for this platform.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Chosen<'a> {
    /// A release archive.
    Binary {
        /// This platform's target.
        target: &'a BinaryTarget,
        /// The entry's version (checked to be a folder name).
        version: &'a str,
    },
    /// An npm package.
    Npm {
        /// The distribution.
        npx: &'a NpxDistribution,
        /// The package name, without a version.
        name: &'a str,
        /// The version spec: from the package spec, else the entry, else `latest`.
        version: &'a str,
    },
}

impl<'a> Chosen<'a> {
    /// The version (spec) to install.
    pub fn version(&self) -> &'a str {
        match *self {
            Self::Binary { version, .. } | Self::Npm { version, .. } => version,
        }
    }

    /// Arguments after the command.
    pub fn args(&self) -> &'a [String] {
        match *self {
            Self::Binary { target, .. } => &target.args,
            Self::Npm { npx, .. } => &npx.args,
        }
    }

    /// The distribution's own environment.
    pub fn env(&self) -> &'a BTreeMap<String, String> {
        match *self {
            Self::Binary { target, .. } => &target.env,
            Self::Npm { npx, .. } => &npx.env,
        }
    }
}

/// A manifest that cannot be used, naming the file and the entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestError {
    /// Where the manifest came from (a file path, or `built-in manifest`).
    pub origin: String,
    /// The entry at fault, e.g. `entry 2 ("codex")`; `None` for the whole file.
    pub entry: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.entry {
            Some(entry) => write!(f, "{}: {entry}: {}", self.origin, self.message),
            None => write!(f, "{}: {}", self.origin, self.message),
        }
    }
}

impl std::error::Error for ManifestError {}

/// The top level of a manifest file.
#[derive(Deserialize)]
struct ManifestFile {
    agents: Vec<serde_json::Value>,
}

/// Parses a manifest (`{"agents": [...]}`, or a bare array of entries) and
/// checks every entry: a valid id, no duplicate ids, a known distribution
/// shape, a usable version where one is needed.
///
/// # Errors
/// [`ManifestError`] naming `origin` and, when one entry is at fault, its
/// position (from 1) and id.
pub fn parse(text: &str, origin: &str) -> Result<Vec<ManifestEntry>, ManifestError> {
    let whole = |message: String| ManifestError {
        origin: origin.to_owned(),
        entry: None,
        message,
    };
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| whole(format!("not valid JSON: {e}")))?;
    let raw_entries = if value.is_array() {
        serde_json::from_value::<Vec<serde_json::Value>>(value)
    } else {
        serde_json::from_value::<ManifestFile>(value).map(|file| file.agents)
    }
    .map_err(|e| whole(format!("expected {{\"agents\": [...]}}: {e}")))?;
    let mut entries: Vec<ManifestEntry> = Vec::with_capacity(raw_entries.len());
    for (index, raw) in raw_entries.into_iter().enumerate() {
        let label = match raw.get("id").and_then(|id| id.as_str()) {
            Some(id) => format!("entry {} ({id:?})", index + 1),
            None => format!("entry {}", index + 1),
        };
        let at_entry = |message: String| ManifestError {
            origin: origin.to_owned(),
            entry: Some(label.clone()),
            message,
        };
        let entry: ManifestEntry =
            serde_json::from_value(raw).map_err(|e| at_entry(e.to_string()))?;
        entry.check().map_err(at_entry)?;
        if entries.iter().any(|e| e.id == entry.id) {
            return Err(at_entry(format!("duplicate agent id {:?}", entry.id)));
        }
        entries.push(entry);
    }
    Ok(entries)
}

impl ManifestEntry {
    /// The display name: `name`, else the id.
    pub fn display_name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.id)
    }

    /// The distribution this runtime installs on this platform: a `binary`
    /// target for [`platform_key`], else the `npx` package.
    ///
    /// # Errors
    /// Why nothing can be installed here, naming the platforms and kinds the
    /// entry does offer.
    pub fn choose(&self) -> Result<Chosen<'_>, String> {
        let platform = platform_key();
        let distribution = &self.distribution;
        if let Some(targets) = &distribution.binary
            && let Some(target) = targets.get(&platform)
        {
            return Ok(Chosen::Binary {
                target,
                version: self.version.as_deref().unwrap_or_default(),
            });
        }
        if let Some(npx) = &distribution.npx {
            let (name, version) = split_package_spec(&npx.package);
            return Ok(Chosen::Npm {
                npx,
                name,
                version: version.or(self.version.as_deref()).unwrap_or("latest"),
            });
        }
        let mut offered = Vec::new();
        if let Some(targets) = &distribution.binary {
            let platforms: Vec<&str> = targets.keys().map(String::as_str).collect();
            offered.push(format!("binary for {}", platforms.join(", ")));
        }
        offered.extend(
            distribution
                .other
                .keys()
                .map(|kind| format!("{kind} (not supported by this runtime)")),
        );
        Err(format!(
            "no distribution for this platform ({platform}); the manifest offers: {}",
            if offered.is_empty() {
                "nothing installable".to_owned()
            } else {
                offered.join("; ")
            }
        ))
    }

    /// The version the manifest asks for on this platform (see [`Self::choose`]).
    pub fn wanted_version(&self) -> Option<&str> {
        self.choose().ok().map(|chosen| chosen.version())
    }

    fn check(&self) -> Result<(), String> {
        check_agent_id(&self.id)?;
        let distribution = &self.distribution;
        if distribution.npx.is_none()
            && distribution.binary.is_none()
            && distribution.local.is_none()
            && distribution.other.is_empty()
        {
            return Err("distribution names no kind (npx, binary or local)".to_owned());
        }
        if let Some(npx) = &distribution.npx {
            let (name, version) = split_package_spec(&npx.package);
            check_package_name(name)?;
            if let Some(version) = version.or(self.version.as_deref()) {
                check_version_spec(version)?;
            }
        }
        if let Some(targets) = &distribution.binary {
            let version = self
                .version
                .as_deref()
                .ok_or("a binary distribution needs a top-level \"version\"")?;
            check_version_dir_name(version)?;
            for (platform, target) in targets {
                if target.archive.trim().is_empty() || target.cmd.trim().is_empty() {
                    return Err(format!(
                        "binary target {platform:?} needs \"archive\" and \"cmd\""
                    ));
                }
                if let Some(sha256) = &target.sha256
                    && (sha256.len() != 64 || !sha256.chars().all(|c| c.is_ascii_hexdigit()))
                {
                    return Err(format!(
                        "binary target {platform:?}: sha256 must be 64 hex digits"
                    ));
                }
            }
        }
        if let Some(local) = &distribution.local
            && local.command.trim().is_empty()
        {
            return Err("distribution.local.command is empty".to_owned());
        }
        if let Some(capabilities) = &self.client_capabilities
            && !capabilities.is_object()
        {
            return Err("clientCapabilities must be an object".to_owned());
        }
        for auth in &self.auth {
            if auth.method_id.trim().is_empty() {
                return Err("auth: methodId is empty".to_owned());
            }
            check_env_name("auth: env", &auth.env)?;
        }
        for env in &self.credential_env {
            check_env_name("credentialEnv", env)?;
        }
        Ok(())
    }
}

/// Checks an agent id: 1 to 64 characters, letters, digits, `-`, `_`, `.`,
/// starting with a letter or digit (ids name folders in the data dir).
///
/// # Errors
/// A message naming the id and the rule.
pub fn check_agent_id(id: &str) -> Result<(), String> {
    let valid = !id.is_empty()
        && id.len() <= 64
        && id.starts_with(|c: char| c.is_ascii_alphanumeric())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if valid {
        Ok(())
    } else {
        Err(format!(
            "agent id {id:?} must be 1 to 64 letters, digits, '-', '_' or '.', starting with a letter or digit"
        ))
    }
}

/// Checks an environment variable name (letters, digits and `_`, not
/// starting with a digit) of the manifest member `what`.
fn check_env_name(what: &str, env: &str) -> Result<(), String> {
    let valid = !env.is_empty()
        && !env.starts_with(|c: char| c.is_ascii_digit())
        && env.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if valid {
        Ok(())
    } else {
        Err(format!(
            "{what} {env:?} is not an environment variable name (letters, digits and '_')"
        ))
    }
}

/// Splits an npm package spec into name and version: `@scope/name@1.2.3` →
/// (`@scope/name`, `Some("1.2.3")`), `name` → (`name`, `None`).
pub fn split_package_spec(spec: &str) -> (&str, Option<&str>) {
    let search_from = usize::from(spec.starts_with('@'));
    match spec[search_from..].find('@') {
        Some(at) => {
            let at = at + search_from;
            (&spec[..at], Some(&spec[at + 1..]))
        }
        None => (spec, None),
    }
}

/// Checks an npm package name: `name` or `@scope/name`, each part made of
/// letters, digits, `-`, `.`, `_`, `~` (no paths, URLs or flags).
fn check_package_name(name: &str) -> Result<(), String> {
    let part_ok = |part: &str| {
        !part.is_empty()
            && !part.starts_with('.')
            && part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-._~".contains(c))
    };
    let valid = match name.strip_prefix('@') {
        Some(scoped) => scoped
            .split_once('/')
            .is_some_and(|(scope, name)| part_ok(scope) && part_ok(name)),
        None => part_ok(name),
    };
    if valid && name.len() <= 214 {
        Ok(())
    } else {
        Err(format!(
            "npm package name {name:?} is not a registry package name (name or @scope/name)"
        ))
    }
}

/// Checks a version spec handed to npm as `<package>@<spec>`: a registry
/// version (`1.2.3`, `1.2.3-beta.1`), a dist-tag (`latest`, `next`) or a
/// range without spaces (`^1.2`, `~1.2.3`, `>=1.2`, `1.x`, `*`).
///
/// npm also takes `file:`, `git+https:`, `npm:` aliases, tarball URLs and
/// `user/repo` in that place; any of those would install (and run the
/// install scripts of) code from somewhere other than the registry package
/// the manifest names, so anything with `:`, `/`, `@`, `#` or whitespace is
/// refused: only letters, digits and `. + - _ ^ ~ < > = * |` pass, starting
/// with a letter, a digit or a range operator. npm also reads a spec ending
/// in `.tgz`, `.tar.gz` or `.tar` as a local file, so those endings are
/// refused too.
///
/// # Errors
/// A message naming the version and what is allowed.
pub fn check_version_spec(version: &str) -> Result<(), String> {
    let valid = !version.is_empty()
        && version.len() <= 100
        && version.starts_with(|c: char| c.is_ascii_alphanumeric() || "^~<>=*".contains(c))
        && version
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ".+-_^~<>=*|".contains(c))
        && ![".tgz", ".tar.gz", ".tar"]
            .iter()
            .any(|ending| version.to_ascii_lowercase().ends_with(ending));
    if valid {
        Ok(())
    } else {
        Err(format!(
            "version {version:?} is not a registry version, dist-tag or range (letters, digits and . + - _ ^ ~ < > = * | only)"
        ))
    }
}

/// Checks a concrete version used as a folder name in the data dir:
/// letters, digits, `.`, `-`, `+`, `_`, starting with a letter or digit.
pub fn check_version_dir_name(version: &str) -> Result<(), String> {
    let valid = !version.is_empty()
        && version.len() <= 100
        && version.starts_with(|c: char| c.is_ascii_alphanumeric())
        && version
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ".-+_".contains(c));
    if valid {
        Ok(())
    } else {
        Err(format!(
            "version {version:?} must be letters, digits, '.', '-', '+' or '_'"
        ))
    }
}

/// Whether `version` names exactly one release (`1.2.3`, `1.2.3-beta.1`),
/// as opposed to a tag (`latest`) or a range (`^1.2`).
pub fn is_exact_version(version: &str) -> bool {
    let core = version.split(['-', '+']).next().unwrap_or("");
    let numbers: Vec<&str> = core.split('.').collect();
    numbers.len() == 3
        && numbers
            .iter()
            .all(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
        && check_version_dir_name(version).is_ok()
}

/// This machine's platform key in the registry's naming: `linux-x86_64`,
/// `darwin-aarch64`, `windows-x86_64`, …
pub fn platform_key() -> String {
    let os = match std::env::consts::OS {
        "macos" => "darwin",
        other => other,
    };
    format!("{os}-{}", std::env::consts::ARCH)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builtin_manifest_parses() {
        let entries = parse(BUILTIN, "built-in manifest").expect("built-in manifest");
        let ids: Vec<&str> = entries.iter().map(|e| e.id.as_str()).collect();
        assert_eq!(ids, ["codex", "claude", "gemini", "opencode"]);
        let codex_auth: Vec<(&str, &str)> = entries[0]
            .auth
            .iter()
            .map(|a| (a.method_id.as_str(), a.env.as_str()))
            .collect();
        assert_eq!(
            codex_auth,
            [
                ("codex-api-key", "CODEX_API_KEY"),
                ("openai-api-key", "OPENAI_API_KEY")
            ]
        );
        for entry in &entries {
            let version = entry.wanted_version().unwrap_or_default();
            assert!(
                is_exact_version(version),
                "{}: pinned {version:?}",
                entry.id
            );
        }
    }

    #[test]
    fn package_specs_split_after_the_scope() {
        assert_eq!(
            split_package_spec("@zed-industries/codex-acp@0.16.0"),
            ("@zed-industries/codex-acp", Some("0.16.0"))
        );
        assert_eq!(
            split_package_spec("@zed-industries/codex-acp"),
            ("@zed-industries/codex-acp", None)
        );
        assert_eq!(
            split_package_spec("opencode-ai@latest"),
            ("opencode-ai", Some("latest"))
        );
        assert_eq!(split_package_spec("opencode-ai"), ("opencode-ai", None));
    }

    #[test]
    fn version_specs_name_registry_versions_only() {
        for good in [
            "1.2.3",
            "0.16.0-beta.1+build.5",
            "latest",
            "next",
            "^1.2",
            "~1.2.3",
            ">=1.2",
            "<2",
            "1.x",
            "*",
            "1||2",
        ] {
            assert_eq!(check_version_spec(good), Ok(()), "{good}");
        }
        for bad in [
            "",
            "file:/tmp/evil.tgz",
            "git+https://example.com/x.git",
            "https://example.com/x.tgz",
            "npm:other-package@1.0.0",
            "github:user/repo",
            "user/repo",
            "../x",
            "1.2.3 || evil",
            "--registry=http://evil",
            "-1",
            "1.0#main",
            "1.0\n",
            "latest.tgz",
            "1.0.0.tar",
            "evil.TAR.GZ",
        ] {
            assert!(check_version_spec(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn exact_versions_are_recognized() {
        for exact in ["0.16.0", "1.2.3-beta.1", "10.0.1+build.5"] {
            assert!(is_exact_version(exact), "{exact}");
        }
        for loose in ["latest", "^1.2.3", "1.2", "1.x.0", "", "../1.2.3"] {
            assert!(!is_exact_version(loose), "{loose}");
        }
    }

    #[test]
    fn errors_name_the_file_and_the_entry() {
        let text = r#"{"agents": [
            {"id": "ok", "distribution": {"local": {"command": "true"}}},
            {"id": "bad", "distribution": {"npx": {}}}
        ]}"#;
        let error = parse(text, "/etc/agents.json").expect_err("missing package");
        let message = error.to_string();
        assert!(
            message.starts_with("/etc/agents.json: entry 2 (\"bad\"): "),
            "{message}"
        );
        assert!(message.contains("package"), "{message}");
    }

    #[test]
    fn bad_entries_are_rejected() {
        let cases = [
            (
                r#"[{"id": "../x", "distribution": {"local": {"command": "a"}}}]"#,
                "agent id",
            ),
            (r#"[{"id": "x", "distribution": {}}]"#, "names no kind"),
            (
                r#"[{"id": "x", "distribution": {"npx": {"package": "./dir"}}}]"#,
                "package name",
            ),
            (
                r#"[{"id": "x", "distribution": {"binary": {"linux-x86_64": {"archive": "https://a/b.zip", "cmd": "b"}}}}]"#,
                "version",
            ),
            (
                r#"[{"id": "x", "version": "1.0.0", "distribution": {"binary": {"linux-x86_64": {"archive": "https://a/b.zip", "cmd": "b", "sha256": "xyz"}}}}]"#,
                "sha256",
            ),
            (
                r#"[{"id": "x", "distribution": {"local": {"command": "a"}}}, {"id": "x", "distribution": {"local": {"command": "b"}}}]"#,
                "duplicate",
            ),
            (
                r#"[{"id": "x", "distribution": {"local": {"command": "a"}}, "auth": [{"methodId": "k", "env": "A=B"}]}]"#,
                "environment variable name",
            ),
            (
                r#"[{"id": "x", "distribution": {"local": {"command": "a"}}, "auth": [{"methodId": "", "env": "A"}]}]"#,
                "methodId",
            ),
            (
                r#"[{"id": "x", "distribution": {"local": {"command": "a"}}, "auth": [{"env": "A"}]}]"#,
                "methodId",
            ),
            (
                r#"[{"id": "x", "distribution": {"local": {"command": "a"}}, "credentialEnv": ["A B"]}]"#,
                "credentialEnv \"A B\" is not an environment variable name",
            ),
            (r#"{"agents": 3}"#, "expected"),
            ("{", "not valid JSON"),
        ];
        for (text, needle) in cases {
            let error = parse(text, "f.json").expect_err(text).to_string();
            assert!(error.contains(needle), "{text}: {error}");
        }
    }

    #[test]
    fn registry_members_this_runtime_ignores_are_accepted() {
        let text = r#"{"version": "1.0.0", "agents": [{"id": "py", "name": "Py", "version": "1.0.0",
            "description": "d", "authors": ["a"], "license": "MIT",
            "distribution": {"uvx": {"package": "py-agent"}}}]}"#;
        let entries = parse(text, "registry.json").expect("registry shape");
        assert!(entries[0].distribution.other.contains_key("uvx"));
    }

    #[test]
    fn the_platform_key_uses_registry_names() {
        let key = platform_key();
        assert!(!key.contains("macos"), "{key}");
        assert!(key.contains('-'), "{key}");
    }
}
