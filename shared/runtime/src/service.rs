//! What every service binary does, once: load config (exit 64 on a bad one), start telemetry,
//! connect, run until SIGINT/SIGTERM, drain, flush spans. A service's `main.rs` is one call.
//!
//! ```no_run
//! # mod directory { pub mod config { pub const SECTION: &str = "directory"; }
//! #   #[derive(Default, serde::Serialize, serde::Deserialize)] pub struct DirectoryConfig;
//! #   impl switchboard_runtime::config::Section for DirectoryConfig {}
//! #   pub async fn run(_: &async_nats::Client, _: &switchboard_runtime::RuntimeConfig,
//! #       _: DirectoryConfig, _: switchboard_runtime::CancellationToken)
//! #       -> Result<(), std::io::Error> { Ok(()) } }
//! fn main() -> std::process::ExitCode {
//!     switchboard_runtime::service::main(
//!         "directory",
//!         directory::config::SECTION,
//!         |client, runtime, config: directory::DirectoryConfig, shutdown| async move {
//!             directory::run(&client, &runtime, config, shutdown).await
//!         },
//!     )
//! }
//! ```
//!
//! The async runtime is built from the configuration (`worker_threads`): one thread by default,
//! so a request's hops inside the service (connection, handler, publish, ack) wake no other
//! thread.

use std::fmt::Display;
use std::future::Future;
use std::process::ExitCode;
use std::time::Duration;

use async_nats::Client;
use tokio_util::sync::CancellationToken;

use crate::{RuntimeConfig, config, micro, nats, resources, shutdown, telemetry};

/// Exit code for bad configuration (BSD `EX_USAGE`).
pub const EXIT_BAD_CONFIG: u8 = 64;

/// Runs a service binary named `name` whose settings are the config section `section`.
///
/// `<binary> health` instead checks a running instance (for container probes) and exits 0 when
/// it is healthy, 1 when not: NATS reachable with the same configuration, JetStream answering,
/// and *this host's* instance answering a micro `PING` addressed to its own id (which it wrote
/// to [`micro::health_id_file`] at start), so a process that lost NATS or stopped serving fails.
pub fn main<C, F, Fut, E>(name: &'static str, section: &str, run: F) -> ExitCode
where
    C: config::Section,
    F: FnOnce(Client, RuntimeConfig, C, CancellationToken) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: Display,
{
    let figment = config::figment();
    let loaded = RuntimeConfig::load(&figment).and_then(|runtime| {
        let service = config::section_for::<C>(&figment, section, &runtime)?;
        Ok((runtime, service))
    });
    let (runtime, service) = match loaded {
        Ok(loaded) => loaded,
        Err(err) => {
            eprintln!("{name}: {err}");
            return ExitCode::from(EXIT_BAD_CONFIG);
        }
    };
    match async_runtime(runtime.worker_threads) {
        Ok(tokio) => tokio.block_on(serve(name, runtime, service, run)),
        Err(err) => {
            eprintln!("{name}: cannot start the async runtime: {err}");
            ExitCode::FAILURE
        }
    }
}

/// `work`'s output, or `None` when `stop` was cancelled and `grace` has passed since without
/// `work` finishing (a service still starting, or stuck draining, when SIGTERM came).
async fn within_grace<T>(
    work: impl Future<Output = T>,
    stop: &CancellationToken,
    grace: Duration,
) -> Option<T> {
    tokio::select! {
        done = work => Some(done),
        () = async {
            stop.cancelled().await;
            tokio::time::sleep(grace).await;
        } => None,
    }
}

/// The async runtime for `worker_threads` (see [`RuntimeConfig::worker_threads`]): 1 is a
/// current-thread runtime, 0 a multi-thread runtime with a worker per core, N one with N.
pub fn async_runtime(worker_threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = if worker_threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        if worker_threads > 1 {
            builder.worker_threads(worker_threads);
        }
        builder
    };
    builder.enable_all().build()
}

/// The service once its configuration is read: health check or run.
async fn serve<C, F, Fut, E>(
    name: &'static str,
    runtime: RuntimeConfig,
    service: C,
    run: F,
) -> ExitCode
where
    C: config::Section,
    F: FnOnce(Client, RuntimeConfig, C, CancellationToken) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: Display,
{
    if std::env::args().nth(1).as_deref() == Some("health") {
        return match health(name, &runtime).await {
            Ok(report) => {
                println!("{name}: healthy ({report})");
                ExitCode::SUCCESS
            }
            Err(why) => {
                eprintln!("{name}: unhealthy: {why}");
                ExitCode::FAILURE
            }
        };
    }
    // From here on SIGINT/SIGTERM stop the service cleanly (even while it connects).
    let stop = shutdown::on_signal();
    let telemetry = match telemetry::init(name, &runtime.telemetry) {
        Ok(guard) => guard,
        Err(err) => {
            eprintln!("{name}: {err}");
            return ExitCode::from(EXIT_BAD_CONFIG);
        }
    };
    if let Some(listen) = &runtime.telemetry.metrics_listen {
        match telemetry::metrics::serve(listen, stop.clone()).await {
            Ok(bound) => tracing::info!(service = name, "metrics at http://{bound}/metrics"),
            Err(err) => {
                eprintln!("{name}: cannot serve /metrics on {listen}: {err}");
                telemetry.shutdown();
                return ExitCode::from(EXIT_BAD_CONFIG);
            }
        }
    }
    if let Some(endpoint) = telemetry.exporting_to() {
        let endpoint = endpoint.to_owned();
        let probed = tokio::task::spawn_blocking({
            let endpoint = endpoint.clone();
            move || telemetry::export::probe(&endpoint, Duration::from_secs(1))
        })
        .await;
        if let Ok(Err(why)) = probed {
            tracing::warn!(service = name, %endpoint, error = %why, "the OTLP endpoint does not answer; traces and metrics are dropped until it does");
        }
    }
    let connected = tokio::select! {
        connected = nats::connect(&runtime.nats, name) => connected,
        () = stop.cancelled() => {
            // Stopped before NATS answered (it may be retrying the first connect).
            telemetry.shutdown();
            return ExitCode::SUCCESS;
        }
    };
    let code = match connected {
        Ok(client) => {
            let js = async_nats::jetstream::new(client.clone());
            let checked = tokio::select! {
                checked = resources::check_replicas(&js, &runtime.jetstream) => checked,
                () = stop.cancelled() => {
                    // Stopped before JetStream answered (e.g. the first connect is retried).
                    telemetry.shutdown();
                    return ExitCode::SUCCESS;
                }
            };
            match checked {
                Err(err) if err.misconfigured => {
                    eprintln!("{name}: {err}");
                    tracing::error!(service = name, error = %err, "bad configuration");
                    telemetry.shutdown();
                    return ExitCode::from(EXIT_BAD_CONFIG);
                }
                // Not a setting problem (e.g. JetStream still electing a leader): the service's
                // own start applies the streams again and reports what fails there.
                Err(err) => tracing::warn!(service = name, error = %err, "replicas check failed"),
                Ok(()) => {}
            }
            // After SIGINT/SIGTERM the service has the grace period to finish, whatever it is
            // doing (still starting, or serving requests in flight); then the process exits.
            let grace = Duration::from_millis(runtime.shutdown_grace_ms);
            let running = run(client.clone(), runtime, service, stop.clone());
            let outcome = match within_grace(running, &stop, grace).await {
                Some(outcome) => outcome,
                None => {
                    tracing::warn!(
                        service = name,
                        "not stopped within the shutdown grace period; exiting"
                    );
                    Ok(())
                }
            };
            match tokio::time::timeout(grace, client.drain()).await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => tracing::warn!(error = %err, "draining the NATS connection failed"),
                Err(_) => tracing::warn!("draining the NATS connection timed out"),
            }
            match outcome {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => {
                    tracing::error!(service = name, error = %err, "service failed");
                    ExitCode::FAILURE
                }
            }
        }
        Err(err) => {
            tracing::error!(service = name, error = %err, "cannot connect to NATS");
            ExitCode::FAILURE
        }
    };
    telemetry.shutdown();
    code
}

/// Runs `job` every `every` until `stop` (a missed tick waits, never bursts); a failed run is
/// logged as `what failed` and the next tick tries again. The services' sweeps run this beside
/// their endpoints, in the same task, so stopping (or aborting) a service stops its sweep too.
async fn periodically<F, Fut, E>(
    what: &str,
    every: std::time::Duration,
    stop: CancellationToken,
    mut job: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: Display,
{
    let mut ticker = tokio::time::interval(every.max(std::time::Duration::from_millis(10)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            () = stop.cancelled() => return,
        }
        if let Err(err) = job().await {
            tracing::warn!(error = %err, "{what} failed");
        }
    }
}

/// Runs `sweep(target, now)` every `every` until `stop`: a service's deadline or offline sweep.
/// What it returns (a count) is dropped; a failure is logged and the next tick tries again.
pub async fn sweep_periodically<T, F, Fut, N, E>(
    what: &str,
    every: std::time::Duration,
    stop: CancellationToken,
    target: std::sync::Arc<T>,
    sweep: F,
) where
    F: Fn(std::sync::Arc<T>, switchboard_proto::timestamp::OffsetDateTime) -> Fut,
    Fut: Future<Output = Result<N, E>>,
    E: Display,
{
    periodically(what, every, stop, || {
        let swept = sweep(
            std::sync::Arc::clone(&target),
            switchboard_proto::timestamp::now(),
        );
        async move { swept.await.map(|_| ()) }
    })
    .await;
}

/// The `health` check (see [`main`]).
async fn health(name: &str, runtime: &RuntimeConfig) -> Result<String, String> {
    let wait = std::time::Duration::from_secs(3);
    let client = tokio::time::timeout(
        wait,
        nats::connect(&runtime.nats, &format!("{name}-health")),
    )
    .await
    .map_err(|_| "NATS did not answer within 3 s".to_owned())?
    .map_err(|err| format!("cannot connect to NATS: {err}"))?;
    let js = async_nats::jetstream::new(client.clone());
    tokio::time::timeout(wait, js.query_account())
        .await
        .map_err(|_| "JetStream did not answer within 3 s".to_owned())?
        .map_err(|err| format!("JetStream unavailable: {err}"))?;
    let path = micro::health_id_file(name);
    let id = std::fs::read_to_string(&path)
        .map_err(|err| format!("no instance id at {} ({err}); not started?", path.display()))?;
    let subject = switchboard_proto::subject::service_ping(name, Some(id.trim()));
    tokio::time::timeout(wait, client.request(subject.clone(), "".into()))
        .await
        .map_err(|_| format!("{subject} not answered within 3 s"))?
        .map_err(|err| format!("{subject}: {err}"))?;
    // The instance's own view of its export (failures it counted), else a probe from here.
    let stats = switchboard_proto::subject::service_stats(name, Some(id.trim()));
    let exported = match tokio::time::timeout(wait, client.request(stats, "".into())).await {
        Ok(Ok(reply)) => export_line(&reply.payload),
        _ => None,
    };
    let exported = exported.unwrap_or_else(|| match &runtime.telemetry.otlp_endpoint {
        None => "telemetry not exported".to_owned(),
        Some(endpoint) => match telemetry::export::probe(endpoint, Duration::from_secs(1)) {
            Ok(()) => format!("telemetry to {endpoint}"),
            Err(why) => format!("telemetry NOT EXPORTED: {endpoint} does not answer ({why})"),
        },
    });
    Ok(format!(
        "instance {} answers, JetStream reachable; {exported}",
        id.trim()
    ))
}

/// What a `$SRV.STATS` reply says of the instance's OTLP export, as one line.
pub fn export_line(stats: &[u8]) -> Option<String> {
    let stats: serde_json::Value = serde_json::from_slice(stats).ok()?;
    let status: telemetry::export::ExportStatus = stats
        .get("endpoints")?
        .as_array()?
        .iter()
        .find_map(|endpoint| endpoint.get("data")?.get("telemetry").cloned())
        .and_then(|status| serde_json::from_value(status).ok())?;
    Some(describe_export(&status))
}

/// One line on an export status: where to, and whether it fails.
pub fn describe_export(status: &telemetry::export::ExportStatus) -> String {
    let Some(endpoint) = &status.endpoint else {
        return "telemetry not exported".to_owned();
    };
    let failed: u64 = status.failures.values().sum();
    if status.failing && failed == 0 {
        format!(
            "telemetry NOT EXPORTED: {endpoint} {}",
            status.last_error.as_deref().unwrap_or("does not answer")
        )
    } else if status.failing {
        format!(
            "telemetry NOT EXPORTED: {endpoint} fails for {} ({failed} failed exports; last: {})",
            status.failing_signals.join(", "),
            status.last_error.as_deref().unwrap_or("unknown")
        )
    } else if failed > 0 {
        format!("telemetry to {endpoint} (working again after {failed} failed exports)")
    } else if status.exported == 0 {
        format!("telemetry to {endpoint} (nothing exported yet)")
    } else {
        format!("telemetry to {endpoint}")
    }
}

/// Why a service could not start (shared by every service's `start`).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A stream or bucket could not be applied.
    #[error(transparent)]
    Resource(#[from] resources::ResourceError),
    /// A stream the service reads could not be opened.
    #[error("opening stream {stream}: {message}")]
    Stream {
        /// Name of the stream, e.g. `AGENT_INBOX`.
        stream: &'static str,
        /// Why.
        message: String,
    },
    /// A core NATS subscription the service needs could not be made.
    #[error("subscribing to {subject}: {message}")]
    Subscribe {
        /// The subject it needs, e.g. `_SB.inbox.stored.*` for held fetches.
        subject: &'static str,
        /// Why.
        message: String,
    },
    /// The micro service could not start.
    #[error(transparent)]
    Micro(#[from] micro::MicroError),
    /// A file of CA certificates (the A2A gateway's `ca_file`) could not be read.
    #[error("reading CA certificates from {path}: {message}")]
    Certificates {
        /// The file.
        path: String,
        /// Why (missing, not PEM, no certificate in it).
        message: String,
    },
    /// The settings cannot run safely together (checked again at start, for services
    /// started in-process without `service::main`).
    #[error("config: {0}")]
    Config(String),
    /// An HTTP listener (the A2A gateway's) could not bind its address.
    #[error("listening on {address}: {message}")]
    Listen {
        /// The address it was to bind, e.g. `127.0.0.1:9999`.
        address: String,
        /// Why (address in use, no permission…).
        message: String,
    },
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{async_runtime, within_grace};
    use tokio::runtime::RuntimeFlavor;
    use tokio_util::sync::CancellationToken;

    #[tokio::test(start_paused = true)]
    async fn after_a_stop_the_work_has_the_grace_period_and_no_more() {
        let stop = CancellationToken::new();
        let grace = Duration::from_secs(3);
        // Work that finishes is waited for, stopped or not.
        assert_eq!(within_grace(async { 7 }, &stop, grace).await, Some(7));
        // Work that ignores the stop is given up `grace` after it.
        let started = tokio::time::Instant::now();
        let stopper = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            stopper.cancel();
        });
        let never = std::future::pending::<()>();
        assert_eq!(within_grace(never, &stop, grace).await, None);
        assert_eq!(started.elapsed(), Duration::from_secs(4));
        // Work that finishes within the grace period keeps its outcome.
        let slow = async {
            tokio::time::sleep(Duration::from_secs(2)).await;
            "drained"
        };
        assert_eq!(within_grace(slow, &stop, grace).await, Some("drained"));
    }

    #[test]
    fn worker_threads_choose_the_runtime() {
        let flavor = |threads| {
            async_runtime(threads)
                .map(|rt| rt.handle().runtime_flavor())
                .ok()
        };
        assert_eq!(flavor(1), Some(RuntimeFlavor::CurrentThread));
        assert_eq!(flavor(0), Some(RuntimeFlavor::MultiThread));
        assert_eq!(flavor(3), Some(RuntimeFlavor::MultiThread));
        let three = async_runtime(3).map(|rt| rt.metrics().num_workers()).ok();
        assert_eq!(three, Some(3));
    }
}
