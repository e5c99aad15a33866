//! The `task-lifecycle` binary as deployed: configured by environment, serving, stopping
//! cleanly on SIGTERM, refusing bad configuration with exit code 64.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use switchboard_testkit::NatsServer;
use switchboard_testkit::process::{BAD_SETTINGS, ServiceProcess, config_error};

const BIN: &str = env!("CARGO_BIN_EXE_task-lifecycle");

#[tokio::test]
async fn serves_from_env_config_and_stops_on_sigterm() {
    let nats = NatsServer::start().await;
    let service = ServiceProcess::start(
        BIN,
        "task-lifecycle",
        &nats.url(),
        &[("SWITCHBOARD_TASK_LIFECYCLE__MAX_OPEN_CHILDREN", "3")],
    )
    .await;
    let reply = service
        .client()
        .request("agent.task.list.solo", "".into())
        .await
        .unwrap();
    let body: serde_json::Value = serde_json::from_slice(&reply.payload).unwrap();
    assert_eq!(body, serde_json::json!({"tasks": []}));
    let status = service.terminate().await;
    assert!(status.success(), "clean exit, got {status:?}");
}

#[tokio::test]
async fn bad_configuration_exits_64_with_one_clear_line() {
    let mut settings = BAD_SETTINGS.to_vec();
    settings.push(("SWITCHBOARD_TASK_LIFECYCLE__DEPTH_LIMIT", "0"));
    settings.push(("SWITCHBOARD_TASK_LIFECYCLE__MAX_OPEN_CHILDREN", "many"));
    settings.push(("SWITCHBOARD_TASK_LIFECYCLE__MAX_CHILDREN", "2"));
    settings.push(("SWITCHBOARD_TASK_LIFECYCLE__SWEEP_MS", "5"));
    for (key, value) in settings {
        let (code, stderr) = config_error(BIN, key, value).await;
        assert_eq!(code, Some(64), "{key}={value}: {stderr}");
        assert!(
            stderr.starts_with("task-lifecycle: invalid configuration"),
            "{stderr}"
        );
        assert_eq!(stderr.lines().count(), 1, "one clear line: {stderr}");
    }
}
