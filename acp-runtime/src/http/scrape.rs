//! `GET /metrics` (research/contract.md, "Metrics"): the server's metrics as
//! Prometheus text, or OpenMetrics text when `Accept` names
//! `application/openmetrics-text` (as Prometheus does). The bearer token
//! guards it like any `/v2` route unless `--metrics-public`
//! ([`super::route`]).

use super::body::{Body, full};
use super::headers;
use crate::metrics::prometheus_text;
use crate::protocol::{OPENMETRICS, OPENMETRICS_TEXT, PROMETHEUS_TEXT};
use crate::runtime::Runtime;
use bytes::Bytes;
use http::{HeaderMap, Response, StatusCode};

/// The answer to `GET /metrics`: 200 with every metric of the registry.
/// Its cost does not grow with the number of sessions or connections
/// (their gauges are counts kept as they change).
#[utoipa::path(
    get,
    path = "/metrics",
    summary = "The server's metrics.",
    operation_id = "metrics",
    tag = "server",
    description = "Prometheus text, or OpenMetrics text when `Accept` names `application/openmetrics-text`. Needs the token unless the server runs with `--metrics-public`. A server started with `--no-metrics` answers 404.",
    responses(
        (status = 200, description = "Every metric.",
            content((String = "text/plain"), (String = "application/openmetrics-text"))),
        (status = 401, response = super::problem::Problem),
        (status = 404, response = super::problem::Problem),
    )
)]
pub fn serve(runtime: &Runtime, request: &HeaderMap) -> Response<Body> {
    let mut text = String::new();
    // Writing to a String cannot fail; an encoder error would be a bug of
    // a metric, and a scrape answers with what was written.
    if let Err(error) = prometheus_client::encoding::text::encode(&mut text, &runtime.registry) {
        tracing::warn!(%error, "encoding the metrics failed");
    }
    if headers::names(request, OPENMETRICS) {
        full(StatusCode::OK, OPENMETRICS_TEXT, Bytes::from(text))
    } else {
        full(
            StatusCode::OK,
            PROMETHEUS_TEXT,
            Bytes::from(prometheus_text(&text)),
        )
    }
}
