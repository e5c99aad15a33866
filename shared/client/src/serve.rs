//! [`Agent::serve`]: a handler run on every message of a goal, up to N at once, that survives
//! its handler failing or panicking and stops gracefully — the Rust side of what the Python and
//! TypeScript SDKs' `serve` do (docs/protocol.md §7 for the reading rules it keeps, §9 for the
//! error answer).
//!
//! - **A failing handler never loses its message.** A call is answered at once with
//!   `error = {kind: "handler_error", message: <the error's text>}` (its caller gets the error,
//!   not a timeout); a task is rejected (not taken yet) or failed (taken) with the text as the
//!   reason, so its requester is told; any other message is rejected into the dead letters
//!   with the text as the reason (`switchboard dlq list`, `dlq replay`). A panic counts as a
//!   failure. Then the next message is served.
//! - **Acknowledgements stay cumulative and correct** with many handlers at once: the goal's
//!   cursor passes a message only when every message before it is settled ([`Delivery::ack`]).
//! - **A graceful stop** (the `stop` token): no new message is started, the handlers in
//!   progress finish and are acknowledged, then `serve` returns. The goal stays open: close it
//!   (and deregister) when the agent is done for good; keep it, and a restarted agent that opens
//!   the same named goal ([`Agent::open_named_goal`]) reads what came meanwhile.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use switchboard_proto::{GoalId, InboxMessage, MessageKind, TaskState};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::Agent;
use crate::error::ClientError;
use crate::goal::{Delivery, Goal};

/// What a failing handler's call is answered with (`error.kind`), in every SDK.
pub const HANDLER_ERROR: &str = "handler_error";

/// How [`Agent::serve`] reads.
#[derive(Debug, Clone, Copy)]
pub struct ServeOptions {
    /// How many messages are handled at once (at least 1).
    pub max_concurrent: usize,
    /// How long one read waits for a message before it looks at the stop token again.
    pub wait: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            max_concurrent: 1,
            wait: Duration::from_secs(1),
        }
    }
}

/// What one [`Agent::serve`] did, when it returned.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Served {
    /// Messages whose handler succeeded (acknowledged).
    pub handled: u64,
    /// Calls whose handler failed, answered with a `handler_error` (acknowledged).
    pub answered_with_error: u64,
    /// Tasks whose handler failed, rejected or failed for their requester (acknowledged).
    pub tasks_ended: u64,
    /// Other messages whose handler failed, rejected into the dead letters.
    pub rejected: u64,
}

/// How one message's handling ended.
enum Outcome {
    Handled,
    Answered,
    TaskEnded,
    Rejected,
    /// Not settled (the fabric could not take the ack, answer or reject): given back, so it
    /// is handed out again.
    GivenBack,
}

impl Agent {
    /// Runs `handler` on every message of `goal` until `stop` is cancelled, up to
    /// `options.max_concurrent` at once, each in the span of its delivery (its replies, calls
    /// and sends join the sender's trace) and, for a call, as the handling of that call (calls
    /// it makes name it as their parent). `Ok(())` acknowledges the message (the ack rides on
    /// the loop's next fetch, or goes on its own after [`ACK_LINGER`](crate::ACK_LINGER):
    /// a busy goal's acks cost no request of their own); `Err(text)` or a
    /// panic answers a call with a `handler_error`, rejects or fails a task for its requester,
    /// or rejects any other message into the dead letters, and the loop goes on. The handler replies to calls itself
    /// ([`Agent::reply`]); it gets the message, and reaches the agent through its own `Arc`.
    ///
    /// Returns once `stop` is cancelled and every handler in progress has finished and been
    /// settled; an error only when the goal cannot be read (closed, or not this agent's).
    pub async fn serve<F, Fut>(
        self: &Arc<Self>,
        goal: &Goal,
        stop: CancellationToken,
        options: ServeOptions,
        handler: F,
    ) -> Result<Served, ClientError>
    where
        F: Fn(InboxMessage) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), String>> + Send + 'static,
    {
        let handler = Arc::new(handler);
        let slots = Arc::new(Semaphore::new(options.max_concurrent.max(1)));
        let mut running: JoinSet<Outcome> = JoinSet::new();
        let mut served = Served::default();
        let read = async {
            loop {
                let slot = tokio::select! {
                    () = stop.cancelled() => return Ok(()),
                    slot = Arc::clone(&slots).acquire_owned() => slot,
                };
                let Ok(slot) = slot else { return Ok(()) };
                // A delivery read as the stop comes is dropped, which gives it back.
                let delivery = tokio::select! {
                    () = stop.cancelled() => return Ok(()),
                    next = goal.recv(options.wait) => next?,
                };
                let Some(delivery) = delivery else { continue };
                let agent = Arc::clone(self);
                let handler = Arc::clone(&handler);
                let goal_id = goal.id();
                running.spawn(async move {
                    let outcome = handle(&agent, goal_id, delivery, handler.as_ref()).await;
                    drop(slot);
                    outcome
                });
                // Count what finished meanwhile (the set must not grow without bound).
                while let Some(done) = running.try_join_next() {
                    count(&mut served, done);
                }
            }
        };
        let read: Result<(), ClientError> = read.await;
        // The graceful end: every handler in progress finishes and is settled, and every ack
        // still lingering is sent.
        while let Some(done) = running.join_next().await {
            count(&mut served, done);
        }
        if let Err(err) = goal.flush_acks().await {
            tracing::warn!(error = %err, "the last acks were not taken; their messages may come again");
        }
        read.map(|()| served)
    }
}

fn count(served: &mut Served, done: Result<Outcome, tokio::task::JoinError>) {
    match done {
        Ok(Outcome::Handled) => served.handled += 1,
        Ok(Outcome::Answered) => served.answered_with_error += 1,
        Ok(Outcome::TaskEnded) => served.tasks_ended += 1,
        Ok(Outcome::Rejected) => served.rejected += 1,
        // The settling task itself cannot panic (the handler runs in a task of its own);
        // given back, the message comes again.
        Ok(Outcome::GivenBack) | Err(_) => {}
    }
}

/// Runs the handler on one delivery in a task of its own (a panic is caught there) and
/// settles the delivery by how it ended.
async fn handle<F, Fut>(
    agent: &Arc<Agent>,
    goal: GoalId,
    delivery: Delivery,
    handler: &F,
) -> Outcome
where
    F: Fn(InboxMessage) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), String>> + Send + 'static,
{
    let span = delivery.span();
    let message = delivery.message.clone();
    let call = message
        .correlation_id
        .filter(|_| message.kind == MessageKind::Request);
    let work = handler(message);
    let work = async move {
        match call {
            Some(correlation_id) => crate::serving(correlation_id, work).await,
            None => work.await,
        }
    };
    let ended = tokio::spawn(work.instrument(span.clone())).await;
    let failure = match ended {
        Ok(Ok(())) => None,
        Ok(Err(text)) => Some(text),
        Err(join) => Some(panic_text(join)),
    };
    let Some(text) = failure else {
        // Its ack rides on the read loop's next fetch (or goes on its own shortly).
        delivery.ack_soon();
        return Outcome::Handled;
    };
    let text: String = text
        .chars()
        .take(switchboard_proto::call::REPLY_ERROR_MESSAGE_MAX)
        .collect();
    let text = if text.is_empty() {
        "the handler failed".to_owned()
    } else {
        text
    };
    tracing::warn!(parent: &span, error = %text, seq = delivery.seq, "the handler failed");
    if let Some(task) = delivery
        .message
        .task
        .as_ref()
        .filter(|_| delivery.message.kind == MessageKind::Task)
        .map(|task| task.id)
    {
        // The requester is told: the task is rejected (not taken yet) or failed (taken).
        if end_task(agent, goal, task, &text)
            .instrument(span.clone())
            .await
        {
            return match delivery.ack().instrument(span).await {
                Ok(_) => Outcome::TaskEnded,
                Err(_) => Outcome::GivenBack,
            };
        }
    }
    if let Some(correlation_id) = call {
        match agent
            .reply_error(correlation_id, HANDLER_ERROR, &text)
            .instrument(span.clone())
            .await
        {
            // Answered, or nobody waits any more (the call expired or was answered already):
            // the message is done.
            Ok(_) => {
                return match delivery.ack().instrument(span).await {
                    Ok(_) => Outcome::Answered,
                    Err(_) => Outcome::GivenBack,
                };
            }
            Err(err) if call_is_over(&err) => {
                return match delivery.ack().instrument(span).await {
                    Ok(_) => Outcome::Answered,
                    Err(_) => Outcome::GivenBack,
                };
            }
            Err(err) => {
                tracing::warn!(parent: &span, error = %err, "the error answer failed; rejecting the call");
            }
        }
    }
    match delivery.reject(&text).instrument(span).await {
        Ok(()) => Outcome::Rejected,
        Err(_) => Outcome::GivenBack,
    }
}

/// Ends task `task` whose handler failed with `text`, in `goal`: rejected while still
/// submitted, failed once taken (started first when only accepted or waiting for input: the
/// state machine fails only working tasks), left alone when it ended already. `false` when
/// that could not be done — the task is gone, it is not this agent's, another goal of this
/// agent took it — and the message is then rejected into the dead letters as any other.
async fn end_task(agent: &Agent, goal: GoalId, task: uuid::Uuid, text: &str) -> bool {
    let Ok(record) = agent.get_task(task).await else {
        return false;
    };
    if record.assignee != *agent.id() {
        return false;
    }
    let ended = match record.state {
        state if state.is_terminal() => return true,
        TaskState::Submitted => agent.reject_task(task, text).await,
        // Another goal of this agent took it: its work is that goal's to end.
        _ if record.assignee_goal.is_some_and(|taker| taker != goal) => return false,
        TaskState::Working => agent.fail_task(task, text).await,
        _ => match agent.start_task(task).await {
            Ok(_) => agent.fail_task(task, text).await,
            Err(err) => Err(err),
        },
    };
    match ended {
        Ok(_) => true,
        // Ended meanwhile (canceled, or its deadline passed): nothing left to tell.
        Err(err) => matches!(
            err.kind(),
            Some(
                switchboard_proto::ErrorKind::TaskTerminal | switchboard_proto::ErrorKind::Expired
            )
        ),
    }
}

/// Whether an error answer's refusal says the call needs no answer any more: its deadline
/// passed, it is unknown (ended long ago), or it was answered already.
fn call_is_over(err: &ClientError) -> bool {
    use switchboard_proto::ErrorKind;
    matches!(
        err.kind(),
        Some(ErrorKind::Expired | ErrorKind::NotFound | ErrorKind::Conflict)
    )
}

/// The text of a panic (its message when it was a string), for the caller or the dead letter.
fn panic_text(join: tokio::task::JoinError) -> String {
    if !join.is_panic() {
        return "the handler was cancelled".to_owned();
    }
    let payload = join.into_panic();
    let text = payload
        .downcast_ref::<&str>()
        .map(|text| (*text).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    format!("the handler panicked: {text}")
}
