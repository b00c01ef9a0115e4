//! A private Prometheus server (Debian's `prometheus` package) scraping a
//! test server with its bearer token: a temporary directory for its
//! configuration and data, its own port, a scrape every second. Stopped
//! and removed on drop.

use crate::TempDir;
use serde_json::Value;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running Prometheus.
pub struct Prometheus {
    child: Child,
    /// Its HTTP API, `http://127.0.0.1:PORT`.
    base_url: String,
    http: reqwest::Client,
    _dir: TempDir,
}

/// A free local port (bound, then released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free local port")
        .port()
}

impl Prometheus {
    /// Starts Prometheus scraping `target` (`host:port`) at `/metrics`
    /// every second with `Authorization: Bearer <token>`.
    ///
    /// # Panics
    /// When `prometheus` is not installed (the message says how to install
    /// it) or does not become ready within 30 s.
    pub async fn scraping(target: &str, token: &str) -> Prometheus {
        let program = std::env::var("PROMETHEUS").unwrap_or_else(|_| "prometheus".to_owned());
        let installed = Command::new(&program)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        assert!(
            installed,
            "{program} not found: install Debian's package (`apt-get install prometheus`, as \
             scripts/test does) or set PROMETHEUS to its path"
        );
        let dir = TempDir::new("prometheus");
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
                 scrape_configs:\n  - job_name: sandbox-agent\n    \
                 authorization:\n      credentials: {token}\n    \
                 static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .expect("write prometheus.yml");
        let port = free_port();
        let child = Command::new(&program)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn prometheus");
        let prometheus = Prometheus {
            child,
            base_url: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::new(),
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = prometheus
                .http
                .get(format!("{}/-/ready", prometheus.base_url))
                .send()
                .await
                .is_ok_and(|response| response.status().is_success());
            if ready {
                return prometheus;
            }
            assert!(
                Instant::now() < deadline,
                "prometheus not ready within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The value of the instant query `query` (`/api/v1/query`): its one
    /// sample's value, `None` while the result is empty.
    ///
    /// # Panics
    /// When the API answers with an error or more than one sample.
    pub async fn value(&self, query: &str) -> Option<f64> {
        let body: Value = self
            .http
            .get(format!(
                "{}/api/v1/query?query={}",
                self.base_url,
                crate::path_segment(query)
            ))
            .send()
            .await
            .expect("query prometheus")
            .json()
            .await
            .expect("prometheus answers JSON");
        assert_eq!(body["status"], "success", "{query}: {body}");
        let result = body["data"]["result"].as_array().expect("a vector");
        assert!(result.len() <= 1, "{query}: more than one sample: {body}");
        result.first().map(|sample| {
            sample["value"][1]
                .as_str()
                .and_then(|v| v.parse().ok())
                .expect("a numeric value")
        })
    }

    /// Waits up to `within` for `query` to have the value `want`; returns
    /// the last value seen.
    pub async fn wait_for(&self, query: &str, want: f64, within: Duration) -> Option<f64> {
        let deadline = Instant::now() + within;
        loop {
            let value = self.value(query).await;
            if value == Some(want) || Instant::now() >= deadline {
                return value;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Whether the scrape target is up (`up == 1`) with the last error, from
    /// `/api/v1/targets` (for failure messages).
    pub async fn targets(&self) -> Value {
        self.http
            .get(format!("{}/api/v1/targets", self.base_url))
            .send()
            .await
            .expect("prometheus targets")
            .json()
            .await
            .expect("prometheus answers JSON")
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
