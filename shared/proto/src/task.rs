//! The task state machine (ARCHITECTURE.md §5): A2A states plus an acceptance step.
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

use crate::error::{ErrorKind, ErrorReply};
use crate::message::TaskState;

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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
        /// The current state.
        from: TaskState,
        /// The op.
        op: TaskOp,
    },
    /// This role may not perform the op.
    NotAllowed {
        /// The op.
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
}
