//! inbox-fanout end to end against a real nats-server: the seed's gates and edge cases,
//! per-goal fan-out, broadcast, anti-loop, ACL, dedup, a failing goal, races and a restart.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

// Longer than 600 lines because it holds one scenario per test of sending; every integration file
// is its own test binary (a link of all five services), so a topic gets one file however many
// tests it has.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use serde_json::json;
use switchboard_client::Goal;
use switchboard_proto::send::SendRequest;
use switchboard_proto::{
    AgentId, ErrorKind, GoalId, INBOX_STREAM, InboxMessage, MAX_BODY_BYTES, MessageKind, Part,
    subject,
};
use switchboard_runtime::publish::{PublishFailure, Published};
use switchboard_tests::{Fabric, Service, agent_with, card, raw, runtime, start_fanout};

fn send(to: &str, message: &str) -> SendRequest {
    SendRequest {
        to: Some(to.to_owned()),
        message: Some(message.to_owned()),
        ..SendRequest::default()
    }
}

async fn drain_bodies(goal: &Goal) -> Vec<String> {
    goal.drain()
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.body)
        .collect()
}

#[tokio::test]
async fn every_live_goal_gets_exactly_one_copy_with_the_fields_passed_through() {
    let fabric = Fabric::start().await;
    let writer = fabric.agent("writer").await;
    let researcher = fabric.agent("researcher").await;
    let goals = [
        researcher.open_goal().await.unwrap(),
        researcher.open_goal().await.unwrap(),
        researcher.open_goal().await.unwrap(),
    ];
    let writer_goal = writer.open_goal().await.unwrap();

    let correlation = uuid::Uuid::now_v7();
    let in_reply_to = uuid::Uuid::now_v7();
    let report = writer
        .send(SendRequest {
            correlation_id: Some(correlation),
            from_goal_id: Some(writer_goal.id()),
            kind: Some(MessageKind::Request),
            in_reply_to: Some(in_reply_to),
            expects_reply: true,
            parts: vec![Part::Data {
                data: json!({"rows": 3}),
            }],
            callback: Some(
                json!({"session_id": "feishu:user_123"})
                    .as_object()
                    .unwrap()
                    .clone(),
            ),
            metadata: json!({"priority": "high"}).as_object().unwrap().clone(),
            ..send("researcher", "task #1 ready for handoff")
        })
        .await
        .unwrap();
    let want: BTreeSet<GoalId> = goals.iter().map(Goal::id).collect();
    assert_eq!(
        report.delivered_to.iter().copied().collect::<BTreeSet<_>>(),
        want
    );
    assert!(report.unreachable_reasons.is_empty());
    let message_id = report.message_id.unwrap();

    for goal in &goals {
        let got = goal.drain().await.unwrap();
        assert_eq!(got.len(), 1, "exactly one copy per goal");
        let m = &got[0];
        assert_eq!(m.id, Some(message_id));
        assert_eq!(m.from_agent_id, "writer");
        assert_eq!(m.from_goal_id, writer_goal.id());
        assert_eq!(m.to_agent_id, "researcher");
        assert_eq!(m.body, "task #1 ready for handoff");
        assert_eq!(m.correlation_id, Some(correlation));
        assert_eq!(m.kind, MessageKind::Request);
        assert_eq!(m.in_reply_to, Some(in_reply_to));
        assert!(m.expects_reply);
        assert_eq!(m.parts.len(), 1);
        assert_eq!(
            m.callback.as_ref().unwrap()["session_id"],
            "feishu:user_123"
        );
        assert_eq!(m.metadata["priority"], "high");
        assert_eq!(m.ttl, Some(2));
        assert_eq!(m.trace, vec![AgentId::parse("writer").unwrap()]);
    }

    // A plain send: no correlation_id on the wire, and a fresh from_goal_id.
    writer.send_to_peer("researcher", "plain").await.unwrap();
    let js = async_nats::jetstream::new(fabric.nats.client().await);
    let stream = js.get_stream(INBOX_STREAM).await.unwrap();
    let stored = stream
        .get_last_raw_message_by_subject(&subject::inbox(&goals[0].id()))
        .await
        .unwrap();
    let wire: serde_json::Value = serde_json::from_slice(&stored.payload).unwrap();
    assert!(wire.get("correlation_id").is_none(), "{wire}");
    assert!(
        wire.get("kind").is_none(),
        "kind `message` is omitted: {wire}"
    );
    // The client attributes a send to the agent's current goal...
    assert_eq!(wire["from_goal_id"], json!(writer_goal.id().to_string()));
    let msg_id = stored
        .headers
        .get(switchboard_proto::HEADER_MSG_ID)
        .unwrap()
        .as_str()
        .to_owned();
    assert_eq!(
        msg_id,
        format!("writer:{}:{}", wire["id"].as_str().unwrap(), goals[0].id())
    );
}

#[tokio::test]
async fn the_seed_gates_and_edge_cases() {
    let fabric = Fabric::start().await;
    let writer = fabric.agent("writer").await;
    let (_researcher, goal) = fabric.agent_with_goal("researcher").await;
    let _idle = fabric.agent("idle").await; // registered, no goal
    let before = fabric.stored().await;

    let kind = |r: Result<_, switchboard_client::ClientError>| r.unwrap_err().kind().unwrap();
    // 1. `to` present and non-empty after trim.
    assert_eq!(
        kind(
            writer
                .send(SendRequest {
                    message: Some("x".into()),
                    ..Default::default()
                })
                .await
        ),
        ErrorKind::MissingTo
    );
    assert_eq!(
        kind(writer.send_to_peer("  ", "x").await),
        ErrorKind::MissingTo
    );
    // 2. not the caller.
    let err = writer.send_to_peer("writer", "hello me").await.unwrap_err();
    assert_eq!(err.kind(), Some(ErrorKind::SelfSend));
    assert!(err.to_string().contains("cannot send to itself"), "{err}");
    // 3. message non-empty.
    assert_eq!(
        kind(
            writer
                .send(SendRequest {
                    to: Some("researcher".into()),
                    ..Default::default()
                })
                .await
        ),
        ErrorKind::EmptyMessage
    );
    assert_eq!(
        kind(writer.send_to_peer("researcher", "").await),
        ErrorKind::EmptyMessage
    );
    // 4. body ≤ 64 KiB: 65,536 bytes accepted, 65,537 refused naming the limit.
    let at_limit = "a".repeat(MAX_BODY_BYTES);
    let report = writer.send_to_peer("researcher", &at_limit).await.unwrap();
    assert_eq!(report.delivered_to, vec![goal.id()]);
    let err = writer
        .send_to_peer("researcher", &"a".repeat(MAX_BODY_BYTES + 1))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), Some(ErrorKind::BodyTooLarge));
    assert!(err.to_string().contains("65536"), "{err}");
    assert_eq!(drain_bodies(&goal).await, vec![at_limit]);
    let after_limit = fabric.stored().await;
    assert_eq!(after_limit, before + 1);

    // 5. unknown agent: a reason, answered before any publish.
    let report = writer.send_to_peer("ghost", "anyone?").await.unwrap();
    assert_eq!(report.unreachable_reasons, vec!["unknown agent_id `ghost`"]);
    assert!(report.delivered_to.is_empty());
    assert!(report.message_id.is_none(), "nothing attempted");
    let report = writer.send_to_peer("Not.An.Id", "x").await.unwrap();
    assert_eq!(
        report.unreachable_reasons,
        vec!["unknown agent_id `Not.An.Id`"]
    );
    // 6. no live goals.
    let report = writer.send_to_peer("idle", "wake up").await.unwrap();
    assert_eq!(report.unreachable_reasons, vec!["no live goals for `idle`"]);
    assert_eq!(
        fabric.stored().await,
        after_limit,
        "no publish for refused sends"
    );

    // An unregistered sender cannot send (its card carries the ACL).
    let client = fabric.nats.client().await;
    let reply = raw(
        &client,
        "agent.send.stranger",
        r#"{"to":"researcher","message":"hi"}"#,
    )
    .await;
    assert_eq!(reply.error_kind(), "not_registered");
    // Garbage and malformed subjects get typed errors.
    for (subject, payload, want) in [
        ("agent.send.writer", "{not json", "bad_request"),
        (
            "agent.send.writer",
            r#"{"to": 5, "message": "x"}"#,
            "bad_request",
        ),
        (
            "agent.send.writer",
            r#"{"to": "researcher", "mesage": "typo"}"#,
            "bad_request",
        ),
        (
            "agent.send.writer",
            r#"{"to": "researcher", "message": "x", "from_goal_id": "nope"}"#,
            "bad_request",
        ),
        (
            "agent.send.writer",
            r#"{"to": "researcher", "message": "x", "trace": ["a.b"]}"#,
            "bad_request",
        ),
        (
            "agent.send.writer",
            r#"{"to": "researcher", "message": "x", "ttl": 300}"#,
            "bad_request",
        ),
        (
            "agent.send.a.b",
            r#"{"to": "researcher", "message": "x"}"#,
            "invalid_agent_id",
        ),
        (
            "agent.send.Writer",
            r#"{"to": "researcher", "message": "x"}"#,
            "invalid_agent_id",
        ),
    ] {
        assert_eq!(
            raw(&client, subject, payload).await.error_kind(),
            want,
            "{subject} {payload}"
        );
    }
    // Garbage with no reply subject is dropped; the service keeps serving.
    client
        .publish("agent.send.writer", "{garbage".into())
        .await
        .unwrap();
    client
        .publish(
            "agent.send.writer",
            r#"{"to":"ghost","message":"x"}"#.into(),
        )
        .await
        .unwrap();
    assert_eq!(
        writer
            .send_to_peer("researcher", "still here")
            .await
            .unwrap()
            .delivered_to,
        vec![goal.id()]
    );
    assert_eq!(drain_bodies(&goal).await, vec!["still here"]);
}

#[tokio::test]
async fn one_past_a_full_goal_leaves_exactly_the_newest_in_order() {
    let fabric = Fabric::start().await;
    let writer = fabric.agent("writer").await;
    let (_reader, goal) = fabric.agent_with_goal("reader").await;
    let room = switchboard_proto::INBOX_STORED_PER_GOAL.unsigned_abs() as usize;
    for i in 0..=room {
        let report = writer
            .send_to_peer("reader", &format!("m{i:03}"))
            .await
            .unwrap();
        assert_eq!(report.delivered_to, vec![goal.id()]);
    }
    let want: Vec<String> = (1..=room).map(|i| format!("m{i:03}")).collect();
    assert_eq!(drain_bodies(&goal).await, want);
}

#[tokio::test]
async fn six_past_a_full_unread_goal_tell_six_senders_and_the_reader() {
    let fabric = Fabric::start().await;
    let (first, first_goal) = fabric.agent_with_goal("first").await;
    let (second, second_goal) = fabric.agent_with_goal("second").await;
    let (_reader, goal) = fabric.agent_with_goal("reader").await;
    // Nothing read: 128 (the goal's room) + 6 unread arrive, alternately from the two senders:
    // the 6 oldest are removed, 3 of each.
    let stored = switchboard_proto::INBOX_STORED_PER_GOAL.unsigned_abs() as usize;
    let mut ids = Vec::new();
    for i in 0..stored + 6 {
        let sender = if i % 2 == 0 { &first } else { &second };
        let report = sender
            .send_to_peer("reader", &format!("m{i:03}"))
            .await
            .unwrap();
        assert_eq!(
            report.delivered_to,
            vec![goal.id()],
            "message {i} is stored"
        );
        ids.push(report.message_id.unwrap());
    }
    // Each sender gets a notice per removed message, in reply to it, in the goal it sent from.
    for (sender_goal, removed) in [
        (&first_goal, vec![ids[0], ids[2], ids[4]]),
        (&second_goal, vec![ids[1], ids[3], ids[5]]),
    ] {
        let notices: Vec<InboxMessage> = sender_goal
            .drain()
            .await
            .unwrap()
            .into_iter()
            .filter(|m| m.kind == MessageKind::Notify)
            .collect();
        let answered: Vec<_> = notices.iter().filter_map(|m| m.in_reply_to).collect();
        assert_eq!(answered, removed);
        for notice in &notices {
            assert_eq!(notice.metadata["reason"], "expired_unread");
            assert_eq!(notice.metadata["goal_id"], json!(goal.id().to_string()));
            assert_eq!(notice.from_agent_id.as_str(), "reader");
        }
    }
    // The reader learns it with its next fetch (once), and keeps the newest 128.
    let fetched = goal.fetch(64, Duration::ZERO, None).await.unwrap();
    let expired = fetched
        .expired_unread
        .expect("the fetch reports what was removed");
    assert_eq!(expired.count, 6);
    assert_eq!(expired.ids, ids[..6].to_vec());
    assert_eq!(fetched.messages.len(), 64);
    assert_eq!(fetched.unread, stored as u64);
    assert_eq!(fetched.messages[0].message.body, "m006");
    let again = goal.fetch(64, Duration::ZERO, None).await.unwrap();
    assert_eq!(again.expired_unread, None, "reported once");
    // A read message makes room silently: no notice, nothing reported.
    let last = again.messages.last().unwrap().seq;
    goal.fetch(1, Duration::ZERO, Some(last)).await.unwrap();
    first.send_to_peer("reader", "one more").await.unwrap();
    assert!(
        first_goal.drain().await.unwrap().is_empty(),
        "no notice for a message that was read"
    );
    assert_eq!(
        goal.fetch(64, Duration::ZERO, None)
            .await
            .unwrap()
            .expired_unread,
        None
    );
}

/// Delegates to JetStream, except that publishes to one goal fail.
struct FailOneGoal {
    inner: inbox_fanout::JetStreamPublisher,
    failing: String,
}

impl inbox_fanout::InboxPublisher for FailOneGoal {
    fn publish_all<'a>(
        &'a self,
        messages: &'a [(String, String, Bytes)],
    ) -> BoxFuture<'a, Vec<Result<Published, PublishFailure>>> {
        Box::pin(async move {
            let mut results = self.inner.publish_all(messages).await;
            for ((subject, _, _), result) in messages.iter().zip(results.iter_mut()) {
                if *subject == self.failing {
                    *result = Err(PublishFailure {
                        subject: subject.clone(),
                        attempts: 3,
                        last: "injected failure".into(),
                        full: false,
                    });
                }
            }
            results
        })
    }
}

#[tokio::test]
async fn a_failing_goal_is_a_reason_while_the_others_deliver() {
    let fabric = Fabric::start().await;
    let peer = fabric.agent("peer").await;
    let good = [
        peer.open_goal().await.unwrap(),
        peer.open_goal().await.unwrap(),
    ];
    let bad = peer.open_goal().await.unwrap();
    // A second fan-out whose publisher fails for `bad`; stop the normal one.
    let url = fabric.url();
    let js = async_nats::jetstream::new(async_nats::connect(&url).await.unwrap());
    let faulty = Service::FanoutWith(
        inbox_fanout::FanoutConfig::default(),
        Arc::new(FailOneGoal {
            inner: inbox_fanout::JetStreamPublisher(js),
            failing: subject::inbox(&bad.id()),
        }),
    )
    .start(&runtime(&url))
    .await;
    let Fabric { fanout, .. } = &fabric;
    fanout.shutdown.cancel();
    let sender = fabric.agent("sender").await;
    // Wait until only the faulty replica answers.
    switchboard_testkit::assert_eventually!(Duration::from_secs(10), async {
        sender
            .send_to_peer("peer", "probe")
            .await
            .is_ok_and(|r| r.unreachable_reasons.len() == 1)
    });
    let report = sender.send_to_peer("peer", "important").await.unwrap();
    let delivered: BTreeSet<GoalId> = report.delivered_to.iter().copied().collect();
    assert_eq!(delivered, good.iter().map(Goal::id).collect());
    assert_eq!(report.unreachable_reasons.len(), 1);
    assert!(
        report.unreachable_reasons[0].contains(&bad.id().to_string())
            && report.unreachable_reasons[0].contains("injected failure"),
        "{:?}",
        report.unreachable_reasons
    );
    faulty.stop().await;
}

#[tokio::test]
async fn a_peer_that_leaves_between_list_peers_and_send_is_a_reason() {
    let fabric = Fabric::start().await;
    let caller = fabric.agent("caller").await;
    let (peer, goal) = fabric.agent_with_goal("fleeting").await;
    let listed = caller.peers().await.unwrap();
    assert!(
        listed
            .peers
            .iter()
            .any(|p| p.agent_id == "fleeting" && p.reachable)
    );
    // It closes its goal, then deregisters, between our list_peers and our send. Every send
    // is answered with a report (never an error or a panic); the view learns of the close
    // through its KV watch, so the reason appears within a bounded time.
    goal.close().await.unwrap();
    let no_goals = vec!["no live goals for `fleeting`".to_owned()];
    switchboard_testkit::assert_eventually!(Duration::from_secs(5), async {
        caller
            .send_to_peer("fleeting", "are you there?")
            .await
            .unwrap()
            .unreachable_reasons
            == no_goals
    });
    peer.deregister().await.unwrap();
    let report = caller.send_to_peer("fleeting", "hello?").await.unwrap();
    assert_eq!(report.unreachable_reasons, no_goals);
    assert!(report.delivered_to.is_empty());
}

#[tokio::test]
async fn a_brand_new_goal_is_visible_to_the_next_send() {
    let fabric = Fabric::start().await;
    let sender = fabric.agent("sender").await;
    for i in 0..20 {
        let newcomer = fabric.agent(&format!("newcomer-{i}")).await;
        let goal = newcomer.open_goal().await.unwrap();
        let report = sender
            .send_to_peer(newcomer.id().as_str(), "welcome")
            .await
            .unwrap();
        assert_eq!(report.delivered_to, vec![goal.id()], "round {i}");
    }
}

#[tokio::test]
async fn broadcast_reaches_every_reachable_peer_and_respects_the_cap() {
    let fabric = Fabric::start_with(inbox_fanout::FanoutConfig {
        broadcast_cap: 3,
        ..Default::default()
    })
    .await;
    let url = fabric.url();
    let (herald, _herald_goal) = fabric.agent_with_goal("herald").await;
    let mut goals = Vec::new();
    for name in ["a1", "a2", "a3"] {
        let agent = fabric.agent(name).await;
        goals.push((agent.open_goal().await.unwrap(), agent));
    }
    let mut closed = card("closed");
    closed.allow_from = vec!["nobody".into()];
    let closed = agent_with(&url, closed, Duration::from_secs(3600)).await;
    let _closed_goal = closed.open_goal().await.unwrap();
    let _goalless = fabric.agent("goalless").await;

    let report = herald.broadcast("hear ye").await.unwrap();
    assert_eq!(report.delivered_to.len(), 3, "{report:?}");
    assert!(report.unreachable_reasons.is_empty(), "{report:?}");
    for (goal, _) in &goals {
        assert_eq!(drain_bodies(goal).await, vec!["hear ye"]);
    }
    assert!(
        _herald_goal.drain().await.unwrap().is_empty(),
        "sender excluded"
    );
    assert!(
        _closed_goal.drain().await.unwrap().is_empty(),
        "ACL-denied peer excluded"
    );

    // One more reachable peer: over the cap, refused, nothing sent.
    let (_a4, a4_goal) = fabric.agent_with_goal("a4").await;
    let before = fabric.stored().await;
    let err = herald.broadcast("too many").await.unwrap_err();
    assert_eq!(err.kind(), Some(ErrorKind::BroadcastTooLarge));
    assert!(err.to_string().contains("cap is 3"), "{err}");
    assert_eq!(fabric.stored().await, before);
    assert!(a4_goal.drain().await.unwrap().is_empty());
}

#[tokio::test]
async fn ttl_and_trace_refusals_name_the_rule() {
    let fabric = Fabric::start().await;
    let a = fabric.agent("a").await;
    let b = fabric.agent("b").await;
    let c = fabric.agent("c").await;
    let b_goal = b.open_goal().await.unwrap();
    let c_goal = c.open_goal().await.unwrap();
    let _a_goal = a.open_goal().await.unwrap();

    // A → B with one hop left: B receives ttl 0 and trace [a].
    a.send(SendRequest {
        ttl: Some(1),
        ..send("b", "forward this")
    })
    .await
    .unwrap();
    let got = b_goal.drain().await.unwrap();
    assert_eq!(got[0].ttl, Some(0));
    // B forwards it to C, passing ttl and trace along: refused, ttl exhausted.
    let report = b
        .send(SendRequest {
            ttl: got[0].ttl,
            trace: got[0].trace.clone(),
            ..send("c", "fwd")
        })
        .await
        .unwrap();
    assert_eq!(report.unreachable_reasons.len(), 1);
    assert!(
        report.unreachable_reasons[0].starts_with("ttl exhausted"),
        "{report:?}"
    );
    // B forwards back to A with budget left: refused, A is in the trace.
    let report = b
        .send(SendRequest {
            ttl: Some(2),
            trace: got[0].trace.clone(),
            ..send("a", "back")
        })
        .await
        .unwrap();
    assert_eq!(
        report.unreachable_reasons,
        vec!["loop: `a` is already in this message's trace"]
    );
    // A full chain A → B → C is fine and C sees the whole path.
    a.send_to_peer("b", "start").await.unwrap();
    let first = b_goal.drain().await.unwrap().remove(0);
    let report = b
        .send(SendRequest {
            ttl: first.ttl,
            trace: first.trace.clone(),
            ..send("c", "relay")
        })
        .await
        .unwrap();
    assert_eq!(report.delivered_to, vec![c_goal.id()], "{report:?}");
    let relayed = c_goal.drain().await.unwrap().remove(0);
    assert_eq!(relayed.ttl, Some(1));
    assert_eq!(
        relayed.trace,
        vec![AgentId::parse("a").unwrap(), AgentId::parse("b").unwrap()]
    );
}

#[tokio::test]
async fn acl_refusals_are_reasons_never_deliveries() {
    let fabric = Fabric::start().await;
    let url = fabric.url();
    let mut picky = card("picky");
    picky.allow_from = vec!["friend-*".into()];
    let picky = agent_with(&url, picky, Duration::from_secs(3600)).await;
    let picky_goal = picky.open_goal().await.unwrap();
    let mut shy = card("shy");
    shy.can_talk_to = vec!["*".into()];
    shy.deny_talk_to = vec!["pick*".into()];
    let shy = agent_with(&url, shy, Duration::from_secs(3600)).await;
    let stranger = fabric.agent("stranger").await;
    let friend = fabric.agent("friend-1").await;

    let report = stranger.send_to_peer("picky", "hi").await.unwrap();
    assert_eq!(
        report.unreachable_reasons,
        vec!["`picky` does not accept messages from `stranger`"]
    );
    let report = shy.send_to_peer("picky", "hi").await.unwrap();
    assert_eq!(
        report.unreachable_reasons,
        vec!["`shy` may not talk to `picky` (deny_talk_to `pick*`)"]
    );
    let report = friend.send_to_peer("picky", "hi").await.unwrap();
    assert_eq!(report.delivered_to, vec![picky_goal.id()]);
    assert_eq!(
        drain_bodies(&picky_goal).await,
        vec!["hi"],
        "only the allowed one arrived"
    );
}

#[tokio::test]
async fn a_retried_send_is_stored_once() {
    let fabric = Fabric::start().await;
    let writer = fabric.agent("writer").await;
    let reader = fabric.agent("reader").await;
    let goals = [
        reader.open_goal().await.unwrap(),
        reader.open_goal().await.unwrap(),
    ];
    let id = uuid::Uuid::now_v7();
    let request = SendRequest {
        id: Some(id),
        ..send("reader", "exactly once")
    };
    let first = writer.send(request.clone()).await.unwrap();
    let second = writer.send(request).await.unwrap();
    assert_eq!(first.message_id, Some(id));
    assert_eq!(second.message_id, Some(id));
    assert_eq!(
        second.delivered_to.len(),
        2,
        "the retry is acknowledged too"
    );
    for goal in &goals {
        assert_eq!(drain_bodies(goal).await, vec!["exactly once"]);
    }
}

/// Issue 26, item 5: an id is its sender's. Mallory, who learned the id alice will use, sends
/// with it first; alice's message is still stored, and the reader gets both.
#[tokio::test]
async fn another_senders_id_sent_first_does_not_suppress_a_message() {
    let fabric = Fabric::start().await;
    let alice = fabric.agent("alice").await;
    let mallory = fabric.agent("mallory").await;
    let (_reader, goal) = fabric.agent_with_goal("reader").await;
    let id = uuid::Uuid::now_v7();
    let impostor = mallory
        .send(SendRequest {
            id: Some(id),
            ..send("reader", "from the impostor")
        })
        .await
        .unwrap();
    assert_eq!(impostor.delivered_to, [goal.id()]);
    let real = alice
        .send(SendRequest {
            id: Some(id),
            ..send("reader", "the real one")
        })
        .await
        .unwrap();
    assert_eq!(real.delivered_to, [goal.id()]);
    let mut got = Vec::new();
    while let Some(delivery) = goal.recv(Duration::from_millis(300)).await.unwrap() {
        let message = delivery.ack().await.unwrap();
        got.push((message.from_agent_id.to_string(), message.body));
    }
    assert_eq!(
        got,
        [
            ("mallory".to_owned(), "from the impostor".to_owned()),
            ("alice".to_owned(), "the real one".to_owned())
        ]
    );
}

#[tokio::test]
async fn restarting_the_fanout_mid_stream_loses_no_acknowledged_message() {
    let fabric = Fabric::start().await;
    let url = fabric.url();
    let writer = fabric.agent("writer").await;
    let (_reader, goal) = fabric.agent_with_goal("reader").await;

    let progress = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = Arc::clone(&progress);
    let sender = tokio::spawn(async move {
        let mut acknowledged = Vec::new();
        for i in 0..60 {
            // The client retries with the same id while no fan-out answers.
            let report = writer
                .send_to_peer("reader", &format!("n{i:02}"))
                .await
                .unwrap();
            assert_eq!(report.delivered_to.len(), 1, "{report:?}");
            acknowledged.push(report.message_id.unwrap());
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        acknowledged
    });
    let sent = || progress.load(std::sync::atomic::Ordering::SeqCst);
    switchboard_testkit::assert_eventually!(Duration::from_secs(10), async { sent() >= 20 });
    let Fabric { fanout, .. } = fabric;
    fanout.stop().await;
    // A real wait: no fan-out for a while (the outage under test); the sender is stuck
    // retrying, mid-stream.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let during_outage = sent();
    assert!(
        during_outage < 60,
        "the restart happened mid-stream ({during_outage} sent)"
    );
    let replacement = start_fanout(&url, inbox_fanout::FanoutConfig::default()).await;
    let acknowledged = sender.await.unwrap();

    let got = goal.drain().await.unwrap();
    let ids: Vec<uuid::Uuid> = got.iter().map(|m| m.id.unwrap()).collect();
    assert_eq!(
        ids, acknowledged,
        "every acknowledged message, once, in order"
    );
    replacement.stop().await;
}

/// A durable consumer someone made on `AGENT_INBOX` for one goal (an operator's tool, a test
/// harness) holds back only that goal's purges: another goal whose reader keeps up still has
/// its read messages purged, not removed one by one as if unread.
#[tokio::test]
async fn a_consumer_of_one_goal_does_not_hold_back_another_goals_purge() {
    use async_nats::jetstream::consumer;
    let fabric = Fabric::start().await;
    let (sender, _sender_goal) = fabric.agent_with_goal("sender").await;
    let (_reader, goal) = fabric.agent_with_goal("reader").await;
    let js = async_nats::jetstream::new(fabric.nats.client().await);
    let inbox = js
        .get_stream(switchboard_proto::INBOX_STREAM)
        .await
        .unwrap();
    inbox
        .create_consumer(consumer::pull::Config {
            durable_name: Some("someone-elses-tool".into()),
            filter_subject: subject::inbox(&switchboard_proto::GoalId::new()),
            ack_policy: consumer::AckPolicy::Explicit,
            ..Default::default()
        })
        .await
        .unwrap();
    let room = switchboard_proto::INBOX_STORED_PER_GOAL.unsigned_abs() as usize;
    for n in 0..room {
        sender
            .send_to_peer("reader", &format!("m{n}"))
            .await
            .unwrap();
    }
    assert_eq!(goal.drain().await.unwrap().len(), room, "read and acked");
    // The goal is full of read messages: the next send purges them all at once.
    sender.send_to_peer("reader", "one more").await.unwrap();
    use futures::StreamExt;
    let stored = inbox
        .info_with_subjects(goal.subject())
        .await
        .unwrap()
        .next()
        .await
        .map(|entry| entry.unwrap().1)
        .unwrap_or(0);
    assert_eq!(stored, 1, "the read messages were purged, not kept");
}

/// The fetch that reports what a flood removed from `goal`, and then everything `goal` still
/// holds (taken), oldest first.
async fn removed_and_kept(
    goal: &Goal,
) -> (switchboard_proto::inbox::ExpiredUnread, Vec<InboxMessage>) {
    let first = goal.fetch(1, Duration::ZERO, None).await.unwrap();
    let removed = first
        .expired_unread
        .expect("the fetch reports what was removed");
    (removed, goal.drain().await.unwrap())
}

/// The ids of the `expired_unread` notices in `goal` (taken), oldest first.
async fn notices_in(goal: &Goal) -> Vec<uuid::Uuid> {
    goal.drain()
        .await
        .unwrap()
        .into_iter()
        .filter(|m| {
            m.kind == MessageKind::Notify
                && m.metadata.get("reason").and_then(|r| r.as_str()) == Some("expired_unread")
        })
        .filter_map(|m| m.in_reply_to)
        .collect()
}

fn senders(counts: &[(&str, u64)]) -> Vec<switchboard_proto::inbox::SenderCount> {
    counts
        .iter()
        .map(|(agent, count)| switchboard_proto::inbox::SenderCount {
            agent_id: AgentId::parse(agent).unwrap(),
            count: *count,
        })
        .collect()
}

/// Issue 37, hole 9: a full goal is fair under `evict_oldest`. alice sends bob one message,
/// then mallory sends 132 (with alice's, bob's room and 5 more): before, every message past
/// the room evicted the oldest of the goal, alice's first, and 128 more would have removed
/// everything anyone else had sent. Now a full goal takes room from the sender holding the most of it:
/// mallory's own oldest go, alice's stays, alice's next message lands (taking mallory's oldest
/// too), and bob's fetch names mallory as whose messages went.
#[tokio::test]
async fn a_flood_into_a_shared_goal_evicts_only_the_flooders_own_messages() {
    let fabric = Fabric::start().await;
    let (alice, alice_goal) = fabric.agent_with_goal("alice").await;
    let (mallory, mallory_goal) = fabric.agent_with_goal("mallory").await;
    let (_bob, bob_goal) = fabric.agent_with_goal("bob").await;
    let room = switchboard_proto::INBOX_STORED_PER_GOAL.unsigned_abs() as usize;
    alice.send_to_peer("bob", "alice early").await.unwrap();
    let mut flood = Vec::new();
    for n in 0..room + 4 {
        let report = mallory
            .send_to_peer("bob", &format!("flood {n:03}"))
            .await
            .unwrap();
        assert_eq!(
            report.delivered_to,
            vec![bob_goal.id()],
            "flood {n} is stored"
        );
        flood.push(report.message_id.unwrap());
    }
    let late = alice.send_to_peer("bob", "alice late").await.unwrap();
    assert_eq!(
        late.delivered_to,
        vec![bob_goal.id()],
        "alice still gets in"
    );

    // 127 of mallory's filled the goal beside alice's; her 5 more and alice's late one each
    // removed mallory's oldest.
    let (removed, kept) = removed_and_kept(&bob_goal).await;
    assert_eq!(removed.count, 6);
    assert_eq!(removed.ids, flood[..6].to_vec(), "mallory's oldest went");
    assert_eq!(
        removed.from,
        senders(&[("mallory", 6)]),
        "bob sees who filled it"
    );
    let bodies: Vec<&str> = kept.iter().map(|m| m.body.as_str()).collect();
    assert_eq!(bodies.len(), room);
    assert_eq!(
        bodies[0], "alice early",
        "alice's unread message survived the flood"
    );
    assert_eq!(bodies[1], "flood 006");
    assert_eq!(bodies[room - 1], "alice late");
    // Only mallory is told her messages went unread.
    assert_eq!(notices_in(&mallory_goal).await, flood[..6].to_vec());
    assert!(notices_in(&alice_goal).await.is_empty());
}

/// Issue 37, hole 9, found in review: a full goal's read of who holds it stops at a fetch's
/// worth of bytes, so mallory first sends 14 messages of 60 KiB (more than one read takes),
/// then alice three small ones, then mallory floods. Counting what lies past the read as one
/// holder that could win made every eviction take the first message past mallory's large
/// ones — soon alice's. Now only holders the read saw are chosen: mallory's own go.
#[tokio::test]
async fn large_messages_first_do_not_turn_a_flood_against_the_others() {
    let fabric = Fabric::start().await;
    let (alice, _alice_goal) = fabric.agent_with_goal("alice").await;
    let (mallory, _mallory_goal) = fabric.agent_with_goal("mallory").await;
    let (_bob, bob_goal) = fabric.agent_with_goal("bob").await;
    let room = switchboard_proto::INBOX_STORED_PER_GOAL.unsigned_abs() as usize;
    let large = "x".repeat(60 * 1024);
    for _ in 0..14 {
        mallory.send_to_peer("bob", &large).await.unwrap();
    }
    for n in 0..3 {
        alice
            .send_to_peer("bob", &format!("alice {n}"))
            .await
            .unwrap();
    }
    for n in 0..room {
        mallory
            .send_to_peer("bob", &format!("flood {n:03}"))
            .await
            .unwrap();
    }
    let (removed, kept) = removed_and_kept(&bob_goal).await;
    let bodies: Vec<&str> = kept.iter().map(|m| m.body.as_str()).collect();
    for n in 0..3 {
        assert!(
            bodies.contains(&format!("alice {n}").as_str()),
            "alice's message {n} survived mallory's flood"
        );
    }
    assert_eq!(
        removed.from,
        senders(&[("mallory", removed.count)]),
        "only mallory's messages went"
    );
}

/// Issue 37, hole 9: a full goal is fair under `overflow: refuse`. Before, once mallory had
/// filled bob's goal every other sender got `inbox_full` too. Now a sender holding its share
/// of the goal (held × senders ≥ waiting) is refused; one under it takes room from the biggest
/// holder instead, so alice and a newcomer still get in, alice's earlier message is kept, and
/// mallory stays refused.
#[tokio::test]
async fn a_flood_into_a_refusing_goal_refuses_only_the_flooder() {
    use switchboard_proto::inbox::Overflow;
    use switchboard_proto::registry::GoalOpenRequest;
    let fabric = Fabric::start().await;
    let (alice, alice_goal) = fabric.agent_with_goal("alice").await;
    let (mallory, mallory_goal) = fabric.agent_with_goal("mallory").await;
    let carol = fabric.agent("carol").await;
    let bob = fabric.agent("bob").await;
    let bob_goal = bob
        .open_goal_with(GoalOpenRequest {
            overflow: Some(Overflow::Refuse),
            ..GoalOpenRequest::default()
        })
        .await
        .unwrap();
    let room = switchboard_proto::INBOX_STORED_PER_GOAL.unsigned_abs() as usize;
    alice.send_to_peer("bob", "alice early").await.unwrap();
    let mut flood = Vec::new();
    for n in 0..room + 2 {
        let sent = mallory.send_to_peer("bob", &format!("flood {n:03}")).await;
        if n < room - 1 {
            flood.push(sent.unwrap().message_id.unwrap());
        } else {
            let err = sent.unwrap_err();
            assert_eq!(err.kind(), Some(ErrorKind::InboxFull), "flood {n}: {err}");
        }
    }
    // alice (1 of 128) and carol (none) are under their share: each takes mallory's oldest.
    let late = alice.send_to_peer("bob", "alice late").await.unwrap();
    assert_eq!(
        late.delivered_to,
        vec![bob_goal.id()],
        "alice is not refused"
    );
    let new = carol.send_to_peer("bob", "carol").await.unwrap();
    assert_eq!(
        new.delivered_to,
        vec![bob_goal.id()],
        "a newcomer is not refused"
    );
    let err = mallory
        .send_to_peer("bob", "still flooding")
        .await
        .unwrap_err();
    assert_eq!(err.kind(), Some(ErrorKind::InboxFull), "{err}");

    let (removed, kept) = removed_and_kept(&bob_goal).await;
    assert_eq!(removed.count, 2);
    assert_eq!(removed.ids, flood[..2].to_vec());
    assert_eq!(
        removed.from,
        senders(&[("mallory", 2)]),
        "bob sees who filled it"
    );
    let bodies: Vec<&str> = kept.iter().map(|m| m.body.as_str()).collect();
    assert_eq!(bodies.len(), room);
    assert_eq!(bodies[0], "alice early", "nothing of alice's was removed");
    assert_eq!(bodies[1], "flood 002");
    assert_eq!(bodies[room - 2..], ["alice late", "carol"]);
    assert_eq!(notices_in(&mallory_goal).await, flood[..2].to_vec());
    assert!(notices_in(&alice_goal).await.is_empty());
}

/// Issue 37, hole 9: fairness counts only what waits. bob holds a full fetch of mallory's 64
/// (not acked yet) when alice's message and 64 more of mallory's arrive: the one past the room
/// takes mallory's oldest *waiting* message — not alice's, the oldest waiting one, as before,
/// and never one bob holds.
#[tokio::test]
async fn fairness_never_takes_what_the_reader_holds() {
    let fabric = Fabric::start().await;
    let (alice, _alice_goal) = fabric.agent_with_goal("alice").await;
    let (mallory, _mallory_goal) = fabric.agent_with_goal("mallory").await;
    let (_bob, bob_goal) = fabric.agent_with_goal("bob").await;
    let cap = switchboard_proto::INBOX_CAP_PER_GOAL.unsigned_abs() as usize;
    for n in 0..cap {
        mallory
            .send_to_peer("bob", &format!("held {n:02}"))
            .await
            .unwrap();
    }
    let held = bob_goal.fetch(64, Duration::ZERO, None).await.unwrap();
    assert_eq!(held.messages.len(), cap);
    alice.send_to_peer("bob", "alice waiting").await.unwrap();
    let mut waiting = Vec::new();
    for n in 0..cap {
        let report = mallory
            .send_to_peer("bob", &format!("waiting {n:02}"))
            .await
            .unwrap();
        waiting.push(report.message_id.unwrap());
    }
    // Handed out again (not acked): all 64 still there, and one of mallory's waiting ones went.
    let again = bob_goal.fetch(64, Duration::ZERO, None).await.unwrap();
    assert_eq!(again.messages.len(), cap);
    assert_eq!(again.messages[0].message.body, "held 00");
    let removed = again.expired_unread.expect("one went");
    assert_eq!(removed.ids, vec![waiting[0]]);
    assert_eq!(removed.from, senders(&[("mallory", 1)]));
    let next = bob_goal
        .fetch(64, Duration::ZERO, again.messages.last().map(|m| m.seq))
        .await
        .unwrap();
    let bodies: Vec<&str> = next
        .messages
        .iter()
        .map(|m| m.message.body.as_str())
        .collect();
    assert_eq!(bodies.len(), cap);
    assert_eq!(bodies[0], "alice waiting");
    assert_eq!(bodies[1], "waiting 01");
}
