//! The server's OpenTelemetry spans (research/contract.md, "Traces"): one
//! per HTTP request, per client ACP request, per prompt turn
//! (`invoke_agent`), per tool call (`execute_tool`) and per permission
//! wait; the client's W3C `traceparent` read from the HTTP headers, and the
//! span's own written into the `_meta` of the request forwarded to the
//! agent.
//!
//! Every span here has the target [`TARGET`]. The binary exports that
//! target, and only it, when tracing is on; otherwise no subscriber layer
//! is interested in it, so a span costs one cached callsite check, its
//! field values are never evaluated, and nothing is parsed or allocated.
//! The propagator is OpenTelemetry's global one, which the binary sets to
//! W3C trace context when it turns tracing on.

use crate::protocol::Method;
use http::HeaderMap;
use opentelemetry::propagation::{Extractor, Injector};
use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use tracing::Span;
use tracing::field::Empty;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The `tracing` target of every span exported over OTLP. A log
/// subscriber filters it out; the OTLP layer takes only it.
pub const TARGET: &str = "sandbox_agent_trace";

/// W3C trace context's header and `_meta` key (research/contract.md,
/// "Traces": propagation).
pub const TRACEPARENT: &str = "traceparent";
/// W3C trace context's vendor state, carried beside [`TRACEPARENT`].
pub const TRACESTATE: &str = "tracestate";
/// The member of ACP params that carries extension data.
const META: &str = "_meta";
/// The most bytes of a client's or an agent's string that a span name or
/// attribute takes (research/contract.md, "Traces": bounds).
pub(crate) const MAX_VALUE_BYTES: usize = 256;
/// The span name of a client request whose method is neither ACP's nor
/// this product's, which keeps span names a bounded set.
const OTHER_METHOD: &str = "other";

/// `text` as a span takes it: at most [`MAX_VALUE_BYTES`] bytes, cut at a
/// character boundary and ended with `…` when it was longer.
fn bounded(text: &str) -> Cow<'_, str> {
    if text.len() <= MAX_VALUE_BYTES {
        return Cow::Borrowed(text);
    }
    let mut end = MAX_VALUE_BYTES - '…'.len_utf8();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!("{}…", &text[..end]))
}

/// Whether spans of [`TARGET`] are recorded at all (tracing is on): the
/// check that keeps the hot path free of parsing when it is off.
pub(crate) fn enabled() -> bool {
    tracing::enabled!(target: TARGET, tracing::Level::INFO)
}

/// The span of one plain HTTP request (`http.request.method`, the bounded
/// `http.route` template; `http.response.status_code` is recorded by
/// [`http_status`]). A `traceparent` header makes it a child of the
/// client's span.
pub(crate) fn http_request(
    method: &http::Method,
    route: &'static str,
    headers: &HeaderMap,
) -> Span {
    let method = http_method(method);
    let span = tracing::info_span!(
        target: TARGET,
        "http.request",
        otel.name = %format_args!("{} {route}", if method == OTHER_HTTP_METHOD { "HTTP" } else { method }),
        otel.kind = "server",
        otel.status_code = Empty,
        http.request.method = method,
        http.route = route,
        http.response.status_code = Empty,
    );
    if !span.is_disabled()
        && let Some(parent) = client_context(headers)
    {
        // Fails only once the span has started, which it has not.
        let _ = span.set_parent(parent);
    }
    span
}

/// `http.request.method` of OpenTelemetry's HTTP conventions for a method
/// none of HTTP's own: the client's verb is not recorded, so it is bounded.
const OTHER_HTTP_METHOD: &str = "_OTHER";

/// `method` as a span records it: one of HTTP's methods, else
/// [`OTHER_HTTP_METHOD`] (the span is then named `HTTP {route}`).
fn http_method(method: &http::Method) -> &'static str {
    [
        http::Method::GET,
        http::Method::HEAD,
        http::Method::POST,
        http::Method::PUT,
        http::Method::DELETE,
        http::Method::CONNECT,
        http::Method::OPTIONS,
        http::Method::TRACE,
        http::Method::PATCH,
    ]
    .iter()
    .find(|known| *known == method)
    .map_or(OTHER_HTTP_METHOD, http::Method::as_str)
}

/// The client's trace context from W3C trace context headers: `None`
/// without exactly one `traceparent` of the W3C format
/// ([`valid_traceparent`]; the request then starts a trace). Several
/// `tracestate` lines are one list, joined with `,` (W3C trace context,
/// "tracestate": combining header lines).
fn client_context(headers: &HeaderMap) -> Option<opentelemetry::Context> {
    let mut traceparents = headers.get_all(TRACEPARENT).iter();
    let traceparent = traceparents.next()?.to_str().ok()?;
    if traceparents.next().is_some() || !valid_traceparent(traceparent) {
        return None;
    }
    let tracestate = headers
        .get_all(TRACESTATE)
        .iter()
        .filter_map(|line| line.to_str().ok())
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join(",");
    let carrier = TraceHeaders {
        traceparent,
        tracestate,
    };
    Some(opentelemetry::global::get_text_map_propagator(
        |propagator| propagator.extract(&carrier),
    ))
}

/// Whether `value` is a W3C `traceparent`: `version-traceid-parentid-flags`,
/// version two lowercase hex digits but `ff` (and for `00` nothing after the
/// flags), trace id 32 and parent id 16 lowercase hex digits, neither all
/// zero, flags two hex digits. OpenTelemetry's propagator alone would take
/// `00-0af7-b7ad-01`, padding the ids with zeros.
fn valid_traceparent(value: &str) -> bool {
    let hex = |part: &str, len: usize| {
        part.len() == len && part.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    let nonzero = |part: &str| part.bytes().any(|b| b != b'0');
    let mut parts = value.split('-');
    let (Some(version), Some(trace_id), Some(parent_id), Some(flags)) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    hex(version, 2)
        && version != "ff"
        && (version != "00" || parts.next().is_none())
        && hex(trace_id, 32)
        && nonzero(trace_id)
        && hex(parent_id, 16)
        && nonzero(parent_id)
        && hex(flags, 2)
}

/// Records the answer's status on an [`http_request`] span; a 5xx is an
/// error (OpenTelemetry's HTTP server conventions).
pub(crate) fn http_status(span: &Span, status: u16) {
    span.record("http.response.status_code", status);
    if status >= 500 {
        span.record("otel.status_code", "error");
    }
}

/// The span of one client ACP request (`rpc.method`, the connection id
/// when it has one, `params.sessionId` when there is one), named by
/// [`Method::span_name`] (else [`OTHER_METHOD`]); the client's strings
/// [`bounded`]. A child of
/// `parent` (the HTTP request's span; [`Span::none`]: a trace of its own).
pub(crate) fn rpc_request(
    parent: &Span,
    method: Method,
    name: &str,
    connection: Option<&str>,
    session: Option<&str>,
) -> Span {
    let session = session.map(bounded);
    tracing::info_span!(
        target: TARGET,
        parent: parent,
        "rpc.request",
        otel.name = method.span_name().unwrap_or(OTHER_METHOD),
        rpc.system = "jsonrpc",
        rpc.method = &*bounded(name),
        acp.connection.id = connection,
        acp.session.id = session.as_deref(),
    )
}

/// The span of one prompt turn, from forwarding `session/prompt` to the
/// agent's answer: OpenTelemetry's GenAI `invoke_agent` (the agent is
/// another process, hence kind client), a child of `parent` (the
/// `session/prompt` request's span).
pub(crate) fn invoke_agent(parent: &Span, agent: &str, session: Option<&str>) -> Span {
    let session = session.map(bounded);
    tracing::info_span!(
        target: TARGET,
        parent: parent,
        "invoke_agent",
        otel.name = %format_args!("invoke_agent {agent}"),
        otel.kind = "client",
        otel.status_code = Empty,
        gen_ai.operation.name = "invoke_agent",
        gen_ai.agent.name = agent,
        gen_ai.conversation.id = session.as_deref(),
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        acp.stop_reason = Empty,
    )
}

/// The members of a `session/prompt` answer a turn's span records. The
/// result is read member by member, so that a malformed `usage` costs only
/// the values it breaks.
#[derive(Deserialize)]
struct PromptAnswer {
    result: Option<Value>,
    error: Option<serde::de::IgnoredAny>,
}

/// ACP's token counts of a turn (`PromptResponse.usage`) and the
/// attributes OpenTelemetry's GenAI conventions give them (integers).
const USAGE_ATTRIBUTES: [(&str, &str); 2] = [
    ("inputTokens", "gen_ai.usage.input_tokens"),
    ("outputTokens", "gen_ai.usage.output_tokens"),
];

/// Records the agent's answer `line` to `session/prompt` on its
/// [`invoke_agent`] span: the stop reason, the token usage when the agent
/// reported it, an error status for an error answer. A token count that is
/// not an integer from 0 to `i64::MAX` is left out; the rest is recorded.
pub(crate) fn end_turn(span: &Span, line: &[u8]) {
    if span.is_disabled() {
        return;
    }
    let Ok(answer) = serde_json::from_slice::<PromptAnswer>(line) else {
        return;
    };
    if answer.error.is_some() {
        span.record("otel.status_code", "error");
    }
    let Some(result) = answer.result else { return };
    if let Some(stop_reason) = result.get("stopReason").and_then(Value::as_str) {
        span.record("acp.stop_reason", &*bounded(stop_reason));
    }
    let usage = result.get("usage");
    for (member, attribute) in USAGE_ATTRIBUTES {
        let tokens = usage
            .and_then(|usage| usage.get(member))
            .and_then(Value::as_i64)
            .filter(|tokens| *tokens >= 0);
        if let Some(tokens) = tokens {
            span.record(attribute, tokens);
        }
    }
}

/// The spans of a session's current prompt turn: the turn's own, and one
/// per tool call still open. Held by the session; empty (and never
/// touched) while tracing is off.
#[derive(Debug)]
pub(crate) struct TurnTrace {
    /// The turn's [`invoke_agent`] span ([`Span::none`] between turns).
    turn: Span,
    /// Open tool calls by `toolCallId`: each span ends when its call
    /// reaches `completed` or `failed`, or when the turn ends.
    tools: Vec<(Box<str>, Span)>,
}

/// The members of a `session/update` a tool call's span reads.
#[derive(Deserialize)]
struct UpdateNote {
    params: UpdateParams,
}

#[derive(Deserialize)]
struct UpdateParams {
    update: ToolUpdate,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ToolUpdate {
    tool_call_id: String,
    title: Option<String>,
    kind: Option<String>,
    status: Option<String>,
}

/// The members of `session/request_permission` its span reads.
#[derive(Deserialize)]
struct PermissionNote {
    params: PermissionParams,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PermissionParams {
    tool_call: Option<ToolCallRef>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ToolCallRef {
    tool_call_id: String,
}

impl Default for TurnTrace {
    fn default() -> Self {
        Self {
            turn: Span::none(),
            tools: Vec::new(),
        }
    }
}

impl TurnTrace {
    /// A new turn: its span is `turn`; tool calls of an earlier turn end.
    pub(crate) fn begin(&mut self, turn: &Span) {
        self.tools.clear();
        self.turn = turn.clone();
    }

    /// Turn `turn` is over: its open tool calls end with it. A later
    /// turn's trace is left alone.
    pub(crate) fn end(&mut self, turn: &Span) {
        if self.turn.id() == turn.id() {
            self.tools.clear();
            self.turn = Span::none();
        }
    }

    /// A `session/update` of kind `kind` (`line` the whole notification):
    /// a `tool_call` opens an `execute_tool` span under the turn, and a
    /// status `completed` or `failed` (in the `tool_call` itself or a later
    /// `tool_call_update`) ends it.
    pub(crate) fn on_update(&mut self, kind: &str, line: &[u8]) {
        let opens = match kind {
            "tool_call" => true,
            "tool_call_update" => false,
            _ => return,
        };
        if self.turn.is_disabled() {
            return;
        }
        let Ok(note) = serde_json::from_slice::<UpdateNote>(line) else {
            return;
        };
        let update = note.params.update;
        let at = self
            .tools
            .iter()
            .position(|(id, _)| **id == *update.tool_call_id);
        if opens && at.is_none() {
            let title = bounded(update.title.as_deref().unwrap_or(""));
            let kind = update.kind.as_deref().map(bounded);
            let span = tracing::info_span!(
                target: TARGET,
                parent: &self.turn,
                "execute_tool",
                otel.name = %format_args!("execute_tool {title}"),
                otel.status_code = Empty,
                gen_ai.operation.name = "execute_tool",
                gen_ai.tool.call.id = &*bounded(&update.tool_call_id),
                gen_ai.tool.name = &*title,
                acp.tool_call.kind = kind.as_deref(),
                acp.tool_call.status = Empty,
            );
            self.tools.push((update.tool_call_id.as_str().into(), span));
        }
        let Some(status) = update.status.as_deref() else {
            return;
        };
        if let Some(at) = self
            .tools
            .iter()
            .position(|(id, _)| **id == *update.tool_call_id)
            && matches!(status, "completed" | "failed")
        {
            let (_, span) = self.tools.swap_remove(at);
            span.record("acp.tool_call.status", status);
            if status == "failed" {
                span.record("otel.status_code", "error");
            }
        }
    }

    /// The span of a `session/request_permission` (`line` the agent's
    /// request), open until the request is answered: a child of its tool
    /// call's span when that is open, else of the turn's.
    pub(crate) fn permission(&self, line: &[u8]) -> Span {
        if self.turn.is_disabled() {
            return Span::none();
        }
        let call = serde_json::from_slice::<PermissionNote>(line)
            .ok()
            .and_then(|note| note.params.tool_call)
            .map(|call| call.tool_call_id);
        let parent = call
            .as_deref()
            .and_then(|call| self.tools.iter().find(|(id, _)| **id == *call))
            .map_or(&self.turn, |(_, span)| span);
        let call = call.as_deref().map(bounded);
        tracing::info_span!(
            target: TARGET,
            parent: parent,
            "session/request_permission",
            acp.method = "session/request_permission",
            gen_ai.tool.call.id = call.as_deref(),
        )
    }
}

/// `params` with `span`'s trace context added to its `_meta`
/// (`traceparent`, and `tracestate` when it is not empty: ACP's `_meta`
/// propagation convention), for the request forwarded to the agent. The
/// client's other `_meta` keys are kept; a `traceparent` of its own is
/// replaced, since the agent works under the runtime's span, and a
/// `tracestate` of its own only by a non-empty one of the runtime's
/// (research/contract.md, "Traces": propagation out). Each top-level value is copied as it was
/// written. `None` (send `params` as it is) when `span` is not recorded,
/// or `params` is absent, or it or its `_meta` is not an object.
pub(crate) fn with_trace_meta(span: &Span, params: Option<&RawValue>) -> Option<Box<RawValue>> {
    if span.is_disabled() || params.is_none() {
        return None;
    }
    let mut fields = HashMap::new();
    opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.inject_context(&span.context(), &mut MetaCarrier(&mut fields));
    });
    if fields.is_empty() {
        return None;
    }
    // A request without params gets none: its method may take none.
    let params = params?.get();
    if let Some(spliced) = meta_spliced(params, &fields) {
        return Some(spliced);
    }
    let mut members: BTreeMap<String, Box<RawValue>> = serde_json::from_str(params).ok()?;
    let mut meta: BTreeMap<String, Box<RawValue>> = match members.get(META) {
        Some(meta) => serde_json::from_str(meta.get()).ok()?,
        None => BTreeMap::new(),
    };
    for (key, value) in fields {
        meta.insert(key, serde_json::value::to_raw_value(&value).ok()?);
    }
    members.insert(
        META.to_owned(),
        serde_json::value::to_raw_value(&meta).ok()?,
    );
    serde_json::value::to_raw_value(&members).ok()
}

/// `params` with a `_meta` of `fields` alone written before its first
/// member, without parsing it: `None` unless `params` is an object that
/// certainly has no `_meta` member (neither the text `_meta` nor an escape
/// `\u` that could spell one appears in it), which most requests are. The
/// members are copied as written; `params` is JSON already (a parsed
/// message's raw value), so a splice keeps it JSON.
fn meta_spliced(params: &str, fields: &HashMap<String, String>) -> Option<Box<RawValue>> {
    let members = params.trim_start().strip_prefix('{')?;
    let bytes = params.as_bytes();
    if memchr::memmem::find(bytes, META.as_bytes()).is_some()
        || memchr::memmem::find(bytes, b"\\u").is_some()
    {
        return None;
    }
    let meta = serde_json::to_string(fields).ok()?;
    let mut spliced = String::with_capacity(params.len() + meta.len() + 10);
    spliced.push_str("{\"_meta\":");
    spliced.push_str(&meta);
    if members.trim_start().starts_with('}') {
        spliced.push('}');
    } else {
        spliced.push(',');
        spliced.push_str(members);
    }
    RawValue::from_string(spliced).ok()
}

/// A request's W3C trace context headers as a propagator reads them: the
/// one valid `traceparent`, the `tracestate` lines joined.
struct TraceHeaders<'a> {
    traceparent: &'a str,
    tracestate: String,
}

impl Extractor for TraceHeaders<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            TRACEPARENT => Some(self.traceparent),
            TRACESTATE => Some(&self.tracestate),
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        vec![TRACEPARENT, TRACESTATE]
    }
}

/// The `_meta` keys a propagator writes; an empty value (a `tracestate`
/// with no member) is not one.
struct MetaCarrier<'a>(&'a mut HashMap<String, String>);

impl Injector for MetaCarrier<'_> {
    fn set(&mut self, key: &str, value: String) {
        if !value.is_empty() {
            self.0.insert(key.to_owned(), value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{TraceContextExt as _, TracerProvider as _};
    use opentelemetry_sdk::propagation::TraceContextPropagator;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use std::sync::{Arc, Mutex};
    use tracing::field::{Field, Visit};
    use tracing_subscriber::layer::{Context, SubscriberExt};

    /// Every field value a span got, in order, as `(field, typed value)`:
    /// `i64 7`, `u64 7`, `str text`, `debug text` (the `tracing` call the
    /// OpenTelemetry bridge turns into an attribute of that type; `u64` and
    /// `debug` become strings).
    #[derive(Clone, Default)]
    struct Recorded(Arc<Mutex<Vec<(String, String)>>>);

    impl Recorded {
        /// The last value recorded for `field`.
        fn last(&self, field: &str) -> Option<String> {
            let fields = self.0.lock().ok()?;
            fields
                .iter()
                .rev()
                .find(|(f, _)| f == field)
                .map(|(_, v)| v.clone())
        }

        fn clear(&self) {
            if let Ok(mut fields) = self.0.lock() {
                fields.clear();
            }
        }

        fn push(&self, field: &Field, value: String) {
            if let Ok(mut fields) = self.0.lock() {
                fields.push((field.name().to_owned(), value));
            }
        }
    }

    impl Visit for &Recorded {
        fn record_i64(&mut self, field: &Field, value: i64) {
            self.push(field, format!("i64 {value}"));
        }
        fn record_u64(&mut self, field: &Field, value: u64) {
            self.push(field, format!("u64 {value}"));
        }
        fn record_str(&mut self, field: &Field, value: &str) {
            self.push(field, format!("str {value}"));
        }
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            self.push(field, format!("debug {value:?}"));
        }
    }

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Recorded {
        fn on_new_span(
            &self,
            attrs: &tracing::span::Attributes<'_>,
            _: &tracing::span::Id,
            _: Context<'_, S>,
        ) {
            attrs.record(&mut &*self);
        }
        fn on_record(
            &self,
            _: &tracing::span::Id,
            values: &tracing::span::Record<'_>,
            _: Context<'_, S>,
        ) {
            values.record(&mut &*self);
        }
    }

    /// Runs `test` with tracing on: a real tracer (exporting nowhere)
    /// behind the `tracing` bridge, and W3C trace context as propagator;
    /// `test` sees the field values spans got.
    fn traced(test: impl FnOnce(&Recorded)) {
        let provider = SdkTracerProvider::builder().build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("test"));
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        let recorded = Recorded::default();
        let subscriber = tracing_subscriber::registry()
            .with(layer)
            .with(recorded.clone());
        tracing::subscriber::with_default(subscriber, || test(&recorded));
    }

    /// Tracing off: no span, params as they are, no tool call parsed.
    fn off() {
        // No subscriber in unit tests: tracing is off.
        assert!(!enabled());
        let span = invoke_agent(&Span::none(), "mock", Some("s1"));
        assert!(span.is_disabled());
        let params = RawValue::from_string(r#"{"sessionId":"s1"}"#.to_owned()).ok();
        assert!(with_trace_meta(&span, params.as_deref()).is_none());
        let mut trace = TurnTrace::default();
        trace.begin(&span);
        trace.on_update("tool_call", br#"{"params":{"update":{"toolCallId":"t"}}}"#);
        assert!(trace.tools.is_empty());
    }

    /// One test, in order: tracing's callsite interest is process-wide, so
    /// "off" is only certain before any subscriber was ever set.
    #[test]
    fn off_then_on() {
        off();
        traced(|_| meta_gets_the_trace_context_and_keeps_the_rest_as_written());
        traced(|_| a_tool_call_span_ends_at_its_final_status_or_with_the_turn());
        traced(a_bad_usage_value_costs_only_itself);
        traced(|_| only_a_w3c_traceparent_is_followed());
        traced(|_| tracestate_is_sent_only_when_there_is_one());
        traced(client_and_agent_strings_are_bounded);
    }

    fn client_and_agent_strings_are_bounded(recorded: &Recorded) {
        let size = |field: &str| {
            let value = recorded.last(field).unwrap_or_default();
            let (_, text) = value.split_once(' ').unwrap_or_default();
            text.len()
        };
        // 'é' is two bytes: the cut falls inside one.
        let long = format!("x{}", "é".repeat(4 << 20));
        let verb = http::Method::from_bytes(long.as_bytes());
        if let Ok(verb) = verb {
            let _span = http_request(&verb, "/v2/rpc", &HeaderMap::new());
            assert_eq!(
                recorded.last("http.request.method").as_deref(),
                Some("str _OTHER")
            );
            assert_eq!(
                recorded.last("otel.name").as_deref(),
                Some("debug HTTP /v2/rpc")
            );
        }
        let verb = http::Method::from_bytes(b"FROB").expect("a token");
        let _span = http_request(&verb, "/v2/rpc", &HeaderMap::new());
        assert_eq!(
            recorded.last("otel.name").as_deref(),
            Some("debug HTTP /v2/rpc")
        );
        let _span = http_request(&http::Method::POST, "/acp", &HeaderMap::new());
        assert_eq!(
            recorded.last("otel.name").as_deref(),
            Some("debug POST /acp")
        );
        let _span = rpc_request(
            &Span::none(),
            Method::parse(&long),
            &long,
            Some("c1"),
            Some(&long),
        );
        assert_eq!(recorded.last("otel.name").as_deref(), Some("str other"));
        assert!(size("rpc.method") <= MAX_VALUE_BYTES);
        assert!(
            recorded
                .last("rpc.method")
                .is_some_and(|m| m.ends_with("é…"))
        );
        assert!(size("acp.session.id") <= MAX_VALUE_BYTES);
        let _span = rpc_request(
            &Span::none(),
            Method::parse("session/prompt"),
            "session/prompt",
            None,
            Some("s1"),
        );
        assert_eq!(
            recorded.last("otel.name").as_deref(),
            Some("str session/prompt")
        );
        let _span = rpc_request(
            &Span::none(),
            Method::parse("_sandboxagent/session/detach"),
            "_sandboxagent/session/detach",
            None,
            None,
        );
        assert_eq!(
            recorded.last("otel.name").as_deref(),
            Some("str _sandboxagent/session/detach")
        );
        let _span = rpc_request(
            &Span::none(),
            Method::parse("_vendor/anything"),
            "_vendor/anything",
            None,
            None,
        );
        assert_eq!(recorded.last("otel.name").as_deref(), Some("str other"));
        assert_eq!(
            recorded.last("rpc.method").as_deref(),
            Some("str _vendor/anything")
        );

        let turn = invoke_agent(&Span::none(), "mock", Some(&long));
        assert!(size("gen_ai.conversation.id") <= MAX_VALUE_BYTES);
        let answer = format!(r#"{{"id":1,"result":{{"stopReason":"{long}"}}}}"#);
        end_turn(&turn, answer.as_bytes());
        assert!(size("acp.stop_reason") <= MAX_VALUE_BYTES);
        let mut trace = TurnTrace::default();
        trace.begin(&turn);
        let update = format!(
            r#"{{"params":{{"update":{{"toolCallId":"{long}","title":"{long}","kind":"{long}"}}}}}}"#
        );
        trace.on_update("tool_call", update.as_bytes());
        assert_eq!(trace.tools.len(), 1);
        for field in [
            "otel.name",
            "gen_ai.tool.call.id",
            "gen_ai.tool.name",
            "acp.tool_call.kind",
        ] {
            assert!(
                size(field) <= MAX_VALUE_BYTES + "execute_tool ".len(),
                "{field}"
            );
        }
        let permission = format!(r#"{{"params":{{"toolCall":{{"toolCallId":"{long}"}}}}}}"#);
        let _wait = trace.permission(permission.as_bytes());
        assert!(size("gen_ai.tool.call.id") <= MAX_VALUE_BYTES);
    }

    fn headers(lines: &[(&'static str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in lines {
            if let Ok(value) = value.parse() {
                headers.append(*name, value);
            }
        }
        headers
    }

    fn only_a_w3c_traceparent_is_followed() {
        let good = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        assert!(valid_traceparent(good));
        assert!(valid_traceparent(
            "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-later"
        ));
        for bad in [
            "00-0af7-b7ad-01",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-1",
            "0-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
        ] {
            assert!(!valid_traceparent(bad), "{bad}");
        }
        assert!(client_context(&headers(&[(TRACEPARENT, "00-0af7-b7ad-01")])).is_none());
        assert!(client_context(&headers(&[(TRACEPARENT, good), (TRACEPARENT, good)])).is_none());
        // Several tracestate lines are one list.
        let context = client_context(&headers(&[
            (TRACEPARENT, good),
            (TRACESTATE, "a=1"),
            (TRACESTATE, "b=2"),
        ]))
        .expect("a valid traceparent");
        let span = context.span();
        let parent = span.span_context();
        assert_eq!(
            parent.trace_id().to_string(),
            "0af7651916cd43dd8448eb211c80319c"
        );
        assert_eq!(parent.trace_state().header(), "a=1,b=2");
    }

    fn tracestate_is_sent_only_when_there_is_one() {
        let meta = |span: &Span, params: &str| -> Value {
            let params = RawValue::from_string(params.to_owned()).ok();
            let traced = with_trace_meta(span, params.as_deref()).expect("traced params");
            serde_json::from_str::<Value>(traced.get()).expect("JSON")["_meta"].clone()
        };
        // No tracestate of the runtime's: none sent, the client's kept.
        let span = invoke_agent(&Span::none(), "mock", Some("s1"));
        let alone = meta(&span, "{}");
        assert!(alone.get(TRACESTATE).is_none(), "{alone}");
        let own = meta(&span, r#"{"_meta":{"tracestate":"client=1"}}"#);
        assert_eq!(own[TRACESTATE], "client=1");
        // One of the runtime's (from the client's header) wins.
        let span = invoke_agent(&Span::none(), "mock", Some("s1"));
        let good = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let context = client_context(&headers(&[(TRACEPARENT, good), (TRACESTATE, "r=2")]));
        let _ = span.set_parent(context.expect("a valid traceparent"));
        let own = meta(&span, r#"{"_meta":{"tracestate":"client=1"}}"#);
        assert_eq!(own[TRACESTATE], "r=2");
    }

    fn a_bad_usage_value_costs_only_itself(recorded: &Recorded) {
        let turn = invoke_agent(&Span::none(), "mock", Some("s1"));
        end_turn(
            &turn,
            br#"{"id":1,"result":{"stopReason":"end_turn","usage":{"inputTokens":7,"outputTokens":-8,"totalTokens":15}}}"#,
        );
        assert_eq!(
            recorded.last("acp.stop_reason").as_deref(),
            Some("str end_turn")
        );
        // An integer attribute, as the GenAI conventions say (a u64 would
        // be exported as a string).
        assert_eq!(
            recorded.last("gen_ai.usage.input_tokens").as_deref(),
            Some("i64 7")
        );
        assert_eq!(recorded.last("gen_ai.usage.output_tokens"), None);

        recorded.clear();
        let turn = invoke_agent(&Span::none(), "mock", Some("s1"));
        end_turn(
            &turn,
            br#"{"id":1,"result":{"stopReason":"refusal","usage":{"inputTokens":1.5,"outputTokens":18446744073709551615}}}"#,
        );
        assert_eq!(
            recorded.last("acp.stop_reason").as_deref(),
            Some("str refusal")
        );
        assert_eq!(recorded.last("gen_ai.usage.input_tokens"), None);
        assert_eq!(recorded.last("gen_ai.usage.output_tokens"), None);

        recorded.clear();
        let turn = invoke_agent(&Span::none(), "mock", Some("s1"));
        end_turn(
            &turn,
            br#"{"id":1,"result":{"stopReason":"end_turn","usage":"lots"}}"#,
        );
        assert_eq!(
            recorded.last("acp.stop_reason").as_deref(),
            Some("str end_turn")
        );
    }

    fn meta_gets_the_trace_context_and_keeps_the_rest_as_written() {
        assert!(enabled());
        let span = invoke_agent(&Span::none(), "mock", Some("s1"));
        let params = RawValue::from_string(
                r#"{"sessionId":"s1","n":9007199254740993,"_meta":{"custom":{"a":[1,2]},"traceparent":"old"}}"#
                    .to_owned(),
            )
            .ok();
        let traced = with_trace_meta(&span, params.as_deref()).expect("params with _meta");
        assert!(traced.get().contains("9007199254740993"), "{traced}");
        let traced: Value = serde_json::from_str(traced.get()).expect("JSON");
        assert_eq!(traced["sessionId"], "s1");
        assert_eq!(traced["_meta"]["custom"], serde_json::json!({"a": [1, 2]}));
        let traceparent = traced["_meta"]["traceparent"].as_str().unwrap_or_default();
        let trace_id = span.context().span().span_context().trace_id().to_string();
        assert!(
            traceparent.starts_with(&format!("00-{trace_id}-")),
            "{traceparent}"
        );

        // No params, or params that are not an object: as they are.
        assert!(with_trace_meta(&span, None).is_none());
        let empty = RawValue::from_string("{}".to_owned()).ok();
        let alone = with_trace_meta(&span, empty.as_deref()).expect("a _meta");
        assert!(
            alone.get().starts_with(r#"{"_meta":{"traceparent":"00-"#),
            "{alone}"
        );
        let list = RawValue::from_string("[1]".to_owned()).ok();
        assert!(with_trace_meta(&span, list.as_deref()).is_none());

        // Without a `_meta`, the members are kept as written after it.
        let plain = RawValue::from_string(r#"{"n":9007199254740993,"s":"x"}"#.to_owned()).ok();
        let spliced = with_trace_meta(&span, plain.as_deref()).expect("a _meta");
        assert!(
            spliced
                .get()
                .ends_with(r#"},"n":9007199254740993,"s":"x"}"#),
            "{spliced}"
        );
        let spliced: Value = serde_json::from_str(spliced.get()).expect("JSON");
        assert!(spliced["_meta"]["traceparent"].is_string(), "{spliced}");
        // A `_meta` spelled with an escape is still the one `_meta`: its
        // keys are kept beside the trace context, in one member.
        let escaped = RawValue::from_string(r#"{"\u005fmeta":{"custom":1}}"#.to_owned()).ok();
        let traced = with_trace_meta(&span, escaped.as_deref()).expect("a _meta");
        let traced: BTreeMap<String, Value> =
            serde_json::from_str(traced.get()).expect("one member per key");
        assert_eq!(traced.len(), 1, "{traced:?}");
        assert_eq!(traced[META]["custom"], 1);
        assert!(traced[META][TRACEPARENT].is_string(), "{traced:?}");
    }

    fn a_tool_call_span_ends_at_its_final_status_or_with_the_turn() {
        let turn = invoke_agent(&Span::none(), "mock", Some("s1"));
        let mut trace = TurnTrace::default();
        trace.begin(&turn);
        let update = |kind: &str, id: &str, status: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"s1","update":{{"sessionUpdate":"{kind}","toolCallId":"{id}","title":"t","status":"{status}"}}}}}}"#
            )
        };
        trace.on_update("tool_call", update("tool_call", "a", "pending").as_bytes());
        trace.on_update(
            "tool_call",
            update("tool_call", "b", "in_progress").as_bytes(),
        );
        assert_eq!(trace.tools.len(), 2);
        trace.on_update(
            "tool_call_update",
            update("tool_call_update", "a", "in_progress").as_bytes(),
        );
        assert_eq!(trace.tools.len(), 2);
        trace.on_update(
            "tool_call_update",
            update("tool_call_update", "a", "failed").as_bytes(),
        );
        assert_eq!(trace.tools.len(), 1);
        // A later turn's span is not ended by an earlier turn's end.
        let other = invoke_agent(&Span::none(), "mock", Some("s1"));
        trace.end(&other);
        assert_eq!(trace.tools.len(), 1);
        trace.end(&turn);
        assert!(trace.tools.is_empty() && trace.turn.is_disabled());
    }
}
