//! A goal and its durable inbox.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::{self, AckKind};
use futures::StreamExt;
use switchboard_proto::registry::{GoalCloseReply, GoalCloseRequest, GoalOpenReply};
use switchboard_proto::subject::RegistryOp;
use switchboard_proto::{AgentId, GoalId, INBOX_CAP_PER_GOAL, InboxMessage};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::agent::{Agent, request};
use crate::error::ClientError;

/// How long [`Goal::drain`] waits for messages the consumer reports pending.
const DRAIN_WAIT: Duration = Duration::from_secs(2);
/// How many acknowledged stream sequences a goal remembers (its inbox holds at most
/// [`INBOX_CAP_PER_GOAL`] messages at a time).
const SEEN_MAX: usize = 4_096;

/// The stream sequences this reader acknowledged with a confirmation, the most recent
/// [`SEEN_MAX`]. JetStream can deliver a message again after its ack was confirmed — when the
/// consumer's leader died (SIGKILL, SIGSTOP) before the ack reached the other replicas — and
/// such a copy is acknowledged again and not handed out a second time.
#[derive(Debug, Default)]
struct Seen {
    sequences: HashSet<u64>,
    order: VecDeque<u64>,
    dropped: u64,
}

impl Seen {
    /// Whether `sequence` was acknowledged before; if so the copy is counted as dropped.
    fn drop_repeat(&mut self, sequence: u64) -> bool {
        let repeat = self.sequences.contains(&sequence);
        self.dropped += u64::from(repeat);
        repeat
    }

    fn insert(&mut self, sequence: u64) {
        if self.sequences.insert(sequence) {
            self.order.push_back(sequence);
            if self.order.len() > SEEN_MAX
                && let Some(oldest) = self.order.pop_front()
            {
                self.sequences.remove(&oldest);
            }
        }
    }
}

type SharedSeen = Arc<Mutex<Seen>>;

fn seen(shared: &SharedSeen) -> std::sync::MutexGuard<'_, Seen> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One live run of an agent, with its inbox.
#[derive(Debug)]
pub struct Goal {
    id: GoalId,
    subject: String,
    agent: AgentId,
    nats: async_nats::Client,
    consumer: PullConsumer,
    request_timeout: Duration,
    seen: SharedSeen,
}

/// A message taken from the inbox; [`Delivery::ack`] it once handled, or it is redelivered.
///
/// While it is held, the message is kept from redelivery by an in-progress ack every half
/// [`INBOX_ACK_WAIT_MS`](switchboard_proto::INBOX_ACK_WAIT_MS), so handling may take as long
/// as it needs; dropping it unacknowledged stops that, and the message comes back after the
/// ack wait.
#[derive(Debug)]
pub struct Delivery {
    /// The message.
    pub message: InboxMessage,
    raw: jetstream::Message,
    _in_progress: DropGuard,
    sequence: Option<u64>,
    seen: SharedSeen,
}

/// `+TERM <reason>` for `raw` (async-nats' `AckKind::Term` carries no reason).
async fn terminate(raw: &jetstream::Message, reason: &str) -> Result<(), ClientError> {
    let Some(reply) = raw.message.reply.clone() else {
        return Err(ClientError::Inbox(
            "the message has no ack subject".to_owned(),
        ));
    };
    let reason: String = reason
        .chars()
        .filter(|c| !c.is_control())
        .take(200)
        .collect();
    raw.context
        .client()
        .publish(reply, format!("+TERM {reason}").into())
        .await
        .map_err(|err| ClientError::Inbox(format!("reject: {err}")))
}

/// Sends `+WPI` for `raw` every half ack wait until the guard drops.
fn keep_in_progress(raw: &jetstream::Message) -> DropGuard {
    let stop = CancellationToken::new();
    let raw = raw.clone();
    let every = Duration::from_millis(switchboard_proto::INBOX_ACK_WAIT_MS / 2);
    let stopped = stop.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                () = stopped.cancelled() => return,
            }
            if let Err(err) = raw.ack_with(AckKind::Progress).await {
                tracing::debug!(error = %err, "in-progress ack failed");
            }
        }
    });
    stop.drop_guard()
}

impl Delivery {
    /// A span for handling this message, continuing the sender's trace from the message's
    /// `traceparent` (OpenTelemetry messaging conventions: `process` of a NATS message).
    /// Requests made inside it — a reply, a call, a send — join the same trace:
    /// `handle(delivery.message).instrument(delivery.span())`.
    pub fn span(&self) -> tracing::Span {
        let message = &self.message;
        let span = tracing::info_span!(
            "receive",
            otel.name = "process agent.inbox",
            otel.kind = "consumer",
            messaging.system = "nats",
            messaging.operation.type = "process",
            messaging.destination.name = %self.raw.subject,
            messaging.message.id = message.id.map(|id| id.to_string()).unwrap_or_default(),
            messaging.message.conversation_id = message
                .correlation_id
                .map(|id| id.to_string())
                .unwrap_or_default(),
            switchboard.from_agent_id = %message.from_agent_id,
            switchboard.to_agent_id = %message.to_agent_id,
            switchboard.kind = ?message.kind,
        );
        switchboard_runtime::telemetry::set_parent_from(&span, self.raw.headers.as_ref());
        span
    }

    /// Gives the message back for now: it is delivered again after `delay` (at once when
    /// `None`). After [`INBOX_MAX_DELIVER`](switchboard_proto::INBOX_MAX_DELIVER) deliveries
    /// the inbox gives up on it and it moves to the dead-letter stream.
    pub async fn nak(self, delay: Option<Duration>) -> Result<(), ClientError> {
        self.raw
            .ack_with(AckKind::Nak(delay))
            .await
            .map_err(|err| ClientError::Inbox(format!("nak: {err}")))
    }

    /// Rejects the message for good (`+TERM` with `reason`): it is never delivered again, and
    /// moves to the dead-letter stream with the reason, for an operator to look at or replay
    /// (`switchboard dlq list|replay`).
    pub async fn reject(self, reason: &str) -> Result<(), ClientError> {
        terminate(&self.raw, reason).await
    }

    /// Acknowledges the message and waits for the server to confirm, so it is never
    /// delivered to this goal again.
    pub async fn ack(self) -> Result<InboxMessage, ClientError> {
        self.raw
            .double_ack()
            .await
            .map_err(|err| ClientError::Inbox(format!("ack: {err}")))?;
        if let Some(sequence) = self.sequence {
            seen(&self.seen).insert(sequence);
        }
        Ok(self.message)
    }
}

impl Goal {
    pub(crate) async fn attach(agent: &Agent, reply: GoalOpenReply) -> Result<Self, ClientError> {
        let consumer: PullConsumer = agent
            .jetstream()
            .get_consumer_from_stream(&reply.consumer, &reply.stream)
            .await
            .map_err(|err| {
                ClientError::Inbox(format!("opening consumer {}: {err}", reply.consumer))
            })?;
        Ok(Self {
            id: reply.goal_id,
            subject: reply.subject,
            agent: agent.id().clone(),
            nats: agent.nats().clone(),
            consumer,
            request_timeout: agent.options().request_timeout,
            seen: SharedSeen::default(),
        })
    }

    /// How many copies of already acknowledged messages this reader dropped (JetStream
    /// delivered them again after a confirmed ack; see [`Goal::recv`]).
    pub fn redeliveries_dropped(&self) -> u64 {
        seen(&self.seen).dropped
    }

    /// The goal id.
    pub fn id(&self) -> GoalId {
        self.id
    }

    /// Its inbox subject.
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// Decodes one inbox message; a message that is not an `InboxMessage` (only a foreign
    /// publisher could put one there) is rejected with its reason, so it never comes back and
    /// lands in the dead-letter stream, and skipped. A copy of a message this reader already
    /// acknowledged is acknowledged again and skipped.
    async fn decode(&self, raw: jetstream::Message) -> Option<Delivery> {
        let sequence = raw.info().ok().map(|info| info.stream_sequence);
        if let Some(sequence) = sequence
            && seen(&self.seen).drop_repeat(sequence)
        {
            tracing::debug!(sequence, subject = %raw.subject, "a message acknowledged before was delivered again; acknowledged and dropped");
            if let Err(err) = raw.ack().await {
                tracing::debug!(error = %err, "acknowledging a repeated message failed");
            }
            return None;
        }
        match serde_json::from_slice::<InboxMessage>(&raw.payload) {
            Ok(message) => Some(Delivery {
                message,
                _in_progress: keep_in_progress(&raw),
                raw,
                sequence,
                seen: Arc::clone(&self.seen),
            }),
            Err(err) => {
                tracing::warn!(subject = %raw.subject, error = %err, "undecodable inbox message moved to the dead letters");
                if let Err(err) = terminate(&raw, &format!("undecodable: {err}")).await {
                    tracing::debug!(error = %err, "terminating an undecodable message failed");
                }
                None
            }
        }
    }

    /// Waits up to `wait` for the next message. Returns `None` when none arrived.
    ///
    /// A message this reader already acknowledged (with a confirmation) is not returned again:
    /// JetStream can deliver it once more when its consumer's leader died before the ack was
    /// replicated, and the reader acknowledges that copy and drops it
    /// ([`Goal::redeliveries_dropped`] counts them).
    pub async fn recv(&self, wait: Duration) -> Result<Option<Delivery>, ClientError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let mut batch = self
                .consumer
                .batch()
                .max_messages(1)
                .expires(left.max(Duration::from_millis(10)))
                .messages()
                .await
                .map_err(|err| ClientError::Inbox(format!("pull: {err}")))?;
            match batch.next().await {
                Some(Ok(raw)) => {
                    if let Some(delivery) = self.decode(raw).await {
                        return Ok(Some(delivery));
                    }
                }
                Some(Err(err)) => return Err(ClientError::Inbox(format!("pull: {err}"))),
                None => return Ok(None),
            }
        }
    }

    /// Takes every message waiting now, acknowledging each after it is decoded (the caller
    /// has taken it). Returns them oldest first.
    ///
    /// "Waiting now" is the consumer's own pending count, asked of the server first: a
    /// no-wait fetch alone can miss a message stored a moment ago, because the server tells
    /// a consumer about new messages asynchronously.
    pub async fn drain(&self) -> Result<Vec<InboxMessage>, ClientError> {
        let mut taken = Vec::new();
        loop {
            let mut consumer = self.consumer.clone();
            let info = consumer
                .info()
                .await
                .map_err(|err| ClientError::Inbox(format!("consumer info: {err}")))?;
            let waiting = usize::try_from(info.num_pending).unwrap_or(usize::MAX);
            if waiting == 0 {
                return Ok(taken);
            }
            let want = waiting.min(usize::try_from(INBOX_CAP_PER_GOAL).unwrap_or(64));
            let mut batch = self
                .consumer
                .batch()
                .max_messages(want)
                .expires(DRAIN_WAIT)
                .messages()
                .await
                .map_err(|err| ClientError::Inbox(format!("pull: {err}")))?;
            let mut got = 0;
            while let Some(raw) = batch.next().await {
                let raw = raw.map_err(|err| ClientError::Inbox(format!("pull: {err}")))?;
                got += 1;
                if let Some(delivery) = self.decode(raw).await {
                    taken.push(delivery.ack().await?);
                }
            }
            if got == 0 {
                // Pending but nothing came within the wait (e.g. another reader took them).
                return Ok(taken);
            }
        }
    }

    /// How many messages wait in the inbox, not yet taken (the consumer's pending count, asked
    /// of the server). Cheap enough to poll: an MCP host is told when it grows.
    pub async fn waiting(&self) -> Result<u64, ClientError> {
        let mut consumer = self.consumer.clone();
        let info = consumer
            .info()
            .await
            .map_err(|err| ClientError::Inbox(format!("consumer info: {err}")))?;
        Ok(info.num_pending)
    }

    /// Closes the goal: its consumer is deleted and its inbox purged.
    pub async fn close(self) -> Result<GoalCloseReply, ClientError> {
        request(
            &self.nats,
            RegistryOp::GoalClose.subject(&self.agent),
            &GoalCloseRequest { goal_id: self.id },
            self.request_timeout,
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::{SEEN_MAX, Seen};

    #[test]
    fn seen_remembers_the_most_recent_sequences() {
        let mut seen = Seen::default();
        for sequence in 1..=(SEEN_MAX as u64 + 10) {
            seen.insert(sequence);
        }
        seen.insert(SEEN_MAX as u64 + 10);
        assert_eq!(seen.sequences.len(), SEEN_MAX);
        assert_eq!(seen.order.len(), SEEN_MAX);
        assert!(!seen.sequences.contains(&10), "the oldest are forgotten");
        assert!(seen.sequences.contains(&11));
        assert!(seen.sequences.contains(&(SEEN_MAX as u64 + 10)));
    }
}
