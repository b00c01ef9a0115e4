//! No agent process tree outlives a server that dies without stopping it
//! (research/contract.md, "Agent process trees and a server that dies"):
//! after `kill -9` of the server the agent's keeper kills the tree at once,
//! and a tree that is left anyway (its keeper lost too) is killed by the
//! next server on the same data dir before it starts the agent again.
//!
//! The agent is as stubborn as agents get without leaving their process
//! group: it ignores SIGTERM and SIGHUP, keeps running after its stdin
//! closes, and leaves a `sleep` grandchild.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use v2_api_tests::agents::TempDir;
use v2_api_tests::procfs::{self, ProcessRef};
use v2_api_tests::server::{sandbox_agent_bin, shell_quote};
use v2_api_tests::{Api, TestServer};

/// Agent id of the stubborn agent.
const STUBBORN: &str = "stubborn";
/// Bound for the server to die and be reaped after SIGKILL.
const KILL_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound for a tree to be gone once something killed it.
const GONE_TIMEOUT: Duration = Duration::from_secs(5);

/// Writes the stubborn agent's script into `dir`: TERM and HUP ignored, a
/// `sleep` grandchild, ACP through the mock agent (a child, which inherits
/// the ignored signals), and when stdin closes (the mock exits) it stays,
/// waiting for the `sleep` (so every process of the tree exists once the
/// agent answered, and the test can kill them all).
fn stubborn_agent(dir: &TempDir) -> PathBuf {
    let bin = shell_quote(&sandbox_agent_bin().to_string_lossy());
    let script = format!(
        "#!/bin/sh\n\
         trap '' TERM HUP\n\
         sleep 300 </dev/null >/dev/null 2>&1 &\n\
         {bin} mock-agent\n\
         wait\n"
    );
    let path = dir.write("stubborn-agent.sh", script.as_bytes());
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("make the agent script executable");
    path
}

/// `--agent-command stubborn=<script>`.
fn agent_command(script: &Path) -> String {
    format!("{STUBBORN}={}", shell_quote(&script.to_string_lossy()))
}

/// Starts the agent (an `initialize`) and returns its tree: every process
/// under the server, checked to hold the script and the `sleep` grandchild.
async fn start_agent(server: &TestServer, script: &Path) -> Vec<ProcessRef> {
    server.initialize(STUBBORN).await;
    let script = script.to_string_lossy();
    // The background `sleep` may still be a forked shell that has not
    // exec'd yet when `initialize` is answered.
    let deadline = Instant::now() + GONE_TIMEOUT;
    loop {
        let tree = server.descendants();
        let commands: Vec<String> = tree.iter().map(|p| procfs::cmdline(p.pid)).collect();
        if commands.iter().any(|c| c.contains(script.as_ref()))
            && commands.iter().any(|c| c.contains("sleep 300"))
        {
            return tree;
        }
        assert!(
            Instant::now() < deadline,
            "the agent and its sleep run under the server: {commands:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The processes of `tree` that still run, described.
fn alive(tree: &[ProcessRef]) -> Vec<String> {
    tree.iter()
        .filter(|p| procfs::is_alive(p))
        .map(|p| format!("{} {}", p.pid, procfs::cmdline(p.pid)))
        .collect()
}

/// Waits up to `timeout` for every process of `tree` to be gone; returns
/// the survivors.
async fn survivors_after(tree: &[ProcessRef], timeout: Duration) -> Vec<String> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = alive(tree);
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every running process (on the whole machine) whose command line holds
/// `needle`.
fn running_with(needle: &str) -> Vec<ProcessRef> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(procfs::process_ref)
        .filter(|p| procfs::is_alive(p) && procfs::cmdline(p.pid).contains(needle))
        .collect()
}

/// Kills what is left of `tree` when the test ends, passing or failing.
struct KillOnDrop(Vec<ProcessRef>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for process in &self.0 {
            procfs::signal(process, nix::sys::signal::Signal::SIGKILL);
        }
    }
}

#[tokio::test]
async fn a_sigkilled_server_takes_its_agent_tree_with_it() {
    let dir = TempDir::new("orphans-keeper");
    let script = stubborn_agent(&dir);
    let command = agent_command(&script);
    let mut server =
        TestServer::start(&["--agent-command", &command, "--shutdown-grace-ms", "500"]).await;
    let tree = start_agent(&server, &script).await;
    let _cleanup = KillOnDrop(tree.clone());

    server
        .kill_now(KILL_TIMEOUT)
        .await
        .expect("the server dies on SIGKILL");
    let left = survivors_after(&tree, GONE_TIMEOUT).await;
    assert!(
        left.is_empty(),
        "the agent tree outlived the SIGKILLed server by {GONE_TIMEOUT:?}: {left:?}"
    );
}

#[tokio::test]
async fn the_next_start_kills_a_tree_a_dead_server_left() {
    let dir = TempDir::new("orphans-record");
    let data_dir = TempDir::new("orphans-data");
    let script = stubborn_agent(&dir);
    let data = data_dir.path().to_string_lossy().into_owned();
    let command = agent_command(&script);
    let args = [
        "--data-dir",
        data.as_str(),
        "--agent-command",
        command.as_str(),
        "--shutdown-grace-ms",
        "500",
    ];

    let mut first = TestServer::start(&args).await;
    let old_tree = start_agent(&first, &script).await;
    let _cleanup = KillOnDrop(old_tree.clone());
    // Lose the keeper (or the tree supervisor) first: only the record in
    // the data dir is left.
    for keeper in old_tree.iter().filter(|p| {
        let command = procfs::cmdline(p.pid);
        command.contains("sandbox-agent-keeper") || command.contains(" supervise ")
    }) {
        procfs::signal(keeper, nix::sys::signal::Signal::SIGKILL);
    }
    first
        .kill_now(KILL_TIMEOUT)
        .await
        .expect("the server dies on SIGKILL");
    // Shown, not assumed: without its server and keeper the tree lives on.
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The agent's own command line (the server's names the script too).
    let script_text = format!("/bin/sh {}", script.to_string_lossy());
    assert!(
        !running_with(&script_text).is_empty() && !alive(&old_tree).is_empty(),
        "the stubborn agent outlives its server when nothing kills it"
    );

    let second = TestServer::start(&args).await;
    second.initialize(STUBBORN).await;
    let left = survivors_after(&old_tree, GONE_TIMEOUT).await;
    assert!(
        left.is_empty(),
        "the tree of the dead server still runs beside the new one: {left:?}"
    );
    let new_tree = second.descendants();
    let leaders = running_with(&script_text);
    assert_eq!(
        leaders.len(),
        1,
        "exactly one stubborn agent runs: {:?}",
        leaders
            .iter()
            .map(|p| format!("{} {}", p.pid, procfs::cmdline(p.pid)))
            .collect::<Vec<_>>()
    );
    assert!(
        new_tree.contains(&leaders[0]),
        "the one that runs is the new server's"
    );
}

/// Writes an agent script into `dir` that leaves a grandchild in a session
/// of its own (`setsid`: out of the agent's process group, which is all the
/// keeper and the group record reach), holding `marker` in its command
/// line, then speaks ACP through the mock agent.
fn escaping_agent(dir: &TempDir, marker: &str) -> PathBuf {
    let bin = shell_quote(&sandbox_agent_bin().to_string_lossy());
    let script = format!(
        "#!/bin/sh\n\
         setsid sleep {marker} </dev/null >/dev/null 2>&1 &\n\
         exec {bin} mock-agent\n"
    );
    let path = dir.write("escaping-agent.sh", script.as_bytes());
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("make the agent script executable");
    path
}

/// Starts the escaping agent on `server` and returns its escaped grandchild,
/// shown to be out of the server's process groups.
async fn start_escaping(server: &TestServer, marker: &str) -> Vec<ProcessRef> {
    server.initialize(STUBBORN).await;
    let deadline = Instant::now() + GONE_TIMEOUT;
    loop {
        // `setsid sleep …` matches before `setsid` made its own session
        // (and process group): wait for that, not only for the name.
        let escaped = running_with(&format!("sleep {marker}"));
        let on_its_own = |process: &ProcessRef| {
            let pid = nix::unistd::Pid::from_raw(process.pid as i32);
            nix::unistd::getpgid(Some(pid)) == Ok(pid)
        };
        if !escaped.is_empty() && escaped.iter().all(on_its_own) {
            return escaped;
        }
        assert!(
            Instant::now() < deadline,
            "the escaping grandchild never ran in a process group of its own: {escaped:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_setsid_grandchild_dies_with_a_sigkilled_server() {
    let dir = TempDir::new("orphans-setsid-kill");
    let marker = "303.5";
    let script = escaping_agent(&dir, marker);
    let command = agent_command(&script);
    let mut server = TestServer::start(&["--agent-command", &command]).await;
    let escaped = start_escaping(&server, marker).await;
    let _cleanup = KillOnDrop(escaped.clone());
    server
        .kill_now(KILL_TIMEOUT)
        .await
        .expect("the server dies on SIGKILL");
    let left = survivors_after(&escaped, GONE_TIMEOUT).await;
    assert!(
        left.is_empty(),
        "a setsid grandchild outlived the SIGKILLed server: {left:?}"
    );
}

#[tokio::test]
async fn a_setsid_grandchild_dies_in_a_graceful_stop() {
    let dir = TempDir::new("orphans-setsid-stop");
    let marker = "304.5";
    let script = escaping_agent(&dir, marker);
    let command = agent_command(&script);
    let mut server =
        TestServer::start(&["--agent-command", &command, "--shutdown-grace-ms", "1000"]).await;
    let escaped = start_escaping(&server, marker).await;
    let _cleanup = KillOnDrop(escaped.clone());
    server.send_sigterm();
    server
        .wait_exit(KILL_TIMEOUT)
        .await
        .expect("the server stops on SIGTERM");
    let left = survivors_after(&escaped, GONE_TIMEOUT).await;
    assert!(
        left.is_empty(),
        "a setsid grandchild outlived the server's graceful stop: {left:?}"
    );
}

/// The blocked-signal mask of `pid` (`SigBlk` in `/proc/<pid>/status`).
fn blocked_signals(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix("SigBlk:"))
        .unwrap_or_default()
        .trim()
        .to_owned()
}

#[tokio::test]
async fn a_supervised_agent_starts_with_no_signal_blocked() {
    let server = TestServer::start(&[]).await;
    server.initialize(v2_api_tests::MOCK).await;
    let agents = server.mock_agent_processes();
    assert!(!agents.is_empty(), "the mock agent runs");
    for agent in agents {
        assert_eq!(
            blocked_signals(agent.pid),
            "0000000000000000",
            "the agent {} inherited blocked signals: SIGTERM would never reach it",
            procfs::cmdline(agent.pid)
        );
    }
}

#[tokio::test]
async fn a_setsid_grandchild_dies_when_initialize_times_out() {
    let dir = TempDir::new("orphans-setsid-timeout");
    let marker = "305.5";
    let script = format!(
        "#!/bin/sh\n\
         setsid sleep {marker} </dev/null >/dev/null 2>&1 &\n\
         exec sleep 300\n"
    );
    let script = dir.write("silent-agent.sh", script.as_bytes());
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("make the agent script executable");
    let command = agent_command(&script);
    let server =
        TestServer::start(&["--agent-command", &command, "--request-timeout-ms", "1500"]).await;
    let api = server.api();
    let initialize = tokio::spawn(async move {
        Api::send(
            api.request(reqwest::Method::POST, "/v2/rpc")
                .header("content-type", "application/json")
                .body(
                    serde_json::json!({
                        "jsonrpc": "2.0", "id": 1, "method": "initialize",
                        "params": {"protocolVersion": 1, "clientCapabilities": {},
                                   "_meta": {"sandboxagent.dev": {"agent": STUBBORN}}}
                    })
                    .to_string(),
                ),
        )
        .await
    });
    let deadline = Instant::now() + GONE_TIMEOUT;
    let escaped = loop {
        let escaped = running_with(&format!("sleep {marker}"));
        if !escaped.is_empty() {
            break escaped;
        }
        assert!(
            Instant::now() < deadline,
            "the escaping grandchild never ran"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let _cleanup = KillOnDrop(escaped.clone());
    let reply = initialize.await.expect("initialize");
    assert!(
        reply.text().contains("no answer to initialize"),
        "initialize timed out: {}",
        reply.text()
    );
    let left = survivors_after(&escaped, GONE_TIMEOUT).await;
    assert!(
        left.is_empty(),
        "a setsid grandchild outlived its agent's failed start: {left:?}"
    );
}
