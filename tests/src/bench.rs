//! The measuring harness every bench shares: sequential latency percentiles, then throughput
//! with a fixed number of operations in flight.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What one path measured.
#[derive(Debug, Clone, Copy)]
pub struct Sample {
    /// Median sequential latency.
    pub p50: Duration,
    /// 99th percentile sequential latency.
    pub p99: Duration,
    /// Operations per second with `in_flight` concurrent.
    pub per_sec: f64,
}

/// Runs `op` `ops / 10` times to warm up, `ops` times one after another (latency), then
/// `ops * spread` times spread over `in_flight` concurrent tasks (throughput).
pub async fn measure<F, Fut>(ops: usize, spread: usize, in_flight: usize, op: F) -> Sample
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    for _ in 0..ops / 10 {
        op().await;
    }
    let mut latencies = Vec::with_capacity(ops);
    for _ in 0..ops {
        let started = Instant::now();
        op().await;
        latencies.push(started.elapsed());
    }
    latencies.sort();
    let per_sec = throughput(ops * spread, in_flight, op).await;
    Sample {
        p50: percentile(&latencies, 0.50),
        p99: percentile(&latencies, 0.99),
        per_sec,
    }
}

/// Operations per second of `op` run about `total` times over `in_flight` concurrent tasks.
pub async fn throughput<F, Fut>(total: usize, in_flight: usize, op: Arc<F>) -> f64
where
    F: Fn() -> Fut + Send + Sync + ?Sized + 'static,
    Fut: Future<Output = ()> + Send,
{
    let per_task = total.div_ceil(in_flight).max(4);
    let started = Instant::now();
    let tasks: Vec<_> = (0..in_flight)
        .map(|_| {
            let op = Arc::clone(&op);
            tokio::spawn(async move {
                for _ in 0..per_task {
                    op().await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a benchmark task panicked");
    }
    (per_task * in_flight) as f64 / started.elapsed().as_secs_f64()
}

/// One path of [`compare_all`]: an operation whose future is boxed, so paths of different
/// types share one list.
pub type Path = Arc<dyn Fn() -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

/// Boxes `op` into a [`Path`].
pub fn path<F, Fut>(op: F) -> Path
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    Arc::new(move || Box::pin(op()) as futures::future::BoxFuture<'static, ()>)
}

/// Two paths compared on the same machine at the same time ([`compare_all`] of the two).
pub async fn compare<A, FutA, B, FutB>(ops: usize, in_flight: usize, a: A, b: B) -> (Sample, Sample)
where
    A: Fn() -> FutA + Send + Sync + 'static,
    FutA: Future<Output = ()> + Send + 'static,
    B: Fn() -> FutB + Send + Sync + 'static,
    FutB: Future<Output = ()> + Send + 'static,
{
    let samples = compare_all(ops, in_flight, &[path(a), path(b)]).await;
    (samples[0], samples[1])
}

/// Paths compared on the same machine at the same time: after a warm-up of each, `ops`
/// sequential runs of each in blocks of `ops / 8`, ordered forward then backward twice (A B B
/// A A B B A for two, A B C C B A A B C C B A for three), so a drift in the machine's speed
/// weighs on all alike; then the throughput of each with `in_flight` concurrent. A path's
/// background work after its last run of a block spills into the next block once per block,
/// not once per run. Samples come back in the order of `paths`.
pub async fn compare_all(ops: usize, in_flight: usize, paths: &[Path]) -> Vec<Sample> {
    for _ in 0..ops / 10 {
        for op in paths {
            op().await;
        }
    }
    let block = (ops / 8).max(1);
    let mut runs: Vec<Vec<Duration>> = paths.iter().map(|_| Vec::with_capacity(ops)).collect();
    let forward: Vec<usize> = (0..paths.len()).collect();
    let backward: Vec<usize> = forward.iter().rev().copied().collect();
    for order in [&forward, &backward, &forward, &backward] {
        for &n in order {
            for _ in 0..block {
                let started = Instant::now();
                paths[n]().await;
                runs[n].push(started.elapsed());
            }
        }
    }
    let mut samples = Vec::with_capacity(paths.len());
    for (op, mut of_path) in paths.iter().zip(runs) {
        of_path.sort();
        let per_sec = throughput(ops, in_flight, Arc::clone(op)).await;
        samples.push(Sample {
            p50: percentile(&of_path, 0.50),
            p99: percentile(&of_path, 0.99),
            per_sec,
        });
    }
    samples
}

/// The `p` quantile (0.0–1.0) of `sorted` latencies, nearest rank; zero when empty.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let last = sorted.len().saturating_sub(1);
    let rank = (last as f64 * p).round() as usize;
    sorted.get(rank.min(last)).copied().unwrap_or_default()
}

/// Milliseconds with three decimals.
pub fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

/// `BENCH_OPS` from the environment, or `default`.
pub fn ops_from_env(default: usize) -> usize {
    std::env::var("BENCH_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Publishes `count` inbox messages with `body` into `AGENT_INBOX` (a backlog for the audit
/// to work through), 60 per goal so the per-goal cap of 64 keeps every one, up to 1,024
/// publishes in flight.
pub async fn fill_inbox(js: &async_nats::jetstream::Context, count: usize, body: &str) {
    use switchboard_proto::{AgentId, GoalId, InboxMessage, new_id, subject};
    let goals: Vec<GoalId> = (0..count.div_ceil(60)).map(|_| GoalId::new()).collect();
    let from = AgentId::parse("bench-sender").unwrap();
    let to = AgentId::parse("bench-receiver").unwrap();
    let mut acks = Vec::with_capacity(1024);
    for n in 0..count {
        let mut message = InboxMessage::new(from.clone(), GoalId::new(), to.clone(), body);
        message.id = Some(new_id());
        let payload = serde_json::to_vec(&message).unwrap();
        acks.push(
            js.publish(subject::inbox(&goals[n % goals.len()]), payload.into())
                .await
                .unwrap(),
        );
        if acks.len() >= 1024 {
            for ack in acks.drain(..) {
                ack.await.unwrap();
            }
        }
    }
    for ack in acks {
        ack.await.unwrap();
    }
}

/// A reader that keeps up with `goal`, as a running agent does: each fetch waits for messages
/// and acknowledges the page before it. Runs until the returned task is aborted, and counts
/// the messages it took in `taken`.
pub fn keep_reading(
    goal: switchboard_client::Goal,
    taken: Arc<std::sync::atomic::AtomicUsize>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut last = None;
        loop {
            match goal.fetch(64, Duration::from_secs(5), last).await {
                Ok(page) => {
                    if let Some(seq) = page.messages.last().map(|m| m.seq) {
                        last = Some(seq);
                    }
                    taken.fetch_add(page.messages.len(), std::sync::atomic::Ordering::Relaxed);
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })
}
