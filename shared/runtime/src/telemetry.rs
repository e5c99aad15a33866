//! Logs and traces: `tracing` everywhere, OpenTelemetry OTLP/HTTP export when an endpoint is
//! configured, and W3C trace context (`traceparent`/`tracestate`) carried in NATS headers.
//!
//! The OpenTelemetry layer is installed even without an exporter, so spans always have trace
//! ids and context keeps flowing through a service that does not export itself.
//!
//! [`inject`] and [`extract`] are the one place trace context meets NATS headers (the
//! wasmCloud `opentelemetry-nats` pattern): every publish and request goes through
//! [`traced_headers`], every handler through [`set_parent_from`].

use async_nats::HeaderMap;
use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry::{Context, global};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer as _;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, fmt};

use crate::config::{LogFormat, TelemetryConfig};

/// The standard OTLP endpoint variable.
pub const OTLP_ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
/// The standard service name variable; overrides the name the binary passes.
pub const SERVICE_NAME_ENV: &str = "OTEL_SERVICE_NAME";

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
    /// The OTLP exporter could not be built.
    #[error("building the OTLP exporter for {endpoint}: {source}")]
    Exporter {
        /// The traces URL tried: the configured endpoint with `/v1/traces` appended.
        endpoint: String,
        /// Why.
        source: opentelemetry_otlp::ExporterBuildError,
    },
    /// A global subscriber is already installed.
    #[error("a tracing subscriber is already installed: {0}")]
    AlreadyInstalled(#[from] tracing_subscriber::util::TryInitError),
}

/// Keeps the tracer provider alive; [`TelemetryGuard::shutdown`] flushes pending spans.
#[derive(Debug)]
pub struct TelemetryGuard {
    provider: SdkTracerProvider,
    exporting_to: Option<String>,
}

impl TelemetryGuard {
    /// Where spans are exported, if anywhere.
    pub fn exporting_to(&self) -> Option<&str> {
        self.exporting_to.as_deref()
    }

    /// Flushes and stops the exporter. Call once, at the end of `main`.
    pub fn shutdown(self) {
        if let Err(err) = self.provider.shutdown() {
            eprintln!("telemetry shutdown: {err}");
        }
    }
}

/// Installs the global subscriber (fmt to stderr + OpenTelemetry) and the W3C propagator.
pub fn init(
    service_name: &str,
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
        .unwrap_or_else(|| service_name.to_owned());
    let resource = Resource::builder().with_service_name(service_name).build();
    let mut builder = SdkTracerProvider::builder().with_resource(resource);

    let endpoint = config.otlp_endpoint.clone().or_else(|| {
        std::env::var(OTLP_ENDPOINT_ENV)
            .ok()
            .filter(|url| !url.is_empty())
    });
    if let Some(endpoint) = &endpoint {
        let traces_url = traces_url(endpoint);
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(traces_url.clone())
            .build()
            .map_err(|source| TelemetryError::Exporter {
                endpoint: traces_url,
                source,
            })?;
        builder = builder.with_batch_exporter(exporter);
    }
    let provider = builder.build();
    let tracer = provider.tracer("switchboard");
    global::set_tracer_provider(provider.clone());

    // The log filter applies to log output only: spans must exist for the OpenTelemetry layer
    // even when logs are quiet, or trace context would stop at this service.
    // Colours only for a person at a terminal: a file or a log shipper gets plain text, or
    // one JSON object per line with `log_format = "json"`.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let (text, json) = match config.log_format {
        LogFormat::Text => (
            Some(
                fmt::layer()
                    .with_writer(std::io::stderr)
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
    tracing_subscriber::registry()
        .with(text.with_filter(filter.clone()))
        .with(json.with_filter(filter))
        .with(
            tracing_opentelemetry::layer()
                .with_tracer(tracer)
                .with_filter(LevelFilter::INFO),
        )
        .try_init()?;

    Ok(TelemetryGuard {
        provider,
        exporting_to: endpoint,
    })
}

/// The OTLP/HTTP traces URL for a base endpoint (`http://host:4318` → `…/v1/traces`).
fn traces_url(endpoint: &str) -> String {
    let base = endpoint.trim_end_matches('/');
    if base.ends_with("/v1/traces") {
        base.to_owned()
    } else {
        format!("{base}/v1/traces")
    }
}

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

        let mut headers = HeaderMap::new();
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
    fn traces_url_appends_the_signal_path_once() {
        assert_eq!(traces_url("http://j:4318"), "http://j:4318/v1/traces");
        assert_eq!(traces_url("http://j:4318/"), "http://j:4318/v1/traces");
        assert_eq!(
            traces_url("http://j:4318/v1/traces"),
            "http://j:4318/v1/traces"
        );
    }
}
