//! The `task-lifecycle` binary as deployed: configured by environment, serving, stopping
//! cleanly on SIGTERM, refusing bad configuration with exit code 64.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use switchboard_testkit::ServiceBinary;

const TASKS: ServiceBinary =
    ServiceBinary::new(env!("CARGO_BIN_EXE_task-lifecycle"), "task-lifecycle");

#[tokio::test]
async fn serves_from_env_config_and_stops_on_sigterm() {
    let body = TASKS
        .answer_then_stop(
            &[("SWITCHBOARD_TASK_LIFECYCLE__MAX_OPEN_CHILDREN", "3")],
            "agent.task.list.solo",
            "",
        )
        .await;
    assert_eq!(body, serde_json::json!({"tasks": [], "total": 0}));
}

#[tokio::test]
async fn bad_configuration_exits_64_with_one_clear_line() {
    TASKS
        .refuses_bad_settings(&[
            ("SWITCHBOARD_TASK_LIFECYCLE__DEPTH_LIMIT", "0"),
            ("SWITCHBOARD_TASK_LIFECYCLE__MAX_OPEN_CHILDREN", "many"),
            ("SWITCHBOARD_TASK_LIFECYCLE__MAX_CHILDREN", "2"),
            ("SWITCHBOARD_TASK_LIFECYCLE__SWEEP_MS", "5"),
        ])
        .await;
}
