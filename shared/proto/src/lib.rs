//! The Switchboard wire contract, as pure data.
//!
//! Everything two parties of the fabric must agree on lives here and nowhere else: identifiers
//! and their validation ([`ids`]), every subject, stream, bucket and header name ([`subject`],
//! [`names`]), the messages agents exchange ([`message`]), agent cards and registry payloads
//! ([`registry`]), the error reply shape ([`error`]) and the pure access-control rules ([`acl`]).
//!
//! The crate depends on serde and nothing async, so any client (including non-Rust ones reading
//! `docs/protocol.md`) can follow the same contract.
//!
//! Layout:
//! - [`ids`]: `AgentId`, `GoalId`, fresh UUID v7 ids.
//! - [`names`]: constants: limits, stream/bucket/header names.
//! - [`subject`]: subject builders and the caller-identity parser.
//! - [`message`]: `InboxMessage` (the six seed fields plus optional extensions).
//! - [`inbox`]: reading a goal's inbox: fetch/ack requests and replies, the cursor record.
//! - [`registry`]: `AgentCard`, runtime state, goal records, directory requests and replies.
//! - [`acl`]: who may talk to whom (globs, deny beats allow).
//! - [`send`]: send_to_peer request/report and the pure gate and anti-loop rules.
//! - [`call`]: correlated calls, the pending-call record, chain/cycle/depth rules.
//! - [`task`]: the task state machine (who may do what, legal transitions).
//! - [`receipt`]: delivered/read receipts, their KV record and the status request.
//! - [`people`]: persons and roles as parties, notes, asks, and the person-side operations.
//! - [`files`]: files by reference: attachments, uploads in chunks, reads, grants.
//! - [`limits`]: provider limits the fleet shares: leases, their specs, the operator's ops.
//! - [`approval`]: approvals bound to an exact action (RFC 8785 hash, strict parse, single use).
//! - [`audit`]: audit records, refusal events and the audit queries.
//! - [`error`]: `ErrorKind` and the `{"error":{code,kind,message}}` reply.

pub mod acl;
pub mod approval;
pub mod audit;
pub mod budget;
pub mod call;
pub mod endpoint;
pub mod error;
pub mod files;
pub mod ids;
pub mod inbox;
pub mod limits;
pub mod message;
pub mod names;
pub mod people;
pub mod receipt;
pub mod registry;
pub mod send;
pub mod subject;
pub mod task;

pub use error::{ErrorBody, ErrorKind, ErrorReply};
pub use ids::{AgentId, GoalId, IdError, new_id};
pub use message::{Callback, InboxMessage, MessageKind, Part, TaskRef, TaskState};
pub use names::*;
pub mod schema;
pub use registry::{AgentCard, AgentRecord, AgentStatus, GoalKind, GoalRecord, Skill};

/// Serde helpers for timestamps: RFC 3339 in UTC, e.g. `2026-04-30T14:00:00Z`.
pub mod timestamp {
    pub use time::OffsetDateTime;
    /// `#[serde(with = "switchboard_proto::timestamp::rfc3339")]` for required timestamps.
    pub use time::serde::rfc3339;

    /// A timestamp on the wire: RFC 3339 in UTC (`2026-04-30T14:00:00.25Z`). The schema of every
    /// `OffsetDateTime` field.
    pub struct Timestamp;

    impl schemars::JsonSchema for Timestamp {
        fn schema_name() -> std::borrow::Cow<'static, str> {
            "Timestamp".into()
        }

        fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
            schemars::json_schema!({
                "type": "string",
                "format": "date-time",
                "description": "RFC 3339 in UTC, e.g. 2026-04-30T14:00:00.25Z",
            })
        }
    }

    /// The current time in UTC.
    pub fn now() -> OffsetDateTime {
        OffsetDateTime::now_utc()
    }

    /// `at` plus `ms` milliseconds, or `None` when that is past what a timestamp can hold: a
    /// client-given duration (`deadline_in_ms`, `timeout_ms`) never overflows into a panic.
    pub fn checked_after(at: OffsetDateTime, ms: u64) -> Option<OffsetDateTime> {
        let ms = i64::try_from(ms).ok()?;
        at.checked_add(time::Duration::milliseconds(ms))
    }

    /// Formats a timestamp as RFC 3339 (the wire form).
    pub fn format(at: OffsetDateTime) -> String {
        at.format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_else(|_| at.to_string())
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn durations_from_clients_never_overflow() {
            let now = super::now();
            assert!(super::checked_after(now, u64::MAX).is_none());
            assert!(super::checked_after(now, i64::MAX.unsigned_abs()).is_none());
            assert!(super::checked_after(now, 1_000).is_some_and(|at| at > now));
        }
    }
}
