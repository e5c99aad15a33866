//! Agent cards, runtime state, goals, and the directory's requests and replies
//! (docs/protocol.md §4, §5).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use time::OffsetDateTime;

use crate::ids::{AgentId, GoalId};
use crate::subject::RegistryEvent;

/// What an agent says about itself (A2A-style agent card plus access rules).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AgentCard {
    /// The agent's id (always equal to the registering subject's last token).
    pub agent_id: AgentId,
    /// What the agent does, for other agents (and their LLMs) to read.
    #[serde(default)]
    pub description: String,
    /// Short capability labels, e.g. `search`.
    #[serde(default)]
    pub capabilities: Vec<String>,
    /// A2A-style skills.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skills: Vec<Skill>,
    /// Globs of agents allowed to message this one (`*` = anyone).
    #[serde(default = "everyone")]
    pub allow_from: Vec<String>,
    /// Globs of agents this one may message (`*` = anyone).
    #[serde(default = "everyone")]
    pub can_talk_to: Vec<String>,
    /// Globs of agents this one may never message; beats `can_talk_to`.
    #[serde(default)]
    pub deny_talk_to: Vec<String>,
    /// Tasks it works on at once (accepted, working, input_required).
    #[serde(default = "default_max_concurrent_tasks")]
    pub max_concurrent_tasks: u32,
    /// Free-form JSON object for other agents to read; omitted from the wire when empty.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub metadata: Map<String, Value>,
}

impl AgentCard {
    /// A card with defaults: open ACLs, no description.
    pub fn new(agent_id: AgentId) -> Self {
        Self {
            agent_id,
            description: String::new(),
            capabilities: Vec::new(),
            skills: Vec::new(),
            allow_from: everyone(),
            can_talk_to: everyone(),
            deny_talk_to: Vec::new(),
            max_concurrent_tasks: default_max_concurrent_tasks(),
            metadata: Map::new(),
        }
    }
}

fn everyone() -> Vec<String> {
    vec!["*".to_owned()]
}

/// The card metadata key that, `false`, keeps `skill:` routing away from an agent whose card
/// still lists skills for others to read.
pub const ROUTES_SKILLS_KEY: &str = "routes_skills";

/// The card metadata key the A2A gateway writes on the card of a remote A2A agent it carries
/// (`switchboard a2a add`): the remote's card URL. It marks the directory record as the
/// remote's: the directory never lets such a card replace a Switchboard agent's card, nor
/// take an id keyed in the agents file, while the agent itself may always take its id back
/// from a remote (docs/protocol.md §4.1).
pub const REMOTE_CARD_URL_KEY: &str = "a2a_card_url";

/// Default of [`AgentCard::max_concurrent_tasks`].
pub const DEFAULT_MAX_CONCURRENT_TASKS: u32 = 3;

fn default_max_concurrent_tasks() -> u32 {
    DEFAULT_MAX_CONCURRENT_TASKS
}

/// An A2A-style skill.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Skill {
    /// Stable id of the skill, e.g. `web`; required.
    pub id: String,
    /// Human-readable name, e.g. `Web search`; required.
    pub name: String,
    /// What it does.
    #[serde(default)]
    pub description: String,
    /// Free-form labels, e.g. `web`; omitted from the wire when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// Example requests an LLM (or an A2A client) can model its own on, e.g. `find the 2025
    /// revenue of ACME`; omitted when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub examples: Vec<String>,
    /// Media types the skill takes, e.g. `text/plain`; empty = the agent's defaults.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub input_modes: Vec<String>,
    /// Media types the skill answers with; empty = the agent's defaults.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub output_modes: Vec<String>,
}

/// Whether an agent is around and how loaded it is.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum AgentStatus {
    /// Online, free.
    #[default]
    Idle,
    /// Online, working.
    Busy,
    /// Heartbeats stopped or deregistered; messages keep queuing.
    Offline,
}

/// The directory's record of an agent: its card plus runtime state. The value stored in the
/// `agent_registry` KV bucket under the agent id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AgentRecord {
    /// The card, as last registered.
    pub card: AgentCard,
    /// Idle, busy or offline: set by (de)register, heartbeats, task load and the offline sweep.
    pub status: AgentStatus,
    /// Ids of tasks the agent reports it is working on.
    #[serde(default)]
    pub current_tasks: Vec<String>,
    /// How many tasks the task service last counted active for the agent (accepted, working
    /// or asking). Skill routing weighs this count, never what the agent says of itself.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub task_load: u32,
    /// Time of the first registration, kept across re-registrations and restarts.
    #[serde(with = "time::serde::rfc3339")]
    #[schemars(with = "crate::timestamp::Timestamp")]
    pub registered_at: OffsetDateTime,
    /// Last register or heartbeat.
    #[serde(with = "time::serde::rfc3339")]
    #[schemars(with = "crate::timestamp::Timestamp")]
    pub last_heartbeat: OffsetDateTime,
}

fn is_zero(count: &u32) -> bool {
    *count == 0
}

/// What kind of run a goal is.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum GoalKind {
    /// A session with a human in the loop (the default).
    #[default]
    Interactive,
    /// A background job.
    Background,
    /// A long-running daemon.
    Daemon,
}

/// A live goal: the value stored in `agent_goals` under `<agent_id>.<goal_id>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct GoalRecord {
    /// The goal's id: the second half of its `agent_goals` key.
    pub goal_id: GoalId,
    /// The agent that opened (owns) the goal: the first half of the key.
    pub agent_id: AgentId,
    /// What kind of run it is.
    #[serde(default)]
    pub kind: GoalKind,
    /// When it opened.
    #[serde(with = "time::serde::rfc3339")]
    #[schemars(with = "crate::timestamp::Timestamp")]
    pub opened_at: OffsetDateTime,
}

/// Key of a goal in the `agent_goals` bucket: `<agent_id>.<goal_id>`.
pub fn goal_key(agent: &AgentId, goal: &GoalId) -> String {
    format!("{agent}.{goal}")
}

/// Reply to `register`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RegisterReply {
    /// The caller's id, taken from the subject (a card naming another is refused).
    pub agent_id: AgentId,
    /// First registration time (kept across re-registrations).
    #[serde(with = "time::serde::rfc3339")]
    #[schemars(with = "crate::timestamp::Timestamp")]
    pub registered_at: OffsetDateTime,
}

/// Body of `heartbeat`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HeartbeatRequest {
    /// New status (`idle` or `busy`; use deregister to go offline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<AgentStatus>,
    /// Ids of the tasks the agent is working on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_tasks: Option<Vec<String>>,
}

/// Sent by task-lifecycle to `_SB.registry.tasks.<agent_id>` whenever an agent's active tasks
/// change: the directory stores them as `current_tasks` and marks the agent `busy` at its cap.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskLoadReport {
    /// The agent's tasks in accepted, working or input_required.
    pub current_tasks: Vec<uuid::Uuid>,
}

/// Reply to `heartbeat`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct HeartbeatReply {
    /// The caller's id, taken from the subject.
    pub agent_id: AgentId,
    /// Its status after the heartbeat.
    pub status: AgentStatus,
    /// When the directory took this heartbeat; 30 s (default) without another = offline.
    #[serde(with = "time::serde::rfc3339")]
    #[schemars(with = "crate::timestamp::Timestamp")]
    pub last_heartbeat: OffsetDateTime,
}

/// Reply to `deregister`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DeregisterReply {
    /// The caller's id, taken from the subject; its card is kept.
    pub agent_id: AgentId,
    /// Goals closed (inboxes purged, cursors deleted), in the order they were opened.
    pub closed_goals: Vec<GoalId>,
}

/// Body of `goal.open`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GoalOpenRequest {
    /// Reuse this goal id (re-open after a restart); a fresh one when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub goal_id: Option<GoalId>,
    /// Open the goal by name (1–64 characters of `[a-z0-9_.-]`, not with `goal_id`): the same
    /// name always opens the same goal of this agent ([`GoalId::named`]), so an agent that
    /// restarts resumes it and reads what was sent while it was down.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// What kind of run this is (default `interactive`); ignored when re-opening a goal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<GoalKind>,
    /// What a message that finds the goal's inbox full does (default `evict_oldest`); ignored
    /// when re-opening a goal the caller holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overflow: Option<crate::inbox::Overflow>,
}

/// Reply to `goal.open`: where the goal's messages are.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct GoalOpenReply {
    /// The goal's id: the one asked for, or a fresh UUID v7.
    pub goal_id: GoalId,
    /// Its inbox subject, `agent.inbox.<goal_id>` (read it with `agent.inbox.fetch.<agent_id>`;
    /// agents never read the stream themselves).
    pub subject: String,
}

/// Body of `goal.close`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GoalCloseRequest {
    /// One of the caller's open goals; any other id is `not_found`.
    pub goal_id: GoalId,
}

/// Reply to `goal.close`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct GoalCloseReply {
    /// The goal that was closed; fetch and ack of it are `not_found` from now on.
    pub goal_id: GoalId,
    /// Messages purged from its inbox.
    pub purged: u64,
}

/// One entry of list_peers (the seed shape plus `capabilities` and `status`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PeerSummary {
    /// The peer's id: what a send, call or task names as `to`.
    pub agent_id: AgentId,
    /// What the peer does, from its card (empty when it gave none).
    pub description: String,
    /// Capability labels from the peer's card, e.g. `search`.
    #[serde(default)]
    pub capabilities: Vec<String>,
    /// Idle, busy or offline; status does not affect `reachable`.
    pub status: AgentStatus,
    /// Whether the caller can reach it now (ACL allows the pair and it has a live goal).
    pub reachable: bool,
}

/// Most peers one list_peers page returns when the request names no `limit`.
pub const PEERS_PAGE_DEFAULT: u32 = 100;
/// Most peers one list_peers page may return, whatever `limit` asks for.
pub const PEERS_PAGE_MAX: u32 = 1_000;
/// Budget for one list_peers page, in bytes of its peers' JSON: a page ends early rather than
/// grow past it, so a page always fits a NATS message (the smallest `max_payload` Switchboard
/// supports is 256 KiB).
pub const PEERS_PAGE_BYTES: usize = 128 * 1024;

/// Body of `peers` (list_peers); an empty body asks for the first page.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PeersRequest {
    /// Start after this agent id (the previous page's `next`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    /// Most peers to return (default [`PEERS_PAGE_DEFAULT`], at most [`PEERS_PAGE_MAX`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// Only peers whose card lists this skill (a capability or a skill id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skill: Option<String>,
}

/// Body of `_SB.registry.route.<agent_id>` (services only): pick one agent with `skill` for
/// a message, call or task from that agent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RouteRequest {
    /// The skill, as in `skill:<name>`.
    pub skill: String,
    /// For a task: agents at their `max_concurrent_tasks` are skipped.
    #[serde(default)]
    pub task: bool,
}

/// Reply to a route request: the agent picked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RouteReply {
    /// An agent that lists the skill, is reachable from the asker (ACL both ways, a live
    /// goal, not offline) and, for a task, below its cap: idle before busy, fewest current
    /// tasks, then round-robin.
    pub agent_id: AgentId,
}

impl AgentCard {
    /// Takes control characters out of every text of the card (terminal escape sequences
    /// included), keeping line breaks and tabs in descriptions: a card is shown to other
    /// agents, their LLMs and their operators' terminals, and is written by whoever registers.
    pub fn strip_control(&mut self) {
        fn line(text: &mut String) {
            if text.chars().any(char::is_control) {
                text.retain(|c| !c.is_control());
            }
        }
        fn prose(text: &mut String) {
            if text
                .chars()
                .any(|c| c.is_control() && c != '\n' && c != '\t')
            {
                text.retain(|c| !c.is_control() || c == '\n' || c == '\t');
            }
        }
        prose(&mut self.description);
        self.capabilities.iter_mut().for_each(line);
        for skill in &mut self.skills {
            line(&mut skill.id);
            line(&mut skill.name);
            prose(&mut skill.description);
            skill.tags.iter_mut().for_each(line);
            skill.examples.iter_mut().for_each(prose);
            skill.input_modes.iter_mut().for_each(line);
            skill.output_modes.iter_mut().for_each(line);
        }
    }

    /// Whether `skill:` work may be routed to this card's agent for `skill`: it lists it, and
    /// its metadata does not say [`ROUTES_SKILLS_KEY`]` = false` (what the A2A gateway writes
    /// on a remote agent's card unless the operator opened it to routing).
    pub fn routes_skill(&self, skill: &str) -> bool {
        self.has_skill(skill)
            && self.metadata.get(ROUTES_SKILLS_KEY) != Some(&serde_json::Value::Bool(false))
    }

    /// Whether the card lists `skill`: as a capability or as a skill's id.
    pub fn has_skill(&self, skill: &str) -> bool {
        self.capabilities.iter().any(|c| c == skill) || self.skills.iter().any(|s| s.id == skill)
    }

    /// Whether this is the card of a remote A2A agent the gateway carries: its metadata
    /// names the remote's card URL ([`REMOTE_CARD_URL_KEY`]).
    pub fn is_remote(&self) -> bool {
        self.metadata.contains_key(REMOTE_CARD_URL_KEY)
    }
}

/// Reply to `peers` (list_peers): one page of peers in agent-id order.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PeersReply {
    /// Other registered agents, in agent-id order.
    pub peers: Vec<PeerSummary>,
    /// More peers follow: ask again with `after` set to this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
    /// Why the list is empty, when the caller is not registered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Body of `lookup`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LookupRequest {
    /// The agent to look up (validated by the service, so a bad id gets `invalid_agent_id`).
    pub agent_id: String,
}

/// Reply to `lookup`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct LookupReply {
    /// The full stored card, every default filled in.
    pub card: AgentCard,
    /// Idle, busy or offline: set by (de)register, heartbeats, task load and the offline sweep.
    pub status: AgentStatus,
    /// Ids of its active tasks, from its heartbeats or the task service's load reports.
    pub current_tasks: Vec<String>,
    /// Time of the first registration, kept across re-registrations and restarts.
    #[serde(with = "time::serde::rfc3339")]
    #[schemars(with = "crate::timestamp::Timestamp")]
    pub registered_at: OffsetDateTime,
    /// Last register or heartbeat; 30 s (default) without one marks the agent offline.
    #[serde(with = "time::serde::rfc3339")]
    #[schemars(with = "crate::timestamp::Timestamp")]
    pub last_heartbeat: OffsetDateTime,
    /// Ids of the agent's open goals.
    pub live_goals: Vec<GoalId>,
}

/// Payload of `agent.registry.events.<event>.<agent_id>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RegistryEventPayload {
    /// Unique event id (also the `Nats-Msg-Id`, so a retried publish is stored once).
    pub id: uuid::Uuid,
    /// Which event; also the `<event>` token of the subject.
    pub event: RegistryEvent,
    /// The agent the event is about; also the subject's last token.
    pub agent_id: AgentId,
    /// When it happened.
    #[serde(with = "time::serde::rfc3339")]
    #[schemars(with = "crate::timestamp::Timestamp")]
    pub at: OffsetDateTime,
    /// The goal concerned (goal events).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub goal_id: Option<GoalId>,
    /// The status after the event (status / offline / registered events).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<AgentStatus>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn card_defaults_are_open() {
        let card: AgentCard = serde_json::from_value(json!({"agent_id": "researcher"})).unwrap();
        assert_eq!(card, AgentCard::new(AgentId::parse("researcher").unwrap()));
        assert_eq!(card.allow_from, vec!["*"]);
        assert_eq!(card.can_talk_to, vec!["*"]);
        assert!(card.deny_talk_to.is_empty());
    }

    #[test]
    fn card_round_trips_against_literal_json() {
        let literal = json!({
            "agent_id": "researcher",
            "description": "research agent",
            "capabilities": ["search"],
            "skills": [{"id": "web", "name": "Web search", "description": "finds things",
                        "tags": ["web"]}],
            "allow_from": ["coord*"],
            "can_talk_to": ["*"],
            "deny_talk_to": ["spam-*"],
            "max_concurrent_tasks": 2,
            "metadata": {"team": "blue"}
        });
        let card: AgentCard = serde_json::from_value(literal.clone()).unwrap();
        assert_eq!(serde_json::to_value(&card).unwrap(), literal);
    }

    #[test]
    fn peers_reply_has_the_seed_shape() {
        let literal = json!({"peers": [{"agent_id": "researcher", "description": "research agent",
            "capabilities": ["search"], "status": "idle", "reachable": true}]});
        let reply: PeersReply = serde_json::from_value(literal.clone()).unwrap();
        assert_eq!(serde_json::to_value(&reply).unwrap(), literal);
        let unregistered = PeersReply {
            peers: vec![],
            next: None,
            note: Some("agent `x` is not registered".into()),
        };
        assert_eq!(
            serde_json::to_value(&unregistered).unwrap(),
            json!({"peers": [], "note": "agent `x` is not registered"})
        );
        let paged: PeersReply = serde_json::from_value(json!({"peers": [], "next": "m"})).unwrap();
        assert_eq!(paged.next.as_deref(), Some("m"));
    }

    #[test]
    fn peers_request_is_optional_and_strict() {
        assert_eq!(
            serde_json::from_value::<PeersRequest>(json!({})).unwrap(),
            PeersRequest::default()
        );
        let page: PeersRequest =
            serde_json::from_value(json!({"after": "writer", "limit": 500})).unwrap();
        assert_eq!(
            (page.after.as_deref(), page.limit),
            (Some("writer"), Some(500))
        );
        assert!(serde_json::from_value::<PeersRequest>(json!({"limit": -1})).is_err());
        assert!(serde_json::from_value::<PeersRequest>(json!({"page": 2})).is_err());
    }

    #[test]
    fn heartbeat_rejects_unknown_fields_and_wrong_types() {
        assert!(serde_json::from_value::<HeartbeatRequest>(json!({"status": "busy"})).is_ok());
        assert!(serde_json::from_value::<HeartbeatRequest>(json!({"status": 7})).is_err());
        assert!(serde_json::from_value::<HeartbeatRequest>(json!({"stauts": "busy"})).is_err());
    }

    #[test]
    fn goal_open_reply_round_trips() {
        let literal = json!({"goal_id": "0193a1b2-0000-7000-8000-000000000001",
            "subject": "agent.inbox.0193a1b2-0000-7000-8000-000000000001"});
        let reply: GoalOpenReply = serde_json::from_value(literal.clone()).unwrap();
        assert_eq!(serde_json::to_value(&reply).unwrap(), literal);
    }
}
