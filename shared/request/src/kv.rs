//! KV reads beyond what async-nats offers: a point-in-time snapshot of many keys.
//!
//! async-nats lists keys with an ordered consumer over "last message per subject"; under
//! concurrent writes to a history-1 bucket that pass can miss keys (measured: 49 of 50 keys
//! with a writer running). The server has the right primitive instead: a batched direct get
//! with `multi_last` (ADR-31, nats-server ≥ 2.11) answers with the last message of every
//! matching key *as of one stream sequence*, so a snapshot is consistent by construction.
//! The server caps that at 1024 matching keys (it answers 413); above that we read every
//! message of the filter in stream order with an ordered consumer and fold by key, the latest
//! value winning. `pending == 0` alone is not a safe end (measured: a key lost under a
//! concurrent writer): a key's unread message may be replaced by a write the count has not
//! seen yet. So at `pending == 0` we also ask for the last sequence matching the filter and
//! read on until we pass it; a message we skipped was deleted by a write already appended
//! by then, so that write is read.

use std::collections::BTreeMap;
use std::time::Duration;

use async_nats::jetstream::consumer::{DeliverPolicy, ReplayPolicy, push};
use async_nats::jetstream::{self, kv};
use async_nats::{HeaderMap, StatusCode};
use bytes::Bytes;
use futures::StreamExt;
use switchboard_proto::{
    HEADER_KV_OPERATION, HEADER_NUM_PENDING, HEADER_SEQUENCE, HEADER_SUBJECT, HEADER_TIME_STAMP,
};

/// One live key and its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvEntry {
    /// The key (without the bucket prefix).
    pub key: String,
    /// The key's latest payload as stored (a JSON record in every Switchboard KV bucket).
    pub value: Bytes,
    /// Its revision (stream sequence), for compare-and-set.
    pub revision: u64,
    /// When the server stored it.
    pub stored_at: Option<time::OffsetDateTime>,
}

/// A snapshot could not be read.
#[derive(Debug, thiserror::Error)]
#[error("reading a snapshot of {bucket}: {message}")]
pub struct SnapshotError {
    /// Name of the bucket (or index stream) being read, as the error text shows it.
    pub bucket: String,
    /// What failed.
    pub message: String,
}

/// A key's latest value and revision as the bucket's stream leader has it (`None` when the key
/// was never written, or its latest entry is a delete or purge). A KV `get` may be answered by
/// any replica (direct get), and one that lags says "none" for a key written a moment ago:
/// decisions a lagging replica must not make — "this goal does not exist", "this agent does
/// not own it" — read here.
pub async fn leader_entry(
    store: &kv::Store,
    key: &str,
) -> Result<Option<(Bytes, u64)>, async_nats::jetstream::stream::LastRawMessageError> {
    use async_nats::jetstream::stream::LastRawMessageErrorKind;
    let subject = format!("{}{key}", store.prefix);
    match store.stream.get_last_raw_message_by_subject(&subject).await {
        Ok(message) if message.headers.get(HEADER_KV_OPERATION).is_some() => Ok(None),
        Ok(message) => Ok(Some((message.payload, message.sequence))),
        Err(err) if err.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
        Err(err) => Err(err),
    }
}

/// How long one page may take to arrive.
const PAGE_TIMEOUT: Duration = Duration::from_secs(10);
/// Most keys asked for in one direct-get batch (the server's own cap is 1024).
const DIRECT_BATCH: usize = 1024;

/// Every live key matching `key_filter` (`>` for all, `writer.*` for one agent's goals) with
/// its latest value, as of one moment, sorted by stream sequence. Deleted and purged keys are
/// skipped. The bucket must allow direct gets (async-nats creates buckets that way).
pub async fn snapshot(
    js: &jetstream::Context,
    store: &kv::Store,
    key_filter: &str,
) -> Result<Vec<KvEntry>, SnapshotError> {
    let source = Source::of(store);
    last_per_subject(js, &source, key_filter).await
}

/// The same snapshot over a plain stream whose subjects are `<prefix><key>` (one message per
/// subject): the latest message of every matching subject, keys without `prefix`. The stream
/// must allow direct gets.
pub async fn stream_snapshot(
    js: &jetstream::Context,
    stream: &jetstream::stream::Stream,
    prefix: &str,
    key_filter: &str,
) -> Result<Vec<KvEntry>, SnapshotError> {
    let name = stream.cached_info().config.name.clone();
    let source = Source {
        name: &name,
        stream,
        stream_name: &name,
        prefix,
    };
    last_per_subject(js, &source, key_filter).await
}

/// What a snapshot reads: a stream, and the subject prefix its keys sit under.
struct Source<'a> {
    name: &'a str,
    stream: &'a jetstream::stream::Stream,
    stream_name: &'a str,
    prefix: &'a str,
}

impl<'a> Source<'a> {
    /// A KV bucket's stream and key prefix.
    fn of(store: &'a kv::Store) -> Self {
        Self {
            name: &store.name,
            stream: &store.stream,
            stream_name: &store.stream_name,
            prefix: &store.prefix,
        }
    }
}

async fn last_per_subject(
    js: &jetstream::Context,
    source: &Source<'_>,
    key_filter: &str,
) -> Result<Vec<KvEntry>, SnapshotError> {
    match direct_snapshot(js, source, key_filter, DIRECT_BATCH).await? {
        Some(entries) => Ok(entries),
        None => scan(js, source, key_filter).await,
    }
}

fn header_u64(headers: &HeaderMap, name: &str) -> Option<u64> {
    headers.get(name).and_then(|v| v.as_str().parse().ok())
}

/// How a batched direct get ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchEnd {
    /// End of the batch: `pending` more messages matched than the batch returned.
    Done {
        /// Matches left out.
        pending: u64,
    },
    /// Nothing matched.
    NotFound,
    /// The server refused the batch as too large (413: over 1024 subjects for `multi_last`).
    TooLarge,
    /// The replica that answered is not ready (503, 408: e.g. just after its server
    /// restarted); the stream leader can still answer a non-direct read.
    NotReady,
}

/// One batched direct get (ADR-31, nats-server ≥ 2.11) on `stream`: `request` (its `batch`,
/// `seq` / `next_by_subj` / `multi_last`, `max_bytes`) is sent to `$JS.API.DIRECT.GET.<stream>`
/// and every message of the batch is passed to `each` in order until the end of the batch
/// (at most `timeout` in all). Errors are messages for the caller's own error type.
pub async fn direct_batch(
    js: &jetstream::Context,
    stream: &str,
    request: &serde_json::Value,
    timeout: Duration,
    mut each: impl FnMut(async_nats::Message) -> Result<(), String>,
) -> Result<BatchEnd, String> {
    let client = js.client();
    let inbox = client.new_inbox();
    let mut replies = client
        .subscribe(inbox.clone())
        .await
        .map_err(|err| err.to_string())?;
    client
        .publish_with_reply(
            switchboard_proto::subject::js_direct_get(stream),
            inbox,
            request.to_string().into(),
        )
        .await
        .map_err(|err| err.to_string())?;
    let read = async {
        while let Some(message) = replies.next().await {
            match message.status {
                None | Some(StatusCode::OK) => each(message)?,
                Some(status) if status.as_u16() == 204 => {
                    let headers = message.headers.unwrap_or_default();
                    let pending = header_u64(&headers, HEADER_NUM_PENDING).unwrap_or(0);
                    return Ok(BatchEnd::Done { pending });
                }
                Some(StatusCode::NOT_FOUND) => return Ok(BatchEnd::NotFound),
                Some(status) if status.as_u16() == 413 => return Ok(BatchEnd::TooLarge),
                Some(status) if status.as_u16() == 503 || status.as_u16() == 408 => {
                    return Ok(BatchEnd::NotReady);
                }
                Some(status) => {
                    return Err(format!(
                        "direct get answered {status}: {}",
                        message.description.unwrap_or_default()
                    ));
                }
            }
        }
        Err("reply subscription closed".to_owned())
    };
    tokio::time::timeout(timeout, read)
        .await
        .map_err(|_| "direct get timed out".to_owned())?
}

/// The sequence a direct get's reply carries (`Nats-Sequence`).
pub fn direct_sequence(message: &async_nats::Message) -> Result<u64, String> {
    message
        .headers
        .as_ref()
        .and_then(|headers| header_u64(headers, HEADER_SEQUENCE))
        .ok_or_else(|| "direct get reply without Nats-Sequence".to_owned())
}

async fn direct_snapshot(
    js: &jetstream::Context,
    store: &Source<'_>,
    key_filter: &str,
    page_size: usize,
) -> Result<Option<Vec<KvEntry>>, SnapshotError> {
    let fail = |message: String| SnapshotError {
        bucket: store.name.to_owned(),
        message,
    };
    let filter = format!("{}{}", store.prefix, key_filter);
    let request = serde_json::json!({ "multi_last": [filter], "batch": page_size });
    let mut entries = Vec::new();
    let end = direct_batch(js, store.stream_name, &request, PAGE_TIMEOUT, |message| {
        let revision = direct_sequence(&message)?;
        let headers = message.headers.unwrap_or_default();
        let subject = headers
            .get(HEADER_SUBJECT)
            .map(|v| v.as_str().to_owned())
            .unwrap_or_default();
        let live = headers
            .get(HEADER_KV_OPERATION)
            .is_none_or(|op| op.as_str() == "PUT");
        if live && let Some(key) = subject.strip_prefix(store.prefix) {
            let stored_at = headers.get(HEADER_TIME_STAMP).and_then(|v| {
                time::OffsetDateTime::parse(
                    v.as_str(),
                    &time::format_description::well_known::Rfc3339,
                )
                .ok()
            });
            entries.push(KvEntry {
                key: key.to_owned(),
                value: message.payload,
                revision,
                stored_at,
            });
        }
        Ok(())
    })
    .await
    .map_err(fail)?;
    match end {
        BatchEnd::Done { pending: 0 } | BatchEnd::NotFound => Ok(Some(entries)),
        // More keys than one batch, or a replica not ready: read through the leader instead.
        BatchEnd::Done { .. } | BatchEnd::TooLarge => Ok(None),
        BatchEnd::NotReady => {
            tracing::debug!(stream = %store.stream_name, "direct get unavailable; scanning");
            Ok(None)
        }
    }
}

/// The full-scan path over a KV bucket (what [`snapshot`] falls back to above 1024 keys),
/// exposed so tests can exercise it directly.
pub async fn scan_snapshot(
    js: &jetstream::Context,
    store: &kv::Store,
    key_filter: &str,
) -> Result<Vec<KvEntry>, SnapshotError> {
    let source = Source::of(store);
    scan(js, &source, key_filter).await
}

/// Every message of the filter in stream order, folded by key.
async fn scan(
    js: &jetstream::Context,
    store: &Source<'_>,
    key_filter: &str,
) -> Result<Vec<KvEntry>, SnapshotError> {
    let fail = |message: String| SnapshotError {
        bucket: store.name.to_owned(),
        message,
    };
    let consumer = store
        .stream
        .create_consumer(push::OrderedConfig {
            deliver_subject: js.client().new_inbox(),
            filter_subject: format!("{}{}", store.prefix, key_filter),
            deliver_policy: DeliverPolicy::All,
            replay_policy: ReplayPolicy::Instant,
            ..Default::default()
        })
        .await
        .map_err(|err| fail(err.to_string()))?;
    if consumer.cached_info().num_pending == 0 {
        return Ok(Vec::new());
    }
    let mut messages = consumer
        .messages()
        .await
        .map_err(|err| fail(err.to_string()))?;
    let mut latest: BTreeMap<String, Option<KvEntry>> = BTreeMap::new();
    let filter = format!("{}{}", store.prefix, key_filter);
    let mut read_up_to = 0u64;
    let read = async {
        while let Some(message) = messages.next().await {
            let message = message.map_err(|err| fail(err.to_string()))?;
            let info = message.info().map_err(|err| fail(err.to_string()))?;
            let (pending, revision) = (info.pending, info.stream_sequence);
            let live = message
                .headers
                .as_ref()
                .and_then(|headers| headers.get(HEADER_KV_OPERATION))
                .is_none_or(|op| op.as_str() == "PUT");
            if let Some(key) = message.subject.as_str().strip_prefix(store.prefix) {
                let entry = live.then(|| KvEntry {
                    key: key.to_owned(),
                    value: message.payload.clone(),
                    revision,
                    stored_at: Some(info.published),
                });
                latest.insert(key.to_owned(), entry);
            }
            read_up_to = read_up_to.max(revision);
            if pending == 0 {
                let last = match store.stream.get_last_raw_message_by_subject(&filter).await {
                    Ok(message) => message.sequence,
                    Err(err) => return Err(fail(format!("reading the last sequence: {err}"))),
                };
                if read_up_to >= last {
                    break;
                }
            }
        }
        Ok::<(), SnapshotError>(())
    };
    tokio::time::timeout(SCAN_TIMEOUT, read)
        .await
        .map_err(|_| fail("scan timed out".to_owned()))??;
    let mut entries: Vec<KvEntry> = latest.into_values().flatten().collect();
    entries.sort_by_key(|entry| entry.revision);
    Ok(entries)
}

/// How long a full scan may take.
const SCAN_TIMEOUT: Duration = Duration::from_secs(60);

/// The code a clustered stream answers a lost expectation with (`Nats-Expected-Last-Subject-
/// Sequence`, which every KV update and create carries): "wrong last sequence", error code
/// 10164. async-nats 0.51 maps only the single server's 10071 to `WrongLastSequence`, so on a
/// cluster a lost compare-and-set would read as a failure (an `unavailable` answer where a
/// retry was due: measured on the 3-node R3 bench, 23 of 64 concurrent acks of one goal).
const WRONG_LAST_SEQUENCE_CLUSTERED: &str = "error code 10164";

/// Whether a KV update lost its compare-and-set (another writer changed the key since it was
/// read), on a single server or a cluster alike.
pub fn lost_revision(err: &kv::UpdateError) -> bool {
    err.kind() == kv::UpdateErrorKind::WrongLastRevision
        || err.to_string().contains(WRONG_LAST_SEQUENCE_CLUSTERED)
}

/// Whether a KV create found the key taken, on a single server or a cluster alike.
pub fn already_exists(err: &kv::CreateError) -> bool {
    err.kind() == kv::CreateErrorKind::AlreadyExists
        || err.to_string().contains(WRONG_LAST_SEQUENCE_CLUSTERED)
}

/// Whether a publish failed its `Nats-Expected-Last-…` expectation, on a single server or a
/// cluster alike.
pub fn lost_expectation(err: &jetstream::context::PublishError) -> bool {
    err.kind() == jetstream::context::PublishErrorKind::WrongLastSequence
        || err.to_string().contains(WRONG_LAST_SEQUENCE_CLUSTERED)
}

#[cfg(test)]
mod cas_tests {
    use super::*;

    #[test]
    fn a_clustered_lost_compare_and_set_is_recognised() {
        let clustered = kv::UpdateError::with_source(
            kv::UpdateErrorKind::Other,
            std::io::Error::other(
                "publish failed: wrong last sequence (code 400, error code 10164)",
            ),
        );
        assert!(lost_revision(&clustered));
        assert!(!lost_revision(&kv::UpdateError::new(
            kv::UpdateErrorKind::TimedOut
        )));
        assert!(lost_revision(&kv::UpdateError::new(
            kv::UpdateErrorKind::WrongLastRevision
        )));
    }
}
