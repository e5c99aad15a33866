//! People (docs/protocol.md §14): note a person, ask a person or a role and wait for the
//! answer, request an approval of one exact action and use it once before acting.
//!
//! Asks and approvals are parked: their answer arrives in the asking goal's inbox as
//! `kind: response` from `people` with `from_person` and `correlation_id` = the item id (or a
//! `kind: notify` timeout notice); [`PersonAnswer::of`] tells such a message apart from the
//! rest of the goal's mail.

use std::time::Duration;

use serde_json::Value;
use switchboard_proto::approval::{Action, ApprovalRequest, ApprovalUse, ApprovalUsed};
use switchboard_proto::people::{
    AskRequest, NoteReport, NoteRequest, Parked, PendingItems, PeopleList, PeopleOp, PersonItem,
};
use switchboard_proto::{InboxMessage, MessageKind};
use uuid::Uuid;

use crate::Agent;
use crate::error::ClientError;
use crate::goal::Goal;

/// How a question or approval ended for the agent.
#[derive(Debug, Clone, PartialEq)]
pub enum PersonAnswer {
    /// A person answered (or decided): the `kind: response` message, with `from_person`.
    Answered(InboxMessage),
    /// Nobody answered by the deadline: the `kind: notify` notice.
    TimedOut(InboxMessage),
}

impl PersonAnswer {
    /// What `message` says about item `item_id`: its answer, its timeout notice, or `None`
    /// (another message, or an escalation notice, which is not an ending). Only the people
    /// service writes as `people` (the id is reserved), so a peer cannot forge one.
    pub fn of(message: &InboxMessage, item_id: Uuid) -> Option<Self> {
        if message.correlation_id != Some(item_id)
            || message.from_agent_id.as_str() != switchboard_proto::PEOPLE_AGENT
        {
            return None;
        }
        let tag = message
            .metadata
            .get("switchboard")
            .and_then(Value::as_str)
            .unwrap_or_default();
        match (message.kind, tag) {
            (MessageKind::Response, _) => Some(Self::Answered(message.clone())),
            (_, "ask_timeout" | "approval_expired") => Some(Self::TimedOut(message.clone())),
            _ => None,
        }
    }

    /// The message either way.
    pub fn message(&self) -> &InboxMessage {
        match self {
            Self::Answered(message) | Self::TimedOut(message) => message,
        }
    }

    /// For an approval: whether it was approved.
    pub fn approved(&self) -> bool {
        matches!(self, Self::Answered(message) if message
            .metadata
            .get("people")
            .and_then(|people| people.get("decision"))
            .and_then(Value::as_str)
            == Some("approved"))
    }
}

impl Agent {
    async fn people_request<Req, Resp>(&self, op: PeopleOp, body: &Req) -> Result<Resp, ClientError>
    where
        Req: serde::Serialize + ?Sized,
        Resp: serde::de::DeserializeOwned,
    {
        // Safe to repeat: asks and approvals carry their id, notes are at worst noted twice
        // only when the first reply was lost, and the rest only read.
        self.repeatable(&op.subject(self.id()), body).await
    }

    /// Notes a person or a role (`person:alice`, `role:oncall`); nothing waits.
    pub async fn note_person(&self, to: &str, message: &str) -> Result<NoteReport, ClientError> {
        let body = NoteRequest {
            to: to.to_owned(),
            message: message.to_owned(),
            metadata: serde_json::Map::new(),
            note_id: Some(switchboard_proto::new_id()),
        };
        self.people_request(PeopleOp::Note, &body).await
    }

    /// Asks a person or a role; the answer comes to `goal` (tell it apart with [`PersonAnswer::of`]). The
    /// ask id is chosen here, so a retried request joins the first ask.
    pub async fn ask_person(
        &self,
        goal: &Goal,
        to: &str,
        question: &str,
        timeout: Option<Duration>,
    ) -> Result<Parked, ClientError> {
        let body = AskRequest {
            to: to.to_owned(),
            message: question.to_owned(),
            from_goal_id: goal.id(),
            timeout_ms: timeout.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
            escalate_after_ms: None,
            escalate_to: None,
            ask_id: Some(switchboard_proto::new_id()),
            metadata: serde_json::Map::new(),
        };
        self.ask_person_with(body).await
    }

    /// [`Agent::ask_person`] with every field (escalation among them).
    pub async fn ask_person_with(&self, mut body: AskRequest) -> Result<Parked, ClientError> {
        body.ask_id.get_or_insert_with(switchboard_proto::new_id);
        self.people_request(PeopleOp::Ask, &body).await
    }

    /// Requests an approval of `action`; the decision comes to `from_goal_id`'s inbox.
    pub async fn request_approval(&self, mut body: ApprovalRequest) -> Result<Parked, ClientError> {
        body.approval_id
            .get_or_insert_with(switchboard_proto::new_id);
        self.people_request(PeopleOp::ApprovalRequest, &body).await
    }

    /// Checks the approval for exactly `action` and spends it (single use): act only on `Ok`.
    pub async fn use_approval(
        &self,
        approval_id: Uuid,
        action: Action,
    ) -> Result<ApprovalUsed, ClientError> {
        let body = ApprovalUse {
            approval_id,
            action,
            use_id: Some(switchboard_proto::new_id()),
        };
        self.people_request(PeopleOp::ApprovalUse, &body).await
    }

    /// One of this agent's items.
    pub async fn person_item(&self, item_id: Uuid) -> Result<PersonItem, ClientError> {
        self.people_request(PeopleOp::Get, &serde_json::json!({ "item_id": item_id }))
            .await
    }

    /// This agent's asks and approvals waiting for a person, and approvals not used yet.
    pub async fn people_pending(&self) -> Result<PendingItems, ClientError> {
        self.people_request(PeopleOp::Pending, &serde_json::json!({}))
            .await
    }

    /// The persons and roles configured, and whether this agent may reach each.
    pub async fn people(&self) -> Result<PeopleList, ClientError> {
        self.people_request(PeopleOp::List, &serde_json::json!({}))
            .await
    }
}
