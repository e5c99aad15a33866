//! Feeding the SQLite index from `AGENT_AUDIT`, two ways. Catching up reads what the stream
//! holds beyond the head (everything at start-up, then other replicas' records) and drops
//! rows the stream has aged out. On the writing replica, the indexer inserts the records the
//! appender stored, one transaction per batch on a blocking thread beside the appender, and
//! only then acknowledges their sources.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use bytes::Bytes;
use switchboard_proto::audit::{AuditEntry, AuditRecord, GENESIS_HASH};
use tokio::sync::{mpsc, oneshot};

use crate::error::AuditError;
use crate::store::{self, ack, read_range, stored_hash};
use crate::trail::{Head, Trail};

/// How long a source let go without a record holds the acknowledgements back: it comes back
/// after the ack wait (seconds); one that has not after this was removed from its stream.
const HOLE_GIVEN_UP: Duration = Duration::from_secs(300);
/// Records indexed per transaction while catching up.
const CATCH_UP_BATCH: usize = 500;
/// How long a query on the writing replica waits for the index to reach the stream's end.
const FRESH_WAIT: Duration = Duration::from_secs(5);

impl Trail {
    /// Reads records appended since the head (by other replicas) into the index, and drops
    /// index rows the stream has aged out. Returns how many were read.
    ///
    /// On the writing replica the appender holds the head and indexes what it stores: this
    /// then waits (at most [`FRESH_WAIT`]) until the index has reached the stream's last record
    /// as of the call, or catches up itself if the appender lets go of the head meanwhile.
    pub async fn catch_up(&self) -> Result<usize, AuditError> {
        if let Ok(mut head) = self.head.try_lock() {
            return self.catch_up_locked(&mut head).await;
        }
        let state = store::stream_state(&self.stream).await?;
        // Rows the stream has aged out go now (the appender's own catch-up runs between
        // bursts only).
        self.index
            .prune_below(state.first_sequence)
            .map_err(AuditError::CatchUpIndex)?;
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

    /// Catches up from `head`, which the caller holds: reads what the stream holds beyond it
    /// into the index, moves it to the last record read, and drops rows the stream has aged
    /// out. Returns how many records were read.
    pub(crate) async fn catch_up_locked(&self, head: &mut Head) -> Result<usize, AuditError> {
        let mut batch = Vec::new();
        let mut read = 0;
        let index = Arc::clone(&self.index);
        let mut last = None;
        read_range(&self.stream, head.seq + 1, |stored| {
            let hash = stored_hash(&stored);
            last = Some((stored.seq, hash.clone(), stored.subject.clone()));
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
                index.insert(&batch).map_err(AuditError::CatchUpIndex)?;
                batch.clear();
            }
            Ok(())
        })
        .await?;
        self.index
            .insert(&batch)
            .map_err(AuditError::CatchUpIndex)?;
        if let Some((seq, hash, subject)) = last {
            *head = Head {
                seq,
                hash,
                subject: Some(subject),
            };
        }
        self.mark_indexed(head.seq);
        if let Ok(state) = store::stream_state(&self.stream).await {
            self.index
                .prune_below(state.first_sequence)
                .map_err(AuditError::CatchUpIndex)?;
            if state.messages == 0 && head.seq < state.last_sequence {
                // Everything aged out: the next record follows the stream's last sequence and
                // starts a new chain (verify checks from the oldest record kept).
                *head = Head {
                    seq: state.last_sequence,
                    hash: GENESIS_HASH.to_owned(),
                    subject: None,
                };
            }
        }
        Ok(read)
    }
}

/// A record stored, waiting for the indexer (its source is acknowledged once it is indexed).
pub(crate) struct Committed {
    pub(crate) entry: AuditEntry,
    pub(crate) body: Bytes,
    pub(crate) message: jetstream::Message,
}

/// What the appender asks of the indexer.
pub(crate) enum IndexJob {
    /// Index these stored records (in stream order), then acknowledge their sources.
    Rows(Vec<Committed>),
    /// Answer once every job before this one is done.
    Drained(oneshot::Sender<()>),
}

/// What the appender and its indexer share.
#[derive(Default)]
pub(crate) struct Shared {
    /// Ids of records sent and not yet indexed (a source arriving again meanwhile is dropped:
    /// its first delivery is acknowledged when the record is indexed).
    on_way: std::sync::Mutex<HashSet<String>>,
    /// An insert failed: the indexer skips what follows (so the index has no gap) until the
    /// appender recovers by reading the stream from the index's last row.
    pub(crate) failed: std::sync::atomic::AtomicBool,
    /// Per source stream, the sequences of sources let go without a stored record (they come
    /// back after the ack wait). The consumers acknowledge everything up to the message acked
    /// (`AckPolicy::All`), so no source at or above the lowest of them is acknowledged until
    /// its record is stored.
    holes: std::sync::Mutex<HashMap<String, BTreeMap<u64, std::time::Instant>>>,
}

/// Where a source message is in its stream, `None` when its reply subject does not say.
pub(crate) fn position(message: &jetstream::Message) -> Option<(String, u64)> {
    message
        .info()
        .ok()
        .map(|info| (info.stream.to_owned(), info.stream_sequence))
}

impl Shared {
    /// The ids of records sent and not yet indexed.
    pub(crate) fn on_way(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.on_way
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether an insert failed since the appender last recovered.
    pub(crate) fn index_failed(&self) -> bool {
        self.failed.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The holes, without those older than [`HOLE_GIVEN_UP`] (their sources never came back:
    /// removed from the source stream meanwhile).
    fn holes(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, BTreeMap<u64, std::time::Instant>>> {
        let mut holes = self
            .holes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (stream, set) in holes.iter_mut() {
            set.retain(|seq, since| {
                let keep = since.elapsed() < HOLE_GIVEN_UP;
                if !keep {
                    tracing::warn!(%stream, seq, "a source let go without a record never came back; acknowledging past it");
                }
                keep
            });
        }
        holes.retain(|_, set| !set.is_empty());
        holes
    }

    /// Notes a source let go without a stored record (since when: the first time).
    pub(crate) fn let_go(&self, message: &jetstream::Message) {
        if let Some((stream, seq)) = position(message) {
            self.hole(stream, seq);
        }
    }

    fn hole(&self, stream: String, seq: u64) {
        self.holes()
            .entry(stream)
            .or_default()
            .entry(seq)
            .or_insert_with(std::time::Instant::now);
    }

    /// A source's record exists after all: its hole, if it had one, is closed.
    fn close_hole(&self, stream: &str, seq: u64) {
        let mut holes = self.holes();
        if let Some(set) = holes.get_mut(stream) {
            set.remove(&seq);
        }
        holes.retain(|_, set| !set.is_empty());
    }

    /// The lowest sequence of `stream` a cumulative ack must not reach: a source let go
    /// without a record, or one whose record is on its way (chained, not yet indexed).
    fn ack_limit(&self, stream: &str) -> Option<u64> {
        let hole = self
            .holes()
            .get(stream)
            .and_then(|holes| holes.keys().next().copied());
        let on_way = self
            .on_way()
            .iter()
            .filter_map(|id| {
                let (of, seq) = id.rsplit_once(':')?;
                (of == stream).then(|| seq.parse::<u64>().ok()).flatten()
            })
            .min();
        match (hole, on_way) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Acknowledges a source found already recorded (a redelivery): its own hole, if it had
    /// one, is closed — its record exists — then [`Shared::ack_through`].
    pub(crate) async fn ack_recorded(&self, message: &jetstream::Message) {
        if let Some((stream, seq)) = position(message) {
            self.close_hole(&stream, seq);
        }
        self.ack_through(message).await;
    }

    /// Acknowledges `message` — and with it every earlier message of its consumer — unless a
    /// source without a stored record (let go, or on its way) is among those.
    pub(crate) async fn ack_through(&self, message: &jetstream::Message) {
        let Some((stream, seq)) = position(message) else {
            return;
        };
        if self.ack_limit(&stream).is_none_or(|limit| seq < limit) {
            ack(message).await;
        }
    }

    /// Acknowledges indexed sources: per source stream, the newest one below any hole (the
    /// consumers acknowledge all before it), after the holes these fill are closed.
    async fn ack_indexed(&self, rows: &[Committed]) {
        let placed: Vec<(String, u64, &jetstream::Message)> = rows
            .iter()
            .filter_map(|row| position(&row.message).map(|(s, seq)| (s, seq, &row.message)))
            .collect();
        for (stream, seq, _) in &placed {
            self.close_hole(stream, *seq);
        }
        let mut newest: HashMap<&str, (u64, &jetstream::Message)> = HashMap::new();
        let mut limits: HashMap<&str, Option<u64>> = HashMap::new();
        for (stream, seq, message) in &placed {
            let limit = *limits
                .entry(stream.as_str())
                .or_insert_with(|| self.ack_limit(stream));
            if limit.is_some_and(|limit| *seq >= limit) {
                continue;
            }
            let entry = newest.entry(stream.as_str()).or_insert((*seq, message));
            if *seq > entry.0 {
                *entry = (*seq, message);
            }
        }
        for (_, message) in newest.into_values() {
            ack(message).await;
        }
    }
}

/// Indexes stored records in order, one transaction per job, on a blocking thread beside the
/// appender, then acknowledges their sources.
pub(crate) async fn index_stored(
    trail: Arc<Trail>,
    mut jobs: mpsc::Receiver<IndexJob>,
    shared: Arc<Shared>,
) {
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
        shared.ack_indexed(&rows).await;
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{HOLE_GIVEN_UP, Shared};

    #[test]
    fn a_cumulative_ack_stops_below_every_source_without_a_stored_record() {
        let shared = Shared::default();
        assert_eq!(shared.ack_limit("AGENT_INBOX"), None);
        // A record on its way (chained, not indexed) and a source let go: the lower one bounds
        // the acks of its own stream only.
        shared.on_way().insert("AGENT_INBOX:7".to_owned());
        shared.hole("AGENT_INBOX".to_owned(), 12);
        shared.hole("AGENT_EVENTS".to_owned(), 3);
        assert_eq!(shared.ack_limit("AGENT_INBOX"), Some(7));
        assert_eq!(shared.ack_limit("AGENT_EVENTS"), Some(3));
        assert_eq!(shared.ack_limit("AGENT_TASKS"), None);
        // Indexed: the hole then limits; filled, nothing does.
        shared.on_way().remove("AGENT_INBOX:7");
        assert_eq!(shared.ack_limit("AGENT_INBOX"), Some(12));
        shared.close_hole("AGENT_INBOX", 12);
        assert_eq!(shared.ack_limit("AGENT_INBOX"), None);
        assert_eq!(shared.ack_limit("AGENT_EVENTS"), Some(3));
        // A hole let go again keeps the time it first opened.
        shared.hole("AGENT_EVENTS".to_owned(), 3);
        assert_eq!(shared.holes()["AGENT_EVENTS"].len(), 1);
    }

    #[test]
    fn a_hole_whose_source_never_comes_back_is_given_up() {
        let shared = Shared::default();
        let long_ago = Instant::now()
            .checked_sub(HOLE_GIVEN_UP + Duration::from_secs(1))
            .expect("the clock is past the give-up time");
        shared
            .holes()
            .entry("AGENT_INBOX".to_owned())
            .or_default()
            .insert(5, long_ago);
        shared.hole("AGENT_INBOX".to_owned(), 9);
        // The old one no longer holds acks back; the young one does.
        assert_eq!(shared.ack_limit("AGENT_INBOX"), Some(9));
    }
}
