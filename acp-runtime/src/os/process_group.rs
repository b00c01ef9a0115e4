//! Process groups: an agent, or an npm run, started as the leader of its
//! own group, is stopped with its children by signalling the group.

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// Sends `signal` to the agent's process group (the agent and its children).
pub fn signal_group(pid: u32, signal: Signal) {
    if let Ok(pid) = i32::try_from(pid)
        && let Err(error) = killpg(Pid::from_raw(pid), signal)
        && error != nix::errno::Errno::ESRCH
    {
        tracing::warn!(pid, ?signal, %error, "cannot signal agent process group");
    }
}
