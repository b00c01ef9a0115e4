//! Two ways to answer the agent's permission requests: a handler (a
//! policy for every request), and by hand from the client-wide event
//! stream while `prompt` runs.
//!
//! ```text
//! cargo build -p sandbox-agent
//! cargo run -p sandbox-agent-sdk --example permissions
//! ```

use sandbox_agent_sdk::schema::{NewSessionRequest, PromptRequest, PromptResponse};
use sandbox_agent_sdk::{
    ClientOptions, Error, Event, PermissionDecision, SandboxAgentClient, StreamExt,
};

#[tokio::main]
async fn main() -> Result<(), Error> {
    // 1. A handler answers every request; no event reading needed.
    let options = ClientOptions::new("mock").permission_handler(|request| async move {
        eprintln!("[handler] rejecting: {:?}", request.tool_call.fields.title);
        PermissionDecision::Reject
    });
    let client = SandboxAgentClient::connect(options).await?;
    let session = client.new_session(NewSessionRequest::new("/tmp")).await?;
    let done = client
        .prompt(PromptRequest::new(
            session.session_id.clone(),
            vec!["please ask permission".into()],
        ))
        .await?;
    println!("with a handler: {:?}", done.stop_reason);
    client.shutdown().await;

    // 2. No handler: the request arrives on `Events`. Read it while the
    //    prompt runs (here with `select!`); one left unread for
    //    `unread_permission_timeout` (30 s) is answered "cancelled".
    let client = SandboxAgentClient::connect(ClientOptions::new("mock")).await?;
    let Some(mut events) = client.take_events() else {
        return Ok(());
    };
    let session = client.new_session(NewSessionRequest::new("/tmp")).await?;
    let prompt = client.prompt(PromptRequest::new(
        session.session_id.clone(),
        vec!["please ask permission".into()],
    ));
    tokio::pin!(prompt);
    let done: PromptResponse = loop {
        tokio::select! {
            result = &mut prompt => break result?,
            Some(event) = events.next() => {
                if let Event::PermissionRequest(request) = event {
                    for option in &request.request().options {
                        eprintln!("[offered] {} ({:?})", option.name, option.kind);
                    }
                    eprintln!("[by hand] allowing: {}", request.title());
                    request.decide(PermissionDecision::Allow)?;
                }
            }
        }
    };
    println!("answered by hand: {:?}", done.stop_reason);
    client.shutdown().await;
    Ok(())
}
