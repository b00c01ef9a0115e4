//! `sandbox-agent ps [--all | --state running|exited]`: the processes of
//! a running server's process API (research/contract.md, "CLI: exec and
//! ps"), a line each: id, pid, state, exit, command.

use super::args::{Remote, RemoteArgs, URL_ENV};
use clap::{Args, ValueEnum};
use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::Value;

/// Processes asked for per page: the list's largest `limit`
/// (research/contract.md, "Processes and terminals").
const PAGE: usize = 1000;

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
    let remote = args.server.remote()?;
    let state = match (args.all, args.state) {
        (true, _) => None,
        (false, None | Some(State::Running)) => Some("running"),
        (false, Some(State::Exited)) => Some("exited"),
    };
    let mut processes = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut path = format!("/v2/processes?limit={PAGE}");
        if let Some(state) = state {
            path.push_str("&state=");
            path.push_str(state);
        }
        if let Some(cursor) = &cursor {
            path.push_str("&cursor=");
            path.extend(utf8_percent_encode(cursor, NON_ALPHANUMERIC));
        }
        let request = remote.request(reqwest::Method::GET, &path);
        let page: Value = Remote::send(request)
            .await
            .map_err(|failure| failure.message)?
            .json()
            .await
            .map_err(|e| format!("the process list is not JSON: {e}"))?;
        if let Some(Value::Array(more)) = page.get("processes") {
            processes.extend(more.iter().cloned());
        }
        match page["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    print!("{}", table(&processes));
    Ok(())
}

/// The table: a header and a line per process, columns padded to their
/// widest cell, the command last.
fn table(processes: &[Value]) -> String {
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
fn row(process: &Value) -> [String; 5] {
    let text = |key: &str| process[key].as_str().unwrap_or("-").to_owned();
    let pid = process["pid"]
        .as_i64()
        .map_or_else(|| "-".to_owned(), |pid| pid.to_string());
    let exit = match (process["exitCode"].as_i64(), process["signal"].as_str()) {
        (Some(code), _) => code.to_string(),
        (None, Some(signal)) => signal.to_owned(),
        (None, None) => "-".to_owned(),
    };
    let mut words = vec![text("command")];
    if let Some(Value::Array(args)) = process.get("args") {
        words.extend(args.iter().filter_map(Value::as_str).map(str::to_owned));
    }
    [
        text("id"),
        pid,
        text("state"),
        exit,
        shell_words::join(words),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_table_lines_up() {
        let processes = [
            json!({"id": "p1", "pid": 42, "state": "running", "exitCode": null,
                   "signal": null, "command": "sleep", "args": ["100"]}),
            json!({"id": "p22", "pid": 7, "state": "exited", "exitCode": null,
                   "signal": "SIGKILL", "command": "sh", "args": ["-c", "echo hi"]}),
        ];
        assert_eq!(
            table(&processes),
            "ID   PID  STATE    EXIT     COMMAND\n\
             p1   42   running  -        sleep 100\n\
             p22  7    exited   SIGKILL  sh -c 'echo hi'\n"
        );
    }
}
