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
use std::sync::Arc;
use std::time::Duration;

use a2a::{Message, Part as A2aPart, Role, SendMessageRequest};
use futures::future::join_all;
use serde::Serialize;
use serde_json::Value;
use switchboard_proto::call::ReplyRequest;
use switchboard_proto::inbox::{AckRequest, FetchReply, FetchRequest, FetchedMessage};
use switchboard_proto::send::SendRequest;
use switchboard_proto::subject::{self, RegistryOp};
use switchboard_proto::task::{TaskAction, TaskOp, TaskReply, TaskRequestOp};
use switchboard_proto::{AgentId, GoalId, InboxMessage, MessageKind, TaskState};
use switchboard_runtime::CancellationToken;
use switchboard_runtime::request::request_json;
use tracing::Instrument;

use crate::gateway::{Gateway, SERVICE_TIMEOUT};
use crate::outbound::{OutboundError, Outcome, RemoteClient, fit};
use crate::remote;
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
}

impl Carrier {
    /// A request to a service as the carried agent.
    pub(crate) async fn fabric<Resp: serde::de::DeserializeOwned>(
        &self,
        subject: &str,
        body: &impl Serialize,
    ) -> Result<Resp, String> {
        request_json(&self.gateway.client, subject, body, SERVICE_TIMEOUT)
            .await
            .map_err(|failure| failure.to_string())
    }

    pub(crate) async fn register(
        &self,
        card: &a2a::AgentCard,
        card_url: &str,
    ) -> Result<(), String> {
        let ours = remote::fabric_card(&self.agent, card, card_url);
        self.fabric::<Value>(&RegistryOp::Register.subject(&self.agent), &ours)
            .await
            .map(|_| ())
    }

    /// Reads the inbox in batches of `remote_concurrency`, carries each batch at once, and
    /// acknowledges it with the next fetch; returns when `lost` or the remote is unreachable.
    pub(crate) async fn serve(&self, lost: &CancellationToken) {
        let max = self.gateway.config.remote_concurrency;
        let mut done: Option<u64> = None;
        let mut failures = 0;
        while !lost.is_cancelled() {
            let fetch = FetchRequest {
                goal_id: self.goal,
                max: Some(max),
                wait_ms: Some(FETCH_WAIT_MS),
                ack_through: done,
                ..Default::default()
            };
            let reply: FetchReply = match self
                .fabric(&subject::inbox_fetch(&self.agent), &fetch)
                .await
            {
                Ok(reply) => reply,
                // Five in a row (the services away, the goal lost): a new session registers
                // and opens the goal again.
                Err(err) => {
                    tracing::warn!(agent_id = %self.agent, error = %err, "inbox fetch failed");
                    failures += 1;
                    if failures >= 5 {
                        lost.cancel();
                        return;
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            failures = 0;
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
                    lost.cancel();
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
    /// remote could not be reached (the message stays in the inbox).
    async fn carry_traced(&self, fetched: &FetchedMessage) -> Result<(), OutboundError> {
        let message = &fetched.message;
        let span = tracing::info_span!(
            "a2a.outbound",
            otel.name = "a2a-gateway.outbound",
            otel.kind = "client",
            rpc.system = "jsonrpc",
            switchboard.agent_id = %self.agent,
            switchboard.from_agent_id = %message.from_agent_id,
            switchboard.kind = ?message.kind,
        );
        let mut headers = async_nats::HeaderMap::new();
        for (name, value) in [
            (switchboard_proto::HEADER_TRACEPARENT, &fetched.traceparent),
            (switchboard_proto::HEADER_TRACESTATE, &fetched.tracestate),
        ] {
            if let Some(value) = value {
                headers.insert(name, switchboard_runtime::headers::safe_value(value));
            }
        }
        switchboard_runtime::telemetry::set_parent_from(&span, Some(&headers));
        self.carry(message).instrument(span).await.or_else(|err| {
            if err.is_transient() {
                Err(err)
            } else {
                // A refusal or a broken answer is the remote's final word: reported where
                // the message came from, never retried.
                tracing::info!(agent_id = %self.agent, error = %err, "remote agent refused a message");
                Ok(())
            }
        })
    }

    async fn carry(&self, message: &InboxMessage) -> Result<(), OutboundError> {
        match message.kind {
            MessageKind::Request => self.call(message).await,
            MessageKind::Task => self.task(message).await,
            MessageKind::Message | MessageKind::Notify => {
                if let Some(paused) = self.paused_answered(message).await {
                    return self.resume(message, paused).await;
                }
                self.message(message).await
            }
            MessageKind::Response | MessageKind::TaskUpdate => {
                tracing::debug!(agent_id = %self.agent, kind = ?message.kind, "nothing to carry");
                Ok(())
            }
        }
    }

    /// A call: the remote's answer is the reply (its failure, a reply saying so).
    async fn call(&self, message: &InboxMessage) -> Result<(), OutboundError> {
        let Some(correlation_id) = message.correlation_id else {
            return Ok(());
        };
        let request = self.request(message, None);
        let answer = match self.exchange(&request, None).await {
            Ok(outcome) => match outcome.state {
                Some(
                    a2a::TaskState::Failed | a2a::TaskState::Rejected | a2a::TaskState::Canceled,
                ) => fit(format!(
                    "the remote agent did not answer: {}",
                    outcome.answer()
                )),
                _ => outcome.answer(),
            },
            Err(err) if err.is_transient() => return Err(err),
            Err(err) => fit(format!("the remote agent did not answer: {err}")),
        };
        let reply = ReplyRequest {
            correlation_id: Some(correlation_id),
            message: Some(answer),
            parts: Vec::new(),
        };
        if let Err(err) = self
            .fabric::<Value>(&subject::reply(&self.agent), &reply)
            .await
        {
            tracing::info!(agent_id = %self.agent, %correlation_id, error = %err, "call answer not taken");
        }
        Ok(())
    }

    /// A plain message: sent; what the remote answers goes back to the sender.
    async fn message(&self, message: &InboxMessage) -> Result<(), OutboundError> {
        let request = self.request(message, None);
        let answer = match self.exchange(&request, None).await {
            Ok(outcome) => outcome.answer(),
            Err(err) if err.is_transient() => return Err(err),
            Err(err) => fit(format!("the remote agent refused the message: {err}")),
        };
        let send = SendRequest {
            to: Some(message.from_agent_id.to_string()),
            message: Some(answer),
            in_reply_to: message.id,
            correlation_id: message.correlation_id,
            from_goal_id: Some(self.goal),
            ..Default::default()
        };
        if let Err(err) = self
            .fabric::<Value>(&subject::send(&self.agent), &send)
            .await
        {
            tracing::info!(agent_id = %self.agent, error = %err, "answer not delivered to the sender");
        }
        Ok(())
    }

    /// A task: accepted, started, carried to the remote, settled by its outcome.
    async fn task(&self, message: &InboxMessage) -> Result<(), OutboundError> {
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
        if let Err(err) = self.op(TaskOp::Accept, accept).await {
            let get = TaskAction {
                task_id: Some(task.id),
                ..Default::default()
            };
            let reply: Result<TaskReply, String> = self
                .fabric(&TaskRequestOp::Get.subject(&self.agent), &get)
                .await;
            let ours = reply.as_ref().is_ok_and(|reply| {
                reply.task.assignee == self.agent
                    && matches!(reply.task.state, TaskState::Accepted | TaskState::Working)
            });
            if !ours {
                tracing::info!(agent_id = %self.agent, task_id = %task.id, error = %err, "task not taken");
                return Ok(());
            }
        }
        let start = TaskAction {
            task_id: Some(task.id),
            ..Default::default()
        };
        // Refused when it is working already (carried again): that is where it should be.
        let _ = self.op(TaskOp::Start, start).await;
        let request = self.request(message, None);
        self.run_task(task.id, &request).await
    }

    /// Sends `request` for Switchboard task `task_id` and settles the task by the outcome.
    async fn run_task(
        &self,
        task_id: uuid::Uuid,
        request: &SendMessageRequest,
    ) -> Result<(), OutboundError> {
        let outcome = match self.exchange(request, Some(task_id)).await {
            Ok(outcome) => outcome,
            Err(err) if err.is_transient() => return Err(err),
            Err(err) => {
                let fail = TaskAction {
                    task_id: Some(task_id),
                    message: Some(fit(err.to_string())),
                    ..Default::default()
                };
                let _ = self.op(TaskOp::Fail, fail).await;
                return Ok(());
            }
        };
        let action = |message: String, parts| TaskAction {
            task_id: Some(task_id),
            message: Some(message),
            parts,
            ..Default::default()
        };
        let result = match outcome.state {
            Some(a2a::TaskState::InputRequired | a2a::TaskState::AuthRequired) => {
                if let Some((remote_task_id, context_id)) = outcome.remote_task.clone() {
                    let paused = PausedTask {
                        remote_task_id,
                        context_id,
                    };
                    self.pauses.put(&task_id, &paused).await;
                }
                let question = outcome
                    .status_text
                    .clone()
                    .map(fit)
                    .unwrap_or_else(|| outcome.answer());
                self.op(TaskOp::InputRequired, action(question, Vec::new()))
                    .await
            }
            Some(a2a::TaskState::Failed | a2a::TaskState::Rejected | a2a::TaskState::Canceled) => {
                self.op(TaskOp::Fail, action(outcome.answer(), Vec::new()))
                    .await
            }
            Some(a2a::TaskState::Completed) | None => {
                self.op(
                    TaskOp::Complete,
                    action(outcome.answer(), outcome.parts.clone()),
                )
                .await
            }
            Some(other) => {
                let reason = format!("the remote task stopped in state {other:?} before its end");
                self.op(TaskOp::Fail, action(reason, Vec::new())).await
            }
        };
        if let Err(err) = result {
            tracing::info!(agent_id = %self.agent, %task_id, error = %err, "task not settled");
        }
        Ok(())
    }

    /// The paused task `message` answers (a message in reply to a task's question carries
    /// `metadata.task_id`).
    async fn paused_answered(&self, message: &InboxMessage) -> Option<(uuid::Uuid, PausedTask)> {
        let task_id = message
            .metadata
            .get("task_id")?
            .as_str()?
            .parse::<uuid::Uuid>()
            .ok()?;
        Some((task_id, self.pauses.get(&task_id).await?))
    }

    /// The requester's answer goes into the paused remote task, which then runs on.
    async fn resume(
        &self,
        message: &InboxMessage,
        (task_id, paused): (uuid::Uuid, PausedTask),
    ) -> Result<(), OutboundError> {
        let _ = self
            .op(
                TaskOp::Start,
                TaskAction {
                    task_id: Some(task_id),
                    ..Default::default()
                },
            )
            .await;
        let request = self.request(message, Some(&paused));
        self.pauses.delete(&task_id).await;
        self.run_task(task_id, &request).await
    }

    async fn op(&self, op: TaskOp, action: TaskAction) -> Result<Value, String> {
        self.fabric(&TaskRequestOp::Transition(op).subject(&self.agent), &action)
            .await
    }

    /// The A2A request carrying `message`: its text and parts, the sender's goal as the
    /// context (one remote context per conversation), or the paused task it continues.
    fn request(&self, message: &InboxMessage, paused: Option<&PausedTask>) -> SendMessageRequest {
        let mut parts = vec![A2aPart::text(message.body.clone())];
        parts.extend(crate::mapping::outbound(&message.parts));
        let mut a2a_message = Message::new(Role::User, parts);
        a2a_message.message_id = message.id.unwrap_or_default().to_string();
        a2a_message.context_id = Some(message.from_goal_id.to_string());
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

    /// [`RemoteClient::exchange`] with this agent's settings; a status note of a working
    /// remote task becomes progress of Switchboard task `task` when set.
    async fn exchange(
        &self,
        request: &SendMessageRequest,
        task: Option<uuid::Uuid>,
    ) -> Result<Outcome, OutboundError> {
        let timeout = Duration::from_millis(self.gateway.config.remote_timeout_ms);
        let progress = |note: String| async move {
            if let Some(task_id) = task {
                let progress = TaskAction {
                    task_id: Some(task_id),
                    message: Some(fit(note)),
                    ..Default::default()
                };
                let _ = self.op(TaskOp::Progress, progress).await;
            }
        };
        self.client
            .exchange(request, self.streaming, timeout, progress)
            .await
    }
}
