//! The sweeper (docs/protocol.md §17, "How long"): every `sweep_ms` each replica removes the
//! uploads that went idle and the files whose time ran out — past their retention and past
//! every grant's `until` (a message delivered later keeps its file longer). Of two replicas
//! removing one file, one releases its bytes of the quota (the record's removal is a
//! compare-and-set).

use std::sync::Arc;
use std::time::Duration;

use switchboard_proto::files::{FileRecord, FileState};
use switchboard_runtime::CancellationToken;
use time::OffsetDateTime;

use crate::error::FilesError;
use crate::service::Files;

/// Every `every` until `shutdown`, one sweep.
pub async fn sweep_every(files: Arc<Files>, every: Duration, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(every) => {}
            () = shutdown.cancelled() => return,
        }
        match files.sweep().await {
            Ok(0) => {}
            Ok(removed) => tracing::info!(removed, "expired files and idle uploads removed"),
            Err(err) => tracing::warn!(error = %err, "files sweep failed"),
        }
    }
}

impl Files {
    /// One sweep: removes what ran out; returns how many files and uploads it removed.
    pub async fn sweep(&self) -> Result<usize, FilesError> {
        let entries =
            switchboard_request::kv::snapshot(self.store.js(), self.store.index(), "file.*")
                .await
                .map_err(|err| FilesError::store("listing files", err))?;
        let now = OffsetDateTime::now_utc();
        let mut removed = 0;
        for entry in entries {
            let Ok(record) = serde_json::from_slice::<FileRecord>(&entry.value) else {
                tracing::warn!(key = %entry.key, "an unreadable file record is left alone");
                continue;
            };
            // One record that fails (its reads, its removal) does not stop the sweep.
            match self.ran_out(&record, now).await {
                Ok(true) => match self.remove(&record, entry.revision).await {
                    Ok(true) => removed += 1,
                    Ok(false) => {}
                    Err(err) => {
                        tracing::warn!(key = %entry.key, error = %err, "removing a file failed; the next sweep retries");
                    }
                },
                Ok(false) => {}
                Err(err) => {
                    tracing::warn!(key = %entry.key, error = %err, "a file's time could not be read; the next sweep retries");
                }
            }
        }
        Ok(removed)
    }

    /// Whether a file's time ran out: an upload idle for `upload_idle_secs` since its last
    /// chunk (or its start), a complete file past its retention and every grant.
    async fn ran_out(&self, record: &FileRecord, now: OffsetDateTime) -> Result<bool, FilesError> {
        match record.state {
            FileState::Uploading => {
                let last = self
                    .store
                    .last_chunk_at(&record.nuid)
                    .await?
                    .unwrap_or(record.created_at);
                Ok(last.max(record.created_at) + self.idle() < now)
            }
            FileState::Complete => {
                if record.expires_at > now {
                    return Ok(false);
                }
                let grants = self.store.grants(&record.attachment.file_ref).await?;
                Ok(grants.iter().all(|(_, grant)| grant.until <= now))
            }
        }
    }
}
