//! Tasks in JetStream.
//!
//! - `task.<task_id>` in the `agent_tasks` bucket: the record, the compare-and-set target of
//!   every transition, so two replicas (or a retried request) can never both move a task.
//! - `load.<agent_id>` in the same bucket: the assignee's active set (tasks accepted, working or
//!   waiting for input), also written with compare-and-set, so concurrent accepts for one
//!   assignee are decided one at a time and never exceed its `max_concurrent_tasks`.
//! - The `AGENT_TASKS_INDEX` stream: `req.<agent>.<id>` and `asg.<agent>.<id>` (who asked, who
//!   works; kept with the task, for `list`), `pair.<requester>.<assignee>.<id>` (both, so a
//!   listing of one pair's tasks reads only theirs: `list` with `peer`, the A2A gateway's
//!   `ListTasks`) and `open.<id>` (only for a task with a deadline
//!   or a parent, carrying both; removed with a filtered purge when the task ends, for the
//!   deadline sweep and the orphan check, whose cost is then what can be due). A plain
//!   stream for the same reason as the open-call index: a KV delete leaves a marker that
//!   snapshots keep reading.
//!
//! Index entries are written before the record, so a crash leaves at worst an entry without a
//! record, which readers skip; never a record nobody can find.
//!
//! Agent cards and live goals are read straight from the directory's buckets.

use async_nats::jetstream::{self, kv, stream};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use switchboard_proto::AgentId;
use switchboard_proto::subject::TASKS_INDEX;
use switchboard_proto::task::TaskRecord;
use switchboard_request::kv::stream_snapshot;
use switchboard_runtime::publish::publish_durable;
use switchboard_runtime::store::StoreError;
use time::OffsetDateTime;
use uuid::Uuid;

/// A task record with its KV revision, the compare-and-set target of its next write.
#[derive(Debug, Clone)]
pub struct TaskEntry {
    /// The record as it was read or written (state, parties, deadline, result).
    pub task: TaskRecord,
    /// The `agent_tasks` KV revision of that record; a write naming an older one is refused.
    pub revision: u64,
}

/// One entry of an assignee's active set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadEntry {
    /// The task.
    pub task_id: Uuid,
    /// When it was reserved (an accept in flight is recognised by its age).
    #[serde(with = "time::serde::rfc3339")]
    pub since: OffsetDateTime,
}

/// `load.<agent_id>`: the assignee's active tasks.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TaskLoad {
    /// Tasks accepted, working or waiting for input (and accepts in flight).
    pub active: Vec<LoadEntry>,
}

/// What an `open.<id>` index entry carries, so the sweep reads only the records that are due.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OpenEntry {
    /// The task's deadline.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "time::serde::rfc3339::option"
    )]
    pub deadline: Option<OffsetDateTime>,
    /// Its parent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<Uuid>,
}

/// The task store: the `agent_tasks` bucket and its index stream (the registry is read
/// through the door's view, see [`crate::tasks::Tasks::live_goals`]).
#[derive(Debug, Clone)]
pub struct TaskStore {
    js: jetstream::Context,
    tasks: kv::Store,
    index: stream::Stream,
}

fn task_key(id: &Uuid) -> String {
    format!("task.{id}")
}

fn load_key(agent: &AgentId) -> String {
    format!("load.{agent}")
}

fn encode<T: Serialize>(value: &T) -> Result<Bytes, StoreError> {
    serde_json::to_vec(value)
        .map(Bytes::from)
        .map_err(|err| StoreError::Corrupt(err.to_string()))
}

/// Which index a listing reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// Tasks an agent asked for.
    Requester,
    /// Tasks given to an agent.
    Assignee,
}

impl Side {
    fn token(self) -> &'static str {
        match self {
            Self::Requester => "req",
            Self::Assignee => "asg",
        }
    }
}

impl TaskStore {
    /// Wraps the applied bucket and index stream.
    pub fn new(js: jetstream::Context, tasks: kv::Store, index: stream::Stream) -> Self {
        Self { js, tasks, index }
    }

    async fn get<T: serde::de::DeserializeOwned>(
        store: &kv::Store,
        key: &str,
        step: &'static str,
    ) -> Result<Option<(T, u64)>, StoreError> {
        match store
            .entry(key)
            .await
            .map_err(|err| StoreError::store(step, err))?
        {
            Some(entry) if entry.operation == kv::Operation::Put => {
                let value = serde_json::from_slice(&entry.value)
                    .map_err(|_| StoreError::Corrupt(key.to_owned()))?;
                Ok(Some((value, entry.revision)))
            }
            _ => Ok(None),
        }
    }

    /// A task by id.
    pub async fn find(&self, id: &Uuid) -> Result<Option<TaskEntry>, StoreError> {
        Ok(
            Self::get::<TaskRecord>(&self.tasks, &task_key(id), "reading the task")
                .await?
                .map(|(task, revision)| TaskEntry { task, revision }),
        )
    }

    /// Records a new task: index entries first, then the record. `Ok(None)` when a task with
    /// that id exists already.
    pub async fn insert(&self, task: &TaskRecord) -> Result<Option<TaskEntry>, StoreError> {
        let id = task.task_id;
        let open = encode(&OpenEntry {
            deadline: task.deadline,
            parent: task.parent,
        })?;
        let mut entries = vec![
            (format!("req.{}.{id}", task.requester), Bytes::new()),
            (format!("asg.{}.{id}", task.assignee), Bytes::new()),
            (
                format!("pair.{}.{}.{id}", task.requester, task.assignee),
                Bytes::new(),
            ),
        ];
        // Only a task with a deadline or a parent can ever need the sweep.
        if task.deadline.is_some() || task.parent.is_some() {
            entries.push((format!("open.{id}"), open));
        }
        // The entries are independent of each other: written at once, all before the record.
        let writes = entries.into_iter().map(|(key, payload)| async move {
            let subject = TASKS_INDEX.entry(&key);
            // The subject keeps one entry anyway; a fresh id per create attempt keeps an entry
            // purged by `forget` from being de-duplicated away when the create is retried.
            let msg_id = format!("{subject}:{}", switchboard_proto::new_id());
            publish_durable(&self.js, &subject, &msg_id, payload)
                .await
                .map_err(|err| StoreError::store("indexing the task", err))
        });
        futures::future::try_join_all(writes).await?;
        match self.tasks.create(task_key(&id), encode(task)?).await {
            Ok(revision) => Ok(Some(TaskEntry {
                task: task.clone(),
                revision,
            })),
            Err(err) if switchboard_request::kv::already_exists(&err) => Ok(None),
            Err(err) => Err(StoreError::store("recording the task", err)),
        }
    }

    /// Writes `task` if nobody changed it since `stored` was read. `Ok(None)` when another
    /// writer won (re-read). A task that ends leaves the open index.
    pub async fn update(
        &self,
        stored: &TaskEntry,
        task: TaskRecord,
    ) -> Result<Option<TaskEntry>, StoreError> {
        match self
            .tasks
            .update(task_key(&task.task_id), encode(&task)?, stored.revision)
            .await
        {
            Ok(revision) => {
                if task.state.is_terminal() && !stored.task.state.is_terminal() {
                    self.close(&task.task_id).await;
                }
                Ok(Some(TaskEntry { task, revision }))
            }
            Err(err) if switchboard_request::kv::lost_revision(&err) => Ok(None),
            Err(err) => Err(StoreError::store("updating the task", err)),
        }
    }

    /// Removes a task from the open index (best effort: the sweep skips and removes stale
    /// entries).
    pub async fn close(&self, id: &Uuid) {
        let filter = TASKS_INDEX.entry(&format!("open.{id}"));
        if let Err(err) = self.index.purge().filter(filter.as_str()).await {
            tracing::debug!(%filter, error = %err, "task index not removed");
        }
    }

    /// Forgets a task that never started (it could not be delivered).
    pub async fn forget(&self, id: &Uuid) -> Result<(), StoreError> {
        for filter in [
            TASKS_INDEX.entry(&format!("*.*.{id}")),
            TASKS_INDEX.entry(&format!("pair.*.*.{id}")),
            TASKS_INDEX.entry(&format!("open.{id}")),
        ] {
            if let Err(err) = self.index.purge().filter(filter.as_str()).await {
                tracing::debug!(%filter, error = %err, "task index not removed");
            }
        }
        self.tasks
            .purge(task_key(id))
            .await
            .map_err(|err| StoreError::store("forgetting the task", err))
    }

    /// Ids of the tasks `agent` asked for or works on, in id order.
    pub async fn ids(&self, side: Side, agent: &AgentId) -> Result<Vec<Uuid>, StoreError> {
        self.indexed(&format!("{}.{agent}.*", side.token())).await
    }

    /// Ids of the tasks `requester` gave `assignee`, in id order: one read of that pair's
    /// entries, however many tasks either of them has with anyone else.
    pub async fn pair_ids(
        &self,
        requester: &AgentId,
        assignee: &AgentId,
    ) -> Result<Vec<Uuid>, StoreError> {
        self.indexed(&format!("pair.{requester}.{assignee}.*"))
            .await
    }

    /// The task ids of the index entries matching `filter` (one snapshot), in id order.
    async fn indexed(&self, filter: &str) -> Result<Vec<Uuid>, StoreError> {
        let mut ids: Vec<Uuid> =
            stream_snapshot(&self.js, &self.index, TASKS_INDEX.prefix(), filter)
                .await
                .map_err(|err| StoreError::store("listing tasks", err))?
                .into_iter()
                .filter_map(|entry| {
                    entry
                        .key
                        .rsplit('.')
                        .next()
                        .and_then(|id| Uuid::parse_str(id).ok())
                })
                .collect();
        ids.sort_unstable();
        Ok(ids)
    }

    /// Every open task with what its index entry says (the deadline sweep).
    pub async fn open(&self) -> Result<Vec<(Uuid, OpenEntry, Option<OffsetDateTime>)>, StoreError> {
        Ok(
            stream_snapshot(&self.js, &self.index, TASKS_INDEX.prefix(), "open.*")
                .await
                .map_err(|err| StoreError::store("listing open tasks", err))?
                .into_iter()
                .filter_map(|entry| {
                    let id = entry
                        .key
                        .rsplit('.')
                        .next()
                        .and_then(|id| Uuid::parse_str(id).ok())?;
                    let open = serde_json::from_slice(&entry.value).unwrap_or_default();
                    Some((id, open, entry.stored_at))
                })
                .collect(),
        )
    }

    /// The assignee's active set and its revision (`None`: never written).
    pub async fn load(&self, agent: &AgentId) -> Result<(TaskLoad, Option<u64>), StoreError> {
        Ok(
            match Self::get::<TaskLoad>(&self.tasks, &load_key(agent), "reading the task load")
                .await?
            {
                Some((load, revision)) => (load, Some(revision)),
                None => (TaskLoad::default(), None),
            },
        )
    }

    /// Writes the active set if it is still at `revision`; false when another writer won.
    pub async fn save_load(
        &self,
        agent: &AgentId,
        load: &TaskLoad,
        revision: Option<u64>,
    ) -> Result<bool, StoreError> {
        let key = load_key(agent);
        let payload = encode(load)?;
        match revision {
            Some(revision) => match self.tasks.update(key, payload, revision).await {
                Ok(_) => Ok(true),
                Err(err) if switchboard_request::kv::lost_revision(&err) => Ok(false),
                Err(err) => Err(StoreError::store("writing the task load", err)),
            },
            None => match self.tasks.create(key, payload).await {
                Ok(_) => Ok(true),
                Err(err) if switchboard_request::kv::already_exists(&err) => Ok(false),
                Err(err) => Err(StoreError::store("writing the task load", err)),
            },
        }
    }
}
