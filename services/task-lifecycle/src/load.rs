//! The concurrency cap: an assignee's active set (tasks accepted, working or waiting for
//! input), reserved at accept, released when a task stops being active, and reported to the
//! directory as the agent's `current_tasks`.
//!
//! The set (`load.<agent_id>`) is the compare-and-set target, so concurrent accepts for one
//! assignee are decided one at a time and never exceed its `max_concurrent_tasks`, across
//! replicas; within a replica a per-assignee lock makes them take turns instead of colliding.
//! An accept also re-checks the assignee's `allow_from`, since cards change after a task is
//! created.

use std::sync::Arc;
use std::time::Duration;

use switchboard_proto::registry::TaskLoadReport;
use switchboard_proto::task::TaskRecord;
use switchboard_proto::{AgentId, TaskState, acl, subject, timestamp};
use switchboard_request::request::request_json;
use switchboard_runtime::store::StoreError;
use uuid::Uuid;

use crate::error::TaskError;
use crate::store::{LoadEntry, TaskLoad};
use crate::tasks::{CAS_ATTEMPTS, Tasks};

/// A reservation in an assignee's active set younger than this is an accept in flight.
const RESERVATION_IN_FLIGHT: time::Duration = time::Duration::seconds(30);
/// How long the directory may take to take a load report.
const DIRECTORY_TIMEOUT: Duration = Duration::from_secs(2);

impl Tasks {
    /// The acceptance rules besides the cap: the requester is still allowed by the assignee's
    /// `allow_from` (cards change).
    pub(crate) async fn check_acceptance(&self, task: &TaskRecord) -> Result<(), TaskError> {
        if task.requester == task.assignee {
            return Ok(());
        }
        // The card as stored now: its owner may have changed it a moment ago.
        let card = self.door.view().card_now(&task.assignee).await?;
        let allowed = card.is_some_and(|card| {
            card.allow_from
                .iter()
                .any(|glob| acl::glob_matches(glob, task.requester.as_str()))
        });
        if allowed {
            Ok(())
        } else {
            Err(TaskError::NotAllowedFrom {
                assignee: task.assignee.clone(),
                requester: task.requester.clone(),
            })
        }
    }

    /// This replica's turn at an assignee's active set (locks of idle agents are dropped).
    async fn load_turn(&self, agent: &AgentId) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = match self.load_locks.lock() {
            Ok(mut locks) => {
                locks.retain(|_, lock| Arc::strong_count(lock) > 1);
                Arc::clone(locks.entry(agent.clone()).or_default())
            }
            Err(_) => Arc::new(tokio::sync::Mutex::new(())),
        };
        lock.lock_owned().await
    }

    /// Reserves a place in the assignee's active set, refusing at `max_concurrent_tasks`.
    /// The set is the compare-and-set target, so concurrent accepts are decided one at a time.
    pub(crate) async fn reserve(&self, agent: &AgentId, task_id: Uuid) -> Result<(), TaskError> {
        let _turn = self.load_turn(agent).await;
        let cap = self.door.view().card(agent).await?.map_or(
            switchboard_proto::registry::DEFAULT_MAX_CONCURRENT_TASKS,
            |c| c.max_concurrent_tasks,
        );
        let cap = usize::try_from(cap).unwrap_or(usize::MAX);
        for attempt in 0..CAS_ATTEMPTS {
            let (load, revision) = self.store.load(agent).await?;
            if load.active.iter().any(|entry| entry.task_id == task_id) {
                return Ok(());
            }
            let mut live = self.verified_at_cap(load.active, cap).await?;
            if live.len() >= cap {
                return Err(TaskError::AtCapacity {
                    agent: agent.clone(),
                    active: live.len(),
                    cap,
                });
            }
            live.push(LoadEntry {
                task_id,
                since: timestamp::now(),
            });
            let load = TaskLoad { active: live };
            if self.store.save_load(agent, &load, revision).await? {
                return Ok(());
            }
            switchboard_runtime::store::cas_backoff(u32::try_from(attempt).unwrap_or(u32::MAX))
                .await;
        }
        Err(TaskError::LoadKeepsChanging(agent.clone()))
    }

    /// An active set that looks full is checked against the records: entries whose task is
    /// not active (left by a crash between a transition and its release) are dropped; an
    /// accept still in flight counts. Below the cap the entries are trusted as they are, so
    /// an accept costs no record reads.
    async fn verified_at_cap(
        &self,
        entries: Vec<LoadEntry>,
        cap: usize,
    ) -> Result<Vec<LoadEntry>, StoreError> {
        if entries.len() < cap {
            return Ok(entries);
        }
        let now = timestamp::now();
        let mut live = Vec::with_capacity(entries.len());
        for entry in entries {
            let in_flight = now - entry.since < RESERVATION_IN_FLIGHT;
            let keep = match self.store.find(&entry.task_id).await? {
                Some(stored) => {
                    stored.task.state.is_active()
                        || (stored.task.state == TaskState::Submitted && in_flight)
                }
                None => in_flight,
            };
            if keep {
                live.push(entry);
            }
        }
        Ok(live)
    }

    /// Takes a task out of the assignee's active set (best effort: stale entries are dropped
    /// by the next reservation).
    pub(crate) async fn release(&self, agent: &AgentId, task_id: Uuid) {
        let _turn = self.load_turn(agent).await;
        for attempt in 0..CAS_ATTEMPTS {
            let (mut load, revision) = match self.store.load(agent).await {
                Ok(load) => load,
                Err(err) => {
                    tracing::warn!(%agent, error = %err, "task load not released");
                    return;
                }
            };
            let before = load.active.len();
            load.active.retain(|entry| entry.task_id != task_id);
            if load.active.len() == before {
                return;
            }
            match self.store.save_load(agent, &load, revision).await {
                Ok(true) => return,
                Ok(false) => {
                    switchboard_runtime::store::cas_backoff(
                        u32::try_from(attempt).unwrap_or(u32::MAX),
                    )
                    .await;
                }
                Err(err) => {
                    tracing::warn!(%agent, error = %err, "task load not released");
                    return;
                }
            }
        }
    }

    /// Tells the directory an agent's active tasks (its `current_tasks`; `busy` at the cap).
    pub(crate) async fn report_load(&self, agent: &AgentId) {
        let cap = match self.door.view().card(agent).await {
            Ok(card) => card.map_or(usize::MAX, |c| {
                usize::try_from(c.max_concurrent_tasks).unwrap_or(usize::MAX)
            }),
            Err(err) => {
                tracing::warn!(%agent, error = %err, "card not read");
                return;
            }
        };
        let entries = match self.store.load(agent).await {
            Ok((load, _)) => self.verified_at_cap(load.active, cap).await,
            Err(err) => Err(err),
        };
        let current_tasks = match entries {
            Ok(live) => live.into_iter().map(|e| e.task_id).collect(),
            Err(err) => {
                tracing::warn!(%agent, error = %err, "task load not read");
                return;
            }
        };
        let report = TaskLoadReport { current_tasks };
        let subject = subject::registry_tasks(agent);
        if let Err(err) =
            request_json::<_, serde_json::Value>(&self.client, &subject, &report, DIRECTORY_TIMEOUT)
                .await
        {
            tracing::warn!(%agent, error = %err, "the directory did not take the task load");
        }
    }
}
