//! The floor of issue 40's decided call path, as raw NATS: what the broker must do for one
//! durable call, with none of the services' own work. The peer benchmark's nats-py caller and
//! callee drive it exactly as they drive a Switchboard call (the same JSON bodies, the callee's
//! held fetch and `ack_through`), so the row beside Switchboard's call shows what the design
//! alone costs on this machine, measured in the same run.
//!
//! Two tasks stand in for the services, each on its own connection, with no checks, no
//! events, no audit trail and no trace context (so the floor sits below the design's own):
//! - the **correlator's part**: on a call, the request's store in a goal inbox (a JetStream
//!   publish with a message id, on a stream configured as `AGENT_INBOX` is, whose republish
//!   is the store notice) beside the call record's create (a KV create, as `agent_calls`);
//!   on the callee's reply, the record's claim (a KV compare-and-set), then the answer to the
//!   waiting caller and the reply's own answer;
//! - the **fan-out's part**: the callee's fetch held until a store notice arrives, answered with
//!   the stored message the notice carries, the hand-out then recorded on the goal's cursor (a
//!   KV put, as `agent_cursors`) after the reply;
//! - the **audit's part**, off the call's path as the audit is: one stored record for the
//!   request and one for the answer. It pulls the inbox stream and the call records' stream
//!   (the claim is the answer's trace, so no event is published for it), publishes a record
//!   per request and per claim into a stream configured as `AGENT_AUDIT` is, and acknowledges
//!   its sources cumulatively once their records are stored.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::jetstream::{self, kv, stream};
use async_nats::{HeaderMap, Subject};
use bytes::Bytes;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::value::RawValue;
use switchboard_runtime::config::JetStreamConfig;
use switchboard_runtime::resources;
use tokio::sync::{Mutex, watch};
use tokio::task::JoinHandle;

/// The subjects the Python side's floor path uses (tests/python/bench_peers.py).
const CALL: &str = "bench.floor.call";
const FETCH: &str = "bench.floor.fetch";
const REPLY: &str = "bench.floor.reply";
const INBOX: &str = "bench.floor.inbox";
const STORED: &str = "bench.floor.stored";
const RECORDS: &str = "bench.floor.records";

/// Calls waiting for their answer: the caller's reply subject and the record's revision (0
/// until its create returns: the callee may answer before that).
type Waiting = Arc<Mutex<HashMap<String, (Subject, watch::Receiver<u64>)>>>;

/// The running floor; dropping it stops both parts.
pub struct CallFloor {
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for CallFloor {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

#[derive(Deserialize)]
struct CallIn<'a> {
    #[serde(borrow)]
    message: &'a RawValue,
    to: &'a str,
}

#[derive(Deserialize)]
struct ReplyIn<'a> {
    correlation_id: String,
    #[serde(borrow)]
    message: &'a RawValue,
}

#[derive(Deserialize)]
struct FetchIn {
    #[serde(default)]
    wait_ms: u64,
}

/// Where the floor's parts connect, and how its streams are kept.
pub struct Placement<'a> {
    /// The correlator's part.
    pub correlator: &'a str,
    /// The fan-out's part.
    pub fanout: &'a str,
    /// The audit's part, when the services measured beside the floor run an audit.
    pub trail: Option<&'a str>,
    /// Replicas of every stream and bucket (as `jetstream.replicas`).
    pub replicas: usize,
}

impl<'a> Placement<'a> {
    /// Every part on one server, with the audit's part, one replica: the shipped defaults.
    pub fn single(url: &'a str) -> Self {
        Self {
            correlator: url,
            fanout: url,
            trail: Some(url),
            replicas: 1,
        }
    }
}

/// Creates the floor's stream and buckets (as the services' are, under other names) and starts
/// its parts where `at` says.
pub async fn start(at: Placement<'_>) -> CallFloor {
    let defaults = JetStreamConfig {
        replicas: at.replicas,
        ..JetStreamConfig::default()
    };
    let correlator = async_nats::connect(at.correlator)
        .await
        .expect("floor connects");
    let fanout = async_nats::connect(at.fanout)
        .await
        .expect("floor connects");
    let js = jetstream::new(correlator.clone());
    let mut inbox = resources::inbox_stream(&defaults);
    inbox.name = "BENCH_FLOOR_INBOX".to_owned();
    inbox.subjects = vec![format!("{INBOX}.*")];
    // The stream makes room itself (the services remove read messages from a full goal).
    inbox.discard = stream::DiscardPolicy::Old;
    inbox.discard_new_per_subject = false;
    inbox.republish = Some(stream::Republish {
        source: format!("{INBOX}.*"),
        destination: format!("{STORED}.{{{{wildcard(1)}}}}"),
        headers_only: false,
    });
    js.get_or_create_stream(inbox).await.expect("floor inbox");
    let mut calls = resources::calls_bucket(&defaults);
    calls.bucket = "bench_floor_calls".to_owned();
    let calls = js.create_key_value(calls).await.expect("floor calls");
    let mut cursors = resources::cursors_bucket(&defaults);
    cursors.bucket = "bench_floor_cursors".to_owned();
    let fan_js = jetstream::new(fanout.clone());
    fan_js
        .create_key_value(cursors.clone())
        .await
        .expect("floor cursors");
    let cursors = fan_js.get_key_value(cursors.bucket).await.expect("cursors");
    let waiting: Waiting = Arc::default();
    let mut tasks = Vec::new();
    if let Some(url) = at.trail {
        let mut trail = resources::audit_stream(&defaults);
        trail.name = "BENCH_FLOOR_TRAIL".to_owned();
        trail.subjects = vec![RECORDS.to_owned()];
        js.get_or_create_stream(trail).await.expect("floor trail");
        let auditor = async_nats::connect(url).await.expect("floor connects");
        tasks.push(tokio::spawn(record_trail(jetstream::new(auditor))));
    }
    tasks.extend([
        tokio::spawn(open_calls(
            correlator.clone(),
            js,
            calls.clone(),
            waiting.clone(),
        )),
        tokio::spawn(claim_answers(correlator, calls, waiting)),
        tokio::spawn(hold_fetches(fanout, cursors)),
    ]);
    CallFloor { tasks }
}

/// The correlator's part of a call: store the request beside the record's create.
async fn open_calls(
    client: async_nats::Client,
    js: jetstream::Context,
    calls: kv::Store,
    waiting: Waiting,
) {
    let mut requests = client.subscribe(CALL).await.expect("floor subscribes");
    let ids = Arc::new(AtomicU64::new(0));
    while let Some(request) = requests.next().await {
        let (js, calls, waiting, ids) = (js.clone(), calls.clone(), waiting.clone(), ids.clone());
        tokio::spawn(async move {
            let Some(reply) = request.reply else { return };
            let Ok(call) = serde_json::from_slice::<CallIn>(&request.payload) else {
                return;
            };
            let id = format!("floor-{}", ids.fetch_add(1, Ordering::Relaxed));
            let stored = format!(
                r#"{{"kind":"request","correlation_id":"{id}","from":"caller","body":{}}}"#,
                call.message.get()
            );
            let record = format!(
                r#"{{"correlation_id":"{id}","to":"{}","state":"open","deadline_ms":30000}}"#,
                call.to
            );
            let mut headers = HeaderMap::new();
            headers.insert(async_nats::header::NATS_MESSAGE_ID, id.as_str());
            let store = async {
                js.publish_with_headers(format!("{INBOX}.goal"), headers, stored.into())
                    .await?
                    .await
            };
            let (revision, known) = watch::channel(0);
            waiting.lock().await.insert(id.clone(), (reply, known));
            let (stored, created) =
                tokio::join!(store, calls.create(format!("call.{id}"), record.into()));
            match (stored, created) {
                (Ok(_), Ok(created)) => {
                    let _ = revision.send(created);
                }
                (stored, created) => {
                    waiting.lock().await.remove(&id);
                    panic!(
                        "the floor's call failed: {:?} {:?}",
                        stored.err(),
                        created.err()
                    );
                }
            }
        });
    }
}

/// The correlator's part of an answer: claim the record, then answer the caller and the callee.
async fn claim_answers(client: async_nats::Client, calls: kv::Store, waiting: Waiting) {
    let mut replies = client.subscribe(REPLY).await.expect("floor subscribes");
    while let Some(reply) = replies.next().await {
        let (client, calls, waiting) = (client.clone(), calls.clone(), waiting.clone());
        tokio::spawn(async move {
            let Some(to_callee) = reply.reply else { return };
            let Ok(answer) = serde_json::from_slice::<ReplyIn>(&reply.payload) else {
                return;
            };
            let Some((caller, mut known)) = waiting.lock().await.remove(&answer.correlation_id)
            else {
                return;
            };
            let Ok(revision) = known.wait_for(|revision| *revision > 0).await.map(|r| *r) else {
                return;
            };
            let claimed = format!(
                r#"{{"correlation_id":"{}","state":"answered"}}"#,
                answer.correlation_id
            );
            let key = format!("call.{}", answer.correlation_id);
            if calls.update(key, claimed.into(), revision).await.is_err() {
                return;
            }
            let body = format!(r#"{{"body":{}}}"#, answer.message.get());
            let _ = client.publish(caller, body.into()).await;
            let _ = client.publish(to_callee, Bytes::from_static(b"{}")).await;
        });
    }
}

/// The fan-out's part: a fetch held until a store notice, answered with the stored message, the
/// hand-out recorded on the cursor after the reply.
async fn hold_fetches(client: async_nats::Client, cursors: kv::Store) {
    let mut fetches = client.subscribe(FETCH).await.expect("floor subscribes");
    let mut notices = client
        .subscribe(format!("{STORED}.*"))
        .await
        .expect("floor subscribes");
    let mut held: VecDeque<(Subject, tokio::time::Instant)> = VecDeque::new();
    let mut ready: Vec<(u64, Bytes)> = Vec::new();
    loop {
        let next_deadline = held.front().map(|(_, at)| *at);
        tokio::select! {
            Some(fetch) = fetches.next() => {
                let Some(reply) = fetch.reply else { continue };
                let wait = serde_json::from_slice::<FetchIn>(&fetch.payload).map_or(0, |f| f.wait_ms);
                if ready.is_empty() {
                    let at = tokio::time::Instant::now() + Duration::from_millis(wait);
                    held.push_back((reply, at));
                } else {
                    hand_out(&client, &cursors, reply, std::mem::take(&mut ready)).await;
                }
            }
            Some(notice) = notices.next() => {
                let seq = notice
                    .headers
                    .as_ref()
                    .and_then(|h| h.get("Nats-Sequence"))
                    .and_then(|v| v.as_str().parse().ok())
                    .unwrap_or(0);
                ready.push((seq, notice.payload));
                if let Some((reply, _)) = held.pop_front() {
                    hand_out(&client, &cursors, reply, std::mem::take(&mut ready)).await;
                }
            }
            () = async {
                match next_deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            } => {
                if let Some((reply, _)) = held.pop_front() {
                    let _ = client.publish(reply, Bytes::from_static(br#"{"messages":[]}"#)).await;
                }
            }
            else => return,
        }
    }
}

/// Answers a fetch with `messages`, then records the hand-out on the goal's cursor.
async fn hand_out(
    client: &async_nats::Client,
    cursors: &kv::Store,
    reply: Subject,
    messages: Vec<(u64, Bytes)>,
) {
    let mut page = String::from(r#"{"messages":["#);
    let last = messages.last().map_or(0, |(seq, _)| *seq);
    for (i, (seq, message)) in messages.iter().enumerate() {
        if i > 0 {
            page.push(',');
        }
        page.push_str(&format!(r#"{{"seq":{seq},"message":"#));
        page.push_str(&String::from_utf8_lossy(message));
        page.push('}');
    }
    page.push_str("]}");
    let _ = client.publish(reply, page.into()).await;
    let cursors = cursors.clone();
    tokio::spawn(async move {
        let cursor = format!(r#"{{"handed":{last},"acked":{last}}}"#);
        let _ = cursors.put("goal", cursor.into()).await;
    });
}

/// The audit's part: a record stored per request and per answer, the sources acknowledged
/// cumulatively (as the audit's `AckPolicy::All` consumers are) once their records are stored.
async fn record_trail(js: jetstream::Context) {
    let source = |stream: &'static str| {
        let js = js.clone();
        async move {
            let stream = js.get_stream(stream).await.expect("floor source");
            let consumer = stream
                .create_consumer(jetstream::consumer::pull::Config {
                    ack_policy: jetstream::consumer::AckPolicy::All,
                    deliver_policy: jetstream::consumer::DeliverPolicy::New,
                    max_ack_pending: 4_096,
                    ..Default::default()
                })
                .await
                .expect("floor consumer");
            consumer.messages().await.expect("floor messages")
        }
    };
    let requests = source("BENCH_FLOOR_INBOX").await.map(|m| (0, m));
    let answers = source("KV_bench_floor_calls").await.map(|m| (1, m));
    let mut sources = futures::stream::select(requests, answers);
    let mut stored = VecDeque::new();
    let mut last: [Option<jetstream::Message>; 2] = [None, None];
    while let Some((from, message)) = sources.next().await {
        let mut next = Some((from, message));
        while let Some((from, Ok(message))) = next.take() {
            // A claim is the answer; a create is read and passed over (the filter cannot
            // tell them apart).
            if from == 0 || message.payload.ends_with(br#""answered"}"#) {
                let record =
                    jetstream::message::PublishMessage::build().payload(message.payload.clone());
                match js.send_publish(RECORDS, record).await {
                    Ok(ack) => stored.push_back(ack),
                    Err(err) => panic!("the floor's record failed: {err}"),
                }
            }
            last[from] = Some(message);
            if stored.len() < 256 {
                next = futures::FutureExt::now_or_never(sources.next()).flatten();
            }
        }
        for ack in stored.drain(..) {
            ack.await.expect("the floor's record is stored");
        }
        for message in last.iter_mut().filter_map(Option::take) {
            let _ = message.ack().await;
        }
    }
}

/// A caller of the floor on `url`, as the Rust client calls (the same body as
/// tests/python/bench_peers.py's floor path).
pub async fn caller(url: &str) -> switchboard_tests::bench::Path {
    let client = async_nats::connect(url)
        .await
        .expect("floor caller connects");
    let body = Bytes::from(
        serde_json::json!({
            "to": "callee", "message": "x".repeat(256), "timeout_ms": 30_000,
            "from_goal_id": "caller-goal",
        })
        .to_string(),
    );
    switchboard_tests::bench::path(move || {
        let (client, body) = (client.clone(), body.clone());
        async move {
            let answer = client.request(CALL, body).await.expect("the floor answers");
            assert!(
                answer.payload.len() > 256,
                "the floor's answer carries the body"
            );
        }
    })
}

/// A callee of the floor on `url` until `stop`: held fetches acknowledging what the one before
/// handed out, each request answered (the Rust client's read loop, `Agent::serve`).
pub fn callee(url: String, stop: tokio_util::sync::CancellationToken) -> JoinHandle<()> {
    #[derive(Deserialize)]
    struct Page {
        messages: Vec<Item>,
    }
    #[derive(Deserialize)]
    struct Item {
        seq: u64,
        message: Request,
    }
    #[derive(Deserialize)]
    struct Request {
        correlation_id: String,
        body: Box<RawValue>,
    }
    tokio::spawn(async move {
        let client = async_nats::connect(&url)
            .await
            .expect("floor callee connects");
        let mut acked: Option<u64> = None;
        while !stop.is_cancelled() {
            let fetch = match acked {
                Some(seq) => {
                    format!(r#"{{"goal_id":"goal","max":64,"wait_ms":1000,"ack_through":{seq}}}"#)
                }
                None => r#"{"goal_id":"goal","max":64,"wait_ms":1000}"#.to_owned(),
            };
            let Ok(page) = client.request(FETCH, fetch.into()).await else {
                continue;
            };
            let page: Page = serde_json::from_slice(&page.payload).expect("a floor page");
            let replies = page.messages.iter().map(|item| {
                let reply = format!(
                    r#"{{"correlation_id":"{}","message":{}}}"#,
                    item.message.correlation_id,
                    item.message.body.get()
                );
                client.request(REPLY, reply.into())
            });
            for answered in futures::future::join_all(replies).await {
                answered.expect("the floor takes the reply");
            }
            if let Some(last) = page.messages.last() {
                acked = Some(last.seq);
            }
        }
    })
}
