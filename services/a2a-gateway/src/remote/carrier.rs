//! Carrying one remote agent's inbox (docs/a2a.md, "Outbound"): `Carrier::serve` reads the
//! inbox through the inbox service in batches of `remote_concurrency`, carries each message
//! with the A2A client, and acknowledges the batch once it is carried:
//!
//! - a call (`kind: request`) becomes an A2A `SendMessage` (streamed when the remote streams);
//!   the answer is the call's reply;
//! - a task (`kind: task`) is accepted, started and sent; the remote's status updates become
//!   `progress`, `input_required`, `complete` or `fail` of the Switchboard task, and the
//!   requester's answer to a question goes back into the same remote task;
//! - a message is sent, and whatever the remote answers comes back to the sender's goals as
//!   an ordinary message `in_reply_to` it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use a2a::{Message, Part as A2aPart, Role, SendMessageRequest};
use futures::future::join_all;
use serde::Serialize;
use serde_json::Value;
use switchboard_proto::call::ReplyRequest;
use switchboard_proto::inbox::{AckRequest, FetchReply, FetchRequest, FetchedMessage};
use switchboard_proto::send::SendRequest;
use switchboard_proto::subject;
use switchboard_proto::task::{TaskAction, TaskOp, TaskReply, TaskRequestOp};
use switchboard_proto::{AgentId, GoalId, InboxMessage, MessageKind, TaskState};
use switchboard_request::request::{RequestFailure, request_json};
use switchboard_runtime::CancellationToken;
use tracing::Instrument;

use crate::gateway::{Gateway, SERVICE_TIMEOUT};
use crate::remote::answer::OutboundError;
use crate::remote::attempts::Attempts;
use crate::remote::outbound::{Outcome, RemoteClient, fit};
use crate::remote::{add, card};
use crate::store::{Paused, PausedTask};

/// How long one inbox fetch waits for a message.
const FETCH_WAIT_MS: i64 = 5_000;

/// What one session of a carried agent works with.
pub(crate) struct Carrier {
    pub(crate) gateway: Arc<Gateway>,
    pub(crate) agent: AgentId,
    pub(crate) goal: GoalId,
    pub(crate) client: RemoteClient,
    pub(crate) streaming: bool,
    pub(crate) pauses: Paused,
    pub(crate) attempts: Arc<Attempts>,
    /// The remote as the operator added it (its pinned skills, whether it is routed skills).
    pub(crate) record: card::RemoteAgent,
    /// Cancelled once the id is found to be a Switchboard agent's: the session stops at once.
    pub(crate) lost: CancellationToken,
}

/// A failed request to a service, as the carrier sees it: a refusal is final, anything else
/// (no responders, a timeout) means the fabric is away and the message is carried again.
fn away(failure: RequestFailure) -> OutboundError {
    OutboundError::Unreachable(format!("the fabric: {failure}"))
}

fn refused(failure: &RequestFailure) -> bool {
    matches!(failure, RequestFailure::Service(_))
}

impl Carrier {
    /// A request to a service as the carried agent.
    pub(crate) async fn fabric<Resp: serde::de::DeserializeOwned>(
        &self,
        subject: &str,
        body: &impl Serialize,
    ) -> Result<Resp, RequestFailure> {
        request_json(&self.gateway.client, subject, body, SERVICE_TIMEOUT).await
    }

    /// Registers the agent with a card made from `card`. The directory refuses it when the id
    /// is a Switchboard agent's (keyed in the agents file, or registered by the agent after
    /// `a2a add`): that agent's card is never overwritten, and the session is [`Carrier::lost`].
    pub(crate) async fn register(&self, card: &a2a::AgentCard) -> Result<(), async_nats::Error> {
        let ours = card::fabric_card(&self.record, card);
        match add::claim(&self.gateway.client, &self.agent, &ours).await {
            Ok(()) => Ok(()),
            Err(err @ card::RemoteError::Taken(_)) => {
                self.lost.cancel();
                Err(err.into())
            }
            Err(err) => Err(err.into()),
        }
    }

    /// Whether the id is a Switchboard agent's now (the registry view holds a card that is not
    /// a remote's: the agent signed in); marks the session [`Carrier::lost`] when it is.
    pub(crate) async fn taken_over(&self) -> bool {
        if self.lost.is_cancelled() {
            return true;
        }
        let taken = matches!(
            self.gateway.store.agent(&self.agent).await,
            Ok(Some(record)) if !record.card.is_remote()
        );
        if taken {
            self.lost.cancel();
        }
        taken
    }

    /// Reads the inbox in batches of `remote_concurrency`, carries each batch at once, and
    /// acknowledges it with the next fetch; returns when `ended` or the remote is unreachable.
    pub(crate) async fn serve(&self, ended: &CancellationToken) {
        let max = self.gateway.config.remote_concurrency;
        let mut done: Option<u64> = None;
        let mut failures = 0;
        while !ended.is_cancelled() {
            let fetch = FetchRequest {
                goal_id: self.goal,
                max: Some(max),
                wait_ms: Some(FETCH_WAIT_MS),
                ack_through: done,
                ..Default::default()
            };
            // A remote that lost its id stops reading at once: what the fetch hands out then
            // is the agent's, and the remote's goal is closed after the session.
            let fetch_subject = subject::inbox_fetch(&self.agent);
            let fetching = self.fabric::<FetchReply>(&fetch_subject, &fetch);
            let fetched = tokio::select! {
                fetched = fetching => fetched,
                () = self.lost.cancelled() => return,
            };
            let reply: FetchReply = match fetched {
                Ok(reply) => reply,
                // Five in a row (the services away, the goal lost): a new session registers
                // and opens the goal again.
                Err(err) => {
                    tracing::warn!(agent_id = %self.agent, error = %err, "inbox fetch failed");
                    failures += 1;
                    if failures >= 5 {
                        self.ack(done).await;
                        ended.cancel();
                        return;
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            failures = 0;
            // Nothing is carried once the id is a Switchboard agent's (the registry view's word).
            if !reply.messages.is_empty() && self.taken_over().await {
                return;
            }
            let results = join_all(
                reply
                    .messages
                    .iter()
                    .map(|fetched| self.carry_traced(fetched)),
            )
            .await;
            let mut through = None;
            for (fetched, result) in reply.messages.iter().zip(results) {
                if let Err(err) = result {
                    tracing::warn!(agent_id = %self.agent, error = %err, "remote agent unreachable mid-batch");
                    self.ack(through).await;
                    ended.cancel();
                    return;
                }
                through = Some(fetched.seq);
            }
            done = through;
        }
        self.ack(done).await;
    }

    async fn ack(&self, through: Option<u64>) {
        let Some(through) = through else { return };
        let ack = AckRequest {
            goal_id: self.goal,
            through: Some(through),
            ..Default::default()
        };
        if let Err(err) = self
            .fabric::<Value>(&subject::inbox_ack(&self.agent), &ack)
            .await
        {
            tracing::warn!(agent_id = %self.agent, error = %err, "inbox ack failed; the messages will be carried again");
        }
    }

    /// Carries one message in a span continuing its sender's trace; `Err` only when the
    /// remote (or the fabric) could not be reached and the message has attempts left (it
    /// stays in the inbox). On its last attempt a message is answered as given up.
    async fn carry_traced(&self, fetched: &FetchedMessage) -> Result<(), OutboundError> {
        let message = &fetched.message;
        let span = tracing::info_span!(
            "a2a.outbound",
            otel.name = "a2a-gateway.outbound",
            otel.kind = "client",
            rpc.system = "jsonrpc",
            switchboard.service = crate::SPEC.name,
            switchboard.agent_id = %self.agent,
            switchboard.from_agent_id = %message.from_agent_id,
            switchboard.kind = message.kind.as_str(),
            switchboard.correlation_id = tracing::field::Empty,
        );
        if let Some(id) = message.correlation_id {
            span.record("switchboard.correlation_id", id.to_string().as_str());
        }
        switchboard_runtime::telemetry::set_parent_from_text(
            &span,
            fetched.traceparent.as_deref(),
            fetched.tracestate.as_deref(),
        );
        let last = self.attempts.last(fetched.seq);
        match self.carry(message, last).instrument(span).await {
            Ok(()) => {
                self.attempts.done(fetched.seq);
                Ok(())
            }
            Err(err) if err.is_transient() && !self.attempts.failed(fetched.seq) => Err(err),
            Err(err) => {
                // A refusal or a broken answer is the remote's final word (reported where
                // the message came from); so is the last attempt.
                tracing::info!(agent_id = %self.agent, error = %err, "message given up");
                self.attempts.done(fetched.seq);
                Ok(())
            }
        }
    }

    /// `last`: this is the message's last attempt, so an unreachable remote is final too.
    async fn carry(&self, message: &InboxMessage, last: bool) -> Result<(), OutboundError> {
        match message.kind {
            MessageKind::Request => self.call(message, last).await,
            MessageKind::Task => self.task(message, last).await,
            // What a service wrote (a notice that a message went unread, a call's timeout)
            // has no hop budget: it is the fabric's own word to this agent, never carried off
            // the fabric — a remote that answered it would start a loop at someone's cost.
            MessageKind::Message | MessageKind::Notify if message.ttl.is_none() => {
                tracing::debug!(agent_id = %self.agent, kind = ?message.kind, "a service notice; not carried");
                Ok(())
            }
            MessageKind::Message | MessageKind::Notify => {
                if let Some(paused) = self.paused_answered(message).await {
                    return self.resume(message, paused, last).await;
                }
                self.message(message, last).await
            }
            MessageKind::Response | MessageKind::TaskUpdate | MessageKind::Receipt => {
                tracing::debug!(agent_id = %self.agent, kind = ?message.kind, "nothing to carry");
                Ok(())
            }
        }
    }

    /// A call: the remote's answer is the reply (its failure, a reply saying so). A call
    /// whose caller stopped waiting is not sent.
    async fn call(&self, message: &InboxMessage, last: bool) -> Result<(), OutboundError> {
        let Some(correlation_id) = message.correlation_id else {
            return Ok(());
        };
        let left = call_time_left(message);
        if left.is_some_and(|left| left.is_zero()) {
            tracing::info!(agent_id = %self.agent, %correlation_id, "call past its deadline; not sent");
            return Ok(());
        }
        let request = self.request(message, None);
        let answer = match self.exchange(&request, None, left).await {
            Ok(outcome) => match outcome.state {
                Some(
                    a2a::TaskState::Failed | a2a::TaskState::Rejected | a2a::TaskState::Canceled,
                ) => fit(format!(
                    "the remote agent did not answer: {}",
                    outcome.answer()
                )),
                _ => outcome.answer(),
            },
            Err(err) if err.is_transient() && !last => return Err(err),
            Err(err) => fit(format!("the remote agent did not answer: {err}")),
        };
        let reply = ReplyRequest {
            correlation_id: Some(correlation_id),
            message: Some(answer),
            ..ReplyRequest::default()
        };
        match self
            .fabric::<Value>(&subject::reply(&self.agent), &reply)
            .await
        {
            Ok(_) => Ok(()),
            Err(failure) if !refused(&failure) => Err(away(failure)),
            Err(failure) => {
                tracing::info!(agent_id = %self.agent, %correlation_id, error = %failure, "call answer not taken");
                Ok(())
            }
        }
    }

    /// A plain message: sent; what the remote answers goes back to the sender, as an answer
    /// does (docs/protocol.md §8, "Answering the sender"): `in_reply_to` the message and with
    /// the hop budget it arrived with, so a remote that answers everything runs out of hops.
    async fn message(&self, message: &InboxMessage, last: bool) -> Result<(), OutboundError> {
        let request = self.request(message, None);
        let answer = match self.exchange(&request, None, None).await {
            Ok(outcome) => outcome.answer(),
            Err(err) if err.is_transient() && !last => return Err(err),
            Err(err) => fit(format!("the remote agent did not take the message: {err}")),
        };
        let send = SendRequest {
            to: Some(message.from_agent_id.to_string()),
            message: Some(answer),
            in_reply_to: message.id,
            correlation_id: message.correlation_id,
            from_goal_id: Some(self.goal),
            ttl: message.ttl,
            ..Default::default()
        };
        match self
            .fabric::<Value>(&subject::send(&self.agent), &send)
            .await
        {
            Ok(_) => Ok(()),
            Err(failure) if !refused(&failure) => Err(away(failure)),
            Err(failure) => {
                tracing::info!(agent_id = %self.agent, error = %failure, "answer not delivered to the sender");
                Ok(())
            }
        }
    }

    /// A task: accepted, started, carried to the remote, settled by its outcome.
    async fn task(&self, message: &InboxMessage, last: bool) -> Result<(), OutboundError> {
        let Some(task) = &message.task else {
            return Ok(());
        };
        let accept = TaskAction {
            task_id: Some(task.id),
            from_goal_id: Some(self.goal),
            ..Default::default()
        };
        // Taken already: carried before, and the remote could not be reached or this gateway
        // stopped before the end; carried again unless it moved on since.
        match self.op(TaskOp::Accept, accept).await {
            Ok(_) => {}
            Err(failure) if !refused(&failure) => return Err(away(failure)),
            Err(refusal) => {
                let get = TaskAction {
                    task_id: Some(task.id),
                    ..Default::default()
                };
                let reply: TaskReply = self
                    .fabric(&TaskRequestOp::Get.subject(&self.agent), &get)
                    .await
                    .map_err(away)?;
                let ours = reply.task.assignee == self.agent
                    && matches!(reply.task.state, TaskState::Accepted | TaskState::Working);
                if !ours {
                    tracing::info!(agent_id = %self.agent, task_id = %task.id, error = %refusal, "task not taken");
                    return Ok(());
                }
            }
        }
        let start = TaskAction {
            task_id: Some(task.id),
            ..Default::default()
        };
        // Refused when it is working already (carried again): that is where it should be.
        if let Err(failure) = self.op(TaskOp::Start, start).await
            && !refused(&failure)
        {
            return Err(away(failure));
        }
        let request = self.request(message, None);
        self.run_task(task.id, &request, last).await
    }

    /// Sends `request` for Switchboard task `task_id` and settles the task by the outcome.
    async fn run_task(
        &self,
        task_id: uuid::Uuid,
        request: &SendMessageRequest,
        last: bool,
    ) -> Result<(), OutboundError> {
        let action = |message: String, parts| TaskAction {
            task_id: Some(task_id),
            message: Some(message),
            parts,
            ..Default::default()
        };
        let outcome = match self.exchange(request, Some(task_id), None).await {
            Ok(outcome) => outcome,
            Err(err) if err.is_transient() && !last => return Err(err),
            Err(err) => {
                return self
                    .settle(TaskOp::Fail, action(fit(err.to_string()), Vec::new()))
                    .await;
            }
        };
        match outcome.state {
            Some(a2a::TaskState::InputRequired | a2a::TaskState::AuthRequired) => {
                if let (Some((remote_task_id, context_id)), Some(requester)) =
                    (outcome.remote_task.clone(), self.requester(task_id).await?)
                {
                    let paused = PausedTask {
                        remote_task_id,
                        context_id,
                        requester,
                    };
                    self.pauses.put(&task_id, &paused).await;
                }
                let question = outcome
                    .status_text
                    .clone()
                    .map(fit)
                    .unwrap_or_else(|| outcome.answer());
                self.settle(TaskOp::InputRequired, action(question, Vec::new()))
                    .await
            }
            Some(a2a::TaskState::Failed | a2a::TaskState::Rejected | a2a::TaskState::Canceled) => {
                self.settle(TaskOp::Fail, action(outcome.answer(), Vec::new()))
                    .await
            }
            Some(a2a::TaskState::Completed) | None => {
                let complete = action(outcome.answer(), outcome.parts.clone());
                match self.op(TaskOp::Complete, complete).await {
                    Ok(_) => Ok(()),
                    Err(failure) if !refused(&failure) => Err(away(failure)),
                    // Refused (an answer the task service will not store, a task canceled
                    // meanwhile): the task fails with why, rather than staying at work.
                    Err(refusal) => {
                        let reason = fit(format!("the remote's answer was not taken: {refusal}"));
                        self.settle(TaskOp::Fail, action(reason, Vec::new())).await
                    }
                }
            }
            Some(other) => {
                let reason = format!("the remote task stopped in state {other:?} before its end");
                self.settle(TaskOp::Fail, action(reason, Vec::new())).await
            }
        }
    }

    /// A transition that ends this carrying of the task: refused is logged (the task moved
    /// on meanwhile), the fabric away is carried again.
    async fn settle(&self, op: TaskOp, action: TaskAction) -> Result<(), OutboundError> {
        let task_id = action.task_id;
        match self.op(op, action).await {
            Ok(_) => Ok(()),
            Err(failure) if !refused(&failure) => Err(away(failure)),
            Err(refusal) => {
                tracing::info!(agent_id = %self.agent, ?task_id, error = %refusal, "task not settled");
                Ok(())
            }
        }
    }

    /// The requester of task `task_id` (who alone may answer its question).
    async fn requester(&self, task_id: uuid::Uuid) -> Result<Option<AgentId>, OutboundError> {
        let get = TaskAction {
            task_id: Some(task_id),
            ..Default::default()
        };
        match self
            .fabric::<TaskReply>(&TaskRequestOp::Get.subject(&self.agent), &get)
            .await
        {
            Ok(reply) => Ok(Some(reply.task.requester)),
            Err(failure) if !refused(&failure) => Err(away(failure)),
            Err(_) => Ok(None),
        }
    }

    /// The paused task `message` answers: it names the task (`metadata.task_id`, as the
    /// requester's answer does) and comes from that task's requester; anyone else's message
    /// naming it is an ordinary message.
    async fn paused_answered(&self, message: &InboxMessage) -> Option<(uuid::Uuid, PausedTask)> {
        let task_id = message
            .metadata
            .get("task_id")?
            .as_str()?
            .parse::<uuid::Uuid>()
            .ok()?;
        let paused = self.pauses.get(&task_id).await?;
        (paused.requester == message.from_agent_id).then_some((task_id, paused))
    }

    /// The requester's answer goes into the paused remote task, which then runs on; the pause
    /// is forgotten once that run is over (a run that could not reach the remote keeps it, so
    /// the answer is carried again as an answer).
    async fn resume(
        &self,
        message: &InboxMessage,
        (task_id, paused): (uuid::Uuid, PausedTask),
        last: bool,
    ) -> Result<(), OutboundError> {
        let start = TaskAction {
            task_id: Some(task_id),
            ..Default::default()
        };
        if let Err(failure) = self.op(TaskOp::Start, start).await
            && !refused(&failure)
        {
            return Err(away(failure));
        }
        let request = self.request(message, Some(&paused));
        self.run_task(task_id, &request, last).await?;
        self.pauses.delete(&task_id).await;
        Ok(())
    }

    async fn op(&self, op: TaskOp, action: TaskAction) -> Result<Value, RequestFailure> {
        self.fabric(&TaskRequestOp::Transition(op).subject(&self.agent), &action)
            .await
    }

    /// The A2A request carrying `message`: its text and parts, in the remote context of its
    /// sender's conversation, or the paused task it continues.
    fn request(&self, message: &InboxMessage, paused: Option<&PausedTask>) -> SendMessageRequest {
        let mut parts = vec![A2aPart::text(message.body.clone())];
        parts.extend(crate::mapping::outbound(&message.parts));
        let mut a2a_message = Message::new(Role::User, parts);
        a2a_message.message_id = message.id.unwrap_or_default().to_string();
        a2a_message.context_id = Some(remote_context(message));
        if let Some(paused) = paused {
            a2a_message.task_id = Some(paused.remote_task_id.clone());
            a2a_message.context_id = Some(paused.context_id.clone());
        }
        let mut metadata = HashMap::new();
        metadata.insert(
            "switchboard_from_agent_id".to_owned(),
            Value::String(message.from_agent_id.to_string()),
        );
        a2a_message.metadata = Some(metadata);
        SendMessageRequest {
            message: a2a_message,
            configuration: None,
            metadata: None,
            tenant: None,
        }
    }

    /// [`RemoteClient::exchange`] with this agent's settings, bounded by `left` when set (a
    /// call's time); a status note of a working remote task becomes progress of Switchboard
    /// task `task` when set, at most one a second.
    async fn exchange(
        &self,
        request: &SendMessageRequest,
        task: Option<uuid::Uuid>,
        left: Option<Duration>,
    ) -> Result<Outcome, OutboundError> {
        let configured = Duration::from_millis(self.gateway.config.remote_timeout_ms);
        let timeout = left.map_or(configured, |left| left.min(configured));
        let noted = Mutex::new(None::<tokio::time::Instant>);
        let noted = &noted;
        let progress = |note: String| async move {
            let Some(task_id) = task else { return };
            {
                let mut last = noted.lock().unwrap_or_else(PoisonError::into_inner);
                let now = tokio::time::Instant::now();
                if last.is_some_and(|at| now.duration_since(at) < Duration::from_secs(1)) {
                    return;
                }
                *last = Some(now);
            }
            let progress = TaskAction {
                task_id: Some(task_id),
                message: Some(fit(note)),
                ..Default::default()
            };
            let _ = self.op(TaskOp::Progress, progress).await;
        };
        self.client
            .exchange(request, self.streaming, timeout, progress)
            .await
    }
}

/// The time a call has left (its request carries `metadata.call_deadline`); `None` when it
/// names none.
fn call_time_left(message: &InboxMessage) -> Option<Duration> {
    let deadline = message.metadata.get("call_deadline")?.as_str()?;
    let deadline =
        time::OffsetDateTime::parse(deadline, &time::format_description::well_known::Rfc3339)
            .ok()?;
    let left = deadline - switchboard_proto::timestamp::now();
    Some(left.try_into().unwrap_or(Duration::ZERO))
}

/// The remote context of a conversation: one per sender and sending goal (a goal id alone
/// could be reused by another agent after its goal closed), as a UUID.
fn remote_context(message: &InboxMessage) -> String {
    let digest = ring::digest::digest(
        &ring::digest::SHA256,
        format!("{}\0{}", message.from_agent_id, message.from_goal_id).as_bytes(),
    );
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest.as_ref()[..16]);
    uuid::Builder::from_custom_bytes(bytes)
        .into_uuid()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contexts_differ_by_sender_for_one_goal_id() {
        let Ok(a) = AgentId::parse("a") else { panic!() };
        let Ok(b) = AgentId::parse("b") else { panic!() };
        let goal = GoalId::default();
        let from_a = InboxMessage::new(a.clone(), goal, b.clone(), "x");
        let from_b = InboxMessage::new(b, goal, a, "x");
        assert_ne!(remote_context(&from_a), remote_context(&from_b));
        assert_eq!(remote_context(&from_a), remote_context(&from_a.clone()));
    }
}
