//! A goal and its inbox, read through the inbox service (docs/protocol.md §7): fetch, handle,
//! ack. The client never touches JetStream.
//!
//! Reading is idempotent: what is fetched but not acknowledged is handed out again by the next
//! fetch, so a reader that crashed simply fetches. The goal keeps the messages of its last
//! fetch and hands them out one by one ([`Goal::recv`]); acknowledging one moves the goal's
//! cursor through it. A message given back ([`Delivery::nak`]) — or dropped unacknowledged —
//! makes the next `recv` fetch again from the cursor, so it comes back; after
//! [`INBOX_MAX_DELIVER`](switchboard_proto::inbox::INBOX_MAX_DELIVER) hand-outs the service moves it to the dead letters.

use std::sync::Arc;
use std::time::Duration;

use switchboard_proto::inbox::{
    AckReply, AckRequest, FETCH_MAX, FETCH_WAIT_MAX_MS, FetchReply, FetchRequest, FetchedMessage,
};
use switchboard_proto::registry::{GoalCloseReply, GoalCloseRequest, GoalOpenReply};
use switchboard_proto::subject::{self, RegistryOp};
use switchboard_proto::{AgentId, GoalId, InboxMessage};

use switchboard_request::request::{RequestFailure, request_json, request_json_retrying};

use crate::error::ClientError;
use crate::request;

mod state;
use state::{SharedState, state};

/// Most messages one [`Goal::recv`] fetch takes ahead (handed out one by one).
const RECV_AHEAD: u32 = 16;

/// How long an ack settled by [`Agent::serve`](crate::Agent::serve) waits to ride on the
/// read loop's next fetch (`ack_through`) before it is sent on its own: a busy goal's acks
/// cost no request and no cursor write of their own (the service writes them with the next
/// hand-out); an idle goal's last ack goes out this long after its handler ended.
pub const ACK_LINGER: Duration = Duration::from_millis(25);

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
    /// The inbox message as the service stored it.
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

    fn give_back(&self, seq: u64, not_before: Option<tokio::time::Instant>) {
        state(&self.state).give_back(seq, not_before);
    }

    /// `seq` is settled (handled, or rejected into the dead letters): the ack through every
    /// settled message before the first unsettled one is owed, carried by the next fetch or
    /// sent alone after [`ACK_LINGER`].
    fn settle(&self, seq: u64) {
        let linger = {
            let mut state = state(&self.state);
            let through = state.ack_through(seq);
            state.owed = state.owed.max(through);
            let linger = !state.flush_scheduled && state.owed > state.confirmed;
            state.flush_scheduled |= linger;
            linger.then_some(state.owed)
        };
        if let Some(through) = linger {
            let reader = self.clone();
            tokio::spawn(async move { reader.linger(through).await });
        }
    }

    /// Lingers, then sends the settled acks the service does not have yet: while fetches keep
    /// confirming each ack it waited for, it waits for the next one instead; it ends once
    /// the service has every settled ack.
    async fn linger(&self, mut waited_for: u64) {
        loop {
            tokio::time::sleep(ACK_LINGER).await;
            let through = {
                let mut state = state(&self.state);
                if state.owed <= state.confirmed {
                    state.flush_scheduled = false;
                    return;
                }
                if state.confirmed >= waited_for {
                    // A fetch carried it: wait for the next one the same way.
                    waited_for = state.owed;
                    continue;
                }
                state.owed
            };
            match self.send_ack(through).await {
                Ok(()) => waited_for = through,
                Err(err) => {
                    tracing::warn!(error = %err, "an ack was not taken; its messages may come again");
                    state(&self.state).flush_scheduled = false;
                    return;
                }
            }
        }
    }

    /// Sends an ack through `through` on its own.
    async fn send_ack(&self, through: u64) -> Result<(), ClientError> {
        let request = AckRequest {
            goal_id: self.goal,
            through: Some(through),
            ..Default::default()
        };
        let reply = self.ack(&request).await?;
        state(&self.state).confirmed(reply.cursor);
        Ok(())
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

/// How long past its `wait_ms` a fetch's reply may take before the reader stops waiting for it
/// (the replica holding it may have gone away) and fetches again, without waiting. A fetch is
/// milliseconds of work, and a reader stalled for a whole request timeout falls behind its
/// goal's 64-message inbox (service_faults lost 25 sends with 5 s + the wait).
const FETCH_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);

impl Drop for Delivery {
    fn drop(&mut self) {
        if !self.settled {
            self.reader.give_back(self.seq, None);
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
            switchboard.correlation_id = message
                .correlation_id
                .map(|id| id.to_string())
                .unwrap_or_default(),
            messaging.message.conversation_id = message
                .correlation_id
                .map(|id| id.to_string())
                .unwrap_or_default(),
            switchboard.from_agent_id = %message.from_agent_id,
            switchboard.to_agent_id = %message.to_agent_id,
            switchboard.kind = message.kind.as_str(),
            switchboard.goal_id = %self.reader.goal,
            // The reading agent: a process hosting several agents exports each under its own
            // `service.name` (see `telemetry::init_hosting`).
            switchboard.service = %self.reader.agent,
        );
        switchboard_request::trace::set_parent_from_text(
            &span,
            self.traceparent.as_deref(),
            self.tracestate.as_deref(),
        );
        span
    }

    /// Gives the message back for now: the next [`Goal::recv`] fetches again from the cursor
    /// (not before `delay` has passed), so this message comes first again. After
    /// [`INBOX_MAX_DELIVER`](switchboard_proto::inbox::INBOX_MAX_DELIVER) hand-outs the inbox gives up on it and it moves to the dead
    /// letters.
    pub async fn nak(mut self, delay: Option<Duration>) -> Result<(), ClientError> {
        self.settled = true;
        self.reader.give_back(
            self.seq,
            delay.map(|delay| tokio::time::Instant::now() + delay),
        );
        Ok(())
    }

    /// Rejects the message for good: it moves to the dead letters with `reason` (control
    /// characters removed, at most 200 characters), for an operator to look at or replay
    /// (`switchboard dlq list|replay`), and the cursor moves through it.
    pub async fn reject(mut self, reason: &str) -> Result<(), ClientError> {
        self.settled = true;
        // Still in flight while the reject is on its way: an ack settled meanwhile stops
        // before it, so no fetch's `ack_through` passes it before it is in the dead letters.
        let request = AckRequest {
            goal_id: self.reader.goal,
            seq: Some(self.seq),
            reject: Some(reason.to_owned()),
            ..Default::default()
        };
        match self.reader.ack(&request).await {
            // Settled: acks held back behind it are owed now (the service has moved the
            // cursor to where its reply says).
            Ok(reply) => {
                state(&self.reader.state).confirmed(reply.cursor);
                self.reader.settle(self.seq);
                Ok(())
            }
            Err(err) => {
                self.reader.give_back(self.seq, None);
                Err(err)
            }
        }
    }

    /// Settles the message as handled and lets its ack ride on the reader's next fetch, or go
    /// on its own after [`ACK_LINGER`] (what [`Agent::serve`](crate::Agent::serve) does). A
    /// reader that stops flushes what it owes ([`Goal::flush_acks`]); one that crashes first
    /// is handed the messages again (hand-out is at least once, docs/protocol.md §7).
    pub(crate) fn ack_soon(mut self) {
        self.settled = true;
        self.reader.settle(self.seq);
    }

    /// Acknowledges the message: the goal's cursor moves through it (and through any earlier
    /// message), confirmed by the service, so it is never handed out to this goal again —
    /// unless an earlier message was given back and is not handled yet: then the cursor stops
    /// just before that one, and this message may be handed out again later.
    pub async fn ack(mut self) -> Result<InboxMessage, ClientError> {
        self.settled = true;
        let through = state(&self.reader.state).ack_through(self.seq);
        let request = AckRequest {
            goal_id: self.reader.goal,
            through: Some(through),
            ..Default::default()
        };
        if let Err(err) = self.reader.ack(&request).await {
            // Not acknowledged: it is handed out again rather than skipped.
            self.reader.give_back(self.seq, None);
            return Err(err);
        }
        Ok(self.message.clone())
    }
}

impl Goal {
    /// The goal `reply` opened for `agent`, read over `nats` with the agent's request timeout
    /// and send retries.
    pub(crate) fn attach(
        reply: GoalOpenReply,
        agent: AgentId,
        nats: async_nats::Client,
        request_timeout: Duration,
        retries: u32,
    ) -> Self {
        Self {
            id: reply.goal_id,
            subject: reply.subject,
            agent,
            nats,
            request_timeout,
            retries,
            state: SharedState::default(),
        }
    }

    /// The goal id: what a `from_goal_id` names so that answers come to this goal.
    pub fn id(&self) -> GoalId {
        self.id
    }

    /// Its inbox subject, `agent.inbox.<goal_id>` (read through fetch, never subscribed to).
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
            after: None,
        })
        .await
    }

    /// A fetch is retried while no replica answers (a restart), but not hedged: every copy
    /// that reaches a replica would count as one more hand-out of the oldest message towards
    /// its redelivery limit. A held one (`wait_ms`) that gets no reply in time (the replica
    /// holding it went away) is followed by fetches that do not wait.
    async fn fetch_with(&self, mut body: FetchRequest) -> Result<FetchReply, ClientError> {
        let subject = subject::inbox_fetch(&self.agent);
        let mut pause = Duration::from_millis(100);
        let mut attempt = 0;
        loop {
            let held = Duration::from_millis(u64::try_from(body.wait_ms.unwrap_or(0)).unwrap_or(0));
            let timeout = FETCH_ATTEMPT_TIMEOUT.min(self.request_timeout) + held;
            match request_json(&self.nats, &subject, &body, timeout).await {
                Err(RequestFailure::Timeout { .. } | RequestFailure::NoResponders { .. })
                    if attempt < self.retries =>
                {
                    body.wait_ms = None;
                    attempt += 1;
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                }
                outcome => return outcome.map_err(ClientError::from),
            }
        }
    }

    /// Moves the goal's cursor through `through` (a sequence this goal was handed).
    pub async fn ack_through(&self, through: u64) -> Result<AckReply, ClientError> {
        let request = AckRequest {
            goal_id: self.id,
            through: Some(through),
            ..Default::default()
        };
        self.reader().ack(&request).await
    }

    /// Waits up to `wait` for the next message. Returns `None` when none arrived.
    ///
    /// Several deliveries may be held at once (handled concurrently); none is handed out twice
    /// while it is held, and one given back comes first again.
    pub async fn recv(&self, wait: Duration) -> Result<Option<Delivery>, ClientError> {
        let deadline = tokio::time::Instant::now() + wait;
        let not_before = {
            let mut state = state(&self.state);
            match state.refetch.take() {
                Some(not_before) => {
                    state.ahead.clear();
                    Some(not_before)
                }
                None => None,
            }
        };
        // The newest sequence this call fetched (a given-back one past it is read next).
        let mut fetched_through = 0;
        if let Some(Some(not_before)) = not_before {
            tokio::time::sleep_until(not_before.min(deadline)).await;
        }
        loop {
            if let Some(next) = self.next_ahead() {
                return Ok(Some(next));
            }
            let (after, ack_through) = {
                let state = state(&self.state);
                (state.read_after(fetched_through), state.carry())
            };
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let reply = self
                .fetch_with(FetchRequest {
                    goal_id: self.id,
                    max: Some(RECV_AHEAD),
                    wait_ms: Some(
                        i64::try_from(left.as_millis())
                            .unwrap_or(0)
                            .min(i64::try_from(FETCH_WAIT_MAX_MS).unwrap_or(i64::MAX)),
                    ),
                    ack_through,
                    peek: false,
                    after,
                })
                .await?;
            let fetched_any = !reply.messages.is_empty();
            if let Some(last) = reply.messages.last() {
                fetched_through = fetched_through.max(last.seq);
            }
            {
                let mut state = state(&self.state);
                state.passed(reply.cursor);
                state.confirmed(reply.cursor);
                state.ahead.extend(reply.messages);
            }
            if let Some(next) = self.next_ahead() {
                return Ok(Some(next));
            }
            // Everything fetched is being handled already: read past it, while time is left.
            if !fetched_any || tokio::time::Instant::now() >= deadline {
                return Ok(None);
            }
        }
    }

    /// The next fetched message that is not in flight, handed out.
    fn next_ahead(&self) -> Option<Delivery> {
        let mut state = state(&self.state);
        while let Some(next) = state.ahead.pop_front() {
            // Being handled, or handled already (fetched again from the cursor after a
            // message was given back): not handed out twice.
            let done = next.seq <= state.acked && !state.given_back.contains(&next.seq);
            if state.in_flight.contains(&next.seq) || done {
                continue;
            }
            state.handing(next.seq);
            drop(state);
            return Some(self.delivery(next));
        }
        None
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

    /// Sends at once the acks settled by [`Agent::serve`](crate::Agent::serve) that no fetch
    /// has carried yet (it lingers them up to [`ACK_LINGER`]; `serve` flushes before it
    /// returns).
    pub async fn flush_acks(&self) -> Result<(), ClientError> {
        let owed = {
            let state = state(&self.state);
            (state.owed > state.confirmed).then_some(state.owed)
        };
        match owed {
            Some(through) => self.reader().send_ack(through).await,
            None => Ok(()),
        }
    }

    /// Takes every message unread now and acknowledges them (the caller has taken them).
    /// Returns them oldest first.
    pub async fn drain(&self) -> Result<Vec<InboxMessage>, ClientError> {
        {
            let mut state = state(&self.state);
            state.ahead.clear();
            state.refetch = None;
            state.given_back.clear();
            state.in_flight.clear();
        }
        let mut taken = Vec::new();
        let mut last = None;
        loop {
            // Each page after the first acknowledges the one before (taking is the point): a
            // goal holds at most 64 messages, so this ends after one or two pages unless
            // senders keep up.
            let reply = self.fetch(FETCH_MAX, Duration::ZERO, last).await?;
            let more = reply.unread > reply.messages.len() as u64;
            let Some(page_last) = reply.messages.last().map(|m| m.seq) else {
                break;
            };
            taken.extend(reply.messages.into_iter().map(|m| m.message));
            last = Some(page_last);
            if !more {
                break;
            }
        }
        if let Some(last) = last {
            self.ack_through(last).await?;
        }
        Ok(taken)
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
                after: None,
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
