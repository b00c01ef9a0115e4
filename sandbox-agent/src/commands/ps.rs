//! `sandbox-agent ps [--all | --state running|exited]`: the processes of
//! a running server's process API (research/contract.md, "CLI: exec and
//! ps"), a line each: id, pid, state, exit, command. The pages come from
//! the SDK's `list_processes`.

use super::args::{Failure, RemoteArgs, URL_ENV};
use clap::{Args, ValueEnum};
use sandbox_agent_sdk::{ProcessInfo, ProcessListParams, ProcessState};

/// Processes asked for per page: the list's largest `limit`
/// (research/contract.md, "Processes and terminals").
const PAGE: u32 = 1000;

/// `sandbox-agent ps`.
#[derive(Debug, Clone, Args)]
#[command(mut_arg("url", |url| url.env(URL_ENV)))]
pub struct PsArgs {
    /// `--url` (else $SANDBOX_AGENT_URL) and `--token`.
    #[command(flatten)]
    pub server: RemoteArgs,
    /// Every process the server keeps, exited ones too (default: the
    /// running ones).
    #[arg(long, short = 'a', conflicts_with = "state")]
    pub all: bool,
    /// Only processes in this state.
    #[arg(long, value_enum)]
    pub state: Option<State>,
}

/// A process's state, as the list filters it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum State {
    /// Still running.
    Running,
    /// Exited (kept for reading).
    Exited,
}

/// Runs `sandbox-agent ps`: every page of the list, then the table.
///
/// # Errors
/// A message for the user: no `--url`, the server's problem detail.
pub async fn run(args: PsArgs) -> Result<(), String> {
    let remote = args.server.remote().await?;
    let state = match (args.all, args.state) {
        (true, _) => None,
        (false, None | Some(State::Running)) => Some(ProcessState::Running),
        (false, Some(State::Exited)) => Some(ProcessState::Exited),
    };
    let mut params = ProcessListParams {
        limit: Some(PAGE),
        state,
        ..ProcessListParams::default()
    };
    let mut processes = Vec::new();
    loop {
        let page =
            remote
                .client
                .list_processes(params.clone())
                .await
                .map_err(|error| match error {
                    sandbox_agent_sdk::Error::InvalidResponse { message, .. } => {
                        format!("the process list is not JSON: {message}")
                    }
                    error => Failure::from(error).message,
                })?;
        processes.extend(page.processes);
        match page.next_cursor {
            Some(next) => params.cursor = Some(next),
            None => break,
        }
    }
    print!("{}", table(&processes));
    Ok(())
}

/// The table: a header and a line per process, columns padded to their
/// widest cell, the command last.
fn table(processes: &[ProcessInfo]) -> String {
    let rows: Vec<[String; 5]> =
        std::iter::once(["ID", "PID", "STATE", "EXIT", "COMMAND"].map(str::to_owned))
            .chain(processes.iter().map(row))
            .collect();
    let mut widths = [0; 4];
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in &rows {
        for (width, cell) in widths.iter().zip(row) {
            out.push_str(cell);
            out.push_str(&" ".repeat(width - cell.chars().count() + 2));
        }
        out.push_str(&row[4]);
        out.push('\n');
    }
    out
}

/// One process's cells: the exit is the code, else the signal, else `-`;
/// the command is shell-quoted.
fn row(process: &ProcessInfo) -> [String; 5] {
    let pid = process
        .pid
        .map_or_else(|| "-".to_owned(), |pid| pid.to_string());
    let exit = match (process.exit_code, &process.signal) {
        (Some(code), _) => code.to_string(),
        (None, Some(signal)) => signal.clone(),
        (None, None) => "-".to_owned(),
    };
    let words = std::iter::once(&process.command).chain(&process.args);
    [
        process.id.clone(),
        pid,
        process.state.as_str().to_owned(),
        exit,
        shell_words::join(words),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn process(fields: Value) -> ProcessInfo {
        let mut info = json!({"cwd": "/", "tty": false, "startedAt": "2026-01-01T00:00:00.000Z",
                              "outputBytes": 0});
        if let (Some(info), Value::Object(fields)) = (info.as_object_mut(), fields) {
            info.extend(fields);
        }
        match serde_json::from_value(info) {
            Ok(info) => info,
            Err(error) => panic!("a process: {error}"),
        }
    }

    #[test]
    fn the_table_lines_up() {
        let processes = [
            process(
                json!({"id": "p1", "pid": 42, "state": "running", "exitCode": null,
                   "signal": null, "command": "sleep", "args": ["100"]}),
            ),
            process(
                json!({"id": "p22", "pid": 7, "state": "exited", "exitCode": null,
                   "signal": "SIGKILL", "command": "sh", "args": ["-c", "echo hi"]}),
            ),
        ];
        assert_eq!(
            table(&processes),
            "ID   PID  STATE    EXIT     COMMAND\n\
             p1   42   running  -        sleep 100\n\
             p22  7    exited   SIGKILL  sh -c 'echo hi'\n"
        );
    }
}
