//! The trail: what the appender, the indexer, `verify` and the queries share — the stream
//! `AGENT_AUDIT`, this replica's index of it and the head the next record follows. Ingest,
//! which runs them, is `ingest.rs`.
//!
//! The parts: `appender.rs` (following the source streams, appending chained records),
//! `indexer.rs` (feeding the index from the stream), `lease.rs` (the writer lease),
//! `verify.rs` (checking the chain), `store.rs` (reading streams back).

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, stream};
use switchboard_proto::audit::GENESIS_HASH;
use tokio::sync::{Mutex, watch};

use crate::error::AuditError;
use crate::index::Index;

/// The last record this replica knows: where the next one goes and what it must name.
#[derive(Debug, Clone)]
pub(crate) struct Head {
    pub(crate) seq: u64,
    pub(crate) hash: String,
    /// Its subject, when known. When it is the appender's own subject, the next record is
    /// published with that subject's expected last sequence besides the stream's: the
    /// sequence alone would let a pipelined record follow another writer's record that took
    /// the place of one of ours whose publish failed. (`Nats-Expected-Last-Msg-Id` would say
    /// the same, but nats-server 2.15 re-checks it on replicas against state a restarted
    /// replica does not have, and stops the stream there with a write error.)
    pub(crate) subject: Option<String>,
}

impl Head {
    /// The index's last row (the index has no gap below it), or the start of the stream. Its
    /// subject is left unknown: the next record is checked by sequence only, which is safe
    /// for the first record published after the head was read.
    pub(crate) fn of_index(index: &Index) -> Result<Self, AuditError> {
        Ok(match index.head().map_err(AuditError::CatchUpIndex)? {
            Some((seq, hash)) => Self {
                seq,
                hash,
                subject: None,
            },
            None => Self {
                seq: 0,
                hash: GENESIS_HASH.to_owned(),
                subject: None,
            },
        })
    }
}

/// The trail: the stream, the index, and the appender's head.
#[derive(Debug)]
pub struct Trail {
    pub(crate) js: jetstream::Context,
    pub(crate) stream: stream::Stream,
    pub(crate) index: Arc<Index>,
    pub(crate) head: Mutex<Head>,
    /// The highest sequence the index has taken in (records read or appended); a query on the
    /// writing replica waits on it instead of reading the stream the appender is writing.
    pub(crate) indexed: watch::Sender<u64>,
}

impl Trail {
    /// Wraps the applied stream and an index, and reads into the index whatever the stream
    /// holds beyond it (all of it for a fresh index).
    pub async fn open(
        js: jetstream::Context,
        stream: stream::Stream,
        index: Arc<Index>,
    ) -> Result<Self, AuditError> {
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

    /// The SQLite query index this replica keeps (thread, history and pending read it).
    pub fn index(&self) -> Arc<Index> {
        Arc::clone(&self.index)
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
