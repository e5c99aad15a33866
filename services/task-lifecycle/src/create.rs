//! Opening a task: create hands one to another agent; spawn delegates part of the caller's
//! task to a subagent, or to one of its own goals with `to: "self"`.
//!
//! Everything is checked before anything is written: the send gates on `to` and the body, the
//! deadline, both agents registered and the ACL both ways, a live goal of the assignee, and
//! for a spawn the parent's rules (only its assignee spawns, capped in depth, in children over
//! its life and in open children). Then the task is recorded (a child is first linked to its
//! parent, whose record is the compare-and-set target so concurrent spawns are counted one at
//! a time) and the `kind: task` message goes to every live goal of the assignee; a task no
//! goal took is forgotten. A create repeated with the same task id, requester and text is a
//! retry, answered as a duplicate, so nothing is created or delivered twice.

use switchboard_proto::send::{
    Target, check_attachments, check_body, check_content_fits, check_receipt, check_sender,
    check_target,
};
use switchboard_proto::task::{CreateTask, TaskRecord, TaskRefusal, TaskReply};
use switchboard_proto::{
    AgentId, ErrorKind, GoalId, InboxMessage, MessageKind, TaskState, acl, new_id, timestamp,
};
use switchboard_request::request::route_by_skill;
use switchboard_runtime::store::StoreError;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::error::TaskError;
use crate::tasks::{CAS_ATTEMPTS, CHILD_IN_FLIGHT, Tasks, task_ref};

/// The furthest `deadline_in_ms` a task may ask for: 366 days.
const TASK_DEADLINE_MAX_MS: u64 = 366 * 24 * 3_600_000;

impl Tasks {
    /// create: hands a task to another agent (no parent).
    pub async fn create(
        &self,
        caller: &AgentId,
        request: CreateTask,
    ) -> Result<TaskReply, TaskError> {
        self.open_task(caller, request, false).await
    }

    /// spawn: delegates part of the caller's task (`parent_task_id`) to a subagent, or to one of
    /// its own goals with `to: "self"`.
    pub async fn spawn(
        &self,
        caller: &AgentId,
        request: CreateTask,
    ) -> Result<TaskReply, TaskError> {
        self.open_task(caller, request, true).await
    }

    /// What create and spawn share: who the task is for, its deadline, the parties' cards
    /// and the assignee's goals, checked before anything is written; then the task recorded
    /// (linked to its parent for a spawn) and its `kind: task` message delivered to every live
    /// goal of the assignee. A task no goal took is forgotten.
    async fn open_task(
        &self,
        caller: &AgentId,
        request: CreateTask,
        spawn: bool,
    ) -> Result<TaskReply, TaskError> {
        let now = timestamp::now();
        let parent_id = match (spawn, request.parent_task_id) {
            (true, None) => return Err(TaskError::ParentRequired),
            (false, Some(_)) => return Err(TaskError::ParentOnCreate),
            (_, parent) => parent,
        };
        let (assignee, body) = self.assignee(caller, &request, spawn).await?;
        let (deadline, deadline_clamped) = self.deadline(&request, parent_id, now).await?;
        if let Some(goal) = &request.from_goal_id {
            self.check_goal(caller, goal).await?;
        }
        let goals = self.parties(caller, &assignee).await?;
        self.check_files(caller, &request.attachments).await?;
        let task_id = request.task_id.unwrap_or_else(new_id);
        if let Some(existing) = self.store.find(&task_id).await? {
            return self
                .created_again(caller, body, existing.task, &goals)
                .await;
        }
        let mut task = new_task(caller, &assignee, body, &request, now);
        (task.task_id, task.deadline, task.parent) = (task_id, deadline, parent_id);
        task.requester_goal = request.from_goal_id;
        // The budget is reserved before a spawn is linked to its parent, so a spawn refused
        // for its budget leaves no child behind; a task that is not made gives it back (§16).
        task.budget = self.budget(&task, &request).await?;
        let give_back = |task: &TaskRecord| {
            if let Some(budget) = &task.budget {
                switchboard_request::budget::close(&self.client, budget);
            }
        };
        if let Some(parent_id) = parent_id {
            let parent = match self.adopt(caller, parent_id, task_id).await {
                Ok(parent) => parent,
                Err(err) => {
                    give_back(&task);
                    return Err(err);
                }
            };
            task.requester_goal = request.from_goal_id.or(parent.assignee_goal);
            task.depth = parent.depth + 1;
        }
        let depth = task.depth;
        let inserted = self.store.insert(&task).await;
        if inserted.is_err() {
            give_back(&task);
        }
        let Some(stored) = inserted? else {
            // Created meanwhile by a concurrent request with the same id.
            let Some(existing) = self.store.find(&task_id).await? else {
                return Err(TaskError::BeingCreated(task_id));
            };
            return self
                .created_again(caller, body, existing.task, &goals)
                .await;
        };
        let delivered_to = self.deliver_task(&stored.task, &goals).await;
        if delivered_to.is_empty() {
            give_back(&stored.task);
            self.store.forget(&task_id).await?;
            return Err(TaskError::Undelivered(assignee));
        }
        tracing::info!(%task_id, requester = %caller, %assignee, depth, parent = ?parent_id, "task created");
        let task = &stored.task;
        self.emit(task, None, None, None, &[], &task.attachments)
            .await;
        Ok(TaskReply {
            task: stored.task,
            delivered_to,
            duplicate: false,
            deadline_clamped,
            descendants: Vec::new(),
        })
    }

    /// Who the task is for, and its body: the send's target and body checks (`to` present,
    /// not the caller — self only through spawn, as `self` or the caller's id — a non-empty
    /// message of at most 64 KiB), a `skill:` target routed to an agent below its task cap,
    /// and content that fits one inbox message with its parts, metadata and callback.
    async fn assignee<'r>(
        &self,
        caller: &AgentId,
        request: &'r CreateTask,
        spawn: bool,
    ) -> Result<(AgentId, &'r str), TaskError> {
        let to_self = spawn
            && request
                .to
                .as_deref()
                .is_some_and(|to| to.trim() == "self" || to.trim() == caller.as_str());
        let gate = |err: switchboard_proto::ErrorReply| {
            if err.kind() == ErrorKind::SelfSend {
                TaskError::TaskForSelf
            } else {
                TaskError::Gate(err)
            }
        };
        let named = request.from_agent_id.as_deref();
        let target = if to_self {
            check_sender(caller, named).map_err(gate)?;
            None
        } else {
            Some(check_target(caller, named, request.to.as_deref()).map_err(gate)?)
        };
        check_receipt(request.receipt, request.from_goal_id).map_err(gate)?;
        let body = check_body(request.message.as_deref()).map_err(gate)?;
        check_attachments(&request.attachments).map_err(gate)?;
        let assignee = match target {
            None => caller.clone(),
            Some(Target::Broadcast) => return Err(TaskError::Broadcast),
            Some(Target::Peer(to)) => {
                AgentId::parse(&to).map_err(|_| TaskError::UnknownAssignee(to.clone()))?
            }
            Some(Target::Skill(skill)) => route_by_skill(&self.js.client(), caller, &skill, true)
                .await
                .map_err(TaskError::NoSkill)?,
        };
        let callback = request.callback.clone().map(serde_json::Value::Object);
        let metadata = serde_json::Value::Object(request.metadata.clone());
        let attachments = serde_json::to_value(&request.attachments).unwrap_or_default();
        check_content_fits(
            "the message with its parts, attachments, metadata and callback",
            body,
            &request.parts,
            &[
                &metadata,
                callback.as_ref().unwrap_or(&serde_json::Value::Null),
                &attachments,
            ],
        )
        .map_err(TaskError::Gate)?;
        Ok((assignee, body))
    }

    /// The task's deadline, and whether its parent's shortened it: `deadline` or
    /// `deadline_in_ms` (not both, at most a year, in the future); a subtask never outlives
    /// its parent (a parent that ran out takes no more subtasks).
    async fn deadline(
        &self,
        request: &CreateTask,
        parent_id: Option<Uuid>,
        now: OffsetDateTime,
    ) -> Result<(Option<OffsetDateTime>, bool), TaskError> {
        let mut deadline = match (request.deadline, request.deadline_in_ms) {
            (Some(_), Some(_)) => return Err(TaskError::TwoDeadlines),
            (Some(at), None) => Some(at),
            (None, Some(ms)) if ms > TASK_DEADLINE_MAX_MS => {
                return Err(TaskError::DeadlineTooFar {
                    ms,
                    max: TASK_DEADLINE_MAX_MS,
                });
            }
            (None, Some(ms)) => {
                Some(timestamp::checked_after(now, ms).ok_or(TaskError::DeadlineOutOfRange)?)
            }
            (None, None) => None,
        };
        if let Some(at) = deadline
            && at <= now
        {
            return Err(TaskError::DeadlinePassed { at });
        }
        let mut clamped = false;
        if let Some(parent_id) = parent_id
            && let Some(parent) = self.store.find(&parent_id).await?
            && let Some(limit) = parent.task.deadline
        {
            if limit <= now {
                return Err(TaskError::ParentDeadlinePassed {
                    parent: parent_id,
                    at: limit,
                });
            }
            if deadline.is_none_or(|own| own > limit) {
                deadline = Some(limit);
                clamped = true;
            }
        }
        Ok((deadline, clamped))
    }

    /// Who may give whom a task: both registered, the ACL both ways (none for a task to one's
    /// own goals), and an assignee with a live goal. Returns the assignee's goals.
    async fn parties(
        &self,
        caller: &AgentId,
        assignee: &AgentId,
    ) -> Result<Vec<GoalId>, TaskError> {
        let Some(requester_card) = self.door.view().card(caller).await? else {
            return Err(TaskError::NotRegistered(caller.clone()));
        };
        if assignee != caller {
            let Some(assignee_card) = self.door.view().card(assignee).await? else {
                return Err(TaskError::UnknownAssignee(assignee.as_str().to_owned()));
            };
            if let Err(denial) = acl::check(&requester_card, &assignee_card) {
                return Err(TaskError::AclDenied {
                    denial,
                    requester: caller.clone(),
                    assignee: assignee.clone(),
                });
            }
        }
        let goals = self.live_goals(assignee).await?;
        if goals.is_empty() {
            return Err(TaskError::NoLiveGoals(assignee.clone()));
        }
        Ok(goals)
    }

    /// A create whose task id exists already: the same requester and text is a retry (if the
    /// first attempt stopped before its delivery, deliver now: the copies are de-duplicated
    /// per goal by their message id, so nothing arrives twice); anything else is a conflict.
    async fn created_again(
        &self,
        caller: &AgentId,
        body: &str,
        existing: TaskRecord,
        goals: &[GoalId],
    ) -> Result<TaskReply, TaskError> {
        if existing.requester != *caller || existing.message != body {
            return Err(TaskError::Exists(existing.task_id));
        }
        let delivered_to = if existing.state == TaskState::Submitted {
            let delivered = self.deliver_task(&existing, goals).await;
            self.emit(&existing, None, None, None, &[], &existing.attachments)
                .await;
            delivered
        } else {
            Vec::new()
        };
        Ok(TaskReply {
            task: existing,
            delivered_to,
            duplicate: true,
            deadline_clamped: false,
            descendants: Vec::new(),
        })
    }

    /// The task's budget (docs/protocol.md §16): the node it names, else its parent task's,
    /// else a new tree for the amounts it asks, else the configured default; reserved at the
    /// limits service before the task is recorded (a retried create finds its first grant).
    async fn budget(
        &self,
        task: &TaskRecord,
        request: &CreateTask,
    ) -> Result<Option<switchboard_proto::budget::BudgetGrant>, TaskError> {
        if let Some(ask) = &request.budget {
            ask.check().map_err(TaskError::BadBudget)?;
        }
        let inherited = match task.parent {
            Some(parent) => self
                .store
                .find(&parent)
                .await?
                .and_then(|p| p.task.budget)
                .map(|b| (b.root, b.work)),
            None => None,
        };
        let Some(draw) = switchboard_request::budget::draw(
            task.task_id,
            request.budget.as_ref(),
            inherited,
            self.default_budget.clone(),
        ) else {
            return Ok(None);
        };
        switchboard_request::budget::reserve(
            &self.client,
            draw,
            task.task_id,
            (&task.requester, task.requester_goal),
            &task.assignee,
            task.deadline,
        )
        .await
        .map(Some)
        .map_err(TaskError::Budget)
    }

    /// The `kind: task` message to each of the assignee's goals (`Nats-Msg-Id`
    /// `task:<task_id>:<goal>`, so a repeat is stored once); returns the goals that took it.
    async fn deliver_task(&self, task: &TaskRecord, goals: &[GoalId]) -> Vec<GoalId> {
        let mut message = InboxMessage::new(
            task.requester.clone(),
            task.requester_goal.unwrap_or_default(),
            task.assignee.clone(),
            task.message.as_str(),
        );
        message.id = Some(task.message_id);
        message.in_reply_to = task.in_reply_to;
        message.kind = MessageKind::Task;
        message.parts = task.parts.clone();
        message.attachments = task.attachments.clone();
        message.task = Some(task_ref(task));
        message.callback = task.callback.clone();
        message.metadata = task.metadata.clone();
        // Only the service says what budget a task has (docs/protocol.md §16).
        message
            .metadata
            .remove(switchboard_proto::budget::BUDGET_METADATA_KEY);
        if let Some(budget) = &task.budget {
            message.metadata.insert(
                switchboard_proto::budget::BUDGET_METADATA_KEY.to_owned(),
                serde_json::to_value(budget).unwrap_or_default(),
            );
        }
        message.receipt = task.receipt;
        let delivered = self
            .publish_to(
                &task.assignee,
                goals,
                &message,
                &format!("task:{}", task.task_id),
            )
            .await;
        if task.receipt.is_some() {
            let copies: Vec<(AgentId, GoalId)> = delivered
                .iter()
                .map(|goal| (task.assignee.clone(), *goal))
                .collect();
            switchboard_delivery::receipts::advance_logged(
                &self.receipts,
                task.message_id,
                &task.requester,
                &copies,
                switchboard_proto::receipt::ReceiptState::Stored,
            )
            .await;
        }
        delivered
    }

    /// A goal named in a request must be a live goal of the caller (updates go there).
    pub(crate) async fn check_goal(&self, agent: &AgentId, goal: &GoalId) -> Result<(), TaskError> {
        if self.door.view().owns_goal(agent, goal).await? {
            Ok(())
        } else {
            Err(TaskError::NotALiveGoal {
                agent: agent.clone(),
                goal: *goal,
            })
        }
    }

    /// Links a new child to its parent (spawn): the caller must be the parent's assignee, the
    /// parent open, the depth and open-children caps respected. The parent's record is the
    /// compare-and-set target, so concurrent spawns are counted one at a time.
    async fn adopt(
        &self,
        caller: &AgentId,
        parent_id: Uuid,
        child: Uuid,
    ) -> Result<TaskRecord, TaskError> {
        for _ in 0..CAS_ATTEMPTS {
            let Some(parent) = self.store.find(&parent_id).await? else {
                return Err(TaskError::NotFound(parent_id));
            };
            let record = &parent.task;
            if record.assignee != *caller {
                return Err(TaskError::NotParentAssignee {
                    parent: parent_id,
                    assignee: record.assignee.clone(),
                });
            }
            if record.state.is_terminal() {
                return Err(TaskError::Refused(TaskRefusal::Terminal(record.state)));
            }
            if record.depth + 1 > self.config.depth_limit {
                return Err(TaskError::TooDeep {
                    parent: parent_id,
                    depth: record.depth + 1,
                    limit: self.config.depth_limit,
                });
            }
            if record.children.contains(&child) {
                return Ok(parent.task);
            }
            if record.children.len() >= self.config.max_children {
                return Err(TaskError::TooManyChildren {
                    parent: parent_id,
                    max: self.config.max_children,
                });
            }
            let open = self.open_children(record).await?;
            if open >= self.config.max_open_children {
                return Err(TaskError::TooManyOpenChildren {
                    parent: parent_id,
                    open,
                    limit: self.config.max_open_children,
                });
            }
            let mut updated = record.clone();
            updated.children.push(child);
            if let Some(stored) = self.store.update(&parent, updated).await? {
                return Ok(stored.task);
            }
        }
        Err(TaskError::KeepsChanging(parent_id))
    }

    /// Children of `task` that have not ended (one being created counts).
    async fn open_children(&self, task: &TaskRecord) -> Result<usize, StoreError> {
        let now = timestamp::now();
        let mut open = 0;
        for child in &task.children {
            match self.store.find(child).await? {
                Some(stored) if !stored.task.state.is_terminal() => open += 1,
                Some(_) => {}
                None if child_age(child, now).is_some_and(|age| age < CHILD_IN_FLIGHT) => {
                    open += 1;
                }
                None => {}
            }
        }
        Ok(open)
    }
}

/// How old a (v7) id is; `None` for ids without a timestamp.
fn child_age(id: &Uuid, now: OffsetDateTime) -> Option<time::Duration> {
    let (secs, nanos) = id.get_timestamp()?.to_unix();
    let at = OffsetDateTime::from_unix_timestamp(i64::try_from(secs).ok()?).ok()?
        + time::Duration::nanoseconds(i64::from(nanos));
    Some(now - at)
}

/// A new task as `request` asks for it, `submitted` now; its id, deadline, parent, depth and
/// requester goal are the caller's to fill in.
fn new_task(
    caller: &AgentId,
    assignee: &AgentId,
    body: &str,
    request: &CreateTask,
    now: OffsetDateTime,
) -> TaskRecord {
    TaskRecord {
        task_id: Uuid::nil(),
        requester: caller.clone(),
        requester_goal: None,
        assignee: assignee.clone(),
        assignee_goal: None,
        state: TaskState::Submitted,
        message: body.to_owned(),
        parts: request.parts.clone(),
        attachments: request.attachments.clone(),
        deadline: None,
        callback: request.callback.clone(),
        metadata: request.metadata.clone(),
        parent: None,
        depth: 1,
        children: Vec::new(),
        result: None,
        result_parts: Vec::new(),
        result_attachments: Vec::new(),
        reason: None,
        message_id: new_id(),
        in_reply_to: request.in_reply_to,
        receipt: request.receipt,
        transitions: 0,
        history: Vec::new(),
        created_at: now,
        updated_at: now,
        traceparent: switchboard_runtime::telemetry::current_traceparent(),
        budget: None,
    }
}
