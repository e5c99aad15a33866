//! The report's people rows (issue 39): with `BENCH_PENDING` (default 10,000) approvals
//! waiting for one person, how long a person's decision takes to reach its parked agent,
//! beside how long a parked call's answer takes to reach its caller, measured the same way
//! (from the answer's request to the agent's fetch returning it). The target: p50 at most 2×
//! the call's.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use switchboard_client::{Agent, Goal, PersonAnswer};
use switchboard_proto::approval::{Action, ApprovalRequest};
use switchboard_proto::people::ops::PeopleOpsOp;
use switchboard_testkit::process::ServiceProcess;
use switchboard_tests::bench::{Sample, percentile};
use switchboard_tests::service_bin;

use crate::{Report, agent};

/// Approvals left waiting while the rows are measured.
fn bench_pending() -> usize {
    std::env::var("BENCH_PENDING")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}

/// Approvals one filler agent requests (the caps raised to let it).
const PER_FILLER: usize = 1_000;

const PEOPLE: &str = "[[person]]\nid = \"approver\"\naccess = [\"approver\"]\n";

fn action(n: usize) -> Action {
    Action {
        tool: "deploy".to_owned(),
        arguments: json!({"version": n}),
    }
}

fn approval(goal: &Goal, n: usize) -> ApprovalRequest {
    ApprovalRequest {
        action: action(n),
        reason: "bench".to_owned(),
        to: "person:approver".to_owned(),
        from_goal_id: goal.id(),
        expires_in_ms: 3_600_000,
        escalate_after_ms: None,
        escalate_to: None,
        approval_id: None,
    }
}

/// The next message in `goal` that `accept` takes, acknowledged (others acknowledged too).
async fn next_matching(goal: &Goal, accept: impl Fn(&switchboard_proto::InboxMessage) -> bool) {
    loop {
        let delivery = goal
            .recv(Duration::from_secs(30))
            .await
            .unwrap()
            .expect("a message within 30 s");
        let message = delivery.ack().await.unwrap();
        if accept(&message) {
            return;
        }
    }
}

fn sample(mut latencies: Vec<Duration>) -> Sample {
    latencies.sort();
    let total: Duration = latencies.iter().sum();
    Sample {
        p50: percentile(&latencies, 0.50),
        p99: percentile(&latencies, 0.99),
        per_sec: latencies.len() as f64 / total.as_secs_f64().max(1e-9),
    }
}

/// Adds the people rows and the 2× target.
pub async fn people_rows(report: &mut Report, url: &str, ops: usize) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("people.toml");
    std::fs::write(&file, PEOPLE).unwrap();
    let file = file.display().to_string();
    let env = [
        ("SWITCHBOARD_PEOPLE__FILE", file.as_str()),
        ("SWITCHBOARD_PEOPLE__MAX_OPEN_PER_SENDER", "100000"),
        ("SWITCHBOARD_PEOPLE__MAX_OPEN_PER_AGENT", "100000"),
        ("SWITCHBOARD_REQUESTS__PER_SECOND", "10000000"),
        ("SWITCHBOARD_REQUESTS__BURST", "10000000"),
    ];
    let people = ServiceProcess::start(&service_bin("people"), "people", url, &env).await;

    // The approvals left waiting, from a few agents, 64 at a time.
    let pending = bench_pending();
    let filled = Instant::now();
    let mut fillers = Vec::new();
    for f in 0..pending.div_ceil(PER_FILLER) {
        let filler = Arc::new(agent(url, &format!("bench-filler-{f}")).await);
        let goal = Arc::new(filler.open_goal().await.unwrap());
        let count = PER_FILLER.min(pending - f * PER_FILLER);
        let tasks: Vec<_> = (0..64)
            .map(|t| {
                let (filler, goal) = (Arc::clone(&filler), Arc::clone(&goal));
                tokio::spawn(async move {
                    for n in (t..count).step_by(64) {
                        filler.request_approval(approval(&goal, n)).await.unwrap();
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        fillers.push((filler, goal));
    }
    let filled = filled.elapsed();

    let ops_client = async_nats::connect(url).await.unwrap();
    let asker = agent(url, "bench-asker").await;
    let asker_goal = asker.open_goal().await.unwrap();
    let mut decided = Vec::with_capacity(ops);
    for n in 0..ops + ops / 10 {
        let parked = asker
            .request_approval(approval(&asker_goal, n))
            .await
            .unwrap();
        let started = Instant::now();
        let body = json!({"person": "approver", "item_id": parked.item_id,
            "decision": "approved", "action_hash": parked.action_hash});
        let _: serde_json::Value = switchboard_request::request::request_json(
            &ops_client,
            &PeopleOpsOp::Answer.subject(),
            &body,
            Duration::from_secs(10),
        )
        .await
        .unwrap();
        next_matching(&asker_goal, |m| {
            PersonAnswer::of(m, parked.item_id).is_some()
        })
        .await;
        if n >= ops / 10 {
            decided.push(started.elapsed());
        }
    }
    let decided = sample(decided);

    // A parked call's answer, measured the same way: from the callee's reply request to the
    // caller's fetch returning the answer.
    let caller = agent(url, "bench-parked-caller").await;
    let caller_goal = caller.open_goal().await.unwrap();
    let callee: Agent = agent(url, "bench-parked-callee").await;
    let callee_goal = callee.open_goal().await.unwrap();
    let mut answered = Vec::with_capacity(ops);
    for n in 0..ops + ops / 10 {
        let parked = caller
            .call_parked("bench-parked-callee", "approve?", Duration::from_secs(60))
            .await
            .unwrap();
        let id = parked.correlation_id;
        next_matching(&callee_goal, |m| m.correlation_id == Some(id)).await;
        let started = Instant::now();
        callee.reply(id, "approved").await.unwrap();
        next_matching(&caller_goal, |m| m.correlation_id == Some(id)).await;
        if n >= ops / 10 {
            answered.push(started.elapsed());
        }
    }
    let answered = sample(answered);
    drop(fillers);
    people.terminate().await;

    report.note_row(
        "people",
        "approvals left waiting for one person",
        format!("{pending} (requested in {:.1} s)", filled.as_secs_f64()),
    );
    report.row(
        "people",
        "a person's decision → its parked agent's fetch",
        decided,
    );
    report.row(
        "people",
        "a parked call's answer → its caller's fetch",
        answered,
    );
    report.ratio(
        "decision reaching its agent p50 / parked call answer p50",
        decided.p50.as_secs_f64() / answered.p50.as_secs_f64(),
        2.0,
        false,
    );
}
