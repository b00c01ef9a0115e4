//! [`SandboxAgent`]: a runtime started by a [`SandboxProvider`] (or one
//! already running) and the clients on it, in the shape of the TypeScript
//! SDK's `SandboxAgent` (`start`, `createSession`, `session.prompt`,
//! `destroySandbox`). It sits on [`SandboxAgentClient`] (it derefs to the
//! client of its default agent) and replaces nothing.

use crate::client::SandboxAgentClient;
use crate::error::Error;
use crate::meta::{Metadata, sandbox_meta};
use crate::options::ClientOptions;
use crate::provider::{Sandbox, SandboxProvider, local};
use crate::turn::TurnStream;
use agent_client_protocol::v1::schema::{
    ContentBlock, NewSessionRequest, PromptRequest, SessionId, StopReason,
};
use std::collections::HashMap;
use std::sync::Arc;

/// What [`SandboxAgent::start`] needs.
///
/// ```
/// use sandbox_agent_sdk::{StartOptions, local};
/// use std::sync::Arc;
/// let options = StartOptions {
///     sandbox: Some(Arc::new(local())),
///     agent: "mock".into(),
/// };
/// // or: StartOptions::new("mock").sandbox(local())
/// # let _ = options;
/// ```
#[derive(Debug, Clone, Default)]
pub struct StartOptions {
    /// Where the runtime runs; `None`: [`local()`] (the embedded server, as
    /// [`SandboxAgentClient::connect`] without a base URL).
    pub sandbox: Option<Arc<dyn SandboxProvider>>,
    /// The default agent (`mock`, `codex`, `claude`, …): the one the
    /// [`SandboxAgent`] derefs to and sessions get when
    /// [`SessionOptions::agent`] names none.
    pub agent: String,
}

impl StartOptions {
    /// Options for `agent` on the [`local()`] provider.
    pub fn new(agent: impl Into<String>) -> StartOptions {
        StartOptions {
            sandbox: None,
            agent: agent.into(),
        }
    }

    /// Runs the runtime in sandboxes of `provider`.
    pub fn sandbox(mut self, provider: impl SandboxProvider + 'static) -> StartOptions {
        self.sandbox = Some(Arc::new(provider));
        self
    }
}

/// What [`SandboxAgent::create_session`] needs; every field may be left out.
#[derive(Debug, Clone, Default)]
pub struct SessionOptions {
    /// The agent; `None`: the [`SandboxAgent`]'s default agent. Another
    /// agent gets a client of its own on the same runtime.
    pub agent: Option<String>,
    /// The session's working directory in the sandbox; `None`: the
    /// sandbox's default (`/home/agent` in the image, the current directory
    /// for [`local()`], `/` for [`SandboxAgent::connect`]).
    pub cwd: Option<String>,
    /// Metadata stored with the session (`_meta["sandboxagent.dev"]`).
    pub metadata: Option<Metadata>,
}

/// A runtime and the clients on it. Derefs to the [`SandboxAgentClient`] of
/// the default agent, so every client method is here too.
#[derive(Debug)]
pub struct SandboxAgent {
    /// The default agent's client.
    client: SandboxAgentClient,
    /// Clients of other agents, made by [`create_session`](Self::create_session).
    others: tokio::sync::Mutex<HashMap<String, SandboxAgentClient>>,
    /// The sandbox this value started; `None` for
    /// [`connect`](Self::connect), and once destroyed.
    sandbox: tokio::sync::Mutex<Option<Box<dyn Sandbox>>>,
    /// Its id, kept after destroy.
    sandbox_id: Option<String>,
    /// Its fleet.
    fleet: Option<String>,
    /// The runtime's token (for the other agents' clients).
    token: Option<String>,
    /// The sessions' default working directory.
    default_cwd: String,
}

impl SandboxAgent {
    /// Starts a sandbox with `options.sandbox` (default [`local()`]), and
    /// connects a client for `options.agent` to the runtime in it with the
    /// token generated for it.
    ///
    /// # Errors
    /// [`Error::InvalidOptions`] for an empty agent; [`Error::Sandbox`]
    /// naming the step that failed (create, start, health) with what the
    /// sandbox printed; the client's errors
    /// ([`SandboxAgentClient::connect`]), after which the sandbox is
    /// destroyed.
    pub async fn start(options: StartOptions) -> Result<SandboxAgent, Error> {
        if options.agent.is_empty() {
            return Err(Error::InvalidOptions(
                "StartOptions::agent is empty".to_owned(),
            ));
        }
        let provider = options.sandbox.unwrap_or_else(|| Arc::new(local()));
        let mut sandbox = provider.start().await?;
        let connected = SandboxAgentClient::connect(
            ClientOptions::new(options.agent)
                .base_url(sandbox.base_url())
                .token(sandbox.token()),
        )
        .await;
        let client = match connected {
            Ok(client) => client,
            Err(error) => {
                let _ = sandbox.destroy().await;
                return Err(error);
            }
        };
        Ok(SandboxAgent {
            client,
            others: tokio::sync::Mutex::default(),
            sandbox_id: Some(sandbox.id().to_owned()),
            fleet: sandbox.fleet().map(str::to_owned),
            token: Some(sandbox.token().to_owned()),
            default_cwd: sandbox.default_cwd(),
            sandbox: tokio::sync::Mutex::new(Some(sandbox)),
        })
    }

    /// A runtime that is already running at `base_url` (with `token`, if it
    /// requires one), with `agent` as the default agent;
    /// [`destroy_sandbox`](Self::destroy_sandbox) only closes the clients.
    ///
    /// # Errors
    /// As [`SandboxAgentClient::connect`] in server mode.
    pub async fn connect(
        base_url: impl Into<String>,
        token: Option<String>,
        agent: impl Into<String>,
    ) -> Result<SandboxAgent, Error> {
        let mut options = ClientOptions::new(agent).base_url(base_url);
        if let Some(token) = &token {
            options = options.token(token);
        }
        let client = SandboxAgentClient::connect(options).await?;
        Ok(SandboxAgent {
            client,
            others: tokio::sync::Mutex::default(),
            sandbox: tokio::sync::Mutex::new(None),
            sandbox_id: None,
            fleet: None,
            token,
            default_cwd: "/".to_owned(),
        })
    }

    /// The default agent's client.
    pub fn client(&self) -> &SandboxAgentClient {
        &self.client
    }

    /// The sandbox's id at its provider (a container id, `local-PID`);
    /// `None` after [`connect`](Self::connect).
    pub fn sandbox_id(&self) -> Option<&str> {
        self.sandbox_id.as_deref()
    }

    /// The fleet its container is labelled with (docker); `None` otherwise.
    pub fn fleet(&self) -> Option<&str> {
        self.fleet.as_deref()
    }

    /// A new session (`session/new`) of `options.agent` (default: the
    /// default agent) in `options.cwd` with `options.metadata`.
    ///
    /// # Errors
    /// As [`SandboxAgentClient::new_session`]; for another agent, as
    /// [`SandboxAgentClient::connect`] too (404 `unknown-agent`, …).
    pub async fn create_session(&self, options: SessionOptions) -> Result<Session, Error> {
        let client = match options.agent {
            Some(agent) if agent != self.client.agent() => self.client_for(agent).await?,
            _ => self.client.clone(),
        };
        let mut request =
            NewSessionRequest::new(options.cwd.unwrap_or_else(|| self.default_cwd.clone()));
        if let Some(metadata) = options.metadata {
            request = request.meta(sandbox_meta(metadata));
        }
        let created = client.new_session(request).await?;
        Ok(Session {
            id: created.into_inner().session_id,
            client,
        })
    }

    /// The client of `agent` on this runtime, connected on first use.
    async fn client_for(&self, agent: String) -> Result<SandboxAgentClient, Error> {
        let mut others = self.others.lock().await;
        if let Some(client) = others.get(&agent) {
            return Ok(client.clone());
        }
        let mut options = ClientOptions::new(agent.clone()).base_url(self.client.base_url());
        if let Some(token) = &self.token {
            options = options.token(token);
        }
        let client = SandboxAgentClient::connect(options).await?;
        others.insert(agent, client.clone());
        Ok(client)
    }

    /// Closes every client, then destroys the sandbox (removes the
    /// container, stops the local process). Calling it again does nothing;
    /// after [`connect`](Self::connect) it only closes the clients.
    ///
    /// # Errors
    /// [`Error::Sandbox`] with step `destroy` (the engine refused or could
    /// not be reached; call again, or the provider's `cleanup(fleet)`).
    pub async fn destroy_sandbox(&self) -> Result<(), Error> {
        self.client.shutdown().await;
        for client in self.others.lock().await.values() {
            client.shutdown().await;
        }
        let mut sandbox = self.sandbox.lock().await;
        if let Some(running) = sandbox.as_mut() {
            running.destroy().await?;
        }
        *sandbox = None;
        Ok(())
    }
}

impl std::ops::Deref for SandboxAgent {
    type Target = SandboxAgentClient;

    fn deref(&self) -> &SandboxAgentClient {
        &self.client
    }
}

/// A session made by [`SandboxAgent::create_session`].
#[derive(Debug, Clone)]
pub struct Session {
    /// The session id.
    pub id: SessionId,
    /// The client of its agent.
    client: SandboxAgentClient,
}

impl Session {
    /// Sends `content` (text, or a `Vec<ContentBlock>`) and waits for the
    /// end of the turn: its stop reason (`EndTurn`, `Cancelled`, …).
    ///
    /// # Errors
    /// As [`SandboxAgentClient::prompt`].
    pub async fn prompt(&self, content: impl Into<PromptContent>) -> Result<StopReason, Error> {
        let request = PromptRequest::new(self.id.clone(), content.into().0);
        Ok(self.client.prompt(request).await?.stop_reason)
    }

    /// Sends `content` and streams the turn: its updates (message chunks,
    /// tool calls, permission requests, questions) as
    /// [`TurnEvent`](crate::TurnEvent)s, ending with `Stopped` (the stop reason) or
    /// `Failed`.
    pub fn prompt_stream(&self, content: impl Into<PromptContent>) -> TurnStream {
        self.client
            .prompt_stream(PromptRequest::new(self.id.clone(), content.into().0))
    }

    /// Cancels the running turn (`session/cancel`): it ends with stop
    /// reason `Cancelled`.
    ///
    /// # Errors
    /// As [`SandboxAgentClient::cancel`].
    pub async fn cancel(&self) -> Result<(), Error> {
        self.client.cancel(self.id.clone()).await
    }

    /// The client of the session's agent.
    pub fn client(&self) -> &SandboxAgentClient {
        &self.client
    }
}

/// What a prompt carries: from a `&str`/`String` (one text block) or a
/// `Vec<ContentBlock>`.
#[derive(Debug, Clone)]
pub struct PromptContent(Vec<ContentBlock>);

impl From<&str> for PromptContent {
    fn from(text: &str) -> PromptContent {
        PromptContent(vec![text.into()])
    }
}

impl From<String> for PromptContent {
    fn from(text: String) -> PromptContent {
        PromptContent(vec![text.into()])
    }
}

impl From<Vec<ContentBlock>> for PromptContent {
    fn from(blocks: Vec<ContentBlock>) -> PromptContent {
        PromptContent(blocks)
    }
}
