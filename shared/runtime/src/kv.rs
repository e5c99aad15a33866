//! KV reads beyond what async-nats offers: a consistent snapshot of many keys in one pass.

use std::time::Duration;

use async_nats::jetstream::consumer::{DeliverPolicy, ReplayPolicy, push};
use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use futures::StreamExt;

/// One live key and its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvEntry {
    /// The key (without the bucket prefix).
    pub key: String,
    /// The value.
    pub value: Bytes,
    /// Its revision (stream sequence), for compare-and-set.
    pub revision: u64,
}

/// A snapshot could not be read.
#[derive(Debug, thiserror::Error)]
#[error("reading a snapshot of {bucket}: {message}")]
pub struct SnapshotError {
    /// The bucket.
    pub bucket: String,
    /// What failed.
    pub message: String,
}

/// How long a snapshot may take before it is abandoned.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(10);

/// Every live key matching `key_filter` (`>` for all, `writer.>` for one agent's goals) with
/// its latest value, read in one ordered-consumer pass over the bucket's stream (last message
/// per subject). Deleted and purged keys are skipped.
pub async fn snapshot(
    js: &jetstream::Context,
    store: &kv::Store,
    key_filter: &str,
) -> Result<Vec<KvEntry>, SnapshotError> {
    let fail = |message: String| SnapshotError {
        bucket: store.name.clone(),
        message,
    };
    let consumer = store
        .stream
        .create_consumer(push::OrderedConfig {
            deliver_subject: js.client().new_inbox(),
            filter_subject: format!("{}{}", store.prefix, key_filter),
            deliver_policy: DeliverPolicy::LastPerSubject,
            replay_policy: ReplayPolicy::Instant,
            ..Default::default()
        })
        .await
        .map_err(|err| fail(err.to_string()))?;
    if consumer.cached_info().num_pending == 0 {
        return Ok(Vec::new());
    }
    let mut messages = consumer.messages().await.map_err(|err| fail(err.to_string()))?;
    let mut entries = Vec::new();
    let read = async {
        while let Some(message) = messages.next().await {
            let message = message.map_err(|err| fail(err.to_string()))?;
            let info = message.info().map_err(|err| fail(err.to_string()))?;
            let pending = info.pending;
            let revision = info.stream_sequence;
            let live = message
                .headers
                .as_ref()
                .and_then(|headers| headers.get("KV-Operation"))
                .is_none_or(|op| op.as_str() == "PUT");
            if live && let Some(key) = message.subject.as_str().strip_prefix(store.prefix.as_str()) {
                entries.push(KvEntry {
                    key: key.to_owned(),
                    value: message.payload.clone(),
                    revision,
                });
            }
            if pending == 0 {
                break;
            }
        }
        Ok::<(), SnapshotError>(())
    };
    tokio::time::timeout(SNAPSHOT_TIMEOUT, read)
        .await
        .map_err(|_| fail("timed out".to_owned()))??;
    Ok(entries)
}
