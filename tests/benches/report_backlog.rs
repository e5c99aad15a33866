//! The report's backlog rows (issue 40): fetch+ack of one goal's backlog of 64 messages beside
//! a raw pull consumer, and beside the raw steps a fetch takes in sequence (its floor).

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer};
use bytes::Bytes;
use futures::StreamExt;
use switchboard_client::Agent;
use switchboard_proto::inbox::FETCH_MAX;
use switchboard_proto::{GoalId, INBOX_STREAM, subject};
use switchboard_tests::bench::ms;

use crate::Report;

/// The raw NATS steps one fetch of a backlog takes in sequence, timed one after the other: a
/// request/reply whose reply is as large as the batch (the agent's request and the service's
/// answer), one batched direct get of the goal's next 64 messages (the read), and one KV
/// update of a cursor-sized value (the hand-out's record). What the decided design (issue 16:
/// no consumer, a cursor in KV; issue 40: the hand-out recorded) cannot go below.
struct BacklogFloor {
    client: async_nats::Client,
    js: jetstream::Context,
    cursors: jetstream::kv::Store,
    revision: u64,
    /// Time spent in each step so far: request/reply, direct get, cursor update.
    steps: [Duration; 3],
}

impl BacklogFloor {
    async fn start(url: &str, js: &jetstream::Context) -> Self {
        let responder = async_nats::connect(url).await.unwrap();
        let mut requests = responder.subscribe("bench.backlog.floor").await.unwrap();
        tokio::spawn(async move {
            while let Some(message) = requests.next().await {
                if let Some(reply) = message.reply {
                    // As large as a fetch reply of 64 stored messages (about 40 KiB).
                    let batch = Bytes::from(vec![b'x'; FETCH_MAX as usize * 640]);
                    responder.publish(reply, batch).await.unwrap();
                }
            }
        });
        let cursors = js
            .create_key_value(jetstream::kv::Config {
                bucket: "bench_backlog_floor".into(),
                history: 1,
                ..Default::default()
            })
            .await
            .unwrap();
        let revision = cursors
            .put("cursor", Bytes::from(vec![b'c'; 200]))
            .await
            .unwrap();
        Self {
            client: async_nats::connect(url).await.unwrap(),
            js: js.clone(),
            cursors,
            revision,
            steps: [Duration::ZERO; 3],
        }
    }

    /// One round: the three steps in sequence, reading the goal's messages from `from`.
    async fn round(&mut self, goal: &GoalId, from: u64) -> Duration {
        let started = Instant::now();
        self.client
            .request("bench.backlog.floor", Bytes::from_static(b"{}"))
            .await
            .unwrap();
        let asked = started.elapsed();
        let request = serde_json::json!({
            "seq": from.max(1), "next_by_subj": subject::inbox(goal), "batch": FETCH_MAX,
        });
        let mut got = 0;
        switchboard_request::kv::direct_batch(
            &self.js,
            INBOX_STREAM,
            &request,
            Duration::from_secs(5),
            |_| {
                got += 1;
                Ok(())
            },
        )
        .await
        .unwrap();
        assert_eq!(got, FETCH_MAX as usize, "the floor reads the whole batch");
        let read = started.elapsed();
        self.revision = self
            .cursors
            .update("cursor", Bytes::from(vec![b'c'; 200]), self.revision)
            .await
            .unwrap();
        let took = started.elapsed();
        self.steps[0] += asked;
        self.steps[1] += read - asked;
        self.steps[2] += took - read;
        took
    }
}

/// Fetch+ack throughput of one goal's backlog of 64 messages (the cap), beside a raw pull
/// consumer reading and acking the same messages (`BENCH_ONLY=backlog` runs it alone).
/// `reader` reads `goal` (the full report's inbox reader: the scale rows after it count the
/// agents registered).
pub async fn backlog_rows(
    report: &mut Report,
    url: &str,
    js: &jetstream::Context,
    reader: &Agent,
    goal: &switchboard_client::Goal,
    ops: usize,
) {
    let rounds = (ops / 10).clamp(5, 50);
    let raw_reader = js
        .get_stream(INBOX_STREAM)
        .await
        .unwrap()
        .create_consumer(consumer::pull::Config {
            durable_name: Some("bench-backlog-raw".into()),
            filter_subject: subject::inbox(&goal.id()),
            ack_policy: consumer::AckPolicy::Explicit,
            deliver_policy: consumer::DeliverPolicy::New,
            ..Default::default()
        })
        .await
        .unwrap();
    let mut floor = BacklogFloor::start(url, js).await;
    let (mut raw_time, mut ours_time, mut read) = (Duration::ZERO, Duration::ZERO, 0usize);
    let mut floor_time = Duration::ZERO;
    let mut committed = None;
    for _ in 0..rounds {
        // Published as the services publish (untimed): a full goal makes room by purging
        // what the last round read.
        switchboard_tests::store_at_once(js, goal, FETCH_MAX as usize).await;
        let started = Instant::now();
        // A pull can come back short (even empty) right after the publishes are acked; the
        // raw reader pulls again for the rest, as any consumer loop does (bounded: 10 s).
        let mut got = 0;
        let deadline = started + Duration::from_secs(10);
        while got < FETCH_MAX as usize && Instant::now() < deadline {
            let mut batch = raw_reader
                .fetch()
                .max_messages(FETCH_MAX as usize - got)
                .messages()
                .await
                .unwrap();
            while let Some(message) = batch.next().await {
                message.unwrap().ack().await.unwrap();
                got += 1;
            }
        }
        reader.nats().flush().await.unwrap();
        raw_time += started.elapsed();
        assert_eq!(got, FETCH_MAX as usize);

        // The same batch through the raw steps a fetch takes in sequence.
        floor_time += floor
            .round(&goal.id(), committed.map_or(0, |c| c + 1))
            .await;

        // A reader's loop: each fetch commits the batch before it (`ack_through`).
        let started = Instant::now();
        let page = goal
            .fetch(FETCH_MAX, Duration::ZERO, committed)
            .await
            .unwrap();
        ours_time += started.elapsed();
        assert_eq!(page.messages.len(), FETCH_MAX as usize);
        committed = page.messages.last().map(|m| m.seq);
        read += page.messages.len();
    }
    // The last batch's ack, counted too.
    let started = Instant::now();
    goal.ack_through(committed.unwrap()).await.unwrap();
    ours_time += started.elapsed();
    let raw_rate = read as f64 / raw_time.as_secs_f64();
    let ours_rate = read as f64 / ours_time.as_secs_f64();
    report.note_row(
        "inbox",
        &format!("one goal's backlog of {FETCH_MAX}, {rounds} rounds: raw pull + ack each"),
        format!("{raw_rate:.0} msg/s"),
    );
    report.note_row(
        "inbox",
        &format!(
            "the same backlog: fetch (max {FETCH_MAX}) committing the batch before, + the last ack"
        ),
        format!("{ours_rate:.0} msg/s"),
    );
    let floor_rate = read as f64 / floor_time.as_secs_f64();
    report.note_row(
        "inbox",
        "the same backlog through a fetch's raw steps (request/reply carrying the batch, batched direct get, cursor update)",
        format!(
            "{floor_rate:.0} msg/s ({:.2}× raw pull-consume; fetch+ack {:.2}× this floor); per batch: request/reply {} ms, direct get {} ms, cursor update {} ms; raw pull + acks {} ms",
            floor_rate / raw_rate,
            ours_rate / floor_rate,
            ms(floor.steps[0] / rounds as u32),
            ms(floor.steps[1] / rounds as u32),
            ms(floor.steps[2] / rounds as u32),
            ms(raw_time / rounds as u32),
        ),
    );
    report.ratio(
        "fetch+ack of a goal's backlog / raw pull-consume",
        ours_rate / raw_rate,
        0.5,
        true,
    );
    js.delete_key_value("bench_backlog_floor").await.unwrap();
    // Gone with the rows it measured: a durable consumer of the inbox stream is one more floor
    // the services' purges consider.
    drop(raw_reader);
    js.get_stream(INBOX_STREAM)
        .await
        .unwrap()
        .delete_consumer("bench-backlog-raw")
        .await
        .unwrap();
}
