//! Where files live: their bytes in the Object Store bucket `agent_files` (stream
//! `OBJ_agent_files`: chunks on `$O.agent_files.C.<nuid>`, the object's info on
//! `$O.agent_files.M.<name>`, written in the Object Store's own format so any NATS tool reads a
//! finished file), and their records, grants and quotas in KV `agent_files_index`
//! (docs/protocol.md §17, "State").

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::object_store::{ObjectInfo, ObjectOptions};
use async_nats::jetstream::{self, kv, stream};
use base64::Engine;
use bytes::Bytes;
use switchboard_proto::files::{
    FILE_CHUNK_BYTES, FileRecord, Grant, HEADER_DIGEST_STATE, HEADER_FILE_OFFSET, QuotaRecord,
    file_key, grant_key, grants_of, quota_key,
};
use switchboard_proto::{AgentId, FILES_BUCKET};
use switchboard_request::kv::{SnapshotError, already_exists, lost_expectation, lost_revision};
use uuid::Uuid;

use crate::error::FilesError;

/// Compare-and-set attempts on one quota before the request is answered `unavailable`.
const CAS_ATTEMPTS: u32 = 32;
/// How long one batched read of chunks may take.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The last chunk stored for an upload: where the next goes, and the digest so far.
#[derive(Debug, Clone)]
pub struct LastChunk {
    /// Its stream sequence (the next chunk's expected last subject sequence).
    pub seq: u64,
    /// Where the next chunk starts.
    pub received: u64,
    /// The digest's state header after it.
    pub digest_state: String,
}

/// One chunk read back.
#[derive(Debug, Clone)]
pub struct StoredChunk {
    /// Its stream sequence.
    pub seq: u64,
    /// Where its bytes start in the file.
    pub offset: u64,
    /// Its bytes.
    pub payload: Bytes,
}

/// The files' store.
#[derive(Debug, Clone)]
pub struct Store {
    js: jetstream::Context,
    objects: stream::Stream,
    index: kv::Store,
}

impl Store {
    /// A store on the object stream and the index bucket (both applied by the caller).
    pub fn new(js: jetstream::Context, objects: stream::Stream, index: kv::Store) -> Self {
        Self { js, objects, index }
    }

    /// The subject of a file's chunks.
    pub fn chunk_subject(nuid: &str) -> String {
        format!("$O.{FILES_BUCKET}.C.{nuid}")
    }

    /// The subject of a finished file's Object Store info (its name is the file id).
    fn meta_subject(file: &Uuid) -> String {
        let name = base64::engine::general_purpose::URL_SAFE.encode(file.to_string());
        format!("$O.{FILES_BUCKET}.M.{name}")
    }

    /// A file's record and its revision.
    pub async fn record(&self, file: &Uuid) -> Result<Option<(FileRecord, u64)>, FilesError> {
        let entry = self
            .index
            .entry(file_key(file))
            .await
            .map_err(|err| FilesError::store("reading a file record", err))?;
        match entry {
            Some(entry) if entry.operation == kv::Operation::Put => {
                let record = serde_json::from_slice(&entry.value)
                    .map_err(|err| FilesError::store("decoding a file record", err))?;
                Ok(Some((record, entry.revision)))
            }
            _ => Ok(None),
        }
    }

    /// Writes a new file's record: false when one exists under its id already.
    pub async fn create_record(&self, record: &FileRecord) -> Result<bool, FilesError> {
        let key = file_key(&record.attachment.file_ref);
        match self.index.create(&key, encode(record)?).await {
            Ok(_) => Ok(true),
            Err(err) if already_exists(&err) => Ok(false),
            Err(err) => Err(FilesError::store("writing a file record", err)),
        }
    }

    /// Replaces a record written at `revision`; false when it changed meanwhile.
    pub async fn update_record(
        &self,
        record: &FileRecord,
        revision: u64,
    ) -> Result<bool, FilesError> {
        let key = file_key(&record.attachment.file_ref);
        match self.index.update(&key, encode(record)?, revision).await {
            Ok(_) => Ok(true),
            Err(err) if lost_revision(&err) => Ok(false),
            Err(err) => Err(FilesError::store("updating a file record", err)),
        }
    }

    /// Removes a file's record as written at `revision`: false when it changed meanwhile (so
    /// of two replicas removing one file, one alone goes on to release its quota).
    pub async fn remove_record(&self, file: &Uuid, revision: u64) -> Result<bool, FilesError> {
        match self
            .index
            .purge_expect_revision(file_key(file), Some(revision))
            .await
        {
            Ok(()) => Ok(true),
            Err(err) if err.to_string().contains("wrong last sequence") => Ok(false),
            Err(err) => Err(FilesError::store("removing a file record", err)),
        }
    }

    /// An agent's grant on a file, if it has one.
    pub async fn grant(&self, file: &Uuid, agent: &AgentId) -> Result<Option<Grant>, FilesError> {
        let entry = self
            .index
            .entry(grant_key(file, agent))
            .await
            .map_err(|err| FilesError::store("reading a grant", err))?;
        match entry {
            Some(entry) if entry.operation == kv::Operation::Put => {
                serde_json::from_slice(&entry.value)
                    .map(Some)
                    .map_err(|err| FilesError::store("decoding a grant", err))
            }
            _ => Ok(None),
        }
    }

    /// Every grant on a file: (agent id, grant).
    pub async fn grants(&self, file: &Uuid) -> Result<Vec<(String, Grant)>, FilesError> {
        let entries = switchboard_request::kv::snapshot(&self.js, &self.index, &grants_of(file))
            .await
            .map_err(|err: SnapshotError| FilesError::store("listing grants", err))?;
        let prefix = format!("grant.{file}.");
        Ok(entries
            .into_iter()
            .filter_map(|entry| {
                let agent = entry.key.strip_prefix(&prefix)?.to_owned();
                let grant = serde_json::from_slice(&entry.value).ok()?;
                Some((agent, grant))
            })
            .collect())
    }

    /// Removes one grant.
    pub async fn revoke(&self, file: &Uuid, agent: &str) -> Result<(), FilesError> {
        self.index
            .purge(format!("grant.{file}.{agent}"))
            .await
            .map_err(|err| FilesError::store("removing a grant", err))
    }

    /// Counts `size` more bytes against `agent`'s quota, unless that passes `quota`.
    pub async fn reserve(&self, agent: &AgentId, size: u64, quota: u64) -> Result<(), FilesError> {
        self.change_quota(agent, |used| match used.checked_add(size) {
            Some(total) if total <= quota => Ok(total),
            _ => Err(FilesError::QuotaExceeded { size, used, quota }),
        })
        .await
    }

    /// Counts `size` bytes fewer against `agent`'s quota.
    pub async fn release(&self, agent: &AgentId, size: u64) -> Result<(), FilesError> {
        self.change_quota(agent, |used| Ok(used.saturating_sub(size)))
            .await
    }

    async fn change_quota(
        &self,
        agent: &AgentId,
        change: impl Fn(u64) -> Result<u64, FilesError>,
    ) -> Result<(), FilesError> {
        let key = quota_key(agent);
        for attempt in 0..CAS_ATTEMPTS {
            let entry = self
                .index
                .entry(&key)
                .await
                .map_err(|err| FilesError::store("reading a quota", err))?;
            let (used, revision) = match &entry {
                Some(entry) if entry.operation == kv::Operation::Put => (
                    serde_json::from_slice::<QuotaRecord>(&entry.value)
                        .map_err(|err| FilesError::store("decoding a quota", err))?
                        .used,
                    Some(entry.revision),
                ),
                _ => (0, None),
            };
            let value = encode(&QuotaRecord {
                used: change(used)?,
            })?;
            let written = match revision {
                Some(revision) => match self.index.update(&key, value, revision).await {
                    Ok(_) => true,
                    Err(err) if lost_revision(&err) => false,
                    Err(err) => return Err(FilesError::store("writing a quota", err)),
                },
                None => match self.index.create(&key, value).await {
                    Ok(_) => true,
                    Err(err) if already_exists(&err) => false,
                    Err(err) => return Err(FilesError::store("writing a quota", err)),
                },
            };
            if written {
                return Ok(());
            }
            switchboard_runtime::store::cas_backoff(attempt).await;
        }
        Err(FilesError::Store(format!(
            "the quota of `{agent}` kept changing; retry"
        )))
    }

    /// The last chunk stored on `nuid`'s subject, if any.
    pub async fn last_chunk(&self, nuid: &str) -> Result<Option<LastChunk>, FilesError> {
        use async_nats::jetstream::stream::LastRawMessageErrorKind;
        let message = match self
            .objects
            .get_last_raw_message_by_subject(&Self::chunk_subject(nuid))
            .await
        {
            Ok(message) => message,
            Err(err) if err.kind() == LastRawMessageErrorKind::NoMessageFound => return Ok(None),
            Err(err) => return Err(FilesError::store("reading the last chunk", err)),
        };
        let headers = &message.headers;
        let offset = header_u64(headers, HEADER_FILE_OFFSET)
            .ok_or_else(|| FilesError::Store("a stored chunk without its offset".to_owned()))?;
        let digest_state = headers
            .get(HEADER_DIGEST_STATE)
            .map(|value| value.as_str().to_owned())
            .unwrap_or_default();
        Ok(Some(LastChunk {
            seq: message.sequence,
            received: offset + message.payload.len() as u64,
            digest_state,
        }))
    }

    /// Stores one chunk after the one at `after_seq` (0: the first), keyed so a repeat is
    /// stored once. Returns its sequence, or `None` when another chunk came first.
    pub async fn put_chunk(
        &self,
        file: &Uuid,
        nuid: &str,
        offset: u64,
        payload: Bytes,
        digest_state: &str,
        after_seq: u64,
    ) -> Result<Option<u64>, FilesError> {
        let mut headers = HeaderMap::new();
        headers.insert(HEADER_FILE_OFFSET, offset.to_string().as_str());
        headers.insert(HEADER_DIGEST_STATE, digest_state);
        let publish = jetstream::message::PublishMessage::build()
            .headers(headers)
            .payload(payload)
            .message_id(format!("{file}:{offset}"))
            .expected_last_subject_sequence(after_seq);
        let ack = self
            .js
            .send_publish(Self::chunk_subject(nuid), publish)
            .await
            .map_err(|err| FilesError::store("storing a chunk", err))?;
        match ack.await {
            Ok(ack) if ack.duplicate => Ok(None),
            Ok(ack) => Ok(Some(ack.sequence)),
            Err(err) if lost_expectation(&err) => Ok(None),
            Err(err) => Err(FilesError::store("storing a chunk", err)),
        }
    }

    /// Writes a finished file's Object Store info (`chunks` chunks on `record.nuid`).
    pub async fn put_object_info(
        &self,
        record: &FileRecord,
        chunks: usize,
    ) -> Result<(), FilesError> {
        let digest = hex_to_bytes(&record.attachment.sha256);
        let info = ObjectInfo {
            name: record.attachment.file_ref.to_string(),
            description: Some(record.attachment.name.clone()),
            metadata: [
                ("name".to_owned(), record.attachment.name.clone()),
                (
                    "media_type".to_owned(),
                    record.attachment.media_type.clone(),
                ),
                ("owner".to_owned(), record.owner.to_string()),
            ]
            .into(),
            headers: None,
            options: Some(ObjectOptions {
                link: None,
                max_chunk_size: Some(
                    usize::try_from(record.chunk_bytes).unwrap_or(FILE_CHUNK_BYTES),
                ),
            }),
            bucket: FILES_BUCKET.to_owned(),
            nuid: record.nuid.clone(),
            size: usize::try_from(record.attachment.size).unwrap_or(usize::MAX),
            chunks,
            modified: Some(record.created_at),
            digest: Some(format!(
                "SHA-256={}",
                base64::engine::general_purpose::URL_SAFE.encode(digest)
            )),
            deleted: false,
        };
        let mut headers = HeaderMap::new();
        headers.insert(async_nats::header::NATS_ROLLUP, "sub");
        let payload = serde_json::to_vec(&info)
            .map_err(|err| FilesError::store("encoding an object's info", err))?;
        self.js
            .publish_with_headers(
                Self::meta_subject(&record.attachment.file_ref),
                headers,
                payload.into(),
            )
            .await
            .map_err(|err| FilesError::store("writing an object's info", err))?
            .await
            .map_err(|err| FilesError::store("writing an object's info", err))?;
        Ok(())
    }

    /// Removes a file's chunks and Object Store info.
    pub async fn purge_object(&self, file: &Uuid, nuid: &str) -> Result<(), FilesError> {
        for subject in [Self::chunk_subject(nuid), Self::meta_subject(file)] {
            self.objects
                .purge()
                .filter(subject)
                .await
                .map_err(|err| FilesError::store("removing a file's chunks", err))?;
        }
        Ok(())
    }

    /// Up to `max` chunks of `nuid` from stream sequence `from` on, in order.
    pub async fn chunks_from(
        &self,
        nuid: &str,
        from: u64,
        max: u32,
    ) -> Result<Vec<StoredChunk>, FilesError> {
        let mut chunks = Vec::new();
        self.each_chunk_from(nuid, from, max, |chunk| chunks.push(chunk))
            .await?;
        Ok(chunks)
    }

    /// [`Store::chunks_from`], each chunk handed to `each` as it arrives (a read sends one
    /// on while the next is fetched).
    pub async fn each_chunk_from(
        &self,
        nuid: &str,
        from: u64,
        max: u32,
        mut each: impl FnMut(StoredChunk),
    ) -> Result<(), FilesError> {
        let request = serde_json::json!({
            "seq": from.max(1),
            "next_by_subj": Self::chunk_subject(nuid),
            "batch": max,
        });
        let stream_name = self.objects.cached_info().config.name.clone();
        switchboard_request::kv::direct_batch(
            &self.js,
            &stream_name,
            &request,
            READ_TIMEOUT,
            |message| {
                let headers = message.headers.clone().unwrap_or_default();
                let seq = switchboard_request::kv::direct_sequence(&message)?;
                let offset = header_u64(&headers, HEADER_FILE_OFFSET)
                    .ok_or_else(|| "a stored chunk without its offset".to_owned())?;
                each(StoredChunk {
                    seq,
                    offset,
                    payload: message.payload,
                });
                Ok(())
            },
        )
        .await
        .map_err(|err| FilesError::store("reading chunks", err))?;
        Ok(())
    }

    /// The index bucket (the sweeper lists its records).
    pub fn index(&self) -> &kv::Store {
        &self.index
    }

    /// The JetStream context.
    pub fn js(&self) -> &jetstream::Context {
        &self.js
    }

    /// When the last chunk of `nuid` was stored, if any.
    pub async fn last_chunk_at(
        &self,
        nuid: &str,
    ) -> Result<Option<time::OffsetDateTime>, FilesError> {
        use async_nats::jetstream::stream::LastRawMessageErrorKind;
        match self
            .objects
            .get_last_raw_message_by_subject(&Self::chunk_subject(nuid))
            .await
        {
            Ok(message) => Ok(Some(message.time)),
            Err(err) if err.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
            Err(err) => Err(FilesError::store("reading the last chunk", err)),
        }
    }
}

fn encode<T: serde::Serialize>(value: &T) -> Result<Bytes, FilesError> {
    serde_json::to_vec(value)
        .map(Bytes::from)
        .map_err(|err| FilesError::store("encoding a record", err))
}

fn header_u64(headers: &HeaderMap, name: &str) -> Option<u64> {
    headers.get(name)?.as_str().parse().ok()
}

/// A checked hex digest's bytes.
fn hex_to_bytes(hex: &str) -> Vec<u8> {
    hex.as_bytes()
        .chunks(2)
        .filter_map(|pair| u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok())
        .collect()
}
