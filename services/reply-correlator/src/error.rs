//! Correlator errors, named after the step that failed, and the one place they become the
//! wire's `{code, kind}`.
//!
//! Store failures wrap the shared [`StoreError`] (so every service maps them to the same
//! kinds). Refusals by a rule other services share — the send gates, the call-chain rules —
//! and the fan-out's own refusal of a call's request arrive as ready-made error replies and
//! pass through unchanged.

use switchboard_proto::{AgentId, ErrorKind, ErrorReply, GoalId, timestamp};
use switchboard_runtime::store::StoreError;
use time::OffsetDateTime;
use uuid::Uuid;

/// Why a call, a reply, a pending listing or a deadline sweep failed.
#[derive(Debug, thiserror::Error)]
pub enum CorrelatorError {
    /// A send gate refused the call's request or the answer (`to` missing, a call to oneself,
    /// an empty or oversized message, a sender other than the caller, content that would not
    /// fit one inbox message).
    #[error("{}", .0.error.message)]
    Gate(ErrorReply),
    /// The call's `budget` is malformed (amounts out of range, `root` without `parent`).
    #[error("{0}")]
    BadBudget(String),
    /// The budgets refused the call's budget (`budget_exhausted`, `not_allowed`, …) or could
    /// not be reached (`unavailable`).
    #[error("{}", .0.error.message)]
    Budget(ErrorReply),
    /// The call names `*`: a call goes to one peer.
    #[error("a call goes to one peer; use send_to_peer with `*` to broadcast")]
    Broadcast,
    /// The callee cannot be reached: its id cannot exist, or the fan-out delivered the request
    /// to none of its goals (the reasons).
    #[error("{0}")]
    Unreachable(String),
    /// `from_goal_id` is not a live goal of the caller (answers would land in someone else's).
    #[error("goal {goal} is not a live goal of `{caller}`")]
    NotYourGoal {
        /// The goal named.
        goal: GoalId,
        /// The caller.
        caller: AgentId,
    },
    /// `parent_correlation_id` names no call.
    #[error("parent call {0} is unknown")]
    UnknownParent(Uuid),
    /// The call-chain rules refused the call (a cycle, too deep, a parent call made to
    /// another agent).
    #[error("{}", .0.error.message)]
    Chain(ErrorReply),
    /// The caller already has the most open calls allowed.
    #[error("`{caller}` already has {cap} open calls; answer or wait for some first")]
    TooManyCalls {
        /// The caller.
        caller: AgentId,
        /// `max_open_calls`.
        cap: usize,
    },
    /// Subscribing to the waiting call's answer subject failed.
    #[error("listening for the answer: {0}")]
    ListenForAnswer(#[source] async_nats::Error),
    /// The fan-out refused the call's request (its error reply, passed on).
    #[error("{}", .0.error.message)]
    FanoutRefused(ErrorReply),
    /// No fan-out answered the call's request.
    #[error("inbox-fanout is not running; the call was not made")]
    FanoutNotRunning,
    /// Handing the call's request to the fan-out failed otherwise (timeout, connection).
    #[error("{0}")]
    DeliverRequest(#[source] async_nats::Error),
    /// A waiting call's deadline passed without an answer.
    #[error(
        "no answer from `{callee}` within {timeout_ms} ms (call {correlation_id}){}",
        if *.clamped { "; its time was cut to what the parent call had left" } else { "" }
    )]
    Timeout {
        /// The callee.
        callee: AgentId,
        /// The call's timeout (after clamping).
        timeout_ms: u64,
        /// The call.
        correlation_id: Uuid,
        /// Whether the timeout was cut to the parent call's deadline.
        clamped: bool,
    },
    /// A waiting call's request left the callee's inbox unread (removed from a full inbox,
    /// rejected, dead-lettered): no answer can come, so the call ends now, not at its deadline.
    #[error("call {correlation_id} to `{callee}` ended unanswered: {reason}")]
    RequestDropped {
        /// The callee.
        callee: AgentId,
        /// The call.
        correlation_id: Uuid,
        /// What happened to the request.
        reason: String,
    },
    /// A call made while serving a call whose deadline has passed.
    #[error(
        "the parent call {parent} ran out at {}: a call made while serving it cannot outlive it",
        timestamp::format(*.deadline)
    )]
    ParentExpired {
        /// The parent call.
        parent: Uuid,
        /// Its deadline.
        deadline: OffsetDateTime,
    },
    /// A reply names no call.
    #[error("`correlation_id` is required: the call you are answering")]
    MissingCorrelationId,
    /// A reply names a call nobody made (or one gone from the bucket).
    #[error("no call {0}")]
    UnknownCall(Uuid),
    /// A reply from someone other than the call's callee.
    #[error("only `{callee}` may answer call {correlation_id}")]
    NotCallee {
        /// The call's callee, the only one who may answer.
        callee: AgentId,
        /// The call.
        correlation_id: Uuid,
    },
    /// A reply to a call whose deadline passed; the answer is not delivered.
    #[error(
        "call {correlation_id} expired at {}; the answer was not delivered",
        timestamp::format(*.deadline)
    )]
    Expired {
        /// The call.
        correlation_id: Uuid,
        /// Its deadline.
        deadline: OffsetDateTime,
    },
    /// Another reply claimed the call a moment ago and is delivering its answer.
    #[error("an answer to call {0} is being delivered; retry to see its outcome")]
    AnswerInProgress(Uuid),
    /// Compare-and-set on the call kept losing to concurrent writers.
    #[error("call {0} keeps changing; retry")]
    Contention(Uuid),
    /// A partial reply named a part number past the next one.
    #[error("part {got} of call {correlation_id} is out of order: the next part is {next}")]
    PartOutOfOrder {
        /// The call.
        correlation_id: Uuid,
        /// The number the reply named.
        got: u32,
        /// The number the call takes next.
        next: u32,
    },
    /// A streamed answer past its limits (parts, or the joined text's size).
    #[error("{0}")]
    StreamTooLong(String),
    /// A partial reply to a call already answered (the final reply ends a call).
    #[error("call {0} is answered already: no more parts")]
    AnsweredAlready(Uuid),
    /// A retried call (by its id) that was answered into the caller goal's inbox: the
    /// answer is there, as `kind: response` with this correlation id.
    #[error("call {0} is answered: its answer is in your calling goal's inbox")]
    AnsweredToInbox(Uuid),
    /// The `correlation_id` a call named belongs to another caller's call.
    #[error("call id {0} is taken by another call; choose a fresh id")]
    CallIdTaken(Uuid),
    /// Encoding the answer for the hand-over failed (a bug).
    #[error("{0}")]
    EncodeAnswer(#[source] async_nats::Error),
    /// Publishing into the caller goal's inbox failed.
    #[error("{0}")]
    PublishToInbox(#[source] async_nats::Error),
    /// Reading or writing the calls bucket, its index or the goals bucket failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl CorrelatorError {
    /// The stable kind callers match on.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Gate(reply)
            | Self::Chain(reply)
            | Self::FanoutRefused(reply)
            | Self::Budget(reply) => reply.kind(),
            Self::BadBudget(_) => ErrorKind::BadRequest,
            Self::Broadcast | Self::MissingCorrelationId | Self::PartOutOfOrder { .. } => {
                ErrorKind::BadRequest
            }
            Self::StreamTooLong(_) => ErrorKind::BodyTooLarge,
            Self::AnsweredAlready(_) | Self::AnsweredToInbox(_) | Self::CallIdTaken(_) => {
                ErrorKind::Conflict
            }
            Self::Unreachable(_) => ErrorKind::Unreachable,
            Self::NotYourGoal { .. } => ErrorKind::InvalidGoalId,
            Self::UnknownParent(_) | Self::UnknownCall(_) => ErrorKind::NotFound,
            Self::TooManyCalls { .. } => ErrorKind::TooManyCalls,
            Self::ListenForAnswer(_)
            | Self::FanoutNotRunning
            | Self::DeliverRequest(_)
            | Self::PublishToInbox(_) => ErrorKind::Unavailable,
            Self::Timeout { .. } => ErrorKind::Timeout,
            Self::RequestDropped { .. } => ErrorKind::InboxFull,
            Self::NotCallee { .. } => ErrorKind::NotCallee,
            Self::Expired { .. } | Self::ParentExpired { .. } => ErrorKind::Expired,
            Self::AnswerInProgress(_) | Self::Contention(_) => ErrorKind::Conflict,
            Self::EncodeAnswer(_) => ErrorKind::Internal,
            Self::Store(store) => store.kind(),
        }
    }
}

impl CorrelatorError {
    /// Whether a failed delivery of a call's request may still have stored it: it timed out or
    /// the store failed on its way (a write whose acknowledgement was lost), as opposed to a
    /// refusal that stored nothing.
    pub(crate) fn may_have_delivered(&self) -> bool {
        match self {
            Self::DeliverRequest(_) => true,
            Self::FanoutRefused(reply) => matches!(
                reply.kind(),
                ErrorKind::Unavailable | ErrorKind::Internal | ErrorKind::Timeout
            ),
            _ => false,
        }
    }
}

impl From<CorrelatorError> for ErrorReply {
    fn from(err: CorrelatorError) -> Self {
        match err {
            CorrelatorError::Gate(reply)
            | CorrelatorError::Chain(reply)
            | CorrelatorError::FanoutRefused(reply) => reply,
            CorrelatorError::Store(store) => store.into(),
            err => ErrorReply::new(err.kind(), err.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_delivery_that_failed_on_its_way_may_have_stored_the_request() {
        let door = |kind| CorrelatorError::FanoutRefused(ErrorReply::new(kind, "door"));
        for kind in [
            ErrorKind::Unavailable,
            ErrorKind::Internal,
            ErrorKind::Timeout,
        ] {
            assert!(door(kind).may_have_delivered(), "{kind:?}");
        }
        let timed_out = CorrelatorError::DeliverRequest("took more than 10 s".into());
        assert!(timed_out.may_have_delivered());
        // Refusals store nothing: the call is forgotten and refused.
        for kind in [
            ErrorKind::AclDenied,
            ErrorKind::NotRegistered,
            ErrorKind::InboxFull,
            ErrorKind::BodyTooLarge,
        ] {
            assert!(!door(kind).may_have_delivered(), "{kind:?}");
        }
        assert!(!CorrelatorError::Unreachable("no live goals".into()).may_have_delivered());
        // What the caller is told of one: `unavailable`, whatever the door said.
        assert_eq!(timed_out.kind(), ErrorKind::Unavailable);
    }
}
