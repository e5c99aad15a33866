//! send_to_peer through inbox-fanout beside raw JetStream publishes of the same payloads, on
//! the same private nats-server, in the same run (so the ratios are meaningful on any machine).
//!
//! `cargo bench -p switchboard-tests --bench fanout` (set `BENCH_OPS` to change the sequential
//! sample size; default 400). For each body size (256 B, 16 KiB) and goal count (1, 8):
//! - sequential latency (p50, p99) of one send (→ report) vs one "raw" delivery: the same
//!   InboxMessage published to each goal's subject with JetStream, acks awaited together —
//!   exactly the broker work a send needs, without gates, registry view or the request hop;
//! - throughput with 64 operations in flight.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;

use async_nats::jetstream;
use bytes::Bytes;
use switchboard_client::Agent;
use switchboard_delivery::deliver::deliver_all;
use switchboard_proto::{AgentId, GoalId, InboxMessage, new_id, subject};
use switchboard_tests::Fabric;
use switchboard_tests::bench::{keep_reading, measure, ms, ops_from_env};

const IN_FLIGHT: usize = 64;

#[tokio::main]
async fn main() {
    let ops = ops_from_env(400);
    let fabric = Fabric::start().await;
    let url = fabric.url();
    let sender = Arc::new(fabric.agent("bench-sender").await);
    let js = jetstream::new(async_nats::connect(&url).await.unwrap());

    // (goal count, receiver, goal ids). Each goal is read by a reader that keeps up, as a
    // running agent's is: the rows measure a send, not the removal of unread messages from a
    // full goal (that path is the report's own row; measured here by mistake, it made this
    // bench take minutes).
    let mut receivers: Vec<(usize, Agent, Vec<GoalId>)> = Vec::new();
    let mut keepers = Vec::new();
    let taken = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for goals in [1usize, 8] {
        let agent = fabric.agent(&format!("bench-receiver-{goals}")).await;
        let mut ids = Vec::new();
        for _ in 0..goals {
            let goal = agent.open_goal().await.unwrap();
            ids.push(goal.id());
            keepers.push(keep_reading(goal, Arc::clone(&taken)));
        }
        receivers.push((goals, agent, ids));
    }

    println!("Switchboard send_to_peer vs raw JetStream publish — same nats-server, same run");
    println!(
        "(sequential: {ops} ops after {} warm-up; throughput: {IN_FLIGHT} in flight)\n",
        ops / 10
    );
    println!(
        "| body | goals | path | p50 ms | p99 ms | ops/s ({IN_FLIGHT} in flight) |\n|---|---|---|---|---|---|"
    );
    let mut ratios = Vec::new();
    for size in [256usize, 16 * 1024] {
        let body: String = "x".repeat(size);
        for (goals, receiver, goal_ids) in &receivers {
            let to = receiver.id().to_string();

            // Raw: the same InboxMessage, one JetStream publish per goal, acks together.
            let message = InboxMessage::new(
                AgentId::parse("bench-sender").unwrap(),
                GoalId::new(),
                receiver.id().clone(),
                body.clone(),
            );
            let payload = Bytes::from(serde_json::to_vec(&message).unwrap());
            let (js_raw, ids) = (js.clone(), goal_ids.clone());
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

            let (agent, to_peer, text, expect) =
                (Arc::clone(&sender), to.clone(), body.clone(), *goals);
            let ours = measure(ops, 4, IN_FLIGHT, move || {
                let (agent, to_peer, text) = (Arc::clone(&agent), to_peer.clone(), text.clone());
                async move {
                    let report = agent.send_to_peer(&to_peer, &text).await.unwrap();
                    assert_eq!(report.delivered_to.len(), expect, "{report:?}");
                }
            })
            .await;

            let label = if size >= 1024 {
                format!("{} KiB", size / 1024)
            } else {
                format!("{size} B")
            };
            for (path, s) in [("raw JetStream", &raw), ("send_to_peer", &ours)] {
                println!(
                    "| {label} | {goals} | {path} | {} | {} | {:.0} |",
                    ms(s.p50),
                    ms(s.p99),
                    s.per_sec
                );
            }
            let lat = ours.p50.as_secs_f64() / raw.p50.as_secs_f64();
            let lat99 = ours.p99.as_secs_f64() / raw.p99.as_secs_f64();
            let thr = ours.per_sec / raw.per_sec;
            println!(
                "| {label} | {goals} | ratio ours/raw | {lat:.2}× | {lat99:.2}× | {thr:.2}× |"
            );
            ratios.push((label, *goals, lat, thr));
        }
    }
    println!();
    for (label, goals, lat, thr) in ratios {
        println!(
            "{label}, {goals} goal(s): send_to_peer p50 is {lat:.2}× raw; throughput is {:.0}% of raw",
            thr * 100.0
        );
    }
    for keeper in keepers {
        keeper.abort();
    }
}
