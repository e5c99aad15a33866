//! The task state machine (docs/protocol.md §10): A2A states plus an acceptance step.
//!
//! ```text
//! submitted → accepted → working → completed | failed
//!                        working ⇄ input_required
//! submitted → rejected
//! any non-terminal → canceled        any non-terminal → failed (deadline_expired)
//! ```
//!
//! Pure rules, so the task service, its compare-and-set writes and property tests share one
//! definition. Terminal states never change.

// Longer than 600 lines because it holds the task's whole wire vocabulary (states, ops,
// records, events, the list query and its bounds) beside the one state machine they share;
// split, each half would import the other.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::error::{ErrorKind, ErrorReply};
use crate::ids::{AgentId, GoalId};
use crate::message::{Callback, Part, TaskState};

pub mod ops;

impl TaskState {
    /// Completed, failed, rejected and canceled never change again.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Completed | Self::Failed | Self::Rejected | Self::Canceled
        )
    }

    /// States that count toward the assignee's `max_concurrent_tasks`.
    pub fn is_active(self) -> bool {
        matches!(self, Self::Accepted | Self::Working | Self::InputRequired)
    }

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Submitted => "submitted",
            Self::Accepted => "accepted",
            Self::Working => "working",
            Self::InputRequired => "input_required",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Rejected => "rejected",
            Self::Canceled => "canceled",
        }
    }
}

/// Something that may change a task's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TaskOp {
    /// The assignee takes the task.
    Accept,
    /// The assignee refuses it.
    Reject,
    /// The assignee starts (or resumes after input) work.
    Start,
    /// The assignee reports progress (state unchanged).
    Progress,
    /// The assignee asks the requester a question.
    InputRequired,
    /// The assignee finishes with a result.
    Complete,
    /// The assignee gives up.
    Fail,
    /// The requester (or the system, for a cascade) cancels.
    Cancel,
    /// The system: the deadline passed (→ failed, `deadline_expired`).
    Expire,
}

impl TaskOp {
    /// Every op.
    pub const ALL: [TaskOp; 9] = [
        Self::Accept,
        Self::Reject,
        Self::Start,
        Self::Progress,
        Self::InputRequired,
        Self::Complete,
        Self::Fail,
        Self::Cancel,
        Self::Expire,
    ];

    /// The op's name (also its subject token, `agent.task.<op>.<agent_id>`, where it has one).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Accept => "accept",
            Self::Reject => "reject",
            Self::Start => "start",
            Self::Progress => "progress",
            Self::InputRequired => "input_required",
            Self::Complete => "complete",
            Self::Fail => "fail",
            Self::Cancel => "cancel",
            Self::Expire => "expire",
        }
    }

    /// Who may perform the op.
    pub fn allowed(self, role: TaskRole) -> bool {
        match self {
            Self::Accept
            | Self::Reject
            | Self::Start
            | Self::Progress
            | Self::InputRequired
            | Self::Complete
            | Self::Fail => role == TaskRole::Assignee,
            Self::Cancel => matches!(role, TaskRole::Requester | TaskRole::System),
            Self::Expire => role == TaskRole::System,
        }
    }
}

/// Who is acting on a task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TaskRole {
    /// The agent that created the task.
    Requester,
    /// The agent the task was given to.
    Assignee,
    /// The service itself (deadlines, cancel cascades).
    System,
}

/// Why an op was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskRefusal {
    /// The task has ended; nothing changes it.
    Terminal(TaskState),
    /// The op does not apply in this state.
    Illegal {
        /// The task's state, which has no transition for `op`.
        from: TaskState,
        /// The op tried, named in the `illegal_transition` message.
        op: TaskOp,
    },
    /// This role may not perform the op.
    NotAllowed {
        /// The op tried, named in the `not_allowed` message.
        op: TaskOp,
        /// The role that tried.
        role: TaskRole,
    },
}

impl From<TaskRefusal> for ErrorReply {
    fn from(refusal: TaskRefusal) -> Self {
        match refusal {
            TaskRefusal::Terminal(state) => ErrorReply::new(
                ErrorKind::TaskTerminal,
                format!("the task is {} and can no longer change", state.as_str()),
            ),
            TaskRefusal::Illegal { from, op } => ErrorReply::new(
                ErrorKind::IllegalTransition,
                format!(
                    "`{}` is not possible while the task is {}",
                    op.as_str(),
                    from.as_str()
                ),
            ),
            TaskRefusal::NotAllowed { op, role } => ErrorReply::new(
                ErrorKind::NotAllowed,
                format!("the {role:?} may not `{}` this task", op.as_str()).to_lowercase(),
            ),
        }
    }
}

/// Applies `op` by `role` to a task in `state`: the new state, or why not. Role is checked
/// first, then terminal states, then the transition table.
pub fn apply(state: TaskState, op: TaskOp, role: TaskRole) -> Result<TaskState, TaskRefusal> {
    use TaskOp as Op;
    use TaskState as S;
    if !op.allowed(role) {
        return Err(TaskRefusal::NotAllowed { op, role });
    }
    if state.is_terminal() {
        return Err(TaskRefusal::Terminal(state));
    }
    let next = match (state, op) {
        (S::Submitted, Op::Accept) => S::Accepted,
        (S::Submitted, Op::Reject) => S::Rejected,
        (S::Accepted | S::InputRequired, Op::Start) => S::Working,
        (S::Working, Op::Progress) => S::Working,
        (S::Working, Op::InputRequired) => S::InputRequired,
        (S::Working, Op::Complete) => S::Completed,
        (S::Working, Op::Fail) => S::Failed,
        (_, Op::Cancel) => S::Canceled,
        (_, Op::Expire) => S::Failed,
        (from, op) => return Err(TaskRefusal::Illegal { from, op }),
    };
    Ok(next)
}

/// A request an agent sends to the task service, addressed `agent.task.<op>.<agent_id>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TaskRequestOp {
    /// Hand a task to another agent ([`CreateTask`]).
    Create,
    /// Delegate part of a task to a subagent ([`CreateTask`] with `parent_task_id`).
    Spawn,
    /// A state change ([`TaskAction`]).
    Transition(TaskOp),
    /// One task ([`TaskAction`] with only `task_id`).
    Get,
    /// Tasks by role, state or parent ([`ListTasks`]).
    List,
}

impl TaskRequestOp {
    /// Every request op, for wiring endpoints.
    pub const ALL: [TaskRequestOp; 12] = [
        Self::Create,
        Self::Spawn,
        Self::Transition(TaskOp::Accept),
        Self::Transition(TaskOp::Reject),
        Self::Transition(TaskOp::Start),
        Self::Transition(TaskOp::Progress),
        Self::Transition(TaskOp::InputRequired),
        Self::Transition(TaskOp::Complete),
        Self::Transition(TaskOp::Fail),
        Self::Transition(TaskOp::Cancel),
        Self::Get,
        Self::List,
    ];

    /// The subject token (and micro endpoint name).
    pub fn token(self) -> &'static str {
        match self {
            Self::Create => "create",
            Self::Spawn => "spawn",
            Self::Transition(op) => op.as_str(),
            Self::Get => "get",
            Self::List => "list",
        }
    }

    /// `agent.task.<op>`: the prefix the caller's id is appended to.
    pub fn prefix(self) -> String {
        format!("{}.{}", crate::subject::TASK_PREFIX, self.token())
    }

    /// `agent.task.<op>.<agent_id>`.
    pub fn subject(self, agent: &AgentId) -> String {
        format!("{}.{agent}", self.prefix())
    }
}

/// `create` and `spawn`: a task for `to` (`self` in a spawn: any live goal of the caller).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTask {
    /// The assignee (`self` allowed in a spawn only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// What to do (≤ 64 KiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Structured input (A2A parts), carried to the assignee in the `kind: task` message.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<Part>,
    /// Files for the assignee (docs/protocol.md §17): each one the requester uploaded or was
    /// handed; carried in the `kind: task` message, and the assignee may read them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<crate::files::Attachment>,
    /// When the task must be done by (RFC 3339).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "time::serde::rfc3339::option"
    )]
    #[schemars(with = "Option<crate::timestamp::Timestamp>")]
    pub deadline: Option<OffsetDateTime>,
    /// The deadline relative to now, in milliseconds (instead of `deadline`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_in_ms: Option<u64>,
    /// Routing of the conversation that asked; returned unchanged in every `task_update`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback: Option<Callback>,
    /// Free-form JSON, stored in the record and carried in the `kind: task` message.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub metadata: Map<String, Value>,
    /// The requester goal that updates go to (the client's current goal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_goal_id: Option<GoalId>,
    /// A caller-chosen id (UUID) so a retried create is recognised; minted when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<Uuid>,
    /// spawn only: the task this one is a part of (the caller must be its assignee).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_task_id: Option<Uuid>,
    /// The task's cost budget (docs/protocol.md §16): amounts for a new tree, or caps on what
    /// it draws from its parent task's budget (or from the node it names, e.g. the call being
    /// served). A spawn under a parent with a budget draws from it without this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<crate::budget::BudgetAsk>,
    /// The message that prompted this task (the task message's `in_reply_to`), so the audit
    /// trail links it into that conversation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_reply_to: Option<Uuid>,
    /// The requester, if the body names one: it must be the subject's identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_agent_id: Option<String>,
    /// Receipts for the request message, back in `from_goal_id` (required with it):
    /// `delivered`, or `read` (see [`crate::receipt`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt: Option<crate::receipt::ReceiptLevel>,
}

/// `accept`, `reject`, `start`, `progress`, `input_required`, `complete`, `fail`, `cancel`, `get`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskAction {
    /// The task to act on; required (`bad_request` without it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<Uuid>,
    /// The reason (reject, fail, cancel), note (progress), question (input_required) or result
    /// (complete); each of those names is accepted as an alias.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        alias = "reason",
        alias = "note",
        alias = "question",
        alias = "result"
    )]
    pub message: Option<String>,
    /// Structured content (progress, question or result parts).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<Part>,
    /// Files for the other party (docs/protocol.md §17): a progress note's, a question's, or
    /// the result's (the task's artifacts); carried in the `task_update` message and the event.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<crate::files::Attachment>,
    /// The caller's goal (on `accept`: the goal that takes the task).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_goal_id: Option<GoalId>,
}

/// Which side of a task a listing shows.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum ListRole {
    /// Tasks the caller created.
    Requester,
    /// Tasks given to the caller.
    Assignee,
    /// Both (the default).
    #[default]
    Any,
}

/// `list`: the caller's tasks by role and state, or the children of a parent, paged.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListTasks {
    /// Which side (default both).
    #[serde(default)]
    pub role: ListRole,
    /// Only tasks in this state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<TaskState>,
    /// The children of this task (subagent_status); the caller must be a party of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<Uuid>,
    /// Page size (default 50, at most 200).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
    /// `next_cursor` of the previous page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<Uuid>,
    /// Only tasks whose other party is this agent (the assignee of a task the caller asked
    /// for, the requester of one it was given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<AgentId>,
    /// Newest first (default: oldest first); the cursor pages in the same order.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub newest_first: bool,
    /// Only tasks whose `metadata` has each of these keys with exactly this value (at most
    /// [`LIST_METADATA_MAX`] keys): the A2A gateway lists one context by `a2a_context_id`.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub metadata: Map<String, Value>,
}

/// Default page size of `list`.
pub const LIST_LIMIT_DEFAULT: usize = 50;
/// Largest page size of `list`.
pub const LIST_LIMIT_MAX: usize = 200;
/// Most task records one `list` reads, its page and its count together: a listing that
/// reaches it answers with what it found and a `next_cursor` to read on from, so a filter
/// that matches little costs a bounded amount per request, never a scan of every task.
pub const LIST_READ_MAX: usize = 256;
/// Most candidate tasks among which `list` counts the matches of a `state` or `metadata`
/// filter (each is read once, within [`LIST_READ_MAX`]); past it `total` is left out.
pub const LIST_COUNT_MAX: usize = LIST_READ_MAX;
/// Most keys a `list`'s `metadata` filter may name.
pub const LIST_METADATA_MAX: usize = 8;

/// One change in a task's life, as kept in its record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TaskTransition {
    /// What happened.
    pub op: TaskOp,
    /// Who did it (absent: the service, for deadlines and cascades).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<AgentId>,
    /// State before.
    pub from: TaskState,
    /// State after.
    pub to: TaskState,
    /// When the transition was made (the record's `updated_at` from then on).
    #[serde(with = "time::serde::rfc3339")]
    #[schemars(with = "crate::timestamp::Timestamp")]
    pub at: OffsetDateTime,
    /// Reason, note or question (shortened in the record; full text in the messages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// A task: the value stored in `agent_tasks` under `task.<task_id>`, and the reply of every op.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TaskRecord {
    /// The task id (UUID v7 unless the requester chose one).
    pub task_id: Uuid,
    /// Who asked.
    pub requester: AgentId,
    /// The requester goal that receives `task_update` messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requester_goal: Option<GoalId>,
    /// Who does it.
    pub assignee: AgentId,
    /// Set by `accept`'s `from_goal_id` (absent until then); the assignee's notices go there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assignee_goal: Option<GoalId>,
    /// Current state; completed, failed, rejected and canceled never change again.
    pub state: TaskState,
    /// What to do, exactly as sent (the `kind: task` message's `body`).
    pub message: String,
    /// The create's parts, carried in the `kind: task` message.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<Part>,
    /// The create's attachments, carried in the `kind: task` message.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<crate::files::Attachment>,
    /// When it must be done by; past it, the task fails with `deadline_expired`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "time::serde::rfc3339::option"
    )]
    #[schemars(with = "Option<crate::timestamp::Timestamp>")]
    pub deadline: Option<OffsetDateTime>,
    /// The requester's routing, returned unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback: Option<Callback>,
    /// The create's free-form `metadata`, stored unchanged.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub metadata: Map<String, Value>,
    /// The parent task, for a subagent task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<Uuid>,
    /// Nesting depth: 1 for a task without parent.
    pub depth: u32,
    /// Children spawned from this task, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<Uuid>,
    /// The result text (completed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    /// The result parts (completed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub result_parts: Vec<Part>,
    /// The result's attachments (completed): the task's files for its requester.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub result_attachments: Vec<crate::files::Attachment>,
    /// Why it ended, when it was rejected, failed (`deadline_expired` for deadlines) or canceled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The id of the `kind: task` message delivered to the assignee.
    pub message_id: Uuid,
    /// The message that prompted the task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_reply_to: Option<Uuid>,
    /// The receipts the requester asked for on the task message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt: Option<crate::receipt::ReceiptLevel>,
    /// Transitions so far: also the number of the task's latest event (`<task_id>:<n>`; the
    /// creation is event 0).
    pub transitions: u32,
    /// The latest transitions (at most [`HISTORY_KEPT`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<TaskTransition>,
    /// When the task was created (state `submitted`).
    #[serde(with = "time::serde::rfc3339")]
    #[schemars(with = "crate::timestamp::Timestamp")]
    pub created_at: OffsetDateTime,
    /// When the record last changed; `agent_tasks`' max age counts from it.
    #[serde(with = "time::serde::rfc3339")]
    #[schemars(with = "crate::timestamp::Timestamp")]
    pub updated_at: OffsetDateTime,
    /// The W3C `traceparent` of the span the task was created in: what the service does to
    /// the task on its own (its deadline, a cascade's cancels) joins that trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// The task's budget, when it has one (its assignee sees it as `metadata.budget`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<crate::budget::BudgetGrant>,
}

/// How many transitions a task record keeps.
pub const HISTORY_KEPT: usize = 32;
/// The `reason` of a task failed by its deadline.
pub const DEADLINE_EXPIRED: &str = "deadline_expired";

impl TaskRecord {
    /// The caller's role: the assignee for assignee ops, the requester for a cancel (both for a
    /// task an agent gave itself); `None` for an outsider.
    pub fn role_of(&self, agent: &AgentId, op: TaskOp) -> Option<TaskRole> {
        let assignee = self.assignee == *agent;
        let requester = self.requester == *agent;
        match (assignee, requester) {
            (true, true) if op.allowed(TaskRole::Assignee) => Some(TaskRole::Assignee),
            (_, true) => Some(TaskRole::Requester),
            (true, false) => Some(TaskRole::Assignee),
            (false, false) => None,
        }
    }

    /// Whether `agent` is the requester or the assignee.
    pub fn is_party(&self, agent: &AgentId) -> bool {
        self.assignee == *agent || self.requester == *agent
    }
}

/// A descendant of a task that ended, as the end left it (`cancel` reports each one).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DescendantState {
    /// The subtask.
    pub task_id: Uuid,
    /// Its parent.
    pub parent: Uuid,
    /// Its state now: `canceled` by the cascade, or the end it had reached before.
    pub state: TaskState,
}

/// The reply to every task op but `list`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TaskReply {
    /// The task after the op.
    pub task: TaskRecord,
    /// True when a spawn's deadline was cut to its parent task's (a subtask never outlives
    /// its parent); omitted when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deadline_clamped: bool,
    /// An op that ended the task: every descendant and the state the end left it in (the
    /// cascade cancels the open ones), parents before children; omitted when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub descendants: Vec<DescendantState>,
    /// The goals the `kind: task` message reached (create, spawn).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub delivered_to: Vec<GoalId>,
    /// True when the op had already been applied (a retried request): nothing changed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub duplicate: bool,
}

/// The reply to `list`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TaskList {
    /// Tasks, oldest first (newest first when asked).
    pub tasks: Vec<TaskRecord>,
    /// Pass as `cursor` for the next page; absent on the last page. A page may be short (even
    /// empty) and still have one, when the listing read [`LIST_READ_MAX`] records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<Uuid>,
    /// How many tasks match on all pages. Counted record by record when a `state` or
    /// `metadata` filter is asked for (absent past [`LIST_COUNT_MAX`] candidates); otherwise
    /// from the task index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<u64>,
}

/// Published on `agent.task.events.<task_id>` for the creation (`op` absent) and every
/// transition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TaskEvent {
    /// `<task_id>:<n>`, n counting from 0 (the creation): stable, so a retried publish and the
    /// audit service de-duplicate by it.
    pub id: String,
    /// The task the event is about; also the subject's last token.
    pub task_id: Uuid,
    /// The op (absent for the creation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op: Option<TaskOp>,
    /// Who acted (absent: the service).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<AgentId>,
    /// State before (absent for the creation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<TaskState>,
    /// State after.
    pub to: TaskState,
    /// Who created the task.
    pub requester: AgentId,
    /// Who the task was given to.
    pub assignee: AgentId,
    /// The parent task, for a subtask; absent for a task without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<Uuid>,
    /// Reason, note, question or result text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The op's parts: progress parts, question parts, result parts (absent when none), so a
    /// reader of the events (the A2A gateway's streams) has them as they come.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<crate::Part>,
    /// The op's attachments (the creation's, a progress note's, a question's, the result's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<crate::files::Attachment>,
    /// When it happened: the record's `updated_at`.
    #[serde(with = "time::serde::rfc3339")]
    #[schemars(with = "crate::timestamp::Timestamp")]
    pub at: OffsetDateTime,
}

#[cfg(test)]
mod tests {
    use super::*;
    use TaskOp as Op;
    use TaskRole as R;
    use TaskState as S;

    #[test]
    fn the_happy_path_and_the_loop() {
        let mut state = S::Submitted;
        for op in [
            Op::Accept,
            Op::Start,
            Op::Progress,
            Op::InputRequired,
            Op::Start,
            Op::Complete,
        ] {
            state = apply(state, op, R::Assignee).unwrap();
        }
        assert_eq!(state, S::Completed);
    }

    #[test]
    fn refusals_have_kinds() {
        let err: ErrorReply = apply(S::Completed, Op::Cancel, R::Requester)
            .unwrap_err()
            .into();
        assert_eq!(err.kind(), ErrorKind::TaskTerminal);
        let err: ErrorReply = apply(S::Submitted, Op::Complete, R::Assignee)
            .unwrap_err()
            .into();
        assert_eq!(err.kind(), ErrorKind::IllegalTransition);
        assert!(
            err.error
                .message
                .contains("`complete` is not possible while the task is submitted")
        );
        let err: ErrorReply = apply(S::Working, Op::Complete, R::Requester)
            .unwrap_err()
            .into();
        assert_eq!(err.kind(), ErrorKind::NotAllowed);
        assert_eq!(apply(S::Working, Op::Expire, R::System), Ok(S::Failed));
        assert!(apply(S::Working, Op::Expire, R::Requester).is_err());
    }

    #[test]
    fn subjects_and_aliases() {
        let a = AgentId::parse("writer").unwrap();
        assert_eq!(
            TaskRequestOp::Transition(Op::InputRequired).subject(&a),
            "agent.task.input_required.writer"
        );
        assert_eq!(TaskRequestOp::Spawn.subject(&a), "agent.task.spawn.writer");
        let id = Uuid::nil();
        assert_eq!(
            crate::subject::task_events(&id),
            "agent.task.events.00000000-0000-0000-0000-000000000000"
        );
        let action: TaskAction =
            serde_json::from_value(serde_json::json!({"task_id": id, "reason": "busy"})).unwrap();
        assert_eq!(action.message.as_deref(), Some("busy"));
        assert!(
            serde_json::from_value::<TaskAction>(serde_json::json!({"task_id": id, "bogus": 1}))
                .is_err()
        );
    }

    #[test]
    fn roles_of_a_self_task() {
        let me = AgentId::parse("me").unwrap();
        let other = AgentId::parse("other").unwrap();
        let now = OffsetDateTime::now_utc();
        let task = TaskRecord {
            task_id: Uuid::nil(),
            requester: me.clone(),
            requester_goal: None,
            assignee: me.clone(),
            assignee_goal: None,
            state: S::Submitted,
            message: "x".into(),
            parts: Vec::new(),
            attachments: Vec::new(),
            deadline: None,
            callback: None,
            metadata: Map::new(),
            parent: None,
            depth: 1,
            children: Vec::new(),
            result: None,
            result_parts: Vec::new(),
            result_attachments: Vec::new(),
            reason: None,
            message_id: Uuid::nil(),
            in_reply_to: None,
            receipt: None,
            transitions: 0,
            history: Vec::new(),
            created_at: now,
            updated_at: now,
            traceparent: None,
            budget: None,
        };
        assert_eq!(task.role_of(&me, Op::Accept), Some(R::Assignee));
        assert_eq!(task.role_of(&me, Op::Cancel), Some(R::Requester));
        assert_eq!(task.role_of(&other, Op::Cancel), None);
    }
}
