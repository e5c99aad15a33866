// Longer than 600 lines because it is the one table of every wire type and agent-facing
// subject (the AsyncAPI document is generated from it): split, the contract would have two
// indexes to keep in step.

//! The wire contract as data: a JSON Schema (draft 2020-12) for every
//! request, reply and stored message type, and an AsyncAPI 3.0 document naming every
//! agent-facing subject with its request and reply. Both are generated from the types
//! themselves, so they cannot drift from them: `tests/contract.rs` compares them with the
//! committed `docs/schema/*.json` and `docs/asyncapi.yaml` (and rewrites those with
//! `SWITCHBOARD_WRITE_CONTRACT=1`), then validates the document with the official AsyncAPI
//! parser. A foreign client (the Python and TypeScript SDKs) reads its types from there.

use schemars::{JsonSchema, schema_for};
use serde_json::{Map, Value, json};

use crate::approval::{ApprovalRequest, ApprovalUse, ApprovalUsed};
use crate::audit::{
    AuditRecords, ExportDone, HistoryRequest, RefusalEvent, ThreadRequest, VerifyReply,
};
use crate::budget::{
    BudgetEvent, BudgetGrant, BudgetQuery, BudgetView, CloseRequest, CostQuery, CostReport,
    ReserveRequest, SpendRequest,
};
use crate::call::{
    CallAnswer, CallEvent, CallParked, CallPart, CallParts, CallPartsRequest, PendingCalls,
    ReplyAck, ReplyRequest,
};
use crate::files::{
    Attachment, ChunkReply, DeleteReply, FileQuery, FileView, ReadEnd, ReadRequest, RevokeReply,
    RevokeRequest, UploadReply, UploadRequest,
};
use crate::inbox::{AckReply, AckRequest, FetchReply, FetchRequest};
use crate::limits::{
    AcquireRequest, Lease, LimitList, LimitQuery, LimitSpec, LimitView, ReleaseRequest, Released,
    RenewRequest,
};
use crate::people::ops::{AnswerAck, AnswerRequest, InboxPage, InboxQuery, PersonItemQuery};
use crate::people::{
    AskRequest, ItemRequest, NoteReport, NoteRequest, Parked, PendingItems, PeopleEvent,
    PeopleList, PersonItem,
};
use crate::receipt::{SendStatusReply, SendStatusRequest};
use crate::registry::{
    AgentCard, DeregisterReply, GoalCloseReply, GoalCloseRequest, GoalOpenReply, GoalOpenRequest,
    HeartbeatReply, HeartbeatRequest, LookupReply, LookupRequest, PeersReply, PeersRequest,
    RegisterReply, RegistryEventPayload,
};
use crate::send::{DeliveryReport, SendRequest};
use crate::task::ops::{OpsCancel, OpsListTasks, TaskTree, TreeQuery};
use crate::task::{CreateTask, ListTasks, TaskAction, TaskEvent, TaskList, TaskReply};
use crate::{ErrorReply, InboxMessage};

/// An empty request body (`{}`), for the subjects that take none.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize, JsonSchema)]
pub struct Empty {}

/// The schema of `T`, as a JSON value.
fn schema<T: JsonSchema>() -> Value {
    schema_for!(T).to_value()
}

/// Every wire type with a schema of its own, by name: what `docs/schema/<name>.json` holds.
pub fn schemas() -> Vec<(&'static str, Value)> {
    macro_rules! named {
        ($($t:ident),* $(,)?) => { vec![$((stringify!($t), schema::<$t>()),)*] };
    }
    named![
        AckReply,
        AckRequest,
        AcquireRequest,
        AgentCard,
        AnswerAck,
        AnswerRequest,
        ApprovalRequest,
        ApprovalUse,
        ApprovalUsed,
        AskRequest,
        AuditRecords,
        CallAnswer,
        CallEvent,
        CallPart,
        CallParked,
        CallParts,
        CallPartsRequest,
        CallRequest,
        CreateTask,
        DeliveryReport,
        DeregisterReply,
        Empty,
        ErrorReply,
        ExportDone,
        FetchReply,
        FetchRequest,
        GoalCloseReply,
        GoalCloseRequest,
        GoalOpenReply,
        GoalOpenRequest,
        HeartbeatReply,
        HeartbeatRequest,
        HistoryRequest,
        InboxMessage,
        InboxPage,
        InboxQuery,
        ItemRequest,
        Lease,
        BudgetEvent,
        BudgetGrant,
        BudgetQuery,
        BudgetView,
        CloseRequest,
        CostQuery,
        CostReport,
        ReserveRequest,
        SpendRequest,
        LimitList,
        LimitQuery,
        LimitSpec,
        LimitView,
        Attachment,
        UploadRequest,
        UploadReply,
        ChunkReply,
        ReadRequest,
        ReadEnd,
        FileQuery,
        FileView,
        RevokeRequest,
        RevokeReply,
        DeleteReply,
        ListTasks,
        LookupReply,
        LookupRequest,
        NoteReport,
        NoteRequest,
        OpsCancel,
        OpsListTasks,
        Parked,
        PeersReply,
        PeersRequest,
        PendingCalls,
        PendingItems,
        PeopleEvent,
        PeopleList,
        PersonItem,
        PersonItemQuery,
        RefusalEvent,
        RegisterReply,
        RegistryEventPayload,
        ReleaseRequest,
        Released,
        RenewRequest,
        ReplyAck,
        ReplyRequest,
        SendRequest,
        SendStatusReply,
        SendStatusRequest,
        TaskAction,
        TaskEvent,
        TaskList,
        TaskReply,
        TaskTree,
        ThreadRequest,
        TreeQuery,
        VerifyReply,
    ]
}

use crate::call::CallRequest;

/// One agent-facing subject: a request an agent sends (and the replies it may get), or
/// messages a service publishes that an agent may read.
pub struct Subject {
    /// The operation's id in the AsyncAPI document.
    pub id: &'static str,
    /// The subject, `{agent_id}` (the caller) or `{task_id}` for the varying token.
    pub address: &'static str,
    /// What it does, and where docs/protocol.md says more.
    pub summary: &'static str,
    /// The request body's type (`send`), or the published message's (`receive`).
    pub message: &'static str,
    /// The replies (every request may also be answered with an `ErrorReply`); empty for a
    /// published message.
    pub replies: &'static [&'static str],
}

/// Every agent-facing subject (docs/protocol.md §3).
pub const SUBJECTS: &[Subject] = &[
    Subject {
        id: "register",
        address: "agent.registry.register.{agent_id}",
        summary: "Register (or update) the caller's card (§4.1).",
        message: "AgentCard",
        replies: &["RegisterReply"],
    },
    Subject {
        id: "heartbeat",
        address: "agent.registry.heartbeat.{agent_id}",
        summary: "Stay online (§4.2).",
        message: "HeartbeatRequest",
        replies: &["HeartbeatReply"],
    },
    Subject {
        id: "deregister",
        address: "agent.registry.deregister.{agent_id}",
        summary: "Leave: close every goal, drop the card (§4.3).",
        message: "Empty",
        replies: &["DeregisterReply"],
    },
    Subject {
        id: "goalOpen",
        address: "agent.registry.goal.open.{agent_id}",
        summary: "Open a goal: an inbox of its own (§4.4).",
        message: "GoalOpenRequest",
        replies: &["GoalOpenReply"],
    },
    Subject {
        id: "goalClose",
        address: "agent.registry.goal.close.{agent_id}",
        summary: "Close a goal and purge its inbox (§4.5).",
        message: "GoalCloseRequest",
        replies: &["GoalCloseReply"],
    },
    Subject {
        id: "peers",
        address: "agent.registry.peers.{agent_id}",
        summary: "list_peers: the agents the caller may reach (§4.6).",
        message: "PeersRequest",
        replies: &["PeersReply"],
    },
    Subject {
        id: "lookup",
        address: "agent.registry.lookup.{agent_id}",
        summary: "One agent's card and status (§4.7).",
        message: "LookupRequest",
        replies: &["LookupReply"],
    },
    Subject {
        id: "inboxFetch",
        address: "agent.inbox.fetch.{agent_id}",
        summary: "Read one of the caller's goals after its cursor, held up to wait_ms (§7).",
        message: "FetchRequest",
        replies: &["FetchReply"],
    },
    Subject {
        id: "inboxAck",
        address: "agent.inbox.ack.{agent_id}",
        summary: "Move a goal's cursor, or reject one message to the dead letters (§7).",
        message: "AckRequest",
        replies: &["AckReply"],
    },
    Subject {
        id: "send",
        address: "agent.send.{agent_id}",
        summary: "send_to_peer, or broadcast with to: \"*\" (§8).",
        message: "SendRequest",
        replies: &["DeliveryReport"],
    },
    Subject {
        id: "sendStatus",
        address: "agent.send.status.{agent_id}",
        summary: "Where a message sent with a receipt is (§8, Receipts).",
        message: "SendStatusRequest",
        replies: &["SendStatusReply"],
    },
    Subject {
        id: "call",
        address: "agent.call.{agent_id}",
        summary: "A correlated call: waits for the answer, or parks (§9). With stream: true, CallPart replies come before the answer.",
        message: "CallRequest",
        replies: &["CallAnswer", "CallParked", "CallPart"],
    },
    Subject {
        id: "reply",
        address: "agent.reply.{agent_id}",
        summary: "Answer a call by its correlation_id, whole or in parts (§9).",
        message: "ReplyRequest",
        replies: &["ReplyAck"],
    },
    Subject {
        id: "callsPending",
        address: "agent.calls.pending.{agent_id}",
        summary: "The caller's open calls (§9).",
        message: "Empty",
        replies: &["PendingCalls"],
    },
    Subject {
        id: "callsParts",
        address: "agent.calls.parts.{agent_id}",
        summary: "Read back the parts of a streamed call (§9).",
        message: "CallPartsRequest",
        replies: &["CallParts"],
    },
    Subject {
        id: "taskCreate",
        address: "agent.task.create.{agent_id}",
        summary: "Give a task to an agent (§10).",
        message: "CreateTask",
        replies: &["TaskReply"],
    },
    Subject {
        id: "taskSpawn",
        address: "agent.task.spawn.{agent_id}",
        summary: "Split the task being worked on into a subtask (§10).",
        message: "CreateTask",
        replies: &["TaskReply"],
    },
    Subject {
        id: "taskAccept",
        address: "agent.task.accept.{agent_id}",
        summary: "Accept a task given to the caller (§10).",
        message: "TaskAction",
        replies: &["TaskReply"],
    },
    Subject {
        id: "taskReject",
        address: "agent.task.reject.{agent_id}",
        summary: "Reject a task, with a reason (§10).",
        message: "TaskAction",
        replies: &["TaskReply"],
    },
    Subject {
        id: "taskStart",
        address: "agent.task.start.{agent_id}",
        summary: "Start (or resume) work on a task (§10).",
        message: "TaskAction",
        replies: &["TaskReply"],
    },
    Subject {
        id: "taskProgress",
        address: "agent.task.progress.{agent_id}",
        summary: "Report progress: a note and/or parts (§10).",
        message: "TaskAction",
        replies: &["TaskReply"],
    },
    Subject {
        id: "taskInputRequired",
        address: "agent.task.input_required.{agent_id}",
        summary: "Ask the requester a question (§10).",
        message: "TaskAction",
        replies: &["TaskReply"],
    },
    Subject {
        id: "taskComplete",
        address: "agent.task.complete.{agent_id}",
        summary: "Complete a task with its result (§10).",
        message: "TaskAction",
        replies: &["TaskReply"],
    },
    Subject {
        id: "taskFail",
        address: "agent.task.fail.{agent_id}",
        summary: "Fail a task, with a reason (§10).",
        message: "TaskAction",
        replies: &["TaskReply"],
    },
    Subject {
        id: "taskCancel",
        address: "agent.task.cancel.{agent_id}",
        summary: "Cancel a task the caller gave, and its open subtasks (§10).",
        message: "TaskAction",
        replies: &["TaskReply"],
    },
    Subject {
        id: "taskGet",
        address: "agent.task.get.{agent_id}",
        summary: "Read a task the caller is a party of (§10).",
        message: "TaskAction",
        replies: &["TaskReply"],
    },
    Subject {
        id: "taskList",
        address: "agent.task.list.{agent_id}",
        summary: "List the caller's tasks (§10).",
        message: "ListTasks",
        replies: &["TaskList"],
    },
    Subject {
        id: "taskEvents",
        address: "agent.task.events.{task_id}",
        summary: "Published by task-lifecycle: the creation and every transition of a task (§10, Events).",
        message: "TaskEvent",
        replies: &[],
    },
    Subject {
        id: "peopleNote",
        address: "agent.people.note.{agent_id}",
        summary: "Note a person or a role: recorded in their inbox; nothing waits (§14).",
        message: "NoteRequest",
        replies: &["NoteReport"],
    },
    Subject {
        id: "peopleAsk",
        address: "agent.people.ask.{agent_id}",
        summary: "Ask a person or a role; the answer arrives in from_goal_id's inbox as kind: response with from_person (§14).",
        message: "AskRequest",
        replies: &["Parked"],
    },
    Subject {
        id: "peopleApprovalRequest",
        address: "agent.people.approval.request.{agent_id}",
        summary: "Request an approval of one exact action, bound to its RFC 8785 SHA-256 (§14).",
        message: "ApprovalRequest",
        replies: &["Parked"],
    },
    Subject {
        id: "peopleApprovalUse",
        address: "agent.people.approval.use.{agent_id}",
        summary: "Check an approval for this exact action and spend it: single use (§14).",
        message: "ApprovalUse",
        replies: &["ApprovalUsed"],
    },
    Subject {
        id: "peopleGet",
        address: "agent.people.get.{agent_id}",
        summary: "One of the caller's items addressed to people (§14).",
        message: "ItemRequest",
        replies: &["PersonItem"],
    },
    Subject {
        id: "peoplePending",
        address: "agent.people.pending.{agent_id}",
        summary: "The caller's asks and approvals waiting for a person, and approvals not used yet (§14).",
        message: "Empty",
        replies: &["PendingItems"],
    },
    Subject {
        id: "peopleList",
        address: "agent.people.list.{agent_id}",
        summary: "The persons and roles configured, and whether the caller may reach each (§14).",
        message: "Empty",
        replies: &["PeopleList"],
    },
    Subject {
        id: "peopleEvents",
        address: "agent.people.events.{event}.{item_id}",
        summary: "Published by people: what happened to an item addressed to a person (§14, Events).",
        message: "PeopleEvent",
        replies: &[],
    },
    Subject {
        id: "limitsAcquire",
        address: "agent.limits.acquire.{agent_id}",
        summary: "Take a lease on a provider limit before calling the provider, waiting up to wait_ms in a queue fair across agents (§15).",
        message: "AcquireRequest",
        replies: &["Lease"],
    },
    Subject {
        id: "limitsRelease",
        address: "agent.limits.release.{agent_id}",
        summary: "Give a lease back with the tokens the call used (§15).",
        message: "ReleaseRequest",
        replies: &["Released"],
    },
    Subject {
        id: "limitsRenew",
        address: "agent.limits.renew.{agent_id}",
        summary: "Hold a lease longer (§15).",
        message: "RenewRequest",
        replies: &["Lease"],
    },
    Subject {
        id: "limitsGet",
        address: "agent.limits.get.{agent_id}",
        summary: "A limit, what is in use, and the caller's own leases (§15).",
        message: "LimitQuery",
        replies: &["LimitView"],
    },
    Subject {
        id: "filesUpload",
        address: "agent.files.upload.{agent_id}",
        summary: "Declare an upload: name, media type, size and SHA-256; quota and size are checked before any data moves (§17).",
        message: "UploadRequest",
        replies: &["UploadReply"],
    },
    Subject {
        id: "filesChunk",
        address: "agent.files.chunk.{agent_id}",
        summary: "One chunk of an upload, in order: the body is the bytes (128 KiB, the last one the rest), the headers Switchboard-File-Id and Switchboard-File-Offset (§17).",
        message: "Empty",
        replies: &["ChunkReply"],
    },
    Subject {
        id: "filesRead",
        address: "agent.files.read.{agent_id}",
        summary: "Read a file the caller uploaded or was delivered: up to 8 chunk messages (bytes, Switchboard-File-Offset and Switchboard-Chunk-Seq headers), then a ReadEnd (§17).",
        message: "ReadRequest",
        replies: &["ReadEnd"],
    },
    Subject {
        id: "filesStat",
        address: "agent.files.stat.{agent_id}",
        summary: "What a file is, and how far its upload got (§17).",
        message: "FileQuery",
        replies: &["FileView"],
    },
    Subject {
        id: "filesRevoke",
        address: "agent.files.revoke.{agent_id}",
        summary: "The uploader takes back one reader of a file, or every one (§17).",
        message: "RevokeRequest",
        replies: &["RevokeReply"],
    },
    Subject {
        id: "filesDelete",
        address: "agent.files.delete.{agent_id}",
        summary: "The uploader deletes a file now (§17).",
        message: "FileQuery",
        replies: &["DeleteReply"],
    },
    Subject {
        id: "auditThread",
        address: "agent.audit.thread",
        summary: "A conversation's audit records (§11).",
        message: "ThreadRequest",
        replies: &["AuditRecords"],
    },
    Subject {
        id: "auditHistory",
        address: "agent.audit.history",
        summary: "Audit records by agent, goal, task, time or kind (§11).",
        message: "HistoryRequest",
        replies: &["AuditRecords"],
    },
    Subject {
        id: "auditPending",
        address: "agent.audit.pending",
        summary: "Requests with no answer yet (§11).",
        message: "Empty",
        replies: &["AuditRecords"],
    },
    Subject {
        id: "budgetSpend",
        address: "agent.budget.spend.{agent_id}",
        summary: "Report what the caller spent on work it owns; charged up to what the work has left (§16).",
        message: "SpendRequest",
        replies: &["BudgetView"],
    },
    Subject {
        id: "budgetGet",
        address: "agent.budget.get.{agent_id}",
        summary: "A budget node the caller owns or asked for, and its tree's totals (§16).",
        message: "BudgetQuery",
        replies: &["BudgetView"],
    },
    Subject {
        id: "budgetReserve",
        address: "_SB.budget.reserve",
        summary: "Services only: open a root budget or reserve a child's from its parent (§16).",
        message: "ReserveRequest",
        replies: &["BudgetGrant"],
    },
    Subject {
        id: "budgetClose",
        address: "_SB.budget.close",
        summary: "Services only: the work ended; its unspent share returns to its parent (§16).",
        message: "CloseRequest",
        replies: &[],
    },
    Subject {
        id: "budgetEvents",
        address: "agent.budget.events.{event}.{root}",
        summary: "Published by limits: a budget opened, reserved, spent or exhausted (§16).",
        message: "BudgetEvent",
        replies: &[],
    },
    Subject {
        id: "auditCost",
        address: "agent.audit.cost",
        summary: "What each agent spent in a budget tree, or one agent's spend per tree (§16).",
        message: "CostQuery",
        replies: &["CostReport"],
    },
    Subject {
        id: "auditVerify",
        address: "agent.audit.verify",
        summary: "Check the audit trail's hash chain (§11).",
        message: "Empty",
        replies: &["VerifyReply"],
    },
];

/// What an inbox holds: the stored message every goal's fetch hands out (§7).
const STORED: &[&str] = &[
    "InboxMessage",
    "CallEvent",
    "RefusalEvent",
    "RegistryEventPayload",
    "ExportDone",
];

/// The AsyncAPI 3.0 document of [`SUBJECTS`], its payloads `$ref`s to `./schema/<name>.json`.
pub fn asyncapi() -> Value {
    let mut channels = Map::new();
    let mut operations = Map::new();
    let mut messages = Map::new();
    let message_ref = |name: &str| json!({ "$ref": format!("#/components/messages/{name}") });
    for subject in SUBJECTS {
        let mut parameters = Map::new();
        for parameter in ["agent_id", "task_id", "event", "item_id", "root"] {
            if subject.address.contains(&format!("{{{parameter}}}")) {
                let description = match parameter {
                    "agent_id" => {
                        "The caller's agent id: the last token is the caller, never a body field (§1)."
                    }
                    "task_id" => "The task the events are about.",
                    "event" => "What happened (PeopleEventKind, or a budget event's `event`).",
                    "root" => "The budget tree: its root piece of work's id (§16).",
                    _ => "The item addressed to a person the event is about.",
                };
                parameters.insert(parameter.to_owned(), json!({ "description": description }));
            }
        }
        let mut channel = json!({
            "address": subject.address,
            "messages": { subject.message: message_ref(subject.message) },
        });
        if !parameters.is_empty() {
            channel["parameters"] = Value::Object(parameters);
        }
        channels.insert(subject.id.to_owned(), channel);
        let mut operation = json!({
            "action": if subject.replies.is_empty() { "receive" } else { "send" },
            "channel": { "$ref": format!("#/channels/{}", subject.id) },
            "summary": subject.summary,
            "messages": [ { "$ref": format!("#/channels/{}/messages/{}", subject.id, subject.message) } ],
        });
        if !subject.replies.is_empty() {
            let reply_channel = format!("{}Reply", subject.id);
            let mut replies = Map::new();
            for reply in subject.replies.iter().chain(["ErrorReply"].iter()) {
                replies.insert((*reply).to_owned(), message_ref(reply));
            }
            channels.insert(
                reply_channel.clone(),
                json!({ "address": null, "messages": replies }),
            );
            operation["reply"] =
                json!({ "channel": { "$ref": format!("#/channels/{reply_channel}") } });
        }
        operations.insert(subject.id.to_owned(), operation);
    }
    for (name, schema) in schemas() {
        let mut message = json!({
            "name": name,
            "contentType": "application/json",
            "payload": { "$ref": format!("./schema/{name}.json") },
        });
        if let Some(description) = schema.get("description").and_then(Value::as_str) {
            message["summary"] = Value::from(description.lines().next().unwrap_or_default());
        }
        messages.insert(name.to_owned(), message);
    }
    json!({
        "asyncapi": "3.0.0",
        "info": {
            "title": "Switchboard",
            "version": env!("CARGO_PKG_VERSION"),
            "description": format!(
                "The subjects an agent uses on a Switchboard NATS fabric (docs/protocol.md, the wire contract). Every request is JSON; every request may be answered with an ErrorReply (with the NATS micro error headers). What an inbox fetch hands out are {}.",
                STORED.join(", ")
            ),
        },
        "defaultContentType": "application/json",
        "servers": {
            "local": { "host": "127.0.0.1:4222", "protocol": "nats", "description": "switchboard up (the embedded nats-server)" }
        },
        "channels": channels,
        "operations": operations,
        "components": { "messages": messages },
    })
}

/// `value` as YAML: block style, every string double-quoted (a JSON string is a valid YAML
/// double-quoted scalar), so the output needs no YAML library to be exact.
pub fn yaml(value: &Value) -> String {
    let mut out = String::new();
    write_yaml(value, 0, &mut out);
    out
}

fn key(name: &str) -> String {
    let plain = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if plain {
        name.to_owned()
    } else {
        Value::from(name).to_string()
    }
}

fn scalar(value: &Value) -> Option<String> {
    match value {
        Value::Object(map) if map.is_empty() => Some("{}".to_owned()),
        Value::Array(items) if items.is_empty() => Some("[]".to_owned()),
        Value::Object(_) | Value::Array(_) => None,
        other => Some(other.to_string()),
    }
}

fn write_yaml(value: &Value, indent: usize, out: &mut String) {
    let pad = " ".repeat(indent);
    match value {
        Value::Object(map) => {
            for (name, inner) in map {
                match scalar(inner) {
                    Some(text) => out.push_str(&format!("{pad}{}: {text}\n", key(name))),
                    None => {
                        out.push_str(&format!("{pad}{}:\n", key(name)));
                        write_yaml(inner, indent + 2, out);
                    }
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                match scalar(item) {
                    Some(text) => out.push_str(&format!("{pad}- {text}\n")),
                    None => {
                        let mut nested = String::new();
                        write_yaml(item, indent + 2, &mut nested);
                        // The first line of the item goes after the dash.
                        let nested = nested.trim_start();
                        out.push_str(&format!("{pad}- {nested}"));
                    }
                }
            }
        }
        other => out.push_str(&format!("{pad}{other}\n")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_subject_names_types_that_have_schemas() {
        let named: Vec<&str> = schemas().iter().map(|(name, _)| *name).collect();
        for subject in SUBJECTS {
            assert!(named.contains(&subject.message), "{}", subject.message);
            for reply in subject.replies {
                assert!(named.contains(reply), "{reply}");
            }
        }
    }

    #[test]
    fn yaml_quotes_what_needs_quoting() {
        let value = json!({"a": {"$ref": "x"}, "b": [{"c": 1, "d": "two"}, "e"], "f": {}});
        assert_eq!(
            yaml(&value),
            "a:\n  \"$ref\": \"x\"\nb:\n  - c: 1\n    d: \"two\"\n  - \"e\"\nf: {}\n"
        );
    }
}
