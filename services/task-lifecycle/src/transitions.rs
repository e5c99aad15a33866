//! The ops on a task (accept, reject, start, progress, input_required, complete, fail,
//! cancel) and how every change is written and told.
//!
//! Every change is: read the record, check the op against the state machine
//! (`switchboard_proto::task::apply`) and, for accept, the acceptance rules (`load.rs`), write
//! with compare-and-set on the revision read, and only then tell the world (here): the event
//! on `agent.task.events.<id>`, a `kind: task_update` message to the requester's goal (the
//! `callback` unchanged) and a notice to the assignee when someone else moved its task. The
//! assignee's load goes to the directory (`load.rs`) and a task that ends cancels its open
//! descendants (`sweep.rs`). A writer that loses the compare-and-set re-reads and decides
//! again, so no transition happens twice or illegally.

use switchboard_delivery::door::{Address, Letter, Origin};
use switchboard_proto::files::Attachment;
use switchboard_proto::send::{check_attachments, check_content_fits};
use switchboard_proto::task::{
    self as rules, DescendantState, HISTORY_KEPT, TaskAction, TaskEvent, TaskOp, TaskRecord,
    TaskReply, TaskRole, TaskTransition,
};
use switchboard_proto::{
    AgentId, GoalId, InboxMessage, MessageKind, Part, TaskState, new_id, subject, timestamp,
};
use switchboard_runtime::publish::publish_event;
use switchboard_runtime::store::StoreError;

use crate::error::TaskError;
use crate::store::TaskEntry;
use crate::tasks::{CAS_ATTEMPTS, Tasks, task_ref};

/// Notes kept in a record's history are shortened to this many characters.
const NOTE_KEPT: usize = 512;

impl Tasks {
    /// accept, reject, start, progress, input_required, complete, fail, cancel: the request
    /// checked, then the task read and moved by compare-and-set ([`Tasks::try_act`]), read
    /// again whenever another writer won.
    pub async fn act(
        &self,
        caller: &AgentId,
        op: TaskOp,
        request: TaskAction,
    ) -> Result<TaskReply, TaskError> {
        let Some(task_id) = request.task_id else {
            return Err(TaskError::TaskIdRequired);
        };
        let text = check_action(op, &request)?;
        self.check_files(caller, &request.attachments).await?;
        if op == TaskOp::Accept
            && let Some(goal) = &request.from_goal_id
        {
            self.check_goal(caller, goal).await?;
        }
        for _ in 0..CAS_ATTEMPTS {
            let Some(stored) = self.store.find(&task_id).await? else {
                return Err(TaskError::NotFound(task_id));
            };
            if let Some(reply) = self.try_act(caller, op, &request, text, stored).await? {
                return Ok(reply);
            }
        }
        Err(TaskError::KeepsChanging(task_id))
    }

    /// One attempt at `op` on the task as `stored`: a retry of the task's last step changes
    /// nothing; a task past its deadline fails now, whoever asks; otherwise the state machine
    /// decides, and the change is committed. `None` when another writer won (read again).
    async fn try_act(
        &self,
        caller: &AgentId,
        op: TaskOp,
        request: &TaskAction,
        text: Option<&str>,
        stored: TaskEntry,
    ) -> Result<Option<TaskReply>, TaskError> {
        let task = &stored.task;
        let task_id = task.task_id;
        let Some(role) = task.role_of(caller, op) else {
            return Err(TaskError::NotAParty {
                caller: caller.clone(),
                task: task_id,
            });
        };
        // An accept from another goal of the same agent is not a retry: the first goal that
        // accepted has the task.
        let other_goal = op == TaskOp::Accept
            && request.from_goal_id.is_some()
            && request.from_goal_id != task.assignee_goal;
        if op != TaskOp::Progress && !other_goal && is_repeat(task, op, caller) {
            return Ok(Some(reply(stored.task, true, Vec::new())));
        }
        if !task.state.is_terminal()
            && let Some(deadline) = task.deadline
            && deadline <= timestamp::now()
        {
            if self.expire(&stored).await?.is_none() {
                return Ok(None);
            }
            return Err(TaskError::DeadlineExpired {
                task: task_id,
                deadline,
            });
        }
        let next = rules::apply(task.state, op, role).map_err(TaskError::Refused)?;
        // The update carries the text, the parts and the task's callback.
        let callback = task.callback.clone().map(serde_json::Value::Object);
        let attachments = serde_json::to_value(&request.attachments).unwrap_or_default();
        check_content_fits(
            "the text with its parts, attachments and the task's callback",
            text.unwrap_or(""),
            &request.parts,
            &[
                callback.as_ref().unwrap_or(&serde_json::Value::Null),
                &attachments,
            ],
        )
        .map_err(TaskError::Gate)?;
        if op == TaskOp::Accept {
            self.check_acceptance(task).await?;
            self.reserve(&task.assignee, task_id).await?;
        }
        let updated = moved(task, next, op, request, text);
        let change = Change {
            op,
            by: Some(caller.clone()),
            role,
            text: text.map(str::to_owned),
            parts: request.parts.clone(),
            attachments: request.attachments.clone(),
        };
        if let Some(done) = self.commit(&stored, updated, &change).await? {
            let descendants = if done.task.state.is_terminal() {
                self.cascade(&done.task).await
            } else {
                Vec::new()
            };
            return Ok(Some(reply(done.task, false, descendants)));
        }
        // Another writer won: decide again on what it wrote. This accept's reservation stays
        // only if the task became active (accepted by a racing request).
        if op == TaskOp::Accept
            && !self
                .store
                .find(&task_id)
                .await?
                .is_some_and(|now| now.task.state.is_active())
        {
            self.release(&task.assignee, task_id).await;
        }
        Ok(None)
    }

    /// Writes a transition and, if it won, tells everyone. `Ok(None)`: another writer won.
    pub(crate) async fn commit(
        &self,
        stored: &TaskEntry,
        mut updated: TaskRecord,
        change: &Change,
    ) -> Result<Option<TaskEntry>, StoreError> {
        let before = &stored.task;
        let now = timestamp::now();
        updated.updated_at = now;
        updated.transitions = before.transitions + 1;
        updated.history.push(TaskTransition {
            op: change.op,
            by: change.by.clone(),
            from: before.state,
            to: updated.state,
            at: now,
            note: change.text.as_deref().map(shorten),
        });
        if updated.history.len() > HISTORY_KEPT {
            let excess = updated.history.len() - HISTORY_KEPT;
            updated.history.drain(..excess);
        }
        let Some(done) = self.store.update(stored, updated).await? else {
            return Ok(None);
        };
        let task = &done.task;
        tracing::info!(task_id = %task.task_id, op = change.op.as_str(), from = before.state.as_str(), to = task.state.as_str(), by = ?change.by, "task transition");
        // The other party may read the op's files (checked before the op) before it hears of
        // them, also without a live goal to deliver to (an A2A client reads its task's
        // artifacts through the gateway); only once the op is in.
        if let Some(by) = &change.by
            && let Err(err) = self.grant_files(by, task, &change.attachments).await
        {
            tracing::warn!(task_id = %task.task_id, error = %err, "the other party was not granted the op's files");
        }
        self.emit(
            task,
            Some(change.op),
            change.by.as_ref(),
            change.text.as_deref(),
            &change.parts,
            &change.attachments,
        )
        .await;
        self.tell(before, task, change).await;
        let load_changed = before.state.is_active() != task.state.is_active();
        if before.state.is_active() && !task.state.is_active() {
            self.release(&task.assignee, task.task_id).await;
        }
        if load_changed {
            self.report_load(&task.assignee).await;
        }
        Ok(Some(done))
    }

    /// Publishes the creation (`op` absent) or a transition on `agent.task.events.<id>`.
    pub(crate) async fn emit(
        &self,
        task: &TaskRecord,
        op: Option<TaskOp>,
        by: Option<&AgentId>,
        note: Option<&str>,
        parts: &[switchboard_proto::Part],
        attachments: &[Attachment],
    ) {
        // A task that ended gives back what its assignee did not spend (§16).
        if task.state.is_terminal()
            && let Some(budget) = &task.budget
        {
            switchboard_request::budget::close(&self.client, budget);
        }
        {
            use switchboard_runtime::telemetry::metrics;
            metrics::instruments().task_transitions.add(
                1,
                &[
                    metrics::service(crate::SPEC.name),
                    metrics::KeyValue::new("switchboard.task.state", task.state.as_str()),
                ],
            );
        }
        let n = task.transitions;
        let event = TaskEvent {
            id: format!("{}:{n}", task.task_id),
            task_id: task.task_id,
            op,
            by: if op.is_some() {
                by.cloned()
            } else {
                Some(task.requester.clone())
            },
            from: op.and_then(|_| task.history.last().map(|h| h.from)),
            to: task.state,
            requester: task.requester.clone(),
            assignee: task.assignee.clone(),
            parent: task.parent,
            note: note.map(str::to_owned),
            parts: parts.to_vec(),
            attachments: attachments.to_vec(),
            at: task.updated_at,
        };
        let subject = subject::task_events(&task.task_id);
        publish_event(&self.js, &subject, &format!("task:{}", event.id), &event).await;
    }

    /// The `task_update` message to the requester's goal, and a notice to the assignee when
    /// someone else (the requester, the deadline, a cascade) moved its task.
    async fn tell(&self, before: &TaskRecord, task: &TaskRecord, change: &Change) {
        let by = actor_name(change.by.as_ref());
        let id = task.task_id;
        let detail = change
            .text
            .as_deref()
            .map(|t| format!(": {t}"))
            .unwrap_or_default();
        let body = match change.op {
            TaskOp::Accept => format!("{by} accepted task {id}"),
            TaskOp::Reject => format!("{by} rejected task {id}{detail}"),
            TaskOp::Start if before.state == TaskState::InputRequired => {
                format!("{by} resumed work on task {id}")
            }
            TaskOp::Start => format!("{by} started work on task {id}"),
            TaskOp::Progress => format!("progress on task {id}{detail}"),
            TaskOp::InputRequired => format!("{by} needs input on task {id}{detail}"),
            TaskOp::Complete => format!("task {id} completed{detail}"),
            TaskOp::Fail => format!("task {id} failed{detail}"),
            TaskOp::Cancel => format!("task {id} was canceled by {by}{detail}"),
            TaskOp::Expire => format!("task {id} failed{detail}"),
        };
        let n = task.transitions;
        let build = |from: &AgentId, from_goal: Option<GoalId>, to: &AgentId| {
            let mut message = InboxMessage::new(
                from.clone(),
                from_goal.unwrap_or_default(),
                to.clone(),
                &body,
            );
            message.id = Some(new_id());
            message.kind = MessageKind::TaskUpdate;
            message.in_reply_to = Some(task.message_id);
            message.parts = change.parts.clone();
            message.attachments = change.attachments.clone();
            message.task = Some(task_ref(task));
            message.callback = task.callback.clone();
            message
                .metadata
                .insert("task_op".to_owned(), change.op.as_str().into());
            if let Some(by) = &change.by {
                message
                    .metadata
                    .insert("task_by".to_owned(), by.as_str().into());
            }
            if let Some(reason) = &task.reason {
                message
                    .metadata
                    .insert("task_reason".to_owned(), shorten(reason).into());
            }
            message
        };
        let to_requester = build(&task.assignee, task.assignee_goal, &task.requester);
        let requester_goals = self
            .goals_or_all(&task.requester, task.requester_goal)
            .await;
        self.publish_to(
            &task.requester,
            &requester_goals,
            &to_requester,
            &format!("update:{id}:{n}"),
        )
        .await;
        if change.role != TaskRole::Assignee {
            let notice = build(&task.requester, task.requester_goal, &task.assignee);
            let assignee_goals: Vec<GoalId> = self
                .goals_or_all(&task.assignee, task.assignee_goal)
                .await
                .into_iter()
                .filter(|goal| !(task.requester == task.assignee && requester_goals.contains(goal)))
                .collect();
            self.publish_to(
                &task.assignee,
                &assignee_goals,
                &notice,
                &format!("notice:{id}:{n}"),
            )
            .await;
        }
    }

    /// `goal` while it is still a live goal of `agent`, else every live goal of `agent`: a
    /// goal id closed and opened again by another agent gets nothing of `agent`'s.
    async fn goals_or_all(&self, agent: &AgentId, goal: Option<GoalId>) -> Vec<GoalId> {
        let goal = match goal {
            Some(goal) => match self.door.view().owns_goal(agent, &goal).await {
                Ok(false) => None,
                // Ours, or not known for now: the write goes ahead rather than lose it.
                Ok(true) | Err(_) => Some(goal),
            },
            None => None,
        };
        match goal {
            Some(goal) => vec![goal],
            None => self.live_goals(agent).await.unwrap_or_else(|err| {
                tracing::warn!(%agent, error = %err, "goals not listed; message not delivered");
                Vec::new()
            }),
        }
    }

    /// Delivers `message` to each of `agent`'s `goals` through the door, as the service's
    /// word (keyed `<purpose>:<goal>`); returns the goals that took it.
    pub(crate) async fn publish_to(
        &self,
        agent: &AgentId,
        goals: &[GoalId],
        message: &InboxMessage,
        purpose: &str,
    ) -> Vec<GoalId> {
        if goals.is_empty() {
            return Vec::new();
        }
        let letter = Letter {
            to: Address::Goals(agent.clone(), goals.to_vec()),
            from_goal: None,
            message: message.clone(),
        };
        match self.door.deliver(Origin::Service { purpose }, letter).await {
            Ok(report) => {
                for reason in &report.unreachable_reasons {
                    tracing::error!(%agent, %purpose, %reason, "task message not delivered");
                }
                report.delivered_to
            }
            Err(err) => {
                tracing::error!(%agent, %purpose, error = %err, "task message not delivered");
                Vec::new()
            }
        }
    }
}

/// What a transition did, for events and messages.
#[derive(Debug, Clone)]
pub(crate) struct Change {
    pub(crate) op: TaskOp,
    pub(crate) by: Option<AgentId>,
    pub(crate) role: TaskRole,
    pub(crate) text: Option<String>,
    pub(crate) parts: Vec<Part>,
    /// The op's attachments (already checked against the files).
    pub(crate) attachments: Vec<Attachment>,
}

/// The request's own checks: a reject or fail says why, an input_required asks something, a
/// progress says something, and no text is over 64 KiB. Returns the trimmed text, if any.
fn check_action(op: TaskOp, request: &TaskAction) -> Result<Option<&str>, TaskError> {
    let text = request
        .message
        .as_deref()
        .map(str::trim)
        .filter(|t| !t.is_empty());
    match op {
        TaskOp::Reject | TaskOp::Fail if text.is_none() => {
            return Err(TaskError::ReasonRequired(op));
        }
        TaskOp::InputRequired if text.is_none() && request.parts.is_empty() => {
            return Err(TaskError::QuestionRequired);
        }
        TaskOp::Progress if text.is_none() && request.parts.is_empty() => {
            return Err(TaskError::NoteRequired);
        }
        _ => {}
    }
    check_attachments(&request.attachments).map_err(TaskError::Gate)?;
    if let Some(text) = text
        && text.len() > switchboard_proto::MAX_BODY_BYTES
    {
        return Err(TaskError::TextTooLarge { len: text.len() });
    }
    Ok(text)
}

/// `task` moved to `next` by `op`: the goal that accepted it, the result, or the reason.
fn moved(
    task: &TaskRecord,
    next: TaskState,
    op: TaskOp,
    request: &TaskAction,
    text: Option<&str>,
) -> TaskRecord {
    let mut updated = task.clone();
    updated.state = next;
    match op {
        TaskOp::Accept => updated.assignee_goal = request.from_goal_id,
        TaskOp::Complete => {
            updated.result = text.map(str::to_owned);
            updated.result_parts = request.parts.clone();
            updated.result_attachments = request.attachments.clone();
        }
        TaskOp::Reject | TaskOp::Fail | TaskOp::Cancel => {
            updated.reason = text.map(str::to_owned);
        }
        _ => {}
    }
    updated
}

/// The reply to an op: the task as it now is (`duplicate`: a retry changed nothing) and the
/// descendants a terminal op ended.
fn reply(task: TaskRecord, duplicate: bool, descendants: Vec<DescendantState>) -> TaskReply {
    TaskReply {
        task,
        delivered_to: Vec::new(),
        duplicate,
        deadline_clamped: false,
        descendants,
    }
}

/// Whether `op` by `caller` is the task's last step and left it in its current state (a
/// retried request).
fn is_repeat(task: &TaskRecord, op: TaskOp, caller: &AgentId) -> bool {
    task.history.last().is_some_and(|last| {
        last.op == op && last.by.as_ref() == Some(caller) && last.to == task.state
    })
}

/// Who moved a task, for messages.
fn actor_name(by: Option<&AgentId>) -> String {
    by.map_or_else(|| "switchboard".to_owned(), |agent| format!("`{agent}`"))
}

/// A note as a record's history and message metadata keep it: at most `NOTE_KEPT` characters.
fn shorten(text: &str) -> String {
    if text.chars().count() <= NOTE_KEPT {
        text.to_owned()
    } else {
        let mut short: String = text.chars().take(NOTE_KEPT).collect();
        short.push('…');
        short
    }
}
