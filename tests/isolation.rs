//! Isolation against a hostile agent (ARCHITECTURE.md §8), as far as it is built: a request
//! whose reply subject is not a reply inbox is refused unanswered and not run, so no agent can
//! make a service write where it points — another agent's registry record, a goal's inbox, the
//! JetStream API. (The account-based configuration of issue 17 is not built yet.)

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use serde_json::json;
use switchboard_proto::subject::{self, RegistryOp};
use switchboard_proto::{AgentId, EVENTS_STREAM, REGISTRY_BUCKET};
use switchboard_tests::{Fabric, raw};

fn id(agent: &str) -> AgentId {
    AgentId::parse(agent).unwrap()
}

#[tokio::test]
async fn a_reply_subject_of_the_callers_choosing_is_never_written_to() {
    let fabric = Fabric::start().await;
    let (bob, bob_goal) = fabric.agent_with_goal("bob").await;
    let _mallory = fabric.agent("mallory").await;
    let client = fabric.nats.client().await;
    let js = async_nats::jetstream::new(client.clone());
    let registry = js.get_key_value(REGISTRY_BUCKET).await.unwrap();
    let bob_record = registry.entry("bob").await.unwrap().unwrap();
    let targets = [
        "$KV.agent_registry.bob".to_owned(),
        subject::inbox(&bob_goal.id()),
        format!("$JS.API.STREAM.DELETE.{EVENTS_STREAM}"),
        "_SB.audit.records".to_owned(),
        "_SB.calls.answer.00000000-0000-7000-8000-000000000000".to_owned(),
        "_INBOX.>".to_owned(),
    ];
    // What mallory may legitimately ask, each with a reply subject of her choosing; the last
    // would take mallory offline if it ran.
    let requests = [
        (RegistryOp::Peers.subject(&id("mallory")), json!({})),
        (RegistryOp::Heartbeat.subject(&id("mallory")), json!({})),
        (
            subject::send(&id("mallory")),
            json!({"to": "bob", "message": "hi"}),
        ),
        (
            subject::inbox_fetch(&id("mallory")),
            json!({"goal_id": bob_goal.id()}),
        ),
        (RegistryOp::Deregister.subject(&id("mallory")), json!({})),
    ];
    for target in &targets {
        for (subject, body) in &requests {
            client
                .publish_with_reply(subject.clone(), target.clone(), body.to_string().into())
                .await
                .unwrap();
        }
    }
    client.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Nothing was written, nothing was run.
    let after = registry.entry("bob").await.unwrap().unwrap();
    assert_eq!(
        after.revision, bob_record.revision,
        "bob's record untouched"
    );
    assert!(
        js.get_stream(EVENTS_STREAM).await.is_ok(),
        "AGENT_EVENTS still exists"
    );
    assert!(
        bob_goal.drain().await.unwrap().is_empty(),
        "bob's inbox untouched"
    );
    let mallory = bob.lookup("mallory").await.unwrap();
    assert_ne!(
        mallory.status,
        switchboard_proto::AgentStatus::Offline,
        "the deregister was not run"
    );
    // Each refusal is counted by kind in the endpoint's stats.
    let stats = raw(&client, "$SRV.STATS.directory", "").await;
    let refused: u64 = stats.body["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["data"]["errors_by_kind"]["bad_reply_subject"].as_u64())
        .sum();
    assert_eq!(refused, (targets.len() * 3) as u64, "{}", stats.body);
    // The same requests with a reply inbox are answered.
    let peers = raw(&client, &RegistryOp::Peers.subject(&id("mallory")), "{}").await;
    assert!(peers.body["peers"].is_array(), "{}", peers.body);
}

/// Issue 17, attack 6: a parked call names the goal its answer and timeout notice go to; naming
/// another agent's goal would flood that goal's inbox. The correlator checks the goal is the
/// caller's own before anything is stored or delivered.
#[tokio::test]
async fn a_call_cannot_park_its_answers_in_another_agents_goal() {
    let fabric = Fabric::start().await;
    let (_bob, bob_goal) = fabric.agent_with_goal("bob").await;
    let (_mallory, mallory_goal) = fabric.agent_with_goal("mallory").await;
    let (_carol, carol_goal) = fabric.agent_with_goal("carol").await;
    let client = fabric.nats.client().await;
    let call = |goal: switchboard_proto::GoalId| {
        json!({"to": "carol", "message": "?", "wait": false, "timeout_ms": 1, "from_goal_id": goal})
            .to_string()
    };
    for goal in [bob_goal.id(), switchboard_proto::GoalId::new()] {
        let refused = raw(&client, &subject::call(&id("mallory")), call(goal)).await;
        assert_eq!(refused.error_kind(), "invalid_goal_id", "{}", refused.body);
    }
    assert!(
        carol_goal.drain().await.unwrap().is_empty(),
        "nothing was delivered"
    );
    // Her own goal: the call is made, and its timeout notice lands in her goal, not bob's.
    let parked = raw(
        &client,
        &subject::call(&id("mallory")),
        call(mallory_goal.id()),
    )
    .await;
    assert!(parked.body["correlation_id"].is_string(), "{}", parked.body);
    let notice = mallory_goal
        .recv(Duration::from_secs(10))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(notice.message.kind, switchboard_proto::MessageKind::Notify);
    notice.ack().await.unwrap();
    assert!(
        bob_goal.drain().await.unwrap().is_empty(),
        "bob's inbox untouched"
    );
}
