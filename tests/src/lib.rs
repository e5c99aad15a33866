//! Shared fixtures for the integration tests: services started in-process against a real
//! nats-server, and requests sent the way a non-Rust agent would.
//!
//! - [`services`]: one replica of any service ([`Service`]), the test configs, a cluster's
//!   services;
//! - [`fabric`]: a nats-server with the request services and registered agents;
//! - [`wire`]: raw requests and replies, reading inboxes and streams back;
//! - [`otlp`]: an OTLP/HTTP sink for trace tests;
//! - [`a2a`]: the A2A gateway in front of an echo agent, and requests to it;
//! - [`http`]: a bare HTTP/1.1 client (and SSE reader) for the A2A gateway;
//! - [`bench`]: the measuring harness of `make bench`;
//! - [`rust_files`]: the workspace's sources, for the checks that read them (layout, README).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

pub mod a2a;
pub mod bench;
pub mod fabric;
pub mod fake_llm;
pub mod files;
pub mod http;
pub mod otlp;
pub mod services;
pub mod wire;

pub use directory::DirectoryConfig;
pub use fabric::*;
pub use otlp::*;
pub use services::*;
pub use wire::*;

/// Runs the ignored test `name` of the running test binary alone, in a child process that
/// `configure` may give its environment, and returns its output once it has passed: for a test
/// that measures the whole process (its CPU) or needs an environment the others must not share.
/// Panics, with the child's output, when the child fails or runs no test, or after 120 s.
pub async fn run_alone(
    name: &str,
    configure: impl FnOnce(&mut tokio::process::Command),
) -> std::process::Output {
    let mut command = tokio::process::Command::new(std::env::current_exe().unwrap());
    command
        .args([
            "--exact",
            name,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .kill_on_drop(true);
    configure(&mut command);
    let output = tokio::time::timeout(std::time::Duration::from_secs(120), command.output())
        .await
        .unwrap_or_else(|_| panic!("{name} did not end within 120 s"))
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "{name}, run alone, did not pass\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    output
}

/// Every `.rs` file below `dir`, skipping build output.
pub fn rust_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(dir) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name();
            if path.is_dir() {
                if !["target", ".git", ".venv", ".tools", "node_modules"]
                    .contains(&name.to_string_lossy().as_ref())
                {
                    todo.push(path);
                }
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}
