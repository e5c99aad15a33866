//! create, spawn, the transitions, get, list, and the deadline sweep.
//!
//! Every change is: read the record, check the op against the state machine
//! (`switchboard_proto::task::apply`) and the acceptance rules, write with compare-and-set on
//! the revision read, and only then tell the world: the event on `agent.task.events.<id>`, a
//! `kind: task_update` message to the requester's goal (the `callback` unchanged), a notice to
//! the assignee when someone else moved its task, the assignee's load to the directory, and
//! the cancel cascade over open descendants when a task ends. A writer that loses the
//! compare-and-set re-reads and decides again, so no transition happens twice or illegally.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use async_nats::Client;
use async_nats::jetstream;
use bytes::Bytes;
use switchboard_proto::registry::TaskLoadReport;
use switchboard_proto::send::{
    SendRequest, Target, check_content_fits, check_gates, no_live_goals, unknown_agent,
};
use switchboard_proto::task::{
    self as rules, CreateTask, DEADLINE_EXPIRED, HISTORY_KEPT, LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX,
    ListRole, ListTasks, TaskAction, TaskEvent, TaskList, TaskOp, TaskRecord, TaskReply,
    TaskRequestOp, TaskRole, TaskTransition,
};
use switchboard_proto::{
    AgentId, ErrorKind, ErrorReply, GoalId, InboxMessage, MessageKind, Part, TaskRef, TaskState,
    acl, new_id, subject, timestamp,
};
use switchboard_runtime::micro::{AgentRequest, Endpoint};
use switchboard_runtime::publish::{publish_all, publish_event};
use switchboard_runtime::request::request_json;
use switchboard_runtime::store::StoreError;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::config::TaskConfig;
use crate::store::{LoadEntry, Side, Stored, TaskStore};

/// Compare-and-set retries on one record.
const CAS_ATTEMPTS: usize = 16;
/// A reservation in an assignee's load younger than this is an accept in flight.
const RESERVATION_IN_FLIGHT: time::Duration = time::Duration::seconds(30);
/// A child listed by its parent without a record yet, younger than this, is being created.
const CHILD_IN_FLIGHT: time::Duration = time::Duration::seconds(30);
/// Notes kept in a record's history are shortened to this many characters.
const NOTE_KEPT: usize = 512;
/// The furthest `deadline_in_ms` a task may ask for: 366 days.
const TASK_DEADLINE_MAX_MS: u64 = 366 * 24 * 3_600_000;
/// How long the directory may take to take a load report.
const DIRECTORY_TIMEOUT: Duration = Duration::from_secs(2);
/// Every this many sweeps, open children are checked against their parents (a cascade cut
/// short by a crash is finished).
const ORPHAN_CHECK_EVERY: u64 = 10;

/// The task service.
#[derive(Debug)]
pub struct Tasks {
    client: Client,
    js: jetstream::Context,
    store: TaskStore,
    config: TaskConfig,
    sweeps: std::sync::atomic::AtomicU64,
    /// One lock per assignee whose active set this replica is changing: requests on one
    /// replica take turns instead of colliding on the compare-and-set (other replicas still
    /// race through it).
    load_locks: std::sync::Mutex<HashMap<AgentId, Arc<tokio::sync::Mutex<()>>>>,
}

fn bad(message: impl Into<String>) -> ErrorReply {
    ErrorReply::new(ErrorKind::BadRequest, message)
}

fn shorten(text: &str) -> String {
    if text.chars().count() <= NOTE_KEPT {
        text.to_owned()
    } else {
        let mut short: String = text.chars().take(NOTE_KEPT).collect();
        short.push('…');
        short
    }
}

/// Who moved a task, for messages.
fn actor_name(by: Option<&AgentId>) -> String {
    by.map_or_else(|| "switchboard".to_owned(), |agent| format!("`{agent}`"))
}

impl Tasks {
    /// Wires the parts together.
    pub fn new(client: Client, store: TaskStore, config: TaskConfig) -> Self {
        Self {
            js: jetstream::new(client.clone()),
            client,
            store,
            config,
            sweeps: std::sync::atomic::AtomicU64::new(0),
            load_locks: std::sync::Mutex::new(HashMap::new()),
        }
    }

    /// One endpoint per op on `agent.task.<op>.<agent_id>`.
    pub fn endpoints(self: &Arc<Self>) -> Vec<Endpoint> {
        TaskRequestOp::ALL
            .into_iter()
            .map(|op| {
                let me = Arc::clone(self);
                let name = op.token();
                let prefix = op.prefix();
                match op {
                    TaskRequestOp::Create => {
                        Endpoint::agent(name, prefix, move |req: AgentRequest<CreateTask>| {
                            let me = Arc::clone(&me);
                            async move { me.create(&req.caller, req.body).await }
                        })
                    }
                    TaskRequestOp::Spawn => {
                        Endpoint::agent(name, prefix, move |req: AgentRequest<CreateTask>| {
                            let me = Arc::clone(&me);
                            async move { me.spawn(&req.caller, req.body).await }
                        })
                    }
                    TaskRequestOp::Transition(task_op) => {
                        Endpoint::agent(name, prefix, move |req: AgentRequest<TaskAction>| {
                            let me = Arc::clone(&me);
                            async move { me.act(&req.caller, task_op, req.body).await }
                        })
                    }
                    TaskRequestOp::Get => {
                        Endpoint::agent(name, prefix, move |req: AgentRequest<TaskAction>| {
                            let me = Arc::clone(&me);
                            async move { me.get(&req.caller, req.body).await }
                        })
                    }
                    TaskRequestOp::List => {
                        Endpoint::agent(name, prefix, move |req: AgentRequest<ListTasks>| {
                            let me = Arc::clone(&me);
                            async move { me.list(&req.caller, req.body).await }
                        })
                    }
                }
            })
            .collect()
    }

    /// create: hands a task to another agent (no parent).
    pub async fn create(
        &self,
        caller: &AgentId,
        request: CreateTask,
    ) -> Result<TaskReply, ErrorReply> {
        self.open_task(caller, request, false).await
    }

    /// spawn: delegates part of the caller's task (`parent_task_id`) to a subagent, or to one of
    /// its own goals with `to: "self"`.
    pub async fn spawn(
        &self,
        caller: &AgentId,
        request: CreateTask,
    ) -> Result<TaskReply, ErrorReply> {
        self.open_task(caller, request, true).await
    }

    /// What create and spawn share: checks, records the task (linked to its parent for a
    /// spawn), then delivers the `kind: task` message to every live goal of the assignee.
    async fn open_task(
        &self,
        caller: &AgentId,
        request: CreateTask,
        spawn: bool,
    ) -> Result<TaskReply, ErrorReply> {
        let now = timestamp::now();
        let parent_id = match (spawn, request.parent_task_id) {
            (true, None) => {
                return Err(bad(
                    "`parent_task_id` is required: the task this one is part of",
                ));
            }
            (false, Some(_)) => {
                return Err(bad(
                    "`parent_task_id` belongs to spawn (agent.task.spawn.<me>), not create",
                ));
            }
            (_, parent) => parent,
        };
        let to_self = spawn
            && request
                .to
                .as_deref()
                .is_some_and(|to| to.trim() == "self" || to.trim() == caller.as_str());
        // The send gates: `to` present, not the caller (self only through spawn), a non-empty
        // message of at most 64 KiB.
        let probe = SendRequest {
            to: if to_self {
                Some("_".to_owned())
            } else {
                request.to.clone()
            },
            message: request.message.clone(),
            from_agent_id: request.from_agent_id.clone(),
            ..SendRequest::default()
        };
        let (target, body) = check_gates(caller, &probe).map_err(|err| {
            if err.kind() == ErrorKind::SelfSend {
                ErrorReply::new(
                    ErrorKind::SelfSend,
                    "a task for yourself is a subtask: spawn it with `to: \"self\"`",
                )
            } else {
                err
            }
        })?;
        let assignee = match target {
            _ if to_self => caller.clone(),
            Target::Broadcast => return Err(bad("a task goes to one agent, not `*`")),
            Target::Peer(to) => AgentId::parse(&to)
                .map_err(|_| ErrorReply::new(ErrorKind::Unreachable, unknown_agent(&to)))?,
        };
        let callback = request.callback.clone().map(serde_json::Value::Object);
        let metadata = serde_json::Value::Object(request.metadata.clone());
        check_content_fits(
            "the message with its parts, metadata and callback",
            body,
            &request.parts,
            &[
                &metadata,
                callback.as_ref().unwrap_or(&serde_json::Value::Null),
            ],
        )?;
        let deadline = match (request.deadline, request.deadline_in_ms) {
            (Some(_), Some(_)) => return Err(bad("give `deadline` or `deadline_in_ms`, not both")),
            (Some(at), None) => Some(at),
            (None, Some(ms)) if ms > TASK_DEADLINE_MAX_MS => {
                return Err(bad(format!(
                    "deadline_in_ms is {ms}; the most is {TASK_DEADLINE_MAX_MS} (366 days)"
                )));
            }
            (None, Some(ms)) => Some(
                timestamp::checked_after(now, ms)
                    .ok_or_else(|| bad("deadline_in_ms is out of range"))?,
            ),
            (None, None) => None,
        };
        if let Some(at) = deadline
            && at <= now
        {
            return Err(ErrorReply::new(
                ErrorKind::Expired,
                format!("the deadline {} has already passed", timestamp::format(at)),
            ));
        }
        if let Some(goal) = &request.from_goal_id {
            self.check_goal(caller, goal).await?;
        }

        // Who may give whom a task: both registered, the ACL both ways.
        let Some(requester_card) = self.store.card(caller).await? else {
            return Err(ErrorReply::new(
                ErrorKind::NotRegistered,
                format!("`{caller}` is not registered; register before creating tasks"),
            ));
        };
        if !to_self {
            let Some(assignee_card) = self.store.card(&assignee).await? else {
                return Err(ErrorReply::new(
                    ErrorKind::Unreachable,
                    unknown_agent(assignee.as_str()),
                ));
            };
            if let Err(denial) = acl::check(&requester_card, &assignee_card) {
                return Err(ErrorReply::new(
                    ErrorKind::AclDenied,
                    denial.reason(caller.as_str(), assignee.as_str()),
                ));
            }
        }
        let goals = self.store.live_goals(&assignee).await?;
        if goals.is_empty() {
            return Err(ErrorReply::new(
                ErrorKind::Unreachable,
                no_live_goals(&assignee),
            ));
        }

        let task_id = request.task_id.unwrap_or_else(new_id);
        if let Some(existing) = self.store.find(&task_id).await? {
            return self
                .created_again(caller, body, existing.task, &goals)
                .await;
        }
        let (depth, requester_goal) = match parent_id {
            Some(parent_id) => {
                let parent = self.adopt(caller, parent_id, task_id).await?;
                (
                    parent.depth + 1,
                    request.from_goal_id.or(parent.assignee_goal),
                )
            }
            None => (1, request.from_goal_id),
        };
        let task = TaskRecord {
            task_id,
            requester: caller.clone(),
            requester_goal,
            assignee: assignee.clone(),
            assignee_goal: None,
            state: TaskState::Submitted,
            message: body.to_owned(),
            parts: request.parts.clone(),
            deadline,
            callback: request.callback.clone(),
            metadata: request.metadata.clone(),
            parent: parent_id,
            depth,
            children: Vec::new(),
            result: None,
            result_parts: Vec::new(),
            reason: None,
            message_id: new_id(),
            in_reply_to: request.in_reply_to,
            transitions: 0,
            history: Vec::new(),
            created_at: now,
            updated_at: now,
        };
        let Some(stored) = self.store.insert(&task).await? else {
            // Created meanwhile by a concurrent request with the same id.
            let Some(existing) = self.store.find(&task_id).await? else {
                return Err(ErrorReply::new(
                    ErrorKind::Conflict,
                    format!("task {task_id} is being created; retry"),
                ));
            };
            return self
                .created_again(caller, body, existing.task, &goals)
                .await;
        };
        let delivered_to = self.deliver_task(&stored.task, &goals).await;
        if delivered_to.is_empty() {
            self.store.forget(&task_id).await?;
            return Err(ErrorReply::new(
                ErrorKind::Unavailable,
                format!("the task could not be delivered to any goal of `{assignee}`"),
            ));
        }
        tracing::info!(%task_id, requester = %caller, %assignee, depth, parent = ?parent_id, "task created");
        self.emit(&stored.task, None, None, None).await;
        Ok(TaskReply {
            task: stored.task,
            delivered_to,
            duplicate: false,
        })
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
    ) -> Result<TaskReply, ErrorReply> {
        if existing.requester != *caller || existing.message != body {
            return Err(ErrorReply::new(
                ErrorKind::Conflict,
                format!("task {} exists already", existing.task_id),
            ));
        }
        let delivered_to = if existing.state == TaskState::Submitted {
            let delivered = self.deliver_task(&existing, goals).await;
            self.emit(&existing, None, None, None).await;
            delivered
        } else {
            Vec::new()
        };
        Ok(TaskReply {
            task: existing,
            delivered_to,
            duplicate: true,
        })
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
        message.task = Some(task_ref(task));
        message.callback = task.callback.clone();
        message.metadata = task.metadata.clone();
        self.publish_to(goals, &message, &format!("task:{}", task.task_id))
            .await
    }

    /// A goal named in a request must be a live goal of the caller (updates go there).
    async fn check_goal(&self, agent: &AgentId, goal: &GoalId) -> Result<(), ErrorReply> {
        if self.store.owns_goal(agent, goal).await? {
            Ok(())
        } else {
            Err(ErrorReply::new(
                ErrorKind::InvalidGoalId,
                format!("goal {goal} is not a live goal of `{agent}`"),
            ))
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
    ) -> Result<TaskRecord, ErrorReply> {
        for _ in 0..CAS_ATTEMPTS {
            let Some(parent) = self.store.find(&parent_id).await? else {
                return Err(ErrorReply::new(
                    ErrorKind::NotFound,
                    format!("no task {parent_id}"),
                ));
            };
            let record = &parent.task;
            if record.assignee != *caller {
                return Err(ErrorReply::new(
                    ErrorKind::NotAllowed,
                    format!(
                        "only `{}`, the assignee of task {parent_id}, may spawn subtasks of it",
                        record.assignee
                    ),
                ));
            }
            if record.state.is_terminal() {
                return Err(rules::TaskRefusal::Terminal(record.state).into());
            }
            if record.depth + 1 > self.config.depth_limit {
                return Err(ErrorReply::new(
                    ErrorKind::DepthExceeded,
                    format!(
                        "a subtask of task {parent_id} would be nested {} deep; the limit is {}",
                        record.depth + 1,
                        self.config.depth_limit
                    ),
                ));
            }
            if record.children.contains(&child) {
                return Ok(parent.task);
            }
            if record.children.len() >= self.config.max_children {
                return Err(ErrorReply::new(
                    ErrorKind::TooManyChildren,
                    format!(
                        "task {parent_id} has spawned {} subtasks, the most allowed",
                        self.config.max_children
                    ),
                ));
            }
            let open = self.open_children(record).await?;
            if open >= self.config.max_open_children {
                return Err(ErrorReply::new(
                    ErrorKind::TooManyChildren,
                    format!(
                        "task {parent_id} already has {open} open subtasks (the limit is {}); wait for one to end",
                        self.config.max_open_children
                    ),
                ));
            }
            let mut updated = record.clone();
            updated.children.push(child);
            if let Some(stored) = self.store.update(&parent, updated).await? {
                return Ok(stored.task);
            }
        }
        Err(ErrorReply::new(
            ErrorKind::Conflict,
            format!("task {parent_id} keeps changing; retry"),
        ))
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

    /// accept, reject, start, progress, input_required, complete, fail, cancel.
    pub async fn act(
        &self,
        caller: &AgentId,
        op: TaskOp,
        request: TaskAction,
    ) -> Result<TaskReply, ErrorReply> {
        let Some(task_id) = request.task_id else {
            return Err(bad("`task_id` is required"));
        };
        let text = request
            .message
            .as_deref()
            .map(str::trim)
            .filter(|t| !t.is_empty());
        match op {
            TaskOp::Reject | TaskOp::Fail if text.is_none() => {
                return Err(bad(format!("`{}` needs a `reason`", op.as_str())));
            }
            TaskOp::InputRequired if text.is_none() && request.parts.is_empty() => {
                return Err(bad("`input_required` needs a `question` for the requester"));
            }
            TaskOp::Progress if text.is_none() && request.parts.is_empty() => {
                return Err(bad("`progress` needs a `note` or parts"));
            }
            _ => {}
        }
        if let Some(text) = text
            && text.len() > switchboard_proto::MAX_BODY_BYTES
        {
            return Err(ErrorReply::new(
                ErrorKind::BodyTooLarge,
                format!(
                    "the text is {} bytes; the limit is {} bytes",
                    text.len(),
                    switchboard_proto::MAX_BODY_BYTES
                ),
            ));
        }
        if op == TaskOp::Accept
            && let Some(goal) = &request.from_goal_id
        {
            self.check_goal(caller, goal).await?;
        }

        for _ in 0..CAS_ATTEMPTS {
            let Some(stored) = self.store.find(&task_id).await? else {
                return Err(ErrorReply::new(
                    ErrorKind::NotFound,
                    format!("no task {task_id}"),
                ));
            };
            let task = &stored.task;
            let Some(role) = task.role_of(caller, op) else {
                return Err(ErrorReply::new(
                    ErrorKind::NotAllowed,
                    format!(
                        "`{caller}` is neither the requester nor the assignee of task {task_id}"
                    ),
                ));
            };
            // A retried request whose op is already the task's last step changes nothing. An
            // accept from another goal of the same agent is not a retry: the first goal that
            // accepted has the task.
            let other_goal = op == TaskOp::Accept
                && request.from_goal_id.is_some()
                && request.from_goal_id != task.assignee_goal;
            if op != TaskOp::Progress && !other_goal && is_repeat(task, op, caller) {
                return Ok(TaskReply {
                    task: stored.task,
                    delivered_to: Vec::new(),
                    duplicate: true,
                });
            }
            let now = timestamp::now();
            if !task.state.is_terminal()
                && let Some(deadline) = task.deadline
                && deadline <= now
            {
                // The deadline has passed: the task fails now, whoever asks.
                if self.expire(&stored).await?.is_none() {
                    continue;
                }
                return Err(ErrorReply::new(
                    ErrorKind::Expired,
                    format!(
                        "task {task_id} passed its deadline {} and failed ({DEADLINE_EXPIRED})",
                        timestamp::format(deadline)
                    ),
                ));
            }
            let next = rules::apply(task.state, op, role).map_err(ErrorReply::from)?;
            // The update carries the text, the parts and the task's callback.
            let callback = task.callback.clone().map(serde_json::Value::Object);
            check_content_fits(
                "the text with its parts and the task's callback",
                text.unwrap_or(""),
                &request.parts,
                &[callback.as_ref().unwrap_or(&serde_json::Value::Null)],
            )?;
            if op == TaskOp::Accept {
                self.check_acceptance(task).await?;
                self.reserve(&task.assignee, task_id).await?;
            }
            let mut updated = task.clone();
            updated.state = next;
            match op {
                TaskOp::Accept => updated.assignee_goal = request.from_goal_id,
                TaskOp::Complete => {
                    updated.result = text.map(str::to_owned);
                    updated.result_parts = request.parts.clone();
                }
                TaskOp::Reject | TaskOp::Fail | TaskOp::Cancel => {
                    updated.reason = text.map(str::to_owned);
                }
                _ => {}
            }
            let change = Change {
                op,
                by: Some(caller.clone()),
                role,
                text: text.map(str::to_owned),
                parts: request.parts.clone(),
            };
            if let Some(done) = self.commit(&stored, updated, &change).await? {
                if done.task.state.is_terminal() {
                    self.cascade(&done.task).await;
                }
                return Ok(TaskReply {
                    task: done.task,
                    delivered_to: Vec::new(),
                    duplicate: false,
                });
            }
            // Another writer won: decide again on what it wrote. This accept's reservation
            // stays only if the task became active (accepted by a racing request).
            if op == TaskOp::Accept
                && !self
                    .store
                    .find(&task_id)
                    .await?
                    .is_some_and(|now| now.task.state.is_active())
            {
                self.release(&task.assignee, task_id).await;
            }
        }
        Err(ErrorReply::new(
            ErrorKind::Conflict,
            format!("task {task_id} keeps changing; retry"),
        ))
    }

    /// The acceptance rules besides the cap: the requester is still allowed by the assignee's
    /// `allow_from` (cards change).
    async fn check_acceptance(&self, task: &TaskRecord) -> Result<(), ErrorReply> {
        if task.requester == task.assignee {
            return Ok(());
        }
        let card = self.store.card(&task.assignee).await?;
        let allowed = card.is_some_and(|card| {
            card.allow_from
                .iter()
                .any(|glob| acl::glob_matches(glob, task.requester.as_str()))
        });
        if allowed {
            Ok(())
        } else {
            Err(ErrorReply::new(
                ErrorKind::AclDenied,
                format!(
                    "`{}` does not accept tasks from `{}` (allow_from)",
                    task.assignee, task.requester
                ),
            ))
        }
    }

    /// This replica's turn at an assignee's active set (locks of idle agents are dropped).
    async fn load_turn(&self, agent: &AgentId) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = match self.load_locks.lock() {
            Ok(mut locks) => {
                locks.retain(|_, lock| Arc::strong_count(lock) > 1);
                Arc::clone(locks.entry(agent.clone()).or_default())
            }
            Err(_) => Arc::new(tokio::sync::Mutex::new(())),
        };
        lock.lock_owned().await
    }

    /// Reserves a place in the assignee's active set, refusing at `max_concurrent_tasks`.
    /// The set is the compare-and-set target, so concurrent accepts are decided one at a time.
    async fn reserve(&self, agent: &AgentId, task_id: Uuid) -> Result<(), ErrorReply> {
        let _turn = self.load_turn(agent).await;
        let cap = self.store.card(agent).await?.map_or(
            switchboard_proto::registry::DEFAULT_MAX_CONCURRENT_TASKS,
            |c| c.max_concurrent_tasks,
        );
        let cap = usize::try_from(cap).unwrap_or(usize::MAX);
        for attempt in 0..CAS_ATTEMPTS {
            let (load, revision) = self.store.load(agent).await?;
            if load.active.iter().any(|entry| entry.task_id == task_id) {
                return Ok(());
            }
            let mut live = self.verified_at_cap(load.active, cap).await?;
            if live.len() >= cap {
                return Err(ErrorReply::new(
                    ErrorKind::AtCapacity,
                    format!(
                        "`{agent}` already has {} tasks accepted, working or waiting for input (max_concurrent_tasks {cap})",
                        live.len()
                    ),
                ));
            }
            live.push(LoadEntry {
                task_id,
                since: timestamp::now(),
            });
            let load = crate::store::TaskLoad { active: live };
            if self.store.save_load(agent, &load, revision).await? {
                return Ok(());
            }
            switchboard_runtime::store::cas_backoff(u32::try_from(attempt).unwrap_or(u32::MAX))
                .await;
        }
        Err(ErrorReply::new(
            ErrorKind::Conflict,
            format!("the task load of `{agent}` keeps changing; retry"),
        ))
    }

    /// An active set that looks full is checked against the records: entries whose task is
    /// not active (left by a crash between a transition and its release) are dropped; an
    /// accept still in flight counts. Below the cap the entries are trusted as they are, so
    /// an accept costs no record reads.
    async fn verified_at_cap(
        &self,
        entries: Vec<LoadEntry>,
        cap: usize,
    ) -> Result<Vec<LoadEntry>, StoreError> {
        if entries.len() < cap {
            return Ok(entries);
        }
        let now = timestamp::now();
        let mut live = Vec::with_capacity(entries.len());
        for entry in entries {
            let in_flight = now - entry.since < RESERVATION_IN_FLIGHT;
            let keep = match self.store.find(&entry.task_id).await? {
                Some(stored) => {
                    stored.task.state.is_active()
                        || (stored.task.state == TaskState::Submitted && in_flight)
                }
                None => in_flight,
            };
            if keep {
                live.push(entry);
            }
        }
        Ok(live)
    }

    /// Takes a task out of the assignee's active set (best effort: stale entries are dropped
    /// by the next reservation).
    async fn release(&self, agent: &AgentId, task_id: Uuid) {
        let _turn = self.load_turn(agent).await;
        for attempt in 0..CAS_ATTEMPTS {
            let (mut load, revision) = match self.store.load(agent).await {
                Ok(load) => load,
                Err(err) => {
                    tracing::warn!(%agent, error = %err, "task load not released");
                    return;
                }
            };
            let before = load.active.len();
            load.active.retain(|entry| entry.task_id != task_id);
            if load.active.len() == before {
                return;
            }
            match self.store.save_load(agent, &load, revision).await {
                Ok(true) => return,
                Ok(false) => {
                    switchboard_runtime::store::cas_backoff(
                        u32::try_from(attempt).unwrap_or(u32::MAX),
                    )
                    .await;
                }
                Err(err) => {
                    tracing::warn!(%agent, error = %err, "task load not released");
                    return;
                }
            }
        }
    }

    /// Tells the directory an agent's active tasks (its `current_tasks`; `busy` at the cap).
    async fn report_load(&self, agent: &AgentId) {
        let cap = match self.store.card(agent).await {
            Ok(card) => card.map_or(usize::MAX, |c| {
                usize::try_from(c.max_concurrent_tasks).unwrap_or(usize::MAX)
            }),
            Err(err) => {
                tracing::warn!(%agent, error = %err, "card not read");
                return;
            }
        };
        let entries = match self.store.load(agent).await {
            Ok((load, _)) => self.verified_at_cap(load.active, cap).await,
            Err(err) => Err(err),
        };
        let current_tasks = match entries {
            Ok(live) => live.into_iter().map(|e| e.task_id).collect(),
            Err(err) => {
                tracing::warn!(%agent, error = %err, "task load not read");
                return;
            }
        };
        let report = TaskLoadReport { current_tasks };
        let subject = subject::registry_tasks(agent);
        if let Err(err) =
            request_json::<_, serde_json::Value>(&self.client, &subject, &report, DIRECTORY_TIMEOUT)
                .await
        {
            tracing::warn!(%agent, error = %err, "the directory did not take the task load");
        }
    }

    /// Writes a transition and, if it won, tells everyone. `Ok(None)`: another writer won.
    async fn commit(
        &self,
        stored: &Stored,
        mut updated: TaskRecord,
        change: &Change,
    ) -> Result<Option<Stored>, StoreError> {
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
        self.emit(
            task,
            Some(change.op),
            change.by.as_ref(),
            change.text.as_deref(),
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
    async fn emit(
        &self,
        task: &TaskRecord,
        op: Option<TaskOp>,
        by: Option<&AgentId>,
        note: Option<&str>,
    ) {
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
        self.publish_to(&requester_goals, &to_requester, &format!("update:{id}:{n}"))
            .await;
        if change.role != TaskRole::Assignee {
            let notice = build(&task.requester, task.requester_goal, &task.assignee);
            let assignee_goals: Vec<GoalId> = self
                .goals_or_all(&task.assignee, task.assignee_goal)
                .await
                .into_iter()
                .filter(|goal| !(task.requester == task.assignee && requester_goals.contains(goal)))
                .collect();
            self.publish_to(&assignee_goals, &notice, &format!("notice:{id}:{n}"))
                .await;
        }
    }

    /// `goal` if given, else every live goal of `agent`.
    async fn goals_or_all(&self, agent: &AgentId, goal: Option<GoalId>) -> Vec<GoalId> {
        match goal {
            Some(goal) => vec![goal],
            None => self.store.live_goals(agent).await.unwrap_or_else(|err| {
                tracing::warn!(%agent, error = %err, "goals not listed; message not delivered");
                Vec::new()
            }),
        }
    }

    /// Publishes `message` to each goal's inbox (de-duplicated by `<purpose>:<goal>`); returns
    /// the goals that took it.
    async fn publish_to(
        &self,
        goals: &[GoalId],
        message: &InboxMessage,
        purpose: &str,
    ) -> Vec<GoalId> {
        let payload = match serde_json::to_vec(message) {
            Ok(payload) => Bytes::from(payload),
            Err(err) => {
                tracing::error!(error = %err, "message not encoded");
                return Vec::new();
            }
        };
        let batch: Vec<(String, String, Bytes)> = goals
            .iter()
            .map(|goal| {
                (
                    subject::inbox(goal),
                    format!("{purpose}:{goal}"),
                    payload.clone(),
                )
            })
            .collect();
        let mut delivered = Vec::new();
        for (goal, outcome) in goals.iter().zip(publish_all(&self.js, &batch).await) {
            match outcome {
                Ok(_) => delivered.push(*goal),
                Err(err) => {
                    tracing::error!(%goal, %purpose, error = %err, "task message not delivered")
                }
            }
        }
        delivered
    }

    /// Fails a task past its deadline with `deadline_expired` (the service acting), then
    /// cancels its open descendants. `Ok(None)`: another writer changed it first.
    async fn expire(&self, stored: &Stored) -> Result<Option<Stored>, StoreError> {
        let mut updated = stored.task.clone();
        updated.state = TaskState::Failed;
        updated.reason = Some(DEADLINE_EXPIRED.to_owned());
        let change = Change {
            op: TaskOp::Expire,
            by: None,
            role: TaskRole::System,
            text: Some(DEADLINE_EXPIRED.to_owned()),
            parts: Vec::new(),
        };
        let done = self.commit(stored, updated, &change).await?;
        if let Some(done) = &done {
            tracing::info!(task_id = %done.task.task_id, "task deadline expired");
            self.cascade(&done.task).await;
        }
        Ok(done)
    }

    /// Cancels every open descendant of a task that ended, breadth first; each assignee and
    /// requester is told like any other transition.
    async fn cascade(&self, ended: &TaskRecord) {
        let mut queue: VecDeque<(Uuid, Uuid, TaskState)> = ended
            .children
            .iter()
            .map(|child| (*child, ended.task_id, ended.state))
            .collect();
        while let Some((id, parent, parent_state)) = queue.pop_front() {
            match self.cancel_by_system(&id, parent, parent_state).await {
                Ok(Some(child)) => queue.extend(
                    child
                        .children
                        .iter()
                        .map(|grandchild| (*grandchild, child.task_id, child.state)),
                ),
                Ok(None) => {}
                Err(err) => {
                    // The sweep's orphan check finishes it later.
                    tracing::warn!(task_id = %id, error = %err, "cascade cancel failed");
                }
            }
        }
    }

    /// Cancels one task because its parent ended; `Ok(None)` when it had ended already.
    async fn cancel_by_system(
        &self,
        id: &Uuid,
        parent: Uuid,
        parent_state: TaskState,
    ) -> Result<Option<TaskRecord>, StoreError> {
        for _ in 0..CAS_ATTEMPTS {
            let Some(stored) = self.store.find(id).await? else {
                return Ok(None);
            };
            // Only a real child: an id listed under a parent must name that parent back.
            if stored.task.parent != Some(parent) {
                tracing::warn!(task_id = %id, %parent, "listed as a child but names another parent; not canceled");
                return Ok(None);
            }
            let Ok(next) = rules::apply(stored.task.state, TaskOp::Cancel, TaskRole::System) else {
                return Ok(None);
            };
            let reason = format!("parent task {parent} ended ({})", parent_state.as_str());
            let mut updated = stored.task.clone();
            updated.state = next;
            updated.reason = Some(reason.clone());
            let change = Change {
                op: TaskOp::Cancel,
                by: None,
                role: TaskRole::System,
                text: Some(reason),
                parts: Vec::new(),
            };
            if let Some(done) = self.commit(&stored, updated, &change).await? {
                return Ok(Some(done.task));
            }
        }
        Err(StoreError::store(
            "canceling a subtask",
            format!("task {id} keeps changing"),
        ))
    }

    /// get: one task, for its requester, its assignee, or a party of an ancestor.
    pub async fn get(
        &self,
        caller: &AgentId,
        request: TaskAction,
    ) -> Result<TaskReply, ErrorReply> {
        let Some(task_id) = request.task_id else {
            return Err(bad("`task_id` is required"));
        };
        let task = self.visible(caller, &task_id).await?;
        Ok(TaskReply {
            task,
            delivered_to: Vec::new(),
            duplicate: false,
        })
    }

    /// A task `caller` may see: it is a party of the task or of one of its ancestors.
    async fn visible(&self, caller: &AgentId, task_id: &Uuid) -> Result<TaskRecord, ErrorReply> {
        let Some(stored) = self.store.find(task_id).await? else {
            return Err(ErrorReply::new(
                ErrorKind::NotFound,
                format!("no task {task_id}"),
            ));
        };
        let mut next = Some(stored.task.clone());
        for _ in 0..=self.config.depth_limit {
            let Some(task) = next else { break };
            if task.is_party(caller) {
                return Ok(stored.task);
            }
            next = match task.parent {
                Some(parent) => self.store.find(&parent).await?.map(|s| s.task),
                None => None,
            };
        }
        Err(ErrorReply::new(
            ErrorKind::NotAllowed,
            format!("`{caller}` is not a party of task {task_id}"),
        ))
    }

    /// list: the caller's tasks by role and state, or a task's children, oldest first, paged
    /// by task id.
    pub async fn list(&self, caller: &AgentId, request: ListTasks) -> Result<TaskList, ErrorReply> {
        let limit = request.limit.unwrap_or(LIST_LIMIT_DEFAULT);
        if limit == 0 || limit > LIST_LIMIT_MAX {
            return Err(bad(format!("`limit` must be 1 to {LIST_LIMIT_MAX}")));
        }
        let mut ids = match request.parent {
            Some(parent) => {
                let mut children = self.visible(caller, &parent).await?.children;
                children.sort_unstable();
                children
            }
            None => {
                let mut ids = Vec::new();
                if matches!(request.role, ListRole::Requester | ListRole::Any) {
                    ids.extend(self.store.ids(Side::Requester, caller).await?);
                }
                if matches!(request.role, ListRole::Assignee | ListRole::Any) {
                    ids.extend(self.store.ids(Side::Assignee, caller).await?);
                }
                ids.sort_unstable();
                ids.dedup();
                ids
            }
        };
        if let Some(cursor) = request.cursor {
            ids.retain(|id| *id > cursor);
        }
        let mut tasks = Vec::new();
        let mut next_cursor = None;
        for (i, id) in ids.iter().enumerate() {
            let stored = match self.store.find(id).await {
                Ok(Some(stored)) => stored,
                Ok(None) => continue,
                Err(StoreError::Corrupt(key)) => {
                    // One bad record must not fail every listing.
                    tracing::warn!(%key, "undecodable task record skipped");
                    continue;
                }
                Err(err) => return Err(err.into()),
            };
            // An index entry is only a hint: the record says who the parties are (children
            // were checked through their parent above).
            let listed = match request.parent {
                Some(parent) => stored.task.parent == Some(parent),
                None => stored.task.is_party(caller),
            };
            if !listed {
                continue;
            }
            if request
                .state
                .is_some_and(|state| state != stored.task.state)
            {
                continue;
            }
            tasks.push(stored.task);
            if tasks.len() == limit {
                if i + 1 < ids.len() {
                    next_cursor = Some(*id);
                }
                break;
            }
        }
        Ok(TaskList { tasks, next_cursor })
    }

    /// One sweep: every open task past its deadline fails with `deadline_expired` (exactly one
    /// replica wins each), and now and then open children of ended parents are canceled.
    /// Returns how many tasks this sweep expired.
    pub async fn sweep(&self, now: OffsetDateTime) -> Result<usize, StoreError> {
        let round = self
            .sweeps
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let check_orphans = round.is_multiple_of(ORPHAN_CHECK_EVERY);
        let mut expired = 0;
        for (id, entry, stored_at) in self.store.open().await? {
            let due = entry.deadline.is_some_and(|at| at <= now);
            let orphan_check = check_orphans && entry.parent.is_some();
            if !due && !orphan_check {
                continue;
            }
            let found = match self.store.find(&id).await {
                Err(StoreError::Corrupt(key)) => {
                    // One bad record must not stop the sweep for every other task.
                    tracing::warn!(%key, "undecodable task record skipped by the sweep");
                    continue;
                }
                other => other?,
            };
            let Some(stored) = found else {
                if stored_at.is_some_and(|at| now - at > CHILD_IN_FLIGHT) {
                    self.store.close(&id).await;
                }
                continue;
            };
            if stored.task.state.is_terminal() {
                self.store.close(&id).await;
                continue;
            }
            if due {
                if self.expire(&stored).await?.is_some() {
                    expired += 1;
                }
                continue;
            }
            if let Some(parent_id) = stored.task.parent
                && let Some(parent) = self.store.find(&parent_id).await?
                && parent.task.state.is_terminal()
            {
                tracing::info!(task_id = %id, parent = %parent_id, "finishing an interrupted cascade");
                if let Some(child) = self
                    .cancel_by_system(&id, parent_id, parent.task.state)
                    .await?
                {
                    self.cascade(&child).await;
                }
            }
        }
        Ok(expired)
    }
}

/// What a transition did, for events and messages.
#[derive(Debug, Clone)]
struct Change {
    op: TaskOp,
    by: Option<AgentId>,
    role: TaskRole,
    text: Option<String>,
    parts: Vec<Part>,
}

fn task_ref(task: &TaskRecord) -> TaskRef {
    TaskRef {
        id: task.task_id,
        state: task.state,
        deadline: task.deadline,
        parent: task.parent,
    }
}

/// Whether `op` by `caller` is the task's last step and left it in its current state (a
/// retried request).
fn is_repeat(task: &TaskRecord, op: TaskOp, caller: &AgentId) -> bool {
    task.history.last().is_some_and(|last| {
        last.op == op && last.by.as_ref() == Some(caller) && last.to == task.state
    })
}

/// How old a (v7) id is; `None` for ids without a timestamp.
fn child_age(id: &Uuid, now: OffsetDateTime) -> Option<time::Duration> {
    let (secs, nanos) = id.get_timestamp()?.to_unix();
    let at = OffsetDateTime::from_unix_timestamp(i64::try_from(secs).ok()?).ok()?
        + time::Duration::nanoseconds(i64::from(nanos));
    Some(now - at)
}
