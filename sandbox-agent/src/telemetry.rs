//! The server's logging and trace export: log lines to stderr (text or
//! JSON), and, when the standard OpenTelemetry variables ask for it, the
//! runtime's spans over OTLP/HTTP with protobuf bodies
//! (research/contract.md, "Logs" and "Traces").
//!
//! Spans go out in batches from the SDK's own thread; [`Traces::shutdown`]
//! sends what is left and must run once the server has stopped, outside the
//! async runtime (it blocks until the receiver answered or the export
//! timed out).

use crate::commands::server::LogFormat;
use acp_runtime::spans::TARGET;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{BatchSpanProcessor, SdkTracerProvider};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{EnvFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// The service name spans carry without `OTEL_SERVICE_NAME`.
const DEFAULT_SERVICE_NAME: &str = "sandbox-agent";

/// Whether the environment turns trace export on (the OpenTelemetry SDK
/// environment variables specification): an OTLP endpoint is set
/// (`OTEL_EXPORTER_OTLP_ENDPOINT`, or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`),
/// `OTEL_TRACES_EXPORTER` is unset or lists `otlp`, and `OTEL_SDK_DISABLED`
/// is not `true`. `Err` says why a set variable was not followed.
fn wanted(var: impl Fn(&str) -> Option<String>) -> Result<bool, String> {
    if var("OTEL_SDK_DISABLED").is_some_and(|value| value.eq_ignore_ascii_case("true")) {
        return Ok(false);
    }
    let endpoints = [
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ];
    if !endpoints.iter().any(|name| var(name).is_some()) {
        return Ok(false);
    }
    // A user or password in the URL would reach the HTTP client's debug
    // logs (they print the authority): refused, naming the variable and
    // never its value (research/contract.md, "Traces").
    if let Some(name) = endpoints
        .iter()
        .find(|name| var(name).is_some_and(|url| has_userinfo(&url)))
    {
        return Err(format!(
            "{name} has a user or password in its URL: give the collector's credentials in OTEL_EXPORTER_OTLP_HEADERS instead; traces are off"
        ));
    }
    match var("OTEL_TRACES_EXPORTER") {
        None => Ok(true),
        Some(exporters) if exporters.split(',').any(|e| e.trim() == "otlp") => Ok(true),
        Some(exporters) if exporters.trim() == "none" => Ok(false),
        Some(exporters) => Err(format!(
            "OTEL_TRACES_EXPORTER={exporters}: only `otlp` and `none` are supported; traces are off"
        )),
    }
}

/// Whether `url` has userinfo (`user:password@`) in its authority, the
/// part between `scheme://` and the first `/`, `?` or `#`.
fn has_userinfo(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    authority.contains('@')
}

/// A variable of the process environment; an empty one counts as unset.
fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.is_empty())
}

/// Trace export, while it is on.
pub(crate) struct Traces {
    provider: SdkTracerProvider,
}

impl Traces {
    /// The exporter the environment asks for (see [`wanted`]); `Ok(None)`
    /// when it asks for none. The endpoint, headers and timeout come from
    /// the `OTEL_EXPORTER_OTLP_*` variables, the batch sizes and delay from
    /// `OTEL_BSP_*`, the service name from `OTEL_SERVICE_NAME`
    /// (default `sandbox-agent`). Sets W3C trace context as the global
    /// propagator, which the runtime reads `traceparent` with.
    ///
    /// # Errors
    /// A message for the log: a variable that was not followed, or an
    /// exporter that could not be built (traces are then off).
    pub(crate) fn from_env() -> Result<Option<Self>, String> {
        if !wanted(env_var)? {
            return Ok(None);
        }
        let protocol = env_var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            .or_else(|| env_var("OTEL_EXPORTER_OTLP_PROTOCOL"));
        if let Some(protocol) = protocol.filter(|protocol| protocol != "http/protobuf") {
            return Err(format!(
                "OTLP protocol {protocol}: only http/protobuf is supported; traces are off"
            ));
        }
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .build()
            .map_err(|error| format!("cannot export traces: {error}"))?;
        let service_name =
            env_var("OTEL_SERVICE_NAME").unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_owned());
        let provider = SdkTracerProvider::builder()
            .with_span_processor(BatchSpanProcessor::builder(exporter).build())
            .with_resource(Resource::builder().with_service_name(service_name).build())
            .build();
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        Ok(Some(Self { provider }))
    }

    /// Sends the spans still in the batch and stops the exporter. Blocks:
    /// call it outside the async runtime, after the server stopped.
    pub(crate) fn shutdown(self) {
        if let Err(error) = self.provider.shutdown() {
            tracing::warn!(%error, "could not send the last spans");
        }
    }
}

/// The server's subscriber: log lines to stderr in `format`, at the level
/// `RUST_LOG` sets (else `default`), and the runtime's spans (target
/// [`TARGET`], which the log lines leave out) to `traces` when it is on.
/// With `traces` off no layer wants those spans, so they cost nothing.
///
/// A log line that cannot be written is dropped silently (see
/// `init_logging` in `main.rs`).
pub(crate) fn init_server(default: &str, format: LogFormat, traces: Option<&Traces>) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let filter = match format!("{TARGET}=off").parse() {
        Ok(directive) => filter.add_directive(directive),
        Err(_) => filter,
    };
    let Some(traces) = traces else {
        // No exporter: one global filter, as every other command logs. Per-
        // layer filters were seen to drop the store writer's warnings here
        // (tests/v2_api/tests/durable_files.rs), and a global filter is the
        // cheaper check besides.
        let builder = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .log_internal_errors(false);
        match format {
            LogFormat::Text => builder
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .init(),
            LogFormat::Json => builder.json().with_ansi(false).init(),
        }
        return;
    };
    let lines = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .log_internal_errors(false);
    let lines = match format {
        LogFormat::Text => lines
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_filter(filter)
            .boxed(),
        LogFormat::Json => lines.json().with_ansi(false).with_filter(filter).boxed(),
    };
    let spans = tracing_opentelemetry::layer()
        .with_tracer(traces.provider.tracer("sandbox-agent"))
        .with_location(false)
        .with_threads(false)
        .with_tracked_inactivity(false)
        .with_target(false)
        .with_level(false)
        .with_filter(Targets::new().with_target(TARGET, tracing::Level::INFO));
    tracing_subscriber::registry()
        .with(lines)
        .with(spans)
        .init();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    #[test]
    fn an_endpoint_turns_traces_on_and_none_turns_them_off() {
        assert_eq!(wanted(with(&[])), Ok(false));
        let base = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318");
        assert_eq!(wanted(with(&[base])), Ok(true));
        let traces = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c/v1/traces");
        assert_eq!(wanted(with(&[traces])), Ok(true));
        assert_eq!(
            wanted(with(&[base, ("OTEL_TRACES_EXPORTER", "none")])),
            Ok(false)
        );
        assert_eq!(
            wanted(with(&[base, ("OTEL_TRACES_EXPORTER", "otlp,console")])),
            Ok(true)
        );
        assert!(wanted(with(&[base, ("OTEL_TRACES_EXPORTER", "zipkin")])).is_err());
        assert_eq!(
            wanted(with(&[base, ("OTEL_SDK_DISABLED", "TRUE")])),
            Ok(false)
        );
    }

    #[test]
    fn an_endpoint_with_a_password_is_refused_without_naming_it() {
        for name in [
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        ] {
            let error = wanted(with(&[(name, "http://user:PASSWORD@127.0.0.1:4318")]))
                .expect_err("userinfo refused");
            assert!(error.contains(name), "{error}");
            assert!(error.contains("OTEL_EXPORTER_OTLP_HEADERS"), "{error}");
            assert!(!error.contains("PASSWORD"), "{error}");
        }
        assert!(
            wanted(with(&[(
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "http://u@c:4318/p"
            )]))
            .is_err()
        );
        // An `@` past the authority is not userinfo.
        let path = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318/a@b?x=@#@");
        assert_eq!(wanted(with(&[path])), Ok(true));
    }
}
