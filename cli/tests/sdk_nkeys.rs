//! The Python and TypeScript SDKs under the accounts `switchboard nats-config` writes: each
//! agent signs in with its own generated NKey and reads its replies under
//! `_INBOX.<agent_id>`. A Python agent calls a TypeScript agent that gives the work to a Rust
//! agent as a task; all three are keyed, and none could read another's inbox.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::sync::Arc;

use common::System;
use switchboard_client::proto::{AgentCard, AgentId};
use switchboard_client::{Agent, AgentOptions, TaskOutcome};
use switchboard_runtime::CancellationToken;
use switchboard_testkit::{python_call, start_ts_relay};

fn seed(system: &System, agent: &str) -> String {
    std::fs::read_to_string(system.agent_key(agent))
        .unwrap()
        .trim()
        .to_owned()
}

#[tokio::test]
async fn both_sdks_work_signed_in_with_their_generated_keys() {
    let system = System::start_secured(&["py-sdk", "ts-relay", "rust-worker"]).await;

    let worker_id = AgentId::parse("rust-worker").unwrap();
    let nats = switchboard_client::agent_connect_options(&worker_id)
        .nkey(seed(&system, "rust-worker"))
        .connect(system.url())
        .await
        .unwrap();
    let worker = Arc::new(
        Agent::connect_with(nats, AgentCard::new(worker_id), AgentOptions::default())
            .await
            .unwrap(),
    );
    let goal = worker.open_goal().await.unwrap();
    let stop = CancellationToken::new();
    let serving = stop.clone();
    tokio::spawn(async move {
        let _ = worker
            .serve_tasks(&goal, serving, None, |task| async move {
                Ok(TaskOutcome::text(format!("rust did: {}", task.message)))
            })
            .await;
    });

    let relay_seed = seed(&system, "ts-relay");
    let mut relay =
        start_ts_relay(&system.url(), "ts-relay", "rust-worker", Some(&relay_seed)).await;

    let py_seed = seed(&system, "py-sdk");
    let output = python_call(&system.url(), "py-sdk", Some(&py_seed), "ts-relay", "hello").await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert_eq!(stdout.trim(), "via ts-relay: rust did: hello");

    // Signed in as itself only: the Python SDK with another agent's key cannot speak as it.
    let refused = python_call(&system.url(), "ts-relay", Some(&py_seed), "ts-relay", "hi").await;
    assert!(!refused.status.success(), "py-sdk's key spoke as ts-relay");
    stop.cancel();
    let _ = relay.kill().await;
}
