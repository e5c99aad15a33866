//! Every subject of the fabric (docs/protocol.md §3): one constant or builder per subject, used
//! by the services, the clients and the generated NATS permissions alike, so renaming one
//! here renames it everywhere. No other crate spells a subject (`tests/layout.rs` checks).
//!
//! Grouped as: agent inboxes, the directory, send, calls, tasks, audit and refusals, dead
//! letters, the services' internal index streams, and NATS's own (`$JS`, `$SRV`, reply
//! inboxes). Then the caller-identity rule.
//!
//! Identity rule: every subject an agent publishes a request to ends with the caller's own
//! `agent_id`; services take the caller from that token, never from the body. Services subscribe
//! with a trailing `>` so that malformed tails (`a.b`, over-long ids) still reach them and get a
//! typed error instead of silence.

use uuid::Uuid;

use crate::call::CallEventKind;
use crate::ids::{AgentId, GoalId, IdError};
use crate::names::{INBOX_STREAM, inbox_consumer};

/// `<prefix>.>`: every subject below `prefix` (what a service endpoint subscribes to, what a
/// stream holds).
pub fn below(prefix: &str) -> String {
    format!("{prefix}.>")
}

/// Prefix of every per-goal inbox subject: `agent.inbox.<goal_id>`.
pub const INBOX_SUBJECT_PREFIX: &str = "agent.inbox";

/// `agent.inbox.<goal_id>`: where a goal's messages land.
pub fn inbox(goal_id: &GoalId) -> String {
    format!("{INBOX_SUBJECT_PREFIX}.{goal_id}")
}

/// `agent.inbox.*`: every goal inbox (the subjects of `AGENT_INBOX`): exactly one token after
/// the prefix, so the fetch and ack requests below are never stored as messages.
pub const INBOX_ALL: &str = "agent.inbox.*";

/// Prefix of inbox reads: `agent.inbox.fetch.<agent_id>`.
pub const INBOX_FETCH_PREFIX: &str = "agent.inbox.fetch";
/// Prefix of cursor moves and rejects: `agent.inbox.ack.<agent_id>`.
pub const INBOX_ACK_PREFIX: &str = "agent.inbox.ack";

/// `agent.inbox.fetch.<agent_id>`: read one of the caller's goals after its cursor.
pub fn inbox_fetch(agent: &AgentId) -> String {
    format!("{INBOX_FETCH_PREFIX}.{agent}")
}

/// `agent.inbox.ack.<agent_id>`: move one of the caller's goal cursors, or reject a message.
pub fn inbox_ack(agent: &AgentId) -> String {
    format!("{INBOX_ACK_PREFIX}.{agent}")
}

/// Prefix of the stored-message notices `AGENT_INBOX` republishes (headers only, services
/// only): `_SB.inbox.stored.<goal_id>`, sent once a message is stored, which is what wakes
/// a held fetch on any replica.
pub const INBOX_STORED_PREFIX: &str = "_SB.inbox.stored";
/// `_SB.inbox.stored.<goal_id>`: the notice that a message for the goal was stored.
pub fn inbox_stored(goal_id: &GoalId) -> String {
    format!("{INBOX_STORED_PREFIX}.{goal_id}")
}

/// Every stored-message notice (what each inbox-fanout replica subscribes to).
pub const INBOX_STORED_ALL: &str = "_SB.inbox.stored.*";
/// The republish destination template of `AGENT_INBOX` (`{{wildcard(1)}}` is the goal id).
pub const INBOX_STORED_TEMPLATE: &str = "_SB.inbox.stored.{{wildcard(1)}}";

/// Prefix of the directory's request subjects.
pub const REGISTRY_PREFIX: &str = "agent.registry";
/// Prefix of directory events.
pub const REGISTRY_EVENTS_PREFIX: &str = "agent.registry.events";
/// Every directory event (the subjects of `AGENT_EVENTS`).
pub const REGISTRY_EVENTS_ALL: &str = "agent.registry.events.>";

/// A directory request, addressed as `agent.registry.<op>.<agent_id>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RegistryOp {
    /// Create or update the caller's card.
    Register,
    /// Keep the caller online.
    Heartbeat,
    /// Take the caller offline and close its goals.
    Deregister,
    /// Open a goal (and its inbox cursor).
    GoalOpen,
    /// Close a goal and purge its inbox.
    GoalClose,
    /// list_peers.
    Peers,
    /// Look up one agent.
    Lookup,
}

impl RegistryOp {
    /// Every op, for wiring endpoints.
    pub const ALL: [RegistryOp; 7] = [
        Self::Register,
        Self::Heartbeat,
        Self::Deregister,
        Self::GoalOpen,
        Self::GoalClose,
        Self::Peers,
        Self::Lookup,
    ];

    /// The op's subject tokens (`goal.open` spans two).
    pub fn token(self) -> &'static str {
        match self {
            Self::Register => "register",
            Self::Heartbeat => "heartbeat",
            Self::Deregister => "deregister",
            Self::GoalOpen => "goal.open",
            Self::GoalClose => "goal.close",
            Self::Peers => "peers",
            Self::Lookup => "lookup",
        }
    }

    /// The micro endpoint name (`goal_open` for `goal.open`).
    pub fn endpoint_name(self) -> &'static str {
        match self {
            Self::GoalOpen => "goal_open",
            Self::GoalClose => "goal_close",
            other => other.token(),
        }
    }

    /// Subject prefix without the agent token: `agent.registry.<op>`.
    pub fn prefix(self) -> String {
        format!("{REGISTRY_PREFIX}.{}", self.token())
    }

    /// `agent.registry.<op>.<agent_id>`: the subject an agent publishes this request to.
    pub fn subject(self, agent: &AgentId) -> String {
        format!("{}.{agent}", self.prefix())
    }

    /// The subject a service subscribes to (`agent.registry.<op>.>`).
    pub fn endpoint_subject(self) -> String {
        below(&self.prefix())
    }
}

/// An event the directory publishes as `agent.registry.events.<event>.<agent_id>`.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum RegistryEvent {
    /// A card was created or updated.
    Registered,
    /// The agent deregistered.
    Deregistered,
    /// The agent's status changed through a heartbeat or a task-load report.
    Status,
    /// `goal.open` recorded a new goal (not sent on an idempotent re-open).
    GoalOpened,
    /// A goal was closed, by `goal.close` or by `deregister`.
    GoalClosed,
    /// Heartbeats stopped for longer than the timeout.
    Offline,
}

impl RegistryEvent {
    /// The event's subject token.
    pub fn token(self) -> &'static str {
        match self {
            Self::Registered => "registered",
            Self::Deregistered => "deregistered",
            Self::Status => "status",
            Self::GoalOpened => "goal_opened",
            Self::GoalClosed => "goal_closed",
            Self::Offline => "offline",
        }
    }

    /// `agent.registry.events.<event>.<agent_id>`.
    pub fn subject(self, agent: &AgentId) -> String {
        format!("{REGISTRY_EVENTS_PREFIX}.{}.{agent}", self.token())
    }
}

/// Prefix of send requests: `agent.send.<agent_id>`.
pub const SEND_PREFIX: &str = "agent.send";

/// `agent.send.<agent_id>`: send_to_peer / broadcast.
pub fn send(agent: &AgentId) -> String {
    format!("{SEND_PREFIX}.{agent}")
}

/// Prefix of the receipt status request: `agent.send.status.<agent_id>`.
pub const SEND_STATUS_PREFIX: &str = "agent.send.status";

/// `agent.send.status.<agent_id>`: where a message the caller sent with `receipt` is.
pub fn send_status(agent: &AgentId) -> String {
    format!("{SEND_STATUS_PREFIX}.{agent}")
}

/// Prefix of call requests.
pub const CALL_PREFIX: &str = "agent.call";
/// Prefix of replies.
pub const REPLY_PREFIX: &str = "agent.reply";
/// Prefix of pending-call listings.
pub const CALLS_PENDING_PREFIX: &str = "agent.calls.pending";
/// Prefix of the internal subjects waiting correlators listen on for answers (services only).
pub const CALL_ANSWER_PREFIX: &str = "_SB.calls.answer";
/// Internal subject a waiting correlator listens on for one call's answer (services only).
pub fn call_answer(correlation_id: &Uuid) -> String {
    format!("{CALL_ANSWER_PREFIX}.{correlation_id}")
}

/// `agent.call.<agent_id>`: a correlated call.
pub fn call(agent: &AgentId) -> String {
    format!("{CALL_PREFIX}.{agent}")
}

/// `agent.reply.<agent_id>`: reply_to_peer.
pub fn reply(agent: &AgentId) -> String {
    format!("{REPLY_PREFIX}.{agent}")
}

/// `agent.calls.pending.<agent_id>`: open calls of an agent.
pub fn calls_pending(agent: &AgentId) -> String {
    format!("{CALLS_PENDING_PREFIX}.{agent}")
}

/// Prefix of the streamed-call read-back: `agent.calls.parts.<agent_id>`.
pub const CALLS_PARTS_PREFIX: &str = "agent.calls.parts";

/// `agent.calls.parts.<agent_id>`: the parts (and final answer) of a streamed call the caller
/// made.
pub fn calls_parts(agent: &AgentId) -> String {
    format!("{CALLS_PARTS_PREFIX}.{agent}")
}

/// Prefix of the directory's task-load endpoint (services only):
/// `_SB.registry.tasks.<agent_id>` with a [`crate::registry::TaskLoadReport`].
pub const REGISTRY_TASKS_PREFIX: &str = "_SB.registry.tasks";

/// `_SB.registry.tasks.<agent_id>`: where the task service reports an agent's load.
pub fn registry_tasks(agent: &AgentId) -> String {
    format!("{REGISTRY_TASKS_PREFIX}.{agent}")
}

/// Prefix of the directory's skill routing (services only): `_SB.registry.route.<agent_id>`
/// with a [`crate::registry::RouteRequest`], answered for that agent.
pub const REGISTRY_ROUTE_PREFIX: &str = "_SB.registry.route";

/// `_SB.registry.route.<agent_id>`: which agent with a skill `agent`'s message goes to.
pub fn registry_route(agent: &AgentId) -> String {
    format!("{REGISTRY_ROUTE_PREFIX}.{agent}")
}

/// Prefix of task requests: `agent.task.<op>.<agent_id>` ([`crate::task::TaskRequestOp`]).
pub const TASK_PREFIX: &str = "agent.task";
/// Prefix of task events: `agent.task.events.<task_id>`.
pub const TASK_EVENTS_PREFIX: &str = "agent.task.events";

/// `agent.task.events.<task_id>`: one event per transition (and the creation).
pub fn task_events(task_id: &Uuid) -> String {
    format!("{TASK_EVENTS_PREFIX}.{task_id}")
}

/// Prefix of call events.
pub const CALL_EVENTS_PREFIX: &str = "agent.calls.events";

/// `agent.calls.events.<event>.<correlation_id>`.
pub fn call_events(event: CallEventKind, correlation_id: &Uuid) -> String {
    format!("{CALL_EVENTS_PREFIX}.{}.{correlation_id}", event.token())
}

/// Prefix of the people requests: `agent.people.<op>.<agent_id>` ([`crate::people::PeopleOp`]).
pub const PEOPLE_PREFIX: &str = "agent.people";
/// Prefix of the limits requests: `agent.limits.<op>.<agent_id>` ([`crate::limits::LimitsOp`]).
pub const LIMITS_PREFIX: &str = "agent.limits";
pub use crate::budget::{BUDGET_EVENTS_PREFIX, BUDGET_PREFIX};
/// Prefix of people events: `agent.people.events.<event>.<item_id>`
/// ([`crate::people::PeopleEventKind::subject`]).
pub const PEOPLE_EVENTS_PREFIX: &str = "agent.people.events";
pub use crate::files::FILES_PREFIX;
/// Prefix of files events: `agent.files.events.<kind>.<file_id>` (`uploaded`, `read`,
/// `deleted`), stored in `AGENT_EVENTS` for the audit.
pub const FILES_EVENTS_PREFIX: &str = "agent.files.events";

/// `agent.files.events.<kind>.<file_id>`.
pub fn files_event(kind: &str, file: &Uuid) -> String {
    format!("{FILES_EVENTS_PREFIX}.{kind}.{file}")
}

/// Prefix of the operator endpoints (services, the console and the operator CLI only; agents
/// get a permission violation): `_SB.ops.<service>.<op>`.
pub const OPS_PREFIX: &str = "_SB.ops";

/// `_SB.ops.<service>.<op>`.
pub fn ops(service: &str, op: &str) -> String {
    format!("{OPS_PREFIX}.{service}.{op}")
}

/// Prefix of the audit queries: `agent.audit.<op>` ([`crate::audit::AuditOp`]).
pub const AUDIT_PREFIX: &str = "agent.audit";
/// The subject of `AGENT_AUDIT` written before writers had their own (services only).
pub const AUDIT_RECORDS: &str = "_SB.audit.records";
/// The records of every audit writer: `_SB.audit.records.<writer_id>` (services only).
pub const AUDIT_RECORDS_ALL: &str = "_SB.audit.records.*";

/// `_SB.audit.records.<writer_id>`: where one audit writer appends. A record whose
/// predecessor is the writer's own is published with that subject's expected last sequence,
/// so it can only follow the very record it names as its predecessor.
pub fn audit_records_of(writer: &Uuid) -> String {
    format!("{AUDIT_RECORDS}.{writer}")
}
/// Prefix of refusal events: `agent.refusals.<service>.<agent_id>`.
pub const REFUSALS_PREFIX: &str = "agent.refusals";

/// `agent.refusals.<service>.<agent_id>`: a request `service` refused from `caller` (the
/// caller token is whatever the subject named, already checked to be one token).
pub fn refusal(service: &str, caller: &str) -> String {
    format!("{REFUSALS_PREFIX}.{service}.{caller}")
}

/// Subject prefix of dead letters: `agent.dlq.<stream>.<reader>`, the reader of a goal being
/// `inbox-<goal_id>` ([`inbox_consumer`], [`dead_letter`]).
pub const DLQ_PREFIX: &str = "agent.dlq";

/// `agent.dlq.AGENT_INBOX.inbox-<goal_id>`: where a goal's dead letters go.
pub fn dead_letter(goal_id: &GoalId) -> String {
    format!("{DLQ_PREFIX}.{INBOX_STREAM}.{}", inbox_consumer(goal_id))
}

/// The subjects of one of the services' internal index streams: `<prefix><key>`, one entry per
/// key, the keys laid out by the service that owns the index (services only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexSubjects {
    prefix: &'static str,
}

impl IndexSubjects {
    /// The prefix every entry's subject starts with (ends with `.`).
    pub fn prefix(self) -> &'static str {
        self.prefix
    }

    /// The subject of the entry `key` (`out.alice.<id>` → `_SB.calls.open.out.alice.<id>`);
    /// `key` may hold wildcards to make a filter.
    pub fn entry(self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// Every entry: the stream's subject filter.
    pub fn all(self) -> String {
        self.entry(">")
    }
}

/// The open-call index of the reply-correlator: `_SB.calls.open.out.<caller>.<id>` and
/// `_SB.calls.open.in.<callee>.<id>`.
pub const CALLS_OPEN_INDEX: IndexSubjects = IndexSubjects {
    prefix: "_SB.calls.open.",
};

/// The task index of task-lifecycle: `_SB.tasks.req.<agent>.<id>`, `_SB.tasks.asg.<agent>.<id>`
/// (kept while the task is kept) and `_SB.tasks.open.<id>` (removed when the task ends).
pub const TASKS_INDEX: IndexSubjects = IndexSubjects {
    prefix: "_SB.tasks.",
};

/// `$JS.API.INFO`: the JetStream account info request (a context asks it first).
pub const JS_API_INFO: &str = "$JS.API.INFO";
/// `$JS.FC.>`: where a push consumer's flow-control replies go (an ordered watch answers them).
pub const JS_FLOW_CONTROL_ALL: &str = "$JS.FC.>";

/// `$JS.API.<op>.<stream>`: a JetStream API request on one stream, `op` like `STREAM.INFO`,
/// `STREAM.MSG.GET` or `CONSUMER.CREATE` (what a permission list names).
pub fn js_api(op: &str, stream: &str) -> String {
    format!("$JS.API.{op}.{stream}")
}

/// `$JS.API.DIRECT.GET.<stream>`: JetStream's direct get (any replica answers).
pub fn js_direct_get(stream: &str) -> String {
    format!("$JS.API.DIRECT.GET.{stream}")
}

/// `$SRV.PING.<service>`, or `$SRV.PING.<service>.<instance>` for one instance: the NATS micro
/// discovery ping.
pub fn service_ping(service: &str, instance: Option<&str>) -> String {
    match instance {
        Some(id) => format!("$SRV.PING.{service}.{id}"),
        None => format!("$SRV.PING.{service}"),
    }
}

/// `$SRV.STATS.<service>`, or `$SRV.STATS.<service>.<instance>` for one instance: the NATS
/// micro statistics (each endpoint's `data` holds `errors_by_kind` and `telemetry`).
pub fn service_stats(service: &str, instance: Option<&str>) -> String {
    match instance {
        Some(id) => format!("$SRV.STATS.{service}.{id}"),
        None => format!("$SRV.STATS.{service}"),
    }
}

/// Prefixes of the subjects a service answers on: NATS reply inboxes (`_INBOX.` is every
/// client library's default) and the server's import reply subjects (`_R_.`, docs/protocol.md
/// §1). A request whose reply subject is anything else — a KV key, a JetStream API subject,
/// another goal's inbox — is refused unanswered: a service never writes where a caller points.
pub const REPLY_INBOX_PREFIXES: [&str; 2] = ["_INBOX.", IMPORTED_REPLY_PREFIX];

/// The reply subjects the server makes for a request imported from another account (under
/// the generated accounts, every agent's request to a service): each leads back to the
/// requester alone.
pub const IMPORTED_REPLY_PREFIX: &str = "_R_.";

/// Whether `reply` is a subject a service may answer on (see [`REPLY_INBOX_PREFIXES`]): one of
/// the prefixes followed by at least one more token, with no wildcard.
pub fn is_reply_inbox(reply: &str) -> bool {
    REPLY_INBOX_PREFIXES.iter().any(|prefix| {
        reply
            .strip_prefix(prefix)
            .is_some_and(|rest| !rest.is_empty() && !rest.contains(['*', '>', ' ']))
    })
}

/// The reply subject prefix of agent `<agent_id>`: `_INBOX.<agent_id>`. Every agent's client
/// uses it (docs/protocol.md §1), and under the generated NATS config an agent may subscribe
/// only below it, so no agent can see another's replies.
pub fn agent_inbox_prefix(agent: &AgentId) -> String {
    format!("{}{agent}", REPLY_INBOX_PREFIXES[0])
}

/// Extracts and validates the caller identity: the part of `subject` after `prefix.`.
///
/// The tail must be exactly one valid agent id token; `a.b`, an empty tail or 65 characters are
/// all [`IdError`]s, which services answer with `invalid_agent_id`.
pub fn caller_from_subject(subject: &str, prefix: &str) -> Result<AgentId, IdError> {
    let tail = subject
        .strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix('.'))
        .unwrap_or("");
    AgentId::parse(tail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builders_spell_the_contract() {
        let a = AgentId::parse("writer").unwrap();
        let g = GoalId::parse("0193a1b2-0000-7000-8000-000000000001").unwrap();
        assert_eq!(
            inbox(&g),
            "agent.inbox.0193a1b2-0000-7000-8000-000000000001"
        );
        assert_eq!(
            RegistryOp::Register.subject(&a),
            "agent.registry.register.writer"
        );
        assert_eq!(
            RegistryOp::GoalOpen.subject(&a),
            "agent.registry.goal.open.writer"
        );
        assert_eq!(
            RegistryOp::GoalClose.endpoint_subject(),
            "agent.registry.goal.close.>"
        );
        assert_eq!(
            RegistryEvent::Offline.subject(&a),
            "agent.registry.events.offline.writer"
        );
        assert_eq!(send(&a), "agent.send.writer");
        assert_eq!(call(&a), "agent.call.writer");
        assert_eq!(reply(&a), "agent.reply.writer");
        assert_eq!(calls_pending(&a), "agent.calls.pending.writer");
        assert_eq!(inbox_fetch(&a), "agent.inbox.fetch.writer");
        assert_eq!(inbox_ack(&a), "agent.inbox.ack.writer");
        assert_eq!(agent_inbox_prefix(&a), "_INBOX.writer");
    }

    #[test]
    fn only_reply_inboxes_are_answered() {
        for ok in ["_INBOX.abc.def", "_INBOX.x", "_R_.abc.def"] {
            assert!(is_reply_inbox(ok), "{ok}");
        }
        for hostile in [
            "$KV.agent_registry.bob",
            "$JS.API.STREAM.DELETE.AGENT_AUDIT",
            "_SB.audit.records",
            "agent.inbox.0193a1b2-0000-7000-8000-000000000001",
            "_INBOX.",
            "_INBOX",
            "_INBOX.>",
            "_INBOXX.a",
            "_R_.*",
        ] {
            assert!(!is_reply_inbox(hostile), "{hostile}");
        }
    }

    #[test]
    fn caller_comes_from_the_last_token() {
        let p = RegistryOp::Peers.prefix();
        assert_eq!(
            caller_from_subject("agent.registry.peers.writer", &p).unwrap(),
            "writer"
        );
        assert!(caller_from_subject("agent.registry.peers.a.b", &p).is_err());
        assert!(caller_from_subject("agent.registry.peers", &p).is_err());
        assert!(caller_from_subject("agent.registry.peersx", &p).is_err());
        let long = format!("agent.registry.peers.{}", "a".repeat(65));
        assert!(caller_from_subject(&long, &p).is_err());
    }
}
