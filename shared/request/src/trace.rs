//! W3C trace context on NATS headers: what every publish and request carries
//! (`traceparent`, `tracestate`; docs/protocol.md §1 "Trace context"), so one conversation is one trace.
//!
//! Works on the global OpenTelemetry propagator; `switchboard_runtime::telemetry::init` sets
//! the W3C one. Needs only the OpenTelemetry API and `tracing-opentelemetry`, never an exporter.

use async_nats::HeaderMap;
use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::{Context, global};
use tracing_opentelemetry::OpenTelemetrySpanExt;

struct HeaderInjector<'a>(&'a mut HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        // W3C: an empty `tracestate` is the same as none; foreign clients should not have to
        // skip an empty header.
        if !value.is_empty() {
            self.0.insert(key, value.as_str());
        }
    }
}

struct HeaderExtractor<'a>(&'a HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(|value| value.as_str())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(name, _)| name.as_ref()).collect()
    }
}

/// Writes `context` into `headers` as `traceparent`/`tracestate`.
pub fn inject(context: &Context, headers: &mut HeaderMap) {
    global::get_text_map_propagator(|propagator| {
        propagator.inject_context(context, &mut HeaderInjector(headers));
    });
}

/// Reads the trace context from NATS headers (an empty context when absent).
pub fn extract(headers: Option<&HeaderMap>) -> Context {
    match headers {
        Some(headers) => global::get_text_map_propagator(|propagator| {
            propagator.extract(&HeaderExtractor(headers))
        }),
        None => Context::new(),
    }
}

/// Headers carrying the current span's trace context: start every publish and request here.
pub fn traced_headers() -> HeaderMap {
    let mut headers = HeaderMap::new();
    inject(&tracing::Span::current().context(), &mut headers);
    headers
}

/// The current span's W3C `traceparent`, to keep on a record so what happens to it later (a
/// deadline, a sweep) joins the trace it was made in; `None` outside any span.
pub fn current_traceparent() -> Option<String> {
    traced_headers()
        .get(switchboard_proto::HEADER_TRACEPARENT)
        .map(|value| value.as_str().to_owned())
}

/// Makes `span` a child of a W3C trace context given as text, as a fetched inbox message
/// carries it (`traceparent`, `tracestate`); no-op when there is none. Each value is made
/// header-safe first.
pub fn set_parent_from_text(
    span: &tracing::Span,
    traceparent: Option<&str>,
    tracestate: Option<&str>,
) {
    let mut headers = HeaderMap::new();
    for (name, value) in [
        (switchboard_proto::HEADER_TRACEPARENT, traceparent),
        (switchboard_proto::HEADER_TRACESTATE, tracestate),
    ] {
        if let Some(value) = value {
            headers.insert(name, crate::headers::safe_value(value));
        }
    }
    set_parent_from(span, Some(&headers));
}

/// Makes `span` a child of the trace context in `headers` (no-op when there is none).
pub fn set_parent_from(span: &tracing::Span, headers: Option<&HeaderMap>) {
    let parent = extract(headers);
    if let Err(err) = span.set_parent(parent) {
        tracing::debug!(error = %err, "could not set span parent from headers");
    }
}
