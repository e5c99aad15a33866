//! The directory, end to end against a real nats-server: what an agent does to join, open
//! goals and find its peers, and what happens when it misbehaves.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

// Longer than 600 lines because it holds one scenario per test of the directory; every integration
// file is its own test binary (a link of all five services), so a topic gets one file however many
// tests it has.

use std::collections::BTreeSet;
use std::time::Duration;

use async_nats::jetstream;
use serde_json::json;
use switchboard_client::{Agent, render_peer_messages_block};
use switchboard_proto::registry::{
    GoalOpenRequest, HeartbeatRequest, PEERS_PAGE_BYTES, PeersRequest, RegistryEventPayload,
};
use switchboard_proto::subject::{RegistryEvent, RegistryOp};
use switchboard_proto::{
    AgentId, AgentStatus, CONSUMER_META_AGENT, CURSORS_BUCKET, ErrorKind, GoalId, GoalKind,
    INBOX_STREAM, InboxMessage, inbox::CursorRecord, inbox_consumer, subject,
};
use switchboard_testkit::{NatsServer, assert_eventually};
use switchboard_tests::{
    DirectoryConfig, agent_with, card, fast_offline, raw, start_directory, start_fanout,
    stored_events,
};

const LONG: Duration = Duration::from_secs(3600);

#[tokio::test]
async fn register_heartbeat_and_offline_by_timeout() {
    let nats = NatsServer::start().await;
    // Generous against a loaded CI machine: the steps below must fit well inside it.
    let _dir = start_directory(&nats.url(), fast_offline(1_500)).await;

    // An agent that never heartbeats on its own (interval of an hour).
    let mut researcher = card("researcher");
    researcher.description = "research agent".into();
    researcher.capabilities = vec!["search".into()];
    let agent = agent_with(&nats.url(), researcher.clone(), LONG).await;
    let goal = agent.open_goal().await.unwrap();

    let looked = agent.lookup("researcher").await.unwrap();
    assert_eq!(looked.card, researcher);
    assert_eq!(looked.status, AgentStatus::Idle);
    assert_eq!(looked.live_goals, vec![goal.id()]);

    // Heartbeat with a status and a task list.
    let beat = agent
        .heartbeat(&HeartbeatRequest {
            status: Some(AgentStatus::Busy),
            current_tasks: Some(vec!["t1".into()]),
        })
        .await
        .unwrap();
    assert_eq!(beat.status, AgentStatus::Busy);
    let looked = agent.lookup("researcher").await.unwrap();
    assert_eq!(looked.status, AgentStatus::Busy);
    assert_eq!(looked.current_tasks, vec!["t1"]);

    // Heartbeats stop: offline after the timeout, with an `offline` event; goals stay open.
    assert_eventually!(
        Duration::from_secs(10),
        async { agent.lookup("researcher").await.unwrap().status == AgentStatus::Offline },
        "agent never went offline"
    );
    let offline = stored_events(agent.nats(), "agent.registry.events.offline.researcher").await;
    assert_eq!(offline.len(), 1, "exactly one offline event: {offline:?}");
    assert_eq!(offline[0].event, RegistryEvent::Offline);
    assert_eq!(
        agent.lookup("researcher").await.unwrap().live_goals,
        vec![goal.id()]
    );

    // A heartbeat brings it back.
    let beat = agent.heartbeat(&HeartbeatRequest::default()).await.unwrap();
    assert_eq!(beat.status, AgentStatus::Idle);

    // The full event trail of this agent, in order.
    let kinds: Vec<RegistryEvent> =
        stored_events(agent.nats(), "agent.registry.events.*.researcher")
            .await
            .into_iter()
            .map(|event| event.event)
            .collect();
    assert_eq!(
        kinds,
        vec![
            RegistryEvent::Registered,
            RegistryEvent::GoalOpened,
            RegistryEvent::Status,
            RegistryEvent::Offline,
            RegistryEvent::Status,
        ]
    );
}

#[tokio::test]
async fn heartbeat_loop_keeps_an_agent_online() {
    let nats = NatsServer::start().await;
    let _dir = start_directory(&nats.url(), fast_offline(1_000)).await;
    let agent = agent_with(&nats.url(), card("steady"), Duration::from_millis(100)).await;
    // Well past several timeouts, the loop has kept it online the whole time.
    for _ in 0..30 {
        // A real wait: it must stay online across the window, checked every 100 ms.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_ne!(
            agent.lookup("steady").await.unwrap().status,
            AgentStatus::Offline
        );
    }
    assert!(
        stored_events(agent.nats(), "agent.registry.events.offline.steady")
            .await
            .is_empty()
    );
    // Dropping the agent stops the loop; it then goes offline.
    let observer = agent_with(&nats.url(), card("observer"), LONG).await;
    drop(agent);
    assert_eventually!(Duration::from_secs(5), async {
        observer.lookup("steady").await.unwrap().status == AgentStatus::Offline
    });
}

#[tokio::test]
async fn goals_open_and_close() {
    let nats = NatsServer::start().await;
    let _dir = start_directory(&nats.url(), DirectoryConfig::default()).await;
    let agent = agent_with(&nats.url(), card("writer"), LONG).await;
    let js = jetstream::new(agent.nats().clone());

    let bg = agent.open_goal_of(GoalKind::Background).await.unwrap();
    let chosen = GoalId::new();
    let daemon = agent
        .open_goal_with(GoalOpenRequest {
            goal_id: Some(chosen),
            name: None,
            kind: Some(GoalKind::Daemon),
            overflow: None,
        })
        .await
        .unwrap();
    assert_eq!(daemon.id(), chosen);
    assert_eq!(daemon.subject(), subject::inbox(&chosen));

    // The goal is a cursor owned by its agent, at 0; no consumer exists.
    let mut stream = js.get_stream(INBOX_STREAM).await.unwrap();
    let cursors = js.get_key_value(CURSORS_BUCKET).await.unwrap();
    let cursor: CursorRecord =
        serde_json::from_slice(&cursors.get(chosen.to_string()).await.unwrap().unwrap()).unwrap();
    assert_eq!(cursor, CursorRecord::new(agent.id().clone(), 0));
    assert_eq!(stream.info().await.unwrap().state.consumer_count, 0);

    // Re-opening the same goal is idempotent.
    let again = agent
        .open_goal_with(GoalOpenRequest {
            goal_id: Some(chosen),
            name: None,
            kind: None,
            overflow: None,
        })
        .await
        .unwrap();
    assert_eq!(again.id(), chosen);
    let live: BTreeSet<GoalId> = agent
        .lookup("writer")
        .await
        .unwrap()
        .live_goals
        .into_iter()
        .collect();
    assert_eq!(live, BTreeSet::from([bg.id(), chosen]));

    // Messages waiting in a goal are purged when it closes.
    publish_inbox(&js, &agent, chosen, "will be purged").await;
    let closed = daemon.close().await.unwrap();
    assert_eq!(closed.goal_id, chosen);
    assert_eq!(closed.purged, 1);
    assert!(
        cursors.entry(chosen.to_string()).await.unwrap().is_none(),
        "the cursor is purged, not left as a delete marker"
    );
    assert_eq!(
        stream.info().await.unwrap().state.messages,
        0,
        "inbox purged"
    );
    assert_eq!(
        agent.lookup("writer").await.unwrap().live_goals,
        vec![bg.id()]
    );

    // Closing it again: not_found.
    let err = agent.close_goal(chosen).await.unwrap_err();
    assert_eq!(err.kind(), Some(ErrorKind::NotFound));

    // Another agent may not take over a goal id it does not own.
    let thief = agent_with(&nats.url(), card("thief"), LONG).await;
    let err = thief
        .open_goal_with(GoalOpenRequest {
            goal_id: Some(bg.id()),
            name: None,
            kind: None,
            overflow: None,
        })
        .await
        .unwrap_err();
    assert_eq!(err.kind(), Some(ErrorKind::Conflict));
    let err = thief.close_goal(bg.id()).await.unwrap_err();
    assert_eq!(err.kind(), Some(ErrorKind::NotFound));

    // Deregister closes every remaining goal.
    let gone = agent.deregister().await.unwrap();
    assert_eq!(gone.closed_goals, vec![bg.id()]);
    let looked = thief.lookup("writer").await.unwrap();
    assert_eq!(looked.status, AgentStatus::Offline);
    assert!(looked.live_goals.is_empty());
    let closed_events =
        stored_events(agent.nats(), "agent.registry.events.goal_closed.writer").await;
    assert_eq!(closed_events.len(), 2);
}

/// Publishes an inbox message the way the fan-out service does (JetStream, Nats-Msg-Id).
async fn publish_inbox(
    js: &jetstream::Context,
    to: &Agent,
    goal: GoalId,
    body: &str,
) -> InboxMessage {
    let mut message = InboxMessage::new(
        AgentId::parse("sender").unwrap(),
        GoalId::new(),
        to.id().clone(),
        body,
    );
    message.id = Some(switchboard_proto::new_id());
    // As the services publish: a full inbox makes room (switchboard_delivery::room).
    switchboard_delivery::deliver::deliver(
        js,
        &subject::inbox(&goal),
        &format!("{}:{goal}", message.id.unwrap()),
        serde_json::to_vec(&message).unwrap().into(),
    )
    .await
    .unwrap();
    message
}

#[tokio::test]
async fn buffer_on_demand_send_before_subscribe() {
    let nats = NatsServer::start().await;
    let _dir = start_directory(&nats.url(), DirectoryConfig::default()).await;
    let _inbox = start_fanout(&nats.url(), Default::default()).await;
    let client = nats.client().await;
    let js = jetstream::new(client.clone());

    // The goal is opened with a raw request: nothing reads its inbox yet.
    let agent = agent_with(&nats.url(), card("late"), LONG).await;
    let opened = raw(&client, "agent.registry.goal.open.late", "{}").await;
    let goal_id = GoalId::parse(opened.body["goal_id"].as_str().unwrap()).unwrap();

    let mut sent = Vec::new();
    for i in 0..3 {
        sent.push(publish_inbox(&js, &agent, goal_id, &format!("message {i}")).await);
    }
    let mut with_correlation = publish_inbox(&js, &agent, goal_id, "with correlation").await;
    with_correlation.correlation_id = None; // as published
    sent.push(with_correlation);

    // Now the goal's runtime attaches and reads: everything is there, oldest first.
    let goal = agent
        .open_goal_with(GoalOpenRequest {
            goal_id: Some(goal_id),
            name: None,
            kind: None,
            overflow: None,
        })
        .await
        .unwrap();
    let drained = goal.drain().await.unwrap();
    let bodies: Vec<&str> = drained.iter().map(|m| m.body.as_str()).collect();
    assert_eq!(
        bodies,
        vec!["message 0", "message 1", "message 2", "with correlation"]
    );
    assert_eq!(drained[0].id, sent[0].id);
    // Acked after taking: nothing comes back.
    assert!(goal.drain().await.unwrap().is_empty());
    assert!(
        goal.recv(Duration::from_millis(200))
            .await
            .unwrap()
            .is_none()
    );

    let block = render_peer_messages_block(&drained).unwrap();
    assert!(block.starts_with("# PEER MESSAGES\n<peer-message from=\"sender\" sent_at=\""));
    assert_eq!(block.matches("<peer-message ").count(), 4);

    // recv + ack, and an un-acked delivery comes back to the same durable consumer.
    publish_inbox(&js, &agent, goal_id, "ack me").await;
    let delivery = goal.recv(Duration::from_secs(2)).await.unwrap().unwrap();
    assert_eq!(delivery.message.body, "ack me");
    delivery.ack().await.unwrap();
    assert!(
        goal.recv(Duration::from_millis(200))
            .await
            .unwrap()
            .is_none()
    );

    // The inbox keeps at most the newest 128 messages of a goal nobody reads.
    let room = switchboard_proto::INBOX_STORED_PER_GOAL.unsigned_abs() as usize;
    for i in 0..room + 6 {
        publish_inbox(&js, &agent, goal_id, &format!("flood {i}")).await;
    }
    let flood = goal.drain().await.unwrap();
    assert_eq!(flood.len(), room);
    assert_eq!(flood[0].body, "flood 6");
    assert_eq!(flood[room - 1].body, format!("flood {}", room + 5));
}

#[tokio::test]
async fn peers_with_acl_reachability() {
    let nats = NatsServer::start().await;
    let _dir = start_directory(&nats.url(), DirectoryConfig::default()).await;
    let url = nats.url();

    let mut coord = card("coordinator");
    coord.description = "plans work".into();
    coord.deny_talk_to = vec!["spam*".into()];
    let mut researcher = card("researcher");
    researcher.description = "research agent".into();
    researcher.capabilities = vec!["search".into()];
    researcher.allow_from = vec!["coord*".into()];
    let writer = card("writer");
    let spammer = card("spammer");
    let sleeper = card("sleeper"); // registered, no live goal
    let mut narrow = card("narrow");
    narrow.can_talk_to = vec!["writer".into(), "spam*".into()];
    narrow.deny_talk_to = vec!["spammer".into()];

    let mut agents = Vec::new();
    for c in [coord, researcher, writer, spammer, narrow] {
        let agent = agent_with(&url, c, LONG).await;
        let goal = agent.open_goal().await.unwrap();
        agents.push((agent, goal));
    }
    let sleeper = agent_with(&url, sleeper, LONG).await;

    let reach = |reply: switchboard_proto::registry::PeersReply| -> Vec<(String, bool)> {
        reply
            .peers
            .into_iter()
            .map(|p| (p.agent_id.to_string(), p.reachable))
            .collect()
    };
    let owned = |v: &[(&str, bool)]| {
        v.iter()
            .map(|(a, r)| (a.to_string(), *r))
            .collect::<Vec<_>>()
    };

    // coordinator: deny beats its `*` allow for spammer; sleeper has no live goal.
    let peers = agents[0].0.peers().await.unwrap();
    assert!(peers.note.is_none());
    let researcher_entry = peers
        .peers
        .iter()
        .find(|p| p.agent_id == "researcher")
        .unwrap();
    assert_eq!(researcher_entry.description, "research agent");
    assert_eq!(researcher_entry.capabilities, vec!["search"]);
    assert_eq!(researcher_entry.status, AgentStatus::Idle);
    assert_eq!(
        reach(peers),
        owned(&[
            ("narrow", true),
            ("researcher", true),
            ("sleeper", false),
            ("spammer", false),
            ("writer", true)
        ])
    );
    // writer: researcher only accepts coord*.
    assert_eq!(
        reach(agents[2].0.peers().await.unwrap()),
        owned(&[
            ("coordinator", true),
            ("narrow", true),
            ("researcher", false),
            ("sleeper", false),
            ("spammer", true)
        ])
    );
    // narrow: only writer and spam*, but spammer itself is denied.
    assert_eq!(
        reach(agents[4].0.peers().await.unwrap()),
        owned(&[
            ("coordinator", false),
            ("researcher", false),
            ("sleeper", false),
            ("spammer", false),
            ("writer", true)
        ])
    );
    // sleeper opens a goal: now reachable.
    let _goal = sleeper.open_goal().await.unwrap();
    assert!(
        agents[0]
            .0
            .peers()
            .await
            .unwrap()
            .peers
            .iter()
            .any(|p| p.agent_id == "sleeper" && p.reachable)
    );

    // An unregistered caller gets the seed's note.
    let client = nats.client().await;
    let reply = raw(&client, "agent.registry.peers.ghost", "").await;
    assert_eq!(
        reply.body,
        json!({"peers": [], "note": "agent `ghost` is not registered"})
    );
}

/// list_peers comes in pages in agent-id order: `limit` peers (default 100), `next` to
/// continue, and a page never grows past its byte budget however long the descriptions are.
#[tokio::test]
async fn list_peers_pages_in_id_order_within_a_byte_budget() {
    let nats = NatsServer::start().await;
    let url = nats.url();
    let _directory = start_directory(&url, DirectoryConfig::default()).await;
    let client = nats.client().await;
    // 250 small cards and 12 big ones (15,000-character descriptions), registered as a
    // foreign client would.
    let mut expected = BTreeSet::new();
    for i in 0..250 {
        let id = format!("peer-{i:03}");
        let reply = raw(
            &client,
            &format!("agent.registry.register.{id}"),
            json!({"agent_id": id}).to_string(),
        )
        .await;
        assert!(reply.body.get("error").is_none(), "{:?}", reply.body);
        expected.insert(id);
    }
    for i in 0..12 {
        let id = format!("big-{i:02}");
        let card = json!({"agent_id": id, "description": "d".repeat(15_000)});
        let reply = raw(
            &client,
            &format!("agent.registry.register.{id}"),
            card.to_string(),
        )
        .await;
        assert!(reply.body.get("error").is_none(), "{:?}", reply.body);
        expected.insert(id);
    }
    let asker = agent_with(&url, card("zz-asker"), LONG).await;

    // The first page: big cards first (id order), cut by the byte budget, not the limit.
    let first = asker.peers_page(&PeersRequest::default()).await.unwrap();
    let bytes = serde_json::to_vec(&first.peers).unwrap().len();
    assert!(
        first.peers.len() < 12 && bytes <= PEERS_PAGE_BYTES,
        "{} peers, {bytes} bytes",
        first.peers.len()
    );
    assert_eq!(
        first.next.as_deref(),
        Some(first.peers.last().unwrap().agent_id.as_str())
    );
    // Small cards: 100 per page by default, `limit` up to 1000, at least 1.
    let small = asker
        .peers_page(&PeersRequest {
            after: Some("big-11".into()),
            limit: None,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(small.peers.len(), 100);
    assert_eq!(small.peers[0].agent_id, "peer-000");
    assert_eq!(small.next.as_deref(), Some("peer-099"));
    let rest = asker
        .peers_page(&PeersRequest {
            after: Some("peer-099".into()),
            limit: Some(5_000),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(rest.peers.len(), 150);
    assert_eq!(rest.next, None, "the last page has no next");
    let one = asker
        .peers_page(&PeersRequest {
            after: None,
            limit: Some(0),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!((one.peers.len(), one.next.as_deref()), (1, Some("big-00")));

    // The client walks every page; the caller is never listed.
    let all: Vec<String> = asker
        .peers()
        .await
        .unwrap()
        .peers
        .into_iter()
        .map(|peer| peer.agent_id.to_string())
        .collect();
    assert_eq!(all, expected.into_iter().collect::<Vec<_>>());

    // A malformed page request is a typed error.
    for body in [r#"{"limit": "ten"}"#, r#"{"page": 2}"#, r#"{"after": 7}"#] {
        let reply = raw(&client, "agent.registry.peers.zz-asker", body).await;
        assert_eq!(reply.error_kind(), "bad_request", "{body}");
    }
}

#[tokio::test]
async fn two_replicas_serve_the_same_registry() {
    let nats = NatsServer::start().await;
    let url = nats.url();
    let a = start_directory(&url, fast_offline(500)).await;
    let b = start_directory(&url, fast_offline(500)).await;

    // 40 agents register concurrently; the queue group spreads them over both replicas.
    let mut joins = Vec::new();
    for i in 0..40 {
        let url = url.clone();
        joins.push(tokio::spawn(async move {
            let agent = agent_with(&url, card(&format!("agent-{i:02}")), LONG).await;
            let goal = agent.open_goal().await.unwrap();
            (agent, goal)
        }));
    }
    let mut agents = Vec::new();
    for join in joins {
        agents.push(join.await.unwrap());
    }
    // Every read, from whichever replica answers, sees every write.
    for (agent, goal) in &agents {
        let peers = agent.peers().await.unwrap();
        assert_eq!(peers.peers.len(), 39);
        assert!(peers.peers.iter().all(|p| p.reachable));
        assert_eq!(
            agent.lookup(agent.id().as_str()).await.unwrap().live_goals,
            vec![goal.id()]
        );
    }

    // Concurrent heartbeats on one agent through both replicas never lose an update: each
    // sets a distinct task list, and the final state is one of them, with status intact.
    let target = &agents[0].0;
    let requests: Vec<HeartbeatRequest> = (0..20)
        .map(|i| HeartbeatRequest {
            status: Some(AgentStatus::Busy),
            current_tasks: Some(vec![format!("task-{i}")]),
        })
        .collect();
    let beats = requests.iter().map(|beat| target.heartbeat(beat));
    for beat in futures::future::join_all(beats).await {
        assert_eq!(beat.unwrap().status, AgentStatus::Busy);
    }
    let tasks = target
        .lookup(target.id().as_str())
        .await
        .unwrap()
        .current_tasks;
    assert_eq!(tasks.len(), 1);

    // Both replicas really served requests ($SRV.STATS per instance).
    let client = nats.client().await;
    let inbox = client.new_inbox();
    let mut stats = client.subscribe(inbox.clone()).await.unwrap();
    client
        .publish_with_reply("$SRV.STATS.directory", inbox, "".into())
        .await
        .unwrap();
    let mut served = Vec::new();
    for _ in 0..2 {
        let msg =
            tokio::time::timeout(Duration::from_secs(5), futures::StreamExt::next(&mut stats))
                .await
                .unwrap()
                .unwrap();
        let value: serde_json::Value = serde_json::from_slice(&msg.payload).unwrap();
        let total: u64 = value["endpoints"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["num_requests"].as_u64().unwrap())
            .sum();
        served.push(total);
    }
    assert!(
        served.iter().all(|n| *n > 0),
        "both replicas served: {served:?}"
    );

    // Both sweepers run; a silent agent still gets exactly one offline event.
    let silent = agent_with(&url, card("silent"), LONG).await;
    assert_eventually!(Duration::from_secs(5), async {
        silent.lookup("silent").await.unwrap().status == AgentStatus::Offline
    });
    // A real wait: let both sweepers pass over it several more times (a second offline
    // event is what must not happen).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let offline: Vec<RegistryEventPayload> =
        stored_events(&client, "agent.registry.events.offline.silent").await;
    assert_eq!(offline.len(), 1, "{offline:?}");

    // One replica leaves; the other keeps serving everything.
    a.stop().await;
    let agent = agent_with(&url, card("late-joiner"), LONG).await;
    assert_eq!(agent.peers().await.unwrap().peers.len(), 41);
    b.stop().await;
}

#[tokio::test]
async fn restart_of_directory_and_server_loses_nothing() {
    let mut nats = NatsServer::start().await;
    let url = nats.url();
    let dir = start_directory(&url, DirectoryConfig::default()).await;

    let mut researcher = card("researcher");
    researcher.allow_from = vec!["coordinator".into()];
    let agent = agent_with(&url, researcher.clone(), LONG).await;
    let goal = agent.open_goal().await.unwrap();
    let goal_id = goal.id();
    let js = jetstream::new(agent.nats().clone());
    publish_inbox(&js, &agent, goal_id, "kept across restarts").await;
    let before = agent.lookup("researcher").await.unwrap();

    // Restart the directory...
    dir.stop().await;
    let dir = start_directory(&url, DirectoryConfig::default()).await;
    assert_eq!(agent.lookup("researcher").await.unwrap(), before);

    // ...and the server under it (same port, same store).
    dir.stop().await;
    drop(goal);
    drop(agent);
    nats.restart().await;
    let _dir = start_directory(&url, DirectoryConfig::default()).await;
    let _inbox = start_fanout(&url, Default::default()).await;
    let nats_client = switchboard_client::agent_connect_options(&researcher.agent_id)
        .connect(url.as_str())
        .await
        .unwrap();
    let back = switchboard_client::Agent::connect_with(
        nats_client,
        researcher,
        switchboard_client::AgentOptions::default(),
    )
    .await
    .unwrap();
    let after = back.lookup("researcher").await.unwrap();
    assert_eq!(after.card, before.card);
    assert_eq!(after.registered_at, before.registered_at);
    assert_eq!(after.live_goals, vec![goal_id]);
    let goal = back
        .open_goal_with(GoalOpenRequest {
            goal_id: Some(goal_id),
            name: None,
            kind: None,
            overflow: None,
        })
        .await
        .unwrap();
    let drained = goal.drain().await.unwrap();
    assert_eq!(drained.len(), 1);
    assert_eq!(drained[0].body, "kept across restarts");
}

#[tokio::test]
async fn bad_inputs_get_typed_errors_and_the_service_keeps_serving() {
    let nats = NatsServer::start().await;
    let _dir = start_directory(&nats.url(), DirectoryConfig::default()).await;
    let client = nats.client().await;
    let owner = agent_with(&nats.url(), card("owner"), LONG).await;
    let owned_goal = owner.open_goal().await.unwrap();
    let long_id = "a".repeat(65);

    let table: Vec<(String, Vec<u8>, &str)> = vec![
        (
            "agent.registry.register.x".into(),
            b"{not json".to_vec(),
            "bad_request",
        ),
        (
            "agent.registry.register.x".into(),
            b"[1,2]".to_vec(),
            "bad_request",
        ),
        (
            "agent.registry.register.x".into(),
            b"\"card\"".to_vec(),
            "bad_request",
        ),
        (
            "agent.registry.register.x".into(),
            br#"{"description": 5}"#.to_vec(),
            "bad_request",
        ),
        (
            "agent.registry.register.x".into(),
            br#"{"allow_from": "everyone"}"#.to_vec(),
            "bad_request",
        ),
        (
            "agent.registry.register.x".into(),
            br#"{"agent_id": "other"}"#.to_vec(),
            "identity_mismatch",
        ),
        (
            "agent.registry.register.x".into(),
            br#"{"agent_id": 7}"#.to_vec(),
            "bad_request",
        ),
        (
            "agent.registry.register.x".into(),
            vec![0xff, 0xfe, 0x7b],
            "bad_request",
        ),
        (
            "agent.registry.register.x".into(),
            format!("{}1{}", "[".repeat(200), "]".repeat(200)).into_bytes(),
            "bad_request",
        ),
        (
            "agent.registry.register.a.b".into(),
            b"{}".to_vec(),
            "invalid_agent_id",
        ),
        (
            "agent.registry.register.*".into(),
            b"{}".to_vec(),
            "invalid_agent_id",
        ),
        (
            "agent.registry.register.Upper".into(),
            b"{}".to_vec(),
            "invalid_agent_id",
        ),
        (
            "agent.registry.register.-dash".into(),
            b"{}".to_vec(),
            "invalid_agent_id",
        ),
        (
            format!("agent.registry.register.{long_id}"),
            b"{}".to_vec(),
            "invalid_agent_id",
        ),
        (
            "agent.registry.heartbeat.ghost".into(),
            b"{}".to_vec(),
            "not_registered",
        ),
        (
            "agent.registry.heartbeat.owner".into(),
            br#"{"status": "offline"}"#.to_vec(),
            "bad_request",
        ),
        (
            "agent.registry.heartbeat.owner".into(),
            br#"{"status": 3}"#.to_vec(),
            "bad_request",
        ),
        (
            "agent.registry.heartbeat.owner".into(),
            br#"{"current_tasks": "t1"}"#.to_vec(),
            "bad_request",
        ),
        (
            "agent.registry.deregister.ghost".into(),
            b"".to_vec(),
            "not_registered",
        ),
        (
            "agent.registry.goal.open.ghost".into(),
            b"{}".to_vec(),
            "not_registered",
        ),
        (
            "agent.registry.goal.open.owner".into(),
            br#"{"goal_id": "nope"}"#.to_vec(),
            "invalid_goal_id",
        ),
        (
            "agent.registry.goal.open.owner".into(),
            br#"{"kind": "forever"}"#.to_vec(),
            "bad_request",
        ),
        (
            "agent.registry.goal.open.owner".into(),
            br#"{"gaol_id": "x"}"#.to_vec(),
            "bad_request",
        ),
        (
            "agent.registry.goal.close.owner".into(),
            b"{}".to_vec(),
            "bad_request",
        ),
        (
            "agent.registry.goal.close.owner".into(),
            br#"{"goal_id": "nope"}"#.to_vec(),
            "invalid_goal_id",
        ),
        (
            "agent.registry.goal.close.owner".into(),
            format!(r#"{{"goal_id": "{}"}}"#, GoalId::new()).into_bytes(),
            "not_found",
        ),
        (
            "agent.registry.lookup.owner".into(),
            br#"{"agent_id": "a.b"}"#.to_vec(),
            "invalid_agent_id",
        ),
        (
            "agent.registry.lookup.owner".into(),
            br#"{"agent_id": ""}"#.to_vec(),
            "invalid_agent_id",
        ),
        (
            "agent.registry.lookup.owner".into(),
            br#"{"agent_id": "*"}"#.to_vec(),
            "invalid_agent_id",
        ),
        (
            "agent.registry.lookup.owner".into(),
            format!(r#"{{"agent_id": "{long_id}"}}"#).into_bytes(),
            "invalid_agent_id",
        ),
        (
            "agent.registry.lookup.owner".into(),
            br#"{"agent_id": "ghost"}"#.to_vec(),
            "not_found",
        ),
        (
            "agent.registry.lookup.owner".into(),
            br#"{"agent_id": 7}"#.to_vec(),
            "bad_request",
        ),
        (
            "agent.registry.lookup.owner".into(),
            b"{}".to_vec(),
            "bad_request",
        ),
        (
            "agent.registry.peers.a.b".into(),
            b"".to_vec(),
            "invalid_agent_id",
        ),
    ];
    // A goal id owned by another agent.
    let steal = format!(r#"{{"goal_id": "{}"}}"#, owned_goal.id());
    let mut table = table;
    table.push(("agent.registry.register.thief".into(), b"{}".to_vec(), "ok"));
    table.push((
        "agent.registry.goal.open.thief".into(),
        steal.clone().into_bytes(),
        "conflict",
    ));
    table.push((
        "agent.registry.goal.close.thief".into(),
        steal.into_bytes(),
        "not_found",
    ));

    for (subject, payload, want) in &table {
        let reply = raw(&client, subject, payload.clone()).await;
        if *want == "ok" {
            assert!(
                reply.body.get("error").is_none(),
                "{subject}: {:?}",
                reply.body
            );
            continue;
        }
        assert_eq!(
            reply.error_kind(),
            *want,
            "{subject} {:?} -> {:?}",
            String::from_utf8_lossy(payload),
            reply.body
        );
    }
    // The kinds the client sees match, too.
    let err = owner.lookup("ghost").await.unwrap_err();
    assert_eq!(err.kind(), Some(ErrorKind::NotFound));

    // Still serving, state untouched.
    assert_eq!(
        owner.lookup("owner").await.unwrap().live_goals,
        vec![owned_goal.id()]
    );
    // Garbage published with no reply subject is dropped without a crash.
    client
        .publish("agent.registry.register.x", "{garbage".into())
        .await
        .unwrap();
    client.flush().await.unwrap();
    assert!(owner.peers().await.is_ok());

    // Errors are counted by kind in the micro stats.
    let stats = client
        .request("$SRV.STATS.directory", "".into())
        .await
        .unwrap();
    let stats: serde_json::Value = serde_json::from_slice(&stats.payload).unwrap();
    let register = stats["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "register")
        .unwrap();
    assert!(
        register["data"]["errors_by_kind"]["bad_request"]
            .as_u64()
            .unwrap()
            >= 6
    );
}

#[tokio::test]
async fn micro_discovery_lists_every_endpoint() {
    let nats = NatsServer::start().await;
    let _dir = start_directory(&nats.url(), DirectoryConfig::default()).await;
    let client = nats.client().await;
    let ping = client
        .request("$SRV.PING.directory", "".into())
        .await
        .unwrap();
    let ping: serde_json::Value = serde_json::from_slice(&ping.payload).unwrap();
    assert_eq!(ping["name"], "directory");
    let info = client
        .request("$SRV.INFO.directory", "".into())
        .await
        .unwrap();
    let info: serde_json::Value = serde_json::from_slice(&info.payload).unwrap();
    let subjects: BTreeSet<String> = info["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["subject"].as_str().unwrap().to_owned())
        .collect();
    let mut want: BTreeSet<String> = RegistryOp::ALL
        .iter()
        .map(|op| op.endpoint_subject())
        .collect();
    // The service-only endpoints: task load (from task-lifecycle) and skill routing.
    want.insert(format!(
        "{}.>",
        switchboard_proto::subject::REGISTRY_TASKS_PREFIX
    ));
    want.insert(format!(
        "{}.>",
        switchboard_proto::subject::REGISTRY_ROUTE_PREFIX
    ));
    assert_eq!(subjects, want);
    assert!(
        info["endpoints"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["queue_group"] == "directory")
    );
}

#[tokio::test]
async fn deregister_stops_the_heartbeat_and_register_resumes_it() {
    let nats = NatsServer::start().await;
    let _dir = start_directory(&nats.url(), fast_offline(2_000)).await;
    let agent = agent_with(&nats.url(), card("leaver"), Duration::from_millis(50)).await;
    agent.deregister().await.unwrap();
    // A real wait: many heartbeat intervals later it is still offline: the loop stopped.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        agent.lookup("leaver").await.unwrap().status,
        AgentStatus::Offline
    );
    assert!(
        stored_events(agent.nats(), "agent.registry.events.status.leaver")
            .await
            .is_empty()
    );
    agent.register().await.unwrap();
    assert_eq!(
        agent.lookup("leaver").await.unwrap().status,
        AgentStatus::Idle
    );
}

#[tokio::test]
async fn two_agents_racing_for_one_goal_id_never_both_win() {
    let nats = NatsServer::start().await;
    // 20 races: room for every goal one agent might win (the per-agent cap is another test's).
    let config = DirectoryConfig {
        max_goals_per_agent: 64,
        ..DirectoryConfig::default()
    };
    let _dir = start_directory(&nats.url(), config).await;
    let a = agent_with(&nats.url(), card("racer-a"), LONG).await;
    let b = agent_with(&nats.url(), card("racer-b"), LONG).await;
    for _ in 0..20 {
        let goal_id = GoalId::new();
        let request = GoalOpenRequest {
            goal_id: Some(goal_id),
            name: None,
            kind: None,
            overflow: None,
        };
        let (ra, rb) = tokio::join!(a.open_goal_with(request.clone()), b.open_goal_with(request));
        let loser = match (ra, rb) {
            (Ok(_), Err(err)) | (Err(err), Ok(_)) => err,
            (Ok(_), Ok(_)) => panic!("both agents own {goal_id}"),
            (Err(a), Err(b)) => panic!("nobody owns {goal_id}: {a} / {b}"),
        };
        assert_eq!(loser.kind(), Some(ErrorKind::Conflict));
    }
}

/// Migration from v1: when a directory starts, a goal still read through a v1 durable consumer
/// gets a cursor owned by the goal's agent at the consumer's ack floor (what was read is not
/// handed out again), and the consumer is deleted; anyone else is refused the goal id.
#[tokio::test]
async fn a_directory_replaces_v1_goal_consumers_with_cursors_at_their_ack_floor() {
    use jetstream::consumer::{AckPolicy, pull};
    let nats = NatsServer::start().await;
    let js = jetstream::new(nats.client().await);
    let goal_id = GoalId::new();
    let closed_goal = GoalId::new();
    // What v1 left behind: three messages and a live goal of `owner`, read through a consumer
    // that acked two; and a consumer of a goal that is not live any more.
    let jetstream_config = switchboard_runtime::RuntimeConfig::default().jetstream;
    js.create_stream(switchboard_runtime::resources::inbox_stream(
        &jetstream_config,
    ))
    .await
    .unwrap();
    let goals = js
        .create_key_value(switchboard_runtime::resources::goals_bucket(
            &jetstream_config,
        ))
        .await
        .unwrap();
    let owner_id = AgentId::parse("owner").unwrap();
    let record = switchboard_proto::GoalRecord {
        goal_id,
        agent_id: owner_id.clone(),
        kind: GoalKind::Daemon,
        opened_at: switchboard_proto::timestamp::now(),
    };
    goals
        .put(
            switchboard_proto::registry::goal_key(&owner_id, &goal_id),
            serde_json::to_vec(&record).unwrap().into(),
        )
        .await
        .unwrap();
    let stream = js.get_stream(INBOX_STREAM).await.unwrap();
    for n in 1..=3 {
        let message = InboxMessage::new(
            AgentId::parse("sender").unwrap(),
            GoalId::new(),
            owner_id.clone(),
            format!("v1 message {n}"),
        );
        js.publish(
            subject::inbox(&goal_id),
            serde_json::to_vec(&message).unwrap().into(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    }
    for goal in [goal_id, closed_goal] {
        stream
            .create_consumer(pull::Config {
                durable_name: Some(inbox_consumer(&goal)),
                filter_subject: subject::inbox(&goal),
                ack_policy: AckPolicy::Explicit,
                metadata: [(CONSUMER_META_AGENT.to_owned(), "owner".to_owned())].into(),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    let consumer: jetstream::consumer::PullConsumer = stream
        .get_consumer(&inbox_consumer(&goal_id))
        .await
        .unwrap();
    let mut batch = consumer.fetch().max_messages(2).messages().await.unwrap();
    while let Some(message) = futures::StreamExt::next(&mut batch).await {
        message.unwrap().double_ack().await.unwrap();
    }

    let _dir = start_directory(&nats.url(), DirectoryConfig::default()).await;
    let _inbox = start_fanout(&nats.url(), Default::default()).await;
    let mut stream = js.get_stream(INBOX_STREAM).await.unwrap();
    assert_eq!(
        stream.info().await.unwrap().state.consumer_count,
        0,
        "every v1 goal consumer deleted"
    );
    let owner = agent_with(&nats.url(), card("owner"), LONG).await;
    let other = agent_with(&nats.url(), card("other"), LONG).await;
    let request = GoalOpenRequest {
        goal_id: Some(goal_id),
        name: None,
        kind: None,
        overflow: None,
    };
    let refused = other.open_goal_with(request.clone()).await.unwrap_err();
    assert_eq!(refused.kind(), Some(ErrorKind::Conflict));
    let reopened = owner.open_goal_with(request).await.unwrap();
    let unread = reopened.drain().await.unwrap();
    let bodies: Vec<&str> = unread.iter().map(|m| m.body.as_str()).collect();
    assert_eq!(bodies, ["v1 message 3"], "read from the ack floor on");
}

#[tokio::test]
async fn a_half_finished_close_can_be_retried() {
    let nats = NatsServer::start().await;
    let _dir = start_directory(&nats.url(), DirectoryConfig::default()).await;
    let agent = agent_with(&nats.url(), card("closer"), LONG).await;
    let goal = agent.open_goal().await.unwrap();
    let js = jetstream::new(agent.nats().clone());
    publish_inbox(&js, &agent, goal.id(), "left behind").await;
    // Simulate a close that forgot the goal and then failed: the record is gone, the
    // cursor and the message are not.
    let goals = js
        .get_key_value(switchboard_proto::GOALS_BUCKET)
        .await
        .unwrap();
    goals
        .delete(switchboard_proto::registry::goal_key(
            agent.id(),
            &goal.id(),
        ))
        .await
        .unwrap();
    let closed = agent.close_goal(goal.id()).await.unwrap();
    assert_eq!(closed.purged, 1);
    // Now it is really gone.
    let err = agent.close_goal(goal.id()).await.unwrap_err();
    assert_eq!(err.kind(), Some(ErrorKind::NotFound));
}

#[tokio::test]
async fn skill_routing_spreads_work_and_passes_over_an_agent_at_its_cap() {
    let fabric = switchboard_tests::Fabric::start().await;
    let url = fabric.url();
    let translator = |id: &str, cap: u32| {
        let mut card = card(id);
        card.capabilities = vec!["translate".into()];
        card.max_concurrent_tasks = cap;
        card
    };
    let mut goals = Vec::new();
    let mut agents = Vec::new();
    for n in 1..=4 {
        let agent = agent_with(&url, translator(&format!("translator-{n}"), 3), LONG).await;
        goals.push(agent.open_goal().await.unwrap().id());
        agents.push(agent);
    }
    let full = agent_with(&url, translator("translator-full", 1), LONG).await;
    let _full_goal = full.open_goal().await.unwrap();
    let (boss, _boss_goal) = fabric.agent_with_goal("boss").await;
    // One translator takes a task and is at its cap (the directory marks it busy).
    let taken = boss
        .give_task("translator-full", "one at a time")
        .await
        .unwrap()
        .task
        .task_id;
    full.accept_task(taken).await.unwrap();
    assert_eventually!(Duration::from_secs(10), async {
        boss.lookup("translator-full")
            .await
            .is_ok_and(|found| found.status == AgentStatus::Busy)
    });

    // 100 tasks for whoever translates: the four below their cap share them evenly.
    let mut counts = std::collections::HashMap::<String, usize>::new();
    for i in 0..100 {
        let reply = boss
            .create_task(switchboard_proto::task::CreateTask {
                to: Some("skill:translate".into()),
                message: Some(format!("text {i}")),
                ..Default::default()
            })
            .await
            .unwrap();
        *counts.entry(reply.task.assignee.to_string()).or_default() += 1;
    }
    assert!(!counts.contains_key("translator-full"), "{counts:?}");
    for n in 1..=4 {
        let got = counts.get(&format!("translator-{n}")).copied().unwrap_or(0);
        assert!(
            (20..=30).contains(&got),
            "translator-{n} got {got}: {counts:?}"
        );
    }
    // A message and a call by skill go to one idle translator, named in the reply.
    let sent = boss
        .send(switchboard_proto::send::SendRequest {
            to: Some("skill:translate".into()),
            message: Some("bonjour".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let routed = sent.routed_to.expect("the report names the agent");
    assert!(routed.as_str().starts_with("translator-") && routed.as_str() != "translator-full");
    assert_eq!(sent.delivered_to.len(), 1);
    let parked = boss
        .call_parked("skill:translate", "hola?", Duration::from_secs(30))
        .await
        .unwrap();
    assert!(
        goals.contains(&parked.delivered_to[0]),
        "an idle translator's goal"
    );
    // Nobody fits: an unreachable reason, an error for a task.
    let none = boss.send_to_peer("skill:cook", "dinner?").await.unwrap();
    assert!(none.delivered_to.is_empty());
    assert!(
        none.unreachable_reasons[0].contains("no reachable agent has skill `cook`"),
        "{none:?}"
    );
    let refused = boss
        .create_task(switchboard_proto::task::CreateTask {
            to: Some("skill:cook".into()),
            message: Some("dinner".into()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.kind(), Some(ErrorKind::Unreachable), "{refused}");
    // list_peers by skill: the five translators, nobody else.
    let listed = boss
        .peers_page(&PeersRequest {
            skill: Some("translate".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let ids: Vec<&str> = listed.peers.iter().map(|p| p.agent_id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "translator-1",
            "translator-2",
            "translator-3",
            "translator-4",
            "translator-full"
        ]
    );
}

/// Issue 25: `overflow` on goal.open takes the two policies and nothing else.
#[tokio::test]
async fn goal_open_refuses_an_unknown_overflow_policy() {
    let nats = switchboard_testkit::NatsServer::start().await;
    let _dir = start_directory(&nats.url(), DirectoryConfig::default()).await;
    let client = nats.client().await;
    let _agent = agent_with(&nats.url(), card("mallory"), Duration::from_secs(3600)).await;
    for body in [
        r#"{"overflow":"drop_newest"}"#,
        r#"{"overflow":9223372036854775807}"#,
        "{\"overflow\":\"refuse\\r\\nX-Injected: 1\"}",
        r#"{"overflow":["refuse"]}"#,
    ] {
        let reply = raw(&client, "agent.registry.goal.open.mallory", body).await;
        assert_eq!(
            reply.error_kind(),
            "bad_request",
            "{body}: {:?}",
            reply.body
        );
    }
    let opened = raw(
        &client,
        "agent.registry.goal.open.mallory",
        r#"{"overflow":"refuse"}"#,
    )
    .await;
    assert!(opened.body["goal_id"].is_string(), "{:?}", opened.body);
}

/// Issue 26, item 7: a card is read by every agent, its LLM and its operator's terminal; the
/// directory takes terminal escape codes and other control characters out of its text.
#[tokio::test]
async fn a_cards_control_characters_never_reach_another_agent() {
    let nats = NatsServer::start().await;
    let _dir = start_directory(&nats.url(), DirectoryConfig::default()).await;
    let mut sly = card("sly");
    sly.description = "helpful\n\u{1b}]0;pwned\u{7}\u{1b}[2Jagent".into();
    sly.capabilities = vec!["trans\u{1b}[8mlate".into()];
    let _sly = agent_with(&nats.url(), sly, LONG).await;
    let reader = agent_with(&nats.url(), card("reader"), LONG).await;
    let looked = reader.lookup("sly").await.unwrap();
    assert_eq!(looked.card.description, "helpful\n]0;pwned[2Jagent");
    assert_eq!(looked.card.capabilities, ["trans[8mlate"]);
}

/// Issue 26, item 3: skills are granted, not claimed. With the operator's grants (what
/// `switchboard nats-config` writes from agents.toml) an agent whose card lists a skill it was
/// not granted gets none of its work; and the load routing weighs is the task service's count,
/// so an agent that says it is idle while it holds tasks is not handed all the work.
#[tokio::test]
async fn skill_work_goes_by_grant_and_by_the_task_services_count() {
    let dir = tempfile::tempdir().unwrap();
    let grants = dir.path().join("skill-grants.json");
    std::fs::write(
        &grants,
        r#"{"honest": ["translate"], "loaded": ["translate"], "claimer": [], "boss": []}"#,
    )
    .unwrap();
    let fabric = switchboard_tests::Fabric::start_directory_with(DirectoryConfig {
        skill_grants_file: Some(grants),
        ..DirectoryConfig::default()
    })
    .await;
    let url = fabric.url();
    let translator = |id: &str| {
        let mut card = card(id);
        card.capabilities = vec!["translate".into()];
        card.max_concurrent_tasks = 5;
        card
    };
    let claimer = agent_with(&url, translator("claimer"), LONG).await;
    let _claimer_goal = claimer.open_goal().await.unwrap();
    let honest = agent_with(&url, translator("honest"), LONG).await;
    let _honest_goal = honest.open_goal().await.unwrap();
    let (boss, _boss_goal) = fabric.agent_with_goal("boss").await;
    let routed = |n: usize| {
        let boss = &boss;
        async move {
            let mut to = Vec::new();
            for i in 0..n {
                let sent = boss
                    .send(switchboard_proto::send::SendRequest {
                        to: Some("skill:translate".into()),
                        message: Some(format!("text {i}")),
                        ..Default::default()
                    })
                    .await
                    .unwrap();
                to.push(sent.routed_to.expect("routed").to_string());
            }
            to
        }
    };
    assert!(
        routed(10).await.iter().all(|to| to == "honest"),
        "a skill listed on a card but not granted got work"
    );

    // "loaded" (granted) takes 2 tasks, then says by heartbeat it has none and is idle.
    let loaded = agent_with(&url, translator("loaded"), LONG).await;
    let _loaded_goal = loaded.open_goal().await.unwrap();
    for n in 0..2 {
        let task = boss
            .give_task("loaded", &format!("work {n}"))
            .await
            .unwrap()
            .task
            .task_id;
        loaded.accept_task(task).await.unwrap();
    }
    assert_eventually!(Duration::from_secs(10), async {
        boss.lookup("loaded")
            .await
            .is_ok_and(|found| found.current_tasks.len() == 2)
    });
    loaded
        .heartbeat(&HeartbeatRequest {
            status: Some(AgentStatus::Idle),
            current_tasks: Some(Vec::new()),
        })
        .await
        .unwrap();
    assert!(
        routed(10).await.iter().all(|to| to == "honest"),
        "the agent holding 2 tasks got work by saying it had none"
    );
}
