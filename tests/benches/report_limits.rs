//! The report's provider-limit rows (issue 41): an uncontended lease taken and given back
//! beside raw request/reply, and acquires per second on one key through three `limits`
//! replicas, with the leases out sampled all along (never past the limit).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::json;
use switchboard_client::limits_set;
use switchboard_proto::AgentId;
use switchboard_proto::limits::{Lease, LimitSpec, LimitsOp, LimitsOpsOp};
use switchboard_request::request::request_json;
use switchboard_testkit::process::ServiceProcess;
use switchboard_tests::bench::{Sample, measure};
use switchboard_tests::service_bin;

use crate::Report;

/// Acquires in flight in the throughput row.
const IN_FLIGHT: usize = 256;
/// The throughput row's limit: leases out at once.
const CONCURRENT: u32 = 100;

fn spec(key: &str, concurrent: u32) -> LimitSpec {
    LimitSpec {
        per_agent: Some(concurrent),
        ..LimitSpec::concurrent(key, concurrent)
    }
}

/// One acquire (waiting up to 10 s) and its release, as agent `agent`.
async fn lease_once(client: &async_nats::Client, agent: &AgentId, key: &str) {
    let lease: Lease = request_json(
        client,
        &LimitsOp::Acquire.subject(agent),
        &json!({"key": key, "wait_ms": 10_000}),
        Duration::from_secs(20),
    )
    .await
    .unwrap();
    let _: serde_json::Value = request_json(
        client,
        &LimitsOp::Release.subject(agent),
        &json!({"key": key, "lease_id": lease.lease_id}),
        Duration::from_secs(10),
    )
    .await
    .unwrap();
}

/// The rows, on the fabric at `url` (three `limits` replicas started and stopped here).
pub(crate) async fn limit_rows(
    report: &mut Report,
    url: &str,
    ops: usize,
    env: &[(&str, &str)],
    raw: Option<Sample>,
) {
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(ServiceProcess::start(&service_bin("limits"), "limits", url, env).await);
    }
    let client = async_nats::connect(url).await.unwrap();

    // Raw request/reply beside, on the same server: the full report's own row, or measured
    // here when the rows run alone.
    let raw = match raw {
        Some(raw) => raw,
        None => raw_request_reply(url, ops).await,
    };
    limits_set(&client, &spec("bench:uncontended", 1_000))
        .await
        .unwrap();
    let pair = {
        let client = client.clone();
        let agent = AgentId::parse("bench-lease").unwrap();
        measure(ops, 2, 64, move || {
            let (client, agent) = (client.clone(), agent.clone());
            async move { lease_once(&client, &agent, "bench:uncontended").await }
        })
        .await
    };
    report.row(
        "limits",
        "raw request/reply (the report's, or measured here alone)",
        raw,
    );
    report.row("limits", "acquire + release of an uncontended lease", pair);
    report.ratio(
        "limits: acquire+release p50 / raw request/reply p50",
        pair.p50.as_secs_f64() / raw.p50.as_secs_f64(),
        2.0,
        false,
    );
    let floor = pair_floor(url, ops).await;
    report.note_row(
        "limits",
        "the pair's raw steps: 2 × (request/reply + KV compare-and-set of a lease's state)",
        format!(
            "p50 {} ms ({:.2}× raw request/reply; acquire+release {:.2}× this floor)",
            switchboard_tests::bench::ms(floor),
            floor.as_secs_f64() / raw.p50.as_secs_f64(),
            pair.p50.as_secs_f64() / floor.as_secs_f64()
        ),
    );
    throughput_row(report, &client, ops).await;
    // Together: each waits until no replica of the service answers any more.
    futures::future::join_all(replicas.into_iter().map(ServiceProcess::terminate)).await;
}

/// The p50 of what an acquire and its release cannot do without (a grant is stored before it
/// is answered, a release too: docs/protocol.md §15), timed with raw NATS on the same server:
/// twice a request/reply to an echo and a KV compare-and-set of a 200-byte value in a
/// bucket stored like `agent_limits`, one after the other.
async fn pair_floor(url: &str, ops: usize) -> Duration {
    let client = async_nats::connect(url).await.unwrap();
    let responder = async_nats::connect(url).await.unwrap();
    let mut echo = responder.subscribe("bench.limits.floor").await.unwrap();
    responder.flush().await.unwrap();
    tokio::spawn(async move {
        while let Some(message) = echo.next().await {
            if let Some(reply) = message.reply {
                let _ = responder.publish(reply, message.payload).await;
            }
        }
    });
    let js = async_nats::jetstream::new(client.clone());
    let bucket = js
        .create_key_value(async_nats::jetstream::kv::Config {
            bucket: "bench_limits_floor".into(),
            history: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    let state = bytes::Bytes::from(vec![b's'; 200]);
    let mut revision = bucket.put("key", state.clone()).await.unwrap();
    let mut took = Vec::with_capacity(ops);
    for n in 0..ops + ops / 10 {
        let started = Instant::now();
        for _ in 0..2 {
            client
                .request("bench.limits.floor", "{}".into())
                .await
                .unwrap();
            revision = bucket.update("key", state.clone(), revision).await.unwrap();
        }
        if n >= ops / 10 {
            took.push(started.elapsed());
        }
    }
    js.delete_key_value("bench_limits_floor").await.unwrap();
    took.sort();
    switchboard_tests::bench::percentile(&took, 0.5)
}

/// Raw request/reply on `url`: a plain subscriber echoing the request.
async fn raw_request_reply(url: &str, ops: usize) -> Sample {
    let client = async_nats::connect(url).await.unwrap();
    let responder = async_nats::connect(url).await.unwrap();
    let mut echo = responder.subscribe("bench.limits.echo").await.unwrap();
    responder.flush().await.unwrap();
    let answering = responder.clone();
    tokio::spawn(async move {
        while let Some(message) = echo.next().await {
            if let Some(reply) = message.reply {
                let _ = answering.publish(reply, message.payload).await;
            }
        }
        eprintln!("bench: the echo subscription ended");
    });
    // The echo answers before it is measured.
    let mut tries = 0;
    while let Err(err) = client.request("bench.limits.echo", "{}".into()).await {
        tries += 1;
        assert!(tries < 50, "the echo never answered: {err}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let raw = measure(ops, 2, 64, move || {
        let client = client.clone();
        async move {
            client
                .request("bench.limits.echo", "{}".into())
                .await
                .unwrap();
        }
    })
    .await;
    drop(responder);
    raw
}

/// Acquires per second on one key of `CONCURRENT` leases, `IN_FLIGHT` at once from 64 agents
/// through the three replicas, for a time that scales with `ops`; the leases out are sampled
/// through `_SB.ops.limits.list` meanwhile.
async fn throughput_row(report: &mut Report, client: &async_nats::Client, ops: usize) {
    let key = "bench:shared";
    limits_set(client, &spec(key, CONCURRENT)).await.unwrap();
    let run_for = Duration::from_millis((ops as u64 * 10).clamp(500, 5_000));
    let done = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let most = Arc::new(AtomicU32::new(0));
    let sampler = {
        let (client, stop, most) = (client.clone(), Arc::clone(&stop), Arc::clone(&most));
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let listed: serde_json::Value = request_json(
                    &client,
                    &LimitsOpsOp::List.subject(),
                    &json!({}),
                    Duration::from_secs(10),
                )
                .await
                .unwrap();
                for limit in listed["limits"].as_array().into_iter().flatten() {
                    if limit["spec"]["key"] == "bench:shared" {
                        let in_use = limit["in_use"].as_u64().unwrap_or(0);
                        most.fetch_max(
                            u32::try_from(in_use).unwrap_or(u32::MAX),
                            Ordering::Relaxed,
                        );
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let started = Instant::now();
    let workers: Vec<_> = (0..IN_FLIGHT)
        .map(|n| {
            let (client, done, stop) = (client.clone(), Arc::clone(&done), Arc::clone(&stop));
            let agent = AgentId::parse(&format!("bench-fleet-{}", n % 64)).unwrap();
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    lease_once(&client, &agent, key).await;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    tokio::time::sleep(run_for).await;
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.await.unwrap();
    }
    let took = started.elapsed();
    sampler.await.unwrap();
    let rate = done.load(Ordering::Relaxed) as f64 / took.as_secs_f64();
    let most = most.load(Ordering::Relaxed);
    assert!(most <= CONCURRENT, "{most} leases out of {CONCURRENT}");
    report.note_row(
        "limits",
        "one key, 3 replicas, 256 acquires in flight from 64 agents",
        format!(
            "{rate:.0} acquires/s (each released at once); at most {most} of {CONCURRENT} leases out in the samples"
        ),
    );
    report.at_least(
        "limits: acquires per second on one key across 3 replicas",
        rate,
        "acquires/s",
        10_000.0,
    );
}
