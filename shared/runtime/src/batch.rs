//! Storing events in atomic batches (ADR-50): a service that publishes many small events on its
//! hot path — the correlator's call events — hands them to an [`EventBatcher`], which stores the
//! events submitted within [`LINGER`] of each other as one batch: one ack for all of them instead
//! of one per event, and one write (one replication round on an R3 stream) per batch.
//!
//! - **Order**: one batch is in flight at a time, so events are stored in the order they were
//!   submitted (a call's `opened` before its `answered`, from one replica).
//! - **Exactly once**: every event keeps its `Nats-Msg-Id`; a batch whose ack was lost is sent
//!   again, and the server refuses a batch holding an id it already stored (error 10201) — which,
//!   batches being atomic, means that batch was stored.
//! - **Waiting**: a submit returns a receiver that resolves once the event is stored (or lost
//!   after the retries, logged); an urgent submit sends the batch at once, without lingering
//!   (a caller that must see the event stored before it goes on).
//! - The stream needs `allow_atomic` (`AGENT_EVENTS` has it); a batch of one event is a plain
//!   publish, and a batch the stream refuses as such (a service of an older version applied it
//!   without `allow_atomic`) is stored one event at a time.

use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::message::PublishMessage;
use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use crate::telemetry;

/// How long an event waits for others to be stored with it.
pub const LINGER: Duration = Duration::from_millis(5);
/// Most events in one batch (the server's limit is 1,000).
const MAX_BATCH: usize = 256;
/// Attempts at one batch (within the publish retry budget) before its events are given up
/// (logged).
const ATTEMPTS: usize = 8;
/// First pause between attempts (doubling).
const RETRY_PAUSE: Duration = Duration::from_millis(50);
/// Events waiting to be batched, at most (a submit beyond waits for room).
const QUEUE: usize = 4_096;
/// The server's error code for a batch holding a message id it stored before.
const DUPLICATE_IN_BATCH: &str = "10201";
/// How the server describes that refusal.
const DUPLICATE_TEXT: &str = "batch contains duplicate message id";
/// The server's error code for a batch to a stream without `allow_atomic`.
const ATOMIC_DISABLED: &str = "10174";

/// Whether a publish error says the stream does not take atomic batches (`allow_atomic` off:
/// a service of an older version applied it during an upgrade). Batches are then sent one
/// message at a time.
pub fn atomic_disabled(error: &str) -> bool {
    error.contains(ATOMIC_DISABLED) || error.contains("atomic publish is disabled")
}

/// One event to store.
struct Event {
    subject: String,
    msg_id: String,
    payload: Bytes,
    stored: oneshot::Sender<bool>,
    urgent: bool,
}

/// Hands events to the background task that stores them in batches; cheap to clone.
#[derive(Debug, Clone)]
pub struct EventBatcher {
    queue: mpsc::Sender<Event>,
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Event")
            .field("subject", &self.subject)
            .field("msg_id", &self.msg_id)
            .finish_non_exhaustive()
    }
}

impl EventBatcher {
    /// Starts the background task storing events through `js`. It ends, after storing what
    /// was submitted, once every clone of the batcher is dropped.
    pub fn start(js: jetstream::Context) -> (Self, tokio::task::JoinHandle<()>) {
        let (queue, events) = mpsc::channel(QUEUE);
        let task = tokio::spawn(store_batches(js, events));
        (Self { queue }, task)
    }

    /// Submits an event; the receiver says whether it was stored (`false`: lost after the
    /// retries, or the batcher is gone). `urgent` sends the batch it joins at once.
    pub async fn submit(
        &self,
        subject: String,
        msg_id: String,
        payload: Bytes,
        urgent: bool,
    ) -> oneshot::Receiver<bool> {
        let (stored, receiver) = oneshot::channel();
        let event = Event {
            subject,
            msg_id,
            payload,
            stored,
            urgent,
        };
        if let Err(mpsc::error::SendError(event)) = self.queue.send(event).await {
            let _ = event.stored.send(false);
        }
        receiver
    }
}

/// The background task: gathers events for up to [`LINGER`] (or until one is urgent, or
/// [`MAX_BATCH`]), stores them, and goes on.
async fn store_batches(js: jetstream::Context, mut events: mpsc::Receiver<Event>) {
    while let Some(first) = events.recv().await {
        let mut batch = vec![first];
        let until = tokio::time::Instant::now() + LINGER;
        while batch.len() < MAX_BATCH && !batch.iter().any(|e| e.urgent) {
            match tokio::time::timeout_at(until, events.recv()).await {
                Ok(Some(event)) => batch.push(event),
                Ok(None) | Err(_) => break,
            }
        }
        // Whatever else is queued already goes too.
        while batch.len() < MAX_BATCH {
            match events.try_recv() {
                Ok(event) => batch.push(event),
                Err(_) => break,
            }
        }
        let stored = store(&js, &batch).await;
        for event in batch {
            let _ = event.stored.send(stored);
        }
    }
}

/// Stores one batch; true once stored. A batch that failed for want of a server (a timeout,
/// no responders: a leader election, say) is sent again whole within
/// [`crate::publish::PUBLISH_RETRY_BUDGET`]; one the stream refused for what it holds is
/// stored one event at a time, so one bad event does not take the others with it.
async fn store(js: &jetstream::Context, batch: &[Event]) -> bool {
    let until = tokio::time::Instant::now() + crate::publish::PUBLISH_RETRY_BUDGET;
    let mut pause = RETRY_PAUSE;
    let mut last = String::new();
    for _ in 0..ATTEMPTS {
        match attempt(js, batch).await {
            Ok(()) => return true,
            Err(err) if err.contains(DUPLICATE_IN_BATCH) || err.contains(DUPLICATE_TEXT) => {
                return true;
            }
            Err(err) if !transient(&err) => return one_by_one(js, batch).await,
            Err(err) => last = err,
        }
        if tokio::time::Instant::now() + pause > until {
            break;
        }
        tokio::time::sleep(pause).await;
        pause *= 2;
    }
    tracing::error!(events = batch.len(), error = %last, "events lost after retries");
    false
}

/// Whether a failed attempt may succeed as it is a moment later (no server answered in time).
fn transient(error: &str) -> bool {
    let error = error.to_ascii_lowercase();
    [
        "timed out",
        "timeout",
        "no responders",
        "disconnected",
        "broken pipe",
    ]
    .iter()
    .any(|transient| error.contains(transient))
}

/// Stores the events of a batch the stream refused as such one at a time (retried as any
/// durable publish); true when every one was stored.
async fn one_by_one(js: &jetstream::Context, batch: &[Event]) -> bool {
    let mut all = true;
    for event in batch {
        if let Err(err) = crate::publish::publish_durable(
            js,
            &event.subject,
            &event.msg_id,
            event.payload.clone(),
        )
        .await
        {
            tracing::error!(subject = %event.subject, error = %err, "event lost after retries");
            all = false;
        }
    }
    all
}

/// One attempt: all but the last as plain publishes with the batch headers (no reply), the
/// last committing the batch and acknowledged for all.
async fn attempt(js: &jetstream::Context, batch: &[Event]) -> Result<(), String> {
    let Some((last, before)) = batch.split_last() else {
        return Ok(());
    };
    let batch_id = switchboard_proto::new_id().to_string();
    let headers = |event: &Event, n: usize| {
        let mut headers = telemetry::traced_headers();
        headers.insert(async_nats::header::NATS_MESSAGE_ID, event.msg_id.as_str());
        if batch.len() > 1 {
            headers.insert(async_nats::header::NATS_BATCH_ID, batch_id.as_str());
            headers.insert(
                async_nats::header::NATS_BATCH_SEQUENCE,
                (n + 1).to_string().as_str(),
            );
        }
        headers
    };
    let client = js.client();
    for (n, event) in before.iter().enumerate() {
        client
            .publish_with_headers(
                event.subject.clone(),
                headers(event, n),
                event.payload.clone(),
            )
            .await
            .map_err(|err| err.to_string())?;
    }
    let mut last_headers = headers(last, before.len());
    if batch.len() > 1 {
        last_headers.insert(
            async_nats::header::NATS_BATCH_COMMIT,
            async_nats::header::NATS_BATCH_COMMIT_FINAL,
        );
    }
    let publish = PublishMessage::build()
        .payload(last.payload.clone())
        .headers(last_headers);
    js.send_publish(last.subject.clone(), publish)
        .await
        .map_err(|err| err.to_string())?
        .await
        .map(|_| ())
        .map_err(|err| err.to_string())
}
