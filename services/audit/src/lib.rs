//! # audit
//!
//! The append-only trail of everything that crosses Switchboard (docs/protocol.md §11):
//! every inbox delivery and every registry, call, task and refusal event is recorded once, in
//! order, in the stream `AGENT_AUDIT`, hash-chained so a changed, removed or inserted record is
//! found by `agent.audit.verify`. An embedded SQLite index, rebuildable from the stream at any
//! time, answers `agent.audit.thread`, `history`, `pending` and `export`.
//!
//! Layout: `config.rs` (`[audit]`), `error.rs` (errors → stable kinds), `endpoints.rs` (the
//! endpoint table), `queries.rs` (thread, history, pending, export, verify), `record.rs`
//! (source message → record, hashing), `trail.rs` (the trail and ingest), `lease.rs` (the
//! writer lease), `appender.rs` (source streams → chained records), `indexer.rs` (stream →
//! index), `verify.rs` (the hash chain check), `index.rs` (SQLite), `store.rs` (JetStream
//! reads and writes), this file (`start`/`run`).

mod appender;
pub mod config;
pub mod cost;
mod endpoints;
pub mod error;
pub mod index;
mod indexer;
mod ingest;
mod lease;
mod queries;
pub mod record;
pub mod store;
pub mod trail;
mod verify;

use std::sync::Arc;
use std::time::Duration;

use async_nats::Client;
use async_nats::jetstream;
use switchboard_proto::{AUDIT_SERVICE, AUDIT_STREAM};
use switchboard_runtime::micro::{self, ServiceSpec};
use switchboard_runtime::{CancellationToken, RuntimeConfig, resources};

pub use config::AuditConfig;
pub use queries::Queries;
pub use switchboard_runtime::service::StartError;
pub use trail::Trail;

/// The micro service description.
pub const SPEC: ServiceSpec = ServiceSpec {
    name: AUDIT_SERVICE,
    version: env!("CARGO_PKG_VERSION"),
    description: "Switchboard audit: hash-chained trail, threads, history, export, verify",
};

/// A started audit service; call [`Running::run`] to serve and ingest.
#[derive(Debug)]
pub struct Running {
    running: micro::Running,
    trail: Arc<Trail>,
    js: jetstream::Context,
    config: AuditConfig,
    grace: Duration,
}

/// Applies the streams it reads and writes, opens (and catches up) the index, and subscribes
/// the query endpoints.
pub async fn start(
    client: &Client,
    runtime: &RuntimeConfig,
    config: AuditConfig,
) -> Result<Running, StartError> {
    let js = jetstream::new(client.clone());
    let settings = &runtime.jetstream;
    resources::ensure_stream(&js, resources::inbox_stream(settings)).await?;
    resources::ensure_stream(&js, resources::events_stream(settings)).await?;
    resources::ensure_stream(&js, resources::audit_stream(settings)).await?;
    resources::ensure_bucket(
        &js,
        resources::audit_lease_bucket(settings, Duration::from_millis(config.lease_ttl_ms)),
    )
    .await?;
    let stream = js
        .get_stream(AUDIT_STREAM)
        .await
        .map_err(|err| StartError::Stream {
            stream: AUDIT_STREAM,
            message: err.to_string(),
        })?;
    let index = index::Index::open(&config.index_path).map_err(|err| StartError::Stream {
        stream: AUDIT_STREAM,
        message: err.to_string(),
    })?;
    let trail = Arc::new(
        Trail::open(js.clone(), stream, Arc::new(index))
            .await
            .map_err(|err| StartError::Stream {
                stream: AUDIT_STREAM,
                message: err.to_string(),
            })?,
    );
    let queries = Arc::new(Queries::new(client.clone(), Arc::clone(&trail)));
    let running = micro::start(
        client,
        SPEC,
        endpoints::endpoints(&queries),
        &runtime.requests,
    )
    .await?;
    tracing::info!(service = SPEC.name, "audit ready");
    Ok(Running {
        running,
        trail,
        js,
        config,
        grace: runtime.shutdown_grace(),
    })
}

impl Running {
    /// The trail (for in-process callers and tests).
    pub fn trail(&self) -> Arc<Trail> {
        Arc::clone(&self.trail)
    }

    /// Ingests and serves until `shutdown`, then drains.
    pub async fn run(self, shutdown: CancellationToken) {
        let ingest = ingest::ingest(
            Arc::clone(&self.trail),
            self.js.clone(),
            trail::IngestSettings::from(&self.config),
            shutdown.clone(),
        );
        let ingest = async move {
            // Logged when it happens: a replica that cannot ingest still answers queries.
            if let Err(err) = ingest.await {
                tracing::error!(error = %err, "audit ingest stopped; this replica only answers queries");
            }
        };
        // How far behind its sources the trail is, for the metrics (only when they are read).
        let lag = {
            use switchboard_runtime::telemetry::metrics::{Sample, sample_streams};
            let consumer = &self.config.consumer;
            sample_streams(
                self.js.clone(),
                SPEC.name,
                vec![
                    Sample::Consumer {
                        stream: switchboard_proto::INBOX_STREAM,
                        consumer: format!("{consumer}-inbox"),
                        gauge: "switchboard.audit.lag",
                    },
                    Sample::Consumer {
                        stream: switchboard_proto::EVENTS_STREAM,
                        consumer: format!("{consumer}-events"),
                        gauge: "switchboard.audit.lag",
                    },
                ],
                shutdown.clone(),
            )
        };
        // One task for all, so stopping (or aborting) the service stops its writer too.
        tokio::join!(ingest, lag, self.running.run(shutdown, self.grace));
    }
}

/// Starts and serves until `shutdown` (what `main` and `switchboard up` call).
pub async fn run(
    client: &Client,
    runtime: &RuntimeConfig,
    config: AuditConfig,
    shutdown: CancellationToken,
) -> Result<(), StartError> {
    start(client, runtime, config).await?.run(shutdown).await;
    Ok(())
}

/// Sets every thread of this process to the CPU priority `nice` (a Linux nice value; 0 leaves
/// them as they are). Threads started later inherit it from the thread that starts them. The
/// `audit` binary calls this with `audit.nice`: the trail is written asynchronously, so on
/// cores shared with nats-server and the message path it yields and catches up when they are
/// idle. Failures are logged, not fatal (the audit works at any priority).
pub fn yield_cpu(nice: i32) {
    if nice == 0 {
        return;
    }
    let tasks = match std::fs::read_dir("/proc/self/task") {
        Ok(tasks) => tasks,
        Err(err) => {
            tracing::debug!(error = %err, "threads not listed; the audit keeps its CPU priority");
            return;
        }
    };
    for task in tasks.flatten() {
        let tid = task
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<i32>().ok())
            .and_then(rustix::process::Pid::from_raw);
        if let Some(tid) = tid
            && let Err(err) = rustix::process::setpriority_process(Some(tid), nice)
        {
            tracing::debug!(error = %err, "a thread kept its CPU priority");
        }
    }
    tracing::info!(nice, "audit CPU priority lowered");
}
