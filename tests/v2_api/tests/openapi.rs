//! The OpenAPI document (research/contract.md, "OpenAPI"): served at
//! `GET /v2/openapi.json` without a token, the same bytes as
//! `docs/openapi.json` and as `sandbox-agent openapi`; valid OpenAPI 3.1 by
//! `openapi-spec-validator`; and schemathesis, fuzzing a live server from
//! it, finds no 5xx, no undocumented status, no answer off its schema.
//!
//! The Python tools come from the virtual environment `scripts/test`
//! makes in `target/py` (pinned in `tests/v2_api/requirements.txt`).

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Instant;
use v2_api_tests::TestServer;
use v2_api_tests::server::{sandbox_agent_command, workspace_root};

const TOKEN: &str = "openapi-test-token";
/// Test cases schemathesis generates per operation in its fuzzing phase
/// (the coverage phase adds its own edge cases): the 23 operations run in
/// about 40 s on two loaded cores.
const EXAMPLES_PER_OPERATION: &str = "40";

/// The committed copy of the document.
fn committed_path() -> PathBuf {
    workspace_root().join("docs").join("openapi.json")
}

/// A program of the test's Python environment.
///
/// # Panics
/// When the environment is missing, naming the command that makes it.
fn python_tool(name: &str) -> PathBuf {
    let tool = workspace_root().join("target/py/bin").join(name);
    assert!(
        tool.is_file(),
        "{} is missing: run scripts/test once (it makes the Python environment target/py with the pinned tools of tests/v2_api/requirements.txt)",
        tool.display()
    );
    tool
}

/// Panics with the tool's output unless it exited 0.
fn assert_success(what: &str, output: &Output) {
    assert!(
        output.status.success(),
        "{what} failed ({}):\n--- stdout ---\n{}\n--- stderr ---\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test]
async fn served_document_is_public_and_matches_docs_openapi_json() {
    let server = TestServer::start(&["--token", TOKEN]).await;
    let reply = server
        .http()
        .get(server.url("/v2/openapi.json"))
        .send()
        .await
        .expect("GET /v2/openapi.json");
    assert_eq!(reply.status(), 200, "the document needs no token");
    assert_eq!(
        reply
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/json")
    );
    let served = reply.text().await.expect("document body");

    let printed = sandbox_agent_command()
        .arg("openapi")
        .output()
        .expect("run sandbox-agent openapi");
    assert_success("sandbox-agent openapi", &printed);
    assert_eq!(
        String::from_utf8_lossy(&printed.stdout),
        served,
        "`sandbox-agent openapi` prints the served document"
    );

    let committed = std::fs::read_to_string(committed_path()).unwrap_or_default();
    assert!(
        committed == served,
        "docs/openapi.json differs from the document the server serves; regenerate it with\n    cargo run -q -- openapi > docs/openapi.json\nand commit it"
    );

    let document: serde_json::Value = serde_json::from_str(&served).expect("JSON");
    assert_eq!(document["openapi"], "3.1.0");
    let paths = document["paths"].as_object().expect("paths");
    for path in [
        "/v2/health",
        "/v2/openapi.json",
        "/metrics",
        "/v2/agents",
        "/v2/agents/{agent}/install",
        "/v2/sessions",
        "/v2/sessions/{id}",
        "/v2/sessions/{id}/events",
        "/v2/fs/entries",
        "/v2/fs/stat",
        "/v2/fs/mkdir",
        "/v2/fs/move",
        "/v2/fs/entry",
        "/v2/fs/file",
        "/v2/fs/upload-batch",
        "/v2/processes",
        "/v2/processes/run",
        "/v2/processes/{id}",
        "/v2/processes/{id}/output",
        "/v2/processes/{id}/input",
        "/v2/processes/{id}/signal",
        "/v2/processes/{id}/resize",
    ] {
        assert!(paths.contains_key(path), "{path} is documented");
    }
    for transport in ["/v2/rpc", "/acp", "/ui"] {
        assert!(
            !paths.contains_key(transport),
            "{transport} is not plain HTTP"
        );
    }
    // Every operation but the two public ones needs the bearer token, and
    // every operation documents its errors as problem+json.
    assert_eq!(document["security"], serde_json::json!([{"bearer": []}]));
    for (path, item) in paths {
        for (method, operation) in item.as_object().expect("path item") {
            let public = path == "/v2/health" || path == "/v2/openapi.json";
            let responses = operation["responses"].as_object().expect("responses");
            assert_eq!(
                responses.contains_key("401"),
                !public,
                "{method} {path}: 401 documented exactly when a token guards it"
            );
            for (status, response) in responses {
                if status.starts_with('4') || status.starts_with('5') {
                    assert_eq!(
                        response["$ref"], "#/components/responses/Problem",
                        "{method} {path} {status}"
                    );
                }
            }
        }
    }
}

#[test]
fn document_is_valid_openapi_3_1() {
    let validator = python_tool("openapi-spec-validator");
    let output = Command::new(validator)
        .arg(committed_path())
        .output()
        .expect("run openapi-spec-validator");
    assert_success("openapi-spec-validator docs/openapi.json", &output);
}

#[tokio::test]
async fn schemathesis_finds_nothing_on_a_live_server() {
    let schemathesis = python_tool("schemathesis");
    // The file system API confined to an empty directory of its own, the
    // process API off: random input touches nothing of the host. The
    // server runs in that directory (`env -C`), so relative paths land in
    // it and the fuzzer reaches the operations' successes too.
    let root = tempfile_dir();
    let root_arg = root.to_str().expect("UTF-8 path");
    let server = TestServer::start_via(
        &["env", "-C", root_arg],
        &["--token", TOKEN, "--fs-root", root_arg, "--no-processes"],
        &[],
    )
    .await;
    let started = Instant::now();
    let output = tokio::process::Command::new(schemathesis)
        .arg("run")
        .arg(server.url("/v2/openapi.json"))
        .args(["--header", &format!("Authorization: Bearer {TOKEN}")])
        .args([
            "--checks",
            "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance",
        ])
        // Installs reach the network and write the agent cache.
        .args(["--exclude-path-regex", "/install$"])
        .args(["--max-examples", EXAMPLES_PER_OPERATION])
        .args(["--phases", "examples,coverage,fuzzing"])
        .args(["--seed", "1"])
        // One worker: with two, hypothesis (inside schemathesis) once failed
        // on its own cache ("AST constructor recursion depth mismatch").
        .args(["--workers", "1"])
        .args(["--request-timeout", "30"])
        .env("NO_COLOR", "1")
        .env(
            "SCHEMATHESIS_HOOKS",
            workspace_root().join("tests/v2_api/schemathesis_hooks.py"),
        )
        .current_dir(&root)
        .kill_on_drop(true)
        .output()
        .await
        .expect("run schemathesis");
    println!("schemathesis took {:?}", started.elapsed());
    assert_success("schemathesis", &output);
    let _ = std::fs::remove_dir_all(&root);
}

/// A new empty directory under the system's temporary directory.
fn tempfile_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "openapi-fuzz-{}-{}",
        std::process::id(),
        fastrand::u64(..)
    ));
    std::fs::create_dir_all(&dir).expect("create the fs root");
    dir
}
