//! The correlator: its parts, the waiting calls this replica holds (and the in-process
//! hand-over of an answer to one of them), and the two writes the call rules
//! ([`crate::calls`]) and the deadline sweep ([`crate::sweep`]) share — a call event, and a
//! message into the caller goal's inbox.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use async_nats::Client;
use async_nats::jetstream;
use switchboard_delivery::door::{Address, Door, Letter, Origin};
use switchboard_proto::call::{CallAnswer, CallEvent, CallEventKind, PendingCall};
use switchboard_proto::{AgentId, InboxMessage, new_id, subject, timestamp};
use switchboard_runtime::publish::publish_event;
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use crate::config::CorrelatorConfig;
use crate::error::CorrelatorError;
use crate::store::{CallEntry, CallStore};

/// How long a replier waits for the waiting replica to take an answer.
pub(crate) const HANDOVER_TIMEOUT: Duration = Duration::from_secs(2);

/// An answer handed over in process, and where to say it was taken.
#[derive(Debug)]
pub(crate) struct LocalAnswer {
    pub(crate) answer: CallAnswer,
    pub(crate) taken: oneshot::Sender<()>,
}

/// A waiting call this replica holds: where its answer goes — one wait per attempt held here,
/// as a caller's retry may wait beside its first attempt, and each gets the answer — and the
/// call as this replica stored it (a reply taken here tries its claim on that revision before
/// reading the call).
#[derive(Debug, Clone)]
pub(crate) struct Held {
    pub(crate) waits: Vec<(u64, mpsc::Sender<LocalAnswer>)>,
    pub(crate) stored: CallEntry,
}

/// Tells the waits of one call apart.
static NEXT_WAIT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Adds a wait for `stored`'s answer to `waiting`; the guard takes it out again.
pub(crate) fn hold<'w>(
    waiting: &'w Waiting,
    stored: &CallEntry,
    answer_to: mpsc::Sender<LocalAnswer>,
) -> WaitingGuard<'w> {
    let id = stored.call.correlation_id;
    let token = NEXT_WAIT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut held = waiting.lock().unwrap_or_else(PoisonError::into_inner);
    let held = held.entry(id).or_insert_with(|| Held {
        waits: Vec::new(),
        stored: stored.clone(),
    });
    if stored.revision > held.stored.revision {
        held.stored = stored.clone();
    }
    held.waits.push((token, answer_to));
    WaitingGuard { waiting, id, token }
}

/// The waiting calls this replica holds, by correlation id.
pub(crate) type Waiting = Mutex<HashMap<Uuid, Held>>;

/// A caller's place among its waiting calls on this replica: a waiting call is counted against
/// `max_open_calls` here, in memory, not in the open-call index (docs/protocol.md section 9).
pub(crate) type Slot = switchboard_runtime::places::Place<AgentId>;

/// How the replica that handed an answer over is told it was taken.
pub(crate) enum Taken {
    /// In process.
    Here(oneshot::Sender<()>),
    /// By replying `taken` to the hand-over request (when it asked for a reply).
    Nats(Option<async_nats::Subject>),
}

/// Removes a wait from [`Correlator::waiting`] when it ends, however it ends (and the call
/// with its last wait).
pub(crate) struct WaitingGuard<'a> {
    waiting: &'a Waiting,
    id: Uuid,
    token: u64,
}

impl Drop for WaitingGuard<'_> {
    fn drop(&mut self) {
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(held) = waiting.get_mut(&self.id) {
            held.waits.retain(|(token, _)| *token != self.token);
            if held.waits.is_empty() {
                waiting.remove(&self.id);
            }
        }
    }
}

/// A call event and the subject it is stored under.
fn call_event(event: CallEventKind, call: &PendingCall, body: Option<&str>) -> (String, CallEvent) {
    let payload = CallEvent {
        id: new_id(),
        event,
        correlation_id: call.correlation_id,
        caller: call.caller.clone(),
        callee: call.callee.clone(),
        chain: call.chain.clone(),
        at: timestamp::now(),
        body: body.map(str::to_owned),
    };
    (subject::call_events(event, &call.correlation_id), payload)
}

/// The correlator.
#[derive(Debug)]
pub struct Correlator {
    pub(crate) client: Client,
    pub(crate) js: jetstream::Context,
    pub(crate) store: CallStore,
    pub(crate) config: CorrelatorConfig,
    pub(crate) waiting: Waiting,
    /// The waiting calls each caller has on this replica.
    pub(crate) per_caller: switchboard_runtime::places::Places<AgentId>,
    /// The one door into every inbox: a call's request goes in as the caller's message, its
    /// answer or timeout notice as the correlator's word; its registry view also answers goal
    /// ownership without a read.
    pub(crate) door: Door,
    /// Writes taken off a request's path (events), awaited when the replica stops.
    pub(crate) background: tokio_util::task::TaskTracker,
    /// Places for replies to a call not stored yet, read again while its record may still be
    /// on its way ([`OVERTAKEN_READS`]); past [`OVERTAKEN_WAITERS`], `not_found` at once.
    overtaken: tokio::sync::Semaphore,
    /// Each replier's share of those places ([`OVERTAKEN_PER_REPLIER`]), so one agent replying
    /// to made-up ids cannot take them all from the callees whose replies really overtook.
    overtaken_by: switchboard_runtime::places::Places<AgentId>,
    /// `[budgets]`: the budget a call gets when it names none and draws on no parent's, and
    /// the caps on a new tree.
    pub(crate) budgets: switchboard_runtime::config::BudgetsConfig,
}

/// When a reply names a call with no record, it may have overtaken the record (a call whose
/// record is created beside its request's delivery, docs/protocol.md §9 "Call ids"): the
/// pauses, in milliseconds, before each read again (250 ms in all).
const OVERTAKEN_READS: [u64; 5] = [10, 20, 40, 80, 100];
/// At most this many replies wait for a record at once, so replies naming made-up ids cost
/// their sender 250 ms each and never hold the service's hands.
const OVERTAKEN_WAITERS: usize = 64;
/// At most this many of them from one replier.
const OVERTAKEN_PER_REPLIER: usize = 16;

impl Correlator {
    /// Wires the parts together.
    pub fn new(client: Client, store: CallStore, config: CorrelatorConfig, door: Door) -> Self {
        Self {
            js: jetstream::new(client.clone()),
            client,
            store,
            config,
            waiting: Waiting::default(),
            per_caller: Default::default(),
            door,
            background: tokio_util::task::TaskTracker::new(),
            overtaken: tokio::sync::Semaphore::new(OVERTAKEN_WAITERS),
            overtaken_by: Default::default(),
            budgets: Default::default(),
        }
    }

    /// The same, giving calls that name no budget the configured default (`[budgets]`).
    pub fn with_budgets(mut self, budgets: &switchboard_runtime::config::BudgetsConfig) -> Self {
        self.budgets = budgets.clone();
        self
    }

    /// Publishes a call event into `AGENT_EVENTS` (retried with the same id; the call's state
    /// change is already committed, so a failure is logged, not returned).
    pub(crate) async fn emit(&self, event: CallEventKind, call: &PendingCall, body: Option<&str>) {
        count_call(event.token());
        if event == CallEventKind::Expired
            && let Some(budget) = &call.budget
        {
            switchboard_request::budget::close(&self.client, budget);
        }
        let (subject, payload) = call_event(event, call, body);
        publish_event(&self.js, &subject, &payload.id.to_string(), &payload).await;
    }

    /// Publishes the one `answered` event of a call, stored once however often it is sent
    /// (`Nats-Msg-Id: answered:<correlation_id>`): awaited before the callee's reply is
    /// acknowledged, and sent again by a retried reply, so a replica killed between the answer
    /// and its event loses no event (the callee, unacknowledged, retries).
    pub(crate) async fn emit_answered(&self, call: &PendingCall, body: &str) {
        count_call(CallEventKind::Answered.token());
        // The call ended: what its callee did not spend returns to the tree (§16).
        if let Some(budget) = &call.budget {
            switchboard_request::budget::close(&self.client, budget);
        }
        let (subject, payload) = call_event(CallEventKind::Answered, call, Some(body));
        let once = format!("answered:{}", call.correlation_id);
        publish_event(&self.js, &subject, &once, &payload).await;
    }

    /// Waiting calls this replica holds right now.
    pub fn waiting_now(&self) -> usize {
        self.waiting.lock().map_or(0, |waiting| waiting.len())
    }

    /// Hands `answer` to every wait of its call this replica holds; true once one took it
    /// (false: not here, or they ended meanwhile, and the answer goes the NATS way).
    pub(crate) async fn hand_over_here(&self, answer: &CallAnswer) -> bool {
        let waits: Vec<_> = self
            .waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&answer.correlation_id)
            .map(|held| held.waits.iter().map(|(_, wait)| wait.clone()).collect())
            .unwrap_or_default();
        let mut taken_by = futures::stream::FuturesUnordered::new();
        for wait in waits {
            let (taken, was_taken) = oneshot::channel();
            let handed = LocalAnswer {
                answer: answer.clone(),
                taken,
            };
            if wait.send(handed).await.is_ok() {
                taken_by.push(tokio::time::timeout(HANDOVER_TIMEOUT, was_taken));
            }
        }
        // The first wait to take it answers the reply; the others take it as they come.
        while let Some(took) = futures::StreamExt::next(&mut taken_by).await {
            if matches!(took, Ok(Ok(()))) {
                return true;
            }
        }
        false
    }

    /// Publishes to the caller goal's inbox, de-duplicated per call and purpose — while that
    /// goal is still the caller's: a goal id closed and opened again by another agent gets
    /// nothing of the caller's (the answer stays on the call's record).
    pub(crate) async fn to_caller_inbox(
        &self,
        call: &PendingCall,
        message: &InboxMessage,
        purpose: &str,
    ) -> Result<(), CorrelatorError> {
        if !self.caller_owns_goal(call).await {
            tracing::info!(correlation_id = %call.correlation_id, goal_id = %call.caller_goal, %purpose, "the caller goal is no longer the caller's; nothing written to it");
            return Ok(());
        }
        let purpose = format!("{purpose}:{}", call.correlation_id);
        let letter = Letter {
            to: Address::Goals(call.caller.clone(), vec![call.caller_goal]),
            from_goal: None,
            message: message.clone(),
        };
        let report = self
            .door
            .deliver(Origin::Service { purpose: &purpose }, letter)
            .await
            .map_err(|err| CorrelatorError::PublishToInbox(err.into()))?;
        if report.delivered_to.is_empty() {
            return Err(CorrelatorError::PublishToInbox(
                report.unreachable_reasons.join("; ").into(),
            ));
        }
        Ok(())
    }
}

impl Correlator {
    /// Whether the call's caller goal is still a live goal of its caller (an error reading
    /// it counts as yes: the write goes ahead rather than lose the answer).
    pub(crate) async fn caller_owns_goal(&self, call: &PendingCall) -> bool {
        self.door
            .view()
            .owns_goal(&call.caller, &call.caller_goal)
            .await
            .unwrap_or(true)
    }
}

/// Refuses an answer or a part of one to `call` from anyone but its callee (`not_callee`).
pub(crate) fn check_callee(call: &PendingCall, callee: &AgentId) -> Result<(), CorrelatorError> {
    if call.callee == *callee {
        Ok(())
    } else {
        Err(CorrelatorError::NotCallee {
            callee: call.callee.clone(),
            correlation_id: call.correlation_id,
        })
    }
}

/// The refusal of an answer to `call` after its deadline (`expired`).
pub(crate) fn expired(call: &PendingCall) -> CorrelatorError {
    CorrelatorError::Expired {
        correlation_id: call.correlation_id,
        deadline: call.deadline,
    }
}

impl Correlator {
    /// A place for one more waiting call of `caller` on this replica, or `None` when it has
    /// `max_open_calls` waiting here already.
    pub(crate) fn waiting_slot(&self, caller: &AgentId) -> Option<Slot> {
        self.per_caller.take(caller, self.config.max_open_calls)
    }

    /// The waiting calls `agent` made or must answer that this replica holds (a young waiting
    /// call is in no index: see [`crate::store::INDEX_WAITING_AFTER`]).
    pub(crate) fn held_calls(&self, agent: &AgentId) -> Vec<CallEntry> {
        self.waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .filter(|held| held.stored.call.caller == *agent || held.stored.call.callee == *agent)
            .map(|held| held.stored.clone())
            .collect()
    }

    /// Whether this replica holds the waiting caller of the call.
    pub(crate) fn holds(&self, correlation_id: &Uuid) -> bool {
        self.waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(correlation_id)
    }

    /// The record of a call this replica holds, as it last wrote or read it: a compare-and-set
    /// may start from it without reading the bucket (it fails, and the caller reads, when the
    /// record changed since).
    pub(crate) fn held_record(&self, correlation_id: &Uuid) -> Option<CallEntry> {
        self.waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(correlation_id)
            .map(|held| held.stored.clone())
            // Revision 0: held before its record was stored (a call recorded beside its
            // delivery); a claim on it would create the record, so the reply reads it instead.
            .filter(|stored| stored.revision > 0)
    }

    /// The call's record: `held` when given, else read now — and, when there is none, again
    /// for up to 250 ms while a place is free for `replier` (a reply may overtake the record of
    /// a call created beside its request's delivery); then `not_found`.
    pub(crate) async fn record_of(
        &self,
        replier: &AgentId,
        held: Option<CallEntry>,
        correlation_id: Uuid,
    ) -> Result<CallEntry, CorrelatorError> {
        if let Some(stored) = held {
            return Ok(stored);
        }
        if let Some(stored) = self.store.find(&correlation_id).await? {
            return Ok(stored);
        }
        let Some(_own) = self.overtaken_by.take(replier, OVERTAKEN_PER_REPLIER) else {
            return Err(CorrelatorError::UnknownCall(correlation_id));
        };
        let Ok(_place) = self.overtaken.try_acquire() else {
            return Err(CorrelatorError::UnknownCall(correlation_id));
        };
        for pause in OVERTAKEN_READS {
            tokio::time::sleep(Duration::from_millis(pause)).await;
            if let Some(stored) = self.store.find(&correlation_id).await? {
                return Ok(stored);
            }
        }
        Err(CorrelatorError::UnknownCall(correlation_id))
    }

    /// Remembers `stored` as the latest record of a call this replica holds.
    pub(crate) fn hold_record(&self, stored: &CallEntry) {
        if let Some(held) = self
            .waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_mut(&stored.call.correlation_id)
        {
            held.stored = stored.clone();
        }
    }
}

/// One call opened on `switchboard.calls` (`opened`), by the path it took: `beside` (its record
/// created beside its request's delivery) or `record_first` (docs/protocol.md §9, "Call ids").
pub(crate) fn count_opened(beside: bool) {
    use switchboard_runtime::telemetry::metrics;
    let opening = if beside { "beside" } else { "record_first" };
    metrics::instruments().calls.add(
        1,
        &[
            metrics::service(crate::SPEC.name),
            metrics::KeyValue::new("switchboard.outcome", "opened"),
            metrics::KeyValue::new("switchboard.opening", opening),
        ],
    );
}

/// One call outcome on `switchboard.calls`: the token of the event a call ended with
/// (`answered`, `expired`, `late_answer`, `refused`).
pub(crate) fn count_call(outcome: &'static str) {
    use switchboard_runtime::telemetry::metrics;
    metrics::instruments().calls.add(
        1,
        &[
            metrics::service(crate::SPEC.name),
            metrics::KeyValue::new("switchboard.outcome", outcome),
        ],
    );
}
