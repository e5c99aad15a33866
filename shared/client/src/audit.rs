//! The audit queries (`agent.audit.<op>`), for operators and agents allowed to read the trail.

use std::time::Duration;

use futures::StreamExt;
use switchboard_proto::audit::{
    AuditOp, AuditRecords, ExportDone, HEADER_EXPORT, HistoryRequest, ThreadRequest, VerifyReply,
};
use switchboard_proto::{ErrorReply, HEADER_SERVICE_ERROR};

use crate::error::ClientError;
use crate::request;

/// How long a query (or one export message) may take.
const TIMEOUT: Duration = Duration::from_secs(30);
/// How long verify may take (the service allows 120 s to read the stream).
const VERIFY_TIMEOUT: Duration = Duration::from_secs(130);

/// thread: the conversation around a message, call or task, oldest first: every page of a
/// thread longer than one reply, read on from `query.cursor`.
pub async fn audit_thread(
    nats: &async_nats::Client,
    query: &ThreadRequest,
) -> Result<AuditRecords, ClientError> {
    let mut all: AuditRecords = request(nats, AuditOp::Thread.subject(), query, TIMEOUT).await?;
    let mut next = all.next_cursor.take();
    while let Some(cursor) = next {
        let page_query = ThreadRequest {
            cursor: Some(cursor),
            ..query.clone()
        };
        let page: AuditRecords =
            request(nats, AuditOp::Thread.subject(), &page_query, TIMEOUT).await?;
        // A page that brings nothing new ends the walk (the thread shrank meanwhile).
        if page.records.is_empty() {
            break;
        }
        all.records.extend(page.records);
        next = page.next_cursor;
    }
    all.truncated = false;
    Ok(all)
}

/// history: records by agent, goal, task, time and kind, one page.
pub async fn audit_history(
    nats: &async_nats::Client,
    query: &HistoryRequest,
) -> Result<AuditRecords, ClientError> {
    request(nats, AuditOp::History.subject(), query, TIMEOUT).await
}

/// pending: requests that expect a reply and have none.
pub async fn audit_pending(nats: &async_nats::Client) -> Result<AuditRecords, ClientError> {
    request(
        nats,
        AuditOp::Pending.subject(),
        &serde_json::json!({}),
        TIMEOUT,
    )
    .await
}

/// verify: walks the hash chain and reports the first break.
pub async fn audit_verify(nats: &async_nats::Client) -> Result<VerifyReply, ClientError> {
    request(
        nats,
        AuditOp::Verify.subject(),
        &serde_json::json!({}),
        VERIFY_TIMEOUT,
    )
    .await
}

/// export: every record of `filter` as JSON lines, handed to `lines` chunk by chunk (each
/// chunk is whole lines), then the summary.
pub async fn audit_export(
    nats: &async_nats::Client,
    filter: &HistoryRequest,
    mut lines: impl FnMut(&[u8]),
) -> Result<ExportDone, ClientError> {
    let subject = AuditOp::Export.subject();
    let failed = |message: String| ClientError::Request {
        subject: subject.clone(),
        message,
    };
    let inbox = nats.new_inbox();
    let mut replies = nats
        .subscribe(inbox.clone())
        .await
        .map_err(|err| failed(err.to_string()))?;
    let body = serde_json::to_vec(filter).map_err(|err| failed(err.to_string()))?;
    nats.publish_with_reply_and_headers(
        subject.clone(),
        inbox,
        switchboard_request::trace::traced_headers(),
        body.into(),
    )
    .await
    .map_err(|err| failed(err.to_string()))?;
    let mut received = 0u64;
    loop {
        let message = tokio::time::timeout(TIMEOUT, replies.next())
            .await
            .map_err(|_| ClientError::Timeout {
                subject: subject.clone(),
            })?
            .ok_or_else(|| failed("the reply subscription closed".to_owned()))?;
        if message.status == Some(async_nats::StatusCode::NO_RESPONDERS) {
            return Err(ClientError::NoResponders { subject });
        }
        let headers = message.headers.as_ref();
        if headers
            .and_then(|h| h.get(HEADER_EXPORT))
            .is_some_and(|v| v.as_str() == "chunk")
        {
            lines(&message.payload);
            received += 1;
            continue;
        }
        if headers.and_then(|h| h.get(HEADER_SERVICE_ERROR)).is_some() {
            let reply: ErrorReply =
                serde_json::from_slice(&message.payload).map_err(|err| failed(err.to_string()))?;
            return Err(ClientError::Service(reply));
        }
        let done: ExportDone =
            serde_json::from_slice(&message.payload).map_err(|err| ClientError::Decode {
                subject: subject.clone(),
                message: err.to_string(),
            })?;
        // Chunks are plain messages: a slow reader can lose some. Never pass off a partial
        // export as whole.
        if received != done.chunks {
            return Err(failed(format!(
                "the export is incomplete: {received} of {} chunks arrived",
                done.chunks
            )));
        }
        return Ok(done);
    }
}
