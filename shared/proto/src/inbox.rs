//! Reading a goal's inbox through its cursor (docs/protocol.md §7): the `fetch` and `ack`
//! requests an agent sends to `inbox-fanout`, their replies, and the cursor record the service
//! keeps per live goal in KV `agent_cursors`.
//!
//! A goal's cursor is the `AGENT_INBOX` sequence of the last message its owner has finished
//! with; unread means a greater sequence. Reading never changes what is unread (a fetch that is
//! not acked hands out the same messages again); only an ack — or `ack_through` on the next
//! fetch — moves the cursor, and only forward.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::ids::{AgentId, GoalId};
use crate::message::InboxMessage;
use crate::receipt::{PENDING_READS_MAX, PendingRead};

/// Most messages one fetch returns (`max`): a goal's whole inbox (its cap).
pub const FETCH_MAX: u32 = crate::names::INBOX_CAP_PER_GOAL.unsigned_abs() as u32;
/// Messages a fetch returns when `max` is not given.
pub const FETCH_DEFAULT: u32 = 16;
/// Longest a fetch may be held waiting for a message (`wait_ms`), in milliseconds.
pub const FETCH_WAIT_MAX_MS: u64 = 30_000;
/// Most bytes of stored messages one fetch reply carries, so the reply stays under NATS'
/// default 1 MiB payload limit whatever the messages' size (a message is at most 128 KiB, and
/// a fetch always returns at least one message when one is unread). The service keeps below a
/// smaller `max_payload` too (the shipped configs set 256 KB), with room for the framing.
pub const FETCH_REPLY_BYTES: usize = 768 * 1024;
/// How many times the head message (the oldest unread) is handed out without the cursor
/// passing it before the service moves it to the dead letters and skips it.
pub const INBOX_MAX_DELIVER: u32 = 10;
/// Longest `traceparent` / `tracestate` a fetch reply carries for a message (W3C allows 55 and
/// 512 characters); a longer value, which only a hostile sender could make, is left out.
pub const TRACE_HEADER_MAX_CHARS: usize = 512;
/// Longest reject reason kept (characters, control characters removed).
pub const REJECT_REASON_MAX_CHARS: usize = 200;

/// `agent.inbox.fetch.<agent_id>`: read one of the caller's goals after its cursor.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FetchRequest {
    /// The goal to read (one of the caller's own).
    pub goal_id: GoalId,
    /// Most messages to return, 1–64 (default 16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<u32>,
    /// How long to hold the request when nothing is unread, 0–30000 ms (default 0: answer at
    /// once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<i64>,
    /// Commit the cursor through this sequence first ("I am done through N"): lower than the
    /// cursor is a no-op; higher than anything this goal was handed is `bad_request`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ack_through: Option<u64>,
    /// Look without taking: the reply is the same, but the hand-out is not recorded (it does
    /// not count towards the redelivery limit, and `ack_through` cannot name what only a peek
    /// returned). For a host that announces unread messages without reading them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub peek: bool,
    /// Read the messages after this sequence instead of after the cursor: for a reader that
    /// handles several messages at once and wants the next ones while earlier ones are still
    /// being handled (not acked yet). At most the highest sequence handed out (`bad_request`
    /// above it); at or below the cursor it changes nothing. Such a read does not count as a
    /// hand-out of the oldest unread message (it does not return it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<u64>,
}

/// One unread message with its stream sequence (what `ack`/`ack_through` take).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FetchedMessage {
    /// Its `AGENT_INBOX` sequence.
    pub seq: u64,
    /// The stored inbox message, exactly as the service published it.
    pub message: InboxMessage,
    /// W3C trace context the sender's publish carried, so the reader's handling joins the
    /// sender's trace (omitted when the publish had none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// The publish's W3C `tracestate`, to pass on with `traceparent` (omitted when none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
}

/// Reply to a fetch: the unread messages in stream order, at most `max`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FetchReply {
    /// The goal read: the request's `goal_id`, echoed.
    pub goal_id: GoalId,
    /// The cursor after the request's `ack_through` (and any dead-lettered head) was applied.
    pub cursor: u64,
    /// The unread messages, oldest first.
    pub messages: Vec<FetchedMessage>,
    /// How many messages were unread when the reply was made, these included: more than
    /// `messages.len()` means fetch again after acking.
    #[serde(default)]
    pub unread: u64,
    /// Messages removed unread since the previous fetch (the goal was full); omitted when
    /// none. Each one's sender was told with a `kind: notify` (`reason: expired_unread`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expired_unread: Option<ExpiredUnread>,
}

/// `agent.inbox.ack.<agent_id>`: move a goal's cursor, or reject one message.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AckRequest {
    /// The goal (one of the caller's own).
    pub goal_id: GoalId,
    /// Done with every message through this sequence (it must have been handed out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub through: Option<u64>,
    /// The message to reject, with `reject`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    /// Why the message at `seq` cannot be handled: it is copied to the dead letters with this
    /// reason, and the cursor moves through it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reject: Option<String>,
}

/// What an [`AckRequest`] asks for, once checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AckOp {
    /// Move the cursor through this sequence.
    Through(u64),
    /// Dead-letter the message at `seq` with `reason`, then move the cursor through it.
    Reject {
        /// `AGENT_INBOX` sequence of the message to dead-letter.
        seq: u64,
        /// Why (control characters removed, at most [`REJECT_REASON_MAX_CHARS`]).
        reason: String,
    },
}

impl AckRequest {
    /// The one operation the request names: `through`, or `seq` with `reject`.
    pub fn op(&self) -> Result<AckOp, String> {
        match (self.through, self.seq, &self.reject) {
            (Some(through), None, None) => Ok(AckOp::Through(through)),
            (None, Some(seq), Some(reason)) => Ok(AckOp::Reject {
                seq,
                reason: clean_reason(reason),
            }),
            (None, Some(_), None) => Err("`seq` needs `reject` (the reason)".to_owned()),
            (None, None, Some(_)) => Err("`reject` needs `seq` (the message)".to_owned()),
            (None, None, None) => Err("give `through`, or `seq` with `reject`".to_owned()),
            _ => Err("give either `through`, or `seq` with `reject`, not both".to_owned()),
        }
    }
}

/// A reject reason as stored: control characters (CR/LF among them: it becomes a header)
/// removed, at most [`REJECT_REASON_MAX_CHARS`] characters, never empty.
pub fn clean_reason(reason: &str) -> String {
    let cleaned: String = reason
        .chars()
        .filter(|c| !c.is_control())
        .take(REJECT_REASON_MAX_CHARS)
        .collect();
    let cleaned = cleaned.trim();
    if cleaned.is_empty() {
        "rejected by its reader (no reason given)".to_owned()
    } else {
        format!("rejected by its reader: {cleaned}")
    }
}

/// Reply to an ack.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AckReply {
    /// The goal acked: the request's `goal_id`, echoed.
    pub goal_id: GoalId,
    /// The goal's cursor after this ack: the last sequence done with (it never moves back).
    pub cursor: u64,
}

/// A goal's cursor as stored in KV `agent_cursors` under the goal id (services only).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CursorRecord {
    /// The agent that owns the goal: the only one that may fetch or ack it.
    pub agent_id: AgentId,
    /// The last sequence the owner finished with (0 when the goal opened).
    pub cursor: u64,
    /// The highest sequence ever handed out for this goal (an ack past it is refused).
    #[serde(default)]
    pub handed: u64,
    /// The head message whose hand-outs are being counted (the oldest unread when counted).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub head: u64,
    /// How many times `head` was handed out without the cursor passing it.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub head_deliveries: u32,
    /// Messages removed unread since the owner's last fetch (the goal was full): the next
    /// fetch reports them and clears the count.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub expired_unread: u64,
    /// Their message ids, the newest [`EXPIRED_IDS_KEPT`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expired_ids: Vec<Uuid>,
    /// Whose they were: each sender with how many of its messages were removed (at most
    /// [`EXPIRED_SENDERS_KEPT`] senders, those with the most kept).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expired_from: Vec<SenderCount>,
    /// `read` receipts owed: messages handed out whose senders asked for `read`, until the
    /// cursor passes them (at most [`PENDING_READS_MAX`], oldest dropped).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_reads: Vec<PendingRead>,
    /// What a message that finds the goal full does (chosen at `goal.open`; absent =
    /// `evict_oldest`).
    #[serde(default, skip_serializing_if = "Overflow::is_default")]
    pub overflow: Overflow,
}

/// What a full goal does with the next message (docs/protocol.md §8, "The inbox cap"). Either
/// way a message already handed out to the goal's reader is not evicted.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Overflow {
    /// The oldest message not yet handed out goes (its sender gets an `expired_unread`
    /// notice, the reader a count on its next fetch) and the new one is stored: the seed's
    /// behaviour, right for a reader that wants the newest.
    #[default]
    EvictOldest,
    /// Nothing is evicted: the new message is refused (`inbox_full`, 429, nothing stored), so
    /// its sender learns at once and can back off. Right for a reader that must see everything.
    Refuse,
}

impl Overflow {
    /// True for `evict_oldest` (left off the wire).
    #[allow(clippy::trivially_copy_pass_by_ref)]
    pub fn is_default(&self) -> bool {
        *self == Self::EvictOldest
    }
}

/// How many ids of messages removed unread a cursor keeps for its owner's next fetch.
pub const EXPIRED_IDS_KEPT: usize = 16;

/// How many senders of messages removed unread a cursor names for its owner's next fetch
/// (the senders with the most removed; a full goal removes from its biggest holder, so the
/// first of them is who filled it).
pub const EXPIRED_SENDERS_KEPT: usize = 8;

/// A sender and how many of its messages something counted (docs/protocol.md §8, "The inbox
/// cap": whose messages a full goal removed unread).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SenderCount {
    /// The sender (`from_agent_id` of its messages).
    pub agent_id: AgentId,
    /// How many of its messages.
    pub count: u64,
}

/// `metadata.reason` of the notice a sender gets when its message was removed unread.
pub const EXPIRED_UNREAD: &str = "expired_unread";

/// Messages of a goal removed before its owner read them (the goal was full: each new
/// message past the cap removed the oldest waiting message of the sender holding the most of
/// the goal), as a fetch reports them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ExpiredUnread {
    /// How many, since the previous fetch.
    pub count: u64,
    /// Their message ids, the newest [`EXPIRED_IDS_KEPT`].
    pub ids: Vec<Uuid>,
    /// Whose they were, most removed first (at most [`EXPIRED_SENDERS_KEPT`] senders):
    /// a full goal removes the messages of the sender holding the most of it, so this names
    /// who filled it. Omitted when unknown (messages removed before issue 37).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub from: Vec<SenderCount>,
}

#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_zero(value: &u64) -> bool {
    *value == 0
}

#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_zero_u32(value: &u32) -> bool {
    *value == 0
}

impl CursorRecord {
    /// A new goal's cursor: nothing read yet, or (a goal migrated from a v1 consumer) done
    /// through `cursor`.
    pub fn new(agent_id: AgentId, cursor: u64) -> Self {
        Self {
            agent_id,
            cursor,
            handed: cursor,
            head: 0,
            head_deliveries: 0,
            expired_unread: 0,
            expired_ids: Vec::new(),
            expired_from: Vec::new(),
            pending_reads: Vec::new(),
            overflow: Overflow::EvictOldest,
        }
    }

    /// Owes a `read` receipt for a message just handed out (once per sequence).
    pub fn owe_read(&mut self, pending: PendingRead) {
        if self.pending_reads.iter().any(|p| p.seq == pending.seq) {
            return;
        }
        self.pending_reads.push(pending);
        let over = self.pending_reads.len().saturating_sub(PENDING_READS_MAX);
        self.pending_reads.drain(..over);
    }

    /// Forgets the receipt owed for `seq` (the message was dead-lettered or removed unread:
    /// never read).
    pub fn forget_read(&mut self, seq: u64) {
        self.pending_reads.retain(|p| p.seq != seq);
    }

    /// Takes the `read` receipts the cursor has passed: they are due now.
    pub fn reads_due(&mut self) -> Vec<PendingRead> {
        let cursor = self.cursor;
        let (due, owed) = std::mem::take(&mut self.pending_reads)
            .into_iter()
            .partition(|p| p.seq <= cursor);
        self.pending_reads = owed;
        due
    }

    /// Records that message `id` was removed unread.
    pub fn expired(&mut self, id: Option<Uuid>) {
        self.expired_unread = self.expired_unread.saturating_add(1);
        if let Some(id) = id {
            self.expired_ids.push(id);
            let over = self.expired_ids.len().saturating_sub(EXPIRED_IDS_KEPT);
            self.expired_ids.drain(..over);
        }
    }

    /// Records that message `id`, sent by `from`, was removed unread: [`CursorRecord::expired`],
    /// and counted against its sender (the [`EXPIRED_SENDERS_KEPT`] senders with the most
    /// removed are kept; a new one takes the place of the one with the fewest).
    pub fn expired_sent_by(&mut self, id: Option<Uuid>, from: Option<&AgentId>) {
        self.expired(id);
        let Some(from) = from else {
            return;
        };
        if let Some(sender) = self.expired_from.iter_mut().find(|s| s.agent_id == *from) {
            sender.count = sender.count.saturating_add(1);
            return;
        }
        if self.expired_from.len() >= EXPIRED_SENDERS_KEPT
            && let Some(fewest) = self
                .expired_from
                .iter()
                .enumerate()
                .min_by_key(|(_, sender)| sender.count)
                .map(|(index, _)| index)
        {
            self.expired_from.remove(fewest);
        }
        self.expired_from.push(SenderCount {
            agent_id: from.clone(),
            count: 1,
        });
    }

    /// Takes what expired since the last fetch (clearing it); `None` when nothing did.
    pub fn take_expired(&mut self) -> Option<ExpiredUnread> {
        if self.expired_unread == 0 {
            return None;
        }
        let mut from = std::mem::take(&mut self.expired_from);
        from.sort_by(|a, b| {
            b.count
                .cmp(&a.count)
                .then_with(|| a.agent_id.cmp(&b.agent_id))
        });
        Some(ExpiredUnread {
            count: std::mem::take(&mut self.expired_unread),
            ids: std::mem::take(&mut self.expired_ids),
            from,
        })
    }

    /// Moves the cursor through `through` (never back). Returns whether it moved.
    pub fn advance(&mut self, through: u64) -> bool {
        if through <= self.cursor {
            return false;
        }
        self.cursor = through;
        self.handed = self.handed.max(through);
        if self.head <= through {
            self.head = 0;
            self.head_deliveries = 0;
        }
        true
    }

    /// Whether the head message `seq` has been handed out the most times allowed, so the next
    /// hand-out must dead-letter it instead.
    pub fn head_exhausted(&self, seq: u64) -> bool {
        self.head == seq && self.head_deliveries >= INBOX_MAX_DELIVER
    }

    /// Records that messages through `last` were handed out by a read that did not start at
    /// the oldest unread message (see [`FetchRequest::after`]).
    pub fn hand_out_later(&mut self, last: u64) {
        self.handed = self.handed.max(last);
    }

    /// Records one hand-out of messages `first..=last` (stream sequences).
    pub fn hand_out(&mut self, first: u64, last: u64) {
        if self.head == first {
            self.head_deliveries = self.head_deliveries.saturating_add(1);
        } else {
            self.head = first;
            self.head_deliveries = 1;
        }
        self.handed = self.handed.max(last);
    }
}

/// The KV key of a goal's cursor: the goal id.
pub fn cursor_key(goal_id: &GoalId) -> String {
    goal_id.to_string()
}

/// The owner check every fetch and ack passes: a goal that does not exist and a goal of
/// another agent are answered alike, so goal ids are addresses, not keys.
pub fn owned_by<'a>(
    record: Option<&'a CursorRecord>,
    caller: &AgentId,
) -> Option<&'a CursorRecord> {
    record.filter(|record| record.agent_id == *caller)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn goal() -> GoalId {
        GoalId::parse("0193a1b2-0000-7000-8000-000000000001").unwrap()
    }

    #[test]
    fn fetch_request_and_reply_match_the_contract_literals() {
        let literal = serde_json::json!({
            "goal_id": "0193a1b2-0000-7000-8000-000000000001",
            "max": 8, "wait_ms": 5000, "ack_through": 41
        });
        let request: FetchRequest = serde_json::from_value(literal.clone()).unwrap();
        assert_eq!(request.max, Some(8));
        assert_eq!(serde_json::to_value(&request).unwrap(), literal);
        let reply = serde_json::json!({
            "goal_id": "0193a1b2-0000-7000-8000-000000000001",
            "cursor": 41,
            "messages": [{"seq": 42, "message": {
                "from_agent_id": "writer", "from_goal_id": "0193a1b2-0000-7000-8000-000000000002",
                "to_agent_id": "researcher", "body": "hi", "sent_at": "2026-04-30T14:00:00Z",
                "correlation_id": null
            }}],
            "unread": 1
        });
        let decoded: FetchReply = serde_json::from_value(reply).unwrap();
        assert_eq!(decoded.messages[0].seq, 42);
        assert_eq!(decoded.messages[0].message.body, "hi");
    }

    #[test]
    fn unknown_fields_and_a_bad_goal_id_are_refused() {
        assert!(serde_json::from_str::<FetchRequest>(r#"{"goal_id":"nope"}"#).is_err());
        assert!(
            serde_json::from_value::<FetchRequest>(
                serde_json::json!({"goal_id": goal().to_string(), "maxx": 1})
            )
            .is_err()
        );
    }

    #[test]
    fn an_ack_names_exactly_one_operation() {
        let through = AckRequest {
            goal_id: goal(),
            through: Some(3),
            ..Default::default()
        };
        assert_eq!(through.op(), Ok(AckOp::Through(3)));
        let reject = AckRequest {
            goal_id: goal(),
            seq: Some(4),
            reject: Some("bad\r\nX-Injected: 1".to_owned()),
            ..Default::default()
        };
        let Ok(AckOp::Reject { seq, reason }) = reject.op() else {
            panic!("a reject")
        };
        assert_eq!(seq, 4);
        assert!(!reason.contains('\r') && !reason.contains('\n'));
        assert!(reason.ends_with("badX-Injected: 1"));
        let both = AckRequest {
            goal_id: goal(),
            through: Some(3),
            seq: Some(4),
            reject: Some("x".to_owned()),
        };
        assert!(both.op().is_err());
        assert!(
            AckRequest {
                goal_id: goal(),
                ..Default::default()
            }
            .op()
            .is_err()
        );
        assert_eq!(clean_reason(&"y".repeat(10_000)).chars().count(), 200 + 24);
    }

    #[test]
    fn removed_messages_name_their_senders_most_first_and_are_taken_once() {
        let alice = AgentId::parse("alice").unwrap();
        let mallory = AgentId::parse("mallory").unwrap();
        let mut record = CursorRecord::new(alice.clone(), 0);
        assert_eq!(record.take_expired(), None);
        record.expired_sent_by(Some(Uuid::now_v7()), Some(&alice));
        for _ in 0..3 {
            record.expired_sent_by(Some(Uuid::now_v7()), Some(&mallory));
        }
        record.expired_sent_by(None, None);
        // Kept on the wire (the cursor record round-trips through KV).
        let stored: CursorRecord =
            serde_json::from_value(serde_json::to_value(&record).unwrap()).unwrap();
        assert_eq!(stored, record);
        let expired = record.take_expired().unwrap();
        assert_eq!(expired.count, 5);
        assert_eq!(expired.ids.len(), 4);
        assert_eq!(
            expired.from,
            vec![
                SenderCount {
                    agent_id: mallory,
                    count: 3
                },
                SenderCount {
                    agent_id: alice.clone(),
                    count: 1
                },
            ]
        );
        assert_eq!(record.take_expired(), None, "taken once");
        // At most EXPIRED_SENDERS_KEPT senders: a newcomer replaces the one with the fewest.
        for n in 0..EXPIRED_SENDERS_KEPT {
            let sender = AgentId::parse(&format!("s{n}")).unwrap();
            for _ in 0..=n {
                record.expired_sent_by(None, Some(&sender));
            }
        }
        record.expired_sent_by(None, Some(&alice));
        let expired = record.take_expired().unwrap();
        assert_eq!(expired.from.len(), EXPIRED_SENDERS_KEPT);
        assert!(expired.from.iter().all(|s| s.agent_id.as_str() != "s0"));
        assert_eq!(expired.from.last().unwrap().agent_id, alice);
        // An older reply without `from` still decodes.
        let old: ExpiredUnread =
            serde_json::from_value(serde_json::json!({"count": 1, "ids": []})).unwrap();
        assert!(old.from.is_empty());
    }

    #[test]
    fn the_cursor_moves_only_forward_and_counts_head_hand_outs() {
        let alice = AgentId::parse("alice").unwrap();
        let mut record = CursorRecord::new(alice.clone(), 0);
        for _ in 0..INBOX_MAX_DELIVER {
            assert!(!record.head_exhausted(5));
            record.hand_out(5, 9);
        }
        assert!(record.head_exhausted(5));
        assert_eq!(record.handed, 9);
        assert!(!record.advance(0));
        assert!(record.advance(5));
        assert_eq!(
            (record.cursor, record.head, record.head_deliveries),
            (5, 0, 0)
        );
        record.hand_out(7, 9);
        assert!(!record.advance(4), "never back");
        assert_eq!(record.cursor, 5);
        assert!(owned_by(Some(&record), &alice).is_some());
        assert!(owned_by(Some(&record), &AgentId::parse("mallory").unwrap()).is_none());
    }
}
