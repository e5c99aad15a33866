//! What a remote A2A agent answers, decoded in one pass, in time linear in its size and with
//! what is kept bounded in count (issue 26: 1.9 MB of empty text parts cost 3.6 s of CPU
//! through the `a2a-lf` types, which read every part and every message through a
//! `serde_json::Value` map and copy it once more).
//!
//! The wire shapes are the A2A v1.0 JSON ones; only what the gateway uses is read (ids, state,
//! parts, artifacts), the rest is skipped without being built. Each list keeps its first
//! [`PARTS_KEPT`] parts or [`ARTIFACTS_KEPT`] artifacts and skips the others; a part with none
//! of `text`, `raw`, `url` or `data` is a protocol error, as in `a2a-lf`. The result is the
//! `a2a-lf` types, so everything after decoding is unchanged.

use std::fmt;
use std::marker::PhantomData;

use a2a::{
    Artifact, Message, Part, PartContent, Role, SendMessageResponse, StreamResponse, Task,
    TaskArtifactUpdateEvent, TaskState, TaskStatus, TaskStatusUpdateEvent,
};
use serde::Deserialize;
use serde::de::{DeserializeOwned, IgnoredAny, SeqAccess, Visitor};
use serde_json::Value;

/// Parts kept of one message or artifact: more than any answer meant for an agent holds.
pub const PARTS_KEPT: usize = 256;
/// Artifacts kept of one task.
pub const ARTIFACTS_KEPT: usize = 64;

/// A list that keeps its first `N` elements and skips the rest unbuilt.
struct Capped<T, const N: usize>(Vec<T>);

impl<T, const N: usize> Default for Capped<T, N> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

impl<'de, T: Deserialize<'de>, const N: usize> Deserialize<'de> for Capped<T, N> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Keep<T, const N: usize>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>, const N: usize> Visitor<'de> for Keep<T, N> {
            type Value = Capped<T, N>;
            fn expecting(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
                formatter.write_str("a list")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut kept = Vec::new();
                while kept.len() < N {
                    match seq.next_element()? {
                        Some(element) => kept.push(element),
                        None => return Ok(Capped(kept)),
                    }
                }
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Capped(kept))
            }
        }
        deserializer.deserialize_seq(Keep::<T, N>(PhantomData))
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WirePart {
    text: Option<String>,
    /// Inline bytes are never carried: whether there were any is all that is read.
    raw: Option<IgnoredAny>,
    url: Option<String>,
    data: Option<Value>,
    filename: Option<String>,
    media_type: Option<String>,
}

impl WirePart {
    fn into_part<E: serde::de::Error>(self) -> Result<Part, E> {
        let content = match (self.text, self.raw, self.url, self.data) {
            (Some(text), ..) => PartContent::Text(text),
            (None, Some(_), ..) => PartContent::Raw(Vec::new()),
            (None, None, Some(url), _) => PartContent::Url(url),
            (None, None, None, Some(data)) => PartContent::Data(data),
            (None, None, None, None) => {
                return Err(E::custom("Part must have one of: text, raw, url, data"));
            }
        };
        Ok(Part {
            content,
            filename: self.filename,
            media_type: self.media_type,
            metadata: None,
        })
    }
}

/// A message's or an artifact's parts, checked and capped.
#[derive(Default)]
struct Parts(Vec<Part>);

impl<'de> Deserialize<'de> for Parts {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let Capped(wire) = Capped::<WirePart, PARTS_KEPT>::deserialize(deserializer)?;
        wire.into_iter()
            .map(WirePart::into_part)
            .collect::<Result<_, D::Error>>()
            .map(Parts)
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireMessage {
    #[serde(default)]
    message_id: String,
    context_id: Option<String>,
    task_id: Option<String>,
    #[serde(default)]
    parts: Parts,
}

impl From<WireMessage> for Message {
    fn from(wire: WireMessage) -> Self {
        Self {
            message_id: wire.message_id,
            context_id: wire.context_id,
            task_id: wire.task_id,
            role: Role::Agent,
            parts: wire.parts.0,
            metadata: None,
            extensions: None,
            reference_task_ids: None,
        }
    }
}

#[derive(Deserialize)]
struct WireStatus {
    state: TaskState,
    message: Option<WireMessage>,
}

impl From<WireStatus> for TaskStatus {
    fn from(wire: WireStatus) -> Self {
        Self {
            state: wire.state,
            message: wire.message.map(Message::from),
            timestamp: None,
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireArtifact {
    #[serde(default)]
    artifact_id: String,
    name: Option<String>,
    #[serde(default)]
    parts: Parts,
}

impl From<WireArtifact> for Artifact {
    fn from(wire: WireArtifact) -> Self {
        Self {
            artifact_id: wire.artifact_id,
            name: wire.name,
            description: None,
            parts: wire.parts.0,
            metadata: None,
            extensions: None,
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireTask {
    id: String,
    context_id: String,
    status: WireStatus,
    artifacts: Option<Capped<WireArtifact, ARTIFACTS_KEPT>>,
}

impl From<WireTask> for Task {
    fn from(wire: WireTask) -> Self {
        Self {
            id: wire.id,
            context_id: wire.context_id,
            status: wire.status.into(),
            artifacts: wire
                .artifacts
                .map(|Capped(artifacts)| artifacts.into_iter().map(Artifact::from).collect()),
            history: None,
            metadata: None,
        }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireStatusUpdate {
    task_id: String,
    context_id: String,
    status: WireStatus,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireArtifactUpdate {
    task_id: String,
    context_id: String,
    artifact: WireArtifact,
    append: Option<bool>,
    last_chunk: Option<bool>,
}

/// The `result` of `SendMessage` or of one streamed event: one of these keys.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireAnswer {
    task: Option<WireTask>,
    message: Option<WireMessage>,
    status_update: Option<WireStatusUpdate>,
    artifact_update: Option<WireArtifactUpdate>,
}

impl WireAnswer {
    fn into_event(self) -> Result<StreamResponse, OutboundError> {
        if let Some(message) = self.message {
            return Ok(StreamResponse::Message(message.into()));
        }
        if let Some(task) = self.task {
            return Ok(StreamResponse::Task(task.into()));
        }
        if let Some(update) = self.status_update {
            return Ok(StreamResponse::StatusUpdate(TaskStatusUpdateEvent {
                task_id: update.task_id,
                context_id: update.context_id,
                status: update.status.into(),
                metadata: None,
            }));
        }
        if let Some(update) = self.artifact_update {
            return Ok(StreamResponse::ArtifactUpdate(TaskArtifactUpdateEvent {
                task_id: update.task_id,
                context_id: update.context_id,
                artifact: update.artifact.into(),
                append: update.append,
                last_chunk: update.last_chunk,
                metadata: None,
            }));
        }
        Err(OutboundError::Protocol(
            "an answer with none of task, message, statusUpdate, artifactUpdate".to_owned(),
        ))
    }
}

/// A JSON-RPC response: its `result` decoded as `T`, or its `error`.
#[derive(Deserialize)]
struct Envelope<T> {
    result: Option<T>,
    error: Option<RpcError>,
}

/// A JSON-RPC error object, loosely: a remote's odd `code` or `message` still reads as a
/// refusal.
#[derive(Deserialize)]
struct RpcError {
    code: Option<Value>,
    message: Option<Value>,
}

/// The `result` of a JSON-RPC response body decoded as `T`, or its error as a refusal.
fn result<T: DeserializeOwned>(body: &[u8]) -> Result<T, OutboundError> {
    let envelope: Envelope<T> =
        serde_json::from_slice(body).map_err(|err| OutboundError::Protocol(err.to_string()))?;
    if let Some(error) = envelope.error {
        return Err(OutboundError::Refused {
            code: error.code.as_ref().and_then(Value::as_i64).unwrap_or(0),
            message: error
                .message
                .as_ref()
                .and_then(Value::as_str)
                .unwrap_or("no message")
                .chars()
                .take(1_000)
                .collect(),
        });
    }
    envelope
        .result
        .ok_or_else(|| OutboundError::Protocol("neither result nor error".to_owned()))
}

/// `SendMessage`'s answer: a task or a message.
pub fn send_message_response(body: &[u8]) -> Result<SendMessageResponse, OutboundError> {
    match result::<WireAnswer>(body)?.into_event()? {
        StreamResponse::Task(task) => Ok(SendMessageResponse::Task(task)),
        StreamResponse::Message(message) => Ok(SendMessageResponse::Message(message)),
        _ => Err(OutboundError::Protocol(
            "SendMessage answered with neither a task nor a message".to_owned(),
        )),
    }
}

/// `GetTask`'s answer.
pub fn task(body: &[u8]) -> Result<Task, OutboundError> {
    result::<WireTask>(body).map(Task::from)
}

/// One event of `SendStreamingMessage`.
pub fn stream_response(body: &[u8]) -> Result<StreamResponse, OutboundError> {
    result::<WireAnswer>(body)?.into_event()
}

/// Largest answer (a whole JSON-RPC response, or one streamed event) read from a remote.
pub const MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024;

/// Why an exchange with a remote agent failed.
#[derive(Debug, thiserror::Error)]
pub enum OutboundError {
    /// The remote could not be reached or stopped answering: try again later.
    #[error("the remote agent is unreachable: {0}")]
    Unreachable(String),
    /// The remote answered with a JSON-RPC error.
    #[error("the remote agent refused ({code}): {message}")]
    Refused {
        /// The JSON-RPC error code.
        code: i64,
        /// Its message.
        message: String,
    },
    /// The remote answered an HTTP error status other than 5xx and 429.
    #[error("the remote agent answered HTTP {0}")]
    Http(u16),
    /// The remote took longer than the exchange may take: final (sending again would make
    /// it do the work again).
    #[error("the remote agent did not answer within {0:?}")]
    TimedOut(std::time::Duration),
    /// The remote answered something that is not A2A.
    #[error("the remote agent answered outside the protocol: {0}")]
    Protocol(String),
}

impl OutboundError {
    /// A transport error: a timeout is final ([`OutboundError::TimedOut`]), anything else
    /// (refused connection, reset, TLS) may pass.
    pub(crate) fn transport(err: &reqwest::Error, timeout: std::time::Duration) -> Self {
        if err.is_timeout() {
            Self::TimedOut(timeout)
        } else {
            Self::Unreachable(err.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A remote's answer of 4 MiB of empty text parts, as issue 26 sent it.
    fn flood() -> Vec<u8> {
        let head = br#"{"jsonrpc":"2.0","id":1,"result":{"message":{"messageId":"m","role":"ROLE_AGENT","parts":["#;
        let tail = br#"{"text":"the end"}]}}}"#;
        let mut body = head.to_vec();
        while body.len() + 12 + tail.len() < crate::remote::answer::MAX_ANSWER_BYTES {
            body.extend_from_slice(br#"{"text":""},"#);
        }
        body.extend_from_slice(tail);
        body
    }

    #[test]
    fn a_flood_of_parts_keeps_the_first_few_and_skips_the_rest() {
        let SendMessageResponse::Message(message) = send_message_response(&flood()).unwrap() else {
            panic!("a message")
        };
        assert_eq!(message.parts.len(), PARTS_KEPT);
    }

    #[test]
    fn the_answers_the_gateway_reads_decode_as_a2a_types() {
        let task = br#"{"jsonrpc":"2.0","id":1,"result":{"task":{"id":"t1","contextId":"c1",
            "status":{"state":"TASK_STATE_COMPLETED","message":{"messageId":"s","role":"ROLE_AGENT",
            "parts":[{"text":"done"}]}},"artifacts":[{"artifactId":"a","parts":[{"text":"hi"},
            {"raw":"aGk=","mediaType":"image/png"},{"url":"https://x/y","filename":"y"},
            {"data":{"k":1}}]}],"history":[{"messageId":"h","role":"ROLE_USER","parts":[]}]}}}"#;
        let SendMessageResponse::Task(task) = send_message_response(task).unwrap() else {
            panic!("a task")
        };
        assert_eq!((task.id.as_str(), task.context_id.as_str()), ("t1", "c1"));
        assert_eq!(task.status.state, TaskState::Completed);
        let parts = &task.artifacts.unwrap()[0].parts;
        assert!(matches!(&parts[0].content, PartContent::Text(text) if text == "hi"));
        assert!(matches!(parts[1].content, PartContent::Raw(_)));
        assert!(matches!(&parts[2].content, PartContent::Url(url) if url == "https://x/y"));
        assert!(matches!(parts[3].content, PartContent::Data(_)));
        let update = br#"{"jsonrpc":"2.0","id":1,"result":{"artifactUpdate":{"taskId":"t1",
            "contextId":"c1","artifact":{"artifactId":"a","parts":[{"text":"more"}]},
            "append":true,"lastChunk":false}}}"#;
        let StreamResponse::ArtifactUpdate(update) = stream_response(update).unwrap() else {
            panic!("an artifact update")
        };
        assert_eq!(update.append, Some(true));
        let bare = br#"{"jsonrpc":"2.0","id":1,"result":{"id":"t2","contextId":"c2",
            "status":{"state":"TASK_STATE_WORKING"}}}"#;
        assert_eq!(self::task(bare).unwrap().id, "t2");
    }

    #[test]
    fn refusals_and_wrong_shapes_are_told_apart() {
        let refused = send_message_response(
            br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32001,"message":"no"}}"#,
        );
        assert!(matches!(
            refused,
            Err(OutboundError::Refused { code: -32001, .. })
        ));
        for garbage in [
            &b"<html>"[..],
            br#"{"jsonrpc":"2.0","id":1,"result":{"task":{"nope":1}}}"#,
            br#"{"jsonrpc":"2.0","id":1,"result":{"message":{"parts":[{"nope":1}]}}}"#,
            br#"{"jsonrpc":"2.0","id":1,"result":{}}"#,
            br#"{"jsonrpc":"2.0","id":1}"#,
        ] {
            assert!(
                matches!(
                    send_message_response(garbage),
                    Err(OutboundError::Protocol(_))
                ),
                "{}",
                String::from_utf8_lossy(garbage)
            );
        }
    }
}
