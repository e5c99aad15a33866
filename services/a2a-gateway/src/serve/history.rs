//! `Task.history`: the request that created a task, then each question the agent asked and
//! the client's answer to it (kept in `a2a_history`, `store.rs`), cut by the request's
//! `historyLength` (docs/a2a.md, "Exposing agents").

use a2a::Task;
use switchboard_proto::task::TaskRecord;

use crate::error::GatewayError;
use crate::gateway::Gateway;
use crate::mapping;

/// A request's `historyLength`: how many of the latest history messages a task shows (`None`:
/// all); a negative one is refused.
pub(crate) fn history_length(asked: Option<i32>) -> Result<Option<usize>, GatewayError> {
    match asked {
        None => Ok(None),
        Some(length) => usize::try_from(length).map(Some).map_err(|_| {
            GatewayError::InvalidParams(format!("historyLength is {length}; it must be 0 or more"))
        }),
    }
}

/// `task` with only its `keep` latest history messages (none for 0), as `historyLength` asks.
pub(crate) fn with_history(mut task: Task, keep: Option<usize>) -> Task {
    if let Some(keep) = keep {
        task.history = match task.history.take() {
            Some(mut history) if keep > 0 => {
                let skip = history.len().saturating_sub(keep);
                history.drain(..skip);
                Some(history)
            }
            _ => None,
        };
    }
    task
}

impl Gateway {
    /// A task record as an A2A task, its follow-ups (questions and the client's answers) in
    /// its history after the request, `keep` of the latest messages kept.
    pub(crate) async fn a2a_task(&self, record: &TaskRecord, keep: Option<usize>) -> Task {
        let mut task = mapping::task(record, &self.links);
        if keep != Some(0) && mapping::may_have_follow_ups(record) {
            match self.store.follow_ups(&record.task_id).await {
                Ok(follow_ups) => task.history.get_or_insert_default().extend(follow_ups),
                Err(err) => {
                    tracing::warn!(task_id = %record.task_id, error = %err, "history without its follow-ups");
                }
            }
        }
        with_history(task, keep)
    }
}
