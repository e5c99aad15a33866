//! Files by reference on a 3-node R3 cluster (docs/protocol.md §17): a file uploaded through
//! one node is read through another while the node the files service is connected to is
//! killed mid-download. The read goes on from where it stood (by offset and stream sequence),
//! and the bytes hash to the declared digest.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use sha2::{Digest, Sha256};
use switchboard_proto::send::SendRequest;
use switchboard_testkit::NatsCluster;
use switchboard_tests::files::{attachments_of, data, hex};
use switchboard_tests::services::{Service, cluster_runtime, rotated};
use switchboard_tests::{agent_on, start_services_across};
use tokio::io::AsyncReadExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_survives_the_kill_of_its_services_node() {
    let mut cluster = NatsCluster::start(3).await;
    let urls = cluster.urls();
    let shutdown = start_services_across(&urls, false).await;
    // The files service connects to node 1 first: that is the node killed.
    let files = Service::Files(Default::default())
        .start(&cluster_runtime(rotated(&urls, 1)))
        .await;
    let alice = agent_on(&urls[0], "alice").await;
    let bob = agent_on(&urls[2], "bob").await;
    let bob_goal = bob.open_goal().await.unwrap();
    let bytes = data(6 * 1024 * 1024 + 777);
    let attachment = alice
        .upload_bytes("weights.bin", "application/octet-stream", &bytes)
        .await
        .unwrap();
    alice
        .send(SendRequest {
            to: Some("bob".into()),
            message: Some("the weights".into()),
            attachments: vec![attachment.clone()],
            ..Default::default()
        })
        .await
        .unwrap();
    let got = attachments_of(&bob_goal).await;

    // Bob's download writes into a pipe this test drains: it holds the download after the
    // first 2 MiB while node 1 is killed, then lets it go on.
    let (mut drain, mut pipe) = tokio::io::duplex(256 * 1024);
    let downloading = tokio::spawn(async move {
        let written = bob.download(&got[0], &mut pipe).await;
        drop(pipe);
        written
    });
    let mut read = vec![0u8; 2 * 1024 * 1024];
    drain.read_exact(&mut read).await.unwrap();
    cluster.stop_node(1).await;
    let mut rest = Vec::new();
    drain.read_to_end(&mut rest).await.unwrap();
    read.extend_from_slice(&rest);
    let written = tokio::time::timeout(Duration::from_secs(60), downloading)
        .await
        .expect("the download ends within 60 s")
        .unwrap()
        .expect("the download resumes and its digest is right");
    assert_eq!(written, bytes.len() as u64);
    assert_eq!(hex(&Sha256::digest(&read)), attachment.sha256);
    assert_eq!(read, bytes);

    cluster.start_node(1).await;
    files.stop().await;
    shutdown.cancel();
}
