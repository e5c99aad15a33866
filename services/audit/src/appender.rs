//! Appending: following the source streams and appending each source message's record,
//! chained, to `AGENT_AUDIT`.
//!
//! Durable pull consumers on `AGENT_INBOX` and `AGENT_EVENTS` (explicit ack) feed one
//! appender per replica. The appender turns each source message into a record, chains it on
//! the record it sent before (each body names the hash of the record before it; the body's
//! SHA-256 travels in the `Switchboard-Audit-Hash` header), and publishes it on its own subject
//! `_SB.audit.records.<writer>` with `Nats-Expected-Last-Sequence` = the sequence it must
//! follow, and, when the record before it is its own, `Nats-Expected-Last-Subject-Sequence` =
//! that record's sequence, and `Nats-Msg-Id` = its event id.
//! The chain fixes every record's sequence in advance, so the appender does not wait for the
//! stream's acks of the records before: up to a window of publishes are in flight. Records are
//! sent in runs (up to [`MARK_EVERY`], or what came within [`LINGER`]; one record per run on a
//! clustered stream, see [`run_max`]) and only the last of a run asks for an ack: each record after the first of a run is stored only right after this
//! writer's record before it (the expected last sequence and subject sequence), so the last
//! one stored where it belongs proves every record of its run stored, and a run that fails
//! anywhere fails at its last record (issue 25, round three: one ack per run instead of one per
//! record). The acks are read in order; stored records go to the indexer (`indexer.rs`) in
//! batches, and a source message is acknowledged only after its record is stored and indexed
//! (one cumulative ack per indexed batch). Records are not stored as ADR-50 atomic batches: measured on nats-server
//! 2.15, a batch costs the server about 1 ms of CPU more than its records published one by one
//! (docs/performance.md, "The data path").
//!
//! Exactly once: an event id already in the index is acknowledged without a second record; one
//! whose record is on its way (published, not yet indexed) waits for it. The appender chains
//! on a head it knows: the index head (everything up to it is indexed) followed by its own
//! records on their way, so every record it stores was checked against every record before it.
//! When another replica appended meanwhile (or a publish failed), the expected-sequence check
//! fails: the appender collects every publish still on its way, reads what it missed into the
//! index (so the duplicate check sees it), and sends the sources not yet stored again. So
//! redeliveries, restarts and several replicas never write a record twice, and the chain has
//! one order.

use std::collections::VecDeque;
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_nats::header::{
    NATS_EXPECTED_LAST_SEQUENCE, NATS_EXPECTED_LAST_SUBJECT_SEQUENCE, NATS_MESSAGE_ID,
};
use async_nats::jetstream;
use async_nats::jetstream::context::PublishError;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::publish::PublishAck;
use bytes::Bytes;
use futures::FutureExt;
use switchboard_proto::audit::{AuditEntry, HEADER_AUDIT_HASH};
use switchboard_proto::{EVENTS_STREAM, INBOX_STREAM};
use tokio::sync::{MutexGuard, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::error::AuditError;
use crate::indexer::{Committed, IndexJob, Shared, index_stored};
use crate::record;
use crate::store::{self, Source};
use crate::trail::{Head, IngestSettings, Trail};

/// Recoveries in a row (each: collect, catch up, send again) without a record stored before
/// the sources waiting are given up (they come back after the ack wait).
const APPEND_ATTEMPTS: usize = 16;
/// Publishes in flight per `batch` of the config (the window is 4 × `batch`, at most 4,000:
/// the JetStream client allows 5,000 publishes awaiting their ack).
const WINDOW_BATCHES: usize = 4;
/// Stored batches waiting for the indexer (beyond the one it is inserting) before the appender
/// waits for it.
const INDEX_QUEUE: usize = 4;
/// The pause after a recovery that could not reach the stream, before the appender goes on.
const RECOVERY_PAUSE: Duration = Duration::from_millis(250);
/// How long stored records wait, once nothing is in flight, before they are indexed and their
/// sources acknowledged: a trickle of calls shares an index transaction and an ack, and the
/// audit floor (below which an inbox may purge read messages, `room.rs`) lags by no more.
const INDEX_PAUSE: Duration = Duration::from_millis(3);
/// How long a record waits for others to share its run's ack when sources come one by one
/// (a trickle of calls): the trail lags by at most this more.
const LINGER: Duration = Duration::from_millis(10);
/// Records in a run at most: a run is sent as soon as it has this many.
const MARK_EVERY: usize = 64;
/// How long one record's publish may wait for the connection (it waits while the client
/// reconnects): past it the record is not sent, and its run fails and is recovered.
const SEND_TIMEOUT: Duration = Duration::from_secs(5);

/// Feeds the appender from the durable consumers and runs it until `stop`; also catches up
/// with other replicas' records every `catch_up_every`.
pub(crate) async fn write(
    trail: Arc<Trail>,
    js: jetstream::Context,
    settings: IngestSettings,
    shutdown: CancellationToken,
) -> Result<(), AuditError> {
    let IngestSettings {
        consumer_prefix,
        batch,
        ack_wait,
        catch_up_every,
        lease_ttl: _,
    } = settings;
    let (tx, mut rx) = mpsc::channel::<Source>(batch * 4);
    let mut feeders = Vec::new();
    for (stream_name, consumer_name) in [
        (INBOX_STREAM, format!("{consumer_prefix}-inbox")),
        (EVENTS_STREAM, format!("{consumer_prefix}-events")),
    ] {
        let consumer =
            store::source_consumer(&js, stream_name, &consumer_name, ack_wait, batch).await?;
        let tx = tx.clone();
        let stop = shutdown.clone();
        feeders.push(tokio::spawn(async move {
            store::feed(consumer, tx, stop).await;
        }));
    }
    drop(tx);
    // The appender owns the head while it writes: queries wait for its indexer instead of
    // reading the stream it is writing (see `Trail::catch_up`).
    let mut head = trail.head.lock().await;
    let (jobs, job_rx) = mpsc::channel(INDEX_QUEUE);
    let shared = Arc::new(Shared::default());
    let indexer = tokio::spawn(index_stored(
        Arc::clone(&trail),
        job_rx,
        Arc::clone(&shared),
    ));
    let mut appender = Appender {
        trail: Arc::clone(&trail),
        subject: switchboard_proto::subject::audit_records_of(&switchboard_proto::new_id()),
        window: (batch * WINDOW_BATCHES).min(4_000),
        batch,
        run_max: run_max(&trail, batch),
        tail: head.clone(),
        client: trail.js.client(),
        run: Vec::new(),
        send_run_at: None,
        sent: VecDeque::new(),
        stored: Vec::new(),
        hand_over_at: None,
        jobs,
        shared,
        fruitless: 0,
    };
    let mut ticker = tokio::time::interval(catch_up_every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The tail at the last catch-up, and when it ran (none yet: the first tick runs one).
    let mut caught_up_at = (u64::MAX, tokio::time::Instant::now());
    loop {
        if appender.shared.index_failed() {
            appender.recover(&mut head, Vec::new(), &shutdown).await;
        }
        let room = appender.sent.len() + appender.run.len() < appender.window;
        let hand_over_at = appender.hand_over_at;
        let send_run_at = appender.send_run_at;
        tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            acked = front_ack(&mut appender.sent), if !appender.sent.is_empty() => {
                appender.settle(&mut head, acked, &shutdown).await;
            }
            () = sleep_until(send_run_at), if send_run_at.is_some() => appender.send_run().await,
            () = sleep_until(hand_over_at), if hand_over_at.is_some() => appender.hand_over().await,
            next = rx.recv(), if room => match next {
                Some(source) => appender.offer(source).await,
                None => break,
            },
            _ = ticker.tick() => {
                // Between bursts only: the catch-up reads from the head, which must be where
                // the last stored record is, and the index must hold everything before it.
                // While the lease holds nobody else appends, so an idle writer catches up
                // once after a burst and then only every `IDLE_CATCH_UP` (to drop index rows
                // the stream aged out): an idle system stays quiet on the wire.
                let idle = appender.tail.seq == caught_up_at.0
                    && caught_up_at.1.elapsed() < IDLE_CATCH_UP;
                if appender.sent.is_empty()
                    && appender.run.is_empty()
                    && !idle
                    && appender.drain().await
                {
                    if let Err(err) = trail.catch_up_locked(&mut head).await {
                        tracing::warn!(error = %err, "audit catch-up failed");
                    }
                    appender.tail = head.clone();
                    caught_up_at = (appender.tail.seq, tokio::time::Instant::now());
                }
            }
        }
    }
    // Stopping: send the run being gathered and collect the acks of what was sent (their
    // sources are acknowledged once indexed), so the index holds every record this replica
    // stored before it lets go.
    appender.send_run().await;
    while !appender.sent.is_empty() {
        let acked = front_ack(&mut appender.sent).await;
        appender.settle(&mut head, acked, &shutdown).await;
    }
    appender.finish_indexing(&mut head).await;
    drop(appender);
    drop(head);
    let _ = indexer.await;
    for feeder in feeders {
        feeder.abort();
    }
    Ok(())
}

/// How often an idle writer (nothing stored since its last catch-up) catches up anyway: it
/// drops the index rows of records the stream has aged out, which is all there is to do while
/// the lease holds.
const IDLE_CATCH_UP: std::time::Duration = std::time::Duration::from_secs(30);

/// Records per run on `trail`'s stream. On a clustered stream (more than one replica) every
/// record is its own run: the stream leader refuses a publish that expects a subject's last
/// sequence while an earlier message on that subject is still being replicated (error 10164),
/// so the second record of a run would always fail and take the run with it.
fn run_max(trail: &Trail, batch: usize) -> usize {
    if trail.stream.cached_info().config.num_replicas > 1 {
        1
    } else {
        MARK_EVERY.min(batch)
    }
}

/// Sleeps until `at` (polled only when there is one).
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The ack of the oldest run in flight (its last record's).
async fn front_ack(sent: &mut VecDeque<Sent>) -> Result<PublishAck, PublishError> {
    match sent.iter_mut().find_map(|sent| sent.ack.as_mut()) {
        Some(ack) => ack.as_mut().await,
        None => std::future::pending().await,
    }
}

type AckFuture = Pin<Box<dyn Future<Output = Result<PublishAck, PublishError>> + Send>>;

/// A record chained on the one before it, to be stored at `seq`.
struct Chained {
    source: Source,
    /// The sequence it must be stored at.
    seq: u64,
    hash: String,
    body: Bytes,
    /// Whether the record before it is this appender's own (then its subject's last sequence
    /// is checked too).
    after_own: bool,
}

/// A record published, waiting for the stream's ack: its own when it is the last of its run,
/// else the run's.
struct Sent {
    record: Chained,
    ack: Option<AckFuture>,
}

/// The writing replica's appender: chains each new source on the record sent before it and
/// keeps up to `window` publishes in flight.
struct Appender {
    trail: Arc<Trail>,
    /// `_SB.audit.records.<writer>`: this appender's own subject, new each time it starts.
    subject: String,
    window: usize,
    batch: usize,
    /// The last record chained (the head when nothing is in flight).
    tail: Head,
    /// The connection the records are published on (the JetStream context's).
    client: async_nats::Client,
    /// Records chained but not sent yet: the run being gathered.
    run: Vec<Chained>,
    /// Records in a run at most (1 on a clustered stream: see [`run_max`]).
    run_max: usize,
    /// When the run is sent if it does not fill up first.
    send_run_at: Option<tokio::time::Instant>,
    /// Records in flight, oldest first.
    sent: VecDeque<Sent>,
    /// Records stored since the last job handed to the indexer.
    stored: Vec<Committed>,
    /// When `stored` goes to the indexer, once nothing is in flight.
    hand_over_at: Option<tokio::time::Instant>,
    jobs: mpsc::Sender<IndexJob>,
    shared: Arc<Shared>,
    /// Recoveries since a record was last stored.
    fruitless: usize,
}

impl Appender {
    /// Takes a source: acknowledges it if its record exists, drops it if its record is on its
    /// way, or sends its record.
    async fn offer(&mut self, source: Source) {
        let id = source.record.id.as_str();
        // `on_way` first: the indexer inserts a row before it forgets the id, so a record is
        // always in one of the two.
        if self.shared.on_way().contains(id) {
            tracing::debug!(id, "source delivered again while its record is on its way");
            return;
        }
        match self.trail.index.has(id) {
            Ok(true) => self.shared.ack_recorded(&source.message).await,
            Ok(false) => self.chain(source).await,
            Err(err) => {
                self.shared.let_go(&source.message);
                tracing::error!(error = %err, id, "audit index unreadable; the source comes back later");
            }
        }
    }

    /// Chains the source's record on the tail and publishes it.
    async fn chain(&mut self, source: Source) {
        let Source {
            mut record,
            message,
        } = source;
        record.prev_hash = self.tail.hash.clone();
        let body = match serde_json::to_vec(&record) {
            Ok(body) => Bytes::from(body),
            Err(err) => {
                self.shared.let_go(&message);
                tracing::error!(error = %err, id = %record.id, "audit record not encodable");
                return;
            }
        };
        let hash = record::hash(&body);
        let after_own = self.tail.subject.as_deref() == Some(self.subject.as_str());
        self.shared.on_way().insert(record.id.clone());
        self.tail = Head {
            seq: self.tail.seq + 1,
            hash: hash.clone(),
            subject: Some(self.subject.clone()),
        };
        let record = Chained {
            source: Source { record, message },
            seq: self.tail.seq,
            hash,
            body,
            after_own,
        };
        self.run.push(record);
        if self.run.len() >= self.run_max {
            self.send_run().await;
        } else if self.send_run_at.is_none() {
            self.send_run_at = Some(tokio::time::Instant::now() + LINGER);
        }
    }

    /// Sends the run gathered so far; only its last record asks for an ack.
    async fn send_run(&mut self) {
        self.send_run_at = None;
        let run = std::mem::take(&mut self.run);
        let last = run.len().saturating_sub(1);
        for (n, record) in run.into_iter().enumerate() {
            self.publish(record, n == last).await;
        }
    }

    /// Publishes a chained record with the headers that let the stream store it only where it
    /// belongs (the expected last sequence, and subject sequence after this writer's own); with
    /// `acked`, the stream's ack comes back (the run's last record), else nothing does.
    async fn publish(&mut self, record: Chained, acked: bool) {
        // On a clustered stream the subject's expectation is checked only while nothing of
        // this writer is in flight: the leader refuses it while an earlier message on the
        // subject is being replicated (see [`run_max`]); the stream-wide expectation still
        // holds every record to its place.
        let after_own = record.after_own && (self.run_max > 1 || self.sent.is_empty());
        let mut headers = switchboard_runtime::telemetry::traced_headers();
        headers.insert(HEADER_AUDIT_HASH, record.hash.as_str());
        if !acked {
            headers.insert(NATS_MESSAGE_ID, record.source.record.id.as_str());
            headers.insert(
                NATS_EXPECTED_LAST_SEQUENCE,
                (record.seq - 1).to_string().as_str(),
            );
            if after_own {
                headers.insert(
                    NATS_EXPECTED_LAST_SUBJECT_SEQUENCE,
                    (record.seq - 1).to_string().as_str(),
                );
            }
            // A record that is not stored (or a publish that fails here) fails the run's last
            // record, which recovers the whole run.
            let sent = tokio::time::timeout(
                SEND_TIMEOUT,
                self.client.publish_with_headers(
                    self.subject.clone(),
                    headers,
                    record.body.clone(),
                ),
            )
            .await;
            if !matches!(sent, Ok(Ok(()))) {
                tracing::debug!("an audit record was not sent; its run will fail");
            }
            self.sent.push_back(Sent { record, ack: None });
            return;
        }
        let mut publish = PublishMessage::build()
            .payload(record.body.clone())
            .headers(headers)
            .message_id(&record.source.record.id)
            .expected_last_sequence(record.seq - 1);
        if after_own {
            publish = publish.expected_last_subject_sequence(record.seq - 1);
        }
        let ack: AckFuture = match self
            .trail
            .js
            .send_publish(self.subject.clone(), publish)
            .await
        {
            Ok(future) => future.into_future(),
            Err(err) => futures::future::ready(Err(err)).boxed(),
        };
        self.sent.push_back(Sent {
            record,
            ack: Some(ack),
        });
    }

    /// Takes the oldest run's ack: its last record stored where it was meant to go, the whole
    /// run is (see the module docs), moves the head and goes to the indexer; anything else
    /// (another writer moved the stream, a publish failed or timed out) starts a recovery.
    async fn settle(
        &mut self,
        head: &mut MutexGuard<'_, Head>,
        acked: Result<PublishAck, PublishError>,
        shutdown: &CancellationToken,
    ) {
        let mut run = Vec::new();
        while let Some(sent) = self.sent.pop_front() {
            let last = sent.ack.is_some();
            run.push(sent.record);
            if last {
                break;
            }
        }
        let (Some(first), Some(last)) = (run.first(), run.last()) else {
            return;
        };
        match acked {
            Ok(ack) if !ack.duplicate && ack.sequence == last.seq && first.seq == head.seq + 1 => {
                self.fruitless = 0;
                for record in run {
                    head.seq = record.seq;
                    head.hash = record.hash.clone();
                    head.subject = Some(self.subject.clone());
                    self.stored.push(Committed {
                        entry: AuditEntry {
                            seq: record.seq,
                            hash: record.hash,
                            record: record.source.record,
                        },
                        body: record.body,
                        message: record.source.message,
                    });
                }
                if self.stored.len() >= self.batch {
                    self.hand_over().await;
                } else if self.sent.is_empty() && self.hand_over_at.is_none() {
                    // Nothing more in flight: indexed (and acknowledged, with one cumulative
                    // ack) after a short pause that lets a trickle of records share it.
                    self.hand_over_at = Some(tokio::time::Instant::now() + INDEX_PAUSE);
                }
            }
            other => {
                match other {
                    Err(err) if switchboard_request::kv::lost_expectation(&err) => {
                        tracing::debug!("another writer moved the audit stream; catching up");
                    }
                    Err(err) => {
                        tracing::warn!(error = %err, "an audit record was not stored; recovering")
                    }
                    Ok(ack) => tracing::debug!(
                        duplicate = ack.duplicate,
                        sequence = ack.sequence,
                        expected = last.seq,
                        "an audit record was not stored where expected; catching up"
                    ),
                }
                let sources = run.into_iter().map(|record| record.source).collect();
                self.recover(head, sources, shutdown).await;
            }
        }
    }

    /// Hands the records stored so far to the indexer.
    async fn hand_over(&mut self) {
        self.hand_over_at = None;
        if self.stored.is_empty() {
            return;
        }
        let rows = std::mem::take(&mut self.stored);
        if self.jobs.send(IndexJob::Rows(rows)).await.is_err() {
            self.shared
                .failed
                .store(true, std::sync::atomic::Ordering::Release);
        }
    }

    /// Hands over what is stored and waits until the indexer has done every job; false if the
    /// indexer is gone.
    async fn drain(&mut self) -> bool {
        self.hand_over().await;
        let (done, drained) = oneshot::channel();
        self.jobs.send(IndexJob::Drained(done)).await.is_ok() && drained.await.is_ok()
    }

    /// Brings the head back to what the stream holds after a record was not stored where it
    /// was meant to go: collects every publish still in flight, lets the indexer finish,
    /// reads what the stream holds beyond the head into the index (records of another writer,
    /// or its own whose ack was lost), then offers the sources not yet recorded again, chained
    /// on the new head. If the stream cannot be read, they are left unacknowledged: they come
    /// back after the ack wait.
    async fn recover(
        &mut self,
        head: &mut MutexGuard<'_, Head>,
        mut waiting: Vec<Source>,
        shutdown: &CancellationToken,
    ) {
        waiting.extend(self.in_flight_sources().await);
        self.finish_indexing(head).await;
        let caught_up = self.trail.catch_up_locked(head).await;
        self.tail = (**head).clone();
        match caught_up {
            Ok(_) => {
                self.shared.on_way().clear();
                self.shared
                    .failed
                    .store(false, std::sync::atomic::Ordering::Release);
            }
            Err(err) => {
                for source in &waiting {
                    self.shared.let_go(&source.message);
                }
                tracing::warn!(error = %err, count = waiting.len(), "audit stream unreadable; its sources come back after the ack wait");
                self.shared.on_way().clear();
                tokio::select! {
                    () = shutdown.cancelled() => {}
                    () = tokio::time::sleep(RECOVERY_PAUSE) => {}
                }
                return;
            }
        }
        if shutdown.is_cancelled() {
            // Stopping (or the lease was lost): another writer takes the sources over.
            return;
        }
        self.fruitless += 1;
        if self.fruitless > APPEND_ATTEMPTS {
            for source in &waiting {
                self.shared.let_go(&source.message);
            }
            tracing::error!(
                count = waiting.len(),
                "audit records not appended after {APPEND_ATTEMPTS} recoveries; their sources come back after the ack wait"
            );
            self.fruitless = 0;
            return;
        }
        for source in waiting {
            self.offer(source).await;
        }
    }

    /// The sources of every record still in flight, once its run's ack (or its failure)
    /// arrived, then those of the run not sent yet.
    async fn in_flight_sources(&mut self) -> Vec<Source> {
        let mut all = Vec::with_capacity(self.sent.len() + self.run.len());
        while let Some(mut sent) = self.sent.pop_front() {
            if let Some(ack) = sent.ack.as_mut() {
                let _ = ack.await;
            }
            all.push(sent.record.source);
        }
        self.send_run_at = None;
        all.extend(self.run.drain(..).map(|record| record.source));
        all
    }

    /// Lets the indexer finish every job. If an insert failed (or the indexer is gone), the
    /// head goes back to the index's last row — the index has no gap below it — so the next
    /// catch-up reads what was stored but not indexed.
    async fn finish_indexing(&mut self, head: &mut Head) {
        let drained = self.drain().await;
        if self.shared.index_failed() || !drained {
            match Head::of_index(&self.trail.index) {
                Ok(read) => *head = read,
                Err(err) => tracing::error!(error = %err, "audit index unreadable"),
            }
        }
    }
}
