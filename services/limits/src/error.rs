//! Limits errors and the one place they become the wire's `{code, kind}` (docs/protocol.md
//! §2 and §15).

use switchboard_proto::{ErrorKind, ErrorReply};
use switchboard_runtime::store::StoreError;

/// Why a limits request failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LimitsError {
    /// A malformed field (a bad key, a wait or hold out of range, absurd tokens).
    #[error("{0}")]
    BadRequest(String),
    /// No limit is declared for the key, or no such lease of the caller's.
    #[error("{0}")]
    NotFound(String),
    /// No lease within the wait, or too many acquires wait on the key.
    #[error("{why}; retry after {retry_after_ms} ms")]
    Limited {
        /// What binds.
        why: String,
        /// A hint.
        retry_after_ms: u64,
    },
    /// The key's state kept changing under this replica's writes.
    #[error("`{0}` kept changing under this replica's writes; retry")]
    Conflict(String),
    /// Too many limits are declared.
    #[error("{0}")]
    TooMany(String),
    /// The store failed.
    #[error("{0}")]
    Store(String),
    /// This replica cannot take the request now.
    #[error("{0}")]
    Unavailable(String),
    /// The caller may not act on this budget node.
    #[error("{0}")]
    NotAllowed(String),
    /// The budget node ended, or its id names other work.
    #[error("{0}")]
    Refused(String),
    /// Nothing is left of the budget to grant.
    #[error("{0}")]
    Exhausted(String),
}

impl From<StoreError> for LimitsError {
    fn from(err: StoreError) -> Self {
        Self::Store(err.to_string())
    }
}

impl LimitsError {
    /// The stable kind.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::BadRequest(_) => ErrorKind::BadRequest,
            Self::NotFound(_) => ErrorKind::NotFound,
            Self::Limited { .. } | Self::TooMany(_) => ErrorKind::Limited,
            Self::Conflict(_) | Self::Refused(_) => ErrorKind::Conflict,
            Self::NotAllowed(_) => ErrorKind::NotAllowed,
            Self::Exhausted(_) => ErrorKind::BudgetExhausted,
            Self::Store(_) | Self::Unavailable(_) => ErrorKind::Unavailable,
        }
    }
}

impl From<LimitsError> for ErrorReply {
    fn from(err: LimitsError) -> Self {
        ErrorReply::new(err.kind(), err.to_string())
    }
}
