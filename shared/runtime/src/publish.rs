//! Durable publishing: JetStream publish with trace context and `Nats-Msg-Id`, waiting for the
//! ack, retried with the same id so a retry that did land is stored once (the stream's
//! duplicate window). Every service that writes to a stream goes through here.

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, context::PublishAckFuture};
use bytes::Bytes;
use switchboard_proto::HEADER_MSG_ID;
use tracing::Instrument as _;

use crate::telemetry;

/// How long a publish keeps retrying a transient failure (no stream leader, no responders, a
/// timeout): long enough to ride through a JetStream leader election after a node fails.
pub const PUBLISH_RETRY_BUDGET: Duration = Duration::from_secs(8);
/// First pause between attempts (doubling, at most [`MAX_PAUSE`]).
const RETRY_PAUSE: Duration = Duration::from_millis(50);
/// Longest pause between attempts.
const MAX_PAUSE: Duration = Duration::from_secs(1);

/// A publish that was not acknowledged.
#[derive(Debug, Clone, thiserror::Error)]
#[error("publish to {subject} not acknowledged after {attempts} attempts: {last}")]
pub struct PublishFailure {
    /// Subject published to; its stream is the one that did not acknowledge.
    pub subject: String,
    /// Attempts made within [`PUBLISH_RETRY_BUDGET`] (0 when the payload did not encode).
    pub attempts: usize,
    /// Text of the last attempt's error; a permanent one (e.g. too large) stops the retries.
    pub last: String,
    /// The stream refused the message because its subject already holds the most messages it
    /// may (`discard_new_per_subject`): nothing was stored, and only room made there helps. For
    /// a goal inbox, the owner chose `overflow: refuse` (`inbox_full`).
    pub full: bool,
}

/// What a successful publish stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    /// Stream sequence of the message.
    pub sequence: u64,
    /// True when the stream had it already (a duplicate `Nats-Msg-Id` in the window).
    pub duplicate: bool,
}

/// Whether a publish error says the subject holds the most messages it may (the stream
/// discards new messages per subject), as a full goal inbox does.
pub fn is_full(error: &str) -> bool {
    error.contains("maximum messages per subject exceeded")
}

/// Why one attempt failed, and whether another could succeed.
#[derive(Debug, Clone)]
struct Failed {
    message: String,
    permanent: bool,
}

impl From<jetstream::context::PublishError> for Failed {
    fn from(err: jetstream::context::PublishError) -> Self {
        use jetstream::context::PublishErrorKind as Kind;
        let message = err.to_string();
        // Too large, an expectation that will not change, or any other request the server
        // refuses as bad (a JetStream API 400, e.g. "message size exceeds maximum allowed"):
        // retrying cannot help. Unavailability (no responders, no leader, timeouts) can pass.
        let permanent = matches!(
            err.kind(),
            Kind::MaxPayloadExceeded | Kind::WrongLastSequence | Kind::WrongLastMessageId
        ) || message.contains("(code 400");
        Self { message, permanent }
    }
}

fn headers(msg_id: &str) -> HeaderMap {
    let mut headers = telemetry::traced_headers();
    headers.insert(HEADER_MSG_ID, msg_id);
    headers
}

/// One publish, in a PRODUCER span (OpenTelemetry messaging conventions: `send`) whose
/// context the message carries: what reads the message later continues the trace from it.
async fn send(
    js: &jetstream::Context,
    subject: &str,
    msg_id: &str,
    payload: &Bytes,
) -> Result<PublishAckFuture, Failed> {
    // Named by the subject's kind (`agent.inbox`, `agent.events`), not the whole subject: the
    // span name stays low-cardinality, the subject is an attribute.
    let mut kind = subject.splitn(3, '.');
    let kind = match (kind.next(), kind.next()) {
        (Some(first), Some(second)) => format!("{first}.{second}"),
        _ => subject.to_owned(),
    };
    // Outside any span (a background task with no trace to join) a publish starts none: it
    // would be a one-span trace of its own.
    if tracing::Span::current().is_none() {
        return js
            .publish_with_headers(subject.to_owned(), headers(msg_id), payload.clone())
            .await
            .map_err(Failed::from);
    }
    let span = tracing::info_span!(
        "publish",
        otel.name = %format!("publish {kind}"),
        otel.kind = "producer",
        messaging.system = "nats",
        messaging.operation.type = "send",
        messaging.destination.name = subject,
        messaging.message.id = msg_id,
    );
    let headers = span.in_scope(|| headers(msg_id));
    js.publish_with_headers(subject.to_owned(), headers, payload.clone())
        .instrument(span)
        .await
        .map_err(Failed::from)
}

async fn acked(sent: Result<PublishAckFuture, Failed>) -> Result<Published, Failed> {
    let ack = sent?.await.map_err(Failed::from)?;
    Ok(Published {
        sequence: ack.sequence,
        duplicate: ack.duplicate,
    })
}

/// Publishes `payload` to `subject` with `Nats-Msg-Id: msg_id` and waits for the stream's ack.
/// A transient failure is retried with the same id for up to [`PUBLISH_RETRY_BUDGET`]; a
/// permanent one (too large, a failed expectation) is returned at once.
pub async fn publish_durable(
    js: &jetstream::Context,
    subject: &str,
    msg_id: &str,
    payload: Bytes,
) -> Result<Published, PublishFailure> {
    let first = acked(send(js, subject, msg_id, &payload).await).await;
    retry_after(js, subject, msg_id, payload, first).await
}

/// Retries after a first attempt's outcome, within the budget.
async fn retry_after(
    js: &jetstream::Context,
    subject: &str,
    msg_id: &str,
    payload: Bytes,
    first: Result<Published, Failed>,
) -> Result<Published, PublishFailure> {
    let started = tokio::time::Instant::now();
    let mut pause = RETRY_PAUSE;
    let mut attempts = 1;
    let mut outcome = first;
    loop {
        let failed = match outcome {
            Ok(stored) => return Ok(stored),
            Err(failed) => failed,
        };
        // A subject at its limit stays there until someone makes room: not retried here (a
        // goal inbox's publisher makes room, see `switchboard-delivery`).
        if is_full(&failed.message) {
            return Err(PublishFailure {
                subject: subject.to_owned(),
                attempts,
                last: failed.message,
                full: true,
            });
        }
        if failed.permanent || started.elapsed() + pause > PUBLISH_RETRY_BUDGET {
            return Err(PublishFailure {
                subject: subject.to_owned(),
                attempts,
                last: failed.message,
                full: false,
            });
        }
        tracing::warn!(%subject, attempt = attempts, error = %failed.message, "publish not acknowledged; retrying");
        crate::telemetry::metrics::instruments()
            .publish_retries
            .add(1, &[]);
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_PAUSE);
        attempts += 1;
        outcome = acked(send(js, subject, msg_id, &payload).await).await;
    }
}

/// Publishes several messages at once: every publish is sent before any ack is awaited (so
/// N goals cost about one round trip, not N); the failed ones are then retried concurrently,
/// each as [`publish_durable`] would. Results come back in input order.
pub async fn publish_all(
    js: &jetstream::Context,
    messages: &[(String, String, Bytes)],
) -> Vec<Result<Published, PublishFailure>> {
    send_all(js, messages).await.acked().await
}

/// Publishes sent (handed to the connection, in order) whose acks are not awaited yet: a
/// caller can send something after them on the same connection — which the server then
/// receives after them — before it waits for anything.
pub struct Sent<'a> {
    js: &'a jetstream::Context,
    messages: &'a [(String, String, Bytes)],
    first: Vec<Result<PublishAckFuture, Failed>>,
}

/// Sends every message of `messages` (subject, `Nats-Msg-Id`, payload) without waiting for
/// an ack; [`Sent::acked`] then waits for them, retrying as [`publish_all`] does.
pub async fn send_all<'a>(
    js: &'a jetstream::Context,
    messages: &'a [(String, String, Bytes)],
) -> Sent<'a> {
    let mut first = Vec::with_capacity(messages.len());
    for (subject, msg_id, payload) in messages {
        first.push(send(js, subject, msg_id, payload).await);
    }
    Sent {
        js,
        messages,
        first,
    }
}

impl Sent<'_> {
    /// The acks, each failed publish retried as [`publish_durable`] would; in input order.
    pub async fn acked(self) -> Vec<Result<Published, PublishFailure>> {
        let Self {
            js,
            messages,
            first,
        } = self;
        let first = futures::future::join_all(first.into_iter().map(acked)).await;
        let outcomes = messages
            .iter()
            .zip(first)
            .map(|((subject, msg_id, payload), outcome)| {
                retry_after(js, subject, msg_id, payload.clone(), outcome)
            });
        futures::future::join_all(outcomes).await
    }
}

/// `value` as the JSON payload of a publish to `subject`; a value that does not encode is a
/// failure of that publish (no attempt made).
pub fn json_payload<T: serde::Serialize>(
    subject: &str,
    value: &T,
) -> Result<Bytes, PublishFailure> {
    serde_json::to_vec(value)
        .map(Bytes::from)
        .map_err(|err| PublishFailure {
            subject: subject.to_owned(),
            attempts: 0,
            last: format!("encoding: {err}"),
            full: false,
        })
}

/// Encodes `value` as JSON and publishes it with [`publish_durable`].
pub async fn publish_json<T: serde::Serialize>(
    js: &jetstream::Context,
    subject: &str,
    msg_id: &str,
    value: &T,
) -> Result<Published, PublishFailure> {
    publish_durable(js, subject, msg_id, json_payload(subject, value)?).await
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
    let to = switchboard_proto::subject::refusal(service, caller.as_str());
    // In the trace of the request refused, when there is one.
    tokio::spawn(
        async move {
            publish_event(&js, &to, &event.id.to_string(), &event).await;
        }
        .in_current_span(),
    );
}
