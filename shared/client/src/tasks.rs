//! Tasks: one method per op of `agent.task.<op>.<agent_id>`, and a worker loop that takes the
//! tasks arriving in a goal through accept → start → work → complete / fail.

use std::future::Future;

use switchboard_proto::task::{
    CreateTask, ListTasks, TaskAction, TaskList, TaskOp, TaskRecord, TaskReply, TaskRequestOp,
};
use switchboard_proto::{GoalId, InboxMessage, MessageKind, Part};
use switchboard_request::request::request_json_retrying;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;
use uuid::Uuid;

use crate::Agent;
use crate::error::ClientError;
use crate::goal::Goal;
use crate::request;

/// What a piece of work produced: the result text and parts of a completed task.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TaskOutcome {
    /// The result text (may be empty).
    pub result: String,
    /// Result parts, stored as the task's `result_parts` and sent to the requester.
    pub parts: Vec<Part>,
    /// Result files (the task's artifacts), uploaded first ([`Agent::upload_file`]): stored
    /// as the task's `result_attachments`; the requester may read them.
    pub attachments: Vec<switchboard_proto::files::Attachment>,
}

impl TaskOutcome {
    /// An outcome with only result text, no parts.
    pub fn text(result: impl Into<String>) -> Self {
        Self {
            result: result.into(),
            parts: Vec::new(),
            attachments: Vec::new(),
        }
    }
}

impl Agent {
    /// Sends a task request. Requests that are safe to repeat (every op but `progress`) are
    /// retried when no service answered; the service recognises a repeat and answers it with
    /// `duplicate: true` instead of a second transition.
    async fn task_request<Req, Resp>(
        &self,
        op: TaskRequestOp,
        body: &Req,
        retry: bool,
    ) -> Result<Resp, ClientError>
    where
        Req: serde::Serialize + ?Sized,
        Resp: serde::de::DeserializeOwned,
    {
        let timeout = self.options().request_timeout;
        if retry {
            request_json_retrying(
                self.nats(),
                &op.subject(self.id()),
                body,
                timeout,
                self.options().send_retries,
            )
            .await
            .map_err(ClientError::from)
        } else {
            request(self.nats(), op.subject(self.id()), body, timeout).await
        }
    }

    /// create: hands a task to another agent; every live goal of it gets a `kind: task`
    /// message. The task id is chosen here when absent (so a retry is recognised) and updates
    /// go to this agent's current goal unless `from_goal_id` says otherwise.
    pub async fn create_task(&self, mut task: CreateTask) -> Result<TaskReply, ClientError> {
        task.task_id.get_or_insert_with(switchboard_proto::new_id);
        if task.from_goal_id.is_none() {
            task.from_goal_id = self.current_goal();
        }
        let op = if task.parent_task_id.is_some() {
            TaskRequestOp::Spawn
        } else {
            TaskRequestOp::Create
        };
        self.task_request(op, &task, true).await
    }

    /// create with just an assignee and what to do.
    pub async fn give_task(&self, to: &str, message: &str) -> Result<TaskReply, ClientError> {
        self.create_task(CreateTask {
            to: Some(to.to_owned()),
            message: Some(message.to_owned()),
            ..CreateTask::default()
        })
        .await
    }

    /// spawn: a subtask of `parent` (a task this agent works on) for `to`, or for any live
    /// goal of this agent itself with `to = "self"`. Its result comes back to this agent's
    /// goal as a `task_update`.
    pub async fn spawn_subtask(
        &self,
        parent: Uuid,
        to: &str,
        message: &str,
    ) -> Result<TaskReply, ClientError> {
        self.create_task(CreateTask {
            to: Some(to.to_owned()),
            message: Some(message.to_owned()),
            parent_task_id: Some(parent),
            ..CreateTask::default()
        })
        .await
    }

    /// Any transition with every option (`accept` fills in the current goal as the goal that
    /// takes the task).
    pub async fn task_op(
        &self,
        op: TaskOp,
        mut action: TaskAction,
    ) -> Result<TaskReply, ClientError> {
        if op == TaskOp::Accept && action.from_goal_id.is_none() {
            action.from_goal_id = self.current_goal();
        }
        self.task_request(
            TaskRequestOp::Transition(op),
            &action,
            op != TaskOp::Progress,
        )
        .await
    }

    async fn simple_op(
        &self,
        op: TaskOp,
        task_id: Uuid,
        text: Option<&str>,
        parts: Vec<Part>,
    ) -> Result<TaskReply, ClientError> {
        self.task_op(
            op,
            TaskAction {
                task_id: Some(task_id),
                message: text.map(str::to_owned),
                parts,
                ..TaskAction::default()
            },
        )
        .await
    }

    /// accept: take the task (refused with `at_capacity`, `acl_denied` or `expired`).
    pub async fn accept_task(&self, task_id: Uuid) -> Result<TaskReply, ClientError> {
        self.simple_op(TaskOp::Accept, task_id, None, Vec::new())
            .await
    }

    /// reject: refuse a submitted task, saying why.
    pub async fn reject_task(&self, task_id: Uuid, reason: &str) -> Result<TaskReply, ClientError> {
        self.simple_op(TaskOp::Reject, task_id, Some(reason), Vec::new())
            .await
    }

    /// start: begin work on an accepted task, or resume after input.
    pub async fn start_task(&self, task_id: Uuid) -> Result<TaskReply, ClientError> {
        self.simple_op(TaskOp::Start, task_id, None, Vec::new())
            .await
    }

    /// progress: tell the requester how it goes (state stays `working`).
    pub async fn task_progress(
        &self,
        task_id: Uuid,
        note: &str,
        parts: Vec<Part>,
    ) -> Result<TaskReply, ClientError> {
        self.simple_op(TaskOp::Progress, task_id, Some(note), parts)
            .await
    }

    /// input_required: ask the requester a question; `start` resumes once answered.
    pub async fn ask_requester(
        &self,
        task_id: Uuid,
        question: &str,
    ) -> Result<TaskReply, ClientError> {
        self.simple_op(TaskOp::InputRequired, task_id, Some(question), Vec::new())
            .await
    }

    /// complete: finish with a result; the requester's goal gets it as a `task_update`.
    pub async fn complete_task(
        &self,
        task_id: Uuid,
        outcome: TaskOutcome,
    ) -> Result<TaskReply, ClientError> {
        let text = (!outcome.result.is_empty()).then_some(outcome.result.as_str());
        self.task_op(
            TaskOp::Complete,
            TaskAction {
                task_id: Some(task_id),
                message: text.map(str::to_owned),
                parts: outcome.parts,
                attachments: outcome.attachments,
                from_goal_id: None,
            },
        )
        .await
    }

    /// fail: give up, saying why.
    pub async fn fail_task(&self, task_id: Uuid, reason: &str) -> Result<TaskReply, ClientError> {
        self.simple_op(TaskOp::Fail, task_id, Some(reason), Vec::new())
            .await
    }

    /// cancel: the requester calls a task off (its open subtasks are canceled too).
    pub async fn cancel_task(
        &self,
        task_id: Uuid,
        reason: Option<&str>,
    ) -> Result<TaskReply, ClientError> {
        self.simple_op(TaskOp::Cancel, task_id, reason, Vec::new())
            .await
    }

    /// get: one task this agent is a party of (or of one of its ancestors).
    pub async fn get_task(&self, task_id: Uuid) -> Result<TaskRecord, ClientError> {
        let action = TaskAction {
            task_id: Some(task_id),
            ..TaskAction::default()
        };
        let reply: TaskReply = self.task_request(TaskRequestOp::Get, &action, true).await?;
        Ok(reply.task)
    }

    /// list: this agent's tasks by role and state, or a task's children, paged.
    pub async fn list_tasks(&self, query: &ListTasks) -> Result<TaskList, ClientError> {
        self.task_request(TaskRequestOp::List, query, true).await
    }

    /// subagent_status: the children of `parent` and their states.
    pub async fn subtasks(&self, parent: Uuid) -> Result<Vec<TaskRecord>, ClientError> {
        let mut all = Vec::new();
        let mut cursor = None;
        loop {
            let page = self
                .list_tasks(&ListTasks {
                    parent: Some(parent),
                    cursor,
                    limit: Some(switchboard_proto::task::LIST_LIMIT_MAX),
                    ..ListTasks::default()
                })
                .await?;
            all.extend(page.tasks);
            match page.next_cursor {
                Some(next) => cursor = Some(next),
                None => return Ok(all),
            }
        }
    }

    /// Works on one `kind: task` message that arrived in `goal`: accept (for that goal) →
    /// start → `work` → complete (its `Ok`) or fail (its `Err`, the reason). Returns the task
    /// as it ended, or the refusal of accept (e.g. `at_capacity`: the task stays submitted
    /// for later; `illegal_transition`: another goal took it).
    pub async fn work_on<F, Fut>(
        &self,
        goal: GoalId,
        message: &InboxMessage,
        work: F,
    ) -> Result<TaskRecord, ClientError>
    where
        F: FnOnce(TaskRecord) -> Fut,
        Fut: Future<Output = Result<TaskOutcome, String>>,
    {
        let Some(task) = message
            .task
            .as_ref()
            .filter(|_| message.kind == MessageKind::Task)
        else {
            return Err(ClientError::Inbox("not a `kind: task` message".to_owned()));
        };
        // Accepted for this goal: if another goal of this agent took it first, this is
        // refused (`illegal_transition`) and the work is theirs.
        self.task_op(
            TaskOp::Accept,
            TaskAction {
                task_id: Some(task.id),
                from_goal_id: Some(goal),
                ..TaskAction::default()
            },
        )
        .await?;
        let started = self.start_task(task.id).await?;
        let reply = match work(started.task).await {
            Ok(outcome) => self.complete_task(task.id, outcome).await?,
            Err(reason) => self.fail_task(task.id, &reason).await?,
        };
        Ok(reply.task)
    }

    /// The agent-side task loop: reads `goal` until `stop`, works on every task that arrives
    /// (one at a time, with [`Agent::work_on`], in the span of its delivery, so its
    /// transitions join the trace the task was created in) and hands every other message to
    /// `others` (or drops it with a debug log when `None`). Messages are acknowledged once
    /// taken.
    pub async fn serve_tasks<F, Fut>(
        &self,
        goal: &Goal,
        stop: CancellationToken,
        others: Option<tokio::sync::mpsc::UnboundedSender<InboxMessage>>,
        work: F,
    ) -> Result<(), ClientError>
    where
        F: Fn(TaskRecord) -> Fut,
        Fut: Future<Output = Result<TaskOutcome, String>>,
    {
        loop {
            let delivery = tokio::select! {
                () = stop.cancelled() => return Ok(()),
                next = goal.recv(std::time::Duration::from_secs(1)) => next?,
            };
            let Some(delivery) = delivery else { continue };
            // Handled in the sender's trace: the task's transitions join the trace it was
            // created in.
            let span = delivery.span();
            let message = delivery.ack().instrument(span.clone()).await?;
            if message.kind == MessageKind::Task {
                match self
                    .work_on(goal.id(), &message, &work)
                    .instrument(span)
                    .await
                {
                    Ok(task) => {
                        tracing::info!(task_id = %task.task_id, state = task.state.as_str(), "task worked on")
                    }
                    Err(err) => tracing::warn!(error = %err, "task not worked on"),
                }
            } else if let Some(others) = &others {
                let _ = others.send(message);
            } else {
                tracing::debug!(kind = ?message.kind, "non-task message dropped by the task loop");
            }
        }
    }
}
