//! Deadlines and the cancel cascade: the periodic sweep, expiry, and canceling the open
//! descendants of a task that ended.
//!
//! Each replica sweeps the open index (tasks with a deadline or a parent). A task past its
//! deadline fails with `deadline_expired`, the service acting; the compare-and-set lets
//! exactly one replica win each. A task that ends cancels its open descendants, breadth
//! first, each told like any other transition. Every `ORPHAN_CHECK_EVERY` sweeps, open
//! children are also checked against their parents, so a cascade cut short by a crash is
//! finished.

use std::collections::VecDeque;

use switchboard_proto::TaskState;
use switchboard_proto::task::{
    self as rules, DEADLINE_EXPIRED, DescendantState, TaskOp, TaskRecord, TaskRole,
};
use switchboard_runtime::store::StoreError;
use time::OffsetDateTime;
use tracing::Instrument as _;
use uuid::Uuid;

use crate::store::TaskEntry;
use crate::tasks::{CAS_ATTEMPTS, CHILD_IN_FLIGHT, Tasks};
use crate::transitions::Change;

/// Every this many sweeps, open children are checked against their parents (a cascade cut
/// short by a crash is finished).
const ORPHAN_CHECK_EVERY: u64 = 10;

impl Tasks {
    /// One sweep: every open task past its deadline fails with `deadline_expired` (exactly one
    /// replica wins each), and now and then open children of ended parents are canceled.
    /// Returns how many tasks this sweep expired.
    pub async fn sweep(&self, now: OffsetDateTime) -> Result<usize, StoreError> {
        let round = self
            .sweeps
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let check_orphans = round.is_multiple_of(ORPHAN_CHECK_EVERY);
        let mut expired = 0;
        for (id, entry, stored_at) in self.store.open().await? {
            let due = entry.deadline.is_some_and(|at| at <= now);
            let orphan_check = check_orphans && entry.parent.is_some();
            if !due && !orphan_check {
                continue;
            }
            let found = match self.store.find(&id).await {
                Err(StoreError::Corrupt(key)) => {
                    // One bad record must not stop the sweep for every other task.
                    tracing::warn!(%key, "undecodable task record skipped by the sweep");
                    continue;
                }
                other => other?,
            };
            let Some(stored) = found else {
                if stored_at.is_some_and(|at| now - at > CHILD_IN_FLIGHT) {
                    self.store.close(&id).await;
                }
                continue;
            };
            if stored.task.state.is_terminal() {
                self.store.close(&id).await;
                continue;
            }
            if due {
                // In the trace the task was created in: its failure and the cascade's cancels
                // join the task's story.
                let span = switchboard_runtime::telemetry::span_for_record(
                    "task-lifecycle.deadline",
                    crate::SPEC.name,
                    stored.task.traceparent.as_deref(),
                );
                span.record("switchboard.task_id", id.to_string().as_str());
                if self.expire(&stored).instrument(span).await?.is_some() {
                    expired += 1;
                }
                continue;
            }
            if let Some(parent_id) = stored.task.parent
                && !stored.task.state.is_terminal()
                && let Some(parent) = self.store.find(&parent_id).await?
                && parent.task.state.is_terminal()
            {
                tracing::info!(task_id = %id, parent = %parent_id, "finishing an interrupted cascade");
                if let Some(child) = self
                    .cancel_by_system(&id, parent_id, parent.task.state)
                    .await?
                {
                    self.cascade(&child).await;
                }
            }
        }
        Ok(expired)
    }

    /// Fails a task past its deadline with `deadline_expired` (the service acting), then
    /// cancels its open descendants. `Ok(None)`: another writer changed it first.
    pub(crate) async fn expire(&self, stored: &TaskEntry) -> Result<Option<TaskEntry>, StoreError> {
        let mut updated = stored.task.clone();
        updated.state = TaskState::Failed;
        updated.reason = Some(DEADLINE_EXPIRED.to_owned());
        let change = Change {
            op: TaskOp::Expire,
            by: None,
            role: TaskRole::System,
            text: Some(DEADLINE_EXPIRED.to_owned()),
            parts: Vec::new(),
            attachments: Vec::new(),
        };
        let done = self.commit(stored, updated, &change).await?;
        if let Some(done) = &done {
            tracing::info!(task_id = %done.task.task_id, "task deadline expired");
            self.cascade(&done.task).await;
        }
        Ok(done)
    }

    /// Cancels every open descendant of a task that ended, breadth first; each assignee and
    /// requester is told like any other transition. Returns every descendant with the state
    /// it is left in (canceled now, or the end it had reached), parents before children.
    pub(crate) async fn cascade(&self, ended: &TaskRecord) -> Vec<DescendantState> {
        let mut queue: VecDeque<(Uuid, Uuid, TaskState)> = ended
            .children
            .iter()
            .map(|child| (*child, ended.task_id, ended.state))
            .collect();
        let mut descendants = Vec::new();
        while let Some((id, parent, parent_state)) = queue.pop_front() {
            match self.cancel_by_system(&id, parent, parent_state).await {
                Ok(Some(child)) => {
                    descendants.push(DescendantState {
                        task_id: child.task_id,
                        parent,
                        state: child.state,
                    });
                    queue.extend(
                        child
                            .children
                            .iter()
                            .map(|grandchild| (*grandchild, child.task_id, child.state)),
                    );
                }
                Ok(None) => {}
                Err(err) => {
                    // The sweep's orphan check finishes it later.
                    tracing::warn!(task_id = %id, error = %err, "cascade cancel failed");
                }
            }
        }
        descendants
    }

    /// Writes a cancel the service makes itself (a cascade's, an operator's), moving the task
    /// to `next` with `reason`; `Ok(None)`: another writer won.
    pub(crate) async fn cancel_as_system(
        &self,
        stored: &TaskEntry,
        next: TaskState,
        reason: String,
    ) -> Result<Option<TaskEntry>, StoreError> {
        let mut updated = stored.task.clone();
        updated.state = next;
        updated.reason = Some(reason.clone());
        let change = Change {
            op: TaskOp::Cancel,
            by: None,
            role: TaskRole::System,
            text: Some(reason),
            parts: Vec::new(),
            attachments: Vec::new(),
        };
        self.commit(stored, updated, &change).await
    }

    /// Cancels one task because its parent ended and returns it; one that had ended already is
    /// returned as it is. `Ok(None)`: gone, or not really that parent's child.
    async fn cancel_by_system(
        &self,
        id: &Uuid,
        parent: Uuid,
        parent_state: TaskState,
    ) -> Result<Option<TaskRecord>, StoreError> {
        for _ in 0..CAS_ATTEMPTS {
            let Some(stored) = self.store.find(id).await? else {
                return Ok(None);
            };
            // Only a real child: an id listed under a parent must name that parent back.
            if stored.task.parent != Some(parent) {
                tracing::warn!(task_id = %id, %parent, "listed as a child but names another parent; not canceled");
                return Ok(None);
            }
            let Ok(next) = rules::apply(stored.task.state, TaskOp::Cancel, TaskRole::System) else {
                return Ok(Some(stored.task));
            };
            let reason = format!("parent task {parent} ended ({})", parent_state.as_str());
            if let Some(done) = self.cancel_as_system(&stored, next, reason).await? {
                return Ok(Some(done.task));
            }
        }
        Err(StoreError::store(
            "canceling a subtask",
            format!("task {id} keeps changing"),
        ))
    }
}
