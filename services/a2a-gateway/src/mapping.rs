//! Switchboard ↔ A2A: task states, parts, and a task record as an A2A `Task` (docs/a2a.md,
//! "The mapping").
//!
//! | Switchboard | A2A |
//! |---|---|
//! | `submitted`, `accepted` | `TASK_STATE_SUBMITTED` |
//! | `working` | `TASK_STATE_WORKING` |
//! | `input_required` | `TASK_STATE_INPUT_REQUIRED` (the question is the status message) |
//! | `completed` | `TASK_STATE_COMPLETED` (the result is the artifact `result`) |
//! | `failed`, `rejected`, `canceled` | the same names (the reason is the status message) |

use std::collections::HashMap;

use a2a::{Artifact, Message, Part, PartContent, Role, Task, TaskStatus};
use serde_json::Value;
use switchboard_proto::TaskState;
use switchboard_proto::task::TaskRecord;

use crate::links::FileLinks;
use time::OffsetDateTime;

/// Metadata key under which a task keeps its A2A context id.
pub const CONTEXT_KEY: &str = "a2a_context_id";
/// Metadata key under which a task keeps the id of the A2A message that created it.
pub const MESSAGE_KEY: &str = "a2a_message_id";
/// Metadata key set (to `true`) on a task whose message had no text, only parts: its body is
/// [`textless`]'s words, which its history leaves out.
pub const TEXTLESS: &str = "a2a_textless";

/// The body of a message of `parts` parts and no text (the fabric's messages have text).
pub fn textless(parts: usize) -> String {
    format!("({parts} part(s), no text)")
}

/// The artifact id of a completed task's result.
pub const RESULT_ARTIFACT: &str = "result";

/// The A2A state of a Switchboard state.
pub fn state(state: TaskState) -> a2a::TaskState {
    match state {
        TaskState::Submitted | TaskState::Accepted => a2a::TaskState::Submitted,
        TaskState::Working => a2a::TaskState::Working,
        TaskState::InputRequired => a2a::TaskState::InputRequired,
        TaskState::Completed => a2a::TaskState::Completed,
        TaskState::Failed => a2a::TaskState::Failed,
        TaskState::Rejected => a2a::TaskState::Rejected,
        TaskState::Canceled => a2a::TaskState::Canceled,
    }
}

/// The Switchboard state an A2A state filter names (`ListTasks`), when there is one.
pub fn state_filter(state: &a2a::TaskState) -> Option<TaskState> {
    match state {
        a2a::TaskState::Submitted => Some(TaskState::Submitted),
        a2a::TaskState::Working => Some(TaskState::Working),
        a2a::TaskState::InputRequired => Some(TaskState::InputRequired),
        a2a::TaskState::Completed => Some(TaskState::Completed),
        a2a::TaskState::Failed => Some(TaskState::Failed),
        a2a::TaskState::Rejected => Some(TaskState::Rejected),
        a2a::TaskState::Canceled => Some(TaskState::Canceled),
        a2a::TaskState::Unspecified | a2a::TaskState::AuthRequired => None,
    }
}

/// A time as chrono's UTC (the A2A types' clock).
pub fn utc(at: OffsetDateTime) -> Option<chrono::DateTime<chrono::Utc>> {
    chrono::DateTime::from_timestamp(at.unix_timestamp(), at.nanosecond())
}

/// An A2A message's parts as Switchboard parts: the text parts joined become the body, every
/// other part is carried: `data` as is, `url` as a file reference, `raw` bytes as a file
/// whose URI is a `data:` URI (RFC 2397) holding them in base64, which [`outbound`] turns
/// back into bytes.
pub fn inbound(parts: &[Part]) -> (String, Vec<switchboard_proto::Part>) {
    let mut text = Vec::new();
    let mut carried = Vec::new();
    for part in parts {
        match &part.content {
            PartContent::Text(t) => text.push(t.clone()),
            PartContent::Data(data) => {
                carried.push(switchboard_proto::Part::Data { data: data.clone() })
            }
            PartContent::Url(url) => carried.push(switchboard_proto::Part::File {
                uri: url.clone(),
                mime: part.media_type.clone(),
                name: part.filename.clone(),
            }),
            PartContent::Raw(bytes) => carried.push(switchboard_proto::Part::File {
                uri: data_uri(part.media_type.as_deref(), bytes),
                mime: part.media_type.clone(),
                name: part.filename.clone(),
            }),
        }
    }
    (text.join("\n"), carried)
}

/// `bytes` as a `data:` URI: `data:<media type>;base64,<bytes>`. A media type that is not a
/// plain `type/subtype` is left out, so the URI always parses back.
fn data_uri(media_type: Option<&str>, bytes: &[u8]) -> String {
    use base64::Engine as _;
    let media_type = media_type
        .filter(|media| {
            media.split_once('/').is_some_and(|(kind, sub)| {
                !kind.is_empty()
                    && !sub.is_empty()
                    && media.len() <= 255
                    && media
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"/.+-_".contains(&b))
            })
        })
        .unwrap_or("");
    format!(
        "data:{media_type};base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

/// The bytes of a base64 `data:` URI, when `uri` is one.
fn data_uri_bytes(uri: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    let (head, payload) = uri.strip_prefix("data:")?.split_once(',')?;
    if !head.ends_with(";base64") {
        return None;
    }
    base64::engine::general_purpose::STANDARD
        .decode(payload)
        .ok()
}

/// Switchboard parts as A2A parts (a file part holding a base64 `data:` URI as `raw` bytes).
pub fn outbound(parts: &[switchboard_proto::Part]) -> Vec<Part> {
    parts
        .iter()
        .map(|part| match part {
            switchboard_proto::Part::Text { text } => Part::text(text.clone()),
            switchboard_proto::Part::Data { data } => Part::data(data.clone()),
            switchboard_proto::Part::File { uri, mime, name } => {
                let mut part = match data_uri_bytes(uri) {
                    Some(bytes) => Part::raw(bytes),
                    None => Part::url(uri.clone()),
                };
                part.media_type = mime.clone();
                part.filename = name.clone();
                part
            }
        })
        .collect()
}

/// An agent message with `text` (a status's question, reason or note); `id` is the task
/// event it comes from (`<task_id>:<n>`), so the same status always has the same message id.
pub fn agent_message(task_id: &str, context: &str, text: &str, id: String) -> Message {
    let mut message = Message::new(Role::Agent, vec![Part::text(text)]);
    message.message_id = id;
    message.context_id = Some(context.to_owned());
    message.task_id = Some(task_id.to_owned());
    message
}

/// A client's answer as its task's history keeps it: what the fabric carried and nothing
/// else, the client's words (`ROLE_USER` whatever the request said), its parts without
/// their metadata, its `messageId`, the task and the context.
pub fn follow_up(message: &Message, task_id: &uuid::Uuid, context: &str) -> Message {
    let parts = message
        .parts
        .iter()
        .map(|part| Part {
            metadata: None,
            ..part.clone()
        })
        .collect();
    let mut kept = Message::new(Role::User, parts);
    kept.message_id = message.message_id.clone();
    kept.task_id = Some(task_id.to_string());
    kept.context_id = Some(context.to_owned());
    kept
}

/// The task's A2A context id: the one it was created with, or its own id.
pub fn context_of(task: &TaskRecord) -> String {
    match task.metadata.get(CONTEXT_KEY) {
        Some(Value::String(context)) => context.clone(),
        _ => task.task_id.to_string(),
    }
}

/// The status of a task: its state, when it last changed, and what the assignee said last
/// (the question, the reason, or the latest note).
pub fn status(task: &TaskRecord) -> TaskStatus {
    let context = context_of(task);
    let said = match task.state {
        TaskState::Completed => None,
        TaskState::Failed | TaskState::Rejected | TaskState::Canceled => task.reason.clone(),
        _ => task.history.last().and_then(|last| last.note.clone()),
    };
    TaskStatus {
        state: state(task.state),
        message: said.map(|text| {
            let id = format!("{}:{}", task.task_id, task.transitions);
            agent_message(&task.task_id.to_string(), &context, &text, id)
        }),
        timestamp: utc(task.updated_at),
    }
}

/// The result artifact of a completed task: its text, parts and files (each a link the
/// requester reads it by, `links`); none for a completion that carried none of them (an
/// artifact has at least one part, A2A v1.0).
pub fn result(task: &TaskRecord, links: &FileLinks) -> Option<Artifact> {
    if task.state != TaskState::Completed {
        return None;
    }
    let mut parts = Vec::new();
    if let Some(text) = task.result.as_ref().filter(|text| !text.is_empty()) {
        parts.push(Part::text(text.clone()));
    }
    parts.extend(outbound(&task.result_parts));
    parts.extend(links.parts(&task.requester, &task.result_attachments));
    if parts.is_empty() {
        return None;
    }
    Some(Artifact {
        artifact_id: RESULT_ARTIFACT.to_owned(),
        name: Some("result".to_owned()),
        description: None,
        parts,
        metadata: None,
        extensions: None,
    })
}

/// Whether the task may have follow-ups (answers to its questions): it has asked one, as far
/// as its record's latest transitions tell.
pub fn may_have_follow_ups(task: &TaskRecord) -> bool {
    task.transitions as usize > task.history.len()
        || task
            .history
            .iter()
            .any(|step| step.to == TaskState::InputRequired)
}

/// The request that created the task, as the user message of its history (its files as links
/// for the requester).
fn request(task: &TaskRecord, context: &str, links: &FileLinks) -> Message {
    let mut parts = Vec::new();
    if !task.message.is_empty() && task.metadata.get(TEXTLESS) != Some(&Value::Bool(true)) {
        parts.push(Part::text(task.message.clone()));
    }
    parts.extend(outbound(&task.parts));
    parts.extend(links.parts(&task.requester, &task.attachments));
    let mut message = Message::new(Role::User, parts);
    message.message_id = match task.metadata.get(MESSAGE_KEY) {
        Some(Value::String(id)) => id.clone(),
        _ => task.message_id.to_string(),
    };
    message.context_id = Some(context.to_owned());
    message.task_id = Some(task.task_id.to_string());
    message
}

/// A task record as an A2A task: state, result artifact, the request as history, and
/// Switchboard's own facts (assignee, requester, deadline) in the metadata. Its files are
/// links (`links`) for its requester, the client that reads it.
pub fn task(record: &TaskRecord, links: &FileLinks) -> Task {
    let context = context_of(record);
    let mut metadata = HashMap::from([
        (
            "switchboardAssignee".to_owned(),
            Value::String(record.assignee.to_string()),
        ),
        (
            "switchboardState".to_owned(),
            Value::String(record.state.as_str().to_owned()),
        ),
    ]);
    if let Some(deadline) = record.deadline.and_then(utc) {
        metadata.insert(
            "switchboardDeadline".to_owned(),
            Value::String(deadline.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
        );
    }
    Task {
        id: record.task_id.to_string(),
        context_id: context.clone(),
        status: status(record),
        artifacts: result(record, links).map(|artifact| vec![artifact]),
        history: Some(vec![request(record, &context, links)]),
        metadata: Some(metadata),
    }
}

/// A task id from a client: a UUID, or the task does not exist for it.
pub(crate) fn task_id(id: &str) -> Result<uuid::Uuid, crate::error::GatewayError> {
    uuid::Uuid::parse_str(id).map_err(|_| crate::error::GatewayError::TaskNotFound(id.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_switchboard_state_has_an_a2a_state() {
        use TaskState as S;
        for (ours, theirs) in [
            (S::Submitted, a2a::TaskState::Submitted),
            (S::Accepted, a2a::TaskState::Submitted),
            (S::Working, a2a::TaskState::Working),
            (S::InputRequired, a2a::TaskState::InputRequired),
            (S::Completed, a2a::TaskState::Completed),
            (S::Failed, a2a::TaskState::Failed),
            (S::Rejected, a2a::TaskState::Rejected),
            (S::Canceled, a2a::TaskState::Canceled),
        ] {
            assert_eq!(state(ours), theirs);
        }
    }

    #[test]
    fn a_completion_without_text_or_parts_has_no_artifact() {
        let completed = |result: serde_json::Value| -> TaskRecord {
            let mut record = serde_json::json!({
                "task_id": "0193a1b2-0000-7000-8000-000000000a01",
                "requester": "a2a-client",
                "assignee": "echo",
                "state": "completed",
                "message": "hi",
                "depth": 1,
                "message_id": "0193a1b2-0000-7000-8000-0000000000b1",
                "transitions": 3,
                "created_at": "2026-04-30T14:00:00Z",
                "updated_at": "2026-04-30T14:00:01Z",
            });
            if let (Some(record), Some(extra)) = (record.as_object_mut(), result.as_object()) {
                record.extend(extra.clone());
            }
            serde_json::from_value(record).unwrap_or_else(|err| panic!("{err}"))
        };
        let links = crate::links::FileLinks::new(
            "a secret of the tests",
            "http://127.0.0.1:9".into(),
            std::time::Duration::from_secs(60),
        );
        assert!(result(&completed(serde_json::json!({})), &links).is_none());
        assert!(result(&completed(serde_json::json!({"result": ""})), &links).is_none());
        let answered = result(&completed(serde_json::json!({"result": "done"})), &links);
        assert_eq!(answered.map(|artifact| artifact.parts.len()), Some(1));
    }

    #[test]
    fn parts_cross_both_ways_raw_bytes_as_data_uris() {
        let parts = vec![
            Part::text("hello"),
            Part::data(serde_json::json!({"k": 1})),
            Part::url("https://example.com/a.txt").with_media_type("text/plain"),
        ];
        let (body, carried) = inbound(&parts);
        assert_eq!(body, "hello");
        assert_eq!(carried.len(), 2);
        let back = outbound(&carried);
        assert_eq!(back[0], Part::data(serde_json::json!({"k": 1})));
        let raw = Part::raw(b"tck".to_vec())
            .with_media_type("text/plain")
            .with_filename("output.txt");
        let (_, carried) = inbound(std::slice::from_ref(&raw));
        assert_eq!(
            carried,
            vec![switchboard_proto::Part::File {
                uri: "data:text/plain;base64,dGNr".to_owned(),
                mime: Some("text/plain".to_owned()),
                name: Some("output.txt".to_owned()),
            }]
        );
        assert_eq!(outbound(&carried), vec![raw]);
        // A media type that would break the URI is left out of it, not carried into it.
        let odd = Part::raw(vec![0, 255]).with_media_type("text/plain;base64,AAAA");
        let (_, carried) = inbound(&[odd]);
        let switchboard_proto::Part::File { uri, .. } = &carried[0] else {
            panic!("a raw part is carried as a file");
        };
        assert_eq!(uri, "data:;base64,AP8=");
        assert_eq!(data_uri_bytes(uri), Some(vec![0, 255]));
    }
}
