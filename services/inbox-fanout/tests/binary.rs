//! The `inbox-fanout` binary as deployed: configured by environment, serving sends, stopping
//! cleanly on SIGTERM, refusing bad configuration with exit code 64.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use switchboard_testkit::NatsServer;
use switchboard_testkit::process::{BAD_SETTINGS, ServiceProcess, config_error};

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
    let reply = service
        .client()
        .request("agent.send.solo", r#"{"to":"solo","message":"me"}"#.into())
        .await
        .unwrap();
    let body: serde_json::Value = serde_json::from_slice(&reply.payload).unwrap();
    assert_eq!(body["error"]["kind"], "self_send");
    let status = service.terminate().await;
    assert!(status.success(), "clean exit, got {status:?}");
}

#[tokio::test]
async fn bad_configuration_exits_64_with_one_clear_line() {
    let mut settings = BAD_SETTINGS.to_vec();
    settings.push(("SWITCHBOARD_INBOX_FANOUT__BROADCAST_CAP", "many"));
    settings.push(("SWITCHBOARD_INBOX_FANOUT__CAP", "5"));
    settings.push(("SWITCHBOARD_INBOX_FANOUT__BROADCAST_CAP", "0"));
    for (key, value) in settings {
        let (code, stderr) = config_error(BIN, key, value).await;
        assert_eq!(code, Some(64), "{key}={value}: {stderr}");
        assert!(
            stderr.starts_with("inbox-fanout: invalid configuration"),
            "{stderr}"
        );
        assert_eq!(stderr.lines().count(), 1, "one clear line: {stderr}");
    }
}
