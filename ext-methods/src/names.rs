//! Wire names: the `_meta` namespace and every `_sandboxagent/*` method and
//! notification (research/contract.md,
//! "Extension methods and control plane"). Defined here once; the runtime and
//! the SDK use them by name.

/// The `_meta` key of this product: `_meta["sandboxagent.dev"]`.
pub const NAMESPACE: &str = "sandboxagent.dev";

/// Prefix of every extension method and notification name.
pub const PREFIX: &str = "_sandboxagent/";

/// Requests the runtime answers itself (never forwarded to an agent).
pub mod method {
    /// [`AttachParams`](crate::AttachParams) →
    /// [`AttachResult`](crate::AttachResult): this connection joins a live
    /// session as controller or observer, its history replayed from the
    /// event log to it alone (the agent is not asked).
    pub const SESSION_ATTACH: &str = "_sandboxagent/session/attach";
    /// `{sessionId}` → `{}`: this connection stops receiving the session.
    pub const SESSION_DETACH: &str = "_sandboxagent/session/detach";
    /// `{sessionId}` → [`TerminateResult`](crate::TerminateResult): ends the session.
    pub const SESSION_TERMINATE: &str = "_sandboxagent/session/terminate";
    /// `{sessionId}` or `{agent}` → [`ListModelsResult`](crate::ListModelsResult).
    pub const SESSION_LIST_MODELS: &str = "_sandboxagent/session/list_models";
    /// [`SetMetadataParams`](crate::SetMetadataParams) → the updated session entry.
    pub const SESSION_SET_METADATA: &str = "_sandboxagent/session/set_metadata";
    /// `{sessionId}` → one session entry (ACP `SessionInfo` with `_meta`).
    pub const SESSION_GET: &str = "_sandboxagent/session/get";
    /// `{}` → [`AgentListResult`](crate::AgentListResult).
    pub const AGENT_LIST: &str = "_sandboxagent/agent/list";
    /// ACP `session/list` params (`cwd?`, `cursor?`) → its result: the
    /// server-wide inventory (the seed-era name of `session/list`).
    pub const SESSION_LIST: &str = "_sandboxagent/session/list";
    /// [`AgentInstallRequest`](crate::AgentInstallRequest) →
    /// [`AgentInstallResult`](crate::AgentInstallResult): as
    /// `POST /v2/agents/{agent}/install`.
    pub const AGENT_INSTALL: &str = "_sandboxagent/agent/install";
    /// [`FsPathParams`](crate::FsPathParams) → [`FsEntries`](crate::FsEntries):
    /// as `GET /v2/fs/entries`.
    pub const FS_LIST_ENTRIES: &str = "_sandboxagent/fs/list_entries";
    /// [`FsPathParams`](crate::FsPathParams) → [`FsEntry`](crate::FsEntry):
    /// as `GET /v2/fs/stat`.
    pub const FS_STAT: &str = "_sandboxagent/fs/stat";
    /// [`FsPathParams`](crate::FsPathParams) →
    /// [`FsPathResult`](crate::FsPathResult): as `POST /v2/fs/mkdir`.
    pub const FS_MKDIR: &str = "_sandboxagent/fs/mkdir";
    /// [`FsMoveParams`](crate::FsMoveParams) →
    /// [`FsMoveResult`](crate::FsMoveResult): as `POST /v2/fs/move`.
    pub const FS_MOVE: &str = "_sandboxagent/fs/move";
    /// [`FsDeleteParams`](crate::FsDeleteParams) →
    /// [`FsPathResult`](crate::FsPathResult): as `DELETE /v2/fs/entry`.
    pub const FS_DELETE_ENTRY: &str = "_sandboxagent/fs/delete_entry";
    /// [`ProcessRequest`](crate::ProcessRequest) →
    /// [`RunResult`](crate::RunResult): as `POST /v2/processes/run`.
    pub const PROCESS_RUN: &str = "_sandboxagent/process/run";
    /// [`ProcessRequest`](crate::ProcessRequest) →
    /// [`ProcessInfo`](crate::ProcessInfo): as `POST /v2/processes`.
    pub const PROCESS_START: &str = "_sandboxagent/process/start";
    /// [`ProcessListParams`](crate::ProcessListParams) →
    /// [`ProcessPage`](crate::ProcessPage): as `GET /v2/processes`.
    pub const PROCESS_LIST: &str = "_sandboxagent/process/list";
    /// [`ProcessRef`](crate::ProcessRef) →
    /// [`ProcessInfo`](crate::ProcessInfo): as `GET /v2/processes/{id}`.
    pub const PROCESS_GET: &str = "_sandboxagent/process/get";
    /// [`ProcessSignalParams`](crate::ProcessSignalParams) → `{}`: as
    /// `POST /v2/processes/{id}/signal`.
    pub const PROCESS_SIGNAL: &str = "_sandboxagent/process/signal";
    /// [`ProcessInputParams`](crate::ProcessInputParams) → `{}`: as
    /// `POST /v2/processes/{id}/input`.
    pub const PROCESS_INPUT: &str = "_sandboxagent/process/input";
    /// [`ProcessResizeParams`](crate::ProcessResizeParams) → `{}`: as
    /// `POST /v2/processes/{id}/resize`.
    pub const PROCESS_RESIZE: &str = "_sandboxagent/process/resize";
}

/// Notifications the runtime sends on the SSE stream.
pub mod notification {
    /// [`SessionEnded`](crate::SessionEnded): a session ended.
    pub const SESSION_ENDED: &str = "_sandboxagent/session/ended";
    /// [`AgentUnparsed`](crate::AgentUnparsed): an agent stdout line that is not JSON-RPC.
    pub const AGENT_UNPARSED: &str = "_sandboxagent/agent/unparsed";
    /// [`StreamGap`](crate::StreamGap): events a resumed stream can no longer replay.
    pub const STREAM_GAP: &str = "_sandboxagent/stream/gap";
    /// [`RequestResolved`](crate::RequestResolved): an agent request another
    /// connection answered (or the runtime cancelled) is no longer open.
    pub const REQUEST_RESOLVED: &str = "_sandboxagent/request/resolved";
    /// [`TurnInterrupted`](crate::TurnInterrupted): a prompt turn that was
    /// running when its server stopped, recorded in the session's log when
    /// the store is next opened; the agent requests it names are closed.
    pub const TURN_INTERRUPTED: &str = "_sandboxagent/turn/interrupted";
}

/// One extension method: its wire name, the capability flag that advertises
/// it, and whether it is also accepted as a notification (no id, HTTP 202).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtMethod {
    /// Wire name, e.g. `_sandboxagent/session/detach`.
    pub name: &'static str,
    /// Key in `extensions`, e.g. `sessionDetach`.
    pub capability: &'static str,
    /// Also accepted without an id.
    pub notification: bool,
}

/// Every extension method this product defines. A server advertises the ones
/// it actually answers (see [`crate::advertisement`]).
pub const METHODS: &[ExtMethod] = &[
    ExtMethod {
        name: method::SESSION_ATTACH,
        capability: "sessionAttach",
        notification: false,
    },
    ExtMethod {
        name: method::SESSION_DETACH,
        capability: "sessionDetach",
        notification: true,
    },
    ExtMethod {
        name: method::SESSION_TERMINATE,
        capability: "sessionTerminate",
        notification: true,
    },
    ExtMethod {
        name: method::SESSION_LIST_MODELS,
        capability: "sessionListModels",
        notification: false,
    },
    ExtMethod {
        name: method::SESSION_SET_METADATA,
        capability: "sessionSetMetadata",
        notification: true,
    },
    ExtMethod {
        name: method::SESSION_GET,
        capability: "sessionGet",
        notification: false,
    },
    ExtMethod {
        name: method::AGENT_LIST,
        capability: "agentList",
        notification: false,
    },
    ExtMethod {
        name: method::SESSION_LIST,
        capability: "sessionList",
        notification: false,
    },
    ExtMethod {
        name: method::AGENT_INSTALL,
        capability: "agentInstall",
        notification: false,
    },
    ExtMethod {
        name: method::FS_LIST_ENTRIES,
        capability: "fsListEntries",
        notification: false,
    },
    ExtMethod {
        name: method::FS_STAT,
        capability: "fsStat",
        notification: false,
    },
    ExtMethod {
        name: method::FS_MKDIR,
        capability: "fsMkdir",
        notification: false,
    },
    ExtMethod {
        name: method::FS_MOVE,
        capability: "fsMove",
        notification: false,
    },
    ExtMethod {
        name: method::FS_DELETE_ENTRY,
        capability: "fsDeleteEntry",
        notification: false,
    },
    ExtMethod {
        name: method::PROCESS_RUN,
        capability: "processRun",
        notification: false,
    },
    ExtMethod {
        name: method::PROCESS_START,
        capability: "processStart",
        notification: false,
    },
    ExtMethod {
        name: method::PROCESS_LIST,
        capability: "processList",
        notification: false,
    },
    ExtMethod {
        name: method::PROCESS_GET,
        capability: "processGet",
        notification: false,
    },
    ExtMethod {
        name: method::PROCESS_SIGNAL,
        capability: "processSignal",
        notification: false,
    },
    ExtMethod {
        name: method::PROCESS_INPUT,
        capability: "processInput",
        notification: false,
    },
    ExtMethod {
        name: method::PROCESS_RESIZE,
        capability: "processResize",
        notification: false,
    },
];

/// Capability flags for behaviour that is not a method: the notifications the
/// runtime sends and the `_meta` it reads.
pub mod capability {
    /// The runtime sends `_sandboxagent/session/ended`.
    pub const SESSION_ENDED_NOTIFICATION: &str = "sessionEndedNotification";
    /// The runtime sends `_sandboxagent/agent/unparsed`.
    pub const AGENT_UNPARSED_NOTIFICATION: &str = "agentUnparsedNotification";
    /// The runtime sends `_sandboxagent/stream/gap`.
    pub const STREAM_GAP_NOTIFICATION: &str = "streamGapNotification";
    /// The runtime sends `_sandboxagent/request/resolved`.
    pub const REQUEST_RESOLVED_NOTIFICATION: &str = "requestResolvedNotification";
    /// The runtime records `_sandboxagent/turn/interrupted` in session logs.
    pub const TURN_INTERRUPTED_NOTIFICATION: &str = "turnInterruptedNotification";
    /// `initialize` / `session/new` take the agent from `_meta["sandboxagent.dev"].agent`.
    pub const SESSION_AGENT_META: &str = "sessionAgentMeta";
    /// `session/list` answers from the server-wide inventory, with `_meta`.
    pub const SESSION_LIST_INVENTORY: &str = "sessionListInventory";
}

/// The extension method named `name`, if it is one.
pub fn find(name: &str) -> Option<&'static ExtMethod> {
    METHODS.iter().find(|m| m.name == name)
}
