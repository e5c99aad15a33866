//! The Python SDK's own test suite (`sdk/python/tests`, pytest) against a real fabric:
//! nats-server and every service, started here; the suite reads `SWITCHBOARD_NATS_URL`. The
//! suite runs against the SDK as `pip install ./sdk/python` installs it (into a folder of its
//! own each run, so never a stale copy).

use std::time::Duration;

use switchboard_testkit::{python_bin, stdout_of};
use switchboard_tests::Fabric;
use tokio::process::Command;

#[tokio::test]
async fn the_python_sdk_suite_passes_against_a_real_fabric() {
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
    let root = switchboard_testkit::workspace_root();
    // Built from a copy: setuptools writes build/ and *.egg-info beside the sources.
    let source = tempfile::tempdir().unwrap();
    copy_tree(&root.join("sdk/python"), source.path()).expect("the SDK copies into a tempdir");
    let installed = tempfile::tempdir().unwrap();
    stdout_of(
        Command::new(python_bin())
            .current_dir(source.path())
            .args([
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                "--no-build-isolation",
            ])
            .args(["--target", &installed.path().display().to_string()])
            .arg("."),
        Duration::from_secs(300),
        "pip install ./sdk/python",
    )
    .await;
    let stdout = stdout_of(
        Command::new(python_bin())
            .current_dir(&root)
            .args([
                "-m",
                "pytest",
                "sdk/python/tests",
                "-q",
                "-p",
                "no:cacheprovider",
            ])
            .env("SWITCHBOARD_NATS_URL", fabric.url())
            // The CLI, for the suite's secured fabric (`up --auth` with generated NKeys).
            .env(
                "SWITCHBOARD_BIN",
                switchboard_tests::service_bin("switchboard"),
            )
            .env("PYTHONPATH", installed.path()),
        Duration::from_secs(300),
        "the Python SDK suite (pytest)",
    )
    .await;
    assert!(stdout.contains("passed"), "{stdout}");
    // Every test ran: the secured-fabric one skips only without SWITCHBOARD_BIN.
    assert!(!stdout.contains("skipped"), "{stdout}");
}

/// Copies the SDK's sources (not its caches) from `from` into `to`.
fn copy_tree(from: &std::path::Path, to: &std::path::Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(from)?.flatten() {
        let name = entry.file_name();
        if name == "__pycache__" || name == "build" || name.to_string_lossy().ends_with(".egg-info")
        {
            continue;
        }
        let target = to.join(&name);
        if entry.file_type()?.is_dir() {
            std::fs::create_dir_all(&target)?;
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}
