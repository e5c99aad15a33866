//! # reply-correlator
//!
//! Correlated calls for Switchboard (docs/protocol.md §9): `agent.call.<id>` makes a call
//! that waits for the answer or parks, `agent.reply.<id>` answers by correlation id only (in
//! parts, `partial: true`, before the final reply), `agent.calls.pending.<id>` lists open
//! calls, `agent.calls.parts.<id>` reads a streamed call's parts back. Pending calls live in the `agent_calls` KV
//! bucket with their deadline; every state change is a compare-and-set, so answers and
//! timeouts resolve exactly once across replicas and restarts.
//!
//! How it fits with the other services: docs/architecture.md.
//!
//! Layout: `config.rs` (`[reply_correlator]`), `error.rs` (errors → stable kinds),
//! `endpoints.rs` (the endpoint table), `calls.rs` (making a call, step by step; its request
//! goes through the one door, `switchboard_delivery::door`), `wait.rs` (waiting for the
//! answer), `answers.rs` (the reply rules: claiming a call and delivering its answer), `parts.rs` (streamed answers: partial replies, forwarding them in order, reading
//! them back), `sweep.rs` (the call timeout sweep and the pending listing), `correlator.rs`
//! (the correlator and the waiting calls it holds), `store.rs` (the calls bucket and its open-call index), this file
//! (`start`/`run`).

mod answers;
pub mod calls;
pub mod config;
mod correlator;
mod endpoints;
pub mod error;
mod open;
mod parts;
mod queries;
pub mod store;
mod sweep;
mod wait;

use std::sync::Arc;
use std::time::Duration;

use async_nats::Client;
use async_nats::jetstream;
use switchboard_delivery::door::Door;
use switchboard_proto::REPLY_CORRELATOR_SERVICE;
use switchboard_runtime::micro::{self, ServiceSpec};
use switchboard_runtime::{CancellationToken, RuntimeConfig, resources};

pub use config::CorrelatorConfig;
pub use correlator::Correlator;
pub use switchboard_runtime::service::StartError;

/// The micro service description.
pub const SPEC: ServiceSpec = ServiceSpec {
    name: REPLY_CORRELATOR_SERVICE,
    version: env!("CARGO_PKG_VERSION"),
    description: "Switchboard reply-correlator: calls that wait for an answer, replies, timeouts",
};

/// A started correlator; call [`Running::run`] to serve.
#[derive(Debug)]
pub struct Running {
    running: micro::Running,
    correlator: Arc<Correlator>,
    sweep_every: Duration,
    grace: Duration,
}

/// Applies what it uses (the `agent_calls` bucket, the `AGENT_CALLS_OPEN` index, the inbox
/// stream it writes answers to, the events stream) and subscribes its endpoints.
pub async fn start(
    client: &Client,
    runtime: &RuntimeConfig,
    config: CorrelatorConfig,
) -> Result<Running, StartError> {
    let js = jetstream::new(client.clone());
    resources::ensure_stream(&js, resources::inbox_stream(&runtime.jetstream)).await?;
    resources::ensure_stream(&js, resources::events_stream(&runtime.jetstream)).await?;
    let calls = resources::ensure_bucket(&js, resources::calls_bucket(&runtime.jetstream)).await?;
    resources::ensure_stream(&js, resources::calls_open_stream(&runtime.jetstream)).await?;
    let index = js
        .get_stream(switchboard_proto::CALLS_OPEN_STREAM)
        .await
        .map_err(|err| StartError::Stream {
            stream: switchboard_proto::CALLS_OPEN_STREAM,
            message: err.to_string(),
        })?;
    let sweep_every = Duration::from_millis(config.sweep_interval_ms.max(10));
    // A call's request is delivered in process, through the one door into every inbox, not by
    // a request to the fan-out (docs/protocol.md §9, "Order of checks", step 11). A call never
    // broadcasts.
    let door = Door::open(&js, &runtime.jetstream, 0).await?;
    let correlator = Arc::new(
        Correlator::new(
            client.clone(),
            store::CallStore::new(js, calls, index),
            config,
            door,
        )
        .with_budgets(&runtime.budgets),
    );
    let running = micro::start(
        client,
        SPEC,
        endpoints::endpoints(Arc::clone(&correlator)),
        &runtime.requests,
    )
    .await?;
    tracing::info!(service = SPEC.name, "reply-correlator ready");
    {
        use switchboard_runtime::telemetry::metrics;
        let held = Arc::downgrade(&correlator);
        metrics::probe_gauge(
            "switchboard.calls.waiting",
            vec![metrics::service(SPEC.name)],
            Box::new(move || {
                held.upgrade().map_or(0, |correlator| {
                    i64::try_from(correlator.waiting_now()).unwrap_or(0)
                })
            }),
        );
    }
    Ok(Running {
        running,
        correlator,
        sweep_every,
        grace: runtime.shutdown_grace(),
    })
}

impl Running {
    /// The correlator (for in-process callers and tests).
    pub fn correlator(&self) -> Arc<Correlator> {
        Arc::clone(&self.correlator)
    }

    /// Serves and sweeps deadlines until `shutdown`, then drains.
    pub async fn run(self, shutdown: CancellationToken) {
        let watch = tokio::spawn(self.correlator.door.view().clone().watch(shutdown.clone()));
        let sweep = switchboard_runtime::service::sweep_periodically(
            "deadline sweep",
            self.sweep_every,
            shutdown.clone(),
            Arc::clone(&self.correlator),
            |correlator, now| async move { correlator.sweep(now).await },
        );
        tokio::join!(sweep, self.running.run(shutdown, self.grace));
        // Events written off the requests' paths are stored before the replica stops.
        self.correlator.background.close();
        self.correlator.background.wait().await;
        let _ = watch.await;
    }
}

/// Starts and serves until `shutdown` (what `main` and `switchboard up` call).
pub async fn run(
    client: &Client,
    runtime: &RuntimeConfig,
    config: CorrelatorConfig,
    shutdown: CancellationToken,
) -> Result<(), StartError> {
    start(client, runtime, config).await?.run(shutdown).await;
    Ok(())
}
