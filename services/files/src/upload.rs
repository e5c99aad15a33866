//! Uploading (docs/protocol.md §17, "Uploading"): an upload is declared with its size and
//! digest (quota and size checked before any data moves), then its chunks come in order, each
//! a request of its own, to whichever replica. The stored chunks are the upload's progress:
//! the last one names where the next starts and carries the digest's state, and each is
//! stored only right after the one before (`Nats-Expected-Last-Subject-Sequence`), so two
//! replicas never both append. A replica remembers the uploads it saw last to skip reading
//! the last chunk back. The last chunk's digest is checked before it is stored; the Object
//! Store's info is written, and the file is complete.

use async_nats::Message;
use switchboard_proto::files::{
    Attachment, ChunkReply, FILE_CHUNK_BYTES, FileRecord, FileState, HEADER_FILE_ID,
    HEADER_FILE_OFFSET, UploadReply, UploadRequest, check_media_type, check_name, check_sha256,
    scoped_file_id,
};
use switchboard_proto::{AgentId, new_id};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::digest::{Running, hex};
use crate::error::FilesError;
use crate::service::{Files, Progress, charged};

impl Files {
    /// `agent.files.upload`: declares an upload; its bytes count against the caller's quota
    /// from now on. An empty file is complete at once.
    pub async fn upload(
        &self,
        caller: &AgentId,
        request: UploadRequest,
    ) -> Result<UploadReply, FilesError> {
        let bad =
            |err: switchboard_proto::files::FileFieldError| FilesError::BadRequest(err.to_string());
        check_name(&request.name).map_err(bad)?;
        check_media_type(&request.media_type).map_err(bad)?;
        let sha256 = check_sha256(&request.sha256).map_err(bad)?;
        if request.size > self.config.max_file_bytes {
            return Err(FilesError::TooLarge {
                size: request.size,
                max: self.config.max_file_bytes,
            });
        }
        if request.size == 0 {
            let empty = hex(&Running::default().finish(&[]));
            if empty != sha256 {
                return Err(FilesError::DigestMismatch {
                    declared: sha256,
                    actual: empty,
                });
            }
        }
        let file_id = match request.upload_id {
            Some(upload_id) => scoped_file_id(caller, upload_id),
            None => new_id(),
        };
        if let Some((existing, _)) = self.store.record(&file_id).await? {
            // The same upload again (a retry, a hedged copy): where it stands.
            return self
                .again(
                    caller,
                    existing,
                    &request.name,
                    &request.media_type,
                    request.size,
                    &sha256,
                )
                .await;
        }
        let request_size = request.size;
        self.store
            .reserve(caller, charged(request_size), self.config.quota_bytes)
            .await?;
        let now = OffsetDateTime::now_utc();
        let mut record = FileRecord {
            attachment: Attachment {
                name: request.name,
                media_type: request.media_type,
                size: request.size,
                sha256,
                file_ref: file_id,
            },
            owner: caller.clone(),
            state: FileState::Uploading,
            nuid: file_id.simple().to_string(),
            created_at: now,
            expires_at: now + self.idle(),
            chunk_seqs: None,
            chunk_bytes: self.chunk_bytes as u64,
        };
        if request.size == 0 {
            record.state = FileState::Complete;
            record.expires_at = now + self.retention();
            self.store.put_object_info(&record, 0).await?;
        }
        let created = self.store.create_record(&record).await;
        if !matches!(created, Ok(true)) {
            // Not created by this request: a copy of it made it first (holding a reservation
            // of its own), or the create failed — or took effect unseen, when the record is
            // there now and is this request's (then its reservation stays).
            let existing = self.store.record(&file_id).await?;
            if created.is_ok() || existing.is_none() {
                self.store.release(caller, charged(request_size)).await?;
            }
            let Some((existing, _)) = existing else {
                return Err(created.err().unwrap_or_else(|| {
                    FilesError::Store("the upload's record vanished; retry".to_owned())
                }));
            };
            let attachment = record.attachment;
            return self
                .again(
                    caller,
                    existing,
                    &attachment.name,
                    &attachment.media_type,
                    attachment.size,
                    &attachment.sha256,
                )
                .await;
        }
        if record.state == FileState::Complete {
            self.event("uploaded", &record, caller).await;
        }
        Ok(UploadReply {
            file_id,
            chunk_bytes: self.chunk_bytes,
            received: 0,
            idle_ms: self.config.upload_idle_secs * 1000,
        })
    }

    /// An upload declared again: the same one answers where it stands; anything else under
    /// its id is `conflict`.
    async fn again(
        &self,
        caller: &AgentId,
        existing: FileRecord,
        name: &str,
        media_type: &str,
        size: u64,
        sha256: &str,
    ) -> Result<UploadReply, FilesError> {
        let declared = &existing.attachment;
        if existing.owner != *caller
            || declared.name != name
            || declared.media_type != media_type
            || declared.size != size
            || declared.sha256 != sha256
        {
            return Err(FilesError::Conflict(
                "this upload_id names another upload of yours; choose a fresh one".to_owned(),
            ));
        }
        let received = match existing.state {
            FileState::Complete => size,
            FileState::Uploading => self.progress(&existing, 0).await?.received,
        };
        Ok(UploadReply {
            file_id: declared.file_ref,
            chunk_bytes: usize::try_from(existing.chunk_bytes).unwrap_or(FILE_CHUNK_BYTES),
            received,
            idle_ms: self.config.upload_idle_secs * 1000,
        })
    }

    /// `agent.files.chunk`: one chunk, the bytes in the body, the file and the offset in the
    /// headers. A repeat of a stored chunk is answered as it was; one out of order is
    /// `conflict`, naming the offset the upload goes on from.
    pub async fn chunk(
        &self,
        caller: &AgentId,
        message: &Message,
    ) -> Result<ChunkReply, FilesError> {
        let (file, offset) = chunk_headers(message)?;
        // A client may send a chunk before the previous one's reply: one that follows a chunk
        // this replica is storing, or one waiting here, waits for it (`window.rs`), then goes
        // on from it. It is in flight itself before it waits, so the chunk after it waits too.
        let end = offset.saturating_add(message.payload.len() as u64);
        let _flight = self.in_flight.start(file, end);
        // (An empty chunk, or one at the end of the offsets, would wait for itself: it is
        // refused below without waiting.)
        if end > offset {
            self.in_flight
                .after(file, offset, crate::window::WAIT)
                .await;
        }
        self.chunk_in_order(caller, message, file, offset).await
    }

    async fn chunk_in_order(
        &self,
        caller: &AgentId,
        message: &Message,
        file: Uuid,
        offset: u64,
    ) -> Result<ChunkReply, FilesError> {
        let payload = message.payload.clone();
        let remembered = self.remembered(&file);
        let (record, revision) = match &remembered {
            Some(progress) => (progress.record.clone(), progress.revision),
            None => match self.store.record(&file).await? {
                Some(found) => found,
                None => return Err(FilesError::NotFound(file)),
            },
        };
        if record.owner != *caller {
            return Err(FilesError::NotFound(file));
        }
        let size = record.attachment.size;
        if record.state == FileState::Complete {
            // A repeat of the last chunk, whose reply was lost.
            return Ok(ChunkReply {
                received: size,
                attachment: Some(record.attachment),
            });
        }
        let end = offset
            .checked_add(payload.len() as u64)
            .filter(|end| *end <= size)
            .ok_or_else(|| {
                FilesError::BadRequest(format!(
                    "the chunk at {offset} of {} bytes ends past the declared size {size}",
                    payload.len()
                ))
            })?;
        let last = end == size;
        let chunk_bytes = record.chunk_bytes;
        if payload.is_empty() || (!last && payload.len() as u64 != chunk_bytes) {
            return Err(FilesError::BadRequest(format!(
                "every chunk but the last is {chunk_bytes} bytes (the upload's chunk_bytes), the \
                 last one the rest (at least 1)"
            )));
        }
        let progress = match remembered {
            // What this replica stored last, unless another replica has gone on since (the
            // chunk is not the one that follows it): then where the stream stands.
            Some(progress) if progress.received == offset => progress,
            Some(_) => {
                self.forget(&file);
                self.progress(&record, revision).await?
            }
            None => self.progress(&record, revision).await?,
        };
        if progress.received == size {
            // Every chunk is stored but the upload was not completed (its replica failed
            // after the last store): complete it now.
            let attachment = self.complete(record, revision, progress.seq).await?;
            return Ok(ChunkReply {
                received: size,
                attachment: Some(attachment),
            });
        }
        if offset < progress.received && end <= progress.received {
            return Ok(ChunkReply {
                received: progress.received,
                attachment: None,
            });
        }
        if offset != progress.received {
            return Err(FilesError::OutOfOrder {
                expected: progress.received,
                got: offset,
            });
        }
        let mut digest = progress.digest.clone();
        let state = match last {
            true => {
                let actual = hex(&digest.clone().finish(&payload));
                if actual != record.attachment.sha256 {
                    self.abort(&record, revision).await;
                    return Err(FilesError::DigestMismatch {
                        declared: record.attachment.sha256.clone(),
                        actual,
                    });
                }
                String::new()
            }
            false => {
                digest.update(&payload);
                digest.to_header()
            }
        };
        let stored = self
            .store
            .put_chunk(&file, &record.nuid, offset, payload, &state, progress.seq)
            .await?;
        let Some(seq) = stored else {
            // Another copy of this chunk, or another chunk, was stored first: read where the
            // upload stands.
            self.forget(&file);
            // Removed meanwhile (deleted, given up): gone, not out of order.
            if self.store.record(&file).await?.is_none() {
                return Err(FilesError::NotFound(file));
            }
            let now = self.progress(&record, revision).await?;
            return match now.received >= end {
                true => Ok(ChunkReply {
                    received: now.received,
                    attachment: None,
                }),
                false => Err(FilesError::OutOfOrder {
                    expected: now.received,
                    got: offset,
                }),
            };
        };
        if offset == 0 && self.store.record(&file).await?.is_none() {
            // Removed while its first chunk was on its way (the only chunk a removal's purge
            // cannot turn away: it expects an empty subject): take it out again.
            self.forget(&file);
            self.store.purge_object(&file, &record.nuid).await?;
            return Err(FilesError::NotFound(file));
        }
        if !last {
            self.remember(
                file,
                Progress {
                    record,
                    revision,
                    seq,
                    received: end,
                    digest,
                },
            );
            return Ok(ChunkReply {
                received: end,
                attachment: None,
            });
        }
        self.forget(&file);
        let attachment = self.complete(record, revision, seq).await?;
        Ok(ChunkReply {
            received: size,
            attachment: Some(attachment),
        })
    }

    /// Where an upload stands (its record as read at `revision`): this replica's memory of
    /// it, or its last stored chunk.
    async fn progress(&self, record: &FileRecord, revision: u64) -> Result<Progress, FilesError> {
        let file = record.attachment.file_ref;
        if let Some(progress) = self.remembered(&file) {
            return Ok(progress);
        }
        let Some(last) = self.store.last_chunk(&record.nuid).await? else {
            return Ok(Progress {
                record: record.clone(),
                revision,
                seq: 0,
                received: 0,
                digest: Running::default(),
            });
        };
        // The last chunk carries no state (the digest was finished): nothing is left to hash.
        let digest = match last.received == record.attachment.size {
            true => Running::default(),
            false => Running::from_header(&last.digest_state, last.received).ok_or_else(|| {
                FilesError::Store(format!("the last chunk of {file} carries no digest state"))
            })?,
        };
        Ok(Progress {
            record: record.clone(),
            revision,
            seq: last.seq,
            received: last.received,
            digest,
        })
    }

    /// The last chunk is stored: the Object Store's info, then the record says complete.
    async fn complete(
        &self,
        mut record: FileRecord,
        revision: u64,
        last_seq: u64,
    ) -> Result<Attachment, FilesError> {
        let first_seq = self
            .store
            .chunks_from(&record.nuid, 1, 1)
            .await?
            .first()
            .map(|chunk| chunk.seq)
            .ok_or_else(|| {
                FilesError::Store("the upload's first chunk could not be read; retry".to_owned())
            })?;
        let chunks = record.attachment.size.div_ceil(record.chunk_bytes.max(1));
        self.store
            .put_object_info(&record, usize::try_from(chunks).unwrap_or(usize::MAX))
            .await?;
        record.state = FileState::Complete;
        record.expires_at = OffsetDateTime::now_utc() + self.retention();
        record.chunk_seqs = Some((first_seq, last_seq));
        if !self.store.update_record(&record, revision).await? {
            // Completed by a copy of this chunk at another replica meanwhile, or removed.
            return match self.store.record(&record.attachment.file_ref).await? {
                Some((now, _)) if now.state == FileState::Complete => Ok(now.attachment),
                _ => Err(FilesError::NotFound(record.attachment.file_ref)),
            };
        }
        self.event("uploaded", &record, &record.owner).await;
        Ok(record.attachment)
    }

    /// Gives an upload up: its chunks, its record and its bytes of the quota.
    pub(crate) async fn abort(&self, record: &FileRecord, revision: u64) {
        let file = record.attachment.file_ref;
        self.forget(&file);
        // The record first (compare-and-set): a replica whose memory of the upload is stale
        // (another completed it) removes nothing.
        let removed = async {
            if self.store.remove_record(&file, revision).await? {
                self.store.purge_object(&file, &record.nuid).await?;
                self.store
                    .release(&record.owner, charged(record.attachment.size))
                    .await?;
            }
            Ok::<(), FilesError>(())
        };
        if let Err(err) = removed.await {
            tracing::warn!(%file, error = %err, "removing an upload failed; the sweeper retries");
        }
    }
}

/// A chunk's file id and offset, from its headers.
fn chunk_headers(message: &Message) -> Result<(Uuid, u64), FilesError> {
    let missing = || {
        FilesError::BadRequest(format!(
            "a chunk carries the headers {HEADER_FILE_ID} (the file id) and {HEADER_FILE_OFFSET} (where its bytes start)"
        ))
    };
    let headers = message.headers.as_ref().ok_or_else(missing)?;
    let file = headers
        .get(HEADER_FILE_ID)
        .and_then(|value| Uuid::try_parse(value.as_str()).ok())
        .ok_or_else(missing)?;
    let offset = headers
        .get(HEADER_FILE_OFFSET)
        .and_then(|value| value.as_str().parse::<u64>().ok())
        .ok_or_else(missing)?;
    Ok((file, offset))
}
