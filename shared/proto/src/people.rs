//! People in the fabric (docs/protocol.md §14): who a person or a role is on the wire, the
//! items agents address to them (notes, asks, approvals), and the person-side operations.
//!
//! A person is `person:<local>` and a role `role:<local>`, `<local>` following the agent-id
//! rule; `:` is outside the agent-id alphabet, so no agent id is ever mistaken for either.
//! Subject and KV tokens cannot hold `:`, so keys spell them `person.<local>` /
//! `role.<local>`. The person-side operations are in [`ops`].

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::approval::Action;
use crate::ids::{AgentId, GoalId};
pub use crate::ids::{PERSON_PREFIX, Party, PartyError, ROLE_PREFIX};

pub mod ops;

/// Longest note, question or approval reason, in bytes.
pub const MAX_PEOPLE_TEXT_BYTES: usize = 16 * 1024;
/// Longest answer or decision note a person may give, in bytes.
pub const MAX_ANSWER_BYTES: usize = 16 * 1024;
/// Default time an ask waits for its answer: one hour.
pub const ASK_TIMEOUT_DEFAULT_MS: u64 = 3_600_000;
/// Longest an ask or an approval may wait (and an approval be usable): seven days.
pub const PEOPLE_WAIT_MAX_MS: u64 = 7 * 24 * 3_600_000;
/// Most items one inbox page returns.
pub const INBOX_PAGE_MAX: usize = 100;

/// An agent-facing people request: `agent.people.<op>.<agent_id>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeopleOp {
    /// Note a person ([`NoteRequest`]).
    Note,
    /// Ask a person or a role ([`AskRequest`]).
    Ask,
    /// Request an approval ([`crate::approval::ApprovalRequest`]).
    ApprovalRequest,
    /// Use an approval ([`crate::approval::ApprovalUse`]).
    ApprovalUse,
    /// One of the caller's items ([`ItemRequest`]).
    Get,
    /// The caller's waiting items ([`PendingItems`]).
    Pending,
    /// The people and roles configured ([`PeopleList`]).
    List,
}

impl PeopleOp {
    /// Every op, for the endpoint table and the NATS exports.
    pub const ALL: [Self; 7] = [
        Self::Note,
        Self::Ask,
        Self::ApprovalRequest,
        Self::ApprovalUse,
        Self::Get,
        Self::Pending,
        Self::List,
    ];

    /// The op's subject tokens after `agent.people`.
    pub fn token(self) -> &'static str {
        match self {
            Self::Note => "note",
            Self::Ask => "ask",
            Self::ApprovalRequest => "approval.request",
            Self::ApprovalUse => "approval.use",
            Self::Get => "get",
            Self::Pending => "pending",
            Self::List => "list",
        }
    }

    /// `agent.people.<op>`.
    pub fn prefix(self) -> String {
        format!("{}.{}", crate::subject::PEOPLE_PREFIX, self.token())
    }

    /// `agent.people.<op>.<agent>`.
    pub fn subject(self, agent: &AgentId) -> String {
        format!("{}.{agent}", self.prefix())
    }
}

/// What an agent addressed to a person.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ItemKind {
    /// A note: the agent does not wait.
    Note,
    /// A question: the agent's ask is parked until the answer, its timeout.
    Ask,
    /// An approval of one exact action.
    Approval,
}

/// Where an item is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ItemState {
    /// A note nobody marked read yet.
    Unread,
    /// A note marked read.
    Read,
    /// An ask or an approval waiting for its addressee.
    Open,
    /// Unanswered by its escalation time: now waiting for `escalate_to`.
    Escalated,
    /// An ask answered.
    Answered,
    /// An approval approved (usable once, until it expires).
    Approved,
    /// An approval denied.
    Denied,
    /// Unanswered by its deadline (or, approved, unused by then).
    Expired,
    /// An approved approval that was used.
    Used,
}

impl ItemState {
    /// Whether a person can still answer (the item waits for someone).
    pub fn is_waiting(self) -> bool {
        matches!(self, Self::Open | Self::Escalated | Self::Unread)
    }
}

/// A person's decision on an approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// The action may be done, once.
    Approved,
    /// The action must not be done.
    Denied,
}

/// Who answered an item, what and when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Answer {
    /// The person who answered (`person:bob`), also when the item went to a role.
    pub by: Party,
    /// The answer's text (an ask), or the note given with a decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// An approval's decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
    /// When.
    #[serde(with = "time::serde::rfc3339")]
    #[schemars(with = "crate::timestamp::Timestamp")]
    pub at: OffsetDateTime,
}

/// One item addressed to a person or a role: the record in `agent_people_items`, and what
/// `people.get` and the person-side `item` return.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PersonItem {
    /// The item's id (an ask's `ask_id`, an approval's `approval_id`).
    pub item_id: Uuid,
    /// Note, ask or approval.
    pub kind: ItemKind,
    /// The agent that wrote it.
    pub from_agent: AgentId,
    /// The agent's goal its answer goes to (asks and approvals).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_goal: Option<GoalId>,
    /// Whom the agent addressed.
    pub to: Party,
    /// Who must answer now: `to`, or `escalate_to` once escalated.
    pub addressee: Party,
    /// The note, the question, or an approval's reason (agent-written: hostile text).
    pub message: String,
    /// An approval's action.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<Action>,
    /// An approval's binding: lowercase hex SHA-256 of the action's RFC 8785 JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action_hash: Option<String>,
    /// Where it is in its life.
    pub state: ItemState,
    /// When the agent wrote it.
    #[serde(with = "time::serde::rfc3339")]
    #[schemars(with = "crate::timestamp::Timestamp")]
    pub created_at: OffsetDateTime,
    /// When an ask times out, or an approval expires (unanswered or unused).
    #[serde(
        default,
        with = "time::serde::rfc3339::option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<crate::timestamp::Timestamp>")]
    pub deadline: Option<OffsetDateTime>,
    /// When an unanswered item goes to `escalate_to`.
    #[serde(
        default,
        with = "time::serde::rfc3339::option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<crate::timestamp::Timestamp>")]
    pub escalate_at: Option<OffsetDateTime>,
    /// Who gets it at `escalate_at`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub escalate_to: Option<Party>,
    /// When it was escalated (once at most).
    #[serde(
        default,
        with = "time::serde::rfc3339::option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<crate::timestamp::Timestamp>")]
    pub escalated_at: Option<OffsetDateTime>,
    /// The answer, once given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<Answer>,
    /// Whether the answer or the timeout notice is in the agent's goal inbox.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub delivered: bool,
    /// The id of the request message answers and notices reply to (`in_reply_to`).
    pub request_id: Uuid,
    /// When an approval was used.
    #[serde(
        default,
        with = "time::serde::rfc3339::option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<crate::timestamp::Timestamp>")]
    pub used_at: Option<OffsetDateTime>,
    /// The `use_id` of that use (a retried use with it gets the same reply).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_id: Option<Uuid>,
    /// Free metadata the agent attached.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub metadata: Map<String, Value>,
    /// The W3C trace context the item was made in (its answer joins that trace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

/// `agent.people.note.<agent>`: note a person; nothing waits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoteRequest {
    /// `person:<id>` or `role:<name>`.
    pub to: String,
    /// The note.
    pub message: String,
    /// Free metadata.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub metadata: Map<String, Value>,
    /// A client-chosen id: a retry with it is noted once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note_id: Option<Uuid>,
}

/// The reply to a note.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoteReport {
    /// The note's item id.
    pub item_id: Uuid,
    /// Whom it went to.
    pub to: Party,
}

/// `agent.people.ask.<agent>`: ask a person or a role; the answer arrives in `from_goal_id`'s
/// inbox as `kind: response` with `correlation_id` = `ask_id` and `from_person`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AskRequest {
    /// `person:<id>` or `role:<name>`.
    pub to: String,
    /// The question.
    pub message: String,
    /// The caller's goal the answer goes to (one of its live goals).
    pub from_goal_id: GoalId,
    /// How long the answer may take (default one hour, at most seven days).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Unanswered this long, the question goes to `escalate_to` (once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub escalate_after_ms: Option<u64>,
    /// Who gets it then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub escalate_to: Option<String>,
    /// A client-chosen id: a retry with it joins the first ask instead of asking twice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ask_id: Option<Uuid>,
    /// Free metadata.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub metadata: Map<String, Value>,
}

/// The reply to an ask or an approval request: it is parked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Parked {
    /// The item's id: the `correlation_id` of the answer to come.
    pub item_id: Uuid,
    /// Whom it went to.
    pub to: Party,
    /// An approval's binding hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action_hash: Option<String>,
    /// When it times out (an ask) or expires (an approval).
    #[serde(with = "time::serde::rfc3339")]
    #[schemars(with = "crate::timestamp::Timestamp")]
    pub deadline: OffsetDateTime,
    /// When it escalates, if it may.
    #[serde(
        default,
        with = "time::serde::rfc3339::option",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(with = "Option<crate::timestamp::Timestamp>")]
    pub escalate_at: Option<OffsetDateTime>,
    /// True when a retry joined the item made before.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub joined: bool,
}

/// `agent.people.get.<agent>`: one of the caller's own items.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ItemRequest {
    /// The item.
    pub item_id: Uuid,
}

/// `agent.people.pending.<agent>`: the caller's asks and approvals still waiting for a person,
/// and approvals approved but not used yet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PendingItems {
    /// Oldest first.
    pub items: Vec<PersonItem>,
}

/// One person as agents see them (`agent.people.list`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PersonEntry {
    /// `person:<id>`.
    pub id: Party,
    /// Display name (operator-written).
    pub name: String,
    /// The roles they hold, as `role:<name>`.
    pub roles: Vec<Party>,
    /// Whether they may decide approvals.
    pub approver: bool,
    /// Whether the caller may reach them.
    pub reachable: bool,
}

/// One role as agents see it (`agent.people.list`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RoleEntry {
    /// `role:<name>`.
    pub id: Party,
    /// Its members, as `person:<id>`.
    pub members: Vec<Party>,
    /// Whether the caller may reach it.
    pub reachable: bool,
}

/// The reply to `agent.people.list`: everyone an operator configured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PeopleList {
    /// The people.
    pub people: Vec<PersonEntry>,
    /// The roles.
    pub roles: Vec<RoleEntry>,
}

/// What happened to an item: `agent.people.events.<event>.<item_id>` (in `AGENT_EVENTS`). It
/// carries no text: bodies reach the audit trail only through the inbox records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PeopleEventKind {
    /// An agent noted a person.
    Noted,
    /// An agent asked.
    Asked,
    /// An agent requested an approval.
    ApprovalRequested,
    /// A person marked a note read.
    Read,
    /// A person answered an ask.
    Answered,
    /// A person approved.
    Approved,
    /// A person denied.
    Denied,
    /// Unanswered, the item went to its `escalate_to`.
    Escalated,
    /// The deadline passed.
    Expired,
    /// The agent used its approval.
    Used,
}

impl PeopleEventKind {
    /// Every kind, for the stream's subjects and the audit's mapping.
    pub const ALL: [Self; 10] = [
        Self::Noted,
        Self::Asked,
        Self::ApprovalRequested,
        Self::Read,
        Self::Answered,
        Self::Approved,
        Self::Denied,
        Self::Escalated,
        Self::Expired,
        Self::Used,
    ];

    /// The wire name (the subject token).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Noted => "noted",
            Self::Asked => "asked",
            Self::ApprovalRequested => "approval_requested",
            Self::Read => "read",
            Self::Answered => "answered",
            Self::Approved => "approved",
            Self::Denied => "denied",
            Self::Escalated => "escalated",
            Self::Expired => "expired",
            Self::Used => "used",
        }
    }

    /// `agent.people.events.<event>.<item_id>`.
    pub fn subject(self, item_id: &Uuid) -> String {
        format!(
            "{}.{}.{item_id}",
            crate::subject::PEOPLE_EVENTS_PREFIX,
            self.as_str()
        )
    }

    /// Whether a person did it (the audit names the person, not the agent).
    pub fn by_person(self) -> bool {
        matches!(
            self,
            Self::Read | Self::Answered | Self::Approved | Self::Denied
        )
    }
}

/// One people event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PeopleEvent {
    /// A fresh id per event.
    pub id: Uuid,
    /// What happened.
    pub event: PeopleEventKind,
    /// The item.
    pub item_id: Uuid,
    /// Its kind.
    pub kind: ItemKind,
    /// The agent that wrote the item.
    pub from_agent: AgentId,
    /// Whom the agent addressed.
    pub to: Party,
    /// Who must answer now.
    pub addressee: Party,
    /// The person who acted (read, answered, approved, denied).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<Party>,
    /// An approval's binding hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action_hash: Option<String>,
    /// When.
    #[serde(with = "time::serde::rfc3339")]
    #[schemars(with = "crate::timestamp::Timestamp")]
    pub at: OffsetDateTime,
}
