//! `initialize` on no connection yet: the agent installed (research/contract.md,
//! "Agents: manifest, installs, lazy install") and started if needed, a
//! connection opened, the answer made from the agent's cached `initialize`
//! result.

use super::{Reply, Runtime};
use crate::agent::StartError;
use crate::agent::agent_process::AgentProcess;
use crate::error::Error;
use crate::inbound::Inbound;
use crate::memory::connection::{ClientCapabilities, Profile};
use crate::protocol::{self, method};
use bytes::Bytes;
use ext_methods::capability;
use serde_json::value::RawValue;
use std::sync::Arc;

/// How a connection about to be opened differs by the edge it came from.
#[derive(Debug, Clone, Copy, Default)]
pub struct Opening<'a> {
    /// The profile the connection is opened on.
    pub profile: Profile,
    /// The agent the client named by path (`/acp/{agent}`, or the server's
    /// `--default-agent` on a bare `/acp`): it stands in for
    /// `_meta["sandboxagent.dev"].agent` when `initialize` lacks it.
    pub agent: Option<&'a str>,
    /// The id the connection gets: a WebSocket announced it in its 101
    /// answer already. `None`: a fresh one.
    pub connection_id: Option<&'a str>,
}

impl Runtime {
    /// `initialize` without a connection: install (research/contract.md,
    /// "Agents: manifest, installs, lazy install") and start the agent if
    /// needed, open a connection, answer from the agent's cached `initialize`
    /// result.
    ///
    /// # Errors
    /// 400 when `message` is not `initialize` or names no agent, 404 for an
    /// unknown agent, 503 at the connection cap, and the start's problems
    /// ([`Runtime::ready_agent`]).
    pub(super) async fn open(
        self: &Arc<Self>,
        message: &Inbound<'_>,
        opening: Opening<'_>,
    ) -> Result<Reply, Error> {
        if !message.is_initialize() {
            return Err(Error::MissingConnectionId(
                " (only initialize may be sent without one)",
            ));
        }
        let envelope = &message.envelope;
        let client_id = envelope.id.unwrap_or(RawValue::NULL);
        let agent = protocol::meta_agent(envelope.params)
            .or_else(|| opening.agent.map(str::to_owned))
            .ok_or(Error::MissingAgent {
                method: method::INITIALIZE.to_owned(),
            })?;
        if !self.agents.is_known(&agent) {
            return Err(self.unknown_agent(agent));
        }
        if !self.connections.has_room() {
            return Err(Error::TooManyConnections {
                limit: self.config.max_connections,
            });
        }
        let process = match self.ready_agent(&agent, client_id).await? {
            Ok(process) => process,
            Err(rejected) => return Ok(rejected),
        };
        let capabilities = ClientCapabilities::from_initialize_params(envelope.params);
        let connection = match opening.connection_id {
            Some(id) => self.connections.open_as(
                id.into(),
                agent.as_str().into(),
                capabilities,
                opening.profile,
            )?,
            None => self
                .connections
                .open(agent.as_str().into(), capabilities, opening.profile)?,
        };
        tracing::info!(connection = %connection.id, agent, "connection opened");
        let result = self.initialize_result(&process);
        Ok(Reply::Json {
            body: Bytes::from(protocol::response_line(client_id, Some(&result), None)),
            connection_id: Some(connection.id.clone()),
            last_event_id: None,
        })
    }

    /// The running process of `agent`, started if needed. `Ok(Err(reply))`:
    /// the agent answered `initialize` with a JSON-RPC error, which is the
    /// answer to the client's request `client_id` (a 200; research/contract.md,
    /// "Transport: /v2/rpc", POST).
    ///
    /// # Errors
    /// The problem when the agent is unknown, not installed or cannot start.
    pub(super) async fn ready_agent(
        self: &Arc<Self>,
        agent: &str,
        client_id: &RawValue,
    ) -> Result<Result<Arc<AgentProcess>, Reply>, Error> {
        match self.agents.ensure_running(&self.routes, agent).await {
            Ok(process) => Ok(Ok(process)),
            Err(StartError::Rejected(error)) => Ok(Err(Reply::json(protocol::response_line(
                client_id,
                None,
                Some(&error),
            )))),
            Err(StartError::Unknown) => Err(self.unknown_agent(agent.to_owned())),
            Err(StartError::Failed(reason)) => Err(Error::AgentStartFailed {
                agent: agent.to_owned(),
                reason,
            }),
            Err(StartError::NotInstalled) => Err(Error::AgentNotInstalled {
                agent: agent.to_owned(),
                install_args: if crate::config::default_data_dir().as_ref()
                    == Some(&self.config.data_dir)
                {
                    String::new()
                } else {
                    format!(
                        " --data-dir {}",
                        shell_words::quote(&self.config.data_dir.to_string_lossy())
                    )
                },
            }),
            Err(StartError::Install(error)) => Err(Error::from_install(agent, error)),
        }
    }

    fn unknown_agent(&self, agent: String) -> Error {
        Error::UnknownAgent {
            agent,
            known: self.agents.known_ids(),
        }
    }

    /// The `initialize` result clients get: the agent's own, with the
    /// runtime's capability block at
    /// `agentCapabilities._meta["sandboxagent.dev"]` (research/contract.md,
    /// "Extension methods and control plane", the capability block).
    pub(super) fn initialize_result(&self, process: &AgentProcess) -> Box<RawValue> {
        let Some(raw) = process.initialize_result.lock().clone() else {
            return RawValue::NULL.to_owned();
        };
        let Ok(mut result) = serde_json::from_str::<serde_json::Value>(raw.get()) else {
            return raw;
        };
        if let Some(object) = result.as_object_mut() {
            object
                .entry("agentCapabilities")
                .or_insert_with(|| serde_json::json!({}));
        }
        let block = ext_methods::advertisement(
            super::ext::names(self),
            &[
                capability::SESSION_ENDED_NOTIFICATION,
                capability::AGENT_UNPARSED_NOTIFICATION,
                capability::STREAM_GAP_NOTIFICATION,
                capability::REQUEST_RESOLVED_NOTIFICATION,
                capability::TURN_INTERRUPTED_NOTIFICATION,
                capability::SESSION_AGENT_META,
                capability::SESSION_LIST_INVENTORY,
            ],
        );
        ext_methods::inject_advertisement(&mut result, block);
        protocol::raw(&result)
    }
}
