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
//! - [`bench`]: the measuring harness of `make bench`.

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
