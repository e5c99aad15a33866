//! The `task-lifecycle` binary as deployed: configured by environment, serving, stopping
//! cleanly on SIGTERM, refusing bad configuration with exit code 64.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use switchboard_testkit::NatsServer;
use switchboard_testkit::process::{self, ServiceProcess};

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
    let body = service.request_json("agent.task.list.solo", "").await;
    assert_eq!(body, serde_json::json!({"tasks": [], "total": 0}));
    service.stops_cleanly().await;
}

#[tokio::test]
async fn bad_configuration_exits_64_with_one_clear_line() {
    process::refuses_bad_settings(
        BIN,
        "task-lifecycle",
        &[
            ("SWITCHBOARD_TASK_LIFECYCLE__DEPTH_LIMIT", "0"),
            ("SWITCHBOARD_TASK_LIFECYCLE__MAX_OPEN_CHILDREN", "many"),
            ("SWITCHBOARD_TASK_LIFECYCLE__MAX_CHILDREN", "2"),
            ("SWITCHBOARD_TASK_LIFECYCLE__SWEEP_MS", "5"),
        ],
    )
    .await;
}
