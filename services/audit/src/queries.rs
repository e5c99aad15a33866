//! The queries: `agent.audit.thread`, `history`, `pending`, `export`, `verify`. Anyone allowed
//! by NATS permissions may ask; answers come from this replica's index (caught up with the
//! stream before each query), except `verify`, which reads the stream itself.

use std::sync::Arc;

use async_nats::{Client, HeaderMap, Subject};
use bytes::Bytes;
use switchboard_proto::audit::{
    AuditEntry, AuditRecords, ExportDone, HEADER_EXPORT, HISTORY_LIMIT_DEFAULT, HISTORY_LIMIT_MAX,
    HistoryRequest, ThreadRequest, VerifyReply,
};
use switchboard_proto::budget::{CostQuery, CostReport};

use crate::error::AuditError;
use crate::index::{Index, IndexError};
use crate::trail::Trail;

/// Largest export chunk (JSON lines), in bytes.
const CHUNK_BYTES: usize = 60 * 1024;
/// Records read from the index per export page.
const EXPORT_PAGE: usize = 500;
/// Most bytes of records in one reply, whatever the server allows.
const REPLY_BUDGET_MAX: usize = 900 * 1024;
/// Room kept under the server's `max_payload` for the reply's envelope and headers.
const REPLY_HEADROOM: usize = 64 * 1024;

/// Cuts `records` to what fits a reply of `budget` bytes; true when something was cut.
fn fit(records: &mut Vec<AuditEntry>, budget: usize) -> bool {
    let mut size = 0;
    for (i, entry) in records.iter().enumerate() {
        size += serde_json::to_vec(entry).map_or(usize::MAX, |b| b.len());
        if size > budget {
            records.truncate(i.max(1));
            return true;
        }
    }
    false
}

/// The query side.
#[derive(Debug)]
pub struct Queries {
    client: Client,
    trail: Arc<Trail>,
}

/// Runs an index call on a blocking thread.
async fn blocking<T: Send + 'static>(
    index: Arc<Index>,
    call: impl FnOnce(&Index) -> Result<T, IndexError> + Send + 'static,
) -> Result<T, AuditError> {
    tokio::task::spawn_blocking(move || call(&index))
        .await
        .map_err(AuditError::IndexThread)?
        .map_err(AuditError::QueryIndex)
}

impl Queries {
    /// Wires the parts together.
    pub fn new(client: Client, trail: Arc<Trail>) -> Self {
        Self { client, trail }
    }

    /// How many bytes of records a reply may carry: below the connected server's
    /// `max_payload` (a deployment may lower it, e.g. to 256 KiB) and at most 900 KiB.
    fn budget(&self) -> usize {
        self.client
            .server_info()
            .max_payload
            .saturating_sub(REPLY_HEADROOM)
            .clamp(REPLY_HEADROOM, REPLY_BUDGET_MAX)
    }

    /// The index, caught up with the stream first (so a query sees what was appended by any
    /// replica before it was asked).
    async fn fresh_index(&self) -> Result<Arc<Index>, AuditError> {
        self.trail.catch_up().await?;
        Ok(self.trail.index())
    }

    /// thread: the conversation around a message, call or task.
    pub async fn thread(&self, request: ThreadRequest) -> Result<AuditRecords, AuditError> {
        if request.message_id.is_none()
            && request.correlation_id.is_none()
            && request.task_id.is_none()
        {
            return Err(AuditError::ThreadWithoutId);
        }
        let index = self.fresh_index().await?;
        let mut records = blocking(index, move |index| {
            index.thread(request.message_id, request.correlation_id, request.task_id)
        })
        .await?;
        // Pages of a long thread: skip what was read, cut to one reply, say where to go on.
        let skip = usize::try_from(request.cursor.unwrap_or(0)).unwrap_or(usize::MAX);
        records.drain(..skip.min(records.len()));
        let truncated = fit(&mut records, self.budget());
        let next_cursor = truncated.then(|| (skip + records.len()) as u64);
        Ok(AuditRecords {
            records,
            next_cursor,
            truncated,
        })
    }

    /// history: records matching a filter, paged by sequence.
    pub async fn history(&self, request: HistoryRequest) -> Result<AuditRecords, AuditError> {
        let limit = request.limit.unwrap_or(HISTORY_LIMIT_DEFAULT);
        if limit == 0 || limit > HISTORY_LIMIT_MAX {
            return Err(AuditError::HistoryLimit);
        }
        let index = self.fresh_index().await?;
        let cursor = request.cursor.unwrap_or(0);
        let mut records = blocking(index, move |index| {
            index.history(&request, cursor, limit + 1)
        })
        .await?;
        let more = records.len() > limit;
        records.truncate(limit);
        let next_cursor = if fit(&mut records, self.budget()) || more {
            records.last().map(|e| e.seq)
        } else {
            None
        };
        Ok(AuditRecords {
            records,
            next_cursor,
            truncated: false,
        })
    }

    /// cost: a budget tree's cost, or one agent's spend per tree (docs/protocol.md §16).
    pub async fn cost(&self, request: CostQuery) -> Result<CostReport, AuditError> {
        let index = self.fresh_index().await?;
        match (request.root, request.agent_id) {
            (Some(root), None) => {
                let entries =
                    blocking(index, move |index| index.budget_tree(&root.to_string())).await?;
                Ok(crate::cost::tree(root, &entries))
            }
            (None, Some(agent)) if (1..=256).contains(&agent.len()) => {
                let who = agent.clone();
                let entries = blocking(index, move |index| {
                    index.budget_spent_by(&who, crate::cost::AGENT_SPENDS_MAX)
                })
                .await?;
                Ok(crate::cost::agent(&agent, &entries))
            }
            _ => Err(AuditError::CostWithoutOne),
        }
    }

    /// pending: requests that expect a reply and have none.
    pub async fn pending(&self) -> Result<AuditRecords, AuditError> {
        let index = self.fresh_index().await?;
        let mut records = blocking(index, Index::pending).await?;
        let truncated = fit(&mut records, self.budget());
        Ok(AuditRecords {
            records,
            next_cursor: None,
            truncated,
        })
    }

    /// verify: the hash chain over the whole stream.
    pub async fn verify(&self) -> Result<VerifyReply, AuditError> {
        self.trail.verify().await
    }

    /// export: the `filter`'s records as JSON lines, sent to the `reply` subject in chunks of
    /// at most 60 KiB (header `Switchboard-Export: chunk`); the final reply is the summary.
    pub async fn export(
        &self,
        filter: HistoryRequest,
        reply: Option<Subject>,
    ) -> Result<Bytes, AuditError> {
        if filter.limit.is_some() || filter.cursor.is_some() {
            return Err(AuditError::ExportPaged);
        }
        let Some(reply) = reply else {
            return Err(AuditError::ExportWithoutReply);
        };
        let index = self.fresh_index().await?;
        let mut cursor = 0;
        let mut chunk = Vec::with_capacity(CHUNK_BYTES);
        let mut done = ExportDone {
            records: 0,
            chunks: 0,
        };
        loop {
            let page_filter = filter.clone();
            let page: Vec<AuditEntry> = blocking(Arc::clone(&index), move |index| {
                index.history(&page_filter, cursor, EXPORT_PAGE)
            })
            .await?;
            let Some(last) = page.last() else { break };
            cursor = last.seq;
            for entry in &page {
                let line = serde_json::to_vec(entry).map_err(AuditError::EncodeExportLine)?;
                if !chunk.is_empty() && chunk.len() + line.len() + 1 > CHUNK_BYTES {
                    self.send_chunk(&reply, std::mem::take(&mut chunk)).await?;
                    done.chunks += 1;
                }
                chunk.extend_from_slice(&line);
                chunk.push(b'\n');
                done.records += 1;
            }
        }
        if !chunk.is_empty() {
            self.send_chunk(&reply, chunk).await?;
            done.chunks += 1;
        }
        serde_json::to_vec(&done)
            .map(Bytes::from)
            .map_err(AuditError::EncodeExportSummary)
    }

    async fn send_chunk(&self, reply: &Subject, chunk: Vec<u8>) -> Result<(), AuditError> {
        let mut headers = HeaderMap::new();
        headers.insert(HEADER_EXPORT, "chunk");
        self.client
            .publish_with_headers(reply.clone(), headers, chunk.into())
            .await
            .map_err(AuditError::SendExportChunk)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchboard_proto::audit::{AuditRecord, GENESIS_HASH};

    fn entry(seq: u64, payload_bytes: usize) -> AuditEntry {
        AuditEntry {
            seq,
            hash: String::new(),
            record: AuditRecord {
                id: format!("S:{seq}"),
                at: time::OffsetDateTime::UNIX_EPOCH,
                kind: "message".into(),
                subject: "agent.inbox.x".into(),
                message_id: None,
                correlation_id: None,
                in_reply_to: None,
                task_id: None,
                parent_task_id: None,
                from_agent: None,
                from_goal: None,
                to_agent: None,
                to_goal: None,
                expects_reply: false,
                payload: serde_json::Value::String("p".repeat(payload_bytes)),
                trace_id: None,
                prev_hash: GENESIS_HASH.into(),
            },
        }
    }

    #[test]
    fn replies_are_cut_to_the_budget_but_keep_one_record() {
        let mut records: Vec<_> = (1..=10).map(|seq| entry(seq, 1000)).collect();
        assert!(!fit(&mut records, 1_000_000), "everything fits");
        assert_eq!(records.len(), 10);
        assert!(fit(&mut records, 2_500));
        assert_eq!(
            records.iter().map(|e| e.seq).collect::<Vec<_>>(),
            vec![1, 2]
        );
        let mut huge = vec![entry(1, 5_000), entry(2, 10)];
        assert!(fit(&mut huge, 1_000));
        assert_eq!(
            huge.len(),
            1,
            "a record larger than the budget is still sent alone"
        );
    }
}
