//! The `inbox-fanout` binary as deployed: configured by environment, serving sends, stopping
//! cleanly on SIGTERM, refusing bad configuration with exit code 64.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use switchboard_testkit::NatsServer;
use switchboard_testkit::process::{self, ServiceProcess};

const BIN: &str = env!("CARGO_BIN_EXE_inbox-fanout");

#[tokio::test]
async fn serves_from_env_config_and_stops_on_sigterm() {
    let nats = NatsServer::start().await;
    let service = ServiceProcess::start(
        BIN,
        "inbox-fanout",
        &nats.url(),
        &[("SWITCHBOARD_INBOX_FANOUT__BROADCAST_CAP", "8")],
    )
    .await;
    // Gate 2 needs no registry: the binary answers with its typed error.
    let body = service
        .request_json("agent.send.solo", r#"{"to":"solo","message":"me"}"#)
        .await;
    assert_eq!(body["error"]["kind"], "self_send");
    service.stops_cleanly().await;
}

#[tokio::test]
async fn bad_configuration_exits_64_with_one_clear_line() {
    process::refuses_bad_settings(
        BIN,
        "inbox-fanout",
        &[
            ("SWITCHBOARD_INBOX_FANOUT__BROADCAST_CAP", "many"),
            ("SWITCHBOARD_INBOX_FANOUT__CAP", "5"),
            ("SWITCHBOARD_INBOX_FANOUT__BROADCAST_CAP", "0"),
        ],
    )
    .await;
}
