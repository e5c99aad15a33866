//! # inbox-fanout
//!
//! The inbox of Switchboard (docs/protocol.md §7, §8): it writes and it reads.
//!
//! Writing is send_to_peer and broadcast: the seed's six gates, ACL, anti-loop, and one durable
//! JetStream publish per live goal of the target, all acks awaited together. Reading is
//! `agent.inbox.fetch.<agent_id>` / `agent.inbox.ack.<agent_id>` against per-goal cursors in KV
//! `agent_cursors`: agents never touch the JetStream API, and a goal costs one KV entry, not a
//! consumer. Stateless apart from NATS: a local view of the registry (fed by KV watches) makes
//! resolution cost no round trip, held fetches are woken by the stream's republished notices;
//! any number of replicas serve in queue group `inbox-fanout`.
//!
//! Layout: `config.rs` (`[inbox_fanout]`), `error.rs` (errors → kinds), `endpoints.rs` (every
//! endpoint: send, send status, fetch, ack), `send.rs` (the send handler), `reader.rs`
//! (the reading rules: ownership, bounds), `fetch.rs` (a fetch, pass by pass), `ack.rs` (ack and reject), `handout.rs` (recording hand-outs, after the reply for a woken fetch), `receipts.rs` (delivered/read receipts and the status request),
//! `store.rs` (cursors, batched reads, dead letters), `wake.rs` (waking held fetches), this
//! file (`start`/`run`); the registry view is `switchboard_delivery::registry_view`.

mod ack;
pub mod config;
mod endpoints;
pub mod error;
mod fetch;
mod handout;
pub mod reader;
pub mod receipts;
pub mod send;
pub mod store;
pub mod wake;

use std::sync::Arc;

use async_nats::Client;
use async_nats::jetstream;
use switchboard_proto::INBOX_FANOUT_SERVICE;
use switchboard_proto::subject::INBOX_STORED_ALL;
use switchboard_runtime::micro::{self, ServiceSpec};
use switchboard_runtime::{CancellationToken, RuntimeConfig, resources};

pub use config::FanoutConfig;
pub use reader::Reader;
pub use receipts::Receipts;
pub use send::Fanout;
use store::InboxStore;
use switchboard_delivery::door::Door;
pub use switchboard_delivery::door::{InboxPublisher, JetStreamPublisher};
pub use switchboard_delivery::registry_view::RegistryView;
use wake::WakeHub;

/// The micro service description.
pub const SPEC: ServiceSpec = ServiceSpec {
    name: INBOX_FANOUT_SERVICE,
    version: env!("CARGO_PKG_VERSION"),
    description: "Switchboard inbox-fanout: send_to_peer, broadcast and reading per-goal inboxes",
};

/// The fan-out could not start.
pub use switchboard_runtime::service::StartError;

/// A started fan-out; call [`Running::run`] to serve.
#[derive(Debug)]
pub struct Running {
    running: micro::Running,
    view: RegistryView,
    wake: WakeHub,
    notices: async_nats::Subscriber,
    stopping: CancellationToken,
    grace: std::time::Duration,
    js: async_nats::jetstream::Context,
}

/// The stores the service works on.
struct Parts {
    js: jetstream::Context,
    view: RegistryView,
    store: InboxStore,
    receipts: Receipts,
}

/// Applies the inbox stream and the buckets the send rules and the reader use (whichever
/// service starts first creates them; applying them again is a no-op) and wraps them.
async fn parts(client: &Client, runtime: &RuntimeConfig) -> Result<Parts, StartError> {
    let js = jetstream::new(client.clone());
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
    let cursors =
        resources::ensure_bucket(&js, resources::cursors_bucket(&runtime.jetstream)).await?;
    let receipts = Receipts::new(
        js.clone(),
        resources::ensure_bucket(&js, resources::receipts_bucket(&runtime.jetstream)).await?,
        cursors.clone(),
    );
    Ok(Parts {
        view: RegistryView::new(js.clone(), agents, goals),
        store: InboxStore::new(js.clone(), cursors, inbox),
        receipts,
        js,
    })
}

/// Applies the resources it needs, starts the registry view and subscribes the endpoints,
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
    let Parts {
        js,
        view,
        store,
        receipts,
    } = parts(client, runtime).await?;
    resources::ensure_stream(&js, resources::dlq_stream(&runtime.jetstream)).await?;
    // Subscribed before the endpoints, so no store notice is missed by a fetch held later.
    let notices =
        client
            .subscribe(INBOX_STORED_ALL)
            .await
            .map_err(|err| StartError::Subscribe {
                subject: INBOX_STORED_ALL,
                message: err.to_string(),
            })?;
    let wake = WakeHub::new(client.statistics());
    let stopping = CancellationToken::new();
    let reader = Arc::new(Reader::new(
        store.clone(),
        wake.clone(),
        receipts.clone(),
        stopping.clone(),
    ));
    let files =
        resources::ensure_bucket(&js, resources::files_index_bucket(&runtime.jetstream)).await?;
    let door = Door::new(
        view.clone(),
        publisher,
        js.clone(),
        receipts.bucket(),
        config.broadcast_cap,
    )
    .with_files(switchboard_delivery::files::Files::new(
        files,
        std::time::Duration::from_secs(runtime.jetstream.files_retention_secs),
    ));
    let fanout = Arc::new(Fanout::new(door, store, js.clone(), config));
    let running = micro::start(
        client,
        SPEC,
        endpoints::endpoints(fanout, reader, receipts),
        &runtime.requests,
    )
    .await?;
    tracing::info!(service = SPEC.name, "inbox-fanout ready");
    Ok(Running {
        running,
        view,
        wake,
        notices,
        stopping,
        grace: runtime.shutdown_grace(),
        js,
    })
}

impl Running {
    /// The registry view (for tests and diagnostics).
    pub fn view(&self) -> RegistryView {
        self.view.clone()
    }

    /// How many goals have a fetch held by this replica (for tests and diagnostics).
    pub fn goals_waiting(&self) -> usize {
        self.wake.goals_waiting()
    }

    /// Serves until `shutdown`, then drains: held fetches are answered (empty) at once, so a
    /// stopping replica keeps no reader waiting.
    pub async fn run(self, shutdown: CancellationToken) {
        let watch = tokio::spawn(self.view.clone().watch(shutdown.clone()));
        let wake = tokio::spawn(self.wake.clone().run(self.notices, shutdown.clone()));
        // The inbox's and the dead letters' sizes, for the metrics (only when they are read).
        let sizes = {
            use switchboard_runtime::telemetry::metrics::{Sample, sample_streams};
            tokio::spawn(sample_streams(
                self.js.clone(),
                SPEC.name,
                vec![
                    Sample::Stream {
                        stream: switchboard_proto::INBOX_STREAM,
                        gauge: "switchboard.inbox.messages",
                    },
                    Sample::Stream {
                        stream: switchboard_proto::DLQ_STREAM,
                        gauge: "switchboard.dlq.messages",
                    },
                ],
                shutdown.clone(),
            ))
        };
        let stopping = self.stopping.clone();
        let stop_holding = shutdown.clone();
        tokio::spawn(async move {
            stop_holding.cancelled().await;
            stopping.cancel();
        });
        self.running.run(shutdown, self.grace).await;
        let _ = tokio::join!(watch, wake, sizes);
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
