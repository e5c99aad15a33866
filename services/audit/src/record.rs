//! From a source message (an inbox delivery or an event) to an [`AuditRecord`], and the hash
//! that chains records.
//!
//! Payloads are read as plain JSON and the ids taken by field name, so the audit records what
//! was sent even when a producer's shape changes.

use serde_json::Value;
use switchboard_proto::GoalId;
use switchboard_proto::audit::{AuditRecord, GENESIS_HASH, hash_hex};
use switchboard_proto::subject::INBOX_SUBJECT_PREFIX;
use time::OffsetDateTime;
use uuid::Uuid;

/// SHA-256 of a record body, lowercase hex.
pub fn hash(body: &[u8]) -> String {
    hash_hex(ring::digest::digest(&ring::digest::SHA256, body).as_ref())
}

fn uuid(value: &Value, field: &str) -> Option<Uuid> {
    value
        .get(field)?
        .as_str()
        .and_then(|s| Uuid::parse_str(s).ok())
}

fn text(value: &Value, field: &str) -> Option<String> {
    value.get(field)?.as_str().map(str::to_owned)
}

fn goal(value: &Value, field: &str) -> Option<GoalId> {
    value
        .get(field)?
        .as_str()
        .and_then(|s| GoalId::parse(s).ok())
}

/// The record of one source message (its `prev_hash` is filled in when it is chained).
pub fn from_source(
    stream: &str,
    sequence: u64,
    at: OffsetDateTime,
    subject: &str,
    payload: &[u8],
) -> AuditRecord {
    let body: Value = serde_json::from_slice(payload)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(payload).into_owned()));
    let mut record = AuditRecord {
        id: format!("{stream}:{sequence}"),
        at,
        kind: "unknown".to_owned(),
        subject: subject.to_owned(),
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
        payload: Value::Null,
        trace_id: None,
        prev_hash: GENESIS_HASH.to_owned(),
    };
    let tokens: Vec<&str> = subject.split('.').collect();
    if let Some(goal_id) = subject
        .strip_prefix(INBOX_SUBJECT_PREFIX)
        .and_then(|rest| rest.strip_prefix('.'))
    {
        record.kind = text(&body, "kind").unwrap_or_else(|| "message".to_owned());
        record.message_id = uuid(&body, "id");
        record.correlation_id = uuid(&body, "correlation_id");
        record.in_reply_to = uuid(&body, "in_reply_to");
        if let Some(task) = body.get("task") {
            record.task_id = uuid(task, "id");
            record.parent_task_id = uuid(task, "parent");
        }
        // A person's answer, written by the people service, is the person's (§14).
        record.from_agent = text(&body, "from_person").or_else(|| text(&body, "from_agent_id"));
        record.from_goal = goal(&body, "from_goal_id");
        record.to_agent = text(&body, "to_agent_id");
        record.to_goal = GoalId::parse(goal_id).ok();
        record.expects_reply = body
            .get("expects_reply")
            .and_then(Value::as_bool)
            .unwrap_or(false);
    } else {
        match tokens.as_slice() {
            ["agent", "registry", "events", event, ..] => {
                record.kind = format!("registry.{event}");
                record.from_agent = text(&body, "agent_id");
                record.from_goal = goal(&body, "goal_id");
            }
            ["agent", "calls", "events", event, ..] => {
                record.kind = format!("call.{event}");
                record.correlation_id = uuid(&body, "correlation_id");
                record.from_agent = text(&body, "caller");
                record.to_agent = text(&body, "callee");
            }
            ["agent", "task", "events", ..] => {
                let op = text(&body, "op").unwrap_or_else(|| "created".to_owned());
                record.kind = format!("task.{op}");
                record.task_id = uuid(&body, "task_id");
                record.parent_task_id = uuid(&body, "parent");
                let by = text(&body, "by");
                let requester = text(&body, "requester");
                let assignee = text(&body, "assignee");
                record.to_agent = if by.is_some() && by == assignee {
                    requester
                } else {
                    assignee
                };
                record.from_agent = by.or_else(|| Some("switchboard".to_owned()));
            }
            ["agent", "people", "events", event, ..] => {
                // docs/protocol.md §14: what a person did names the person; what an agent did,
                // the agent. The item id is the thread's correlation id (an ask's answer is a
                // `response` with it).
                record.kind = format!("people.{event}");
                record.correlation_id = uuid(&body, "item_id");
                let agent = text(&body, "from_agent");
                let party = text(&body, "by").or_else(|| text(&body, "addressee"));
                if text(&body, "by").is_some() {
                    record.from_agent = party;
                    record.to_agent = agent;
                } else {
                    record.from_agent = agent;
                    record.to_agent = party;
                }
            }
            ["agent", "budget", "events", event, ..] => {
                // docs/protocol.md §16: the tree's root id is the record's correlation id, so
                // a tree's records are found together (`agent.audit.cost`, `thread`).
                record.kind = format!("budget.{event}");
                record.correlation_id = uuid(&body, "root");
                record.from_agent = text(&body, "agent_id");
                record.to_agent = text(&body, "requester");
            }
            ["agent", "refusals", service, ..] => {
                record.kind = format!("refused.{service}");
                record.from_agent = text(&body, "agent_id");
            }
            _ => {}
        }
    }
    record.payload = body;
    record
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_hash_is_the_sha256_in_lowercase_hex() {
        // FIPS 180-2 test vectors.
        assert_eq!(
            hash(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            hash(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn inbox_deliveries_and_events_get_their_ids() {
        let goal = "0193a1b2-0000-7000-8000-000000000001";
        let message = json!({
            "from_agent_id": "writer", "from_goal_id": goal, "to_agent_id": "researcher",
            "body": "hi", "sent_at": "2026-04-30T14:00:00Z", "kind": "request",
            "id": "0193a1b2-0000-7000-8000-0000000000aa", "expects_reply": true,
            "correlation_id": "0193a1b2-0000-7000-8000-0000000000cc"
        });
        let at = OffsetDateTime::UNIX_EPOCH;
        let record = from_source(
            "AGENT_INBOX",
            7,
            at,
            &format!("agent.inbox.{goal}"),
            &serde_json::to_vec(&message).unwrap(),
        );
        assert_eq!(record.id, "AGENT_INBOX:7");
        assert_eq!(record.kind, "request");
        assert!(record.expects_reply);
        assert_eq!(record.to_goal.unwrap().to_string(), goal);
        assert_eq!(record.from_agent.as_deref(), Some("writer"));
        assert!(record.correlation_id.is_some());

        let event = json!({"id": "x", "task_id": "0193a1b2-0000-7000-8000-0000000000dd",
            "op": "accept", "by": "researcher", "to": "accepted", "requester": "writer",
            "assignee": "researcher", "at": "2026-04-30T14:00:00Z"});
        let record = from_source(
            "AGENT_EVENTS",
            9,
            at,
            "agent.task.events.0193a1b2-0000-7000-8000-0000000000dd",
            &serde_json::to_vec(&event).unwrap(),
        );
        assert_eq!(record.kind, "task.accept");
        assert_eq!(record.from_agent.as_deref(), Some("researcher"));
        assert_eq!(record.to_agent.as_deref(), Some("writer"));
        let garbage = from_source("AGENT_EVENTS", 10, at, "agent.refusals.x.y", b"\xff");
        assert_eq!(garbage.kind, "refused.x");
        assert!(garbage.payload.is_string());

        let decided = json!({"id": "0193a1b2-0000-7000-8000-0000000000ee", "event": "approved",
            "item_id": "0193a1b2-0000-7000-8000-0000000000ff", "kind": "approval",
            "from_agent": "deployer", "to": "role:oncall", "addressee": "role:oncall",
            "by": "person:bob", "at": "2026-04-30T14:00:00Z"});
        let record = from_source(
            "AGENT_EVENTS",
            11,
            at,
            "agent.people.events.approved.0193a1b2-0000-7000-8000-0000000000ff",
            &serde_json::to_vec(&decided).unwrap(),
        );
        assert_eq!(record.kind, "people.approved");
        assert_eq!(record.from_agent.as_deref(), Some("person:bob"));
        assert_eq!(record.to_agent.as_deref(), Some("deployer"));
        assert_eq!(
            record.correlation_id.map(|id| id.to_string()).as_deref(),
            Some("0193a1b2-0000-7000-8000-0000000000ff")
        );
    }
}
