//! Process-tree helpers over Linux `/proc`.
//!
//! Used to check that the server cleans up its agent processes (no orphan
//! processes remain; research/contract.md,
//! "Routing: connections, sessions, one agent process") and, in
//! [`crate::TestServer`]'s drop, to kill whatever a failing server left.

use std::collections::HashMap;

/// One process, identified by pid *and* start time so a recycled pid is never
/// mistaken for the process that was recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProcessRef {
    /// The process id.
    pub pid: u32,
    /// Field 22 of `/proc/<pid>/stat` (clock ticks since boot).
    pub start_time: u64,
}

/// The fields of `/proc/<pid>/stat` the harness needs.
#[derive(Debug, Clone, Copy)]
pub struct Stat {
    /// Single-letter state (`R`, `S`, `Z`, ...).
    pub state: char,
    /// Parent pid.
    pub ppid: u32,
    /// Start time in clock ticks since boot.
    pub start_time: u64,
}

/// Reads `/proc/<pid>/stat`; `None` when the process does not exist.
pub fn stat(pid: u32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may contain spaces
    // or parentheses itself: the fixed fields start after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `fields[0]` is field 3 (state), so field N is `fields[N - 3]`.
    Some(Stat {
        state: fields.first()?.chars().next()?,
        ppid: fields.get(1)?.parse().ok()?,
        start_time: fields.get(19)?.parse().ok()?,
    })
}

/// A [`ProcessRef`] for a live pid, `None` if it does not exist.
pub fn process_ref(pid: u32) -> Option<ProcessRef> {
    stat(pid).map(|s| ProcessRef {
        pid,
        start_time: s.start_time,
    })
}

/// Every process whose parent chain leads to `pid` (children, grandchildren,
/// ...), excluding `pid` itself. A snapshot: processes already reparented
/// (their parent exited) are no longer found.
pub fn descendants(pid: u32) -> Vec<ProcessRef> {
    let mut children: HashMap<u32, Vec<ProcessRef>> = HashMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    for entry in entries.flatten() {
        let Some(child) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        if let Some(s) = stat(child) {
            children.entry(s.ppid).or_default().push(ProcessRef {
                pid: child,
                start_time: s.start_time,
            });
        }
    }
    let mut found = Vec::new();
    let mut queue = vec![pid];
    while let Some(parent) = queue.pop() {
        for child in children.remove(&parent).unwrap_or_default() {
            queue.push(child.pid);
            found.push(child);
        }
    }
    found
}

/// Whether the recorded process still runs. A zombie counts as dead: it no
/// longer executes, and once its parent is gone reaping it is the job of
/// whatever pid 1 the machine has.
pub fn is_alive(process: &ProcessRef) -> bool {
    match stat(process.pid) {
        Some(s) => s.start_time == process.start_time && s.state != 'Z',
        None => false,
    }
}

/// Whether `pid` names a running (non-zombie) process right now. Prefer
/// [`is_alive`] with a recorded [`ProcessRef`] when the pid may be recycled.
pub fn pid_is_alive(pid: u32) -> bool {
    stat(pid).is_some_and(|s| s.state != 'Z')
}

/// The command line of `pid`, arguments joined by spaces (empty when the
/// process is gone or is a zombie).
pub fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|raw| {
            raw.split(|b| *b == 0)
                .filter(|part| !part.is_empty())
                .map(|part| String::from_utf8_lossy(part).into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default()
}

/// The environment of `pid` (`/proc/<pid>/environ`), as `NAME=value`
/// pairs; empty when the process is gone.
pub fn environ(pid: u32) -> Vec<(String, String)> {
    std::fs::read(format!("/proc/{pid}/environ"))
        .map(|raw| {
            raw.split(|b| *b == 0)
                .filter_map(|part| {
                    let text = String::from_utf8_lossy(part);
                    text.split_once('=')
                        .map(|(k, v)| (k.to_owned(), v.to_owned()))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Resident set size of `pid` in bytes (`VmRSS` of `/proc/<pid>/status`).
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Sends `signal` to the recorded process if it is still that process.
/// Errors (already gone) are ignored: this is best-effort cleanup.
pub fn signal(process: &ProcessRef, signal: nix::sys::signal::Signal) {
    if is_alive(process)
        && let Ok(raw) = i32::try_from(process.pid)
    {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(raw), signal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_child_and_sees_it_die() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let me = std::process::id();
        let found = descendants(me);
        let process = found
            .iter()
            .find(|p| p.pid == child.id())
            .copied()
            .expect("the child is a descendant");
        assert!(is_alive(&process));
        assert!(pid_is_alive(process.pid));
        // Right after fork the child may not have exec'd `sleep` yet.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !cmdline(process.pid).contains("sleep 30") && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(cmdline(process.pid).contains("sleep 30"));
        assert!(rss_bytes(me).is_some_and(|rss| rss > 0));
        signal(&process, nix::sys::signal::Signal::SIGKILL);
        let _ = child.wait();
        assert!(!is_alive(&process));
        assert!(!pid_is_alive(process.pid));
    }

    #[test]
    fn a_recycled_pid_is_not_the_recorded_process() {
        let me = process_ref(std::process::id()).expect("self");
        let other = ProcessRef {
            pid: me.pid,
            start_time: me.start_time + 1,
        };
        assert!(is_alive(&me));
        assert!(!is_alive(&other));
    }
}
