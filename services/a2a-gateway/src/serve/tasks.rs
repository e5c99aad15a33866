//! The task methods: `SendMessage` (a Switchboard task for the agent, or the answer to its
//! question), `GetTask`, `ListTasks` and `CancelTask`, each made by the client's agent
//! through the task service, so its rules (ACLs, caps, visibility) decide.

use std::time::Duration;

use a2a::{
    CancelTaskRequest, GetTaskRequest, ListTasksRequest, ListTasksResponse, SendMessageRequest,
    SendMessageResponse, Task,
};
use serde_json::{Map, Value};
use switchboard_proto::send::SendRequest;
use switchboard_proto::subject;
use switchboard_proto::task::{
    CreateTask, ListRole, ListTasks, TaskAction, TaskList, TaskOp, TaskRecord, TaskReply,
    TaskRequestOp,
};
use switchboard_proto::{AgentId, ErrorKind, TaskState};
use uuid::Uuid;

use crate::error::GatewayError;
use crate::gateway::Gateway;
use crate::mapping::task_id;
use crate::mapping::{self, CONTEXT_KEY, MESSAGE_KEY};
use crate::serve::files::Content;
use crate::serve::history::history_length;
use crate::serve::params::{check_message_id, message_context};

/// `ListTasks` page size when the client gives none, and the most it may ask for.
const PAGE_DEFAULT: usize = 50;
const PAGE_MAX: usize = 100;

/// Whether a blocking `SendMessage` stops waiting at this state: it ended, or it asks the
/// client for input.
pub(crate) fn settles(state: TaskState) -> bool {
    state.is_terminal() || state == TaskState::InputRequired
}

/// The task a message made or answered, the last event before the message took effect
/// (`None` for a new task: all of its events are news), and its live events, subscribed to
/// before the message took effect.
pub(crate) struct Submitted {
    /// The task.
    pub(crate) id: Uuid,
    /// The last event before this message's effect.
    pub(crate) after: Option<u32>,
    /// The task's live events from before this message's effect.
    pub(crate) live: crate::serve::events::LiveEvents,
}

/// Whether the message has text (not only parts).
fn has_text(request: &SendMessageRequest) -> bool {
    request.message.parts.iter().any(
        |part| matches!(&part.content, a2a::PartContent::Text(text) if !text.trim().is_empty()),
    )
}

impl Gateway {
    /// `SendMessage`: a message without `taskId` creates a task for `agent`; one naming a task
    /// that asks for input answers it (a message to the assignee, in reply to the task).
    /// Waits for the task to settle unless `returnImmediately`; once the task exists, the
    /// answer is the task (as it is, if waiting failed), never an error a retry would repeat.
    pub async fn send_message(
        &self,
        caller: &AgentId,
        agent: &AgentId,
        request: SendMessageRequest,
    ) -> Result<SendMessageResponse, GatewayError> {
        // A call holds a connection as a blocking wait does: it takes one of the client's
        // stream slots (429 past the cap: a call cannot be answered at once).
        if self.as_call(agent, &request).await {
            let _slot = self.open_stream(caller)?;
            if let crate::serve::messages::Called::Message(message) =
                self.call(caller, agent, &request).await?
            {
                return Ok(SendMessageResponse::Message(message));
            }
        }
        let wait = !request
            .configuration
            .as_ref()
            .and_then(|configuration| configuration.return_immediately)
            .unwrap_or(false);
        let keep = history_length(
            request
                .configuration
                .as_ref()
                .and_then(|configuration| configuration.history_length),
        )?;
        let mut submitted = self.submit(caller, agent, &request).await?;
        // A blocking wait holds a connection: it takes one of the client's stream slots, and
        // with none free the call answers at once, as `returnImmediately`.
        if wait
            && let Some(_slot) = self.try_stream_slot(caller)
            && let Err(err) = self.settled(&mut submitted).await
        {
            tracing::warn!(error = %err, task_id = %submitted.id, "not waiting for the task");
        }
        let record = self.get(caller, &submitted.id).await?;
        Ok(SendMessageResponse::Task(
            self.a2a_task(&record, keep).await,
        ))
    }

    /// Creates the task, or answers it: what a message does before anyone waits or streams.
    pub(crate) async fn submit(
        &self,
        caller: &AgentId,
        agent: &AgentId,
        request: &SendMessageRequest,
    ) -> Result<Submitted, GatewayError> {
        let content = self.message_content(caller, request).await?;
        let uploaded = content.attachments.clone();
        let submitted = async {
            match &request.message.task_id {
                Some(id) => {
                    let id = task_id(id)?;
                    let (after, live) = self.answer(caller, agent, id, request, content).await?;
                    Ok(Submitted {
                        id,
                        after: Some(after),
                        live,
                    })
                }
                None => {
                    let id = switchboard_proto::new_id();
                    let live = self.live_events(&id).await?;
                    self.create(caller, agent, request, id, content).await?;
                    Ok(Submitted {
                        id,
                        after: None,
                        live,
                    })
                }
            }
        }
        .await;
        // A message refused leaves no file behind to count against the quota; one whose fate
        // is unknown (no service answered: it may have been delivered) keeps them.
        if let Err(err) = &submitted
            && !matches!(err, GatewayError::Unavailable { .. })
        {
            self.forget_files(caller, &uploaded).await;
        }
        submitted
    }

    async fn create(
        &self,
        caller: &AgentId,
        agent: &AgentId,
        request: &SendMessageRequest,
        id: Uuid,
        content: Content,
    ) -> Result<(), GatewayError> {
        let Content {
            text,
            parts,
            attachments,
        } = content;
        let (context, continued) = message_context(request)?;
        check_message_id(&request.message.message_id)?;
        // A webhook given with the message is in place before the task exists, so it gets
        // every event, the creation included; a creation refused takes it away again.
        let webhook = request
            .configuration
            .as_ref()
            .and_then(|configuration| configuration.task_push_notification_config.clone());
        let has_webhook = webhook.is_some();
        if let Some(config) = webhook {
            let config =
                crate::serve::push::checked(config, &id, self.config.push_allow_private).await?;
            self.store
                .put_push_config(
                    &id,
                    caller,
                    config,
                    crate::serve::push::MAX_CONFIGS_PER_TASK,
                )
                .await?;
        }
        // A context the client names has a goal; a fresh one gets it when the client comes
        // back with it (a goal per one-off message would cost an open and, past the LRU
        // bound, a close per message).
        let from_goal_id = if continued {
            self.context_goal(caller, &context).await
        } else {
            None
        };
        let mut metadata = Map::new();
        metadata.insert(CONTEXT_KEY.to_owned(), Value::String(context));
        metadata.insert(
            MESSAGE_KEY.to_owned(),
            Value::String(request.message.message_id.clone()),
        );
        if !has_text(request) {
            metadata.insert(mapping::TEXTLESS.to_owned(), Value::Bool(true));
        }
        let create = CreateTask {
            to: Some(agent.to_string()),
            message: Some(text),
            parts,
            attachments,
            metadata,
            task_id: Some(id),
            from_goal_id,
            ..Default::default()
        };
        let created: Result<TaskReply, GatewayError> = self
            .request(
                caller,
                &TaskRequestOp::Create.subject(caller),
                &create,
                "creating the task",
            )
            .await;
        // Refused by the task service: no task, so no webhook. (No answer at all may still
        // have made it: the webhook stays.)
        if let Err(GatewayError::Refused(_)) = &created
            && has_webhook
            && let Err(err) = self.store.forget_push_configs(&id).await
        {
            tracing::warn!(task_id = %id, error = %err, "push configs of a refused task left behind");
        }
        created.map(|_| ())
    }

    /// Answers the question of a task in `input_required`: the text goes to the assignee as a
    /// message in reply to the task. Returns the number of the task's last event before the
    /// answer (the question) and its live events from before the answer.
    async fn answer(
        &self,
        caller: &AgentId,
        agent: &AgentId,
        id: Uuid,
        request: &SendMessageRequest,
        content: Content,
    ) -> Result<(u32, crate::serve::events::LiveEvents), GatewayError> {
        let Content {
            text,
            parts,
            attachments,
        } = content;
        check_message_id(&request.message.message_id)?;
        let live = self.live_events(&id).await?;
        let record = self.get_for(caller, agent, &id).await?;
        // A message naming a task and another context contradicts itself (A2A v1.0: the
        // task's context is the one the message continues).
        if let Some(context) = request.message.context_id.as_deref()
            && !context.is_empty()
            && context != mapping::context_of(&record)
        {
            return Err(GatewayError::InvalidParams(format!(
                "task {id} belongs to another context than `{}`",
                context.chars().take(80).collect::<String>()
            )));
        }
        if record.state != TaskState::InputRequired {
            return Err(GatewayError::NotAnswerable {
                task: id.to_string(),
                state: record.state.as_str(),
            });
        }
        // The question is the task's latest event, numbered as its transitions so far (the
        // creation is event 0): only what comes after it answers this message.
        let after = record.transitions;
        let mut metadata = Map::new();
        metadata.insert("task_id".to_owned(), Value::String(id.to_string()));
        metadata.insert(
            MESSAGE_KEY.to_owned(),
            Value::String(request.message.message_id.clone()),
        );
        let send = SendRequest {
            to: Some(record.assignee.to_string()),
            message: Some(text),
            parts,
            attachments,
            in_reply_to: Some(record.message_id),
            metadata,
            ..Default::default()
        };
        // One answer per question (issue 37): the first claim of this question sends, every
        // later answer to it is refused — on any replica — and adds nothing to the history.
        if !self.store.claim_answer(&id, after).await? {
            return Err(GatewayError::AlreadyAnswered {
                task: id.to_string(),
            });
        }
        let sent: Result<Value, GatewayError> = self
            .request(
                caller,
                &subject::send(caller),
                &send,
                "answering the task's question",
            )
            .await;
        if let Err(err) = sent {
            // Given back only when the fabric refused the answer for sure: after a timeout
            // it may have gone through, and a second answer must not follow it.
            if matches!(err, GatewayError::Refused(_)) {
                self.store.release_answer(&id, after).await;
            }
            return Err(err);
        }
        // The history shows the question and this answer (the answer went through whether
        // or not the history takes it).
        let context = mapping::context_of(&record);
        let mut follow_ups: Vec<a2a::Message> =
            mapping::status(&record).message.into_iter().collect();
        follow_ups.push(mapping::follow_up(&request.message, &id, &context));
        if let Err(err) = self.store.add_follow_ups(&id, &follow_ups).await {
            tracing::warn!(task_id = %id, error = %err, "an answer left out of the task's history");
        }
        Ok((after, live))
    }

    /// Waits (at most `blocking_timeout_ms`) until an event after `submitted.after` settles
    /// the task: live, or found in the store when the live events are quiet (one lost in a
    /// reconnect).
    async fn settled(&self, submitted: &mut Submitted) -> Result<(), GatewayError> {
        let deadline =
            tokio::time::Instant::now() + Duration::from_millis(self.config.blocking_timeout_ms);
        let after = submitted.after;
        let is_news = |event: &switchboard_proto::task::TaskEvent| {
            crate::store::event_number(event).is_some_and(|n| after.is_none_or(|after| n > after))
        };
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            // Past the wait (or when the gateway stops) the task is answered as it is: A2A
            // lets a blocking call return a task still working, which the client then follows
            // with GetTask or SubscribeToTask.
            if left.is_zero() || self.stopping.is_cancelled() {
                return Ok(());
            }
            let wait = left.min(crate::serve::events::QUIET_CHECK);
            let live = tokio::select! {
                event = submitted.live.next_within(wait) => event,
                () = self.stopping.cancelled() => return Ok(()),
            };
            match live {
                Some(event) if is_news(&event) && settles(event.to) => return Ok(()),
                Some(_) => {}
                None => {
                    let stored = self.store.task_events_after(&submitted.id, after).await?;
                    if stored.iter().any(|event| settles(event.to)) {
                        return Ok(());
                    }
                }
            }
        }
    }

    /// A task the caller asked `agent` for (the endpoint a client addresses is the agent's):
    /// any other task does not exist for it.
    pub(crate) async fn get_for(
        &self,
        caller: &AgentId,
        agent: &AgentId,
        id: &Uuid,
    ) -> Result<TaskRecord, GatewayError> {
        let record = self.get(caller, id).await?;
        // Only the client that asked: the task service would also show a party of an
        // ancestor task, which is not this client's business here.
        if record.assignee == *agent && record.requester == *caller {
            Ok(record)
        } else {
            Err(GatewayError::TaskNotFound(id.to_string()))
        }
    }

    /// A task the caller is a party of.
    pub(crate) async fn get(
        &self,
        caller: &AgentId,
        id: &Uuid,
    ) -> Result<TaskRecord, GatewayError> {
        let action = TaskAction {
            task_id: Some(*id),
            ..Default::default()
        };
        match self
            .request::<_, TaskReply>(
                caller,
                &TaskRequestOp::Get.subject(caller),
                &action,
                "reading the task",
            )
            .await
        {
            Ok(reply) => Ok(reply.task),
            // Another agent's task does not exist for this client.
            Err(GatewayError::Refused(reply))
                if matches!(reply.kind(), ErrorKind::NotFound | ErrorKind::NotAllowed) =>
            {
                Err(GatewayError::TaskNotFound(id.to_string()))
            }
            Err(err) => Err(err),
        }
    }

    /// `GetTask`.
    pub async fn get_task(
        &self,
        caller: &AgentId,
        agent: &AgentId,
        request: GetTaskRequest,
    ) -> Result<Task, GatewayError> {
        let id = task_id(&request.id)?;
        let keep = history_length(request.history_length)?;
        let record = self.get_for(caller, agent, &id).await?;
        Ok(self.a2a_task(&record, keep).await)
    }

    /// `ListTasks`: the tasks the caller asked `agent` for, a page at a time; `contextId` and
    /// `status` filter. One task-service request per call: the pair, the state, the context
    /// (the tasks' `a2a_context_id` metadata), the page size and the cursor all go to the task
    /// service, which reads only that pair's index entries and a bounded number of records. A
    /// page may be short, even empty, with a `nextPageToken` (the task service's read budget
    /// was spent first); an empty `nextPageToken` is the end of the list.
    pub async fn list_tasks(
        &self,
        caller: &AgentId,
        agent: &AgentId,
        request: ListTasksRequest,
    ) -> Result<ListTasksResponse, GatewayError> {
        let page = match request.page_size {
            None => PAGE_DEFAULT,
            Some(size) => usize::try_from(size)
                .ok()
                .filter(|size| (1..=PAGE_MAX).contains(size))
                .ok_or_else(|| {
                    GatewayError::InvalidParams(format!("pageSize must be 1 to {PAGE_MAX}"))
                })?,
        };
        let cursor = match request.page_token.as_deref() {
            None | Some("") => None,
            Some(token) => Some(Uuid::parse_str(token).map_err(|_| {
                GatewayError::InvalidParams("pageToken is not one this gateway gave".to_owned())
            })?),
        };
        let state = match &request.status {
            None | Some(a2a::TaskState::Unspecified) => None,
            Some(state) => Some(mapping::state_filter(state).ok_or_else(|| {
                GatewayError::InvalidParams("no task is ever in that status here".to_owned())
            })?),
        };
        // ProtoJSON: an empty string is an unset field.
        let context = request
            .context_id
            .as_deref()
            .filter(|context| !context.is_empty());
        let include_artifacts = request.include_artifacts.unwrap_or(false);
        let keep = history_length(request.history_length)?;
        let mut metadata = Map::new();
        if let Some(context) = context {
            metadata.insert(CONTEXT_KEY.to_owned(), Value::String(context.to_owned()));
        }
        let list = ListTasks {
            role: ListRole::Requester,
            state,
            parent: None,
            limit: Some(page),
            cursor,
            peer: Some(agent.clone()),
            newest_first: true,
            metadata,
        };
        let listed: TaskList = self
            .request(
                caller,
                &TaskRequestOp::List.subject(caller),
                &list,
                "listing tasks",
            )
            .await?;
        // The task service filtered; the records decide here too (only this client's tasks
        // for this agent, in the context asked for).
        let shown = listed.tasks.iter().filter(|record| {
            record.requester == *caller
                && record.assignee == *agent
                && context.is_none_or(|context| mapping::context_of(record) == context)
        });
        let shown = shown.map(|record| async move {
            let mut task = self.a2a_task(record, keep).await;
            if !include_artifacts {
                task.artifacts = None;
            }
            task
        });
        let tasks: Vec<Task> = futures::future::join_all(shown).await;
        // The task service counts what matches on every page (a filter over more candidates
        // than it reads in one request is not counted: then this page's own count).
        let total = listed
            .total
            .and_then(|total| usize::try_from(total).ok())
            .unwrap_or(tasks.len());
        Ok(ListTasksResponse {
            total_size: i32::try_from(total).unwrap_or(i32::MAX),
            page_size: i32::try_from(page).unwrap_or(i32::MAX),
            next_page_token: listed
                .next_cursor
                .map(|cursor| cursor.to_string())
                .unwrap_or_default(),
            tasks,
        })
    }

    /// `CancelTask`: the cancel op as the requester, which also cancels the task's open
    /// subtasks (the cascade).
    pub async fn cancel_task(
        &self,
        caller: &AgentId,
        agent: &AgentId,
        request: CancelTaskRequest,
    ) -> Result<Task, GatewayError> {
        let id = task_id(&request.id)?;
        let before = self.get_for(caller, agent, &id).await?;
        // The task service answers a repeated cancel with the task (a retry is harmless);
        // A2A says an ended task is not cancelable, whoever ended it.
        if before.state.is_terminal() {
            return Err(GatewayError::NotCancelable {
                task: id.to_string(),
                why: format!("the task is {}", before.state.as_str()),
            });
        }
        let action = TaskAction {
            task_id: Some(id),
            message: Some("canceled by the A2A client".to_owned()),
            ..Default::default()
        };
        match self
            .request::<_, TaskReply>(
                caller,
                &TaskRequestOp::Transition(TaskOp::Cancel).subject(caller),
                &action,
                "canceling the task",
            )
            .await
        {
            Ok(reply) => Ok(mapping::task(&reply.task, &self.links)),
            Err(GatewayError::Refused(reply)) => match reply.kind() {
                ErrorKind::NotFound => Err(GatewayError::TaskNotFound(id.to_string())),
                ErrorKind::TaskTerminal | ErrorKind::IllegalTransition | ErrorKind::NotAllowed => {
                    Err(GatewayError::NotCancelable {
                        task: id.to_string(),
                        why: reply.error.message,
                    })
                }
                _ => Err(GatewayError::Refused(reply)),
            },
            Err(err) => Err(err),
        }
    }
}
