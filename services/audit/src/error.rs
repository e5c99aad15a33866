//! Audit errors, named after the step that failed, and the one place they map to the stable
//! `{code, kind}` callers match on. Reading or writing the trail (`AGENT_AUDIT`, the source
//! streams, the writer lease) fails as `unavailable` (retry); a query the index or the encoder
//! cannot answer as `internal`; a request the queries refuse as `bad_request`.

use switchboard_proto::audit::HISTORY_LIMIT_MAX;
use switchboard_proto::{ErrorKind, ErrorReply};

use crate::index::IndexError;

/// Why an audit query, or the trail's reading and writing, failed.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// A `thread` request names no message, call or task.
    #[error("give one of `message_id`, `correlation_id` or `task_id`")]
    ThreadWithoutId,
    /// A `history` request's `limit` is 0 or above [`HISTORY_LIMIT_MAX`].
    #[error("`limit` must be 1 to {HISTORY_LIMIT_MAX}")]
    HistoryLimit,
    /// A `cost` request names neither or both of `root` and `agent_id` (or an empty one).
    #[error("give one of `root` (a budget tree) or `agent_id`")]
    CostWithoutOne,
    /// An `export` request pages (`limit` or `cursor`): it sends every record.
    #[error("export takes a filter without `limit` or `cursor`: it sends every record")]
    ExportPaged,
    /// An `export` request has no reply subject to send its chunks to.
    #[error("export needs a reply subject")]
    ExportWithoutReply,
    /// A query's index call failed.
    #[error(transparent)]
    QueryIndex(IndexError),
    /// The blocking thread running a query's index call failed (panicked or was cancelled).
    #[error(transparent)]
    IndexThread(tokio::task::JoinError),
    /// An exported record did not encode as a JSON line.
    #[error(transparent)]
    EncodeExportLine(serde_json::Error),
    /// The export summary did not encode.
    #[error(transparent)]
    EncodeExportSummary(serde_json::Error),
    /// An export chunk could not be published to the reply subject.
    #[error(transparent)]
    SendExportChunk(async_nats::PublishError),
    /// Reading a stream's info (its first and last sequence) failed.
    #[error("audit trail: reading the stream info: {0}")]
    ReadStreamInfo(#[source] async_nats::Error),
    /// Reading `AGENT_AUDIT` back (its consumer or a message) failed.
    #[error("audit trail: reading the trail: {0}")]
    ReadTrail(#[source] async_nats::Error),
    /// Reading a range of `AGENT_AUDIT` took longer than allowed.
    #[error("audit trail: reading the trail timed out")]
    ReadTrailTimedOut,
    /// The index failed while the trail was read into it: reading its head, inserting the
    /// records read, or pruning rows the stream has aged out.
    #[error("audit trail: {0}")]
    CatchUpIndex(IndexError),
    /// Opening the writer lease bucket failed.
    #[error("audit trail: opening the writer lease: {0}")]
    OpenLease(#[source] async_nats::Error),
    /// Opening a source stream (`AGENT_INBOX`, `AGENT_EVENTS`) failed.
    #[error("audit trail: opening a source stream: {0}")]
    OpenSourceStream(#[source] async_nats::Error),
    /// Opening (or creating) a durable source consumer failed.
    #[error("audit trail: opening the audit consumer: {0}")]
    OpenSourceConsumer(#[source] async_nats::Error),
}

impl AuditError {
    /// The stable kind callers match on.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::ThreadWithoutId
            | Self::HistoryLimit
            | Self::CostWithoutOne
            | Self::ExportPaged
            | Self::ExportWithoutReply => ErrorKind::BadRequest,
            Self::QueryIndex(_)
            | Self::IndexThread(_)
            | Self::EncodeExportLine(_)
            | Self::EncodeExportSummary(_) => ErrorKind::Internal,
            Self::SendExportChunk(_)
            | Self::ReadStreamInfo(_)
            | Self::ReadTrail(_)
            | Self::ReadTrailTimedOut
            | Self::CatchUpIndex(_)
            | Self::OpenLease(_)
            | Self::OpenSourceStream(_)
            | Self::OpenSourceConsumer(_) => ErrorKind::Unavailable,
        }
    }
}

impl From<AuditError> for ErrorReply {
    fn from(err: AuditError) -> Self {
        ErrorReply::new(err.kind(), err.to_string())
    }
}
