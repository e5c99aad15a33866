//! Receipts: what a sender learns after "sent" (issue 20). A send, call or task created with
//! `receipt: "delivered"` or `"read"` makes the inbox service tell the sender's goal, with
//! `kind: receipt` messages, when each receiving goal's reader was first handed the message
//! (`delivered`) and when that goal's cursor passed it (`read`). `agent.send.status.<agent_id>`
//! answers the per-goal state of such a message at any time, from a record in KV
//! `agent_receipts` that only its sender may read.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::ids::{AgentId, GoalId};

/// The receipts a sender asks for (`receipt` on send, call and task create).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ReceiptLevel {
    /// One receipt per goal, when its reader is first handed the message.
    Delivered,
    /// `delivered`, then `read` when the goal's cursor passes the message.
    Read,
}

/// Where one copy of a receipted message is, for one receiving goal. Only moves forward, in
/// this order; `expired_unread` ends a copy that was never read (its goal was full).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum ReceiptState {
    /// In the goal's inbox; its reader has not been handed it yet.
    Stored,
    /// The goal's reader was handed it (a fetch returned it).
    Delivered,
    /// The goal's cursor passed it: its reader is done with it.
    Read,
    /// Removed before its reader acknowledged it (the goal held its most unread messages).
    ExpiredUnread,
}

impl ReceiptState {
    /// The state's wire name (`metadata.state` of a receipt message).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stored => "stored",
            Self::Delivered => "delivered",
            Self::Read => "read",
            Self::ExpiredUnread => "expired_unread",
        }
    }
}

/// `metadata.switchboard` of a receipt message. Informational: what makes a receipt genuine is
/// its `kind`, which only the inbox service writes (an agent's send of `kind: receipt` is
/// refused).
pub const RECEIPT_MARK: &str = "receipt";

/// Most receiving goals one receipt record follows: a broadcast past it keeps the first ones.
pub const RECEIPT_GOALS_MAX: usize = 256;

/// How long a receipt record is kept (KV `agent_receipts` max age), seconds: 7 days.
pub const RECEIPT_RECORD_TTL_SECS: u64 = 7 * 24 * 3600;

/// Most bytes KV `agent_receipts` holds (256 MiB).
pub const RECEIPTS_MAX_BYTES: i64 = 256 * 1024 * 1024;

/// One receiving goal's state, in a receipt record and a status reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct GoalReceipt {
    /// The receiving goal.
    pub goal_id: GoalId,
    /// The agent owning it.
    pub agent_id: AgentId,
    /// Where the copy is.
    pub state: ReceiptState,
    /// When it got there.
    #[serde(with = "time::serde::rfc3339")]
    #[schemars(with = "crate::timestamp::Timestamp")]
    pub at: OffsetDateTime,
}

/// A receipted message's record in KV `agent_receipts`, under its message id (services only).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ReceiptRecord {
    /// Who sent it: the only agent whose status request is answered.
    pub sender: AgentId,
    /// The receiving goals, in the order they were first recorded.
    pub goals: Vec<GoalReceipt>,
}

impl ReceiptRecord {
    /// Moves `goal`'s copy to `state` (adding the goal when new, up to
    /// [`RECEIPT_GOALS_MAX`]). Returns whether anything changed: a state never moves back, so
    /// a late or repeated update is a no-op.
    pub fn advance(
        &mut self,
        goal: GoalId,
        agent: &AgentId,
        state: ReceiptState,
        at: OffsetDateTime,
    ) -> bool {
        let full = self.goals.len() >= RECEIPT_GOALS_MAX;
        match self.goals.iter_mut().find(|g| g.goal_id == goal) {
            Some(known) if known.state >= state => false,
            Some(known) => {
                known.state = state;
                known.at = at;
                true
            }
            None if full => false,
            None => {
                self.goals.push(GoalReceipt {
                    goal_id: goal,
                    agent_id: agent.clone(),
                    state,
                    at,
                });
                true
            }
        }
    }
}

/// A receipted message handed to a goal's reader, until the goal's cursor passes it: then its
/// record moves to `read` (and, when the sender asked for `read`, the sender is told). Kept on
/// the goal's cursor record, so an ack never re-reads the stream to find whom to tell.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PendingRead {
    /// The message's `AGENT_INBOX` sequence.
    pub seq: u64,
    /// Its message id (what the receipt is `in_reply_to`).
    pub id: Uuid,
    /// The sender, told in `to_goal`.
    pub to_agent: AgentId,
    /// The goal the sender sent from.
    pub to_goal: GoalId,
    /// The message's correlation id (a call's), carried on the receipt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<Uuid>,
    /// What the sender asked for: `read` gets a receipt message when the cursor passes it,
    /// `delivered` only the record's update.
    pub level: ReceiptLevel,
}

/// Most `read` receipts one goal owes at once (twice the inbox cap: a goal never holds more
/// unread messages than the cap, so only a reader racing its own fetches gets near it).
pub const PENDING_READS_MAX: usize = 2 * crate::names::INBOX_CAP_PER_GOAL.unsigned_abs() as usize;

/// `agent.send.status.<agent_id>`: where a message the caller sent with a receipt is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SendStatusRequest {
    /// The message id the delivery report (or call / task reply) named.
    pub message_id: Uuid,
}

/// Reply to a status request: every receiving goal's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SendStatusReply {
    /// The message asked about.
    pub message_id: Uuid,
    /// One entry per receiving goal.
    pub goals: Vec<GoalReceipt>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn goal(n: usize) -> GoalId {
        GoalId::parse(&format!("0193a1b2-0000-7000-8000-{n:012}")).unwrap()
    }

    #[test]
    fn a_goal_state_only_moves_forward() {
        let bob = AgentId::parse("bob").unwrap();
        let now = crate::timestamp::now();
        let mut record = ReceiptRecord {
            sender: AgentId::parse("alice").unwrap(),
            goals: Vec::new(),
        };
        assert!(record.advance(goal(1), &bob, ReceiptState::Stored, now));
        assert!(record.advance(goal(1), &bob, ReceiptState::Read, now));
        assert!(!record.advance(goal(1), &bob, ReceiptState::Delivered, now));
        assert!(!record.advance(goal(1), &bob, ReceiptState::Read, now));
        assert_eq!(record.goals[0].state, ReceiptState::Read);
        let mut full = ReceiptRecord {
            sender: record.sender.clone(),
            goals: Vec::new(),
        };
        for n in 0..RECEIPT_GOALS_MAX {
            assert!(full.advance(goal(100 + n), &bob, ReceiptState::Stored, now));
        }
        assert!(!full.advance(goal(99), &bob, ReceiptState::Stored, now));
    }

    #[test]
    fn levels_and_states_match_the_contract_literals() {
        let level: ReceiptLevel = serde_json::from_str(r#""read""#).unwrap();
        assert_eq!(level, ReceiptLevel::Read);
        assert!(serde_json::from_str::<ReceiptLevel>(r#""seen""#).is_err());
        assert_eq!(
            serde_json::to_string(&ReceiptState::ExpiredUnread).unwrap(),
            r#""expired_unread""#
        );
        assert!(
            serde_json::from_value::<SendStatusRequest>(serde_json::json!({
                "message_id": "0193a1b2-0000-7000-8000-000000000001", "x": 1
            }))
            .is_err()
        );
    }
}
