//! Correlated calls (ARCHITECTURE.md §3, §5, §6): requests and replies of `agent.call.<id>`,
//! `agent.reply.<id>`, `agent.calls.pending.<id>`, the pending-call record kept in the
//! `agent_calls` bucket, and the pure rules (timeout clamp, chain, cycle, depth).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::error::{ErrorKind, ErrorReply};
use crate::ids::{AgentId, GoalId};
use crate::message::Part;

/// Body of `agent.call.<agent_id>` (talk_to_agent / call_agent).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CallRequest {
    /// Who must answer: the callee's agent id, trimmed (`*` is refused: a call has one peer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// The question; becomes the request message's `body` (send gates 3 and 4 apply).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The caller's goal: where a parked answer (or a timeout notice) lands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_goal_id: Option<GoalId>,
    /// Deadline from now, in milliseconds (default 30 s, clamped to 300 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Wait for the answer (default) or park and get it in the inbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<bool>,
    /// The call being served while this one is made (the chain is derived from it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_correlation_id: Option<Uuid>,
    /// Structured content for the callee.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<Part>,
    /// Free-form metadata for the callee.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub metadata: Map<String, Value>,
    /// The message that prompted this call (the request's `in_reply_to`), so the audit trail
    /// links it into that conversation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_reply_to: Option<Uuid>,
    /// The caller, if the body names one: it must be the subject's identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_agent_id: Option<String>,
    /// Receipts for the request message, back in `from_goal_id` (required with it):
    /// `delivered`, or `read` (see [`crate::receipt`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt: Option<crate::receipt::ReceiptLevel>,
}

/// Reply to a parked call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallParked {
    /// Correlates the answer that will land in the caller goal's inbox.
    pub correlation_id: Uuid,
    /// The callee's goals that got the request.
    pub delivered_to: Vec<GoalId>,
    /// When the call times out.
    #[serde(with = "time::serde::rfc3339")]
    pub deadline: OffsetDateTime,
    /// True when the deadline was cut to the parent call's (a call made while serving one
    /// never outlives it); omitted when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub clamped: bool,
}

/// Reply to a waiting call: the callee's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallAnswer {
    /// Id of the call this answers, as `call` opened it and the callee's `reply` named it.
    pub correlation_id: Uuid,
    /// Who answered.
    pub from_agent_id: AgentId,
    /// The callee's answer text, exactly as its `reply` sent it.
    pub body: String,
    /// Structured content of the answer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<Part>,
    /// When it was answered.
    #[serde(with = "time::serde::rfc3339")]
    pub answered_at: OffsetDateTime,
    /// True when the call's deadline had been cut to its parent call's; omitted when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub clamped: bool,
}

/// Body of `agent.reply.<agent_id>` (reply_to_peer): no target, only the correlation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplyRequest {
    /// The call being answered, from the request message's `correlation_id`; required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<Uuid>,
    /// The answer text; the caller gets it as `body` (send gates 3 and 4 apply).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Structured content of the answer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<Part>,
}

/// Where an answer went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AnswerRoute {
    /// Straight to the caller waiting on its call request.
    Caller,
    /// Into the caller goal's inbox as `kind: response`.
    Inbox,
}

/// Reply to `reply`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplyAck {
    /// The call the reply named, echoed back.
    pub correlation_id: Uuid,
    /// Where the answer went (the first time; a retried reply reports the same).
    pub delivered: AnswerRoute,
    /// True when this reply was a retry of one already delivered (nothing sent again).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub duplicate: bool,
}

/// Lifecycle of a pending call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallState {
    /// Waiting for the answer.
    Open,
    /// Answered (exactly once).
    Answered,
    /// The deadline passed first.
    Expired,
}

/// A call as recorded in the `agent_calls` bucket under `call.<correlation_id>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingCall {
    /// The call's id: the record's key is `call.<correlation_id>`.
    pub correlation_id: Uuid,
    /// Who asked.
    pub caller: AgentId,
    /// The caller's goal (parked answers and timeout notices land there).
    pub caller_goal: GoalId,
    /// Who must answer.
    pub callee: AgentId,
    /// Agents from the root caller down to this caller.
    pub chain: Vec<AgentId>,
    /// The call this one was made while serving.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<Uuid>,
    /// The request message's id (the answer's `in_reply_to`).
    pub request_id: Uuid,
    /// Waiting (true) or parked.
    pub wait: bool,
    /// Open until answered or expired; every change is a compare-and-set, never back to open.
    pub state: CallState,
    /// Where the answer went, once delivered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answered_via: Option<AnswerRoute>,
    /// When a reply claimed the call (its delivery may still be under way).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "time::serde::rfc3339::option"
    )]
    pub claimed_at: Option<OffsetDateTime>,
    /// When the call was opened; listings sort by it, oldest first.
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// When the call expires: `created_at` plus the clamped `timeout_ms`.
    #[serde(with = "time::serde::rfc3339")]
    pub deadline: OffsetDateTime,
}

impl PendingCall {
    /// Depth of the call: how many agents are before the callee.
    pub fn depth(&self) -> usize {
        self.chain.len()
    }
}

/// Key of a call's record in `agent_calls` (kept after the call ends, until the bucket's
/// max age, so retried and late replies get the right answer).
pub fn call_key(correlation_id: &Uuid) -> String {
    format!("call.{correlation_id}")
}

/// Index key of an open call among its caller's outgoing calls (deleted when it ends).
pub fn outgoing_key(caller: &AgentId, correlation_id: &Uuid) -> String {
    format!("out.{caller}.{correlation_id}")
}

/// Index key of an open call among its callee's incoming calls (deleted when it ends).
pub fn incoming_key(callee: &AgentId, correlation_id: &Uuid) -> String {
    format!("in.{callee}.{correlation_id}")
}

/// Reply to `agent.calls.pending.<agent_id>`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PendingCalls {
    /// Open calls this agent made.
    pub outgoing: Vec<PendingCall>,
    /// Open calls this agent must answer.
    pub incoming: Vec<PendingCall>,
}

/// What happened to a call, published as `agent.calls.events.<event>.<correlation_id>` into
/// `AGENT_EVENTS` (the audit trail's input).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallEventKind {
    /// The request was delivered; the call is open.
    Opened,
    /// The answer was delivered (once).
    Answered,
    /// The deadline passed first.
    Expired,
    /// An answer arrived after the deadline and was not delivered (its text is kept here).
    LateAnswer,
    /// A call was refused by a rule (cycle, depth, cap, unreachable callee); the reason is
    /// the event's body.
    Refused,
}

impl CallEventKind {
    /// The `<event>` token of `agent.calls.events.<event>.<correlation_id>`.
    pub fn token(self) -> &'static str {
        match self {
            Self::Opened => "opened",
            Self::Answered => "answered",
            Self::Expired => "expired",
            Self::LateAnswer => "late_answer",
            Self::Refused => "refused",
        }
    }
}

/// Payload of a call event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallEvent {
    /// Event id (also its `Nats-Msg-Id`).
    pub id: Uuid,
    /// What happened.
    pub event: CallEventKind,
    /// The call the event is about; also the subject's last token.
    pub correlation_id: Uuid,
    /// Who asked.
    pub caller: AgentId,
    /// Who was asked.
    pub callee: AgentId,
    /// The call's chain: root caller first, its caller last (the callee is not in it).
    pub chain: Vec<AgentId>,
    /// When the correlator built the event, right after the change it reports.
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
    /// The answer's text (answered, late_answer), or the refusal's reason (refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
}

/// Clamps a requested timeout: default when absent, at most `max_ms`, at least 1 ms.
pub fn clamp_timeout(requested_ms: Option<u64>, default_ms: u64, max_ms: u64) -> u64 {
    requested_ms.unwrap_or(default_ms).min(max_ms).max(1)
}

/// Derives a new call's chain from the call being served (if any) and checks the cycle and
/// depth rules: the callee must not be in the chain (nor be the caller), and the depth
/// (agents before the callee) must stay below `depth_limit`.
pub fn derive_chain(
    caller: &AgentId,
    callee: &AgentId,
    parent: Option<&PendingCall>,
    depth_limit: usize,
) -> Result<Vec<AgentId>, ErrorReply> {
    let mut chain = match parent {
        Some(parent) => {
            if parent.callee != *caller {
                return Err(ErrorReply::new(
                    ErrorKind::IdentityMismatch,
                    format!(
                        "parent call {} was made to `{}`, not to `{caller}`",
                        parent.correlation_id, parent.callee
                    ),
                ));
            }
            let mut chain = parent.chain.clone();
            chain.push(caller.clone());
            chain
        }
        None => vec![caller.clone()],
    };
    if chain.contains(callee) {
        chain.push(callee.clone());
        let path: Vec<&str> = chain.iter().map(AgentId::as_str).collect();
        return Err(ErrorReply::new(
            ErrorKind::Cycle,
            format!(
                "calling `{callee}` would close a cycle: {}",
                path.join(" → ")
            ),
        ));
    }
    if chain.len() >= depth_limit {
        let path: Vec<&str> = chain.iter().map(AgentId::as_str).collect();
        return Err(ErrorReply::new(
            ErrorKind::DepthExceeded,
            format!(
                "call depth {} reaches the limit of {depth_limit}: {} → {callee}",
                chain.len(),
                path.join(" → ")
            ),
        ));
    }
    Ok(chain)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(raw: &str) -> AgentId {
        AgentId::parse(raw).unwrap()
    }

    fn parent(chain: &[&str], callee: &str) -> PendingCall {
        PendingCall {
            correlation_id: Uuid::now_v7(),
            caller: id(chain.last().unwrap()),
            caller_goal: GoalId::new(),
            callee: id(callee),
            chain: chain.iter().map(|a| id(a)).collect(),
            parent: None,
            request_id: Uuid::now_v7(),
            wait: true,
            state: CallState::Open,
            answered_via: None,
            claimed_at: None,
            created_at: OffsetDateTime::UNIX_EPOCH,
            deadline: OffsetDateTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn timeouts_default_and_clamp() {
        assert_eq!(clamp_timeout(None, 30_000, 300_000), 30_000);
        assert_eq!(clamp_timeout(Some(5), 30_000, 300_000), 5);
        assert_eq!(clamp_timeout(Some(900_000), 30_000, 300_000), 300_000);
        assert_eq!(clamp_timeout(Some(0), 30_000, 300_000), 1);
        assert_eq!(
            clamp_timeout(None, 30_000, 0),
            1,
            "never panics on a bad max"
        );
    }

    #[test]
    fn chains_grow_from_the_parent() {
        assert_eq!(
            derive_chain(&id("a"), &id("b"), None, 5).unwrap(),
            vec![id("a")]
        );
        let p = parent(&["a"], "b");
        assert_eq!(
            derive_chain(&id("b"), &id("c"), Some(&p), 5).unwrap(),
            vec![id("a"), id("b")]
        );
    }

    #[test]
    fn a_b_a_is_a_cycle_naming_the_chain() {
        let p = parent(&["a"], "b");
        let err = derive_chain(&id("b"), &id("a"), Some(&p), 5).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Cycle);
        assert!(
            err.error.message.contains("a → b → a"),
            "{}",
            err.error.message
        );
    }

    #[test]
    fn the_fifth_hop_is_refused() {
        // a→b→c→d→e is fine (depth 4); e→f would be depth 5.
        let p = parent(&["a", "b", "c", "d"], "e");
        let err = derive_chain(&id("e"), &id("f"), Some(&p), 5).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::DepthExceeded);
        let p = parent(&["a", "b", "c"], "d");
        assert_eq!(
            derive_chain(&id("d"), &id("e"), Some(&p), 5).unwrap().len(),
            4
        );
    }

    #[test]
    fn only_the_callee_of_the_parent_may_extend_it() {
        let p = parent(&["a"], "b");
        let err = derive_chain(&id("mallory"), &id("c"), Some(&p), 5).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::IdentityMismatch);
    }

    #[test]
    fn record_round_trips() {
        let p = parent(&["a"], "b");
        let text = serde_json::to_string(&p).unwrap();
        assert_eq!(serde_json::from_str::<PendingCall>(&text).unwrap(), p);
        assert!(!text.contains("answered_via"));
    }
}
