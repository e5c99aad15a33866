//! Reading (docs/protocol.md §17, "Downloading"): a read answers with up to sixteen chunks, each
//! a message of its own to the reader's reply inbox with its offset and stream sequence in
//! headers, then a [`ReadEnd`]. The reader goes on from the last chunk's sequence
//! (`after_seq`): one batched direct get, no search. Without it (a reader resuming from an
//! offset alone) the chunk is found by a binary search over the file's stream sequences,
//! at most a few dozen direct gets for any size.

use async_nats::{HeaderMap, Subject};
use switchboard_proto::AgentId;
use switchboard_proto::files::{
    FileRecord, HEADER_CHUNK_SEQ, HEADER_FILE_OFFSET, READ_CHUNKS_MAX, ReadEnd, ReadRequest,
};

use crate::error::FilesError;
use crate::service::Files;

/// Where a read's sending stands.
struct Sending {
    reply: Subject,
    next_offset: u64,
    after_seq: Option<u64>,
    sent: u32,
}

/// Chunks a read answers with when it does not say.
const READ_CHUNKS_DEFAULT: u32 = 4;

impl Files {
    /// `agent.files.read`: chunks from `offset` to `reply`, then where the next read starts.
    pub async fn read(
        &self,
        caller: &AgentId,
        request: ReadRequest,
        reply: Option<Subject>,
    ) -> Result<ReadEnd, FilesError> {
        // The chunks go to the caller's own reply inboxes only (`_INBOX.<caller>.…`), or to
        // the reply subject the server made for a request that crossed from the agents'
        // account (`_R_.…`, under the generated accounts), which leads back to the caller
        // alone: never to a subject the caller names for someone else.
        let own = format!(
            "{}.",
            switchboard_proto::subject::agent_inbox_prefix(caller)
        );
        let Some(reply) = reply.filter(|reply| {
            let reply = reply.as_str();
            (reply.starts_with(&own)
                || reply.starts_with(switchboard_proto::subject::IMPORTED_REPLY_PREFIX))
                && switchboard_proto::subject::is_reply_inbox(reply)
        }) else {
            return Err(FilesError::BadRequest(format!(
                "a read is a request whose reply inbox is the caller's own ({own}…)"
            )));
        };
        let record = self.readable(caller, &request.file_id).await?;
        let size = record.attachment.size;
        let offset = request.offset;
        let chunk_bytes = record.chunk_bytes.max(1);
        if offset > size || !offset.is_multiple_of(chunk_bytes) {
            return Err(FilesError::BadRequest(format!(
                "offset must be a multiple of the file's chunk size, {chunk_bytes}, up to the \
                 size {size}"
            )));
        }
        let max = request
            .chunks
            .unwrap_or(READ_CHUNKS_DEFAULT)
            .clamp(1, READ_CHUNKS_MAX);
        if offset == size {
            return Ok(ReadEnd {
                next_offset: size,
                after_seq: request.after_seq,
                chunks: 0,
                size,
                eof: true,
            });
        }
        let mut sending = Sending {
            reply,
            next_offset: offset,
            after_seq: request.after_seq,
            sent: 0,
        };
        // From the chunk after `after_seq` when that is the one at the offset; otherwise
        // (a reader resuming from an offset alone) from the one a binary search finds.
        let followed = match request.after_seq.and_then(|after| after.checked_add(1)) {
            Some(next) => {
                self.send_chunks(&record.nuid, next, max, &mut sending)
                    .await?
            }
            None => false,
        };
        if !followed {
            let start = self.find(&record, offset).await?;
            self.send_chunks(&record.nuid, start, max, &mut sending)
                .await?;
        }
        let Sending {
            next_offset,
            after_seq,
            sent,
            ..
        } = sending;
        if sent == 0 {
            return Err(FilesError::Store(format!(
                "the chunk at {offset} of {} is missing from the store",
                request.file_id
            )));
        }
        if offset == 0 {
            self.event("read", &record, caller).await;
        }
        Ok(ReadEnd {
            next_offset,
            after_seq,
            chunks: sent,
            size,
            eof: next_offset >= size,
        })
    }

    /// Up to `max` chunks from stream sequence `from` to the reader, each sent as soon as it
    /// is fetched (the fetch of the next overlaps the send of this one), as long as they
    /// follow on from `sending.next_offset`: a wrong `after_seq` must not hand out another
    /// part of the file as this one. Whether any chunk was sent.
    async fn send_chunks(
        &self,
        nuid: &str,
        from: u64,
        max: u32,
        sending: &mut Sending,
    ) -> Result<bool, FilesError> {
        let (fetched, mut arrived) = tokio::sync::mpsc::unbounded_channel();
        let fetch = self.store.each_chunk_from(nuid, from, max, move |chunk| {
            // The channel holds at most `max` chunks (16 at most); a send loop that stopped
            // early just leaves the rest unread.
            let _ = fetched.send(chunk);
        });
        let client = self.store.js().client();
        let before = sending.sent;
        let send = async {
            while let Some(chunk) = arrived.recv().await {
                if chunk.offset != sending.next_offset {
                    break;
                }
                let mut headers = HeaderMap::new();
                headers.insert(HEADER_FILE_OFFSET, chunk.offset.to_string().as_str());
                headers.insert(HEADER_CHUNK_SEQ, chunk.seq.to_string().as_str());
                sending.next_offset = chunk.offset + chunk.payload.len() as u64;
                sending.after_seq = Some(chunk.seq);
                client
                    .publish_with_headers(sending.reply.clone(), headers, chunk.payload)
                    .await
                    .map_err(|err| FilesError::store("sending a chunk", err))?;
                sending.sent += 1;
            }
            Ok::<(), FilesError>(())
        };
        let (fetch, send) = tokio::join!(fetch, send);
        send?;
        fetch?;
        Ok(sending.sent > before)
    }

    /// The stream sequence of the chunk at `offset`, found by a binary search between the
    /// file's first and last chunk sequences (chunks are stored in order).
    async fn find(&self, record: &FileRecord, offset: u64) -> Result<u64, FilesError> {
        let missing = || {
            FilesError::Store(format!(
                "the chunks of {} are missing",
                record.attachment.file_ref
            ))
        };
        let (mut low, mut high) = record.chunk_seqs.ok_or_else(missing)?;
        while low <= high {
            let middle = low + (high - low) / 2;
            let probe = self.store.chunks_from(&record.nuid, middle, 1).await?;
            let Some(chunk) = probe.first() else {
                return Err(missing());
            };
            if chunk.offset == offset {
                return Ok(chunk.seq);
            }
            if chunk.offset < offset {
                low = chunk.seq + 1;
            } else if middle == 0 {
                break;
            } else {
                high = middle - 1;
            }
        }
        Err(missing())
    }
}
