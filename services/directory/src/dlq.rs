//! The dead-letter mover: JetStream gives up on a goal's message after
//! [`INBOX_MAX_DELIVER`](switchboard_proto::INBOX_MAX_DELIVER) deliveries, or when a reader
//! rejects it (`+TERM`), and says so in an advisory. `AGENT_ADVISORIES` keeps those advisories;
//! every directory replica pulls them from one durable consumer and writes each given-up
//! message into `AGENT_DLQ` as `agent.dlq.<stream>.<consumer>`: the original payload and
//! headers, plus `Switchboard-Dlq-*` headers with the reason, the source stream, sequence and
//! subject, the consumer and the delivery count. The dead letter's `Nats-Msg-Id` is
//! `<stream>:<seq>:<consumer>`, so an advisory handled twice (a replica died before acking it)
//! still makes one letter. `switchboard dlq list|replay` reads and replays them.

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, AckKind, consumer::PullConsumer, consumer::pull};
use futures::StreamExt;
use serde::Deserialize;
use switchboard_proto::{
    ADVISORIES_STREAM, DLQ_PREFIX, HEADER_DLQ_CONSUMER, HEADER_DLQ_DELIVERIES, HEADER_DLQ_REASON,
    HEADER_DLQ_SEQ, HEADER_DLQ_STREAM, HEADER_DLQ_SUBJECT, HEADER_MSG_ID,
};
use switchboard_runtime::CancellationToken;

/// The durable consumer the directory replicas share on `AGENT_ADVISORIES`.
pub const MOVER_CONSUMER: &str = "directory-dlq";

/// What JetStream says when it gives up on a message (the fields both advisories share).
#[derive(Debug, Deserialize)]
struct Advisory {
    #[serde(rename = "type")]
    kind: String,
    stream: String,
    consumer: String,
    stream_seq: u64,
    #[serde(default)]
    deliveries: u64,
    /// Only on `MSG_TERMINATED`: what the reader gave with its `+TERM`.
    #[serde(default)]
    reason: Option<String>,
}

impl Advisory {
    fn reason(&self) -> String {
        if self.kind.ends_with(".terminated") {
            match self.reason.as_deref().map(str::trim) {
                Some(reason) if !reason.is_empty() => format!("rejected by its reader: {reason}"),
                _ => "rejected by its reader (no reason given)".to_owned(),
            }
        } else {
            format!(
                "not acknowledged after {} deliveries (the limit)",
                self.deliveries
            )
        }
    }
}

/// Moves given-up messages into `AGENT_DLQ`.
#[derive(Debug)]
pub struct DeadLetters {
    js: jetstream::Context,
    advisories: PullConsumer,
}

impl DeadLetters {
    /// Opens (or creates) the mover's durable consumer; the streams exist already.
    pub async fn open(js: jetstream::Context) -> Result<Self, String> {
        let stream = js
            .get_stream(ADVISORIES_STREAM)
            .await
            .map_err(|err| format!("opening {ADVISORIES_STREAM}: {err}"))?;
        let advisories = stream
            .get_or_create_consumer(
                MOVER_CONSUMER,
                pull::Config {
                    durable_name: Some(MOVER_CONSUMER.to_owned()),
                    description: Some("directory: advisories into AGENT_DLQ".to_owned()),
                    ack_policy: jetstream::consumer::AckPolicy::Explicit,
                    ack_wait: Duration::from_secs(30),
                    ..Default::default()
                },
            )
            .await
            .map_err(|err| format!("opening consumer {MOVER_CONSUMER}: {err}"))?;
        Ok(Self { js, advisories })
    }

    /// Moves letters until `stop`.
    pub async fn run(self, stop: CancellationToken) {
        loop {
            let batch = self
                .advisories
                .batch()
                .max_messages(64)
                .expires(Duration::from_secs(1))
                .messages();
            let mut batch = tokio::select! {
                batch = batch => match batch {
                    Ok(batch) => batch,
                    Err(err) => {
                        tracing::warn!(error = %err, "pulling advisories failed");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                },
                () = stop.cancelled() => return,
            };
            while let Some(message) = batch.next().await {
                let Ok(message) = message else { break };
                match self.move_one(&message.payload).await {
                    Ok(()) => {
                        if let Err(err) = message.double_ack().await {
                            tracing::warn!(error = %err, "acking an advisory failed");
                        }
                    }
                    Err(err) => {
                        tracing::warn!(error = %err, "moving a dead letter failed; retrying");
                        let _ = message
                            .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
                            .await;
                    }
                }
            }
            if stop.is_cancelled() {
                return;
            }
        }
    }

    /// Writes the letter for one advisory (an advisory that does not decode is skipped).
    async fn move_one(&self, payload: &[u8]) -> Result<(), String> {
        let advisory: Advisory = match serde_json::from_slice(payload) {
            Ok(advisory) => advisory,
            Err(err) => {
                tracing::warn!(error = %err, "skipping an advisory that does not decode");
                return Ok(());
            }
        };
        let mut reason = advisory.reason();
        let stream = self
            .js
            .get_stream(&advisory.stream)
            .await
            .map_err(|err| format!("opening {}: {err}", advisory.stream))?;
        let (subject, mut headers, body) = match stream.get_raw_message(advisory.stream_seq).await {
            Ok(original) => (
                original.subject.to_string(),
                original.headers,
                original.payload,
            ),
            Err(err) => {
                reason.push_str(&format!("; the message is no longer in the stream ({err})"));
                (String::new(), HeaderMap::new(), bytes::Bytes::new())
            }
        };
        headers.insert(
            HEADER_MSG_ID,
            format!(
                "{}:{}:{}",
                advisory.stream, advisory.stream_seq, advisory.consumer
            )
            .as_str(),
        );
        headers.insert(HEADER_DLQ_REASON, reason.as_str());
        headers.insert(HEADER_DLQ_STREAM, advisory.stream.as_str());
        headers.insert(HEADER_DLQ_SEQ, advisory.stream_seq.to_string().as_str());
        headers.insert(HEADER_DLQ_SUBJECT, subject.as_str());
        headers.insert(HEADER_DLQ_CONSUMER, advisory.consumer.as_str());
        headers.insert(
            HEADER_DLQ_DELIVERIES,
            advisory.deliveries.to_string().as_str(),
        );
        let letter = format!("{DLQ_PREFIX}.{}.{}", advisory.stream, advisory.consumer);
        self.js
            .publish_with_headers(letter.clone(), headers, body)
            .await
            .map_err(|err| format!("publishing {letter}: {err}"))?
            .await
            .map_err(|err| format!("storing {letter}: {err}"))?;
        tracing::info!(
            stream = %advisory.stream,
            seq = advisory.stream_seq,
            consumer = %advisory.consumer,
            %reason,
            "message moved to the dead-letter stream"
        );
        Ok(())
    }
}
