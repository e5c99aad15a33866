//! The person-side operations (docs/protocol.md §14, "People answer"): `_SB.ops.people.<op>`,
//! which only Switchboard's own users (the services, the console, the operator CLI) may
//! publish on. Each names the person acting; the people service checks every rule against
//! that person.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::ids::AgentId;
use crate::people::{Decision, ItemState, PersonItem};

/// A person-side operation: `_SB.ops.people.<op>` (services, the console and the operator
/// CLI only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeopleOpsOp {
    /// A person's inbox page ([`InboxQuery`] → [`InboxPage`]).
    Inbox,
    /// One item a person is or was addressed by ([`PersonItemQuery`] → [`PersonItem`]).
    Item,
    /// Answer, decide or mark read ([`AnswerRequest`] → [`AnswerAck`]).
    Answer,
}

impl PeopleOpsOp {
    /// Every op.
    pub const ALL: [Self; 3] = [Self::Inbox, Self::Item, Self::Answer];

    /// The subject: `_SB.ops.people.<op>`.
    pub fn subject(self) -> String {
        let op = match self {
            Self::Inbox => "inbox",
            Self::Item => "item",
            Self::Answer => "answer",
        };
        crate::subject::ops(crate::names::PEOPLE_SERVICE, op)
    }
}

/// `_SB.ops.people.inbox` (services and the console only): a person's items.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InboxQuery {
    /// The person asking (`person:<id>`); the console and the operator CLI name the signed-in
    /// person.
    pub person: String,
    /// `open` (waiting for them, the default) or `done`.
    #[serde(default)]
    pub state: InboxState,
    /// Only this agent's items.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender: Option<AgentId>,
    /// At most this many items (1–100, default 50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
    /// Skip this many (the page's `next`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<usize>,
}

/// Which of a person's items a listing shows.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum InboxState {
    /// Waiting for them.
    #[default]
    Open,
    /// Answered, read, expired or used.
    Done,
}

/// One sender's share of a person's inbox: a flood shows as such.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SenderShare {
    /// The agent.
    pub agent: AgentId,
    /// Its items waiting for the person.
    pub open: usize,
    /// Whether it holds its full share (further items are refused `inbox_full`).
    pub at_cap: bool,
}

/// A page of a person's inbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct InboxPage {
    /// Interleaved across senders (one each in turn, oldest first), so no sender's flood pushes
    /// another's items off the first page.
    pub items: Vec<PersonItem>,
    /// Every sender with open items, most first.
    pub senders: Vec<SenderShare>,
    /// The `after` of the next page, if there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<usize>,
}

/// `_SB.ops.people.item`: one item the person is or was addressed by.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PersonItemQuery {
    /// The person asking.
    pub person: String,
    /// The item.
    pub item_id: Uuid,
}

/// `_SB.ops.people.answer`: a person answers an ask, decides an approval or marks a note read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AnswerRequest {
    /// The person answering.
    pub person: String,
    /// The item.
    pub item_id: Uuid,
    /// An ask's answer, or a decision's note.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// An approval's decision (required for approvals, refused otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
    /// The action hash the person was shown: it must equal the item's, so a person approves
    /// exactly the action they saw.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action_hash: Option<String>,
}

/// The reply to an answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AnswerAck {
    /// The item.
    pub item_id: Uuid,
    /// Its state now.
    pub state: ItemState,
    /// Whether the answer is in the agent's inbox (false for a note, or when the agent's goal
    /// is gone).
    pub delivered: bool,
}
