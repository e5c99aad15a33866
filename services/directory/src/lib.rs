//! # directory
//!
//! Agent cards, live goals, status and list_peers for Switchboard (docs/protocol.md §4–§6).
//! All state is in JetStream KV (`agent_registry`, `agent_goals`), written with compare-and-set,
//! so any number of replicas serve the same registry; requests are NATS micro endpoints on
//! `agent.registry.<op>.<agent_id>` in queue group `directory`.
//!
//! Layout: `config.rs` (the `[directory]` section), `error.rs` (errors → stable kinds),
//! `endpoints.rs` (the endpoint table), `registry.rs` (the registry rules: register,
//! heartbeat, peers, lookup, offline sweep), `goals.rs` (the goal rules: open, close),
//! `routing.rs` (skill routing), `grants.rs` (who may be routed which skill), `store.rs` (the KV and JetStream reads and writes), this
//! file (`start`/`run`).

pub mod config;
mod endpoints;
pub mod error;
mod goals;
pub mod grants;
pub mod registry;
mod routing;
mod store;

use std::sync::Arc;
use std::time::Duration;

use async_nats::Client;
use async_nats::jetstream;
use switchboard_proto::DIRECTORY_SERVICE;
use switchboard_runtime::micro::{self, ServiceSpec};
use switchboard_runtime::{CancellationToken, RuntimeConfig, resources};

pub use config::DirectoryConfig;
pub use registry::Registry;

/// The micro service description.
pub const SPEC: ServiceSpec = ServiceSpec {
    name: DIRECTORY_SERVICE,
    version: env!("CARGO_PKG_VERSION"),
    description: "Switchboard directory: agent cards, goals, heartbeats, list_peers",
};

/// The directory could not start.
pub use switchboard_runtime::service::StartError;

/// A started directory: endpoints are subscribed; call [`Directory::run`] to serve.
#[derive(Debug)]
pub struct Directory {
    running: micro::Running,
    registry: Arc<Registry>,
    config: DirectoryConfig,
    grace: Duration,
}

/// Applies the directory's streams and buckets, subscribes its endpoints.
pub async fn start(
    client: &Client,
    runtime: &RuntimeConfig,
    config: DirectoryConfig,
) -> Result<Directory, StartError> {
    config
        .check_skill_routing(runtime)
        .map_err(StartError::Config)?;
    let js = jetstream::new(client.clone());
    resources::ensure_stream(&js, resources::inbox_stream(&runtime.jetstream)).await?;
    resources::ensure_stream(&js, resources::events_stream(&runtime.jetstream)).await?;
    let agents =
        resources::ensure_bucket(&js, resources::registry_bucket(&runtime.jetstream)).await?;
    let goals = resources::ensure_bucket(&js, resources::goals_bucket(&runtime.jetstream)).await?;
    let cursors =
        resources::ensure_bucket(&js, resources::cursors_bucket(&runtime.jetstream)).await?;
    let inbox = js
        .get_stream(switchboard_proto::INBOX_STREAM)
        .await
        .map_err(|err| StartError::Stream {
            stream: switchboard_proto::INBOX_STREAM,
            message: err.to_string(),
        })?;
    let grants = grants::Grants::open(config.skill_grants_file.clone()).map_err(|message| {
        StartError::Stream {
            stream: "skill grants",
            message,
        }
    })?;
    let registry = Arc::new(Registry::new(
        js, agents, goals, cursors, inbox, &config, grants,
    ));
    registry
        .migrate_v1_consumers()
        .await
        .map_err(|err| StartError::Stream {
            stream: switchboard_proto::INBOX_STREAM,
            message: format!("migrating v1 goal consumers: {err}"),
        })?;
    let running = micro::start(
        client,
        SPEC,
        endpoints::endpoints(Arc::clone(&registry)),
        &runtime.requests,
    )
    .await?;
    {
        use switchboard_runtime::telemetry::metrics;
        let view = registry.view().clone();
        metrics::probe_gauge(
            "switchboard.goals.live",
            vec![metrics::service(SPEC.name)],
            Box::new(move || i64::try_from(view.size().1).unwrap_or(i64::MAX)),
        );
    }
    tracing::info!(service = SPEC.name, "directory ready");
    Ok(Directory {
        running,
        registry,
        config,
        grace: runtime.shutdown_grace(),
    })
}

impl Directory {
    /// The registry this directory serves (for in-process callers and tests).
    pub fn registry(&self) -> Arc<Registry> {
        Arc::clone(&self.registry)
    }

    /// Serves requests and sweeps for silent agents until `shutdown`, then drains.
    pub async fn run(self, shutdown: CancellationToken) {
        let sweep = switchboard_runtime::service::sweep_periodically(
            "offline sweep",
            Duration::from_millis(self.config.sweep_interval_ms),
            shutdown.clone(),
            Arc::clone(&self.registry),
            |registry, now| async move { registry.sweep_offline(now).await },
        );
        let view = self.registry.view().clone().watch(shutdown.clone());
        tokio::join!(sweep, view, self.running.run(shutdown, self.grace));
    }
}

/// Starts and serves until `shutdown` (what `main` and `switchboard up` call).
pub async fn run(
    client: &Client,
    runtime: &RuntimeConfig,
    config: DirectoryConfig,
    shutdown: CancellationToken,
) -> Result<(), StartError> {
    start(client, runtime, config).await?.run(shutdown).await;
    Ok(())
}
