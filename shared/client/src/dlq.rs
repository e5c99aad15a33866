//! The dead letters (`AGENT_DLQ`): messages the fabric gave up on, with why and where from, for
//! operators (`switchboard dlq list|replay`).

use async_nats::HeaderMap;
use async_nats::jetstream::{self, consumer::DeliverPolicy, consumer::pull::OrderedConfig};
use futures::StreamExt;
use serde::Serialize;
use switchboard_proto::{
    DLQ_STREAM, HEADER_DLQ_CONSUMER, HEADER_DLQ_DELIVERIES, HEADER_DLQ_REASON, HEADER_DLQ_SEQ,
    HEADER_DLQ_STREAM, HEADER_DLQ_SUBJECT, HEADER_MSG_ID,
};

use crate::error::ClientError;

/// One dead letter.
#[derive(Debug, Clone, Serialize)]
pub struct DeadLetter {
    /// Its sequence in `AGENT_DLQ` (what `replay` takes).
    pub seq: u64,
    /// When it was moved there (RFC 3339).
    pub at: String,
    /// Why the fabric gave up on it.
    pub reason: String,
    /// Where it came from: stream, sequence and subject (e.g. `agent.inbox.<goal_id>`).
    pub stream: String,
    /// Its sequence in that stream when it was given up on.
    pub source_seq: u64,
    /// The subject it was stored under; empty when the message was gone before it could be copied.
    pub subject: String,
    /// The consumer that gave up (e.g. `inbox-<goal_id>`), after `deliveries` deliveries.
    pub consumer: String,
    /// How many times it was handed out before the reader gave up on it.
    pub deliveries: u64,
    /// The message as it was (JSON when it is JSON, else text).
    pub payload: serde_json::Value,
}

/// What `replay` did.
#[derive(Debug, Clone, Serialize)]
pub struct Replayed {
    /// The dead letter replayed (now deleted from `AGENT_DLQ`).
    pub seq: u64,
    /// Where the message went back to.
    pub subject: String,
    /// Sequence of the fresh copy at the end of its stream (an inbox copy is unread again).
    pub stream_seq: u64,
}

fn header(headers: &HeaderMap, name: &str) -> String {
    headers
        .get(name)
        .map(|value| value.as_str().to_owned())
        .unwrap_or_default()
}

fn letter(seq: u64, at: String, headers: &HeaderMap, payload: &[u8]) -> DeadLetter {
    DeadLetter {
        seq,
        at,
        reason: header(headers, HEADER_DLQ_REASON),
        stream: header(headers, HEADER_DLQ_STREAM),
        source_seq: header(headers, HEADER_DLQ_SEQ).parse().unwrap_or_default(),
        subject: header(headers, HEADER_DLQ_SUBJECT),
        consumer: header(headers, HEADER_DLQ_CONSUMER),
        deliveries: header(headers, HEADER_DLQ_DELIVERIES)
            .parse()
            .unwrap_or_default(),
        payload: serde_json::from_slice(payload).unwrap_or_else(|_| {
            serde_json::Value::String(String::from_utf8_lossy(payload).into_owned())
        }),
    }
}

fn dlq_error(what: &str, err: impl std::fmt::Display) -> ClientError {
    ClientError::Inbox(format!("{what} {DLQ_STREAM}: {err}"))
}

/// The oldest `limit` dead letters.
pub async fn dlq_list(
    nats: &async_nats::Client,
    limit: usize,
) -> Result<Vec<DeadLetter>, ClientError> {
    let js = jetstream::new(nats.clone());
    let stream = js
        .get_stream(DLQ_STREAM)
        .await
        .map_err(|err| dlq_error("opening", err))?;
    let consumer = stream
        .create_consumer(OrderedConfig {
            deliver_policy: DeliverPolicy::All,
            ..Default::default()
        })
        .await
        .map_err(|err| dlq_error("reading", err))?;
    let waiting = usize::try_from(consumer.cached_info().num_pending).unwrap_or(usize::MAX);
    let mut letters = Vec::new();
    if waiting == 0 || limit == 0 {
        return Ok(letters);
    }
    let mut messages = consumer
        .messages()
        .await
        .map_err(|err| dlq_error("reading", err))?;
    while letters.len() < waiting.min(limit) {
        let next = tokio::time::timeout(std::time::Duration::from_secs(5), messages.next()).await;
        let Ok(Some(Ok(message))) = next else { break };
        let info = message.info().map_err(|err| dlq_error("reading", err))?;
        let at = switchboard_proto::timestamp::format(info.published);
        let headers = message.headers.clone().unwrap_or_default();
        letters.push(letter(info.stream_sequence, at, &headers, &message.payload));
    }
    Ok(letters)
}

/// Puts dead letter `seq` back where it came from (a fresh copy at the end of its stream,
/// carrying its original headers but not its old message id) and deletes the letter.
pub async fn dlq_replay(nats: &async_nats::Client, seq: u64) -> Result<Replayed, ClientError> {
    let js = jetstream::new(nats.clone());
    let stream = js
        .get_stream(DLQ_STREAM)
        .await
        .map_err(|err| dlq_error("opening", err))?;
    let stored = stream
        .get_raw_message(seq)
        .await
        .map_err(|err| dlq_error(&format!("reading letter {seq} of"), err))?;
    let subject = header(&stored.headers, HEADER_DLQ_SUBJECT);
    if subject.is_empty() {
        return Err(ClientError::Inbox(format!(
            "dead letter {seq} has no message to replay (it was gone from its stream)"
        )));
    }
    let mut headers = HeaderMap::new();
    for (name, values) in stored.headers.iter() {
        let name: &str = name.as_ref();
        if name.starts_with("Switchboard-Dlq-") || name == HEADER_MSG_ID {
            continue;
        }
        for value in values {
            headers.append(name, value.as_str());
        }
    }
    // Replaying the same letter twice stores one copy.
    headers.insert(HEADER_MSG_ID, format!("replay:{DLQ_STREAM}:{seq}").as_str());
    let ack = js
        .publish_with_headers(subject.clone(), headers, stored.payload)
        .await
        .map_err(|err| ClientError::Inbox(format!("replaying to {subject}: {err}")))?
        .await
        .map_err(|err| ClientError::Inbox(format!("replaying to {subject}: {err}")))?;
    stream
        .delete_message(seq)
        .await
        .map_err(|err| dlq_error(&format!("deleting letter {seq} from"), err))?;
    Ok(Replayed {
        seq,
        subject,
        stream_seq: ack.sequence,
    })
}

/// Discards dead letter `seq` for good (an operator looked at it and wants it gone). `Ok(false)`
/// when there was no such letter (discarded or replayed already).
pub async fn dlq_discard(nats: &async_nats::Client, seq: u64) -> Result<bool, ClientError> {
    let js = jetstream::new(nats.clone());
    let stream = js
        .get_stream(DLQ_STREAM)
        .await
        .map_err(|err| dlq_error("opening", err))?;
    match stream.delete_message(seq).await {
        Ok(deleted) => Ok(deleted),
        Err(err) if err.to_string().contains("no message found") => Ok(false),
        Err(err) => Err(dlq_error(&format!("deleting letter {seq} from"), err)),
    }
}
