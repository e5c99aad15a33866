//! The Python and TypeScript SDKs under the accounts `switchboard nats-config` writes: each
//! agent signs in with its own generated NKey and reads its replies under
//! `_INBOX.<agent_id>`. A Python agent calls a TypeScript agent that gives the work to a Rust
//! agent as a task; all three are keyed, and none could read another's inbox.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::System;
use switchboard_client::proto::{AgentCard, AgentId};
use switchboard_client::{Agent, AgentOptions, TaskOutcome};
use switchboard_runtime::CancellationToken;
use switchboard_testkit::{python_bin, workspace_root};
use tokio::io::{AsyncBufReadExt, BufReader};

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

    let mut relay = tokio::process::Command::new("node")
        .current_dir(workspace_root().join("sdk/typescript"))
        .args([
            "dist/examples/relay.js",
            &system.url(),
            "ts-relay",
            "rust-worker",
        ])
        .env("SWITCHBOARD_NKEY_SEED", seed(&system, "ts-relay"))
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node runs the built TypeScript SDK (make test builds it)");
    let mut lines = BufReader::new(relay.stdout.take().unwrap()).lines();
    let ready = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the TypeScript agent starts within 30 s")
        .unwrap()
        .unwrap_or_default();
    assert!(ready.starts_with("ready"), "{ready}");

    let script = format!(
        "import asyncio\nfrom switchboard import Agent\n\
         async def main():\n    \
             async with await Agent.connect({url:?}, 'py-sdk', nkey_seed={seed:?}) as agent:\n        \
                 print((await agent.call('ts-relay', 'hello', timeout_ms=20000))['body'])\n\
         asyncio.run(main())\n",
        url = system.url(),
        seed = seed(&system, "py-sdk"),
    );
    let output = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(python_bin())
            .args(["-c", &script])
            .env("PYTHONPATH", workspace_root().join("sdk/python"))
            .output(),
    )
    .await
    .expect("the Python agent finishes within 60 s")
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert_eq!(stdout.trim(), "via ts-relay: rust did: hello");

    // Signed in as itself only: the Python SDK with another agent's key cannot speak as it.
    let impostor = format!(
        "import asyncio\nfrom switchboard import Agent\n\
         async def main():\n    \
             await Agent.connect({url:?}, 'ts-relay', nkey_seed={seed:?})\n\
         asyncio.run(main())\n",
        url = system.url(),
        seed = seed(&system, "py-sdk"),
    );
    let refused = tokio::process::Command::new(python_bin())
        .args(["-c", &impostor])
        .env("PYTHONPATH", workspace_root().join("sdk/python"))
        .output()
        .await
        .unwrap();
    assert!(!refused.status.success(), "py-sdk's key spoke as ts-relay");
    stop.cancel();
    let _ = relay.kill().await;
}
