//! Routes around `/v2/rpc`: `GET /v2/health`, unknown routes (404), wrong
//! verbs (405) and the removed v1 API (410). DESIGN section 3 ("Errors"),
//! section 6; contract.md problem table.

use reqwest::Method;
use reqwest::header::CONTENT_TYPE;
use v2_api_tests::problem::problem_text;
use v2_api_tests::{Api, TestServer, assert_problem};

#[tokio::test]
async fn health_answers_status_ok_and_version() {
    let server = TestServer::start(&[]).await;
    let reply = server.health().await;
    reply.assert_status(200);
    assert!(
        reply
            .header("content-type")
            .is_some_and(|ct| ct.starts_with("application/json")),
        "{reply:?}"
    );
    let body = reply.json();
    assert_eq!(body["status"], "ok", "{reply:?}");
    assert!(
        body.get("version").is_some_and(|v| !v.is_null()),
        "{reply:?}"
    );
}

#[tokio::test]
async fn unknown_routes_are_404_not_found() {
    let server = TestServer::start(&[]).await;
    for (method, path) in [
        (Method::GET, "/"),
        (Method::GET, "/v2/nope"),
        (Method::POST, "/v2/rpcx"),
        (Method::GET, "/v2/rpc/extra"),
        (Method::GET, "/v3/rpc"),
    ] {
        let reply = Api::send(server.request(method.clone(), path)).await;
        let doc = assert_problem(&reply, 404, "not-found");
        assert!(doc.is_object(), "{method} {path}");
    }
}

#[tokio::test]
async fn wrong_verb_on_a_known_path_is_405_with_allow() {
    let server = TestServer::start(&[]).await;
    for method in [Method::PUT, Method::PATCH] {
        let reply = Api::send(
            server
                .request(method.clone(), "/v2/rpc")
                .header(CONTENT_TYPE, "application/json")
                .body("{}"),
        )
        .await;
        assert_problem(&reply, 405, "method-not-allowed");
        let allow = allowed_methods(reply.header("allow"));
        for verb in ["GET", "POST", "DELETE"] {
            assert!(
                allow.iter().any(|a| a == verb),
                "{method} /v2/rpc: Allow lacks {verb}: {reply:?}"
            );
        }
    }

    let reply = Api::send(server.request(Method::POST, "/v2/health")).await;
    assert_problem(&reply, 405, "method-not-allowed");
    let allow = allowed_methods(reply.header("allow"));
    assert!(
        allow.iter().any(|a| a == "GET"),
        "POST /v2/health: Allow lacks GET: {reply:?}"
    );
}

#[tokio::test]
async fn every_v1_path_is_410_gone() {
    let server = TestServer::start(&[]).await;
    for (method, path) in [
        (Method::GET, "/v1/health"),
        (Method::GET, "/v1/agents"),
        (Method::POST, "/v1/sessions"),
        (Method::POST, "/v1/sessions/abc/messages"),
        (Method::DELETE, "/v1/sessions/abc"),
        (Method::GET, "/v1/sessions/abc/events?offset=0"),
        (Method::POST, "/v1/rpc"),
    ] {
        let mut builder = server.request(method.clone(), path);
        if method == Method::POST {
            builder = builder.header(CONTENT_TYPE, "application/json").body("{}");
        }
        let reply = Api::send(builder).await;
        let doc = assert_problem(&reply, 410, "gone");
        assert!(
            problem_text(&doc).contains("/v2"),
            "{method} {path}: the problem should point to /v2: {reply:?}"
        );
    }
}

/// The comma-separated tokens of an `Allow` header, upper-cased.
fn allowed_methods(allow: Option<&str>) -> Vec<String> {
    allow
        .unwrap_or_default()
        .split(',')
        .map(|m| m.trim().to_ascii_uppercase())
        .filter(|m| !m.is_empty())
        .collect()
}
