//! Files errors and the one place they become the wire's `{code, kind}` (docs/protocol.md §2
//! and §17).

use switchboard_proto::{ErrorKind, ErrorReply};
use switchboard_runtime::store::StoreError;

/// Why a files request failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum FilesError {
    /// A malformed field, header or chunk.
    #[error("{0}")]
    BadRequest(String),
    /// No such file, or none the caller may read (the two are not told apart).
    #[error("no file `{0}` you may read")]
    NotFound(uuid::Uuid),
    /// Only the uploader may do this.
    #[error("{0}")]
    NotAllowed(String),
    /// An upload id already names another upload.
    #[error("{0}")]
    Conflict(String),
    /// A chunk out of order: the upload expects another offset.
    #[error("the upload expects the chunk at offset {expected}; this one is at {got}")]
    OutOfOrder {
        /// The offset the upload goes on from.
        expected: u64,
        /// The chunk's.
        got: u64,
    },
    /// The file is larger than the service takes.
    #[error("the file is {size} bytes; the largest taken is {max}")]
    TooLarge {
        /// Declared size.
        size: u64,
        /// `max_file_bytes`.
        max: u64,
    },
    /// The upload would take the agent past its storage quota.
    #[error(
        "the upload needs {size} bytes and you keep {used} of your {quota}; delete files or wait for them to expire"
    )]
    QuotaExceeded {
        /// Declared size.
        size: u64,
        /// Bytes the agent keeps.
        used: u64,
        /// `quota_bytes`.
        quota: u64,
    },
    /// The bytes stored do not hash to the declared digest (the upload is removed).
    #[error(
        "the file's bytes hash to {actual}, not the declared {declared}; the upload was removed"
    )]
    DigestMismatch {
        /// Declared.
        declared: String,
        /// Computed.
        actual: String,
    },
    /// The store failed.
    #[error("{0}")]
    Store(String),
}

impl From<StoreError> for FilesError {
    fn from(err: StoreError) -> Self {
        Self::Store(err.to_string())
    }
}

impl FilesError {
    /// The stable kind.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::BadRequest(_) => ErrorKind::BadRequest,
            Self::NotFound(_) => ErrorKind::NotFound,
            Self::NotAllowed(_) => ErrorKind::NotAllowed,
            Self::OutOfOrder { .. } | Self::Conflict(_) => ErrorKind::Conflict,
            Self::TooLarge { .. } => ErrorKind::FileTooLarge,
            Self::QuotaExceeded { .. } => ErrorKind::QuotaExceeded,
            Self::DigestMismatch { .. } => ErrorKind::DigestMismatch,
            Self::Store(_) => ErrorKind::Unavailable,
        }
    }

    /// A store failure in `step`.
    pub(crate) fn store(step: &str, err: impl std::fmt::Display) -> Self {
        Self::Store(format!("{step}: {err}"))
    }
}

impl From<FilesError> for ErrorReply {
    fn from(err: FilesError) -> Self {
        ErrorReply::new(err.kind(), err.to_string())
    }
}
