//! Streams (`SendStreamingMessage`, `SubscribeToTask`): the task first, then one item per
//! event of the task as `AGENT_EVENTS` stores it, until the task ends.
//!
//! Every item's SSE `id` is the event's stream sequence (also in the item's metadata as
//! `switchboard_event_seq`, for clients that do not surface SSE ids). A client that lost its
//! connection subscribes again with `Last-Event-ID: <seq>` — on any replica, after a restart —
//! and gets the task, then every event after that one: none lost, none twice. A completed
//! task's result comes as an `artifactUpdate` just before its final `statusUpdate`.

use std::collections::HashMap;
use std::sync::Arc;

use a2a::{StreamResponse, TaskArtifactUpdateEvent, TaskStatus, TaskStatusUpdateEvent};
use futures::StreamExt;
use serde_json::Value;
use switchboard_proto::task::{TaskEvent, TaskRecord};
use switchboard_proto::{AgentId, TaskState};
use tokio::sync::mpsc;
use tracing::Instrument;
use uuid::Uuid;

use crate::error::GatewayError;
use crate::gateway::{Gateway, StreamSlot};
use crate::mapping;

/// Metadata key carrying an item's event sequence (its SSE id).
pub const EVENT_SEQ_KEY: &str = "switchboard_event_seq";

/// Items buffered per stream before the producer waits for a slow client.
const BUFFER: usize = 16;

/// One item of a stream: its SSE id (a stream sequence) and what it says.
#[derive(Debug, Clone)]
pub struct Item {
    /// The `AGENT_EVENTS` sequence of the event (for the leading task: the latest event it
    /// reflects, so resuming from it skips nothing). `None` for a completed task's result,
    /// which comes just before the final status of the same event: a client cut off between
    /// the two resumes from the event before and gets both again.
    pub seq: Option<u64>,
    /// The A2A stream response.
    pub response: StreamResponse,
}

impl Gateway {
    /// Follows task `id` for `caller` from after event `after` (`None`: from now, for a new
    /// subscriber). `Err` before anything is sent: no such task, or (without `after`) a task
    /// that has already ended.
    pub(crate) async fn follow(
        self: &Arc<Self>,
        caller: &AgentId,
        agent: &AgentId,
        id: Uuid,
        after: Option<u64>,
        slot: StreamSlot,
    ) -> Result<mpsc::Receiver<Result<Item, GatewayError>>, GatewayError> {
        // Whose task it is comes first: nothing about another client's task is told.
        let record = self.get_for(caller, agent, &id).await?;
        let last = self.store.last_event(&id).await?;
        let (position, record) = match after {
            // A position past the task's last event would wait for events that never come.
            Some(after) if after > last => {
                return Err(GatewayError::BadLastEvent(after.to_string()));
            }
            Some(after) => (after, record),
            // From now: the record read again after the position is at least as new as it,
            // so following from the position misses nothing (at worst an item repeats the
            // state the task already shows).
            None => (last, self.get_for(caller, agent, &id).await?),
        };
        // An ended task has no more events: the stream stops once it has replayed up to the
        // last one (a resumed stream), or it is refused (a new subscriber: use GetTask).
        let ends_at = if record.state.is_terminal() {
            if after.is_none() {
                return Err(GatewayError::SubscribeEnded(id.to_string()));
            }
            Some(self.store.last_event(&id).await?)
        } else {
            None
        };
        let events = self.store.task_events(&id, position).await?;
        let (items, receiver) = mpsc::channel(BUFFER);
        let gateway = Arc::clone(self);
        let caller = caller.clone();
        let span = tracing::Span::current();
        tokio::spawn(
            async move {
                // The client's stream slot is held until the producer ends.
                let _slot = slot;
                gateway
                    .produce(caller, record, position, ends_at, Box::pin(events), items)
                    .await;
            }
            .instrument(span),
        );
        Ok(receiver)
    }

    async fn produce(
        &self,
        caller: AgentId,
        record: TaskRecord,
        position: u64,
        ends_at: Option<u64>,
        mut events: std::pin::Pin<
            Box<dyn futures::Stream<Item = Result<crate::store::StoredEvent, String>> + Send>,
        >,
        items: mpsc::Sender<Result<Item, GatewayError>>,
    ) {
        let context = mapping::context_of(&record);
        let mut first = mapping::task(&record);
        first
            .metadata
            .get_or_insert_with(HashMap::new)
            .insert(EVENT_SEQ_KEY.to_owned(), Value::from(position));
        if items
            .send(Ok(Item {
                seq: Some(position),
                response: StreamResponse::Task(first),
            }))
            .await
            .is_err()
            || ends_at.is_some_and(|last| position >= last)
        {
            return;
        }
        loop {
            // A client that went away frees its slot and consumer at once, even while the
            // task is quiet.
            let event = tokio::select! {
                event = events.next() => event,
                () = items.closed() => return,
                () = self.stopping.cancelled() => return,
            };
            let Some(event) = event else { return };
            let stored = match event {
                Ok(stored) => stored,
                Err(message) => {
                    let _ = items
                        .send(Err(GatewayError::Unavailable {
                            step: "following the task's events",
                            message,
                        }))
                        .await;
                    return;
                }
            };
            // The end of an ended task's replay (its terminal event, or the last one stored).
            let done =
                stored.event.to.is_terminal() || ends_at.is_some_and(|end| stored.seq >= end);
            let mut out = Vec::with_capacity(2);
            if stored.event.to == TaskState::Completed {
                match self.get(&caller, &stored.event.task_id).await {
                    Ok(completed) => {
                        if let Some(artifact) = mapping::result(&completed) {
                            out.push(StreamResponse::ArtifactUpdate(TaskArtifactUpdateEvent {
                                task_id: stored.event.task_id.to_string(),
                                context_id: context.clone(),
                                artifact,
                                append: Some(false),
                                last_chunk: Some(true),
                                metadata: Some(seq_metadata(stored.seq)),
                            }));
                        }
                    }
                    Err(err) => {
                        let _ = items.send(Err(err)).await;
                        return;
                    }
                }
            }
            out.push(StreamResponse::StatusUpdate(status_update(
                &context,
                &stored.event,
                stored.seq,
            )));
            for response in out {
                let seq = match response {
                    StreamResponse::ArtifactUpdate(_) => None,
                    _ => Some(stored.seq),
                };
                let item = Item { seq, response };
                if items.send(Ok(item)).await.is_err() {
                    return;
                }
            }
            if done {
                return;
            }
        }
    }
}

fn seq_metadata(seq: u64) -> HashMap<String, Value> {
    HashMap::from([(EVENT_SEQ_KEY.to_owned(), Value::from(seq))])
}

/// One event as a status update, with its stream sequence and op in the metadata.
pub(crate) fn status_update(context: &str, event: &TaskEvent, seq: u64) -> TaskStatusUpdateEvent {
    let mut metadata = seq_metadata(seq);
    if let Some(op) = event.op {
        metadata.insert("switchboard_op".to_owned(), Value::from(op.as_str()));
    }
    TaskStatusUpdateEvent {
        task_id: event.task_id.to_string(),
        context_id: context.to_owned(),
        status: event_status(context, event),
        metadata: Some(metadata),
    }
}

/// The status after `event`: its state, its note (question, reason, progress) as the agent's
/// message, when it happened.
fn event_status(context: &str, event: &TaskEvent) -> TaskStatus {
    TaskStatus {
        state: mapping::state(event.to),
        message: event
            .note
            .as_deref()
            .filter(|_| event.to != TaskState::Completed)
            .map(|note| {
                let task_id = event.task_id.to_string();
                mapping::agent_message(&task_id, context, note, event.id.clone())
            }),
        timestamp: mapping::utc(event.at),
    }
}
