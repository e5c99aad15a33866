//! The registry, kept entirely in JetStream KV so any number of replicas can serve it.
//!
//! `agent_registry` holds one [`AgentRecord`] per agent; `agent_goals` one [`GoalRecord`] per
//! live goal under `<agent_id>.<goal_id>`. Every read-modify-write is a compare-and-set on the
//! key's revision, retried on conflict, so concurrent replicas never lose an update. Each goal
//! also owns a cursor in `agent_cursors` (ARCHITECTURE.md §4a), created when the goal opens, so
//! messages sent before its runtime reads wait for it (buffer-on-demand); the cursor names the
//! goal's owner, which makes a goal id an address nobody else can read or claim.

use std::collections::BTreeSet;
use std::time::Duration;

use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::context::ConsumerInfoErrorKind;
use async_nats::jetstream::kv::{self, CreateErrorKind, UpdateErrorKind};
use async_nats::jetstream::stream::ConsumerErrorKind;
use async_nats::jetstream::{self, stream};
use bytes::Bytes;
use futures::TryStreamExt;
use serde::Serialize;
use serde::de::DeserializeOwned;
use switchboard_proto::inbox::{CursorRecord, cursor_key};
use switchboard_proto::registry::{
    DeregisterReply, GoalCloseReply, GoalOpenReply, GoalOpenRequest, HeartbeatReply,
    HeartbeatRequest, LookupReply, PEERS_PAGE_BYTES, PEERS_PAGE_DEFAULT, PEERS_PAGE_MAX,
    PeerSummary, PeersReply, PeersRequest, RegisterReply, RegistryEventPayload, TaskLoadReport,
    goal_key,
};
use switchboard_proto::subject::{self, RegistryEvent};
use switchboard_proto::{
    AgentCard, AgentId, AgentRecord, AgentStatus, GoalId, GoalRecord, acl, new_id, timestamp,
};
use switchboard_runtime::kv::{leader_entry, snapshot};
use switchboard_runtime::publish::publish_event;
use switchboard_runtime::registry_view::RegistryView;
use time::OffsetDateTime;
use tracing::Instrument;

use crate::error::DirectoryError;

/// How many times a compare-and-set is retried before giving up with `conflict`.
const CAS_ATTEMPTS: u32 = 64;
/// How long list_peers waits for the registry view to catch up with KV before it reads KV
/// itself (the view is normally a few milliseconds behind at most).
const VIEW_CATCH_UP: Duration = Duration::from_millis(500);

/// The directory's handle on its state.
#[derive(Debug)]
pub struct Registry {
    js: jetstream::Context,
    agents: kv::Store,
    goals: kv::Store,
    cursors: kv::Store,
    inbox: stream::Stream,
    heartbeat_timeout: Duration,
    /// The most live goals one agent may hold.
    max_goals_per_agent: usize,
    view: RegistryView,
}

fn decode<T: DeserializeOwned>(key: &str, value: &[u8]) -> Result<T, DirectoryError> {
    serde_json::from_slice(value).map_err(|err| DirectoryError::CorruptRecord {
        key: key.to_owned(),
        message: err.to_string(),
    })
}

fn encode<T: Serialize>(value: &T) -> Result<Bytes, DirectoryError> {
    serde_json::to_vec(value)
        .map(Bytes::from)
        .map_err(|err| DirectoryError::CorruptRecord {
            key: "(encoding)".to_owned(),
            message: err.to_string(),
        })
}

/// How many opens the registry view may lag behind: within this many goals of the cap, an
/// open counts the agent's goals from the bucket instead of the view.
const VIEW_LAG_MARGIN: usize = 8;

/// Outcome of one compare-and-set attempt.
enum Cas {
    Done,
    Conflict,
}

impl Registry {
    /// Wraps the applied buckets and stream.
    pub fn new(
        js: jetstream::Context,
        agents: kv::Store,
        goals: kv::Store,
        cursors: kv::Store,
        inbox: stream::Stream,
        config: &crate::DirectoryConfig,
    ) -> Self {
        let view = RegistryView::new(js.clone(), agents.clone(), goals.clone());
        Self {
            js,
            agents,
            goals,
            cursors,
            inbox,
            heartbeat_timeout: Duration::from_millis(config.heartbeat_timeout_ms),
            max_goals_per_agent: usize::try_from(config.max_goals_per_agent).unwrap_or(usize::MAX),
            view,
        }
    }

    /// The in-memory registry view list_peers and the offline sweep read (fed by KV watches
    /// while [`RegistryView::watch`] runs; [`crate::Directory::run`] runs it).
    pub fn view(&self) -> &RegistryView {
        &self.view
    }

    /// The record of `agent` and its revision, if registered.
    async fn record(&self, agent: &AgentId) -> Result<Option<(AgentRecord, u64)>, DirectoryError> {
        let entry = self
            .agents
            .entry(agent.as_str())
            .await
            .map_err(|err| DirectoryError::store("reading agent record", err))?;
        match entry {
            Some(entry) if entry.operation == kv::Operation::Put => {
                Ok(Some((decode(&entry.key, &entry.value)?, entry.revision)))
            }
            _ => Ok(None),
        }
    }

    async fn put_record(
        &self,
        agent: &AgentId,
        record: &AgentRecord,
        revision: Option<u64>,
    ) -> Result<Cas, DirectoryError> {
        let value = encode(record)?;
        match revision {
            None => match self.agents.create(agent.as_str(), value).await {
                Ok(_) => Ok(Cas::Done),
                Err(err) if err.kind() == CreateErrorKind::AlreadyExists => Ok(Cas::Conflict),
                Err(err) => Err(DirectoryError::store("creating agent record", err)),
            },
            Some(revision) => match self.agents.update(agent.as_str(), value, revision).await {
                Ok(_) => Ok(Cas::Done),
                Err(err) if err.kind() == UpdateErrorKind::WrongLastRevision => Ok(Cas::Conflict),
                Err(err) => Err(DirectoryError::store("updating agent record", err)),
            },
        }
    }

    /// Applies `change` to the agent's record with compare-and-set, retrying on conflict.
    /// `change` sees the current record (or `None`) and returns the new one, or an error to
    /// abort. Returns (old, new).
    async fn modify<F>(
        &self,
        agent: &AgentId,
        mut change: F,
    ) -> Result<(Option<AgentRecord>, AgentRecord), DirectoryError>
    where
        F: FnMut(Option<&AgentRecord>) -> Result<AgentRecord, DirectoryError>,
    {
        for attempt in 0..CAS_ATTEMPTS {
            if attempt > 0 {
                switchboard_runtime::store::cas_backoff(attempt).await;
            }
            let current = self.record(agent).await?;
            let (old, revision) = match current {
                Some((record, revision)) => (Some(record), Some(revision)),
                None => (None, None),
            };
            let new = change(old.as_ref())?;
            if let Cas::Done = self.put_record(agent, &new, revision).await? {
                return Ok((old, new));
            }
        }
        Err(DirectoryError::Contention {
            key: agent.to_string(),
        })
    }

    /// Publishes a registry event to `AGENT_EVENTS` with JetStream acks, retrying with the
    /// same `Nats-Msg-Id`. The state change it reports is already committed, so a publish
    /// failure is logged, not returned.
    async fn emit(
        &self,
        event: RegistryEvent,
        agent: &AgentId,
        goal_id: Option<GoalId>,
        status: Option<AgentStatus>,
    ) {
        let payload = RegistryEventPayload {
            id: new_id(),
            event,
            agent_id: agent.clone(),
            at: timestamp::now(),
            goal_id,
            status,
        };
        publish_event(
            &self.js,
            &event.subject(agent),
            &payload.id.to_string(),
            &payload,
        )
        .await;
    }

    /// register: create or update the caller's card. `body` is the raw JSON object.
    pub async fn register(
        &self,
        caller: &AgentId,
        body: serde_json::Value,
    ) -> Result<RegisterReply, DirectoryError> {
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
        let card: AgentCard = serde_json::from_value(serde_json::Value::Object(fields))
            .map_err(|err| DirectoryError::InvalidCard(err.to_string()))?;
        let size = serde_json::to_vec(&card).map_or(usize::MAX, |stored| stored.len());
        if size > switchboard_proto::MAX_CARD_BYTES {
            return Err(DirectoryError::InvalidCard(format!(
                "the card is {size} bytes as stored; the limit is {} bytes (16 KiB)",
                switchboard_proto::MAX_CARD_BYTES
            )));
        }

        let now = timestamp::now();
        let (_, record) = self
            .modify(caller, |current| {
                Ok(AgentRecord {
                    card: card.clone(),
                    status: match current.map(|r| r.status) {
                        Some(AgentStatus::Busy) => AgentStatus::Busy,
                        _ => AgentStatus::Idle,
                    },
                    current_tasks: current.map(|r| r.current_tasks.clone()).unwrap_or_default(),
                    registered_at: current.map_or(now, |r| r.registered_at),
                    last_heartbeat: now,
                })
            })
            .await?;
        tracing::info!(agent_id = %caller, "agent registered");
        self.emit(RegistryEvent::Registered, caller, None, Some(record.status))
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
            self.emit(RegistryEvent::Status, caller, None, Some(record.status))
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
                    ..current.clone()
                })
            })
            .await?;
        if old.map(|r| r.status) != Some(record.status) {
            self.emit(RegistryEvent::Status, agent, None, Some(record.status))
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
        if self.record(caller).await?.is_none() {
            return Err(DirectoryError::NotRegistered(caller.clone()));
        }
        let mut closed = Vec::new();
        for goal in self.goals_of(caller).await? {
            self.close_goal(caller, goal.goal_id).await?;
            closed.push(goal.goal_id);
        }
        self.modify(caller, |current| {
            let current = current.ok_or_else(|| DirectoryError::NotRegistered(caller.clone()))?;
            Ok(AgentRecord {
                status: AgentStatus::Offline,
                ..current.clone()
            })
        })
        .await?;
        tracing::info!(agent_id = %caller, goals = closed.len(), "agent deregistered");
        self.emit(
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

    /// The live goals of one agent.
    pub async fn goals_of(&self, agent: &AgentId) -> Result<Vec<GoalRecord>, DirectoryError> {
        let entries = snapshot(&self.js, &self.goals, &format!("{agent}.*"))
            .await
            .map_err(|err| DirectoryError::store("listing goals", err))?;
        entries
            .iter()
            .map(|entry| decode(&entry.key, &entry.value))
            .collect()
    }

    /// goal.open: create the goal's cursor (claiming the goal id for the caller) and record the
    /// goal. Re-opening a goal the caller already owns is idempotent; a goal id another agent
    /// holds (a live goal record, or its cursor) is refused.
    pub async fn open_goal(
        &self,
        caller: &AgentId,
        request: GoalOpenRequest,
    ) -> Result<GoalOpenReply, DirectoryError> {
        if self.record(caller).await?.is_none() {
            return Err(DirectoryError::NotRegistered(caller.clone()));
        }
        let goal_id = request.goal_id.unwrap_or_default();
        let holders = self.goal_holders(&goal_id).await?;
        if holders.iter().any(|holder| holder != caller) {
            return Err(DirectoryError::GoalOwnedElsewhere { goal: goal_id });
        }
        // A new goal is one more cursor and one more inbox subject: capped per agent, so one
        // agent cannot fill the cluster. Re-opening a goal one holds is not a new one.
        // The in-memory view counts first (no read): an agent well below the cap by its count
        // opens without a scan, however many goals it holds (a raised cap). Near the cap (the
        // view may lag a few opens behind) the goals are counted from the bucket.
        let near_cap = self.view.cached(caller.as_str()).is_none_or(|peer| {
            peer.goals.len().saturating_add(VIEW_LAG_MARGIN) >= self.max_goals_per_agent
        });
        if holders.is_empty() && near_cap {
            let live = snapshot(&self.js, &self.goals, &format!("{caller}.*"))
                .await
                .map_err(|err| DirectoryError::store("counting goals", err))?
                .len();
            if live >= self.max_goals_per_agent {
                return Err(DirectoryError::TooManyGoals {
                    cap: self.max_goals_per_agent,
                });
            }
        }
        // A goal id the caller chose may have been used before (its inbox may hold messages
        // stored after an earlier close); one minted here is new.
        self.claim_cursor(caller, &goal_id, request.goal_id.is_some())
            .await?;
        if holders.is_empty() {
            let record = GoalRecord {
                goal_id,
                agent_id: caller.clone(),
                kind: request.kind.unwrap_or_default(),
                opened_at: timestamp::now(),
            };
            self.goals
                .put(goal_key(caller, &goal_id).as_str(), encode(&record)?)
                .await
                .map_err(|err| DirectoryError::store("recording goal", err))?;
            tracing::info!(agent_id = %caller, %goal_id, "goal opened");
            self.emit(RegistryEvent::GoalOpened, caller, Some(goal_id), None)
                .await;
        }
        Ok(GoalOpenReply {
            goal_id,
            subject: subject::inbox(&goal_id),
        })
    }

    /// The agents with a live goal record for `goal_id` (normally none or one). A goal record
    /// of another agent refuses the id even where its cursor is missing (a close and a re-open
    /// of the owner racing), so nobody else can claim a goal that messages are still sent to.
    async fn goal_holders(&self, goal_id: &GoalId) -> Result<Vec<AgentId>, DirectoryError> {
        let records = snapshot(&self.js, &self.goals, &format!("*.{goal_id}"))
            .await
            .map_err(|err| DirectoryError::store("reading goal", err))?;
        records
            .iter()
            .map(|entry| Ok(decode::<GoalRecord>(&entry.key, &entry.value)?.agent_id))
            .collect()
    }

    /// Creates the goal's cursor for `caller`, or confirms the caller owns the one that exists.
    /// The create is the claim: of two agents racing for one goal id, one wins. A new cursor
    /// starts after whatever the goal's inbox already holds when the id was `chosen` by the
    /// caller (a reused id never hands out an earlier owner's messages), at 0 for a fresh one.
    async fn claim_cursor(
        &self,
        caller: &AgentId,
        goal_id: &GoalId,
        chosen: bool,
    ) -> Result<(), DirectoryError> {
        let start = if chosen {
            self.last_inbox_sequence(goal_id).await?
        } else {
            0
        };
        self.create_cursor(&CursorRecord::new(caller.clone(), start), goal_id)
            .await
    }

    /// Creates `record` as the goal's cursor, or confirms its agent owns the one that exists.
    pub(crate) async fn create_cursor(
        &self,
        record: &CursorRecord,
        goal_id: &GoalId,
    ) -> Result<(), DirectoryError> {
        let key = cursor_key(goal_id);
        match self.cursors.create(key.as_str(), encode(record)?).await {
            Ok(_) => return Ok(()),
            Err(err) if err.kind() == CreateErrorKind::AlreadyExists => {}
            Err(err) => return Err(DirectoryError::store("creating goal cursor", err)),
        }
        match self.cursor(goal_id).await? {
            Some((cursor, _)) if cursor.agent_id == record.agent_id => Ok(()),
            _ => Err(DirectoryError::GoalOwnedElsewhere { goal: *goal_id }),
        }
    }

    /// The sequence of the newest message in the goal's inbox (0 when it holds none).
    async fn last_inbox_sequence(&self, goal_id: &GoalId) -> Result<u64, DirectoryError> {
        match self
            .inbox
            .get_last_raw_message_by_subject(&subject::inbox(goal_id))
            .await
        {
            Ok(message) => Ok(message.sequence),
            Err(err) if err.kind() == stream::LastRawMessageErrorKind::NoMessageFound => Ok(0),
            Err(err) => Err(DirectoryError::store("reading the goal's inbox", err)),
        }
    }

    /// The goal's cursor and its revision as the bucket's leader has it (a replica answering
    /// direct gets may not have the cursor a create just wrote).
    async fn cursor(
        &self,
        goal_id: &GoalId,
    ) -> Result<Option<(CursorRecord, u64)>, DirectoryError> {
        let key = cursor_key(goal_id);
        match leader_entry(&self.cursors, &key).await {
            Ok(Some((value, revision))) => Ok(Some((decode(&key, &value)?, revision))),
            Ok(None) => Ok(None),
            Err(err) => Err(DirectoryError::store("reading goal cursor", err)),
        }
    }

    /// goal.close: forget the goal, purge its inbox and delete its cursor. A close that failed
    /// half-way can be retried: the caller's cursor still proves the goal is theirs.
    pub async fn close_goal(
        &self,
        caller: &AgentId,
        goal_id: GoalId,
    ) -> Result<GoalCloseReply, DirectoryError> {
        let key = goal_key(caller, &goal_id);
        let recorded = self
            .goals
            .entry(key.as_str())
            .await
            .map_err(|err| DirectoryError::store("reading goal", err))?
            .is_some_and(|entry| entry.operation == kv::Operation::Put);
        let owns_cursor = self
            .cursor(&goal_id)
            .await?
            .is_some_and(|(cursor, _)| cursor.agent_id == *caller);
        if !recorded && !owns_cursor {
            return Err(DirectoryError::UnknownGoal {
                agent: caller.clone(),
                goal: goal_id,
            });
        }
        // Forget the goal first so no new delivery targets it, then empty its inbox, then drop
        // the cursor.
        if recorded {
            self.goals
                .delete(key.as_str())
                .await
                .map_err(|err| DirectoryError::store("forgetting goal", err))?;
        }
        let purged = self
            .inbox
            .purge()
            .filter(subject::inbox(&goal_id))
            .await
            .map_err(|err| DirectoryError::store("purging inbox", err))?
            .purged;
        if owns_cursor {
            self.delete_cursor(caller, &goal_id).await?;
        }
        tracing::info!(agent_id = %caller, %goal_id, purged, "goal closed");
        self.emit(RegistryEvent::GoalClosed, caller, Some(goal_id), None)
            .await;
        Ok(GoalCloseReply { goal_id, purged })
    }

    /// Deletes the caller's cursor of a goal: a delete marker written only while the cursor is
    /// still the one read (a fetch moving it meanwhile makes this read again), then everything
    /// up to that marker purged, so nothing of a closed goal stays in the bucket, while a cursor
    /// created after the marker (the goal opened again meanwhile) is kept.
    async fn delete_cursor(
        &self,
        caller: &AgentId,
        goal_id: &GoalId,
    ) -> Result<(), DirectoryError> {
        let subject = format!("{}{}", self.cursors.prefix, cursor_key(goal_id));
        for attempt in 0..CAS_ATTEMPTS {
            if attempt > 0 {
                switchboard_runtime::store::cas_backoff(attempt).await;
            }
            let Some((cursor, revision)) = self.cursor(goal_id).await? else {
                return Ok(());
            };
            if cursor.agent_id != *caller {
                return Ok(());
            }
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(
                switchboard_proto::HEADER_KV_OPERATION,
                switchboard_proto::KV_OPERATION_DELETE,
            );
            headers.insert(
                switchboard_proto::HEADER_EXPECTED_LAST_SUBJECT_SEQUENCE,
                revision.to_string().as_str(),
            );
            let stored = self
                .js
                .publish_with_headers(subject.clone(), headers, Bytes::new())
                .await
                .map_err(|err| DirectoryError::store("deleting goal cursor", err))?
                .await;
            let marker = match stored {
                Ok(ack) => ack.sequence,
                Err(err)
                    if err.kind() == jetstream::context::PublishErrorKind::WrongLastSequence =>
                {
                    continue;
                }
                Err(err) => return Err(DirectoryError::store("deleting goal cursor", err)),
            };
            self.cursors
                .stream
                .purge()
                .filter(subject.clone())
                .sequence(marker + 1)
                .await
                .map_err(|err| DirectoryError::store("purging goal cursor", err))?;
            return Ok(());
        }
        Err(DirectoryError::Contention {
            key: cursor_key(goal_id),
        })
    }

    /// Migration from v1, run once by each directory replica before it serves: every v1 goal
    /// consumer (`inbox-<goal_id>` on `AGENT_INBOX`) becomes a cursor owned by the goal's agent
    /// at the consumer's ack floor (nothing already read is handed out again), then the
    /// consumer is deleted. A consumer whose goal is not live any more is just deleted. The
    /// cursor exists before the consumer goes, so no other agent can claim the goal between
    /// the two; replicas doing this at once converge (the create and the delete are
    /// idempotent). Returns how many consumers were migrated and how many deleted.
    pub async fn migrate_v1_consumers(&self) -> Result<(usize, usize), DirectoryError> {
        let names: Vec<String> = self
            .inbox
            .consumer_names()
            .try_collect()
            .await
            .map_err(|err| DirectoryError::store("listing inbox consumers", err))?;
        let (mut migrated, mut deleted) = (0, 0);
        for (name, goal_id) in names.iter().filter_map(|name| {
            let goal = name.strip_prefix("inbox-")?;
            Some((name, GoalId::parse(goal).ok()?))
        }) {
            let info = match self.inbox.consumer_info(name).await {
                Ok(info) => info,
                Err(err) if err.kind() == ConsumerInfoErrorKind::NotFound => continue,
                Err(err) => return Err(DirectoryError::store("reading a v1 inbox consumer", err)),
            };
            // The live goal's agent: its record, whatever the consumer's metadata says.
            let holders = self.goal_holders(&goal_id).await?;
            if let [owner] = holders.as_slice() {
                let record = CursorRecord::new(owner.clone(), info.ack_floor.stream_sequence);
                self.create_cursor(&record, &goal_id).await?;
                migrated += 1;
            }
            match self.inbox.delete_consumer(name).await {
                Ok(_) => deleted += 1,
                Err(err)
                    if matches!(err.kind(), ConsumerErrorKind::JetStream(ref js)
                        if js.error_code() == ErrorCode::CONSUMER_NOT_FOUND) => {}
                Err(err) => return Err(DirectoryError::store("deleting a v1 inbox consumer", err)),
            }
        }
        if deleted > 0 {
            tracing::info!(
                migrated,
                deleted,
                "v1 goal inbox consumers replaced by cursors"
            );
        }
        Ok((migrated, deleted))
    }

    /// Every registered agent (one snapshot pass over the bucket).
    pub async fn all_records(&self) -> Result<Vec<(AgentRecord, u64)>, DirectoryError> {
        let entries = snapshot(&self.js, &self.agents, ">")
            .await
            .map_err(|err| DirectoryError::store("listing agents", err))?;
        entries
            .iter()
            .map(|entry| Ok((decode(&entry.key, &entry.value)?, entry.revision)))
            .collect()
    }

    /// Agents that have at least one live goal.
    async fn agents_with_goals(&self) -> Result<BTreeSet<String>, DirectoryError> {
        let entries = snapshot(&self.js, &self.goals, ">")
            .await
            .map_err(|err| DirectoryError::store("listing goals", err))?;
        Ok(entries
            .into_iter()
            .filter_map(|entry| entry.key.split_once('.').map(|(agent, _)| agent.to_owned()))
            .collect())
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
        let page = if self.view.caught_up(VIEW_CATCH_UP).await? {
            self.view.with(|view| {
                let me = view.record(caller.as_str())?;
                let candidates = view
                    .records_after(after)
                    .map(|(record, _)| (record, view.has_goal(record.card.agent_id.as_str())));
                Some(peers_page(&me.card, candidates, limit))
            })
        } else {
            tracing::warn!("registry view is behind; list_peers reads KV");
            match self.record(caller).await? {
                None => None,
                Some((me, _)) => {
                    let with_goals = self.agents_with_goals().await?;
                    let mut records = self.all_records().await?;
                    records.sort_by(|(a, _), (b, _)| a.card.agent_id.cmp(&b.card.agent_id));
                    let candidates = records
                        .iter()
                        .filter(|(record, _)| {
                            after.is_none_or(|after| record.card.agent_id.as_str() > after)
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
        let Some((record, _)) = self.record(&agent).await? else {
            return Err(DirectoryError::UnknownAgent(agent));
        };
        let live_goals = self
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
            let outcome = match self.put_record(&agent, &offline, Some(revision)).await {
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
                self.emit(
                    RegistryEvent::Offline,
                    &agent,
                    None,
                    Some(AgentStatus::Offline),
                )
                .instrument(tracing::info_span!("directory.offline", agent_id = %agent))
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
