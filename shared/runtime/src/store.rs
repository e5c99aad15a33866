//! The error of a service's JetStream-backed store, shared so every service maps store
//! failures to the same error kinds.

use switchboard_proto::{ErrorKind, ErrorReply};

/// Why a read or write of a service's state failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A KV or JetStream call failed (answered as `unavailable`: retry).
    #[error("{step}: {source}")]
    Unavailable {
        /// What we were doing.
        step: &'static str,
        /// The NATS/JetStream error (or what went wrong, in words); the caller reads it in the
        /// `unavailable` message, a log keeps the chain.
        #[source]
        source: async_nats::Error,
    },
    /// A stored record does not decode (answered as `internal`).
    #[error("corrupt record `{0}`")]
    Corrupt(String),
}

impl StoreError {
    /// Wraps a store error (or a description of what went wrong) with the step that failed.
    pub fn store(step: &'static str, err: impl Into<async_nats::Error>) -> Self {
        Self::Unavailable {
            step,
            source: err.into(),
        }
    }
}

impl StoreError {
    /// The stable kind every service answers a store failure with: `unavailable` when the
    /// store could not be reached (worth a retry), `internal` for a record that cannot be read.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Unavailable { .. } => ErrorKind::Unavailable,
            Self::Corrupt(_) => ErrorKind::Internal,
        }
    }
}

impl From<StoreError> for ErrorReply {
    fn from(err: StoreError) -> Self {
        ErrorReply::new(err.kind(), err.to_string())
    }
}

/// Jittered backoff between compare-and-set attempts, so writers racing on one key spread out
/// instead of colliding in lockstep (the ceiling doubles from 0.5 ms up to 16 ms).
pub async fn cas_backoff(attempt: u32) {
    let ceiling_us = 500u64 << attempt.min(5);
    // The low bits of a v7 id are random.
    let jitter = u64::try_from(switchboard_proto::new_id().as_u128() % 1_000).unwrap_or(500);
    tokio::time::sleep(std::time::Duration::from_micros(
        ceiling_us * jitter / 1_000,
    ))
    .await;
}
