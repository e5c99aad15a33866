//! Each of the five services runs as two real processes (queue-group replicas). One replica of
//! each, in turn, is stopped with SIGTERM and restarted, then the same with SIGKILL, while 10
//! agents exchange messages, calls and tasks.
//!
//! Asserted: at least 2,000 acknowledged sends and 200 calls and tasks; none lost or delivered
//! again after a confirmed ack; every call resolved exactly once (one outcome for the caller,
//! one `answered` or `expired` event, none left open); every task ends exactly once; the audit
//! recorded every stored inbox message and event exactly once (record count = accepted count).
//!
//! The services are the workspace's own binaries (`target/<profile>/<service>`), which
//! `cargo test --workspace` builds.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

// Longer than 600 lines because one run's traffic is checked every way at once (loss, doubles,
// calls, tasks, audit), and the checks share that run's records.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use switchboard_client::{Agent, AgentOptions, Goal, TaskOutcome};
use switchboard_proto::{MessageKind, TaskState};
use switchboard_testkit::NatsServer;
use switchboard_testkit::process::ServiceProcess;
use switchboard_tests::{card, service_bin};
use tokio::time::Instant;
use uuid::Uuid;

const AGENTS: usize = 10;
/// Acknowledged sends each agent makes at least: 2,000 in all.
const SENDS_PER_AGENT: usize = 200;
const SERVICES: [&str; 5] = [
    "directory",
    "inbox-fanout",
    "reply-correlator",
    "task-lifecycle",
    "audit",
];
/// Quick audit takeover when its writer dies (the lease and redelivery).
const SERVICE_ENV: &[(&str, &str)] = &[
    ("SWITCHBOARD_AUDIT__ACK_WAIT_MS", "1000"),
    ("SWITCHBOARD_AUDIT__LEASE_TTL_MS", "1000"),
    ("SWITCHBOARD_AUDIT__CATCH_UP_INTERVAL_MS", "100"),
];

async fn start(service: &str, url: &str) -> ServiceProcess {
    ServiceProcess::start(&service_bin(service), service, url, SERVICE_ENV).await
}

/// What one agent's reader saw.
#[derive(Default)]
struct Read {
    /// Plain messages by id, with how often each was delivered.
    messages: BTreeMap<Uuid, usize>,
    doubled: Vec<Uuid>,
    answered: usize,
    tasks_done: usize,
    /// Messages this agent sent that a full goal removed unread, as its expiry notices said
    /// (in this agent's own goal, the one it sends from).
    told_expired: BTreeSet<Uuid>,
    /// The longest the reader spent on one message (answering, working a task, acking), and
    /// on what: a reader held up for seconds falls behind its goal's 64-message inbox.
    slowest: (Duration, &'static str),
}

/// What each reader must have read before it stops: set once the senders are done.
type Expected = tokio::sync::watch::Receiver<Option<Arc<Vec<BTreeSet<Uuid>>>>>;

/// Reads `goal` (reader `index`): acks everything, answers call requests, and works every task
/// it is given (accept, start, complete) — until every message acknowledged to it has arrived
/// and 2 s passed quietly, or 30 s after the senders stopped.
async fn reader(agent: Arc<Agent>, goal: Goal, index: usize, mut expected: Expected) -> Read {
    let mut read = Read::default();
    let mut confirmed = BTreeSet::new();
    let mut quiet_since = Instant::now();
    let mut deadline = None;
    loop {
        let want = expected.borrow_and_update().clone();
        if let Some(want) = want {
            let deadline = *deadline.get_or_insert(Instant::now() + Duration::from_secs(30));
            let all_in = want[index].iter().all(|id| read.messages.contains_key(id));
            if (all_in && quiet_since.elapsed() > Duration::from_secs(2))
                || Instant::now() > deadline
            {
                return read;
            }
        }
        let Some(delivery) =
            switchboard_tests::read_or_pause(&goal, Duration::from_millis(500)).await
        else {
            continue;
        };
        quiet_since = Instant::now();
        let message = delivery.message.clone();
        let step = match message.kind {
            MessageKind::Request if message.expects_reply => "reply",
            MessageKind::Task => "task",
            _ => "ack",
        };
        match message.kind {
            MessageKind::Request if message.expects_reply => {
                if let Some(cid) = message.correlation_id
                    && agent.reply(cid, "answer").await.is_ok()
                {
                    read.answered += 1;
                }
            }
            MessageKind::Task => {
                if let Some(task) = message.task.as_ref()
                    && task.state == TaskState::Submitted
                {
                    let id = task.id;
                    let worked = async {
                        agent.accept_task(id).await?;
                        agent.start_task(id).await?;
                        agent.complete_task(id, TaskOutcome::text("done")).await
                    };
                    if worked.await.is_ok() {
                        read.tasks_done += 1;
                    }
                }
            }
            MessageKind::Notify
                if message.metadata.get("reason").and_then(|r| r.as_str())
                    == Some("expired_unread") =>
            {
                read.told_expired.extend(message.in_reply_to);
            }
            MessageKind::Message => {
                let id = message.id.unwrap();
                if confirmed.contains(&id) {
                    read.doubled.push(id);
                }
                *read.messages.entry(id).or_default() += 1;
            }
            _ => {}
        }
        if delivery.ack().await.is_ok()
            && let Some(id) = message.id
        {
            confirmed.insert(id);
        }
        let took = quiet_since.elapsed();
        if took > read.slowest.0 {
            read.slowest = (took, step);
        }
    }
}

/// What one agent's sender did.
#[derive(Default)]
struct Sent {
    acknowledged: Vec<(usize, Uuid)>,
    not_acknowledged: Vec<String>,
    calls: usize,
    answers: usize,
    call_errors: BTreeMap<String, usize>,
    /// (requester, task).
    tasks: Vec<(usize, Uuid)>,
    task_errors: Vec<String>,
}

async fn sender(i: usize, agent: Arc<Agent>, stop: Arc<AtomicBool>) -> Sent {
    let mut sent = Sent::default();
    let mut n = 0usize;
    // Until the faults are over and this sender has its share of the 2,000 acknowledged sends
    // (a count, not a time: a loaded machine takes longer, it does not send less).
    while (!stop.load(Ordering::Relaxed) || sent.acknowledged.len() < SENDS_PER_AGENT)
        && n < SENDS_PER_AGENT * 4
    {
        let to = (i + 1) % AGENTS;
        match agent
            .send_to_peer(&format!("agent-{to}"), &format!("{i}→{to} #{n}"))
            .await
        {
            Ok(report) if !report.delivered_to.is_empty() => {
                sent.acknowledged.push((to, report.message_id.unwrap()));
            }
            Ok(report) => sent
                .not_acknowledged
                .push(format!("{:?}", report.unreachable_reasons)),
            Err(err) => sent.not_acknowledged.push(err.to_string()),
        }
        if n.is_multiple_of(8) {
            sent.calls += 1;
            let callee = format!("agent-{}", (i + 3) % AGENTS);
            match agent
                .call(&callee, "question", Duration::from_secs(5))
                .await
            {
                Ok(_) => sent.answers += 1,
                Err(err) => {
                    let kind = err
                        .kind()
                        .map_or_else(|| "transport".to_owned(), |kind| kind.to_string());
                    *sent.call_errors.entry(kind).or_default() += 1;
                }
            }
        }
        if n % 8 == 4 {
            match agent
                .give_task(&format!("agent-{}", (i + 5) % AGENTS), "work")
                .await
            {
                Ok(reply) => sent.tasks.push((i, reply.task.task_id)),
                Err(err) => sent.task_errors.push(err.to_string()),
            }
        }
        n += 1;
        // A real wait: each sender is paced at one round per 80 ms.
        tokio::time::sleep(Duration::from_millis(80)).await;
    }
    sent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_service_stopped_and_killed_in_turn_loses_doubles_and_leaves_nothing_open() {
    let nats = NatsServer::start().await;
    let url = nats.url();
    let mut replicas: Vec<[Option<ServiceProcess>; 2]> = Vec::new();
    for service in SERVICES {
        replicas.push([
            Some(start(service, &url).await),
            Some(start(service, &url).await),
        ]);
    }

    let stop = Arc::new(AtomicBool::new(false));
    let (expected_tx, expected_rx) = tokio::sync::watch::channel(None);
    let mut agents = Vec::new();
    let mut readers = Vec::new();
    for i in 0..AGENTS {
        let agent_card = card(&format!("agent-{i}"));
        let client = switchboard_client::agent_connect_options(&agent_card.agent_id)
            .connect(url.as_str())
            .await
            .unwrap();
        let options = AgentOptions {
            request_timeout: Duration::from_secs(5),
            ..AgentOptions::default()
        };
        let agent = Arc::new(
            Agent::connect_with(client, agent_card, options)
                .await
                .unwrap(),
        );
        let goal = agent.open_goal().await.unwrap();
        readers.push(tokio::spawn(reader(
            Arc::clone(&agent),
            goal,
            i,
            expected_rx.clone(),
        )));
        agents.push(agent);
    }
    let senders: Vec<_> = agents
        .iter()
        .enumerate()
        .map(|(i, agent)| tokio::spawn(sender(i, Arc::clone(agent), Arc::clone(&stop))))
        .collect();

    // One replica of each service in turn: SIGTERM, then (second round) SIGKILL.
    // A real wait: traffic flows for a while before the first fault.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for signal in ["TERM", "KILL"] {
        for (s, service) in SERVICES.iter().enumerate() {
            let victim = replicas[s][0].take().unwrap();
            let status = victim.signal(signal).await;
            println!("SIG{signal} {service}: exited {status:?}");
            // A real wait: one replica fewer for a second of traffic.
            tokio::time::sleep(Duration::from_secs(1)).await;
            replicas[s][0] = Some(start(service, &url).await);
            // A real wait: two seconds of traffic before the next fault.
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }
    // A real wait: traffic after the last fault, before the senders stop.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);

    let mut sent = Vec::new();
    for sender in senders {
        sent.push(sender.await.unwrap());
    }
    let mut expected = vec![BTreeSet::new(); AGENTS];
    for s in &sent {
        for (to, id) in &s.acknowledged {
            expected[*to].insert(*id);
        }
    }
    expected_tx.send(Some(Arc::new(expected))).unwrap();
    let mut read = Vec::new();
    for reader in readers {
        read.push(reader.await.unwrap());
    }

    // Messages: none lost, none doubled.
    let acknowledged: usize = sent.iter().map(|s| s.acknowledged.len()).sum();
    let not_acknowledged: Vec<&String> = sent.iter().flat_map(|s| &s.not_acknowledged).collect();
    // A message a full goal removed unread is not lost when its sender was told so.
    let told: BTreeSet<Uuid> = read.iter().flat_map(|r| r.told_expired.clone()).collect();
    let mut lost = Vec::new();
    let mut removed_and_told = 0;
    for s in &sent {
        for (to, id) in &s.acknowledged {
            if read[*to].messages.contains_key(id) {
                continue;
            }
            if told.contains(id) {
                removed_and_told += 1;
            } else {
                lost.push(*id);
            }
        }
    }
    let doubled: Vec<Uuid> = read.iter().flat_map(|r| r.doubled.clone()).collect();

    // Calls: one outcome each (by construction of the client), and exactly one terminal event
    // per opened call, none left open.
    let calls: usize = sent.iter().map(|s| s.calls).sum();
    let answers: usize = sent.iter().map(|s| s.answers).sum();
    let mut call_errors: BTreeMap<String, usize> = BTreeMap::new();
    for s in &sent {
        for (kind, n) in &s.call_errors {
            *call_errors.entry(kind.clone()).or_default() += n;
        }
    }
    let client = nats.client().await;
    // A call whose caller gave up is expired by the correlator's sweep shortly after its
    // deadline: wait (bounded) until every opened call has its one ending. A call is opened
    // when its request message is stored (the audit trail records it; there is no `opened`
    // event).
    let resolution = std::cell::RefCell::new((BTreeSet::new(), BTreeMap::new()));
    let _resolved = switchboard_testkit::eventually(Duration::from_secs(30), || async {
        let mut opened = BTreeSet::new();
        let mut ended: BTreeMap<String, usize> = BTreeMap::new();
        for entry in switchboard_tests::audit_records(&client).await {
            if entry.record.kind == "request"
                && let Some(cid) = entry.record.correlation_id
            {
                opened.insert(cid.to_string());
            }
        }
        let events: Vec<serde_json::Value> =
            switchboard_tests::stored_json(&client, "agent.calls.events.>").await;
        for event in &events {
            let cid = event["correlation_id"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            if matches!(
                event["event"].as_str().unwrap_or_default(),
                "answered" | "expired"
            ) {
                *ended.entry(cid).or_default() += 1;
            }
        }
        let all = opened.iter().all(|cid| ended.contains_key(cid));
        *resolution.borrow_mut() = (opened, ended);
        all
    })
    .await;
    let (opened, ended) = resolution.into_inner();
    let unresolved: Vec<&String> = opened
        .iter()
        .filter(|cid| !ended.contains_key(*cid))
        .collect();
    let resolved_twice: Vec<(&String, &usize)> = ended.iter().filter(|(_, n)| **n > 1).collect();
    for agent in &agents {
        let pending = agent.pending_calls().await.unwrap();
        assert!(
            pending.outgoing.is_empty(),
            "{}: calls left open: {:?}",
            agent.id(),
            pending.outgoing
        );
    }

    // Tasks: each created task ended, once.
    let tasks: Vec<(usize, Uuid)> = sent.iter().flat_map(|s| s.tasks.clone()).collect();
    let task_errors: Vec<&String> = sent.iter().flat_map(|s| &s.task_errors).collect();
    let mut not_ended = Vec::new();
    for (requester, task) in &tasks {
        match agents[*requester].get_task(*task).await {
            Ok(record) if record.state.is_terminal() => {
                let terminal = record
                    .history
                    .iter()
                    .filter(|step| step.to.is_terminal())
                    .count();
                assert_eq!(terminal, 1, "task {task} ended {terminal} times");
            }
            Ok(record) => not_ended.push(format!("{task}: {:?}", record.state)),
            Err(err) => not_ended.push(format!("{task}: {err}")),
        }
    }

    // The audit: every stored inbox message and event recorded exactly once.
    let want = switchboard_tests::stored_ever(&client).await;
    // The records as they were when the last one came in (not what later traffic added).
    let audited = std::cell::RefCell::new(BTreeMap::new());
    let _complete = switchboard_testkit::eventually(Duration::from_secs(30), || async {
        let mut have = BTreeMap::new();
        for entry in switchboard_tests::audit_records(&client).await {
            *have.entry(entry.record.id.clone()).or_insert(0usize) += 1;
        }
        let all = want.iter().all(|id| have.contains_key(id));
        *audited.borrow_mut() = have;
        all
    })
    .await;
    let have = audited.into_inner();
    let missing: Vec<&String> = want.iter().filter(|id| !have.contains_key(*id)).collect();
    let recorded_twice: Vec<(&String, &usize)> = have.iter().filter(|(_, n)| **n > 1).collect();
    let extra: Vec<&String> = have
        .keys()
        .filter(|id| !want.contains(*id) && !id.starts_with(switchboard_proto::AUDIT_STREAM))
        .collect();

    println!(
        "five services, two replicas each, one of each stopped (SIGTERM) then killed (SIGKILL) in turn:"
    );
    println!(
        "  sends acknowledged {acknowledged}, not acknowledged {}, removed unread (sender told) \
         {removed_and_told}, lost {}, doubled {}",
        not_acknowledged.len(),
        lost.len(),
        doubled.len()
    );
    println!(
        "  calls {calls}: answered {answers}, errors {call_errors:?}; opened {} (requests stored), unresolved {}, resolved twice {}",
        opened.len(),
        unresolved.len(),
        resolved_twice.len()
    );
    let slowest = read
        .iter()
        .map(|r| r.slowest)
        .max_by_key(|(took, _)| *took)
        .unwrap_or_default();
    println!("  slowest reader step: {:?} ({})", slowest.0, slowest.1);
    println!(
        "  tasks created {}, refused {}, not ended {}",
        tasks.len(),
        task_errors.len(),
        not_ended.len()
    );
    println!(
        "  audit: {} source messages, {} recorded, missing {}, twice {}, extra {}",
        want.len(),
        have.len(),
        missing.len(),
        recorded_twice.len(),
        extra.len()
    );
    for line in not_acknowledged.iter().take(5) {
        println!("  not acknowledged: {line}");
    }
    for line in task_errors.iter().take(5) {
        println!("  task refused: {line}");
    }

    assert!(
        acknowledged >= AGENTS * SENDS_PER_AGENT,
        "≥ 2,000 acknowledged sends, got {acknowledged}"
    );
    assert!(
        calls + tasks.len() >= 200,
        "≥ 200 calls and tasks, got {}",
        calls + tasks.len()
    );
    assert!(
        lost.is_empty(),
        "acknowledged but lost: {:?}",
        &lost[..lost.len().min(5)]
    );
    assert!(
        doubled.is_empty(),
        "delivered again after a confirmed ack: {doubled:?}"
    );
    assert!(
        unresolved.is_empty(),
        "calls opened but never answered or expired: {unresolved:?}"
    );
    assert!(
        resolved_twice.is_empty(),
        "calls resolved twice: {resolved_twice:?}"
    );
    assert!(
        not_ended.is_empty(),
        "tasks that never ended: {not_ended:?}"
    );
    assert!(
        missing.is_empty(),
        "stored but not audited: {:?}",
        &missing[..missing.len().min(5)]
    );
    assert!(
        recorded_twice.is_empty(),
        "audited twice: {recorded_twice:?}"
    );
    assert!(extra.is_empty(), "audited but never stored: {extra:?}");
    for pair in replicas {
        for replica in pair.into_iter().flatten() {
            replica.signal("TERM").await;
        }
    }
}

/// Issue 25: a call retried with the same `correlation_id` after the correlator replica
/// holding it was killed (SIGKILL) is one call: the callee gets one request, the caller one
/// answer, on the retry a new replica took.
#[tokio::test]
async fn a_call_retried_by_its_id_after_its_replica_was_killed_is_one_call() {
    use switchboard_proto::call::{CallAnswer, CallRequest};
    let nats = NatsServer::start().await;
    let url = nats.url();
    let _directory = start("directory", &url).await;
    let _fanout = start("inbox-fanout", &url).await;
    let first = start("reply-correlator", &url).await;
    let connect = |id: &'static str| {
        let url = url.clone();
        async move {
            let card = card(id);
            let client = switchboard_client::agent_connect_options(&card.agent_id)
                .connect(url.as_str())
                .await
                .unwrap();
            Agent::connect_with(client, card, AgentOptions::default())
                .await
                .unwrap()
        }
    };
    let caller = connect("caller").await;
    let callee = connect("callee").await;
    let callee_goal = callee.open_goal().await.unwrap();
    let id = switchboard_proto::new_id();
    let body = CallRequest {
        to: Some("callee".into()),
        message: Some("one question".into()),
        timeout_ms: Some(20_000),
        correlation_id: Some(id),
        ..CallRequest::default()
    };
    let subject = switchboard_proto::subject::call(caller.id());
    let payload = serde_json::to_vec(&body).unwrap();
    // The first attempt: its replica is killed while it holds the call.
    let lost = tokio::spawn({
        let (nats, subject, payload) = (caller.nats().clone(), subject.clone(), payload.clone());
        async move { nats.request(subject, payload.into()).await }
    });
    assert!(
        switchboard_testkit::eventually(Duration::from_secs(10), || async {
            callee_goal.waiting().await.unwrap() == 1
        })
        .await,
        "the request reached the callee"
    );
    first.signal("KILL").await;
    let _second = start("reply-correlator", &url).await;
    // The retry, same id: the new replica joins the open call.
    let retry = tokio::spawn({
        let nats = caller.nats().clone();
        async move { nats.request(subject, payload.into()).await }
    });
    // A real wait: the retry reaches the new replica, and a second request (which must not
    // appear) would be stored by now.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let page = callee_goal.fetch(64, Duration::ZERO, None).await.unwrap();
    assert_eq!(page.messages.len(), 1, "one request, not one per attempt");
    let request = &page.messages[0].message;
    // The call's id is the caller's chosen one scoped to it (docs/protocol.md §9, "Call ids").
    let call_id = switchboard_proto::call::scoped_call_id(caller.id(), id);
    assert_eq!(request.correlation_id, Some(call_id));
    callee.reply(call_id, "one answer").await.unwrap();
    let reply = tokio::time::timeout(Duration::from_secs(10), retry)
        .await
        .expect("the retry is answered")
        .unwrap()
        .unwrap();
    let answer: CallAnswer = serde_json::from_slice(&reply.payload)
        .unwrap_or_else(|err| panic!("{err}: {:?}", String::from_utf8_lossy(&reply.payload)));
    assert_eq!(answer.correlation_id, call_id);
    assert_eq!(answer.body, "one answer");
    // The killed replica's caller request got nothing (its replica is gone).
    assert!(
        tokio::time::timeout(Duration::from_millis(200), lost)
            .await
            .ok()
            .is_none_or(|outcome| outcome.unwrap().is_err()),
        "the killed replica did not answer"
    );
    // And a retry after the answer is told the same answer, not a second call.
    let again: CallAnswer = caller.call_with(body).await.unwrap();
    assert_eq!(again.body, "one answer");
    let page = callee_goal
        .fetch(64, Duration::ZERO, Some(page.messages[0].seq))
        .await
        .unwrap();
    assert!(page.messages.is_empty(), "no second request: {page:?}");
}
