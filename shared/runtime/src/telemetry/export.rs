//! Export health: whether the OTLP endpoint takes what this process sends.
//!
//! Every exporter is wrapped in [`Watched`], which counts each failed export by signal and kind
//! (`unreachable`, `timeout`, `rejected`, `other`), logs the first failure of each kind once (a
//! dead collector would otherwise be silent, or fill the log), logs once when exports succeed
//! again, and keeps the last error for [`status`]: the `health` commands, the `up` banner and
//! every service's `$SRV.STATS` read it from there.

use std::collections::BTreeMap;
use std::net::ToSocketAddrs;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::metrics::Temporality;
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use serde::{Deserialize, Serialize};

/// What this process knows of its OTLP export, as `health` and `$SRV.STATS` report it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportStatus {
    /// The collector's base URL; `None` when nothing is exported.
    pub endpoint: Option<String>,
    /// `http/protobuf` or `grpc`.
    pub protocol: Option<String>,
    /// Failed exports so far, by `<signal>.<kind>` (e.g. `traces.unreachable`).
    pub failures: BTreeMap<String, u64>,
    /// Whether the latest export of some signal failed (or the endpoint did not answer at
    /// start and nothing has been exported since).
    pub failing: bool,
    /// The signals whose latest export failed (`traces`, `metrics`), or `endpoint` when it
    /// did not answer at start.
    #[serde(default)]
    pub failing_signals: Vec<String>,
    /// The latest failure's message.
    pub last_error: Option<String>,
    /// Exports that succeeded so far.
    #[serde(default)]
    pub exported: u64,
}

#[derive(Debug, Default)]
struct State {
    endpoint: Option<String>,
    protocol: Option<String>,
    failures: Mutex<BTreeMap<String, u64>>,
    failing: Mutex<std::collections::BTreeSet<&'static str>>,
    last_error: Mutex<Option<String>>,
    exported: AtomicU64,
}

fn state() -> &'static Mutex<Option<&'static State>> {
    static STATE: OnceLock<Mutex<Option<&'static State>>> = OnceLock::new();
    STATE.get_or_init(Mutex::default)
}

fn current() -> Option<&'static State> {
    *state().lock().unwrap_or_else(PoisonError::into_inner)
}

/// Starts watching exports to `endpoint` (once per process; telemetry is installed once).
pub(super) fn watch(endpoint: Option<&str>, protocol: &str) {
    let fresh: &'static State = Box::leak(Box::new(State {
        endpoint: endpoint.map(str::to_owned),
        protocol: endpoint.map(|_| protocol.to_owned()),
        ..State::default()
    }));
    *state().lock().unwrap_or_else(PoisonError::into_inner) = Some(fresh);
}

/// This process's export status (an empty one before telemetry is installed).
pub fn status() -> ExportStatus {
    let Some(state) = current() else {
        return ExportStatus::default();
    };
    ExportStatus {
        endpoint: state.endpoint.clone(),
        protocol: state.protocol.clone(),
        failures: state
            .failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone(),
        failing: !failing_now(state).is_empty(),
        failing_signals: failing_now(state)
            .iter()
            .map(|signal| (*signal).to_owned())
            .collect(),
        last_error: state
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone(),
        exported: state.exported.load(Ordering::Relaxed),
    }
}

fn failing_now(state: &State) -> std::collections::BTreeSet<&'static str> {
    state
        .failing
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone()
}

/// Records what a [`probe`] of the endpoint found before any export was tried: a closed
/// endpoint shows as failing at once, not only after the first batch is dropped.
pub fn record_probe(result: &Result<(), String>) {
    let Some(state) = current() else { return };
    if let Err(why) = result
        && state.exported.load(Ordering::Relaxed) == 0
    {
        state
            .failing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert("endpoint");
        *state
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(format!("does not answer: {why}"));
    }
}

/// Failed exports so far, all signals and kinds (for the export-failures metric).
pub fn failures_total() -> BTreeMap<String, u64> {
    status().failures
}

/// The kind of an export error, from its message (the SDK gives only text).
fn kind_of(message: &str) -> &'static str {
    let lower = message.to_lowercase();
    if lower.contains("timed out") || lower.contains("timeout") || lower.contains("deadline") {
        "timeout"
    } else if lower.contains("connect")
        || lower.contains("refused")
        || lower.contains("dns")
        || lower.contains("unavailable")
        || lower.contains("transport")
        || lower.contains("network")
    {
        "unreachable"
    } else if lower.contains("status") || lower.contains("40") || lower.contains("50") {
        "rejected"
    } else {
        "other"
    }
}

fn record(signal: &'static str, result: &OTelSdkResult) {
    let Some(state) = current() else { return };
    match result {
        Ok(()) => {
            state.exported.fetch_add(1, Ordering::Relaxed);
            let recovered = {
                let mut failing = state.failing.lock().unwrap_or_else(PoisonError::into_inner);
                failing.remove("endpoint");
                failing.remove(signal)
            };
            if recovered {
                tracing::info!(
                    signal,
                    endpoint = state.endpoint.as_deref().unwrap_or(""),
                    "OTLP export works again"
                );
            }
        }
        // A shutdown's second call is no export failure.
        Err(OTelSdkError::AlreadyShutdown) => {}
        Err(err) => {
            let message = err.to_string();
            let key = format!("{signal}.{}", kind_of(&message));
            let first = {
                let mut failures = state
                    .failures
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                let count = failures.entry(key.clone()).or_default();
                *count += 1;
                *count == 1
            };
            let was_failing = !state
                .failing
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(signal);
            *state
                .last_error
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(message.clone());
            // Once per kind, and once again after a recovery: never once per batch.
            if first || !was_failing {
                tracing::warn!(
                    signal,
                    kind = key.as_str(),
                    endpoint = state.endpoint.as_deref().unwrap_or(""),
                    error = %message,
                    "OTLP export failed; telemetry is being dropped (logged once per kind)"
                );
            }
        }
    }
}

/// An exporter whose every result is counted and logged as above.
#[derive(Debug)]
pub struct Watched<E>(pub E);

impl<E: SpanExporter> SpanExporter for Watched<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let result = self.0.export(batch).await;
        record("traces", &result);
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.0.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.0.set_resource(resource);
    }
}

impl<E: PushMetricExporter> PushMetricExporter for Watched<E> {
    async fn export(&self, metrics: &ResourceMetrics) -> OTelSdkResult {
        let result = self.0.export(metrics).await;
        record("metrics", &result);
        result
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.0.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    fn temporality(&self) -> Temporality {
        self.0.temporality()
    }
}

/// Whether something accepts connections at `endpoint`'s host and port (a URL such as
/// `http://jaeger:4318`; without a port, 4318 for `http`, 443 for `https`), within `within`.
/// What the `up` banner and the `health` commands say before any export has been tried.
pub fn probe(endpoint: &str, within: Duration) -> Result<(), String> {
    let (scheme, rest) = endpoint.split_once("://").unwrap_or(("http", endpoint));
    let authority = rest.split('/').next().unwrap_or(rest);
    let authority = authority.rsplit('@').next().unwrap_or(authority);
    let has_port = authority
        .rsplit_once(':')
        .is_some_and(|(_, port)| port.parse::<u16>().is_ok());
    let address = if has_port {
        authority.to_owned()
    } else if scheme == "https" {
        format!("{authority}:443")
    } else {
        format!("{authority}:4318")
    };
    let addresses = address
        .to_socket_addrs()
        .map_err(|err| format!("cannot resolve {address}: {err}"))?;
    let mut last = format!("{address} resolves to no address");
    for addr in addresses {
        match std::net::TcpStream::connect_timeout(&addr, within) {
            Ok(_) => return Ok(()),
            Err(err) => last = format!("{address}: {err}"),
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_sorted_into_kinds() {
        assert_eq!(
            kind_of("reqwest error: error sending request: Connection refused (os error 111)"),
            "unreachable"
        );
        assert_eq!(kind_of("Operation timed out after 10s"), "timeout");
        assert_eq!(kind_of("HTTP export failed. Status Code: 404"), "rejected");
        assert_eq!(kind_of("something else"), "other");
    }

    #[test]
    fn each_signal_fails_and_recovers_on_its_own() {
        watch(Some("http://collector:4318"), "http/protobuf");
        record_probe(&Err("connection refused".to_owned()));
        assert_eq!(status().failing_signals, vec!["endpoint"]);
        // Traces go through (the endpoint answers after all); metrics are refused.
        record("traces", &Ok(()));
        record(
            "metrics",
            &Err(OTelSdkError::InternalFailure(
                "HTTP export failed with status code: 405".to_owned(),
            )),
        );
        record("traces", &Ok(()));
        let now = status();
        assert!(now.failing);
        assert_eq!(now.failing_signals, vec!["metrics"]);
        assert_eq!(now.failures.get("metrics.rejected"), Some(&1));
        assert_eq!(now.exported, 2);
        record("metrics", &Ok(()));
        assert!(!status().failing);
    }

    #[test]
    fn a_closed_port_does_not_answer_and_an_open_one_does() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
        let open = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            probe(&format!("http://{open}"), Duration::from_secs(1)),
            Ok(())
        );
        drop(listener);
        let closed = probe(&format!("http://{open}/v1/traces"), Duration::from_secs(1));
        assert!(closed.is_err(), "{closed:?}");
    }
}
