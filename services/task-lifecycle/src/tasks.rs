//! The task service: what every rule works with (the NATS client, the store, the door into
//! the inboxes, the config) and
//! the limits they share.
//!
//! The rules themselves are `impl Tasks` blocks beside their concern: `create.rs` (create,
//! spawn), `transitions.rs` (the ops and how a change is told), `load.rs` (the concurrency
//! cap), `queries.rs` (get, list), `sweep.rs` (deadlines and the cancel cascade). Every change
//! is a compare-and-set on a KV revision, retried at most `CAS_ATTEMPTS` times.

use std::collections::HashMap;
use std::sync::Arc;

use async_nats::Client;
use async_nats::jetstream;
use switchboard_delivery::door::Door;
use switchboard_delivery::error::DoorError;
use switchboard_delivery::files::Files;
use switchboard_proto::files::Attachment;
use switchboard_proto::task::TaskRecord;
use switchboard_proto::{AgentId, GoalId, TaskRef};
use switchboard_runtime::store::StoreError;

use crate::config::TaskConfig;
use crate::error::TaskError;
use crate::store::TaskStore;

/// Compare-and-set retries on one record.
pub(crate) const CAS_ATTEMPTS: usize = 16;
/// A child listed by its parent without a record yet, younger than this, is being created.
pub(crate) const CHILD_IN_FLIGHT: time::Duration = time::Duration::seconds(30);

/// The task service.
#[derive(Debug)]
pub struct Tasks {
    pub(crate) client: Client,
    pub(crate) js: jetstream::Context,
    pub(crate) store: TaskStore,
    /// The one door into every inbox (a task and its updates are the service's word to the
    /// goals it chose); its registry view answers cards and goals.
    pub(crate) door: Door,
    /// KV `agent_receipts`: a task created with `receipt` records its message there.
    pub(crate) receipts: jetstream::kv::Store,
    pub(crate) config: TaskConfig,
    pub(crate) sweeps: std::sync::atomic::AtomicU64,
    /// One lock per assignee whose active set this replica is changing: requests on one
    /// replica take turns instead of colliding on the compare-and-set (other replicas still
    /// race through it).
    pub(crate) load_locks: std::sync::Mutex<HashMap<AgentId, Arc<tokio::sync::Mutex<()>>>>,
    /// The budget a task gets when it names none and draws on no parent's (`[budgets]`).
    pub(crate) default_budget: Option<switchboard_proto::budget::BudgetAsk>,
}

impl Tasks {
    /// Wires the parts together.
    pub fn new(
        client: Client,
        store: TaskStore,
        door: Door,
        receipts: jetstream::kv::Store,
        config: TaskConfig,
    ) -> Self {
        Self {
            js: jetstream::new(client.clone()),
            client,
            store,
            door,
            receipts,
            config,
            sweeps: std::sync::atomic::AtomicU64::new(0),
            load_locks: std::sync::Mutex::new(HashMap::new()),
            default_budget: None,
        }
    }

    /// The same, giving tasks that name no budget the configured default (`[budgets]`).
    pub fn with_budgets(mut self, budgets: &switchboard_runtime::config::BudgetsConfig) -> Self {
        self.default_budget = budgets.default_ask();
        self
    }
}

impl Tasks {
    /// An agent's live goals (none when it is not registered), through the registry view.
    pub(crate) async fn live_goals(&self, agent: &AgentId) -> Result<Vec<GoalId>, StoreError> {
        Ok(self
            .door
            .view()
            .resolve(agent)
            .await?
            .map(|peer| peer.goals)
            .unwrap_or_default())
    }
}

impl Tasks {
    /// Whether `caller` may put each attachment on a task message, as it is (the door's check,
    /// docs/protocol.md §17): before anything is stored, so a refused file changes nothing.
    pub(crate) async fn check_files(
        &self,
        caller: &AgentId,
        attachments: &[Attachment],
    ) -> Result<(), TaskError> {
        Files::check_on(self.door.files(), caller, attachments)
            .await
            .map_err(|err| TaskError::Gate(DoorError::from(err).into()))
    }

    /// Grants the party of `task` that `caller` is not the reading of `attachments` (checked
    /// by [`Tasks::check_files`]): the door grants only the agents it delivers to, and a party
    /// with no live goal reads its task's files by the task's record.
    pub(crate) async fn grant_files(
        &self,
        caller: &AgentId,
        task: &TaskRecord,
        attachments: &[Attachment],
    ) -> Result<(), TaskError> {
        let other = if *caller == task.requester {
            &task.assignee
        } else {
            &task.requester
        };
        Files::grant_on(
            self.door.files(),
            caller,
            attachments,
            std::slice::from_ref(other),
        )
        .await
        .map_err(|err| TaskError::Gate(DoorError::from(err).into()))
    }
}

/// The task as messages carry it (`task` on a `kind: task` or `task_update` message).
pub(crate) fn task_ref(task: &TaskRecord) -> TaskRef {
    TaskRef {
        id: task.task_id,
        state: task.state,
        deadline: task.deadline,
        parent: task.parent,
    }
}
