//! The directory's KV and JetStream reads and writes.
//!
//! `agent_registry` holds one [`AgentRecord`] per agent; `agent_goals` one [`GoalRecord`] per
//! live goal under `<agent_id>.<goal_id>`; `agent_cursors` the cursor each goal owns
//! (docs/protocol.md §12), which names the goal's owner; `AGENT_INBOX` the goals' messages,
//! purged when a goal closes; `AGENT_EVENTS` the registry events. Every read-modify-write is
//! a compare-and-set on the key's revision, retried on conflict, so concurrent replicas never
//! lose an update. The rules that decide what to write are in [`crate::registry`] and
//! [`crate::goals`].

use std::collections::BTreeSet;

use async_nats::jetstream::ErrorCode;
use async_nats::jetstream::context::ConsumerInfoErrorKind;
use async_nats::jetstream::kv;
use async_nats::jetstream::stream::ConsumerErrorKind;
use async_nats::jetstream::{self, stream};
use bytes::Bytes;
use futures::TryStreamExt;
use serde::Serialize;
use serde::de::DeserializeOwned;
use switchboard_proto::inbox::{CursorRecord, cursor_key};
use switchboard_proto::registry::{RegistryEventPayload, goal_key};
use switchboard_proto::subject::{self, RegistryEvent};
use switchboard_proto::{AgentId, AgentRecord, AgentStatus, GoalId, GoalRecord, new_id, timestamp};
use switchboard_request::kv::{leader_entry, snapshot};
use switchboard_runtime::publish::publish_event;

use crate::error::DirectoryError;

/// How many times a compare-and-set is retried before giving up with `conflict`.
const CAS_ATTEMPTS: u32 = 64;

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

/// Outcome of one compare-and-set attempt.
pub(crate) enum Cas {
    Done,
    Conflict,
}

/// The directory's buckets and streams.
#[derive(Debug)]
pub(crate) struct RegistryStore {
    js: jetstream::Context,
    agents: kv::Store,
    goals: kv::Store,
    cursors: kv::Store,
    inbox: stream::Stream,
}

impl RegistryStore {
    /// Wraps the applied buckets and stream.
    pub(crate) fn new(
        js: jetstream::Context,
        agents: kv::Store,
        goals: kv::Store,
        cursors: kv::Store,
        inbox: stream::Stream,
    ) -> Self {
        Self {
            js,
            agents,
            goals,
            cursors,
            inbox,
        }
    }

    /// The record of `agent` and its revision, if registered.
    pub(crate) async fn record(
        &self,
        agent: &AgentId,
    ) -> Result<Option<(AgentRecord, u64)>, DirectoryError> {
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

    /// Writes `record`: created when `revision` is `None`, else updated if still at `revision`.
    pub(crate) async fn put_record(
        &self,
        agent: &AgentId,
        record: &AgentRecord,
        revision: Option<u64>,
    ) -> Result<Cas, DirectoryError> {
        let value = encode(record)?;
        match revision {
            None => match self.agents.create(agent.as_str(), value).await {
                Ok(_) => Ok(Cas::Done),
                Err(err) if switchboard_request::kv::already_exists(&err) => Ok(Cas::Conflict),
                Err(err) => Err(DirectoryError::store("creating agent record", err)),
            },
            Some(revision) => match self.agents.update(agent.as_str(), value, revision).await {
                Ok(_) => Ok(Cas::Done),
                Err(err) if switchboard_request::kv::lost_revision(&err) => Ok(Cas::Conflict),
                Err(err) => Err(DirectoryError::store("updating agent record", err)),
            },
        }
    }

    /// Applies `change` to the agent's record with compare-and-set, retrying on conflict.
    /// `change` sees the current record (or `None`) and returns the new one, or an error to
    /// abort. Returns (old, new).
    pub(crate) async fn modify<F>(
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
    pub(crate) async fn emit(
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

    /// Every registered agent (one snapshot pass over the bucket).
    pub(crate) async fn all_records(&self) -> Result<Vec<(AgentRecord, u64)>, DirectoryError> {
        let entries = snapshot(&self.js, &self.agents, ">")
            .await
            .map_err(|err| DirectoryError::store("listing agents", err))?;
        entries
            .iter()
            .map(|entry| Ok((decode(&entry.key, &entry.value)?, entry.revision)))
            .collect()
    }

    /// Agents that have at least one live goal.
    pub(crate) async fn agents_with_goals(&self) -> Result<BTreeSet<String>, DirectoryError> {
        let entries = snapshot(&self.js, &self.goals, ">")
            .await
            .map_err(|err| DirectoryError::store("listing goals", err))?;
        Ok(entries
            .into_iter()
            .filter_map(|entry| entry.key.split_once('.').map(|(agent, _)| agent.to_owned()))
            .collect())
    }

    /// The live goals of one agent.
    pub(crate) async fn goals_of(
        &self,
        agent: &AgentId,
    ) -> Result<Vec<GoalRecord>, DirectoryError> {
        let entries = snapshot(&self.js, &self.goals, &format!("{agent}.*"))
            .await
            .map_err(|err| DirectoryError::store("listing goals", err))?;
        entries
            .iter()
            .map(|entry| decode(&entry.key, &entry.value))
            .collect()
    }

    /// How many live goals `agent` holds, counted from the bucket.
    pub(crate) async fn count_goals(&self, agent: &AgentId) -> Result<usize, DirectoryError> {
        Ok(snapshot(&self.js, &self.goals, &format!("{agent}.*"))
            .await
            .map_err(|err| DirectoryError::store("counting goals", err))?
            .len())
    }

    /// The agents with a live goal record for `goal_id` (normally none or one). A goal record
    /// of another agent refuses the id even where its cursor is missing (a close and a re-open
    /// of the owner racing), so nobody else can claim a goal that messages are still sent to.
    pub(crate) async fn goal_holders(
        &self,
        goal_id: &GoalId,
    ) -> Result<Vec<AgentId>, DirectoryError> {
        let records = snapshot(&self.js, &self.goals, &format!("*.{goal_id}"))
            .await
            .map_err(|err| DirectoryError::store("reading goal", err))?;
        records
            .iter()
            .map(|entry| Ok(decode::<GoalRecord>(&entry.key, &entry.value)?.agent_id))
            .collect()
    }

    /// Records a live goal under `<agent_id>.<goal_id>`.
    pub(crate) async fn put_goal(&self, record: &GoalRecord) -> Result<(), DirectoryError> {
        self.goals
            .put(
                goal_key(&record.agent_id, &record.goal_id).as_str(),
                encode(record)?,
            )
            .await
            .map_err(|err| DirectoryError::store("recording goal", err))?;
        Ok(())
    }

    /// Whether `agent` has a goal record for `goal_id`.
    pub(crate) async fn goal_recorded(
        &self,
        agent: &AgentId,
        goal_id: &GoalId,
    ) -> Result<bool, DirectoryError> {
        Ok(self
            .goals
            .entry(goal_key(agent, goal_id).as_str())
            .await
            .map_err(|err| DirectoryError::store("reading goal", err))?
            .is_some_and(|entry| entry.operation == kv::Operation::Put))
    }

    /// Forgets `agent`'s goal record for `goal_id`.
    pub(crate) async fn forget_goal(
        &self,
        agent: &AgentId,
        goal_id: &GoalId,
    ) -> Result<(), DirectoryError> {
        self.goals
            .delete(goal_key(agent, goal_id).as_str())
            .await
            .map_err(|err| DirectoryError::store("forgetting goal", err))
    }

    /// Empties the goal's inbox; returns how many messages were purged.
    pub(crate) async fn purge_inbox(&self, goal_id: &GoalId) -> Result<u64, DirectoryError> {
        Ok(self
            .inbox
            .purge()
            .filter(subject::inbox(goal_id))
            .await
            .map_err(|err| DirectoryError::store("purging inbox", err))?
            .purged)
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
            Err(err) if switchboard_request::kv::already_exists(&err) => {}
            Err(err) => return Err(DirectoryError::store("creating goal cursor", err)),
        }
        match self.cursor(goal_id).await? {
            Some((cursor, _)) if cursor.agent_id == record.agent_id => Ok(()),
            _ => Err(DirectoryError::GoalOwnedElsewhere { goal: *goal_id }),
        }
    }

    /// The sequence of the newest message in the goal's inbox (0 when it holds none).
    pub(crate) async fn last_inbox_sequence(
        &self,
        goal_id: &GoalId,
    ) -> Result<u64, DirectoryError> {
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
    pub(crate) async fn cursor(
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

    /// Deletes the caller's cursor of a goal: a delete marker written only while the cursor is
    /// still the one read (a fetch moving it meanwhile makes this read again), then everything
    /// up to that marker purged, so nothing of a closed goal stays in the bucket, while a cursor
    /// created after the marker (the goal opened again meanwhile) is kept.
    pub(crate) async fn delete_cursor(
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
                Err(err) if switchboard_request::kv::lost_expectation(&err) => {
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
    pub(crate) async fn migrate_v1_consumers(&self) -> Result<(usize, usize), DirectoryError> {
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
}
