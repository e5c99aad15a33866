//! The registry rules: register, heartbeat, task load, deregister, list_peers, lookup and
//! the offline sweep (the goal rules are in `goals.rs`).
//!
//! All state is in JetStream KV (`store.rs`) so any number of replicas can serve it; every
//! change goes through a compare-and-set there. list_peers and the offline sweep read
//! an in-memory [`RegistryView`] fed by KV watches, and fall back to KV (list_peers) or let
//! the compare-and-set settle a stale read (the sweep).

use std::time::Duration;

use async_nats::jetstream::{self, kv, stream};
use switchboard_delivery::registry_view::RegistryView;
use switchboard_proto::registry::{
    DeregisterReply, HeartbeatReply, HeartbeatRequest, LookupReply, PEERS_PAGE_BYTES,
    PEERS_PAGE_DEFAULT, PEERS_PAGE_MAX, PeerSummary, PeersReply, PeersRequest, RegisterReply,
    TaskLoadReport,
};
use switchboard_proto::subject::RegistryEvent;
use switchboard_proto::{AgentCard, AgentId, AgentRecord, AgentStatus, acl, timestamp};
use time::OffsetDateTime;
use tracing::Instrument;

use crate::error::DirectoryError;
use crate::store::{Cas, RegistryStore};

/// How long list_peers waits for the registry view to catch up with KV before it reads KV
/// itself (the view is normally a few milliseconds behind at most).
pub(crate) const VIEW_CATCH_UP: Duration = Duration::from_millis(500);

/// The directory's handle on its state.
#[derive(Debug)]
pub struct Registry {
    pub(crate) store: RegistryStore,
    pub(crate) heartbeat_timeout: Duration,
    /// The most live goals one agent may hold.
    pub(crate) max_goals_per_agent: usize,
    pub(crate) view: RegistryView,
    /// Turns of the round-robin among equally good agents for a skill.
    pub(crate) route_turn: std::sync::atomic::AtomicUsize,
    /// Who may be routed which skill (`directory.skill_grants_file`).
    pub(crate) grants: crate::grants::Grants,
}

impl Registry {
    /// Wraps the applied buckets and stream, routing skills by `grants`.
    pub fn new(
        js: jetstream::Context,
        agents: kv::Store,
        goals: kv::Store,
        cursors: kv::Store,
        inbox: stream::Stream,
        config: &crate::DirectoryConfig,
        grants: crate::grants::Grants,
    ) -> Self {
        let view = RegistryView::new(js.clone(), agents.clone(), goals.clone());
        Self {
            store: RegistryStore::new(js, agents, goals, cursors, inbox),
            heartbeat_timeout: Duration::from_millis(config.heartbeat_timeout_ms),
            max_goals_per_agent: usize::try_from(config.max_goals_per_agent).unwrap_or(usize::MAX),
            view,
            route_turn: std::sync::atomic::AtomicUsize::new(0),
            grants,
        }
    }

    /// The in-memory registry view list_peers and the offline sweep read (fed by KV watches
    /// while [`RegistryView::watch`] runs; [`crate::Directory::run`] runs it).
    pub fn view(&self) -> &RegistryView {
        &self.view
    }

    /// The v1 migration, run once by each replica before it serves: every v1 goal consumer
    /// becomes a cursor owned by the goal's agent and is deleted (see `store.rs`). Returns
    /// how many consumers were migrated and how many deleted.
    pub async fn migrate_v1_consumers(&self) -> Result<(usize, usize), DirectoryError> {
        self.store.migrate_v1_consumers().await
    }

    /// register: create or update the caller's card. `body` is the raw JSON object. A remote
    /// A2A agent's card ([`AgentCard::is_remote`]) is refused (`not_allowed`) for an id keyed
    /// in the agents file, and over the record of an agent that registered itself.
    pub async fn register(
        &self,
        caller: &AgentId,
        body: serde_json::Value,
    ) -> Result<RegisterReply, DirectoryError> {
        // The people service writes persons' answers as `people` (docs/protocol.md §14): an
        // agent under that id could pass its messages off as a person's.
        if caller.as_str() == switchboard_proto::PEOPLE_AGENT {
            return Err(DirectoryError::ReservedId(caller.clone()));
        }
        let serde_json::Value::Object(mut fields) = body else {
            return Err(DirectoryError::InvalidCard(
                "the body must be a JSON object (the agent card)".to_owned(),
            ));
        };
        match fields.get("agent_id") {
            None => {}
            Some(serde_json::Value::String(named)) if named == caller.as_str() => {}
            Some(serde_json::Value::String(named)) => {
                return Err(DirectoryError::IdentityMismatch {
                    caller: caller.clone(),
                    body: named.chars().take(80).collect(),
                });
            }
            Some(_) => {
                return Err(DirectoryError::InvalidCard(
                    "agent_id must be a string".to_owned(),
                ));
            }
        }
        fields.insert("agent_id".to_owned(), caller.as_str().into());
        let mut card: AgentCard = serde_json::from_value(serde_json::Value::Object(fields))
            .map_err(|err| DirectoryError::InvalidCard(err.to_string()))?;
        // Whoever registers writes what every agent and terminal reads: no escape codes.
        card.strip_control();
        let size = serde_json::to_vec(&card).map_or(usize::MAX, |stored| stored.len());
        if size > switchboard_proto::MAX_CARD_BYTES {
            return Err(DirectoryError::InvalidCard(format!(
                "the card is {size} bytes as stored; the limit is {} bytes (16 KiB)",
                switchboard_proto::MAX_CARD_BYTES
            )));
        }

        // A remote A2A agent's card (what the gateway registers for `switchboard a2a add`) never
        // takes a Switchboard agent's id: not one keyed in the agents file (signed in or not),
        // not one its agent registered. The agent's own card always takes its id back from a
        // remote; the gateway then stops carrying the remote (docs/a2a.md, "Outbound").
        let remote = card.is_remote();
        // The A2A gateway's client agents (`a2a-…`) are its own: never a remote's id either,
        // checked here where every register passes, not only in the gateway.
        if remote
            && caller
                .as_str()
                .starts_with(switchboard_proto::A2A_CLIENT_PREFIX)
        {
            return Err(DirectoryError::NotForRemotes {
                agent: caller.clone(),
                why: "is an A2A client's agent",
            });
        }
        if remote && self.grants.lists(caller.as_str()) {
            return Err(DirectoryError::NotForRemotes {
                agent: caller.clone(),
                why: "is keyed in the agents file",
            });
        }
        let now = timestamp::now();
        let (_, record) = self
            .store
            .modify(caller, |current| {
                if remote && current.is_some_and(|r| !r.card.is_remote()) {
                    return Err(DirectoryError::NotForRemotes {
                        agent: caller.clone(),
                        why: "is registered by a Switchboard agent",
                    });
                }
                Ok(AgentRecord {
                    card: card.clone(),
                    status: match current.map(|r| r.status) {
                        Some(AgentStatus::Busy) => AgentStatus::Busy,
                        _ => AgentStatus::Idle,
                    },
                    current_tasks: current.map(|r| r.current_tasks.clone()).unwrap_or_default(),
                    task_load: current.map_or(0, |r| r.task_load),
                    registered_at: current.map_or(now, |r| r.registered_at),
                    last_heartbeat: now,
                })
            })
            .await?;
        tracing::info!(agent_id = %caller, "agent registered");
        self.store
            .emit(RegistryEvent::Registered, caller, None, Some(record.status))
            .await;
        Ok(RegisterReply {
            agent_id: caller.clone(),
            registered_at: record.registered_at,
        })
    }

    /// heartbeat: keep the caller online, optionally with a new status and task list.
    pub async fn heartbeat(
        &self,
        caller: &AgentId,
        request: HeartbeatRequest,
    ) -> Result<HeartbeatReply, DirectoryError> {
        if request.status == Some(AgentStatus::Offline) {
            return Err(DirectoryError::HeartbeatOffline);
        }
        if let Some(tasks) = &request.current_tasks
            && let Some(long) = tasks
                .iter()
                .find(|task| task.len() > switchboard_proto::CURRENT_TASK_MAX_BYTES)
        {
            return Err(DirectoryError::BadHeartbeat(format!(
                "a current_tasks entry is {} bytes; the most is {}",
                long.len(),
                switchboard_proto::CURRENT_TASK_MAX_BYTES
            )));
        }
        let now = timestamp::now();
        let (old, record) = self
            .store
            .modify(caller, |current| {
                let current =
                    current.ok_or_else(|| DirectoryError::NotRegistered(caller.clone()))?;
                let status = match (request.status, current.status) {
                    (Some(status), _) => status,
                    (None, AgentStatus::Offline) => AgentStatus::Idle,
                    (None, status) => status,
                };
                let cap = usize::try_from(current.card.max_concurrent_tasks)
                    .unwrap_or(usize::MAX)
                    .min(switchboard_proto::CURRENT_TASKS_MAX);
                if let Some(tasks) = &request.current_tasks
                    && tasks.len() > cap
                {
                    return Err(DirectoryError::BadHeartbeat(format!(
                        "current_tasks lists {} tasks; at most {cap} (your card's \
                         max_concurrent_tasks, and never more than {})",
                        tasks.len(),
                        switchboard_proto::CURRENT_TASKS_MAX
                    )));
                }
                Ok(AgentRecord {
                    status,
                    current_tasks: request
                        .current_tasks
                        .clone()
                        .unwrap_or_else(|| current.current_tasks.clone()),
                    last_heartbeat: now,
                    ..current.clone()
                })
            })
            .await?;
        if old.map(|r| r.status) != Some(record.status) {
            self.store
                .emit(RegistryEvent::Status, caller, None, Some(record.status))
                .await;
        }
        Ok(HeartbeatReply {
            agent_id: caller.clone(),
            status: record.status,
            last_heartbeat: record.last_heartbeat,
        })
    }

    /// Task load from task-lifecycle: stores the agent's active tasks as `current_tasks` and
    /// sets `busy` at its `max_concurrent_tasks` (back to `idle` below it; offline stays).
    pub async fn task_load(
        &self,
        agent: &AgentId,
        report: TaskLoadReport,
    ) -> Result<HeartbeatReply, DirectoryError> {
        let (old, record) = self
            .store
            .modify(agent, |current| {
                let current =
                    current.ok_or_else(|| DirectoryError::NotRegistered(agent.clone()))?;
                let at_cap = report.current_tasks.len()
                    >= usize::try_from(current.card.max_concurrent_tasks).unwrap_or(usize::MAX);
                let status = match (current.status, at_cap) {
                    (AgentStatus::Offline, _) => AgentStatus::Offline,
                    (_, true) => AgentStatus::Busy,
                    (AgentStatus::Busy, false) => AgentStatus::Idle,
                    (status, false) => status,
                };
                Ok(AgentRecord {
                    status,
                    current_tasks: report
                        .current_tasks
                        .iter()
                        .map(ToString::to_string)
                        .collect(),
                    task_load: u32::try_from(report.current_tasks.len()).unwrap_or(u32::MAX),
                    ..current.clone()
                })
            })
            .await?;
        if old.map(|r| r.status) != Some(record.status) {
            self.store
                .emit(RegistryEvent::Status, agent, None, Some(record.status))
                .await;
        }
        Ok(HeartbeatReply {
            agent_id: agent.clone(),
            status: record.status,
            last_heartbeat: record.last_heartbeat,
        })
    }

    /// deregister: close every goal of the caller and mark it offline (the card stays, so
    /// peers still see who it was).
    pub async fn deregister(&self, caller: &AgentId) -> Result<DeregisterReply, DirectoryError> {
        if self.store.record(caller).await?.is_none() {
            return Err(DirectoryError::NotRegistered(caller.clone()));
        }
        let mut closed = Vec::new();
        for goal in self.store.goals_of(caller).await? {
            self.close_goal(caller, goal.goal_id).await?;
            closed.push(goal.goal_id);
        }
        self.store
            .modify(caller, |current| {
                let current =
                    current.ok_or_else(|| DirectoryError::NotRegistered(caller.clone()))?;
                Ok(AgentRecord {
                    status: AgentStatus::Offline,
                    ..current.clone()
                })
            })
            .await?;
        tracing::info!(agent_id = %caller, goals = closed.len(), "agent deregistered");
        self.store
            .emit(
                RegistryEvent::Deregistered,
                caller,
                None,
                Some(AgentStatus::Offline),
            )
            .await;
        Ok(DeregisterReply {
            agent_id: caller.clone(),
            closed_goals: closed,
        })
    }

    /// list_peers: one page of the other agents in agent-id order, each with `reachable`
    /// from the ACL rules and live goals. Answered from the registry view once it has caught
    /// up with every write stored before the request (so a peer registered a moment ago on any
    /// replica is listed); from a KV scan if the view cannot catch up in time.
    pub async fn peers(
        &self,
        caller: &AgentId,
        request: &PeersRequest,
    ) -> Result<PeersReply, DirectoryError> {
        let limit = request
            .limit
            .unwrap_or(PEERS_PAGE_DEFAULT)
            .clamp(1, PEERS_PAGE_MAX) as usize;
        let after = request.after.as_deref();
        let skill = request
            .skill
            .as_deref()
            .map(switchboard_proto::send::check_skill)
            .transpose()
            .map_err(|err| DirectoryError::InvalidCard(err.error.message))?;
        let has =
            move |record: &AgentRecord| skill.is_none_or(|skill| record.card.has_skill(skill));
        let page = if self.view.caught_up(VIEW_CATCH_UP).await? {
            self.view.with(|view| {
                let me = view.record(caller.as_str())?;
                let candidates = view
                    .records_after(after)
                    .filter(|(record, _)| has(record))
                    .map(|(record, _)| (record, view.has_goal(record.card.agent_id.as_str())));
                Some(peers_page(&me.card, candidates, limit))
            })
        } else {
            tracing::warn!("registry view is behind; list_peers reads KV");
            match self.store.record(caller).await? {
                None => None,
                Some((me, _)) => {
                    let with_goals = self.store.agents_with_goals().await?;
                    let mut records = self.store.all_records().await?;
                    records.sort_by(|(a, _), (b, _)| a.card.agent_id.cmp(&b.card.agent_id));
                    let candidates = records
                        .iter()
                        .filter(|(record, _)| {
                            after.is_none_or(|after| record.card.agent_id.as_str() > after)
                                && has(record)
                        })
                        .map(|(record, _)| {
                            (record, with_goals.contains(record.card.agent_id.as_str()))
                        });
                    Some(peers_page(&me.card, candidates, limit))
                }
            }
        };
        Ok(page.unwrap_or_else(|| PeersReply {
            peers: Vec::new(),
            next: None,
            note: Some(format!("agent `{caller}` is not registered")),
        }))
    }

    /// lookup: one agent's card, status and live goals.
    pub async fn lookup(&self, agent_id: &str) -> Result<LookupReply, DirectoryError> {
        let agent = AgentId::parse(agent_id)?;
        let Some((record, _)) = self.store.record(&agent).await? else {
            return Err(DirectoryError::UnknownAgent(agent));
        };
        let live_goals = self
            .store
            .goals_of(&agent)
            .await?
            .into_iter()
            .map(|goal| goal.goal_id)
            .collect();
        Ok(LookupReply {
            card: record.card,
            status: record.status,
            current_tasks: record.current_tasks,
            registered_at: record.registered_at,
            last_heartbeat: record.last_heartbeat,
            live_goals,
        })
    }

    /// One sweep for agents whose heartbeats stopped: each is marked `offline` with
    /// compare-and-set on the revision the sweep read, so across replicas exactly one
    /// sweeper wins and publishes the `offline` event. Returns the agents this sweep took
    /// offline.
    pub async fn sweep_offline(&self, now: OffsetDateTime) -> Result<Vec<AgentId>, DirectoryError> {
        let mut marked = Vec::new();
        // Candidates come from the view; the compare-and-set on the revision it holds makes a
        // stale candidate (a heartbeat the view has not applied yet) a harmless conflict.
        let silent: Vec<(AgentRecord, u64)> = self.view.with(|view| {
            view.records_after(None)
                .filter(|(record, _)| {
                    record.status != AgentStatus::Offline
                        && now - record.last_heartbeat >= self.heartbeat_timeout
                })
                .map(|(record, revision)| (record.clone(), revision))
                .collect()
        });
        for (record, revision) in silent {
            if record.status == AgentStatus::Offline {
                continue;
            }
            let silent = now - record.last_heartbeat;
            if silent < self.heartbeat_timeout {
                continue;
            }
            let agent = record.card.agent_id.clone();
            let offline = AgentRecord {
                status: AgentStatus::Offline,
                ..record
            };
            let outcome = match self
                .store
                .put_record(&agent, &offline, Some(revision))
                .await
            {
                Ok(outcome) => outcome,
                Err(err) => {
                    // One failing record must not hold back the others.
                    tracing::warn!(agent_id = %agent, error = %err, "marking agent offline failed");
                    continue;
                }
            };
            if let Cas::Done = outcome {
                tracing::info!(agent_id = %agent, silent_ms = silent.whole_milliseconds(), "agent offline: heartbeats stopped");
                // No request started this: the event gets a trace of its own.
                self.store
                    .emit(
                        RegistryEvent::Offline,
                        &agent,
                        None,
                        Some(AgentStatus::Offline),
                    )
                    .instrument(tracing::info_span!(
                        "directory.offline",
                        switchboard.service = crate::SPEC.name,
                        switchboard.agent_id = %agent
                    ))
                    .await;
                marked.push(agent);
            }
        }
        Ok(marked)
    }
}

/// One list_peers page from `candidates` (records in agent-id order, each with whether it has
/// a live goal): the caller is skipped, and the page ends at `limit` peers or before its JSON
/// would pass [`PEERS_PAGE_BYTES`], with `next` set when more candidates follow.
fn peers_page<'a>(
    me: &AgentCard,
    candidates: impl Iterator<Item = (&'a AgentRecord, bool)>,
    limit: usize,
) -> PeersReply {
    let mut peers: Vec<PeerSummary> = Vec::new();
    let mut bytes = 0;
    let mut next = None;
    for (record, has_goal) in candidates {
        if record.card.agent_id == me.agent_id {
            continue;
        }
        let summary = PeerSummary {
            reachable: has_goal && acl::check(me, &record.card).is_ok(),
            agent_id: record.card.agent_id.clone(),
            description: record.card.description.clone(),
            capabilities: record.card.capabilities.clone(),
            status: record.status,
        };
        let size = serde_json::to_vec(&summary).map_or(0, |json| json.len() + 1);
        if let Some(last) = peers.last()
            && (peers.len() >= limit || bytes + size > PEERS_PAGE_BYTES)
        {
            next = Some(last.agent_id.to_string());
            break;
        }
        bytes += size;
        peers.push(summary);
    }
    PeersReply {
        peers,
        next,
        note: None,
    }
}
