//! [`MockAgent`]: the agent's state (its sessions) and its answers to
//! `initialize`, `authenticate` and the session methods (new, load, resume,
//! fork, list, mode, model).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::SystemTime;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    AgentCapabilities, AuthMethod, AuthMethodAgent, AuthenticateRequest, AuthenticateResponse,
    ContentBlock, ContentChunk, CreateElicitationRequest, CurrentModeUpdate, ElicitationAction,
    ElicitationFormMode, ElicitationMode, ElicitationRequestScope, ElicitationSchema,
    ForkSessionRequest, ForkSessionResponse, Implementation, InitializeRequest, InitializeResponse,
    ListSessionsRequest, ListSessionsResponse, LoadSessionRequest, LoadSessionResponse,
    NewSessionRequest, NewSessionResponse, ResumeSessionRequest, ResumeSessionResponse,
    SessionCapabilities, SessionConfigOption, SessionConfigOptionCategory,
    SessionConfigSelectOption, SessionConfigValueId, SessionForkCapabilities, SessionId,
    SessionInfo, SessionInfoUpdate, SessionListCapabilities, SessionMode, SessionModeId,
    SessionModeState, SessionNotification, SessionResumeCapabilities, SessionUpdate,
    SetSessionConfigOptionRequest, SetSessionConfigOptionResponse, SetSessionModeRequest,
    SetSessionModeResponse, StringPropertySchema,
};
use agent_client_protocol::v1::{ConnectionTo, Responder};
use agent_client_protocol::{Client, Error, ErrorCode};
use parking_lot::Mutex;
use tokio_util::task::TaskTracker;

use super::args::MockAgentArgs;
use super::methods::{SetModelRequest, SetModelResponse};
use super::session::{Message, Session, Sessions, Speaker};
use super::state_dir::{Encoded, StateDir};
use super::stdio::Stdout;

/// `agentInfo.name` in the `initialize` result.
pub(super) const AGENT_NAME: &str = "sandbox-agent-mock";
/// The session modes: (id, name). The first is the current mode of a new session.
const MODES: [(&str, &str); 2] = [("default", "Default"), ("plan", "Plan")];
/// The id of the model config option.
const MODEL_CONFIG_ID: &str = "model";
/// The models: (id, name). The first is the current model of a new session.
const MODELS: [(&str, &str); 2] = [("mock-fast", "Mock fast"), ("mock-smart", "Mock smart")];
/// The `authenticate` method id that asks a question scoped to the
/// `authenticate` request (research/contract.md, "The mock agent").
pub(super) const ASK_AUTH_METHOD: &str = "mock-ask";
/// `session/new` refuses a `cwd` whose last component starts with this
/// (research/contract.md, "The mock agent"): a failing `session/new` on
/// demand.
const REFUSED_CWD_PREFIX: &str = "refuse-session";

/// The agent: its sessions and what prompt turns need to reach the outside.
pub(super) struct MockAgent {
    /// `--announce-session-early`: `session/new` sends a `session_info_update`
    /// for the new session before its answer.
    announce_session_early: bool,
    /// `--session-id-prefix`: what every session id starts with.
    session_id_prefix: String,
    /// `--session-id`: every new session gets this id.
    fixed_session_id: Option<String>,
    /// Every session this process knows, shared by handlers and turn tasks.
    /// Never held across an `.await`.
    pub(super) sessions: Mutex<Sessions>,
    /// For the raw (non-JSON) lines of `!garbage` and `!huge`.
    pub(super) stdout: Stdout,
    /// A `!crash` turn sends its exit code here; the connection's foreground
    /// receives it and ends the connection.
    pub(super) crash: tokio::sync::mpsc::UnboundedSender<i32>,
    /// The running prompt turns, so stdin EOF can wait for them.
    pub(super) turns: TaskTracker,
    /// `--require-auth`: the auth method session requests wait for.
    require_auth: Option<String>,
    /// Whether `authenticate` with that method came.
    authenticated: AtomicBool,
    /// `--state-dir`: where sessions are kept for later processes.
    state: Option<StateDir>,
}

/// What the answers to `session/new`, `load`, `resume` and `fork` report
/// about a session.
struct SessionState {
    modes: SessionModeState,
    config_options: Vec<SessionConfigOption>,
}

impl MockAgent {
    pub(super) fn new(
        args: &MockAgentArgs,
        stdout: Stdout,
        crash: tokio::sync::mpsc::UnboundedSender<i32>,
    ) -> Self {
        Self {
            announce_session_early: args.announce_session_early,
            session_id_prefix: args.session_id_prefix.clone(),
            fixed_session_id: args.session_id.clone(),
            sessions: Mutex::default(),
            stdout,
            crash,
            turns: TaskTracker::new(),
            require_auth: args.require_auth.clone(),
            authenticated: AtomicBool::new(false),
            state: args.state_dir.clone().map(StateDir::new),
        }
    }

    pub(super) fn initialize(&self, _request: &InitializeRequest) -> InitializeResponse {
        let sessions = SessionCapabilities::new()
            .list(SessionListCapabilities::new())
            .resume(SessionResumeCapabilities::new())
            .fork(SessionForkCapabilities::new());
        let auth_methods = self
            .require_auth
            .iter()
            .map(|id| {
                AuthMethod::Agent(
                    AuthMethodAgent::new(id.clone(), "Mock credential")
                        .description("The mock agent's --require-auth method".to_owned()),
                )
            })
            .collect();
        InitializeResponse::new(ProtocolVersion::V1)
            .agent_capabilities(
                AgentCapabilities::new()
                    .load_session(true)
                    .session_capabilities(sessions),
            )
            .auth_methods(auth_methods)
            .agent_info(Implementation::new(AGENT_NAME, env!("CARGO_PKG_VERSION")))
    }

    /// Accepts the `--require-auth` method; any other is invalid params.
    pub(super) fn authenticate(
        &self,
        request: &AuthenticateRequest,
    ) -> Result<AuthenticateResponse, Error> {
        if self.require_auth.as_deref() != Some(&*request.method_id.0) {
            return Err(Error::invalid_params()
                .data(format!("unknown auth method {:?}", request.method_id.0)));
        }
        self.authenticated.store(true, Ordering::Release);
        Ok(AuthenticateResponse::new())
    }

    /// `authenticate` with method [`ASK_AUTH_METHOD`]: a form elicitation
    /// scoped to the `authenticate` request itself (`requestId`), one
    /// required string `token`. An accept authenticates; a decline or a
    /// cancel is `-32602` "mock sign-in declined" / "… cancelled".
    pub(super) async fn ask_sign_in(
        self: Arc<Self>,
        responder: Responder<AuthenticateResponse>,
        cx: ConnectionTo<Client>,
    ) -> Result<(), Error> {
        let schema = ElicitationSchema::new().property(
            "token",
            StringPropertySchema::new().title("Mock token".to_owned()),
            true,
        );
        let mode = ElicitationMode::Form(ElicitationFormMode::new(
            ElicitationRequestScope::new(responder.id().clone()),
            schema,
        ));
        let request = CreateElicitationRequest::new(mode, "Sign in to the mock agent");
        let answer = cx.send_request(request).block_task().await;
        let result = match answer.map(|answer| answer.action) {
            Ok(ElicitationAction::Accept(_)) => {
                self.authenticated.store(true, Ordering::Release);
                Ok(AuthenticateResponse::new())
            }
            Ok(ElicitationAction::Decline) => {
                Err(Error::invalid_params().data("mock sign-in declined"))
            }
            Ok(_) => Err(Error::invalid_params().data("mock sign-in cancelled")),
            Err(error) => Err(error),
        };
        responder.respond_with_result(result)
    }

    /// `-32000` "Authentication required" while `--require-auth` waits for
    /// its `authenticate`.
    fn check_authenticated(&self) -> Result<(), Error> {
        if self.require_auth.is_some() && !self.authenticated.load(Ordering::Acquire) {
            return Err(Error::auth_required());
        }
        Ok(())
    }

    pub(super) fn new_session(
        &self,
        request: NewSessionRequest,
        cx: &ConnectionTo<Client>,
    ) -> Result<NewSessionResponse, Error> {
        self.check_authenticated()?;
        let refused = request
            .cwd
            .file_name()
            .and_then(|name| name.to_str())
            .is_some_and(|name| name.starts_with(REFUSED_CWD_PREFIX));
        if refused {
            let cwd = request.cwd.display();
            eprintln!("mock agent: refusing session/new in {cwd}");
            return Err(Error::new(
                ErrorCode::INTERNAL_ERROR,
                format!("mock agent: refused to open a session in {cwd}"),
            ));
        }
        let session = Session::new(request.cwd);
        let (state, updated_at) = (session.state(), session.updated_at);
        let session_id = self.add_session(session);
        if self.announce_session_early {
            let update = SessionInfoUpdate::new().updated_at(rfc3339(updated_at));
            notify(cx, &session_id, SessionUpdate::SessionInfoUpdate(update))?;
        }
        Ok(NewSessionResponse::new(session_id)
            .modes(state.modes)
            .config_options(state.config_options))
    }

    pub(super) fn load_session(
        &self,
        request: &LoadSessionRequest,
        cx: &ConnectionTo<Client>,
    ) -> Result<LoadSessionResponse, Error> {
        self.check_authenticated()?;
        self.restore(&request.session_id)?;
        let (history, state) = self.with_session(&request.session_id, |session| {
            (session.history.clone(), session.state())
        })?;
        for message in &history {
            notify(cx, &request.session_id, message.replay())?;
        }
        Ok(LoadSessionResponse::new()
            .modes(state.modes)
            .config_options(state.config_options))
    }

    pub(super) fn resume_session(
        &self,
        request: &ResumeSessionRequest,
    ) -> Result<ResumeSessionResponse, Error> {
        self.check_authenticated()?;
        self.restore(&request.session_id)?;
        let state = self.with_session(&request.session_id, |session| session.state())?;
        Ok(ResumeSessionResponse::new()
            .modes(state.modes)
            .config_options(state.config_options))
    }

    pub(super) fn fork_session(
        &self,
        request: ForkSessionRequest,
    ) -> Result<ForkSessionResponse, Error> {
        self.check_authenticated()?;
        self.restore(&request.session_id)?;
        let fork = self.with_session(&request.session_id, |parent| parent.fork(request.cwd))?;
        let state = fork.state();
        let session_id = self.add_session(fork);
        Ok(ForkSessionResponse::new(session_id)
            .modes(state.modes)
            .config_options(state.config_options))
    }

    /// The sessions this process holds, in creation order, after those
    /// only `--state-dir` holds (saved by an earlier process: what
    /// `session/load` can load), oldest update first.
    pub(super) fn list_sessions(&self, request: &ListSessionsRequest) -> ListSessionsResponse {
        let sessions = self.sessions.lock();
        let mut saved: Vec<(SessionId, PathBuf, SystemTime)> = self
            .state
            .as_ref()
            .map(StateDir::list)
            .unwrap_or_default()
            .into_iter()
            .filter(|(id, _, _)| !sessions.by_id.contains_key(id))
            .collect();
        saved.sort_by(|a, b| (a.2, &a.0.0).cmp(&(b.2, &b.0.0)));
        let mut held: Vec<(&SessionId, &Session)> = sessions.by_id.iter().collect();
        held.sort_by_key(|(_, session)| session.created);
        let held = held
            .into_iter()
            .map(|(id, session)| (id.clone(), session.cwd.clone(), session.updated_at));
        ListSessionsResponse::new(
            saved
                .into_iter()
                .chain(held)
                .filter(|(_, cwd, _)| request.cwd.as_ref().is_none_or(|want| cwd == want))
                .map(|(id, cwd, updated_at)| {
                    SessionInfo::new(id, cwd).updated_at(rfc3339(updated_at))
                })
                .collect(),
        )
    }

    /// Answers after queueing `current_mode_update`, so a client holding the
    /// answer has the update too.
    pub(super) fn set_mode(
        &self,
        request: &SetSessionModeRequest,
        cx: &ConnectionTo<Client>,
    ) -> Result<SetSessionModeResponse, Error> {
        let mode = known_id(&MODES, &request.mode_id.0, "mode")?;
        let saved = self.with_session(&request.session_id, |session| {
            session.mode = SessionModeId::new(mode);
            session.updated_at = SystemTime::now();
            self.save(&request.session_id, session)
        })?;
        self.write_saved(saved);
        let update = CurrentModeUpdate::new(SessionModeId::new(mode));
        notify(
            cx,
            &request.session_id,
            SessionUpdate::CurrentModeUpdate(update),
        )?;
        Ok(SetSessionModeResponse::new())
    }

    pub(super) fn set_config_option(
        &self,
        request: &SetSessionConfigOptionRequest,
    ) -> Result<SetSessionConfigOptionResponse, Error> {
        if request.config_id.0.as_ref() != MODEL_CONFIG_ID {
            return Err(Error::invalid_params().data(format!(
                "unknown config option `{}`; the mock agent has `{MODEL_CONFIG_ID}`",
                request.config_id.0
            )));
        }
        let Some(value) = request.value.as_value_id() else {
            return Err(Error::invalid_params().data("the `model` option takes a value id"));
        };
        let state = self.select_model(&request.session_id, value)?;
        Ok(SetSessionConfigOptionResponse::new(state.config_options))
    }

    pub(super) fn set_model(&self, request: &SetModelRequest) -> Result<SetModelResponse, Error> {
        self.select_model(&request.session_id, &request.model_id)?;
        Ok(SetModelResponse {})
    }

    fn select_model(
        &self,
        session_id: &SessionId,
        model: &SessionConfigValueId,
    ) -> Result<SessionState, Error> {
        let model = known_id(&MODELS, &model.0, "model")?;
        let (state, saved) = self.with_session(session_id, |session| {
            session.model = SessionConfigValueId::new(model);
            session.updated_at = SystemTime::now();
            (session.state(), self.save(session_id, session))
        })?;
        self.write_saved(saved);
        Ok(state)
    }

    /// Stores a session under a new id (`mock-<uuid>`, or the fixed
    /// `--session-id`) and returns the id.
    fn add_session(&self, mut session: Session) -> SessionId {
        let session_id = SessionId::new(match &self.fixed_session_id {
            Some(id) => id.clone(),
            None => format!("{}{}", self.session_id_prefix, uuid::Uuid::new_v4()),
        });
        let mut sessions = self.sessions.lock();
        sessions.created += 1;
        session.created = sessions.created;
        let saved = self.save(&session_id, &session);
        sessions.by_id.insert(session_id.clone(), session);
        drop(sessions);
        self.write_saved(saved);
        session_id
    }

    /// Makes a session of an earlier process known again: when `id` is not
    /// in memory, reads it from `--state-dir` (if set). A session in neither
    /// place is left to the caller's "session not found".
    ///
    /// # Errors
    /// Internal error (`-32603`) naming the file when it exists but cannot
    /// be read or parsed.
    fn restore(&self, id: &SessionId) -> Result<(), Error> {
        let Some(state) = &self.state else {
            return Ok(());
        };
        if self.sessions.lock().by_id.contains_key(id) {
            return Ok(());
        }
        // Read without the lock: a long history is a large file.
        let mut session = match state.load(id) {
            Ok(Some(session)) => session,
            Ok(None) => return Ok(()),
            Err(error) => {
                return Err(Error::internal_error().data(format!(
                    "cannot read session {:?} from {}: {error}",
                    id.0,
                    state.path(id).display()
                )));
            }
        };
        let mut sessions = self.sessions.lock();
        sessions.created += 1;
        session.created = sessions.created;
        // A `session/load` that raced this one restored it first.
        sessions.by_id.entry(id.clone()).or_insert(session);
        Ok(())
    }

    /// Encodes a session for `--state-dir`, if set, after each change of
    /// it; called with the session map locked (see [`StateDir`]), and
    /// written by [`Self::write_saved`] once it is released. A failure is
    /// reported on stderr; the session goes on in memory.
    pub(super) fn save(&self, id: &SessionId, session: &Session) -> Option<Encoded> {
        let state = self.state.as_ref()?;
        state
            .encode(id, session)
            .map_err(|error| self.report_save_error(id, &error))
            .ok()
    }

    /// Writes what [`Self::save`] encoded (with the session map unlocked).
    pub(super) fn write_saved(&self, encoded: Option<Encoded>) {
        let (Some(state), Some(encoded)) = (&self.state, encoded) else {
            return;
        };
        let id = encoded.id().clone();
        if let Err(error) = state.write(encoded) {
            self.report_save_error(&id, &error);
        }
    }

    /// [`Self::write_saved`] on a blocking thread, awaited.
    pub(super) async fn write_saved_off_thread(self: &Arc<Self>, encoded: Option<Encoded>) {
        if encoded.is_none() {
            return;
        }
        let agent = Arc::clone(self);
        let _ = tokio::task::spawn_blocking(move || agent.write_saved(encoded)).await;
    }

    fn report_save_error(&self, id: &SessionId, error: &std::io::Error) {
        if let Some(state) = &self.state {
            eprintln!(
                "mock agent: cannot save session {:?} to {}: {error}",
                id.0,
                state.path(id).display()
            );
        }
    }

    /// Runs `f` on a session, or returns the ACP "session not found" error (`-32002`).
    fn with_session<T>(
        &self,
        id: &SessionId,
        f: impl FnOnce(&mut Session) -> T,
    ) -> Result<T, Error> {
        match self.sessions.lock().by_id.get_mut(id) {
            Some(session) => Ok(f(session)),
            None => Err(session_not_found(id)),
        }
    }
}

impl Session {
    /// A new session in the first mode with the first model.
    fn new(cwd: PathBuf) -> Self {
        Self {
            created: 0,
            cwd,
            mode: SessionModeId::new(MODES[0].0),
            model: SessionConfigValueId::new(MODELS[0].0),
            history: Vec::new(),
            updated_at: SystemTime::now(),
            turn: None,
        }
    }

    /// A new session with this one's history, mode and model.
    fn fork(&self, cwd: PathBuf) -> Self {
        Self {
            mode: self.mode.clone(),
            model: self.model.clone(),
            history: self.history.clone(),
            ..Self::new(cwd)
        }
    }

    fn state(&self) -> SessionState {
        let modes = MODES
            .iter()
            .map(|(id, name)| SessionMode::new(*id, *name))
            .collect();
        let models: Vec<SessionConfigSelectOption> = MODELS
            .iter()
            .map(|(id, name)| SessionConfigSelectOption::new(*id, *name))
            .collect();
        let model =
            SessionConfigOption::select(MODEL_CONFIG_ID, "Model", self.model.clone(), models)
                .category(SessionConfigOptionCategory::Model);
        SessionState {
            modes: SessionModeState::new(self.mode.clone(), modes),
            config_options: vec![model],
        }
    }
}

impl Message {
    /// The update that replays this message in `session/load`.
    fn replay(&self) -> SessionUpdate {
        let chunk = ContentChunk::new(ContentBlock::from(self.text.clone()));
        match self.from {
            Speaker::User => SessionUpdate::UserMessageChunk(chunk),
            Speaker::Agent => SessionUpdate::AgentMessageChunk(chunk),
        }
    }
}

/// The ACP "session not found" error: `-32002` with `data.sessionId`.
pub(super) fn session_not_found(id: &SessionId) -> Error {
    agent_client_protocol::v1::schema::Error::session_not_found(id.clone()).into()
}

/// `id` if it is one of `known` (pairs of id and name), else invalid params.
fn known_id(known: &[(&'static str, &str)], id: &str, what: &str) -> Result<&'static str, Error> {
    known
        .iter()
        .map(|(known, _)| *known)
        .find(|known| *known == id)
        .ok_or_else(|| {
            let names: Vec<&str> = known.iter().map(|(id, _)| *id).collect();
            Error::invalid_params().data(format!(
                "unknown {what} `{id}`; the mock agent has {}",
                names.join(", ")
            ))
        })
}

/// Sends one `session/update` notification.
pub(super) fn notify(
    cx: &ConnectionTo<Client>,
    session_id: &SessionId,
    update: SessionUpdate,
) -> Result<(), Error> {
    cx.send_notification(SessionNotification::new(session_id.clone(), update))
}

/// A timestamp as RFC 3339 (seconds), as ACP's `updatedAt` fields want.
fn rfc3339(time: SystemTime) -> String {
    humantime::format_rfc3339_seconds(time).to_string()
}
