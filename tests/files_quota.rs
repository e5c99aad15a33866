//! Files by reference (docs/protocol.md §17): what bounds an agent's files — the largest file,
//! the quota (reserved before any data moves, every file counting at least one chunk), sizes
//! past any bound —, reads answered only into the caller's own reply inbox, and a grant that
//! runs out with its message.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use serde_json::json;
use switchboard_proto::ErrorKind;
use switchboard_proto::files::{FILE_CHUNK_BYTES, FilesOp};
use switchboard_tests::files::{error_kind, fabric_with_files, kind};
use switchboard_tests::wire::raw;

#[tokio::test]
async fn quota_and_size_are_refused_before_any_data_moves() {
    let config = files::FilesConfig {
        max_file_bytes: 4 * 1024 * 1024,
        quota_bytes: 5 * 1024 * 1024,
        ..Default::default()
    };
    let (fabric, _files) = fabric_with_files(config).await;
    let agent = fabric.agent("hoarder").await;
    let mut empty = tokio::io::empty();
    let err = agent
        .files()
        .upload(
            "big.bin",
            "application/octet-stream",
            4 * 1024 * 1024 + 1,
            &"0".repeat(64),
            &mut empty,
        )
        .await
        .unwrap_err();
    assert_eq!(kind(&err), ErrorKind::FileTooLarge, "{err}");
    // A flood of declared uploads stops at the quota, never finished or not.
    let mut declared = 0;
    for n in 0..10 {
        let started = raw(
            agent.nats(),
            &FilesOp::Upload.subject(agent.id()),
            serde_json::to_vec(&json!({
                "name": format!("f{n}"), "media_type": "application/octet-stream",
                "size": 1024 * 1024, "sha256": "0".repeat(64),
            }))
            .unwrap(),
        )
        .await;
        if started.body.get("error").is_some() {
            assert_eq!(started.error_kind(), "quota_exceeded");
            break;
        }
        declared += 1;
    }
    assert_eq!(declared, 5, "5 MiB of quota holds five 1 MiB uploads");
    // Numbers past any size (2^63, u64::MAX) are refused as too large, never wrapped round
    // into a small reservation; a negative or fractional one is not a size at all.
    for (size, want) in [
        (json!(1u64 << 63), "file_too_large"),
        (json!(u64::MAX), "file_too_large"),
        (json!(-1), "bad_request"),
        (json!(1.5), "bad_request"),
    ] {
        let refused = raw(
            agent.nats(),
            &FilesOp::Upload.subject(agent.id()),
            serde_json::to_vec(&json!({
                "name": "huge.bin", "media_type": "application/octet-stream",
                "size": size, "sha256": "0".repeat(64),
            }))
            .unwrap(),
        )
        .await;
        assert_eq!(refused.error_kind(), want, "size {size}");
    }
    // Another agent's quota is its own.
    let other = fabric.agent("modest").await;
    other
        .upload_bytes("small.txt", "text/plain", b"hello")
        .await
        .unwrap();
}

#[tokio::test]
async fn reads_go_to_the_callers_own_inbox_and_tiny_files_count_a_chunk() {
    let config = files::FilesConfig {
        quota_bytes: 4 * FILE_CHUNK_BYTES as u64,
        ..Default::default()
    };
    let (fabric, _files) = fabric_with_files(config).await;
    let agent = fabric.agent("tiny").await;
    // Each file counts at least one chunk against the quota, so empty or one-byte files are
    // not free: four fit, the fifth does not.
    let mut kept = Vec::new();
    for n in 0..4 {
        kept.push(
            agent
                .upload_bytes(&format!("{n}.txt"), "text/plain", b"")
                .await
                .unwrap(),
        );
    }
    let err = agent
        .upload_bytes("4.txt", "text/plain", b"x")
        .await
        .unwrap_err();
    assert_eq!(kind(&err), ErrorKind::QuotaExceeded, "{err}");
    let one = agent.file_delete(kept[0].file_ref).await.unwrap();
    assert!(one.deleted);
    agent
        .upload_bytes("4.txt", "text/plain", b"x")
        .await
        .unwrap();

    // A read whose reply inbox is another agent's is refused: the chunks go nowhere else.
    let client = agent.nats().clone();
    let inbox = "_INBOX.victim.x1";
    let mut sniffed = client.subscribe(inbox).await.unwrap();
    let body = serde_json::to_vec(&json!({"file_id": kept[1].file_ref, "offset": 0})).unwrap();
    client
        .publish_with_reply(FilesOp::Read.subject(agent.id()), inbox, body.into())
        .await
        .unwrap();
    let reply = tokio::time::timeout(
        Duration::from_secs(5),
        futures::StreamExt::next(&mut sniffed),
    )
    .await
    .ok()
    .flatten();
    // The scaffold never answers into a subject that is not the caller's own reply inbox:
    // either nothing comes, or a refusal does, never a chunk.
    if let Some(message) = reply {
        let value: serde_json::Value = serde_json::from_slice(&message.payload).unwrap();
        assert_eq!(error_kind(&value), "bad_request", "{value}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_runs_out_with_the_message_and_then_reads_nothing() {
    use switchboard_tests::fabric::{agent_with, card};
    use switchboard_tests::services::{Service, runtime};

    // A fabric whose messages' files are kept 3 s past each delivery.
    let nats = switchboard_testkit::NatsServer::start().await;
    let mut settings = runtime(&nats.url());
    settings.jetstream.files_retention_secs = 3;
    let _directory = Service::Directory(Default::default())
        .start(&settings)
        .await;
    let _fanout = Service::Fanout(Default::default()).start(&settings).await;
    let _files = Service::Files(Default::default()).start(&settings).await;
    let sender = agent_with(&nats.url(), card("sender"), Duration::from_secs(3600)).await;
    let reader = agent_with(&nats.url(), card("reader"), Duration::from_secs(3600)).await;
    let goal = reader.open_goal().await.unwrap();
    let file = sender
        .upload_bytes("note.txt", "text/plain", b"for a while")
        .await
        .unwrap();
    sender
        .send(switchboard_proto::send::SendRequest {
            to: Some("reader".into()),
            message: Some("read it soon".into()),
            attachments: vec![file.clone()],
            ..Default::default()
        })
        .await
        .unwrap();
    let got = switchboard_tests::files::attachments_of(&goal).await;
    assert_eq!(
        reader.read_attachment(&got[0]).await.unwrap(),
        b"for a while"
    );
    // Past the retention the grant is over: the reader may neither read nor pass it on.
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    let err = reader.read_attachment(&got[0]).await.unwrap_err();
    assert_eq!(kind(&err), ErrorKind::NotFound, "{err}");
    let passed = reader
        .send(switchboard_proto::send::SendRequest {
            to: Some("sender".into()),
            message: Some("back to you".into()),
            attachments: got,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(kind(&passed), ErrorKind::NotFound, "{passed}");
}
