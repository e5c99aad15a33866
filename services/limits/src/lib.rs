//! # limits
//!
//! Provider limits the whole fleet shares (docs/protocol.md §15), and cost budgets that flow
//! down a conversation (§16: `budget.rs`, `tree.rs`). An operator declares a
//! limit per key (`openai:gpt-4.1`: concurrent requests, requests and tokens per minute, each
//! agent's share, the longest hold); an agent **acquires** a lease before it calls its
//! provider — waiting, if it asks to, in a queue fair across agents — and **releases** it with
//! the tokens it used. A lease whose holder dies or goes silent returns by itself at its
//! expiry. Each key's leases, waiting acquires and rate buckets are one value in the
//! `agent_limits` KV bucket, changed only by compare-and-set, so however many replicas run
//! and whichever dies, no more leases are out than the limit allows.
//!
//! Layout: `config.rs` (`[limits]`), `error.rs` (errors → stable kinds), `ledger.rs` (a key's
//! state and the rules that change it, pure), `store.rs` (the bucket), `keeper.rs` (one task
//! per key and replica batching requests into compare-and-set writes, holding waiting
//! acquires), `service.rs` (the checks on each request), `endpoints.rs` (the endpoint table),
//! this file (`start`/`run`, the bucket's watch).

pub mod budget;
pub mod config;
mod endpoints;
pub mod error;
mod keeper;
pub mod ledger;
mod service;
pub mod store;
pub mod tree;

use std::sync::Arc;
use std::time::Duration;

use async_nats::Client;
use async_nats::jetstream::{self, kv};
use futures::StreamExt;
use switchboard_proto::LIMITS_SERVICE;
use switchboard_runtime::micro::{self, ServiceSpec};
use switchboard_runtime::{CancellationToken, RuntimeConfig, resources};

pub use budget::Budgets;
pub use config::LimitsConfig;
pub use service::Limits;
pub use switchboard_runtime::service::StartError;

/// The micro service description.
pub const SPEC: ServiceSpec = ServiceSpec {
    name: LIMITS_SERVICE,
    version: env!("CARGO_PKG_VERSION"),
    description: "Switchboard limits: provider limits the fleet shares, as leases; cost budgets",
};

/// A started limits service; call [`Running::run`] to serve.
#[derive(Debug)]
pub struct Running {
    running: micro::Running,
    limits: Arc<Limits>,
    budgets: Arc<Budgets>,
    grace: Duration,
    sweep_every: Duration,
}

/// Applies the bucket and subscribes the endpoints.
pub async fn start(
    client: &Client,
    runtime: &RuntimeConfig,
    config: LimitsConfig,
) -> Result<Running, StartError> {
    let js = jetstream::new(client.clone());
    let bucket =
        resources::ensure_bucket(&js, resources::limits_bucket(&runtime.jetstream)).await?;
    resources::ensure_stream(&js, resources::events_stream(&runtime.jetstream)).await?;
    // Budget notices go into inboxes through the one door (docs/protocol.md §7).
    let door = switchboard_delivery::door::Door::open(&js, &runtime.jetstream, 0).await?;
    let budgets = Arc::new(Budgets::new(
        bucket.clone(),
        js.clone(),
        door,
        runtime.budgets.clone(),
    ));
    let sweep_every = Duration::from_millis(config.budget_sweep_ms);
    let limits = Arc::new(Limits::new(
        store::LimitStore::new(bucket, js.clone()),
        client.clone(),
        config,
    ));
    let mut table = endpoints::endpoints(&limits);
    table.extend(endpoints::budget_endpoints(&budgets));
    let running = micro::start(client, SPEC, table, &runtime.requests).await?;
    tracing::info!(service = SPEC.name, "limits ready");
    Ok(Running {
        running,
        limits,
        budgets,
        grace: runtime.shutdown_grace(),
        sweep_every,
    })
}

impl Running {
    /// The service (for in-process callers and tests).
    pub fn limits(&self) -> Arc<Limits> {
        Arc::clone(&self.limits)
    }

    /// The budgets (for in-process callers and tests).
    pub fn budgets(&self) -> Arc<Budgets> {
        Arc::clone(&self.budgets)
    }

    /// Serves and follows the bucket until `shutdown`, then drains.
    pub async fn run(self, shutdown: CancellationToken) {
        let watch = tokio::spawn(follow(Arc::clone(&self.limits), shutdown.clone()));
        let view = tokio::spawn(self.budgets.door().view().clone().watch(shutdown.clone()));
        let sweeper = tokio::spawn(sweep_budgets(
            Arc::clone(&self.budgets),
            self.sweep_every,
            shutdown.clone(),
        ));
        self.running.run(shutdown, self.grace).await;
        let _ = watch.await;
        let _ = view.await;
        let _ = sweeper.await;
    }
}

/// Every `every`, removes the budget trees whose work all ended by its deadline alone
/// (`[limits] budget_sweep_ms`; every replica sweeps, and a tree removed twice is removed once).
async fn sweep_budgets(budgets: Arc<Budgets>, every: Duration, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = shutdown.cancelled() => return,
        }
        match budgets.sweep().await {
            Ok(0) => {}
            Ok(removed) => tracing::info!(removed, "budget trees ended by their deadlines removed"),
            Err(err) => tracing::warn!(error = %err, "budget sweep failed"),
        }
    }
}

/// Keeps this replica's limits and keepers in step with what every replica writes (a broken
/// watch is set up again and replays every key's latest value).
async fn follow(limits: Arc<Limits>, shutdown: CancellationToken) {
    loop {
        match limits.store.bucket().watch_with_history(">").await {
            Ok(mut watch) => loop {
                let next = tokio::select! {
                    next = watch.next() => next,
                    () = shutdown.cancelled() => return,
                };
                match next {
                    Some(Ok(entry)) => apply(&limits, &entry),
                    Some(Err(err)) => {
                        tracing::warn!(error = %err, "limits watch error");
                        break;
                    }
                    None => break,
                }
            },
            Err(err) => tracing::warn!(error = %err, "cannot watch the limits bucket"),
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(250)) => {}
            () = shutdown.cancelled() => return,
        }
    }
}

fn apply(limits: &Limits, entry: &kv::Entry) {
    let live = entry.operation == kv::Operation::Put;
    if let Some(h) = entry.key.strip_prefix("spec.") {
        match live
            .then(|| serde_json::from_slice(&entry.value).ok())
            .flatten()
        {
            Some(spec) => {
                limits.specs.put(&spec);
                limits.keepers.spec_changed(&spec);
            }
            None => limits.specs.forget(h),
        }
    } else if let Some(h) = entry.key.strip_prefix("state.") {
        let value = match live {
            true => entry.value.clone(),
            false => bytes::Bytes::new(),
        };
        limits.keepers.changed(h, value, entry.revision);
    }
}

/// Starts and serves until `shutdown` (what `main` and `switchboard up` call).
pub async fn run(
    client: &Client,
    runtime: &RuntimeConfig,
    config: LimitsConfig,
    shutdown: CancellationToken,
) -> Result<(), StartError> {
    start(client, runtime, config).await?.run(shutdown).await;
    Ok(())
}
