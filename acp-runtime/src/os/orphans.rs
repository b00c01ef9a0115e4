//! No agent process tree outlives the server (research/contract.md, "Agent
//! process trees and a server that dies"). Every agent runs in a process
//! group of its own; two mechanisms kill that group when the server is gone
//! without stopping it (SIGKILL, a crash, an abort):
//!
//! - the **keeper**: a `/bin/sh` in the agent's process group that waits
//!   for end of file on a pipe only the server holds open, then sends
//!   SIGKILL to the group (itself included). The kernel closes the pipe
//!   when the server dies, however it dies, so the tree goes at once. It
//!   ignores SIGTERM, SIGHUP and SIGINT: a graceful stop's SIGTERM to the
//!   group leaves it waiting, and the server's SIGKILL to the group after
//!   the agent exited ends it. A parent-death signal would need `unsafe` in
//!   a `pre_exec` hook; a process of its own needs none.
//! - the **group record**: `<data dir>/run/agent-<pgid>.json`, written when
//!   the agent starts and removed when its group has been killed. The next
//!   server on the data dir reads the records of servers that are no longer
//!   running and kills those groups before it serves anything
//!   ([`reap_leftovers`]), for a tree whose keeper was lost too.
//!
//! Identities are pid *and* start time (field 22 of `/proc/<pid>/stat`) and
//! the boot id, so a recycled pid is never taken for the recorded process.
//! Records need `/proc`; without it (not Linux) only the keeper works. A
//! process that leaves the group (`setsid`, `setpgid`) escapes both.

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// The keeper's script: read the lifeline until end of file, then SIGKILL
/// the process group named by `$1`.
const KEEPER_SCRIPT: &str =
    r#"trap '' TERM HUP INT; while read -r line; do :; done; kill -s KILL -- "-$1" 2>/dev/null"#;
/// The keeper's `$0`: what `ps` shows next to the script.
const KEEPER_NAME: &str = "sandbox-agent-keeper";
/// The shell that runs the keeper (an absolute path: `PATH` is not consulted).
const SHELL: &str = "/bin/sh";
/// Folder of the group records, inside the data dir.
const RUN_DIR: &str = "run";
/// Prefix of a group record's file name (`agent-<pgid>.json`).
const RECORD_PREFIX: &str = "agent-";
/// How long start-up waits for the killed leftover groups to be gone.
const REAP_WAIT: Duration = Duration::from_secs(2);

/// Starts the keeper of the process group `pgid` (the agent's pid, whose
/// group it joins). The server's end of its pipe is held by a task that
/// lives as long as the keeper; the keeper dies with the group.
///
/// # Errors
/// When `/bin/sh` cannot be started or the group is already gone.
pub(crate) fn spawn_keeper(pgid: u32) -> std::io::Result<()> {
    let group = i32::try_from(pgid).map_err(std::io::Error::other)?;
    let mut keeper = tokio::process::Command::new(SHELL)
        .args(["-c", KEEPER_SCRIPT, KEEPER_NAME, &pgid.to_string()])
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(group)
        // Not `kill_on_drop`: killing the keeper alone would leave the group
        // unguarded; dropping the pipe makes it kill the group instead.
        .spawn()?;
    let lifeline = keeper.stdin.take();
    tokio::spawn(async move {
        let _ = keeper.wait().await;
        drop(lifeline);
    });
    Ok(())
}

/// The record of one agent process group, as stored in its file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct GroupRecord {
    /// Agent id (for the log).
    agent: String,
    /// The process group id: the agent's pid.
    pgid: u32,
    /// The agent's start time, clock ticks since boot.
    start_time: u64,
    /// The server that started it.
    server_pid: u32,
    /// That server's start time, clock ticks since boot.
    server_start_time: u64,
    /// `/proc/sys/kernel/random/boot_id` when it was written.
    boot_id: String,
}

/// A written group record; dropping it removes the file.
#[derive(Debug)]
pub(crate) struct GroupRecordFile {
    path: PathBuf,
}

impl Drop for GroupRecordFile {
    fn drop(&mut self) {
        if let Err(error) = std::fs::remove_file(&self.path)
            && error.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %self.path.display(), %error, "cannot remove an agent group record");
        }
    }
}

/// Records that this server runs agent `agent` as process group `pgid`, in
/// `<data_dir>/run/agent-<pgid>.json`. `None` (logged) when it cannot:
/// no `/proc`, or the folder is not writable.
pub(crate) fn record_group(data_dir: &Path, agent: &str, pgid: u32) -> Option<GroupRecordFile> {
    let (Some(start_time), Some(server_start_time), Some(boot_id)) =
        (start_time(pgid), start_time(std::process::id()), boot_id())
    else {
        tracing::debug!(
            agent,
            pgid,
            "no /proc: the agent's process group is not recorded"
        );
        return None;
    };
    let record = GroupRecord {
        agent: agent.to_owned(),
        pgid,
        start_time,
        server_pid: std::process::id(),
        server_start_time,
        boot_id,
    };
    let dir = data_dir.join(RUN_DIR);
    let path = dir.join(format!("{RECORD_PREFIX}{pgid}.json"));
    let written = std::fs::create_dir_all(&dir).and_then(|()| {
        let text = serde_json::to_vec(&record).map_err(std::io::Error::other)?;
        std::fs::write(&path, text)
    });
    match written {
        Ok(()) => Some(GroupRecordFile { path }),
        Err(error) => {
            tracing::warn!(agent, pgid, path = %path.display(), %error, "cannot record the agent's process group");
            None
        }
    }
}

/// Kills the agent process groups recorded in `<data_dir>/run/` by servers
/// that no longer run (a server that died without stopping its agents),
/// waits up to 2 s for them to be gone, and removes their records. Records
/// of a server that still runs (another server on the same data dir) are
/// left alone. Call before any agent starts.
pub(crate) async fn reap_leftovers(data_dir: &Path) {
    let dir = data_dir.join(RUN_DIR);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    let boot = boot_id();
    let mut killed = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let is_record = path
            .file_name()
            .and_then(|name| name.to_str())
            .is_some_and(|name| name.starts_with(RECORD_PREFIX) && name.ends_with(".json"));
        if !is_record {
            continue;
        }
        let record = std::fs::read(&path)
            .ok()
            .and_then(|text| serde_json::from_slice::<GroupRecord>(&text).ok());
        let Some(record) = record else {
            tracing::warn!(path = %path.display(), "removing an unreadable agent group record");
            let _ = std::fs::remove_file(&path);
            continue;
        };
        if boot.as_deref() != Some(record.boot_id.as_str()) {
            // Written before the machine restarted: nothing of it runs.
            let _ = std::fs::remove_file(&path);
            continue;
        }
        if start_time(record.server_pid) == Some(record.server_start_time) {
            continue;
        }
        if kill_recorded_group(&record) {
            killed.push(record.pgid);
        }
        let _ = std::fs::remove_file(&path);
    }
    let deadline = Instant::now() + REAP_WAIT;
    while killed.iter().any(|pgid| group_runs(*pgid)) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// SIGKILLs the group of `record` unless its pid now names another process.
/// Returns whether a signal was sent to a group that existed.
fn kill_recorded_group(record: &GroupRecord) -> bool {
    match start_time(record.pgid) {
        // A recycled pid: the recorded group is empty (its id could not be
        // reused while any member lived).
        Some(started) if started != record.start_time => return false,
        // The leader itself, or (gone) its group, which may still have members.
        _ => {}
    }
    let Ok(pgid) = i32::try_from(record.pgid) else {
        return false;
    };
    match killpg(Pid::from_raw(pgid), Signal::SIGKILL) {
        Ok(()) => {
            tracing::warn!(
                agent = %record.agent,
                pgid = record.pgid,
                server_pid = record.server_pid,
                "killed an agent process group left behind by a server that is gone"
            );
            true
        }
        Err(nix::errno::Errno::ESRCH) => false,
        Err(error) => {
            tracing::warn!(agent = %record.agent, pgid = record.pgid, %error, "cannot kill a leftover agent process group");
            false
        }
    }
}

/// Whether a process of group `pgid` still runs (zombies do not count).
fn group_runs(pgid: u32) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    entries.flatten().any(|entry| {
        entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<u32>().ok())
            .and_then(stat_fields)
            .is_some_and(|stat| stat.pgrp == pgid && stat.state != 'Z')
    })
}

/// The fields of `/proc/<pid>/stat` used here and by the tree supervisor.
pub(super) struct StatFields {
    /// Field 3: `R`, `S`, `Z`, …
    pub(super) state: char,
    /// Field 4: the parent's pid.
    pub(super) ppid: u32,
    /// Field 5: the process group.
    pgrp: u32,
    /// Field 22: start time in clock ticks since boot.
    pub(super) start_time: u64,
}

/// Reads `/proc/<pid>/stat`; `None` when the process does not exist.
pub(super) fn stat_fields(pid: u32) -> Option<StatFields> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold anything:
    // the fixed fields start after the last ')'; field N is `fields[N - 3]`.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(StatFields {
        state: fields.first()?.chars().next()?,
        ppid: fields.get(1)?.parse().ok()?,
        pgrp: fields.get(2)?.parse().ok()?,
        start_time: fields.get(19)?.parse().ok()?,
    })
}

/// The start time of `pid` in clock ticks since boot; `None` when it does
/// not exist (or there is no `/proc`).
fn start_time(pid: u32) -> Option<u64> {
    stat_fields(pid).map(|stat| stat.start_time)
}

/// This boot's id; `None` without `/proc`.
fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|id| id.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_a_start_time_and_a_group() {
        let me = stat_fields(std::process::id()).expect("/proc/self/stat");
        assert!(me.start_time > 0);
        assert!(me.pgrp > 0);
        // The tree supervisor's fields: parent pid and state.
        assert_eq!(me.ppid, std::os::unix::process::parent_id());
        assert!(matches!(me.state, 'R' | 'S'), "{}", me.state);
        assert!(boot_id().is_some_and(|id| !id.is_empty()));
    }

    #[tokio::test]
    async fn records_of_a_running_server_are_kept_and_others_removed() {
        let dir = std::env::temp_dir().join(format!("orphans-test-{}", uuid::Uuid::new_v4()));
        let run = dir.join(RUN_DIR);
        std::fs::create_dir_all(&run).expect("run dir");
        let me = std::process::id();
        let live = GroupRecord {
            agent: "live".to_owned(),
            pgid: u32::MAX - 1,
            start_time: 1,
            server_pid: me,
            server_start_time: start_time(me).expect("own start time"),
            boot_id: boot_id().expect("boot id"),
        };
        let dead = GroupRecord {
            agent: "dead".to_owned(),
            server_start_time: live.server_start_time + 1,
            ..live.clone()
        };
        let write = |name: &str, record: &GroupRecord| {
            let text = serde_json::to_vec(record).expect("json");
            std::fs::write(run.join(name), text).expect("write record");
        };
        write("agent-1.json", &live);
        write("agent-2.json", &dead);
        std::fs::write(run.join("agent-3.json"), b"{").expect("write garbage");
        reap_leftovers(&dir).await;
        let mut left: Vec<String> = std::fs::read_dir(&run)
            .expect("run dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(left, ["agent-1.json"]);
    }
}
