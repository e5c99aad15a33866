//! One conversation across three languages (issue 29): a Python agent (the Python SDK) calls a
//! TypeScript agent (the TypeScript SDK), which gives the work as a task to a Rust agent (the
//! Rust client) and answers with its result, all on one real fabric.

use std::sync::Arc;

use switchboard_client::TaskOutcome;
use switchboard_runtime::CancellationToken;
use switchboard_tests::Fabric;

#[tokio::test]
async fn a_python_agent_calls_a_typescript_agent_that_tasks_a_rust_agent() {
    let fabric = Fabric::start().await;

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
    let mut relay =
        switchboard_testkit::start_ts_relay(&fabric.url(), "ts-relay", "rust-worker", None).await;

    // Python: asks the TypeScript agent and prints the answer.
    let output =
        switchboard_testkit::python_call(&fabric.url(), "py-asker", None, "ts-relay", "hello")
            .await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert_eq!(stdout.trim(), "via ts-relay: rust did: hello");
    stop.cancel();
    let _ = relay.kill().await;
}
