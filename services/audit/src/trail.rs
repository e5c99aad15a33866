//! Writing and reading `AGENT_AUDIT`.
//!
//! Ingest: durable pull consumers on `AGENT_INBOX` and `AGENT_EVENTS` (explicit ack) feed one
//! appender per replica. The appender turns each source message into a record, chains it on
//! the record it sent before (each body names the hash of the record before it; the body's
//! SHA-256 travels in the `Switchboard-Audit-Hash` header), and publishes it with
//! `Nats-Expected-Last-Sequence` = the sequence it must follow and `Nats-Msg-Id` = its event id.
//! The chain fixes every record's sequence in advance, so the appender does not wait for the
//! stream's acks of the records before: up to a window of publishes are in flight. Their acks
//! are read in order; stored records are indexed in batches (one SQLite transaction each, on a
//! blocking thread, beside the appender), and a source message is acknowledged only after its
//! record is stored and indexed.
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

use std::collections::{HashSet, VecDeque};
use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::{DeliverPolicy, ReplayPolicy, pull};
use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::publish::PublishAck;
use async_nats::jetstream::{self, stream};
use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use switchboard_proto::audit::{
    AuditEntry, AuditRecord, ChainBreak, GENESIS_HASH, HEADER_AUDIT_HASH, VerifyReply,
};
use switchboard_proto::{EVENTS_STREAM, INBOX_STREAM};
use tokio::sync::{Mutex, MutexGuard, mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::index::Index;
use crate::record;

/// Recoveries in a row (each: collect, catch up, send again) without a record stored before
/// the sources waiting are given up (they come back after the ack wait).
const APPEND_ATTEMPTS: usize = 16;
/// Publishes in flight per `batch` of the config (the window is 4 × `batch`, at most 4,000:
/// the JetStream client allows 5,000 publishes awaiting their ack).
const WINDOW_BATCHES: usize = 4;
/// Stored batches waiting for the indexer (beyond the one it is inserting) before the appender
/// waits for it.
const INDEX_QUEUE: usize = 4;
/// Records indexed per transaction while catching up.
const CATCH_UP_BATCH: usize = 500;
/// How long a query on the writing replica waits for the index to reach the stream's end.
const FRESH_WAIT: Duration = Duration::from_secs(5);
/// The pause after a recovery that could not reach the stream, before the appender goes on.
const RECOVERY_PAUSE: Duration = Duration::from_millis(250);
/// How long reading a range of the stream may take.
const READ_TIMEOUT: Duration = Duration::from_secs(120);

/// A trail operation failed.
#[derive(Debug, thiserror::Error)]
#[error("audit trail: {0}")]
pub struct TrailError(pub String);

impl TrailError {
    fn of(step: &str, err: impl std::fmt::Display) -> Self {
        Self(format!("{step}: {err}"))
    }
}

impl From<crate::index::IndexError> for TrailError {
    fn from(err: crate::index::IndexError) -> Self {
        Self(err.to_string())
    }
}

/// The last record this replica knows: where the next one goes and what it must name.
#[derive(Debug, Clone)]
struct Head {
    seq: u64,
    hash: String,
    /// Its `Nats-Msg-Id`, when known: the next record is published with it as
    /// `Nats-Expected-Last-Msg-Id` besides the expected sequence. The sequence alone would let
    /// a pipelined record follow another writer's record that took the place of one of ours
    /// whose publish failed; the id says which record it must follow.
    msg_id: Option<String>,
}

impl Head {
    /// The index's last row (the index has no gap below it), or the start of the stream. Its
    /// message id is left unknown: the next record is checked by sequence only, which is safe
    /// for the first record published after the head was read.
    fn of_index(index: &Index) -> Result<Self, TrailError> {
        Ok(match index.head()? {
            Some((seq, hash)) => Self {
                seq,
                hash,
                msg_id: None,
            },
            None => Self {
                seq: 0,
                hash: GENESIS_HASH.to_owned(),
                msg_id: None,
            },
        })
    }
}

/// The trail: the stream, the index, and the appender's head.
#[derive(Debug)]
pub struct Trail {
    js: jetstream::Context,
    stream: stream::Stream,
    index: Arc<Index>,
    head: Mutex<Head>,
    /// The highest sequence the index has taken in (records read or appended); a query on the
    /// writing replica waits on it instead of reading the stream the appender is writing.
    indexed: watch::Sender<u64>,
}

/// A source message waiting for its record.
struct Source {
    record: AuditRecord,
    message: jetstream::Message,
}

/// One stored message of a stream, as read back.
pub struct Stored {
    /// Its sequence.
    pub seq: u64,
    /// Its headers.
    pub headers: Option<HeaderMap>,
    /// Its body.
    pub payload: Bytes,
}

/// Reads `stream` from `from` (inclusive) to its last message at the time of the call, in
/// order, handing each message to `each`.
pub async fn read_range(
    stream: &stream::Stream,
    from: u64,
    mut each: impl FnMut(Stored) -> Result<(), TrailError>,
) -> Result<(), TrailError> {
    let mut info_stream = stream.clone();
    let info = info_stream
        .info()
        .await
        .map_err(|err| TrailError::of("reading the stream info", err))?;
    let last = info.state.last_sequence;
    let from = from.max(info.state.first_sequence);
    if info.state.messages == 0 || from > last {
        return Ok(());
    }
    // An ordered *pull* consumer: it fetches in batches as the reader goes, so a large trail
    // read at start-up is never buffered whole in the client (an ordered push consumer ran
    // ahead of the index inserts and the audit's RSS kept the high-water mark).
    let consumer = stream
        .create_consumer(pull::OrderedConfig {
            deliver_policy: DeliverPolicy::ByStartSequence {
                start_sequence: from,
            },
            replay_policy: ReplayPolicy::Instant,
            ..Default::default()
        })
        .await
        .map_err(|err| TrailError::of("reading the trail", err))?;
    let mut messages = consumer
        .messages()
        .await
        .map_err(|err| TrailError::of("reading the trail", err))?;
    let read = async {
        while let Some(message) = messages.next().await {
            let message = message.map_err(|err| TrailError::of("reading the trail", err))?;
            let seq = message
                .info()
                .map_err(|err| TrailError::of("reading the trail", err))?
                .stream_sequence;
            if seq > last {
                break;
            }
            each(Stored {
                seq,
                headers: message.headers.clone(),
                payload: message.payload.clone(),
            })?;
            if seq >= last {
                break;
            }
        }
        Ok::<(), TrailError>(())
    };
    tokio::time::timeout(READ_TIMEOUT, read)
        .await
        .map_err(|_| TrailError("reading the trail timed out".to_owned()))?
}

fn stored_hash(stored: &Stored) -> String {
    stored
        .headers
        .as_ref()
        .and_then(|h| h.get(HEADER_AUDIT_HASH))
        .map_or_else(|| record::hash(&stored.payload), |h| h.as_str().to_owned())
}

impl Trail {
    /// Wraps the applied stream and an index, and reads into the index whatever the stream
    /// holds beyond it (all of it for a fresh index).
    pub async fn open(
        js: jetstream::Context,
        stream: stream::Stream,
        index: Arc<Index>,
    ) -> Result<Self, TrailError> {
        let head = Head::of_index(&index)?;
        let trail = Self {
            js,
            stream,
            index,
            indexed: watch::Sender::new(head.seq),
            head: Mutex::new(head),
        };
        trail.catch_up().await?;
        Ok(trail)
    }

    /// The index.
    pub fn index(&self) -> Arc<Index> {
        Arc::clone(&self.index)
    }

    /// Reads records appended since the head (by other replicas) into the index, and drops
    /// index rows the stream has aged out. Returns how many were read.
    ///
    /// On the writing replica the appender holds the head and indexes what it stores: this
    /// then waits (at most [`FRESH_WAIT`]) until the index has reached the stream's last record
    /// as of the call, or catches up itself if the appender lets go of the head meanwhile.
    pub async fn catch_up(&self) -> Result<usize, TrailError> {
        if let Ok(mut head) = self.head.try_lock() {
            return self.catch_up_locked(&mut head).await;
        }
        let mut stream = self.stream.clone();
        let state = stream
            .info()
            .await
            .map_err(|err| TrailError::of("reading the stream info", err))?
            .state
            .clone();
        // Rows the stream has aged out go now (the appender's own catch-up runs between
        // bursts only).
        self.index.prune_below(state.first_sequence)?;
        let last = state.last_sequence;
        let mut indexed = self.indexed.subscribe();
        let reached = async {
            loop {
                if *indexed.borrow_and_update() >= last {
                    return Ok(0);
                }
                tokio::select! {
                    changed = indexed.changed() => {
                        if changed.is_err() {
                            return Ok(0);
                        }
                    }
                    mut head = self.head.lock() => return self.catch_up_locked(&mut head).await,
                }
            }
        };
        match tokio::time::timeout(FRESH_WAIT, reached).await {
            Ok(read) => read,
            Err(_) => {
                tracing::debug!(
                    last,
                    "the index did not reach the stream's end in time; answering from it as it is"
                );
                Ok(0)
            }
        }
    }

    /// Notes that the index holds everything up to `seq`.
    fn mark_indexed(&self, seq: u64) {
        self.indexed.send_if_modified(|indexed| {
            let moved = seq > *indexed;
            *indexed = (*indexed).max(seq);
            moved
        });
    }

    async fn catch_up_locked(&self, head: &mut Head) -> Result<usize, TrailError> {
        let mut batch = Vec::new();
        let mut read = 0;
        let index = Arc::clone(&self.index);
        let mut last = None;
        read_range(&self.stream, head.seq + 1, |stored| {
            let hash = stored_hash(&stored);
            let msg_id = stored
                .headers
                .as_ref()
                .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
                .map(|id| id.as_str().to_owned());
            last = Some((stored.seq, hash.clone(), msg_id));
            let record: AuditRecord = match serde_json::from_slice(&stored.payload) {
                Ok(record) => record,
                Err(err) => {
                    // Not ours (only a foreign publisher could put it there, and deletes are
                    // denied): the chain continues after it; `verify` reports it.
                    tracing::warn!(seq = stored.seq, error = %err, "undecodable audit record skipped by the index");
                    return Ok(());
                }
            };
            batch.push(AuditEntry {
                seq: stored.seq,
                hash,
                record,
            });
            read += 1;
            if batch.len() >= CATCH_UP_BATCH {
                index.insert(&batch)?;
                batch.clear();
            }
            Ok(())
        })
        .await?;
        self.index.insert(&batch)?;
        if let Some((seq, hash, msg_id)) = last {
            *head = Head { seq, hash, msg_id };
        }
        self.mark_indexed(head.seq);
        let mut stream = self.stream.clone();
        if let Ok(info) = stream.info().await {
            self.index.prune_below(info.state.first_sequence)?;
            if info.state.messages == 0 && head.seq < info.state.last_sequence {
                // Everything aged out: the next record follows the stream's last sequence and
                // starts a new chain (verify checks from the oldest record kept).
                *head = Head {
                    seq: info.state.last_sequence,
                    hash: GENESIS_HASH.to_owned(),
                    msg_id: None,
                };
            }
        }
        Ok(read)
    }

    /// Walks the chain over everything the stream holds and reports the first break: a body
    /// whose hash is not its header, a `prev_hash` that is not the hash of the record before,
    /// or a sequence gap (a record removed). The first record checked is the stream's first
    /// (earlier ones aged out); only a chain starting at sequence 1 must start at `genesis`.
    pub async fn verify(&self) -> Result<VerifyReply, TrailError> {
        let mut reply = VerifyReply {
            ok: true,
            records: 0,
            first_seq: 0,
            last_seq: 0,
            first_break: None,
        };
        let mut prev: Option<(u64, String)> = None;
        read_range(&self.stream, 1, |stored| {
            if reply.records == 0 {
                reply.first_seq = stored.seq;
            }
            reply.records += 1;
            reply.last_seq = stored.seq;
            if reply.first_break.is_some() {
                return Ok(());
            }
            let computed = record::hash(&stored.payload);
            let claimed = stored
                .headers
                .as_ref()
                .and_then(|h| h.get(HEADER_AUDIT_HASH))
                .map(|h| h.as_str().to_owned());
            let record = serde_json::from_slice::<AuditRecord>(&stored.payload);
            let broken = |reason: String| ChainBreak {
                seq: stored.seq,
                reason,
            };
            let found = match (&record, claimed) {
                (Err(err), _) => Some(broken(format!("the record does not decode: {err}"))),
                (_, None) => Some(broken("the record has no hash header".to_owned())),
                (_, Some(claimed)) if claimed != computed => Some(broken(format!(
                    "the body hashes to {computed}, not to its header {claimed}: it was changed"
                ))),
                (Ok(record), Some(_)) => match &prev {
                    Some((seq, _)) if stored.seq != seq + 1 => Some(broken(format!(
                        "records {} to {} are missing",
                        seq + 1,
                        stored.seq - 1
                    ))),
                    Some((_, hash)) if record.prev_hash != *hash => Some(broken(format!(
                        "prev_hash {} is not the hash of record {} ({hash})",
                        record.prev_hash,
                        stored.seq - 1
                    ))),
                    None if stored.seq == 1 && record.prev_hash != GENESIS_HASH => {
                        Some(broken(format!(
                            "the first record names {} before it, not `{GENESIS_HASH}`",
                            record.prev_hash
                        )))
                    }
                    _ => None,
                },
            };
            if found.is_some() {
                reply.ok = false;
                reply.first_break = found;
            }
            prev = Some((stored.seq, computed));
            Ok(())
        })
        .await?;
        Ok(reply)
    }
}

/// Acknowledges a source whose record is stored. A plain ack (no server confirmation): if it
/// is lost the source comes back and is recognised as recorded, so waiting would only slow
/// the trail down.
async fn ack(message: &jetstream::Message) {
    if let Err(err) = message.ack().await {
        tracing::debug!(error = %err, "source ack failed");
    }
}

/// How ingest runs (from [`crate::AuditConfig`]).
#[derive(Debug, Clone)]
pub struct IngestSettings {
    /// Durable consumer name prefix.
    pub consumer_prefix: String,
    /// Most sources per batch.
    pub batch: usize,
    /// Redelivery delay of an unacknowledged source.
    pub ack_wait: Duration,
    /// How often the index reads other replicas' records.
    pub catch_up_every: Duration,
    /// The writer lease's time to live.
    pub lease_ttl: Duration,
}

impl From<&crate::AuditConfig> for IngestSettings {
    fn from(config: &crate::AuditConfig) -> Self {
        Self {
            consumer_prefix: config.consumer.clone(),
            batch: config.batch,
            ack_wait: Duration::from_millis(config.ack_wait_ms),
            catch_up_every: Duration::from_millis(config.catch_up_interval_ms),
            lease_ttl: Duration::from_millis(config.lease_ttl_ms),
        }
    }
}

/// The writer lease: the one key of `audit_lease`, holding the writing replica's id. It
/// expires `ttl` after its last write, so a replica that stops renewing (crash, pause,
/// partition) gives way to another.
struct Lease {
    kv: jetstream::kv::Store,
    holder: String,
    revision: Option<u64>,
}

const LEASE_KEY: &str = "writer";

impl Lease {
    /// Takes the lease if nobody holds it.
    async fn acquire(&mut self) -> bool {
        match self.kv.create(LEASE_KEY, self.holder.clone().into()).await {
            Ok(revision) => {
                self.revision = Some(revision);
                true
            }
            Err(_) => false,
        }
    }

    /// Renews the lease; false when it was lost (expired and taken, or unreachable).
    async fn renew(&mut self) -> bool {
        let Some(revision) = self.revision else {
            return false;
        };
        match self
            .kv
            .update(LEASE_KEY, self.holder.clone().into(), revision)
            .await
        {
            Ok(revision) => {
                self.revision = Some(revision);
                true
            }
            Err(err) => {
                tracing::warn!(error = %err, "audit writer lease not renewed");
                self.revision = None;
                false
            }
        }
    }

    /// Gives the lease up (on shutdown), so another replica takes over at once.
    async fn release(&mut self) {
        if let Some(revision) = self.revision.take()
            && let Err(err) = self
                .kv
                .delete_expect_revision(LEASE_KEY, Some(revision))
                .await
        {
            tracing::debug!(error = %err, "audit writer lease not released");
        }
    }
}

/// Runs ingest until `shutdown`. One replica at a time holds the writer lease and appends
/// (the chain has one writer; the expected-sequence check stays as a safety net for the
/// moment a lease changes hands); the others keep their index caught up and answer queries,
/// and take the lease when it expires.
pub async fn ingest(
    trail: Arc<Trail>,
    js: jetstream::Context,
    settings: IngestSettings,
    shutdown: CancellationToken,
) -> Result<(), TrailError> {
    let kv = js
        .get_key_value(switchboard_proto::AUDIT_LEASE_BUCKET)
        .await
        .map_err(|err| TrailError::of("opening the writer lease", err))?;
    let mut lease = Lease {
        kv,
        holder: switchboard_proto::new_id().to_string(),
        revision: None,
    };
    let every = settings.lease_ttl / 3;
    loop {
        // Follow: keep the index current and wait for the lease.
        let mut ticker = tokio::time::interval(settings.catch_up_every.min(every));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return Ok(()),
                _ = ticker.tick() => {}
            }
            if let Err(err) = trail.catch_up().await {
                tracing::warn!(error = %err, "audit catch-up failed");
            }
            if lease.acquire().await {
                break;
            }
        }
        tracing::info!(holder = %lease.holder, "audit writer lease taken");
        // Write while the lease holds.
        let lost = shutdown.child_token();
        let renewing = {
            let lost = lost.clone();
            async move {
                let mut ticker = tokio::time::interval(every);
                ticker.tick().await;
                loop {
                    tokio::select! {
                        () = lost.cancelled() => break,
                        _ = ticker.tick() => {}
                    }
                    if !lease.renew().await {
                        lost.cancel();
                        break;
                    }
                }
                lease
            }
        };
        let writing = write(
            Arc::clone(&trail),
            js.clone(),
            settings.clone(),
            lost.clone(),
        );
        let (result, returned) = tokio::join!(
            async {
                let result = writing.await;
                lost.cancel();
                result
            },
            renewing
        );
        lease = returned;
        if shutdown.is_cancelled() {
            lease.release().await;
            return result;
        }
        if let Err(err) = result {
            lease.release().await;
            return Err(err);
        }
        tracing::warn!("audit writer lease lost; following until it can be taken again");
    }
}

/// Feeds the appender from the durable consumers and runs it until `stop`; also catches up
/// with other replicas' records every `catch_up_every`.
async fn write(
    trail: Arc<Trail>,
    js: jetstream::Context,
    settings: IngestSettings,
    shutdown: CancellationToken,
) -> Result<(), TrailError> {
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
        let stream = js
            .get_stream(stream_name)
            .await
            .map_err(|err| TrailError::of("opening a source stream", err))?;
        let consumer: jetstream::consumer::PullConsumer = stream
            .get_or_create_consumer(
                &consumer_name,
                pull::Config {
                    durable_name: Some(consumer_name.clone()),
                    description: Some("Switchboard audit: every message into AGENT_AUDIT".into()),
                    ack_policy: jetstream::consumer::AckPolicy::Explicit,
                    ack_wait,
                    max_ack_pending: i64::try_from(batch * 8).unwrap_or(i64::MAX),
                    deliver_policy: DeliverPolicy::All,
                    ..Default::default()
                },
            )
            .await
            .map_err(|err| TrailError::of("opening the audit consumer", err))?;
        let tx = tx.clone();
        let stop = shutdown.clone();
        feeders.push(tokio::spawn(async move {
            feed(consumer, tx, stop).await;
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
        window: (batch * WINDOW_BATCHES).min(4_000),
        batch,
        tail: head.clone(),
        sent: VecDeque::new(),
        stored: Vec::new(),
        jobs,
        shared,
        fruitless: 0,
    };
    let mut ticker = tokio::time::interval(catch_up_every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if appender.shared.index_failed() {
            appender.recover(&mut head, Vec::new(), &shutdown).await;
        }
        let room = appender.sent.len() < appender.window;
        tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            acked = front_ack(&mut appender.sent), if !appender.sent.is_empty() => {
                appender.settle(&mut head, acked, &shutdown).await;
            }
            next = rx.recv(), if room => match next {
                Some(source) => appender.offer(source).await,
                None => break,
            },
            _ = ticker.tick() => {
                // Between bursts only: the catch-up reads from the head, which must be where
                // the last stored record is, and the index must hold everything before it.
                if appender.sent.is_empty() && appender.drain().await {
                    if let Err(err) = trail.catch_up_locked(&mut head).await {
                        tracing::warn!(error = %err, "audit catch-up failed");
                    }
                    appender.tail = head.clone();
                }
            }
        }
    }
    // Stopping: collect the acks of what was sent (their sources are acknowledged once
    // indexed), so the index holds every record this replica stored before it lets go.
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

/// The ack of the oldest record in flight.
async fn front_ack(sent: &mut VecDeque<Sent>) -> Result<PublishAck, PublishError> {
    match sent.front_mut() {
        Some(front) => front.ack.as_mut().await,
        None => std::future::pending().await,
    }
}

/// A record published, waiting for the stream's ack.
struct Sent {
    source: Source,
    /// The sequence it must be stored at.
    seq: u64,
    hash: String,
    body: Bytes,
    ack: Pin<Box<dyn Future<Output = Result<PublishAck, PublishError>> + Send>>,
}

/// A record stored, waiting for the indexer (its source is acknowledged once it is indexed).
struct Committed {
    entry: AuditEntry,
    body: Bytes,
    message: jetstream::Message,
}

/// What the appender asks of the indexer.
enum IndexJob {
    /// Index these stored records (in stream order), then acknowledge their sources.
    Rows(Vec<Committed>),
    /// Answer once every job before this one is done.
    Drained(oneshot::Sender<()>),
}

/// What the appender and its indexer share.
#[derive(Default)]
struct Shared {
    /// Ids of records sent and not yet indexed (a source arriving again meanwhile is dropped:
    /// its first delivery is acknowledged when the record is indexed).
    on_way: std::sync::Mutex<HashSet<String>>,
    /// An insert failed: the indexer skips what follows (so the index has no gap) until the
    /// appender recovers by reading the stream from the index's last row.
    failed: std::sync::atomic::AtomicBool,
}

impl Shared {
    fn on_way(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.on_way
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn index_failed(&self) -> bool {
        self.failed.load(std::sync::atomic::Ordering::Acquire)
    }
}

/// Indexes stored records in order, one transaction per job, on a blocking thread beside the
/// appender, then acknowledges their sources.
async fn index_stored(trail: Arc<Trail>, mut jobs: mpsc::Receiver<IndexJob>, shared: Arc<Shared>) {
    while let Some(job) = jobs.recv().await {
        let rows = match job {
            IndexJob::Drained(done) => {
                let _ = done.send(());
                continue;
            }
            IndexJob::Rows(rows) => rows,
        };
        if rows.is_empty() || shared.index_failed() {
            continue;
        }
        let index = trail.index();
        let inserted = tokio::task::spawn_blocking(move || {
            let result =
                index.insert_published(rows.iter().map(|row| (&row.entry, row.body.as_ref())));
            (rows, result)
        })
        .await;
        let (rows, result) = match inserted {
            Ok(done) => done,
            Err(err) => {
                tracing::error!(error = %err, "audit indexer stopped");
                shared
                    .failed
                    .store(true, std::sync::atomic::Ordering::Release);
                continue;
            }
        };
        if let Err(err) = result {
            // Stored but not indexed: the sources stay unacknowledged, and the appender's
            // recovery reads these records from the stream into the index.
            tracing::error!(error = %err, "audit records stored but not indexed; recovering");
            shared
                .failed
                .store(true, std::sync::atomic::Ordering::Release);
            continue;
        }
        {
            let mut on_way = shared.on_way();
            for row in &rows {
                on_way.remove(&row.entry.record.id);
            }
        }
        if let Some(last) = rows.last() {
            trail.mark_indexed(last.entry.seq);
        }
        for row in &rows {
            ack(&row.message).await;
        }
    }
}

/// The writing replica's appender: chains each new source on the record sent before it and
/// keeps up to `window` publishes in flight.
struct Appender {
    trail: Arc<Trail>,
    window: usize,
    batch: usize,
    /// The last record sent (the head when nothing is in flight).
    tail: Head,
    /// Records in flight, oldest first.
    sent: VecDeque<Sent>,
    /// Records stored since the last job handed to the indexer.
    stored: Vec<Committed>,
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
            Ok(true) => ack(&source.message).await,
            Ok(false) => self.send(source).await,
            Err(err) => {
                tracing::error!(error = %err, id, "audit index unreadable; the source comes back later");
            }
        }
    }

    /// Chains the source's record on the tail and publishes it.
    async fn send(&mut self, source: Source) {
        let Source {
            mut record,
            message,
        } = source;
        record.prev_hash = self.tail.hash.clone();
        let body = match serde_json::to_vec(&record) {
            Ok(body) => Bytes::from(body),
            Err(err) => {
                tracing::error!(error = %err, id = %record.id, "audit record not encodable");
                return;
            }
        };
        let hash = record::hash(&body);
        let mut headers = switchboard_runtime::telemetry::traced_headers();
        headers.insert(HEADER_AUDIT_HASH, hash.as_str());
        let mut publish = PublishMessage::build()
            .payload(body.clone())
            .headers(headers)
            .message_id(&record.id)
            .expected_last_sequence(self.tail.seq);
        if let Some(last_id) = &self.tail.msg_id {
            publish = publish.expected_last_message_id(last_id);
        }
        let ack = match self
            .trail
            .js
            .send_publish(switchboard_proto::subject::AUDIT_RECORDS, publish)
            .await
        {
            Ok(future) => future.into_future(),
            Err(err) => futures::future::ready(Err(err)).boxed(),
        };
        self.shared.on_way().insert(record.id.clone());
        self.tail = Head {
            seq: self.tail.seq + 1,
            hash: hash.clone(),
            msg_id: Some(record.id.clone()),
        };
        self.sent.push_back(Sent {
            source: Source { record, message },
            seq: self.tail.seq,
            hash,
            body,
            ack,
        });
    }

    /// Takes the oldest record's ack: stored where it was meant to go, it moves the head and
    /// goes to the indexer; anything else (another writer moved the stream, a publish failed
    /// or timed out) starts a recovery.
    async fn settle(
        &mut self,
        head: &mut MutexGuard<'_, Head>,
        acked: Result<PublishAck, PublishError>,
        shutdown: &CancellationToken,
    ) {
        let Some(front) = self.sent.pop_front() else {
            return;
        };
        match acked {
            Ok(ack) if !ack.duplicate && ack.sequence == front.seq && front.seq == head.seq + 1 => {
                head.seq = front.seq;
                head.hash = front.hash.clone();
                head.msg_id = Some(front.source.record.id.clone());
                self.fruitless = 0;
                self.stored.push(Committed {
                    entry: AuditEntry {
                        seq: front.seq,
                        hash: front.hash,
                        record: front.source.record,
                    },
                    body: front.body,
                    message: front.source.message,
                });
                if self.stored.len() >= self.batch || self.sent.is_empty() {
                    self.hand_over().await;
                }
            }
            other => {
                match other {
                    Err(err) if err.kind() == PublishErrorKind::WrongLastSequence => {
                        tracing::debug!("another writer moved the audit stream; catching up");
                    }
                    Err(err) => {
                        tracing::warn!(error = %err, "an audit record was not stored; recovering")
                    }
                    Ok(ack) => tracing::debug!(
                        duplicate = ack.duplicate,
                        sequence = ack.sequence,
                        expected = front.seq,
                        "an audit record was not stored where expected; catching up"
                    ),
                }
                self.recover(head, vec![front.source], shutdown).await;
            }
        }
    }

    /// Hands the records stored so far to the indexer.
    async fn hand_over(&mut self) {
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

    /// The sources of every record still in flight, once its ack (or its failure) arrived.
    async fn in_flight_sources(&mut self) -> Vec<Source> {
        let mut all = Vec::with_capacity(self.sent.len());
        while let Some(mut sent) = self.sent.pop_front() {
            let _ = sent.ack.as_mut().await;
            all.push(sent.source);
        }
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

/// Pulls a source consumer into the appender's channel.
async fn feed(
    consumer: jetstream::consumer::PullConsumer,
    tx: mpsc::Sender<Source>,
    stop: CancellationToken,
) {
    loop {
        let mut messages = match consumer.messages().await {
            Ok(messages) => messages,
            Err(err) => {
                tracing::warn!(error = %err, "audit consumer unavailable; retrying");
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_secs(1)) => continue,
                }
            }
        };
        loop {
            let next = tokio::select! {
                () = stop.cancelled() => return,
                next = messages.next() => next,
            };
            let message = match next {
                Some(Ok(message)) => message,
                Some(Err(err)) => {
                    tracing::debug!(error = %err, "audit consumer hiccup");
                    continue;
                }
                None => break,
            };
            let Ok(info) = message.info() else {
                continue;
            };
            let record = record::from_source(
                info.stream,
                info.stream_sequence,
                info.published,
                message.subject.as_str(),
                &message.payload,
            );
            if tx.send(Source { record, message }).await.is_err() {
                return;
            }
        }
    }
}
