//! A sandbox from the image, one prompt to the mock agent, destroyed:
//! README.md's "Use it from Rust" example with the image, the fleet and
//! the prompt from outside. Needs the `docker` feature and a Docker engine
//! (Docker's socket, or `podman system service` with `DOCKER_HOST`).
//!
//! ```text
//! podman system service --time=0 unix:///tmp/podman.sock &
//! DOCKER_HOST=unix:///tmp/podman.sock SANDBOX_AGENT_IMAGE=localhost/sandbox-agent:latest \
//!     cargo run -p sandbox-agent-sdk --features docker --example docker_sandbox -- hello
//! ```
//!
//! `SANDBOX_AGENT_IMAGE` defaults to `sandbox-agent` (README.md, "Deploy
//! it"); `SANDBOX_AGENT_FLEET` labels the container with that fleet id
//! (else one is generated). It prints one line per step.

use sandbox_agent_sdk::docker::docker;
use sandbox_agent_sdk::{Error, SandboxAgent, SessionOptions, StartOptions};

#[tokio::main]
async fn main() -> Result<(), Error> {
    let image = std::env::var("SANDBOX_AGENT_IMAGE").unwrap_or_else(|_| "sandbox-agent".to_owned());
    let prompt = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "hello".to_owned());
    let mut provider = docker(image);
    if let Ok(fleet) = std::env::var("SANDBOX_AGENT_FLEET") {
        provider = provider.fleet(fleet);
    }

    let sdk = SandboxAgent::start(StartOptions::new("mock").sandbox(provider)).await?;
    println!(
        "started {} (fleet {}) at {}",
        sdk.sandbox_id().unwrap_or_default(),
        sdk.fleet().unwrap_or_default(),
        sdk.base_url()
    );
    let session = sdk.create_session(SessionOptions::default()).await?;
    println!("session {}", session.id);
    let outcome = session.prompt(prompt).await;
    // Destroyed whatever the prompt gave.
    sdk.destroy_sandbox().await?;
    println!("stop reason: {:?}", outcome?);
    println!("destroyed");
    Ok(())
}
