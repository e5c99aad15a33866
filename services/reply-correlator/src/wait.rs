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
    /// The call was answered and its record keeps the answer (it went to another attempt).
    Answered(CallAnswer),
}

/// How soon a retry joined to an earlier attempt first reads the call's record for an answer
/// handed to that attempt (the answer goes to one attempt: in process, or to the first
/// replica that takes it over NATS); the gap doubles up to [`RECHECK_MAX`].
const RECHECK_FIRST: Duration = Duration::from_millis(250);

/// The longest gap between a joined attempt's reads of the call's record.
const RECHECK_MAX: Duration = Duration::from_secs(2);

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
        let mut recheck_gap = RECHECK_FIRST;
        let mut recheck_at = tokio::time::Instant::now() + recheck_gap;
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
                () = tokio::time::sleep_until(recheck_at), if joined && recheck_at < until => Woke::Recheck,
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
                Woke::Recheck => {
                    recheck_gap = (recheck_gap * 2).min(RECHECK_MAX);
                    recheck_at = tokio::time::Instant::now() + recheck_gap;
                    match self.kept_answer_of(call).await? {
                        Some(answer) => (answer, Taken::Nats(None)),
                        None => continue,
                    }
                }
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
                            return Err(CorrelatorError::RequestDropped {
                                callee: call.callee.clone(),
                                correlation_id: call.correlation_id,
                                reason,
                            });
                        }
                    }
                }
                Woke::Deadline if grace_until.is_some() => break,
                Woke::Deadline => match self.at_deadline(&stored, indexed).await? {
                    AtDeadline::Over => break,
                    AtDeadline::Answered(answer) => (answer, Taken::Nats(None)),
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
        Ok(match current.map(|s| s.call) {
            Some(PendingCall {
                state: CallState::Answered,
                answered_via: Some(AnswerRoute::Caller),
                answer: Some(answer),
                ..
            }) => AtDeadline::Answered(answer),
            Some(PendingCall {
                state: CallState::Answered,
                ..
            }) => AtDeadline::Grace,
            _ => AtDeadline::Over,
        })
    }

    /// The answer the call's record keeps, once answered (a waiting call's answer is kept on
    /// its record for a retry: protocol §9).
    async fn kept_answer_of(
        &self,
        call: &PendingCall,
    ) -> Result<Option<CallAnswer>, CorrelatorError> {
        Ok(self
            .store
            .find(&call.correlation_id)
            .await?
            .filter(|s| {
                s.call.state == CallState::Answered
                    && s.call.answered_via == Some(AnswerRoute::Caller)
            })
            .and_then(|s| s.call.answer))
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
