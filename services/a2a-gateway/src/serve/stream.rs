//! Streams (`SendStreamingMessage`, `SubscribeToTask`): the task first, then one item per
//! event of the task, until the task ends.
//!
//! Every item's SSE `id` is the event's number within its task (`n` of its event id
//! `<task_id>:<n>`; also in the item's metadata as `switchboardEventSeq`, for clients that
//! do not surface SSE ids). A client that lost its connection subscribes again with
//! `Last-Event-ID: <n>` — on any replica, after a restart — and gets the task, then every
//! event after that one: none lost, none twice. A completed task's result comes as an
//! `artifactUpdate` just before its final `statusUpdate`. A stream from the task's beginning
//! (a message that created it) leads with the task as created — event 0 — and goes on from
//! event 1, whatever the task has done meanwhile.
//!
//! How: the live events come from a core NATS subscription to the task's event subject, made
//! before the stored events are read back (`AGENT_EVENTS`, message by message), and every
//! event is passed on once, in number order; a gap in the live numbers is filled from the
//! store, and a quiet stream checks the store now and then. No JetStream consumer is made per
//! stream, so open streams cost the server a subscription each, not one of its limited
//! consumers.

use std::collections::HashMap;
use std::sync::Arc;

use a2a::{SendMessageRequest, StreamResponse, TaskStatus};
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
use crate::serve::events::{EVENT_SEQ_KEY, Item, LiveEvents, QUIET_CHECK, event_responses};
use crate::serve::messages::CalledStream;
use crate::store::event_number;

/// Items buffered per stream before the producer waits for a slow client.
const BUFFER: usize = 16;

/// Where a stream starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Start {
    /// From now: a new subscriber (an ended task is refused).
    Now,
    /// From the task's first event (a message that just created the task).
    Beginning,
    /// After event `n` (a resumed stream, or a message that answered the task's question).
    After(u32),
}

/// A stream to open: the task, where it starts, the client's slot, and the live events when
/// the caller subscribed already (before its own message took effect).
pub(crate) struct Subscription {
    /// The task to follow.
    pub(crate) task_id: Uuid,
    /// Where the stream starts.
    pub(crate) start: Start,
    /// The client's stream slot, held while the stream is open.
    pub(crate) slot: StreamSlot,
    /// The task's live events, if already subscribed to.
    pub(crate) live: Option<LiveEvents>,
}

impl Gateway {
    /// `SendStreamingMessage`: the client's stream slot first (a client at its cap makes no
    /// task it cannot follow), then the message's call or task, then its stream. A task is
    /// followed from where the message took effect, not from "now": a task that finished
    /// before the stream opened still streams every event.
    pub(crate) async fn send_streaming(
        self: &Arc<Self>,
        caller: &AgentId,
        agent: &AgentId,
        request: &SendMessageRequest,
    ) -> Result<mpsc::Receiver<Result<Item, GatewayError>>, GatewayError> {
        let mut slot = self.open_stream(caller)?;
        if self.as_call(agent, request).await {
            match self.call_streamed(caller, agent, request, slot).await? {
                CalledStream::Items(items) => return Ok(items),
                CalledStream::Task(back) => slot = back,
            }
        }
        let submitted = self.submit(caller, agent, request).await?;
        let start = match submitted.after {
            Some(after) => Start::After(after),
            None => Start::Beginning,
        };
        let subscription = Subscription {
            task_id: submitted.id,
            start,
            slot,
            live: Some(submitted.live),
        };
        self.follow(caller, agent, subscription).await
    }

    /// `SubscribeToTask`: a stream slot, then the stream of task `task_id` from `start`.
    pub(crate) async fn subscribe(
        self: &Arc<Self>,
        caller: &AgentId,
        agent: &AgentId,
        task_id: &str,
        start: Start,
    ) -> Result<mpsc::Receiver<Result<Item, GatewayError>>, GatewayError> {
        let task_id = crate::mapping::task_id(task_id)?;
        let slot = self.open_stream(caller)?;
        let subscription = Subscription {
            task_id,
            start,
            slot,
            live: None,
        };
        self.follow(caller, agent, subscription).await
    }

    /// Follows task `id` for `caller` from `start`. `live` is a subscription made before the
    /// caller's own message took effect, if there is one. `Err` before anything is sent: no
    /// such task, a position the task never reached, or (from now) a task that has ended.
    pub(crate) async fn follow(
        self: &Arc<Self>,
        caller: &AgentId,
        agent: &AgentId,
        subscription: Subscription,
    ) -> Result<mpsc::Receiver<Result<Item, GatewayError>>, GatewayError> {
        let Subscription {
            task_id: id,
            start,
            slot,
            live,
        } = subscription;
        // Whose task it is comes first: nothing about another client's task is told.
        self.get_for(caller, agent, &id).await?;
        let live = match live {
            Some(live) => live,
            None => self.live_events(&id).await?,
        };
        // Read after subscribing: anything newer than this record arrives live.
        let record = self.get_for(caller, agent, &id).await?;
        // The task's latest event: its number is its transitions so far (the creation is 0).
        let last = Some(record.transitions);
        let position = match start {
            // A position the task never reached would wait for events that may never come.
            Start::After(after) if last.is_none_or(|last| after > last) => {
                return Err(GatewayError::BadLastEvent(after.to_string()));
            }
            Start::After(after) => Some(after),
            Start::Beginning => None,
            Start::Now if record.state.is_terminal() => {
                return Err(GatewayError::SubscribeEnded(id.to_string()));
            }
            Start::Now => last,
        };
        let (items, receiver) = mpsc::channel(BUFFER);
        let gateway = Arc::clone(self);
        let span = tracing::Span::current();
        tokio::spawn(
            async move {
                // The client's stream slot is held until the producer ends.
                let _slot = slot;
                gateway.produce(record, position, live, items).await;
            }
            .instrument(span),
        );
        Ok(receiver)
    }

    async fn produce(
        &self,
        record: TaskRecord,
        position: Option<u32>,
        mut live: LiveEvents,
        items: mpsc::Sender<Result<Item, GatewayError>>,
    ) {
        let context = mapping::context_of(&record);
        let mut first = mapping::task(&record, &self.links);
        // From the beginning (a message that just created the task): the task as it was
        // created, event 0, then every event after it — not the task as it is now followed by
        // its creation again (SUBMITTED twice, SSE id 0 twice).
        let position = match position {
            Some(position) => Some(position),
            None => {
                first.status = TaskStatus {
                    state: a2a::TaskState::Submitted,
                    message: None,
                    timestamp: mapping::utc(record.created_at),
                };
                first.artifacts = None;
                if let Some(metadata) = first.metadata.as_mut() {
                    metadata.insert(
                        "switchboardState".to_owned(),
                        Value::from(TaskState::Submitted.as_str()),
                    );
                }
                Some(0)
            }
        };
        let shown = position.map(u64::from).unwrap_or(0);
        first
            .metadata
            .get_or_insert_with(HashMap::new)
            .insert(EVENT_SEQ_KEY.to_owned(), Value::from(shown));
        let first = Item {
            seq: Some(shown),
            response: StreamResponse::Task(first),
        };
        if items.send(Ok(first)).await.is_err() {
            return;
        }
        let mut sent = position;
        // What the store has after the position, then what arrives live.
        match self.catch_up(&record, &context, &mut sent, &items).await {
            Ok(true) | Err(()) => return,
            Ok(false) => {}
        }
        loop {
            let message = tokio::select! {
                message = live.0.next() => match message {
                    Some(message) => Some(message),
                    // The subscription ended (the connection is closing): nothing more comes.
                    None => return,
                },
                () = tokio::time::sleep(QUIET_CHECK) => None,
                () = items.closed() => return,
                () = self.stopping.cancelled() => return,
            };
            let event = message.and_then(|m| serde_json::from_slice::<TaskEvent>(&m.payload).ok());
            let in_order = event
                .as_ref()
                .and_then(event_number)
                .is_some_and(|n| sent.is_none_or(|sent| n == sent + 1));
            let done = match event {
                Some(event) if in_order => {
                    self.pass_on(&record, &context, &event, &mut sent, &items)
                        .await
                }
                // A repeat (already passed on), a gap, a quiet spell or an undecodable
                // message: the store says what is new.
                _ => match self.catch_up(&record, &context, &mut sent, &items).await {
                    Ok(done) => Ok(done),
                    Err(()) => return,
                },
            };
            match done {
                Ok(false) => {}
                Ok(true) | Err(()) => return,
            }
        }
    }

    /// Passes on what the store holds after `sent`; `Ok(true)` once the task has ended.
    async fn catch_up(
        &self,
        record: &TaskRecord,
        context: &str,
        sent: &mut Option<u32>,
        items: &mpsc::Sender<Result<Item, GatewayError>>,
    ) -> Result<bool, ()> {
        let stored = match self.store.task_events_after(&record.task_id, *sent).await {
            Ok(stored) => stored,
            Err(err) => {
                let _ = items.send(Err(err)).await;
                return Err(());
            }
        };
        for event in stored {
            if self.pass_on(record, context, &event, sent, items).await? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// One event as its items (the result first for a completion); `Ok(true)` when it ended
    /// the task, `Err` when the client is gone or the result could not be read.
    async fn pass_on(
        &self,
        record: &TaskRecord,
        context: &str,
        event: &TaskEvent,
        sent: &mut Option<u32>,
        items: &mpsc::Sender<Result<Item, GatewayError>>,
    ) -> Result<bool, ()> {
        let Some(number) = event_number(event) else {
            return Ok(false);
        };
        if sent.is_some_and(|sent| number <= sent) {
            return Ok(false);
        }
        let seq = u64::from(number);
        let completed = if event.to == TaskState::Completed {
            match self.get(&record.requester, &event.task_id).await {
                Ok(completed) => Some(completed),
                Err(err) => {
                    let _ = items.send(Err(err)).await;
                    return Err(());
                }
            }
        } else {
            None
        };
        for response in event_responses(context, event, seq, completed.as_ref(), &self.links) {
            // Only the status carries the event's number: a client cut off after an artifact
            // resumes from the event before and gets the artifact again.
            let seq = matches!(response, StreamResponse::StatusUpdate(_)).then_some(seq);
            items
                .send(Ok(Item { seq, response }))
                .await
                .map_err(|_| ())?;
        }
        *sent = Some(number);
        Ok(event.to.is_terminal())
    }
}
