//! `InboxMessage`: what lands in `agent.inbox.<goal_id>` (docs/protocol.md §7).
//!
//! The six seed fields (`from_agent_id`, `from_goal_id`, `to_agent_id`, `body`, `sent_at`,
//! `correlation_id`) are exact; everything else is optional and omitted from the wire when empty,
//! so a reader that knows only the six still works.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::ids::{AgentId, GoalId};

/// One message in a goal's inbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct InboxMessage {
    /// Sender agent (taken from the send subject, never from the body).
    pub from_agent_id: AgentId,
    /// Sender goal (the caller's, or a fresh one when it gave none).
    pub from_goal_id: GoalId,
    /// Receiving agent: the one this copy was stored for (each peer's own id in a broadcast).
    pub to_agent_id: AgentId,
    /// The message text; what an agent writes here is non-blank and at most 65536 UTF-8 bytes.
    pub body: String,
    /// When the service accepted the send.
    #[serde(with = "time::serde::rfc3339")]
    #[schemars(with = "crate::timestamp::Timestamp")]
    pub sent_at: OffsetDateTime,
    /// Correlates a request with its response; absent from the wire when `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<Uuid>,
    /// Message id, one per send; also the de-duplication key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<Uuid>,
    /// What kind of message this is (absent = `message`).
    #[serde(default, skip_serializing_if = "MessageKind::is_message")]
    pub kind: MessageKind,
    /// The message this one answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_reply_to: Option<Uuid>,
    /// The sender waits for an answer (absent = false).
    #[serde(default, skip_serializing_if = "is_false")]
    pub expects_reply: bool,
    /// Remaining hop budget of a forwarded message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<u8>,
    /// Agents a forwarded message has passed through.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trace: Vec<AgentId>,
    /// Structured content (A2A message parts).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<Part>,
    /// Task this message belongs to (for `task` / `task_update`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task: Option<TaskRef>,
    /// Opaque routing info of the originating conversation, carried unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback: Option<Callback>,
    /// Free-form JSON object; a call's request carries `call_chain` and `call_deadline` here.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub metadata: Map<String, Value>,
    /// The receipts its sender asked for: the inbox service tells `from_goal_id` when this
    /// copy is delivered (and read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt: Option<crate::receipt::ReceiptLevel>,
    /// The person who wrote it (`person:bob`), when a person answered through the people
    /// service (`from_agent_id` is then `people`): show this as the sender.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_person: Option<String>,
    /// Files the message carries by reference (docs/protocol.md §17): the receiver may read
    /// each through `agent.files.read` from the moment the message is delivered.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<crate::files::Attachment>,
}

impl InboxMessage {
    /// A plain message with only the seed fields set; `sent_at` is now.
    pub fn new(from: AgentId, from_goal: GoalId, to: AgentId, body: impl Into<String>) -> Self {
        Self {
            from_agent_id: from,
            from_goal_id: from_goal,
            to_agent_id: to,
            body: body.into(),
            sent_at: crate::timestamp::now(),
            correlation_id: None,
            id: None,
            kind: MessageKind::Message,
            in_reply_to: None,
            expects_reply: false,
            ttl: None,
            trace: Vec::new(),
            parts: Vec::new(),
            task: None,
            callback: None,
            metadata: Map::new(),
            receipt: None,
            from_person: None,
            attachments: Vec::new(),
        }
    }
}

fn is_false(value: &bool) -> bool {
    !*value
}

/// What an inbox message is for; on the wire as `kind`, omitted when `message`.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum MessageKind {
    /// Fire-and-forget message (the default).
    #[default]
    Message,
    /// A call that expects a response.
    Request,
    /// The answer to a request.
    Response,
    /// A system notice (e.g. a call timed out).
    Notify,
    /// A task handed to the receiver.
    Task,
    /// A task's state changed.
    TaskUpdate,
    /// Where a message the receiver sent with `receipt` is (`delivered`, `read`): written by
    /// the inbox service only (an agent's send of this kind is refused).
    Receipt,
}

impl MessageKind {
    /// The kind as it is written on the wire (`message`, `request`, `task_update`, …).
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Message => "message",
            Self::Request => "request",
            Self::Response => "response",
            Self::Notify => "notify",
            Self::Task => "task",
            Self::TaskUpdate => "task_update",
            Self::Receipt => "receipt",
        }
    }

    /// True for the default kind, which is omitted from the wire.
    pub fn is_message(&self) -> bool {
        matches!(self, Self::Message)
    }
}

/// One piece of structured content (an A2A part), tagged by `type` on the wire.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Part {
    /// Plain text.
    Text {
        /// The text; no limit of its own, but it counts toward the message's encoded size.
        text: String,
    },
    /// Arbitrary JSON data.
    Data {
        /// Any JSON value, carried unchanged; its shape is for sender and reader to agree.
        data: Value,
    },
    /// A file by reference.
    File {
        /// Where the file is.
        uri: String,
        /// MIME type of the file, e.g. `text/plain`; absent when the sender gave none.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mime: Option<String>,
        /// File name to show, e.g. `draft.txt`; absent when the sender gave none.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
    },
}

/// The lifecycle state of a task (A2A names plus an acceptance step).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    /// Created, not yet accepted.
    Submitted,
    /// Accepted by the assignee.
    Accepted,
    /// Being worked on.
    Working,
    /// Waiting for the requester.
    InputRequired,
    /// Done with a result.
    Completed,
    /// Ended with an error.
    Failed,
    /// Refused by the assignee.
    Rejected,
    /// Canceled by the requester or the system.
    Canceled,
}

/// A task reference carried in `task` / `task_update` messages.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct TaskRef {
    /// Id of the task the message is about: what `agent.task.<op>` requests name as `task_id`.
    pub id: Uuid,
    /// The task's state when this message was written.
    pub state: TaskState,
    /// When the task must be done by.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "time::serde::rfc3339::option"
    )]
    #[schemars(with = "Option<crate::timestamp::Timestamp>")]
    pub deadline: Option<OffsetDateTime>,
    /// The parent task, for a subagent task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<Uuid>,
}

/// Routing info of the conversation that started an exchange (e.g. a chat session), carried
/// through every hop unchanged so results return where they were asked for.
pub type Callback = Map<String, Value>;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn seed_message() -> InboxMessage {
        InboxMessage {
            sent_at: time::macros::datetime!(2026-04-30 14:00:00 UTC),
            ..InboxMessage::new(
                AgentId::parse("writer").unwrap(),
                GoalId::parse("0193a1b2-0000-7000-8000-000000000001").unwrap(),
                AgentId::parse("researcher").unwrap(),
                "task #1 ready for handoff",
            )
        }
    }

    #[test]
    fn seed_fields_only_and_correlation_absent_when_none() {
        let literal = json!({
            "from_agent_id": "writer",
            "from_goal_id": "0193a1b2-0000-7000-8000-000000000001",
            "to_agent_id": "researcher",
            "body": "task #1 ready for handoff",
            "sent_at": "2026-04-30T14:00:00Z"
        });
        let msg = seed_message();
        assert_eq!(serde_json::to_value(&msg).unwrap(), literal);
        let text = serde_json::to_string(&msg).unwrap();
        assert!(!text.contains("correlation_id"));
        let back: InboxMessage = serde_json::from_value(literal).unwrap();
        assert_eq!(back, msg);
    }

    #[test]
    fn every_optional_field_round_trips() {
        let literal = json!({
            "from_agent_id": "writer",
            "from_goal_id": "0193a1b2-0000-7000-8000-000000000001",
            "to_agent_id": "researcher",
            "body": "here is the draft",
            "sent_at": "2026-04-30T14:00:00Z",
            "correlation_id": "7a3b2f00-0000-4000-8000-000000000000",
            "id": "0193a1b2-0000-7000-8000-0000000000aa",
            "kind": "task_update",
            "in_reply_to": "0193a1b2-0000-7000-8000-0000000000bb",
            "expects_reply": true,
            "ttl": 2,
            "trace": ["writer"],
            "parts": [
                {"type": "text", "text": "hello"},
                {"type": "data", "data": {"k": 1}},
                {"type": "file", "uri": "s3://b/k", "mime": "text/plain"}
            ],
            "task": {"id": "0193a1b2-0000-7000-8000-0000000000cc", "state": "accepted",
                     "deadline": "2026-05-01T00:00:00Z"},
            "callback": {"session_id": "feishu:user_123", "channel": "feishu"},
            "metadata": {"call_chain": ["a", "b"]}
        });
        let msg: InboxMessage = serde_json::from_value(literal.clone()).unwrap();
        assert_eq!(msg.kind, MessageKind::TaskUpdate);
        assert_eq!(msg.task.as_ref().unwrap().state, TaskState::Accepted);
        assert_eq!(serde_json::to_value(&msg).unwrap(), literal);
    }

    #[test]
    fn a_reader_rejects_an_invalid_sender_id() {
        let bad = json!({
            "from_agent_id": "a.b",
            "from_goal_id": "0193a1b2-0000-7000-8000-000000000001",
            "to_agent_id": "researcher",
            "body": "x",
            "sent_at": "2026-04-30T14:00:00Z"
        });
        assert!(serde_json::from_value::<InboxMessage>(bad).is_err());
    }
}
