//! The operator-side task operations (docs/protocol.md §10, "Operators"): `_SB.ops.tasks.<op>`,
//! which only Switchboard's own users (the console, the operator CLI) may publish on. They
//! read any agent's tasks and a whole tree, and cancel a tree in a person's name.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::ids::AgentId;
use crate::message::TaskState;
use crate::task::{ListRole, TaskRecord};

/// Most tasks one tree answer carries; past it the answer says `truncated`.
pub const TREE_MAX: usize = 500;

/// An operator-side task operation: `_SB.ops.tasks.<op>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TaskOpsOp {
    /// Any agent's tasks, newest first ([`OpsListTasks`] → `TaskList`).
    List,
    /// A task's whole tree, from its root ([`TreeQuery`] → [`TaskTree`]).
    Tree,
    /// Cancel a task and its open descendants ([`OpsCancel`] → `TaskReply`).
    Cancel,
}

impl TaskOpsOp {
    /// Every op.
    pub const ALL: [Self; 3] = [Self::List, Self::Tree, Self::Cancel];

    /// The endpoint name and the subject's last token.
    pub fn token(self) -> &'static str {
        match self {
            Self::List => "list",
            Self::Tree => "tree",
            Self::Cancel => "cancel",
        }
    }

    /// The subject: `_SB.ops.tasks.<op>`.
    pub fn subject(self) -> String {
        crate::subject::ops("tasks", self.token())
    }
}

/// `_SB.ops.tasks.list`: one agent's tasks (as requester, assignee or either), newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OpsListTasks {
    /// The agent whose tasks to list.
    pub agent: AgentId,
    /// Which side (default both).
    #[serde(default)]
    pub role: ListRole,
    /// Only tasks in this state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<TaskState>,
    /// Page size (default 50, at most 200).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
    /// `next_cursor` of the previous page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<Uuid>,
}

/// `_SB.ops.tasks.tree`: the tree a task belongs to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TreeQuery {
    /// Any task of the tree; the answer starts at its root.
    pub task_id: Uuid,
}

/// A task tree, root first, then breadth first (each task's `parent` says where it hangs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TaskTree {
    /// The root's id.
    pub root: Uuid,
    /// The tasks, root first; at most [`TREE_MAX`].
    pub tasks: Vec<TaskRecord>,
    /// More tasks hang below than the answer carries.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

/// `_SB.ops.tasks.cancel`: cancel a task and its open descendants in a person's name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OpsCancel {
    /// The task (usually a root: its whole tree ends).
    pub task_id: Uuid,
    /// The person acting (`person:<id>`), named in the task's reason and its events.
    pub person: String,
    /// Why, shown to the requester and the assignees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}
