//! The `reply-correlator` binary as deployed: configured by environment, serving, stopping
//! cleanly on SIGTERM, refusing bad configuration with exit code 64.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use switchboard_testkit::ServiceBinary;

const CORRELATOR: ServiceBinary =
    ServiceBinary::new(env!("CARGO_BIN_EXE_reply-correlator"), "reply-correlator");

#[tokio::test]
async fn serves_from_env_config_and_stops_on_sigterm() {
    let body = CORRELATOR
        .answer_then_stop(
            &[("SWITCHBOARD_REPLY_CORRELATOR__MAX_OPEN_CALLS", "3")],
            "agent.calls.pending.solo",
            "",
        )
        .await;
    assert_eq!(body, serde_json::json!({"outgoing": [], "incoming": []}));
}

#[tokio::test]
async fn bad_configuration_exits_64_with_one_clear_line() {
    CORRELATOR
        .refuses_bad_settings(&[
            ("SWITCHBOARD_REPLY_CORRELATOR__MAX_OPEN_CALLS", "lots"),
            ("SWITCHBOARD_REPLY_CORRELATOR__TIMEOUT_MS", "5"),
            ("SWITCHBOARD_REPLY_CORRELATOR__MAX_TIMEOUT_MS", "0"),
            ("SWITCHBOARD_REPLY_CORRELATOR__DEPTH_LIMIT", "1"),
            // Records would age out before the longest call's deadline.
            ("SWITCHBOARD_JETSTREAM__CALLS_MAX_AGE_SECS", "60"),
        ])
        .await;
}
