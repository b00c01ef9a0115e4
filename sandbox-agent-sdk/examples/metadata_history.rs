//! Session metadata (typed builder and `json!`), the inventory, and a
//! session's recorded event history, page by page.
//!
//! ```text
//! cargo build -p sandbox-agent
//! cargo run -p sandbox-agent-sdk --example metadata_history
//! ```

use sandbox_agent_sdk::schema::{NewSessionRequest, PromptRequest};
use sandbox_agent_sdk::{ClientOptions, Error, Metadata, SandboxAgentClient, sandbox_meta};
use serde_json::json;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let client = SandboxAgentClient::connect(ClientOptions::new("mock")).await?;

    // Metadata at creation, with the typed builder.
    let metadata = Metadata::new()
        .title("Fix the login bug")
        .set("labels", json!({"team": "infra"}));
    let session = client
        .new_session(NewSessionRequest::new("/tmp").meta(sandbox_meta(metadata)))
        .await?;
    let id = session.session_id.clone();
    if let Some(meta) = &session.meta {
        // The wire's RFC 3339 text, and the same as a `SystemTime`.
        let age = meta
            .created_time()
            .and_then(|created| created.elapsed().ok())
            .unwrap_or_default();
        println!(
            "created {id} for agent {} at {} ({age:?} ago)",
            meta.agent, meta.created_at
        );
    }

    // Later changes, straight from `json!` (JSON Merge Patch: null removes).
    let entry = client
        .set_metadata(
            id.clone(),
            json!({"ticket": "ENG-42", "labels": {"priority": "high"}}),
        )
        .await?;
    if let Some(meta) = &entry.meta {
        println!("title {:?}, extra {}", meta.title, json!(meta.extra));
    }

    client
        .prompt(PromptRequest::new(id.clone(), vec!["hello".into()]))
        .await?;

    // The inventory, without a connection.
    client.close().await?;
    for entry in client.all_sessions().await? {
        println!("session {} {:?}", entry.session_id, entry.title);
    }
    let entry = client.get_session(id.clone()).await?;
    println!(
        "events recorded: {:?}",
        entry.meta.map(|meta| meta.event_count)
    );

    // The history, page by page, until the end marker.
    let mut offset = Some(0);
    while let Some(from) = offset {
        let page = client.session_events(id.clone(), from, Some(5)).await?;
        for event in &page.events {
            let method = event.message.get("method").and_then(|m| m.as_str());
            println!(
                "#{:<3} {:?} {}",
                event.offset,
                event.direction,
                method.unwrap_or("(answer)")
            );
        }
        offset = page.next_offset;
    }
    client.shutdown().await;
    Ok(())
}
