//! The agents a server (or `sandbox-agent agents …`) knows, merged from three
//! layers, later ones replacing earlier entries with the same id:
//!
//! 1. built in: the mock agent and the manifest shipped in the binary
//!    ([`manifest::BUILTIN`]: codex, claude, gemini, opencode);
//! 2. `--agents-file FILE`: a manifest in the registry's shape;
//! 3. `--agent-command NAME=CMD [ARGS…]`, in order.
//!
//! Each is an [`AgentSpec`]: the agent's id, how it is obtained and started,
//! its environment.

use super::manifest::{self, ManifestEntry, ManifestError, check_agent_id};
pub use ext_methods::{AgentSource, AuthEnv};
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// One known agent: its id, how to obtain and start it, and its environment.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentSpec {
    /// Agent id, as named in `_meta["sandboxagent.dev"].agent`.
    pub id: String,
    /// Human-readable name.
    pub name: String,
    /// What runs: a fixed command, or a manifest distribution installed into
    /// the data dir first.
    pub launch: Launch,
    /// Environment for the agent process on top of the server's own; values
    /// may use `${AGENT_HOME}` (see [`crate::install::manifest`]).
    pub env: Vec<(String, String)>,
    /// Client capabilities the runtime declares to this agent in its own
    /// `initialize` (default: none, the agent works on its own files and
    /// terminals inside the sandbox; research/contract.md,
    /// "Routing: connections, sessions, one agent process").
    pub client_capabilities: serde_json::Value,
    /// Where the agent comes from.
    pub source: AgentSource,
    /// Auth methods an environment variable satisfies (the manifest's
    /// `auth`; empty for command agents): the runtime authenticates a new
    /// process with the first one that is set and advertised.
    pub auth: Vec<AuthEnv>,
    /// Variables the agent reads itself as its credential (the manifest's
    /// `credentialEnv`; empty for command agents).
    pub credential_env: Vec<String>,
}

/// How an agent's program is found.
#[derive(Debug, Clone, PartialEq)]
pub enum Launch {
    /// A program run as it is: the mock agent, `--agent-command`, a manifest
    /// `local` distribution.
    Command {
        /// Program: a path, or a name looked up on `PATH`.
        program: PathBuf,
        /// Arguments after the program.
        args: Vec<String>,
    },
    /// A manifest entry with an `npx` or `binary` distribution: installed into
    /// the data dir by [`crate::install`], then run from there.
    Install(Box<ManifestEntry>),
}

impl AgentSpec {
    /// The built-in mock agent: this executable with the `mock-agent`
    /// subcommand, keeping its sessions in `<data_dir>/homes/mock/sessions`
    /// (`--state-dir`), so it can load them after a restart
    /// (research/contract.md, "The mock agent" and "Data dir"). A data dir
    /// whose path is not UTF-8 cannot be an argument: the mock then keeps
    /// its sessions in memory only.
    ///
    /// # Errors
    /// When the path of the current executable cannot be read.
    pub fn builtin_mock(data_dir: &Path) -> std::io::Result<Self> {
        let mut args = vec!["mock-agent".to_owned()];
        let state_dir = data_dir.join("homes").join("mock").join("sessions");
        if let Some(state_dir) = state_dir.to_str() {
            args.extend(["--state-dir".to_owned(), state_dir.to_owned()]);
        }
        Ok(Self {
            id: "mock".to_owned(),
            name: "Mock agent (built in)".to_owned(),
            launch: Launch::Command {
                program: std::env::current_exe()?,
                args,
            },
            env: Vec::new(),
            client_capabilities: serde_json::json!({}),
            source: AgentSource::Builtin,
            auth: Vec::new(),
            credential_env: Vec::new(),
        })
    }

    /// An agent from a manifest entry: a `local` distribution runs its
    /// command (source `fallback`); anything else is installed first (source
    /// `registry`).
    pub fn from_manifest(entry: ManifestEntry) -> Self {
        let mut env: Vec<(String, String)> = entry.env.clone().into_iter().collect();
        let client_capabilities = entry
            .client_capabilities
            .clone()
            .unwrap_or_else(|| serde_json::json!({}));
        let (launch, source) = match &entry.distribution.local {
            Some(local) => {
                env.extend(local.env.clone());
                (
                    Launch::Command {
                        program: PathBuf::from(&local.command),
                        args: local.args.clone(),
                    },
                    AgentSource::Fallback,
                )
            }
            None => (
                Launch::Install(Box::new(entry.clone())),
                AgentSource::Registry,
            ),
        };
        Self {
            id: entry.id.clone(),
            name: entry.display_name().to_owned(),
            launch,
            env,
            client_capabilities,
            source,
            auth: entry.auth.clone(),
            credential_env: entry.credential_env.clone(),
        }
    }

    /// The fixed program of a [`Launch::Command`] agent.
    pub fn command_program(&self) -> Option<&Path> {
        match &self.launch {
            Launch::Command { program, .. } => Some(program),
            Launch::Install(_) => None,
        }
    }

    /// Whether a [`Launch::Command`] program can be started: an existing
    /// executable file, or a bare name found on `PATH`. `false` for agents
    /// that are installed (the installer knows whether they are).
    pub fn is_runnable(&self) -> bool {
        let Some(program) = self.command_program() else {
            return false;
        };
        let executable = |path: &Path| {
            path.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        };
        if program.components().count() > 1 {
            return executable(program);
        }
        std::env::var_os("PATH").is_some_and(|paths| {
            std::env::split_paths(&paths).any(|dir| executable(&dir.join(program)))
        })
    }

    /// An agent from `--agent-command NAME=CMD [ARGS…]` (the part after `=` is
    /// split with shell-word rules).
    ///
    /// # Errors
    /// A message naming what is wrong with `value`.
    pub fn from_command_arg(value: &str) -> Result<Self, String> {
        let (id, command) = value
            .split_once('=')
            .ok_or_else(|| format!("expected NAME=COMMAND [ARGS...], got {value:?}"))?;
        let id = id.trim();
        check_agent_id(id)?;
        let mut words = shell_words::split(command)
            .map_err(|e| format!("cannot split the command of agent {id:?}: {e}"))?
            .into_iter();
        let program = words
            .next()
            .ok_or_else(|| format!("agent {id:?} has an empty command"))?;
        Ok(Self {
            id: id.to_owned(),
            name: id.to_owned(),
            launch: Launch::Command {
                program: PathBuf::from(program),
                args: words.collect(),
            },
            env: Vec::new(),
            client_capabilities: serde_json::json!({}),
            source: AgentSource::Fallback,
            auth: Vec::new(),
            credential_env: Vec::new(),
        })
    }
}

/// Every known agent by id. `data_dir` is the server's data dir (the mock
/// agent keeps its sessions in its home there).
///
/// # Errors
/// A message for the user: the agents file cannot be read or parsed (naming
/// the file and the entry), a bad `--agent-command`, or this executable's
/// path is unknown (the mock agent runs it).
pub fn load(
    data_dir: &Path,
    agents_file: Option<&Path>,
    agent_commands: &[String],
) -> Result<BTreeMap<String, AgentSpec>, String> {
    let mut agents = BTreeMap::new();
    let mock = AgentSpec::builtin_mock(data_dir)
        .map_err(|e| format!("cannot locate this executable for the mock agent: {e}"))?;
    agents.insert(mock.id.clone(), mock);
    let builtin = manifest::parse(manifest::BUILTIN, "built-in manifest")
        .map_err(|e: ManifestError| e.to_string())?;
    for entry in builtin {
        agents.insert(entry.id.clone(), AgentSpec::from_manifest(entry));
    }
    if let Some(path) = agents_file {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the agents file {origin}: {e}"))?;
        for entry in manifest::parse(&text, &origin).map_err(|e| e.to_string())? {
            agents.insert(entry.id.clone(), AgentSpec::from_manifest(entry));
        }
    }
    for value in agent_commands {
        let spec = AgentSpec::from_command_arg(value)?;
        agents.insert(spec.id.clone(), spec);
    }
    Ok(agents)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ext_methods::AgentSource;

    #[test]
    fn builtins_files_and_commands_layer_in_order() {
        let dir = std::env::temp_dir().join(format!("catalog-test-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let file = dir.join("agents.json");
        std::fs::write(
            &file,
            r#"{"agents": [
                {"id": "codex", "name": "My Codex", "version": "0.15.0",
                 "distribution": {"npx": {"package": "@zed-industries/codex-acp"}}},
                {"id": "mine", "distribution": {"local": {"command": "my-agent", "args": ["--acp"],
                 "env": {"A": "b"}}}, "env": {"HOME_DIR": "${AGENT_HOME}"}}
            ]}"#,
        )
        .expect("write agents file");
        let agents = load(
            &dir,
            Some(&file),
            &["claude=/bin/claude-acp --x".to_owned()],
        )
        .expect("catalog");
        let _ = std::fs::remove_dir_all(&dir);

        let ids: Vec<&str> = agents.keys().map(String::as_str).collect();
        assert_eq!(
            ids,
            ["claude", "codex", "gemini", "mine", "mock", "opencode"]
        );
        assert_eq!(agents["mock"].source, AgentSource::Builtin);
        let Launch::Command { args, .. } = &agents["mock"].launch else {
            panic!("the mock is a command: {:?}", agents["mock"]);
        };
        let state_dir = dir.join("homes/mock/sessions");
        assert_eq!(
            args,
            &[
                "mock-agent",
                "--state-dir",
                state_dir.to_str().expect("UTF-8")
            ]
        );
        assert_eq!(agents["gemini"].source, AgentSource::Registry);
        let codex = &agents["codex"];
        assert_eq!(codex.name, "My Codex");
        let Launch::Install(entry) = &codex.launch else {
            panic!("codex is installed: {codex:?}");
        };
        assert_eq!(entry.wanted_version(), Some("0.15.0"));
        let mine = &agents["mine"];
        assert_eq!(mine.source, AgentSource::Fallback);
        assert_eq!(
            mine.env,
            [
                ("HOME_DIR".to_owned(), "${AGENT_HOME}".to_owned()),
                ("A".to_owned(), "b".to_owned())
            ]
        );
        let claude = &agents["claude"];
        assert_eq!(claude.source, AgentSource::Fallback);
        assert_eq!(
            claude.launch,
            Launch::Command {
                program: "/bin/claude-acp".into(),
                args: vec!["--x".to_owned()]
            }
        );
    }

    #[test]
    fn a_missing_agents_file_is_named() {
        let error = load(
            Path::new("/nonexistent/data"),
            Some(Path::new("/nonexistent/agents.json")),
            &[],
        )
        .expect_err("missing file");
        assert!(error.contains("/nonexistent/agents.json"), "{error}");
    }
}
