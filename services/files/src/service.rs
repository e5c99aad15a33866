//! The files service's state and the requests that are not uploads or reads: who may read a
//! file, `stat`, `revoke`, `delete`, and the events the audit records (docs/protocol.md §17).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use switchboard_proto::AgentId;
use switchboard_proto::files::{
    DeleteReply, FILE_CHUNK_BYTES, FileQuery, FileRecord, FileState, FileView, RevokeReply,
    RevokeRequest,
};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::config::FilesConfig;
use crate::digest::Running;
use crate::error::FilesError;
use crate::store::Store;

/// What a file counts against its uploader's quota: its size, and at least one chunk, so an
/// agent cannot keep unbounded empty or tiny files (records, grants, sweeps) for free.
pub(crate) fn charged(size: u64) -> u64 {
    size.max(FILE_CHUNK_BYTES as u64)
}

/// Uploads a replica remembers where they stand, at most (the oldest is forgotten first;
/// forgetting costs one read of the last chunk).
const REMEMBERED_UPLOADS: usize = 1024;

/// Where an upload stands, and its record (whose fields do not change while it uploads), so
/// a chunk this replica takes after the last one it took reads nothing back.
#[derive(Debug, Clone)]
pub(crate) struct Progress {
    /// The upload's record and its revision.
    pub record: FileRecord,
    pub revision: u64,
    /// The stream sequence of its last chunk (0: none yet).
    pub seq: u64,
    /// Bytes stored.
    pub received: u64,
    /// The digest of those bytes so far.
    pub digest: Running,
}

/// The files service.
#[derive(Debug)]
pub struct Files {
    pub(crate) store: Store,
    pub(crate) config: FilesConfig,
    /// How long a file stays after its upload (`jetstream.files_retention_secs`).
    retention: Duration,
    uploads: Mutex<HashMap<Uuid, (u64, Progress)>>,
    next: Mutex<u64>,
    /// The chunk size of new uploads ([`Files::with_chunk_bytes`]).
    pub(crate) chunk_bytes: usize,
    /// The chunks this replica is storing (`window.rs`).
    pub(crate) in_flight: crate::window::InFlight,
}

impl Files {
    /// The service on `store`; a file stays `retention` after its upload.
    pub fn new(store: Store, config: FilesConfig, retention: Duration) -> Self {
        Self {
            store,
            config,
            retention,
            uploads: Mutex::new(HashMap::new()),
            next: Mutex::new(0),
            chunk_bytes: FILE_CHUNK_BYTES,
            in_flight: crate::window::InFlight::default(),
        }
    }

    /// The same, new uploads in chunks of `chunk_bytes` (from
    /// [`switchboard_proto::files::chunk_bytes_for`] the server's `max_payload`; 128 KiB
    /// without).
    pub fn with_chunk_bytes(mut self, chunk_bytes: usize) -> Self {
        self.chunk_bytes = chunk_bytes;
        self
    }

    pub(crate) fn retention(&self) -> Duration {
        self.retention
    }

    pub(crate) fn idle(&self) -> Duration {
        Duration::from_secs(self.config.upload_idle_secs)
    }

    pub(crate) fn remembered(&self, file: &Uuid) -> Option<Progress> {
        let uploads = self
            .uploads
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        uploads.get(file).map(|(_, progress)| progress.clone())
    }

    pub(crate) fn remember(&self, file: Uuid, progress: Progress) {
        let order = {
            let mut next = self
                .next
                .lock()
                .unwrap_or_else(|poison| poison.into_inner());
            *next += 1;
            *next
        };
        let mut uploads = self
            .uploads
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        if uploads.len() >= REMEMBERED_UPLOADS && !uploads.contains_key(&file) {
            let oldest = uploads
                .iter()
                .min_by_key(|(_, (order, _))| *order)
                .map(|(file, _)| *file);
            if let Some(oldest) = oldest {
                uploads.remove(&oldest);
            }
        }
        uploads.insert(file, (order, progress));
    }

    pub(crate) fn forget(&self, file: &Uuid) {
        let mut uploads = self
            .uploads
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        uploads.remove(file);
    }

    /// A complete file `caller` may read: its uploader's, or one a message delivered to
    /// `caller` carried, while that grant lasts. Anything else reads as not found.
    pub(crate) async fn readable(
        &self,
        caller: &AgentId,
        file: &Uuid,
    ) -> Result<FileRecord, FilesError> {
        let Some((record, _)) = self.store.record(file).await? else {
            return Err(FilesError::NotFound(*file));
        };
        if record.state != FileState::Complete {
            return Err(FilesError::NotFound(*file));
        }
        if record.owner == *caller {
            return Ok(record);
        }
        match self.store.grant(file, caller).await? {
            Some(grant) if grant.until > OffsetDateTime::now_utc() => Ok(record),
            _ => Err(FilesError::NotFound(*file)),
        }
    }

    /// `agent.files.stat`: what a file is and how far its upload got (an upload in progress
    /// is its uploader's alone to see).
    pub async fn stat(&self, caller: &AgentId, query: FileQuery) -> Result<FileView, FilesError> {
        let record = match self.store.record(&query.file_id).await? {
            Some((record, _))
                if record.state == FileState::Uploading && record.owner == *caller =>
            {
                record
            }
            _ => self.readable(caller, &query.file_id).await?,
        };
        let received = match record.state {
            FileState::Complete => record.attachment.size,
            FileState::Uploading => match self.remembered(&query.file_id) {
                Some(progress) => progress.received,
                None => self
                    .store
                    .last_chunk(&record.nuid)
                    .await?
                    .map_or(0, |last| last.received),
            },
        };
        Ok(FileView {
            attachment: record.attachment,
            owner: record.owner,
            state: record.state,
            received,
            expires_at: record.expires_at,
        })
    }

    /// The uploader's own record of `file` (anyone else: not found).
    async fn owned(&self, caller: &AgentId, file: &Uuid) -> Result<(FileRecord, u64), FilesError> {
        match self.store.record(file).await? {
            Some((record, revision)) if record.owner == *caller => Ok((record, revision)),
            _ => Err(FilesError::NotFound(*file)),
        }
    }

    /// `agent.files.revoke`: the uploader takes back one reader, or every one.
    pub async fn revoke(
        &self,
        caller: &AgentId,
        request: RevokeRequest,
    ) -> Result<RevokeReply, FilesError> {
        let file = request.file_id;
        self.owned(caller, &file).await?;
        let readers: Vec<String> = match request.agent_id {
            Some(agent) => match self.store.grant(&file, &agent).await? {
                Some(_) => vec![agent.to_string()],
                None => Vec::new(),
            },
            None => self
                .store
                .grants(&file)
                .await?
                .into_iter()
                .map(|(agent, _)| agent)
                .collect(),
        };
        for agent in &readers {
            self.store.revoke(&file, agent).await?;
        }
        Ok(RevokeReply {
            revoked: readers.len(),
        })
    }

    /// `agent.files.delete`: the uploader removes a file now (its readers lose it too).
    pub async fn delete(
        &self,
        caller: &AgentId,
        query: FileQuery,
    ) -> Result<DeleteReply, FilesError> {
        let (record, revision) = self.owned(caller, &query.file_id).await?;
        let deleted = self.remove(&record, revision).await?;
        Ok(DeleteReply { deleted })
    }

    /// Removes a file: grants, chunks, record (by compare-and-set: of two replicas removing
    /// it, one releases its quota), then the quota. False when another removal came first.
    pub(crate) async fn remove(
        &self,
        record: &FileRecord,
        revision: u64,
    ) -> Result<bool, FilesError> {
        let file = record.attachment.file_ref;
        self.forget(&file);
        // The record first, by compare-and-set: of two removals (or a removal and a change)
        // one alone goes on, and no chunk of a file still recorded is ever purged.
        if !self.store.remove_record(&file, revision).await? {
            return Ok(false);
        }
        for (agent, _) in self.store.grants(&file).await? {
            self.store.revoke(&file, &agent).await?;
        }
        self.store.purge_object(&file, &record.nuid).await?;
        self.store
            .release(&record.owner, charged(record.attachment.size))
            .await?;
        self.event("deleted", record, &record.owner).await;
        Ok(true)
    }

    /// Publishes `agent.files.events.<kind>.<file_id>` into `AGENT_EVENTS` (the audit records
    /// it): the file's digest, size and who acted. A failure is logged, not the request's.
    pub(crate) async fn event(&self, kind: &str, record: &FileRecord, by: &AgentId) {
        let body = serde_json::json!({
            "file_id": record.attachment.file_ref,
            "name": record.attachment.name,
            "size": record.attachment.size,
            "sha256": record.attachment.sha256,
            "owner": record.owner,
            "agent_id": by,
            "at": OffsetDateTime::now_utc()
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default(),
        });
        let subject = switchboard_proto::subject::files_event(kind, &record.attachment.file_ref);
        let published = async {
            self.store
                .js()
                .publish(subject, body.to_string().into())
                .await?
                .await?;
            Ok::<(), async_nats::Error>(())
        };
        if let Err(err) = published.await {
            tracing::warn!(file = %record.attachment.file_ref, kind, error = %err, "a files event was not stored");
        }
    }
}
