//! A waiting call's wait (docs/protocol.md §9, "Waiting for the answer"): the answer handed
//! over in process by this replica or over NATS by another, the parts of a streamed answer
//! forwarded as they come, the request dropped unread (the call ends at once), the deadline
//! (the call expires, or an answer claimed just then gets a moment to arrive), and a call that
//! waits long entering the open-call index so a sweeper finds it if this replica dies.

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use switchboard_proto::call::{
    AnswerRoute, CallAnswer, CallDropped, CallPart, CallState, PendingCall,
};
use switchboard_proto::timestamp;
use tokio::sync::mpsc;

use crate::calls::CallOutcome;
use crate::correlator::{Correlator, HANDOVER_TIMEOUT, LocalAnswer, Taken};
use crate::error::CorrelatorError;
use crate::parts::PartForwarder;
use crate::store::{CallEntry, INDEX_WAITING_AFTER};

/// What woke a waiting call.
enum Woke {
    /// It has waited long enough to enter the open-call index.
    Index,
    /// This replica claimed its answer.
    Here(LocalAnswer),
    /// A message on its hand-over subject (`None`: the subscription ended).
    Nats(Option<async_nats::Message>),
    /// Time for a joined attempt to read the call's record again.
    Recheck,
    /// Its deadline (or the grace after it) passed.
    Deadline,
}

/// What a message on the hand-over subject means for the call.
enum Handover {
    /// Nothing for this call (another call's, a part, undecodable): wait on.
    Next,
    /// Its answer, from its callee.
    Answer(CallAnswer),
    /// Its request will never be read; the call has ended.
    Dropped(String),
}

/// What the deadline means when it passes.
enum AtDeadline {
    /// The call has expired (or a sweeper ended it): the caller is answered `timeout`.
    Over,
    /// The call was answered just now: its hand-over gets [`HANDOVER_TIMEOUT`] to arrive.
    Grace,
}

/// How soon a retry joined to an earlier attempt first reads the call's record for an answer
/// handed to that attempt (the answer goes to one attempt: in process, or to the first
/// replica that takes it over NATS); the gap doubles up to [`RECHECK_MAX`].
const RECHECK_FIRST: Duration = Duration::from_millis(250);

/// The longest gap between a joined attempt's reads of the call's record.
const RECHECK_MAX: Duration = Duration::from_secs(2);

/// How long after its claim a call's recorded route to a waiting caller is final: the
/// claiming replica's hand-over in process (twice at most), over NATS and its fall-back into
/// the inbox all end within it — three [`HANDOVER_TIMEOUT`]s and the inbox publish's time.
const RECHECK_SETTLED: Duration = Duration::from_secs(3 * HANDOVER_TIMEOUT.as_secs() + 4);

/// When a joined attempt next reads its call's record ([`RECHECK_FIRST`], doubling up to
/// [`RECHECK_MAX`]).
struct Recheck {
    gap: Duration,
    at: tokio::time::Instant,
}

impl Recheck {
    fn new() -> Self {
        Self {
            gap: RECHECK_FIRST,
            at: tokio::time::Instant::now() + RECHECK_FIRST,
        }
    }

    /// The next read, after a gap twice the last.
    fn later(&mut self) {
        self.gap = (self.gap * 2).min(RECHECK_MAX);
        self.at = tokio::time::Instant::now() + self.gap;
    }
}

/// The call ended unanswered: its request will never be read.
fn dropped(call: &PendingCall, reason: String) -> CorrelatorError {
    CorrelatorError::RequestDropped {
        callee: call.callee.clone(),
        correlation_id: call.correlation_id,
        reason,
    }
}

/// Milliseconds in `d`, none when it is negative.
fn millis(d: time::Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.whole_milliseconds()).unwrap_or(0))
}

impl Correlator {
    /// Waits for the call's answer until its deadline; see the module's description.
    pub(crate) async fn wait_for_answer(
        &self,
        stored: CallEntry,
        (answers, local): (
            &mut async_nats::Subscriber,
            &mut mpsc::Receiver<LocalAnswer>,
        ),
        timeout_ms: u64,
        mut forward: PartForwarder,
        joined: bool,
    ) -> Result<CallOutcome, CorrelatorError> {
        let call = &stored.call;
        // A joined call was indexed again when it joined; a new waiting call only if it lasts.
        let mut indexed = joined;
        let mut recheck = Recheck::new();
        let start = tokio::time::Instant::now();
        let deadline = start + millis(call.deadline - timestamp::now());
        // When this call, still waiting, enters the open-call index.
        let index_at = start + millis(call.created_at + INDEX_WAITING_AFTER - timestamp::now());
        let mut grace_until = None;
        loop {
            let until = grace_until.unwrap_or(deadline);
            let woke = tokio::select! {
                biased;
                () = tokio::time::sleep_until(index_at), if !indexed => Woke::Index,
                Some(handed) = local.recv() => Woke::Here(handed),
                message = answers.next() => Woke::Nats(message),
                () = tokio::time::sleep_until(recheck.at), if joined && recheck.at < until => Woke::Recheck,
                () = tokio::time::sleep_until(until) => Woke::Deadline,
            };
            let (answer, taken) = match woke {
                Woke::Index => {
                    // In the background: the wait keeps taking answers meanwhile (a replier
                    // waits only so long before it falls back to the inbox).
                    indexed = true;
                    self.index_later(call);
                    continue;
                }
                Woke::Recheck => match self.recheck(call, local, &mut recheck).await {
                    Some(found) => found,
                    None => continue,
                },
                Woke::Here(handed) => (handed.answer, Taken::Here(handed.taken)),
                // The subscription ended (the connection closed): the caller is answered
                // `timeout` below and will not retry, so the call must be where the sweep
                // finds it.
                Woke::Nats(None) => {
                    if !indexed {
                        self.index_later(call);
                    }
                    break;
                }
                Woke::Nats(Some(message)) => {
                    match self
                        .read_handover(&stored, &message, &mut forward, indexed)
                        .await?
                    {
                        Handover::Next => continue,
                        Handover::Answer(answer) => (answer, Taken::Nats(message.reply)),
                        Handover::Dropped(reason) => {
                            let _ = answers.unsubscribe().await;
                            return Err(dropped(call, reason));
                        }
                    }
                }
                Woke::Deadline if grace_until.is_some() => break,
                Woke::Deadline => match self.at_deadline(&stored, indexed).await? {
                    AtDeadline::Over => break,
                    AtDeadline::Grace => {
                        grace_until = Some(tokio::time::Instant::now() + HANDOVER_TIMEOUT);
                        continue;
                    }
                },
            };
            return Ok(self.take(call, answer, taken, indexed, forward).await);
        }
        let _ = answers.unsubscribe().await;
        Err(CorrelatorError::Timeout {
            callee: call.callee.clone(),
            timeout_ms,
            correlation_id: call.correlation_id,
            clamped: false,
        })
    }

    /// Reads one message on the call's hand-over subject. Only services publish there, but
    /// nothing ends a call unless it is this call's and, for an answer or a part, comes from
    /// its callee.
    async fn read_handover(
        &self,
        stored: &CallEntry,
        message: &async_nats::Message,
        forward: &mut PartForwarder,
        indexed: bool,
    ) -> Result<Handover, CorrelatorError> {
        let call = &stored.call;
        // The request will never be read (a full inbox removed it, its reader rejected it or
        // it went to the dead letters): end the call now.
        if let Ok(dropped) = serde_json::from_slice::<CallDropped>(&message.payload) {
            if dropped.correlation_id != call.correlation_id {
                return Ok(Handover::Next);
            }
            if self.expire(stored, indexed).await? {
                return Ok(Handover::Dropped(dropped.dropped));
            }
            // Answered meanwhile (the hand-over is on its way) or expired.
            return Ok(Handover::Next);
        }
        // A part of a streamed answer.
        if let Ok(part) = serde_json::from_slice::<CallPart>(&message.payload) {
            if part.correlation_id == call.correlation_id && part.from_agent_id == call.callee {
                forward.take(part).await;
            }
            return Ok(Handover::Next);
        }
        match serde_json::from_slice::<CallAnswer>(&message.payload) {
            Ok(answer)
                if answer.correlation_id != call.correlation_id
                    || answer.from_agent_id != call.callee =>
            {
                tracing::warn!(
                    correlation_id = %call.correlation_id,
                    got = %answer.correlation_id,
                    from = %answer.from_agent_id,
                    "an answer hand-over for another call or from another agent; ignored"
                );
                Ok(Handover::Next)
            }
            Ok(answer) => Ok(Handover::Answer(answer)),
            Err(err) => {
                tracing::warn!(error = %err, "undecodable answer hand-over");
                Ok(Handover::Next)
            }
        }
    }

    /// The deadline passed: the call expires here, with its one ending in the trail
    /// (`expired`) — unless it changed meanwhile: answered just now (its hand-over is on the
    /// way) or expired by a sweeper.
    async fn at_deadline(
        &self,
        stored: &CallEntry,
        indexed: bool,
    ) -> Result<AtDeadline, CorrelatorError> {
        let call = &stored.call;
        if self.expire(stored, indexed).await? {
            return Ok(AtDeadline::Over);
        }
        let current = self.store.find(&call.correlation_id).await?;
        Ok(
            match current.is_some_and(|s| s.call.state == CallState::Answered) {
                true => AtDeadline::Grace,
                false => AtDeadline::Over,
            },
        )
    }

    /// A joined attempt's look at its call again: an answer handed over in process meanwhile,
    /// taken as such, or the one its record keeps ([`Self::kept_answer_of`]).
    async fn recheck(
        &self,
        call: &PendingCall,
        local: &mut mpsc::Receiver<LocalAnswer>,
        recheck: &mut Recheck,
    ) -> Option<(CallAnswer, Taken)> {
        recheck.later();
        if let Ok(handed) = local.try_recv() {
            return Some((handed.answer, Taken::Here(handed.taken)));
        }
        let answer = self.kept_answer_of(call).await?;
        Some((answer, Taken::Nats(None)))
    }

    /// The answer the call's record keeps for a joined retry, once it was handed to a waiting
    /// caller (another attempt) long enough ago that the hand-over is settled: the replica that
    /// claimed it records the caller's route before it hands the answer over, and records the
    /// inbox instead should nobody take it ([`RECHECK_SETTLED`] covers every step of that). A
    /// read that fails is no matter: the next one comes.
    async fn kept_answer_of(&self, call: &PendingCall) -> Option<CallAnswer> {
        let stored = match self.store.find(&call.correlation_id).await {
            Ok(stored) => stored?,
            Err(err) => {
                tracing::debug!(correlation_id = %call.correlation_id, error = %err, "a joined call's record was not read again");
                return None;
            }
        };
        let settled = stored
            .call
            .claimed_at
            .is_some_and(|claimed| millis(timestamp::now() - claimed) >= RECHECK_SETTLED);
        let handed = stored.call.state == CallState::Answered
            && stored.call.answered_via == Some(AnswerRoute::Caller);
        (settled && handed).then_some(stored.call.answer).flatten()
    }

    /// Takes the answer: tells whoever handed it over that it was taken (the answering
    /// replica waits only so long before it falls back to the inbox), takes a call this
    /// replica indexed out of the index off the answer's path, then sends every part to the
    /// caller before the final answer.
    async fn take(
        &self,
        call: &PendingCall,
        answer: CallAnswer,
        taken: Taken,
        indexed: bool,
        mut forward: PartForwarder,
    ) -> CallOutcome {
        match taken {
            Taken::Here(taken) => {
                let _ = taken.send(());
            }
            Taken::Nats(Some(reply)) => {
                let _ = self
                    .client
                    .publish(reply, Bytes::from_static(b"taken"))
                    .await;
            }
            Taken::Nats(None) => {}
        }
        if indexed {
            let store = self.store.clone();
            let id = call.correlation_id;
            self.background
                .spawn(async move { store.unindex(&id).await });
        }
        forward.complete(&self.store, call, answer.streamed).await;
        CallOutcome::Answered(answer)
    }

    /// Indexes a waiting call in the background (see [`INDEX_WAITING_AFTER`]).
    fn index_later(&self, call: &PendingCall) {
        let store = self.store.clone();
        let call = call.clone();
        self.background.spawn(async move {
            if let Err(err) = store.reindex(&call).await {
                tracing::warn!(correlation_id = %call.correlation_id, error = %err, "a long waiting call was not indexed");
            }
        });
    }
}
