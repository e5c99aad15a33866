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

use std::sync::Arc;
use std::time::Duration;

use switchboard_proto::inbox::{
    CursorRecord, ExpiredUnread, FETCH_DEFAULT, FETCH_MAX, FETCH_WAIT_MAX_MS, FetchReply,
    FetchRequest, FetchedMessage, INBOX_MAX_DELIVER, TRACE_HEADER_MAX_CHARS, owned_by,
};
use switchboard_proto::receipt::ReceiptState;
use switchboard_proto::{AgentId, GoalId, HEADER_TRACEPARENT, HEADER_TRACESTATE, InboxMessage};
use switchboard_runtime::CancellationToken;
use tokio::time::Instant;

use crate::error::FanoutError;
use crate::handout::{Bookkeeping, HandedOut, first_hand_outs};
use crate::receipts::Receipts;
use crate::store::{Cas, InboxStore, StoredMessage, Unread};
pub use crate::wake::HELD_FETCHES_PER_AGENT;
use crate::wake::{Notice, SAFETY_REREAD, WakeHub};

/// How many compare-and-set attempts one request makes before answering `conflict`.
const CAS_ATTEMPTS: u32 = 64;
/// A held fetch's `ack_through` that passes fewer messages than this is written with the
/// hand-out that ends the wait (one cursor write per message on a call's path); one that
/// passes more is written at once, so a burst into the goal can purge what was read.
const DEFER_ACKS_UP_TO: u64 = 16;

/// Pauses before reading again after a wake finds nothing yet: a replica answering direct gets
/// may apply a message a moment after the leader announced it (milliseconds, seconds while it
/// catches up after a restart).
const AFTER_WAKE: [Duration; 6] = [
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
    wake: WakeHub,
    pub(crate) receipts: Receipts,
    stopping: CancellationToken,
    /// Fetches each agent has held open on this replica right now.
    held: switchboard_runtime::places::Places<AgentId>,
}

/// A fetch's limits, checked.
struct FetchLimits {
    max: u32,
    wait: Duration,
}

fn limits(request: &FetchRequest) -> Result<FetchLimits, FanoutError> {
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
fn fetched(stored: &StoredMessage) -> Option<FetchedMessage> {
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

    /// fetch: the unread messages after the cursor, at most `max`, waiting up to `wait_ms`
    /// for one when none is unread.
    pub async fn fetch(
        &self,
        caller: &AgentId,
        request: &FetchRequest,
    ) -> Result<FetchReply, FanoutError> {
        let FetchLimits { max, mut wait } = limits(request)?;
        // A hold for the whole wait; an agent holding too many already is answered at once.
        let _hold = if wait.is_zero() {
            None
        } else {
            let hold = self.held.take(caller, HELD_FETCHES_PER_AGENT);
            if hold.is_none() {
                wait = Duration::ZERO;
            }
            hold
        };
        let goal = request.goal_id;
        let deadline = Instant::now() + wait;
        // Registered before the first read, so a message stored after it wakes this fetch; with
        // the newest sequence this replica's notices named on the goal (if it knows it).
        let (mut waiter, mut newest) = match wait.is_zero() {
            true => (None, None),
            false => {
                let (waiter, newest) = self.wake.register(goal);
                (Some(waiter), newest)
            }
        };
        // Index of the next quick re-read after a wake (none until a wake).
        let mut quick = AFTER_WAKE.len();
        let mut attempts = 0;
        // A fetch that hands out messages writes the cursor by compare-and-set, so it may start
        // from the cursor this replica saw a moment ago; one that writes nothing (a peek, an
        // empty answer) is answered only from a cursor read now (the goal may have closed).
        let mut recent = if request.peek {
            None
        } else {
            self.recent_owned(caller, &goal)
        };
        // The cursor as this fetch last read or wrote it: a held fetch woken by a store reads
        // only the inbox, not the cursor again (a change by anyone else fails the write below,
        // which reads afresh).
        let mut known: Option<(CursorRecord, u64)> = None;
        // The message a store notice carried, since the last read found nothing.
        let mut woken: Option<Arc<Notice>> = None;
        // A change to the cursor this held fetch has not written yet (its `ack_through` while
        // nothing was unread): written with the hand-out that ends the wait, or at its end.
        let mut unwritten = false;
        // This attempt's `ack_through` passed many messages: written at once, not deferred —
        // a full goal's room comes from purging what its cursor has passed, and a burst that
        // finds the cursor behind would evict unread messages instead.
        let mut acked_many = false;
        loop {
            let from_recent = recent.is_some();
            // A held fetch's record may have been overtaken while it waited — by the reader's
            // own ack, most often, through this replica: start from the newer of the two, so
            // the hand-out's compare-and-set does not lose to it.
            let held =
                known.take().map(
                    |(held, held_revision)| match self.recent_owned(caller, &goal) {
                        Some((newer, newer_revision)) if newer_revision > held_revision => {
                            (newer, newer_revision)
                        }
                        _ => (held, held_revision),
                    },
                );
            let (mut record, mut revision) = match recent.take().or(held) {
                Some(known) => known,
                None => self.owned(caller, &goal).await?,
            };
            let mut changed = std::mem::take(&mut unwritten);
            // Every re-read from the leader comes before any change to the record, so none is
            // lost with the record it replaces.
            if request.after.is_some_and(|after| after > record.handed) {
                (record, revision) = self.owned_from_leader(caller, &goal).await?;
            }
            if let Some(through) = request.ack_through {
                if through > record.handed {
                    (record, revision) = self.owned_from_leader(caller, &goal).await?;
                }
                self.within_stored(&goal, through, &record, "ack_through")
                    .await?;
                let before = record.cursor;
                changed |= record.advance(through);
                acked_many = record.cursor.saturating_sub(before) >= DEFER_ACKS_UP_TO;
            }
            // `read` receipts the cursor passed (taken on this attempt's record, so a lost
            // compare-and-set takes them again from the fresh one).
            let reads = record.reads_due();
            // What was removed unread since the last fetch: reported (and, but for a peek,
            // cleared with this fetch's write).
            let expired = if request.peek {
                record.clone().take_expired()
            } else {
                let expired = record.take_expired();
                changed |= expired.is_some();
                expired
            };
            // Reading past messages still being handled (`after`): only what was handed out.
            let from = match request.after {
                Some(after) if after > record.cursor => {
                    self.within_stored(&goal, after, &record, "after").await?;
                    after
                }
                _ => record.cursor,
            };
            // A notice whose message came right after `from` on this goal (nothing was stored
            // for it in between) is all that is unread: no need to read it back.
            let mut from_notice = false;
            let unread = match woken.take() {
                Some(notice) if notice.message.seq > from && notice.last_on_goal <= from => {
                    from_notice = true;
                    Unread {
                        messages: vec![notice.message.clone()],
                        total: 1,
                    }
                }
                // A held fetch's first read, when the notices say nothing was stored on the
                // goal after `from`: nothing is unread (a message stored since wakes it).
                _ if newest.is_some_and(|newest| newest <= from) => Unread {
                    messages: Vec::new(),
                    total: 0,
                },
                _ => self.store.unread(&goal, from, max).await?,
            };
            if let Some(head) = unread.messages.first()
                && from == record.cursor
                && !request.peek
                && (record.head_exhausted(head.seq) || fetched(head).is_none())
            {
                // Dead-letter the head, then read again from the moved cursor — decided on the
                // leader's cursor, so a lagging replica's cursor never letters a message that
                // was acknowledged meanwhile.
                let (mut leader, leader_revision) = self.owned_from_leader(caller, &goal).await?;
                let undecodable = fetched(head).is_none();
                if leader.cursor < head.seq && (undecodable || leader.head_exhausted(head.seq)) {
                    let reason = if undecodable {
                        "undecodable: not an InboxMessage".to_owned()
                    } else {
                        format!(
                            "handed out {INBOX_MAX_DELIVER} times without being acknowledged (the limit)"
                        )
                    };
                    let deliveries = if leader.head == head.seq {
                        leader.head_deliveries
                    } else {
                        0
                    };
                    self.store
                        .dead_letter(&goal, head.clone(), &reason, deliveries)
                        .await?;
                    leader.forget_read(head.seq);
                    leader.advance(head.seq);
                    let reads = leader.reads_due();
                    if self
                        .cas(&goal, &leader, leader_revision, &mut attempts)
                        .await?
                    {
                        self.receipts
                            .tell(caller, &goal, &reads, ReceiptState::Read)
                            .await;
                    }
                } else {
                    // The replica read lags the leader: read again shortly.
                    self.conflict(&goal, &mut attempts).await?;
                }
                continue;
            }
            let past_head = from > record.cursor;
            let handed_before = record.handed;
            let messages = self.hand_out(&mut record, &unread, request.peek, past_head);
            changed |= !messages.is_empty() && !request.peek;
            // Receipts of messages handed out for the first time: `delivered` now, `read`
            // owed on the cursor until it passes them.
            let delivered = if request.peek {
                Vec::new()
            } else {
                first_hand_outs(&mut record, &messages, handed_before)
            };
            // A held fetch with nothing to hand out that only moved the cursor waits first: the
            // write then goes with the hand-out a notice brings (one write per message, not
            // two). Not with receipts due, which are told once the cursor is written.
            let holds_on = waiter.is_some()
                && messages.is_empty()
                && expired.is_none()
                && reads.is_empty()
                && !acked_many
                && Instant::now() < deadline
                && !self.stopping.is_cancelled();
            if changed && holds_on {
                unwritten = true;
            } else if changed && from_notice && !messages.is_empty() && expired.is_none() {
                // A held fetch woken by a message stored a moment ago: hand-out is at least
                // once (docs/protocol.md §7, "Hand-out is at least once"), so the message is
                // answered now and its bookkeeping written after. A fetch that reads the
                // stream writes first, as the cap's protection of what it hands out needs.
                let handed = HandedOut {
                    goal,
                    through: request.ack_through,
                    first: messages.first().map_or(0, |m| m.seq),
                    last: messages.last().map_or(0, |m| m.seq),
                    past_head,
                    messages: messages.clone(),
                };
                let later = Bookkeeping {
                    store: self.store.clone(),
                    receipts: self.receipts.clone(),
                    caller: caller.clone(),
                };
                tokio::spawn(later.write(handed, record.clone(), revision, delivered, reads));
                return Ok(reply(goal, &record, messages, &unread, expired));
            } else if changed {
                match self.store.put_cursor(&goal, &record, revision).await? {
                    Cas::Done(written) => revision = written,
                    Cas::Conflict => {
                        self.conflict(&goal, &mut attempts).await?;
                        continue;
                    }
                }
                // Stored before the reply, so the reader's ack (and its `read`) comes after —
                // or, into a sender's full goal, queued in order before its `read` and stored
                // after the reply: one round of publishes, never room-making, on this path.
                self.receipts
                    .tell(caller, &goal, &delivered, ReceiptState::Delivered)
                    .await;
                self.receipts
                    .tell(caller, &goal, &reads, ReceiptState::Read)
                    .await;
            } else if from_recent {
                continue;
            }
            let Some(waiting) = waiter.as_mut() else {
                return Ok(reply(goal, &record, messages, &unread, expired));
            };
            let now = Instant::now();
            if !messages.is_empty()
                || expired.is_some()
                || now >= deadline
                || self.stopping.is_cancelled()
            {
                return Ok(reply(goal, &record, messages, &unread, expired));
            }
            known = Some((record, revision));
            // Nothing unread: wait for a store notice, the deadline, the next re-read (a few
            // quick ones right after a notice, then the safety one) or the service stopping.
            let pause = AFTER_WAKE.get(quick).copied().unwrap_or(SAFETY_REREAD);
            quick = quick.saturating_add(1);
            // Only the reads before the first wait trust the notices; every later one (after a
            // notice, or the safety re-read) reads the stream.
            newest = None;
            tokio::select! {
                notice = waiting.stored() => {
                    quick = 0;
                    woken = notice;
                }
                () = tokio::time::sleep_until(deadline.min(now + pause)) => {}
                () = self.stopping.cancelled() => {}
            }
        }
    }

    /// The messages of `unread` this fetch hands out (every one that decodes, in order, up to
    /// the first that does not), recorded on `record` unless the fetch only peeks.
    fn hand_out(
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
    async fn cas(
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

fn reply(
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
