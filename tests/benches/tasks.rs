//! Task operations through task-lifecycle beside raw NATS request/reply, on the same private
//! nats-server, in the same run.
//!
//! `cargo bench -p switchboard-tests --bench tasks` (`BENCH_OPS` sets the sequential sample,
//! default 300):
//! - **raw request/reply**: `client.request` to a subject a plain subscriber answers;
//! - **create**: `Agent::give_task` → `agent.task.create.<me>` (cards and goals read, index
//!   entries and record written, the `kind: task` message stored in the assignee's inbox, the
//!   event stored);
//! - **one transition**: `accept` (record CAS, load reservation, event, `task_update` to the
//!   requester's goal, load report to the directory);
//! - **whole life**: create → accept → start → complete, four requests one after another.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;

use futures::StreamExt;
use switchboard_client::TaskOutcome;
use switchboard_tests::bench::{measure, ms, ops_from_env};
use switchboard_tests::{Fabric, agent_with, card};

const IN_FLIGHT: usize = 64;

#[tokio::main]
async fn main() {
    let ops = ops_from_env(300);
    let fabric = Fabric::start().await;
    let url = fabric.url();

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
    let payload = bytes::Bytes::from("x".repeat(256));
    let raw = measure(ops, 2, IN_FLIGHT, move || {
        let (client, payload) = (requester.clone(), payload.clone());
        async move {
            client.request("bench.echo", payload).await.unwrap();
        }
    })
    .await;

    let boss = Arc::new(fabric.agent("bench-boss").await);
    let _boss_goal = boss.open_goal().await.unwrap();
    let mut worker_card = card("bench-worker");
    worker_card.max_concurrent_tasks = 1_000_000;
    let worker =
        Arc::new(agent_with(&url, worker_card, std::time::Duration::from_secs(3600)).await);
    let _worker_goal = worker.open_goal().await.unwrap();
    let what = "x".repeat(256);

    let create = {
        let (boss, what) = (Arc::clone(&boss), what.clone());
        measure(ops, 2, IN_FLIGHT, move || {
            let (boss, what) = (Arc::clone(&boss), what.clone());
            async move {
                boss.give_task("bench-worker", &what).await.unwrap();
            }
        })
        .await
    };

    // Accept needs a fresh submitted task per op: create them first, hand them out in order.
    let total = ops / 10 + ops + (ops * 2).div_ceil(IN_FLIGHT).max(4) * IN_FLIGHT;
    let mut ids = Vec::with_capacity(total);
    for _ in 0..total {
        ids.push(
            boss.give_task("bench-worker", &what)
                .await
                .unwrap()
                .task
                .task_id,
        );
    }
    let ids = Arc::new(std::sync::Mutex::new(ids));
    let accept = {
        let worker = Arc::clone(&worker);
        measure(ops, 2, IN_FLIGHT, move || {
            let worker = Arc::clone(&worker);
            let id = ids.lock().unwrap().pop().unwrap();
            async move {
                worker.accept_task(id).await.unwrap();
            }
        })
        .await
    };

    // A fresh worker: the accept run left hundreds of tasks active on the first one, and an
    // active set is read and written whole.
    let mut fresh_card = card("bench-worker-2");
    fresh_card.max_concurrent_tasks = 1_000_000;
    let fresh = Arc::new(agent_with(&url, fresh_card, std::time::Duration::from_secs(3600)).await);
    let _fresh_goal = fresh.open_goal().await.unwrap();
    let life = {
        let (boss, worker) = (Arc::clone(&boss), Arc::clone(&fresh));
        measure(ops, 2, IN_FLIGHT, move || {
            let (boss, worker, what) = (Arc::clone(&boss), Arc::clone(&worker), what.clone());
            async move {
                let id = boss
                    .give_task("bench-worker-2", &what)
                    .await
                    .unwrap()
                    .task
                    .task_id;
                worker.accept_task(id).await.unwrap();
                worker.start_task(id).await.unwrap();
                worker
                    .complete_task(id, TaskOutcome::text("done"))
                    .await
                    .unwrap();
            }
        })
        .await
    };

    println!("Switchboard task operations vs raw NATS request/reply — same nats-server, same run");
    println!(
        "(256 B text; sequential: {ops} ops after warm-up; throughput: {IN_FLIGHT} in flight)\n"
    );
    println!(
        "| path | p50 ms | p99 ms | ops/s ({IN_FLIGHT} in flight) | p50 / raw |\n|---|---|---|---|---|"
    );
    for (path, s) in [
        ("raw request/reply", &raw),
        ("create", &create),
        ("accept (one transition)", &accept),
        ("whole life (4 requests)", &life),
    ] {
        println!(
            "| {path} | {} | {} | {:.0} | {:.2}× |",
            ms(s.p50),
            ms(s.p99),
            s.per_sec,
            s.p50.as_secs_f64() / raw.p50.as_secs_f64()
        );
    }
}
