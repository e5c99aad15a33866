//! The call rules: making a call and waiting for its answer (answering it is `answers.rs`).
//!
//! A call is recorded (open, with its deadline) *before* its request is delivered, so an
//! answer can never arrive for a call nobody knows. The request itself goes through
//! inbox-fanout (`agent.send.<caller>`), so calls pass the same gates, ACL and per-goal
//! fan-out as any message. A waiting call is held by the replica that took it, listening on
//! an internal per-call subject; whichever replica takes the reply claims the call with
//! compare-and-set and hands the answer to that listener, or — when no listener acknowledges
//! (parked call, or the waiting replica is gone) — into the caller goal's inbox as
//! `kind: response`. When the replica that claims the call is the one holding the caller, it
//! hands the answer over in process, without the round trip through NATS.

use std::sync::PoisonError;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use serde::Serialize;
use switchboard_proto::call::{
    CallAnswer, CallDropped, CallEventKind, CallParked, CallPart, CallRequest, CallState,
    PendingCall, clamp_timeout, derive_chain,
};
use switchboard_proto::send::{DeliveryReport, SendRequest, Target, check_gates, unknown_agent};
use switchboard_proto::{AgentId, ErrorKind, GoalId, MessageKind, new_id, subject, timestamp};
use switchboard_request::request::route_by_skill;
use tokio::sync::mpsc;

use crate::correlator::{Correlator, HANDOVER_TIMEOUT, Held, LocalAnswer, Taken, WaitingGuard};
use crate::error::CorrelatorError;
use crate::parts::PartForwarder;
use crate::store::{CallEntry, Created, INDEX_WAITING_AFTER};

/// A retried call (named by its `correlation_id`) re-delivers its request only while it is
/// younger than this: half the streams' duplicate window, so the copy is stored once.
const REDELIVER_WITHIN: time::Duration = time::Duration::seconds(60);

/// How long a delivery to the fan-out may take.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);

/// The reply to a call: the answer (wait) or where it will land (park).
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum CallOutcome {
    /// The callee's answer.
    Answered(CallAnswer),
    /// Parked: the answer comes to the caller goal's inbox.
    Parked(CallParked),
}

fn duration_ms(d: time::Duration) -> u64 {
    u64::try_from(d.whole_milliseconds()).unwrap_or(0)
}

impl Correlator {
    /// talk_to_agent / call_agent. Refusals by a rule are published as `refused` events.
    /// A waiting call that asked for `stream` gets its answer's parts on `reply` (the
    /// request's reply subject) before the final answer.
    pub async fn call(
        &self,
        caller: &AgentId,
        request: CallRequest,
        reply: Option<async_nats::Subject>,
    ) -> Result<CallOutcome, CorrelatorError> {
        let to = request.to.clone();
        let result = self.make_call(caller, request, reply).await;
        if let Err(err) = &result
            && matches!(
                err.kind(),
                ErrorKind::Cycle
                    | ErrorKind::DepthExceeded
                    | ErrorKind::TooManyCalls
                    | ErrorKind::Unreachable
            )
            && let Some(callee) = to.as_deref().and_then(|to| AgentId::parse(to.trim()).ok())
        {
            let now = timestamp::now();
            let refused = PendingCall {
                correlation_id: new_id(),
                caller: caller.clone(),
                caller_goal: GoalId::new(),
                callee,
                chain: Vec::new(),
                parent: None,
                request_id: new_id(),
                wait: false,
                state: CallState::Expired,
                answered_via: None,
                claimed_at: None,
                created_at: now,
                deadline: now,
                stream: false,
                streamed: Vec::new(),
                answer: None,
                traceparent: None,
            };
            let reason = err.to_string();
            self.emit(CallEventKind::Refused, &refused, Some(&reason))
                .await;
        }
        result
    }

    async fn make_call(
        &self,
        caller: &AgentId,
        request: CallRequest,
        reply: Option<async_nats::Subject>,
    ) -> Result<CallOutcome, CorrelatorError> {
        // The send gates, reused: `to`, not self, non-empty message, size.
        let probe = SendRequest {
            to: request.to.clone(),
            message: request.message.clone(),
            from_agent_id: request.from_agent_id.clone(),
            from_goal_id: request.from_goal_id,
            receipt: request.receipt,
            ..SendRequest::default()
        };
        let (target, body) = check_gates(caller, &probe).map_err(CorrelatorError::Gate)?;
        let callee = match target {
            Target::Broadcast => return Err(CorrelatorError::Broadcast),
            Target::Peer(to) => match AgentId::parse(&to) {
                Ok(callee) => callee,
                Err(_) => return Err(CorrelatorError::Unreachable(unknown_agent(&to))),
            },
            // One agent with the skill, picked by the directory; the call is then an ordinary
            // call to it (its chain, cycle and depth rules included).
            Target::Skill(skill) => route_by_skill(&self.client, caller, &skill, false)
                .await
                .map_err(CorrelatorError::Unreachable)?,
        };
        // The goal the answer (or a timeout notice) goes to must be the caller's own: a call
        // naming another agent's goal would deliver into that goal's inbox.
        if let Some(goal) = request.from_goal_id
            && !self.send.view.owns_goal(caller, &goal).await?
        {
            return Err(CorrelatorError::NotYourGoal {
                goal,
                caller: caller.clone(),
            });
        }
        let timeout_ms = clamp_timeout(
            request.timeout_ms,
            self.config.default_timeout_ms,
            self.config.max_timeout_ms,
        );
        let parent = match request.parent_correlation_id {
            None => None,
            Some(parent_id) => {
                let Some(parent) = self.store.find(&parent_id).await? else {
                    return Err(CorrelatorError::UnknownParent(parent_id));
                };
                Some(parent.call)
            }
        };
        // Asking back (a question to the agent whose call this one serves, `in_reply_to` its
        // request) is no cycle; it keeps the depth rule and the parent's deadline.
        let chain = derive_chain(
            caller,
            &callee,
            parent.as_ref(),
            self.config.depth_limit,
            request.in_reply_to,
        )
        .map_err(CorrelatorError::Chain)?;

        let now = timestamp::now();
        // `timeout_ms` is clamped to `max_timeout_ms` above; still never an overflow.
        let own = timestamp::checked_after(now, timeout_ms).unwrap_or(now);
        // A call made while serving one never outlives it: its deadline is the earlier of its
        // own and the parent's, and one whose parent has run out is not made.
        let (deadline, clamped) = match &parent {
            Some(parent) if parent.deadline < own => (parent.deadline, true),
            _ => (own, false),
        };
        if deadline <= now {
            return Err(CorrelatorError::ParentExpired {
                parent: request.parent_correlation_id.unwrap_or_default(),
                deadline,
            });
        }
        let timeout_ms = if clamped {
            duration_ms(deadline - now)
        } else {
            timeout_ms
        };
        let correlation_id = request.correlation_id.unwrap_or_else(new_id);
        let fresh = PendingCall {
            correlation_id,
            caller: caller.clone(),
            caller_goal: request.from_goal_id.unwrap_or_default(),
            callee: callee.clone(),
            chain: chain.clone(),
            parent: request.parent_correlation_id,
            request_id: new_id(),
            wait: request.wait.unwrap_or(true),
            state: CallState::Open,
            answered_via: None,
            claimed_at: None,
            created_at: now,
            deadline,
            stream: request.stream && request.wait.unwrap_or(true),
            streamed: Vec::new(),
            answer: None,
            traceparent: switchboard_runtime::telemetry::current_traceparent(),
        };
        // A waiting call is counted by the replica that holds it, in memory; a parked one in
        // the open-call index, once it is indexed (one count, not one before and one after): a
        // call past the cap, or racing others past it, steps back.
        let too_many = || CorrelatorError::TooManyCalls {
            caller: caller.clone(),
            cap: self.config.max_open_calls,
        };
        let _slot = match fresh.wait {
            true => Some(self.waiting_slot(caller).ok_or_else(too_many)?),
            false => None,
        };
        // A call the caller named may exist: then this request is a retry of it (or names
        // another caller's call, which is refused) and joins it instead of opening another.
        let stored = match self.store.create(&fresh).await? {
            Created::New(stored, open) => {
                if open > self.config.max_open_calls {
                    self.store.forget(&stored).await?;
                    return Err(too_many());
                }
                stored
            }
            Created::Exists(existing) => existing,
        };
        let joined = stored.call.request_id != fresh.request_id;
        if joined {
            if stored.call.caller != *caller {
                return Err(CorrelatorError::CallIdTaken(correlation_id));
            }
            match stored.call.state {
                // Its first attempt may have died between the record and the index.
                CallState::Open => self.store.reindex(&stored.call).await?,
                // Answered already: the answer is on the record (kept for this), unless it
                // went to the caller goal's inbox (a parked call, or no replica took it).
                CallState::Answered => {
                    return match (&stored.call.answer, stored.call.wait) {
                        (Some(answer), true) => Ok(CallOutcome::Answered(answer.clone())),
                        _ => Err(CorrelatorError::AnsweredToInbox(correlation_id)),
                    };
                }
                CallState::Expired => {
                    return Err(CorrelatorError::Timeout {
                        callee: stored.call.callee.clone(),
                        timeout_ms,
                        correlation_id,
                        clamped,
                    });
                }
            }
        }
        let record = stored.call.clone();
        // A waiting call listens for its answer before the request can be answered: on its
        // NATS subject (another replica claims it) and in process (this one does).
        let mut answers = if record.wait {
            Some(
                self.client
                    .subscribe(subject::call_answer(&correlation_id))
                    .await
                    .map_err(|err| CorrelatorError::ListenForAnswer(err.into()))?,
            )
        } else {
            None
        };
        let (local_tx, mut local) = mpsc::channel(1);
        let _waiting = record.wait.then(|| {
            self.waiting
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(
                    correlation_id,
                    Held {
                        answer_to: local_tx,
                        stored: stored.clone(),
                    },
                );
            WaitingGuard {
                waiting: &self.waiting,
                id: correlation_id,
            }
        });

        // A retry delivers the request again with the same message id, so it reaches the callee
        // even if the first attempt died before delivering it — but only while the stream's
        // duplicate window (120 s) still stores it once: a call older than
        // [`REDELIVER_WITHIN`] was delivered long ago (or its first attempt failed and
        // forgot it), and a copy then would be a second request.
        let redeliver = !joined || timestamp::now() - record.created_at < REDELIVER_WITHIN;
        let report = if redeliver {
            match self.deliver_request(&record, body, &request).await {
                Ok(report) => report,
                Err(err) if !joined => {
                    self.store.forget(&stored).await?;
                    return Err(err);
                }
                // The call exists and may have reached the callee: keep waiting for it.
                Err(err) => {
                    tracing::debug!(%correlation_id, error = %err, "a retried call's request was not delivered again");
                    DeliveryReport::default()
                }
            }
        } else {
            DeliveryReport::default()
        };
        if report.delivered_to.is_empty() && !joined {
            self.store.forget(&stored).await?;
            return Err(CorrelatorError::Unreachable(
                report.unreachable_reasons.join("; "),
            ));
        }
        tracing::info!(%correlation_id, caller = %caller, callee = %callee, depth = chain.len(), timeout_ms, wait = record.wait, "call opened");
        if !joined {
            crate::correlator::count_call("opened");
        }
        // No `opened` event: the request message, stored in the callee's inbox with the
        // call's `correlation_id`, is the trail's record of the call opening (protocol §13,
        // item 48).
        let Some(answers) = answers.as_mut() else {
            return Ok(CallOutcome::Parked(CallParked {
                correlation_id,
                delivered_to: report.delivered_to,
                deadline: record.deadline,
                clamped,
            }));
        };
        let forward = PartForwarder::new(self.client.clone(), reply.filter(|_| record.stream));
        // A joined call was indexed again above; a new waiting call only if it lasts.
        match self
            .wait_for_answer(stored, (answers, &mut local), timeout_ms, forward, joined)
            .await
        {
            Ok(CallOutcome::Answered(mut answer)) => {
                answer.clamped = clamped;
                Ok(CallOutcome::Answered(answer))
            }
            Err(CorrelatorError::Timeout {
                callee,
                timeout_ms,
                correlation_id,
                ..
            }) => Err(CorrelatorError::Timeout {
                callee,
                timeout_ms,
                correlation_id,
                clamped,
            }),
            other => other,
        }
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

    async fn deliver_request(
        &self,
        record: &PendingCall,
        body: &str,
        request: &CallRequest,
    ) -> Result<DeliveryReport, CorrelatorError> {
        let mut metadata = request.metadata.clone();
        metadata.insert(
            "call_chain".to_owned(),
            serde_json::to_value(&record.chain).unwrap_or_default(),
        );
        metadata.insert(
            "call_deadline".to_owned(),
            timestamp::format(record.deadline).into(),
        );
        let send = SendRequest {
            to: Some(record.callee.to_string()),
            message: Some(body.to_owned()),
            id: Some(record.request_id),
            correlation_id: Some(record.correlation_id),
            // The goal the caller named (checked above); without one, `caller_goal` is a
            // fresh id no goal holds, and the fan-out would rightly refuse it.
            from_goal_id: request.from_goal_id,
            kind: Some(MessageKind::Request),
            expects_reply: true,
            in_reply_to: request.in_reply_to,
            parts: request.parts.clone(),
            metadata,
            receipt: request.receipt,
            ..SendRequest::default()
        };
        // In process, through the fan-out's send rules: no request to the fan-out and back.
        match tokio::time::timeout(
            DELIVERY_TIMEOUT,
            self.send.fanout.send_in_process(&record.caller, send),
        )
        .await
        {
            Ok(Ok(report)) => Ok(report),
            Ok(Err(reply)) => Err(CorrelatorError::FanoutRefused(reply)),
            Err(_) => Err(CorrelatorError::DeliverRequest(
                format!(
                    "delivering the request took more than {} s",
                    DELIVERY_TIMEOUT.as_secs()
                )
                .into(),
            )),
        }
    }

    async fn wait_for_answer(
        &self,
        stored: CallEntry,
        (answers, local): (
            &mut async_nats::Subscriber,
            &mut mpsc::Receiver<LocalAnswer>,
        ),
        timeout_ms: u64,
        mut forward: PartForwarder,
        mut indexed: bool,
    ) -> Result<CallOutcome, CorrelatorError> {
        let call = &stored.call;
        let left = call.deadline - timestamp::now();
        let deadline = tokio::time::Instant::now()
            + Duration::from_millis(duration_ms(left.max(time::Duration::ZERO)));
        // When this call, still waiting, enters the open-call index.
        let index_at = tokio::time::Instant::now()
            + Duration::from_millis(duration_ms(
                (call.created_at + INDEX_WAITING_AFTER - timestamp::now())
                    .max(time::Duration::ZERO),
            ));
        let mut grace_until = None;
        loop {
            let until = grace_until.unwrap_or(deadline);
            let (answer, taken) = tokio::select! {
                biased;
                () = tokio::time::sleep_until(index_at), if !indexed => {
                    // In the background: the wait keeps taking answers meanwhile (a replier
                    // waits only so long before it falls back to the inbox).
                    indexed = true;
                    self.index_later(call);
                    continue;
                }
                Some(handed) = local.recv() => (handed.answer, Taken::Here(handed.taken)),
                message = answers.next() => {
                    let Some(message) = message else {
                        // The subscription ended (the connection closed): the caller is
                        // answered `timeout` below and will not retry, so the call must be
                        // where the sweep finds it.
                        if !indexed {
                            self.index_later(call);
                        }
                        break;
                    };
                    // The request will never be read (a full inbox removed it, its reader
                    // rejected it or it went to the dead letters): end the call now.
                    if let Ok(dropped) = serde_json::from_slice::<CallDropped>(&message.payload) {
                        if dropped.correlation_id != call.correlation_id {
                            continue;
                        }
                        if self.store.end(&stored, CallState::Expired, indexed).await?.is_some() {
                            self.on_expired(call).await;
                            let _ = answers.unsubscribe().await;
                            return Err(CorrelatorError::RequestDropped {
                                callee: call.callee.clone(),
                                correlation_id: call.correlation_id,
                                reason: dropped.dropped,
                            });
                        }
                        // Answered meanwhile (the hand-over is on its way) or expired.
                        continue;
                    }
                    // A part of a streamed answer (from this call's callee only).
                    if let Ok(part) = serde_json::from_slice::<CallPart>(&message.payload) {
                        if part.correlation_id == call.correlation_id
                            && part.from_agent_id == call.callee
                        {
                            forward.take(part).await;
                        }
                        continue;
                    }
                    match serde_json::from_slice::<CallAnswer>(&message.payload) {
                        // Only services publish here, but an answer is taken only if it is
                        // this call's and comes from its callee: nothing else can end a call.
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
                            continue;
                        }
                        Ok(answer) => (answer, Taken::Nats(message.reply)),
                        Err(err) => {
                            tracing::warn!(error = %err, "undecodable answer hand-over");
                            continue;
                        }
                    }
                }
                () = tokio::time::sleep_until(until) => {
                    if grace_until.is_some() {
                        break;
                    }
                    match self.store.end(&stored, CallState::Expired, indexed).await? {
                        // Its one ending in the trail (`expired`), then the caller's timeout.
                        Some(_) => {
                            self.on_expired(call).await;
                            break;
                        }
                        None => {
                            // Changed meanwhile: answered just now (its hand-over is on the
                            // way) or expired by a sweeper.
                            let current = self.store.find(&call.correlation_id).await?;
                            if current.is_some_and(|s| s.call.state == CallState::Answered) {
                                grace_until = Some(tokio::time::Instant::now() + HANDOVER_TIMEOUT);
                                continue;
                            }
                            break;
                        }
                    }
                }
            };
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
            // Taken first (the answering replica waits only so long before it falls back to
            // the inbox), then every part goes to the caller before the final answer. A call
            // this replica indexed leaves the index off the answer's path.
            if indexed {
                let store = self.store.clone();
                let id = call.correlation_id;
                self.background
                    .spawn(async move { store.unindex(&id).await });
            }
            forward.complete(&self.store, call, answer.streamed).await;
            return Ok(CallOutcome::Answered(answer));
        }
        let _ = answers.unsubscribe().await;
        Err(CorrelatorError::Timeout {
            callee: call.callee.clone(),
            timeout_ms,
            correlation_id: call.correlation_id,
            clamped: false,
        })
    }
}
