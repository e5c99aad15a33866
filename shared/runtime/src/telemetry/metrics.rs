//! Metrics: OpenTelemetry instruments, exported by OTLP when an endpoint is configured and
//! served for Prometheus at `GET /metrics` when `telemetry.metrics_listen` is set.
//!
//! Names follow the OpenTelemetry conventions where one exists (`messaging.process.duration`
//! for every request a service handles, with `messaging.operation.name` = the endpoint and
//! `error.type` = the error kind of a refusal); Switchboard's own are `switchboard.*`. In one
//! process hosting several services (`switchboard up`) every point carries
//! `switchboard.service`. docs/observability.md lists them all.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

pub use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Histogram, Meter};
use opentelemetry_sdk::metrics::SdkMeterProvider;
use tokio_util::sync::CancellationToken;

/// The meter every Switchboard instrument comes from.
pub fn meter() -> Meter {
    opentelemetry::global::meter("switchboard")
}

fn registry() -> &'static Mutex<prometheus::Registry> {
    static REGISTRY: OnceLock<Mutex<prometheus::Registry>> = OnceLock::new();
    REGISTRY.get_or_init(Mutex::default)
}

/// A fresh Prometheus registry for a new meter provider (telemetry installed again, as the
/// in-process tests do).
pub(super) fn new_registry() -> prometheus::Registry {
    let fresh = prometheus::Registry::new();
    *registry().lock().unwrap_or_else(PoisonError::into_inner) = fresh.clone();
    instruments_reset();
    fresh
}

/// The Prometheus text exposition of every metric of this process.
pub fn render() -> String {
    use prometheus::Encoder as _;
    let families = registry()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .gather();
    let mut text = Vec::new();
    if let Err(err) = prometheus::TextEncoder::new().encode(&families, &mut text) {
        return format!("# encoding the metrics failed: {err}\n");
    }
    String::from_utf8_lossy(&text).into_owned()
}

/// Serves `GET /metrics` on `listen` until `stop` is cancelled; returns the bound address
/// (`127.0.0.1:0` picks a free port). Anything else is answered 404 (another path) or 405
/// (another method); nothing a client sends reaches a metric.
pub async fn serve(listen: &str, stop: CancellationToken) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let bound = listener.local_addr()?;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(|| async {
            (
                [(
                    axum::http::header::CONTENT_TYPE,
                    "text/plain; version=0.0.4; charset=utf-8",
                )],
                render(),
            )
        }),
    );
    // The shared accept loop: a client that never finishes its headers is dropped, so a
    // scraper's slot cannot be held by idle connections.
    tokio::spawn(crate::http::serve("metrics", listener, app, stop));
    Ok(bound)
}

/// The instruments the scaffold and the services record into.
#[derive(Debug, Clone)]
pub struct Instruments {
    /// `messaging.process.duration` (s): one point per request a service handled, by service,
    /// endpoint and, for a refusal or failure, `error.type`.
    pub process_duration: Histogram<f64>,
    /// `switchboard.inbox.evicted`: unread messages a full goal removed.
    pub inbox_evicted: Counter<u64>,
    /// `switchboard.inbox.dead_lettered`: messages moved to the dead letters.
    pub dead_lettered: Counter<u64>,
    /// `switchboard.calls`: calls by `switchboard.outcome`: `opened`, and how calls end —
    /// `answered`, `expired` (timed out, or its request was dropped unread), `late_answer`,
    /// `refused`.
    pub calls: Counter<u64>,
    /// `switchboard.task.transitions`: task state changes by `switchboard.task.state`.
    pub task_transitions: Counter<u64>,
    /// `switchboard.publish.retries`: JetStream publishes sent again after a transient failure.
    pub publish_retries: Counter<u64>,
}

fn instruments_cell() -> &'static Mutex<Option<Instruments>> {
    static INSTRUMENTS: OnceLock<Mutex<Option<Instruments>>> = OnceLock::new();
    INSTRUMENTS.get_or_init(Mutex::default)
}

fn instruments_reset() {
    *instruments_cell()
        .lock()
        .unwrap_or_else(PoisonError::into_inner) = None;
}

/// The instruments, made from the installed meter provider on first use.
pub fn instruments() -> Instruments {
    let mut cell = instruments_cell()
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    cell.get_or_insert_with(|| {
        let meter = meter();
        Instruments {
            process_duration: meter
                .f64_histogram("messaging.process.duration")
                .with_unit("s")
                .with_description("Duration of handling one request, by service and endpoint")
                .with_boundaries(vec![
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0, 30.0,
                ])
                .build(),
            inbox_evicted: meter
                .u64_counter("switchboard.inbox.evicted")
                .with_description("Unread messages a full goal removed to make room")
                .build(),
            dead_lettered: meter
                .u64_counter("switchboard.inbox.dead_lettered")
                .with_description("Messages moved to the dead letters (AGENT_DLQ)")
                .build(),
            calls: meter
                .u64_counter("switchboard.calls")
                .with_description(
                    "Calls by outcome: opened, answered, expired, late_answer, refused",
                )
                .build(),
            task_transitions: meter
                .u64_counter("switchboard.task.transitions")
                .with_description("Task state changes, by the state entered")
                .build(),
            publish_retries: meter
                .u64_counter("switchboard.publish.retries")
                .with_description("JetStream publishes sent again after a transient failure")
                .build(),
        }
    })
    .clone()
}

/// The attribute naming the service a point belongs to.
pub fn service(name: &'static str) -> KeyValue {
    KeyValue::new(super::route::SERVICE_ATTRIBUTE, name)
}

/// Gauges whose values a service sets from time to time ([`set_gauge`]) and the meter reads
/// on each collection.
type GaugeValues = HashMap<&'static str, HashMap<Vec<KeyValue>, i64>>;

fn gauges() -> &'static Mutex<GaugeValues> {
    static GAUGES: OnceLock<Mutex<GaugeValues>> = OnceLock::new();
    GAUGES.get_or_init(Mutex::default)
}

/// Gauges set with [`set_gauge`], with their descriptions: registered with each meter provider.
pub const GAUGES: &[(&str, &str)] = &[
    (
        "switchboard.goals.live",
        "Live goals in the directory's view",
    ),
    (
        "switchboard.inbox.messages",
        "Messages stored in AGENT_INBOX (unread, or read and not yet reclaimed)",
    ),
    (
        "switchboard.dlq.messages",
        "Messages in the dead letters (AGENT_DLQ)",
    ),
    (
        "switchboard.calls.waiting",
        "Waiting calls held by this replica",
    ),
    (
        "switchboard.audit.lag",
        "Messages the audit has not recorded yet, by source stream",
    ),
    (
        "switchboard.telemetry.export.failures",
        "Failed OTLP exports, by signal and kind",
    ),
];

/// Sets gauge `name` (one of [`GAUGES`]) for `attributes` to `value`.
pub fn set_gauge(name: &'static str, attributes: Vec<KeyValue>, value: i64) {
    gauges()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .entry(name)
        .or_default()
        .insert(attributes, value);
}

/// A gauge read at each collection from a function (e.g. a count a service holds in memory).
pub type Probe = Box<dyn Fn() -> i64 + Send + Sync>;

type Probes = HashMap<(&'static str, Vec<KeyValue>), Probe>;

fn probes() -> &'static Mutex<Probes> {
    static PROBES: OnceLock<Mutex<Probes>> = OnceLock::new();
    PROBES.get_or_init(Mutex::default)
}

/// Reads gauge `name` (one of [`GAUGES`]) for `attributes` from `probe` at each collection; a
/// later probe for the same gauge and attributes (a service started again in this process)
/// replaces the earlier one.
pub fn probe_gauge(name: &'static str, attributes: Vec<KeyValue>, probe: Probe) {
    probes()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert((name, attributes), probe);
}

/// Registers [`GAUGES`] with the installed provider: each reads [`set_gauge`]'s values and the
/// [`probe_gauge`] functions.
pub(super) fn register_gauges(provider: &SdkMeterProvider) {
    use opentelemetry::metrics::MeterProvider as _;
    let meter = provider.meter("switchboard");
    for (name, description) in GAUGES {
        // Registered with the provider for its lifetime; the handle itself is not needed.
        let _registered = meter
            .i64_observable_gauge(*name)
            .with_description(*description)
            .with_callback(move |observer| {
                if *name == "switchboard.telemetry.export.failures" {
                    for (key, count) in super::export::failures_total() {
                        let (signal, kind) = key.split_once('.').unwrap_or((&key, "other"));
                        observer.observe(
                            i64::try_from(count).unwrap_or(i64::MAX),
                            &[
                                KeyValue::new("signal", signal.to_owned()),
                                KeyValue::new("error.type", kind.to_owned()),
                            ],
                        );
                    }
                    return;
                }
                if let Some(values) = gauges()
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get(name)
                {
                    for (attributes, value) in values {
                        observer.observe(*value, attributes);
                    }
                }
                for ((probe_name, attributes), probe) in probes()
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .iter()
                {
                    if probe_name == name {
                        observer.observe(probe(), attributes);
                    }
                }
            })
            .build();
    }
}

/// What [`sample_streams`] reads.
#[derive(Debug, Clone)]
pub enum Sample {
    /// A stream's message count into a gauge.
    Stream {
        /// The stream, e.g. `AGENT_INBOX`.
        stream: &'static str,
        /// The gauge, e.g. `switchboard.inbox.messages`.
        gauge: &'static str,
    },
    /// A durable consumer's pending plus unacknowledged messages into a gauge (the lag).
    Consumer {
        /// The stream it reads.
        stream: &'static str,
        /// The durable consumer's name.
        consumer: String,
        /// The gauge, e.g. `switchboard.audit.lag`.
        gauge: &'static str,
    },
}

/// How often [`sample_streams`] reads: one `STREAM.INFO` or `CONSUMER.INFO` per item, so an
/// idle system stays quiet.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(10);

/// Reads each of `samples` every [`SAMPLE_EVERY`] into its gauge until `stop`, when metrics are
/// wanted at all (an OTLP endpoint or a `/metrics` listener; see [`super::metrics_wanted`]).
pub async fn sample_streams(
    js: async_nats::jetstream::Context,
    service: &'static str,
    samples: Vec<Sample>,
    stop: CancellationToken,
) {
    if !super::metrics_wanted() || samples.is_empty() {
        return;
    }
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = stop.cancelled() => return,
        }
        for sample in &samples {
            match sample {
                Sample::Stream { stream, gauge } => {
                    if let Ok(found) = js.get_stream(*stream).await {
                        let messages = found.cached_info().state.messages;
                        set_gauge(
                            gauge,
                            vec![self::service(service)],
                            i64::try_from(messages).unwrap_or(i64::MAX),
                        );
                    }
                }
                Sample::Consumer {
                    stream,
                    consumer,
                    gauge,
                } => {
                    let Ok(found) = js.get_stream_no_info(*stream).await else {
                        continue;
                    };
                    if let Ok(info) = found.consumer_info(consumer).await {
                        let unacked = u64::try_from(info.num_ack_pending).unwrap_or(0);
                        let behind = info.num_pending.saturating_add(unacked);
                        set_gauge(
                            gauge,
                            vec![
                                self::service(service),
                                KeyValue::new("messaging.destination.name", *stream),
                            ],
                            i64::try_from(behind).unwrap_or(i64::MAX),
                        );
                    }
                }
            }
        }
    }
}
