//! The `inbox-fanout` binary as deployed: configured by environment, serving sends, stopping
//! cleanly on SIGTERM, refusing bad configuration with exit code 64.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use switchboard_testkit::ServiceBinary;

const FANOUT: ServiceBinary =
    ServiceBinary::new(env!("CARGO_BIN_EXE_inbox-fanout"), "inbox-fanout");

#[tokio::test]
async fn serves_from_env_config_and_stops_on_sigterm() {
    // Gate 2 needs no registry: the binary answers with its typed error.
    let body = FANOUT
        .answer_then_stop(
            &[("SWITCHBOARD_INBOX_FANOUT__BROADCAST_CAP", "8")],
            "agent.send.solo",
            r#"{"to":"solo","message":"me"}"#,
        )
        .await;
    assert_eq!(body["error"]["kind"], "self_send");
}

#[tokio::test]
async fn bad_configuration_exits_64_with_one_clear_line() {
    FANOUT
        .refuses_bad_settings(&[
            ("SWITCHBOARD_INBOX_FANOUT__BROADCAST_CAP", "many"),
            ("SWITCHBOARD_INBOX_FANOUT__CAP", "5"),
            ("SWITCHBOARD_INBOX_FANOUT__BROADCAST_CAP", "0"),
        ])
        .await;
}
