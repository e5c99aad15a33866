// Longer than 600 lines because each test is one person's whole story with an item (asked,
// shown, answered, refused, delivered once), and they share the fabric set-up above them.

//! People in the fabric (docs/protocol.md §14), against a real nats-server: an agent notes a
//! person, asks a person or a role and gets exactly one ending (the answer or a timeout
//! notice), requests an approval of an exact action and uses it once; escalation happens once;
//! two people answering at once get one winner; and every refusal has its stable kind.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use switchboard_client::{Agent, Goal, PersonAnswer};
use switchboard_proto::people::PeopleOp;
use switchboard_proto::people::ops::PeopleOpsOp;
use switchboard_proto::{AgentId, MessageKind};
use switchboard_tests::services::{Replica, Service, fast_people, runtime};
use switchboard_tests::wire::{Raw, assert_no_more, raw};
use switchboard_tests::{Fabric, agent_with, card};
use uuid::Uuid;

const PEOPLE: &str = r#"
[[person]]
id = "alice"
name = "Alice"
roles = ["oncall"]
access = ["viewer", "approver"]

[[person]]
id = "bob"
name = "Bob"
roles = ["oncall"]
access = ["viewer", "approver"]

[[person]]
id = "carol"
name = "Carol"
access = ["approver"]

[[person]]
id = "dave"
name = "Dave (no approver access)"
roles = ["readers"]

[[role]]
id = "oncall"
allow_from = ["deploy*"]
"#;

/// The fabric, `replicas` people services and the people file they read.
struct World {
    fabric: Fabric,
    people: Vec<Replica>,
    _dir: tempfile::TempDir,
    ops: async_nats::Client,
}

impl World {
    async fn start(replicas: usize) -> Self {
        let fabric = Fabric::start().await;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("people.toml");
        std::fs::write(&file, PEOPLE).unwrap();
        let mut people = Vec::new();
        for _ in 0..replicas {
            people.push(start_people(&fabric.url(), &file).await);
        }
        let ops = fabric.nats.client().await;
        Self {
            fabric,
            people,
            _dir: dir,
            ops,
        }
    }

    /// A person-side request over `_SB.ops.people.*`.
    async fn op(&self, op: PeopleOpsOp, body: Value) -> Raw {
        raw(&self.ops, &op.subject(), body.to_string()).await
    }
}

async fn start_people(url: &str, file: &Path) -> Replica {
    Service::People(fast_people(file))
        .start(&runtime(url))
        .await
}

/// An agent's request.
async fn agent_op(agent: &Agent, op: PeopleOp, body: Value) -> Raw {
    raw(agent.nats(), &op.subject(agent.id()), body.to_string()).await
}

fn ok(reply: &Raw) -> &Value {
    assert!(
        reply.headers.as_ref().is_none_or(|h| h
            .get(switchboard_proto::HEADER_SERVICE_ERROR_CODE)
            .is_none()),
        "expected success, got {}",
        reply.body
    );
    &reply.body
}

fn id_of(reply: &Raw) -> Uuid {
    Uuid::parse_str(ok(reply)["item_id"].as_str().unwrap()).unwrap()
}

/// Every message that arrives in `goal` within `wait`, acknowledged.
async fn drain(goal: &Goal, wait: Duration) -> Vec<switchboard_proto::InboxMessage> {
    let mut out = Vec::new();
    let until = tokio::time::Instant::now() + wait;
    loop {
        let left = until.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return out;
        }
        if let Some(delivery) = goal.recv(left).await.unwrap() {
            out.push(delivery.ack().await.unwrap());
        }
    }
}

/// The next message for item `id`, skipping nothing (asserts it is the item's).
async fn ending(goal: &Goal, id: Uuid) -> PersonAnswer {
    let message = switchboard_tests::wire::next(goal).await;
    PersonAnswer::of(&message, id).unwrap_or_else(|| panic!("not an ending of {id}: {message:?}"))
}

async fn deployer(world: &World) -> (Agent, Goal) {
    world.fabric.agent_with_goal("deployer").await
}

#[tokio::test]
async fn a_note_waits_in_the_inbox_and_an_answered_ask_reaches_the_agent_once() {
    let world = World::start(2).await;
    let (agent, goal) = deployer(&world).await;

    let note = agent
        .note_person("person:alice", "deploy 42 started")
        .await
        .unwrap();
    let inbox = world
        .op(PeopleOpsOp::Inbox, json!({"person": "alice"}))
        .await;
    let items = ok(&inbox)["items"].as_array().unwrap().clone();
    assert_eq!(items.len(), 1, "{items:?}");
    assert_eq!(items[0]["kind"], "note");
    assert_eq!(items[0]["message"], "deploy 42 started");
    let read = world
        .op(
            PeopleOpsOp::Answer,
            json!({"person": "person:alice", "item_id": note.item_id}),
        )
        .await;
    assert_eq!(ok(&read)["state"], "read");
    // A note retried by its id is noted once.
    let note_id = Uuid::now_v7();
    let once = json!({"to": "person:alice", "message": "once", "note_id": note_id});
    for _ in 0..2 {
        let noted = agent_op(&agent, PeopleOp::Note, once.clone()).await;
        assert_eq!(id_of(&noted), note_id);
    }
    let inbox = world
        .op(PeopleOpsOp::Inbox, json!({"person": "alice"}))
        .await;
    assert_eq!(ok(&inbox)["items"].as_array().unwrap().len(), 1);
    let read = world
        .op(
            PeopleOpsOp::Answer,
            json!({"person": "alice", "item_id": note_id}),
        )
        .await;
    assert_eq!(ok(&read)["state"], "read");
    let inbox = world
        .op(PeopleOpsOp::Inbox, json!({"person": "alice"}))
        .await;
    assert!(ok(&inbox)["items"].as_array().unwrap().is_empty());

    let parked = agent
        .ask_person(&goal, "person:alice", "roll back 42?", None)
        .await
        .unwrap();
    let shown = world
        .op(
            PeopleOpsOp::Item,
            json!({"person": "alice", "item_id": parked.item_id}),
        )
        .await;
    assert_eq!(ok(&shown)["message"], "roll back 42?");
    // Bob is not the addressee: he may neither see nor answer it.
    let peek = world
        .op(
            PeopleOpsOp::Item,
            json!({"person": "bob", "item_id": parked.item_id}),
        )
        .await;
    assert_eq!(peek.error_kind(), "not_found");
    let wrong = world
        .op(
            PeopleOpsOp::Answer,
            json!({"person": "bob", "item_id": parked.item_id, "message": "yes"}),
        )
        .await;
    assert_eq!(wrong.error_kind(), "not_addressee");

    let answered = world
        .op(
            PeopleOpsOp::Answer,
            json!({"person": "alice", "item_id": parked.item_id, "message": "yes, roll back"}),
        )
        .await;
    assert_eq!(ok(&answered)["state"], "answered");
    assert_eq!(ok(&answered)["delivered"], true);
    let PersonAnswer::Answered(answer) = ending(&goal, parked.item_id).await else {
        panic!("expected an answer");
    };
    assert_eq!(answer.kind, MessageKind::Response);
    assert_eq!(answer.body, "yes, roll back");
    assert_eq!(answer.from_person.as_deref(), Some("person:alice"));
    assert_eq!(answer.from_agent_id.as_str(), "people");
    // A second answer is refused and delivers nothing.
    let again = world
        .op(
            PeopleOpsOp::Answer,
            json!({"person": "alice", "item_id": parked.item_id, "message": "no"}),
        )
        .await;
    assert_eq!(again.error_kind(), "already_answered");
    assert_no_more(&goal).await;
    let done = world
        .op(
            PeopleOpsOp::Inbox,
            json!({"person": "alice", "state": "done"}),
        )
        .await;
    // Two notes read and the question answered.
    assert_eq!(ok(&done)["items"].as_array().unwrap().len(), 3);
}

#[tokio::test]
async fn an_unanswered_ask_times_out_with_one_notice_across_three_replicas() {
    let world = World::start(3).await;
    let (agent, goal) = deployer(&world).await;
    let parked = agent
        .ask_person(
            &goal,
            "role:oncall",
            "anyone?",
            Some(Duration::from_millis(300)),
        )
        .await
        .unwrap();
    let PersonAnswer::TimedOut(notice) = ending(&goal, parked.item_id).await else {
        panic!("expected the timeout notice");
    };
    assert_eq!(notice.kind, MessageKind::Notify);
    assert_eq!(notice.metadata["switchboard"], "ask_timeout");
    assert!(drain(&goal, Duration::from_millis(600)).await.is_empty());
    let late = world
        .op(
            PeopleOpsOp::Answer,
            json!({"person": "alice", "item_id": parked.item_id, "message": "late"}),
        )
        .await;
    assert_eq!(late.error_kind(), "expired");
}

#[tokio::test]
async fn bad_targets_rules_and_retries_get_their_kinds() {
    let world = World::start(1).await;
    let (agent, goal) = deployer(&world).await;
    let ask =
        |to: &str, message: &str| json!({"to": to, "message": message, "from_goal_id": goal.id()});
    let cases = [
        (ask("writer", "x"), "bad_request"),
        (ask("person:Alice", "x"), "bad_request"),
        (ask("person:zed", "x"), "unreachable"),
        (ask("role:nobody", "x"), "unreachable"),
        (ask("person:alice", "  "), "empty_message"),
        (ask("person:alice", &"x".repeat(17_000)), "body_too_large"),
        (
            json!({"to": "person:alice", "message": "x", "from_goal_id": Uuid::now_v7()}),
            "invalid_goal_id",
        ),
        (
            json!({"to": "person:alice", "message": "x", "from_goal_id": goal.id(), "timeout_ms": 0}),
            "bad_request",
        ),
        (
            json!({"to": "person:alice", "message": "x", "from_goal_id": goal.id(),
                   "escalate_after_ms": 10}),
            "bad_request",
        ),
        (
            json!({"to": "person:alice", "message": "x", "from_goal_id": goal.id(),
                   "unknown": 1}),
            "bad_request",
        ),
    ];
    // A hostile agent names another agent's live goal, or numbers past every edge.
    let (_, other_goal) = world.fabric.agent_with_goal("deploy-other").await;
    let hostile = [
        (
            json!({"to": "person:alice", "message": "x", "from_goal_id": other_goal.id()}),
            "invalid_goal_id",
        ),
        (
            json!({"to": "person:alice", "message": "x", "from_goal_id": goal.id(),
                   "timeout_ms": 9_223_372_036_854_775_808_u64}),
            "bad_request",
        ),
        (
            json!({"to": "person:alice", "message": "x", "from_goal_id": goal.id(),
                   "timeout_ms": 1_000, "escalate_after_ms": u64::MAX, "escalate_to": "person:bob"}),
            "bad_request",
        ),
        (
            json!({"to": "person:alice\r\nperson:bob", "message": "x", "from_goal_id": goal.id()}),
            "bad_request",
        ),
    ];
    for (body, kind) in cases.into_iter().chain(hostile) {
        let reply = agent_op(&agent, PeopleOp::Ask, body.clone()).await;
        assert_eq!(reply.error_kind(), kind, "{body}");
    }
    // The role admits deploy* only; an agent denying itself persons is refused too.
    let writer = world.fabric.agent_with_goal("writer").await;
    let refused = agent_op(
        &writer.0,
        PeopleOp::Ask,
        json!({"to": "role:oncall", "message": "x", "from_goal_id": writer.1.id()}),
    )
    .await;
    assert_eq!(refused.error_kind(), "acl_denied");
    let mut shy = card("deploy-shy");
    shy.deny_talk_to = vec!["person:*".into()];
    let shy = agent_with(&world.fabric.url(), shy, Duration::from_secs(3600)).await;
    let denied = agent_op(
        &shy,
        PeopleOp::Note,
        json!({"to": "person:alice", "message": "x"}),
    )
    .await;
    assert_eq!(denied.error_kind(), "acl_denied");
    // Not registered.
    let stranger = switchboard_client::agent_connect_options(&AgentId::parse("ghost").unwrap())
        .connect(world.fabric.url())
        .await
        .unwrap();
    let ghost = raw(
        &stranger,
        &PeopleOp::Note.subject(&AgentId::parse("ghost").unwrap()),
        json!({"to": "person:alice", "message": "x"}).to_string(),
    )
    .await;
    assert_eq!(ghost.error_kind(), "not_registered");
    // Approvals need an approver; dave has none.
    let approval = agent_op(
        &agent,
        PeopleOp::ApprovalRequest,
        json!({"action": {"tool": "t", "arguments": {}}, "reason": "r", "to": "person:dave",
               "from_goal_id": goal.id(), "expires_in_ms": 60_000}),
    )
    .await;
    assert_eq!(approval.error_kind(), "unreachable");
    // A retry by id joins; the same id with another question is a conflict.
    let id = Uuid::now_v7();
    let first =
        json!({"to": "person:alice", "message": "q", "from_goal_id": goal.id(), "ask_id": id});
    assert_eq!(
        id_of(&agent_op(&agent, PeopleOp::Ask, first.clone()).await),
        id
    );
    let again = agent_op(&agent, PeopleOp::Ask, first).await;
    assert_eq!(ok(&again)["joined"], true);
    let other =
        json!({"to": "person:alice", "message": "other", "from_goal_id": goal.id(), "ask_id": id});
    assert_eq!(
        agent_op(&agent, PeopleOp::Ask, other).await.error_kind(),
        "conflict"
    );
    // Another agent cannot read it.
    let peek = agent_op(&writer.0, PeopleOp::Get, json!({"item_id": id})).await;
    assert_eq!(peek.error_kind(), "not_found");
    // The reserved id cannot be registered (connecting registers).
    let refused = switchboard_client::Agent::connect(&world.fabric.url(), "people")
        .await
        .unwrap_err();
    assert_eq!(
        refused.kind(),
        Some(switchboard_proto::ErrorKind::NotAllowed)
    );
}

#[tokio::test]
async fn two_members_answering_at_once_get_one_winner_and_the_agent_one_answer() {
    let world = World::start(2).await;
    let (agent, goal) = deployer(&world).await;
    for round in 0..20 {
        let parked = agent
            .ask_person(&goal, "role:oncall", &format!("round {round}"), None)
            .await
            .unwrap();
        let body = |who: &str| json!({"person": who, "item_id": parked.item_id, "message": who});
        let (a, b) = tokio::join!(
            world.op(PeopleOpsOp::Answer, body("alice")),
            world.op(PeopleOpsOp::Answer, body("bob")),
        );
        let won: Vec<&Raw> = [&a, &b]
            .into_iter()
            .filter(|r| r.body.get("error").is_none())
            .collect();
        assert_eq!(won.len(), 1, "round {round}: {} / {}", a.body, b.body);
        let lost = if a.body.get("error").is_some() {
            &a
        } else {
            &b
        };
        assert_eq!(lost.error_kind(), "already_answered");
        let winner = if std::ptr::eq(lost, &a) {
            "bob"
        } else {
            "alice"
        };
        let message = lost.body["error"]["message"].as_str().unwrap();
        assert!(message.contains(&format!("person:{winner}")), "{message}");
        let PersonAnswer::Answered(answer) = ending(&goal, parked.item_id).await else {
            panic!("expected the answer");
        };
        assert_eq!(
            answer.from_person.as_deref(),
            Some(&*format!("person:{winner}"))
        );
    }
    assert_no_more(&goal).await;
}

fn action(amount: u64) -> Value {
    json!({"tool": "pay", "arguments": {"to": "acme", "amount": amount}})
}

#[tokio::test]
async fn an_approval_is_bound_to_its_action_and_used_once() {
    let world = World::start(2).await;
    let (agent, goal) = deployer(&world).await;
    let request = agent_op(
        &agent,
        PeopleOp::ApprovalRequest,
        json!({"action": action(100), "reason": "invoice 7", "to": "role:oncall",
               "from_goal_id": goal.id(), "expires_in_ms": 60_000}),
    )
    .await;
    let id = id_of(&request);
    let hash = ok(&request)["action_hash"].as_str().unwrap().to_owned();
    let use_ = |action: Value| json!({"approval_id": id, "action": action});
    assert_eq!(
        agent_op(&agent, PeopleOp::ApprovalUse, use_(action(100)))
            .await
            .error_kind(),
        "approval_pending"
    );
    // A person decides on the hash shown; another hash is refused; dave is no approver and
    // carol is not the addressee.
    let decide = |who: &str, hash: &str| json!({"person": who, "item_id": id, "decision": "approved", "action_hash": hash, "message": "ok"});
    assert_eq!(
        world
            .op(PeopleOpsOp::Answer, decide("alice", &"0".repeat(64)))
            .await
            .error_kind(),
        "action_mismatch"
    );
    assert_eq!(
        world
            .op(PeopleOpsOp::Answer, decide("carol", &hash))
            .await
            .error_kind(),
        "not_addressee"
    );
    let decided = world.op(PeopleOpsOp::Answer, decide("alice", &hash)).await;
    assert_eq!(ok(&decided)["state"], "approved");
    let PersonAnswer::Answered(answer) = ending(&goal, id).await else {
        panic!("expected the decision");
    };
    assert!(PersonAnswer::Answered(answer.clone()).approved());
    assert_eq!(answer.metadata["people"]["action_hash"], hash);

    // Changed arguments, another tool, or duplicate keys never pass for the approved action.
    assert_eq!(
        agent_op(&agent, PeopleOp::ApprovalUse, use_(action(1000)))
            .await
            .error_kind(),
        "action_mismatch"
    );
    let sneaky = format!(
        r#"{{"approval_id":"{id}","action":{{"tool":"pay","arguments":{{"to":"acme","amount":100,"amount":1000}}}}}}"#
    );
    let sneaky = raw(
        agent.nats(),
        &PeopleOp::ApprovalUse.subject(agent.id()),
        sneaky,
    )
    .await;
    assert_eq!(sneaky.error_kind(), "bad_request");
    // Two uses at once: one wins.
    let use_id = Uuid::now_v7();
    let with_id = json!({"approval_id": id, "action": action(100), "use_id": use_id});
    let (a, b) = tokio::join!(
        agent_op(&agent, PeopleOp::ApprovalUse, with_id.clone()),
        agent_op(&agent, PeopleOp::ApprovalUse, use_(action(100))),
    );
    let wins = [&a, &b]
        .iter()
        .filter(|r| r.body.get("error").is_none())
        .count();
    assert_eq!(wins, 1, "{} / {}", a.body, b.body);
    let loser = if a.body.get("error").is_some() {
        &a
    } else {
        &b
    };
    assert_eq!(loser.error_kind(), "approval_used");
    // The same use_id repeated gets the first reply back, if it won; a new use is refused.
    assert_eq!(
        agent_op(&agent, PeopleOp::ApprovalUse, use_(action(100)))
            .await
            .error_kind(),
        "approval_used"
    );
    if a.body.get("error").is_none() {
        let repeat = agent_op(&agent, PeopleOp::ApprovalUse, with_id).await;
        assert_eq!(ok(&repeat)["duplicate"], true);
    }
    // Another agent knows nothing of it.
    let (other, _) = world.fabric.agent_with_goal("deploy-2").await;
    assert_eq!(
        agent_op(&other, PeopleOp::ApprovalUse, use_(action(100)))
            .await
            .error_kind(),
        "not_found"
    );

    // Denied: the agent is told, and the use refused with the note.
    let denied = agent_op(
        &agent,
        PeopleOp::ApprovalRequest,
        json!({"action": action(5), "reason": "again", "to": "person:carol",
               "from_goal_id": goal.id(), "expires_in_ms": 60_000}),
    )
    .await;
    let denied_id = id_of(&denied);
    let hash = ok(&denied)["action_hash"].as_str().unwrap().to_owned();
    let no = world
        .op(
            PeopleOpsOp::Answer,
            json!({"person": "carol", "item_id": denied_id, "decision": "denied",
                   "action_hash": hash, "message": "not this month"}),
        )
        .await;
    assert_eq!(ok(&no)["state"], "denied");
    let decision = ending(&goal, denied_id).await;
    assert!(!decision.approved());
    let refused = agent_op(
        &agent,
        PeopleOp::ApprovalUse,
        json!({"approval_id": denied_id, "action": action(5)}),
    )
    .await;
    assert_eq!(refused.error_kind(), "approval_denied");
    assert!(
        refused.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not this month")
    );

    // Approved but not used by its expiry: refused `expired`.
    let short = agent_op(
        &agent,
        PeopleOp::ApprovalRequest,
        json!({"action": action(1), "reason": "quick", "to": "person:carol",
               "from_goal_id": goal.id(), "expires_in_ms": 800}),
    )
    .await;
    let short_id = id_of(&short);
    let hash = ok(&short)["action_hash"].as_str().unwrap().to_owned();
    let yes = world
        .op(
            PeopleOpsOp::Answer,
            json!({"person": "carol", "item_id": short_id, "decision": "approved", "action_hash": hash}),
        )
        .await;
    assert_eq!(ok(&yes)["state"], "approved");
    assert!(ending(&goal, short_id).await.approved());
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let late = agent_op(
        &agent,
        PeopleOp::ApprovalUse,
        json!({"approval_id": short_id, "action": action(1)}),
    )
    .await;
    assert_eq!(late.error_kind(), "expired");
    assert_no_more(&goal).await;
}

#[tokio::test]
async fn an_unanswered_item_escalates_once_and_the_first_addressee_is_told_so() {
    let world = World::start(3).await;
    let (agent, goal) = deployer(&world).await;
    let request = agent_op(
        &agent,
        PeopleOp::ApprovalRequest,
        json!({"action": action(9), "reason": "urgent", "to": "person:alice",
               "from_goal_id": goal.id(), "expires_in_ms": 60_000,
               "escalate_after_ms": 300, "escalate_to": "person:carol"}),
    )
    .await;
    let id = id_of(&request);
    let hash = ok(&request)["action_hash"].as_str().unwrap().to_owned();
    let notice = switchboard_tests::wire::next(&goal).await;
    assert_eq!(notice.metadata["switchboard"], "escalated");
    assert_eq!(notice.correlation_id, Some(id));
    assert!(
        PersonAnswer::of(&notice, id).is_none(),
        "escalation is no ending"
    );
    let decide = |who: &str| json!({"person": who, "item_id": id, "decision": "approved", "action_hash": hash});
    let alice = world.op(PeopleOpsOp::Answer, decide("alice")).await;
    assert_eq!(alice.error_kind(), "not_addressee");
    assert!(
        alice.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("escalated to person:carol")
    );
    let carol_inbox = world
        .op(PeopleOpsOp::Inbox, json!({"person": "carol"}))
        .await;
    assert_eq!(ok(&carol_inbox)["items"][0]["item_id"], id.to_string());
    let carol = world.op(PeopleOpsOp::Answer, decide("carol")).await;
    assert_eq!(ok(&carol)["state"], "approved");
    assert!(ending(&goal, id).await.approved());
    assert!(drain(&goal, Duration::from_millis(500)).await.is_empty());
    let used = agent_op(
        &agent,
        PeopleOp::ApprovalUse,
        json!({"approval_id": id, "action": action(9)}),
    )
    .await;
    assert_eq!(ok(&used)["decided_by"], "person:carol");
    // The audit trail names the person on what the person did.
    let events: Vec<Value> =
        switchboard_tests::wire::stored_json(&world.ops, &format!("agent.people.events.*.{id}"))
            .await;
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| e["event"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["approval_requested", "escalated", "approved", "used"]
    );
    assert_eq!(events[2]["by"], "person:carol");
    drop(world.people);
}

#[tokio::test]
async fn a_flood_from_one_agent_stops_at_its_share_and_hides_nobody_else() {
    let world = World::start(1).await;
    let (flood, flood_goal) = world.fabric.agent_with_goal("deploy-flood").await;
    let (honest, honest_goal) = world.fabric.agent_with_goal("deploy-honest").await;
    let mut refused = None;
    for n in 0..40 {
        let reply = agent_op(
            &flood,
            PeopleOp::Ask,
            json!({"to": "person:alice", "message": format!("flood {n}"), "from_goal_id": flood_goal.id()}),
        )
        .await;
        if reply.body.get("error").is_some() {
            refused = Some((n, reply.error_kind()));
            break;
        }
    }
    assert_eq!(refused, Some((32, "inbox_full".to_owned())));
    for n in 0..3 {
        honest
            .ask_person(&honest_goal, "person:alice", &format!("honest {n}"), None)
            .await
            .unwrap();
    }
    let page = world
        .op(PeopleOpsOp::Inbox, json!({"person": "alice", "limit": 6}))
        .await;
    let items = ok(&page)["items"].as_array().unwrap();
    let honest_on_page = items
        .iter()
        .filter(|item| item["from_agent"] == "deploy-honest")
        .count();
    assert_eq!(honest_on_page, 3, "{items:?}");
    let senders = ok(&page)["senders"].as_array().unwrap();
    assert_eq!(senders[0]["agent"], "deploy-flood");
    assert_eq!(senders[0]["at_cap"], true);
    assert_eq!(senders[0]["open"], 32);
    assert!(ok(&page)["next"].is_number());
}

/// Issue 39: 1,000 agents each note, ask and request an approval of one person, and a few
/// of them pile asks up to their share, while another person keeps reading their inbox. The
/// honest sender's one question is first on the person's first page, the flood shows as such
/// in the page's senders, and the other person's reads all succeed meanwhile.
#[tokio::test]
async fn a_thousand_agents_flooding_one_person_hide_nobody_and_stall_nobody() {
    use futures::StreamExt as _;
    const FLOODERS: usize = 1_000;
    const HEAVY: usize = 5;
    let world = World::start(1).await;
    let nats = world.fabric.nats.client().await;
    let (_honest, honest_goal) = world.fabric.agent_with_goal("deploy-honest").await;
    // Each flooder registers, opens a goal, and sends one of each.
    let flood = futures::stream::iter(0..FLOODERS)
        .map(|n| {
            let nats = nats.clone();
            async move {
                let id = AgentId::parse(&format!("flood-{n:04}")).unwrap();
                let registered = raw(
                    &nats,
                    &switchboard_proto::subject::RegistryOp::Register.subject(&id),
                    serde_json::to_string(&card(id.as_str())).unwrap(),
                )
                .await;
                ok(&registered);
                let goal = raw(
                    &nats,
                    &switchboard_proto::subject::RegistryOp::GoalOpen.subject(&id),
                    "{}".to_owned(),
                )
                .await;
                let goal = ok(&goal)["goal_id"].clone();
                let subject = PeopleOp::Ask.subject(&id);
                let ask = |k: usize| {
                    raw(
                        &nats,
                        &subject,
                        json!({"to": "person:alice", "message": format!("flood {n}/{k}"),
                            "from_goal_id": goal})
                        .to_string(),
                    )
                };
                // A heavy sender fills its share: 31 asks and the approval below make 32.
                let asks = if n < HEAVY { 31 } else { 1 };
                for k in 0..asks {
                    ok(&ask(k).await);
                }
                ok(&raw(
                    &nats,
                    &PeopleOp::Note.subject(&id),
                    json!({"to": "person:alice", "message": "<b>look at me</b>"}).to_string(),
                )
                .await);
                ok(&raw(
                    &nats,
                    &PeopleOp::ApprovalRequest.subject(&id),
                    json!({"to": "person:alice", "reason": "flood", "from_goal_id": goal,
                        "expires_in_ms": 600_000, "action": {"tool": "rm", "arguments": {"n": n}}})
                    .to_string(),
                )
                .await);
                let mut refused = 0;
                if n < HEAVY {
                    let past = ask(asks).await;
                    assert_eq!(past.error_kind(), "inbox_full", "{}", past.body);
                    refused += 1;
                }
                refused
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<usize>>();
    // Meanwhile bob reads his inbox over and over: every read is answered.
    let bob_reads = async {
        let mut waits = Vec::new();
        for _ in 0..40 {
            let started = std::time::Instant::now();
            let page = world.op(PeopleOpsOp::Inbox, json!({"person": "bob"})).await;
            ok(&page);
            waits.push(started.elapsed());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        waits.sort();
        waits
    };
    let (refused, waits) = tokio::join!(flood, bob_reads);
    // Only the heavy senders went past their share, each told at once (inbox_full).
    assert_eq!(refused.iter().sum::<usize>(), HEAVY);
    println!(
        "bob's inbox during the flood: p50 {:?}, p95 {:?}, max {:?}",
        waits[waits.len() / 2],
        waits[waits.len() * 95 / 100],
        waits.last().unwrap()
    );
    // The honest agent asks once, after the flood: first on alice's first page.
    let honest = raw(
        &world.ops,
        &PeopleOp::Ask.subject(&AgentId::parse("deploy-honest").unwrap()),
        json!({"to": "person:alice", "message": "honest question", "from_goal_id": honest_goal.id()})
            .to_string(),
    )
    .await;
    ok(&honest);
    let page = world
        .op(PeopleOpsOp::Inbox, json!({"person": "alice", "limit": 20}))
        .await;
    let body = ok(&page);
    assert_eq!(body["items"][0]["from_agent"], "deploy-honest", "{body}");
    // The flood shows as such: 1,001 senders, the heavy ones first and at their cap.
    let senders = body["senders"].as_array().unwrap();
    assert_eq!(senders.len(), FLOODERS + 1);
    for share in &senders[..HEAVY] {
        assert_eq!(share["at_cap"], true, "{share}");
        assert_eq!(share["open"], 32 + 1, "{share}");
    }
    assert!(body["next"].is_number());
}

/// Services as processes, each killed (SIGKILL) at once with the server.
async fn start_processes(
    url: &str,
    file: &Path,
) -> Vec<switchboard_testkit::process::ServiceProcess> {
    let file = file.display().to_string();
    let env = [
        ("SWITCHBOARD_PEOPLE__FILE", file.as_str()),
        ("SWITCHBOARD_PEOPLE__SWEEP_INTERVAL_MS", "100"),
    ];
    let mut out = Vec::new();
    for service in ["directory", "inbox-fanout", "people"] {
        out.push(
            switchboard_testkit::process::ServiceProcess::start(
                &switchboard_tests::service_bin(service),
                service,
                url,
                &env,
            )
            .await,
        );
    }
    out
}

#[tokio::test]
async fn an_approval_survives_a_kill_of_every_service_and_the_server() {
    let mut nats = switchboard_testkit::NatsServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("people.toml");
    std::fs::write(&file, PEOPLE).unwrap();
    let services = start_processes(&nats.url(), &file).await;
    let agent = agent_with(&nats.url(), card("deployer"), Duration::from_secs(3600)).await;
    let goal = agent.open_goal().await.unwrap();
    let parked = agent
        .request_approval(switchboard_proto::approval::ApprovalRequest {
            action: serde_json::from_value(action(42)).unwrap(),
            reason: "release 42".to_owned(),
            to: "person:alice".to_owned(),
            from_goal_id: goal.id(),
            expires_in_ms: 120_000,
            escalate_after_ms: Some(4_000),
            escalate_to: Some("person:carol".to_owned()),
            approval_id: None,
        })
        .await
        .unwrap();
    let id = parked.item_id;

    // Everything dies at once, the server too; then everything starts again on the same store.
    for service in services {
        service.signal("KILL").await;
    }
    nats.restart().await;
    let _services = start_processes(&nats.url(), &file).await;

    // The escalation still happens, once, after the restart.
    let notice = switchboard_tests::wire::next(&goal).await;
    assert_eq!(notice.metadata["switchboard"], "escalated", "{notice:?}");
    let ops = nats.client().await;
    let hash = parked.action_hash.clone().unwrap();
    let decided = raw(
        &ops,
        &PeopleOpsOp::Answer.subject(),
        json!({"person": "carol", "item_id": id, "decision": "approved", "action_hash": hash})
            .to_string(),
    )
    .await;
    assert_eq!(ok(&decided)["state"], "approved");
    let endings: Vec<_> = drain(&goal, Duration::from_secs(3))
        .await
        .into_iter()
        .filter(|message| PersonAnswer::of(message, id).is_some())
        .collect();
    assert_eq!(endings.len(), 1, "exactly one decision: {endings:?}");
    let used = agent
        .use_approval(id, serde_json::from_value(action(42)).unwrap())
        .await
        .unwrap();
    assert_eq!(used.decided_by.to_string(), "person:carol");
    let again = agent
        .use_approval(id, serde_json::from_value(action(42)).unwrap())
        .await
        .unwrap_err();
    assert_eq!(
        again.kind(),
        Some(switchboard_proto::ErrorKind::ApprovalUsed)
    );
}

#[tokio::test]
async fn an_answer_claimed_but_not_delivered_is_delivered_once_by_the_sweep() {
    let world = World::start(2).await;
    let (agent, goal) = deployer(&world).await;
    let parked = agent
        .ask_person(&goal, "person:bob", "still there?", None)
        .await
        .unwrap();
    // What a replica stopped between its claim and its delivery leaves behind: the record
    // answered, not delivered, claimed a while ago.
    let js = async_nats::jetstream::new(world.ops.clone());
    let bucket = js
        .get_key_value(switchboard_proto::PEOPLE_ITEMS_BUCKET)
        .await
        .unwrap();
    let key = format!("item.{}", parked.item_id);
    let entry = bucket.entry(key.as_str()).await.unwrap().unwrap();
    let mut item: Value = serde_json::from_slice(&entry.value).unwrap();
    let claimed_at = time::OffsetDateTime::now_utc() - time::Duration::seconds(30);
    item["state"] = json!("answered");
    item["answer"] = json!({"by": "person:bob", "message": "yes",
        "at": claimed_at.format(&time::format_description::well_known::Rfc3339).unwrap()});
    bucket
        .update(key.as_str(), item.to_string().into(), entry.revision)
        .await
        .unwrap();
    let endings: Vec<_> = drain(&goal, Duration::from_secs(3))
        .await
        .into_iter()
        .filter(|message| PersonAnswer::of(message, parked.item_id).is_some())
        .collect();
    assert_eq!(endings.len(), 1, "{endings:?}");
    assert_eq!(endings[0].from_person.as_deref(), Some("person:bob"));
    let stored = agent.person_item(parked.item_id).await.unwrap();
    assert!(stored.delivered);
}
