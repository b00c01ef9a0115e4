//! Requests the mock answers beyond ACP's v1 schema, as typed messages.

use agent_client_protocol::v1::schema::{SessionConfigValueId, SessionId};
use serde::{Deserialize, Serialize};

/// `session/set_model {sessionId, modelId}`: the model selector of agents
/// that predate config options. Not in the v1 schema.
#[derive(Debug, Clone, Serialize, Deserialize, agent_client_protocol::JsonRpcRequest)]
#[serde(rename_all = "camelCase")]
#[request(method = "session/set_model", response = SetModelResponse)]
pub(super) struct SetModelRequest {
    pub(super) session_id: SessionId,
    pub(super) model_id: SessionConfigValueId,
}

/// The result of `session/set_model`: `{}`.
#[derive(Debug, Clone, Serialize, Deserialize, agent_client_protocol::JsonRpcResponse)]
pub(super) struct SetModelResponse {}
