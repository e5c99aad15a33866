//! Issue 41's fleet test of provider limits (docs/protocol.md §15), in a binary of its own so
//! no other test shares its two cores while it measures: 200 Python agents (the SDK's
//! `async with agent.limit(...)`) call a fake LLM provider through leases.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use serde_json::json;
use switchboard_client::limits_set;
use switchboard_proto::limits::LimitSpec;
use switchboard_tests::Fabric;
use switchboard_tests::services::start_limits;

/// One Python process of the fleet (`tests/python/limits_fleet.py`), connected and waiting for
/// the start line.
struct FleetProcess {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

async fn fleet_process(
    url: &str,
    llm: &str,
    key: &str,
    prefix: &str,
    agents: usize,
    calls: usize,
) -> FleetProcess {
    use tokio::io::AsyncBufReadExt;
    let root = switchboard_testkit::workspace_root();
    let mut child = tokio::process::Command::new(switchboard_testkit::python_bin())
        .arg(root.join("tests/python/limits_fleet.py"))
        .args([url, llm, key, prefix])
        .args([agents.to_string(), calls.to_string()])
        .env("PYTHONPATH", root.join("sdk/python"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdin = child.stdin.take().unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .expect("the fleet connects within 60 s")
        .unwrap()
        .expect("the fleet says it is ready");
    assert!(ready.contains("ready"), "{ready}");
    FleetProcess {
        child,
        stdin,
        lines,
    }
}

/// Issue 41's fleet test: 200 agents in two processes call a provider that allows 10 requests
/// at once and 60 a second (a second's burst) and answers 429 beyond. Through leases on a limit
/// declared as an operator would — 4 % under the provider's rate (3,450 a minute) with a tenth
/// of its burst, leaving a margin for the time between a grant and the call's arrival, which
/// moves with the agents' load — the provider never sees more than 10 at once, no agent gets a 429, the
/// fleet gets at least 0.9x what the limit allows, and no agent waits more than 3x the mean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_agents_through_leases_never_get_a_429_and_share_the_provider_fairly() {
    use switchboard_tests::fake_llm::{FakeLlm, ProviderLimits};
    use tokio::io::AsyncWriteExt;
    let fabric = Fabric::start().await;
    let _limits = [
        start_limits(&fabric.url()).await,
        start_limits(&fabric.url()).await,
    ];
    let provider = FakeLlm::start(ProviderLimits {
        concurrent: 10,
        per_second: 60.0,
        latency: Duration::from_millis(20),
    })
    .await;
    let ops = fabric.nats.client().await;
    limits_set(
        &ops,
        &LimitSpec {
            requests_per_minute: Some(3_450),
            tokens_per_minute: Some(3_450 * 150),
            per_agent: Some(1),
            // A tenth of a second's worth at once: below the provider's own burst (a second's),
            // so the jitter between a grant and the call's arrival finds the provider's bucket
            // never empty.
            burst_ms: Some(100),
            ..LimitSpec::concurrent("fake:llm", 10)
        },
    )
    .await
    .unwrap();
    let calls = 3;
    let mut fleet = Vec::new();
    for prefix in ["fleet-a", "fleet-b"] {
        fleet.push(
            fleet_process(&fabric.url(), &provider.url, "fake:llm", prefix, 100, calls).await,
        );
    }
    for process in &mut fleet {
        process.stdin.write_all(b"go\n").await.unwrap();
        process.stdin.flush().await.unwrap();
    }
    let mut waits: Vec<(String, Vec<f64>)> = Vec::new();
    for mut process in fleet {
        let line = tokio::time::timeout(Duration::from_secs(120), process.lines.next_line())
            .await
            .expect("the fleet finishes within 120 s")
            .unwrap()
            .expect("the fleet reports");
        let report: serde_json::Value = serde_json::from_str(&line).unwrap();
        for timing in ["http_ms", "release_ms"] {
            let each: Vec<f64> = serde_json::from_value(report[timing].clone()).unwrap();
            let mean = each.iter().sum::<f64>() / each.len().max(1) as f64;
            println!("{timing}: mean {mean:.1} ms over {}", each.len());
        }
        assert_eq!(report["refused"], 0, "an agent got a 429: {report}");
        assert_eq!(report["failed"], json!([]), "{report}");
        for (agent, each) in report["waits"].as_object().unwrap() {
            let each: Vec<f64> = serde_json::from_value(each.clone()).unwrap();
            waits.push((agent.clone(), each));
        }
        process.child.wait().await.unwrap();
    }
    let stats = provider.stats();
    assert_eq!(stats.refused, 0, "the provider answered 429: {stats:?}");
    assert_eq!(stats.served, 200 * calls, "{stats:?}");
    assert!(stats.most_at_once <= 10, "{stats:?}");
    // The fleet's throughput against the provider's rate (its one-off burst aside), and
    // against what the limit held allows (its burst, then its rate).
    let took = (stats.last.unwrap() - stats.first.unwrap()).as_secs_f64();
    let of_provider = stats.served as f64 / (60.0 * took);
    let of_held = stats.served as f64 / (3_450.0 / 60.0 * (took + 0.1));
    println!(
        "fleet: {} calls in {took:.2} s, at most {} at once: {of_provider:.2}x the provider's rate, {of_held:.2}x what the limit held allows",
        stats.served, stats.most_at_once,
    );
    assert!(of_provider >= 0.9, "{of_provider:.2}x: {stats:?}");
    // Fairness: each agent's mean wait against the fleet's.
    let per_agent: Vec<f64> = waits
        .iter()
        .map(|(_, each)| each.iter().sum::<f64>() / each.len() as f64)
        .collect();
    let mean = per_agent.iter().sum::<f64>() / per_agent.len() as f64;
    let worst = per_agent.iter().copied().fold(0.0, f64::max);
    println!("waits: mean {mean:.0} ms per acquire, the worst agent's mean {worst:.0} ms");
    assert!(
        worst <= 3.0 * mean,
        "worst {worst:.0} ms, mean {mean:.0} ms"
    );
}
