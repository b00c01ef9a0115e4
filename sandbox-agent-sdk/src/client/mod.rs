//! [`SandboxAgentClient`]: the server (remote or embedded), at most one
//! live connection to the agent, the event stream, and every call.
//!
//! # Layout
//! - [`handle`]: the client and the state its clones share; sending a
//!   request, the timeouts, extension requests.
//! - [`lifecycle`]: `connect`, `open`, `close`, `shutdown`, the event
//!   stream, and what the client knows of its server and connection.
//! - [`acp`]: the ACP methods, named after them: `authenticate`, the
//!   session methods, prompt turns (`prompt`, `prompt_stream`).
//! - [`extensions`]: the sandbox-agent extensions (`_sandboxagent/*`,
//!   answered by the server) under sandbox names.
//! - [`control_plane`]: the control-plane routes (plain HTTP; no
//!   connection needed), event pages.
//! - [`fs`]: the host file system.
//! - [`processes`]: the process API: run, start (a [`ProcessHandle`] with
//!   its resumable output), list, get.
//! - [`output_chunk`]: a followed output chunk's JSON, decoded in one pass.

mod acp;
mod control_plane;
mod extensions;
mod fs;
mod handle;
mod lifecycle;
mod output_chunk;
mod processes;

pub use acp::{SessionList, SetSessionModelRequest, SetSessionModelResponse};
pub use control_plane::{EventPage, SessionEntryPage, SessionEntryQuery, SessionState};
pub use fs::{FS_RESUME_ATTEMPTS, FsDownload, FsPath};
pub use handle::SandboxAgentClient;
pub use processes::{OUTPUT_RECONNECT, OutputEvent, ProcessHandle, ProcessOutput};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::event::Event;
    use crate::events::Events;
    use crate::turn::{TurnEvent, TurnStream};

    fn assert_send_sync<T: Send + Sync>() {}
    fn assert_send<T: Send>() {}

    #[test]
    fn the_client_and_its_parts_can_be_shared_across_tasks() {
        assert_send_sync::<SandboxAgentClient>();
        assert_send_sync::<Events>();
        assert_send_sync::<Error>();
        // Events cross tasks; a permission request is answered by one owner.
        assert_send::<Event>();
        assert_send_sync::<TurnStream>();
        assert_send::<TurnEvent>();
    }
}
