//! The substrate under the reliability suite's node faults: raw JetStream (no Switchboard) on
//! a 3-node cluster with an R3 stream shaped like `AGENT_INBOX` (64 per subject, discard old,
//! direct get), 10 publishers with message ids retrying until acknowledged, each node stopped
//! with SIGTERM and then SIGKILL in turn. Every acknowledged publish must be in the stream
//! afterwards: Switchboard's "nothing acknowledged is lost" rests on this (tests/reliability.rs
//! checks the same faults end to end).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_nats::jetstream::{self, stream};
use futures::StreamExt;
use switchboard_testkit::NatsCluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_jetstream_keeps_acknowledged_publishes_through_node_faults() {
    let mut cluster = NatsCluster::start(3).await;
    let urls = cluster.urls();
    let admin = jetstream::new(cluster.client(0).await);
    switchboard_testkit::create_stream(
        &admin,
        stream::Config {
            name: "RAW".into(),
            subjects: vec!["raw.>".into()],
            num_replicas: 3,
            // One subject per message below, so the cap never evicts what is checked.
            max_messages_per_subject: 64,
            allow_direct: true,
            max_age: Duration::from_secs(86_400),
            discard: stream::DiscardPolicy::Old,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let mut publishers = Vec::new();
    for p in 0..10usize {
        let rotated: Vec<String> = (0..3).map(|i| urls[(p + i) % 3].clone()).collect();
        let client = async_nats::ConnectOptions::new()
            .connect(
                rotated
                    .iter()
                    .map(|url| url.parse::<async_nats::ServerAddr>().unwrap())
                    .collect::<Vec<_>>(),
            )
            .await
            .unwrap();
        let js = jetstream::new(client);
        let stop = Arc::clone(&stop);
        publishers.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let id = format!("{p}-{n}");
                for _ in 0..100 {
                    let mut headers = async_nats::HeaderMap::new();
                    headers.insert("Nats-Msg-Id", id.as_str());
                    let sent = js
                        .publish_with_headers(format!("raw.{p}.{n}"), headers, id.clone().into())
                        .await;
                    let ack = match sent {
                        Ok(future) => future.await,
                        Err(err) => Err(err),
                    };
                    match ack {
                        Ok(ack) => {
                            acked.push((id.clone(), ack.sequence, ack.duplicate));
                            break;
                        }
                        // A real wait: back off before publishing the same id again.
                        Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                    }
                }
                n += 1;
                // A real wait: each publisher is paced at one message per 20 ms.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            acked
        }));
    }
    // A real wait: traffic flows for a while before the first fault.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for node in 0..3 {
        cluster.terminate_node(node).await;
        // A real wait: the node stays down for a second of traffic.
        tokio::time::sleep(Duration::from_secs(1)).await;
        cluster.start_node(node).await;
        // A real wait: a second of traffic before the next fault.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    for node in 0..3 {
        cluster.stop_node(node).await;
        // A real wait: the node stays down for a second of traffic.
        tokio::time::sleep(Duration::from_secs(1)).await;
        cluster.start_node(node).await;
        // A real wait: a second of traffic before the next fault.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut acked = Vec::new();
    for publisher in publishers {
        acked.extend(publisher.await.unwrap());
    }
    // Everything in the stream now. The last node restarted a second ago, so the stream may
    // still be electing a leader: ask until it answers (bounded).
    let js = jetstream::new(cluster.client(1).await);
    let consumer = std::cell::RefCell::new(None);
    let last_error = std::cell::RefCell::new(String::from("no answer"));
    let _answered = switchboard_testkit::eventually(Duration::from_secs(30), || async {
        let attempt = async {
            js.get_stream("RAW")
                .await
                .map_err(|err| err.to_string())?
                .create_consumer(jetstream::consumer::pull::OrderedConfig::default())
                .await
                .map_err(|err| err.to_string())
        };
        match attempt.await {
            Ok(created) => {
                *consumer.borrow_mut() = Some(created);
                true
            }
            Err(err) => {
                println!("stream not ready yet ({err}); asking again");
                *last_error.borrow_mut() = err;
                false
            }
        }
    })
    .await;
    let consumer = consumer.into_inner().unwrap_or_else(|| {
        panic!(
            "the RAW stream did not answer within 30 s: {}",
            last_error.borrow()
        )
    });
    let total = consumer.cached_info().num_pending;
    let mut present = std::collections::BTreeMap::new();
    let mut messages = consumer.messages().await.unwrap();
    for _ in 0..total {
        let message = tokio::time::timeout(Duration::from_secs(5), messages.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let seq = message.info().unwrap().stream_sequence;
        present.insert(String::from_utf8_lossy(&message.payload).to_string(), seq);
    }
    let lost: Vec<_> = acked
        .iter()
        .filter(|(id, _, _)| !present.contains_key(id))
        .collect();
    println!(
        "raw: {} acknowledged, {} in the stream, lost {}: {:?}",
        acked.len(),
        present.len(),
        lost.len(),
        &lost[..lost.len().min(10)]
    );
    assert!(lost.is_empty());
}
