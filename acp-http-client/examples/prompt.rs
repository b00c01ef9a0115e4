//! Prompts an agent on a running sandbox-agent server through typed ACP and
//! prints the agent's reply as it streams in.
//!
//! ```sh
//! sandbox-agent server --no-token            # in another terminal
//! cargo run -p acp-http-client --example prompt -- \
//!     --url http://127.0.0.1:2468 [--token T] [--agent mock] "hello"
//! ```
//!
//! Permission requests (`session/request_permission`) are answered with the
//! first option that allows the operation (`allow_once` or
//! `allow_always`), and the choice is reported on stderr. Try the prompt
//! "please ask permission" with the mock agent.
//!
//! The library knows nothing about sandbox-agent; this example does: it
//! names the agent in `_meta["sandboxagent.dev"]` of `initialize` and
//! `session/new`, which is how that server picks the agent to run.

use acp_http_client::{HttpTransport, TransportOptions, http_failure};
use agent_client_protocol::Client;
use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    ContentBlock, ContentChunk, Implementation, InitializeRequest, NewSessionRequest,
    PermissionOptionKind, PromptRequest, RequestPermissionOutcome, RequestPermissionRequest,
    RequestPermissionResponse, SelectedPermissionOutcome, SessionNotification, SessionUpdate,
};
use clap::Parser;
use std::io::Write;
use std::process::ExitCode;

/// The `_meta` key sandbox-agent reads the agent id from.
const SANDBOX_AGENT_META: &str = "sandboxagent.dev";

#[derive(Parser)]
#[command(about = "Prompt an ACP agent on a sandbox-agent server and print the streamed reply")]
struct Args {
    /// Base URL of the server.
    #[arg(long, default_value = "http://127.0.0.1:2468")]
    url: String,
    /// Bearer token, if the server was started with one.
    #[arg(long, env = "SANDBOX_AGENT_TOKEN")]
    token: Option<String>,
    /// Agent id on the server.
    #[arg(long, default_value = "mock")]
    agent: String,
    /// The prompt text (several words are joined with spaces).
    #[arg(required = true)]
    prompt: Vec<String>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let mut options = TransportOptions::new(&args.url)?;
    if let Some(token) = &args.token {
        options = options.token(token);
    }
    let transport = HttpTransport::new(options)?;
    let meta = serde_json::json!({ SANDBOX_AGENT_META: { "agent": args.agent } });
    let meta = meta.as_object().cloned();
    let prompt = args.prompt.join(" ");

    let result = Client
        .v1()
        .name("acp-http-client-example")
        .on_receive_notification(
            {
                async move |notification: SessionNotification, _cx| {
                    if let SessionUpdate::AgentMessageChunk(ContentChunk {
                        content: ContentBlock::Text(text),
                        ..
                    }) = notification.update
                    {
                        let mut stdout = std::io::stdout().lock();
                        let _ = write!(stdout, "{}", text.text);
                        let _ = stdout.flush();
                    }
                    Ok(())
                }
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .on_receive_request(
            async |request: RequestPermissionRequest, responder, _cx| {
                let allow = request.options.iter().find(|option| {
                    matches!(
                        option.kind,
                        PermissionOptionKind::AllowOnce | PermissionOptionKind::AllowAlways
                    )
                });
                let what = request
                    .tool_call
                    .fields
                    .title
                    .as_deref()
                    .unwrap_or("a tool call");
                let outcome = match allow {
                    Some(option) => {
                        eprintln!("[permission] {what}: allowing with \"{}\"", option.name);
                        RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(
                            option.option_id.clone(),
                        ))
                    }
                    None => {
                        eprintln!("[permission] {what}: no allow option, cancelling");
                        RequestPermissionOutcome::Cancelled
                    }
                };
                responder.respond(RequestPermissionResponse::new(outcome))
            },
            agent_client_protocol::on_receive_request!(),
        )
        .connect_with(transport, async |cx| {
            let init = InitializeRequest::new(ProtocolVersion::V1)
                .client_info(Implementation::new(
                    "acp-http-client-example",
                    env!("CARGO_PKG_VERSION"),
                ))
                .meta(meta.clone());
            let init = cx.send_request(init).block_task().await?;
            if let Some(agent) = init.agent_info {
                eprintln!("[agent] {} {}", agent.name, agent.version);
            }
            let cwd = std::env::current_dir().unwrap_or_else(|_| "/".into());
            let session = cx
                .send_request(NewSessionRequest::new(cwd).meta(meta))
                .block_task()
                .await?;
            let done = cx
                .send_request(PromptRequest::new(session.session_id, vec![prompt.into()]))
                .block_task()
                .await?;
            println!();
            eprintln!("[stop reason] {:?}", done.stop_reason);
            Ok(())
        })
        .await;

    if let Err(error) = result {
        if let Some(failure) = http_failure(&error) {
            let detail = failure
                .problem
                .and_then(|problem| problem.detail.or(problem.title))
                .unwrap_or_default();
            return Err(format!("the server answered {}: {detail}", failure.status).into());
        }
        return Err(error.message.into());
    }
    Ok(())
}
