//! Files by reference from the command line (docs/protocol.md §17): `send --attach FILE`
//! uploads and sends by reference, and the receiver reads it with `attachments get` (the same
//! as `files get`), whole and checked; an agent it was not delivered to gets nothing.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use switchboard_tests::files::{attachments_of, fabric_with_files};
use switchboard_tests::services::switchboard_json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_attach_then_attachments_get_on_the_command_line() {
    let (fabric, _files) = fabric_with_files(Default::default()).await;
    let _writer = fabric.agent("cli-writer").await;
    let (_reader, goal) = fabric.agent_with_goal("cli-reader").await;
    let _outsider = fabric.agent("cli-outsider").await;
    let folder = tempfile::tempdir().unwrap();
    let report = folder.path().join("report.md");
    std::fs::write(&report, "# the report\nall green\n").unwrap();
    let url = fabric.url();

    let sent = switchboard_json(
        &url,
        &[
            "send",
            "--as",
            "cli-writer",
            "--to",
            "cli-reader",
            "the report, attached",
            "--attach",
            report.to_str().unwrap(),
        ],
    )
    .await;
    assert_eq!(sent["delivered_to"].as_array().unwrap().len(), 1, "{sent}");
    let attached = attachments_of(&goal).await;
    assert_eq!(attached.len(), 1);
    assert_eq!(attached[0].name, "report.md");
    assert_eq!(attached[0].media_type, "text/markdown");

    let out = folder.path().join("saved.md");
    let file_ref = attached[0].file_ref.to_string();
    switchboard_json(
        &url,
        &[
            "attachments",
            "--as",
            "cli-reader",
            "get",
            &file_ref,
            "--out",
            out.to_str().unwrap(),
        ],
    )
    .await;
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        "# the report\nall green\n"
    );
    // Not delivered to it: the outsider's get fails and writes nothing.
    let denied = folder.path().join("denied.md");
    let failed = tokio::process::Command::new(switchboard_tests::service_bin("switchboard"))
        .args([
            "--json",
            "files",
            "--as",
            "cli-outsider",
            "get",
            &file_ref,
            "--out",
        ])
        .arg(&denied)
        .env("NATS_URL", &url)
        .output()
        .await
        .unwrap();
    assert!(!failed.status.success());
    assert!(
        String::from_utf8_lossy(&failed.stderr).contains("not_found")
            || String::from_utf8_lossy(&failed.stdout).contains("not_found"),
        "{failed:?}"
    );
    assert!(!denied.exists());
}
