//! The agents a server (or `sandbox-agent agents …`) knows, merged from three
//! layers, later ones replacing earlier entries with the same id:
//!
//! 1. built in: the mock agent and the manifest shipped in the binary
//!    ([`manifest::BUILTIN`]: codex, claude, gemini, opencode);
//! 2. `--agents-file FILE`: a manifest in the registry's shape;
//! 3. `--agent-command NAME=CMD [ARGS…]`, in order.

use super::manifest::{self, ManifestError};
use crate::config::AgentSpec;
use std::collections::BTreeMap;
use std::path::Path;

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
    use crate::config::Launch;
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
