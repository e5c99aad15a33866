//! Correlated calls (docs/protocol.md §9): requests and replies of `agent.call.<id>`,
//! `agent.reply.<id>`, `agent.calls.pending.<id>`, the pending-call record kept in the
//! `agent_calls` bucket, and the pure rules (timeout clamp, chain, cycle, depth).

// Longer than 600 lines because it holds the call's whole wire vocabulary (the request, its
// replies, the stored record with its budget, the chain rules) with their tests, as §9 does.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::error::{ErrorKind, ErrorReply};
use crate::ids::{AgentId, GoalId};
use crate::message::Part;

/// Body of `agent.call.<agent_id>` (talk_to_agent / call_agent).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CallRequest {
    /// Who must answer: the callee's agent id, trimmed (`*` is refused: a call has one peer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// The question; becomes the request message's `body` (send gates 3 and 4 apply).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The caller's goal: where a parked answer (or a timeout notice) lands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_goal_id: Option<GoalId>,
    /// Deadline from now, in milliseconds (default 30 s, clamped to 300 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Wait for the answer (default) or park and get it in the inbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<bool>,
    /// The call being served while this one is made (the chain is derived from it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_correlation_id: Option<Uuid>,
    /// Structured content for the callee.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<Part>,
    /// Free-form metadata for the callee.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub metadata: Map<String, Value>,
    /// The message that prompted this call (the request's `in_reply_to`), so the audit trail
    /// links it into that conversation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_reply_to: Option<Uuid>,
    /// The caller, if the body names one: it must be the subject's identity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_agent_id: Option<String>,
    /// Receipts for the request message, back in `from_goal_id` (required with it):
    /// `delivered`, or `read` (see [`crate::receipt`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt: Option<crate::receipt::ReceiptLevel>,
    /// Stream the answer: a callee's partial replies reach a waiting caller as they come (on
    /// its reply subject, each a [`CallPart`], before the final [`CallAnswer`]). Without it a
    /// waiting caller gets only the final answer, whose `body` joins every part anyway.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stream: bool,
    /// The caller's own name for the call, so a retry is recognised: the call's id is
    /// [`scoped_call_id`] of the caller and this, so a retry naming it again is that call (its
    /// request is delivered once, it has one answer and one timeout notice) and waits for (or
    /// is told) its outcome, and two callers choosing the same value make two calls. The
    /// replies name the call by its id. A fresh UUID v7 is the call's id when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<Uuid>,
    /// The call's cost budget (docs/protocol.md §16): amounts for a new tree, or caps on what
    /// it draws from its parent call's budget (or from the node it names). A call made under
    /// a parent call with a budget draws from it without this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<crate::budget::BudgetAsk>,
    /// Files the request carries by reference (docs/protocol.md §17), as on a send.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<crate::files::Attachment>,
}

/// Reply to a parked call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CallParked {
    /// Correlates the answer that will land in the caller goal's inbox.
    pub correlation_id: Uuid,
    /// The callee's goals that got the request.
    pub delivered_to: Vec<GoalId>,
    /// When the call times out.
    #[serde(with = "time::serde::rfc3339")]
    #[schemars(with = "crate::timestamp::Timestamp")]
    pub deadline: OffsetDateTime,
    /// True when the deadline was cut to the parent call's (a call made while serving one
    /// never outlives it); omitted when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub clamped: bool,
}

/// Reply to a waiting call: the callee's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CallAnswer {
    /// Id of the call this answers, as `call` opened it and the callee's `reply` named it.
    pub correlation_id: Uuid,
    /// Who answered.
    pub from_agent_id: AgentId,
    /// The callee's answer text, exactly as its `reply` sent it.
    pub body: String,
    /// Structured content of the answer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<Part>,
    /// When it was answered.
    #[serde(with = "time::serde::rfc3339")]
    #[schemars(with = "crate::timestamp::Timestamp")]
    pub answered_at: OffsetDateTime,
    /// True when the call's deadline had been cut to its parent call's; omitted when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub clamped: bool,
    /// How many partial replies came before this final one (their text starts `body`);
    /// omitted when none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub streamed: u32,
    /// Set when the callee answered with a failure (`reply` with `error`); `body` then holds
    /// only what was streamed before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ReplyError>,
    /// Files the answer carries by reference (docs/protocol.md §17): the caller may read each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<crate::files::Attachment>,
}

#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_zero(value: &u32) -> bool {
    *value == 0
}

/// Most partial replies one call takes before its final one.
pub const CALL_PARTS_MAX: u32 = 256;

/// Sent (services only, on `_SB.calls.answer.<correlation_id>`) to the replica holding a
/// waiting call when the call's request left the callee's inbox without being read: removed
/// from a full inbox, rejected by its reader or moved to the dead letters. The waiting caller
/// then fails at once with `dropped` as the reason, instead of at its deadline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CallDropped {
    /// The call whose request was dropped.
    pub correlation_id: Uuid,
    /// Why, in words for the caller (`removed unread from a full inbox`, …).
    pub dropped: String,
}

/// One partial reply of a streamed answer, as a waiting caller gets it on its reply subject
/// (and [`CallParts`] returns it): in order of `part`, 1, 2, 3…, before the final answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CallPart {
    /// The call it belongs to.
    pub correlation_id: Uuid,
    /// Who answers.
    pub from_agent_id: AgentId,
    /// Its number: 1 for the first part.
    pub part: u32,
    /// Its text; the final answer's `body` is every part's text joined, then the final's.
    pub body: String,
    /// Structured content of this part.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<Part>,
    /// Files this part carries by reference (docs/protocol.md §17); the caller may read them.
    /// They stay with the part: the final answer carries only its own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<crate::files::Attachment>,
    /// Always true: tells a part from the final answer on the same reply subject.
    pub partial: bool,
    /// When the callee sent it.
    #[serde(with = "time::serde::rfc3339")]
    #[schemars(with = "crate::timestamp::Timestamp")]
    pub at: OffsetDateTime,
}

/// A partial reply as the call record keeps it (the durable copy a caller that missed it
/// reads back with [`CallPartsRequest`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct StreamedPart {
    /// Its number, from 1.
    pub part: u32,
    /// Its text.
    pub body: String,
    /// Its structured content.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<Part>,
    /// Its files by reference (docs/protocol.md §17).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<crate::files::Attachment>,
    /// When it was taken.
    #[serde(with = "time::serde::rfc3339")]
    #[schemars(with = "crate::timestamp::Timestamp")]
    pub at: OffsetDateTime,
}

/// `agent.calls.parts.<agent_id>`: the partial replies (and the final answer, once there is
/// one) of a streamed call the caller made, after part `after`: what a caller that lost its
/// connection mid-call reads back.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CallPartsRequest {
    /// The call (one the caller made).
    pub correlation_id: Uuid,
    /// Parts after this number (0, the default: every part).
    #[serde(default)]
    pub after: u32,
}

/// Reply to [`CallPartsRequest`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CallParts {
    /// The call.
    pub correlation_id: Uuid,
    /// Open, answered or expired.
    pub state: CallState,
    /// The parts after `after`, in order.
    pub parts: Vec<CallPart>,
    /// The final answer, once the call is answered (streamed calls keep it for this).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<CallAnswer>,
}

/// A callee's failure, answered instead of a result (`reply` with `error`): a stable `kind`
/// the caller matches on and a message for people. The SDKs answer `handler_error` when an
/// agent's handler raises.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplyError {
    /// 1–64 characters of `[a-z0-9_]`, e.g. `handler_error`.
    pub kind: String,
    /// What went wrong, at most 1,024 characters.
    #[serde(default)]
    pub message: String,
}

/// The most characters of a [`ReplyError`]'s kind.
pub const REPLY_ERROR_KIND_MAX: usize = 64;
/// The most characters of a [`ReplyError`]'s message.
pub const REPLY_ERROR_MESSAGE_MAX: usize = 1024;

impl ReplyError {
    /// Checks the kind's characters and both lengths.
    pub fn check(&self) -> Result<(), String> {
        let kind_ok = !self.kind.is_empty()
            && self.kind.len() <= REPLY_ERROR_KIND_MAX
            && self
                .kind
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !kind_ok {
            return Err(format!(
                "error.kind must be 1-{REPLY_ERROR_KIND_MAX} characters of [a-z0-9_]"
            ));
        }
        if self.message.chars().count() > REPLY_ERROR_MESSAGE_MAX {
            return Err(format!(
                "error.message must be at most {REPLY_ERROR_MESSAGE_MAX} characters"
            ));
        }
        Ok(())
    }
}

/// Body of `agent.reply.<agent_id>` (reply_to_peer): no target, only the correlation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplyRequest {
    /// The call being answered, from the request message's `correlation_id`; required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub correlation_id: Option<Uuid>,
    /// The answer text; the caller gets it as `body` (send gates 3 and 4 apply).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Structured content of the answer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<Part>,
    /// A partial reply: the call stays open and the caller gets this part now; a final reply
    /// (without `partial`) ends the call.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub partial: bool,
    /// The part's number (1, 2, 3…), so a retried part is taken once: a number already taken
    /// is a duplicate, one past the next is `bad_request`. Omitted: the next number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub part: Option<u32>,
    /// The call failed: a final reply with this instead of a result (no `message`, no
    /// `parts`, not `partial`). The caller's answer carries it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ReplyError>,
    /// Files the reply carries by reference (docs/protocol.md §17), as on a send: the callee
    /// must be their uploader or have been delivered them; the caller may then read them. A
    /// partial reply's stay with that part; not on a reply with `error`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<crate::files::Attachment>,
}

/// Where an answer went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AnswerRoute {
    /// Straight to the caller waiting on its call request.
    Caller,
    /// Into the caller goal's inbox as `kind: response`.
    Inbox,
}

/// Reply to `reply`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ReplyAck {
    /// The call the reply named, echoed back.
    pub correlation_id: Uuid,
    /// Where the answer went (the first time; a retried reply reports the same).
    pub delivered: AnswerRoute,
    /// True when this reply was a retry of one already delivered (nothing sent again).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub duplicate: bool,
    /// A partial reply's number, as taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub part: Option<u32>,
}

/// Lifecycle of a pending call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CallState {
    /// Waiting for the answer.
    Open,
    /// Answered (exactly once).
    Answered,
    /// The deadline passed first.
    Expired,
}

/// A call as recorded in the `agent_calls` bucket under `call.<correlation_id>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PendingCall {
    /// The call's id: the record's key is `call.<correlation_id>`.
    pub correlation_id: Uuid,
    /// Who asked.
    pub caller: AgentId,
    /// The caller's goal (parked answers and timeout notices land there).
    pub caller_goal: GoalId,
    /// Who must answer.
    pub callee: AgentId,
    /// Agents from the root caller down to this caller.
    pub chain: Vec<AgentId>,
    /// The call this one was made while serving.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<Uuid>,
    /// The request message's id (the answer's `in_reply_to`).
    pub request_id: Uuid,
    /// Waiting (true) or parked.
    pub wait: bool,
    /// Open until answered or expired; every change is a compare-and-set, never back to open.
    pub state: CallState,
    /// Where the answer went, once delivered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answered_via: Option<AnswerRoute>,
    /// When a reply claimed the call (its delivery may still be under way).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "time::serde::rfc3339::option"
    )]
    #[schemars(with = "Option<crate::timestamp::Timestamp>")]
    pub claimed_at: Option<OffsetDateTime>,
    /// When the call was opened; listings sort by it, oldest first.
    #[serde(with = "time::serde::rfc3339")]
    #[schemars(with = "crate::timestamp::Timestamp")]
    pub created_at: OffsetDateTime,
    /// When the call expires: `created_at` plus the clamped `timeout_ms`.
    #[serde(with = "time::serde::rfc3339")]
    #[schemars(with = "crate::timestamp::Timestamp")]
    pub deadline: OffsetDateTime,
    /// The waiting caller asked for the answer streamed ([`CallRequest::stream`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stream: bool,
    /// The partial replies taken so far, in order (omitted from listings).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub streamed: Vec<StreamedPart>,
    /// The final answer of a streamed call, kept for a caller that missed it
    /// ([`CallPartsRequest`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<CallAnswer>,
    /// The W3C `traceparent` of the span the call was made in: its timeout notice joins that
    /// trace when the deadline sweep, not a request, ends the call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// The call's budget, when it has one (its callee sees it as `metadata.budget`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<crate::budget::BudgetGrant>,
}

impl PendingCall {
    /// The text every partial reply so far adds up to (the final answer's body starts with it).
    pub fn streamed_text(&self) -> String {
        self.streamed
            .iter()
            .map(|part| part.body.as_str())
            .collect()
    }

    /// The record as a listing shows it: without the streamed text.
    pub fn summary(mut self) -> Self {
        self.streamed.clear();
        self.answer = None;
        self
    }

    /// Depth of the call: how many agents are before the callee.
    pub fn depth(&self) -> usize {
        self.chain.len()
    }
}

/// Key of a call's record in `agent_calls` (kept after the call ends, until the bucket's
/// max age, so retried and late replies get the right answer).
pub fn call_key(correlation_id: &Uuid) -> String {
    format!("call.{correlation_id}")
}

/// Index key of an open call among its caller's outgoing calls (deleted when it ends).
pub fn outgoing_key(caller: &AgentId, correlation_id: &Uuid) -> String {
    format!("out.{caller}.{correlation_id}")
}

/// Index key of an open call among its callee's incoming calls (deleted when it ends).
pub fn incoming_key(callee: &AgentId, correlation_id: &Uuid) -> String {
    format!("in.{callee}.{correlation_id}")
}

/// Reply to `agent.calls.pending.<agent_id>`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PendingCalls {
    /// Open calls this agent made.
    pub outgoing: Vec<PendingCall>,
    /// Open calls this agent must answer.
    pub incoming: Vec<PendingCall>,
}

/// What happened to a call, published as `agent.calls.events.<event>.<correlation_id>` into
/// `AGENT_EVENTS` (the audit trail's input). A call's opening has no event: its request
/// message, stored in the callee's inbox with the call's `correlation_id`, records it
/// (`opened` events were published before issue 25's third round; older trails hold them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CallEventKind {
    /// The answer was delivered (once).
    Answered,
    /// The deadline passed first.
    Expired,
    /// An answer arrived after the deadline and was not delivered (its text is kept here).
    LateAnswer,
    /// A call was refused by a rule (cycle, depth, cap, unreachable callee); the reason is
    /// the event's body.
    Refused,
}

impl CallEventKind {
    /// The `<event>` token of `agent.calls.events.<event>.<correlation_id>`.
    pub fn token(self) -> &'static str {
        match self {
            Self::Answered => "answered",
            Self::Expired => "expired",
            Self::LateAnswer => "late_answer",
            Self::Refused => "refused",
        }
    }
}

/// Payload of a call event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CallEvent {
    /// Event id (also its `Nats-Msg-Id`).
    pub id: Uuid,
    /// What happened.
    pub event: CallEventKind,
    /// The call the event is about; also the subject's last token.
    pub correlation_id: Uuid,
    /// Who asked.
    pub caller: AgentId,
    /// Who was asked.
    pub callee: AgentId,
    /// The call's chain: root caller first, its caller last (the callee is not in it).
    pub chain: Vec<AgentId>,
    /// When the correlator built the event, right after the change it reports.
    #[serde(with = "time::serde::rfc3339")]
    #[schemars(with = "crate::timestamp::Timestamp")]
    pub at: OffsetDateTime,
    /// The answer's text (answered, late_answer), or the refusal's reason (refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
}

/// The UUID v5 namespace of call ids (docs/protocol.md §9, "Call ids"):
/// `6f1c2a7e-4b3d-5e60-9a1b-7c2d3e4f5a6b`.
pub const CALL_ID_NAMESPACE: Uuid = Uuid::from_u128(0x6f1c_2a7e_4b3d_5e60_9a1b_7c2d_3e4f_5a6b);

/// The id of the call `caller` names `chosen` (its `correlation_id`): the UUID v5 of
/// `<caller>:<chosen>` in [`CALL_ID_NAMESPACE`]. Scoped to the caller, so no caller can name,
/// join or block another's call, and a retry with the same `chosen` is the same call.
pub fn scoped_call_id(caller: &AgentId, chosen: Uuid) -> Uuid {
    Uuid::new_v5(&CALL_ID_NAMESPACE, format!("{caller}:{chosen}").as_bytes())
}

/// How near the correlator's clock a chosen call id's time must be for the call's record to be
/// created beside its request's delivery (docs/protocol.md §9, "Call ids"). Twice this is well
/// inside the inbox stream's 120 s duplicate window, so every attempt of such a call that takes
/// the path delivers within the window of the first, and the inbox stores the request once.
pub const FRESH_CALL_ID_WITHIN: time::Duration = time::Duration::seconds(30);

/// The time a UUID v7 was made (its first 48 bits), or `None` for any other id.
fn made_at(id: Uuid) -> Option<time::OffsetDateTime> {
    if id.get_version_num() != 7 {
        return None;
    }
    let (secs, nanos) = id.get_timestamp()?.to_unix();
    let since_epoch = time::Duration::new(i64::try_from(secs).ok()?, i32::try_from(nanos).ok()?);
    time::OffsetDateTime::UNIX_EPOCH.checked_add(since_epoch)
}

/// Whether the id a caller chose for a call was made moments ago: a UUIDv7 whose time is within
/// [`FRESH_CALL_ID_WITHIN`] of `now`, either side. No id chosen (the correlator makes a fresh
/// one) counts as fresh. Any other id (a v4, an old v7) is still a good id; its call records
/// first and delivers after.
pub fn chosen_moments_ago(chosen: Option<Uuid>, now: time::OffsetDateTime) -> bool {
    let Some(chosen) = chosen else {
        return true;
    };
    made_at(chosen).is_some_and(|made| (now - made).abs() <= FRESH_CALL_ID_WITHIN)
}

/// How far ahead of the correlator's clock a chosen UUIDv7's time may be. An id further ahead
/// is refused: its call could record first now and deliver beside its record when the id
/// turns fresh, more than the duplicate window after the first copy (docs/protocol.md §9).
pub const CALL_ID_AHEAD_MAX: time::Duration = time::Duration::seconds(90);

/// Whether `chosen` is a UUIDv7 dated more than [`CALL_ID_AHEAD_MAX`] after `now`.
pub fn chosen_too_far_ahead(chosen: Option<Uuid>, now: time::OffsetDateTime) -> bool {
    let Some(chosen) = chosen.filter(|id| id.get_version_num() == 7) else {
        return false;
    };
    // A time past what a date can hold (after the year 9999) is far ahead too.
    made_at(chosen).is_none_or(|made| made - now > CALL_ID_AHEAD_MAX)
}

/// The message id of call `correlation_id`'s request (UUID v5 of `request` in the call's id):
/// every attempt of one call delivers the same message, so the inbox stores it once.
pub fn request_id_of(correlation_id: Uuid) -> Uuid {
    Uuid::new_v5(&correlation_id, b"request")
}

/// Clamps a requested timeout: default when absent, at most `max_ms`, at least 1 ms.
pub fn clamp_timeout(requested_ms: Option<u64>, default_ms: u64, max_ms: u64) -> u64 {
    requested_ms.unwrap_or(default_ms).min(max_ms).max(1)
}

/// Whether a call to `callee` made while serving `parent` asks back: the parent is still open,
/// and the call goes to its caller `in_reply_to` its request (the message being answered).
pub fn asks_back(
    parent: Option<&PendingCall>,
    callee: &AgentId,
    in_reply_to: Option<Uuid>,
) -> bool {
    parent.is_some_and(|parent| {
        parent.state == CallState::Open
            && parent.caller == *callee
            && in_reply_to == Some(parent.request_id)
    })
}

/// Derives a new call's chain from the call being served (if any) and checks the cycle and
/// depth rules: the callee must not be in the chain (nor be the caller), and the depth
/// (agents before the callee) must stay below `depth_limit`.
///
/// One exception to the cycle rule: asking back ([`asks_back`]). A callee may put a question
/// to the agent whose call it is serving, inside that call; it is still bound by the depth
/// rule and the parent's deadline, so a back-and-forth ends.
pub fn derive_chain(
    caller: &AgentId,
    callee: &AgentId,
    parent: Option<&PendingCall>,
    depth_limit: usize,
    in_reply_to: Option<Uuid>,
) -> Result<Vec<AgentId>, ErrorReply> {
    let asks_back = asks_back(parent, callee, in_reply_to);
    let mut chain = match parent {
        Some(parent) => {
            if parent.callee != *caller {
                return Err(ErrorReply::new(
                    ErrorKind::IdentityMismatch,
                    format!(
                        "parent call {} was made to `{}`, not to `{caller}`",
                        parent.correlation_id, parent.callee
                    ),
                ));
            }
            let mut chain = parent.chain.clone();
            chain.push(caller.clone());
            chain
        }
        None => vec![caller.clone()],
    };
    if chain.contains(callee) && !asks_back {
        chain.push(callee.clone());
        let path: Vec<&str> = chain.iter().map(AgentId::as_str).collect();
        return Err(ErrorReply::new(
            ErrorKind::Cycle,
            format!(
                "calling `{callee}` would close a cycle: {}",
                path.join(" → ")
            ),
        ));
    }
    if chain.len() >= depth_limit {
        let path: Vec<&str> = chain.iter().map(AgentId::as_str).collect();
        return Err(ErrorReply::new(
            ErrorKind::DepthExceeded,
            format!(
                "call depth {} reaches the limit of {depth_limit}: {} → {callee}",
                chain.len(),
                path.join(" → ")
            ),
        ));
    }
    Ok(chain)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_id_is_fresh_only_as_a_v7_made_moments_ago() {
        let now = time::OffsetDateTime::now_utc();
        assert!(chosen_moments_ago(None, now));
        assert!(chosen_moments_ago(Some(Uuid::now_v7()), now));
        // A v7 of 29 s ago or ahead is fresh; of 31 s either side, not.
        let at = |offset: i64| {
            let ms = (now + time::Duration::seconds(offset)).unix_timestamp_nanos() / 1_000_000;
            let ms = u64::try_from(ms).unwrap();
            Uuid::new_v7(uuid::Timestamp::from_unix(
                uuid::NoContext,
                ms / 1000,
                u32::try_from(ms % 1000).unwrap() * 1_000_000,
            ))
        };
        assert!(chosen_moments_ago(Some(at(-29)), now));
        assert!(chosen_moments_ago(Some(at(29)), now));
        assert!(!chosen_moments_ago(Some(at(-31)), now));
        assert!(!chosen_moments_ago(Some(at(31)), now));
        // A v4, a v5 (a scoped id), the nil and max ids: never.
        for other in [
            Uuid::from_u128(0x1234_5678_9abc_4def_8123_4567_89ab_cdef),
            scoped_call_id(&id("a"), Uuid::now_v7()),
            Uuid::nil(),
            Uuid::max(),
        ] {
            assert!(!chosen_moments_ago(Some(other), now), "{other}");
        }
        // A v7 at the end of time does not overflow, and is too far ahead; 89 s ahead is not.
        let last = Uuid::from_u128(0xffff_ffff_ffff_7fff_bfff_ffff_ffff_ffff);
        assert!(!chosen_moments_ago(Some(last), now));
        assert!(chosen_too_far_ahead(Some(last), now));
        assert!(chosen_too_far_ahead(Some(at(91)), now));
        assert!(!chosen_too_far_ahead(Some(at(89)), now));
        assert!(!chosen_too_far_ahead(Some(at(-1000)), now));
        assert!(!chosen_too_far_ahead(None, now));
    }

    fn id(raw: &str) -> AgentId {
        AgentId::parse(raw).unwrap()
    }

    fn parent(chain: &[&str], callee: &str) -> PendingCall {
        PendingCall {
            correlation_id: Uuid::now_v7(),
            caller: id(chain.last().unwrap()),
            caller_goal: GoalId::new(),
            callee: id(callee),
            chain: chain.iter().map(|a| id(a)).collect(),
            parent: None,
            request_id: Uuid::now_v7(),
            wait: true,
            state: CallState::Open,
            answered_via: None,
            claimed_at: None,
            created_at: OffsetDateTime::UNIX_EPOCH,
            deadline: OffsetDateTime::UNIX_EPOCH,
            stream: false,
            streamed: Vec::new(),
            answer: None,
            traceparent: None,
            budget: None,
        }
    }

    #[test]
    fn asking_back_in_reply_to_the_call_is_no_cycle_but_keeps_the_depth() {
        let p = parent(&["a"], "b");
        // b, serving a's call, asks a a question in reply to that call's request.
        assert_eq!(
            derive_chain(&id("b"), &id("a"), Some(&p), 5, Some(p.request_id)).unwrap(),
            vec![id("a"), id("b")]
        );
        // In reply to anything else it is the cycle it always was.
        let other = Some(Uuid::now_v7());
        let err = derive_chain(&id("b"), &id("a"), Some(&p), 5, other).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Cycle);
        // Only the parent's caller: a → b → c, c asking a back is a cycle.
        let p = parent(&["a", "b"], "c");
        let err = derive_chain(&id("c"), &id("a"), Some(&p), 5, Some(p.request_id)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Cycle);
        // And the depth rule holds for a question too.
        let p = parent(&["a", "b"], "c");
        let err = derive_chain(&id("c"), &id("b"), Some(&p), 3, Some(p.request_id)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::DepthExceeded);
    }

    #[test]
    fn timeouts_default_and_clamp() {
        assert_eq!(clamp_timeout(None, 30_000, 300_000), 30_000);
        assert_eq!(clamp_timeout(Some(5), 30_000, 300_000), 5);
        assert_eq!(clamp_timeout(Some(900_000), 30_000, 300_000), 300_000);
        assert_eq!(clamp_timeout(Some(0), 30_000, 300_000), 1);
        assert_eq!(
            clamp_timeout(None, 30_000, 0),
            1,
            "never panics on a bad max"
        );
    }

    #[test]
    fn chains_grow_from_the_parent() {
        assert_eq!(
            derive_chain(&id("a"), &id("b"), None, 5, None).unwrap(),
            vec![id("a")]
        );
        let p = parent(&["a"], "b");
        assert_eq!(
            derive_chain(&id("b"), &id("c"), Some(&p), 5, None).unwrap(),
            vec![id("a"), id("b")]
        );
    }

    #[test]
    fn a_b_a_is_a_cycle_naming_the_chain() {
        let p = parent(&["a"], "b");
        let err = derive_chain(&id("b"), &id("a"), Some(&p), 5, None).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Cycle);
        assert!(
            err.error.message.contains("a → b → a"),
            "{}",
            err.error.message
        );
    }

    #[test]
    fn the_fifth_hop_is_refused() {
        // a→b→c→d→e is fine (depth 4); e→f would be depth 5.
        let p = parent(&["a", "b", "c", "d"], "e");
        let err = derive_chain(&id("e"), &id("f"), Some(&p), 5, None).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::DepthExceeded);
        let p = parent(&["a", "b", "c"], "d");
        assert_eq!(
            derive_chain(&id("d"), &id("e"), Some(&p), 5, None)
                .unwrap()
                .len(),
            4
        );
    }

    #[test]
    fn only_the_callee_of_the_parent_may_extend_it() {
        let p = parent(&["a"], "b");
        let err = derive_chain(&id("mallory"), &id("c"), Some(&p), 5, None).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::IdentityMismatch);
    }

    #[test]
    fn record_round_trips() {
        let p = parent(&["a"], "b");
        let text = serde_json::to_string(&p).unwrap();
        assert_eq!(serde_json::from_str::<PendingCall>(&text).unwrap(), p);
        assert!(!text.contains("answered_via"));
    }
}
