//! `sandbox-agent agents list|install`: the agent catalog and the installer
//! from the command line. Both work on the data dir directly, no server
//! needed; a server using the same data dir sees the result (installs are
//! locked across processes).

use super::args::CatalogArgs;
use acp_runtime::agent::Agents;
use acp_runtime::install::manifest::Chosen;
use acp_runtime::install::{AgentSpec, InstallOptions, Installer, Launch, Progress};
use clap::{Args, Subcommand};
use ext_methods::{AgentInfo, AgentListResult, AgentSource};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::Duration;

/// `sandbox-agent agents …`.
#[derive(Debug, Clone, Args)]
pub struct AgentsArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: AgentsCommand,
    /// Agent sources and the data dir.
    #[command(flatten)]
    pub catalog: CatalogArgs,
}

/// The `agents` subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum AgentsCommand {
    /// List the known agents: source, installed version, program.
    List {
        /// Print the same JSON as GET /v2/agents.
        #[arg(long)]
        json: bool,
    },
    /// Install an agent into the data dir (a no-op when it is there).
    Install {
        /// Agent id (`sandbox-agent agents list` shows them).
        name: String,
        /// Another version than the manifest's (npm agents; "latest" allowed).
        #[arg(long, value_name = "V")]
        version: Option<String>,
        /// Install again even when that version is installed.
        #[arg(long)]
        reinstall: bool,
    },
}

/// How long `agents install` lets one install run.
const INSTALL_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// Runs `sandbox-agent agents …`.
///
/// # Errors
/// A message for the user: a bad agents file, an unknown agent, a failed
/// install (with npm's output or the download error).
pub async fn run(args: AgentsArgs) -> Result<(), String> {
    let specs = args.catalog.agents()?;
    let installer = Arc::new(Installer::new(args.catalog.data_dir()?, INSTALL_TIMEOUT));
    let agents = Agents::new(&specs, 1024, Duration::from_secs(1), installer, false);
    match args.command {
        AgentsCommand::List { json } => list(&agents, &specs, json),
        AgentsCommand::Install {
            name,
            version,
            reinstall,
        } => {
            let spec = specs.get(&name).ok_or_else(|| {
                let known: Vec<&str> = specs.keys().map(String::as_str).collect();
                format!("unknown agent {name:?}; known agents: {}", known.join(", "))
            })?;
            install(&agents, spec, InstallOptions { reinstall, version }).await
        }
    }
}

fn list(
    agents: &Agents,
    specs: &std::collections::BTreeMap<String, AgentSpec>,
    json: bool,
) -> Result<(), String> {
    let infos = agents.infos();
    let mut out = std::io::stdout().lock();
    let written = if json {
        serde_json::to_string_pretty(&AgentListResult { agents: infos })
            .map_err(|e| e.to_string())
            .and_then(|text| writeln!(out, "{text}").map_err(|e| e.to_string()))
    } else {
        let rows: Vec<[String; 4]> = infos
            .iter()
            .map(|info| row(info, specs.get(&info.id)))
            .collect();
        let width = |column: usize| {
            rows.iter()
                .map(|r| r[column].chars().count())
                .max()
                .unwrap_or(0)
        };
        let widths = [width(0).max(2), width(1).max(4), width(2).max(6)];
        let mut text = format!(
            "{:<w0$}  {:<w1$}  {:<w2$}  INSTALLED\n",
            "ID",
            "NAME",
            "SOURCE",
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2]
        );
        for [id, name, source, installed] in &rows {
            text.push_str(&format!(
                "{id:<w0$}  {name:<w1$}  {source:<w2$}  {installed}\n",
                w0 = widths[0],
                w1 = widths[1],
                w2 = widths[2]
            ));
        }
        out.write_all(text.as_bytes()).map_err(|e| e.to_string())
    };
    written.map_err(|e| format!("cannot write to stdout: {e}"))
}

/// One line of `agents list`: id, name, source, and what is installed (or
/// what would be).
fn row(info: &AgentInfo, spec: Option<&AgentSpec>) -> [String; 4] {
    let source = match info.source {
        AgentSource::Builtin => "builtin",
        AgentSource::Registry => "registry",
        AgentSource::Fallback => "fallback",
    };
    let installed = match (info.installed, &info.version, &info.path) {
        (true, Some(version), Some(path)) => format!("{version}  {path}"),
        (true, None, Some(path)) => format!("yes  {path}"),
        (true, _, None) => "yes".to_owned(),
        (false, _, _) => match spec.map(|s| &s.launch) {
            Some(Launch::Install(entry)) => match entry.choose() {
                Ok(chosen) => format!("no (would install {})", artifact(&chosen)),
                Err(reason) => format!("no: {reason}"),
            },
            Some(Launch::Command { program, .. }) => {
                format!("no: {} is not there", program.display())
            }
            None => "no".to_owned(),
        },
    };
    [
        info.id.clone(),
        info.name.clone(),
        source.to_owned(),
        installed,
    ]
}

fn artifact(chosen: &Chosen<'_>) -> String {
    match chosen {
        Chosen::Npm { name, version, .. } => format!("npm {name}@{version}"),
        Chosen::Binary { target, .. } => target.archive.clone(),
    }
}

async fn install(agents: &Agents, spec: &AgentSpec, options: InstallOptions) -> Result<(), String> {
    let what = match &spec.launch {
        Launch::Install(entry) => match entry.choose() {
            Ok(Chosen::Npm { name, version, .. }) => {
                format!(
                    "npm {name}@{}",
                    options.version.as_deref().unwrap_or(version)
                )
            }
            Ok(chosen) => artifact(&chosen),
            Err(_) => spec.id.clone(),
        },
        Launch::Command { .. } => spec.id.clone(),
    };
    let progress = Arc::new(Spinner::start(&spec.id, &what));
    let result = agents.install(&spec.id, options, progress.clone()).await;
    progress.finish();
    let result = result.map_err(|e| e.to_string())?;
    let version = result.version.as_deref().unwrap_or("(version unknown)");
    let path = result.path.as_deref().unwrap_or("");
    let seconds = Duration::from_millis(result.duration_ms).as_secs_f64();
    let line = if result.already_installed {
        format!("{} {version} is already installed: {path}", result.agent)
    } else {
        format!(
            "installed {} {version} in {seconds:.1} s: {path}",
            result.agent
        )
    };
    writeln!(std::io::stdout().lock(), "{line}").map_err(|e| format!("cannot write to stdout: {e}"))
}

/// Install progress on stderr: a spinner with the package name on a terminal,
/// plain lines otherwise.
struct Spinner {
    bar: Option<ProgressBar>,
    agent: String,
}

impl Spinner {
    fn start(agent: &str, what: &str) -> Self {
        if !std::io::stderr().is_terminal() {
            // Plain lines: the installer's own steps say what happens.
            return Self {
                bar: None,
                agent: agent.to_owned(),
            };
        }
        let bar = ProgressBar::new_spinner();
        if let Ok(style) = ProgressStyle::with_template("{spinner} {prefix} [{elapsed}] {wide_msg}")
        {
            bar.set_style(style);
        }
        bar.set_prefix(format!("installing {what}"));
        bar.enable_steady_tick(Duration::from_millis(100));
        Self {
            bar: Some(bar),
            agent: agent.to_owned(),
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

impl Progress for Spinner {
    fn step(&self, message: &str) {
        match &self.bar {
            Some(bar) => bar.set_message(message.to_owned()),
            None => eprintln!("{}: {message}", self.agent),
        }
    }
}
