//! The agent's request and notification handlers, in dispatch order, and
//! the methods outside the v1 schema they answer.

use std::sync::Arc;

use agent_client_protocol::v1::schema::{
    AuthenticateRequest, CancelNotification, ForkSessionRequest, InitializeRequest,
    ListSessionsRequest, LoadSessionRequest, NewSessionRequest, PromptRequest,
    ResumeSessionRequest, SetSessionConfigOptionRequest, SetSessionModeRequest,
};
use agent_client_protocol::v1::{self, Responder};
use agent_client_protocol::{
    Agent, Client, HandleDispatchFrom, on_receive_notification, on_receive_request,
};
use serde::{Deserialize, Serialize};

use super::agent::{AGENT_NAME, ASK_AUTH_METHOD, MockAgent};
use super::methods::SetModelRequest;

/// Every request and notification handler of the agent, in dispatch order;
/// each body is one call into [`MockAgent`].
///
/// One builder chain in one non-generic function on purpose: a chain split
/// across functions that take and return `impl HandleDispatchFrom` names
/// every closure after the whole chain so far, and the debug info of those
/// type names grew the debug binary to 3.5 GB.
pub(super) fn handlers(
    agent: &Arc<MockAgent>,
) -> v1::Builder<Agent, impl HandleDispatchFrom<Client>> {
    Agent
        .v1()
        .name(AGENT_NAME)
        .on_receive_request(
            {
                let agent = agent.clone();
                async move |request: InitializeRequest, responder: Responder<_>, _cx| {
                    responder.respond(agent.initialize(&request))?;
                    // The SDK counts the connection as initialized only once its
                    // outgoing side has taken this answer. Yield (holding the
                    // dispatch loop) so that happens before the next message is
                    // dispatched: a client that does not wait for the answer
                    // (`printf ... | sandbox-agent mock-agent`) is not refused.
                    tokio::task::yield_now().await;
                    Ok(())
                }
            },
            on_receive_request!(),
        )
        .on_receive_request(
            {
                let agent = agent.clone();
                async move |request: AuthenticateRequest, responder: Responder<_>, cx| {
                    if *request.method_id.0 == *ASK_AUTH_METHOD {
                        // Answered once the client answers the question: in a
                        // task of its own, so the dispatch loop stays free.
                        let task = agent.clone().ask_sign_in(responder, cx.clone());
                        return cx.spawn(task);
                    }
                    responder.respond_with_result(agent.authenticate(&request))
                }
            },
            on_receive_request!(),
        )
        .on_receive_request(
            {
                let agent = agent.clone();
                async move |request: NewSessionRequest, responder: Responder<_>, cx| {
                    responder.respond_with_result(agent.new_session(request, &cx))
                }
            },
            on_receive_request!(),
        )
        .on_receive_request(
            {
                let agent = agent.clone();
                async move |request: LoadSessionRequest, responder: Responder<_>, cx| {
                    responder.respond_with_result(agent.load_session(&request, &cx))
                }
            },
            on_receive_request!(),
        )
        .on_receive_request(
            {
                let agent = agent.clone();
                async move |request: ResumeSessionRequest, responder: Responder<_>, _cx| {
                    responder.respond_with_result(agent.resume_session(&request))
                }
            },
            on_receive_request!(),
        )
        .on_receive_request(
            {
                let agent = agent.clone();
                async move |request: ForkSessionRequest, responder: Responder<_>, _cx| {
                    responder.respond_with_result(agent.fork_session(request))
                }
            },
            on_receive_request!(),
        )
        .on_receive_request(
            {
                let agent = agent.clone();
                async move |request: ListSessionsRequest, responder: Responder<_>, _cx| {
                    responder.respond(agent.list_sessions(&request))
                }
            },
            on_receive_request!(),
        )
        .on_receive_request(
            {
                let agent = agent.clone();
                async move |request: SetSessionModeRequest, responder: Responder<_>, cx| {
                    responder.respond_with_result(agent.set_mode(&request, &cx))
                }
            },
            on_receive_request!(),
        )
        .on_receive_request(
            {
                let agent = agent.clone();
                async move |request: SetSessionConfigOptionRequest, responder: Responder<_>, _cx| {
                    responder.respond_with_result(agent.set_config_option(&request))
                }
            },
            on_receive_request!(),
        )
        .on_receive_request(
            {
                let agent = agent.clone();
                async move |request: SetModelRequest, responder: Responder<_>, _cx| {
                    responder.respond_with_result(agent.set_model(&request))
                }
            },
            on_receive_request!(),
        )
        .on_receive_request(
            async move |request: EchoRequest, responder: Responder<_>, _cx| {
                responder.respond(EchoResponse(request.0))
            },
            on_receive_request!(),
        )
        .on_receive_request(
            {
                let agent = agent.clone();
                async move |request: PromptRequest, responder: Responder<_>, cx| {
                    agent.start_turn(request, responder, cx)
                }
            },
            on_receive_request!(),
        )
        .on_receive_notification(
            {
                let agent = agent.clone();
                async move |notification: CancelNotification, _cx| {
                    agent.cancel_turn(&notification.session_id);
                    Ok(())
                }
            },
            on_receive_notification!(),
        )
}

/// `_mock/echo`: any params, answered as the result (the `roundtrip` benchmark).
#[derive(Debug, Clone, Serialize, Deserialize, agent_client_protocol::JsonRpcRequest)]
#[request(method = "_mock/echo", response = EchoResponse)]
struct EchoRequest(serde_json::Value);

/// The result of `_mock/echo`: the request's params.
#[derive(Debug, Clone, Serialize, Deserialize, agent_client_protocol::JsonRpcResponse)]
struct EchoResponse(serde_json::Value);
