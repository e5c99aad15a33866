//! A task's events as A2A stream items: the live subscription to `agent.task.events.<id>`,
//! the item a stream sends (with its event number), and the status updates made of events.
//! Streams, blocking waits and webhooks all read events through here.

use std::collections::HashMap;
use std::time::Duration;

use a2a::{StreamResponse, TaskArtifactUpdateEvent, TaskStatus, TaskStatusUpdateEvent};
use futures::StreamExt as _;
use serde_json::Value;
use switchboard_proto::task::{TaskEvent, TaskRecord};
use switchboard_proto::{TaskState, subject};
use uuid::Uuid;

use crate::error::GatewayError;
use crate::gateway::Gateway;
use crate::mapping;

/// Metadata key carrying an item's event number (its SSE id).
pub const EVENT_SEQ_KEY: &str = "switchboardEventSeq";

/// How long a stream waits for a live event before it reads the store (a live event lost in
/// a reconnect is found this way).
pub(crate) const QUIET_CHECK: Duration = Duration::from_secs(5);

/// One item of a stream: its SSE id (an event number) and what it says.
#[derive(Debug, Clone)]
pub struct Item {
    /// The event's number within its task (for the leading task: the latest event it
    /// reflects, so resuming from it skips nothing). `None` for a completed task's result,
    /// which comes just before the final status of the same event: a client cut off between
    /// the two resumes from the event before and gets both again.
    pub seq: Option<u64>,
    /// The A2A stream response.
    pub response: StreamResponse,
}

/// The live events of one task: a core NATS subscription to its event subject.
pub(crate) struct LiveEvents(pub(crate) async_nats::Subscriber);

impl LiveEvents {
    /// The next live event of the task, `None` after `within` or when the subscription ends.
    pub(crate) async fn next_within(&mut self, within: Duration) -> Option<TaskEvent> {
        match tokio::time::timeout(within, self.0.next()).await {
            Ok(Some(message)) => serde_json::from_slice(&message.payload).ok(),
            _ => None,
        }
    }
}

/// The stream responses one event becomes, in order: a progress report's parts as an artifact
/// of their own (`progress-<n>`, `n` the event's number), a completion's result artifact
/// (`completed`: the task as it completed), then the status update. A stream and a webhook
/// get the same.
pub(crate) fn event_responses(
    context: &str,
    event: &TaskEvent,
    seq: u64,
    completed: Option<&TaskRecord>,
    links: &crate::links::FileLinks,
) -> Vec<StreamResponse> {
    let artifact = |artifact| {
        StreamResponse::ArtifactUpdate(TaskArtifactUpdateEvent {
            task_id: event.task_id.to_string(),
            context_id: context.to_owned(),
            artifact,
            append: Some(false),
            last_chunk: Some(true),
            metadata: Some(seq_metadata(seq)),
        })
    };
    let mut out = Vec::with_capacity(2);
    if event.op == Some(switchboard_proto::task::TaskOp::Progress)
        && (!event.parts.is_empty() || !event.attachments.is_empty())
    {
        let mut parts = mapping::outbound(&event.parts);
        parts.extend(links.parts(&event.requester, &event.attachments));
        out.push(artifact(a2a::Artifact {
            artifact_id: format!("progress-{seq}"),
            name: Some("progress".to_owned()),
            description: None,
            parts,
            metadata: None,
            extensions: None,
        }));
    }
    if let Some(result) = completed.and_then(|record| mapping::result(record, links)) {
        out.push(artifact(result));
    }
    out.push(StreamResponse::StatusUpdate(status_update(
        context, event, seq,
    )));
    out
}

fn seq_metadata(seq: u64) -> HashMap<String, Value> {
    HashMap::from([(EVENT_SEQ_KEY.to_owned(), Value::from(seq))])
}

/// One event as a status update, with its number and op in the metadata.
pub(crate) fn status_update(context: &str, event: &TaskEvent, seq: u64) -> TaskStatusUpdateEvent {
    let mut metadata = seq_metadata(seq);
    if let Some(op) = event.op {
        metadata.insert("switchboardOp".to_owned(), Value::from(op.as_str()));
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

impl Gateway {
    /// Subscribes to the live events of `task_id` (before anything that makes them happens,
    /// so none is missed).
    pub(crate) async fn live_events(&self, task_id: &Uuid) -> Result<LiveEvents, GatewayError> {
        self.client
            .subscribe(subject::task_events(task_id))
            .await
            .map(LiveEvents)
            .map_err(|err| GatewayError::unavailable("following the task's events", err))
    }
}
