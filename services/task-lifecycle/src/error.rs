//! Task errors, named after the rule or step that failed, and their stable error kinds.
//!
//! Each variant's message is what the caller reads; [`TaskError::kind`] is what it matches on.
//! Both go on the wire once, in `From<TaskError> for ErrorReply`.

use switchboard_proto::send::{no_live_goals, unknown_agent};
use switchboard_proto::task::{
    DEADLINE_EXPIRED, LIST_LIMIT_MAX, LIST_METADATA_MAX, TaskOp, TaskRefusal,
};
use switchboard_proto::{AgentId, ErrorKind, ErrorReply, GoalId, MAX_BODY_BYTES, acl, timestamp};
use switchboard_runtime::store::StoreError;
use time::OffsetDateTime;
use uuid::Uuid;

/// Why a task request failed.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// The task's `budget` is malformed (amounts out of range, `root` without `parent`).
    #[error("{0}")]
    BadBudget(String),
    /// The budgets refused the task's budget (`budget_exhausted`, `not_allowed`, …) or could
    /// not be reached (`unavailable`).
    #[error("{}", .0.error.message)]
    Budget(ErrorReply),
    /// A spawn without the task it is part of.
    #[error("`parent_task_id` is required: the task this one is part of")]
    ParentRequired,
    /// A create naming a parent (subtasks are spawned).
    #[error("`parent_task_id` belongs to spawn (agent.task.spawn.<me>), not create")]
    ParentOnCreate,
    /// A send gate (`switchboard_proto::send`: the sender, `to`, the body and its size)
    /// refused the request; its reply is passed on as it is.
    #[error("{}", .0.error.message)]
    Gate(ErrorReply),
    /// A create addressed to the caller itself.
    #[error("a task for yourself is a subtask: spawn it with `to: \"self\"`")]
    TaskForSelf,
    /// A task addressed to `*`.
    #[error("a task goes to one agent, not `*`")]
    Broadcast,
    /// The assignee is not a valid agent id or is not registered.
    #[error("{}", unknown_agent(.0))]
    UnknownAssignee(String),
    /// Both `deadline` and `deadline_in_ms`.
    #[error("give `deadline` or `deadline_in_ms`, not both")]
    TwoDeadlines,
    /// `deadline_in_ms` beyond the furthest deadline allowed.
    #[error("deadline_in_ms is {ms}; the most is {max} (366 days)")]
    DeadlineTooFar {
        /// What was asked for.
        ms: u64,
        /// The most allowed.
        max: u64,
    },
    /// `deadline_in_ms` past what a timestamp can hold.
    #[error("deadline_in_ms is out of range")]
    DeadlineOutOfRange,
    /// The deadline asked for is not in the future.
    #[error("the deadline {} has already passed", timestamp::format(*.at))]
    DeadlinePassed {
        /// The deadline.
        at: OffsetDateTime,
    },
    /// A spawn under a parent task whose deadline has passed.
    #[error(
        "parent task {parent} ran out at {}: a subtask cannot outlive it",
        timestamp::format(*.at)
    )]
    ParentDeadlinePassed {
        /// The parent task.
        parent: Uuid,
        /// Its deadline.
        at: OffsetDateTime,
    },
    /// No agent fits a `skill:<name>` task (or the directory could not say).
    #[error("{0}")]
    NoSkill(String),
    /// The requester is not registered.
    #[error("`{0}` is not registered; register before creating tasks")]
    NotRegistered(AgentId),
    /// The ACL (either side) forbids the requester to give the assignee a task.
    #[error("{}", .denial.reason(.requester.as_str(), .assignee.as_str()))]
    AclDenied {
        /// Which rule refused.
        denial: acl::Denial,
        /// The caller.
        requester: AgentId,
        /// The agent the task is for.
        assignee: AgentId,
    },
    /// The assignee has no live goal to deliver the task to.
    #[error("{}", no_live_goals(.0))]
    NoLiveGoals(AgentId),
    /// A concurrent create with the same task id has not written its record yet.
    #[error("task {0} is being created; retry")]
    BeingCreated(Uuid),
    /// No goal of the assignee took the task message.
    #[error("the task could not be delivered to any goal of `{0}`")]
    Undelivered(AgentId),
    /// The task id is taken by a task of another requester or with another text.
    #[error("task {0} exists already")]
    Exists(Uuid),
    /// A goal named in the request is not a live goal of the caller.
    #[error("goal {goal} is not a live goal of `{agent}`")]
    NotALiveGoal {
        /// The caller.
        agent: AgentId,
        /// The goal.
        goal: GoalId,
    },
    /// No such task.
    #[error("no task {0}")]
    NotFound(Uuid),
    /// A spawn by someone other than the parent's assignee.
    #[error("only `{assignee}`, the assignee of task {parent}, may spawn subtasks of it")]
    NotParentAssignee {
        /// The parent task.
        parent: Uuid,
        /// Its assignee.
        assignee: AgentId,
    },
    /// The state machine (`switchboard_proto::task::apply`) refused the op.
    #[error("{}", ErrorReply::from(*.0).error.message)]
    Refused(TaskRefusal),
    /// The subtask would be nested deeper than `depth_limit`.
    #[error("a subtask of task {parent} would be nested {depth} deep; the limit is {limit}")]
    TooDeep {
        /// The parent task.
        parent: Uuid,
        /// The subtask's depth.
        depth: u32,
        /// `depth_limit`.
        limit: u32,
    },
    /// The parent has spawned `max_children` subtasks over its life.
    #[error("task {parent} has spawned {max} subtasks, the most allowed")]
    TooManyChildren {
        /// The parent task.
        parent: Uuid,
        /// `max_children`.
        max: usize,
    },
    /// The parent has `max_open_children` subtasks open.
    #[error(
        "task {parent} already has {open} open subtasks (the limit is {limit}); wait for one to end"
    )]
    TooManyOpenChildren {
        /// The parent task.
        parent: Uuid,
        /// Its open subtasks.
        open: usize,
        /// `max_open_children`.
        limit: usize,
    },
    /// Compare-and-set on the task kept losing to concurrent writers.
    #[error("task {0} keeps changing; retry")]
    KeepsChanging(Uuid),
    /// An op or a get without `task_id`.
    #[error("`task_id` is required")]
    TaskIdRequired,
    /// A reject or fail without a reason.
    #[error("`{}` needs a `reason`", .0.as_str())]
    ReasonRequired(TaskOp),
    /// An input_required without a question.
    #[error("`input_required` needs a `question` for the requester")]
    QuestionRequired,
    /// A progress without a note or parts.
    #[error("`progress` needs a `note` or parts")]
    NoteRequired,
    /// The op's text is longer than a message body may be.
    #[error("the text is {len} bytes; the limit is {} bytes", MAX_BODY_BYTES)]
    TextTooLarge {
        /// Its length in bytes.
        len: usize,
    },
    /// The caller is neither party of the task it acts on.
    #[error("`{caller}` is neither the requester nor the assignee of task {task}")]
    NotAParty {
        /// The caller.
        caller: AgentId,
        /// The task.
        task: Uuid,
    },
    /// The task passed its deadline; it failed as the op was asked for.
    #[error(
        "task {task} passed its deadline {} and failed ({})",
        timestamp::format(*.deadline),
        DEADLINE_EXPIRED
    )]
    DeadlineExpired {
        /// The task.
        task: Uuid,
        /// Its deadline.
        deadline: OffsetDateTime,
    },
    /// At accept, the assignee's `allow_from` no longer names the requester.
    #[error("`{assignee}` does not accept tasks from `{requester}` (allow_from)")]
    NotAllowedFrom {
        /// The assignee.
        assignee: AgentId,
        /// The requester.
        requester: AgentId,
    },
    /// The assignee is at its `max_concurrent_tasks`.
    #[error(
        "`{agent}` already has {active} tasks accepted, working or waiting for input (max_concurrent_tasks {cap})"
    )]
    AtCapacity {
        /// The assignee.
        agent: AgentId,
        /// Its active tasks.
        active: usize,
        /// `max_concurrent_tasks`.
        cap: usize,
    },
    /// Compare-and-set on the assignee's active set kept losing to concurrent writers.
    #[error("the task load of `{0}` keeps changing; retry")]
    LoadKeepsChanging(AgentId),
    /// The caller is not a party of the task or of any of its ancestors.
    #[error("`{caller}` is not a party of task {task}")]
    NotVisible {
        /// The caller.
        caller: AgentId,
        /// The task.
        task: Uuid,
    },
    /// A list `limit` out of range.
    #[error("`limit` must be 1 to {}", LIST_LIMIT_MAX)]
    BadLimit,
    /// A list `metadata` filter naming too many keys.
    #[error("`metadata` may name at most {} keys", LIST_METADATA_MAX)]
    BadMetadataFilter,
    /// An operator request whose `person` is not `person:<id>`.
    #[error("`person` must be person:<id>, not `{0}`")]
    BadPerson(String),
    /// A KV or JetStream read or write failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl TaskError {
    /// The stable kind callers match on.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::ParentRequired
            | Self::ParentOnCreate
            | Self::Broadcast
            | Self::TwoDeadlines
            | Self::DeadlineTooFar { .. }
            | Self::DeadlineOutOfRange
            | Self::TaskIdRequired
            | Self::ReasonRequired(_)
            | Self::QuestionRequired
            | Self::NoteRequired
            | Self::BadLimit
            | Self::BadPerson(_)
            | Self::BadMetadataFilter
            | Self::BadBudget(_) => ErrorKind::BadRequest,
            Self::Gate(reply) | Self::Budget(reply) => reply.kind(),
            Self::TaskForSelf => ErrorKind::SelfSend,
            Self::UnknownAssignee(_) | Self::NoLiveGoals(_) | Self::NoSkill(_) => {
                ErrorKind::Unreachable
            }
            Self::DeadlinePassed { .. }
            | Self::DeadlineExpired { .. }
            | Self::ParentDeadlinePassed { .. } => ErrorKind::Expired,
            Self::NotRegistered(_) => ErrorKind::NotRegistered,
            Self::AclDenied { .. } | Self::NotAllowedFrom { .. } => ErrorKind::AclDenied,
            Self::BeingCreated(_)
            | Self::Exists(_)
            | Self::KeepsChanging(_)
            | Self::LoadKeepsChanging(_) => ErrorKind::Conflict,
            Self::Undelivered(_) => ErrorKind::Unavailable,
            Self::NotALiveGoal { .. } => ErrorKind::InvalidGoalId,
            Self::NotFound(_) => ErrorKind::NotFound,
            Self::NotParentAssignee { .. } | Self::NotAParty { .. } | Self::NotVisible { .. } => {
                ErrorKind::NotAllowed
            }
            Self::Refused(refusal) => ErrorReply::from(*refusal).kind(),
            Self::TooDeep { .. } => ErrorKind::DepthExceeded,
            Self::TooManyChildren { .. } | Self::TooManyOpenChildren { .. } => {
                ErrorKind::TooManyChildren
            }
            Self::TextTooLarge { .. } => ErrorKind::BodyTooLarge,
            Self::AtCapacity { .. } => ErrorKind::AtCapacity,
            Self::Store(store) => store.kind(),
        }
    }
}

impl From<TaskError> for ErrorReply {
    fn from(err: TaskError) -> Self {
        match err {
            // Made by switchboard_proto already (its code included): passed on unchanged.
            TaskError::Gate(reply) => reply,
            other => ErrorReply::new(other.kind(), other.to_string()),
        }
    }
}
