//! The `audit` binary as deployed: configured by environment, serving, stopping cleanly on
//! SIGTERM, running at its lower CPU priority, refusing bad configuration with exit code 64.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use switchboard_testkit::NatsServer;
use switchboard_testkit::process::{BAD_SETTINGS, ServiceProcess, config_error};

const BIN: &str = env!("CARGO_BIN_EXE_audit");

#[tokio::test]
async fn serves_from_env_config_and_stops_on_sigterm() {
    let nats = NatsServer::start().await;
    let index = tempfile::tempdir().unwrap();
    let path = index.path().join("index.sqlite");
    let service = ServiceProcess::start(
        BIN,
        "audit",
        &nats.url(),
        &[("SWITCHBOARD_AUDIT__INDEX_PATH", path.to_str().unwrap())],
    )
    .await;
    let reply = service
        .client()
        .request("agent.audit.verify", "".into())
        .await
        .unwrap();
    let body: serde_json::Value = serde_json::from_slice(&reply.payload).unwrap();
    assert_eq!(body["ok"], true, "{body}");
    assert_eq!(body["records"], 0);
    assert!(path.exists(), "the index file is created");
    // It runs at `audit.nice` (10 by default), every thread of it.
    let pid = service.pid().unwrap();
    let tasks: Vec<_> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .collect();
    assert!(!tasks.is_empty());
    for task in tasks {
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap();
        // Fields after the command's closing parenthesis; nice is field 19 of stat(5).
        let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
        assert_eq!(fields[16], "10", "thread {:?}: {stat}", task.file_name());
    }
    let status = service.terminate().await;
    assert!(status.success(), "clean exit, got {status:?}");
}

#[tokio::test]
async fn bad_configuration_exits_64_with_one_clear_line() {
    let mut settings = BAD_SETTINGS.to_vec();
    settings.push(("SWITCHBOARD_AUDIT__BATCH", "0"));
    settings.push(("SWITCHBOARD_AUDIT__CONSUMER", "a.b"));
    settings.push(("SWITCHBOARD_AUDIT__ACK_WAIT_MS", "soon"));
    settings.push(("SWITCHBOARD_AUDIT__INDEX", "x"));
    settings.push(("SWITCHBOARD_AUDIT__NICE", "20"));
    for (key, value) in settings {
        let (code, stderr) = config_error(BIN, key, value).await;
        assert_eq!(code, Some(64), "{key}={value}: {stderr}");
        assert!(
            stderr.starts_with("audit: invalid configuration"),
            "{stderr}"
        );
        assert_eq!(stderr.lines().count(), 1, "one clear line: {stderr}");
    }
}
