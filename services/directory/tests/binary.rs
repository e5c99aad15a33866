//! The `directory` binary as deployed: configured by environment, serving, stopping cleanly on
//! SIGTERM, refusing bad configuration with exit code 64.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::process::Stdio;
use std::time::Duration;

use switchboard_testkit::{NatsServer, assert_eventually};
use tokio::process::Command;

fn directory() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_directory"));
    command
        .env_remove("SWITCHBOARD_CONFIG")
        .env("RUST_LOG", "warn")
        .current_dir(std::env::temp_dir())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

async fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .await
        .unwrap();
    assert!(status.success());
}

#[tokio::test]
async fn serves_from_env_config_and_stops_on_sigterm() {
    let nats = NatsServer::start().await;
    let mut child = directory()
        .env("SWITCHBOARD_NATS__URLS", format!("[{}]", nats.url()))
        .env("SWITCHBOARD_DIRECTORY__HEARTBEAT_TIMEOUT_MS", "5000")
        .spawn()
        .unwrap();
    let client = nats.client().await;
    assert_eventually!(Duration::from_secs(20), async {
        client
            .request("$SRV.PING.directory", "".into())
            .await
            .is_ok()
    });
    let reply = client
        .request("agent.registry.register.bin-agent", "{}".into())
        .await
        .unwrap();
    let body: serde_json::Value = serde_json::from_slice(&reply.payload).unwrap();
    assert_eq!(body["agent_id"], "bin-agent");

    signal(child.id().unwrap(), "TERM").await;
    let status = tokio::time::timeout(Duration::from_secs(15), child.wait())
        .await
        .expect("directory exits after SIGTERM")
        .unwrap();
    assert!(status.success(), "clean exit, got {status:?}");
    // Its subscriptions are gone (the server may take a moment to see the closed socket).
    assert_eventually!(Duration::from_secs(10), async {
        let ping = client.request("$SRV.PING.directory", "".into());
        matches!(
            tokio::time::timeout(Duration::from_millis(500), ping).await,
            Ok(Err(err)) if err.kind() == async_nats::RequestErrorKind::NoResponders
        )
    });
}

#[tokio::test]
async fn bad_configuration_exits_64_with_one_clear_line() {
    let output = directory()
        .env("SWITCHBOARD_DIRECTORY__HEARTBEAT_TIMEOUT", "5")
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(64));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.starts_with("directory: invalid configuration"),
        "{stderr}"
    );
    assert!(stderr.contains("heartbeat_timeout"), "{stderr}");

    for (key, value) in [
        ("SWITCHBOARD_DIRECTORY__HEARTBEAT_TIMEOUT_MS", "soon"),
        ("SWITCHBOARD_NATS__URLS", "[]"),
        ("SWITCHBOARD_NATS__USER", "svc-without-password"),
        ("SWITCHBOARD_CONFIG", "/nonexistent/switchboard.toml"),
    ] {
        let output = directory().env(key, value).output().await.unwrap();
        assert_eq!(output.status.code(), Some(64), "{key}={value}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(stderr.lines().count(), 1, "one clear line: {stderr}");
    }
}
