//! The report's file rows (issue 42): uploading and reading a file through the files service
//! beside a raw JetStream Object Store put and get of the same bytes on the same server, in
//! interleaved runs; a large file passing three hops (A uploads, sends it to B, B forwards it
//! to C, C reads it) with its digest checked and one copy stored; and a send carrying a
//! reference beside one without.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use sha2::{Digest, Sha256};
use switchboard_client::{Agent, Goal};
use switchboard_proto::files::Attachment;
use switchboard_proto::send::SendRequest;
use switchboard_testkit::NatsServer;
use switchboard_testkit::process::ServiceProcess;
use switchboard_tests::bench::{compare, ms};
use switchboard_tests::{agent_with, card, service_bin};

use crate::{MIB, Report};

/// The services the rows need: registration, sends, files.
const SERVICES: [&str; 3] = ["directory", "inbox-fanout", "files"];

/// The sizes measured and the runs of each: 8 MiB six times and 256 MiB twice in
/// `make bench`; 2 MiB twice and 16 MiB once when `BENCH_OPS` is below 100, as in CI's smoke
/// run of a debug build (which checks that the rows run, not their figures).
fn sizes(ops: usize) -> [(usize, usize); 2] {
    match ops >= 100 {
        true => [(8 << 20, 6), (256 << 20, 2)],
        false => [(2 << 20, 2), (16 << 20, 1)],
    }
}

/// Bytes that differ chunk by chunk.
fn data(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64).wrapping_mul(2_654_435_761).rotate_right(13) as u8)
        .collect()
}

/// The rows, on a server of their own with the three services as release processes.
pub(crate) async fn file_rows(report: &mut Report, ops: usize, env: &[(&str, &str)]) {
    let nats = NatsServer::start().await;
    let url = nats.url();
    let mut services = Vec::new();
    for service in SERVICES {
        services.push(ServiceProcess::start(&service_bin(service), service, &url, env).await);
    }
    let beat = Duration::from_secs(3600);
    let a = agent_with(&url, card("files-a"), beat).await;
    let b = agent_with(&url, card("files-b"), beat).await;
    let c = agent_with(&url, card("files-c"), beat).await;
    let b_goal = b.open_goal().await.unwrap();
    let c_goal = c.open_goal().await.unwrap();
    let js = jetstream::new(async_nats::connect(&url).await.unwrap());
    let raw = js
        .create_object_store(jetstream::object_store::Config {
            bucket: "bench_raw_files".into(),
            storage: jetstream::stream::StorageType::File,
            ..Default::default()
        })
        .await
        .unwrap();

    let sizes = sizes(ops);
    for (size, runs) in sizes {
        throughput_rows(report, &url, &js, &a, &raw, size, runs).await;
    }
    let large = sizes[1].0;
    three_hops(report, &js, &a, &b, &b_goal, &c, &c_goal, large).await;
    reference_row(report, &url, ops).await;

    js.delete_object_store("bench_raw_files").await.unwrap();
    futures::future::join_all(services.into_iter().map(ServiceProcess::terminate)).await;
}

/// Upload and read of `size` bytes, `runs` times each, interleaved with a raw Object Store
/// put and get of the same bytes: MiB/s of each, and the ratios.
async fn throughput_rows(
    report: &mut Report,
    url: &str,
    js: &jetstream::Context,
    agent: &Agent,
    raw: &jetstream::object_store::ObjectStore,
    size: usize,
    runs: usize,
) {
    let bytes = data(size);
    let mut took = [Duration::ZERO; 4];
    for run in 0..runs {
        let name = format!("raw-{size}-{run}");
        let began = Instant::now();
        raw.put(name.as_str(), &mut bytes.as_slice()).await.unwrap();
        took[0] += began.elapsed();
        let began = Instant::now();
        let mut object = raw.get(&name).await.unwrap();
        let mut back = Vec::with_capacity(size);
        tokio::io::AsyncReadExt::read_to_end(&mut object, &mut back)
            .await
            .unwrap();
        took[1] += began.elapsed();
        assert_eq!(back.len(), size);
        raw.delete(&name).await.unwrap();

        let began = Instant::now();
        let attachment = agent
            .upload_bytes("bench.bin", "application/octet-stream", &bytes)
            .await
            .unwrap();
        took[2] += began.elapsed();
        let began = Instant::now();
        let back = agent.read_attachment(&attachment).await.unwrap();
        took[3] += began.elapsed();
        assert_eq!(back.len(), size);
        agent.file_delete(attachment.file_ref).await.unwrap();
    }
    let rate = |took: Duration| (size * runs) as f64 / MIB / took.as_secs_f64();
    let [put, get, upload, read] = took.map(rate);
    let label = format!("{} MiB", size >> 20);
    report.note_row(
        "files",
        &format!("{label}: raw Object Store put / get"),
        format!("{put:.0} / {get:.0} MiB/s ({runs} runs each, interleaved)"),
    );
    report.note_row(
        "files",
        &format!("{label}: upload / read through the files service"),
        format!(
            "{upload:.0} / {read:.0} MiB/s ({:.2}× / {:.2}× raw)",
            upload / put,
            read / get
        ),
    );
    let relay = relay_floor(url, js, &bytes, runs).await;
    report.note_row(
        "files",
        &format!(
            "{label}: the bytes relayed through a service, chunk by chunk (an upload's floor)"
        ),
        format!(
            "{relay:.0} MiB/s ({:.2}× raw put; the upload {:.2}× this floor)",
            relay / put,
            upload / relay
        ),
    );
    report.ratio(
        &format!("files: upload of {label} / raw Object Store put"),
        upload / put,
        0.5,
        true,
    );
    report.ratio(
        &format!("files: read of {label} / raw Object Store get"),
        read / get,
        0.5,
        true,
    );
}

/// The least an upload through a service costs: each 128 KiB chunk a request to a relay (a
/// plain subscriber in this process) that stores it in the raw bucket's stream, awaits the
/// store's ack and replies — no checks, no digest, no records. Agents have no JetStream API,
/// so every byte crosses the broker twice where a raw put crosses it once. MiB/s.
async fn relay_floor(url: &str, js: &jetstream::Context, bytes: &[u8], runs: usize) -> f64 {
    use futures::StreamExt;
    let subject = "$O.bench_raw_files.C.relay-floor";
    let relay_client = async_nats::connect(url).await.unwrap();
    let mut requests = relay_client.subscribe("bench.files.relay").await.unwrap();
    let store = js.clone();
    let relay = tokio::spawn(async move {
        while let Some(request) = requests.next().await {
            store
                .publish(subject, request.payload)
                .await
                .unwrap()
                .await
                .unwrap();
            if let Some(reply) = request.reply {
                relay_client
                    .publish(reply, bytes::Bytes::new())
                    .await
                    .unwrap();
            }
        }
    });
    let sender = async_nats::connect(url).await.unwrap();
    // The chunks the files service uses on this server.
    let chunk_bytes = switchboard_proto::files::chunk_bytes_for(sender.server_info().max_payload);
    let began = Instant::now();
    for _ in 0..runs {
        for chunk in bytes.chunks(chunk_bytes) {
            sender
                .request("bench.files.relay", bytes::Bytes::copy_from_slice(chunk))
                .await
                .unwrap();
        }
    }
    let took = began.elapsed();
    relay.abort();
    let mut stream = js.get_stream("OBJ_bench_raw_files").await.unwrap();
    stream.purge().filter(subject).await.unwrap();
    let _ = stream.info().await;
    (bytes.len() * runs) as f64 / MIB / took.as_secs_f64()
}

/// A uploads `size` bytes and sends them to B; B forwards the reference to C; C reads them.
/// The digest matches and the Object Store's stream grew by one copy.
#[allow(clippy::too_many_arguments)]
async fn three_hops(
    report: &mut Report,
    js: &jetstream::Context,
    a: &Agent,
    b: &Agent,
    b_goal: &Goal,
    c: &Agent,
    c_goal: &Goal,
    size: usize,
) {
    let bytes = data(size);
    let digest: String = Sha256::digest(&bytes)
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    let mut stream = js
        .get_stream(switchboard_proto::FILES_STREAM)
        .await
        .unwrap();
    let before = stream.info().await.unwrap().state.bytes;
    let began = Instant::now();
    let attachment = a
        .upload_bytes("large.bin", "application/octet-stream", &bytes)
        .await
        .unwrap();
    send(a, "files-b", vec![attachment.clone()]).await;
    let got = next_attachments(b_goal).await;
    send(b, "files-c", got).await;
    let forwarded = next_attachments(c_goal).await;
    let read = c.read_attachment(&forwarded[0]).await.unwrap();
    let took = began.elapsed();
    let read_digest: String = Sha256::digest(&read)
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    assert_eq!(read_digest, digest, "the file arrives intact");
    let stored = stream.info().await.unwrap().state.bytes - before;
    assert!(
        stored < size as u64 + (1 << 20),
        "{stored} bytes stored for one file of {size}"
    );
    report.note_row(
        "files",
        &format!("{} MiB over three hops (A → B → C)", size >> 20),
        format!(
            "intact (SHA-256 {}…), {:.1} MiB stored once, {:.1} s from A's upload to C's last byte",
            &digest[..12],
            stored as f64 / MIB,
            took.as_secs_f64()
        ),
    );
    a.file_delete(attachment.file_ref).await.unwrap();
}

/// A send to a reader carrying a reference, beside the same send without: p50 ratio. The
/// reader keeps its goal read, so no send meets a full inbox.
async fn reference_row(report: &mut Report, url: &str, ops: usize) {
    let beat = Duration::from_secs(3600);
    let sender = Arc::new(agent_with(url, card("files-sender"), beat).await);
    let reader = agent_with(url, card("files-reader"), beat).await;
    let goal = reader.open_goal().await.unwrap();
    let reading = tokio::spawn(async move {
        loop {
            if let Ok(Some(delivery)) = goal.recv(Duration::from_secs(1)).await {
                let _ = delivery.ack().await;
            }
        }
    });
    let attachment = sender
        .upload_bytes("note.txt", "text/plain", b"attached")
        .await
        .unwrap();
    let plain_sender = Arc::clone(&sender);
    let compared_sender = Arc::clone(&sender);
    let (plain, referenced) = compare(
        ops,
        1,
        move || {
            let from = Arc::clone(&compared_sender);
            async move { send(&from, "files-reader", Vec::new()).await }
        },
        move || {
            let (from, with) = (Arc::clone(&sender), attachment.clone());
            async move { send(&from, "files-reader", vec![with]).await }
        },
    )
    .await;
    // The floor of a reference: the reader's grant is written before the copies (so the
    // reader can read what it is handed), one KV write on top of the send, in a bucket like
    // `agent_files_index`.
    let js = jetstream::new(async_nats::connect(url).await.unwrap());
    let grants = js
        .create_key_value(jetstream::kv::Config {
            bucket: "bench_files_grants".to_owned(),
            history: 1,
            storage: jetstream::stream::StorageType::File,
            ..Default::default()
        })
        .await
        .unwrap();
    let floor_sender = Arc::clone(&plain_sender);
    let floor = switchboard_tests::bench::measure(ops, 1, 1, move || {
        let (from, grants) = (Arc::clone(&floor_sender), grants.clone());
        async move {
            grants
                .put("grant.file.files-reader", bytes::Bytes::from_static(b"{}"))
                .await
                .unwrap();
            send(&from, "files-reader", Vec::new()).await;
        }
    })
    .await;
    reading.abort();
    report.row("files", "send_to_peer 256 B", plain);
    report.row("files", "the same send carrying one attachment", referenced);
    report.row("files", "floor: one KV write, then the plain send", floor);
    report.ratio(
        "files: send with a reference p50 / without",
        referenced.p50.as_secs_f64() / plain.p50.as_secs_f64(),
        1.1,
        false,
    );
    report.note_row(
        "files",
        "the floor of a reference",
        format!(
            "one KV write and the send: {} of the plain send; the send with a reference is {} of this floor",
            ratio_text(floor.p50.as_secs_f64() / plain.p50.as_secs_f64()),
            ratio_text(referenced.p50.as_secs_f64() / floor.p50.as_secs_f64()),
        ),
    );
    report.note_row(
        "files",
        "what a reference adds to a send",
        format!(
            "p50 {} ms against {} ms: the door reads the file's record and the sender's right to it, and writes the reader's grant",
            ms(referenced.p50),
            ms(plain.p50)
        ),
    );
}

/// A ratio as the notes write it (`1.23×`).
fn ratio_text(ratio: f64) -> String {
    format!("{ratio:.2}×")
}

async fn send(from: &Agent, to: &str, attachments: Vec<Attachment>) {
    let report = from
        .send(SendRequest {
            to: Some(to.to_owned()),
            message: Some("x".repeat(256)),
            attachments,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(report.delivered_to.len(), 1, "{report:?}");
}

async fn next_attachments(goal: &Goal) -> Vec<Attachment> {
    loop {
        let delivery = goal
            .recv(Duration::from_secs(30))
            .await
            .unwrap()
            .expect("a message within 30 s");
        let message = delivery.ack().await.unwrap();
        if !message.attachments.is_empty() {
            return message.attachments;
        }
    }
}
