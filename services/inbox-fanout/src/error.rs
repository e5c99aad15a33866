//! Fan-out errors, named after the step that failed, and their stable kinds. Gate failures
//! come as ready-made error replies from `switchboard_proto::send`.

use switchboard_proto::{AgentId, ErrorKind, ErrorReply};

/// Why a send failed as a whole (per-target problems are unreachable reasons instead).
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
    Encode(String),
}

impl FanoutError {
    /// The stable kind callers match on.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::SenderNotRegistered(_) => ErrorKind::NotRegistered,
            Self::BroadcastTooLarge { .. } => ErrorKind::BroadcastTooLarge,
            Self::EnvelopeTooLarge { .. } => ErrorKind::BodyTooLarge,
            Self::Encode(_) => ErrorKind::Internal,
        }
    }
}

impl From<FanoutError> for ErrorReply {
    fn from(err: FanoutError) -> Self {
        ErrorReply::new(err.kind(), err.to_string())
    }
}
