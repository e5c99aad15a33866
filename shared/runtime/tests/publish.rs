//! `publish::publish_durable` against a real nats-server: a retried id is stored once, a
//! permanent failure is returned at once, and a transient one (no stream for the subject yet)
//! is retried until it succeeds within the budget.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};
use switchboard_runtime::publish::{PUBLISH_RETRY_BUDGET, publish_durable};
use switchboard_testkit::NatsServer;

fn config(max_message_size: i32) -> stream::Config {
    stream::Config {
        name: "PUB".into(),
        subjects: vec!["pub.>".into()],
        max_message_size,
        ..Default::default()
    }
}

#[tokio::test]
async fn retries_are_stored_once_and_only_transient_failures_are_retried() {
    let nats = NatsServer::start().await;
    let js = jetstream::new(nats.client().await);
    js.create_stream(config(1024)).await.unwrap();

    let first = publish_durable(&js, "pub.a", "id-1", "one".into())
        .await
        .unwrap();
    let again = publish_durable(&js, "pub.a", "id-1", "one".into())
        .await
        .unwrap();
    assert!(!first.duplicate);
    assert!(again.duplicate);
    assert_eq!(again.sequence, first.sequence);

    // Too large for the stream: permanent, answered without waiting out the budget.
    let started = Instant::now();
    let failure = publish_durable(&js, "pub.big", "id-2", vec![b'x'; 4096].into())
        .await
        .unwrap_err();
    assert_eq!(failure.attempts, 1, "{failure}");
    assert!(started.elapsed() < Duration::from_secs(2));

    // No stream for the subject yet (as while a stream has no leader): retried until it
    // appears.
    let creator = js.clone();
    tokio::spawn(async move {
        // A real wait: the stream is missing for 600 ms of the publisher's retries.
        tokio::time::sleep(Duration::from_millis(600)).await;
        creator
            .create_stream(stream::Config {
                name: "LATE".into(),
                subjects: vec!["late.>".into()],
                ..Default::default()
            })
            .await
            .unwrap();
    });
    let started = Instant::now();
    let stored = publish_durable(&js, "late.a", "id-3", "late".into())
        .await
        .unwrap();
    assert_eq!(stored.sequence, 1);
    assert!(started.elapsed() >= Duration::from_millis(500));
    assert!(started.elapsed() < PUBLISH_RETRY_BUDGET);
}
