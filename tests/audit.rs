//! audit end to end against a real nats-server: a scripted conversation read back as one
//! thread, history filters and paging, pending requests, export against the stream, a killed
//! and restarted audit service (nothing lost or doubled), an index rebuilt from the stream,
//! verify finding a tampered record, and refusals in the trail.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

// Longer than 600 lines because it holds one scenario per test of the audit trail; every
// integration file is its own test binary (a link of all five services), so a topic gets one file
// however many tests it has.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream;
use switchboard_client::{
    TaskOutcome, audit_export, audit_history, audit_pending, audit_thread, audit_verify,
};
use switchboard_proto::audit::{
    AuditEntry, AuditRecord, AuditRecords, HEADER_AUDIT_HASH, HistoryRequest, ThreadRequest,
};
use switchboard_proto::call::CallRequest;
use switchboard_proto::send::SendRequest;
use switchboard_proto::task::CreateTask;
use switchboard_proto::{AUDIT_STREAM, ErrorKind};
use switchboard_testkit::{assert_eventually, eventually};
use switchboard_tests::{Fabric, fast_audit, next, start_audit};

const WAIT: Duration = Duration::from_secs(20);

/// The source messages that have no record yet.
async fn unrecorded(nats: &async_nats::Client) -> Vec<String> {
    let want = switchboard_tests::source_ids(nats).await;
    let have: BTreeSet<String> = switchboard_tests::audit_records(nats)
        .await
        .into_iter()
        .map(|e| e.record.id)
        .collect();
    want.difference(&have).cloned().collect()
}

/// Waits until every source message has its record.
async fn caught_up(nats: &async_nats::Client) {
    assert_eventually!(
        WAIT,
        async { unrecorded(nats).await.is_empty() },
        "the audit did not record every source message: {:?}",
        unrecorded(nats).await
    );
}

/// The ids recorded, each checked to have exactly one record.
fn recorded_once(records: &[AuditEntry]) -> BTreeSet<String> {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for entry in records {
        *counts.entry(entry.record.id.as_str()).or_default() += 1;
    }
    let doubled: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(doubled.is_empty(), "records written twice: {doubled:?}");
    counts.keys().map(|k| (*k).to_owned()).collect()
}

fn kinds(records: &[AuditEntry]) -> Vec<String> {
    records.iter().map(|e| e.record.kind.clone()).collect()
}

fn position(records: &[AuditEntry], what: impl Fn(&AuditRecord) -> bool) -> usize {
    records
        .iter()
        .position(|e| what(&e.record))
        .unwrap_or_else(|| panic!("not in the thread: {:?}", kinds(records)))
}

/// A thread longer than one reply comes in pages: the first says `truncated` and
/// `next_cursor`, the next pages carry on without a gap or a repeat, and the client reads them
/// all; a cursor past the end answers nothing.
#[tokio::test]
async fn a_thread_longer_than_one_reply_comes_in_pages() {
    let fabric = Fabric::start().await;
    let (_audit, _trail) = start_audit(&fabric.url(), fast_audit()).await;
    let nats = fabric.nats.client().await;
    let (talker, _talker_goal) = fabric.agent_with_goal("talker").await;
    let (_listener, listener_goal) = fabric.agent_with_goal("listener").await;
    let first = talker
        .send_to_peer("listener", "the first")
        .await
        .unwrap()
        .message_id
        .unwrap();
    // 80 answers of 16 KiB each: about 1.3 MiB, past one reply's budget.
    let big = "x".repeat(16 * 1024);
    for _ in 0..80 {
        talker
            .send(SendRequest {
                to: Some("listener".into()),
                message: Some(big.clone()),
                in_reply_to: Some(first),
                ..SendRequest::default()
            })
            .await
            .unwrap();
    }
    listener_goal.drain().await.unwrap();
    caught_up(&nats).await;
    let query = ThreadRequest {
        message_id: Some(first),
        ..ThreadRequest::default()
    };
    let page: AuditRecords = switchboard_request::request::request_json(
        &nats,
        &switchboard_proto::audit::AuditOp::Thread.subject(),
        &query,
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    assert!(page.truncated);
    let mut cursor = page.next_cursor.expect("a cut thread says where to go on");
    assert_eq!(cursor as usize, page.records.len());
    let mut seqs: Vec<u64> = page.records.iter().map(|e| e.seq).collect();
    loop {
        let next: AuditRecords = switchboard_request::request::request_json(
            &nats,
            &switchboard_proto::audit::AuditOp::Thread.subject(),
            &ThreadRequest {
                cursor: Some(cursor),
                ..query.clone()
            },
            Duration::from_secs(10),
        )
        .await
        .unwrap();
        seqs.extend(next.records.iter().map(|e| e.seq));
        match next.next_cursor {
            Some(more) => cursor = more,
            None => break,
        }
    }
    let unique: BTreeSet<u64> = seqs.iter().copied().collect();
    assert_eq!(unique.len(), seqs.len(), "no record twice");
    assert_eq!(seqs.len(), 81, "the first message and its 80 answers");
    let whole = audit_thread(&nats, &query).await.unwrap();
    assert!(!whole.truncated);
    assert_eq!(
        whole.records.iter().map(|e| e.seq).collect::<Vec<_>>(),
        seqs
    );
    let past: AuditRecords = switchboard_request::request::request_json(
        &nats,
        &switchboard_proto::audit::AuditOp::Thread.subject(),
        &ThreadRequest {
            cursor: Some(u64::MAX),
            ..query.clone()
        },
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    assert!(past.records.is_empty() && past.next_cursor.is_none());
}

#[tokio::test]
async fn a_scripted_conversation_reads_back_as_one_thread_in_causal_order() {
    let fabric = Fabric::start().await;
    let (_audit, _trail) = start_audit(&fabric.url(), fast_audit()).await;
    let nats = fabric.nats.client().await;
    let (boss, boss_goal) = fabric.agent_with_goal("coordinator").await;
    let (researcher, researcher_goal) = fabric.agent_with_goal("researcher").await;
    let (writer, writer_goal) = fabric.agent_with_goal("writer").await;
    let (_bystander, _bg) = fabric.agent_with_goal("bystander").await;
    boss.send_to_peer("bystander", "unrelated").await.unwrap();

    // 1. A message, and a reply to it.
    let first = boss
        .send_to_peer("researcher", "find sources on JetStream")
        .await
        .unwrap()
        .message_id
        .unwrap();
    next(&researcher_goal).await;
    let ack = researcher
        .send(SendRequest {
            to: Some("coordinator".into()),
            message: Some("on it".into()),
            in_reply_to: Some(first),
            ..SendRequest::default()
        })
        .await
        .unwrap()
        .message_id
        .unwrap();
    next(&boss_goal).await;
    // 2. A task in reply to that, with a subtask for the writer.
    let task = boss
        .create_task(CreateTask {
            to: Some("researcher".into()),
            message: Some("write it up".into()),
            in_reply_to: Some(ack),
            ..CreateTask::default()
        })
        .await
        .unwrap()
        .task
        .task_id;
    researcher.accept_task(task).await.unwrap();
    researcher.start_task(task).await.unwrap();
    let sub = researcher
        .spawn_subtask(task, "writer", "draft the intro")
        .await
        .unwrap()
        .task;
    let handed = loop {
        let message = next(&writer_goal).await;
        if message.task.as_ref().is_some_and(|t| t.id == sub.task_id) {
            break message;
        }
    };
    writer.accept_task(sub.task_id).await.unwrap();
    writer.start_task(sub.task_id).await.unwrap();
    // 3. A call from the writer, in reply to the subtask, answered by the researcher.
    let researcher = Arc::new(researcher);
    let answering = {
        let researcher = Arc::clone(&researcher);
        tokio::spawn(async move {
            loop {
                let message = next(&researcher_goal).await;
                if let Some(cid) = message.correlation_id {
                    researcher.reply(cid, "use the ADR format").await.unwrap();
                    return cid;
                }
            }
        })
    };
    let nats_writer = writer.nats().clone();
    let answer: switchboard_proto::call::CallAnswer = switchboard_request::request::request_json(
        &nats_writer,
        "agent.call.writer",
        &CallRequest {
            to: Some("researcher".into()),
            message: Some("which format?".into()),
            from_goal_id: Some(writer_goal.id()),
            in_reply_to: handed.id,
            ..CallRequest::default()
        },
        Duration::from_secs(20),
    )
    .await
    .unwrap();
    let correlation = answering.await.unwrap();
    assert_eq!(answer.body, "use the ADR format");
    writer
        .complete_task(sub.task_id, TaskOutcome::text("intro drafted"))
        .await
        .unwrap();
    researcher
        .complete_task(task, TaskOutcome::text("write-up done"))
        .await
        .unwrap();
    caught_up(&nats).await;

    // Any id of the conversation gives the same thread.
    let by_message = audit_thread(
        &nats,
        &ThreadRequest {
            message_id: Some(first),
            ..ThreadRequest::default()
        },
    )
    .await
    .unwrap()
    .records;
    for other in [
        ThreadRequest {
            task_id: Some(sub.task_id),
            ..ThreadRequest::default()
        },
        ThreadRequest {
            correlation_id: Some(correlation),
            ..ThreadRequest::default()
        },
    ] {
        let thread = audit_thread(&nats, &other).await.unwrap().records;
        assert_eq!(
            thread.iter().map(|e| e.seq).collect::<BTreeSet<_>>(),
            by_message.iter().map(|e| e.seq).collect::<BTreeSet<_>>(),
            "{other:?}"
        );
    }
    let records = by_message;
    assert!(
        !records
            .iter()
            .any(|e| e.record.to_agent.as_deref() == Some("bystander")),
        "the unrelated message is not in the thread"
    );
    // Causal order.
    let sent = position(&records, |r| r.message_id == Some(first));
    let replied = position(&records, |r| r.message_id == Some(ack));
    let created = position(&records, |r| {
        r.kind == "task.created" && r.task_id == Some(task)
    });
    let spawned = position(&records, |r| {
        r.kind == "task.created" && r.task_id == Some(sub.task_id)
    });
    // The call's opening is its request message (there is no `opened` event).
    let opened = position(&records, |r| {
        r.kind == "request" && r.correlation_id == Some(correlation)
    });
    let answered = position(&records, |r| r.kind == "call.answered");
    let sub_done = position(&records, |r| {
        r.kind == "task.complete" && r.task_id == Some(sub.task_id)
    });
    let done = position(&records, |r| {
        r.kind == "task.complete" && r.task_id == Some(task)
    });
    assert!(
        sent < replied
            && replied < created
            && created < spawned
            && spawned < opened
            && opened < answered
            && answered < sub_done
            && sub_done < done,
        "{:?}",
        kinds(&records)
    );
    assert!(records.iter().any(|r| r.record.kind == "request"));
    assert!(
        records
            .windows(2)
            .all(|w| (w[0].record.at, w[0].seq) <= (w[1].record.at, w[1].seq))
    );
}

#[tokio::test]
async fn history_filters_and_pages() {
    let fabric = Fabric::start().await;
    let (_audit, _trail) = start_audit(&fabric.url(), fast_audit()).await;
    let nats = fabric.nats.client().await;
    let (alice, _ag) = fabric.agent_with_goal("alice").await;
    let (_bob, bob_goal) = fabric.agent_with_goal("bob").await;
    let (_carol, _cg) = fabric.agent_with_goal("carol").await;
    let before = switchboard_proto::timestamp::now();
    for n in 0..7 {
        alice
            .send_to_peer("bob", &format!("note {n}"))
            .await
            .unwrap();
    }
    alice.send_to_peer("carol", "hello carol").await.unwrap();
    caught_up(&nats).await;

    let query = |agent: Option<&str>, kind: Option<&str>, limit, cursor| HistoryRequest {
        agent_id: agent.map(str::to_owned),
        kind: kind.map(str::to_owned),
        limit,
        cursor,
        ..HistoryRequest::default()
    };
    let to_bob = audit_history(&nats, &query(Some("bob"), Some("message"), None, None))
        .await
        .unwrap()
        .records;
    assert_eq!(to_bob.len(), 7);
    assert!(
        to_bob
            .iter()
            .all(|e| e.record.to_agent.as_deref() == Some("bob"))
    );
    let by_goal = audit_history(
        &nats,
        &HistoryRequest {
            goal_id: Some(bob_goal.id()),
            kind: Some("message".into()),
            ..HistoryRequest::default()
        },
    )
    .await
    .unwrap()
    .records;
    assert_eq!(by_goal, to_bob);
    let registry = audit_history(&nats, &query(Some("carol"), Some("registry.*"), None, None))
        .await
        .unwrap()
        .records;
    assert_eq!(
        kinds(&registry),
        vec!["registry.registered", "registry.goal_opened"]
    );
    let later = audit_history(
        &nats,
        &HistoryRequest {
            agent_id: Some("alice".into()),
            since: Some(before),
            ..HistoryRequest::default()
        },
    )
    .await
    .unwrap()
    .records;
    assert_eq!(later.len(), 8, "{:?}", kinds(&later));
    let none = audit_history(
        &nats,
        &HistoryRequest {
            agent_id: Some("alice".into()),
            until: Some(before - time::Duration::hours(1)),
            ..HistoryRequest::default()
        },
    )
    .await
    .unwrap()
    .records;
    assert!(none.is_empty());

    // Pages of 3 walk the same records.
    let mut paged = Vec::new();
    let mut cursor = None;
    loop {
        let page = audit_history(&nats, &query(Some("bob"), Some("message"), Some(3), cursor))
            .await
            .unwrap();
        assert!(page.records.len() <= 3);
        paged.extend(page.records);
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    assert_eq!(paged, to_bob);
    let bad = audit_history(&nats, &query(None, None, Some(0), None)).await;
    assert_eq!(bad.unwrap_err().kind(), Some(ErrorKind::BadRequest));
}

#[tokio::test]
async fn pending_lists_requests_without_an_answer() {
    let fabric = Fabric::start().await;
    let (_audit, _trail) = start_audit(&fabric.url(), fast_audit()).await;
    let nats = fabric.nats.client().await;
    let (asker, _ag) = fabric.agent_with_goal("asker").await;
    let (answerer, answerer_goal) = fabric.agent_with_goal("answerer").await;
    let parked = asker
        .call_parked("answerer", "are you there?", Duration::from_secs(60))
        .await
        .unwrap();
    let question = asker
        .send(SendRequest {
            to: Some("answerer".into()),
            message: Some("reply when you can".into()),
            expects_reply: true,
            ..SendRequest::default()
        })
        .await
        .unwrap()
        .message_id
        .unwrap();
    caught_up(&nats).await;
    let pending = audit_pending(&nats).await.unwrap().records;
    let open: BTreeSet<_> = pending.iter().filter_map(|e| e.record.message_id).collect();
    assert_eq!(pending.len(), 2, "{:?}", kinds(&pending));
    assert!(open.contains(&question));
    assert!(
        pending
            .iter()
            .any(|e| e.record.correlation_id == Some(parked.correlation_id))
    );

    answerer.reply(parked.correlation_id, "yes").await.unwrap();
    next(&answerer_goal).await;
    answerer
        .send(SendRequest {
            to: Some("asker".into()),
            message: Some("here you go".into()),
            in_reply_to: Some(question),
            ..SendRequest::default()
        })
        .await
        .unwrap();
    caught_up(&nats).await;
    assert_eventually!(
        WAIT,
        async { audit_pending(&nats).await.unwrap().records.is_empty() },
        "answered requests are still pending"
    );
}

#[tokio::test]
async fn export_matches_the_stream_and_verify_finds_tampering() {
    let fabric = Fabric::start().await;
    let (_audit, _trail) = start_audit(&fabric.url(), fast_audit()).await;
    let nats = fabric.nats.client().await;
    let (sender, _sg) = fabric.agent_with_goal("sender").await;
    let (_receiver, _rg) = fabric.agent_with_goal("receiver").await;
    // Enough (with bodies of 2 KiB) to need several chunks.
    let body = "y".repeat(2048);
    for _ in 0..60 {
        sender.send_to_peer("receiver", &body).await.unwrap();
    }
    caught_up(&nats).await;

    let mut lines = Vec::new();
    let mut chunks = 0;
    let done = audit_export(&nats, &HistoryRequest::default(), |chunk| {
        chunks += 1;
        lines.extend(
            std::str::from_utf8(chunk)
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str::<AuditEntry>(l).unwrap()),
        );
    })
    .await
    .unwrap();
    assert!(chunks > 1, "exported in chunks ({chunks})");
    assert_eq!(done.chunks, chunks);
    let stream = switchboard_tests::audit_records(&nats).await;
    assert_eq!(done.records as usize, lines.len());
    // The stream may have grown by a record or two since; the export is its prefix.
    assert_eq!(lines[..], stream[..lines.len()]);
    let since = stream[10].record.at;
    let mut filtered = Vec::new();
    audit_export(
        &nats,
        &HistoryRequest {
            since: Some(since),
            kind: Some("message".into()),
            ..HistoryRequest::default()
        },
        |chunk| filtered.extend_from_slice(chunk),
    )
    .await
    .unwrap();
    let filtered: Vec<AuditEntry> = std::str::from_utf8(&filtered)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let expected: Vec<_> = stream
        .iter()
        .filter(|e| e.record.kind == "message" && e.record.at >= since)
        .cloned()
        .collect();
    assert_eq!(filtered, expected);

    // The chain is whole.
    let verified = audit_verify(&nats).await.unwrap();
    assert!(verified.ok, "{verified:?}");
    assert_eq!(verified.first_seq, 1);
    assert!(verified.records >= stream.len() as u64);

    // The stream refuses deletes; a forged record appended by someone else breaks the chain
    // where it stands.
    let js = jetstream::new(nats.clone());
    let audit_stream = js.get_stream(AUDIT_STREAM).await.unwrap();
    assert!(
        audit_stream.delete_message(3).await.is_err(),
        "deletes are denied"
    );
    let mut forged = stream[5].record.clone();
    forged.id = "FORGED:1".into();
    forged.prev_hash = "0".repeat(64);
    let body = serde_json::to_vec(&forged).unwrap();
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(HEADER_AUDIT_HASH, audit::record::hash(&body).as_str());
    let forged_seq = js
        .publish_with_headers(
            switchboard_proto::subject::AUDIT_RECORDS,
            headers,
            body.into(),
        )
        .await
        .unwrap()
        .await
        .unwrap()
        .sequence;
    let verified = audit_verify(&nats).await.unwrap();
    assert!(!verified.ok);
    let found = verified.first_break.unwrap();
    assert_eq!(found.seq, forged_seq);
    assert!(found.reason.contains("prev_hash"), "{}", found.reason);

    // A record whose body does not match its hash is found too (a second stream, same rule).
    let mut changed = stream[6].record.clone();
    changed.prev_hash = audit::record::hash(b"whatever");
    let body = serde_json::to_vec(&changed).unwrap();
    let mut headers = async_nats::HeaderMap::new();
    headers.insert(HEADER_AUDIT_HASH, "not-the-hash");
    js.publish_with_headers(
        switchboard_proto::subject::AUDIT_RECORDS,
        headers,
        body.into(),
    )
    .await
    .unwrap()
    .await
    .unwrap();
    let verified = audit_verify(&nats).await.unwrap();
    assert_eq!(
        verified.first_break.unwrap().seq,
        forged_seq,
        "the first break is still the first"
    );
}

#[tokio::test]
async fn a_killed_audit_service_loses_and_doubles_nothing_and_a_fresh_index_matches() {
    let fabric = Fabric::start().await;
    let nats = fabric.nats.client().await;
    // Two replicas: the first writes (it took the lease and recorded the set-up), the second
    // follows.
    let (first, _first_trail) = start_audit(&fabric.url(), fast_audit()).await;
    let (sender, _sg) = fabric.agent_with_goal("sender").await;
    let mut receivers = Vec::new();
    for n in 0..5 {
        receivers.push(fabric.agent_with_goal(&format!("receiver-{n}")).await);
    }
    caught_up(&nats).await;
    let (_second, second_trail) = start_audit(&fabric.url(), fast_audit()).await;
    let sender = Arc::new(sender);
    let flow = {
        let sender = Arc::clone(&sender);
        tokio::spawn(async move {
            for round in 0..30 {
                for n in 0..5 {
                    sender
                        .send_to_peer(&format!("receiver-{n}"), &format!("round {round}"))
                        .await
                        .unwrap();
                }
                // A real wait: paced, so the kill below lands mid-flow however fast the
                // machine is.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    // Kill the writer mid-flow (once it has recorded some of it): its in-flight batch is never
    // acknowledged, its lease is never released; the other replica takes over when the lease
    // expires.
    let before_flow = switchboard_tests::audit_records(&nats).await.len();
    assert!(
        eventually(Duration::from_secs(10), || {
            let nats = nats.clone();
            async move { switchboard_tests::audit_records(&nats).await.len() >= before_flow + 20 }
        })
        .await,
        "the first writer records the flow"
    );
    first.task.abort();
    let _ = first.task.await;
    let at_kill = switchboard_tests::audit_records(&nats).await.len();
    flow.await.unwrap();
    caught_up(&nats).await;

    let records = switchboard_tests::audit_records(&nats).await;
    let recorded = recorded_once(&records);
    let sources = switchboard_tests::source_ids(&nats).await;
    assert_eq!(recorded, sources, "one record per source message, no more");
    assert!(records.len() >= 150);
    assert!(
        at_kill < records.len(),
        "the restarted service recorded what came after the kill ({at_kill} before)"
    );
    assert!(audit_verify(&nats).await.unwrap().ok);

    // A fresh index, rebuilt from the stream, equals the running one.
    let (_third, third_trail) = start_audit(
        &fabric.url(),
        audit::AuditConfig {
            consumer: "audit-rebuild".into(),
            ..fast_audit()
        },
    )
    .await;
    second_trail.catch_up().await.unwrap();
    third_trail.catch_up().await.unwrap();
    let everything = |trail: &audit::Trail| {
        trail
            .index()
            .history(&HistoryRequest::default(), 0, usize::MAX)
            .unwrap()
    };
    let (old, fresh) = (everything(&second_trail), everything(&third_trail));
    assert!(old.len() >= records.len());
    assert_eq!(old, fresh);
    assert_eq!(old[..records.len()], records[..]);
}

#[tokio::test]
async fn refusals_are_in_the_trail() {
    let fabric = Fabric::start().await;
    let (_audit, _trail) = start_audit(&fabric.url(), fast_audit()).await;
    let nats = fabric.nats.client().await;
    let (me, _g) = fabric.agent_with_goal("loner").await;
    assert_eq!(
        me.send_to_peer("loner", "me?").await.unwrap_err().kind(),
        Some(ErrorKind::SelfSend)
    );
    // A peer whose ACL refuses the sender: the send succeeds with a reason, recorded too.
    let mut guarded = switchboard_tests::card("guarded");
    guarded.allow_from = vec!["someone-else".into()];
    let guarded =
        switchboard_tests::agent_with(&fabric.url(), guarded, Duration::from_secs(3600)).await;
    let _guarded_goal = guarded.open_goal().await.unwrap();
    let report = me.send_to_peer("guarded", "let me in").await.unwrap();
    assert!(report.delivered_to.is_empty());
    // A spoofed subject tail is refused and recorded under `_`.
    switchboard_tests::raw(&nats, "agent.send.Not.Valid", "{}").await;
    let found = || async {
        audit_history(
            &nats,
            &HistoryRequest {
                kind: Some("refused.*".into()),
                ..HistoryRequest::default()
            },
        )
        .await
        .unwrap()
        .records
        .iter()
        .map(|e| {
            (
                e.record.kind.clone(),
                e.record.from_agent.clone().unwrap_or_default(),
                e.record.payload["kind"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect::<Vec<_>>()
    };
    let self_send = (
        "refused.inbox-fanout".to_owned(),
        "loner".to_owned(),
        "self_send".to_owned(),
    );
    let spoofed = (
        "refused.inbox-fanout".to_owned(),
        "_".to_owned(),
        "invalid_agent_id".to_owned(),
    );
    let acl = (
        "refused.inbox-fanout".to_owned(),
        "loner".to_owned(),
        "unreachable".to_owned(),
    );
    assert_eventually!(
        WAIT,
        async {
            let found = found().await;
            found.contains(&self_send) && found.contains(&spoofed) && found.contains(&acl)
        },
        "refusals missing from the trail: {:?}",
        found().await
    );
}

#[tokio::test]
async fn retention_drops_old_records_from_the_stream_and_the_index() {
    let fabric = Fabric::start().await;
    let nats = fabric.nats.client().await;
    let mut runtime = switchboard_tests::runtime(&fabric.url());
    runtime.jetstream.audit_max_bytes = 64 * 1024;
    let (_audit, trail) = switchboard_tests::start_audit_with(&runtime, fast_audit()).await;
    let (sender, _sg) = fabric.agent_with_goal("sender").await;
    let (_receiver, _rg) = fabric.agent_with_goal("receiver").await;
    let body = "z".repeat(4096);
    for _ in 0..40 {
        sender.send_to_peer("receiver", &body).await.unwrap();
    }
    let js = jetstream::new(nats.clone());
    assert_eventually!(
        WAIT,
        async {
            let mut stream = js.get_stream(AUDIT_STREAM).await.unwrap();
            stream.info().await.unwrap().state.first_sequence > 1
        },
        "the size limit never dropped a record"
    );
    // Records the trail appends after a catch-up can drop more from the stream's front, so
    // the check is: once the trail has settled, a catch-up leaves nothing the stream dropped.
    assert_eventually!(
        WAIT,
        async {
            trail.catch_up().await.unwrap();
            let first = {
                let mut stream = js.get_stream(AUDIT_STREAM).await.unwrap();
                stream.info().await.unwrap().state.first_sequence
            };
            let indexed = trail
                .index()
                .history(&HistoryRequest::default(), 0, usize::MAX)
                .unwrap();
            !indexed.is_empty() && indexed.iter().all(|e| e.seq >= first)
        },
        "the index holds records the stream dropped"
    );
    // The chain is checked from the oldest record kept.
    let verified = audit_verify(&nats).await.unwrap();
    assert!(verified.ok, "{verified:?}");
    assert!(verified.first_seq > 1);
}

/// Publishes a well-formed record for `id` chained on the stream's last record, as a second
/// writer would (the moment a lease changes hands); retries until its expected sequence holds.
async fn append_as_another_writer(js: &jetstream::Context, id: &str) -> u64 {
    let writer = switchboard_proto::subject::audit_records_of(&switchboard_proto::new_id());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the second writer never got a record in"
        );
        let stream = js.get_stream(AUDIT_STREAM).await.unwrap();
        let last = stream.get_info().await.unwrap().state.last_sequence;
        let prev_hash = match stream.get_raw_message(last).await {
            Ok(message) => message
                .headers
                .get(HEADER_AUDIT_HASH)
                .unwrap()
                .as_str()
                .to_owned(),
            Err(_) => continue,
        };
        let record = AuditRecord {
            id: id.to_owned(),
            at: time::OffsetDateTime::now_utc(),
            kind: "message".into(),
            subject: "agent.inbox.elsewhere".into(),
            message_id: None,
            correlation_id: None,
            in_reply_to: None,
            task_id: None,
            parent_task_id: None,
            from_agent: Some("second-writer".into()),
            from_goal: None,
            to_agent: None,
            to_goal: None,
            expects_reply: false,
            payload: serde_json::json!({"written": "by another replica"}),
            trace_id: None,
            prev_hash,
        };
        let body = serde_json::to_vec(&record).unwrap();
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(HEADER_AUDIT_HASH, audit::record::hash(&body).as_str());
        let publish = jetstream::message::PublishMessage::build()
            .payload(body.into())
            .headers(headers)
            .message_id(id)
            .expected_last_sequence(last);
        match js.send_publish(writer.clone(), publish).await {
            Ok(ack) => match ack.await {
                Ok(ack) => return ack.sequence,
                Err(_) => continue,
            },
            Err(_) => continue,
        }
    }
}

#[tokio::test]
async fn records_of_another_writer_mid_burst_are_caught_up_and_nothing_is_doubled() {
    let fabric = Fabric::start().await;
    let nats = fabric.nats.client().await;
    let js = jetstream::new(nats.clone());
    let (sender, _sg) = fabric.agent_with_goal("sender").await;
    // A flow the appender takes in with many publishes in flight (20 goals of 50: under the
    // inbox's per-goal cap, so the stream keeps every one).
    let mut receivers = Vec::new();
    for n in 0..20 {
        receivers.push(fabric.agent_with_goal(&format!("receiver-{n}")).await);
    }
    let (_audit, trail) = start_audit(&fabric.url(), fast_audit()).await;
    let sender = Arc::new(sender);
    let (second_done, done_rx) = tokio::sync::watch::channel(false);
    let mut sends = Vec::new();
    for worker in 0..20 {
        let sender = Arc::clone(&sender);
        let mut done_rx = done_rx.clone();
        sends.push(tokio::spawn(async move {
            for n in 0..50 {
                if n == 40 {
                    // The last ten only once the second writer is done, so the appender
                    // always writes after it, however slow the machine.
                    done_rx.wait_for(|done| *done).await.unwrap();
                }
                sender
                    .send_to_peer(&format!("receiver-{worker}"), &format!("{n}"))
                    .await
                    .unwrap();
                // A real wait: paced, so the flow goes on while the second writer writes.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    // While it writes, a second writer gets records in between its own: the appender's
    // publishes in flight fail their expected sequence, and it must catch up and send again.
    let mut foreign = BTreeSet::new();
    for n in 0..5 {
        let id = format!("SECOND_WRITER:{n}");
        append_as_another_writer(&js, &id).await;
        foreign.insert(id);
    }
    second_done.send(true).unwrap();
    for send in sends {
        send.await.unwrap();
    }
    caught_up(&nats).await;

    let records = switchboard_tests::audit_records(&nats).await;
    let recorded = recorded_once(&records);
    let mut want = switchboard_tests::source_ids(&nats).await;
    assert!(want.len() >= 1_000);
    want.extend(foreign);
    assert_eq!(
        recorded, want,
        "one record per source, and the second writer's"
    );
    // The second writer's records landed mid-burst: the appender wrote after each of them.
    let last_foreign = records
        .iter()
        .filter(|e| e.record.id.starts_with("SECOND_WRITER:"))
        .map(|e| e.seq)
        .max()
        .unwrap();
    let after = records.iter().filter(|e| e.seq > last_foreign).count();
    assert!(after > 0, "the second writer wrote after the flow");
    eprintln!(
        "records after the second writer's last: {after} of {}",
        records.len()
    );
    let verified = audit_verify(&nats).await.unwrap();
    assert!(verified.ok, "{verified:?}");
    // The index holds exactly what the stream holds.
    trail.catch_up().await.unwrap();
    assert_eq!(trail.index().count().unwrap(), records.len() as u64);
}

#[tokio::test]
async fn a_query_on_the_writing_replica_sees_every_record_stored_before_it() {
    // The writer holds the head while it appends, so a query there does not read the stream:
    // it waits for the writer's own indexer to reach the stream's last record as of the
    // question. Checked while the writer works through a backlog (records stored in batches,
    // indexed behind them): each catch-up must leave the index holding at least every record
    // the stream had just before it.
    let fabric = Fabric::start().await;
    let nats = fabric.nats.client().await;
    let js = jetstream::new(nats.clone());
    let backlog = 6_000;
    switchboard_tests::bench::fill_inbox(&js, backlog, "a backlog message").await;
    let (_audit, trail) = start_audit(&fabric.url(), fast_audit()).await;
    let mut checked = 0;
    loop {
        let last = {
            let mut stream = js.get_stream(AUDIT_STREAM).await.unwrap();
            stream.info().await.unwrap().state.last_sequence
        };
        trail.catch_up().await.unwrap();
        let indexed = trail.index().count().unwrap();
        assert!(
            indexed >= last,
            "the stream had {last} records before the query, the index {indexed} after it"
        );
        checked += 1;
        if last >= backlog as u64 {
            break;
        }
    }
    assert!(
        checked >= 3,
        "only {checked} queries ran during the backlog"
    );
}

#[tokio::test]
async fn records_stored_while_the_index_fails_are_indexed_once_it_works_and_none_is_doubled() {
    // A real SQLite failure, on cue: a trigger on the index file refuses every insert. The
    // writer's records are stored but cannot be indexed; it must keep their sources
    // unacknowledged, append nothing twice while it retries, and once inserts work again,
    // index what was stored and acknowledge every source with exactly one record.
    let fabric = Fabric::start().await;
    let nats = fabric.nats.client().await;
    let js = jetstream::new(nats.clone());
    let dir = tempfile::tempdir().unwrap();
    let index_path = dir.path().join("audit.sqlite");
    let (_audit, trail) = start_audit(
        &fabric.url(),
        audit::AuditConfig {
            index_path: index_path.to_string_lossy().into_owned(),
            ..fast_audit()
        },
    )
    .await;
    let (sender, _sg) = fabric.agent_with_goal("sender").await;
    let (_receiver, _rg) = fabric.agent_with_goal("receiver").await;
    caught_up(&nats).await;

    let db = rusqlite::Connection::open(&index_path).unwrap();
    db.execute_batch(
        "CREATE TRIGGER injected_failure BEFORE INSERT ON records
         BEGIN SELECT RAISE(ABORT, 'injected: the disk is failing'); END;",
    )
    .unwrap();
    let indexed_before = trail.index().count().unwrap();
    for n in 0..40 {
        sender
            .send_to_peer("receiver", &format!("while the index fails {n}"))
            .await
            .unwrap();
    }
    // The fault bites: records reach the stream, the index stays where it was.
    let stream_last = || async {
        let mut stream = js.get_stream(AUDIT_STREAM).await.unwrap();
        stream.info().await.unwrap().state.last_sequence
    };
    assert_eventually!(
        WAIT,
        async { stream_last().await > indexed_before },
        "no record was stored while the index failed"
    );
    // A real wait: several recoveries and redeliveries (ack wait 1 s) run against the failing
    // index, and none may get an insert through.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        trail.index().count().unwrap(),
        indexed_before,
        "the trigger let an insert through"
    );
    // A query meanwhile is answered, not left waiting on the stuck index: from the index as
    // it is once the writer's index has not caught up within its wait (5 s), or refused as
    // unavailable when its own catch-up fails.
    let asked = std::time::Instant::now();
    let answer = tokio::time::timeout(
        Duration::from_secs(10),
        audit_history(&nats, &HistoryRequest::default()),
    )
    .await
    .expect("a query during an index failure was left waiting");
    match answer {
        Ok(page) => assert!(page.records.len() as u64 <= indexed_before),
        Err(err) => assert_eq!(err.kind(), Some(ErrorKind::Unavailable), "{err}"),
    }
    eprintln!(
        "a query during the index failure answered in {:?}",
        asked.elapsed()
    );

    db.execute_batch("DROP TRIGGER injected_failure").unwrap();
    caught_up(&nats).await;

    let records = switchboard_tests::audit_records(&nats).await;
    // The records stored while inserts failed are in the trail once: none was appended again.
    let recorded = recorded_once(&records);
    assert_eq!(
        recorded,
        switchboard_tests::source_ids(&nats).await,
        "one record per source message, no more"
    );
    trail.catch_up().await.unwrap();
    assert_eq!(
        trail.index().count().unwrap(),
        records.len() as u64,
        "the index holds every stored record"
    );
    assert!(audit_verify(&nats).await.unwrap().ok);
}

/// Issue 25: with no traffic, the whole system (every service, the audit writing) sends only a
/// few messages per second — its sweeps and the audit's lease — not the audit's former four
/// stream-info polls a second with their replies and advisories (~18 messages/s).
#[tokio::test]
async fn an_idle_system_is_quiet_on_the_wire() {
    let fabric = Fabric::start_all(
        Default::default(),
        reply_correlator::CorrelatorConfig::default(),
        task_lifecycle::TaskConfig::default(),
    )
    .await;
    let (_audit, _trail) = start_audit(&fabric.url(), audit::AuditConfig::default()).await;
    let nats = fabric.nats.client().await;
    // One exchange, so the audit has written and caught up once; then nothing.
    let (sender, _sender_goal) = fabric.agent_with_goal("sender").await;
    let (_reader, _reader_goal) = fabric.agent_with_goal("reader").await;
    sender.send_to_peer("reader", "hello").await.unwrap();
    caught_up(&nats).await;
    // A real wait: the tail of that exchange (acks, lease, index writes) dies down before the
    // window counts only what an idle system sends.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let tap = fabric.nats.client().await;
    let mut seen = tap.subscribe(">").await.unwrap();
    use futures::StreamExt;
    tap.flush().await.unwrap();
    let window = Duration::from_secs(6);
    let mut subjects: BTreeMap<String, usize> = BTreeMap::new();
    let until = tokio::time::Instant::now() + window;
    while let Ok(Some(message)) = tokio::time::timeout_at(until, seen.next()).await {
        let subject = message.subject.to_string();
        let kind = if subject.starts_with("_INBOX.") {
            "_INBOX.*".to_owned()
        } else {
            subject
        };
        *subjects.entry(kind).or_default() += 1;
    }
    let total: usize = subjects.values().sum();
    let per_second = total as f64 / window.as_secs_f64();
    assert!(
        per_second <= 8.0,
        "{per_second:.1} messages/s with no traffic: {subjects:?}"
    );
}
