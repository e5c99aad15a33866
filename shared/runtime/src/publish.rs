//! Durable publishing: JetStream publish with trace context and `Nats-Msg-Id`, waiting for the
//! ack, retried with the same id so a retry that did land is stored once (the stream's
//! duplicate window). Every service that writes to a stream goes through here.

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, context::PublishAckFuture};
use bytes::Bytes;
use switchboard_proto::HEADER_MSG_ID;

use crate::telemetry;

/// Attempts before a publish is reported failed.
pub const PUBLISH_ATTEMPTS: usize = 3;
/// Pause between attempts (doubles each time).
const RETRY_PAUSE: Duration = Duration::from_millis(50);

/// A publish that was not acknowledged after every attempt.
#[derive(Debug, Clone, thiserror::Error)]
#[error("publish to {subject} not acknowledged after {attempts} attempts: {last}")]
pub struct PublishFailure {
    /// The subject.
    pub subject: String,
    /// Attempts made.
    pub attempts: usize,
    /// The last error.
    pub last: String,
}

/// What a successful publish stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stored {
    /// Stream sequence of the message.
    pub sequence: u64,
    /// True when the stream had it already (a duplicate `Nats-Msg-Id` in the window).
    pub duplicate: bool,
}

fn headers(msg_id: &str) -> HeaderMap {
    let mut headers = telemetry::traced_headers();
    headers.insert(HEADER_MSG_ID, msg_id);
    headers
}

async fn send(
    js: &jetstream::Context,
    subject: &str,
    msg_id: &str,
    payload: &Bytes,
) -> Result<PublishAckFuture, String> {
    js.publish_with_headers(subject.to_owned(), headers(msg_id), payload.clone())
        .await
        .map_err(|err| err.to_string())
}

/// Publishes `payload` to `subject` with `Nats-Msg-Id: msg_id` and waits for the stream's ack,
/// retrying up to [`PUBLISH_ATTEMPTS`] times with the same id.
pub async fn publish_durable(
    js: &jetstream::Context,
    subject: &str,
    msg_id: &str,
    payload: Bytes,
) -> Result<Stored, PublishFailure> {
    attempt_from(js, subject, msg_id, payload, 1, String::new()).await
}

/// Attempts `first..=PUBLISH_ATTEMPTS` (earlier ones already failed with `last`).
async fn attempt_from(
    js: &jetstream::Context,
    subject: &str,
    msg_id: &str,
    payload: Bytes,
    first: usize,
    mut last: String,
) -> Result<Stored, PublishFailure> {
    let mut pause = RETRY_PAUSE;
    if first > 1 {
        tokio::time::sleep(pause).await;
        pause *= 2;
    }
    for attempt in first..=PUBLISH_ATTEMPTS {
        let acked = match send(js, subject, msg_id, &payload).await {
            Ok(ack) => ack.await.map_err(|err| err.to_string()),
            Err(err) => Err(err),
        };
        match acked {
            Ok(ack) => {
                return Ok(Stored {
                    sequence: ack.sequence,
                    duplicate: ack.duplicate,
                });
            }
            Err(err) => {
                tracing::warn!(%subject, attempt, error = %err, "publish not acknowledged");
                last = err;
            }
        }
        if attempt < PUBLISH_ATTEMPTS {
            tokio::time::sleep(pause).await;
            pause *= 2;
        }
    }
    Err(PublishFailure {
        subject: subject.to_owned(),
        attempts: PUBLISH_ATTEMPTS,
        last,
    })
}

/// Publishes several messages at once: every publish is sent before any ack is awaited (so
/// N goals cost about one round trip, not N); the failed ones are then retried concurrently,
/// each up to [`PUBLISH_ATTEMPTS`] attempts in all. Results come back in input order.
pub async fn publish_all(
    js: &jetstream::Context,
    messages: &[(String, String, Bytes)],
) -> Vec<Result<Stored, PublishFailure>> {
    let mut pending = Vec::with_capacity(messages.len());
    for (subject, msg_id, payload) in messages {
        pending.push(send(js, subject, msg_id, payload).await);
    }
    let mut acks = Vec::with_capacity(pending.len());
    for sent in pending {
        acks.push(async move {
            match sent {
                Ok(ack) => ack.await.map_err(|err| err.to_string()),
                Err(err) => Err(err),
            }
        });
    }
    let first = futures::future::join_all(acks).await;
    let outcomes = messages.iter().zip(first).map(
        |((subject, msg_id, payload), outcome)| async move {
            match outcome {
                Ok(ack) => Ok(Stored {
                    sequence: ack.sequence,
                    duplicate: ack.duplicate,
                }),
                Err(err) => {
                    tracing::warn!(%subject, error = %err, "publish not acknowledged; retrying");
                    attempt_from(js, subject, msg_id, payload.clone(), 2, err).await
                }
            }
        },
    );
    futures::future::join_all(outcomes).await
}

/// Encodes `value` as JSON and publishes it with [`publish_durable`].
pub async fn publish_json<T: serde::Serialize>(
    js: &jetstream::Context,
    subject: &str,
    msg_id: &str,
    value: &T,
) -> Result<Stored, PublishFailure> {
    let payload = serde_json::to_vec(value).map_err(|err| PublishFailure {
        subject: subject.to_owned(),
        attempts: 0,
        last: format!("encoding: {err}"),
    })?;
    publish_durable(js, subject, msg_id, payload.into()).await
}

/// Publishes an event about a state change that is already committed: it is retried like any
/// durable publish, and a loss is logged (the change stands), not returned.
pub async fn publish_event<T: serde::Serialize>(
    js: &jetstream::Context,
    subject: &str,
    event_id: &str,
    event: &T,
) {
    if let Err(err) = publish_json(js, subject, event_id, event).await {
        tracing::error!(%subject, %event_id, error = %err, "event lost after retries");
    }
}

/// Publishes a refusal (a rule refused a well-formed request) as
/// `agent.refusals.<service>.<caller>` for the audit trail, in the background so the reply
/// does not wait for it. `subject` is the request subject and `caller` the identity it named
/// (`_` when it named none that is valid).
pub fn publish_refusal(
    js: &jetstream::Context,
    service: &str,
    subject: &str,
    caller: Option<&switchboard_proto::AgentId>,
    kind: switchboard_proto::ErrorKind,
    message: &str,
) {
    let caller = caller.map_or_else(|| "_".to_owned(), ToString::to_string);
    let event = switchboard_proto::audit::RefusalEvent {
        id: switchboard_proto::new_id(),
        service: service.to_owned(),
        agent_id: caller.clone(),
        subject: subject.to_owned(),
        kind,
        message: message.to_owned(),
        at: switchboard_proto::timestamp::now(),
    };
    let js = js.clone();
    let to = format!(
        "{}.{service}.{caller}",
        switchboard_proto::audit::REFUSALS_PREFIX
    );
    tokio::spawn(async move {
        publish_event(&js, &to, &event.id.to_string(), &event).await;
    });
}
