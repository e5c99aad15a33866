//! call, reply and pending.
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

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::Client;
use async_nats::jetstream;
use bytes::Bytes;
use futures::StreamExt;
use serde::Serialize;
use switchboard_proto::call::{
    AnswerRoute, CallAnswer, CallEvent, CallEventKind, CallParked, CallRequest, CallState,
    PendingCall, PendingCalls, ReplyAck, ReplyRequest, clamp_timeout, derive_chain,
};
use switchboard_proto::send::{
    DeliveryReport, SendRequest, Target, check_content_fits, check_gates, unknown_agent,
};
use switchboard_proto::subject::{self, CALL_PREFIX, CALLS_PENDING_PREFIX, REPLY_PREFIX};
use switchboard_proto::{
    AgentId, ErrorKind, ErrorReply, GoalId, InboxMessage, MessageKind, new_id, timestamp,
};
use switchboard_runtime::micro::{AgentRequest, Endpoint};
use switchboard_runtime::publish::{publish_event, publish_json};
use switchboard_runtime::request::{RequestFailure, request_json};
use time::OffsetDateTime;
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use crate::config::CorrelatorConfig;
use crate::error::CorrelatorError;
use crate::store::{CallStore, Stored};

/// How long a delivery to the fan-out may take.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a replier waits for the waiting replica to take an answer.
const HANDOVER_TIMEOUT: Duration = Duration::from_secs(2);
/// Compare-and-set retries on one call.
const CAS_ATTEMPTS: usize = 8;
/// A claim younger than this is a delivery in progress, not a failed one: a second reply
/// must not deliver again.
const CLAIM_IN_PROGRESS: time::Duration = time::Duration::seconds(10);

/// The reply to a call: the answer (wait) or where it will land (park).
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum CallOutcome {
    /// The callee's answer.
    Answered(CallAnswer),
    /// Parked: the answer comes to the caller goal's inbox.
    Parked(CallParked),
}

/// An answer handed over in process, and where to say it was taken.
#[derive(Debug)]
struct LocalAnswer {
    answer: CallAnswer,
    taken: oneshot::Sender<()>,
}

/// How the replica that handed an answer over is told it was taken.
enum Taken {
    /// In process.
    Here(oneshot::Sender<()>),
    /// By replying `taken` to the hand-over request (when it asked for a reply).
    Nats(Option<async_nats::Subject>),
}

/// A waiting call this replica holds: where its answer goes, and the call as this replica
/// stored it (a reply taken here tries its claim on that revision before reading the call).
#[derive(Debug, Clone)]
struct Held {
    answer_to: mpsc::Sender<LocalAnswer>,
    stored: Stored,
}

/// The waiting calls this replica holds, by correlation id.
type Waiting = Mutex<HashMap<Uuid, Held>>;

/// Removes a waiting call from [`Correlator::waiting`] when its wait ends, however it ends.
struct WaitingGuard<'a> {
    waiting: &'a Waiting,
    id: Uuid,
}

impl Drop for WaitingGuard<'_> {
    fn drop(&mut self) {
        self.waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.id);
    }
}

/// The correlator.
#[derive(Debug)]
pub struct Correlator {
    client: Client,
    js: jetstream::Context,
    store: CallStore,
    config: CorrelatorConfig,
    waiting: Waiting,
}

fn duration_ms(d: time::Duration) -> u64 {
    u64::try_from(d.whole_milliseconds()).unwrap_or(0)
}

impl Correlator {
    /// Wires the parts together.
    pub fn new(client: Client, store: CallStore, config: CorrelatorConfig) -> Self {
        Self {
            js: jetstream::new(client.clone()),
            client,
            store,
            config,
            waiting: Waiting::default(),
        }
    }

    /// The three endpoints.
    pub fn endpoints(self: &Arc<Self>) -> Vec<Endpoint> {
        let (a, b, c) = (Arc::clone(self), Arc::clone(self), Arc::clone(self));
        vec![
            Endpoint::agent(
                "call",
                CALL_PREFIX.to_owned(),
                move |req: AgentRequest<CallRequest>| {
                    let me = Arc::clone(&a);
                    async move { me.call(&req.caller, req.body).await }
                },
            ),
            Endpoint::agent(
                "reply",
                REPLY_PREFIX.to_owned(),
                move |req: AgentRequest<ReplyRequest>| {
                    let me = Arc::clone(&b);
                    async move { me.reply(&req.caller, req.body).await }
                },
            ),
            Endpoint::agent(
                "pending",
                CALLS_PENDING_PREFIX.to_owned(),
                move |req: AgentRequest<serde::de::IgnoredAny>| {
                    let me = Arc::clone(&c);
                    async move { me.pending(&req.caller).await }
                },
            ),
        ]
    }

    /// Publishes a call event into `AGENT_EVENTS` (retried with the same id; the call's state
    /// change is already committed, so a failure is logged, not returned).
    async fn emit(&self, event: CallEventKind, call: &PendingCall, body: Option<&str>) {
        let payload = CallEvent {
            id: new_id(),
            event,
            correlation_id: call.correlation_id,
            caller: call.caller.clone(),
            callee: call.callee.clone(),
            chain: call.chain.clone(),
            at: timestamp::now(),
            body: body.map(str::to_owned),
        };
        let subject = subject::call_events(event, &call.correlation_id);
        publish_event(&self.js, &subject, &payload.id.to_string(), &payload).await;
    }

    /// talk_to_agent / call_agent. Refusals by a rule are published as `refused` events.
    pub async fn call(
        &self,
        caller: &AgentId,
        request: CallRequest,
    ) -> Result<CallOutcome, ErrorReply> {
        let to = request.to.clone();
        let result = self.make_call(caller, request).await;
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
            };
            self.emit(CallEventKind::Refused, &refused, Some(&err.error.message))
                .await;
        }
        result
    }

    async fn make_call(
        &self,
        caller: &AgentId,
        request: CallRequest,
    ) -> Result<CallOutcome, ErrorReply> {
        // The send gates, reused: `to`, not self, non-empty message, size.
        let probe = SendRequest {
            to: request.to.clone(),
            message: request.message.clone(),
            from_agent_id: request.from_agent_id.clone(),
            ..SendRequest::default()
        };
        let (target, body) = check_gates(caller, &probe)?;
        let Target::Peer(to) = target else {
            return Err(ErrorReply::new(
                ErrorKind::BadRequest,
                "a call goes to one peer; use send_to_peer with `*` to broadcast",
            ));
        };
        let Ok(callee) = AgentId::parse(&to) else {
            return Err(ErrorReply::new(ErrorKind::Unreachable, unknown_agent(&to)));
        };
        // The goal the answer (or a timeout notice) goes to must be the caller's own: a call
        // naming another agent's goal would deliver into that goal's inbox.
        if let Some(goal) = request.from_goal_id
            && !self.store.owns_goal(caller, &goal).await?
        {
            return Err(ErrorReply::new(
                ErrorKind::InvalidGoalId,
                format!("goal {goal} is not a live goal of `{caller}`"),
            ));
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
                    return Err(ErrorReply::new(
                        ErrorKind::NotFound,
                        format!("parent call {parent_id} is unknown"),
                    ));
                };
                Some(parent.call)
            }
        };
        let chain = derive_chain(caller, &callee, parent.as_ref(), self.config.depth_limit)?;

        let now = timestamp::now();
        let too_many = || {
            ErrorReply::new(
                ErrorKind::TooManyCalls,
                format!(
                    "`{caller}` already has {} open calls; answer or wait for some first",
                    self.config.max_open_calls
                ),
            )
        };
        let correlation_id = new_id();
        let record = PendingCall {
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
            // `timeout_ms` is clamped to `max_timeout_ms` above; still never an overflow.
            deadline: timestamp::checked_after(now, timeout_ms).unwrap_or(now),
        };
        // Counted once the call is indexed (one count, not one before and one after): a call
        // past the cap, or racing others past it, steps back.
        let (stored, open) = self.store.create(&record).await?;
        if open > self.config.max_open_calls {
            self.store.forget(&stored).await?;
            return Err(too_many());
        }

        // A waiting call listens for its answer before the request can be answered: on its
        // NATS subject (another replica claims it) and in process (this one does).
        let mut answers = if record.wait {
            Some(
                self.client
                    .subscribe(subject::call_answer(&correlation_id))
                    .await
                    .map_err(|err| CorrelatorError::store("listening for the answer", err))?,
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

        let report = match self.deliver_request(&record, body, &request).await {
            Ok(report) => report,
            Err(err) => {
                self.store.forget(&stored).await?;
                return Err(err);
            }
        };
        if report.delivered_to.is_empty() {
            self.store.forget(&stored).await?;
            return Err(ErrorReply::new(
                ErrorKind::Unreachable,
                report.unreachable_reasons.join("; "),
            ));
        }
        tracing::info!(%correlation_id, caller = %caller, callee = %callee, depth = chain.len(), timeout_ms, wait = record.wait, "call opened");
        let opened = self.emit(CallEventKind::Opened, &record, None);
        let Some(answers) = answers.as_mut() else {
            opened.await;
            return Ok(CallOutcome::Parked(CallParked {
                correlation_id,
                delivered_to: report.delivered_to,
                deadline: record.deadline,
            }));
        };
        // The `opened` event is stored while the call waits, not before: it is sent at once,
        // and its ack is awaited before an answer is taken, so the trail still has it before
        // the `answered` event (whose replica publishes it only once the answer is taken).
        self.wait_for_answer(stored, answers, &mut local, timeout_ms, opened)
            .await
    }

    async fn deliver_request(
        &self,
        record: &PendingCall,
        body: &str,
        request: &CallRequest,
    ) -> Result<DeliveryReport, ErrorReply> {
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
            ..SendRequest::default()
        };
        request_json(
            &self.client,
            &subject::send(&record.caller),
            &send,
            DELIVERY_TIMEOUT,
        )
        .await
        .map_err(|failure| match failure {
            RequestFailure::Service(reply) => reply,
            RequestFailure::NoResponders { .. } => ErrorReply::new(
                ErrorKind::Unavailable,
                "inbox-fanout is not running; the call was not made",
            ),
            other => ErrorReply::new(ErrorKind::Unavailable, other.to_string()),
        })
    }

    async fn wait_for_answer(
        &self,
        stored: Stored,
        answers: &mut async_nats::Subscriber,
        local: &mut mpsc::Receiver<LocalAnswer>,
        timeout_ms: u64,
        opened: impl Future<Output = ()>,
    ) -> Result<CallOutcome, ErrorReply> {
        let call = &stored.call;
        let left = call.deadline - timestamp::now();
        let deadline = tokio::time::Instant::now()
            + Duration::from_millis(duration_ms(left.max(time::Duration::ZERO)));
        let mut grace_until = None;
        tokio::pin!(opened);
        let mut opened_stored = false;
        loop {
            let until = grace_until.unwrap_or(deadline);
            let (answer, taken) = tokio::select! {
                biased;
                () = &mut opened, if !opened_stored => {
                    opened_stored = true;
                    continue;
                }
                Some(handed) = local.recv() => (handed.answer, Taken::Here(handed.taken)),
                message = answers.next() => {
                    let Some(message) = message else { break };
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
                    match self.store.end(&stored, CallState::Expired).await? {
                        Some(_) => break,
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
            // The `opened` event is stored before the answer is taken: the answering replica
            // publishes `answered` only once it is.
            if !opened_stored {
                (&mut opened).await;
            }
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
            return Ok(CallOutcome::Answered(answer));
        }
        if !opened_stored {
            opened.await;
        }
        let _ = answers.unsubscribe().await;
        Err(ErrorReply::new(
            ErrorKind::Timeout,
            format!(
                "no answer from `{}` within {timeout_ms} ms (call {})",
                call.callee, call.correlation_id
            ),
        ))
    }

    /// reply_to_peer: answers the call named by `correlation_id`; only its callee may.
    pub async fn reply(
        &self,
        callee: &AgentId,
        request: ReplyRequest,
    ) -> Result<ReplyAck, ErrorReply> {
        let Some(correlation_id) = request.correlation_id else {
            return Err(ErrorReply::new(
                ErrorKind::BadRequest,
                "`correlation_id` is required: the call you are answering",
            ));
        };
        // The message gates of a send (non-empty, ≤ 64 KiB), with the caller as a stand-in
        // target so gates 1–2 pass.
        let probe = SendRequest {
            to: Some("_".to_owned()),
            message: request.message.clone(),
            ..SendRequest::default()
        };
        let (_, body) = check_gates(callee, &probe)?;
        // An answer that could not be stored must be refused before the call is claimed.
        check_content_fits("the answer with its parts", body, &request.parts, &[])?;
        // A call this replica holds is claimed on the revision it stored first (no read); if
        // it changed since, the claim fails and the call is read as usual.
        let mut held = self
            .waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&correlation_id)
            .map(|held| held.stored.clone());
        for _ in 0..CAS_ATTEMPTS {
            let found = match held.take() {
                Some(stored) => Some(stored),
                None => self.store.find(&correlation_id).await?,
            };
            let Some(stored) = found else {
                return Err(ErrorReply::new(
                    ErrorKind::NotFound,
                    format!("no call {correlation_id}"),
                ));
            };
            let call = &stored.call;
            if call.callee != *callee {
                return Err(ErrorReply::new(
                    ErrorKind::NotCallee,
                    format!("only `{}` may answer call {correlation_id}", call.callee),
                ));
            }
            let expired = || {
                ErrorReply::new(
                    ErrorKind::Expired,
                    format!(
                        "call {correlation_id} expired at {}; the answer was not delivered",
                        timestamp::format(call.deadline)
                    ),
                )
            };
            match (call.state, call.answered_via) {
                (CallState::Expired, _) => {
                    self.emit(CallEventKind::LateAnswer, call, Some(body)).await;
                    return Err(expired());
                }
                (CallState::Answered, Some(via)) => {
                    return Ok(ReplyAck {
                        correlation_id,
                        delivered: via,
                        duplicate: true,
                    });
                }
                (CallState::Answered, None)
                    if call
                        .claimed_at
                        .is_some_and(|at| timestamp::now() - at < CLAIM_IN_PROGRESS) =>
                {
                    // Another reply claimed it a moment ago and is delivering right now.
                    return Err(ErrorReply::new(
                        ErrorKind::Conflict,
                        format!(
                            "an answer to call {correlation_id} is being delivered; retry to see its outcome"
                        ),
                    ));
                }
                (CallState::Answered, None) => {
                    // Claimed by an attempt that did not finish delivering: claim it anew
                    // (so concurrent retries cannot both deliver), then deliver again (an
                    // inbox copy is de-duplicated by its message id).
                    let Some(reclaimed) = self
                        .store
                        .transition(&stored, CallState::Answered, None)
                        .await?
                    else {
                        continue;
                    };
                    let via = self.deliver_answer(call, callee, body, &request).await?;
                    self.store
                        .transition(&reclaimed, CallState::Answered, Some(via))
                        .await?;
                    return Ok(ReplyAck {
                        correlation_id,
                        delivered: via,
                        duplicate: false,
                    });
                }
                (CallState::Open, _) if call.deadline <= timestamp::now() => {
                    if self.store.end(&stored, CallState::Expired).await?.is_some() {
                        self.on_expired(call).await;
                        return Err(expired());
                    }
                }
                (CallState::Open, _) => {
                    // Claim it; the winner delivers, exactly once (and takes the call out of
                    // the open-call index meanwhile).
                    if let Some(claimed) = self
                        .store
                        .transition(&stored, CallState::Answered, None)
                        .await?
                    {
                        let (via, ()) = tokio::join!(
                            self.deliver_answer(call, callee, body, &request),
                            self.store.unindex(&correlation_id)
                        );
                        let via = via?;
                        self.store
                            .transition(&claimed, CallState::Answered, Some(via))
                            .await?;
                        tracing::info!(%correlation_id, ?via, "call answered");
                        self.emit(CallEventKind::Answered, call, Some(body)).await;
                        return Ok(ReplyAck {
                            correlation_id,
                            delivered: via,
                            duplicate: false,
                        });
                    }
                }
            }
        }
        Err(ErrorReply::new(
            ErrorKind::Conflict,
            format!("call {correlation_id} keeps changing; retry"),
        ))
    }

    async fn deliver_answer(
        &self,
        call: &PendingCall,
        callee: &AgentId,
        body: &str,
        request: &ReplyRequest,
    ) -> Result<AnswerRoute, ErrorReply> {
        if call.wait {
            let answer = CallAnswer {
                correlation_id: call.correlation_id,
                from_agent_id: callee.clone(),
                body: body.to_owned(),
                parts: request.parts.clone(),
                answered_at: timestamp::now(),
            };
            if self.hand_over_here(&answer).await {
                return Ok(AnswerRoute::Caller);
            }
            let payload = serde_json::to_vec(&answer)
                .map_err(|err| ErrorReply::new(ErrorKind::Internal, err.to_string()))?;
            let handed = tokio::time::timeout(
                HANDOVER_TIMEOUT,
                self.client
                    .request(subject::call_answer(&call.correlation_id), payload.into()),
            )
            .await;
            if matches!(handed, Ok(Ok(_))) {
                return Ok(AnswerRoute::Caller);
            }
            tracing::info!(correlation_id = %call.correlation_id, "no waiting caller took the answer; delivering it to the inbox");
        }
        let mut message =
            InboxMessage::new(callee.clone(), GoalId::new(), call.caller.clone(), body);
        message.id = Some(new_id());
        message.kind = MessageKind::Response;
        message.correlation_id = Some(call.correlation_id);
        message.in_reply_to = Some(call.request_id);
        message.parts = request.parts.clone();
        self.to_caller_inbox(call, &message, "response").await?;
        Ok(AnswerRoute::Inbox)
    }

    /// Hands `answer` to its caller's wait when this replica holds it; true once the wait
    /// took it (false: not here, or it ended meanwhile, and the answer goes the NATS way).
    async fn hand_over_here(&self, answer: &CallAnswer) -> bool {
        let here = self
            .waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&answer.correlation_id)
            .map(|held| held.answer_to.clone());
        let Some(wait) = here else {
            return false;
        };
        let (taken, was_taken) = oneshot::channel();
        let handed = LocalAnswer {
            answer: answer.clone(),
            taken,
        };
        if wait.send(handed).await.is_err() {
            return false;
        }
        matches!(
            tokio::time::timeout(HANDOVER_TIMEOUT, was_taken).await,
            Ok(Ok(()))
        )
    }

    /// Publishes to the caller goal's inbox, de-duplicated per call and purpose.
    async fn to_caller_inbox(
        &self,
        call: &PendingCall,
        message: &InboxMessage,
        purpose: &str,
    ) -> Result<(), ErrorReply> {
        let msg_id = format!("{purpose}:{}:{}", call.correlation_id, call.caller_goal);
        publish_json(
            &self.js,
            &subject::inbox(&call.caller_goal),
            &msg_id,
            message,
        )
        .await
        .map(|_| ())
        .map_err(|err| ErrorReply::new(ErrorKind::Unavailable, err.to_string()))
    }

    /// After a call expired (this replica won the transition): a parked caller is told in its
    /// inbox; a waiting caller's own replica answers it with `timeout`.
    async fn on_expired(&self, call: &PendingCall) {
        tracing::info!(correlation_id = %call.correlation_id, callee = %call.callee, "call expired");
        self.emit(CallEventKind::Expired, call, None).await;
        if call.wait {
            return;
        }
        let mut notice = InboxMessage::new(
            call.callee.clone(),
            GoalId::new(),
            call.caller.clone(),
            format!(
                "call {} to `{}` timed out at {} without an answer",
                call.correlation_id,
                call.callee,
                timestamp::format(call.deadline)
            ),
        );
        notice.id = Some(new_id());
        notice.kind = MessageKind::Notify;
        notice.correlation_id = Some(call.correlation_id);
        notice.in_reply_to = Some(call.request_id);
        notice
            .metadata
            .insert("switchboard".to_owned(), "call_timeout".into());
        if let Err(err) = self.to_caller_inbox(call, &notice, "timeout").await {
            tracing::error!(correlation_id = %call.correlation_id, error = %err, "timeout notice not delivered");
        }
    }

    /// The caller's open outgoing and incoming calls.
    pub async fn pending(&self, agent: &AgentId) -> Result<PendingCalls, ErrorReply> {
        let now = timestamp::now();
        let open = |calls: Vec<Stored>| -> Vec<PendingCall> {
            let mut open: Vec<PendingCall> = calls
                .into_iter()
                .map(|s| s.call)
                .filter(|c| c.state == CallState::Open && c.deadline > now)
                .collect();
            open.sort_by_key(|c| c.created_at);
            open
        };
        Ok(PendingCalls {
            outgoing: open(self.store.outgoing(agent).await?),
            incoming: open(self.store.incoming(agent).await?),
        })
    }

    /// One deadline sweep: every open call past its deadline is expired with compare-and-set,
    /// so across replicas exactly one does it (and sends the parked caller its notice).
    /// Returns how many this sweep expired.
    pub async fn sweep(&self, now: OffsetDateTime) -> Result<usize, CorrelatorError> {
        let mut expired = 0;
        for stored in self.store.open().await? {
            if stored.call.state != CallState::Open || stored.call.deadline > now {
                continue;
            }
            match self.store.end(&stored, CallState::Expired).await {
                Ok(Some(_)) => {
                    self.on_expired(&stored.call).await;
                    expired += 1;
                }
                Ok(None) => {}
                Err(err) => {
                    tracing::warn!(correlation_id = %stored.call.correlation_id, error = %err, "expiring a call failed")
                }
            }
        }
        Ok(expired)
    }
}
