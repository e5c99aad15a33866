//! Writing and reading `AGENT_AUDIT`.
//!
//! Ingest: durable pull consumers on `AGENT_INBOX` and `AGENT_EVENTS` (explicit ack) feed one
//! appender per replica. The appender turns a batch of source messages into records, chains
//! them (each body names the hash of the record before it; the body's SHA-256 travels in the
//! `Switchboard-Audit-Hash` header), and publishes them pipelined, each with
//! `Nats-Expected-Last-Sequence` = the sequence it must follow and `Nats-Msg-Id` = its event id.
//! A source message is acknowledged only after its record is stored and indexed.
//!
//! Exactly once: an event id already in the index is acknowledged without a second record.
//! The index is complete up to the appender's head; when another replica appended meanwhile,
//! the expected-sequence check fails, the appender reads what it missed into the index (so
//! the duplicate check sees it) and retries. So redeliveries, restarts and several replicas
//! never write a record twice, and the chain has one order.

use std::sync::Arc;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::{DeliverPolicy, ReplayPolicy, pull, push};
use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::{self, stream};
use bytes::Bytes;
use futures::StreamExt;
use switchboard_proto::audit::{
    AUDIT_RECORDS_SUBJECT, AuditEntry, AuditRecord, ChainBreak, GENESIS_HASH, HEADER_AUDIT_HASH,
    VerifyReply,
};
use switchboard_proto::{EVENTS_STREAM, INBOX_STREAM};
use tokio::sync::{Mutex, mpsc};
use tokio_util::sync::CancellationToken;

use crate::index::Index;
use crate::record;

/// Appends retried after another writer moved the stream.
const APPEND_ATTEMPTS: usize = 16;
/// Records indexed per transaction while catching up.
const CATCH_UP_BATCH: usize = 500;
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
}

/// The trail: the stream, the index, and the appender's head.
#[derive(Debug)]
pub struct Trail {
    js: jetstream::Context,
    stream: stream::Stream,
    index: Arc<Index>,
    head: Mutex<Head>,
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
    js: &jetstream::Context,
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
    let consumer = stream
        .create_consumer(push::OrderedConfig {
            deliver_subject: js.client().new_inbox(),
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
        let head = match index.head()? {
            Some((seq, hash)) => Head { seq, hash },
            None => Head {
                seq: 0,
                hash: GENESIS_HASH.to_owned(),
            },
        };
        let trail = Self {
            js,
            stream,
            index,
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
    pub async fn catch_up(&self) -> Result<usize, TrailError> {
        let mut head = self.head.lock().await;
        self.catch_up_locked(&mut head).await
    }

    async fn catch_up_locked(&self, head: &mut Head) -> Result<usize, TrailError> {
        let mut batch = Vec::new();
        let mut read = 0;
        let index = Arc::clone(&self.index);
        let mut last = None;
        read_range(&self.js, &self.stream, head.seq + 1, |stored| {
            let hash = stored_hash(&stored);
            last = Some((stored.seq, hash.clone()));
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
        if let Some((seq, hash)) = last {
            head.seq = seq;
            head.hash = hash;
        }
        let mut stream = self.stream.clone();
        if let Ok(info) = stream.info().await {
            self.index.prune_below(info.state.first_sequence)?;
            if info.state.messages == 0 && head.seq < info.state.last_sequence {
                // Everything aged out: the next record follows the stream's last sequence and
                // starts a new chain (verify checks from the oldest record kept).
                head.seq = info.state.last_sequence;
                head.hash = GENESIS_HASH.to_owned();
            }
        }
        Ok(read)
    }

    /// Appends the records of `sources` (skipping any already recorded) and acknowledges each
    /// source once its record is stored and indexed. Returns how many records were written.
    async fn append(&self, sources: Vec<Source>) -> Result<usize, TrailError> {
        let mut head = self.head.lock().await;
        let mut waiting = sources;
        let mut written = 0;
        for _ in 0..APPEND_ATTEMPTS {
            let before_batch = head.clone();
            // Exactly once: an event already recorded is only acknowledged.
            let mut fresh = Vec::with_capacity(waiting.len());
            for source in waiting {
                if self.index.has(&source.record.id)? {
                    ack(&source.message).await;
                } else {
                    fresh.push(source);
                }
            }
            if fresh.is_empty() {
                return Ok(written);
            }
            // Chain and send them all, then collect the acks in order.
            let mut prev = head.hash.clone();
            let mut sent = Vec::with_capacity(fresh.len());
            for (i, source) in fresh.iter().enumerate() {
                let mut record = source.record.clone();
                record.prev_hash = prev.clone();
                let body = serde_json::to_vec(&record)
                    .map_err(|err| TrailError::of("encoding a record", err))?;
                let hash = record::hash(&body);
                prev = hash.clone();
                let mut headers = switchboard_runtime::telemetry::traced_headers();
                headers.insert(HEADER_AUDIT_HASH, hash.as_str());
                let publish = PublishMessage::build()
                    .payload(body.into())
                    .headers(headers)
                    .message_id(&record.id)
                    .expected_last_sequence(head.seq + i as u64);
                let ack = self.js.send_publish(AUDIT_RECORDS_SUBJECT, publish).await;
                sent.push((record, hash, ack));
            }
            let mut committed = Vec::new();
            let mut moved = false;
            for (record, hash, ack) in sent {
                if moved {
                    continue;
                }
                let stored = match ack {
                    Ok(future) => future.await,
                    Err(err) => Err(err),
                };
                match stored {
                    Ok(ack) if !ack.duplicate && ack.sequence == head.seq + 1 => {
                        head.seq = ack.sequence;
                        head.hash = hash.clone();
                        committed.push(AuditEntry {
                            seq: ack.sequence,
                            hash,
                            record,
                        });
                    }
                    Ok(_) => moved = true,
                    Err(err) if err.kind() == PublishErrorKind::WrongLastSequence => moved = true,
                    Err(err) => {
                        tracing::warn!(error = %err, "an audit record was not stored; retrying");
                        moved = true;
                    }
                }
            }
            if let Err(err) = self.index.insert(&committed) {
                // The records are stored but not indexed: rewind so the next catch-up reads
                // them from the stream (and their redelivered sources find them recorded).
                *head = before_batch;
                return Err(err.into());
            }
            let done = committed.len();
            written += done;
            let mut rest = fresh.into_iter();
            for source in rest.by_ref().take(done) {
                ack(&source.message).await;
            }
            waiting = rest.collect();
            if waiting.is_empty() {
                return Ok(written);
            }
            // Someone else appended (or a publish failed): learn what is there, then retry.
            self.catch_up_locked(&mut head).await?;
        }
        Err(TrailError(format!(
            "{} records not appended after {APPEND_ATTEMPTS} attempts",
            waiting.len()
        )))
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
        read_range(&self.js, &self.stream, 1, |stored| {
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
    let mut ticker = tokio::time::interval(catch_up_every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let first = tokio::select! {
            () = shutdown.cancelled() => break,
            _ = ticker.tick() => {
                if let Err(err) = trail.catch_up().await {
                    tracing::warn!(error = %err, "audit catch-up failed");
                }
                continue;
            }
            next = rx.recv() => next,
        };
        let Some(first) = first else { break };
        let mut sources = vec![first];
        while sources.len() < batch {
            match rx.try_recv() {
                Ok(source) => sources.push(source),
                Err(_) => break,
            }
        }
        let count = sources.len();
        match trail.append(sources).await {
            Ok(written) => tracing::debug!(count, written, "audit batch appended"),
            // The sources stay unacknowledged and come back after the ack wait.
            Err(err) => tracing::error!(error = %err, count, "audit batch not appended"),
        }
    }
    for feeder in feeders {
        feeder.abort();
    }
    Ok(())
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
