//! Reading tasks: get (one task) and list (the caller's tasks by role, state, metadata and
//! other party, or a task's children; oldest or newest first; with the total), for the
//! parties only.
//!
//! A task is visible to its requester, its assignee and the parties of its ancestors (who
//! handed down the work). The index a listing reads is only a hint: each record says who its
//! parties are, and one undecodable record is skipped rather than failing every listing. A
//! listing's cost is bounded per request: a snapshot of the index entries it needs (one per
//! side) and at most [`LIST_READ_MAX`] records.

use switchboard_proto::AgentId;
use switchboard_proto::task::{
    LIST_COUNT_MAX, LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX, LIST_METADATA_MAX, LIST_READ_MAX, ListRole,
    ListTasks, TaskAction, TaskList, TaskRecord, TaskReply,
};
use switchboard_runtime::store::StoreError;
use uuid::Uuid;

use crate::error::TaskError;
use crate::store::Side;
use crate::tasks::Tasks;

/// How many records a listing reads at once.
const READ_AHEAD: usize = 16;

impl Tasks {
    /// get: one task, for its requester, its assignee, or a party of an ancestor.
    pub async fn get(&self, caller: &AgentId, request: TaskAction) -> Result<TaskReply, TaskError> {
        let Some(task_id) = request.task_id else {
            return Err(TaskError::TaskIdRequired);
        };
        let task = self.visible(caller, &task_id).await?;
        Ok(TaskReply {
            task,
            delivered_to: Vec::new(),
            duplicate: false,
            deadline_clamped: false,
            descendants: Vec::new(),
        })
    }

    /// A task `caller` may see: it is a party of the task or of one of its ancestors.
    async fn visible(&self, caller: &AgentId, task_id: &Uuid) -> Result<TaskRecord, TaskError> {
        let Some(stored) = self.store.find(task_id).await? else {
            return Err(TaskError::NotFound(*task_id));
        };
        let mut next = Some(stored.task.clone());
        for _ in 0..=self.config.depth_limit {
            let Some(task) = next else { break };
            if task.is_party(caller) {
                return Ok(stored.task);
            }
            next = match task.parent {
                Some(parent) => self.store.find(&parent).await?.map(|s| s.task),
                None => None,
            };
        }
        Err(TaskError::NotVisible {
            caller: caller.clone(),
            task: *task_id,
        })
    }

    /// list: the caller's tasks by role, state, metadata and other party, or a task's
    /// children, oldest (or newest) first, paged by task id, with how many match in all.
    ///
    /// One request costs a snapshot of the index entries it needs (the pair's own with a
    /// `peer`, the caller's otherwise; one per side asked for) and at most [`LIST_READ_MAX`]
    /// record reads, the count included: a filter that matches little answers a short page
    /// with a `next_cursor` instead of reading on.
    pub async fn list(&self, caller: &AgentId, request: ListTasks) -> Result<TaskList, TaskError> {
        let limit = request.limit.unwrap_or(LIST_LIMIT_DEFAULT);
        if limit == 0 || limit > LIST_LIMIT_MAX {
            return Err(TaskError::BadLimit);
        }
        if request.metadata.len() > LIST_METADATA_MAX {
            return Err(TaskError::BadMetadataFilter);
        }
        let mut ids = match request.parent {
            Some(parent) => {
                let mut children = self.visible(caller, &parent).await?.children;
                children.sort_unstable();
                children.dedup();
                children
            }
            None => match &request.peer {
                // The pair's tasks: their own index entries, without reading either agent's
                // other tasks (a busy assignee has many requesters).
                Some(peer) => self.pair_ids(caller, peer, request.role).await?,
                None => self.ids_of(caller, request.role).await?,
            },
        };
        if request.newest_first {
            ids.reverse();
        }
        // Where this page starts: after the cursor, in the listing's order.
        let start = match request.cursor {
            Some(cursor) if request.newest_first => ids.partition_point(|id| *id >= cursor),
            Some(cursor) => ids.partition_point(|id| *id <= cursor),
            None => 0,
        };
        let filtered = request.state.is_some() || !request.metadata.is_empty();
        if filtered && ids.len() <= LIST_COUNT_MAX {
            return self.counted(caller, &request, &ids, start, limit).await;
        }
        // Without a filter the index's count is the total; a filter over more candidates than
        // one request reads is not counted.
        let total = (!filtered).then_some(ids.len() as u64);
        let mut tasks = Vec::new();
        let mut next_cursor = None;
        let mut at = start;
        while at < ids.len() {
            let read = at - start;
            if read >= LIST_READ_MAX {
                // The budget is spent with candidates left: the next page reads on from the
                // last one read.
                next_cursor = at.checked_sub(1).and_then(|last| ids.get(last)).copied();
                break;
            }
            // A filter is expected to pass some candidates by: read ahead. Without one,
            // only what the page still needs.
            let ahead = if filtered {
                READ_AHEAD
            } else {
                (limit - tasks.len()).min(READ_AHEAD)
            };
            let want = ahead.min(LIST_READ_MAX - read);
            let chunk = &ids[at..ids.len().min(at + want)];
            let found = self.read_listed(caller, &request, chunk).await?;
            let mut full_at = None;
            for (offset, task) in found.into_iter().enumerate() {
                if let Some(task) = task {
                    tasks.push(task);
                    if tasks.len() == limit {
                        full_at = Some(at + offset);
                        break;
                    }
                }
            }
            if let Some(last) = full_at {
                if last + 1 < ids.len() {
                    next_cursor = ids.get(last).copied();
                }
                break;
            }
            at += chunk.len();
        }
        Ok(TaskList {
            tasks,
            next_cursor,
            total,
        })
    }

    /// A filtered listing of few enough candidates to read them all once: the matches are
    /// counted and the page is taken from them (`start`: where the page begins in `ids`).
    async fn counted(
        &self,
        caller: &AgentId,
        request: &ListTasks,
        ids: &[Uuid],
        start: usize,
        limit: usize,
    ) -> Result<TaskList, TaskError> {
        let mut total: u64 = 0;
        let mut tasks = Vec::new();
        let mut more = false;
        for (n, chunk) in ids.chunks(READ_AHEAD).enumerate() {
            let found = self.read_listed(caller, request, chunk).await?;
            for (offset, task) in found.into_iter().enumerate() {
                let Some(task) = task else { continue };
                total += 1;
                if n * READ_AHEAD + offset < start {
                    continue;
                }
                if tasks.len() < limit {
                    tasks.push(task);
                } else {
                    more = true;
                }
            }
        }
        let next_cursor = if more {
            tasks.last().map(|task| task.task_id)
        } else {
            None
        };
        Ok(TaskList {
            tasks,
            next_cursor,
            total: Some(total),
        })
    }

    /// [`Tasks::listed`] for each of `ids` at once, in their order.
    async fn read_listed(
        &self,
        caller: &AgentId,
        request: &ListTasks,
        ids: &[Uuid],
    ) -> Result<Vec<Option<TaskRecord>>, TaskError> {
        futures::future::try_join_all(ids.iter().map(|id| self.listed(caller, request, id))).await
    }

    /// The ids the index holds for `agent` in `role`, sorted.
    async fn ids_of(&self, agent: &AgentId, role: ListRole) -> Result<Vec<Uuid>, TaskError> {
        let mut ids = Vec::new();
        if matches!(role, ListRole::Requester | ListRole::Any) {
            ids.extend(self.store.ids(Side::Requester, agent).await?);
        }
        if matches!(role, ListRole::Assignee | ListRole::Any) {
            ids.extend(self.store.ids(Side::Assignee, agent).await?);
        }
        ids.sort_unstable();
        ids.dedup();
        Ok(ids)
    }

    /// The ids of the tasks between `caller` and `peer` in `role` (the caller's side), sorted:
    /// the tasks the caller gave the peer (requester), the peer gave the caller (assignee).
    async fn pair_ids(
        &self,
        caller: &AgentId,
        peer: &AgentId,
        role: ListRole,
    ) -> Result<Vec<Uuid>, TaskError> {
        let mut ids = Vec::new();
        if matches!(role, ListRole::Requester | ListRole::Any) {
            ids.extend(self.store.pair_ids(caller, peer).await?);
        }
        // The tasks an agent gave itself are one pair: read once.
        let read_already = role == ListRole::Any && caller == peer;
        if matches!(role, ListRole::Assignee | ListRole::Any) && !read_already {
            ids.extend(self.store.pair_ids(peer, caller).await?);
        }
        ids.sort_unstable();
        ids.dedup();
        Ok(ids)
    }

    /// The task `id` when the listing shows it: the record exists, the caller (and the peer)
    /// are its parties (or it is a child of the listed parent), in the state asked for, with
    /// the metadata asked for.
    async fn listed(
        &self,
        caller: &AgentId,
        request: &ListTasks,
        id: &Uuid,
    ) -> Result<Option<TaskRecord>, TaskError> {
        let stored = match self.store.find(id).await {
            Ok(Some(stored)) => stored,
            Ok(None) => return Ok(None),
            Err(StoreError::Corrupt(key)) => {
                // One bad record must not fail every listing.
                tracing::warn!(%key, "undecodable task record skipped");
                return Ok(None);
            }
            Err(err) => return Err(err.into()),
        };
        // An index entry is only a hint: the record says who the parties are (children
        // were checked through their parent).
        let task = stored.task;
        let parties = match request.parent {
            Some(parent) => task.parent == Some(parent),
            None => {
                task.is_party(caller)
                    && request.peer.as_ref().is_none_or(|peer| task.is_party(peer))
            }
        };
        let state = request.state.is_none_or(|state| state == task.state);
        let metadata = request
            .metadata
            .iter()
            .all(|(key, value)| task.metadata.get(key) == Some(value));
        Ok((parties && state && metadata).then_some(task))
    }
}
