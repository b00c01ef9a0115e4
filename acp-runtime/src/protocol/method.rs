//! ACP method names the runtime looks at (the ACP schema,
//! `agent-client-protocol-schema` v1), and [`Method`]: a client message's
//! method classified once, when the message is parsed, carrying what the
//! runtime decides by method (who may send it, which session header and
//! stream it takes, its span name, what its answer does). A new method is
//! one variant here and one arm in each `match` the compiler then asks for;
//! no list elsewhere names methods (research/contract.md, "Transport:
//! /v2/rpc", "`_sandboxagent/session/attach`", "Traces").

use ext_methods::names::ExtMethod;

/// `initialize`
pub const INITIALIZE: &str = "initialize";
/// `authenticate`
pub const AUTHENTICATE: &str = "authenticate";
/// `session/new`
pub const SESSION_NEW: &str = "session/new";
/// `session/load`
pub const SESSION_LOAD: &str = "session/load";
/// `session/resume`
pub const SESSION_RESUME: &str = "session/resume";
/// `session/fork`
pub const SESSION_FORK: &str = "session/fork";
/// `session/prompt`
pub const SESSION_PROMPT: &str = "session/prompt";
/// `session/cancel`
pub const SESSION_CANCEL: &str = "session/cancel";
/// `session/update`
pub const SESSION_UPDATE: &str = "session/update";
/// `session/list`
pub const SESSION_LIST: &str = "session/list";
/// `session/set_mode`
pub const SESSION_SET_MODE: &str = "session/set_mode";
/// `session/set_model` (agents that predate config options)
pub const SESSION_SET_MODEL: &str = "session/set_model";
/// `$/cancel_request` (ACP protocol level): cancel a request by id.
pub const CANCEL_REQUEST: &str = "$/cancel_request";
/// ACP agent request asking the user for permission.
pub const SESSION_REQUEST_PERMISSION: &str = "session/request_permission";
/// ACP `session/set_config_option`.
pub const SESSION_SET_CONFIG_OPTION: &str = "session/set_config_option";
/// ACP agent request: read a text file (client capability
/// `fs.readTextFile`).
pub const FS_READ_TEXT_FILE: &str = "fs/read_text_file";
/// ACP agent request: write a text file (`fs.writeTextFile`).
pub const FS_WRITE_TEXT_FILE: &str = "fs/write_text_file";
/// ACP agent request: start a terminal (`terminal`).
pub const TERMINAL_CREATE: &str = "terminal/create";
/// ACP agent request: a terminal's output so far.
pub const TERMINAL_OUTPUT: &str = "terminal/output";
/// ACP agent request: wait for a terminal's command to exit.
pub const TERMINAL_WAIT_FOR_EXIT: &str = "terminal/wait_for_exit";
/// ACP agent request: kill a terminal's command.
pub const TERMINAL_KILL: &str = "terminal/kill";
/// ACP agent request: kill and forget a terminal.
pub const TERMINAL_RELEASE: &str = "terminal/release";

/// `session/close` (ACP, unstable): a session-scoped request on `/acp`.
pub const SESSION_CLOSE: &str = "session/close";
/// `session/delete` (ACP, unstable): a session-scoped request on `/acp`.
pub const SESSION_DELETE: &str = "session/delete";

/// A client message's method, classified once with the message
/// ([`crate::inbound::Inbound::method`]). `Other` is any name the runtime
/// has no rule for (forwarded to the agent as it is); its text stays in the
/// envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// `initialize`
    Initialize,
    /// `authenticate`
    Authenticate,
    /// `session/new`
    SessionNew,
    /// `session/load`
    SessionLoad,
    /// `session/resume`
    SessionResume,
    /// `session/fork`
    SessionFork,
    /// `session/list` (answered by the runtime: the server-wide inventory)
    SessionList,
    /// `session/prompt`
    SessionPrompt,
    /// `session/cancel`
    SessionCancel,
    /// `session/set_mode`
    SessionSetMode,
    /// `session/set_model`
    SessionSetModel,
    /// `session/set_config_option`
    SessionSetConfigOption,
    /// `session/close`
    SessionClose,
    /// `session/delete`
    SessionDelete,
    /// `$/cancel_request`
    CancelRequest,
    /// One of this product's `_sandboxagent/*` methods (answered by the
    /// runtime, never forwarded).
    Ext(&'static ExtMethod),
    /// A `_sandboxagent/*` name this product does not define: answered by
    /// the runtime (`-32601` for a request), never forwarded.
    UnknownExt,
    /// Anything else: forwarded to the agent.
    Other,
}

/// Where a request's session id must be given on `/acp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The request acts on one session: `Acp-Session-Id` is required and
    /// must match `params.sessionId` (the RFD's list, as the official Rust
    /// client sends it).
    Session,
    /// No session header needed.
    Connection,
}

/// The stream an answer takes on `/acp`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// The session's stream (the session the request names).
    Session,
    /// The connection's own stream: the client may not have the session's
    /// stream yet (RFD, "Streamable HTTP Message Flow").
    Connection,
}

impl Method {
    /// Classifies `name` (a message's `method` member, unescaped).
    pub fn parse(name: &str) -> Self {
        match name {
            INITIALIZE => Self::Initialize,
            AUTHENTICATE => Self::Authenticate,
            SESSION_NEW => Self::SessionNew,
            SESSION_LOAD => Self::SessionLoad,
            SESSION_RESUME => Self::SessionResume,
            SESSION_FORK => Self::SessionFork,
            SESSION_LIST => Self::SessionList,
            SESSION_PROMPT => Self::SessionPrompt,
            SESSION_CANCEL => Self::SessionCancel,
            SESSION_SET_MODE => Self::SessionSetMode,
            SESSION_SET_MODEL => Self::SessionSetModel,
            SESSION_SET_CONFIG_OPTION => Self::SessionSetConfigOption,
            SESSION_CLOSE => Self::SessionClose,
            SESSION_DELETE => Self::SessionDelete,
            CANCEL_REQUEST => Self::CancelRequest,
            _ if name.starts_with(ext_methods::PREFIX) => {
                ext_methods::names::find(name).map_or(Self::UnknownExt, Self::Ext)
            }
            _ => Self::Other,
        }
    }

    /// Where the session id goes on `/acp` ([`Scope`]).
    pub fn scope(self) -> Scope {
        match self {
            Self::SessionPrompt
            | Self::SessionCancel
            | Self::SessionClose
            | Self::SessionDelete
            | Self::SessionFork
            | Self::SessionLoad
            | Self::SessionResume
            | Self::SessionSetConfigOption
            | Self::SessionSetMode
            | Self::SessionSetModel => Scope::Session,
            _ => Scope::Connection,
        }
    }

    /// Whether an observer may not send it (research/contract.md,
    /// "`_sandboxagent/session/attach`"): it prompts, cancels or changes
    /// the session.
    pub fn controller_only(self) -> bool {
        match self {
            Self::SessionPrompt
            | Self::SessionCancel
            | Self::SessionSetMode
            | Self::SessionSetModel
            | Self::SessionSetConfigOption => true,
            Self::Ext(ext) => matches!(
                ext.name,
                ext_methods::method::SESSION_SET_METADATA | ext_methods::method::SESSION_TERMINATE
            ),
            _ => false,
        }
    }

    /// The stream the answer takes on `/acp` ([`Lane`]): requests that open
    /// a session are answered on the connection's.
    pub fn lane(self) -> Lane {
        if self.opens_session() {
            Lane::Connection
        } else {
            Lane::Session
        }
    }

    /// Whether the request makes a session live on the agent (`new`, `fork`,
    /// `load`, `resume`): it carries a `cwd` the runtime checks and keeps.
    pub fn opens_session(self) -> bool {
        matches!(
            self,
            Self::SessionNew | Self::SessionFork | Self::SessionLoad | Self::SessionResume
        )
    }

    /// Whether the request may name an ended session: one that ended with
    /// its agent process may be loaded, resumed or forked on a new one.
    pub fn revives(self) -> bool {
        matches!(
            self,
            Self::SessionLoad | Self::SessionResume | Self::SessionFork
        )
    }

    /// The span name of a request with this method: its name when ACP or
    /// `ext-methods` defines it, else `None` (the caller's bounded
    /// "other"; research/contract.md, "Traces").
    pub fn span_name(self) -> Option<&'static str> {
        Some(match self {
            Self::Initialize => INITIALIZE,
            Self::Authenticate => AUTHENTICATE,
            Self::SessionNew => SESSION_NEW,
            Self::SessionLoad => SESSION_LOAD,
            Self::SessionResume => SESSION_RESUME,
            Self::SessionFork => SESSION_FORK,
            Self::SessionList => SESSION_LIST,
            Self::SessionPrompt => SESSION_PROMPT,
            Self::SessionCancel => SESSION_CANCEL,
            Self::SessionSetMode => SESSION_SET_MODE,
            Self::SessionSetModel => SESSION_SET_MODEL,
            Self::SessionSetConfigOption => SESSION_SET_CONFIG_OPTION,
            Self::SessionClose => SESSION_CLOSE,
            Self::SessionDelete => SESSION_DELETE,
            Self::CancelRequest => CANCEL_REQUEST,
            Self::Ext(ext) => ext.name,
            Self::UnknownExt | Self::Other => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every variant with a name parses back from it: a name added to
    /// `span_name` without `parse` (or the other way) fails here.
    #[test]
    fn names_round_trip() {
        let all = [
            Method::Initialize,
            Method::Authenticate,
            Method::SessionNew,
            Method::SessionLoad,
            Method::SessionResume,
            Method::SessionFork,
            Method::SessionList,
            Method::SessionPrompt,
            Method::SessionCancel,
            Method::SessionSetMode,
            Method::SessionSetModel,
            Method::SessionSetConfigOption,
            Method::SessionClose,
            Method::SessionDelete,
            Method::CancelRequest,
        ];
        for method in all {
            let name = method.span_name().expect("named");
            assert_eq!(Method::parse(name), method, "{name}");
        }
        for ext in ext_methods::names::METHODS {
            assert_eq!(Method::parse(ext.name), Method::Ext(ext));
            assert_eq!(Method::parse(ext.name).span_name(), Some(ext.name));
        }
        assert_eq!(Method::parse("_sandboxagent/nope"), Method::UnknownExt);
        assert_eq!(Method::parse("session/other"), Method::Other);
        assert_eq!(Method::parse("session/other").span_name(), None);
    }

    #[test]
    fn observers_may_not_steer() {
        for name in [
            SESSION_PROMPT,
            SESSION_CANCEL,
            SESSION_SET_MODE,
            SESSION_SET_MODEL,
            SESSION_SET_CONFIG_OPTION,
            ext_methods::method::SESSION_SET_METADATA,
            ext_methods::method::SESSION_TERMINATE,
        ] {
            assert!(Method::parse(name).controller_only(), "{name}");
        }
        for name in [
            SESSION_LOAD,
            SESSION_NEW,
            ext_methods::method::SESSION_GET,
            "x",
        ] {
            assert!(!Method::parse(name).controller_only(), "{name}");
        }
    }
}
