//! The call rules: making a call and waiting for its answer (answering it is `answers.rs`).
//!
//! A call is recorded (open, with its deadline) *before* its request is delivered, so an
//! answer can never arrive for a call nobody knows. The request itself goes through the one
//! door into every inbox (`switchboard_delivery::door`) as the caller's message, so calls pass
//! the same ACL, anti-loop and per-goal fan-out as any message. A waiting call is held by the replica that took it, listening on
//! an internal per-call subject; whichever replica takes the reply claims the call with
//! compare-and-set and hands the answer to that listener, or — when no listener acknowledges
//! (parked call, or the waiting replica is gone) — into the caller goal's inbox as
//! `kind: response`. When the replica that claims the call is the one holding the caller, it
//! hands the answer over in process, without the round trip through NATS.

use std::sync::PoisonError;
use std::time::Duration;

use serde::Serialize;
use switchboard_delivery::door::{Address, Letter, Origin};
use switchboard_proto::call::{
    CallAnswer, CallEventKind, CallParked, CallRequest, CallState, PendingCall, clamp_timeout,
    derive_chain, request_id_of, scoped_call_id,
};
use switchboard_proto::send::{
    DeliveryReport, Target, check_body, check_receipt, check_target, unknown_agent,
};
use switchboard_proto::{
    AgentId, ErrorKind, GoalId, InboxMessage, MessageKind, new_id, subject, timestamp,
};
use switchboard_request::request::route_by_skill;
use tokio::sync::mpsc;
use tracing::Instrument;

use crate::correlator::{Correlator, Held, LocalAnswer, WaitingGuard};
use crate::error::CorrelatorError;
use crate::parts::PartForwarder;
use crate::store::{CallEntry, Created};

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

/// A call about to be opened: its record, how long the caller waits, and whether the parent's
/// deadline shortened it.
struct Opening {
    call: PendingCall,
    timeout_ms: u64,
    clamped: bool,
}

/// What opening a call's record found.
enum Opened {
    /// A new call.
    New(CallEntry),
    /// A retry of an open call, joined to it.
    Joined(CallEntry),
    /// A retry of a call that has ended: its outcome.
    Ended(Result<CallOutcome, CorrelatorError>),
}

/// A wait's outcome with the call's `clamped` (a parent's deadline shortened it) filled in.
fn with_clamped(
    waited: Result<CallOutcome, CorrelatorError>,
    clamped: bool,
) -> Result<CallOutcome, CorrelatorError> {
    match waited {
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

    /// A call, step by step: who it is for, its record and deadline, the record opened (or a
    /// retry joined to its first attempt), the answer listened for, the request through the
    /// door, then the wait (or, parked, where the answer will land).
    async fn make_call(
        &self,
        caller: &AgentId,
        request: CallRequest,
        reply: Option<async_nats::Subject>,
    ) -> Result<CallOutcome, CorrelatorError> {
        let (callee, body) = self.callee(caller, &request).await?;
        let opening = self.opening(caller, &callee, &request).await?;
        let _slot = match opening.call.wait {
            true => Some(
                self.waiting_slot(caller)
                    .ok_or_else(|| self.too_many(caller))?,
            ),
            false => None,
        };
        let (stored, joined) = match self.record_call(caller, &opening).await? {
            Opened::New(stored) => (stored, false),
            Opened::Joined(stored) => (stored, true),
            Opened::Ended(outcome) => return outcome,
        };
        let record = stored.call.clone();
        // A waiting call listens for its answer before the request can be answered: on its
        // NATS subject (another replica claims it) and in process (this one does).
        let mut answers = self.listen(&record).await?;
        let (local_tx, mut local) = mpsc::channel(1);
        let _waiting = record.wait.then(|| self.hold(&stored, local_tx));
        let report = self.send_request(&stored, joined, body, &request).await?;
        tracing::info!(correlation_id = %record.correlation_id, caller = %caller, callee = %callee, depth = record.chain.len(), timeout_ms = opening.timeout_ms, wait = record.wait, "call opened");
        if !joined {
            crate::correlator::count_call("opened");
        }
        // No `opened` event: the request message, stored in the callee's inbox with the
        // call's `correlation_id`, is the trail's record of the call opening (protocol §13,
        // item 48).
        let Some(answers) = answers.as_mut() else {
            return Ok(CallOutcome::Parked(CallParked {
                correlation_id: record.correlation_id,
                delivered_to: report.delivered_to,
                deadline: record.deadline,
                clamped: opening.clamped,
            }));
        };
        let forward = PartForwarder::new(self.client.clone(), reply.filter(|_| record.stream));
        // A joined call was indexed again above; a new waiting call only if it lasts.
        let waited = self
            .wait_for_answer(
                stored,
                (answers, &mut local),
                opening.timeout_ms,
                forward,
                joined,
            )
            .await;
        with_clamped(waited, opening.clamped)
    }

    /// `too_many_calls` for `caller`.
    fn too_many(&self, caller: &AgentId) -> CorrelatorError {
        CorrelatorError::TooManyCalls {
            caller: caller.clone(),
            cap: self.config.max_open_calls,
        }
    }

    /// Who the call is for and its body: the target and body checks of a send, a peer or a
    /// skill (never a broadcast), and a caller goal that is the caller's own — a call naming
    /// another agent's goal would deliver the answer into that goal's inbox.
    async fn callee<'r>(
        &self,
        caller: &AgentId,
        request: &'r CallRequest,
    ) -> Result<(AgentId, &'r str), CorrelatorError> {
        let target = check_target(
            caller,
            request.from_agent_id.as_deref(),
            request.to.as_deref(),
        )
        .map_err(CorrelatorError::Gate)?;
        check_receipt(request.receipt, request.from_goal_id).map_err(CorrelatorError::Gate)?;
        let body = check_body(request.message.as_deref()).map_err(CorrelatorError::Gate)?;
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
        if let Some(goal) = request.from_goal_id
            && !self.door.view().owns_goal(caller, &goal).await?
        {
            return Err(CorrelatorError::NotYourGoal {
                goal,
                caller: caller.clone(),
            });
        }
        Ok((callee, body))
    }

    /// The call's record before it is opened: its chain (cycle and depth rules, asking back
    /// allowed), its deadline (never past its parent's) and how long the caller waits.
    async fn opening(
        &self,
        caller: &AgentId,
        callee: &AgentId,
        request: &CallRequest,
    ) -> Result<Opening, CorrelatorError> {
        let timeout_ms = clamp_timeout(
            request.timeout_ms,
            self.config.default_timeout_ms,
            self.config.max_timeout_ms,
        );
        let parent = match request.parent_correlation_id {
            None => None,
            Some(parent_id) => match self.store.find(&parent_id).await? {
                Some(parent) => Some(parent.call),
                None => return Err(CorrelatorError::UnknownParent(parent_id)),
            },
        };
        // Asking back (a question to the agent whose call this one serves, `in_reply_to` its
        // request) is no cycle; it keeps the depth rule and the parent's deadline.
        let chain = derive_chain(
            caller,
            callee,
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
        let wait = request.wait.unwrap_or(true);
        // The caller's own name for the call is scoped to it: a retry maps to the same call,
        // another caller's same name to another call (docs/protocol.md §9, "Call ids").
        let correlation_id = request
            .correlation_id
            .map_or_else(new_id, |chosen| scoped_call_id(caller, chosen));
        let call = PendingCall {
            correlation_id,
            caller: caller.clone(),
            caller_goal: request.from_goal_id.unwrap_or_default(),
            callee: callee.clone(),
            chain,
            parent: request.parent_correlation_id,
            request_id: request_id_of(correlation_id),
            wait,
            state: CallState::Open,
            answered_via: None,
            claimed_at: None,
            created_at: now,
            deadline,
            stream: request.stream && wait,
            streamed: Vec::new(),
            answer: None,
            traceparent: switchboard_runtime::telemetry::current_traceparent(),
        };
        Ok(Opening {
            call,
            timeout_ms: if clamped {
                duration_ms(deadline - now)
            } else {
                timeout_ms
            },
            clamped,
        })
    }

    /// Opens the call's record. A call the caller named may exist: then this request is a
    /// retry of it (or names another caller's call, which is refused) and joins it instead of
    /// opening another — or ends here, when the call already has its answer or timed out. A
    /// parked call is counted in the open-call index (a waiting one by the replica holding
    /// it): one past the cap, or racing others past it, steps back.
    async fn record_call(
        &self,
        caller: &AgentId,
        opening: &Opening,
    ) -> Result<Opened, CorrelatorError> {
        let fresh = &opening.call;
        let stored = match self.store.create(fresh).await? {
            Created::New(stored, open) => {
                if open > self.config.max_open_calls {
                    self.store.forget(&stored).await?;
                    return Err(self.too_many(caller));
                }
                return Ok(Opened::New(stored));
            }
            Created::Exists(existing) => existing,
        };
        if stored.call.caller != *caller {
            return Err(CorrelatorError::CallIdTaken(fresh.correlation_id));
        }
        Ok(match stored.call.state {
            // Its first attempt may have died between the record and the index.
            CallState::Open => {
                self.store.reindex(&stored.call).await?;
                Opened::Joined(stored)
            }
            // Answered already: the answer is on the record (kept for this), unless it went to
            // the caller goal's inbox (a parked call, or no replica took it).
            CallState::Answered => Opened::Ended(match (&stored.call.answer, stored.call.wait) {
                (Some(answer), true) => Ok(CallOutcome::Answered(answer.clone())),
                _ => Err(CorrelatorError::AnsweredToInbox(fresh.correlation_id)),
            }),
            CallState::Expired => Opened::Ended(Err(CorrelatorError::Timeout {
                callee: stored.call.callee.clone(),
                timeout_ms: opening.timeout_ms,
                correlation_id: fresh.correlation_id,
                clamped: opening.clamped,
            })),
        })
    }

    /// A waiting call's subscription to the answers other replicas hand over (none parked).
    async fn listen(
        &self,
        call: &PendingCall,
    ) -> Result<Option<async_nats::Subscriber>, CorrelatorError> {
        if !call.wait {
            return Ok(None);
        }
        self.client
            .subscribe(subject::call_answer(&call.correlation_id))
            .await
            .map(Some)
            .map_err(|err| CorrelatorError::ListenForAnswer(err.into()))
    }

    /// Registers a waiting call with this replica, so an answer it claims is handed over in
    /// process; the guard takes it out again.
    fn hold(&self, stored: &CallEntry, answer_to: mpsc::Sender<LocalAnswer>) -> WaitingGuard<'_> {
        let id = stored.call.correlation_id;
        let held = Held {
            answer_to,
            stored: stored.clone(),
        };
        self.waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, held);
        WaitingGuard {
            waiting: &self.waiting,
            id,
        }
    }

    /// Delivers the call's request, or for a retry delivers it again with the same message id
    /// — so it reaches the callee even if the first attempt died before delivering it — but
    /// only while the stream's duplicate window (120 s) still stores it once: a call older than
    /// [`REDELIVER_WITHIN`] was delivered long ago (or its first attempt failed and forgot
    /// it), and a copy then would be a second request. A new call nobody took is forgotten.
    async fn send_request(
        &self,
        stored: &CallEntry,
        joined: bool,
        body: &str,
        request: &CallRequest,
    ) -> Result<DeliveryReport, CorrelatorError> {
        let record = &stored.call;
        if joined && timestamp::now() - record.created_at >= REDELIVER_WITHIN {
            return Ok(DeliveryReport::default());
        }
        let report = match self.deliver_request(record, body, request).await {
            Ok(report) => report,
            Err(err) if !joined => {
                self.store.forget(stored).await?;
                return Err(err);
            }
            // The call exists and may have reached the callee: keep waiting for it.
            Err(err) => {
                tracing::debug!(correlation_id = %record.correlation_id, error = %err, "a retried call's request was not delivered again");
                return Ok(DeliveryReport::default());
            }
        };
        if report.delivered_to.is_empty() && !joined {
            self.store.forget(stored).await?;
            return Err(CorrelatorError::Unreachable(
                report.unreachable_reasons.join("; "),
            ));
        }
        Ok(report)
    }

    /// The call's request into the callee's inboxes, through the one door as the caller's
    /// message (ACL and anti-loop apply), in a span of its own under the call's.
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
        let message = InboxMessage {
            from_agent_id: record.caller.clone(),
            // Without a goal the caller named, `caller_goal` is a fresh id no goal holds.
            from_goal_id: record.caller_goal,
            to_agent_id: record.callee.clone(),
            body: body.to_owned(),
            sent_at: timestamp::now(),
            correlation_id: Some(record.correlation_id),
            id: Some(record.request_id),
            kind: MessageKind::Request,
            in_reply_to: request.in_reply_to,
            expects_reply: true,
            ttl: None,
            trace: Vec::new(),
            parts: request.parts.clone(),
            task: None,
            callback: None,
            metadata,
            receipt: request.receipt,
            from_person: None,
        };
        let letter = Letter {
            to: Address::Agent(record.callee.to_string()),
            from_goal: request.from_goal_id,
            message,
        };
        let span = tracing::info_span!(
            "deliver",
            otel.name = %format!("{}.deliver", crate::SPEC.name),
            otel.kind = "internal",
            messaging.system = "nats",
            messaging.operation.type = "process",
            messaging.operation.name = "deliver",
            switchboard.agent_id = %record.caller,
            otel.status_code = tracing::field::Empty,
            error.type = tracing::field::Empty,
        );
        let delivery = self.door.deliver(Origin::Agent(&record.caller), letter);
        match tokio::time::timeout(DELIVERY_TIMEOUT, delivery.instrument(span.clone())).await {
            Ok(Ok(report)) => Ok(report),
            Ok(Err(err)) => {
                span.record("error.type", err.kind().as_str());
                span.record("otel.status_code", "ERROR");
                Err(CorrelatorError::FanoutRefused(err.into()))
            }
            Err(_) => Err(CorrelatorError::DeliverRequest(
                format!(
                    "delivering the request took more than {} s",
                    DELIVERY_TIMEOUT.as_secs()
                )
                .into(),
            )),
        }
    }
}
