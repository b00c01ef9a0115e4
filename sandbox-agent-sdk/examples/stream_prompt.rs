//! An embedded server, one session, one prompt turn streamed as it runs,
//! with the agent's permission request answered on the way.
//!
//! ```text
//! cargo build -p sandbox-agent
//! cargo run -p sandbox-agent-sdk --example stream_prompt -- "please ask permission"
//! ```
//!
//! The `sandbox-agent` binary is found next to the example (cargo's
//! `target/debug`), or set `SANDBOX_AGENT_BIN`. The agent is the built-in
//! `mock`; name another with `AGENT=codex`.

use sandbox_agent_sdk::schema::{NewSessionRequest, PromptRequest};
use sandbox_agent_sdk::{
    ClientOptions, Error, PermissionDecision, SandboxAgentClient, StreamExt, TurnEvent,
};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let text = std::env::args().skip(1).collect::<Vec<_>>().join(" ");
    let text = if text.is_empty() {
        "please ask permission".to_owned()
    } else {
        text
    };
    let agent = std::env::var("AGENT").unwrap_or_else(|_| "mock".to_owned());

    // No base URL: start a private server, stopped by `shutdown` (or drop).
    let client = SandboxAgentClient::connect(ClientOptions::new(agent)).await?;
    let session = client.new_session(NewSessionRequest::new("/tmp")).await?;

    let mut turn = client.prompt_stream(PromptRequest::new(
        session.session_id.clone(),
        vec![text.into()],
    ));
    let mut outcome = Ok(());
    while let Some(event) = turn.next().await {
        match event {
            TurnEvent::MessageChunk(_) => print!("{}", event.text().unwrap_or_default()),
            TurnEvent::ThoughtChunk(_) => eprintln!("[thinking]"),
            TurnEvent::ToolCall(call) => eprintln!("[tool] {} ({:?})", call.title, call.status),
            TurnEvent::ToolCallUpdate(update) => {
                eprintln!("[tool {}] {:?}", update.tool_call_id, update.fields.status);
            }
            TurnEvent::PermissionRequest(request) => {
                eprintln!("[permission] allowing: {}", request.title());
                request.decide(PermissionDecision::Allow)?;
            }
            TurnEvent::Stopped(done) => println!("\n[stop reason: {:?}]", done.stop_reason),
            TurnEvent::Failed(error) => outcome = Err(error),
            _ => {}
        }
    }
    client.shutdown().await;
    outcome
}
