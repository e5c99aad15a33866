//! A waiting call through the reply-correlator beside raw NATS request/reply, on the same
//! private nats-server, in the same run.
//!
//! `cargo bench -p switchboard-tests --bench calls` (`BENCH_OPS` sets the sequential sample,
//! default 300). Both sides answer with the question's text:
//! - **raw request/reply**: `client.request` to a subject a plain subscriber answers;
//! - **call**: `Agent::call` → `agent.call.<me>` → correlator → inbox-fanout → the callee's
//!   goal inbox → the callee's runtime (pull, ack) → `agent.reply.<callee>` → correlator →
//!   hand-over to the waiting correlator → answer.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use switchboard_proto::MessageKind;
use switchboard_tests::bench::{measure, ms, ops_from_env};
use switchboard_tests::{Fabric, fast_calls};

const IN_FLIGHT: usize = 64;

#[tokio::main]
async fn main() {
    let ops = ops_from_env(300);
    let fabric = Fabric::start_full(
        inbox_fanout::FanoutConfig::default(),
        reply_correlator::CorrelatorConfig {
            // 64 calls in flight from one agent.
            max_open_calls: 1_000,
            ..fast_calls()
        },
    )
    .await;
    let url = fabric.url();
    let question = "x".repeat(256);

    // Raw: a plain responder echoing the request.
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
    let payload = bytes::Bytes::from(question.clone());
    let raw = measure(ops, 2, IN_FLIGHT, move || {
        let (client, payload) = (requester.clone(), payload.clone());
        async move {
            client.request("bench.echo", payload).await.unwrap();
        }
    })
    .await;

    // Call: the callee's runtime pulls each request and answers it (answers in parallel).
    let callee = Arc::new(fabric.agent("bench-callee").await);
    let goal = callee.open_goal().await.unwrap();
    let answerer = Arc::clone(&callee);
    tokio::spawn(async move {
        loop {
            let Ok(Some(delivery)) = goal.recv(Duration::from_secs(60)).await else {
                continue;
            };
            let answerer = Arc::clone(&answerer);
            tokio::spawn(async move {
                let message = delivery.ack().await.unwrap();
                if message.kind == MessageKind::Request {
                    answerer
                        .reply(message.correlation_id.unwrap(), &message.body)
                        .await
                        .unwrap();
                }
            });
        }
    });
    let caller = Arc::new(fabric.agent("bench-caller").await);
    let _caller_goal = caller.open_goal().await.unwrap();
    let call = measure(ops, 2, IN_FLIGHT, move || {
        let (caller, question) = (Arc::clone(&caller), question.clone());
        async move {
            let answer = caller
                .call("bench-callee", &question, Duration::from_secs(30))
                .await
                .unwrap();
            assert_eq!(answer.body.len(), 256);
        }
    })
    .await;

    println!("Switchboard call round trip vs raw NATS request/reply — same nats-server, same run");
    println!(
        "(256 B question; sequential: {ops} ops after warm-up; throughput: {IN_FLIGHT} in flight)\n"
    );
    println!(
        "| path | p50 ms | p99 ms | round trips/s ({IN_FLIGHT} in flight) |\n|---|---|---|---|"
    );
    for (path, s) in [("raw request/reply", &raw), ("call (wait)", &call)] {
        println!(
            "| {path} | {} | {} | {:.0} |",
            ms(s.p50),
            ms(s.p99),
            s.per_sec
        );
    }
    println!(
        "| ratio call/raw | {:.2}× | {:.2}× | {:.2}× |",
        call.p50.as_secs_f64() / raw.p50.as_secs_f64(),
        call.p99.as_secs_f64() / raw.p99.as_secs_f64(),
        call.per_sec / raw.per_sec
    );
}
