//! Reading tasks: get (one task) and list (the caller's tasks by role, state and other party,
//! or a task's children; oldest or newest first; with the total), for the parties only.
//!
//! A task is visible to its requester, its assignee and the parties of its ancestors (who
//! handed down the work). The index a listing reads is only a hint: each record says who its
//! parties are, and one undecodable record is skipped rather than failing every listing.

use switchboard_proto::AgentId;
use switchboard_proto::task::{
    LIST_COUNT_MAX, LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX, ListRole, ListTasks, TaskAction, TaskList,
    TaskRecord, TaskReply,
};
use switchboard_runtime::store::StoreError;
use uuid::Uuid;

use crate::error::TaskError;
use crate::store::Side;
use crate::tasks::Tasks;

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

    /// list: the caller's tasks by role, state and other party, or a task's children, oldest
    /// (or newest) first, paged by task id, with how many match in all.
    pub async fn list(&self, caller: &AgentId, request: ListTasks) -> Result<TaskList, TaskError> {
        let limit = request.limit.unwrap_or(LIST_LIMIT_DEFAULT);
        if limit == 0 || limit > LIST_LIMIT_MAX {
            return Err(TaskError::BadLimit);
        }
        let mut ids = match request.parent {
            Some(parent) => {
                let mut children = self.visible(caller, &parent).await?.children;
                children.sort_unstable();
                children
            }
            None => {
                let ids = self.ids_of(caller, request.role, false).await?;
                match &request.peer {
                    // The pair's tasks: the caller's side of the index against the peer's
                    // other side, without reading a record.
                    Some(peer) => {
                        let theirs = self.ids_of(peer, request.role, true).await?;
                        ids.into_iter()
                            .filter(|id| theirs.binary_search(id).is_ok())
                            .collect()
                    }
                    None => ids,
                }
            }
        };
        if request.newest_first {
            ids.reverse();
        }
        // Without a state filter the index's count is the total; with one, the candidates are
        // read one by one (at most LIST_COUNT_MAX of them).
        let total = match request.state {
            None => Some(ids.len() as u64),
            Some(_) if ids.len() <= LIST_COUNT_MAX => {
                let mut count = 0;
                for id in &ids {
                    if self.listed(caller, &request, id).await?.is_some() {
                        count += 1;
                    }
                }
                Some(count)
            }
            Some(_) => None,
        };
        if let Some(cursor) = request.cursor {
            ids.retain(|id| {
                if request.newest_first {
                    *id < cursor
                } else {
                    *id > cursor
                }
            });
        }
        let mut tasks = Vec::new();
        let mut next_cursor = None;
        for (i, id) in ids.iter().enumerate() {
            let Some(task) = self.listed(caller, &request, id).await? else {
                continue;
            };
            tasks.push(task);
            if tasks.len() == limit {
                if i + 1 < ids.len() {
                    next_cursor = Some(*id);
                }
                break;
            }
        }
        Ok(TaskList {
            tasks,
            next_cursor,
            total,
        })
    }

    /// The ids the index holds for `agent` in `role` (its `other` side: the requester side
    /// for an assignee role and back), sorted.
    async fn ids_of(
        &self,
        agent: &AgentId,
        role: ListRole,
        other: bool,
    ) -> Result<Vec<Uuid>, TaskError> {
        let (mine, theirs) = (Side::Requester, Side::Assignee);
        let (requester_side, assignee_side) = if other {
            (theirs, mine)
        } else {
            (mine, theirs)
        };
        let mut ids = Vec::new();
        if matches!(role, ListRole::Requester | ListRole::Any) {
            ids.extend(self.store.ids(requester_side, agent).await?);
        }
        if matches!(role, ListRole::Assignee | ListRole::Any) {
            ids.extend(self.store.ids(assignee_side, agent).await?);
        }
        ids.sort_unstable();
        ids.dedup();
        Ok(ids)
    }

    /// The task `id` when the listing shows it: the record exists, the caller (and the peer)
    /// are its parties (or it is a child of the listed parent), in the state asked for.
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
        Ok((parties && state).then_some(task))
    }
}
