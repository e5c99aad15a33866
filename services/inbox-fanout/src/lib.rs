//! # inbox-fanout
//!
//! send_to_peer and broadcast for Switchboard (ARCHITECTURE.md §3–§6): the seed's six gates,
//! ACL, anti-loop, and one durable JetStream publish per live goal of the target, all acks
//! awaited together. Stateless apart from NATS: a local view of the registry (fed by KV
//! watches) makes resolution cost no round trip; any number of replicas serve
//! `agent.send.<agent_id>` in queue group `inbox-fanout`.
//!
//! Layout: `config.rs` (`[inbox_fanout]`), `error.rs` (errors → kinds), `handlers.rs` (the
//! send path), this file (`start`/`run`); the registry view is `switchboard_runtime::registry_view`.

pub mod config;
pub mod error;
pub mod handlers;

use std::sync::Arc;

use async_nats::Client;
use async_nats::jetstream;
use switchboard_proto::INBOX_FANOUT_SERVICE;
use switchboard_runtime::micro::{self, ServiceSpec};
use switchboard_runtime::{CancellationToken, RuntimeConfig, resources};

pub use config::FanoutConfig;
pub use handlers::{Fanout, InboxPublisher, JetStreamPublisher};
pub use switchboard_runtime::registry_view::RegistryView;

/// The micro service description.
pub const SPEC: ServiceSpec = ServiceSpec {
    name: INBOX_FANOUT_SERVICE,
    version: env!("CARGO_PKG_VERSION"),
    description: "Switchboard inbox-fanout: send_to_peer and broadcast into per-goal inboxes",
};

/// The fan-out could not start.
pub use switchboard_runtime::service::StartError;

/// A started fan-out; call [`Running::run`] to serve.
#[derive(Debug)]
pub struct Running {
    running: micro::Running,
    view: RegistryView,
    grace: std::time::Duration,
}

/// Applies the resources it needs, starts the registry view and subscribes the endpoint,
/// publishing to JetStream.
pub async fn start(
    client: &Client,
    runtime: &RuntimeConfig,
    config: FanoutConfig,
) -> Result<Running, StartError> {
    let publisher = Arc::new(JetStreamPublisher(jetstream::new(client.clone())));
    start_with(client, runtime, config, publisher).await
}

/// [`start`] with a chosen publisher (tests wrap the JetStream one to inject failures).
pub async fn start_with(
    client: &Client,
    runtime: &RuntimeConfig,
    config: FanoutConfig,
    publisher: Arc<dyn InboxPublisher>,
) -> Result<Running, StartError> {
    let js = jetstream::new(client.clone());
    // Whichever service starts first creates these; applying them again is a no-op.
    resources::ensure_stream(&js, resources::inbox_stream(&runtime.jetstream)).await?;
    let agents =
        resources::ensure_bucket(&js, resources::registry_bucket(&runtime.jetstream)).await?;
    let goals = resources::ensure_bucket(&js, resources::goals_bucket(&runtime.jetstream)).await?;
    let inbox = js
        .get_stream(switchboard_proto::INBOX_STREAM)
        .await
        .map_err(|err| StartError::Stream {
            stream: switchboard_proto::INBOX_STREAM,
            message: err.to_string(),
        })?;
    let view = RegistryView::new(js.clone(), agents, goals);
    let fanout = Arc::new(Fanout::new(view.clone(), publisher, inbox, js, config));
    let running = micro::start(client, SPEC, fanout.endpoints()).await?;
    tracing::info!(service = SPEC.name, "inbox-fanout ready");
    Ok(Running {
        running,
        view,
        grace: runtime.shutdown_grace(),
    })
}

impl Running {
    /// The registry view (for tests and diagnostics).
    pub fn view(&self) -> RegistryView {
        self.view.clone()
    }

    /// Serves until `shutdown`, then drains.
    pub async fn run(self, shutdown: CancellationToken) {
        let watch = tokio::spawn(self.view.clone().watch(shutdown.clone()));
        self.running.run(shutdown, self.grace).await;
        let _ = watch.await;
    }
}

/// Starts and serves until `shutdown` (what `main` and `switchboard up` call).
pub async fn run(
    client: &Client,
    runtime: &RuntimeConfig,
    config: FanoutConfig,
    shutdown: CancellationToken,
) -> Result<(), StartError> {
    start(client, runtime, config).await?.run(shutdown).await;
    Ok(())
}
