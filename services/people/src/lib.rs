//! # people
//!
//! People in the fabric (docs/protocol.md §14). A person (`person:alice`) or a role
//! (`role:oncall`) is a party agents can reach under the same access rules as an agent: an
//! agent **notes** a person (nothing waits), **asks** a person or a role (a parked question
//! whose answer arrives in the agent's goal inbox as `kind: response` with `from_person`), or
//! **requests an approval** of one exact action, bound to the SHA-256 of its RFC 8785 JSON,
//! which it then **uses** once before acting. Unanswered by `escalate_after`, an item goes to
//! `escalate_to`, once; unanswered by its deadline, the agent is told. Items live in the
//! `agent_people_items` KV bucket and every state change is a compare-and-set, so answers,
//! escalations and expiries resolve exactly once across replicas and restarts.
//!
//! People come from the operator's `people.toml` (no agent can add a person); they answer
//! through `_SB.ops.people.*`, which only Switchboard's own users (the console, the operator
//! CLI) may publish on.
//!
//! Layout: `config.rs` (`[people]`), `error.rs` (errors → stable kinds), `book.rs` (the people
//! file and its access rules), `store.rs` (the items bucket), `view.rs` (each replica's view
//! of it), `service.rs` (shared steps: events, answers and notices into goal inboxes),
//! `agents.rs` (what agents do), `persons.rs` (what people do), `sweep.rs` (escalation,
//! expiry, redelivery), `endpoints.rs` (the endpoint table), this file (`start`/`run`).

mod agents;
pub use switchboard_runtime::people_book as book;
pub mod config;
mod endpoints;
pub mod error;
mod persons;
mod service;
pub mod store;
mod sweep;
mod view;

use std::sync::Arc;
use std::time::Duration;

use async_nats::Client;
use async_nats::jetstream;
use switchboard_delivery::door::Door;
use switchboard_proto::PEOPLE_SERVICE;
use switchboard_runtime::micro::{self, ServiceSpec};
use switchboard_runtime::{CancellationToken, RuntimeConfig, resources};

pub use config::PeopleConfig;
pub use service::People;
pub use switchboard_runtime::service::StartError;

/// The micro service description.
pub const SPEC: ServiceSpec = ServiceSpec {
    name: PEOPLE_SERVICE,
    version: env!("CARGO_PKG_VERSION"),
    description: "Switchboard people: notes, asks and approvals addressed to persons and roles",
};

/// A started people service; call [`Running::run`] to serve.
#[derive(Debug)]
pub struct Running {
    running: micro::Running,
    people: Arc<People>,
    sweep_every: Duration,
    reload_every: Duration,
    grace: Duration,
}

/// Applies what it uses (the items bucket, the registry buckets it reads, the inbox and events
/// streams it writes), reads the people file and subscribes its endpoints.
pub async fn start(
    client: &Client,
    runtime: &RuntimeConfig,
    config: PeopleConfig,
) -> Result<Running, StartError> {
    let js = jetstream::new(client.clone());
    resources::ensure_stream(&js, resources::inbox_stream(&runtime.jetstream)).await?;
    resources::ensure_stream(&js, resources::events_stream(&runtime.jetstream)).await?;
    let items =
        resources::ensure_bucket(&js, resources::people_items_bucket(&runtime.jetstream)).await?;
    // A person's word goes into an agent's goal through the one door; its registry view
    // answers cards and goal ownership.
    let door = Door::open(&js, &runtime.jetstream, 0).await?;
    let books = match &config.file {
        Some(path) => book::Books::load(path).map_err(StartError::Config)?,
        None => book::Books::default(),
    };
    let people = Arc::new(People::new(
        js.clone(),
        store::ItemStore::new(items),
        door,
        books,
        config.clone(),
        Duration::from_secs(runtime.jetstream.people_max_age_secs),
    ));
    let running = micro::start(
        client,
        SPEC,
        endpoints::endpoints(&people),
        &runtime.requests,
    )
    .await?;
    tracing::info!(service = SPEC.name, file = ?config.file, "people ready");
    Ok(Running {
        running,
        people,
        sweep_every: Duration::from_millis(config.sweep_interval_ms),
        reload_every: Duration::from_millis(config.reload_interval_ms),
        grace: runtime.shutdown_grace(),
    })
}

impl Running {
    /// The service (for in-process callers and tests).
    pub fn people(&self) -> Arc<People> {
        Arc::clone(&self.people)
    }

    /// Serves, sweeps and follows the people file until `shutdown`, then drains.
    pub async fn run(self, shutdown: CancellationToken) {
        let registry = tokio::spawn(self.people.door.view().clone().watch(shutdown.clone()));
        let items = tokio::spawn(self.people.view.clone().watch(shutdown.clone()));
        let follow = self.people.config.file.clone().map(|path| {
            tokio::spawn(self.people.books.clone().follow(
                path,
                self.reload_every,
                shutdown.clone(),
            ))
        });
        let sweep = switchboard_runtime::service::sweep_periodically(
            "people sweep",
            self.sweep_every,
            shutdown.clone(),
            Arc::clone(&self.people),
            |people, now| async move { people.sweep(now).await },
        );
        tokio::join!(sweep, self.running.run(shutdown, self.grace));
        let _ = registry.await;
        let _ = items.await;
        if let Some(follow) = follow {
            let _ = follow.await;
        }
    }
}

/// Starts and serves until `shutdown` (what `main` and `switchboard up` call).
pub async fn run(
    client: &Client,
    runtime: &RuntimeConfig,
    config: PeopleConfig,
    shutdown: CancellationToken,
) -> Result<(), StartError> {
    start(client, runtime, config).await?.run(shutdown).await;
    Ok(())
}
