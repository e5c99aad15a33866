//! The `audit` binary as deployed: configured by environment, serving, stopping cleanly on
//! SIGTERM, running at its lower CPU priority, refusing bad configuration with exit code 64.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use switchboard_testkit::ServiceBinary;

const AUDIT: ServiceBinary = ServiceBinary::new(env!("CARGO_BIN_EXE_audit"), "audit");

#[tokio::test]
async fn serves_from_env_config_and_stops_on_sigterm() {
    let index = tempfile::tempdir().unwrap();
    let path = index.path().join("index.sqlite");
    let service = AUDIT
        .start(&[("SWITCHBOARD_AUDIT__INDEX_PATH", path.to_str().unwrap())])
        .await;
    let body = service.request_json("agent.audit.verify", "").await;
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
    service.stops_cleanly().await;
}

#[tokio::test]
async fn bad_configuration_exits_64_with_one_clear_line() {
    AUDIT
        .refuses_bad_settings(&[
            ("SWITCHBOARD_AUDIT__BATCH", "0"),
            ("SWITCHBOARD_AUDIT__CONSUMER", "a.b"),
            ("SWITCHBOARD_AUDIT__ACK_WAIT_MS", "soon"),
            ("SWITCHBOARD_AUDIT__INDEX", "x"),
            ("SWITCHBOARD_AUDIT__NICE", "20"),
        ])
        .await;
}
