//! Test helpers for Switchboard: real `nats-server` processes with JetStream
//! (a single server or an n-node cluster on loopback) and bounded polling
//! assertions.
//!
//! The server binary is found by [`nats_server_bin`]; install the pinned version
//! once with `bash nats/install-server.sh`.
//!
//! Every server gets a free loopback port, a unique name and its own temporary
//! store directory, so tests can run in parallel. Processes are killed (and
//! their temp dirs removed) when the [`NatsServer`] / [`NatsCluster`] is dropped.
//! Setup failures panic with a clear message that includes the tail of the
//! server's log.
//!
//! Never sleep for a fixed time in a test: poll with [`assert_eventually!`] or
//! [`eventually`](fn@eventually) instead. A sleep that is itself the test (waiting past a
//! deadline, pacing a sender, a window in which something must not happen) says so in a
//! `// A real wait: <why>` comment right above it.
//!
//! ```no_run
//! use std::time::Duration;
//! use switchboard_testkit::{NatsServer, assert_eventually};
//!
//! # async fn example() {
//! // Inside a `#[tokio::test]`:
//! let mut server = NatsServer::start().await;
//! let js = async_nats::jetstream::new(server.client().await);
//! js.create_stream(async_nats::jetstream::stream::Config {
//!     name: "ORDERS".into(),
//!     subjects: vec!["orders.>".into()],
//!     ..Default::default()
//! })
//! .await
//! .unwrap();
//! js.publish("orders.1", "hello".into()).await.unwrap().await.unwrap();
//!
//! // Same port, same store: the message survives a restart.
//! server.restart().await;
//! let js = async_nats::jetstream::new(server.client().await);
//! assert_eventually!(
//!     Duration::from_secs(5),
//!     async {
//!         match js.get_stream("ORDERS").await {
//!             Ok(mut stream) => stream.info().await.is_ok_and(|i| i.state.messages == 1),
//!             Err(_) => false,
//!         }
//!     },
//!     "stream ORDERS on {} lost its message",
//!     server.url()
//! );
//! # }
//! ```
//!
//! Layout: `server.rs` ([`NatsServer`], [`Login`]), `cluster.rs` ([`NatsCluster`],
//! [`create_stream`]), `eventually.rs` (the bounded polling), `spawn.rs` (the process plumbing
//! both share), `paths.rs` (where nats-server and the Python venv are), `process.rs` (service
//! binaries as child processes), `binary.rs` ([`ServiceBinary`]: the start, ask, stop and
//! bad-settings checks every `services/*/tests/binary.rs` runs), `sdk.rs` (the TypeScript relay
//! and a Python SDK caller the cross-language tests run).

// Panicking with a clear message is the intended way for test setup to fail,
// so unwrap/expect (denied workspace-wide outside tests) are fine here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod binary;
mod cluster;
mod eventually;
mod login;
mod paths;
pub mod process;
mod sdk;
mod server;
mod spawn;

use std::time::Duration;

pub use binary::{RunningService, ServiceBinary};
pub use cluster::{NatsCluster, create_stream};
pub use eventually::eventually;
pub use login::Login;
pub use paths::{nats_server_bin, python_bin, workspace_root};
pub use sdk::{python_call, start_ts_relay, stdout_of};
pub use server::NatsServer;
pub use spawn::free_port;

/// Poll interval of readiness checks and [`eventually`](fn@eventually).
const POLL_INTERVAL: Duration = Duration::from_millis(20);
