//! Why a delivery failed as a whole, and the stable kind each failure is answered with
//! (docs/protocol.md §2): what [`crate::door::Door::deliver`] returns.

use switchboard_proto::{AgentId, ErrorKind, ErrorReply, GoalId};
use switchboard_runtime::store::StoreError;

use crate::files::AttachmentError;

/// Why a delivery failed as a whole (a peer it could not reach is an unreachable reason in
/// the report instead).
#[derive(Debug, thiserror::Error)]
pub enum DoorError {
    /// The sender is not registered (its card carries the ACL rules a send needs).
    #[error("agent `{0}` is not registered; register before sending")]
    SenderNotRegistered(AgentId),
    /// A message named a `from_goal_id` that is not one of the sender's live goals: a
    /// message may not claim to come from (and draw answers into) someone else's goal.
    #[error("from_goal_id {0} is not a live goal of yours")]
    NotYourGoal(GoalId),
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
    Encode(String),
    /// Every goal of the one agent it was for is full and refuses new messages
    /// (`overflow: refuse`): nothing was stored.
    #[error("`{agent}`'s inbox is full and refuses new messages (nothing was stored); retry later")]
    InboxFull {
        /// The receiving agent.
        agent: AgentId,
    },
    /// Reading the registry failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// An attachment the sender may not pass on, or that is not as uploaded.
    #[error(transparent)]
    Attachment(#[from] AttachmentError),
}

impl DoorError {
    /// The stable kind callers match on.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::SenderNotRegistered(_) => ErrorKind::NotRegistered,
            Self::NotYourGoal(_) => ErrorKind::InvalidGoalId,
            Self::BroadcastTooLarge { .. } => ErrorKind::BroadcastTooLarge,
            Self::EnvelopeTooLarge { .. } => ErrorKind::BodyTooLarge,
            Self::Encode(_) => ErrorKind::Internal,
            Self::InboxFull { .. } => ErrorKind::InboxFull,
            Self::Store(store) => store.kind(),
            Self::Attachment(AttachmentError::NotFound(_)) => ErrorKind::NotFound,
            Self::Attachment(AttachmentError::Mismatch(_)) => ErrorKind::BadRequest,
            Self::Attachment(AttachmentError::Store(store)) => store.kind(),
        }
    }
}

impl From<DoorError> for ErrorReply {
    fn from(err: DoorError) -> Self {
        match err {
            DoorError::Store(store) => store.into(),
            err => ErrorReply::new(err.kind(), err.to_string()),
        }
    }
}
