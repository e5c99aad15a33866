//! W3C trace context on NATS headers: what every publish and request carries
//! (`traceparent`, `tracestate`; docs/protocol.md §1 "Trace context"), so one conversation is one trace.
//!
//! Works on the global OpenTelemetry propagator; `switchboard_runtime::telemetry::init` sets
//! the W3C one. Span contexts come from the subscriber's `tracing-opentelemetry` layer, or from
//! [`Propagation`] where that is installed instead; never from an exporter.
//!
//! A process that exports no spans (no OTLP endpoint, the shipped default) does not record
//! them either: `telemetry::init` installs [`Propagation`] instead of the OpenTelemetry layer.
//! Each span then keeps only its W3C context — the trace id, flags and state of its parent and
//! a span id of its own — which is all the next hop needs, so one conversation stays one trace.
//! Recording spans nobody exports cost the limits service a fifth of its throughput
//! (docs/performance.md, "Spans nobody exports").

use std::cell::RefCell;

use async_nats::HeaderMap;
use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{Context, global};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::registry::LookupSpan;

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
    inject(&span_context(&tracing::Span::current()), &mut headers);
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
    set_parent(span, extract(headers));
}

/// Makes `span` a child of `parent`: through the OpenTelemetry layer, or, under a subscriber
/// with [`Propagation`], by giving it `parent`'s trace id, flags and state under a span id of
/// its own (an empty `parent` leaves it the root it was made as).
pub fn set_parent(span: &tracing::Span, parent: Context) {
    if !propagating(span) {
        if let Err(err) = span.set_parent(parent) {
            tracing::debug!(error = %err, "could not set span parent from headers");
        }
        return;
    }
    let parent = parent.span().span_context().clone();
    if !parent.is_valid() {
        return;
    }
    span.with_subscriber(|(id, dispatch)| {
        if let Some(span) = dispatch
            .downcast_ref::<tracing_subscriber::Registry>()
            .and_then(|registry| registry.span(id))
        {
            span.extensions_mut()
                .replace(Propagated(child_of(Some(&parent))));
        }
    });
}

/// `span`'s trace context, to inject into what it sends (see [`set_parent`]).
pub fn span_context(span: &tracing::Span) -> Context {
    if !propagating(span) {
        return span.context();
    }
    let mut found = None;
    span.with_subscriber(|(id, dispatch)| {
        let Some(registry) = dispatch.downcast_ref::<tracing_subscriber::Registry>() else {
            return;
        };
        // The nearest span that keeps a context: a span [`Propagation`] was not enabled for
        // (below its level) is transparent.
        found = registry.span(id).and_then(|span| {
            span.scope()
                .find_map(|span| span.extensions().get::<Propagated>().map(|p| p.0.clone()))
        });
    });
    match found {
        Some(context) => Context::new().with_remote_span_context(context),
        None => Context::new(),
    }
}

/// Whether `span`'s subscriber keeps contexts through [`Propagation`] (else through the
/// OpenTelemetry layer, or not at all): asked of the subscriber itself, so a scoped subscriber
/// with the OpenTelemetry layer in a process whose global one propagates is read right.
fn propagating(span: &tracing::Span) -> bool {
    span.with_subscriber(|(_, dispatch)| dispatch.downcast_ref::<Propagation>().is_some())
        .unwrap_or(false)
}

/// A span's W3C context in a process that only propagates.
#[derive(Debug, Clone)]
struct Propagated(SpanContext);

/// The `tracing` layer of a process that exports no spans: each new span keeps a W3C context
/// — its parent span's trace id, flags and state, or a new sampled trace for a root — under
/// a span id of its own, and nothing else (no attributes, no events, nothing built when it
/// closes). Install it where the OpenTelemetry layer would go, with the same level filter:
/// [`set_parent`] and [`span_context`] find it in the span's subscriber.
#[derive(Debug, Default, Clone, Copy)]
pub struct Propagation;

impl<S> tracing_subscriber::Layer<S> for Propagation
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        _attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let Some(span) = ctx.span(id) else {
            return;
        };
        let parent = span
            .parent()
            .and_then(|parent| parent.extensions().get::<Propagated>().map(|p| p.0.clone()));
        span.extensions_mut()
            .insert(Propagated(child_of(parent.as_ref())));
    }
}

/// A new span's context: under `parent` (its trace, flags and state), or a new sampled trace.
fn child_of(parent: Option<&SpanContext>) -> SpanContext {
    match parent.filter(|parent| parent.is_valid()) {
        Some(parent) => SpanContext::new(
            parent.trace_id(),
            span_id(),
            parent.trace_flags(),
            false,
            parent.trace_state().clone(),
        ),
        None => SpanContext::new(
            TraceId::from_bytes(
                ((u128::from(random()) << 64) | u128::from(random())).to_be_bytes(),
            ),
            span_id(),
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        ),
    }
}

fn span_id() -> SpanId {
    SpanId::from_bytes(random().to_be_bytes())
}

/// A random non-zero u64 from a per-thread small generator seeded from the OS, as the
/// OpenTelemetry SDK's own `RandomIdGenerator` makes its ids.
fn random() -> u64 {
    use rand::{Rng as _, SeedableRng as _};
    thread_local! {
        static RNG: RefCell<rand::rngs::SmallRng> =
            RefCell::new(rand::rngs::SmallRng::from_os_rng());
    }
    RNG.with(|rng| {
        let mut rng = rng.borrow_mut();
        loop {
            let value: u64 = rng.random();
            if value != 0 {
                return value;
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::{Layer as _, filter::LevelFilter};

    /// (trace id, parent span id, flags) of a `traceparent`.
    fn parts(headers: &HeaderMap) -> (String, String, String) {
        let value = headers
            .get(switchboard_proto::HEADER_TRACEPARENT)
            .expect("a traceparent")
            .as_str()
            .to_owned();
        let fields: Vec<&str> = value.split('-').collect();
        assert_eq!(fields.len(), 4, "{value}");
        (fields[1].into(), fields[2].into(), fields[3].into())
    }

    #[test]
    fn a_process_that_only_propagates_keeps_the_trace_and_gives_each_span_an_id() {
        global::set_text_map_propagator(
            opentelemetry_sdk::propagation::TraceContextPropagator::new(),
        );
        let subscriber =
            tracing_subscriber::registry().with(Propagation.with_filter(LevelFilter::INFO));
        tracing::subscriber::with_default(subscriber, || {
            // Outside any span: nothing to carry.
            assert!(
                traced_headers()
                    .get(switchboard_proto::HEADER_TRACEPARENT)
                    .is_none()
            );

            // A hop carrying a caller's context, not sampled and with state: the same trace,
            // flags and state go on, under a span id of this hop's own.
            let trace = "0af7651916cd43dd8448eb211c80319c";
            let mut incoming = HeaderMap::new();
            incoming.insert(
                switchboard_proto::HEADER_TRACEPARENT,
                format!("00-{trace}-b7ad6b7169203331-00").as_str(),
            );
            incoming.insert(switchboard_proto::HEADER_TRACESTATE, "vendor=x");
            let request = tracing::info_span!("request");
            set_parent_from(&request, Some(&incoming));
            let out = request.in_scope(traced_headers);
            let (out_trace, hop, flags) = parts(&out);
            assert_eq!(out_trace, trace);
            assert_ne!(hop, "b7ad6b7169203331");
            assert_eq!(flags, "00");
            assert_eq!(
                out.get(switchboard_proto::HEADER_TRACESTATE)
                    .map(|v| v.as_str().to_owned()),
                Some("vendor=x".to_owned())
            );

            // A child: the same trace, an id of its own. A span below the layer's level is
            // transparent: it carries the span above it.
            let (child_trace, child, _) =
                parts(&request.in_scope(|| tracing::info_span!("child").in_scope(traced_headers)));
            assert_eq!(child_trace, trace);
            assert_ne!(child, hop);
            let (_, quiet, _) =
                parts(&request.in_scope(|| tracing::debug_span!("quiet").in_scope(traced_headers)));
            assert_eq!(quiet, hop);

            // A span with no parent is a new trace, sampled; an empty parent leaves it so.
            let root = tracing::info_span!("root");
            set_parent_from(&root, None);
            let (root_trace, root_id, root_flags) = parts(&root.in_scope(traced_headers));
            assert_ne!(root_trace, trace);
            assert_ne!(root_trace, "0".repeat(32));
            assert_ne!(root_id, "0".repeat(16));
            assert_eq!(root_flags, "01");
            let (again, _, _) = parts(&root.in_scope(traced_headers));
            assert_eq!(again, root_trace, "a span keeps its context");
        });
    }
}
