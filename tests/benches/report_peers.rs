//! Switchboard's call beside its closest peer and raw NATS, measured as a user would: nats-py
//! agents (tests/python/bench_peers.py), the release services with the **shipped defaults** on
//! a private nats-server of their own, Synadia's NATS agent SDK (PyPI `synadia-ai-agents` and
//! `synadia-ai-agent-service`, pinned in tests/python/requirements.txt) and raw request/reply,
//! all in one run: p50, p99, calls/s at 1 and 32 in flight, CPU per call summed over every
//! process (nats-server, the five services, the Python agents; from `/proc`), and broker
//! messages per call (a wiretap on `>`). Beside them, the same agents drive the call's floor:
//! the raw NATS steps of the decided design and nothing else (`report_call_floor.rs`).

use std::time::Duration;

use serde::Deserialize;
use switchboard_testkit::NatsServer;
use switchboard_testkit::process::ServiceProcess;
use switchboard_tests::bench::Sample;
use switchboard_tests::service_bin;

use crate::{Report, SERVICES, report_call_floor};

/// One path as the Python side measured it.
#[derive(Debug, Deserialize)]
struct PeerRow {
    path: String,
    p50_ms: f64,
    p99_ms: f64,
    per_sec_1: f64,
    per_sec_32: f64,
    cpu_ms_sequential: f64,
    cpu_ms_32: f64,
    /// CPU per call, sequential, by process name (`comm`), in milliseconds.
    #[serde(default)]
    cpu_ms_sequential_by_process: std::collections::BTreeMap<String, f64>,
    /// CPU per call at 32 in flight by process name (`comm`), in milliseconds.
    #[serde(default)]
    cpu_ms_32_by_process: std::collections::BTreeMap<String, f64>,
    broker_msgs: f64,
}

#[derive(Debug, Deserialize)]
struct PeerRows {
    rows: Vec<PeerRow>,
}

/// Runs the three paths and adds their rows and issue 25's targets to `report`.
pub async fn peer_rows(report: &mut Report, ops: usize) {
    let nats = NatsServer::start().await;
    let url = nats.url();
    let mut services = Vec::new();
    for service in SERVICES {
        // No settings: what a user runs.
        services.push(ServiceProcess::start(&service_bin(service), service, &url, &[]).await);
    }
    // The floor's raw steps run in this process (its CPU counted with the others').
    let floor = report_call_floor::start(report_call_floor::Placement::single(&url)).await;
    let pids: Vec<String> = nats
        .pid()
        .into_iter()
        .chain(services.iter().filter_map(ServiceProcess::pid))
        .chain([std::process::id()])
        .map(|pid| pid.to_string())
        .collect();
    let script = switchboard_testkit::workspace_root().join("tests/python/bench_peers.py");
    let run = tokio::process::Command::new(switchboard_testkit::python_bin())
        .arg(script)
        .args(["--nats-url", &url, "--ops", &ops.to_string()])
        .args(["--pids", &pids.join(","), "--floor"])
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(1_800), run)
        .await
        .expect("the peer benchmark finished")
        .expect("the peer benchmark ran");
    assert!(
        output.status.success(),
        "bench_peers.py failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let measured: PeerRows = serde_json::from_slice(&output.stdout).unwrap_or_else(|err| {
        panic!(
            "bench_peers.py printed no report ({err}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    });
    drop(floor);
    for service in services {
        service.terminate().await;
    }
    let find = |prefix: &str| {
        measured
            .rows
            .iter()
            .find(|row| row.path.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} row"))
    };
    let (raw, peer, ours, floor) = (
        find("raw"),
        find("synadia"),
        find("switchboard"),
        find("the call's floor"),
    );
    let group = "call vs peers (nats-py agents, shipped defaults)";
    for row in [raw, peer, ours, floor] {
        report.row(
            group,
            &row.path,
            Sample {
                p50: Duration::from_secs_f64(row.p50_ms / 1e3),
                p99: Duration::from_secs_f64(row.p99_ms / 1e3),
                per_sec: row.per_sec_32,
            },
        );
        report.note_row(
            group,
            &format!("{}: cost", row.path),
            format!(
                "{:.0} calls/s at 1 in flight, {:.0} at 32; CPU per call {:.2} ms sequential, \
                 {:.2} ms at 32 in flight (every process); {:.1} broker messages per call",
                row.per_sec_1,
                row.per_sec_32,
                row.cpu_ms_sequential,
                row.cpu_ms_32,
                row.broker_msgs
            ),
        );
        if row.path.starts_with("switchboard") || row.path.starts_with("the call's floor") {
            let by_process = |by: &std::collections::BTreeMap<String, f64>| {
                let mut by: Vec<_> = by.iter().collect();
                by.sort_by(|a, b| b.1.total_cmp(a.1));
                by.iter()
                    .map(|(name, ms)| format!("{name} {ms:.2}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            report.note_row(
                group,
                &format!("{}: CPU by process", row.path),
                format!(
                    "ms per call, sequential: {}; at 32 in flight: {}",
                    by_process(&row.cpu_ms_sequential_by_process),
                    by_process(&row.cpu_ms_32_by_process)
                ),
            );
        }
    }
    report.note_row(
        group,
        "the call's floor against the targets",
        format!(
            "p50 {:.2}× raw request/reply and {:.2}× Synadia's; at 32 in flight {:.2}× \
             Synadia's calls/s at {:.2}× its CPU per call; {:.1} broker messages per call \
             (the call: {:.2}× the floor's p50, {:.2}× its CPU per call at 32 in flight)",
            floor.p50_ms / raw.p50_ms,
            floor.p50_ms / peer.p50_ms,
            floor.per_sec_32 / peer.per_sec_32,
            floor.cpu_ms_32 / peer.cpu_ms_32,
            floor.broker_msgs,
            ours.p50_ms / floor.p50_ms,
            ours.cpu_ms_32 / floor.cpu_ms_32,
        ),
    );
    // Issue 40's targets: a durable call no dearer than a protocol that stores nothing.
    report.ratio(
        "call p50 / raw request/reply p50 (nats-py, shipped defaults)",
        ours.p50_ms / raw.p50_ms,
        4.5,
        false,
    );
    report.ratio(
        "call p50 / Synadia agent SDK prompt p50",
        ours.p50_ms / peer.p50_ms,
        2.5,
        false,
    );
    report.ratio(
        "call throughput at 32 in flight / Synadia agent SDK's",
        ours.per_sec_32 / peer.per_sec_32,
        1.0,
        true,
    );
    report.ratio(
        "CPU per call at 32 in flight (every process) / Synadia agent SDK's",
        ours.cpu_ms_32 / peer.cpu_ms_32,
        1.0,
        false,
    );
    report.absolute(
        "broker messages per call (wiretap on `>`)",
        ours.broker_msgs,
        "messages",
        16.0,
    );
}
