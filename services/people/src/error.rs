//! People errors and the one place they become the wire's `{code, kind}` (docs/protocol.md
//! §2 and §14).

use switchboard_proto::people::Party;
use switchboard_proto::{AgentId, ErrorKind, ErrorReply, GoalId, timestamp};
use switchboard_runtime::store::StoreError;
use time::OffsetDateTime;
use uuid::Uuid;

/// Why a people request failed.
#[derive(Debug, thiserror::Error)]
pub enum PeopleError {
    /// A malformed field (`to` without a prefix, an action that cannot be bound, contradictory
    /// times).
    #[error("{0}")]
    BadRequest(String),
    /// The note, question or reason is blank.
    #[error("`{0}` is empty")]
    Empty(&'static str),
    /// A text past its limit.
    #[error("`{field}` is {size} bytes; at most {limit}")]
    TooLarge {
        /// The field.
        field: &'static str,
        /// Its size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// The caller has no registration.
    #[error("`{0}` is not registered: register before addressing people")]
    NotRegistered(AgentId),
    /// `from_goal_id` is not one of the caller's live goals.
    #[error("goal {goal} is not a live goal of `{caller}`")]
    NotYourGoal {
        /// The goal named.
        goal: GoalId,
        /// The caller.
        caller: AgentId,
    },
    /// The person or role does not exist, has no members, or cannot approve.
    #[error("{0}")]
    Unreachable(String),
    /// The access rules refuse it.
    #[error("{0}")]
    AclDenied(String),
    /// The sender holds its full share of the addressee's inbox.
    #[error(
        "`{agent}` already has {count} {what} waiting for {to}, its full share; wait for answers first"
    )]
    SenderAtCap {
        /// The sender.
        agent: AgentId,
        /// The addressee.
        to: Party,
        /// How many.
        count: usize,
        /// Of what.
        what: &'static str,
    },
    /// The caller has the most asks and approvals waiting allowed.
    #[error("`{agent}` already has {cap} asks and approvals waiting; wait for answers first")]
    TooManyWaiting {
        /// The caller.
        agent: AgentId,
        /// The cap.
        cap: usize,
    },
    /// An item id (client-chosen) names another item.
    #[error("item {0} already exists with other content; choose a fresh id")]
    IdTaken(Uuid),
    /// No such item (or not the caller's: no oracle).
    #[error("no item {0}")]
    NotFound(Uuid),
    /// The person does not exist.
    #[error("no person `{0}`")]
    UnknownPerson(String),
    /// The person is not who the item waits for.
    #[error("{0}")]
    NotAddressee(String),
    /// Someone answered first.
    #[error("item {item} was answered by {by} at {}", timestamp::format(*.at))]
    AlreadyAnswered {
        /// The item.
        item: Uuid,
        /// Who answered.
        by: Party,
        /// When.
        at: OffsetDateTime,
    },
    /// The item ended unanswered at its deadline.
    #[error("item {item} expired at {}", timestamp::format(*.at))]
    Expired {
        /// The item.
        item: Uuid,
        /// Its deadline.
        at: OffsetDateTime,
    },
    /// The person lacks the console access the action needs.
    #[error("{0}")]
    NotAllowed(String),
    /// The approval is not decided yet.
    #[error("approval {0} is not decided yet; wait for the decision in your goal's inbox")]
    ApprovalPending(Uuid),
    /// The approval was denied.
    #[error("approval {item} was denied by {by}{}", .note.as_ref().map(|note| format!(": {note}")).unwrap_or_default())]
    ApprovalDenied {
        /// The approval.
        item: Uuid,
        /// Who denied it.
        by: Party,
        /// Their note.
        note: Option<String>,
    },
    /// The approval was used already.
    #[error("approval {item} was used at {}; each approval is good for one use", timestamp::format(*.at))]
    ApprovalUsed {
        /// The approval.
        item: Uuid,
        /// When.
        at: OffsetDateTime,
    },
    /// The action differs from the one approved.
    #[error(
        "the action differs from the one approved (its hash is {got}, the approval's {want}): arguments or tool changed"
    )]
    ActionMismatch {
        /// The action's hash.
        got: String,
        /// The approval's.
        want: String,
    },
    /// The record kept changing under concurrent writers.
    #[error("item {0} keeps changing; retry")]
    Contention(Uuid),
    /// Reading or writing the items bucket failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl PeopleError {
    /// The stable kind callers match on.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::BadRequest(_) => ErrorKind::BadRequest,
            Self::Empty(_) => ErrorKind::EmptyMessage,
            Self::TooLarge { .. } => ErrorKind::BodyTooLarge,
            Self::NotRegistered(_) => ErrorKind::NotRegistered,
            Self::NotYourGoal { .. } => ErrorKind::InvalidGoalId,
            Self::Unreachable(_) => ErrorKind::Unreachable,
            Self::AclDenied(_) => ErrorKind::AclDenied,
            Self::SenderAtCap { .. } => ErrorKind::InboxFull,
            Self::TooManyWaiting { .. } => ErrorKind::TooManyCalls,
            Self::IdTaken(_) | Self::Contention(_) => ErrorKind::Conflict,
            Self::NotFound(_) | Self::UnknownPerson(_) => ErrorKind::NotFound,
            Self::NotAddressee(_) => ErrorKind::NotAddressee,
            Self::AlreadyAnswered { .. } => ErrorKind::AlreadyAnswered,
            Self::Expired { .. } => ErrorKind::Expired,
            Self::NotAllowed(_) => ErrorKind::NotAllowed,
            Self::ApprovalPending(_) => ErrorKind::ApprovalPending,
            Self::ApprovalDenied { .. } => ErrorKind::ApprovalDenied,
            Self::ApprovalUsed { .. } => ErrorKind::ApprovalUsed,
            Self::ActionMismatch { .. } => ErrorKind::ActionMismatch,
            Self::Store(store) => store.kind(),
        }
    }
}

impl From<PeopleError> for ErrorReply {
    fn from(err: PeopleError) -> Self {
        match err {
            PeopleError::Store(store) => store.into(),
            err => ErrorReply::new(err.kind(), err.to_string()),
        }
    }
}
