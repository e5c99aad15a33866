//! Reading an inbox (docs/protocol.md §7): `agent.inbox.fetch.<agent_id>` hands out a goal's
//! messages after its cursor (long-poll with `wait_ms`, committing `ack_through` first), and
//! `agent.inbox.ack.<agent_id>` moves the cursor or rejects one message to the dead letters.
//!
//! Rules, in the order a request meets them:
//! - only the goal's owner may read or move it; anyone else — and any goal that is not live —
//!   gets `not_found` alike, so a goal id learnt from `delivered_to` or `lookup` opens nothing;
//! - the cursor moves only forward, by compare-and-set, and never past the goal's newest
//!   message;
//! - every hand-out is recorded on the cursor (the highest sequence handed out, and how often
//!   the head message was): the head handed out [`INBOX_MAX_DELIVER`] times without the cursor
//!   passing it moves to the dead letters and is skipped (bounded redelivery, no consumer). A
//!   held fetch woken by a new message records it just after its reply (hand-out is at least
//!   once, docs/protocol.md §7; readers drop repeats by `seq`); every other fetch first;
//! - a held fetch is woken by [`crate::wake`] on whichever replica holds it, and answered empty
//!   when its wait ends or the service stops (reading is idempotent: the reader fetches again);
//! - one agent holds at most [`crate::wake::HELD_FETCHES_PER_AGENT`] fetches open on a replica: past that a
//!   fetch is answered at once, as with `wait_ms: 0`.

use std::time::Duration;

use switchboard_proto::inbox::{
    CursorRecord, ExpiredUnread, FETCH_DEFAULT, FETCH_MAX, FETCH_WAIT_MAX_MS, FetchReply,
    FetchRequest, FetchedMessage, TRACE_HEADER_MAX_CHARS, owned_by,
};
use switchboard_proto::{AgentId, GoalId, HEADER_TRACEPARENT, HEADER_TRACESTATE, InboxMessage};
use switchboard_runtime::CancellationToken;

use crate::error::FanoutError;
use crate::receipts::Receipts;
use crate::store::{Cas, InboxStore, StoredMessage, Unread};
pub use crate::wake::HELD_FETCHES_PER_AGENT;
use crate::wake::WakeHub;

/// How many compare-and-set attempts one request makes before answering `conflict`.
const CAS_ATTEMPTS: u32 = 64;
/// A held fetch's `ack_through` that passes fewer messages than this is written with the
/// hand-out that ends the wait (one cursor write per message on a call's path); one that
/// passes more is written at once, so a burst into the goal can purge what was read.
pub(crate) const DEFER_ACKS_UP_TO: u64 = 16;

/// Pauses before reading again after a wake finds nothing yet: a replica answering direct gets
/// may apply a message a moment after the leader announced it (milliseconds, seconds while it
/// catches up after a restart).
pub(crate) const AFTER_WAKE: [Duration; 6] = [
    Duration::from_millis(2),
    Duration::from_millis(8),
    Duration::from_millis(32),
    Duration::from_millis(128),
    Duration::from_millis(512),
    Duration::from_millis(1024),
];

/// The reading side of the inbox: fetch and ack.
#[derive(Debug, Clone)]
pub struct Reader {
    pub(crate) store: InboxStore,
    pub(crate) wake: WakeHub,
    pub(crate) receipts: Receipts,
    pub(crate) stopping: CancellationToken,
    /// Fetches each agent has held open on this replica right now.
    pub(crate) held: switchboard_runtime::places::Places<AgentId>,
}

/// A fetch's limits, checked.
pub(crate) struct FetchLimits {
    pub(crate) max: u32,
    pub(crate) wait: Duration,
}

pub(crate) fn limits(request: &FetchRequest) -> Result<FetchLimits, FanoutError> {
    let max = request.max.unwrap_or(FETCH_DEFAULT);
    if !(1..=FETCH_MAX).contains(&max) {
        return Err(FanoutError::BadRead(format!(
            "max is {max}; it must be 1 to {FETCH_MAX}"
        )));
    }
    let wait_ms = request.wait_ms.unwrap_or(0);
    let wait = u64::try_from(wait_ms)
        .ok()
        .filter(|ms| *ms <= FETCH_WAIT_MAX_MS)
        .ok_or_else(|| {
            FanoutError::BadRead(format!(
                "wait_ms is {wait_ms}; it must be 0 to {FETCH_WAIT_MAX_MS}"
            ))
        })?;
    Ok(FetchLimits {
        max,
        wait: Duration::from_millis(wait),
    })
}

/// A stored message as handed out; `None` when its payload is not an `InboxMessage` (only a
/// publisher with JetStream access could store one), which is then dead-lettered.
pub(crate) fn fetched(stored: &StoredMessage) -> Option<FetchedMessage> {
    let message: InboxMessage = serde_json::from_slice(&stored.payload).ok()?;
    let header = |name| {
        stored
            .headers
            .get(name)
            .map(|value: &async_nats::HeaderValue| value.as_str())
            .filter(|value| value.len() <= TRACE_HEADER_MAX_CHARS)
            .map(str::to_owned)
    };
    Some(FetchedMessage {
        seq: stored.seq,
        message,
        traceparent: header(HEADER_TRACEPARENT),
        tracestate: header(HEADER_TRACESTATE),
    })
}

impl Reader {
    /// Wires the store, the wake hub and the receipts; held fetches end when `stopping` is
    /// cancelled.
    pub fn new(
        store: InboxStore,
        wake: WakeHub,
        receipts: Receipts,
        stopping: CancellationToken,
    ) -> Self {
        Self {
            store,
            wake,
            receipts,
            stopping,
            held: Default::default(),
        }
    }

    /// The caller's goal cursor, or `not_found` (unknown goal and another's goal alike).
    pub(crate) async fn owned(
        &self,
        caller: &AgentId,
        goal: &GoalId,
    ) -> Result<(CursorRecord, u64), FanoutError> {
        let found = self.store.cursor(goal).await?;
        match found {
            Some((record, revision)) if owned_by(Some(&record), caller).is_some() => {
                Ok((record, revision))
            }
            _ => Err(FanoutError::GoalNotFound(*goal)),
        }
    }

    /// The caller's goal cursor as this replica read or wrote it a moment ago (see
    /// [`InboxStore::recent_cursor`]), for a request whose every change is a compare-and-set.
    pub(crate) fn recent_owned(
        &self,
        caller: &AgentId,
        goal: &GoalId,
    ) -> Option<(CursorRecord, u64)> {
        self.store
            .recent_cursor(goal)
            .filter(|(record, _)| record.agent_id == *caller)
    }

    /// [`Reader::owned`], read through the bucket's leader (see
    /// [`InboxStore::cursor_from_leader`]).
    pub(crate) async fn owned_from_leader(
        &self,
        caller: &AgentId,
        goal: &GoalId,
    ) -> Result<(CursorRecord, u64), FanoutError> {
        match self.store.cursor_from_leader(goal).await? {
            Some((record, revision)) if owned_by(Some(&record), caller).is_some() => {
                Ok((record, revision))
            }
            _ => Err(FanoutError::GoalNotFound(*goal)),
        }
    }

    /// The messages of `unread` this fetch hands out (every one that decodes, in order, up to
    /// the first that does not), recorded on `record` unless the fetch only peeks.
    pub(crate) fn hand_out(
        &self,
        record: &mut CursorRecord,
        unread: &Unread,
        peek: bool,
        past_head: bool,
    ) -> Vec<FetchedMessage> {
        let messages: Vec<FetchedMessage> = unread.messages.iter().map_while(fetched).collect();
        match (messages.first(), messages.last(), peek) {
            (Some(_), Some(last), false) if past_head => record.hand_out_later(last.seq),
            (Some(first), Some(last), false) => record.hand_out(first.seq, last.seq),
            _ => {}
        }
        messages
    }

    /// Whether a reader may name `seq` (`what`: an ack, `ack_through`, `after`) on `goal`:
    /// handed out as `record` says, or — the record of a hand-out is written after its reply —
    /// stored in the goal. Never past the goal's newest message.
    pub(crate) async fn within_stored(
        &self,
        goal: &GoalId,
        seq: u64,
        record: &CursorRecord,
        what: &str,
    ) -> Result<(), FanoutError> {
        if seq <= record.handed {
            return Ok(());
        }
        let last = self.store.last_seq(goal).await?;
        if seq <= last {
            return Ok(());
        }
        Err(FanoutError::BadRead(format!(
            "{what} is {seq}, but goal {goal} holds messages only through {}",
            last.max(record.handed)
        )))
    }

    /// Writes `record`, or counts a conflict (failing the request after too many). Returns
    /// whether it was written.
    pub(crate) async fn cas(
        &self,
        goal: &GoalId,
        record: &CursorRecord,
        revision: u64,
        attempts: &mut u32,
    ) -> Result<bool, FanoutError> {
        if self.store.put_cursor(goal, record, revision).await? == Cas::Conflict {
            self.conflict(goal, attempts).await?;
            return Ok(false);
        }
        Ok(true)
    }

    /// Counts a lost compare-and-set and backs off before the caller reads again.
    pub(crate) async fn conflict(
        &self,
        goal: &GoalId,
        attempts: &mut u32,
    ) -> Result<(), FanoutError> {
        *attempts += 1;
        if *attempts >= CAS_ATTEMPTS {
            return Err(FanoutError::Contention(*goal));
        }
        switchboard_runtime::store::cas_backoff(*attempts).await;
        Ok(())
    }
}

pub(crate) fn reply(
    goal: GoalId,
    record: &CursorRecord,
    messages: Vec<FetchedMessage>,
    unread: &Unread,
    expired_unread: Option<ExpiredUnread>,
) -> FetchReply {
    FetchReply {
        goal_id: goal,
        cursor: record.cursor,
        unread: unread.total.max(messages.len() as u64),
        messages,
        expired_unread,
    }
}
