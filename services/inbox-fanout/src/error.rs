//! Fan-out errors, named after the step that failed, and their stable kinds. Gate failures
//! come as ready-made error replies from `switchboard_proto::send`, a send's delivery failures
//! from the door (`switchboard_delivery::door::DoorError`).

use switchboard_proto::{ErrorKind, ErrorReply, GoalId};
use switchboard_runtime::store::StoreError;

/// Why a send, fetch or ack failed as a whole (per-target problems of a send are unreachable
/// reasons instead).
#[derive(Debug, thiserror::Error)]
pub enum FanoutError {
    /// The goal is not one of the caller's live goals (unknown and another agent's alike).
    #[error("no live goal {0} of yours")]
    GoalNotFound(GoalId),
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
    /// Reading or writing the inbox or a cursor failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl FanoutError {
    /// The stable kind callers match on.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::GoalNotFound(_) => ErrorKind::NotFound,
            Self::BadRead(_) => ErrorKind::BadRequest,
            Self::Contention(_) => ErrorKind::Conflict,
            Self::NoReceipt(_) => ErrorKind::NotFound,
            Self::Receipts(_) => ErrorKind::Unavailable,
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
