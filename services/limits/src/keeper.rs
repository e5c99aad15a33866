//! One keeper task per limit key on each replica (docs/protocol.md §15, "How leases are
//! kept"). Requests for a key queue up at its keeper, which applies every request waiting at
//! that moment in one batch to the key's [`Ledger`] and writes the result by compare-and-set:
//! one write per batch, however many acquires and releases it holds. An acquire that must wait
//! stays with the keeper until the stored state shows its lease (granted by whichever
//! replica's write freed one), or until its wait ends.
//!
//! **One writer while a key is contended**: a keeper losing compare-and-set rounds sends its
//! batches to the key's writer instead of racing it (`keeper/forward.rs`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use switchboard_proto::limits::{KEEPER_PREFIX, LimitSpec};
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use crate::error::LimitsError;
use crate::ledger::{Held, Ledger, Op, Outcome};
use crate::store::{Cas, LimitStore, hashed};

mod forward;
use forward::{CONTENDED, FORWARDS_IN_FLIGHT, Returned, expire_forwarded};
pub use forward::{Forward, Forwarded};

/// Compare-and-set attempts per batch before its requests are answered `conflict`.
const CAS_ATTEMPTS: u32 = 32;
/// Most requests applied in one batch.
pub(crate) const BATCH_MAX: usize = 512;
/// Requests queued at one keeper before more are refused `unavailable` (the replica is
/// overwhelmed; another may answer).
const QUEUE_MAX: usize = 8_192;
/// A keeper with nothing waiting stops after this long without a request.
const IDLE: Duration = Duration::from_secs(60);
/// While other replicas send it a key's batches, the writer waits this long for more requests
/// before it writes a batch smaller than [`LINGER_BATCH`].
const LINGER: Duration = Duration::from_micros(500);
/// See [`LINGER`].
const LINGER_BATCH: usize = 64;
/// The writer lingers only after a batch of at least this many requests.
const LINGER_LOAD: usize = 8;

/// Ms since the Unix epoch, the clock every replica's leases are written in.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// An op's outcome and the state's revision it was judged at.
type Judged = Result<(Outcome, u64), LimitsError>;
/// Where a job's [`Judged`] goes.
type Answer = oneshot::Sender<Judged>;

/// A request for a keeper.
struct Job {
    spec: LimitSpec,
    op: Op,
    answer: Answer,
    /// Sent by another replica: written here, and answered `Waiting` at once if it waits (the
    /// sender holds the wait).
    forwarded: bool,
    /// A forwarded job is applied only until then (ms since the epoch; the sender writes it
    /// itself after that); `u64::MAX` for this replica's own.
    not_after_ms: u64,
}

enum Msg {
    Job(Job),
    /// The operator changed the key's limit: waiting acquires are judged by the new one now.
    Spec(LimitSpec),
    /// A replica (maybe this one) wrote the key's state: its bytes, decoded only when newer
    /// than what the keeper holds.
    Changed(bytes::Bytes, u64),
}

/// An acquire waiting for its lease, with every copy of its request (a client may send a
/// request again while the first waits: each copy gets the same answer).
struct Waiter {
    agent: switchboard_proto::AgentId,
    deadline_ms: u64,
    /// The revision that queued it: an older state does not show it yet.
    after: u64,
    answers: Vec<Answer>,
}

impl Waiter {
    fn answer(self, outcome: &Judged) {
        for answer in self.answers {
            let _ = answer.send(outcome.clone());
        }
    }
}

/// The keepers of one replica, by hashed key.
#[derive(Debug, Clone)]
pub struct Keepers {
    store: LimitStore,
    client: async_nats::Client,
    /// This replica's id: the name its writes carry and the tail of its forwarding subject.
    me: Arc<str>,
    running: Arc<Mutex<HashMap<String, mpsc::Sender<Msg>>>>,
}

fn stopped() -> LimitsError {
    LimitsError::Unavailable("the key's keeper stopped".to_owned())
}

impl Keepers {
    /// Keepers over `store`, forwarding contended keys' batches over `client`.
    pub fn new(store: LimitStore, client: async_nats::Client) -> Self {
        Self {
            store,
            client,
            me: switchboard_proto::new_id().simple().to_string().into(),
            running: Arc::default(),
        }
    }

    /// The subject other replicas forward batches to this one on.
    pub fn subject(&self) -> String {
        format!("{KEEPER_PREFIX}.{}", self.me)
    }

    /// Applies `op` to `spec`'s key and answers what it came to; an acquire that waits answers
    /// when it is granted or its wait ends.
    pub async fn submit(&self, spec: LimitSpec, op: Op) -> Result<Outcome, LimitsError> {
        let outcome = self.enqueue(spec, op, false)?;
        outcome
            .await
            .unwrap_or_else(|_| Err(stopped()))
            .map(|(outcome, _)| outcome)
    }

    fn enqueue(
        &self,
        spec: LimitSpec,
        op: Op,
        forwarded: bool,
    ) -> Result<oneshot::Receiver<Judged>, LimitsError> {
        let (answer, outcome) = oneshot::channel();
        let mut job = Job {
            spec,
            op,
            answer,
            forwarded,
            not_after_ms: u64::MAX,
        };
        for _ in 0..2 {
            let sender = self.keeper(&job.spec.key);
            match sender.try_send(Msg::Job(job)) {
                Ok(()) => return Ok(outcome),
                Err(mpsc::error::TrySendError::Full(_)) => {
                    return Err(LimitsError::Unavailable(
                        "this replica has too many requests queued for the key; retry".to_owned(),
                    ));
                }
                // It stopped (idle) a moment ago: start another.
                Err(mpsc::error::TrySendError::Closed(message)) => {
                    let Msg::Job(back) = message else { break };
                    self.forget(&back.spec.key);
                    job = back;
                }
            }
        }
        Err(stopped())
    }

    /// Tells the key's keeper, if it runs here, what another replica wrote.
    pub fn changed(&self, hashed_key: &str, value: bytes::Bytes, revision: u64) {
        let sender = self
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(hashed_key)
            .cloned();
        if let Some(sender) = sender {
            // A full queue drops it: the keeper reads the store before its next write anyway.
            let _ = sender.try_send(Msg::Changed(value, revision));
        }
    }

    /// Tells the key's keeper, if it runs here, that its limit changed.
    pub fn spec_changed(&self, spec: &LimitSpec) {
        let sender = self
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&hashed(&spec.key))
            .cloned();
        if let Some(sender) = sender {
            let _ = sender.try_send(Msg::Spec(spec.clone()));
        }
    }

    fn keeper(&self, key: &str) -> mpsc::Sender<Msg> {
        let h = hashed(key);
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(sender) = running.get(&h).filter(|s| !s.is_closed()) {
            return sender.clone();
        }
        let (sender, receiver) = mpsc::channel(QUEUE_MAX);
        running.insert(h, sender.clone());
        let (returns, returned) = mpsc::unbounded_channel();
        let keeper = Keeper {
            key: key.to_owned(),
            store: self.store.clone(),
            client: self.client.clone(),
            me: Arc::clone(&self.me),
            spec: None,
            cached: None,
            waiters: HashMap::new(),
            contended_until_ms: 0,
            returns,
            in_flight: 0,
            writing_for_others_until_ms: 0,
            last_batch: 0,
        };
        tokio::spawn(keeper.run(receiver, returned));
        sender
    }

    fn forget(&self, key: &str) {
        let h = hashed(key);
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        if running.get(&h).is_some_and(mpsc::Sender::is_closed) {
            running.remove(&h);
        }
    }
}

struct Keeper {
    key: String,
    store: LimitStore,
    client: async_nats::Client,
    me: Arc<str>,
    spec: Option<LimitSpec>,
    cached: Option<(Ledger, u64)>,
    waiters: HashMap<Uuid, Waiter>,
    /// Until when this key counts as contended here (ms since the epoch).
    contended_until_ms: u64,
    /// Where batches sent to the writer come back (bounded by [`FORWARDS_IN_FLIGHT`]).
    returns: mpsc::UnboundedSender<Returned>,
    /// Batches at the writer now.
    in_flight: usize,
    /// Until when this replica counts as the writer others send a contended key's batches to.
    writing_for_others_until_ms: u64,
    /// Requests in the last batch.
    last_batch: usize,
}

impl Keeper {
    async fn run(
        mut self,
        mut inbox: mpsc::Receiver<Msg>,
        mut returned: mpsc::UnboundedReceiver<Returned>,
    ) {
        loop {
            let wake = self.next_wake();
            let first = tokio::select! {
                biased;
                Some(back) = returned.recv() => {
                    self.came_back(back).await;
                    self.resolve_waiters();
                    continue;
                }
                message = inbox.recv(), if self.in_flight < FORWARDS_IN_FLIGHT => match message {
                    Some(message) => Some(message),
                    None => return,
                },
                () = tokio::time::sleep(wake) => None,
            };
            if first.is_none() && self.waiters.is_empty() && self.in_flight == 0 && wake >= IDLE {
                inbox.close();
                // Answer whatever raced in before the close.
                while let Ok(message) = inbox.try_recv() {
                    self.take(message, &mut Vec::new());
                }
                return;
            }
            let mut jobs = Vec::new();
            if let Some(message) = first {
                self.take(message, &mut jobs);
            }
            // At the most batches at the writer, a timer's wake takes no new request.
            if self.in_flight < FORWARDS_IN_FLIGHT {
                self.drain(&mut inbox, &mut jobs);
            }
            // The writer of a contended key under load gathers a little longer: fewer, larger
            // writes. (Not for a trickle: its last batch was small.)
            if !jobs.is_empty()
                && jobs.len() < LINGER_BATCH
                && self.last_batch >= LINGER_LOAD
                && now_ms() < self.writing_for_others_until_ms
            {
                tokio::time::sleep(LINGER).await;
                self.drain(&mut inbox, &mut jobs);
            }
            self.last_batch = jobs.len();
            self.withdraw_due(&mut jobs);
            let tick = jobs.is_empty() && !self.waiters.is_empty();
            if !jobs.is_empty() || tick {
                self.cycle(jobs, tick).await;
            }
            self.resolve_waiters();
        }
    }

    fn drain(&mut self, inbox: &mut mpsc::Receiver<Msg>, jobs: &mut Vec<Job>) {
        while jobs.len() < BATCH_MAX {
            match inbox.try_recv() {
                Ok(message) => self.take(message, jobs),
                Err(_) => break,
            }
        }
    }

    /// How long until something is due: a wait ending, or the state changing by time while an
    /// acquire waits here; [`IDLE`] when nothing waits.
    fn next_wake(&self) -> Duration {
        if self.waiters.is_empty() {
            return IDLE;
        }
        let now = now_ms();
        let deadline = self
            .waiters
            .values()
            .map(|w| w.deadline_ms.saturating_sub(now))
            .min()
            .unwrap_or(0);
        let change = match (&self.cached, &self.spec) {
            (Some((ledger, _)), Some(spec)) => ledger.next_change(spec, now).unwrap_or(u64::MAX),
            _ => 0,
        };
        Duration::from_millis(deadline.min(change).max(1))
    }

    fn take(&mut self, message: Msg, jobs: &mut Vec<Job>) {
        match message {
            Msg::Job(job) => {
                if job.forwarded {
                    self.writing_for_others_until_ms = now_ms() + CONTENDED.as_millis() as u64;
                }
                self.spec = Some(job.spec.clone());
                jobs.push(job);
            }
            Msg::Spec(spec) => self.spec = Some(spec),
            Msg::Changed(value, revision) => {
                if self
                    .cached
                    .as_ref()
                    .is_none_or(|(_, seen)| revision > *seen)
                {
                    // A purge (the limit deleted) or an undecodable value reads as empty.
                    let ledger = serde_json::from_slice(&value).unwrap_or_default();
                    self.cached = Some((ledger, revision));
                }
            }
        }
    }

    /// Waiters whose wait has ended are withdrawn (granted, if the state already shows it).
    fn withdraw_due(&mut self, jobs: &mut Vec<Job>) {
        let now = now_ms();
        let due: Vec<Uuid> = self
            .waiters
            .iter()
            .filter(|(_, w)| w.deadline_ms <= now)
            .map(|(id, _)| *id)
            .collect();
        let Some(spec) = self.spec.clone() else {
            return;
        };
        for id in due {
            if let Some(mut waiter) = self.waiters.remove(&id) {
                let Some(answer) = waiter.answers.pop() else {
                    continue;
                };
                // The other copies get what the withdraw comes to, as a waiter of its own
                // that the state resolves (granted, or no longer waiting) right after.
                if !waiter.answers.is_empty() {
                    self.waiters.insert(
                        id,
                        Waiter {
                            agent: waiter.agent.clone(),
                            deadline_ms: u64::MAX,
                            after: waiter.after,
                            answers: waiter.answers,
                        },
                    );
                }
                jobs.push(Job {
                    spec: spec.clone(),
                    op: Op::Withdraw {
                        id,
                        agent: waiter.agent,
                    },
                    answer,
                    forwarded: false,
                    not_after_ms: u64::MAX,
                });
            }
        }
    }

    /// Applies `jobs` (none: a tick that settles the queue): sends them to the key's writer
    /// while the key is contended here, else writes them here.
    async fn cycle(&mut self, jobs: Vec<Job>, tick: bool) {
        // Another replica's batch is written here, never sent on (see the module doc).
        let forwardable = !jobs.is_empty() && !jobs.iter().any(|job| job.forwarded);
        if forwardable
            && let Some(writer) = self
                .cached
                .as_ref()
                .and_then(|(ledger, _)| self.writer_to_forward_to(ledger))
        {
            self.send_on(writer, jobs);
            return;
        }
        self.write_here(jobs, tick, forwardable).await;
    }

    /// Writes `jobs` here, reading the state again after a lost race (and sending them to the
    /// winner instead, when `forwardable` and it is the key's writer); then answers each job
    /// or keeps it waiting.
    async fn write_here(&mut self, mut jobs: Vec<Job>, tick: bool, forwardable: bool) {
        let Some(spec) = jobs
            .last()
            .map(|job| job.spec.clone())
            .or_else(|| self.spec.clone())
        else {
            return;
        };
        let mut ops: Vec<Op> = jobs.iter().map(|job| job.op.clone()).collect();
        let mut attempt = 0;
        let written = loop {
            // Another replica's requests past their time are its own to write now: never both.
            if expire_forwarded(&mut jobs) {
                ops = jobs.iter().map(|job| job.op.clone()).collect();
                if jobs.is_empty() && !tick {
                    return;
                }
            }
            let (mut ledger, mut revision) = match self.cached.take() {
                Some(cached) if attempt == 0 => cached,
                _ => match self.store.state(&self.key).await {
                    Ok(read) => read,
                    Err(err) => break Err(LimitsError::Store(err.to_string())),
                },
            };
            if forwardable && attempt > 0 {
                if let Some(writer) = self.writer_to_forward_to(&ledger) {
                    self.cached = Some((ledger, revision));
                    self.send_on(writer, jobs);
                    return;
                }
                // The winner is not one to send to: wait as after any lost round, read again.
                switchboard_runtime::store::cas_backoff(attempt).await;
                (ledger, revision) = match self.store.state(&self.key).await {
                    Ok(read) => read,
                    Err(err) => break Err(LimitsError::Store(err.to_string())),
                };
            }
            // A tick writes only what time changed: the state before, to compare.
            let before = tick.then(|| (ledger.leases.clone(), ledger.queue.clone()));
            let outcomes = ledger.apply(&spec, &ops, now_ms());
            if before
                .is_some_and(|(leases, queue)| leases == ledger.leases && queue == ledger.queue)
            {
                self.cached = Some((ledger, revision));
                return;
            }
            ledger.writer = Some(self.me.to_string());
            match self.store.put_state(&self.key, &ledger, revision).await {
                Ok(Cas::Done(revision)) => break Ok((ledger, revision, outcomes)),
                Ok(Cas::Lost) => {
                    attempt += 1;
                    if attempt >= CAS_ATTEMPTS {
                        break Err(LimitsError::Conflict(self.key.clone()));
                    }
                    self.contended_until_ms = now_ms() + CONTENDED.as_millis() as u64;
                    // The next round reads the winner's state, and may send the batch to it
                    // (it waits there otherwise).
                    if !forwardable {
                        switchboard_runtime::store::cas_backoff(attempt).await;
                    }
                }
                Err(err) => break Err(LimitsError::Store(err.to_string())),
            }
        };
        match written {
            Ok((ledger, revision, outcomes)) => {
                self.cached = Some((ledger, revision));
                for (job, outcome) in jobs.into_iter().zip(outcomes) {
                    self.answer(job, outcome, revision);
                }
            }
            Err(err) => {
                for job in jobs {
                    let _ = job.answer.send(Err(err.clone()));
                }
            }
        }
    }

    fn answer(&mut self, job: Job, outcome: Outcome, revision: u64) {
        match (outcome, job.op) {
            (
                Outcome::Waiting,
                Op::Acquire {
                    id,
                    agent,
                    deadline_ms,
                    ..
                },
            ) if !job.forwarded => {
                let waiter = self.waiters.entry(id).or_insert_with(|| Waiter {
                    agent,
                    deadline_ms,
                    after: revision,
                    answers: Vec::new(),
                });
                waiter.after = waiter.after.max(revision);
                waiter.answers.push(job.answer);
            }
            (outcome, _) => {
                let _ = job.answer.send(Ok((outcome, revision)));
            }
        }
    }

    /// Answers the waiters the state now shows granted, or no longer waiting (withdrawn by
    /// their agent's release, or pruned at their deadline by another replica).
    fn resolve_waiters(&mut self) {
        let Some((ledger, revision)) = &self.cached else {
            return;
        };
        let granted: HashMap<Uuid, &Held> = ledger.leases.iter().map(|l| (l.id, l)).collect();
        let done: Vec<Uuid> = self
            .waiters
            .iter()
            .filter(|(_, waiter)| waiter.after <= *revision)
            .map(|(id, _)| id)
            .filter(|id| granted.contains_key(id) || !ledger.queue.iter().any(|t| t.id == **id))
            .copied()
            .collect();
        for id in done {
            let Some(waiter) = self.waiters.remove(&id) else {
                continue;
            };
            let outcome = match granted.get(&id) {
                Some(lease) => Outcome::Granted((*lease).clone()),
                None => Outcome::Limited {
                    why: format!("the acquire on `{}` was withdrawn", self.key),
                    retry_after_ms: 0,
                },
            };
            waiter.answer(&Ok((outcome, *revision)));
        }
    }
}
