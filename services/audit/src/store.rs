//! The audit's JetStream reads and writes: reading a stream back in order (the index's
//! catch-up, `verify`, tests), a stream's state, opening the durable consumers on the source
//! streams, pulling them into the appender's channel and acknowledging their messages.
//!
//! Two JetStream calls live beside the logic they serve: the writer lease's KV calls in
//! `lease.rs`, and publishing a chained record in `appender.rs` (its ack is a step of the
//! appender's pipeline).

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::{DeliverPolicy, ReplayPolicy, pull};
use async_nats::jetstream::{self, stream};
use bytes::Bytes;
use futures::StreamExt;
use switchboard_proto::audit::{AuditRecord, HEADER_AUDIT_HASH};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::error::AuditError;
use crate::record;

/// How long reading a range of the stream may take.
const READ_TIMEOUT: Duration = Duration::from_secs(120);

/// One stored message of a stream, as read back.
pub struct StoredMessage {
    /// Where it is in the stream: an audit record's place in the chain, a source's position.
    pub seq: u64,
    /// The subject it was stored on (a record: its writer's `_SB.audit.records.<writer>`).
    pub subject: String,
    /// The headers it was stored with (`Switchboard-Audit-Hash` on a record, trace context).
    pub headers: Option<HeaderMap>,
    /// The stored bytes: a record's JSON, or the source message the record is made from.
    pub payload: Bytes,
}

/// The state of `stream` now (message count, first and last sequence).
pub(crate) async fn stream_state(stream: &stream::Stream) -> Result<stream::State, AuditError> {
    let mut stream = stream.clone();
    let info = stream
        .info()
        .await
        .map_err(|err| AuditError::ReadStreamInfo(err.into()))?;
    Ok(info.state.clone())
}

/// Reads `stream` from `from` (inclusive) to its last message at the time of the call, in
/// order, handing each message to `each`.
pub async fn read_range(
    stream: &stream::Stream,
    from: u64,
    mut each: impl FnMut(StoredMessage) -> Result<(), AuditError>,
) -> Result<(), AuditError> {
    let state = stream_state(stream).await?;
    let last = state.last_sequence;
    let from = from.max(state.first_sequence);
    if state.messages == 0 || from > last {
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
        .map_err(|err| AuditError::ReadTrail(err.into()))?;
    let mut messages = consumer
        .messages()
        .await
        .map_err(|err| AuditError::ReadTrail(err.into()))?;
    let read = async {
        while let Some(message) = messages.next().await {
            let message = message.map_err(|err| AuditError::ReadTrail(err.into()))?;
            let seq = message
                .info()
                .map_err(AuditError::ReadTrail)?
                .stream_sequence;
            if seq > last {
                break;
            }
            each(StoredMessage {
                seq,
                subject: message.subject.to_string(),
                headers: message.headers.clone(),
                payload: message.payload.clone(),
            })?;
            if seq >= last {
                break;
            }
        }
        Ok::<(), AuditError>(())
    };
    tokio::time::timeout(READ_TIMEOUT, read)
        .await
        .map_err(|_| AuditError::ReadTrailTimedOut)?
}

/// The record hash of a stored message: its `Switchboard-Audit-Hash` header, or the hash of
/// its body when it has none.
pub(crate) fn stored_hash(stored: &StoredMessage) -> String {
    stored
        .headers
        .as_ref()
        .and_then(|h| h.get(HEADER_AUDIT_HASH))
        .map_or_else(|| record::hash(&stored.payload), |h| h.as_str().to_owned())
}

/// Opens the durable pull consumer a writer reads the source stream `stream_name` with:
/// cumulative acks (`AckPolicy::All`: the indexer acknowledges the newest source of each stored
/// batch, and with it every one before), redelivery after `ack_wait`, at most 8 × `batch`
/// messages unacknowledged.
///
/// Each writer that starts takes a consumer of its own, `<family>-<n>`, created to start right
/// after the lowest ack floor of the family's consumers (`<family>` itself is an older
/// version's, with explicit acks), which it then deletes: everything not acknowledged is
/// delivered again **in order**, so a cumulative ack never passes a source a writer that died
/// had been given but not recorded (a redelivery would come after newer ones). Sources already
/// recorded are recognised and acknowledged. The new consumer exists before the old ones go, so
/// the inbox's audit floor (`shared/delivery/src/room.rs`) is never without one.
pub(crate) async fn source_consumer(
    js: &jetstream::Context,
    stream_name: &str,
    family: &str,
    ack_wait: Duration,
    batch: usize,
) -> Result<jetstream::consumer::PullConsumer, AuditError> {
    let open_failed =
        |err: &dyn std::fmt::Display| AuditError::OpenSourceConsumer(err.to_string().into());
    let stream = js
        .get_stream(stream_name)
        .await
        .map_err(|err| AuditError::OpenSourceStream(err.into()))?;
    let named = |name: &str| {
        name == family
            || name
                .strip_prefix(family)
                .and_then(|rest| rest.strip_prefix('-'))
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    let mut older = Vec::new();
    let mut floor: Option<u64> = None;
    let mut infos = stream.consumers();
    while let Some(info) = infos.next().await {
        let info = info.map_err(|err| open_failed(&err))?;
        if named(&info.name) {
            let acked = info.ack_floor.stream_sequence;
            floor = Some(floor.map_or(acked, |floor| floor.min(acked)));
            older.push(info.name.clone());
        }
    }
    let deliver_policy = match floor {
        Some(floor) if floor > 0 => DeliverPolicy::ByStartSequence {
            start_sequence: floor + 1,
        },
        _ => DeliverPolicy::All,
    };
    let stamp = time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000;
    let mut name = format!("{family}-{stamp}");
    if older.contains(&name) {
        name = format!("{family}-{}", stamp + 1);
    }
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some(name.clone()),
            description: Some("Switchboard audit: every message into AGENT_AUDIT".into()),
            ack_policy: jetstream::consumer::AckPolicy::All,
            ack_wait,
            max_ack_pending: i64::try_from(batch * 8).unwrap_or(i64::MAX),
            deliver_policy,
            ..Default::default()
        })
        .await
        .map_err(|err| open_failed(&err))?;
    for old in older {
        if let Err(err) = stream.delete_consumer(&old).await {
            // Left in place, its ack floor would hold back every goal inbox's purge of read
            // messages (shared/delivery/src/room.rs): tried again in the background.
            tracing::warn!(consumer = %old, error = %err, "an earlier audit consumer was not deleted; trying again");
            let stream = stream.clone();
            tokio::spawn(async move { delete_later(&stream, &old).await });
        }
    }
    tracing::info!(consumer = %name, from = ?floor, "audit source consumer opened");
    Ok(consumer)
}

/// Deletes an earlier writer's consumer that a first attempt could not: every 5 s for up to 5
/// minutes (gone already counts as deleted), then left to the next writer that starts.
async fn delete_later(stream: &jetstream::stream::Stream, name: &str) {
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_secs(5)).await;
        match stream.delete_consumer(name).await {
            Ok(_) => {
                tracing::info!(consumer = %name, "an earlier audit consumer deleted at last");
                return;
            }
            Err(err) if err.to_string().contains("consumer not found") => return,
            Err(err) => {
                tracing::debug!(consumer = %name, error = %err, "earlier audit consumer still not deleted")
            }
        }
    }
    tracing::warn!(consumer = %name, "an earlier audit consumer could not be deleted; the next writer tries again");
}

/// Acknowledges a source whose record is stored, and every earlier one of its consumer (see
/// [`source_consumer`]). A plain ack (no server confirmation): if it is lost the sources come
/// back and are recognised as recorded, so waiting would only slow the trail down.
pub(crate) async fn ack(message: &jetstream::Message) {
    if let Err(err) = message.ack().await {
        tracing::debug!(error = %err, "source ack failed");
    }
}

/// Pulls a source consumer into the appender's channel.
pub(crate) async fn feed(
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
            let mut record = record::from_source(
                info.stream,
                info.stream_sequence,
                info.published,
                message.subject.as_str(),
                &message.payload,
            );
            record.trace_id = message
                .headers
                .as_ref()
                .and_then(|headers| headers.get(switchboard_proto::HEADER_TRACEPARENT))
                .and_then(|value| switchboard_proto::audit::trace_id_of(value.as_str()));
            if tx.send(Source { record, message }).await.is_err() {
                return;
            }
        }
    }
}

/// A source message waiting for its record.
pub(crate) struct Source {
    /// Its record, before it is chained.
    pub(crate) record: AuditRecord,
    /// The message, acknowledged once the record is stored and indexed.
    pub(crate) message: jetstream::Message,
}
