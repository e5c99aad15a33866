//! Audit ingest beside a raw JetStream consumer, on the same private nats-server, in the same
//! run.
//!
//! `cargo bench -p switchboard-tests --bench audit` (`BENCH_OPS` × 50 messages, default
//! 15,000). `AGENT_INBOX` is filled with that many 256 B inbox messages first; then:
//! - **raw consume**: a durable pull consumer with explicit ack reads and acks every message;
//! - **audit ingest**: an audit replica (in-memory index) turns every message into a
//!   hash-chained record in `AGENT_AUDIT` — pull, build, index lookup, pipelined publish with
//!   expected last sequence, index insert, ack — timed until the last record is stored.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer};
use futures::StreamExt;
use switchboard_proto::{AUDIT_STREAM, INBOX_STREAM};
use switchboard_tests::bench::{fill_inbox, ops_from_env};
use switchboard_tests::{fast_audit, runtime, start_audit};

#[tokio::main]
async fn main() {
    let total = ops_from_env(300) * 50;
    let nats = switchboard_testkit::NatsServer::start().await;
    let url = nats.url();
    let client = async_nats::connect(&url).await.unwrap();
    let js = jetstream::new(client.clone());
    let settings = runtime(&url).jetstream;
    switchboard_runtime::resources::ensure_stream(
        &js,
        switchboard_runtime::resources::inbox_stream(&settings),
    )
    .await
    .unwrap();

    fill_inbox(&js, total, &"x".repeat(256)).await;

    // Raw: one durable pull consumer reading and acking everything.
    let inbox = js.get_stream(INBOX_STREAM).await.unwrap();
    let raw_consumer = inbox
        .create_consumer(consumer::pull::Config {
            durable_name: Some("bench-raw".into()),
            ack_policy: consumer::AckPolicy::Explicit,
            max_ack_pending: 4096,
            ..Default::default()
        })
        .await
        .unwrap();
    let started = Instant::now();
    let mut messages = raw_consumer.messages().await.unwrap();
    let mut read = 0;
    while read < total {
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
        message.ack().await.unwrap();
        read += 1;
    }
    let raw = started.elapsed();

    // Audit: from start to the last record stored.
    let started = Instant::now();
    let (_audit, _trail) = start_audit(&url, fast_audit()).await;
    let mut audit_stream = js.get_stream(AUDIT_STREAM).await.unwrap();
    loop {
        let stored = audit_stream.info().await.unwrap().state.messages;
        if stored >= total as u64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let audit = started.elapsed();
    let verified = switchboard_client::audit_verify(&client).await.unwrap();
    assert!(
        verified.ok && verified.records >= total as u64,
        "{verified:?}"
    );

    let rate = |d: Duration| total as f64 / d.as_secs_f64();
    println!("Audit ingest vs raw JetStream consume — same nats-server, same run");
    println!(
        "({total} inbox messages of 256 B; raw: pull + ack each; audit: until the last record is stored)\n"
    );
    println!("| path | seconds | messages/s |\n|---|---|---|");
    println!(
        "| raw consume (pull, ack) | {:.3} | {:.0} |",
        raw.as_secs_f64(),
        rate(raw)
    );
    println!(
        "| audit ingest (record, chain, index, ack) | {:.3} | {:.0} |",
        audit.as_secs_f64(),
        rate(audit)
    );
    println!("| ratio audit/raw | | {:.2} |", rate(audit) / rate(raw));
}
