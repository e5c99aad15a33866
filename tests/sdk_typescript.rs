//! The TypeScript SDK's own test suite (`sdk/typescript/test`, node's test runner) against a
//! real fabric: nats-server and every service, started here; the suite reads
//! `SWITCHBOARD_NATS_URL`. `make test` installs and builds the SDK first
//! (`sdk/typescript/install.sh`).

use std::time::Duration;

use switchboard_testkit::stdout_of;
use switchboard_tests::Fabric;

#[tokio::test]
async fn the_typescript_sdk_suite_passes_against_a_real_fabric() {
    let fabric = Fabric::start().await;
    // The people the suite asks and gets approvals from (SDK_PEOPLE).
    let people_dir = tempfile::tempdir().unwrap();
    let _people =
        switchboard_tests::services::start_sdk_people(&fabric.url(), people_dir.path()).await;
    // Provider limits (docs/protocol.md §15) for the suite's lease tests.
    let _limits = switchboard_tests::services::start_limits(&fabric.url()).await;
    // Files by reference (docs/protocol.md §17) for the suite's file tests.
    let _files =
        switchboard_tests::services::start_files_with(&fabric.url(), Default::default()).await;
    let sdk = switchboard_testkit::workspace_root().join("sdk/typescript");
    // The test files by name (a folder argument works on Node 20 only).
    let mut files: Vec<String> = std::fs::read_dir(sdk.join("dist/test"))
        .expect("make test builds the SDK into dist/")
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".test.js"))
        .map(|name| format!("dist/test/{name}"))
        .collect();
    files.sort();
    let stdout = stdout_of(
        tokio::process::Command::new("node")
            .current_dir(&sdk)
            .args(["--test", "--test-reporter=spec"])
            .args(&files)
            .env("SWITCHBOARD_NATS_URL", fabric.url())
            // The CLI, for the suite's secured fabric (`up --auth` with generated NKeys).
            .env(
                "SWITCHBOARD_BIN",
                switchboard_tests::service_bin("switchboard"),
            ),
        Duration::from_secs(300),
        "the TypeScript SDK suite",
    )
    .await;
    assert!(
        stdout.contains("pass ") && stdout.contains("fail 0") && stdout.contains("skipped 0"),
        "{stdout}"
    );
}
