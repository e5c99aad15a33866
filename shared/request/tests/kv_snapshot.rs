//! `kv::snapshot` against a real nats-server: latest values, deletes skipped, filters, and
//! concurrent writers never produce duplicates or missing keys.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use async_nats::jetstream::{self, kv};
use switchboard_request::kv::snapshot;
use switchboard_testkit::NatsServer;

async fn bucket(js: &jetstream::Context, name: &str, history: i64) -> kv::Store {
    js.create_key_value(kv::Config {
        bucket: name.into(),
        history,
        ..Default::default()
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn snapshot_reads_latest_live_values() {
    let nats = NatsServer::start().await;
    let js = jetstream::new(nats.client().await);
    let store = bucket(&js, "snap", 5).await;
    assert!(snapshot(&js, &store, ">").await.unwrap().is_empty());

    store.put("a.1", "one".into()).await.unwrap();
    store.put("a.2", "two".into()).await.unwrap();
    store.put("b.1", "three".into()).await.unwrap();
    store.delete("a.2").await.unwrap();
    store.put("a.1", "uno".into()).await.unwrap();
    store.put("c.1", "gone".into()).await.unwrap();
    store.purge("c.1").await.unwrap();

    let mut all = snapshot(&js, &store, ">").await.unwrap();
    all.sort_by(|a, b| a.key.cmp(&b.key));
    let pairs: Vec<(String, String)> = all
        .iter()
        .map(|e| (e.key.clone(), String::from_utf8(e.value.to_vec()).unwrap()))
        .collect();
    assert_eq!(
        pairs,
        vec![("a.1".into(), "uno".into()), ("b.1".into(), "three".into())]
    );
    let entry = store.entry("a.1").await.unwrap().unwrap();
    assert_eq!(all[0].revision, entry.revision);

    let only_a = snapshot(&js, &store, "a.*").await.unwrap();
    assert_eq!(only_a.len(), 1);
    assert_eq!(only_a[0].key, "a.1");
}

#[tokio::test]
async fn snapshot_under_concurrent_writes_has_each_key_once() {
    let nats = NatsServer::start().await;
    let js = jetstream::new(nats.client().await);
    let store = bucket(&js, "busy", 1).await;
    for i in 0..50 {
        store.put(format!("k{i:02}"), "0".into()).await.unwrap();
    }
    let writer_store = store.clone();
    let writer = tokio::spawn(async move {
        for round in 1..=40 {
            for i in 0..50 {
                writer_store
                    .put(format!("k{i:02}"), round.to_string().into())
                    .await
                    .unwrap();
            }
        }
    });
    let want: BTreeSet<String> = (0..50).map(|i| format!("k{i:02}")).collect();
    while !writer.is_finished() {
        let keys: Vec<String> = snapshot(&js, &store, ">")
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.key)
            .collect();
        assert_eq!(keys.len(), 50, "no duplicates, nothing missing");
        assert_eq!(keys.into_iter().collect::<BTreeSet<_>>(), want);
    }
    writer.await.unwrap();
}

#[tokio::test]
async fn snapshot_of_more_keys_than_one_direct_batch_is_complete() {
    let nats = NatsServer::start().await;
    let client = nats.client().await;
    let js = jetstream::new(client.clone());
    let store = bucket(&js, "large", 1).await;
    // 3000 keys, published without waiting for each ack.
    let mut acks = Vec::new();
    for i in 0..3000 {
        acks.push(
            js.publish(format!("$KV.large.k{i:04}"), "v".into())
                .await
                .unwrap(),
        );
    }
    for ack in acks {
        ack.await.unwrap();
    }
    store.delete("k0010").await.unwrap();
    let keys: Vec<String> = snapshot(&js, &store, ">")
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.key)
        .collect();
    assert_eq!(keys.len(), 2999);
    assert_eq!(keys.iter().collect::<BTreeSet<_>>().len(), 2999);
    assert!(!keys.contains(&"k0010".to_owned()));

    // The scan path (used above 1024 keys) under a concurrent writer: complete, no duplicates.
    let writer_store = store.clone();
    let writer = tokio::spawn(async move {
        for round in 0..3 {
            for i in (0..3000).step_by(7) {
                writer_store
                    .put(format!("k{i:04}"), format!("r{round}").into())
                    .await
                    .unwrap();
            }
        }
    });
    let mut scans = 0;
    while !writer.is_finished() || scans == 0 {
        let keys: Vec<String> = switchboard_request::kv::scan_snapshot(&js, &store, ">")
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.key)
            .collect();
        let unique: BTreeSet<_> = keys.iter().collect();
        assert_eq!(unique.len(), keys.len(), "no duplicates");
        // k0010 was deleted, but the writer may bring it back (10 is not a multiple of 7).
        assert_eq!(keys.len(), 2999, "nothing missing");
        scans += 1;
    }
    writer.await.unwrap();
}
