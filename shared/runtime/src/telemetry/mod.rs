//! Logs, traces and metrics: `tracing` everywhere, OpenTelemetry OTLP export (HTTP or gRPC)
//! when an endpoint is configured, Prometheus `/metrics` when a listen address is, and W3C trace
//! context (`traceparent`/`tracestate`) carried in NATS headers.
//!
//! Spans always have trace ids, so context keeps flowing through a service that does not
//! export itself: with an exporter (or a sampler chosen with `OTEL_TRACES_SAMPLER`) through the
//! OpenTelemetry layer, without one through `switchboard_request::trace::Propagation`, which
//! keeps each span's W3C context and records nothing else.
//!
//! [`inject`] and [`extract`] are the one place trace context meets NATS headers (the
//! wasmCloud `opentelemetry-nats` pattern): every publish and request goes through
//! [`traced_headers`], every handler through [`set_parent_from`].
//!
//! Each service exports under its own `service.name` (with `service.namespace` `switchboard`,
//! `service.version` and a `service.instance.id` per process), also when several run in one
//! process ([`init_hosting`], see [`route`]). Export failures are counted and logged once per
//! kind ([`export`]).

pub mod export;
pub mod ids;
pub mod lines;
pub mod metrics;
pub mod route;

use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::{Context, KeyValue, global};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{BatchSpanProcessor, SdkTracerProvider};
use tracing_subscriber::Layer as _;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, fmt};

use crate::config::{LogFormat, OtlpProtocol, TelemetryConfig};
pub use route::SERVICE_ATTRIBUTE;
pub use switchboard_request::trace::{
    current_traceparent, extract, inject, set_parent, set_parent_from, set_parent_from_text,
    span_context, traced_headers,
};

/// The standard OTLP endpoint variable.
pub const OTLP_ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
/// The standard OTLP protocol variable (`http/protobuf` or `grpc`).
pub const OTLP_PROTOCOL_ENV: &str = "OTEL_EXPORTER_OTLP_PROTOCOL";
/// The standard metrics exporter variable: `none` keeps metrics off OTLP (a traces-only
/// backend such as Jaeger answers `/v1/metrics` with 404) while `/metrics` still serves them.
pub const METRICS_EXPORTER_ENV: &str = "OTEL_METRICS_EXPORTER";
/// The standard service name variable; overrides the name the binary passes.
pub const SERVICE_NAME_ENV: &str = "OTEL_SERVICE_NAME";
/// `service.namespace` of everything Switchboard exports.
pub const SERVICE_NAMESPACE: &str = "switchboard";

/// Telemetry could not start.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The log filter does not parse.
    #[error("invalid log filter `{filter}`: {source}")]
    Filter {
        /// The filter tried: `RUST_LOG` when set, else `telemetry.log`.
        filter: String,
        /// Why.
        source: tracing_subscriber::filter::ParseError,
    },
    /// An OTLP exporter could not be built.
    #[error("building the OTLP exporter for {endpoint}: {source}")]
    Exporter {
        /// The URL tried: for HTTP the configured endpoint with `/v1/traces` or `/v1/metrics`
        /// appended.
        endpoint: String,
        /// Why.
        source: opentelemetry_otlp::ExporterBuildError,
    },
    /// `OTEL_EXPORTER_OTLP_PROTOCOL` names a protocol not offered.
    #[error("{OTLP_PROTOCOL_ENV}={0}: use http/protobuf or grpc")]
    Protocol(String),
    /// The Prometheus reader could not be built.
    #[error("building the Prometheus reader: {0}")]
    Prometheus(String),
    /// A global subscriber is already installed.
    #[error("a tracing subscriber is already installed: {0}")]
    AlreadyInstalled(#[from] tracing_subscriber::util::TryInitError),
}

/// Keeps the tracer and meter providers alive; [`TelemetryGuard::shutdown`] flushes pending
/// spans and metrics.
#[derive(Debug)]
pub struct TelemetryGuard {
    provider: SdkTracerProvider,
    meters: SdkMeterProvider,
    exporting_to: Option<String>,
}

impl TelemetryGuard {
    /// Where spans and metrics are exported, if anywhere.
    pub fn exporting_to(&self) -> Option<&str> {
        self.exporting_to.as_deref()
    }

    /// Flushes and stops the exporters. Call once, at the end of `main`.
    pub fn shutdown(self) {
        if let Err(err) = self.provider.shutdown() {
            eprintln!("telemetry shutdown: {err}");
        }
        if let Err(err) = self.meters.shutdown() {
            eprintln!("telemetry shutdown (metrics): {err}");
        }
    }
}

static METRICS_WANTED: AtomicBool = AtomicBool::new(false);

/// Whether anything reads this process's metrics (an OTLP endpoint or a `/metrics` listener):
/// what costs broker messages to sample (stream sizes, the audit's lag) is read only then.
pub fn metrics_wanted() -> bool {
    METRICS_WANTED.load(Ordering::Relaxed)
}

/// Installs the global subscriber (fmt to stderr + OpenTelemetry), the W3C propagator and the
/// meter provider, for a process that is one service named `service_name`.
pub fn init(
    service_name: &str,
    config: &TelemetryConfig,
) -> Result<TelemetryGuard, TelemetryError> {
    init_hosting(service_name, &[], config)
}

/// [`init`] for a process named `process_name` that hosts `services` (`switchboard up`): a
/// span whose [`SERVICE_ATTRIBUTE`] names one of them — the scaffold's request spans do — is
/// exported, with its children, under that `service.name`; anything else under
/// `process_name`.
pub fn init_hosting(
    process_name: &str,
    services: &[&str],
    config: &TelemetryConfig,
) -> Result<TelemetryGuard, TelemetryError> {
    global::set_text_map_propagator(TraceContextPropagator::new());
    crate::nats::install_crypto_provider();

    let filter = match std::env::var("RUST_LOG") {
        Ok(directives) if !directives.is_empty() => directives,
        _ => config.log.clone(),
    };
    let filter = EnvFilter::try_new(&filter).map_err(|source| TelemetryError::Filter {
        filter: filter.clone(),
        source,
    })?;

    let service_name = std::env::var(SERVICE_NAME_ENV)
        .ok()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| process_name.to_owned());
    let resource = Resource::builder()
        .with_service_name(service_name.clone())
        .with_attributes([
            KeyValue::new("service.namespace", SERVICE_NAMESPACE),
            KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
            KeyValue::new(
                "service.instance.id",
                switchboard_proto::new_id().to_string(),
            ),
        ])
        .build();

    let endpoint = config.otlp_endpoint.clone().or_else(|| {
        std::env::var(OTLP_ENDPOINT_ENV)
            .ok()
            .filter(|url| !url.is_empty())
    });
    let protocol = match config.otlp_protocol {
        Some(protocol) => protocol,
        None => match std::env::var(OTLP_PROTOCOL_ENV).ok().as_deref() {
            None | Some("") | Some("http/protobuf") => OtlpProtocol::HttpProtobuf,
            Some("grpc") => OtlpProtocol::Grpc,
            Some(other) => return Err(TelemetryError::Protocol(other.to_owned())),
        },
    };
    export::watch(endpoint.as_deref(), protocol.as_str());
    METRICS_WANTED.store(
        endpoint.is_some() || config.metrics_listen.is_some(),
        Ordering::Relaxed,
    );

    let mut builder = SdkTracerProvider::builder().with_resource(resource.clone());
    if let Some(endpoint) = &endpoint {
        if services.is_empty() {
            builder =
                builder.with_batch_exporter(export::Watched(span_exporter(endpoint, protocol)?));
        } else {
            let mut routes = Vec::new();
            for name in std::iter::once(service_name.as_str()).chain(services.iter().copied()) {
                let exporter = export::Watched(span_exporter(endpoint, protocol)?);
                routes.push((
                    name.to_owned(),
                    BatchSpanProcessor::builder(exporter).build(),
                ));
            }
            builder = builder.with_span_processor(route::ByService::new(routes));
        }
    }
    let provider = builder.build();
    let tracer = provider.tracer("switchboard");
    global::set_tracer_provider(provider.clone());

    let prometheus = opentelemetry_prometheus::exporter()
        .with_registry(metrics::new_registry())
        .build()
        .map_err(|err| TelemetryError::Prometheus(err.to_string()))?;
    let mut meters = SdkMeterProvider::builder()
        .with_resource(resource)
        .with_reader(prometheus);
    let metrics_to_otlp = std::env::var(METRICS_EXPORTER_ENV).ok().as_deref() != Some("none");
    if let Some(endpoint) = endpoint.as_ref().filter(|_| metrics_to_otlp) {
        let exporter = export::Watched(metric_exporter(endpoint, protocol)?);
        meters = meters.with_reader(PeriodicReader::builder(exporter).build());
    }
    let meters = meters.build();
    global::set_meter_provider(meters.clone());
    metrics::register_gauges(&meters);

    // The log filter applies to log output only: spans must exist for the trace layer even
    // when logs are quiet, or trace context would stop at this service.
    // Colours only for a person at a terminal: a file or a log shipper gets plain text, or
    // one JSON object per line with `log_format = "json"`.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let (text, json) = match config.log_format {
        LogFormat::Text => (
            Some(
                fmt::layer()
                    .with_writer(lines::SafeLines::new(std::io::stderr, ansi))
                    .with_target(true)
                    .with_ansi(ansi),
            ),
            None,
        ),
        LogFormat::Json => (
            None,
            Some(
                fmt::layer()
                    .json()
                    .with_writer(std::io::stderr)
                    .with_target(true)
                    .with_current_span(false),
            ),
        ),
    };
    // Spans carry what a reader of a trace needs, not the runtime's internals: no busy/idle
    // timings, thread ids or source locations. With no exporter they are not recorded at all:
    // each keeps only the W3C context the next hop needs (`trace::Propagation`).
    // A sampler chosen by `OTEL_TRACES_SAMPLER` decides the flags this process starts traces
    // with even when it exports nothing: then the SDK decides, through its layer.
    let exporting = endpoint.is_some()
        || std::env::var("OTEL_TRACES_SAMPLER").is_ok_and(|sampler| !sampler.is_empty());
    let otel = exporting.then(|| {
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_tracked_inactivity(false)
            .with_threads(false)
            .with_location(false)
            .with_level(false)
            .with_target(false)
            .with_filter(LevelFilter::INFO)
    });
    let propagation = (!exporting)
        .then(|| switchboard_request::trace::Propagation.with_filter(LevelFilter::INFO));
    tracing_subscriber::registry()
        .with(text.with_filter(filter.clone()))
        .with(json.with_filter(filter))
        .with(otel)
        .with(propagation)
        .try_init()?;

    Ok(TelemetryGuard {
        provider,
        meters,
        exporting_to: endpoint,
    })
}

fn span_exporter(
    endpoint: &str,
    protocol: OtlpProtocol,
) -> Result<opentelemetry_otlp::SpanExporter, TelemetryError> {
    match protocol {
        OtlpProtocol::HttpProtobuf => {
            let url = signal_url(endpoint, "traces");
            opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_endpoint(url.clone())
                .build()
                .map_err(|source| TelemetryError::Exporter {
                    endpoint: url,
                    source,
                })
        }
        OtlpProtocol::Grpc => opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .build()
            .map_err(|source| TelemetryError::Exporter {
                endpoint: endpoint.to_owned(),
                source,
            }),
    }
}

fn metric_exporter(
    endpoint: &str,
    protocol: OtlpProtocol,
) -> Result<opentelemetry_otlp::MetricExporter, TelemetryError> {
    match protocol {
        OtlpProtocol::HttpProtobuf => {
            let url = signal_url(endpoint, "metrics");
            opentelemetry_otlp::MetricExporter::builder()
                .with_http()
                .with_endpoint(url.clone())
                .build()
                .map_err(|source| TelemetryError::Exporter {
                    endpoint: url,
                    source,
                })
        }
        OtlpProtocol::Grpc => opentelemetry_otlp::MetricExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .build()
            .map_err(|source| TelemetryError::Exporter {
                endpoint: endpoint.to_owned(),
                source,
            }),
    }
}

/// The OTLP/HTTP URL of `signal` (`traces`, `metrics`) for a base endpoint
/// (`http://host:4318` → `…/v1/traces`); an endpoint that already names a signal's path is
/// taken as the base it ends with.
fn signal_url(endpoint: &str, signal: &str) -> String {
    let mut base = endpoint.trim_end_matches('/');
    for known in ["/v1/traces", "/v1/metrics", "/v1/logs"] {
        base = base.strip_suffix(known).unwrap_or(base);
    }
    format!("{base}/v1/{signal}")
}

/// A span for work the service does on its own for a record made in the trace `traceparent`
/// names (a call's deadline, a task's expiry): a child of that trace when there is one.
pub fn span_for_record(
    name: &'static str,
    service: &'static str,
    traceparent: Option<&str>,
) -> tracing::Span {
    let span = tracing::info_span!(
        "record",
        otel.name = name,
        otel.kind = "internal",
        switchboard.service = service,
        switchboard.correlation_id = tracing::field::Empty,
        switchboard.task_id = tracing::field::Empty,
    );
    if traceparent.is_some() {
        set_parent_from_text(&span, traceparent, None);
    }
    span
}

/// `parent` when it names a trace; otherwise a context whose trace is not sampled, so the span
/// made under it — and everything it causes — is not recorded (see `Endpoint::quiet`).
pub fn unless_traced(parent: Context) -> Context {
    use opentelemetry::trace::{SpanContext, TraceContextExt as _, TraceFlags, TraceState};
    use opentelemetry_sdk::trace::{IdGenerator as _, RandomIdGenerator};
    if parent.span().span_context().is_valid() {
        return parent;
    }
    let ids = RandomIdGenerator::default();
    parent.with_remote_span_context(SpanContext::new(
        ids.new_trace_id(),
        ids.new_span_id(),
        TraceFlags::default(),
        true,
        TraceState::default(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{TraceContextExt, Tracer};

    #[test]
    fn trace_context_round_trips_through_nats_headers() {
        global::set_text_map_propagator(TraceContextPropagator::new());
        let provider = SdkTracerProvider::builder().build();
        let tracer = provider.tracer("test");
        let span = tracer.start("send");
        let cx = Context::current_with_span(span);
        let sent = cx.span().span_context().clone();

        let mut headers = async_nats::HeaderMap::new();
        inject(&cx, &mut headers);
        let traceparent = headers
            .get(switchboard_proto::HEADER_TRACEPARENT)
            .expect("traceparent header")
            .as_str()
            .to_owned();
        assert!(traceparent.starts_with("00-"));
        assert!(traceparent.contains(&sent.trace_id().to_string()));
        // No trace state: no empty `tracestate` header for foreign clients to trip on.
        assert!(headers.get("tracestate").is_none());

        let received = extract(Some(&headers));
        let got = received.span().span_context().clone();
        assert_eq!(got.trace_id(), sent.trace_id());
        assert_eq!(got.span_id(), sent.span_id());
        assert!(got.is_remote());

        assert!(!extract(None).span().span_context().is_valid());
    }

    #[test]
    fn signal_url_appends_the_signal_path_once() {
        assert_eq!(
            signal_url("http://j:4318", "traces"),
            "http://j:4318/v1/traces"
        );
        assert_eq!(
            signal_url("http://j:4318/", "traces"),
            "http://j:4318/v1/traces"
        );
        assert_eq!(
            signal_url("http://j:4318/v1/traces", "traces"),
            "http://j:4318/v1/traces"
        );
        assert_eq!(
            signal_url("http://j:4318/v1/traces", "metrics"),
            "http://j:4318/v1/metrics"
        );
    }
}
