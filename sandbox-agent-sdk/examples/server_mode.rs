//! Server mode: a client of a running `sandbox-agent server` with a token.
//! Checks the server, lists its agents, runs one turn and reports errors by
//! kind.
//!
//! ```text
//! sandbox-agent server --port 2468 --token secret &
//! SANDBOX_AGENT_URL=http://127.0.0.1:2468 SANDBOX_AGENT_TOKEN=secret \
//!     cargo run -p sandbox-agent-sdk --example server_mode -- hello
//! ```

use sandbox_agent_sdk::schema::{NewSessionRequest, PromptRequest};
use sandbox_agent_sdk::{ClientOptions, Error, Mode, SandboxAgentClient, StreamExt, TurnEvent};
use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let url =
        std::env::var("SANDBOX_AGENT_URL").unwrap_or_else(|_| "http://127.0.0.1:2468".to_owned());
    let mut options = ClientOptions::new("mock")
        .base_url(&url)
        .mode(Mode::Server)
        .request_timeout(Duration::from_secs(120));
    if let Ok(token) = std::env::var("SANDBOX_AGENT_TOKEN") {
        options = options.token(token);
    }
    let client = match SandboxAgentClient::connect(options).await {
        Ok(client) => client,
        Err(error) if error.is_connection_lost() => {
            eprintln!("nothing answers at {url}: start `sandbox-agent server` first ({error})");
            return Err(error);
        }
        Err(error) if error.is_unauthorized() => {
            eprintln!("the server refused the token: set SANDBOX_AGENT_TOKEN ({error})");
            return Err(error);
        }
        Err(error) => return Err(error),
    };
    let health = client.health().await?;
    println!(
        "server {} ({})",
        url,
        health.version.as_deref().unwrap_or("?")
    );
    for agent in client.agents().await? {
        println!("agent {:<12} installed: {}", agent.id, agent.installed);
    }

    let text = std::env::args().skip(1).collect::<Vec<_>>().join(" ");
    let text = if text.is_empty() {
        "hello".to_owned()
    } else {
        text
    };
    let session = client.new_session(NewSessionRequest::new("/tmp")).await?;
    let mut turn = client.prompt_stream(PromptRequest::new(
        session.session_id.clone(),
        vec![text.into()],
    ));
    while let Some(event) = turn.next().await {
        match event {
            TurnEvent::MessageChunk(_) => print!("{}", event.text().unwrap_or_default()),
            TurnEvent::Stopped(done) => println!("\n[{:?}]", done.stop_reason),
            TurnEvent::Failed(error) if error.is_timeout() => {
                eprintln!("the turn took too long and was cancelled");
                return Err(error);
            }
            TurnEvent::Failed(error) => return Err(error),
            _ => {}
        }
    }
    // The session lives on on the server; the connection closes here.
    client.close().await
}
