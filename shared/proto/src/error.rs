//! The error reply every service sends on bad input (docs/protocol.md §2):
//! `{"error":{"code":<int>,"kind":"<snake_case>","message":"…"}}`, plus the NATS micro headers
//! `Nats-Service-Error` (the message) and `Nats-Service-Error-Code` (the code).
//!
//! Callers match on `kind`, which is stable; `message` is for humans and may change.

use serde::{Deserialize, Serialize};

/// Stable error kinds. New kinds are added, never renamed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The body is not valid JSON, or has wrong types or unknown fields.
    BadRequest,
    /// An agent id (subject tail or body field) breaks the id rules.
    InvalidAgentId,
    /// A goal id is not a UUID, or a `from_goal_id` is not a live goal of the caller.
    InvalidGoalId,
    /// The body names another agent than the subject, or the parent call went to another agent.
    IdentityMismatch,
    /// The caller has not registered.
    NotRegistered,
    /// The thing asked about does not exist.
    NotFound,
    /// The request conflicts with existing state (e.g. a goal owned by another agent).
    Conflict,
    /// NATS/JetStream could not serve the request now; retry.
    Unavailable,
    /// A bug on our side; details are in the service log.
    Internal,
    /// send gate 1: `to` is missing or blank.
    MissingTo,
    /// send gate 2: an agent sent to itself.
    SelfSend,
    /// send gate 3: `message` is missing or blank.
    EmptyMessage,
    /// send gate 4: the body is over 64 KiB (the message names the limit).
    BodyTooLarge,
    /// A broadcast would reach more peers than the cap; nothing was sent.
    BroadcastTooLarge,
    /// The callee could not be reached (the reasons are in the message); no call was opened.
    Unreachable,
    /// A waiting call's deadline passed without an answer.
    Timeout,
    /// The call would close a cycle (the message names the chain).
    Cycle,
    /// A call chain (default 5 agents) or subtask nesting (default 3 deep) would pass its limit.
    DepthExceeded,
    /// The caller already has the most open outgoing calls allowed.
    TooManyCalls,
    /// The call's deadline passed; a late answer is not delivered.
    Expired,
    /// Only the callee may answer a call.
    NotCallee,
    /// The task has ended (completed, failed, rejected, canceled) and cannot change.
    TaskTerminal,
    /// The task operation does not apply in the task's current state.
    IllegalTransition,
    /// The caller's role (requester/assignee) may not perform this operation.
    NotAllowed,
    /// The assignee's `allow_from` does not admit the requester (task create/accept).
    AclDenied,
    /// The assignee already has `max_concurrent_tasks` tasks accepted, working or waiting.
    AtCapacity,
    /// The parent task has the most open subtasks (default 8) or spawned the most (default 256).
    TooManyChildren,
    /// The body names a sender (`from_agent_id`) other than the subject's identity.
    SenderMismatch,
    /// The request's reply subject is not a reply inbox (`_INBOX.…`, `_R_.…`): a service never
    /// writes where a caller points it, so the request is refused unanswered and not run.
    BadReplySubject,
    /// The caller already has the most live goals allowed (`max_goals_per_agent`).
    TooManyGoals,
    /// The caller sent more requests than its budget allows; retry after a pause. Refused
    /// before any storage work.
    RateLimited,
    /// The receiving goal is full and its owner chose `overflow: refuse` (nothing was stored:
    /// back off and retry), or a waiting call's request was removed from a full inbox unread.
    InboxFull,
    /// The person is not who the item waits for (another person's, or escalated away).
    NotAddressee,
    /// Someone answered the item first (the losing side of a role race): the message names
    /// who and when.
    AlreadyAnswered,
    /// The approval is not decided yet.
    ApprovalPending,
    /// The approval was denied.
    ApprovalDenied,
    /// The approval was used already (each is good for one use).
    ApprovalUsed,
    /// The action differs from the one approved (its hash does not match).
    ActionMismatch,
    /// A provider limit: no lease within `wait_ms`, or too many acquires wait on the key.
    Limited,
    /// The budget the work draws on has nothing left to grant (docs/protocol.md §16).
    BudgetExhausted,
    /// A file is larger than the files service takes (`max_file_bytes`, docs/protocol.md §17).
    FileTooLarge,
    /// An upload would take the agent past its storage quota; nothing was stored.
    QuotaExceeded,
    /// A file's bytes do not hash to its declared SHA-256; the upload was removed.
    DigestMismatch,
    /// A kind this client version does not know yet.
    #[serde(other)]
    Unknown,
}

impl ErrorKind {
    /// The numeric code sent in `Nats-Service-Error-Code` (HTTP-like).
    pub fn code(self) -> u16 {
        match self {
            Self::BadRequest
            | Self::InvalidAgentId
            | Self::InvalidGoalId
            | Self::MissingTo
            | Self::SelfSend
            | Self::EmptyMessage
            | Self::BroadcastTooLarge => 400,
            Self::BodyTooLarge => 413,
            Self::Cycle | Self::DepthExceeded => 409,
            Self::Unreachable => 404,
            Self::NotCallee | Self::NotAllowed | Self::AclDenied => 403,
            Self::AtCapacity | Self::TooManyChildren => 429,
            Self::TaskTerminal | Self::IllegalTransition => 409,
            Self::Expired => 410,
            Self::TooManyCalls | Self::TooManyGoals | Self::RateLimited | Self::InboxFull => 429,
            Self::Timeout => 504,
            Self::IdentityMismatch | Self::SenderMismatch | Self::BadReplySubject => 403,
            Self::NotRegistered | Self::NotFound => 404,
            Self::Conflict => 409,
            Self::Unavailable => 503,
            Self::Internal | Self::Unknown => 500,
            Self::NotAddressee | Self::ApprovalDenied => 403,
            Self::AlreadyAnswered
            | Self::ApprovalPending
            | Self::ApprovalUsed
            | Self::ActionMismatch => 409,
            Self::Limited => 429,
            Self::BudgetExhausted => 402,
            Self::FileTooLarge | Self::QuotaExceeded => 413,
            Self::DigestMismatch => 422,
        }
    }

    /// Whether the error is a rule refusing a well-formed request (gates, ACL, limits, ids,
    /// identity, state machine) rather than a malformed body or a failure on our side:
    /// refusals are published for the audit trail.
    pub fn is_refusal(self) -> bool {
        !matches!(
            self,
            Self::BadRequest
                | Self::NotFound
                | Self::Conflict
                | Self::Unavailable
                | Self::Internal
                | Self::Timeout
                | Self::Unknown
        )
    }

    /// The snake_case name, as on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BadRequest => "bad_request",
            Self::InvalidAgentId => "invalid_agent_id",
            Self::InvalidGoalId => "invalid_goal_id",
            Self::IdentityMismatch => "identity_mismatch",
            Self::NotRegistered => "not_registered",
            Self::NotFound => "not_found",
            Self::Conflict => "conflict",
            Self::Unavailable => "unavailable",
            Self::Internal => "internal",
            Self::MissingTo => "missing_to",
            Self::SelfSend => "self_send",
            Self::EmptyMessage => "empty_message",
            Self::BodyTooLarge => "body_too_large",
            Self::BroadcastTooLarge => "broadcast_too_large",
            Self::Unreachable => "unreachable",
            Self::Timeout => "timeout",
            Self::Cycle => "cycle",
            Self::DepthExceeded => "depth_exceeded",
            Self::TooManyCalls => "too_many_calls",
            Self::Expired => "expired",
            Self::NotCallee => "not_callee",
            Self::TaskTerminal => "task_terminal",
            Self::IllegalTransition => "illegal_transition",
            Self::NotAllowed => "not_allowed",
            Self::AclDenied => "acl_denied",
            Self::SenderMismatch => "sender_mismatch",
            Self::BadReplySubject => "bad_reply_subject",
            Self::TooManyGoals => "too_many_goals",
            Self::RateLimited => "rate_limited",
            Self::InboxFull => "inbox_full",
            Self::AtCapacity => "at_capacity",
            Self::TooManyChildren => "too_many_children",
            Self::NotAddressee => "not_addressee",
            Self::AlreadyAnswered => "already_answered",
            Self::ApprovalPending => "approval_pending",
            Self::ApprovalDenied => "approval_denied",
            Self::ApprovalUsed => "approval_used",
            Self::ActionMismatch => "action_mismatch",
            Self::Limited => "limited",
            Self::BudgetExhausted => "budget_exhausted",
            Self::FileTooLarge => "file_too_large",
            Self::QuotaExceeded => "quota_exceeded",
            Self::DigestMismatch => "digest_mismatch",
            Self::Unknown => "unknown",
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The inner object of an error reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ErrorBody {
    /// HTTP-like code, equal to `Nats-Service-Error-Code`.
    pub code: u16,
    /// Stable kind to match on.
    pub kind: ErrorKind,
    /// Human-readable detail, also sent as `Nats-Service-Error`; it may change, so never match it.
    pub message: String,
}

/// An error reply: `{"error": {...}}`.
#[derive(
    Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error, schemars::JsonSchema,
)]
#[error("{} ({}): {}", error.kind, error.code, error.message)]
pub struct ErrorReply {
    /// The `error` object; a success reply never has this top-level field.
    pub error: ErrorBody,
}

impl ErrorReply {
    /// An error of `kind` with a message; the code follows from the kind.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            error: ErrorBody {
                code: kind.code(),
                kind,
                message: message.into(),
            },
        }
    }

    /// The stable kind to match on (`error.kind`).
    pub fn kind(&self) -> ErrorKind {
        self.error.kind
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn error_reply_matches_the_contract() {
        let reply = ErrorReply::new(ErrorKind::InvalidAgentId, "agent_id `a.b` is invalid");
        let literal = json!({"error": {"code": 400, "kind": "invalid_agent_id",
            "message": "agent_id `a.b` is invalid"}});
        assert_eq!(serde_json::to_value(&reply).unwrap(), literal);
        assert_eq!(
            serde_json::from_value::<ErrorReply>(literal).unwrap(),
            reply
        );
    }

    #[test]
    fn unknown_kinds_still_parse() {
        let reply: ErrorReply = serde_json::from_value(
            json!({"error": {"code": 429, "kind": "a_kind_from_the_future", "message": "x"}}),
        )
        .unwrap();
        assert_eq!(reply.kind(), ErrorKind::Unknown);
    }

    #[test]
    fn as_str_matches_serde() {
        for kind in [
            ErrorKind::BadRequest,
            ErrorKind::InvalidAgentId,
            ErrorKind::InvalidGoalId,
            ErrorKind::IdentityMismatch,
            ErrorKind::NotRegistered,
            ErrorKind::NotFound,
            ErrorKind::Conflict,
            ErrorKind::Unavailable,
            ErrorKind::Internal,
            ErrorKind::MissingTo,
            ErrorKind::SelfSend,
            ErrorKind::EmptyMessage,
            ErrorKind::BodyTooLarge,
            ErrorKind::BroadcastTooLarge,
            ErrorKind::Unreachable,
            ErrorKind::Timeout,
            ErrorKind::Cycle,
            ErrorKind::DepthExceeded,
            ErrorKind::TooManyCalls,
            ErrorKind::Expired,
            ErrorKind::NotCallee,
            ErrorKind::TaskTerminal,
            ErrorKind::IllegalTransition,
            ErrorKind::NotAllowed,
            ErrorKind::AclDenied,
            ErrorKind::AtCapacity,
            ErrorKind::TooManyChildren,
            ErrorKind::SenderMismatch,
            ErrorKind::BadReplySubject,
            ErrorKind::InboxFull,
            ErrorKind::Limited,
            ErrorKind::BudgetExhausted,
            ErrorKind::FileTooLarge,
            ErrorKind::QuotaExceeded,
            ErrorKind::DigestMismatch,
        ] {
            assert_eq!(serde_json::to_value(kind).unwrap(), json!(kind.as_str()));
        }
    }
}
