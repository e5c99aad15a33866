//! The MCP tools: each one a request to the fabric as this agent, its result the service's
//! own reply as JSON, or `{"error": {"kind", "message"}}` with `isError` set so the model can
//! decide what to do next.

use std::time::Duration;

use futures::StreamExt;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::ProgressNotificationParam;
use rmcp::model::{CallToolResult, ContentBlock};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{tool, tool_router};
use switchboard_client::proto::InboxMessage;
use switchboard_client::proto::call::{CallRequest, ReplyRequest};
use switchboard_client::proto::inbox::FETCH_MAX;
use switchboard_client::proto::send::SendRequest;
use switchboard_client::proto::task::{CreateTask, TaskAction, TaskOp};
use switchboard_client::{
    CallEvent, ClientError, TaskOutcome, render_peer_messages_block, serving,
};

use super::SwitchboardMcp;
use super::params::{
    CancelParams, CompleteParams, CreateTaskParams, ListPeersParams, MessageStatusParams, NoParams,
    ReplyParams, SendParams, SpawnParams, StatusParams, TalkParams, UpdateTaskParams,
    update_actions,
};

/// A successful tool result: the service's reply as pretty JSON.
pub(super) fn reply<T: serde::Serialize>(value: &T) -> CallToolResult {
    let text = serde_json::to_string_pretty(value).unwrap_or_else(|err| err.to_string());
    CallToolResult::success(vec![ContentBlock::text(text)])
}

/// A failed tool result: `{"error": {"kind", "message"}}` with `isError` set, where `kind` is
/// the service's stable error kind (or `unavailable` / `timeout` / `transport` when no service
/// answered) so the model can decide what to do next.
pub(super) fn failure(err: &ClientError) -> CallToolResult {
    let kind = match err {
        ClientError::Service(reply) => reply.kind().to_string(),
        ClientError::InvalidId(_) => "bad_request".to_owned(),
        ClientError::NoResponders { .. } => "unavailable".to_owned(),
        ClientError::Timeout { .. } => "timeout".to_owned(),
        _ => "transport".to_owned(),
    };
    refused(&kind, &err.to_string())
}

pub(super) fn refused(kind: &str, message: &str) -> CallToolResult {
    let body = serde_json::json!({ "error": { "kind": kind, "message": message } });
    CallToolResult::error(vec![ContentBlock::text(body.to_string())])
}

pub(super) fn outcome<T: serde::Serialize>(result: Result<T, ClientError>) -> CallToolResult {
    match result {
        Ok(value) => reply(&value),
        Err(err) => failure(&err),
    }
}

#[tool_router(vis = "pub(super)")]
impl SwitchboardMcp {
    #[tool(
        description = "List the other agents you can talk to: their ids, descriptions, \
                       capabilities, status (idle/busy/offline) and whether you may reach them. \
                       Call this before send_to_peer, talk_to_agent or create_task to find the \
                       right agent id. Peers come in pages in id order; when the answer has \
                       `next`, call again with `after` set to it for more. Give `skill` to list \
                       only the agents that can do one thing; or skip the choice and address \
                       work to `skill:<name>` (send_to_peer, talk_to_agent, create_task): the \
                       fabric picks an idle, least loaded agent with that skill."
    )]
    async fn list_peers(&self, Parameters(params): Parameters<ListPeersParams>) -> CallToolResult {
        outcome(
            self.agent
                .peers_page(&switchboard_proto::registry::PeersRequest {
                    after: params.after,
                    limit: params.limit,
                    skill: params.skill,
                })
                .await,
        )
    }

    #[tool(
        description = "Send a one-way message to another agent (fire and forget): it lands in \
                       every live session of that agent. Use to=\"*\" to broadcast to every peer \
                       you may reach. Returns the delivery report: which sessions got it and, \
                       for peers it could not reach, why. Call list_peers first to pick the id. \
                       To get an answer back, use talk_to_agent instead. to=\"person:<id>\" or \
                       \"role:<name>\" notes a person (list_people); a person's answer comes \
                       only through ask_person."
    )]
    async fn send_to_peer(&self, Parameters(params): Parameters<SendParams>) -> CallToolResult {
        if switchboard_client::proto::people::Party::looks_like(&params.to) {
            if !params.attachments.is_empty() {
                return refused(
                    "bad_request",
                    "a note to a person carries text only, no attachments",
                );
            }
            return outcome(self.agent.note_person(&params.to, &params.message).await);
        }
        let attachments = match self.attachments(&params.attachments).await {
            Ok(attachments) => attachments,
            Err(result) => return result,
        };
        let request = SendRequest {
            to: Some(params.to),
            message: Some(params.message),
            in_reply_to: params.in_reply_to,
            correlation_id: params.correlation_id,
            from_goal_id: Some(self.goal.id()),
            receipt: params.receipt,
            attachments,
            ..SendRequest::default()
        };
        outcome(self.agent.send(request).await)
    }

    #[tool(
        description = "Where a message you sent with receipt=\"delivered\" or \"read\" is, for \
                       each session of the receiver: stored (not picked up yet), delivered \
                       (received, not read yet), read, or expired_unread (dropped unread: its \
                       inbox was full). Use it before sending a reminder or giving up on an \
                       answer; the kind=\"receipt\" messages in check_inbox say the same as it \
                       happens."
    )]
    async fn message_status(
        &self,
        Parameters(params): Parameters<MessageStatusParams>,
    ) -> CallToolResult {
        outcome(self.agent.send_status(params.message_id).await)
    }

    #[tool(
        description = "Consult another agent and wait for its answer (a correlated call): \
                       returns the answer text (the whole of it when the agent answers in \
                       parts; each part is reported as progress while you wait), or an error \
                       with kind timeout, cycle, depth_exceeded, expired or unreachable. Use it \
                       when you need the answer before you can go on; the other agent answers \
                       with reply_to_peer. While you answer another agent's request you may ask \
                       that agent a question back with this tool (it is part of its call, not \
                       a cycle). A call made while you answer another agent's call never \
                       outlives that call: its timeout is cut to what is left (clamped: true \
                       says so)."
    )]
    async fn talk_to_agent(
        &self,
        Parameters(params): Parameters<TalkParams>,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        // A call made while a request to us is open continues that request's chain, so the
        // correlator can refuse cycles (A asks B, B asks A) and over-deep chains; one to the
        // agent that asked is a question back inside its call.
        let serving_request = self.last_request();
        let attachments = match self.attachments(&params.attachments).await {
            Ok(attachments) => attachments,
            Err(result) => return result,
        };

        let in_reply_to = serving_request
            .as_ref()
            .filter(|request| request.from.as_str() == params.to.trim())
            .and_then(|request| request.request_id);
        let request = CallRequest {
            to: Some(params.to),
            message: Some(params.message),
            timeout_ms: Some(params.timeout_ms.unwrap_or(30_000)),
            from_goal_id: Some(self.goal.id()),
            receipt: params.receipt,
            in_reply_to,
            attachments,
            ..CallRequest::default()
        };
        let progress = context.meta.get_progress_token();
        let call = async {
            let mut events = Box::pin(self.agent.call_streamed(request).await?);
            while let Some(event) = events.next().await {
                match event? {
                    CallEvent::Part(part) => {
                        if let Some(token) = &progress {
                            let note =
                                ProgressNotificationParam::new(token.clone(), f64::from(part.part))
                                    .with_message(part.body);
                            if let Err(err) = context.peer.notify_progress(note).await {
                                tracing::debug!(error = %err, "progress notification not sent");
                            }
                        }
                    }
                    CallEvent::Answer(answer) => return Ok(answer),
                }
            }
            Err(ClientError::Request {
                subject: switchboard_client::proto::subject::CALL_PREFIX.to_owned(),
                message: "the call ended without an answer".to_owned(),
            })
        };
        let result = match serving_request {
            Some(parent) => serving(parent.correlation_id, call).await,
            None => call.await,
        };
        outcome(result)
    }

    #[tool(
        description = "Answer a peer that asked you something (a message with kind=\"request\" \
                       in check_inbox). No target needed: without correlation_id it answers the \
                       most recent request you have not answered yet. With partial=true it \
                       sends part of a long answer now and keeps the request open; the next \
                       reply_to_peer without partial ends it. Returns the service's \
                       acknowledgement, or an error (e.g. expired when the caller stopped \
                       waiting)."
    )]
    async fn reply_to_peer(&self, Parameters(params): Parameters<ReplyParams>) -> CallToolResult {
        let target = match params.correlation_id.or_else(|| self.last_unanswered()) {
            Some(id) => id,
            None => match self.agent.pending_calls().await {
                Ok(pending) => match pending.incoming.last() {
                    Some(call) => call.correlation_id,
                    None => {
                        return refused(
                            "not_found",
                            "no request is waiting for your answer; use send_to_peer to \
                             message a peer",
                        );
                    }
                },
                Err(err) => return failure(&err),
            },
        };
        let attachments = match self.attachments(&params.attachments).await {
            Ok(attachments) => attachments,
            Err(result) => return result,
        };
        if params.partial {
            let part = self.next_part(target);
            let result = self
                .agent
                .reply_with(ReplyRequest {
                    correlation_id: Some(target),
                    message: Some(params.message),
                    partial: true,
                    part: Some(part),
                    attachments,
                    ..ReplyRequest::default()
                })
                .await;
            // Only a part refused outright gives its number back; one that may have been
            // taken (a timeout) keeps it, so the next part cannot be mistaken for its retry.
            if matches!(&result, Err(err) if err.kind().is_some_and(|kind| kind.is_refusal()
                || kind == switchboard_client::proto::ErrorKind::BadRequest))
            {
                self.part_not_sent(target);
            }
            return outcome(result);
        }
        let result = self
            .agent
            .reply_with_attachments(target, &params.message, attachments)
            .await;
        if result.is_ok()
            || matches!(&result, Err(err) if err.kind().is_some_and(|kind| kind.is_refusal()
                || kind == switchboard_client::proto::ErrorKind::NotFound))
        {
            self.answered(target);
        }
        outcome(result)
    }

    #[tool(
        description = "Read the new messages in your inbox (and take them: each is shown once). \
                       Returns a # PEER MESSAGES block of <peer-message> elements with the \
                       sender, time and, where present, correlation_id, kind (request, \
                       response, notify, task, task_update, receipt) and task_id. A \
                       kind=\"receipt\" says a message you sent with receipt was delivered to \
                       or read by its peer (metadata.state). Answer kind=\"request\" \
                       with reply_to_peer; act on kind=\"task\" with update_task."
    )]
    async fn check_inbox(&self, _: Parameters<NoParams>) -> CallToolResult {
        // One page of unread messages is taken (acknowledged) once the block that hands it to
        // the model is ready: that is the moment they are read. A failed fetch or ack leaves
        // them unread, so the next check_inbox shows them again rather than losing them; more
        // than one page waiting is said at the end of the block.
        let page = match self.goal.fetch(FETCH_MAX, Duration::ZERO, None).await {
            Ok(page) => page,
            Err(err) => return failure(&err),
        };
        let through = page.messages.last().map(|m| m.seq);
        let more = page.unread.saturating_sub(page.messages.len() as u64);
        let expired = page.expired_unread.clone();
        let messages: Vec<InboxMessage> = page.messages.into_iter().map(|m| m.message).collect();
        self.remember_requests(&messages);
        let mut text =
            render_peer_messages_block(&messages).unwrap_or_else(|| "No new messages.".to_owned());
        text.push_str(&self.budget_lines(&messages).await);
        if more > 0 {
            text.push_str(&format!(
                "\n({more} more unread message(s): call check_inbox again to read them)"
            ));
        }
        // Said to the model, so it knows it missed something (each sender was told too).
        if let Some(expired) = expired {
            text.push_str(&format!(
                "\n({} message(s) to you were removed unread because your inbox was full; \
                 their senders were told)",
                expired.count
            ));
        }
        if let Some(through) = through
            && let Err(err) = self.goal.ack_through(through).await
        {
            return failure(&err);
        }
        CallToolResult::success(vec![ContentBlock::text(text)])
    }

    #[tool(
        description = "Give a task to another agent and keep working: it gets a kind=\"task\" \
                       message, accepts and works on it, and every change of state comes back \
                       to your inbox as kind=\"task_update\" (the last one carries the result). \
                       Returns the task record with its task_id. Call list_peers first."
    )]
    async fn create_task(
        &self,
        Parameters(params): Parameters<CreateTaskParams>,
    ) -> CallToolResult {
        let attachments = match self.attachments(&params.attachments).await {
            Ok(attachments) => attachments,
            Err(result) => return result,
        };
        let task = CreateTask {
            to: Some(params.to),
            message: Some(params.message),
            deadline_in_ms: params.deadline_in_ms,
            from_goal_id: Some(self.goal.id()),
            receipt: params.receipt,
            attachments,
            ..CreateTask::default()
        };
        outcome(self.agent.create_task(task).await)
    }

    #[tool(
        description = "Move a task given to you through its life: accept (take it), reject \
                       (decline, say why), start, progress (a note to the requester), \
                       input_required (ask the requester a question), complete (with the \
                       result), fail (say why). Returns the task record, or an error such as \
                       illegal_transition, at_capacity or task_terminal."
    )]
    async fn update_task(
        &self,
        Parameters(params): Parameters<UpdateTaskParams>,
    ) -> CallToolResult {
        let op = params.action;
        if !update_actions().any(|action| action == op) {
            let actions: Vec<&str> = update_actions().map(TaskOp::as_str).collect();
            return refused(
                "bad_request",
                &format!(
                    "update_task cannot `{}` a task (its actions: {}); to cancel a task you \
                     created, use cancel_task",
                    op.as_str(),
                    actions.join(", ")
                ),
            );
        }
        let attachments = match self.attachments(&params.attachments).await {
            Ok(attachments) => attachments,
            Err(result) => return result,
        };
        let action = TaskAction {
            task_id: Some(params.task_id),
            message: params.message,
            from_goal_id: Some(self.goal.id()),
            attachments,
            ..TaskAction::default()
        };
        outcome(self.agent.task_op(op, action).await)
    }

    #[tool(
        description = "Hand part of the task you are working on to a subagent and keep \
                       working: omit agent to spawn a copy of yourself, or name an expert agent. \
                       The subagent's result returns to your inbox as a task_update. Returns \
                       the subtask record; its task_id is the handle for subagent_status. \
                       Subtasks nest at most 3 deep, with at most 8 open per task, and never \
                       outlive your task's deadline (deadline_clamped: true when it was cut)."
    )]
    async fn spawn_subagent(&self, Parameters(params): Parameters<SpawnParams>) -> CallToolResult {
        let task = CreateTask {
            to: Some(params.agent.unwrap_or_else(|| "self".to_owned())),
            message: Some(params.message),
            deadline_in_ms: params.deadline_in_ms,
            parent_task_id: Some(params.parent_task_id),
            from_goal_id: Some(self.goal.id()),
            ..CreateTask::default()
        };
        outcome(self.agent.create_task(task).await)
    }

    #[tool(
        description = "Deliver your result for a task or subtask you worked on: the result goes \
                       to whoever gave it to you and the task ends (completed). This is the only \
                       way a subagent's findings reach its parent."
    )]
    async fn complete_task(
        &self,
        Parameters(params): Parameters<CompleteParams>,
    ) -> CallToolResult {
        let attachments = match self.attachments(&params.attachments).await {
            Ok(attachments) => attachments,
            Err(result) => return result,
        };
        let result = TaskOutcome {
            result: params.result,
            attachments,
            ..TaskOutcome::default()
        };
        outcome(self.agent.complete_task(params.task_id, result).await)
    }

    #[tool(
        description = "Check on tasks: with task_id, that task's record (state, result, \
                       history); with parent_task_id, every subtask of that task and its state. \
                       Read-only."
    )]
    async fn subagent_status(
        &self,
        Parameters(params): Parameters<StatusParams>,
    ) -> CallToolResult {
        match (params.task_id, params.parent_task_id) {
            (Some(task), _) => outcome(self.agent.get_task(task).await),
            (None, Some(parent)) => outcome(self.agent.subtasks(parent).await),
            (None, None) => refused("bad_request", "give task_id or parent_task_id"),
        }
    }

    #[tool(
        description = "Cancel a task you created (its open subtasks are canceled too; the \
                       assignee is told). Returns the task record and descendants: every \
                       subtask with the state the cancel left it in, so you know what was \
                       stopped; or task_terminal if it already ended."
    )]
    async fn cancel_task(&self, Parameters(params): Parameters<CancelParams>) -> CallToolResult {
        outcome(
            self.agent
                .cancel_task(params.task_id, params.reason.as_deref())
                .await,
        )
    }

    #[tool(
        description = "The open correlated calls: outgoing (you asked, no answer yet) and \
                       incoming (others wait for your reply_to_peer), with correlation ids and \
                       callers. Use it to see what you still owe."
    )]
    async fn pending_requests(&self, _: Parameters<NoParams>) -> CallToolResult {
        outcome(self.agent.pending_calls().await)
    }
}

impl SwitchboardMcp {
    /// One line per message that gives work with a cost budget (docs/protocol.md §16): what is
    /// left of it now, so the model can plan. Empty when no message carries one.
    async fn budget_lines(&self, messages: &[InboxMessage]) -> String {
        let mut lines = String::new();
        for message in messages {
            let Some(grant) = switchboard_client::budget_of(message) else {
                continue;
            };
            let of = |left: u64, granted: Option<u64>, unit: &str| match granted {
                Some(granted) => format!("{left} of {granted} {unit} left"),
                None => format!("{unit} unbounded"),
            };
            let (left_cost, left_tokens) = match self.agent.budget(&grant).await {
                Ok(view) => (view.left.cost, view.left.tokens),
                Err(_) => (grant.cost.unwrap_or(0), grant.tokens.unwrap_or(0)),
            };
            lines.push_str(&format!(
                "\n(budget of {} {}: {}, {}; calls and subtasks you make while serving it \
                 draw on it, and past it they are refused with budget_exhausted)",
                if message.task.is_some() {
                    "task"
                } else {
                    "request"
                },
                grant.work,
                of(left_cost, grant.cost, "micro-units of cost"),
                of(left_tokens, grant.tokens, "tokens"),
            ));
        }
        lines
    }
}
