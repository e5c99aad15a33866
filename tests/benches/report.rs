//! The performance report: one run measures Switchboard's paths beside raw NATS on the same
//! private nats-server, prints every figure and ratio against issue 9's targets, and (with
//! `BENCH_WRITE=<file>`) writes the report into that Markdown file between
//! `<!-- report:begin -->` and `<!-- report:end -->`.
//!
//! `make bench` runs it in release and writes `docs/performance.md`. What it does:
//! 1. starts a nats-server (JetStream, file storage) and the five services as real processes
//!    (the workspace's binaries, `target/<profile>/<service>`), so their memory can be read;
//! 2. raw NATS request/reply (a plain echo subscriber) and raw JetStream publish-ack;
//! 3. send_to_peer with 256 B and 16 KiB bodies to an agent with 1 and with 8 live goals
//!    (each read by a reader that keeps up), beside the same `InboxMessage` published raw to
//!    each goal (acks awaited together); a send to a full goal nobody reads;
//! 4. a call's round trip (`Agent::call`, the callee's runtime answering) beside raw
//!    request/reply; a send with `receipt: "read"` beside one without ([`report_receipts`]);
//!    a streamed call's first part beside the plain call ([`report_streaming`]); a blocking A2A `SendMessage` through the gateway beside the native
//!    task round trip and the official Python SDK's server ([`report_a2a`]); a person's
//!    decision reaching its agent with 10,000 approvals pending, beside a parked call's
//!    answer ([`report_people`]);
//! 5. send_to_peer and list_peers with 20 registered agents, then with `BENCH_AGENTS`
//!    (default 10,000);
//! 6. audit ingest beside a raw JetStream consumer reading and acking the same backlog;
//! 7. each service's resident memory (`VmRSS`) after all of that;
//! 8. reading inboxes, live goals at scale (`BENCH_GOALS`, default 100,000) and a 3-node R3
//!    cluster ([`report_inbox`]).
//!
//! `BENCH_OPS` sets the sequential sample (default 400); throughput keeps 64 operations in
//! flight. CI runs it with tiny numbers (debug build) to keep it working; figures come from
//! `make bench`.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

// Longer than 600 lines because the report is one run: its rows share the servers, agents and raw
// baselines measured at the start, so they sit together (the inbox rows are in report_inbox.rs).

mod report_a2a;
mod report_backlog;
mod report_budgets;
mod report_call_floor;
mod report_console;
mod report_files;
mod report_inbox;
mod report_limits;
mod report_peers;
mod report_people;
mod report_receipts;
mod report_streaming;

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer};
use bytes::Bytes;
use futures::StreamExt;
use switchboard_client::{Agent, AgentOptions};
use switchboard_delivery::deliver::deliver_all;
use switchboard_proto::registry::PeersRequest;
use switchboard_proto::{
    AUDIT_STREAM, AgentId, GoalId, INBOX_STREAM, InboxMessage, MessageKind, new_id, subject,
};
use switchboard_testkit::NatsServer;
use switchboard_testkit::process::ServiceProcess;
use switchboard_tests::bench::{
    Sample, fill_inbox, keep_reading, measure, ms, ops_from_env, percentile,
};
use switchboard_tests::{card, service_bin};

const IN_FLIGHT: usize = 64;
const SERVICES: [&str; 5] = [
    "directory",
    "inbox-fanout",
    "reply-correlator",
    "task-lifecycle",
    "audit",
];
/// Agents registered for the bench never heartbeat: keep them online for the run, and let one
/// agent keep 64 calls open.
const SERVICE_ENV: &[(&str, &str)] = &[
    ("SWITCHBOARD_DIRECTORY__HEARTBEAT_TIMEOUT_MS", "86400000"),
    ("SWITCHBOARD_REPLY_CORRELATOR__MAX_OPEN_CALLS", "1000"),
    // The bench drives each path from one agent as fast as it goes, and one agent opens every
    // measured goal: the per-agent guards against a hostile agent would measure themselves.
    ("SWITCHBOARD_REQUESTS__PER_SECOND", "10000000"),
    ("SWITCHBOARD_REQUESTS__BURST", "10000000"),
    ("SWITCHBOARD_DIRECTORY__MAX_GOALS_PER_AGENT", "10000000"),
];
const MIB: f64 = 1024.0 * 1024.0;

/// One line of a results table.
struct Row {
    group: String,
    path: String,
    sample: Option<Sample>,
    note: String,
}

/// One of the targets, as measured.
struct Target {
    what: String,
    measured: String,
    limit: String,
    met: bool,
}

#[derive(Default)]
struct Report {
    rows: Vec<Row>,
    targets: Vec<Target>,
    notes: Vec<String>,
}

impl Report {
    fn row(&mut self, group: &str, path: &str, sample: Sample) {
        self.rows.push(Row {
            group: group.to_owned(),
            path: path.to_owned(),
            sample: Some(sample),
            note: String::new(),
        });
    }

    fn note_row(&mut self, group: &str, path: &str, note: String) {
        self.rows.push(Row {
            group: group.to_owned(),
            path: path.to_owned(),
            sample: None,
            note,
        });
    }

    /// A target "ratio ≤ limit" (or ≥ when `at_least`).
    fn ratio(&mut self, what: &str, ratio: f64, limit: f64, at_least: bool) {
        let met = if at_least {
            ratio >= limit
        } else {
            ratio <= limit
        };
        let sign = if at_least { "≥" } else { "≤" };
        self.targets.push(Target {
            what: what.to_owned(),
            measured: format!("{ratio:.2}×"),
            limit: format!("{sign} {limit:.2}×"),
            met,
        });
    }

    /// A target "measured ≥ limit" in `unit`.
    fn at_least(&mut self, what: &str, measured: f64, unit: &str, limit: f64) {
        self.targets.push(Target {
            what: what.to_owned(),
            measured: format!("{measured:.0} {unit}"),
            limit: format!("≥ {limit} {unit}"),
            met: measured >= limit,
        });
    }

    fn absolute(&mut self, what: &str, measured: f64, unit: &str, limit: f64) {
        self.targets.push(Target {
            what: what.to_owned(),
            measured: format!("{measured:.2} {unit}"),
            limit: format!("≤ {limit} {unit}"),
            met: measured <= limit,
        });
    }
}

fn bench_agents() -> usize {
    std::env::var("BENCH_AGENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

async fn agent(url: &str, id: &str) -> Agent {
    let nats =
        switchboard_client::agent_connect_options(&switchboard_proto::AgentId::parse(id).unwrap())
            .connect(url)
            .await
            .unwrap();
    let options = AgentOptions {
        heartbeat_interval: Duration::from_secs(3600),
        ..AgentOptions::default()
    };
    Agent::connect_with(nats, card(id), options).await.unwrap()
}

fn size_label(size: usize) -> String {
    if size >= 1024 {
        format!("{} KiB", size / 1024)
    } else {
        format!("{size} B")
    }
}

#[tokio::main]
async fn main() {
    let ops = ops_from_env(400);
    if std::env::var("BENCH_ONLY").as_deref() == Ok("cluster") {
        let mut report = Report::default();
        report_inbox::cluster_rows(&mut report, ops, report_inbox::bench_goals()).await;
        println!("{}", render(&report, ops, 0, Duration::ZERO));
        return;
    }
    if std::env::var("BENCH_ONLY").as_deref() == Ok("backlog") {
        backlog_only(ops).await;
        return;
    }
    if std::env::var("BENCH_ONLY").as_deref() == Ok("full-goal") {
        full_goal_only(ops).await;
        return;
    }
    if std::env::var("BENCH_ONLY").as_deref() == Ok("limits") {
        // Provider limits (issue 41) on a server of their own: a few seconds.
        let nats = NatsServer::start().await;
        let mut report = Report::default();
        report_limits::limit_rows(&mut report, &nats.url(), ops, SERVICE_ENV, None).await;
        report_budgets::budget_rows(&mut report, ops).await;
        println!("{}", render(&report, ops, 0, Duration::ZERO));
        return;
    }
    if std::env::var("BENCH_ONLY").as_deref() == Ok("budgets") {
        // The budget rows alone (issue 41): the call with and without a budget, and the floor.
        let mut report = Report::default();
        report_budgets::budget_rows(&mut report, ops).await;
        println!("{}", render(&report, ops, 0, Duration::ZERO));
        return;
    }
    if std::env::var("BENCH_ONLY").as_deref() == Ok("files") {
        // Files by reference (issue 42) on a server of their own.
        let mut report = Report::default();
        report_files::file_rows(&mut report, ops, SERVICE_ENV).await;
        println!("{}", render(&report, ops, 0, Duration::ZERO));
        return;
    }
    if std::env::var("BENCH_ONLY").as_deref() == Ok("people") {
        people_only(ops).await;
        return;
    }
    if std::env::var("BENCH_ONLY").as_deref() == Ok("console") {
        console_only().await;
        return;
    }
    if std::env::var("BENCH_ONLY").as_deref() == Ok("peers") {
        // The call beside Synadia's agent SDK and raw NATS alone (issue 40 asks for three
        // runs of it): a minute instead of the whole report's.
        let mut report = Report::default();
        report_peers::peer_rows(&mut report, ops).await;
        println!("{}", render(&report, ops, 0, Duration::ZERO));
        return;
    }
    let agents_total = bench_agents().max(20);
    let started = Instant::now();
    let nats = NatsServer::start().await;
    let url = nats.url();
    let mut services = start_services(&url).await;
    let client = async_nats::connect(&url).await.unwrap();
    let js = jetstream::new(client.clone());
    let mut report = Report::default();
    println!(
        "Switchboard performance report: {ops} sequential operations per path (after {} warm-up), {IN_FLIGHT} in flight for throughput, {agents_total} agents at scale",
        ops / 10
    );

    // Raw NATS request/reply: a plain subscriber echoing the request.
    let responder = async_nats::connect(&url).await.unwrap();
    let mut requests = responder.subscribe("bench.echo").await.unwrap();
    let echo = responder.clone();
    tokio::spawn(async move {
        while let Some(message) = requests.next().await {
            if let Some(reply) = message.reply {
                echo.publish(reply, message.payload).await.unwrap();
            }
        }
    });
    let requester = async_nats::connect(&url).await.unwrap();
    let question = Bytes::from("x".repeat(256));
    let raw_rr = {
        let (requester, question) = (requester.clone(), question.clone());
        wait_until_audited(&js).await;
        measure(ops, 2, IN_FLIGHT, move || {
            let (client, payload) = (requester.clone(), question.clone());
            async move {
                client.request("bench.echo", payload).await.unwrap();
            }
        })
        .await
    };
    report.row("request/reply", "raw NATS request/reply (256 B)", raw_rr);

    // send_to_peer beside raw JetStream publishes of the same message to each goal. Each goal
    // is read by a reader that keeps up, as a running agent's is, so the rows measure a
    // send, not the removal of unread messages from a full goal (a row of its own below).
    let sender = Arc::new(agent(&url, "bench-sender").await);
    let mut receivers = Vec::new();
    let mut keepers = Vec::new();
    let taken = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for goals in [1usize, 8] {
        let receiver = agent(&url, &format!("bench-receiver-{goals}")).await;
        let mut ids = Vec::new();
        for _ in 0..goals {
            let goal = receiver.open_goal().await.unwrap();
            ids.push(goal.id());
            keepers.push(keep_reading(goal, Arc::clone(&taken)));
        }
        receivers.push((goals, receiver, ids));
    }
    let mut one_goal = Vec::new();
    for size in [256usize, 16 * 1024] {
        let label = size_label(size);
        let body = "x".repeat(size);
        let mut by_goals = Vec::new();
        for (goals, receiver, ids) in &receivers {
            let ids = ids.clone();
            let message = InboxMessage::new(
                AgentId::parse("bench-sender").unwrap(),
                GoalId::new(),
                receiver.id().clone(),
                body.clone(),
            );
            let payload = Bytes::from(serde_json::to_vec(&message).unwrap());
            let js_raw = js.clone();
            wait_until_audited(&js).await;
            let raw = measure(ops, 4, IN_FLIGHT, move || {
                let (js, ids, payload) = (js_raw.clone(), ids.clone(), payload.clone());
                async move {
                    let id = new_id();
                    let batch: Vec<(String, String, Bytes)> = ids
                        .iter()
                        .map(|g| (subject::inbox(g), format!("{id}:{g}"), payload.clone()))
                        .collect();
                    for result in deliver_all(&js, &batch).await {
                        result.unwrap();
                    }
                }
            })
            .await;
            let (agent, to, text, expect) = (
                Arc::clone(&sender),
                receiver.id().to_string(),
                body.clone(),
                *goals,
            );
            wait_until_audited(&js).await;
            let ours = measure(ops, 4, IN_FLIGHT, move || {
                let (agent, to, text) = (Arc::clone(&agent), to.clone(), text.clone());
                async move {
                    let report = agent.send_to_peer(&to, &text).await.unwrap();
                    assert_eq!(report.delivered_to.len(), expect, "{report:?}");
                }
            })
            .await;
            let group = format!("send {label}, {goals} goal(s)");
            report.row(
                &group,
                &format!("raw JetStream publish, {goals} ack(s) awaited together"),
                raw,
            );
            report.row(&group, "send_to_peer", ours);
            by_goals.push((*goals, raw, ours));
        }
        let (_, raw1, ours1) = by_goals[0];
        let (_, _, ours8) = by_goals[1];
        report.ratio(
            &format!("send {label} p50 / (raw request/reply p50 + raw publish-ack p50)"),
            ours1.p50.as_secs_f64() / (raw_rr.p50 + raw1.p50).as_secs_f64(),
            1.5,
            false,
        );
        report.ratio(
            &format!("send {label} throughput / raw pipelined publish ({IN_FLIGHT} in flight)"),
            ours1.per_sec / raw1.per_sec,
            0.5,
            true,
        );
        report.ratio(
            &format!("send {label}: 8-goal p50 / 1-goal p50"),
            ours8.p50.as_secs_f64() / ours1.p50.as_secs_f64(),
            1.5,
            false,
        );
        one_goal.push(ours1);
    }
    // The readers keep reading for the rest of the run (the scale rows send to
    // bench-receiver-1 too).
    drop(keepers);
    wait_until_audited(&js).await;
    report_inbox::reading_rows(&mut report, &url, &js, ops, raw_rr, one_goal[0]).await;

    // A call's round trip: the callee's runtime pulls each request and answers it.
    let callee = Arc::new(agent(&url, "bench-callee").await);
    let callee_goal = callee.open_goal().await.unwrap();
    let answerer = Arc::clone(&callee);
    tokio::spawn(async move {
        loop {
            let Ok(Some(delivery)) = callee_goal.recv(Duration::from_secs(60)).await else {
                continue;
            };
            let answerer = Arc::clone(&answerer);
            tokio::spawn(async move {
                // An ack that failed gave the request back: the next `recv` hands it out again.
                let Ok(message) = delivery.ack().await else {
                    return;
                };
                if message.kind == MessageKind::Request {
                    answerer
                        .reply(message.correlation_id.unwrap(), &message.body)
                        .await
                        .unwrap();
                }
            });
        }
    });
    let caller = Arc::new(agent(&url, "bench-caller").await);
    let _caller_goal = caller.open_goal().await.unwrap();
    let call = {
        let question = "x".repeat(256);
        wait_until_audited(&js).await;
        measure(ops, 2, IN_FLIGHT, move || {
            let (caller, question) = (Arc::clone(&caller), question.clone());
            async move {
                let answer = caller
                    .call("bench-callee", &question, Duration::from_secs(30))
                    .await
                    .unwrap();
                assert_eq!(answer.body.len(), 256);
            }
        })
        .await
    };
    report.row("call", "call round trip (256 B, callee answers)", call);
    report.ratio(
        "call round trip p50 / raw request/reply p50",
        call.p50.as_secs_f64() / raw_rr.p50.as_secs_f64(),
        4.0,
        false,
    );
    wait_until_audited(&js).await;
    report_receipts::receipt_rows(&mut report, &url, ops).await;
    wait_until_audited(&js).await;
    report_streaming::streaming_rows(&mut report, &url, ops, call).await;

    // send and list_peers with 20 registered agents, then with `agents_total`.
    // sender, two receivers, callee, caller, the inbox rows' two, the receipt rows' two, the
    // streamed-call rows' two, and the next one
    let registered = 12;
    let lister = Arc::new(agent(&url, "bench-lister").await);
    register_fillers(&client, 0, 20 - registered).await;
    wait_until_audited(&js).await;
    let (send_small, list_small) = scale_point(&sender, &lister, ops).await;
    report.row("20 agents", "send_to_peer 256 B, 1 goal", send_small);
    report.row("20 agents", "list_peers (first page)", list_small);
    let fill_started = Instant::now();
    register_fillers(&client, 20 - registered, agents_total - registered).await;
    let fill = fill_started.elapsed();
    wait_until_audited(&js).await;
    let (send_large, list_large) = scale_point(&sender, &lister, ops).await;
    let at = format!("{agents_total} agents");
    report.row(&at, "send_to_peer 256 B, 1 goal", send_large);
    report.row(&at, "list_peers (first page of 100)", list_large);
    let mut walks = Vec::new();
    let mut listed = 0;
    for _ in 0..5 {
        let walk = Instant::now();
        listed = lister.peers().await.unwrap().peers.len();
        walks.push(walk.elapsed());
    }
    walks.sort();
    assert_eq!(
        listed,
        agents_total - 1,
        "list_peers lists every other agent"
    );
    report.note_row(
        &at,
        "list_peers, every page (client walks `next`)",
        format!(
            "median {} ms for {listed} peers ({} pages of up to 1,000)",
            ms(percentile(&walks, 0.5)),
            listed.div_ceil(1000)
        ),
    );
    report.note_row(
        &at,
        "registering them (64 register requests in flight)",
        format!(
            "{:.0} registrations/s",
            (agents_total - 20) as f64 / fill.as_secs_f64()
        ),
    );
    report.ratio(
        &format!("send p50 with {agents_total} agents / with 20"),
        send_large.p50.as_secs_f64() / send_small.p50.as_secs_f64(),
        1.2,
        false,
    );
    report.absolute(
        &format!("list_peers p50 with {agents_total} agents"),
        list_large.p50.as_secs_f64() * 1e3,
        "ms",
        10.0,
    );

    // A2A (after the scale rows, which count the registered agents).
    wait_until_audited(&js).await;
    report_a2a::a2a_rows(&mut report, &url, ops, call).await;
    // Last of the request rows: it leaves a goal full of unread messages behind.
    wait_until_audited(&js).await;
    full_goal_row(&mut report, &url, &js, ops, raw_rr).await;

    audit_rows(&mut report, &url, &js, &client, &mut services, ops).await;

    // Memory of each service after the run.
    for (service, process) in SERVICES.iter().zip(&services) {
        let rss = process.pid().and_then(rss_bytes).unwrap_or(0) as f64 / MIB;
        report.note_row("memory", service, format!("{rss:.1} MiB resident"));
        report.absolute(&format!("{service} RSS after the run"), rss, "MiB", 64.0);
    }

    // A person's decision with 10,000 approvals waiting (issue 39): after the agent counts
    // above, which its agents would change.
    wait_until_audited(&js).await;
    report_people::people_rows(&mut report, &url, ops).await;
    // The console's map with every agent registered above, and a long conversation.
    let thread = report_console::thread_of(&url, thread_messages()).await;
    wait_until_audited(&js).await;
    report_console::console_rows(&mut report, &url, agents_total, thread).await;

    // Provider limits (issue 41): three limits replicas on this server, started for the rows.
    wait_until_audited(&js).await;
    report_limits::limit_rows(&mut report, &url, ops, SERVICE_ENV, Some(raw_rr)).await;
    report_budgets::budget_rows(&mut report, ops).await;

    // Files by reference (issue 42), on a server of their own.
    report_files::file_rows(&mut report, ops, SERVICE_ENV).await;

    // The call beside Synadia's agent SDK and raw NATS, on a server of its own with the
    // shipped defaults (issue 25).
    report_peers::peer_rows(&mut report, ops).await;

    // Live goals at scale on this node, then a 3-node R3 cluster.
    let goals = report_inbox::bench_goals();
    let named: Vec<(&str, &ServiceProcess)> = SERVICES.iter().copied().zip(&services).collect();
    report_inbox::scale_rows(&mut report, &url, &js, nats.pid(), &named, ops, goals).await;
    report_inbox::cluster_rows(&mut report, ops, goals).await;

    let text = render(&report, ops, agents_total, started.elapsed());
    println!("\n{text}");
    if let Ok(path) = std::env::var("BENCH_WRITE") {
        write_into(&path, &text);
        println!("(written into {path})");
    }
}

/// The report's five services on the server at `url`, the audit last.
async fn start_services(url: &str) -> Vec<ServiceProcess> {
    let mut services = Vec::new();
    for service in SERVICES {
        services
            .push(ServiceProcess::start(&service_bin(service), service, url, SERVICE_ENV).await);
    }
    services
}

/// `BENCH_ONLY=people`: the people rows alone, on a fabric of their own.
async fn people_only(ops: usize) {
    let nats = NatsServer::start().await;
    let url = nats.url();
    let services = start_services(&url).await;
    let mut report = Report::default();
    report_people::people_rows(&mut report, &url, ops).await;
    println!("{}", render(&report, ops, 0, Duration::ZERO));
    for service in services {
        service.terminate().await;
    }
}

/// The conversation's length: [`report_console::THREAD_MESSAGES`], or `BENCH_THREAD` (the CI
/// smoke run's smaller one).
fn thread_messages() -> usize {
    std::env::var("BENCH_THREAD")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(report_console::THREAD_MESSAGES)
}

/// `BENCH_ONLY=console`: the console rows alone on a fabric of their own, with
/// `BENCH_AGENTS` agents (default 5,000, the figure) and the long conversation.
async fn console_only() {
    let agents: usize = std::env::var("BENCH_AGENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5_000);
    let nats = NatsServer::start().await;
    let url = nats.url();
    let services = start_services(&url).await;
    let client = nats.client().await;
    register_fillers(&client, 0, agents).await;
    let thread = report_console::thread_of(&url, thread_messages()).await;
    let js = jetstream::new(client);
    wait_until_audited(&js).await;
    let mut report = Report::default();
    report_console::console_rows(&mut report, &url, agents, thread).await;
    println!("{}", render(&report, 0, agents, Duration::ZERO));
    for service in services {
        service.terminate().await;
    }
}

/// Audit ingest beside a raw consumer and the audit's floor row, on the same backlog: the
/// audit (the last of `services`) is stopped while the backlog is stored and consumed raw,
/// then started again to ingest it.
async fn audit_rows(
    report: &mut Report,
    url: &str,
    js: &jetstream::Context,
    client: &async_nats::Client,
    services: &mut Vec<ServiceProcess>,
    ops: usize,
) {
    let audit = services.pop().unwrap();
    wait_until_audited(js).await;
    audit.terminate().await;
    let backlog = (ops * 40).max(400);
    let (raw_rate, first_seq) = fill_and_consume_raw(js, backlog).await;
    let floor_rate = consume_and_store_raw(js, first_seq, backlog).await;
    let audit_before = stream_last(js, AUDIT_STREAM).await;
    services.push(ServiceProcess::start(&service_bin("audit"), "audit", url, SERVICE_ENV).await);
    let audit_rate = audit_rate(js, audit_before, backlog).await;
    report.note_row(
        "audit",
        &format!("raw consume of {backlog} messages (pull, ack each)"),
        format!("{raw_rate:.0} msg/s"),
    );
    report.note_row(
        "audit",
        "raw consume + one stored message per source (the audit's floor of broker work)",
        format!(
            "{floor_rate:.0} msg/s ({:.2}× raw consume)",
            floor_rate / raw_rate
        ),
    );
    report.note_row(
        "audit",
        "audit ingest of the same backlog (record, chain, index, ack)",
        format!(
            "{audit_rate:.0} msg/s ({:.2}× the floor)",
            audit_rate / floor_rate
        ),
    );
    report.ratio(
        "audit ingest / raw consume",
        audit_rate / raw_rate,
        0.5,
        true,
    );
    let verified = switchboard_client::audit_verify(client).await.unwrap();
    assert!(
        verified.ok,
        "the chain verifies after the run: {verified:?}"
    );
    report.notes.push(format!(
        "The backlog starts at `AGENT_INBOX` sequence {first_seq}; the audit chain verified after the run ({} records).",
        verified.records
    ));
}

/// `BENCH_ONLY=backlog`: the reading side's throughput rows alone (fetch+ack of a goal's
/// backlog, audit ingest), on a fabric of their own: issue 40's two backlog targets in a
/// minute instead of the whole report's.
async fn backlog_only(ops: usize) {
    let nats = NatsServer::start().await;
    let url = nats.url();
    let mut services = start_services(&url).await;
    let client = async_nats::connect(&url).await.unwrap();
    let js = jetstream::new(client.clone());
    let mut report = Report::default();
    let reader = agent(&url, "bench-backlog-reader").await;
    let goal = reader.open_goal().await.unwrap();
    report_backlog::backlog_rows(&mut report, &url, &js, &reader, &goal, ops).await;
    audit_rows(&mut report, &url, &js, &client, &mut services, ops).await;
    println!("{}", render(&report, ops, 0, Duration::ZERO));
}

/// `BENCH_ONLY=full-goal`: the full-goal row alone, three times on one fabric, beside raw
/// request/reply — to look into that row without the whole report's 3 minutes.
async fn full_goal_only(ops: usize) {
    let nats = NatsServer::start().await;
    let url = nats.url();
    let _services = start_services(&url).await;
    let client = async_nats::connect(&url).await.unwrap();
    let js = jetstream::new(client.clone());
    let mut requests = client.subscribe("bench.echo").await.unwrap();
    let echo = client.clone();
    tokio::spawn(async move {
        while let Some(message) = requests.next().await {
            if let Some(reply) = message.reply {
                echo.publish(reply, message.payload).await.unwrap();
            }
        }
    });
    let requester = async_nats::connect(&url).await.unwrap();
    let raw_rr = measure(ops, 2, IN_FLIGHT, move || {
        let client = requester.clone();
        async move {
            client
                .request("bench.echo", Bytes::from("x".repeat(256)))
                .await
                .unwrap();
        }
    })
    .await;
    let mut report = Report::default();
    report.row("request/reply", "raw NATS request/reply (256 B)", raw_rr);
    for _ in 0..3 {
        full_goal_row(&mut report, &url, &js, ops, raw_rr).await;
    }
    println!("{}", render(&report, ops, 0, Duration::ZERO));
}

/// A send into a goal nobody reads, once it is full: each send removes the oldest unread
/// message and tells its sender (docs/protocol.md, "The inbox cap"). The goal is filled first,
/// so every measured send takes that path.
async fn full_goal_row(
    report: &mut Report,
    url: &str,
    js: &jetstream::Context,
    ops: usize,
    raw_rr: Sample,
) {
    // Fresh agents each time the row runs (`BENCH_ONLY=full-goal` runs it three times).
    let run = uuid::Uuid::new_v4().simple().to_string();
    let (sender_id, receiver_id) = (
        format!("bench-full-sender-{}", &run[..8]),
        format!("bench-full-receiver-{}", &run[..8]),
    );
    let sender = Arc::new(agent(url, &sender_id).await);
    // The sender's notices are read (one per removed message), so its own goal stays open.
    let sender_goal = sender.open_goal().await.unwrap();
    let notices = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let keeper = keep_reading(sender_goal, Arc::clone(&notices));
    let receiver = agent(url, &receiver_id).await;
    let _unread = receiver.open_goal().await.unwrap();
    let body = "x".repeat(256);
    for _ in 0..switchboard_proto::INBOX_STORED_PER_GOAL {
        sender.send_to_peer(&receiver_id, &body).await.unwrap();
    }
    wait_until_audited(js).await;
    let full = measure(ops, 1, 8, move || {
        let (sender, body, to) = (Arc::clone(&sender), body.clone(), receiver_id.clone());
        async move {
            let report = sender.send_to_peer(&to, &body).await.unwrap();
            assert_eq!(report.delivered_to.len(), 1, "{report:?}");
        }
    })
    .await;
    keeper.abort();
    report.row(
        "send 256 B to a full goal nobody reads",
        "send_to_peer (the oldest unread goes, its sender is told)",
        full,
    );
    report.note_row(
        "send 256 B to a full goal nobody reads",
        "p50 / raw request/reply p50",
        format!(
            "{:.1}× (the price of telling the sender; a goal whose reader keeps up never pays it)",
            full.p50.as_secs_f64() / raw_rr.p50.as_secs_f64()
        ),
    );
}

/// Registers `from..to` filler agents with raw register requests, 64 in flight.
async fn register_fillers(client: &async_nats::Client, from: usize, to: usize) {
    futures::stream::iter(from..to)
        .map(|n| {
            let client = client.clone();
            async move {
                let id = format!("filler-{n:05}");
                let body = serde_json::json!({
                    "agent_id": id,
                    "description": "a registered agent with no goal",
                    "capabilities": ["bench"],
                });
                let reply = client
                    .request(
                        format!("agent.registry.register.{id}"),
                        body.to_string().into(),
                    )
                    .await
                    .unwrap();
                assert!(
                    reply
                        .headers
                        .is_none_or(|h| h.get("Nats-Service-Error").is_none()),
                    "registering {id} failed: {:?}",
                    reply.payload
                );
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect::<Vec<()>>()
        .await;
}

/// send_to_peer (256 B, one goal) and list_peers (first page) as measured now.
async fn scale_point(sender: &Arc<Agent>, lister: &Arc<Agent>, ops: usize) -> (Sample, Sample) {
    let agent = Arc::clone(sender);
    let send = measure(ops, 2, IN_FLIGHT, move || {
        let agent = Arc::clone(&agent);
        async move {
            let report = agent
                .send_to_peer("bench-receiver-1", &"x".repeat(256))
                .await
                .unwrap();
            assert_eq!(report.delivered_to.len(), 1);
        }
    })
    .await;
    let agent = Arc::clone(lister);
    let list = measure(ops, 1, 8, move || {
        let agent = Arc::clone(&agent);
        async move {
            let page = agent.peers_page(&PeersRequest::default()).await.unwrap();
            assert!(!page.peers.is_empty());
        }
    })
    .await;
    (send, list)
}

async fn stream_last(js: &jetstream::Context, stream: &str) -> u64 {
    js.get_stream(stream)
        .await
        .unwrap()
        .get_info()
        .await
        .unwrap()
        .state
        .last_sequence
}

/// Waits until the audit's consumers have nothing pending or unacknowledged. Called before
/// each path is measured too: otherwise the backlog a previous row left (a throughput phase
/// stores thousands of messages) is worked off during the next row's sequential samples and
/// lands on whichever path comes next; each path's own background work (the audit recording
/// what it stores) still falls on its own samples.
async fn wait_until_audited(js: &jetstream::Context) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let mut idle = true;
        for (stream, family) in [
            (INBOX_STREAM, "audit-inbox-"),
            (switchboard_proto::EVENTS_STREAM, "audit-events-"),
        ] {
            // Each audit writer opens consumers of its own, `audit-inbox-<n>` (services/audit
            // README); not there yet: the audit creates them once it holds the writer lease, a
            // moment after it answers PING.
            let infos: Vec<_> = js
                .get_stream(stream)
                .await
                .unwrap()
                .consumers()
                .filter_map(|info| async move { info.ok() })
                .filter(|info| std::future::ready(info.name.starts_with(family)))
                .collect()
                .await;
            if infos.is_empty() {
                idle = false;
            }
            for info in infos {
                idle &= info.num_pending == 0 && info.num_ack_pending == 0;
            }
        }
        if idle {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the audit did not catch up in 120 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Publishes `count` inbox messages (256 B bodies, 60 per goal so the per-goal cap keeps them
/// all), then reads and acks them with a raw durable pull consumer. Returns (messages/s from
/// the first delivery to the last ack, first sequence).
async fn fill_and_consume_raw(js: &jetstream::Context, count: usize) -> (f64, u64) {
    let first = stream_last(js, INBOX_STREAM).await + 1;
    fill_inbox(js, count, &"x".repeat(256)).await;
    let raw = backlog_reader(js, "bench-raw", first).await;
    let mut messages = raw.messages().await.unwrap();
    let mut read = 0;
    let mut began = None;
    while read < count {
        let message = match messages.next().await.unwrap() {
            Ok(message) => message,
            // A heartbeat the loaded server sent late (the debug smoke run in CI): the
            // pull goes on.
            Err(err)
                if err.kind()
                    == async_nats::jetstream::consumer::pull::MessagesErrorKind::MissingHeartbeat =>
            {
                continue;
            }
            Err(err) => panic!("pulling the backlog: {err}"),
        };
        began.get_or_insert_with(Instant::now);
        message.ack().await.unwrap();
        read += 1;
    }
    let elapsed = began.map(|at| at.elapsed()).unwrap_or_default();
    ((count - 1) as f64 / elapsed.as_secs_f64(), first)
}

/// A durable pull consumer (explicit ack) named `name` reading `AGENT_INBOX` from `first`.
async fn backlog_reader(
    js: &jetstream::Context,
    name: &str,
    first: u64,
) -> consumer::Consumer<consumer::pull::Config> {
    js.get_stream(INBOX_STREAM)
        .await
        .unwrap()
        .create_consumer(consumer::pull::Config {
            durable_name: Some(name.into()),
            ack_policy: consumer::AckPolicy::Explicit,
            deliver_policy: consumer::DeliverPolicy::ByStartSequence {
                start_sequence: first,
            },
            max_ack_pending: 4096,
            ..Default::default()
        })
        .await
        .unwrap()
}

/// The least broker work audit ingest needs, without the audit: a durable pull consumer reads
/// the backlog from `first` and each message is stored once more in a file stream shaped like
/// `AGENT_AUDIT` (`Nats-Msg-Id`, `Nats-Expected-Last-Sequence`, up to 1,024 publishes in
/// flight), its source acked after the store's ack. Returns messages/s from the first delivery
/// to the last ack.
async fn consume_and_store_raw(js: &jetstream::Context, first: u64, count: usize) -> f64 {
    let mut config = switchboard_runtime::resources::audit_stream(
        &switchboard_runtime::RuntimeConfig::default().jetstream,
    );
    config.name = "BENCH_FLOOR".into();
    config.subjects = vec!["bench.floor".into()];
    let store = js.get_or_create_stream(config).await.unwrap();
    let mut last = store.get_info().await.unwrap().state.last_sequence;
    let source = backlog_reader(js, "bench-floor", first).await;
    let mut messages = source.messages().await.unwrap();
    let mut in_flight = std::collections::VecDeque::new();
    let (mut received, mut done) = (0, 0);
    let mut began = None;
    while done < count {
        while received < count && in_flight.len() < 1024 {
            let next = if in_flight.is_empty() {
                messages.next().await
            } else {
                match futures::FutureExt::now_or_never(messages.next()) {
                    Some(next) => next,
                    None => break,
                }
            };
            let message = next.unwrap().unwrap();
            began.get_or_insert_with(Instant::now);
            received += 1;
            let info = message.info().unwrap();
            let id = format!("{}:{}", info.stream, info.stream_sequence);
            let publish = jetstream::message::PublishMessage::build()
                .payload(message.payload.clone())
                .message_id(id)
                .expected_last_sequence(last);
            last += 1;
            let ack = js.send_publish("bench.floor", publish).await.unwrap();
            in_flight.push_back((message, ack));
        }
        let (message, ack) = in_flight.pop_front().unwrap();
        ack.await.unwrap();
        message.ack().await.unwrap();
        done += 1;
    }
    let elapsed = began.map(|at| at.elapsed()).unwrap_or_default();
    (count - 1) as f64 / elapsed.as_secs_f64()
}

/// The audit's ingest rate over the records it appended after `before`: waits for `count` of
/// them, then divides by the time between the first and the last record's store timestamps
/// (the audit's own pace, without its start-up).
async fn audit_rate(js: &jetstream::Context, before: u64, count: usize) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut last;
    loop {
        last = stream_last(js, AUDIT_STREAM).await;
        if last >= before + count as u64 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the audit stored {} of {count} records in 300 s",
            last - before
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    wait_until_audited(js).await;
    last = stream_last(js, AUDIT_STREAM).await;
    let stream = js.get_stream(AUDIT_STREAM).await.unwrap();
    let first_at = stream.get_raw_message(before + 1).await.unwrap().time;
    let last_at = stream.get_raw_message(last).await.unwrap().time;
    let span = (last_at - first_at).as_seconds_f64().max(1e-6);
    (last - before - 1) as f64 / span
}

pub(crate) fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The machine, build and server the figures come from.
fn machine() -> String {
    let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
    let cpuinfo = read("/proc/cpuinfo");
    let cpu = cpuinfo
        .lines()
        .find(|line| line.starts_with("model name"))
        .and_then(|line| line.split_once(':'))
        .map_or("unknown CPU", |(_, name)| name.trim())
        .to_owned();
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let memory = read("/proc/meminfo")
        .lines()
        .find(|line| line.starts_with("MemTotal:"))
        .and_then(|line| line.split_whitespace().nth(1)?.parse::<f64>().ok())
        .map_or("unknown".to_owned(), |kib| {
            format!("{:.1} GiB", kib / 1024.0 / 1024.0)
        });
    let kernel = read("/proc/sys/kernel/osrelease").trim().to_owned();
    let version = |program: &std::path::Path| {
        std::process::Command::new(program)
            .arg("--version")
            .output()
            .ok()
            .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
            .unwrap_or_else(|| "unknown".to_owned())
    };
    let server = version(&switchboard_testkit::nats_server_bin());
    let rustc = version(std::path::Path::new("rustc"));
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    format!(
        "{cpu}, {cores} cores available, {memory} memory, Linux {kernel}; {server} (JetStream, file storage, one node on loopback); {rustc}, {profile} build. The server, the five services and the bench client share the machine's cores."
    )
}

fn render(report: &Report, ops: usize, agents: usize, took: Duration) -> String {
    let mut out = String::new();
    let date = time::OffsetDateTime::now_utc().date();
    let _ = writeln!(
        out,
        "### Report ({date}; `make bench`, {:.0} s)\n",
        took.as_secs_f64()
    );
    let _ = writeln!(out, "Machine: {}\n", machine());
    let _ = writeln!(
        out,
        "Sequential p50/p99 over {ops} operations after {} warm-up; throughput with {IN_FLIGHT} in flight (list_peers: 8). Scale rows: {agents} registered agents.\n",
        ops / 10
    );
    let _ = writeln!(out, "#### Targets (ratios measured in this run)\n");
    let _ = writeln!(out, "| target | measured | limit | |\n|---|---|---|---|");
    for target in &report.targets {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            target.what,
            target.measured,
            target.limit,
            if target.met { "met" } else { "**missed**" }
        );
    }
    let met = report.targets.iter().filter(|t| t.met).count();
    let _ = writeln!(
        out,
        "\n{met} of {} targets met in this run.\n",
        report.targets.len()
    );
    let _ = writeln!(out, "#### Figures\n");
    let _ = writeln!(
        out,
        "| group | path | p50 ms | p99 ms | ops/s | |\n|---|---|---|---|---|---|"
    );
    for row in &report.rows {
        match row.sample {
            Some(s) => {
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} | {:.0} | |",
                    row.group,
                    row.path,
                    ms(s.p50),
                    ms(s.p99),
                    s.per_sec
                );
            }
            None => {
                let _ = writeln!(out, "| {} | {} | | | | {} |", row.group, row.path, row.note);
            }
        }
    }
    for note in &report.notes {
        let _ = writeln!(out, "\n{note}");
    }
    out
}

/// Replaces the text between the report markers in `path` (or adds the markers after the
/// file's first paragraph block, before its first `## ` heading).
fn write_into(path: &str, text: &str) {
    const BEGIN: &str = "<!-- report:begin (written by `make bench`; edit the bench, not this) -->";
    const END: &str = "<!-- report:end -->";
    let current = std::fs::read_to_string(path).unwrap_or_default();
    let block = format!("{BEGIN}\n{text}\n{END}");
    let updated = match (current.find("<!-- report:begin"), current.find(END)) {
        (Some(start), Some(end)) if start < end => {
            format!(
                "{}{block}{}",
                &current[..start],
                &current[end + END.len()..]
            )
        }
        _ => match current.find("\n## ") {
            Some(at) => format!(
                "{}\n## The report\n\n{block}\n{}",
                &current[..at],
                &current[at..]
            ),
            None => format!("{current}\n{block}\n"),
        },
    };
    std::fs::write(path, updated).unwrap();
}
