//! The report's inbox rows (issue 16, "Inbox v2"): reading through cursors beside raw
//! JetStream, live goals at scale, and a 3-node R3 cluster.
//!
//! - delivery latency: from the start of a send to the answer of the recipient's held fetch,
//!   against send p50 + 1.5 × raw request/reply p50;
//! - fetch + ack of one goal's backlog (64 messages, the cap) beside a raw pull consumer and
//!   beside its raw steps (`report_backlog.rs`);
//! - goal.open p50 with 100, 10,000 and `BENCH_GOALS` (default 100,000) live goals on the
//!   single node, the nats-server's memory per idle goal and every service's memory there;
//! - a 3-node R3 cluster: `min(BENCH_GOALS, 10,000)` goals opened with 32 in flight, and send
//!   p50 beside raw R3 publish p50.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use bytes::Bytes;
use futures::StreamExt;
use switchboard_client::Agent;
use switchboard_proto::registry::GoalOpenReply;
use switchboard_proto::subject::RegistryOp;
use switchboard_proto::{AgentId, GoalId, InboxMessage, new_id, subject};

use switchboard_testkit::NatsCluster;
use switchboard_testkit::process::ServiceProcess;
use switchboard_tests::bench::{Sample, measure, ms, percentile};
use switchboard_tests::{card, service_bin};

use crate::{MIB, Report, SERVICE_ENV, agent, rss_bytes};

/// Goals opened concurrently when filling.
const OPEN_IN_FLIGHT: usize = 32;
/// Goals per filler agent (an agent may have many goals; fewer agents keep registering short).
const GOALS_PER_AGENT: usize = 100;

/// `BENCH_GOALS` from the environment (default 100,000).
pub fn bench_goals() -> usize {
    std::env::var("BENCH_GOALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000)
}

/// Delivery latency through a held fetch, and fetch+ack throughput of a backlog.
pub async fn reading_rows(
    report: &mut Report,
    url: &str,
    js: &jetstream::Context,
    ops: usize,
    raw_rr: Sample,
    send: Sample,
) {
    let sender = Arc::new(agent(url, "bench-inbox-sender").await);
    let reader = agent(url, "bench-inbox-reader").await;
    let goal = reader.open_goal().await.unwrap();

    // Delivery: the reader's fetch is held when the send starts.
    let mut latencies = Vec::with_capacity(ops);
    let mut acked = None;
    for n in 0..ops + ops / 10 {
        let fetch = {
            let goal_id = goal.id();
            let nats = reader.nats().clone();
            let me = reader.id().clone();
            tokio::spawn(async move {
                let body = serde_json::json!({"goal_id": goal_id, "wait_ms": 10_000, "ack_through": acked});
                let reply = nats
                    .request(subject::inbox_fetch(&me), body.to_string().into())
                    .await
                    .unwrap();
                let reply: switchboard_proto::inbox::FetchReply =
                    serde_json::from_slice(&reply.payload).unwrap();
                (reply, Instant::now())
            })
        };
        tokio::time::sleep(Duration::from_millis(2)).await;
        let started = Instant::now();
        sender
            .send_to_peer("bench-inbox-reader", &"x".repeat(256))
            .await
            .unwrap();
        let (reply, answered) = fetch.await.unwrap();
        assert_eq!(reply.messages.len(), 1);
        acked = Some(reply.messages[0].seq);
        if n >= ops / 10 {
            latencies.push(answered.duration_since(started));
        }
    }
    goal.ack_through(acked.unwrap_or(0)).await.unwrap();
    latencies.sort();
    let p50 = percentile(&latencies, 0.50);
    let p99 = percentile(&latencies, 0.99);
    report.note_row(
        "inbox",
        "send → the recipient's held fetch answers (256 B)",
        format!("p50 {} ms, p99 {} ms", ms(p50), ms(p99)),
    );
    let limit = send.p50 + raw_rr.p50.mul_f64(1.5);
    report.ratio(
        "delivery p50 / (send p50 + 1.5 × raw request/reply p50)",
        p50.as_secs_f64() / limit.as_secs_f64(),
        1.0,
        false,
    );

    crate::report_backlog::backlog_rows(report, url, js, &reader, &goal, ops).await;
}

/// Registers `agents` filler agents `goal-filler-<n>` (64 requests in flight).
async fn register_agents(client: &async_nats::Client, prefix: &str, agents: usize) {
    futures::stream::iter(0..agents)
        .map(|n| {
            let client = client.clone();
            let id = AgentId::parse(&format!("{prefix}-{n}")).unwrap();
            async move {
                let body = serde_json::to_vec(&card(id.as_str())).unwrap();
                client
                    .request(RegistryOp::Register.subject(&id), body.into())
                    .await
                    .unwrap();
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<()>>()
        .await;
}

/// Opens goals `from..to`, spread over the filler agents, `OPEN_IN_FLIGHT` at a time. Returns
/// how long it took.
async fn open_goals(client: &async_nats::Client, prefix: &str, from: usize, to: usize) -> Duration {
    let started = Instant::now();
    futures::stream::iter(from..to)
        .map(|n| {
            let client = client.clone();
            let id = AgentId::parse(&format!("{prefix}-{}", n / GOALS_PER_AGENT)).unwrap();
            async move {
                let reply = client
                    .request(RegistryOp::GoalOpen.subject(&id), "{}".into())
                    .await
                    .unwrap();
                let _: GoalOpenReply = serde_json::from_slice(&reply.payload)
                    .unwrap_or_else(|_| panic!("goal.open refused: {:?}", reply.payload));
            }
        })
        .buffer_unordered(OPEN_IN_FLIGHT)
        .collect::<Vec<()>>()
        .await;
    started.elapsed()
}

/// goal.open latency: goals opened one after another by one agent (they stay live). Returns
/// the sample and how many goals it opened.
async fn open_p50(opener: &Arc<Agent>, ops: usize) -> (Sample, usize) {
    let opener = Arc::clone(opener);
    let opened = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&opened);
    let sample = measure(ops, 1, 1, move || {
        let (opener, counted) = (Arc::clone(&opener), Arc::clone(&counted));
        async move {
            opener.open_goal().await.unwrap();
            counted.fetch_add(1, Ordering::Relaxed);
        }
    })
    .await;
    (sample, opened.load(Ordering::Relaxed))
}

/// goal.open p50 and memory with 100, 10,000 and `goals` live goals on the single node.
pub async fn scale_rows(
    report: &mut Report,
    url: &str,
    js: &jetstream::Context,
    nats_pid: Option<u32>,
    services: &[(&str, &ServiceProcess)],
    ops: usize,
    goals: usize,
) {
    let client = async_nats::connect(url).await.unwrap();
    let goals = goals.max(200);
    register_agents(&client, "goal-filler", goals.div_ceil(GOALS_PER_AGENT)).await;
    let opener = Arc::new(agent(url, "bench-goal-opener").await);
    let server_rss = || nats_pid.and_then(rss_bytes).unwrap_or(0) as f64;
    let mut points = vec![100, 10_000.min(goals), goals];
    points.dedup();
    let mut live = 0;
    let (mut first_p50, mut last_p50) = (None, Duration::ZERO);
    let mut rss_at_first = 0.0;
    for point in points {
        let took = open_goals(&client, "goal-filler", live, point).await;
        if point > live && live > 0 {
            report.note_row(
                &format!("{point} live goals"),
                &format!("opening goals {live}..{point} ({OPEN_IN_FLIGHT} in flight)"),
                format!("{:.0} goals/s", (point - live) as f64 / took.as_secs_f64()),
            );
        }
        live = point;
        // The audit records every goal_opened event: let it catch up first, so the sample
        // measures goal.open and not the audit working off the fill.
        crate::wait_until_audited(js).await;
        let (sample, opened) = open_p50(&opener, ops).await;
        live += opened;
        report.row(&format!("{point} live goals"), "goal.open", sample);
        if first_p50.is_none() {
            first_p50 = Some(sample.p50);
            tokio::time::sleep(Duration::from_secs(2)).await;
            rss_at_first = server_rss();
        }
        last_p50 = sample.p50;
    }
    let first = first_p50.unwrap_or(last_p50);
    report.ratio(
        &format!("goal.open p50 with {goals} live goals / with 100"),
        last_p50.as_secs_f64() / first.as_secs_f64(),
        1.2,
        false,
    );
    // Idle: let the server's caches of what was just written expire before reading its memory.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let per_goal = (server_rss() - rss_at_first).max(0.0) / (live - 100) as f64;
    report.note_row(
        &format!("{goals} live goals"),
        "nats-server resident memory",
        format!(
            "{:.1} MiB ({:.0} B per idle live goal over the 100-goal point)",
            server_rss() / MIB,
            per_goal
        ),
    );
    report.absolute(
        "nats-server RSS per idle live goal",
        per_goal / 1024.0,
        "KiB",
        2.0,
    );
    for (service, process) in services {
        let rss = process.pid().and_then(rss_bytes).unwrap_or(0) as f64 / MIB;
        report.note_row(
            &format!("{goals} live goals"),
            &format!("{service} resident memory"),
            format!("{rss:.1} MiB"),
        );
        report.absolute(
            &format!("{service} RSS with {goals} live goals"),
            rss,
            "MiB",
            256.0,
        );
    }
}

/// A 3-node R3 cluster: goals opened with 32 in flight, and send p50 beside raw R3 publish.
pub async fn cluster_rows(report: &mut Report, ops: usize, goals: usize) {
    let goals = goals.clamp(100, 10_000);
    let cluster = NatsCluster::start(3).await;
    let env: Vec<(&str, &str)> = SERVICE_ENV
        .iter()
        .copied()
        .chain([("SWITCHBOARD_JETSTREAM__REPLICAS", "3")])
        .collect();
    let urls = cluster.urls();
    let mut services = Vec::new();
    for (n, service) in ["directory", "inbox-fanout", "reply-correlator"]
        .into_iter()
        .enumerate()
    {
        services
            .push(ServiceProcess::start(&service_bin(service), service, &urls[n % 3], &env).await);
    }
    let client = cluster.client(0).await;
    register_agents(&client, "r3-filler", goals.div_ceil(GOALS_PER_AGENT)).await;
    let took = open_goals(&client, "r3-filler", 0, goals).await;
    let rate = goals as f64 / took.as_secs_f64();
    let group = "3-node R3 cluster";
    report.note_row(
        group,
        &format!("opening {goals} goals ({OPEN_IN_FLIGHT} in flight)"),
        format!("{rate:.0} goals/s"),
    );
    report.targets.push(crate::Target {
        what: format!("3-node R3: goals opened per second ({goals}, {OPEN_IN_FLIGHT} in flight)"),
        measured: format!("{rate:.0}/s"),
        limit: "≥ 500/s".to_owned(),
        met: rate >= 500.0,
    });

    // Send p50 beside a raw R3 publish of the same message.
    let sender = Arc::new(agent(&urls[1], "r3-sender").await);
    let receiver = agent(&urls[2], "r3-receiver").await;
    let _goal = receiver.open_goal().await.unwrap();
    let message = InboxMessage::new(
        sender.id().clone(),
        GoalId::new(),
        receiver.id().clone(),
        "x".repeat(256),
    );
    let payload = Bytes::from(serde_json::to_vec(&message).unwrap());
    let raw_publish = raw_r3_publish(jetstream::new(client.clone()), payload.clone());
    let raw = measure(ops, 1, OPEN_IN_FLIGHT, move || raw_publish()).await;
    let ours = measure(ops, 1, OPEN_IN_FLIGHT, move || {
        let sender = Arc::clone(&sender);
        async move {
            let report = sender
                .send_to_peer("r3-receiver", &"x".repeat(256))
                .await
                .unwrap();
            assert_eq!(report.delivered_to.len(), 1);
        }
    })
    .await;
    report.row(group, "raw JetStream R3 publish (256 B)", raw);
    report.row(group, "send_to_peer 256 B, 1 goal", ours);
    report.note_row(
        group,
        "send p50 / raw R3 publish p50",
        format!("{:.2}×", ours.p50.as_secs_f64() / raw.p50.as_secs_f64()),
    );
    // A waiting call on the cluster: every write on its path is paid three times, with an
    // fsync each (`sync_interval: always`). Issue 40's target (issue 25 asked 3×). Measured
    // in interleaved blocks beside a raw R3 publish and the call's floor (the decided design's
    // raw steps, `report_call_floor.rs`, its parts on the services' nodes).
    let raw = raw_r3_publish(jetstream::new(client.clone()), payload);
    let floor = crate::report_call_floor::start(crate::report_call_floor::Placement {
        correlator: &urls[2],
        fanout: &urls[1],
        trail: None,
        replicas: 3,
    })
    .await;
    let stop = tokio_util::sync::CancellationToken::new();
    let floor_callee = crate::report_call_floor::callee(urls[2].clone(), stop.clone());
    let floor_call = crate::report_call_floor::caller(&urls[0]).await;
    let (call, serving_stop, serving) = cluster_call(&urls).await;
    let samples = switchboard_tests::bench::compare_all(ops, 32, &[raw, call, floor_call]).await;
    stop.cancel();
    serving_stop.cancel();
    let _ = tokio::join!(serving, floor_callee);
    drop(floor);
    let (raw, call, floor) = (samples[0], samples[1], samples[2]);
    report.row(
        group,
        "raw JetStream R3 publish (256 B), beside the call",
        raw,
    );
    report.row(group, "call (wait), 256 B, the callee serves", call);
    report.row(
        group,
        "the call's floor (raw steps of the decided design, no audit)",
        floor,
    );
    report.note_row(
        group,
        "the call's floor p50 / raw R3 publish p50",
        format!(
            "{:.2}× (the call: {:.2}× the floor)",
            floor.p50.as_secs_f64() / raw.p50.as_secs_f64(),
            call.p50.as_secs_f64() / floor.p50.as_secs_f64()
        ),
    );
    report.ratio(
        "3-node R3: call p50 / raw R3 publish p50",
        call.p50.as_secs_f64() / raw.p50.as_secs_f64(),
        4.0,
        false,
    );
    for service in services {
        service.terminate().await;
    }
}

/// A raw JetStream publish of `payload` into a goal inbox, waiting for its ack: a goal subject
/// of its own per publish (the stream refuses a 65th message on one goal; the services make
/// room, a raw publish does not).
fn raw_r3_publish(js: jetstream::Context, payload: Bytes) -> switchboard_tests::bench::Path {
    switchboard_tests::bench::path(move || {
        let (js, payload) = (js.clone(), payload.clone());
        let subject = switchboard_proto::subject::inbox(&GoalId::new());
        async move {
            let publish = jetstream::message::PublishMessage::build()
                .payload(payload)
                .message_id(new_id().to_string());
            js.send_publish(subject, publish)
                .await
                .unwrap()
                .await
                .unwrap();
        }
    })
}

/// Waiting calls on the cluster: the caller on node 0, the callee on node 2 answering through
/// the Rust client's own read loop ([`switchboard_client::Agent::serve`]: held fetches, the
/// handler replies, then the request is acknowledged — off the caller's path, as an SDK user's
/// callee does).
async fn cluster_call(
    urls: &[String],
) -> (
    switchboard_tests::bench::Path,
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<()>,
) {
    let callee = Arc::new(agent(&urls[2], "r3-callee").await);
    let goal = callee.open_goal().await.unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let serving = {
        let (callee, stop) = (Arc::clone(&callee), stop.clone());
        tokio::spawn(async move {
            let replier = Arc::clone(&callee);
            let options = switchboard_client::ServeOptions {
                max_concurrent: 32,
                ..Default::default()
            };
            let handler = move |message: switchboard_proto::InboxMessage| {
                let replier = Arc::clone(&replier);
                async move {
                    let Some(correlation_id) = message.correlation_id else {
                        return Ok(());
                    };
                    replier
                        .reply(correlation_id, &message.body)
                        .await
                        .map(|_| ())
                        .map_err(|err| format!("r3-callee: reply failed: {err}"))
                }
            };
            if let Err(err) = callee.serve(&goal, stop, options, handler).await {
                panic!("r3-callee stopped serving: {err}");
            }
        })
    };
    let caller = Arc::new(agent(&urls[0], "r3-caller").await);
    caller.open_goal().await.unwrap();
    let call = switchboard_tests::bench::path(move || {
        let caller = Arc::clone(&caller);
        async move {
            let answer = caller
                .call("r3-callee", &"x".repeat(256), Duration::from_secs(30))
                .await
                .unwrap();
            assert_eq!(answer.body.len(), 256);
        }
    });
    (call, stop, serving)
}
