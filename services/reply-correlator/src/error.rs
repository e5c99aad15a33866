//! Correlator errors, named after the step that failed. Rule violations (cycle, depth, gates)
//! come as ready-made error replies from `switchboard_proto`.

use switchboard_proto::{ErrorKind, ErrorReply};

/// Why a correlator request failed.
#[derive(Debug, thiserror::Error)]
pub enum CorrelatorError {
    /// A KV or JetStream call failed.
    #[error("{step}: {message}")]
    Store {
        /// What we were doing.
        step: &'static str,
        /// The underlying error.
        message: String,
    },
    /// A stored call record does not decode.
    #[error("corrupt call record `{0}`")]
    Corrupt(String),
}

impl CorrelatorError {
    /// Wraps a store error with the step that failed.
    pub fn store(step: &'static str, err: impl std::fmt::Display) -> Self {
        Self::Store {
            step,
            message: err.to_string(),
        }
    }
}

impl From<CorrelatorError> for ErrorReply {
    fn from(err: CorrelatorError) -> Self {
        let kind = match err {
            CorrelatorError::Store { .. } => ErrorKind::Unavailable,
            CorrelatorError::Corrupt(_) => ErrorKind::Internal,
        };
        ErrorReply::new(kind, err.to_string())
    }
}
