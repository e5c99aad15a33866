//! Attachments at the door (docs/protocol.md §17, "Who may read"). A message may carry a file
//! only if its sender may read it — the uploader, or an agent a message carrying it was
//! delivered to — and only as the file is: every field of the attachment must match the
//! file's record, so nobody can show a receiver another name, size or digest than the bytes
//! have. Each agent the message is then delivered to gets a grant on the file (KV
//! `agent_files_index`, `grant.<file_id>.<agent_id>`) until the delivery plus the retention:
//! the files service lets it read the file while that lasts. Forwarding passes the reference
//! on; the data is never copied.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::kv;
use bytes::Bytes;
use switchboard_proto::AgentId;
use switchboard_proto::files::{Attachment, FileRecord, FileState, Grant, file_key, grant_key};
use switchboard_proto::timestamp::OffsetDateTime;
use switchboard_runtime::store::StoreError;
use uuid::Uuid;

/// Why an attachment cannot go on a message.
#[derive(Debug, thiserror::Error)]
pub enum AttachmentError {
    /// No complete file by that reference that the sender may pass on (its uploader or a
    /// reader it was delivered to): the two are not told apart.
    #[error(
        "attachment `{0}`: no file you may pass on (upload it, or forward one delivered to you)"
    )]
    NotFound(Uuid),
    /// The attachment's name, media type, size or digest is not the file's.
    #[error(
        "attachment `{0}`: its name, media type, size and sha256 must be the file's as uploaded"
    )]
    Mismatch(Uuid),
    /// The index could not be read or written.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// How long the door trusts a complete file's record it read: a file's fields never change
/// once complete, so the only news it can miss is a deletion, and a message sent in that
/// moment carries a reference its reader finds gone (`not_found`), as if it had been deleted
/// a moment later. Grants are never remembered: a revocation counts at once.
const RECORD_FRESH: Duration = Duration::from_secs(2);
/// Complete records remembered at most (the oldest is dropped first).
const RECORDS_REMEMBERED: usize = 4096;

/// The door's view of the files: the index bucket, how long a delivery keeps a file
/// readable, and the complete records it read lately.
#[derive(Debug, Clone)]
pub struct Files {
    index: kv::Store,
    retention: Duration,
    records: Arc<Mutex<HashMap<Uuid, (Instant, FileRecord)>>>,
}

impl Files {
    /// Grants on `index` last `retention` from each delivery.
    pub fn new(index: kv::Store, retention: Duration) -> Self {
        Self {
            index,
            retention,
            records: Arc::default(),
        }
    }

    /// A complete file's record: remembered for [`RECORD_FRESH`], else read.
    async fn complete_record(&self, file: &Uuid) -> Result<Option<FileRecord>, AttachmentError> {
        let now = Instant::now();
        {
            let records = self
                .records
                .lock()
                .unwrap_or_else(|poison| poison.into_inner());
            if let Some((at, record)) = records.get(file)
                && now.duration_since(*at) < RECORD_FRESH
            {
                return Ok(Some(record.clone()));
            }
        }
        let record: Option<FileRecord> = self.read(&file_key(file)).await?;
        let Some(record) = record.filter(|record| record.state == FileState::Complete) else {
            return Ok(None);
        };
        let mut records = self
            .records
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        if records.len() >= RECORDS_REMEMBERED {
            records.retain(|_, (at, _)| now.duration_since(*at) < RECORD_FRESH);
            if records.len() >= RECORDS_REMEMBERED {
                records.clear();
            }
        }
        records.insert(*file, (now, record.clone()));
        Ok(Some(record))
    }

    /// [`Files::check`] on a door's files; a door without refuses any attachment.
    pub async fn check_on(
        files: Option<&Self>,
        passer: &AgentId,
        attachments: &[Attachment],
    ) -> Result<(), AttachmentError> {
        match (files, attachments.first()) {
            (_, None) => Ok(()),
            (Some(files), Some(_)) => files.check(passer, attachments).await,
            (None, Some(first)) => Err(AttachmentError::NotFound(first.file_ref)),
        }
    }

    /// [`Files::grant`] on a door's files, when the message carries any.
    pub async fn grant_on(
        files: Option<&Self>,
        passer: &AgentId,
        attachments: &[Attachment],
        readers: &[AgentId],
    ) -> Result<(), AttachmentError> {
        match files {
            Some(files) if !attachments.is_empty() => {
                files.grant(passer, attachments, readers).await
            }
            _ => Ok(()),
        }
    }

    /// Checks that `passer` may put each attachment on a message, as it is.
    pub async fn check(
        &self,
        passer: &AgentId,
        attachments: &[Attachment],
    ) -> Result<(), AttachmentError> {
        for attachment in attachments {
            let file = attachment.file_ref;
            let Some(record) = self.complete_record(&file).await? else {
                return Err(AttachmentError::NotFound(file));
            };
            if record.owner != *passer {
                let grant: Option<Grant> = self.read(&grant_key(&file, passer)).await?;
                if grant.is_none_or(|grant| grant.until <= OffsetDateTime::now_utc()) {
                    return Err(AttachmentError::NotFound(file));
                }
            }
            if record.attachment != *attachment {
                return Err(AttachmentError::Mismatch(file));
            }
        }
        Ok(())
    }

    /// Records that each of `readers` was delivered `attachments` from `passer`: each may
    /// read them until now plus the retention (a later delivery extends it).
    pub async fn grant(
        &self,
        passer: &AgentId,
        attachments: &[Attachment],
        readers: &[AgentId],
    ) -> Result<(), AttachmentError> {
        let grant = Grant {
            from: passer.clone(),
            until: OffsetDateTime::now_utc() + self.retention,
        };
        let value = Bytes::from(serde_json::to_vec(&grant).map_err(|err| {
            StoreError::store("encoding a grant", std::io::Error::other(err.to_string()))
        })?);
        let writes = attachments.iter().flat_map(|attachment| {
            readers
                .iter()
                .filter(|reader| *reader != passer)
                .map(|reader| grant_key(&attachment.file_ref, reader))
        });
        let writes = writes.map(|key| {
            let value = value.clone();
            async move {
                self.index
                    .put(&key, value)
                    .await
                    .map_err(|err| StoreError::store("writing a grant", err))
            }
        });
        for result in futures::future::join_all(writes).await {
            result?;
        }
        Ok(())
    }

    async fn read<T: serde::de::DeserializeOwned>(
        &self,
        key: &str,
    ) -> Result<Option<T>, StoreError> {
        let entry = self
            .index
            .entry(key)
            .await
            .map_err(|err| StoreError::store("reading the files index", err))?;
        match entry {
            Some(entry) if entry.operation == kv::Operation::Put => {
                serde_json::from_slice(&entry.value)
                    .map(Some)
                    .map_err(|_| StoreError::Corrupt(key.to_owned()))
            }
            _ => Ok(None),
        }
    }
}
