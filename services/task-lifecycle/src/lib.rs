//! # task-lifecycle
//!
//! A2A-style tasks for Switchboard (docs/protocol.md §10): `agent.task.<op>.<agent_id>`
//! creates, spawns, moves, reads and lists tasks; every transition is published on
//! `agent.task.events.<task_id>` and sent to the requester's goal as a `kind: task_update`
//! message carrying the task's `callback` unchanged.
//!
//! States: `submitted → accepted → working → completed | failed`, `working ⇄ input_required`,
//! `submitted → rejected`, any non-terminal → `canceled`, deadline passed → `failed`
//! (`deadline_expired`). The rules are `switchboard_proto::task`; this service applies them
//! with compare-and-set on each record's KV revision, so replicas and retries can never make
//! an illegal or double transition. Acceptance needs the requester in the assignee's
//! `allow_from`, the assignee below its `max_concurrent_tasks`, and the deadline ahead.
//! Subtasks (`spawn`) are linked to their parent, capped in depth and open children, and
//! canceled when the parent ends.
//!
//! Layout: this file (`start`/`run`), `config.rs` (`[task_lifecycle]`), `endpoints.rs` (the
//! endpoint table), `error.rs` (`TaskError` and its error kinds), `tasks.rs` (the `Tasks`
//! service and the limits its rules share), the rules in `create.rs` (create, spawn),
//! `transitions.rs` (the ops and how each change is told), `load.rs` (acceptance: `allow_from`, the
//! concurrency cap, and the load reported to the directory), `queries.rs` (get, list), `ops.rs` (operators: any agent's tasks, a whole tree, cancel a
//! tree in a person's name) and `sweep.rs` (deadlines,
//! the cancel cascade), and `store.rs` (the `agent_tasks` bucket and the `AGENT_TASKS_INDEX`
//! stream).

pub mod config;
mod create;
mod endpoints;
mod error;
mod load;
mod ops;
mod queries;
pub mod store;
mod sweep;
mod tasks;
mod transitions;

use std::sync::Arc;
use std::time::Duration;

use async_nats::Client;
use async_nats::jetstream;
use switchboard_delivery::door::Door;
use switchboard_proto::TASK_LIFECYCLE_SERVICE;
use switchboard_runtime::micro::{self, ServiceSpec};
use switchboard_runtime::{CancellationToken, RuntimeConfig, resources};

pub use config::TaskConfig;
pub use error::TaskError;
pub use switchboard_runtime::service::StartError;
pub use tasks::Tasks;

/// The micro service description.
pub const SPEC: ServiceSpec = ServiceSpec {
    name: TASK_LIFECYCLE_SERVICE,
    version: env!("CARGO_PKG_VERSION"),
    description: "Switchboard task-lifecycle: tasks, deadlines, concurrency caps, subagents",
};

/// A started task service; call [`Running::run`] to serve.
#[derive(Debug)]
pub struct Running {
    running: micro::Running,
    tasks: Arc<Tasks>,
    sweep_every: Duration,
    grace: Duration,
}

/// Applies what it uses (the `agent_tasks` bucket and its index, the inbox and events streams,
/// the directory's buckets it reads) and subscribes its endpoints.
pub async fn start(
    client: &Client,
    runtime: &RuntimeConfig,
    config: TaskConfig,
) -> Result<Running, StartError> {
    let js = jetstream::new(client.clone());
    let settings = &runtime.jetstream;
    resources::ensure_stream(&js, resources::inbox_stream(settings)).await?;
    resources::ensure_stream(&js, resources::events_stream(settings)).await?;
    // Tasks and their updates go into inboxes through the one door, whose registry view
    // answers cards and goals (docs/protocol.md §7, "One door"). A task is never broadcast.
    let door = Door::open(&js, settings, 0).await?;
    let tasks = resources::ensure_bucket(&js, resources::tasks_bucket(settings)).await?;
    let receipts = resources::ensure_bucket(&js, resources::receipts_bucket(settings)).await?;
    resources::ensure_stream(&js, resources::tasks_index_stream(settings)).await?;
    let index = js
        .get_stream(switchboard_proto::TASKS_INDEX_STREAM)
        .await
        .map_err(|err| StartError::Stream {
            stream: switchboard_proto::TASKS_INDEX_STREAM,
            message: err.to_string(),
        })?;
    let sweep_every = Duration::from_millis(config.sweep_interval_ms.max(10));
    let tasks = Arc::new(
        Tasks::new(
            client.clone(),
            store::TaskStore::new(js, tasks, index),
            door,
            receipts,
            config,
        )
        .with_budgets(&runtime.budgets),
    );
    let running = micro::start(
        client,
        SPEC,
        endpoints::endpoints(&tasks),
        &runtime.requests,
    )
    .await?;
    tracing::info!(service = SPEC.name, "task-lifecycle ready");
    Ok(Running {
        running,
        tasks,
        sweep_every,
        grace: runtime.shutdown_grace(),
    })
}

impl Running {
    /// The task service (for in-process callers and tests).
    pub fn tasks(&self) -> Arc<Tasks> {
        Arc::clone(&self.tasks)
    }

    /// Serves and sweeps deadlines until `shutdown`, then drains.
    pub async fn run(self, shutdown: CancellationToken) {
        let watch = tokio::spawn(self.tasks.door.view().clone().watch(shutdown.clone()));
        let sweep = switchboard_runtime::service::sweep_periodically(
            "task sweep",
            self.sweep_every,
            shutdown.clone(),
            Arc::clone(&self.tasks),
            |tasks, now| async move { tasks.sweep(now).await },
        );
        tokio::join!(sweep, self.running.run(shutdown, self.grace));
        let _ = watch.await;
    }
}

/// Starts and serves until `shutdown` (what `main` and `switchboard up` call).
pub async fn run(
    client: &Client,
    runtime: &RuntimeConfig,
    config: TaskConfig,
    shutdown: CancellationToken,
) -> Result<(), StartError> {
    start(client, runtime, config).await?.run(shutdown).await;
    Ok(())
}
