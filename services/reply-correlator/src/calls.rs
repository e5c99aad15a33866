//! The call rules: making a call and waiting for its answer (answering it is `answers.rs`).
//!
//! A call is recorded (open, with its deadline) before its request is delivered — or, a
//! waiting call whose id was made moments ago, while it is delivered (docs/protocol.md §9,
//! "Call ids", `open.rs`; a reply that overtakes such a record is read again). The request
//! goes through the one door into every inbox (`switchboard_delivery::door`) as the caller's
//! message, so calls pass the same ACL, anti-loop and per-goal fan-out as any message. A
//! waiting call is held by the replica that took it, listening on an internal per-call subject; whichever replica takes the reply claims the call with
//! compare-and-set and hands the answer to that listener, or — when no listener acknowledges
//! (parked call, or the waiting replica is gone) — into the caller goal's inbox as
//! `kind: response`. When the replica that claims the call is the one holding the caller, it
//! hands the answer over in process, without the round trip through NATS.

use switchboard_proto::call::{
    CALL_ID_AHEAD_MAX, CallEventKind, CallParked, CallRequest, CallState, PendingCall,
    chosen_moments_ago, chosen_too_far_ahead, clamp_timeout, derive_chain, request_id_of,
    scoped_call_id,
};
use switchboard_proto::send::{
    Target, check_attachments, check_body, check_receipt, check_target, unknown_agent,
};
use switchboard_proto::{AgentId, ErrorKind, ErrorReply, GoalId, new_id, subject, timestamp};
use switchboard_request::request::route_by_skill;
use tokio::sync::mpsc;

use crate::correlator::Correlator;
use crate::error::CorrelatorError;
pub use crate::open::CallOutcome;
use crate::open::{Opening, Sent};
use crate::parts::PartForwarder;

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
        let mut granted = None;
        let result = self.make_call(caller, request, reply, &mut granted).await;
        // A call refused after its budget was reserved gives it back at once (§16), unless its
        // request may be stored (the call goes on, and ends at its answer or deadline).
        if let (Err(err), Some(grant)) = (&result, &granted)
            && !err.may_have_delivered()
            && err.kind() != ErrorKind::Unavailable
        {
            switchboard_request::budget::close(&self.client, grant);
        }
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
                budget: None,
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
        granted: &mut Option<switchboard_proto::budget::BudgetGrant>,
    ) -> Result<CallOutcome, CorrelatorError> {
        let (callee, body, picked) = self.callee(caller, &request).await?;
        let opening = self.opening(caller, &callee, &request).await?;
        granted.clone_from(&opening.call.budget);
        let _slot = match opening.call.wait {
            true => Some(
                self.waiting_slot(caller)
                    .ok_or_else(|| self.too_many(caller))?,
            ),
            false => None,
        };
        // A waiting call listens for its answer before the request can be answered: on its
        // NATS subject (another replica claims it) and in process (this one does).
        let mut answers = self.listen(&opening.call).await?;
        let (local_tx, mut local) = mpsc::channel(1);
        // A callee picked by skill may be another on a retry: such a call records first, so a
        // retry delivers to the callee its record names.
        let beside = opening.call.wait
            && !picked
            && chosen_moments_ago(request.correlation_id, opening.call.created_at);
        let sent = match beside {
            true => {
                self.open_beside(caller, &opening, body, &request, local_tx)
                    .await?
            }
            false => {
                self.open_then_send(caller, &opening, body, &request, local_tx)
                    .await?
            }
        };
        let (stored, joined, report, _held) = match sent {
            Sent::Out {
                stored,
                joined,
                report,
                _held,
            } => (*stored, joined, report, _held),
            Sent::Ended(outcome) => {
                // A retry of a call that has ended: its node has ended too (a tree this retry
                // opened again is removed by the close).
                if let Some(grant) = granted.take() {
                    switchboard_request::budget::close(&self.client, &grant);
                }
                return outcome;
            }
        };
        let record = stored.call.clone();
        tracing::info!(correlation_id = %record.correlation_id, caller = %caller, callee = %callee, depth = record.chain.len(), timeout_ms = opening.timeout_ms, wait = record.wait, "call opened");
        if !joined {
            crate::correlator::count_opened(beside);
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
    pub(crate) fn too_many(&self, caller: &AgentId) -> CorrelatorError {
        CorrelatorError::TooManyCalls {
            caller: caller.clone(),
            cap: self.config.max_open_calls,
        }
    }

    /// Who the call is for, its body, and whether the directory picked the callee (a skill):
    /// the target and body checks of a send, a peer or a skill (never a broadcast), and a
    /// caller goal that is the caller's own — a call naming another agent's goal would deliver
    /// the answer into that goal's inbox.
    async fn callee<'r>(
        &self,
        caller: &AgentId,
        request: &'r CallRequest,
    ) -> Result<(AgentId, &'r str, bool), CorrelatorError> {
        let target = check_target(
            caller,
            request.from_agent_id.as_deref(),
            request.to.as_deref(),
        )
        .map_err(CorrelatorError::Gate)?;
        check_receipt(request.receipt, request.from_goal_id).map_err(CorrelatorError::Gate)?;
        check_attachments(&request.attachments).map_err(CorrelatorError::Gate)?;
        let body = check_body(request.message.as_deref()).map_err(CorrelatorError::Gate)?;
        let (callee, picked) = match target {
            Target::Broadcast => return Err(CorrelatorError::Broadcast),
            Target::Peer(to) => match AgentId::parse(&to) {
                Ok(callee) => (callee, false),
                Err(_) => return Err(CorrelatorError::Unreachable(unknown_agent(&to))),
            },
            // One agent with the skill, picked by the directory; the call is then an ordinary
            // call to it (its chain, cycle and depth rules included).
            Target::Skill(skill) => {
                let picked = route_by_skill(&self.client, caller, &skill, false)
                    .await
                    .map_err(CorrelatorError::Unreachable)?;
                (picked, true)
            }
        };
        if let Some(goal) = request.from_goal_id
            && !self.door.view().owns_goal(caller, &goal).await?
        {
            return Err(CorrelatorError::NotYourGoal {
                goal,
                caller: caller.clone(),
            });
        }
        Ok((callee, body, picked))
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
        let correlation_id = call_id(caller, request, now)?;
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
            budget: None,
        };
        let mut call = call;
        call.budget = self.budget(&call, request, parent.as_ref()).await?;
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

    /// The call's budget (docs/protocol.md §16): the node it names, else its parent call's,
    /// else a new tree for the amounts it asks, else the configured default; reserved at the
    /// limits service (a retry of the call finds its first grant).
    async fn budget(
        &self,
        call: &PendingCall,
        request: &CallRequest,
        parent: Option<&PendingCall>,
    ) -> Result<Option<switchboard_proto::budget::BudgetGrant>, CorrelatorError> {
        if let Some(ask) = &request.budget {
            ask.check().map_err(CorrelatorError::BadBudget)?;
        }
        let inherited = parent
            .and_then(|p| p.budget.as_ref())
            .map(|b| (b.root, b.work));
        let Some(draw) = switchboard_request::budget::draw(
            call.correlation_id,
            request.budget.as_ref(),
            inherited,
            self.budgets.default_ask(),
        ) else {
            return Ok(None);
        };
        let requester = (&call.caller, request.from_goal_id);
        if draw.0.parent.is_some() {
            // A child's grant depends on what its parent has left: reserved before delivery.
            return switchboard_request::budget::reserve(
                &self.client,
                draw,
                call.correlation_id,
                requester,
                &call.callee,
                Some(call.deadline),
            )
            .await
            .map(Some)
            .map_err(CorrelatorError::Budget);
        }
        // A new tree's grant is its ask cut to the caps, known here: the tree is opened beside
        // the request's delivery, off the call's path (the limits service reads a tree that is
        // not stored yet again for a while, should the callee spend first).
        let (tokens, cost, cut) = self.budgets.root_grant(draw.1.tokens, draw.1.cost);
        let grant = switchboard_proto::budget::BudgetGrant {
            root: draw.0.root,
            work: call.correlation_id,
            tokens,
            cost,
            cut,
        };
        let (client, caller, goal, callee) = (
            self.client.clone(),
            call.caller.clone(),
            request.from_goal_id,
            call.callee.clone(),
        );
        let (work, deadline) = (call.correlation_id, call.deadline);
        self.background.spawn(async move {
            let opened = switchboard_request::budget::reserve(
                &client,
                draw,
                work,
                (&caller, goal),
                &callee,
                Some(deadline),
            )
            .await;
            if let Err(err) = opened {
                tracing::warn!(correlation_id = %work, error = %err.error.message, "the call's budget was not opened");
            }
        });
        Ok(Some(grant))
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
}

/// The call's id: the caller's own name for the call scoped to it, so a retry maps to the same
/// call and another caller's same name to another call, or a fresh one (docs/protocol.md §9,
/// "Call ids"). A v7 name dated too far ahead is refused.
fn call_id(
    caller: &AgentId,
    request: &CallRequest,
    now: time::OffsetDateTime,
) -> Result<uuid::Uuid, CorrelatorError> {
    if chosen_too_far_ahead(request.correlation_id, now) {
        return Err(CorrelatorError::Gate(ErrorReply::new(
            ErrorKind::BadRequest,
            format!(
                "correlation_id {} is a UUID v7 dated more than {} s after this service's clock; choose a new id",
                request.correlation_id.unwrap_or_default(),
                CALL_ID_AHEAD_MAX.whole_seconds()
            ),
        )));
    }
    Ok(request
        .correlation_id
        .map_or_else(new_id, |chosen| scoped_call_id(caller, chosen)))
}
