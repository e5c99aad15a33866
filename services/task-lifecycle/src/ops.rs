//! What operators do with tasks (docs/protocol.md §10, "Operators"), on `_SB.ops.tasks.<op>`
//! (Switchboard's own users only): list any agent's tasks, read a whole tree, and cancel a
//! tree in a person's name. The cancel is the service's own (like a deadline's), with the
//! person named in the reason every party is told and the audit keeps.

use std::collections::VecDeque;

use switchboard_proto::ids::Party;
use switchboard_proto::task::ops::{OpsCancel, OpsListTasks, TREE_MAX, TaskTree, TreeQuery};
use switchboard_proto::task::{self as rules, ListTasks, TaskList, TaskOp, TaskReply, TaskRole};
use uuid::Uuid;

use crate::error::TaskError;
use crate::tasks::{CAS_ATTEMPTS, Tasks};

impl Tasks {
    /// One agent's tasks, newest first, as the agent itself would list them.
    pub async fn ops_list(&self, request: OpsListTasks) -> Result<TaskList, TaskError> {
        let query = ListTasks {
            role: request.role,
            state: request.state,
            limit: request.limit,
            cursor: request.cursor,
            newest_first: true,
            ..ListTasks::default()
        };
        self.list(&request.agent, query).await
    }

    /// The tree `task_id` belongs to: up to its root, then every descendant breadth first,
    /// at most [`TREE_MAX`] tasks.
    pub async fn ops_tree(&self, request: TreeQuery) -> Result<TaskTree, TaskError> {
        let Some(mut root) = self.store.find(&request.task_id).await?.map(|s| s.task) else {
            return Err(TaskError::NotFound(request.task_id));
        };
        // Up: at most as many steps as a tree may be deep.
        for _ in 0..=self.config.depth_limit {
            let Some(parent) = root.parent else { break };
            match self.store.find(&parent).await? {
                Some(stored) => root = stored.task,
                None => break,
            }
        }
        let root_id = root.task_id;
        let mut queue: VecDeque<Uuid> = root.children.iter().copied().collect();
        let mut tasks = vec![root];
        let mut truncated = false;
        while let Some(id) = queue.pop_front() {
            if tasks.len() >= TREE_MAX {
                truncated = true;
                break;
            }
            let Some(stored) = self.store.find(&id).await? else {
                continue;
            };
            // Only a real child: a listed id must name its parent back (and a cycle cannot
            // form, since a task's parent is set once, before it exists).
            let parent = stored.task.parent;
            if !tasks.iter().any(|t| Some(t.task_id) == parent) {
                continue;
            }
            queue.extend(stored.task.children.iter().copied());
            tasks.push(stored.task);
        }
        Ok(TaskTree {
            root: root_id,
            tasks,
            truncated,
        })
    }

    /// Cancels `task_id` for a person (then its open descendants, as any ending does). A
    /// task that has ended already is answered as it is, with `duplicate`.
    pub async fn ops_cancel(&self, request: OpsCancel) -> Result<TaskReply, TaskError> {
        let person = match Party::parse(&request.person) {
            Ok(Party::Person(id)) => id,
            _ => {
                return Err(TaskError::BadPerson(
                    request.person.chars().take(80).collect(),
                ));
            }
        };
        let why = request
            .reason
            .as_deref()
            .map(str::trim)
            .filter(|t| !t.is_empty());
        if let Some(why) = why
            && why.len() > switchboard_proto::MAX_BODY_BYTES
        {
            return Err(TaskError::TextTooLarge { len: why.len() });
        }
        let reason = match why {
            Some(why) => format!("canceled by person:{person} (operator): {why}"),
            None => format!("canceled by person:{person} (operator)"),
        };
        for _ in 0..CAS_ATTEMPTS {
            let Some(stored) = self.store.find(&request.task_id).await? else {
                return Err(TaskError::NotFound(request.task_id));
            };
            let Ok(next) = rules::apply(stored.task.state, TaskOp::Cancel, TaskRole::System) else {
                return Ok(TaskReply {
                    task: stored.task,
                    delivered_to: Vec::new(),
                    duplicate: true,
                    deadline_clamped: false,
                    descendants: Vec::new(),
                });
            };
            if let Some(done) = self.cancel_as_system(&stored, next, reason.clone()).await? {
                tracing::info!(task_id = %done.task.task_id, %person, "task tree canceled by an operator");
                let descendants = self.cascade(&done.task).await;
                return Ok(TaskReply {
                    task: done.task,
                    delivered_to: Vec::new(),
                    duplicate: false,
                    deadline_clamped: false,
                    descendants,
                });
            }
        }
        Err(TaskError::KeepsChanging(request.task_id))
    }
}
