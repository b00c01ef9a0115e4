//! `GET /metrics` (research/contract.md, "Metrics"): the real server
//! scraped over HTTP: the bearer token guards it unless `--metrics-public`,
//! Prometheus text by default and OpenMetrics when asked, and the counters
//! and histograms move with the prompt turns a client runs; then a real
//! Prometheus scrapes it and its query API reads the same numbers.

use reqwest::header::{ACCEPT, CONTENT_TYPE};
use serde_json::json;
use std::time::Duration;
use v2_api_tests::TestServer;
use v2_api_tests::prometheus::Prometheus;

const TOKEN: &str = "metrics-test-token";
const TURNS: usize = 3;

/// The value of the sample `series` (name and labels as written, e.g.
/// `x_total{a="b"}`), if the text has it.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}

/// `GET /metrics` with the server's token; the answer's body.
async fn scrape(server: &TestServer) -> String {
    let reply = server.get("/metrics").await;
    reply.assert_status(200);
    reply.text()
}

/// Runs [`TURNS`] turns on one new session; returns the connection and
/// the session id.
async fn run_turns(server: &TestServer) -> (String, String) {
    let conn = server.initialize("mock").await;
    let session = server.new_session(&conn).await;
    for turn in 0..TURNS {
        let answer = server
            .prompt(&conn, &session, json!(10 + turn), "!emit 3 16")
            .await;
        assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    }
    (conn, session)
}

#[tokio::test]
async fn metrics_need_the_token_and_move_with_turns() {
    let server = TestServer::start(&["--token", TOKEN]).await;
    let anonymous = server
        .http()
        .get(server.url("/metrics"))
        .send()
        .await
        .expect("GET /metrics");
    assert_eq!(anonymous.status(), 401, "no token, no metrics");

    let reply = server.get("/metrics").await;
    reply.assert_status(200);
    assert_eq!(
        reply.header("content-type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    let before = reply.text();
    assert!(!before.contains("# EOF"), "{before}");
    // Every family with no label, a fixed label set or the agent label;
    // `prompt_turns_total` and `agent_installs_total` appear with their
    // first turn and install (their labels are not known before).
    for name in [
        "http_requests_total",
        "http_request_duration_seconds",
        "acp_connections",
        "sessions",
        "prompt_turn_duration_seconds",
        "prompt_time_to_first_update_seconds",
        "permission_requests_pending",
        "agent_processes",
        "agent_restarts_total",
        "events_replayed_total",
        "stream_gaps_total",
        "store_queue_writes",
        "store_dropped_events_total",
        "store_write_duration_seconds",
        "fs_bytes_total",
        "processes",
    ] {
        assert!(
            before.contains(&format!("# HELP sandbox_agent_{name} ")),
            "sandbox_agent_{name} has no help text:\n{before}"
        );
    }

    let (conn, session) = run_turns(&server).await;
    let after = scrape(&server).await;
    assert!(
        after.contains("# TYPE sandbox_agent_prompt_turns_total counter"),
        "{after}"
    );
    let turns = r#"sandbox_agent_prompt_turns_total{agent="mock",stop_reason="end_turn"}"#;
    assert_eq!(sample(&after, turns), Some(TURNS as f64), "{after}");
    assert_eq!(
        sample(
            &after,
            r#"sandbox_agent_prompt_turn_duration_seconds_count{agent="mock"}"#
        ),
        Some(TURNS as f64),
        "{after}"
    );
    assert_eq!(
        sample(
            &after,
            r#"sandbox_agent_prompt_time_to_first_update_seconds_count{agent="mock"}"#
        ),
        Some(TURNS as f64),
        "each turn's first update is timed once: {after}"
    );
    assert_eq!(
        sample(&after, r#"sandbox_agent_sessions{state="live"}"#),
        Some(1.0),
        "{after}"
    );
    assert_eq!(
        sample(
            &after,
            r#"sandbox_agent_acp_connections{transport="v2_sse"}"#
        ),
        Some(1.0),
        "{after}"
    );
    assert_eq!(
        sample(&after, r#"sandbox_agent_agent_processes{agent="mock"}"#),
        Some(1.0),
        "{after}"
    );
    let posts = sample(
        &after,
        r#"sandbox_agent_http_requests_total{route="/v2/rpc",method="POST",status="200"}"#,
    )
    .unwrap_or(0.0);
    assert!(posts >= (2 + TURNS) as f64, "{after}");
    // Bounded labels: no session or connection id anywhere.
    assert!(!after.contains(&session), "{after}");
    assert!(!after.contains(&conn), "{after}");

    // OpenMetrics when the scraper names it, as Prometheus does.
    let open = server
        .request(reqwest::Method::GET, "/metrics")
        .header(
            ACCEPT,
            "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
        )
        .send()
        .await
        .expect("GET /metrics");
    assert_eq!(open.status(), 200);
    assert_eq!(
        open.headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
    let open = open.text().await.expect("metrics body");
    assert!(open.ends_with("# EOF\n"), "{open}");
    assert!(
        open.contains("# TYPE sandbox_agent_prompt_turns counter"),
        "{open}"
    );

    // Closing the connection lowers its gauge.
    server.delete(Some(&conn)).await.assert_status(204);
    let closed = scrape(&server).await;
    assert_eq!(
        sample(
            &closed,
            r#"sandbox_agent_acp_connections{transport="v2_sse"}"#
        ),
        Some(0.0),
        "{closed}"
    );
}

#[tokio::test]
async fn metrics_public_opens_only_metrics() {
    let server = TestServer::start(&["--token", TOKEN, "--metrics-public"]).await;
    let anonymous = |path: &str| server.http().get(server.url(path)).send();
    let metrics = anonymous("/metrics").await.expect("GET /metrics");
    assert_eq!(metrics.status(), 200);
    let agents = anonymous("/v2/agents").await.expect("GET /v2/agents");
    assert_eq!(agents.status(), 401, "only /metrics is public");
}

#[tokio::test]
async fn prometheus_scrapes_with_the_token() {
    let server = TestServer::start(&["--token", TOKEN]).await;
    let prometheus = Prometheus::scraping(server.addr(), TOKEN).await;
    run_turns(&server).await;
    let within = Duration::from_secs(30);
    let checks = [
        ("sum(sandbox_agent_prompt_turns_total)", TURNS as f64),
        (
            r#"sandbox_agent_prompt_turn_duration_seconds_count{agent="mock"}"#,
            TURNS as f64,
        ),
        (r#"sandbox_agent_sessions{state="live"}"#, 1.0),
    ];
    for (query, want) in checks {
        let got = prometheus.wait_for(query, want, within).await;
        assert_eq!(
            got,
            Some(want),
            "{query} as Prometheus read it; targets: {}",
            prometheus.targets().await
        );
    }
}

#[tokio::test]
async fn no_metrics_records_nothing_and_answers_404() {
    let server = TestServer::start(&["--token", TOKEN, "--no-metrics"]).await;
    run_turns(&server).await;
    let reply = server.get("/metrics").await;
    reply.assert_status(404);
    let problem = reply.json();
    assert_eq!(
        problem["type"], "urn:sandbox-agent:error:not-found",
        "{problem}"
    );
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("--no-metrics")),
        "{problem}"
    );
    // Everything else still answers.
    server.get("/v2/agents").await.assert_status(200);

    // A public endpoint for metrics that are off is a contradiction: refused.
    let (status, stderr) = v2_api_tests::server::start_up_outcome(
        &["--no-metrics", "--metrics-public"],
        Duration::from_secs(20),
    )
    .await
    .expect("the server must refuse to start");
    assert!(!status.success(), "{stderr}");
    assert!(stderr.contains("--metrics-public"), "{stderr}");
}

/// `sandbox_agent_sessions{state}` as the scrape shows it: live, dormant
/// and ended.
async fn session_gauges(server: &TestServer) -> [f64; 3] {
    let text = scrape(server).await;
    ["live", "dormant", "ended"].map(|state| {
        sample(
            &text,
            &format!("sandbox_agent_sessions{{state=\"{state}\"}}"),
        )
        .unwrap_or_else(|| panic!("no sessions gauge for {state}:\n{text}"))
    })
}

/// How many sessions `GET /v2/sessions?state=…` lists in each state (live,
/// dormant, ended), page after page.
async fn listed(server: &TestServer) -> [f64; 3] {
    let mut counts = [0.0; 3];
    for (slot, state) in ["live", "dormant", "ended"].iter().enumerate() {
        let mut cursor: Option<String> = None;
        loop {
            let mut path = format!("/v2/sessions?state={state}&limit=2");
            if let Some(cursor) = &cursor {
                path.push_str(&format!("&cursor={}", v2_api_tests::path_segment(cursor)));
            }
            let page = server.get_json(&path).await;
            counts[slot] += page["sessions"].as_array().expect("sessions").len() as f64;
            match page["nextCursor"].as_str() {
                Some(next) => cursor = Some(next.to_owned()),
                None => break,
            }
        }
    }
    counts
}

/// The sessions gauge counts what the control plane lists
/// (research/contract.md, "Metrics"): after a restart the stored sessions
/// are dormant (or ended) in both, listing them pages changes nothing,
/// and loading one moves it from dormant to live in both.
#[tokio::test]
async fn the_sessions_gauge_counts_what_the_listing_shows_across_a_restart() {
    let data = v2_api_tests::TempDir::new("metrics-dormant");
    let args = ["--token", TOKEN, "--data-dir", data.utf8()];
    let mut first = TestServer::start(&args).await;
    let conn = first.initialize("mock").await;
    let mut sessions = Vec::new();
    for _ in 0..4 {
        sessions.push(first.new_session(&conn).await);
    }
    let ended = first
        .rpc(
            &conn,
            9,
            "_sandboxagent/session/terminate",
            json!({"sessionId": sessions[3]}),
        )
        .await;
    assert!(ended.get("result").is_some(), "terminate: {ended}");
    assert_eq!(session_gauges(&first).await, [3.0, 0.0, 1.0]);
    assert_eq!(listed(&first).await, [3.0, 0.0, 1.0]);
    first.send_sigterm();
    first
        .wait_exit(Duration::from_secs(20))
        .await
        .expect("SIGTERM ends the server");
    drop(first);

    let second = TestServer::start(&args).await;
    assert_eq!(
        listed(&second).await,
        [0.0, 3.0, 1.0],
        "the live sessions come back dormant"
    );
    assert_eq!(
        session_gauges(&second).await,
        [0.0, 3.0, 1.0],
        "the gauge counts what the listing shows (and the listing read changed nothing)"
    );

    let conn = second.initialize("mock").await;
    let load = second
        .rpc(
            &conn,
            10,
            "session/load",
            json!({"sessionId": sessions[0], "cwd": "/tmp", "mcpServers": []}),
        )
        .await;
    assert!(load.get("result").is_some(), "session/load: {load}");
    assert_eq!(listed(&second).await, [1.0, 2.0, 1.0]);
    assert_eq!(session_gauges(&second).await, [1.0, 2.0, 1.0]);
    assert_eq!(
        listed(&second).await,
        session_gauges(&second).await,
        "a listing again changes nothing"
    );
}
