//! Files between agents, by reference (docs/protocol.md §17), against a real nats-server: an
//! upload in chunks through the files service, an attachment on a send, reads by whoever it
//! was delivered to and nobody else, the bytes stored once however many hops, in the
//! JetStream Object Store's own format. And the attacks: a size or digest that lies, chunks
//! out of order or repeated, a reference to another agent's file, a revoked reader, a flood of
//! uploads against the quota, names that climb out of a folder, media types that forge lines,
//! a never-finished upload.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use async_nats::HeaderMap;
use bytes::Bytes;
use serde_json::json;
use sha2::{Digest, Sha256};
use switchboard_client::{Agent, ClientError};
use switchboard_proto::files::{
    Attachment, FilesOp, HEADER_FILE_ID, HEADER_FILE_OFFSET, chunk_bytes_for,
};
use switchboard_proto::send::SendRequest;
use switchboard_proto::{AgentId, ErrorKind};
use switchboard_tests::files::{attachments_of, data, error_kind, fabric_with_files, hex, kind};
use switchboard_tests::wire::raw;

async fn send_with(
    from: &Agent,
    to: &str,
    attachments: Vec<Attachment>,
) -> Result<(), ClientError> {
    let report = from
        .send(SendRequest {
            to: Some(to.to_owned()),
            message: Some("a file for you".to_owned()),
            attachments,
            ..Default::default()
        })
        .await?;
    assert_eq!(report.delivered_to.len(), 1, "{report:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_passes_three_hops_intact_and_is_stored_once() {
    let (fabric, _files) = fabric_with_files(Default::default()).await;
    let a = fabric.agent("hop-a").await;
    let (b, b_goal) = fabric.agent_with_goal("hop-b").await;
    let (c, c_goal) = fabric.agent_with_goal("hop-c").await;
    // Not a whole number of chunks: the last one is short.
    let bytes = data(8 * 1024 * 1024 + 12_345);
    let attachment = a
        .upload_bytes("model-output.bin", "application/octet-stream", &bytes)
        .await
        .unwrap();
    assert_eq!(attachment.size, bytes.len() as u64);
    assert_eq!(attachment.sha256, hex(&Sha256::digest(&bytes)));

    send_with(&a, "hop-b", vec![attachment.clone()])
        .await
        .unwrap();
    let got = attachments_of(&b_goal).await;
    assert_eq!(got, vec![attachment.clone()]);
    assert_eq!(b.read_attachment(&got[0]).await.unwrap(), bytes);

    // B forwards the reference; C reads the same bytes.
    send_with(&b, "hop-c", got.clone()).await.unwrap();
    let forwarded = attachments_of(&c_goal).await;
    assert_eq!(forwarded, vec![attachment.clone()]);
    let mut saved = Vec::new();
    c.download(&forwarded[0], &mut saved).await.unwrap();
    assert_eq!(hex(&Sha256::digest(&saved)), attachment.sha256);

    // One copy: the Object Store's stream holds the file's bytes once (plus headers and the
    // object's info), and any NATS client reads it as an Object Store object.
    let client = fabric.nats.client().await;
    let js = async_nats::jetstream::new(client);
    let mut stream = js
        .get_stream(switchboard_proto::FILES_STREAM)
        .await
        .unwrap();
    let stored = stream.info().await.unwrap().state.bytes;
    assert!(
        stored >= bytes.len() as u64 && stored < bytes.len() as u64 + 64 * 1024,
        "{stored} bytes stored for a file of {}",
        bytes.len()
    );
    let store = js
        .get_object_store(switchboard_proto::FILES_BUCKET)
        .await
        .unwrap();
    let mut object = store.get(attachment.file_ref.to_string()).await.unwrap();
    let mut read = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(&mut object, &mut read)
        .await
        .unwrap();
    assert_eq!(
        read, bytes,
        "the Object Store reads the same bytes, its digest checked"
    );
}

#[tokio::test]
async fn nobody_else_reads_or_passes_on_a_file_whatever_they_guess() {
    let (fabric, _files) = fabric_with_files(Default::default()).await;
    let owner = fabric.agent("owner").await;
    let (reader, reader_goal) = fabric.agent_with_goal("reader").await;
    let (_victim, victim_goal) = fabric.agent_with_goal("victim").await;
    let thief = fabric.agent("thief").await;
    let secret = owner
        .upload_bytes("secret.txt", "text/plain", b"the plans")
        .await
        .unwrap();

    // Knowing the reference (ids leak: logs, prompts) gives nothing.
    let err = thief.read_attachment(&secret).await.unwrap_err();
    assert_eq!(kind(&err), ErrorKind::NotFound, "{err}");
    let err = thief.file_stat(secret.file_ref).await.unwrap_err();
    assert_eq!(kind(&err), ErrorKind::NotFound, "{err}");
    // Nor may it pass the reference on to get a grant for someone it controls.
    let err = send_with(&thief, "victim", vec![secret.clone()])
        .await
        .unwrap_err();
    assert_eq!(kind(&err), ErrorKind::NotFound, "{err}");
    assert!(
        victim_goal
            .recv(Duration::from_millis(300))
            .await
            .unwrap()
            .is_none(),
        "nothing was delivered"
    );
    // Nor revoke or delete it.
    for err in [
        thief.file_revoke(secret.file_ref, None).await.unwrap_err(),
        thief.file_delete(secret.file_ref).await.unwrap_err(),
    ] {
        assert_eq!(kind(&err), ErrorKind::NotFound, "{err}");
    }

    // A reader it was delivered to reads it; it may not dress it up as another file.
    send_with(&owner, "reader", vec![secret.clone()])
        .await
        .unwrap();
    let got = attachments_of(&reader_goal).await;
    assert_eq!(reader.read_attachment(&got[0]).await.unwrap(), b"the plans");
    for lie in [
        Attachment {
            name: "invoice.pdf".into(),
            ..secret.clone()
        },
        Attachment {
            size: 1,
            ..secret.clone()
        },
        Attachment {
            sha256: "0".repeat(64),
            ..secret.clone()
        },
        Attachment {
            media_type: "application/pdf".into(),
            ..secret.clone()
        },
    ] {
        let err = send_with(&reader, "victim", vec![lie]).await.unwrap_err();
        assert_eq!(kind(&err), ErrorKind::BadRequest, "{err}");
    }

    // The owner takes the reader back: it reads nothing more, and cannot pass it on.
    let revoked = owner
        .file_revoke(secret.file_ref, Some(AgentId::parse("reader").unwrap()))
        .await
        .unwrap();
    assert_eq!(revoked.revoked, 1);
    let err = reader.read_attachment(&secret).await.unwrap_err();
    assert_eq!(kind(&err), ErrorKind::NotFound, "{err}");
    let err = send_with(&reader, "victim", vec![secret.clone()])
        .await
        .unwrap_err();
    assert_eq!(kind(&err), ErrorKind::NotFound, "{err}");

    // Deleted: gone for its owner too.
    assert!(owner.file_delete(secret.file_ref).await.unwrap().deleted);
    let err = owner.read_attachment(&secret).await.unwrap_err();
    assert_eq!(kind(&err), ErrorKind::NotFound, "{err}");
}

/// One raw chunk, as a foreign client sends it.
async fn chunk(
    client: &async_nats::Client,
    agent: &str,
    headers: &[(&str, String)],
    body: Vec<u8>,
) -> serde_json::Value {
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        map.insert(*name, value.as_str());
    }
    let subject = FilesOp::Chunk.subject(&AgentId::parse(agent).unwrap());
    let reply = tokio::time::timeout(
        Duration::from_secs(10),
        client.request_with_headers(subject, map, Bytes::from(body)),
    )
    .await
    .unwrap()
    .unwrap();
    serde_json::from_slice(&reply.payload).unwrap()
}

#[tokio::test]
async fn lying_sizes_and_digests_and_chunks_out_of_order_are_refused() {
    let (fabric, _files) = fabric_with_files(Default::default()).await;
    let agent = fabric.agent("liar").await;
    let client = agent.nats().clone();
    // The service's chunk size for this server (512 KiB under the default 1 MiB payload).
    let chunk_bytes = chunk_bytes_for(client.server_info().max_payload);
    let upload = |size: u64, sha256: String| {
        let client = client.clone();
        async move {
            raw(
                &client,
                &FilesOp::Upload.subject(&AgentId::parse("liar").unwrap()),
                serde_json::to_vec(&json!({
                    "name": "a.bin", "media_type": "application/octet-stream",
                    "size": size, "sha256": sha256,
                }))
                .unwrap(),
            )
            .await
        }
    };
    let bytes = data(chunk_bytes + 100);
    let sha = hex(&Sha256::digest(&bytes));
    let started = upload(bytes.len() as u64, sha.clone()).await;
    assert_eq!(
        started.body["chunk_bytes"], chunk_bytes,
        "{:?}",
        started.body
    );
    let file = started.body["file_id"].as_str().unwrap().to_owned();
    let at = |offset: usize| {
        vec![
            (HEADER_FILE_ID, file.clone()),
            (HEADER_FILE_OFFSET, offset.to_string()),
        ]
    };

    // Out of order: the second chunk first.
    let reply = chunk(
        &client,
        "liar",
        &at(chunk_bytes),
        bytes[chunk_bytes..].to_vec(),
    )
    .await;
    assert_eq!(error_kind(&reply), "conflict", "{reply}");
    assert!(
        reply["error"]["message"]
            .as_str()
            .unwrap()
            .contains("offset 0"),
        "{reply}"
    );
    // A first chunk of the wrong length.
    let reply = chunk(&client, "liar", &at(0), bytes[..1000].to_vec()).await;
    assert_eq!(error_kind(&reply), "bad_request", "{reply}");
    // The first chunk, twice: stored once, answered alike.
    for _ in 0..2 {
        let reply = chunk(&client, "liar", &at(0), bytes[..chunk_bytes].to_vec()).await;
        assert_eq!(reply["received"], chunk_bytes, "{reply}");
    }
    // Past the declared size.
    let reply = chunk(&client, "liar", &at(chunk_bytes), vec![0; 101]).await;
    assert_eq!(error_kind(&reply), "bad_request", "{reply}");
    // Missing or garbled headers.
    for headers in [
        vec![],
        vec![(HEADER_FILE_ID, file.clone())],
        vec![
            (HEADER_FILE_ID, "../../etc".to_owned()),
            (HEADER_FILE_OFFSET, "0".to_owned()),
        ],
        vec![
            (HEADER_FILE_ID, file.clone()),
            (HEADER_FILE_OFFSET, "-1".to_owned()),
        ],
        vec![
            (HEADER_FILE_ID, file.clone()),
            (HEADER_FILE_OFFSET, "18446744073709551615".to_owned()),
        ],
    ] {
        let reply = chunk(&client, "liar", &headers, vec![1; 10]).await;
        assert_eq!(error_kind(&reply), "bad_request", "{headers:?}: {reply}");
    }
    // Another agent's upload: not found.
    let other = fabric.agent("other").await;
    let reply = chunk(
        other.nats(),
        "other",
        &at(chunk_bytes),
        bytes[chunk_bytes..].to_vec(),
    )
    .await;
    assert_eq!(error_kind(&reply), "not_found", "{reply}");
    // The right last chunk completes it.
    let reply = chunk(
        &client,
        "liar",
        &at(chunk_bytes),
        bytes[chunk_bytes..].to_vec(),
    )
    .await;
    assert_eq!(reply["attachment"]["sha256"], sha.as_str(), "{reply}");

    // A digest that lies: refused at the last chunk, the upload removed.
    let lie = upload(10, hex(&Sha256::digest(b"other bytes"))).await;
    let lie_id = lie.body["file_id"].as_str().unwrap().to_owned();
    let reply = chunk(
        &client,
        "liar",
        &[
            (HEADER_FILE_ID, lie_id.clone()),
            (HEADER_FILE_OFFSET, "0".to_owned()),
        ],
        b"0123456789".to_vec(),
    )
    .await;
    assert_eq!(error_kind(&reply), "digest_mismatch", "{reply}");
    let err = agent
        .file_stat(uuid::Uuid::parse_str(&lie_id).unwrap())
        .await
        .unwrap_err();
    assert_eq!(kind(&err), ErrorKind::NotFound, "{err}");
    // An empty file must declare the empty digest.
    let empty = upload(0, "0".repeat(64)).await;
    assert_eq!(empty.error_kind(), "digest_mismatch");
}

#[tokio::test]
async fn names_that_climb_and_media_types_that_forge_are_refused() {
    let (fabric, _files) = fabric_with_files(Default::default()).await;
    let agent = fabric.agent("namer").await;
    for (name, media_type) in [
        ("../../.ssh/authorized_keys", "text/plain"),
        ("..", "text/plain"),
        ("a/b.txt", "text/plain"),
        ("C:\\windows\\x.dll", "text/plain"),
        ("line\nINFO forged", "text/plain"),
        ("ok.txt", "text/plain\r\nX-Injected: 1"),
        ("ok.txt", "text/plain; charset=utf-8"),
        ("ok.txt", "text"),
        ("ok.txt", "te\u{7}xt/plain"),
    ] {
        let err = agent
            .upload_bytes(name, media_type, b"x")
            .await
            .unwrap_err();
        assert_eq!(
            kind(&err),
            ErrorKind::BadRequest,
            "{name:?} {media_type:?}: {err}"
        );
    }
    // At most 16 attachments on one message; the 17th refuses the whole send.
    let one = agent
        .upload_bytes("one.txt", "text/plain", b"1")
        .await
        .unwrap();
    let err = send_with(&agent, "anyone", vec![one; 17])
        .await
        .unwrap_err();
    assert_eq!(kind(&err), ErrorKind::BadRequest, "{err}");
    // An attachment naming such a file on a send is refused before any lookup.
    let good = agent
        .upload_bytes("ok.txt", "text/plain", b"x")
        .await
        .unwrap();
    let err = send_with(
        &agent,
        "anyone",
        vec![Attachment {
            name: "../ok.txt".into(),
            ..good
        }],
    )
    .await
    .unwrap_err();
    assert_eq!(kind(&err), ErrorKind::BadRequest, "{err}");
}

#[tokio::test]
async fn a_never_finished_upload_is_removed_and_its_quota_returned() {
    let config = files::FilesConfig {
        quota_bytes: 2 * 1024 * 1024,
        upload_idle_secs: 10,
        sweep_ms: 250,
        ..Default::default()
    };
    let (fabric, _files) = fabric_with_files(config).await;
    let agent = fabric.agent("quitter").await;
    let chunk_bytes = chunk_bytes_for(agent.nats().server_info().max_payload);
    let bytes = data(2 * 1024 * 1024);
    let started = raw(
        agent.nats(),
        &FilesOp::Upload.subject(agent.id()),
        serde_json::to_vec(&json!({
            "name": "half.bin", "media_type": "application/octet-stream",
            "size": bytes.len(), "sha256": hex(&Sha256::digest(&bytes)),
        }))
        .unwrap(),
    )
    .await;
    let file = started.body["file_id"].as_str().unwrap().to_owned();
    let reply = chunk(
        agent.nats(),
        "quitter",
        &[
            (HEADER_FILE_ID, file.clone()),
            (HEADER_FILE_OFFSET, "0".to_owned()),
        ],
        bytes[..chunk_bytes].to_vec(),
    )
    .await;
    assert_eq!(reply["received"], chunk_bytes, "{reply}");
    // The quota is spent while it waits.
    let err = agent
        .upload_bytes("more.txt", "text/plain", b"x")
        .await
        .unwrap_err();
    assert_eq!(kind(&err), ErrorKind::QuotaExceeded, "{err}");
    // Ten idle seconds later it is gone, chunks and all, and the quota is back.
    let file_id = uuid::Uuid::parse_str(&file).unwrap();
    let gone = switchboard_testkit::eventually(Duration::from_secs(20), || async {
        agent.file_stat(file_id).await.is_err()
    })
    .await;
    assert!(gone, "the idle upload was removed");
    let js = async_nats::jetstream::new(fabric.nats.client().await);
    let mut stream = js
        .get_stream(switchboard_proto::FILES_STREAM)
        .await
        .unwrap();
    assert_eq!(
        stream.info().await.unwrap().state.messages,
        0,
        "its chunks went with it"
    );
    agent
        .upload_bytes("more.txt", "text/plain", b"x")
        .await
        .unwrap();
}

#[tokio::test]
async fn an_upload_declared_again_is_the_same_upload_counted_once() {
    let config = files::FilesConfig {
        quota_bytes: 3 * 1024 * 1024,
        ..Default::default()
    };
    let (fabric, _files) = fabric_with_files(config).await;
    let agent = fabric.agent("retrier").await;
    let bytes = data(2 * 1024 * 1024);
    let declare = |upload_id: &str, size: usize| {
        let client = agent.nats().clone();
        let subject = FilesOp::Upload.subject(agent.id());
        let body = serde_json::to_vec(&json!({
            "name": "twice.bin", "media_type": "application/octet-stream",
            "size": size, "sha256": hex(&Sha256::digest(&bytes)),
            "upload_id": upload_id,
        }))
        .unwrap();
        async move { raw(&client, &subject, body).await }
    };
    let id = switchboard_proto::new_id().to_string();
    // Its reply lost, the same upload is declared again (a hedged copy does the same).
    let first = declare(&id, bytes.len()).await;
    let again = declare(&id, bytes.len()).await;
    assert_eq!(first.body["file_id"], again.body["file_id"], "{again:?}");
    // Counted once: 2 of the 3 MiB quota, so a second 2 MiB upload is over it...
    let other = declare(&switchboard_proto::new_id().to_string(), bytes.len()).await;
    assert_eq!(other.error_kind(), "quota_exceeded");
    // ...and the same id for another file is a conflict, not a second upload.
    let lie = declare(&id, 1).await;
    assert_eq!(lie.error_kind(), "conflict");
    // Another agent naming the same upload id gets a file of its own.
    let stranger = fabric.agent("stranger").await;
    let theirs = raw(
        stranger.nats(),
        &FilesOp::Upload.subject(stranger.id()),
        serde_json::to_vec(&json!({
            "name": "twice.bin", "media_type": "application/octet-stream",
            "size": bytes.len(), "sha256": hex(&Sha256::digest(&bytes)), "upload_id": id,
        }))
        .unwrap(),
    )
    .await;
    assert_ne!(theirs.body["file_id"], first.body["file_id"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_with_chunks_in_flight_is_intact_across_two_replicas() {
    // The client sends each chunk before the previous one's reply; with two replicas some
    // reach the other one first, are refused `conflict` and go again: the file is whole.
    let (fabric, _first) = fabric_with_files(Default::default()).await;
    let _second =
        switchboard_tests::services::start_files_with(&fabric.url(), Default::default()).await;
    let writer = fabric.agent("windowed").await;
    for round in 0..3 {
        let bytes = data(5 * 1024 * 1024 + round * 1000 + 7);
        let attachment = writer
            .upload_bytes("big.bin", "application/octet-stream", &bytes)
            .await
            .unwrap();
        assert_eq!(attachment.size, bytes.len() as u64);
        assert_eq!(attachment.sha256, hex(&Sha256::digest(&bytes)));
        assert_eq!(writer.read_attachment(&attachment).await.unwrap(), bytes);
    }
}
