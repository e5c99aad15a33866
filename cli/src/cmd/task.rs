//! `switchboard task create|get|list|cancel|accept|reject|start|progress|ask|complete|fail`:
//! tasks from the command line, as an agent (requester or assignee).

use clap::{Args, Subcommand};
use switchboard_client::proto::task::{
    CreateTask, ListRole, ListTasks, TaskAction, TaskOp, TaskReply, TaskRequestOp,
};
use switchboard_client::proto::{AgentId, GoalId, TaskState};

use tracing::Instrument as _;

use super::args::Connection;

/// Tasks: create (or spawn a subtask), get, list, cancel, and the assignee's steps
/// (accept, reject, start, progress, ask, complete, fail).
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  switchboard task create --as coordinator --to researcher \"find 3 sources\" --deadline-ms 600000\n  switchboard task get --as coordinator <task_id>\n  switchboard task list --as researcher --role assignee --state submitted\n  switchboard task cancel --as coordinator <task_id> --reason \"plans changed\"",
    mut_args(super::args::global_nats_url)
)]
pub struct TaskArgs {
    #[command(subcommand)]
    command: TaskCommand,
    // Not `super::args::Acting`: global, so it may come before or after the subcommand, and
    // clap refuses a global flag that is required — `run` says it is missing.
    /// The agent acting (requester for create/cancel, any party for get/list).
    #[arg(long = "as", value_name = "AGENT", global = true)]
    as_agent: Option<String>,
    #[command(flatten)]
    conn: Connection,
}

#[derive(Debug, Subcommand)]
enum TaskCommand {
    /// Hand a task to an agent (or, with --parent, spawn a subtask; `--to self` for any goal
    /// of your own agent). Prints the task and the goals it reached.
    #[command(
        after_help = "Examples:\n  switchboard task create --as coordinator --to researcher \"find 3 sources on NATS KV\" --deadline-ms 600000\n  switchboard task create --as researcher --to writer \"draft the intro\" --parent <task_id>\n  switchboard task create --as coordinator --to researcher \"summarise\" --callback '{\"session_id\":\"chat:42\"}'"
    )]
    Create {
        /// The assignee (`self` with --parent).
        #[arg(long, value_name = "AGENT")]
        to: String,
        /// What to do.
        message: String,
        /// Deadline, in milliseconds from now.
        #[arg(long)]
        deadline_ms: Option<u64>,
        /// Routing of the asking conversation (a JSON object), returned in every update.
        #[arg(long, value_name = "JSON")]
        callback: Option<String>,
        /// Free-form metadata (a JSON object).
        #[arg(long, value_name = "JSON")]
        metadata: Option<String>,
        /// The requester goal that receives the updates.
        #[arg(long, value_name = "GOAL_ID")]
        goal: Option<String>,
        /// Spawn as a subtask of this task (you must be its assignee).
        #[arg(long, value_name = "TASK_ID")]
        parent: Option<uuid::Uuid>,
    },
    /// One task with its state, result and history.
    #[command(after_help = "Example:\n  switchboard task get --as coordinator <task_id>")]
    Get {
        /// The task.
        task_id: uuid::Uuid,
    },
    /// Your tasks by role and state, or a task's subtasks with --parent (JSON, paged).
    #[command(
        after_help = "Examples:\n  switchboard task list --as researcher --role assignee --state working\n  switchboard task list --as coordinator --parent <task_id>\n  switchboard task list --as coordinator --limit 10 --cursor <next_cursor>"
    )]
    List {
        /// requester, assignee or any.
        #[arg(long, default_value = "any")]
        role: String,
        /// Only tasks in this state (submitted, accepted, working, input_required, completed,
        /// failed, rejected, canceled).
        #[arg(long)]
        state: Option<String>,
        /// The subtasks of this task.
        #[arg(long, value_name = "TASK_ID")]
        parent: Option<uuid::Uuid>,
        /// Page size (1–200).
        #[arg(long)]
        limit: Option<usize>,
        /// `next_cursor` of the previous page.
        #[arg(long)]
        cursor: Option<uuid::Uuid>,
        /// Only tasks with this agent on the other side.
        #[arg(long, value_name = "AGENT_ID")]
        peer: Option<String>,
        /// Newest first (the cursor then pages backwards).
        #[arg(long)]
        newest_first: bool,
    },
    /// Cancel a task you asked for (its open subtasks are canceled too).
    #[command(
        after_help = "Example:\n  switchboard task cancel --as coordinator <task_id> --reason \"no longer needed\""
    )]
    Cancel {
        /// The task.
        task_id: uuid::Uuid,
        /// Why.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Take a task given to you (as its assignee).
    #[command(
        after_help = "Example:\n  switchboard task accept --as researcher <task_id> --goal <goal_id>"
    )]
    Accept(TransitionArgs),
    /// Decline a task given to you, saying why.
    #[command(
        after_help = "Example:\n  switchboard task reject --as researcher <task_id> \"out of scope\""
    )]
    Reject(TransitionArgs),
    /// Begin work on an accepted task.
    #[command(after_help = "Example:\n  switchboard task start --as researcher <task_id>")]
    Start(TransitionArgs),
    /// A progress note for the requester.
    #[command(
        after_help = "Example:\n  switchboard task progress --as researcher <task_id> \"2 of 3 sources found\""
    )]
    Progress(TransitionArgs),
    /// Ask the requester a question (input_required); resume with `start`.
    #[command(
        after_help = "Example:\n  switchboard task ask --as researcher <task_id> \"English sources only?\""
    )]
    Ask(TransitionArgs),
    /// Finish a task with its result.
    #[command(
        after_help = "Example:\n  switchboard task complete --as researcher <task_id> \"three sources: …\""
    )]
    Complete(TransitionArgs),
    /// Give up on a task, saying why.
    #[command(
        after_help = "Example:\n  switchboard task fail --as researcher <task_id> \"sources unavailable\""
    )]
    Fail(TransitionArgs),
}

impl TaskArgs {
    /// How the reply reads for a person.
    pub fn view(&self) -> crate::output::View {
        match self.command {
            TaskCommand::List { .. } => crate::output::View::TaskList,
            _ => crate::output::View::Task,
        }
    }
}

/// The task a transition applies to, with its text.
#[derive(Debug, Args)]
struct TransitionArgs {
    /// The task.
    task_id: uuid::Uuid,
    /// The reason, note, question or result that goes with the step.
    message: Option<String>,
    /// The goal acting (for accept: the goal that takes the task).
    #[arg(long, value_name = "GOAL_ID")]
    goal: Option<String>,
}

fn json_object(
    flag: &str,
    raw: Option<String>,
) -> anyhow::Result<Option<serde_json::Map<String, serde_json::Value>>> {
    raw.map(|raw| {
        serde_json::from_str(&raw)
            .map_err(|err| anyhow::anyhow!("--{flag} must be a JSON object: {err}"))
    })
    .transpose()
}

fn parse_enum<T: serde::de::DeserializeOwned>(flag: &str, raw: &str) -> anyhow::Result<T> {
    serde_json::from_value(serde_json::Value::String(raw.to_owned()))
        .map_err(|_| anyhow::anyhow!("--{flag}: `{raw}` is not a valid value"))
}

/// Runs a `task` subcommand and returns the service's reply.
pub async fn run(args: TaskArgs) -> anyhow::Result<serde_json::Value> {
    let Some(as_agent) = args.as_agent else {
        anyhow::bail!("--as <AGENT> is required: tasks are created and read as an agent");
    };
    let agent = AgentId::parse(&as_agent)?;
    let url = &args.conn.nats_url;
    let subject = |op: TaskRequestOp| op.subject(&agent);
    match args.command {
        TaskCommand::Create {
            to,
            message,
            deadline_ms,
            callback,
            metadata,
            goal,
            parent,
        } => {
            let request = CreateTask {
                to: Some(to),
                message: Some(message),
                deadline_in_ms: deadline_ms,
                callback: json_object("callback", callback)?,
                metadata: json_object("metadata", metadata)?.unwrap_or_default(),
                from_goal_id: goal.as_deref().map(GoalId::parse).transpose()?,
                // Chosen here, so the retried request is recognised as the same task.
                task_id: Some(switchboard_client::proto::new_id()),
                parent_task_id: parent,
                ..CreateTask::default()
            };
            let Some(parent) = parent else {
                let op = subject(TaskRequestOp::Create);
                return crate::nats::request_with_retry(url, &op, &request).await;
            };
            // A subtask joins its parent's trace.
            let span = task_trace(url, &agent, parent, "spawn").await;
            crate::nats::request_with_retry(url, &subject(TaskRequestOp::Spawn), &request)
                .instrument(span)
                .await
        }
        TaskCommand::Get { task_id } => {
            let request = TaskAction {
                task_id: Some(task_id),
                ..TaskAction::default()
            };
            crate::nats::request_json(url, &subject(TaskRequestOp::Get), &request).await
        }
        TaskCommand::List {
            role,
            state,
            parent,
            limit,
            cursor,
            peer,
            newest_first,
        } => {
            let request = ListTasks {
                role: parse_enum::<ListRole>("role", &role)?,
                state: state
                    .as_deref()
                    .map(|s| parse_enum::<TaskState>("state", s))
                    .transpose()?,
                parent,
                limit,
                cursor,
                peer: peer
                    .as_deref()
                    .map(switchboard_proto::AgentId::parse)
                    .transpose()?,
                newest_first,
                ..ListTasks::default()
            };
            crate::nats::request_json(url, &subject(TaskRequestOp::List), &request).await
        }
        TaskCommand::Accept(step) => transition(url, &agent, TaskOp::Accept, step).await,
        TaskCommand::Reject(step) => transition(url, &agent, TaskOp::Reject, step).await,
        TaskCommand::Start(step) => transition(url, &agent, TaskOp::Start, step).await,
        TaskCommand::Progress(step) => transition(url, &agent, TaskOp::Progress, step).await,
        TaskCommand::Ask(step) => transition(url, &agent, TaskOp::InputRequired, step).await,
        TaskCommand::Complete(step) => transition(url, &agent, TaskOp::Complete, step).await,
        TaskCommand::Fail(step) => transition(url, &agent, TaskOp::Fail, step).await,
        TaskCommand::Cancel { task_id, reason } => {
            let request = TaskAction {
                task_id: Some(task_id),
                message: reason,
                ..TaskAction::default()
            };
            let span = task_trace(url, &agent, task_id, "cancel").await;
            crate::nats::request_with_retry(
                url,
                &subject(TaskRequestOp::Transition(TaskOp::Cancel)),
                &request,
            )
            .instrument(span)
            .await
        }
    }
}

/// One step of a task's life as `agent`. Retried while no service answers, except progress
/// (a note is not idempotent; the other steps are recognised as retries by the service).
async fn transition(
    url: &str,
    agent: &AgentId,
    op: TaskOp,
    step: TransitionArgs,
) -> anyhow::Result<serde_json::Value> {
    let request = TaskAction {
        task_id: Some(step.task_id),
        message: step.message,
        from_goal_id: step.goal.as_deref().map(GoalId::parse).transpose()?,
        ..TaskAction::default()
    };
    let subject = TaskRequestOp::Transition(op).subject(agent);
    let span = task_trace(url, agent, step.task_id, op.as_str()).await;
    if op == TaskOp::Progress {
        crate::nats::request_json(url, &subject, &request)
            .instrument(span)
            .await
    } else {
        crate::nats::request_with_retry(url, &subject, &request)
            .instrument(span)
            .await
    }
}

/// The span a step on task `task_id` runs in: a child of the trace the task was created in
/// (its record's `traceparent`), so a task worked on from the command line — one process per
/// step — is still one trace. Without one (a task this agent cannot read, or created without
/// trace context) the step stays in the command's own trace.
async fn task_trace(url: &str, agent: &AgentId, task_id: uuid::Uuid, op: &str) -> tracing::Span {
    let request = TaskAction {
        task_id: Some(task_id),
        ..TaskAction::default()
    };
    let found = crate::nats::request_json(url, &TaskRequestOp::Get.subject(agent), &request)
        .await
        .ok();
    let traceparent = found
        .and_then(|reply| serde_json::from_value::<TaskReply>(reply).ok())
        .and_then(|reply| reply.task.traceparent);
    let Some(traceparent) = traceparent else {
        return tracing::Span::current();
    };
    let span = tracing::info_span!(
        parent: None,
        "cli",
        otel.name = %format!("switchboard task {op}"),
        otel.kind = "client",
        switchboard.service = crate::traces::CLI_SERVICE,
        switchboard.agent_id = %agent,
        switchboard.task_id = %task_id,
    );
    switchboard_runtime::telemetry::set_parent_from_text(&span, Some(&traceparent), None);
    span
}
