//! The task service: what every rule works with (the NATS client, the store, the config) and
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
use switchboard_proto::task::TaskRecord;
use switchboard_proto::{AgentId, TaskRef};

use crate::config::TaskConfig;
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
    /// KV `agent_receipts`: a task created with `receipt` records its message there.
    pub(crate) receipts: jetstream::kv::Store,
    pub(crate) config: TaskConfig,
    pub(crate) sweeps: std::sync::atomic::AtomicU64,
    /// One lock per assignee whose active set this replica is changing: requests on one
    /// replica take turns instead of colliding on the compare-and-set (other replicas still
    /// race through it).
    pub(crate) load_locks: std::sync::Mutex<HashMap<AgentId, Arc<tokio::sync::Mutex<()>>>>,
}

impl Tasks {
    /// Wires the parts together.
    pub fn new(
        client: Client,
        store: TaskStore,
        receipts: jetstream::kv::Store,
        config: TaskConfig,
    ) -> Self {
        Self {
            js: jetstream::new(client.clone()),
            client,
            store,
            receipts,
            config,
            sweeps: std::sync::atomic::AtomicU64::new(0),
            load_locks: std::sync::Mutex::new(HashMap::new()),
        }
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
