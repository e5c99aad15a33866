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
pub mod http;
pub mod otlp;
pub mod services;
pub mod wire;

pub use directory::DirectoryConfig;
pub use fabric::*;
pub use otlp::*;
pub use services::*;
pub use wire::*;

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
