//! A fetch, pass by pass (docs/protocol.md §7, `fetch`): each pass reads the goal's cursor,
//! applies the request's acks, reads what is unread, dead-letters a head due for it, hands
//! out and writes; a held fetch with nothing to hand out then waits for a store notice. The
//! rules every pass relies on (ownership, the bounds, hand-out recording) are in
//! [`crate::reader`].

use std::sync::Arc;
use std::time::Duration;

use switchboard_proto::inbox::{
    CursorRecord, ExpiredUnread, FetchReply, FetchRequest, FetchedMessage, INBOX_MAX_DELIVER,
};
use switchboard_proto::receipt::{PendingRead, ReceiptState};
use switchboard_proto::{AgentId, GoalId};
use tokio::time::Instant;

use crate::error::FanoutError;
use crate::handout::{Bookkeeping, HandedOut, first_hand_outs};
use crate::reader::{AFTER_WAKE, DEFER_ACKS_UP_TO, FetchLimits, Reader, fetched, limits, reply};
use crate::store::{Cas, Unread};
use crate::wake::{HELD_FETCHES_PER_AGENT, Notice, SAFETY_REREAD, Waiter};

/// A fetch in progress: its request, its wait, and what its passes carry from one to the next.
struct Pass<'a> {
    caller: &'a AgentId,
    request: &'a FetchRequest,
    goal: GoalId,
    max: u32,
    deadline: Instant,
    /// Registered with the wake hub (a held fetch only).
    waiter: Option<Waiter>,
    /// The newest sequence this replica's notices named on the goal, trusted before the first
    /// wait only.
    newest: Option<u64>,
    /// Index of the next quick re-read after a wake (none until a wake).
    quick: usize,
    /// Lost compare-and-sets so far.
    attempts: u32,
    /// The cursor this replica saw a moment ago, for the first pass.
    recent: Option<(CursorRecord, u64)>,
    /// The cursor as this fetch last read or wrote it: a held fetch woken by a store reads only
    /// the inbox, not the cursor again (a change by anyone else fails the write, which reads
    /// afresh).
    known: Option<(CursorRecord, u64)>,
    /// The message a store notice carried, since the last read found nothing.
    woken: Option<Arc<Notice>>,
    /// The goal's newest message, stored just before this fetch registered (its notice came
    /// before the fetch did), trusted before the first wait only.
    stored_lately: Option<Arc<Notice>>,
    /// A change to the cursor this held fetch has not written yet (its `ack_through` while
    /// nothing was unread): written with the hand-out that ends the wait, or at its end.
    unwritten: bool,
    /// The last `ack_through` passed many messages: written at once, not deferred — a full
    /// goal's room comes from purging what its cursor has passed, and a burst that finds the
    /// cursor behind would evict unread messages instead.
    acked_many: bool,
}

/// What a pass does next.
enum Step {
    Reply(FetchReply),
    Again,
    Wait,
}

/// What a pass's acks did: whether they changed the cursor, the `read` receipts and the
/// removed-unread report they made due, and where reading starts.
struct Acks {
    changed: bool,
    reads: Vec<PendingRead>,
    expired: Option<ExpiredUnread>,
    from: u64,
}

/// A pass's hand-out, before it is written.
struct HandOut {
    record: CursorRecord,
    revision: u64,
    changed: bool,
    from_recent: bool,
    from_notice: bool,
    past_head: bool,
    messages: Vec<FetchedMessage>,
    unread: Unread,
    expired: Option<ExpiredUnread>,
    reads: Vec<PendingRead>,
    delivered: Vec<PendingRead>,
}

impl Reader {
    /// fetch: the unread messages after the cursor, at most `max`, waiting up to `wait_ms`
    /// for one when none is unread. Each pass reads the cursor ([`Reader::start_pass`]),
    /// applies the request's acks ([`Reader::take_acks`]), reads what is unread
    /// ([`Reader::read_unread`]), dead-letters a head due for it ([`Reader::letter_head`]),
    /// hands out and writes ([`Reader::settle`]); a held fetch with nothing to hand out then
    /// waits for a store notice ([`Reader::wait_for_notice`]).
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
        // Registered before the first read, so a message stored after it wakes this fetch; with
        // the newest sequence this replica's notices named on the goal (if it knows it).
        let (waiter, newest, stored_lately) = match wait.is_zero() {
            true => (None, None, None),
            false => {
                let (mut waiter, newest) = self.wake.register(goal);
                let lately = waiter.stored_lately();
                (Some(waiter), newest, lately)
            }
        };
        let mut pass = Pass {
            caller,
            request,
            goal,
            max,
            deadline: Instant::now() + wait,
            waiter,
            newest,
            stored_lately,
            quick: AFTER_WAKE.len(),
            attempts: 0,
            // A fetch that hands out messages writes the cursor by compare-and-set, so it may
            // start from the cursor this replica saw a moment ago; one that writes nothing (a
            // peek, an empty answer) is answered only from a cursor read now (the goal may
            // have closed).
            recent: if request.peek {
                None
            } else {
                self.recent_owned(caller, &goal)
            },
            known: None,
            woken: None,
            unwritten: false,
            acked_many: false,
        };
        loop {
            match self.one_pass(&mut pass).await? {
                Step::Reply(reply) => return Ok(reply),
                Step::Again => {}
                Step::Wait => self.wait_for_notice(&mut pass).await,
            }
        }
    }

    /// One pass of a fetch over the cursor and the inbox.
    async fn one_pass(&self, pass: &mut Pass<'_>) -> Result<Step, FanoutError> {
        let (mut record, mut revision, from_recent) = self.start_pass(pass).await?;
        let unwritten = std::mem::take(&mut pass.unwritten);
        let acks = self.take_acks(pass, &mut record, &mut revision).await?;
        let (unread, from_notice) = self.read_unread(pass, acks.from, &record).await?;
        if self.letter_head(pass, &record, acks.from, &unread).await? {
            return Ok(Step::Again);
        }
        let past_head = acks.from > record.cursor;
        let handed_before = record.handed;
        let peek = pass.request.peek;
        let messages = self.hand_out(&mut record, &unread, peek, past_head);
        // Receipts of messages handed out for the first time: `delivered` now, `read` owed on
        // the cursor until it passes them.
        let delivered = match peek {
            true => Vec::new(),
            false => first_hand_outs(&mut record, &messages, handed_before),
        };
        let out = HandOut {
            record,
            revision,
            changed: unwritten || acks.changed || (!messages.is_empty() && !peek),
            from_recent,
            from_notice,
            past_head,
            messages,
            unread,
            expired: acks.expired,
            reads: acks.reads,
            delivered,
        };
        self.settle(pass, out).await
    }

    /// The cursor a pass starts from: the one this replica saw a moment ago (the first pass
    /// of a fetch that will write), or a held fetch's own — unless the reader's own ack
    /// through this replica overtook it while it waited, so the hand-out's compare-and-set
    /// does not lose to it — else one read now. Returns whether it came from the recent one.
    async fn start_pass(
        &self,
        pass: &mut Pass<'_>,
    ) -> Result<(CursorRecord, u64, bool), FanoutError> {
        let from_recent = pass.recent.is_some();
        let held = pass.known.take().map(|(held, held_revision)| {
            match self.recent_owned(pass.caller, &pass.goal) {
                Some((newer, newer_revision)) if newer_revision > held_revision => {
                    (newer, newer_revision)
                }
                _ => (held, held_revision),
            }
        });
        let (record, revision) = match pass.recent.take().or(held) {
            Some(known) => known,
            None => self.owned(pass.caller, &pass.goal).await?,
        };
        Ok((record, revision, from_recent))
    }

    /// The request's `ack_through` applied to `record`, the `read` receipts it makes due, what
    /// was removed unread since the last fetch (cleared, but for a peek), and where reading
    /// starts (`after`, or the cursor). Every re-read from the leader comes before any change
    /// to the record, so none is lost with the record it replaces.
    async fn take_acks(
        &self,
        pass: &mut Pass<'_>,
        record: &mut CursorRecord,
        revision: &mut u64,
    ) -> Result<Acks, FanoutError> {
        let (request, goal, caller) = (pass.request, pass.goal, pass.caller);
        let mut changed = false;
        if request.after.is_some_and(|after| after > record.handed) {
            (*record, *revision) = self.owned_from_leader(caller, &goal).await?;
        }
        if let Some(through) = request.ack_through {
            if through > record.handed {
                (*record, *revision) = self.owned_from_leader(caller, &goal).await?;
            }
            self.within_stored(&goal, through, record, "ack_through")
                .await?;
            let before = record.cursor;
            changed |= record.advance(through);
            pass.acked_many = record.cursor.saturating_sub(before) >= DEFER_ACKS_UP_TO;
        }
        // Taken on this pass's record, so a lost compare-and-set takes them again.
        let reads = record.reads_due();
        let expired = if request.peek {
            record.clone().take_expired()
        } else {
            let expired = record.take_expired();
            changed |= expired.is_some();
            expired
        };
        // Reading past messages still being handled (`after`).
        let from = match request.after {
            Some(after) if after > record.cursor => {
                self.within_stored(&goal, after, record, "after").await?;
                after
            }
            _ => record.cursor,
        };
        Ok(Acks {
            changed,
            reads,
            expired,
            from,
        })
    }

    /// What is unread after `from`, and whether it is the message a store notice carried: a
    /// notice whose message came right after `from` on this goal (nothing stored for it in
    /// between) is all that is unread, with no need to read it back; a held fetch's first read,
    /// when the notices say nothing was stored after `from`, finds nothing (a message stored
    /// since wakes it); otherwise the inbox is read.
    async fn read_unread(
        &self,
        pass: &mut Pass<'_>,
        from: u64,
        record: &CursorRecord,
    ) -> Result<(Unread, bool), FanoutError> {
        Ok(match pass.woken.take() {
            Some(notice) if notice.message.seq > from && notice.last_on_goal <= from => {
                let messages = vec![notice.message.clone()];
                (Unread { messages, total: 1 }, true)
            }
            _ if pass.newest.is_some_and(|newest| newest <= from) => {
                let messages = Vec::new();
                (Unread { messages, total: 0 }, false)
            }
            // Stored a moment before this fetch came, and all that is unread: handed out
            // without reading it back, but recorded before the reply as any fetch not woken
            // by its notice is. Only to a reader that has read this goal before (a goal closed
            // and opened again starts at 0, and a message kept from before its close was
            // purged with it) and only a message addressed to the reader.
            _ if let Some(lately) = pass.stored_lately.take().filter(|lately| {
                lately.message.seq > from
                    && lately.last_on_goal <= from
                    && record.cursor > 0
                    && fetched(&lately.message)
                        .is_some_and(|m| m.message.to_agent_id == *pass.caller)
            }) =>
            {
                let messages = vec![lately.message.clone()];
                (Unread { messages, total: 1 }, false)
            }
            _ => (self.store.unread(&pass.goal, from, pass.max).await?, false),
        })
    }

    /// Dead-letters the oldest unread message when it is due (handed out the most times
    /// allowed, or undecodable) and this fetch would hand it out; true when the pass must read
    /// again from the moved cursor. Decided on the leader's cursor, so a lagging replica's
    /// cursor never letters a message that was acknowledged meanwhile.
    async fn letter_head(
        &self,
        pass: &mut Pass<'_>,
        record: &CursorRecord,
        from: u64,
        unread: &Unread,
    ) -> Result<bool, FanoutError> {
        let Some(head) = unread.messages.first() else {
            return Ok(false);
        };
        let undecodable = fetched(head).is_none();
        if from != record.cursor
            || pass.request.peek
            || !(record.head_exhausted(head.seq) || undecodable)
        {
            return Ok(false);
        }
        let (caller, goal) = (pass.caller, pass.goal);
        let (mut leader, leader_revision) = self.owned_from_leader(caller, &goal).await?;
        if !(leader.cursor < head.seq && (undecodable || leader.head_exhausted(head.seq))) {
            // The replica read lags the leader: read again shortly.
            self.conflict(&goal, &mut pass.attempts).await?;
            return Ok(true);
        }
        let reason = if undecodable {
            "undecodable: not an InboxMessage".to_owned()
        } else {
            format!("handed out {INBOX_MAX_DELIVER} times without being acknowledged (the limit)")
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
            .cas(&goal, &leader, leader_revision, &mut pass.attempts)
            .await?
        {
            self.receipts
                .tell(caller, &goal, &reads, ReceiptState::Read)
                .await;
        }
        Ok(true)
    }

    /// Writes what the pass changed and decides what comes next. A held fetch with nothing to
    /// hand out that only moved the cursor waits first: the write then goes with the hand-out a
    /// notice brings (one write per message, not two) — not with receipts due, which are told
    /// once the cursor is written. A held fetch woken by a message stored a moment ago and
    /// addressed to its reader answers first and records the hand-out after (docs/protocol.md
    /// §7, "Hand-out is at least once"); every other change is written before the reply, as the
    /// cap's protection of what a fetch hands out needs, with its receipts stored before the
    /// reply too (so the reader's ack, and its `read`, comes after). A pass that writes nothing
    /// shows mail addressed to anyone else only once the leader's cursor says the goal is the
    /// caller's.
    async fn settle(&self, pass: &mut Pass<'_>, mut out: HandOut) -> Result<Step, FanoutError> {
        let holds_on = pass.waiter.is_some()
            && out.messages.is_empty()
            && out.expired.is_none()
            && out.reads.is_empty()
            && !pass.acked_many
            && Instant::now() < pass.deadline
            && !self.stopping.is_cancelled();
        // Only messages addressed to the caller go out before the cursor's compare-and-set has
        // confirmed the goal is still its own: a held fetch can outlive its goal, and a goal
        // closed and opened again by another agent meanwhile holds that agent's mail.
        let addressed_to_caller = out
            .messages
            .iter()
            .all(|fetched| fetched.message.to_agent_id == *pass.caller);
        let answer_first = out.from_notice
            && !out.messages.is_empty()
            && out.expired.is_none()
            && !pass.request.peek
            && addressed_to_caller;
        if out.changed && holds_on {
            pass.unwritten = true;
        } else if out.changed && answer_first {
            return Ok(self.answer_first(pass, out));
        } else if out.changed {
            let goal = pass.goal;
            match self
                .store
                .put_cursor(&goal, &out.record, out.revision)
                .await?
            {
                Cas::Done(written) => out.revision = written,
                Cas::Conflict => {
                    self.conflict(&goal, &mut pass.attempts).await?;
                    return Ok(Step::Again);
                }
            }
            let receipts = &self.receipts;
            receipts
                .tell(pass.caller, &goal, &out.delivered, ReceiptState::Delivered)
                .await;
            receipts
                .tell(pass.caller, &goal, &out.reads, ReceiptState::Read)
                .await;
        } else if out.from_recent {
            return Ok(Step::Again);
        }
        // A pass that writes nothing (a peek) has no compare-and-set to confirm the goal is
        // still the caller's, and its record may be a held fetch's from before a close or a
        // replica's that lags one: mail addressed to anyone else goes out only after the
        // leader says the goal is the caller's (else `not_found`).
        if !out.changed && !out.messages.is_empty() && !addressed_to_caller {
            self.owned_from_leader(pass.caller, &pass.goal).await?;
        }
        let done = pass.waiter.is_none()
            || !out.messages.is_empty()
            || out.expired.is_some()
            || Instant::now() >= pass.deadline
            || self.stopping.is_cancelled();
        if done {
            return Ok(Step::Reply(reply(
                pass.goal,
                &out.record,
                out.messages,
                &out.unread,
                out.expired,
            )));
        }
        pass.known = Some((out.record, out.revision));
        Ok(Step::Wait)
    }

    /// Answers with the hand-out and records it just after, in the background (by
    /// compare-and-set; on a lost race applied again to the leader's record).
    fn answer_first(&self, pass: &Pass<'_>, out: HandOut) -> Step {
        let handed = HandedOut {
            goal: pass.goal,
            through: pass.request.ack_through,
            first: out.messages.first().map_or(0, |m| m.seq),
            last: out.messages.last().map_or(0, |m| m.seq),
            past_head: out.past_head,
            messages: out.messages.clone(),
        };
        let later = Bookkeeping {
            store: self.store.clone(),
            receipts: self.receipts.clone(),
            caller: pass.caller.clone(),
        };
        let (record, revision) = (out.record.clone(), out.revision);
        tokio::spawn(later.write(handed, record, revision, out.delivered, out.reads));
        Step::Reply(reply(
            pass.goal,
            &out.record,
            out.messages,
            &out.unread,
            out.expired,
        ))
    }

    /// Nothing unread: waits for a store notice, the deadline, the next re-read (a few quick
    /// ones right after a notice, then the safety one) or the service stopping. Only the reads
    /// before the first wait trust the notices; every later one reads the stream.
    async fn wait_for_notice(&self, pass: &mut Pass<'_>) {
        let Some(waiting) = pass.waiter.as_mut() else {
            return;
        };
        let now = Instant::now();
        let pause = AFTER_WAKE.get(pass.quick).copied().unwrap_or(SAFETY_REREAD);
        pass.quick = pass.quick.saturating_add(1);
        pass.newest = None;
        pass.stored_lately = None;
        tokio::select! {
            notice = waiting.stored() => {
                pass.quick = 0;
                pass.woken = notice;
            }
            () = tokio::time::sleep_until(pass.deadline.min(now + pause)) => {}
            () = self.stopping.cancelled() => {}
        }
    }
}
