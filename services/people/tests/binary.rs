//! The `people` binary as deployed: configured by environment, serving, stopping cleanly on
//! SIGTERM, refusing bad configuration with exit code 64.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use switchboard_testkit::ServiceBinary;

const PEOPLE: ServiceBinary = ServiceBinary::new(env!("CARGO_BIN_EXE_people"), "people");

#[tokio::test]
async fn serves_from_env_config_and_stops_on_sigterm() {
    // No people file: nobody is reachable, and an unregistered caller is told so first.
    let body = PEOPLE
        .answer_then_stop(
            &[("SWITCHBOARD_PEOPLE__SWEEP_INTERVAL_MS", "100")],
            "agent.people.list.solo",
            "",
        )
        .await;
    assert_eq!(body["error"]["kind"], "not_registered", "{body}");
}

#[tokio::test]
async fn bad_configuration_exits_64_with_one_clear_line() {
    PEOPLE
        .refuses_bad_settings(&[
            ("SWITCHBOARD_PEOPLE__MAX_OPEN_PER_SENDER", "0"),
            ("SWITCHBOARD_PEOPLE__MAX_WAIT_MS", "0"),
            ("SWITCHBOARD_PEOPLE__SWEEP_INTERVAL_MS", "soon"),
            // Records would age out before the longest wait's deadline.
            ("SWITCHBOARD_JETSTREAM__PEOPLE_MAX_AGE_SECS", "60"),
        ])
        .await;
}
