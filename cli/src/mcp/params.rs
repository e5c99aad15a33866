//! The parameters of the MCP tools: what the model sends, with the JSON Schema the host shows
//! it (each field's doc comment becomes its description; `update_task`'s `action` lists the
//! assignee's ops from `TaskOp` instead). Ids travel as strings.

use schemars::JsonSchema;
use serde::Deserialize;
use switchboard_client::proto::receipt::ReceiptLevel;
use switchboard_client::proto::task::{TaskOp, TaskRole};
use uuid::Uuid;

/// Tools that take nothing.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct NoParams {}

/// `list_peers` parameters (both optional: no arguments lists the first page).
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ListPeersParams {
    /// Continue after this agent id: the `next` of the previous answer.
    #[serde(default)]
    pub after: Option<String>,
    /// Most peers in the answer (default 100, at most 1000).
    #[serde(default)]
    pub limit: Option<u32>,
    /// Only agents whose card lists this skill, e.g. "translate".
    #[serde(default)]
    pub skill: Option<String>,
}

/// `send_to_peer` parameters.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct SendParams {
    /// The peer's agent id from list_peers, "skill:<name>" for one agent that has the skill,
    /// or "*" to broadcast to every peer you may reach.
    pub to: String,
    /// The message text.
    pub message: String,
    /// The message id this one answers or follows up (optional; threads the conversation).
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub in_reply_to: Option<Uuid>,
    /// A correlation id to carry (optional).
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub correlation_id: Option<Uuid>,
    /// "delivered" or "read" (optional): kind="receipt" messages in your check_inbox tell you
    /// when the peer's session received it and when it read it; message_status asks any time.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub receipt: Option<ReceiptLevel>,
    /// Files to pass on (optional, at most 16): the `ref` of each, from an <attachment> in
    /// check_inbox or a file you uploaded; the receiver may then read them.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub attachments: Vec<Uuid>,
}

/// `talk_to_agent` parameters.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct TalkParams {
    /// The agent id to consult (from list_peers), or "skill:<name>" for one agent that has
    /// the skill.
    pub to: String,
    /// Your question or request.
    pub message: String,
    /// How long to wait for the answer, in milliseconds (default 30000, at most 300000).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// "delivered" or "read" (optional): receipts in your check_inbox while you wait, so you
    /// can tell a slow answer from a question nobody has read yet.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub receipt: Option<ReceiptLevel>,
    /// Files to pass on (optional, at most 16): the `ref` of each, from an <attachment> in
    /// check_inbox or a file you uploaded; the receiver may then read them.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub attachments: Vec<Uuid>,
}

/// `reply_to_peer` parameters.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct ReplyParams {
    /// Your answer.
    pub message: String,
    /// The correlation_id of the request you answer; omit it to answer the most recent request
    /// you have not answered yet.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub correlation_id: Option<Uuid>,
    /// true: this is part of your answer, sent now; the request stays open and you send more
    /// (the last one without partial ends it). For long answers the asker can start on.
    #[serde(default)]
    pub partial: bool,
    /// Files to pass on (optional, at most 16): the `ref` of each, from an <attachment> in
    /// check_inbox or a file you uploaded; the receiver may then read them.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub attachments: Vec<Uuid>,
}

/// `create_task` parameters.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct CreateTaskParams {
    /// The agent id that should do the task (from list_peers), or "skill:<name>" for the
    /// least loaded agent that has the skill and room for it.
    pub to: String,
    /// What to do: a complete, self-contained description.
    pub message: String,
    /// Fail the task if it is not finished within this many milliseconds (optional).
    #[serde(default)]
    pub deadline_in_ms: Option<u64>,
    /// "delivered" or "read" (optional): receipts in your check_inbox when the assignee's
    /// session receives and reads the task.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub receipt: Option<ReceiptLevel>,
    /// Files to pass on (optional, at most 16): the `ref` of each, from an <attachment> in
    /// check_inbox or a file you uploaded; the receiver may then read them.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub attachments: Vec<Uuid>,
}

/// `message_status` parameters.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct MessageStatusParams {
    /// The message id: `message_id` of send_to_peer's report, or `message_id` of the task
    /// create_task returned.
    #[schemars(with = "String")]
    pub message_id: Uuid,
}

/// `update_task` parameters.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct UpdateTaskParams {
    /// The task id (the task_id attribute of the task message in check_inbox).
    #[schemars(with = "String")]
    pub task_id: Uuid,
    /// The step to take (the tool description says what each one does).
    #[schemars(schema_with = "update_actions_schema")]
    pub action: TaskOp,
    /// The note, question, result or reason that goes with the action.
    #[serde(default)]
    pub message: Option<String>,
    /// Files to pass on (optional, at most 16): the `ref` of each, from an <attachment> in
    /// check_inbox or a file you uploaded; the receiver may then read them.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub attachments: Vec<Uuid>,
}

/// The task ops `update_task` takes: the assignee's steps ([`TaskOp::allowed`] for
/// [`TaskRole::Assignee`]), so not `cancel` (the requester's: `cancel_task`) nor `expire` (the
/// service's).
pub fn update_actions() -> impl Iterator<Item = TaskOp> {
    TaskOp::ALL
        .into_iter()
        .filter(|op| op.allowed(TaskRole::Assignee))
}

/// The schema of `update_task`'s `action`: a string, one of [`update_actions`] by wire name.
fn update_actions_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let names: Vec<serde_json::Value> = update_actions().map(|op| op.as_str().into()).collect();
    let mut schema = serde_json::Map::new();
    schema.insert("type".to_owned(), "string".into());
    schema.insert("enum".to_owned(), names.into());
    schemars::Schema::from(schema)
}

/// `spawn_subagent` parameters.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct SpawnParams {
    /// The task you are working on that this subtask belongs to.
    #[schemars(with = "String")]
    pub parent_task_id: Uuid,
    /// What the subagent should do: a complete, self-contained description.
    pub message: String,
    /// A named agent to delegate to; omit it to spawn a copy of yourself (every live session
    /// of your own agent is offered the subtask).
    #[serde(default)]
    pub agent: Option<String>,
    /// Fail the subtask if it is not finished within this many milliseconds (optional).
    #[serde(default)]
    pub deadline_in_ms: Option<u64>,
}

/// `complete_task` parameters.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct CompleteParams {
    /// The task (or subtask) you finished.
    #[schemars(with = "String")]
    pub task_id: Uuid,
    /// Your findings: the result handed to whoever gave you the task.
    pub result: String,
    /// Files to pass on (optional, at most 16): the `ref` of each, from an <attachment> in
    /// check_inbox or a file you uploaded; the receiver may then read them.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub attachments: Vec<Uuid>,
}

/// `subagent_status` parameters.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct StatusParams {
    /// One task or subtask (the handle spawn_subagent or create_task returned).
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub task_id: Option<Uuid>,
    /// A parent task: list all its subtasks and their states.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub parent_task_id: Option<Uuid>,
}

/// `cancel_task` parameters.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct CancelParams {
    /// A task you created (its open subtasks are canceled too).
    #[schemars(with = "String")]
    pub task_id: Uuid,
    /// Why (optional; the assignee is told).
    #[serde(default)]
    pub reason: Option<String>,
}
