//! Fan-out errors, named after the step that failed, and their stable kinds. Gate failures
//! come as ready-made error replies from `switchboard_proto::send`.

use switchboard_proto::{AgentId, ErrorKind, ErrorReply, GoalId};
use switchboard_runtime::store::StoreError;

/// Why a send, fetch or ack failed as a whole (per-target problems of a send are unreachable
/// reasons instead).
#[derive(Debug, thiserror::Error)]
pub enum FanoutError {
    /// The sender is not registered (its card carries the ACL rules a send needs).
    #[error("agent `{0}` is not registered; register before sending")]
    SenderNotRegistered(AgentId),
    /// A broadcast would reach more peers than the cap.
    #[error("broadcast would reach {peers} peers; the cap is {cap}. Nothing was sent")]
    BroadcastTooLarge {
        /// Reachable peers.
        peers: usize,
        /// The configured cap.
        cap: usize,
    },
    /// The message with its envelope is larger than the inbox stream accepts.
    #[error("the message with its parts and metadata is {size} bytes; the limit is {limit} bytes")]
    EnvelopeTooLarge {
        /// Encoded size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// Encoding the inbox message failed (a bug).
    #[error("encoding the inbox message: {0}")]
    Encode(#[source] async_nats::Error),
    /// The goal is not one of the caller's live goals (unknown and another agent's alike).
    #[error("no live goal {0} of yours")]
    GoalNotFound(GoalId),
    /// A send named a `from_goal_id` that is not one of the sender's live goals: a message
    /// may not claim to come from (and draw answers into) someone else's goal.
    #[error("from_goal_id {0} is not a live goal of yours")]
    NotYourGoal(GoalId),
    /// A fetch or ack asked for something out of bounds (`max`, `wait_ms`, a sequence never
    /// handed out, an ack naming no operation).
    #[error("{0}")]
    BadRead(String),
    /// The goal's cursor kept changing under this request.
    #[error("the cursor of goal {0} kept changing; retry")]
    Contention(GoalId),
    /// No message with receipts of the caller has this id (unknown, aged out after 7 days,
    /// sent without `receipt`, or another agent's: answered alike).
    #[error("no message {0} of yours with receipts (send with `receipt` to follow one)")]
    NoReceipt(uuid::Uuid),
    /// Reading the receipt records failed.
    #[error("reading receipt records: {0}")]
    Receipts(#[source] async_nats::Error),
    /// Every goal the message was for is full and refuses new messages (`overflow: refuse`):
    /// nothing was stored.
    #[error("`{agent}`'s inbox is full and refuses new messages (nothing was stored); retry later")]
    InboxFull {
        /// The receiving agent.
        agent: AgentId,
    },
    /// Reading or writing the inbox or a cursor failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl FanoutError {
    /// The stable kind callers match on.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::SenderNotRegistered(_) => ErrorKind::NotRegistered,
            Self::BroadcastTooLarge { .. } => ErrorKind::BroadcastTooLarge,
            Self::EnvelopeTooLarge { .. } => ErrorKind::BodyTooLarge,
            Self::Encode(_) => ErrorKind::Internal,
            Self::GoalNotFound(_) => ErrorKind::NotFound,
            Self::NotYourGoal(_) => ErrorKind::InvalidGoalId,
            Self::BadRead(_) => ErrorKind::BadRequest,
            Self::Contention(_) => ErrorKind::Conflict,
            Self::NoReceipt(_) => ErrorKind::NotFound,
            Self::Receipts(_) => ErrorKind::Unavailable,
            Self::InboxFull { .. } => ErrorKind::InboxFull,
            Self::Store(store) => store.kind(),
        }
    }
}

impl From<FanoutError> for ErrorReply {
    fn from(err: FanoutError) -> Self {
        match err {
            FanoutError::Store(store) => store.into(),
            err => ErrorReply::new(err.kind(), err.to_string()),
        }
    }
}
