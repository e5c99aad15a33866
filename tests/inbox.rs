//! Reading inboxes through cursors (docs/protocol.md §7), end to end against a real
//! nats-server, as an agent would: `agent.inbox.fetch.<me>` and `agent.inbox.ack.<me>`, raw
//! JSON, no JetStream. Past the server's default of 1,000 consumers per stream, owner-only
//! reads, long-poll wake-ups across replicas, bounded redelivery, restarts and bad input.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

// Longer than 600 lines because it holds one scenario per test of reading an inbox; every
// integration file is its own test binary (a link of all five services), so a topic gets one file
// however many tests it has.

use std::time::{Duration, Instant};

use async_nats::Client;
use futures::{FutureExt, StreamExt};
use serde_json::{Value, json};
use switchboard_client::dlq_list;
use switchboard_proto::inbox::{FetchReply, INBOX_MAX_DELIVER};
use switchboard_proto::registry::GoalOpenReply;
use switchboard_proto::subject::{self, RegistryOp};
use switchboard_proto::{AgentId, GoalId, INBOX_STREAM};
use switchboard_testkit::{NatsServer, eventually};
use switchboard_tests::{DirectoryConfig, Fabric, card, raw, start_directory, start_fanout};

fn id(agent: &str) -> AgentId {
    AgentId::parse(agent).unwrap()
}

/// A fetch as a foreign agent sends it; panics on an error reply.
async fn fetch(client: &Client, agent: &str, body: Value) -> FetchReply {
    let reply = raw(client, &subject::inbox_fetch(&id(agent)), body.to_string()).await;
    assert!(
        reply.body.get("error").is_none(),
        "fetch refused: {}",
        reply.body
    );
    serde_json::from_value(reply.body).unwrap()
}

/// A `writer`, and a `reader` with an open goal holding `n` messages from it, `m0` to
/// `m<n-1>`.
async fn sent_to_reader(
    fabric: &Fabric,
    n: usize,
) -> (
    switchboard_client::Agent,
    switchboard_client::Agent,
    switchboard_client::Goal,
) {
    let writer = fabric.agent("writer").await;
    let (reader, goal) = fabric.agent_with_goal("reader").await;
    for n in 0..n {
        writer
            .send_to_peer("reader", &format!("m{n}"))
            .await
            .unwrap();
    }
    (writer, reader, goal)
}

/// The error kind of a fetch or ack that must be refused.
async fn refused(
    client: &Client,
    subject: &str,
    body: impl Into<bytes::Bytes>,
) -> (String, String) {
    let reply = raw(client, subject, body).await;
    let kind = reply.error_kind();
    (
        kind,
        reply.body["error"]["message"].as_str().unwrap().to_owned(),
    )
}

fn bodies(reply: &FetchReply) -> Vec<&str> {
    reply
        .messages
        .iter()
        .map(|m| m.message.body.as_str())
        .collect()
}

#[tokio::test]
async fn fetch_and_ack_hand_out_in_order_idempotently_and_only_forward() {
    let fabric = Fabric::start().await;
    let writer = fabric.agent("writer").await;
    let (_reader, goal) = fabric.agent_with_goal("reader").await;
    let client = fabric.nats.client().await;
    let g = goal.id().to_string();
    for n in 1..=5 {
        writer
            .send_to_peer("reader", &format!("m{n}"))
            .await
            .unwrap();
    }

    // In stream order, at most `max`, with the count of what is unread.
    let first = fetch(&client, "reader", json!({"goal_id": g, "max": 3})).await;
    assert_eq!(bodies(&first), ["m1", "m2", "m3"]);
    assert_eq!(first.unread, 5);
    assert_eq!(first.cursor, 0);
    let seqs: Vec<u64> = first.messages.iter().map(|m| m.seq).collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "stream order: {seqs:?}"
    );

    // Not acked: the same messages again.
    let again = fetch(&client, "reader", json!({"goal_id": g, "max": 3})).await;
    assert_eq!(bodies(&again), ["m1", "m2", "m3"]);

    // Past what was handed out: refused, nothing moves.
    let (kind, message) = refused(
        &client,
        &subject::inbox_ack(&id("reader")),
        json!({"goal_id": g, "through": seqs[2] + 1_000}).to_string(),
    )
    .await;
    assert_eq!(kind, "bad_request", "{message}");
    let (kind, _) = refused(
        &client,
        &subject::inbox_fetch(&id("reader")),
        json!({"goal_id": g, "ack_through": u64::MAX}).to_string(),
    )
    .await;
    assert_eq!(kind, "bad_request");

    // ack_through on the next fetch commits first, then hands out what follows.
    let next = fetch(
        &client,
        "reader",
        json!({"goal_id": g, "ack_through": seqs[1], "max": 64}),
    )
    .await;
    assert_eq!(next.cursor, seqs[1]);
    assert_eq!(bodies(&next), ["m3", "m4", "m5"]);

    // An ack lower than the cursor is a no-op; the cursor never goes back.
    let ack = raw(
        &client,
        &subject::inbox_ack(&id("reader")),
        json!({"goal_id": g, "through": seqs[0]}).to_string(),
    )
    .await;
    assert_eq!(ack.body["cursor"], seqs[1]);

    // Acked through the last: empty.
    let last = next.messages.last().unwrap().seq;
    let ack = raw(
        &client,
        &subject::inbox_ack(&id("reader")),
        json!({"goal_id": g, "through": last}).to_string(),
    )
    .await;
    assert_eq!(ack.body["cursor"], last);
    let empty = fetch(&client, "reader", json!({"goal_id": g})).await;
    assert!(empty.messages.is_empty());
    assert_eq!((empty.cursor, empty.unread), (last, 0));

    // A peek shows without taking: it does not count as a hand-out, however often.
    writer.send_to_peer("reader", "m6").await.unwrap();
    for _ in 0..INBOX_MAX_DELIVER + 2 {
        let peek = fetch(&client, "reader", json!({"goal_id": g, "peek": true})).await;
        assert_eq!(bodies(&peek), ["m6"]);
    }
    // What a peek showed may still be acknowledged: an ack names any message stored in the
    // goal, as the hand-out that gave it may not be recorded yet (docs/protocol.md §7, "Hand-out
    // is at least once"); past the goal's newest message it is refused.
    let peek = fetch(&client, "reader", json!({"goal_id": g, "peek": true})).await;
    let seen = peek.messages[0].seq;
    let (kind, _) = refused(
        &client,
        &subject::inbox_ack(&id("reader")),
        json!({"goal_id": g, "through": seen + 1}).to_string(),
    )
    .await;
    assert_eq!(kind, "bad_request", "past the newest message");
    let ack = raw(
        &client,
        &subject::inbox_ack(&id("reader")),
        json!({"goal_id": g, "through": seen}).to_string(),
    )
    .await;
    assert_eq!(ack.body["cursor"], seen);

    // Closed: the inbox is purged and the goal reads as unknown.
    let closed = goal.close().await.unwrap();
    assert_eq!(closed.purged, 6);
    let (kind, _) = refused(
        &client,
        &subject::inbox_fetch(&id("reader")),
        json!({"goal_id": g}).to_string(),
    )
    .await;
    assert_eq!(kind, "not_found");
}

#[tokio::test]
async fn only_the_owner_reads_or_moves_a_goal() {
    let fabric = Fabric::start().await;
    let writer = fabric.agent("writer").await;
    let (_owner, goal) = fabric.agent_with_goal("owner").await;
    let _mallory = fabric.agent("mallory").await;
    let client = fabric.nats.client().await;
    writer.send_to_peer("owner", "private").await.unwrap();
    let handed = fetch(&client, "owner", json!({"goal_id": goal.id()})).await;
    let seq = handed.messages[0].seq;

    let unknown = GoalId::new();
    for target in [goal.id(), unknown] {
        let attacks = [
            (
                subject::inbox_fetch(&id("mallory")),
                json!({"goal_id": target}),
            ),
            (
                subject::inbox_fetch(&id("mallory")),
                json!({"goal_id": target, "wait_ms": 100, "ack_through": seq}),
            ),
            (
                subject::inbox_ack(&id("mallory")),
                json!({"goal_id": target, "through": seq}),
            ),
            (
                subject::inbox_ack(&id("mallory")),
                json!({"goal_id": target, "seq": seq, "reject": "mine now"}),
            ),
        ];
        for (subject, body) in attacks {
            let (kind, message) = refused(&client, &subject, body.to_string()).await;
            assert_eq!(kind, "not_found", "{subject} {body}");
            // The same answer whether the goal exists or not (only the id differs).
            assert_eq!(
                message.replace(&target.to_string(), "<goal>"),
                "no live goal <goal> of yours"
            );
        }
    }
    // The owner's message is untouched: still unread, nothing dead-lettered.
    let still = fetch(&client, "owner", json!({"goal_id": goal.id()})).await;
    assert_eq!(bodies(&still), ["private"]);
    assert_eq!(still.cursor, 0);
    assert!(dlq_list(&client, 10).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_held_fetch_is_answered_within_milliseconds_of_a_store_on_any_replica() {
    let fabric = Fabric::start().await;
    // A second inbox-fanout replica: sends and fetches land on either.
    let _second = start_fanout(&fabric.url(), Default::default()).await;
    let writer = fabric.agent("writer").await;
    let (_reader, goal) = fabric.agent_with_goal("reader").await;
    let client = fabric.nats.client().await;

    // Nothing arrives: the wait ends with an empty answer, not before.
    let started = Instant::now();
    let empty = fetch(
        &client,
        "reader",
        json!({"goal_id": goal.id(), "wait_ms": 300}),
    )
    .await;
    assert!(empty.messages.is_empty());
    assert!(started.elapsed() >= Duration::from_millis(300));

    let mut latencies = Vec::new();
    for n in 0..20 {
        let held = {
            let client = client.clone();
            let goal = goal.id();
            tokio::spawn(async move {
                let reply = fetch(
                    &client,
                    "reader",
                    json!({"goal_id": goal, "wait_ms": 10_000}),
                )
                .await;
                (reply, Instant::now())
            })
        };
        // A real wait: long enough that the fetch is surely held (nothing outside the fan-out
        // shows it): an answer within 1 s (below) can then only come from a wake-up (a held
        // fetch re-reads on its own every 5 s).
        tokio::time::sleep(Duration::from_millis(200)).await;
        let sent = Instant::now();
        let body = format!("wake {n}");
        if n % 2 == 0 {
            writer.send_to_peer("reader", &body).await.unwrap();
        } else {
            // Stored by someone else entirely: the stream's notice wakes the fetch anyway.
            let message = switchboard_proto::InboxMessage::new(
                id("writer"),
                GoalId::new(),
                id("reader"),
                body.clone(),
            );
            async_nats::jetstream::new(client.clone())
                .publish(
                    subject::inbox(&goal.id()),
                    serde_json::to_vec(&message).unwrap().into(),
                )
                .await
                .unwrap()
                .await
                .unwrap();
        }
        let (reply, answered) = held.await.unwrap();
        assert_eq!(bodies(&reply), [body.as_str()]);
        latencies.push(answered.duration_since(sent));
        goal.ack_through(reply.messages[0].seq).await.unwrap();
    }
    latencies.sort();
    let p50 = latencies[latencies.len() / 2];
    println!(
        "held fetch answered after a store: p50 {p50:?}, max {:?}",
        latencies.last().unwrap()
    );
    // The safety re-read is 5 s: every answer here came from a wake-up.
    assert!(
        *latencies.last().unwrap() < Duration::from_secs(1),
        "{latencies:?}"
    );
}

#[tokio::test]
async fn a_head_handed_out_too_often_or_rejected_lands_in_the_dead_letters() {
    let fabric = Fabric::start().await;
    let writer = fabric.agent("writer").await;
    let (_reader, goal) = fabric.agent_with_goal("reader").await;
    let client = fabric.nats.client().await;
    writer.send_to_peer("reader", "poison").await.unwrap();
    writer.send_to_peer("reader", "fine").await.unwrap();
    let mut poison = 0;
    for _ in 0..INBOX_MAX_DELIVER {
        let reply = fetch(&client, "reader", json!({"goal_id": goal.id(), "max": 1})).await;
        assert_eq!(bodies(&reply), ["poison"]);
        poison = reply.messages[0].seq;
    }
    // The eleventh hand-out: the head is dead-lettered and skipped.
    let reply = fetch(&client, "reader", json!({"goal_id": goal.id(), "max": 1})).await;
    assert_eq!(bodies(&reply), ["fine"]);
    assert_eq!(
        reply.cursor, poison,
        "the cursor moved through the dead letter"
    );

    // A reject with a header-breaking reason: one clean letter, the cursor moves through it.
    let seq = reply.messages[0].seq;
    let ack = raw(
        &client,
        &subject::inbox_ack(&id("reader")),
        json!({"goal_id": goal.id(), "seq": seq, "reject": "bad\r\nNats-Msg-Id: forged"})
            .to_string(),
    )
    .await;
    assert_eq!(ack.body["cursor"], seq);
    // Retried: acknowledged again, no second letter.
    raw(
        &client,
        &subject::inbox_ack(&id("reader")),
        json!({"goal_id": goal.id(), "seq": seq, "reject": "again"}).to_string(),
    )
    .await;
    assert!(
        eventually(Duration::from_secs(5), || {
            let client = client.clone();
            async move { dlq_list(&client, 10).await.map(|l| l.len()).unwrap_or(0) == 2 }
        })
        .await
    );
    let letters = dlq_list(&client, 10).await.unwrap();
    assert_eq!(letters.len(), 2, "{letters:?}");
    assert_eq!(letters[0].payload["body"], "poison");
    assert_eq!(letters[0].deliveries, u64::from(INBOX_MAX_DELIVER));
    assert_eq!(letters[1].payload["body"], "fine");
    assert_eq!(
        letters[1].reason,
        "rejected by its reader: badNats-Msg-Id: forged"
    );
    assert!(
        fetch(&client, "reader", json!({"goal_id": goal.id()}))
            .await
            .messages
            .is_empty()
    );
}

#[tokio::test]
async fn a_restart_of_the_inbox_with_held_fetches_loses_nothing() {
    let fabric = Fabric::start().await;
    let writer = fabric.agent("writer").await;
    let (_reader, goal) = fabric.agent_with_goal("reader").await;
    let client = fabric.nats.client().await;
    let url = fabric.url();
    let held: Vec<_> = (0..5)
        .map(|_| {
            let client = client.clone();
            let goal = goal.id();
            tokio::spawn(async move {
                let started = Instant::now();
                let reply = raw(
                    &client,
                    &subject::inbox_fetch(&id("reader")),
                    json!({"goal_id": goal, "wait_ms": 30_000}).to_string(),
                )
                .await;
                (reply.body, started.elapsed())
            })
        })
        .collect();
    // A real wait: the five fetches are held by the fan-out (nothing outside it shows that)
    // before it stops.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let Fabric { fanout, .. } = fabric;
    fanout.stop().await;
    // The stopping replica answered every held fetch (empty) instead of keeping it.
    for fetch in held {
        let (body, took) = fetch.await.unwrap();
        assert_eq!(body["messages"], json!([]), "{body}");
        assert!(
            took < Duration::from_secs(5),
            "answered at shutdown, not at the wait's end"
        );
    }
    let _replacement = start_fanout(&url, Default::default()).await;
    writer
        .send_to_peer("reader", "after the restart")
        .await
        .unwrap();
    let reply = fetch(
        &client,
        "reader",
        json!({"goal_id": goal.id(), "wait_ms": 5_000}),
    )
    .await;
    assert_eq!(bodies(&reply), ["after the restart"]);
}

#[tokio::test]
async fn bad_fetches_and_acks_get_error_replies_and_the_inbox_keeps_serving() {
    let fabric = Fabric::start().await;
    let (_reader, goal) = fabric.agent_with_goal("reader").await;
    let client = fabric.nats.client().await;
    let fetch_subject = subject::inbox_fetch(&id("reader"));
    let ack_subject = subject::inbox_ack(&id("reader"));
    let g = goal.id().to_string();
    let table: Vec<(&str, String)> = vec![
        (
            fetch_subject.as_str(),
            json!({"goal_id": g, "max": 0}).to_string(),
        ),
        (
            fetch_subject.as_str(),
            json!({"goal_id": g, "max": 100_000}).to_string(),
        ),
        (
            fetch_subject.as_str(),
            json!({"goal_id": g, "max": -1}).to_string(),
        ),
        (
            fetch_subject.as_str(),
            json!({"goal_id": g, "wait_ms": -1}).to_string(),
        ),
        (
            fetch_subject.as_str(),
            json!({"goal_id": g, "wait_ms": 30_001}).to_string(),
        ),
        (
            fetch_subject.as_str(),
            json!({"goal_id": g, "wait_ms": i64::MAX}).to_string(),
        ),
        (
            fetch_subject.as_str(),
            json!({"goal_id": g, "ack_through": -5}).to_string(),
        ),
        // Reading past what was never handed out, or a negative position.
        (
            fetch_subject.as_str(),
            json!({"goal_id": g, "after": u64::MAX}).to_string(),
        ),
        (
            fetch_subject.as_str(),
            json!({"goal_id": g, "after": -1}).to_string(),
        ),
        (
            fetch_subject.as_str(),
            json!({"goal_id": "not-a-uuid"}).to_string(),
        ),
        (
            fetch_subject.as_str(),
            json!({"goal_id": g, "surprise": 1}).to_string(),
        ),
        (fetch_subject.as_str(), json!({}).to_string()),
        (fetch_subject.as_str(), "{garbage".to_owned()),
        (fetch_subject.as_str(), "[1,2]".to_owned()),
        (ack_subject.as_str(), json!({"goal_id": g}).to_string()),
        (
            ack_subject.as_str(),
            json!({"goal_id": g, "through": 1, "seq": 1, "reject": "x"}).to_string(),
        ),
        (
            ack_subject.as_str(),
            json!({"goal_id": g, "seq": 1}).to_string(),
        ),
        (
            ack_subject.as_str(),
            json!({"goal_id": g, "through": 18_446_744_073_709_551_615u64}).to_string(),
        ),
        (ack_subject.as_str(), "\u{0}\u{1}".to_owned()),
    ];
    for (subject, body) in &table {
        let (kind, message) = refused(&client, subject, body.clone()).await;
        assert_eq!(kind, "bad_request", "{subject} {body}: {message}");
    }
    // A malformed caller token is refused before the body is read.
    let (kind, _) = refused(
        &client,
        "agent.inbox.fetch.a.b",
        json!({"goal_id": g}).to_string(),
    )
    .await;
    assert_eq!(kind, "invalid_agent_id");
    // Still serving.
    let ok = fetch(&client, "reader", json!({"goal_id": g})).await;
    assert!(ok.messages.is_empty());
}

/// Open `count` goals for distinct agents, 32 requests in flight.
async fn open_goals(client: &Client, agents: &[AgentId]) -> Vec<GoalId> {
    futures::stream::iter(agents.iter().cloned())
        .map(|agent| {
            let client = client.clone();
            async move {
                let reply = raw(&client, &RegistryOp::GoalOpen.subject(&agent), "{}").await;
                let reply: GoalOpenReply = serde_json::from_value(reply.body).unwrap();
                reply.goal_id
            }
        })
        .buffered(32)
        .collect()
        .await
}

/// 3,000 live goals on a nats-server with its default limits (1,000 consumers per stream):
/// every one opens, is written to and read, and `AGENT_INBOX` has no consumer at all.
#[tokio::test]
async fn three_thousand_live_goals_fit_where_a_thousand_consumers_did_not() {
    const GOALS: usize = 3_000;
    let nats = NatsServer::start().await;
    let _dir = start_directory(&nats.url(), DirectoryConfig::default()).await;
    let _inbox = start_fanout(&nats.url(), Default::default()).await;
    let client = nats.client().await;
    let agents: Vec<AgentId> = (0..GOALS).map(|n| id(&format!("a{n}"))).collect();
    futures::stream::iter(agents.iter().cloned())
        .map(|agent| {
            let client = client.clone();
            async move {
                let body = serde_json::to_string(&card(agent.as_str())).unwrap();
                raw(&client, &RegistryOp::Register.subject(&agent), body).await;
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<()>>()
        .await;
    let started = Instant::now();
    let goals = open_goals(&client, &agents).await;
    println!("{GOALS} goals opened in {:?}", started.elapsed());
    assert_eq!(goals.len(), GOALS);

    let js = async_nats::jetstream::new(client.clone());
    let mut inbox = js.get_stream(INBOX_STREAM).await.unwrap();
    assert_eq!(
        inbox.info().await.unwrap().state.consumer_count,
        0,
        "no consumer per goal"
    );
    // The last goals opened are as usable as the first: a message to each of a sample, read
    // by its owner.
    let sender =
        switchboard_tests::agent_with(&nats.url(), card("sender"), Duration::from_secs(3600)).await;
    for n in [0, 999, 1_000, 1_001, GOALS - 1] {
        sender
            .send_to_peer(agents[n].as_str(), &format!("to goal {n}"))
            .await
            .unwrap();
        let reply = fetch(&client, agents[n].as_str(), json!({"goal_id": goals[n]})).await;
        assert_eq!(bodies(&reply), [format!("to goal {n}").as_str()]);
    }
}

/// A goal id is an address others learn (`delivered_to`, `lookup`): once its owner closed it,
/// another agent may claim the id, but never reads what was sent to the old owner — not even a
/// message that landed after the close's purge.
#[tokio::test]
async fn a_goal_id_claimed_after_its_close_hands_out_nothing_of_the_old_owner() {
    let fabric = Fabric::start().await;
    let writer = fabric.agent("writer").await;
    let (_alice, goal) = fabric.agent_with_goal("alice").await;
    let mallory = fabric.agent("mallory").await;
    let client = fabric.nats.client().await;
    let goal_id = goal.id();
    writer.send_to_peer("alice", "for alice").await.unwrap();
    // While alice's goal is live, the id is hers.
    let denied = mallory
        .open_goal_with(switchboard_proto::registry::GoalOpenRequest {
            goal_id: Some(goal_id),
            name: None,
            kind: None,
            overflow: None,
        })
        .await
        .unwrap_err();
    assert_eq!(denied.kind(), Some(switchboard_proto::ErrorKind::Conflict));
    // alice reads (the inbox service now remembers her cursor for a moment), then closes.
    assert_eq!(
        bodies(&fetch(&client, "alice", json!({"goal_id": goal_id})).await),
        ["for alice"]
    );
    goal.close().await.unwrap();
    // A send that was on its way when the goal closed lands after the purge.
    let late =
        switchboard_proto::InboxMessage::new(id("writer"), GoalId::new(), id("alice"), "late");
    async_nats::jetstream::new(client.clone())
        .publish(
            subject::inbox(&goal_id),
            serde_json::to_vec(&late).unwrap().into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    let claimed = mallory
        .open_goal_with(switchboard_proto::registry::GoalOpenRequest {
            goal_id: Some(goal_id),
            name: None,
            kind: None,
            overflow: None,
        })
        .await
        .unwrap();
    let reply = fetch(&client, "mallory", json!({"goal_id": claimed.id()})).await;
    assert!(reply.messages.is_empty(), "{:?}", bodies(&reply));
    assert_eq!(reply.unread, 0);
    // The other way round: what is sent to mallory's goal now is never handed to alice, whose
    // remembered cursor of the same goal id is stale.
    writer.send_to_peer("mallory", "for mallory").await.unwrap();
    for body in [
        json!({"goal_id": goal_id}),
        json!({"goal_id": goal_id, "peek": true}),
    ] {
        let (kind, _) = refused(
            &client,
            &subject::inbox_fetch(&id("alice")),
            body.to_string(),
        )
        .await;
        assert_eq!(kind, "not_found");
    }
    let reply = fetch(&client, "mallory", json!({"goal_id": goal_id})).await;
    assert_eq!(bodies(&reply), ["for mallory"]);
}

/// A reader that handles several messages at once: each is handed out once while it is held
/// (a fetch from the cursor would return them all again), acks in any order leave nothing
/// unread, and those given back come first again, however far past the cursor.
#[tokio::test]
async fn a_reader_holding_many_deliveries_gets_each_once() {
    let fabric = Fabric::start().await;
    let writer = fabric.agent("writer").await;
    let (_reader, goal) = fabric.agent_with_goal("reader").await;
    for n in 0..40 {
        writer
            .send_to_peer("reader", &format!("m{n}"))
            .await
            .unwrap();
    }
    let mut held = Vec::new();
    while let Some(delivery) = goal.recv(Duration::from_millis(300)).await.unwrap() {
        held.push(delivery);
    }
    let bodies: Vec<String> = held.iter().map(|d| d.message.body.clone()).collect();
    let expected: Vec<String> = (0..40).map(|n| format!("m{n}")).collect();
    assert_eq!(bodies, expected, "each once, in order, while all are held");
    // Two are given back (dropped unacknowledged) while the rest are still held — one further
    // past the cursor than a fetch reads at once — and both come back before anything else.
    let far = held.remove(30);
    let near = held.remove(5);
    drop(far);
    drop(near);
    let first = goal.recv(Duration::from_secs(2)).await.unwrap().unwrap();
    assert_eq!(first.message.body, "m5");
    let second = goal.recv(Duration::from_secs(2)).await.unwrap();
    let second = second.expect("m30, given back past what one fetch from the cursor reads");
    assert_eq!(second.message.body, "m30");
    // The rest are acked, newest first, the given-back ones last: nothing is left unread.
    for delivery in held.into_iter().rev() {
        delivery.ack().await.unwrap();
    }
    second.ack().await.unwrap();
    first.ack().await.unwrap();
    assert!(
        goal.recv(Duration::from_millis(300))
            .await
            .unwrap()
            .is_none()
    );
    assert!(goal.drain().await.unwrap().is_empty());
}

/// Issue 25: a reader that fetches up to 64 and acks with `ack_through` on its next fetch, as
/// fast as it can, loses nothing to a 2,000-message burst from 4 senders: what it holds from
/// its last fetch is not the cap's to evict. Every message is also in the audit trail.
#[tokio::test]
async fn a_reader_that_keeps_up_loses_nothing_to_a_burst_of_2000_from_4_senders() {
    const SENDERS: usize = 4;
    const EACH: usize = 500;
    let fabric = Fabric::start().await;
    let (_audit, _trail) =
        switchboard_tests::start_audit(&fabric.url(), switchboard_tests::fast_audit()).await;
    let nats = fabric.nats.client().await;
    let (_reader, goal) = fabric.agent_with_goal("reader").await;
    let mut senders = Vec::new();
    for n in 0..SENDERS {
        senders.push(fabric.agent_with_goal(&format!("sender-{n}")).await);
    }
    let reading = tokio::spawn(async move {
        let mut got = Vec::new();
        let mut evicted = 0;
        let mut ack = None;
        while got.len() < SENDERS * EACH {
            let page = goal.fetch(64, Duration::from_secs(5), ack).await.unwrap();
            evicted += page.expired_unread.map_or(0, |expired| expired.count);
            if page.messages.is_empty() {
                break;
            }
            ack = page.messages.last().map(|m| m.seq);
            got.extend(page.messages.into_iter().map(|m| (m.seq, m.message.body)));
            // A real wait: handling a page takes a moment (an agent's work), so the burst piles
            // up behind what the reader holds.
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        if let Some(through) = ack {
            goal.ack_through(through).await.unwrap();
        }
        (got, evicted)
    });
    let started = Instant::now();
    futures::future::join_all(
        senders
            .iter()
            .enumerate()
            .map(|(n, (agent, _))| async move {
                for i in 0..EACH {
                    let report = agent
                        .send_to_peer("reader", &format!("{n}:{i}"))
                        .await
                        .unwrap();
                    assert_eq!(report.delivered_to.len(), 1, "{report:?}");
                }
            }),
    )
    .await;
    let rate = (SENDERS * EACH) as f64 / started.elapsed().as_secs_f64();
    let (got, evicted) = tokio::time::timeout(Duration::from_secs(60), reading)
        .await
        .expect("the reader got every message")
        .unwrap();
    assert_eq!(evicted, 0, "messages evicted at {rate:.0} messages/s");
    let bodies: std::collections::BTreeSet<&str> =
        got.iter().map(|(_, body)| body.as_str()).collect();
    assert_eq!(got.len(), SENDERS * EACH, "each message handed out once");
    assert_eq!(bodies.len(), SENDERS * EACH, "every message, none twice");
    // No sender was told of a message removed unread.
    for (_, sender_goal) in &senders {
        assert_eq!(sender_goal.waiting().await.unwrap(), 0);
    }
    // Every message the reader got is in the audit trail.
    let want: std::collections::BTreeSet<String> = got
        .iter()
        .map(|(seq, _)| format!("{INBOX_STREAM}:{seq}"))
        .collect();
    switchboard_testkit::assert_eventually!(
        Duration::from_secs(30),
        async {
            let have: std::collections::BTreeSet<String> = switchboard_tests::audit_records(&nats)
                .await
                .into_iter()
                .map(|entry| entry.record.id)
                .collect();
            want.is_subset(&have)
        },
        "every message of the burst is in the audit trail"
    );
}

/// Issue 25: a goal opened with `overflow: refuse` never evicts: once full, a send or a call to
/// it is answered `inbox_full` (429, with the micro error headers) and nothing is stored; once
/// its reader acks, there is room again.
#[tokio::test]
async fn a_goal_that_refuses_overflow_answers_inbox_full_and_stores_nothing() {
    use switchboard_proto::inbox::Overflow;
    use switchboard_proto::registry::GoalOpenRequest;
    let fabric = Fabric::start().await;
    let (sender, _sender_goal) = fabric.agent_with_goal("sender").await;
    let reader = fabric.agent("reader").await;
    let goal = reader
        .open_goal_with(GoalOpenRequest {
            overflow: Some(Overflow::Refuse),
            ..GoalOpenRequest::default()
        })
        .await
        .unwrap();
    let room = switchboard_proto::INBOX_STORED_PER_GOAL.unsigned_abs() as usize;
    for i in 0..room {
        sender
            .send_to_peer("reader", &format!("m{i}"))
            .await
            .unwrap();
    }
    let stored = fabric.stored().await;
    let refused = sender
        .send_to_peer("reader", "one too many")
        .await
        .unwrap_err();
    assert_eq!(
        refused.kind(),
        Some(switchboard_proto::ErrorKind::InboxFull),
        "{refused}"
    );
    let reply = raw(
        &fabric.nats.client().await,
        &subject::send(&id("sender")),
        json!({"to": "reader", "message": "raw, too many"}).to_string(),
    )
    .await;
    assert_eq!(reply.error_kind(), "inbox_full", "{:?}", reply.body);
    assert_eq!(reply.body["error"]["code"], 429);
    let call = sender
        .call("reader", "are you there?", Duration::from_secs(5))
        .await
        .unwrap_err();
    assert_eq!(
        call.kind(),
        Some(switchboard_proto::ErrorKind::InboxFull),
        "{call}"
    );
    assert_eq!(fabric.stored().await, stored, "nothing more was stored");
    // Nothing was evicted: the reader has every one, oldest first.
    let page = goal.fetch(64, Duration::ZERO, None).await.unwrap();
    assert_eq!(page.messages[0].message.body, "m0");
    assert_eq!(page.unread, room as u64);
    assert!(page.expired_unread.is_none());
    goal.ack_through(page.messages.last().unwrap().seq)
        .await
        .unwrap();
    sender.send_to_peer("reader", "now it fits").await.unwrap();
}

/// Issue 25: a waiting caller whose request is removed unread from the callee's full inbox
/// learns it at once (`inbox_full`), not at its deadline. (Since issue 37 a full goal takes
/// room from the sender holding the most of it, so the caller's own messages fill it here:
/// another sender's flood would remove its own oldest, not the call's request.)
#[tokio::test]
async fn a_waiting_call_whose_request_is_evicted_fails_within_a_second() {
    let fabric = Fabric::start().await;
    let (caller, _caller_goal) = fabric.agent_with_goal("caller").await;
    let caller = std::sync::Arc::new(caller);
    let (_callee, callee_goal) = fabric.agent_with_goal("callee").await;
    let calling = std::sync::Arc::clone(&caller);
    let call = tokio::spawn(async move {
        let outcome = calling
            .call("callee", "the oldest message", Duration::from_secs(30))
            .await;
        (outcome, Instant::now())
    });
    assert!(
        eventually(Duration::from_secs(10), || async {
            callee_goal.waiting().await.unwrap() == 1
        })
        .await,
        "the call's request is stored"
    );
    // The callee never reads: the 129th message evicts the caller's oldest, the call's
    // request.
    let room = switchboard_proto::INBOX_STORED_PER_GOAL.unsigned_abs() as usize;
    for i in 0..room {
        caller
            .send_to_peer("callee", &format!("m{i}"))
            .await
            .unwrap();
    }
    let evicted_at = Instant::now();
    let (outcome, failed_at) = tokio::time::timeout(Duration::from_secs(5), call)
        .await
        .expect("the caller is told long before its 30 s deadline")
        .unwrap();
    let err = outcome.unwrap_err();
    assert_eq!(
        err.kind(),
        Some(switchboard_proto::ErrorKind::InboxFull),
        "{err}"
    );
    assert!(err.to_string().contains("full inbox"), "{err}");
    assert!(
        failed_at.saturating_duration_since(evicted_at) < Duration::from_secs(1),
        "told {:?} after the eviction",
        failed_at.saturating_duration_since(evicted_at)
    );
}

/// Issue 25: what a reader holds from its last fetch is not the cap's to evict. A reader holds
/// a full fetch of 64 while 64 more arrive: nothing goes. One more evicts the oldest message
/// *not handed out yet*, and its sender is told.
#[tokio::test]
async fn messages_handed_out_are_not_evicted_the_oldest_waiting_one_is() {
    let fabric = Fabric::start().await;
    let (sender, sender_goal) = fabric.agent_with_goal("sender").await;
    let (_reader, goal) = fabric.agent_with_goal("reader").await;
    let cap = switchboard_proto::INBOX_CAP_PER_GOAL.unsigned_abs() as usize;
    let mut ids = Vec::new();
    for i in 0..2 * cap + 1 {
        if i == cap {
            let held = goal.fetch(64, Duration::ZERO, None).await.unwrap();
            assert_eq!(held.messages.len(), cap);
        }
        let report = sender
            .send_to_peer("reader", &format!("m{i:03}"))
            .await
            .unwrap();
        ids.push(report.message_id.unwrap());
    }
    // What it held is all there (it was not acked: handed out again), and the fetch reports
    // the one evicted: the oldest waiting one, m064, not m000.
    let page = goal.fetch(64, Duration::ZERO, None).await.unwrap();
    assert_eq!(page.messages[0].message.body, "m000");
    let expired = page.expired_unread.expect("one evicted");
    assert_eq!(expired.count, 1);
    assert_eq!(expired.ids, vec![ids[cap]]);
    // Acked with the next fetch, which hands out the rest, m065 on.
    let through = page.messages[cap - 1].seq;
    let next = goal.fetch(64, Duration::ZERO, Some(through)).await.unwrap();
    let bodies: Vec<&str> = next
        .messages
        .iter()
        .map(|m| m.message.body.as_str())
        .collect();
    assert_eq!(bodies.len(), cap);
    assert_eq!(bodies[0], "m065");
    let notices = sender_goal.drain().await.unwrap();
    assert_eq!(notices.len(), 1);
    assert_eq!(notices[0].in_reply_to, Some(ids[cap]));
}

#[tokio::test]
async fn an_ack_on_a_held_fetch_is_kept_however_the_wait_ends() {
    let fabric = Fabric::start().await;
    let (writer, _reader, goal) = sent_to_reader(&fabric, 3).await;
    let client = fabric.nats.client().await;
    let first = fetch(&client, "reader", json!({"goal_id": goal.id(), "max": 1})).await;
    let all = fetch(&client, "reader", json!({"goal_id": goal.id()})).await;
    assert_eq!(bodies(&all), ["m0", "m1", "m2"]);
    let (one, three) = (first.messages[0].seq, all.messages[2].seq);

    // An ack without a wait is written at once.
    let empty = fetch(
        &client,
        "reader",
        json!({"goal_id": goal.id(), "ack_through": one, "max": 1, "wait_ms": 0}),
    )
    .await;
    assert_eq!(empty.cursor, one);
    // Nothing unread after the ack: the wait ends empty, and the ack stands.
    let held = fetch(
        &client,
        "reader",
        json!({"goal_id": goal.id(), "ack_through": three, "wait_ms": 300}),
    )
    .await;
    assert!(held.messages.is_empty());
    assert_eq!(held.cursor, three);
    let peek = fetch(
        &client,
        "reader",
        json!({"goal_id": goal.id(), "peek": true}),
    )
    .await;
    assert_eq!(peek.cursor, three, "the held fetch's ack was not kept");

    // Acked again while held, then a message arrives: one reply hands it out, past the ack.
    let waiting = {
        let client = client.clone();
        let goal = goal.id();
        tokio::spawn(async move {
            fetch(
                &client,
                "reader",
                json!({"goal_id": goal, "ack_through": three, "wait_ms": 10_000}),
            )
            .await
        })
    };
    // A real wait: the fetch is held (nothing outside the fan-out shows that) before m3 comes.
    tokio::time::sleep(Duration::from_millis(200)).await;
    writer.send_to_peer("reader", "m3").await.unwrap();
    let woken = waiting.await.unwrap();
    assert_eq!(bodies(&woken), ["m3"]);
    assert_eq!(woken.cursor, three);
    let after = fetch(
        &client,
        "reader",
        json!({"goal_id": goal.id(), "ack_through": woken.messages[0].seq, "wait_ms": 0}),
    )
    .await;
    assert!(after.messages.is_empty(), "{after:?}");
    assert_eq!(after.cursor, woken.messages[0].seq);
}

/// Issue 25: a held fetch costs no read of the inbox stream while the store notices show
/// nothing new for its goal, and a message stored while it waits is handed out from the
/// notice itself, without reading it back. (Counted on the wire: the direct gets the fan-out
/// sends for this goal's fetches, told apart by their batch size.)
#[tokio::test]
async fn a_held_fetch_reads_the_inbox_only_when_something_may_be_there() {
    const BATCH: u32 = 57;
    let fabric = Fabric::start().await;
    let writer = fabric.agent("writer").await;
    let (_reader, goal) = fabric.agent_with_goal("reader").await;
    writer.send_to_peer("reader", "first").await.unwrap();
    let first = goal.fetch(BATCH, Duration::ZERO, None).await.unwrap();
    let seq = first.messages[0].seq;

    let watcher = fabric.nats.client().await;
    let mut reads = watcher
        .subscribe(format!("$JS.API.DIRECT.GET.{INBOX_STREAM}"))
        .await
        .unwrap();
    watcher.flush().await.unwrap();
    let count = |reads: &mut async_nats::Subscriber| {
        let mut ours = 0;
        while let Some(Some(read)) = reads.next().now_or_never() {
            let request: Value = serde_json::from_slice(&read.payload).unwrap();
            if request["batch"] == BATCH {
                ours += 1;
            }
        }
        ours
    };

    // Nothing new: one read, when the wait ends (none before it).
    let held = goal
        .fetch(BATCH, Duration::from_millis(600), Some(seq))
        .await
        .unwrap();
    assert!(held.messages.is_empty());
    watcher.flush().await.unwrap();
    assert_eq!(
        count(&mut reads),
        1,
        "read before the wait as well as at its end"
    );

    // A message stored while the fetch waits: handed out without any read.
    let waiting = {
        let goal_id = goal.id();
        let client = fabric.nats.client().await;
        tokio::spawn(async move {
            fetch(
                &client,
                "reader",
                json!({"goal_id": goal_id, "max": BATCH, "wait_ms": 10_000}),
            )
            .await
        })
    };
    // A real wait: the fetch is held (nothing outside the fan-out shows that) before the
    // message is stored; the first wait's end read happened before this one started.
    tokio::time::sleep(Duration::from_millis(300)).await;
    watcher.flush().await.unwrap();
    let before = count(&mut reads);
    writer.send_to_peer("reader", "second").await.unwrap();
    let woken = waiting.await.unwrap();
    assert_eq!(bodies(&woken), ["second"]);
    watcher.flush().await.unwrap();
    assert_eq!(
        before + count(&mut reads),
        0,
        "the held fetch read the inbox stream"
    );
}

/// A held fetch's `ack_through` of many messages is written at once, not when the wait ends:
/// a burst into the goal meanwhile can then purge what was read instead of evicting unread
/// messages. (A short ack is written with the hand-out that ends the wait.)
#[tokio::test]
async fn a_held_fetchs_ack_of_many_messages_is_written_at_once() {
    let fabric = Fabric::start().await;
    let (_writer, _reader, goal) = sent_to_reader(&fabric, 20).await;
    let client = fabric.nats.client().await;
    let all = fetch(&client, "reader", json!({"goal_id": goal.id(), "max": 64})).await;
    assert_eq!(all.messages.len(), 20);
    let last = all.messages[19].seq;
    let held = {
        let client = client.clone();
        let goal = goal.id();
        tokio::spawn(async move {
            fetch(
                &client,
                "reader",
                json!({"goal_id": goal, "ack_through": last, "wait_ms": 3_000}),
            )
            .await
        })
    };
    let written = eventually(Duration::from_secs(2), || async {
        fetch(
            &client,
            "reader",
            json!({"goal_id": goal.id(), "peek": true}),
        )
        .await
        .cursor
            == last
    })
    .await;
    assert!(written, "the ack of 20 waited for the held fetch to end");
    assert!(!held.is_finished(), "the fetch is still held");
    assert!(held.await.unwrap().messages.is_empty());
}

#[tokio::test]
async fn publishers_racing_into_a_full_goal_remove_exactly_one_message_each() {
    // The goal holds what it may (128): 32 read but not yet taken by a consumer that is behind
    // (the audit, under load), 64 handed out to the reader, 32 waiting unread. Then 64
    // publishers store at once: exactly 64 must go — the 32 read ones, then the 32 waiting
    // ones (their loss reported) — and every new one must stay. Before, each publisher that
    // found the goal full removed a message even when another had just made room: under load
    // (the bench's backlog row with a busy loop beside it, 4 runs of 4) 18 to 29 of 64 new
    // messages went unread.
    let fabric = Fabric::start().await;
    let (_reader, goal) = fabric.agent_with_goal("reader").await;
    let js = async_nats::jetstream::new(fabric.nats.client().await);
    js.get_stream(INBOX_STREAM)
        .await
        .unwrap()
        .create_consumer(async_nats::jetstream::consumer::pull::Config {
            durable_name: Some("behind".into()),
            filter_subject: goal.subject().to_owned(),
            ack_policy: async_nats::jetstream::consumer::AckPolicy::All,
            ..Default::default()
        })
        .await
        .unwrap();
    let first = switchboard_tests::store_at_once(&js, &goal, 64).await;
    let read = goal.fetch(32, Duration::ZERO, None).await.unwrap();
    assert_eq!(read.messages.len(), 32);
    let second = switchboard_tests::store_at_once(&js, &goal, 64).await;
    let held = goal
        .fetch(64, Duration::ZERO, read.messages.last().map(|m| m.seq))
        .await
        .unwrap();
    assert_eq!(held.messages.len(), 64);
    let waiting: std::collections::BTreeSet<uuid::Uuid> = second[32..].iter().copied().collect();
    assert_eq!(first.len() + second.len(), 128);

    let new = switchboard_tests::store_at_once(&js, &goal, 64).await;

    // Acked through what it holds: the next fetch hands out every new message, and reports
    // exactly the 32 that waited as removed unread.
    let next = goal
        .fetch(64, Duration::ZERO, held.messages.last().map(|m| m.seq))
        .await
        .unwrap();
    let got: std::collections::BTreeSet<uuid::Uuid> =
        next.messages.iter().filter_map(|m| m.message.id).collect();
    assert_eq!(got, new.into_iter().collect(), "every new message stays");
    let expired = next.expired_unread.expect("the waiting ones were removed");
    assert_eq!(expired.count, 32, "exactly the 32 waiting ones went");
    assert!(
        expired.ids.iter().all(|id| waiting.contains(id)),
        "{:?}",
        expired.ids
    );
}

/// Issue 38: an agent that restarts resumes its goal by name. The worker opens its goal
/// `main`, then dies without closing it (as a crash would); alice sends three messages while
/// it is down; the worker, connected again, opens `main` again: the same goal, with the three
/// waiting, and `lookup` shows one live goal, not two. Ids of the named form are opened by
/// name only — mallory cannot open the worker's named goal by its id first — and bad names
/// are refused.
#[tokio::test]
async fn a_restarted_agent_resumes_its_named_goal_and_reads_what_came_meanwhile() {
    use switchboard_proto::registry::GoalOpenRequest;
    let fabric = Fabric::start().await;
    let (alice, _alice_goal) = fabric.agent_with_goal("alice").await;
    let worker = fabric.agent("worker").await;
    let first = worker.open_named_goal("main").await.unwrap();
    let goal_id = first.id();
    assert_eq!(goal_id, GoalId::named(worker.id(), "main"));
    drop(first);
    drop(worker);

    for n in 0..3 {
        alice
            .send_to_peer("worker", &format!("while down {n}"))
            .await
            .unwrap();
    }
    let worker = fabric.agent("worker").await;
    let resumed = worker.open_named_goal("main").await.unwrap();
    assert_eq!(resumed.id(), goal_id, "the same goal");
    let taken: Vec<String> = resumed
        .drain()
        .await
        .unwrap()
        .into_iter()
        .map(|message| message.body)
        .collect();
    assert_eq!(taken, ["while down 0", "while down 1", "while down 2"]);
    let live = worker.lookup("worker").await.unwrap().live_goals;
    assert_eq!(live.len(), 1, "one live goal after the restart: {live:?}");

    let mallory = fabric.agent("mallory").await;
    let squat = GoalId::named(&AgentId::parse("bob").unwrap(), "main");
    let refused = mallory
        .open_goal_with(GoalOpenRequest {
            goal_id: Some(squat),
            name: None,
            ..GoalOpenRequest::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        refused.kind(),
        Some(switchboard_proto::ErrorKind::BadRequest)
    );
    for bad in ["", "Main", "a b", "x/y", &"n".repeat(65)] {
        let refused = mallory.open_named_goal(bad).await.unwrap_err();
        assert_eq!(
            refused.kind(),
            Some(switchboard_proto::ErrorKind::BadRequest),
            "name {bad:?}"
        );
    }
    let both = mallory
        .open_goal_with(GoalOpenRequest {
            goal_id: Some(GoalId::new()),
            name: Some("main".to_owned()),
            ..GoalOpenRequest::default()
        })
        .await
        .unwrap_err();
    assert_eq!(both.kind(), Some(switchboard_proto::ErrorKind::BadRequest));
    // mallory's own `main` is hers, another goal than the worker's.
    let hers = mallory.open_named_goal("main").await.unwrap();
    assert_ne!(hers.id(), goal_id);
}

/// A held fetch outlives its goal: the owner closes the goal while the fetch (or a peek) waits,
/// and another agent opens a goal of the same id. What is then sent to the new owner is not
/// the old owner's to read: its held fetch, woken by the store, ends `not_found` (or with
/// nothing), never with the new owner's message.
#[tokio::test]
async fn a_held_fetch_outliving_its_goal_never_hands_out_the_next_owners_mail() {
    let fabric = Fabric::start().await;
    let writer = fabric.agent("writer").await;
    let (old_owner, goal) = fabric.agent_with_goal("old-owner").await;
    let new_owner = fabric.agent("new-owner").await;
    let client = fabric.nats.client().await;
    let goal_id = goal.id();
    let hold = |peek: bool| {
        let client = client.clone();
        tokio::spawn(async move {
            raw(
                &client,
                &subject::inbox_fetch(&id("old-owner")),
                json!({"goal_id": goal_id, "wait_ms": 5_000, "peek": peek}).to_string(),
            )
            .await
        })
    };
    // A fetch and a peek (which writes nothing, so no compare-and-set stops it).
    let held = [hold(false), hold(true)];
    // A real wait: the fetch is held before the goal changes hands.
    tokio::time::sleep(Duration::from_millis(300)).await;
    old_owner.close_goal(goal_id).await.unwrap();
    let reopened = new_owner
        .open_goal_with(switchboard_proto::registry::GoalOpenRequest {
            goal_id: Some(goal_id),
            ..Default::default()
        })
        .await;
    let Ok(reopened) = reopened else {
        // Refusing the id outright protects the mail too.
        return;
    };
    writer
        .send_to_peer("new-owner", "for the new owner only")
        .await
        .unwrap();
    for held in held {
        let reply = held.await.unwrap();
        let leaked = reply
            .body
            .get("messages")
            .and_then(Value::as_array)
            .is_some_and(|messages| {
                messages
                    .iter()
                    .any(|m| m.to_string().contains("for the new owner only"))
            });
        assert!(
            !leaked,
            "the old owner's held fetch handed out: {}",
            reply.body
        );
    }
    // The new owner reads it.
    let page = reopened
        .fetch(10, Duration::from_secs(2), None)
        .await
        .unwrap();
    assert_eq!(page.messages.len(), 1);
}

/// A held fetch that comes just after a store gets the message at once (the fan-out keeps the
/// message of each goal's newest notice for a second, `wake.rs`), without mixing goals: a goal
/// closed and opened again by name within that second (its inbox purged with the close) is not
/// handed the message stored before the close, and another agent's goal is not handed it.
#[tokio::test]
async fn a_fetch_just_after_a_store_gets_it_but_never_one_purged_by_a_close() {
    let fabric = Fabric::start().await;
    let writer = fabric.agent("writer").await;
    let reader = fabric.agent("reader").await;
    let client = fabric.nats.client().await;

    // Read once, so the goal's cursor has moved; then a message, then a held fetch after it.
    let goal = reader.open_named_goal("desk").await.unwrap();
    writer.send_to_peer("reader", "first").await.unwrap();
    let page = goal.fetch(8, Duration::from_secs(2), None).await.unwrap();
    assert_eq!(bodies(&page), ["first"]);
    let first = page.messages[0].seq;
    writer.send_to_peer("reader", "second").await.unwrap();
    // Its notice has reached the fan-out before the fetch comes: the fetch hands out what the
    // notice carried, with no read of the inbox stream (a direct get) at all.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut reads = client
        .subscribe(subject::js_direct_get(INBOX_STREAM))
        .await
        .unwrap();
    client.flush().await.unwrap();
    let started = Instant::now();
    let page = goal
        .fetch(8, Duration::from_secs(2), Some(first))
        .await
        .unwrap();
    assert_eq!(bodies(&page), ["second"]);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    client.flush().await.unwrap();
    assert!(
        reads.next().now_or_never().is_none(),
        "the fetch read the stream back"
    );
    drop(reads);

    // A goal's first message, then the goal closed (purged) and opened again by name at once:
    // the same id, a fresh cursor. The held fetch waits out its time: the message went with
    // the close.
    goal.close().await.unwrap();
    let goal = reader.open_named_goal("fresh").await.unwrap();
    writer
        .send_to_peer("reader", "before the close")
        .await
        .unwrap();
    let id = goal.id();
    goal.close().await.unwrap();
    let again = reader.open_named_goal("fresh").await.unwrap();
    assert_eq!(again.id(), id);
    let page = fetch(
        &client,
        "reader",
        json!({"goal_id": again.id(), "wait_ms": 400}),
    )
    .await;
    assert!(page.messages.is_empty(), "{:?}", bodies(&page));

    // And mail sent after the reopen comes as always.
    writer.send_to_peer("reader", "after").await.unwrap();
    let page = again.fetch(8, Duration::from_secs(2), None).await.unwrap();
    assert_eq!(bodies(&page), ["after"]);
}
