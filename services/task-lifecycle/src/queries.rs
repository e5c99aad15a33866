//! Reading tasks: get (one task) and list (the caller's tasks by role and state, or a task's
//! children), for the parties only.
//!
//! A task is visible to its requester, its assignee and the parties of its ancestors (who
//! handed down the work). The index a listing reads is only a hint: each record says who its
//! parties are, and one undecodable record is skipped rather than failing every listing.

use switchboard_proto::AgentId;
use switchboard_proto::task::{
    LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX, ListRole, ListTasks, TaskAction, TaskList, TaskRecord,
    TaskReply,
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

    /// list: the caller's tasks by role and state, or a task's children, oldest first, paged
    /// by task id.
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
                let mut ids = Vec::new();
                if matches!(request.role, ListRole::Requester | ListRole::Any) {
                    ids.extend(self.store.ids(Side::Requester, caller).await?);
                }
                if matches!(request.role, ListRole::Assignee | ListRole::Any) {
                    ids.extend(self.store.ids(Side::Assignee, caller).await?);
                }
                ids.sort_unstable();
                ids.dedup();
                ids
            }
        };
        if let Some(cursor) = request.cursor {
            ids.retain(|id| *id > cursor);
        }
        let mut tasks = Vec::new();
        let mut next_cursor = None;
        for (i, id) in ids.iter().enumerate() {
            let stored = match self.store.find(id).await {
                Ok(Some(stored)) => stored,
                Ok(None) => continue,
                Err(StoreError::Corrupt(key)) => {
                    // One bad record must not fail every listing.
                    tracing::warn!(%key, "undecodable task record skipped");
                    continue;
                }
                Err(err) => return Err(err.into()),
            };
            // An index entry is only a hint: the record says who the parties are (children
            // were checked through their parent above).
            let listed = match request.parent {
                Some(parent) => stored.task.parent == Some(parent),
                None => stored.task.is_party(caller),
            };
            if !listed {
                continue;
            }
            if request
                .state
                .is_some_and(|state| state != stored.task.state)
            {
                continue;
            }
            tasks.push(stored.task);
            if tasks.len() == limit {
                if i + 1 < ids.len() {
                    next_cursor = Some(*id);
                }
                break;
            }
        }
        Ok(TaskList { tasks, next_cursor })
    }
}
