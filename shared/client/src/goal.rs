//! A goal and its inbox, read through the inbox service (ARCHITECTURE.md §4a): fetch, handle,
//! ack. The client never touches JetStream.
//!
//! Reading is idempotent: what is fetched but not acknowledged is handed out again by the next
//! fetch, so a reader that crashed simply fetches. The goal keeps the messages of its last
//! fetch and hands them out one by one ([`Goal::recv`]); acknowledging one moves the goal's
//! cursor through it. A message given back ([`Delivery::nak`]) — or dropped unacknowledged —
//! makes the next `recv` fetch again from the cursor, so it comes back; after
//! [`INBOX_MAX_DELIVER`](switchboard_proto::inbox::INBOX_MAX_DELIVER) hand-outs the service moves it to the dead letters.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use switchboard_proto::inbox::{
    AckReply, AckRequest, FETCH_MAX, FETCH_WAIT_MAX_MS, FetchReply, FetchRequest, FetchedMessage,
};
use switchboard_proto::registry::{GoalCloseReply, GoalCloseRequest, GoalOpenReply};
use switchboard_proto::subject::{self, RegistryOp};
use switchboard_proto::{AgentId, GoalId, InboxMessage};

use switchboard_runtime::request::{RequestFailure, request_json, request_json_retrying};

use crate::agent::{Agent, request};
use crate::error::ClientError;

/// Most messages one [`Goal::recv`] fetch takes ahead (handed out one by one).
const RECV_AHEAD: u32 = 16;

/// What a goal's reader holds between calls.
#[derive(Debug, Default)]
struct ReaderState {
    /// Messages fetched and not handed out yet, oldest first.
    ahead: VecDeque<FetchedMessage>,
    /// Set when a handed-out message was given back: what is ahead is dropped and the next
    /// `recv` fetches from the cursor (not before the instant, if one was given).
    refetch: Option<Option<tokio::time::Instant>>,
}

type SharedState = Arc<Mutex<ReaderState>>;

fn state(shared: &SharedState) -> std::sync::MutexGuard<'_, ReaderState> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One live run of an agent, with its inbox.
#[derive(Debug)]
pub struct Goal {
    id: GoalId,
    subject: String,
    agent: AgentId,
    nats: async_nats::Client,
    request_timeout: Duration,
    retries: u32,
    state: SharedState,
}

/// A message taken from the inbox; [`Delivery::ack`] it once handled. Dropped without an ack
/// (or given back with [`Delivery::nak`]), it is handed out again by the next
/// [`Goal::recv`].
#[derive(Debug)]
pub struct Delivery {
    /// The message.
    pub message: InboxMessage,
    /// Its `AGENT_INBOX` sequence.
    pub seq: u64,
    traceparent: Option<String>,
    tracestate: Option<String>,
    reader: Reader,
    settled: bool,
}

/// What a delivery needs to settle itself.
#[derive(Debug, Clone)]
struct Reader {
    goal: GoalId,
    agent: AgentId,
    nats: async_nats::Client,
    request_timeout: Duration,
    retries: u32,
    state: SharedState,
}

impl Reader {
    async fn ack(&self, request: &AckRequest) -> Result<AckReply, ClientError> {
        request_ack(
            &self.nats,
            &self.agent,
            request,
            self.request_timeout,
            self.retries,
        )
        .await
    }

    fn give_back(&self, not_before: Option<tokio::time::Instant>) {
        let mut state = state(&self.state);
        state.ahead.clear();
        state.refetch = Some(not_before);
    }
}

/// An ack, retried and hedged like a send: acks are idempotent (through a sequence already
/// passed is a no-op), and a reader whose ack waits on a replica that went away would fall
/// behind its goal's 64-message inbox.
async fn request_ack(
    nats: &async_nats::Client,
    agent: &AgentId,
    body: &AckRequest,
    timeout: Duration,
    retries: u32,
) -> Result<AckReply, ClientError> {
    request_json_retrying(nats, &subject::inbox_ack(agent), body, timeout, retries)
        .await
        .map_err(ClientError::from)
}

/// How long past its `wait_ms` a held fetch's reply may take before the reader stops waiting
/// for it (the replica holding it may have gone away) and fetches again without waiting.
const HELD_FETCH_GRACE: Duration = Duration::from_secs(1);

impl Drop for Delivery {
    fn drop(&mut self) {
        if !self.settled {
            self.reader.give_back(None);
        }
    }
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
            messaging.destination.name = %subject::inbox(&self.reader.goal),
            messaging.message.id = message.id.map(|id| id.to_string()).unwrap_or_default(),
            messaging.message.conversation_id = message
                .correlation_id
                .map(|id| id.to_string())
                .unwrap_or_default(),
            switchboard.from_agent_id = %message.from_agent_id,
            switchboard.to_agent_id = %message.to_agent_id,
            switchboard.kind = ?message.kind,
        );
        let mut headers = async_nats::HeaderMap::new();
        if let Some(traceparent) = &self.traceparent {
            headers.insert(switchboard_proto::HEADER_TRACEPARENT, traceparent.as_str());
        }
        if let Some(tracestate) = &self.tracestate {
            headers.insert(switchboard_proto::HEADER_TRACESTATE, tracestate.as_str());
        }
        switchboard_runtime::telemetry::set_parent_from(&span, Some(&headers));
        span
    }

    /// Gives the message back for now: the next [`Goal::recv`] fetches again from the cursor
    /// (not before `delay` has passed), so this message comes first again. After
    /// [`INBOX_MAX_DELIVER`](switchboard_proto::inbox::INBOX_MAX_DELIVER) hand-outs the inbox gives up on it and it moves to the dead
    /// letters.
    pub async fn nak(mut self, delay: Option<Duration>) -> Result<(), ClientError> {
        self.settled = true;
        self.reader
            .give_back(delay.map(|delay| tokio::time::Instant::now() + delay));
        Ok(())
    }

    /// Rejects the message for good: it moves to the dead letters with `reason` (control
    /// characters removed, at most 200 characters), for an operator to look at or replay
    /// (`switchboard dlq list|replay`), and the cursor moves through it.
    pub async fn reject(mut self, reason: &str) -> Result<(), ClientError> {
        self.settled = true;
        let request = AckRequest {
            goal_id: self.reader.goal,
            seq: Some(self.seq),
            reject: Some(reason.to_owned()),
            ..Default::default()
        };
        self.reader.ack(&request).await.map(|_| ())
    }

    /// Acknowledges the message: the goal's cursor moves through it (and through any earlier
    /// message), confirmed by the service, so it is never handed out to this goal again.
    pub async fn ack(mut self) -> Result<InboxMessage, ClientError> {
        self.settled = true;
        let request = AckRequest {
            goal_id: self.reader.goal,
            through: Some(self.seq),
            ..Default::default()
        };
        self.reader.ack(&request).await?;
        Ok(self.message.clone())
    }
}

impl Goal {
    pub(crate) fn attach(agent: &Agent, reply: GoalOpenReply) -> Self {
        Self {
            id: reply.goal_id,
            subject: reply.subject,
            agent: agent.id().clone(),
            nats: agent.nats().clone(),
            request_timeout: agent.options().request_timeout,
            retries: agent.options().send_retries,
            state: SharedState::default(),
        }
    }

    /// The goal id.
    pub fn id(&self) -> GoalId {
        self.id
    }

    /// Its inbox subject.
    pub fn subject(&self) -> &str {
        &self.subject
    }

    fn reader(&self) -> Reader {
        Reader {
            goal: self.id,
            agent: self.agent.clone(),
            nats: self.nats.clone(),
            request_timeout: self.request_timeout,
            retries: self.retries,
            state: Arc::clone(&self.state),
        }
    }

    /// One fetch request: `max` messages, held up to `wait` when none is unread.
    pub async fn fetch(
        &self,
        max: u32,
        wait: Duration,
        ack_through: Option<u64>,
    ) -> Result<FetchReply, ClientError> {
        self.fetch_with(FetchRequest {
            goal_id: self.id,
            max: Some(max.clamp(1, FETCH_MAX)),
            wait_ms: Some(
                i64::try_from(wait.as_millis().min(u128::from(FETCH_WAIT_MAX_MS))).unwrap_or(0),
            ),
            ack_through,
            peek: false,
        })
        .await
    }

    /// A fetch is a read, so it is retried and hedged like a send; a held one (`wait_ms`) is
    /// sent once — its copies would be held too — and, when its reply is overdue (the replica
    /// holding it went away), followed by a fetch that does not wait.
    async fn fetch_with(&self, mut body: FetchRequest) -> Result<FetchReply, ClientError> {
        let subject = subject::inbox_fetch(&self.agent);
        let held = Duration::from_millis(u64::try_from(body.wait_ms.unwrap_or(0)).unwrap_or(0));
        if !held.is_zero() {
            match request_json(&self.nats, &subject, &body, held + HELD_FETCH_GRACE).await {
                Err(RequestFailure::Timeout { .. } | RequestFailure::NoResponders { .. }) => {
                    body.wait_ms = None;
                }
                outcome => return outcome.map_err(ClientError::from),
            }
        }
        request_json_retrying(
            &self.nats,
            &subject,
            &body,
            self.request_timeout,
            self.retries,
        )
        .await
        .map_err(ClientError::from)
    }

    /// Moves the goal's cursor through `through` (a sequence this goal was handed).
    pub async fn ack_through(&self, through: u64) -> Result<AckReply, ClientError> {
        let request = AckRequest {
            goal_id: self.id,
            through: Some(through),
            ..Default::default()
        };
        request_ack(
            &self.nats,
            &self.agent,
            &request,
            self.request_timeout,
            self.retries,
        )
        .await
    }

    /// Waits up to `wait` for the next message. Returns `None` when none arrived.
    pub async fn recv(&self, wait: Duration) -> Result<Option<Delivery>, ClientError> {
        let deadline = tokio::time::Instant::now() + wait;
        let not_before = {
            let mut state = state(&self.state);
            match state.refetch.take() {
                Some(not_before) => {
                    state.ahead.clear();
                    not_before
                }
                None => None,
            }
        };
        if let Some(not_before) = not_before {
            tokio::time::sleep_until(not_before.min(deadline)).await;
        }
        if let Some(next) = state(&self.state).ahead.pop_front() {
            return Ok(Some(self.delivery(next)));
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let reply = self.fetch(RECV_AHEAD, left, None).await?;
        let mut messages = reply.messages.into_iter();
        let first = messages.next();
        state(&self.state).ahead.extend(messages);
        Ok(first.map(|first| self.delivery(first)))
    }

    fn delivery(&self, fetched: FetchedMessage) -> Delivery {
        Delivery {
            message: fetched.message,
            seq: fetched.seq,
            traceparent: fetched.traceparent,
            tracestate: fetched.tracestate,
            reader: self.reader(),
            settled: false,
        }
    }

    /// Takes every message unread now and acknowledges them (the caller has taken them).
    /// Returns them oldest first.
    pub async fn drain(&self) -> Result<Vec<InboxMessage>, ClientError> {
        let (taken, last) = self.take_all().await?;
        if let Some(last) = last {
            self.ack_through(last).await?;
        }
        Ok(taken)
    }

    /// Every message unread now, oldest first, without acknowledging them, and the sequence
    /// to acknowledge them through ([`Goal::ack_through`]) once they are handled.
    pub async fn take_all(&self) -> Result<(Vec<InboxMessage>, Option<u64>), ClientError> {
        {
            let mut state = state(&self.state);
            state.ahead.clear();
            state.refetch = None;
        }
        let mut taken = Vec::new();
        let mut last = None;
        loop {
            // Each page after the first acknowledges the one before: a goal holds at most 64
            // messages, so this ends after one or two pages unless senders keep up.
            let reply = self.fetch(FETCH_MAX, Duration::ZERO, last).await?;
            let more = reply.unread > reply.messages.len() as u64;
            let Some(page_last) = reply.messages.last().map(|m| m.seq) else {
                return Ok((taken, last));
            };
            taken.extend(reply.messages.into_iter().map(|m| m.message));
            last = Some(page_last);
            if !more {
                return Ok((taken, last));
            }
        }
    }

    /// How many messages are unread in the inbox (a peek: nothing is handed out).
    pub async fn waiting(&self) -> Result<u64, ClientError> {
        Ok(self.unread().await?.0)
    }

    /// How many messages are unread and the sequence of the oldest one (a peek: nothing is
    /// handed out). Cheap enough to poll: a change of either means messages arrived or were
    /// read, which is how an MCP host is told of new ones.
    pub async fn unread(&self) -> Result<(u64, Option<u64>), ClientError> {
        let reply = self
            .fetch_with(FetchRequest {
                goal_id: self.id,
                max: Some(1),
                wait_ms: None,
                ack_through: None,
                peek: true,
            })
            .await?;
        Ok((reply.unread, reply.messages.first().map(|m| m.seq)))
    }

    /// Closes the goal: its inbox is purged and its cursor deleted.
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
