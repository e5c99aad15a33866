//! The `files` binary as deployed: configured by environment, serving, stopping cleanly on
//! SIGTERM, refusing bad configuration with exit code 64. (Being a test target of this package
//! also makes `cargo test --workspace` build the binary the files tests and the bench start as
//! a process.)

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use switchboard_testkit::ServiceBinary;

const FILES: ServiceBinary = ServiceBinary::new(env!("CARGO_BIN_EXE_files"), "files");

#[tokio::test]
async fn serves_from_env_config_and_stops_on_sigterm() {
    // The size bound comes from the environment: a file one byte past it is refused.
    let body = FILES
        .answer_then_stop(
            &[("SWITCHBOARD_FILES__MAX_FILE_BYTES", "1000")],
            "agent.files.upload.solo",
            &format!(
                r#"{{"name":"a.bin","media_type":"application/octet-stream","size":1001,"sha256":"{}"}}"#,
                "0".repeat(64)
            ),
        )
        .await;
    assert_eq!(body["error"]["kind"], "file_too_large", "{body}");
}

#[tokio::test]
async fn bad_configuration_exits_64_with_one_clear_line() {
    FILES
        .refuses_bad_settings(&[
            ("SWITCHBOARD_FILES__MAX_FILE_BYTES", "0"),
            ("SWITCHBOARD_FILES__QUOTA_BYTES", "lots"),
            ("SWITCHBOARD_FILES__UPLOAD_IDLE_SECS", "1"),
            ("SWITCHBOARD_FILES__SWEEP_MS", "5"),
            ("SWITCHBOARD_FILES__NO_SUCH_SETTING", "1"),
        ])
        .await;
}
