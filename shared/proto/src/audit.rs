//! The audit trail (docs/protocol.md §11): what every record in `AGENT_AUDIT` holds, the
//! refusal events services publish, and the `agent.audit.<op>` queries.
//!
//! A record is one thing that crossed the fabric — an inbox delivery or an event — with the
//! ids a thread is followed by, and the hash of the record before it: each record's body names
//! `prev_hash`, and the SHA-256 of the body is sent as the `Switchboard-Audit-Hash` header, so
//! changing, removing or inserting a record breaks the chain at that point.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::error::ErrorKind;
use crate::ids::GoalId;

/// Header carrying a record's SHA-256 (lowercase hex) of its body.
pub const HEADER_AUDIT_HASH: &str = "Switchboard-Audit-Hash";
/// Header of an export chunk (`chunk`, JSON lines); the final reply, without it, is the
/// summary ([`ExportDone`]) or an error reply.
pub const HEADER_EXPORT: &str = "Switchboard-Export";
/// The `prev_hash` of the first record of a chain.
pub const GENESIS_HASH: &str = "genesis";

/// An audit query, addressed `agent.audit.<op>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AuditOp {
    /// A conversation by any of its ids ([`ThreadRequest`]).
    Thread,
    /// Records by agent, goal, task, time and kind, paged ([`HistoryRequest`]).
    History,
    /// Requests that expect a reply and have none yet.
    Pending,
    /// A filter's records as JSON lines, in chunks ([`HistoryRequest`] without paging).
    Export,
    /// Walks the hash chain and reports the first break ([`VerifyReply`]).
    Verify,
    /// What each agent spent in a budget tree, or in each tree of one agent
    /// ([`crate::budget::CostQuery`] → [`crate::budget::CostReport`]).
    Cost,
}

impl AuditOp {
    /// Every op.
    pub const ALL: [AuditOp; 6] = [
        Self::Thread,
        Self::History,
        Self::Pending,
        Self::Export,
        Self::Verify,
        Self::Cost,
    ];

    /// The subject token (and micro endpoint name).
    pub fn token(self) -> &'static str {
        match self {
            Self::Thread => "thread",
            Self::History => "history",
            Self::Pending => "pending",
            Self::Export => "export",
            Self::Verify => "verify",
            Self::Cost => "cost",
        }
    }

    /// `agent.audit.<op>`.
    pub fn subject(self) -> String {
        format!("{}.{}", crate::subject::AUDIT_PREFIX, self.token())
    }
}

/// One record of the trail (the body of a message in `AGENT_AUDIT`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AuditRecord {
    /// The stable event id: `<source stream>:<source sequence>`. A record is written once per
    /// id, however often its source is delivered.
    pub id: String,
    /// When the source stream stored it.
    #[serde(with = "time::serde::rfc3339")]
    #[schemars(with = "crate::timestamp::Timestamp")]
    pub at: OffsetDateTime,
    /// What it is: an inbox message's kind (`message`, `request`, `response`, `notify`, `task`,
    /// `task_update`), or `registry.<event>`, `call.<event>`, `task.<op>` (`task.created` for
    /// a creation) or `refused.<service>`.
    pub kind: String,
    /// Subject the source message was stored under, e.g. `agent.inbox.<goal_id>`.
    pub subject: String,
    /// The message id (inbox deliveries).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<Uuid>,
    /// The correlation id (calls).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<Uuid>,
    /// The source's `in_reply_to`: the message this one answers (`thread` follows it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_reply_to: Option<Uuid>,
    /// The source's task: an inbox message's `task.id`, or the task event's task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<Uuid>,
    /// Parent of that task, for a subtask; `thread` follows it through the task tree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_task_id: Option<Uuid>,
    /// Sender or actor, not validated (`switchboard` for a task change the service made).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_agent: Option<String>,
    /// Sender goal (`from_goal_id`), or the goal of a registry goal event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_goal: Option<GoalId>,
    /// Receiver (or the other party).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_agent: Option<String>,
    /// Receiver goal: the goal whose inbox subject stored the message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_goal: Option<GoalId>,
    /// The inbox message's `expects_reply`; `pending` lists such records until answered.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub expects_reply: bool,
    /// The source message as it was (JSON; a body that was not JSON is kept as a string).
    pub payload: Value,
    /// The W3C trace id the source message carried in its `traceparent` header (32 lowercase
    /// hex digits): the conversation's trace in the operator's OpenTelemetry backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    /// The hash of the record before this one ([`GENESIS_HASH`] for the first).
    pub prev_hash: String,
}

/// The trace id of a W3C `traceparent` (`00-<trace id>-<span id>-<flags>`), when it is a
/// well-formed, non-zero one.
pub fn trace_id_of(traceparent: &str) -> Option<String> {
    let mut parts = traceparent.split('-');
    let (_version, id) = (parts.next()?, parts.next()?);
    let hex = id.len() == 32
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    (hex && id.bytes().any(|b| b != b'0')).then(|| id.to_owned())
}

/// A record with its place in `AGENT_AUDIT`, as queries return it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AuditEntry {
    /// Its sequence in `AGENT_AUDIT`.
    pub seq: u64,
    /// SHA-256 of the record's body, lowercase hex (its `Switchboard-Audit-Hash` header).
    pub hash: String,
    /// The record's own fields, flattened beside `seq` and `hash` on the wire.
    #[serde(flatten)]
    pub record: AuditRecord,
}

/// A request a service refused by a rule, published on
/// `agent.refusals.<service>.<agent_id>` (in `AGENT_EVENTS`) so the audit records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RefusalEvent {
    /// Event id (UUID v7); also the `Nats-Msg-Id` header.
    pub id: Uuid,
    /// Name of the refusing service, e.g. `inbox-fanout`; also the subject's `<service>` token.
    pub service: String,
    /// The caller, from the request subject (`_` when that was not a valid id).
    pub agent_id: String,
    /// Subject the refused request was sent to (its tail names the caller).
    pub subject: String,
    /// The error reply's `kind`; always a refusal (never `bad_request`, `not_found`, …).
    pub kind: ErrorKind,
    /// The error's human-readable `message` (for a send: its unreachable reasons, `; `-joined).
    pub message: String,
    /// When the service refused the request.
    #[serde(with = "time::serde::rfc3339")]
    #[schemars(with = "crate::timestamp::Timestamp")]
    pub at: OffsetDateTime,
}

/// `agent.audit.thread`: one of the ids of a conversation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ThreadRequest {
    /// Id of any message in the thread (an inbox message's `id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<Uuid>,
    /// Correlation id of any call in the thread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<Uuid>,
    /// Id of any task in the thread; its parent and subtasks join the thread too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<Uuid>,
    /// How many of the thread's records were read already: the previous page's
    /// `next_cursor` (a thread longer than one reply comes in pages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<u64>,
}

/// `agent.audit.history` and `agent.audit.export`: a filter (all given fields must match).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HistoryRequest {
    /// Records from or to this agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    /// Records from or to this goal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub goal_id: Option<GoalId>,
    /// Records of this task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<Uuid>,
    /// Stored at or after.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "time::serde::rfc3339::option"
    )]
    #[schemars(with = "Option<crate::timestamp::Timestamp>")]
    pub since: Option<OffsetDateTime>,
    /// Stored before.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "time::serde::rfc3339::option"
    )]
    #[schemars(with = "Option<crate::timestamp::Timestamp>")]
    pub until: Option<OffsetDateTime>,
    /// Only this kind; a trailing `.*` matches a family (`call.*`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Page size (default 100, at most 1000; history only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
    /// `next_cursor` of the previous page (history only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<u64>,
}

/// Default page size of `history`.
pub const HISTORY_LIMIT_DEFAULT: usize = 100;
/// Largest page size of `history`.
pub const HISTORY_LIMIT_MAX: usize = 1000;

/// The reply to `thread`, `history` and `pending`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AuditRecords {
    /// Records, oldest first.
    pub records: Vec<AuditEntry>,
    /// Pass as `cursor` for the next page (history; thread when it did not fit one reply).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<u64>,
    /// True when the records were cut to keep the reply under the NATS message size limit
    /// (thread, pending; a history page is cut the same way and says so by `next_cursor`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

/// The last message of an export.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ExportDone {
    /// Records exported.
    pub records: u64,
    /// Chunks sent before this message.
    pub chunks: u64,
}

/// Where the chain breaks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ChainBreak {
    /// The first record that does not fit.
    pub seq: u64,
    /// What is wrong, e.g. `the record has no hash header`.
    pub reason: String,
}

/// The reply to `verify`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct VerifyReply {
    /// True when every record is intact and linked to the one before.
    pub ok: bool,
    /// Records checked.
    pub records: u64,
    /// First sequence checked (earlier ones aged out).
    pub first_seq: u64,
    /// Last sequence checked.
    pub last_seq: u64,
    /// The first break, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_break: Option<ChainBreak>,
}

/// Lowercase hex of a digest (audit hashes are SHA-256 of the record body, in this form).
/// The audit writes one per record, so it is built without a `format!` per byte.
pub fn hash_hex(digest: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut hex = String::with_capacity(digest.len() * 2);
    for byte in digest {
        hex.push(char::from(DIGITS[usize::from(byte >> 4)]));
        hex.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    hex
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_gives_its_trace_id_and_nothing_else_does() {
        assert_eq!(
            trace_id_of("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").as_deref(),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        for bad in [
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-javascript:alert(1)-x-01",
            "",
        ] {
            assert_eq!(trace_id_of(bad), None, "{bad}");
        }
    }
}
