//! The `limits` binary as deployed: configured by environment, serving, stopping cleanly on
//! SIGTERM, refusing bad configuration with exit code 64. (Being a test target of this package
//! also makes `cargo test --workspace` build the binary the fleet tests start as a process.)

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use switchboard_testkit::ServiceBinary;

const LIMITS: ServiceBinary = ServiceBinary::new(env!("CARGO_BIN_EXE_limits"), "limits");

#[tokio::test]
async fn serves_from_env_config_and_stops_on_sigterm() {
    let body = LIMITS
        .answer_then_stop(
            &[("SWITCHBOARD_LIMITS__MAX_WAITING_PER_AGENT", "8")],
            "_SB.ops.limits.list",
            "{}",
        )
        .await;
    assert_eq!(body["limits"], serde_json::json!([]), "{body}");
}

#[tokio::test]
async fn bad_configuration_exits_64_with_one_clear_line() {
    LIMITS
        .refuses_bad_settings(&[
            ("SWITCHBOARD_LIMITS__MAX_WAITING_PER_AGENT", "0"),
            ("SWITCHBOARD_LIMITS__MAX_WAITING_PER_AGENT", "many"),
            ("SWITCHBOARD_LIMITS__NO_SUCH_SETTING", "1"),
        ])
        .await;
}
