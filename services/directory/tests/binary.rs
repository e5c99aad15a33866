//! The `directory` binary as deployed: configured by environment, serving, stopping cleanly on
//! SIGTERM, refusing bad configuration with exit code 64.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use switchboard_testkit::NatsServer;
use switchboard_testkit::process::{BAD_SETTINGS, ServiceProcess, config_error};

const BIN: &str = env!("CARGO_BIN_EXE_directory");

#[tokio::test]
async fn serves_from_env_config_and_stops_on_sigterm() {
    let nats = NatsServer::start().await;
    let service = ServiceProcess::start(
        BIN,
        "directory",
        &nats.url(),
        &[("SWITCHBOARD_DIRECTORY__HEARTBEAT_TIMEOUT_MS", "5000")],
    )
    .await;
    let reply = service
        .client()
        .request("agent.registry.register.bin-agent", "{}".into())
        .await
        .unwrap();
    let body: serde_json::Value = serde_json::from_slice(&reply.payload).unwrap();
    assert_eq!(body["agent_id"], "bin-agent");
    let status = service.terminate().await;
    assert!(status.success(), "clean exit, got {status:?}");
}

/// Runs `directory health` against `url` with the given id file; (exit code, output).
async fn health(url: &str, id_file: &std::path::Path) -> (Option<i32>, String) {
    let output = tokio::process::Command::new(BIN)
        .arg("health")
        .env("SWITCHBOARD_NATS__URLS", format!("[{url}]"))
        .env("SWITCHBOARD_HEALTH_ID_FILE", id_file)
        .output()
        .await
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code(), text)
}

#[tokio::test]
async fn the_health_command_checks_this_very_instance() {
    let nats = NatsServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let id_file = dir.path().join("directory.id");
    let (code, text) = health(&nats.url(), &id_file).await;
    assert_eq!(code, Some(1), "nothing started yet: {text}");
    assert!(text.contains("not started"), "{text}");
    let service = ServiceProcess::start(
        BIN,
        "directory",
        &nats.url(),
        &[("SWITCHBOARD_HEALTH_ID_FILE", id_file.to_str().unwrap())],
    )
    .await;
    let (code, text) = health(&nats.url(), &id_file).await;
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("healthy"), "{text}");
    // A stopped instance is unhealthy (even while another replica would answer PING).
    let _other = ServiceProcess::start(BIN, "directory", &nats.url(), &[]).await;
    let status = service.terminate().await;
    assert!(status.success());
    let (code, text) = health(&nats.url(), &id_file).await;
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("$SRV.PING.directory."), "{text}");
    let (code, text) = health("nats://127.0.0.1:1", &id_file).await;
    assert_eq!(code, Some(1), "{text}");
}

#[tokio::test]
async fn bad_configuration_exits_64_with_one_clear_line() {
    let mut settings = BAD_SETTINGS.to_vec();
    settings.push(("SWITCHBOARD_DIRECTORY__HEARTBEAT_TIMEOUT", "5"));
    settings.push(("SWITCHBOARD_DIRECTORY__HEARTBEAT_TIMEOUT_MS", "soon"));
    for (key, value) in settings {
        let (code, stderr) = config_error(BIN, key, value).await;
        assert_eq!(code, Some(64), "{key}={value}: {stderr}");
        assert!(
            stderr.starts_with("directory: invalid configuration"),
            "{stderr}"
        );
        assert_eq!(stderr.lines().count(), 1, "one clear line: {stderr}");
    }
}
