//! One conversation across three languages (issue 29): a Python agent (the Python SDK) calls a
//! TypeScript agent (the TypeScript SDK), which gives the work as a task to a Rust agent (the
//! Rust client) and answers with its result, all on one real fabric.

use std::sync::Arc;
use std::time::Duration;

use switchboard_client::TaskOutcome;
use switchboard_runtime::CancellationToken;
use switchboard_tests::Fabric;
use tokio::io::{AsyncBufReadExt, BufReader};

#[tokio::test]
async fn a_python_agent_calls_a_typescript_agent_that_tasks_a_rust_agent() {
    let fabric = Fabric::start().await;
    let root = switchboard_testkit::workspace_root();

    // Rust: works every task it is given.
    let (worker, goal) = fabric.agent_with_goal("rust-worker").await;
    let worker = Arc::new(worker);
    let stop = CancellationToken::new();
    let serving = stop.clone();
    let _worker = tokio::spawn(async move {
        let _ = worker
            .serve_tasks(&goal, serving, None, |task| async move {
                Ok(TaskOutcome::text(format!("rust did: {}", task.message)))
            })
            .await;
    });

    // TypeScript: relays each call to the Rust agent as a task.
    let mut relay = tokio::process::Command::new("node")
        .current_dir(root.join("sdk/typescript"))
        .args([
            "dist/examples/relay.js",
            &fabric.url(),
            "ts-relay",
            "rust-worker",
        ])
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

    // Python: asks the TypeScript agent and prints the answer.
    let script = format!(
        "import asyncio\nfrom switchboard import Agent\n\
         async def main():\n    \
             async with await Agent.connect({url:?}, 'py-asker') as agent:\n        \
                 print((await agent.call('ts-relay', 'hello', timeout_ms=20000))['body'])\n\
         asyncio.run(main())\n",
        url = fabric.url()
    );
    let output = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new(switchboard_testkit::python_bin())
            .args(["-c", &script])
            .env("PYTHONPATH", root.join("sdk/python"))
            .output(),
    )
    .await
    .expect("the Python agent finishes within 60 s")
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert_eq!(stdout.trim(), "via ts-relay: rust did: hello");
    stop.cancel();
    let _ = relay.kill().await;
}
