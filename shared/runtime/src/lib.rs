//! What every Switchboard service shares, so each service is only its rules.
//!
//! Layout:
//! - [`config`]: figment layering (defaults < `switchboard.toml` < `SWITCHBOARD_*` env, nested
//!   keys via `__`), the shared `RuntimeConfig` and per-service sections.
//! - [`nats`]: a named NATS connection with auth/TLS, reconnect logging and a 5 s ping.
//! - [`telemetry`]: `tracing` + OpenTelemetry OTLP export, and the one helper that puts W3C trace
//!   context into NATS headers and takes it out again.
//! - [`service`]: a service binary's whole `main` (config, telemetry, connect, run, drain) and
//!   the shared start-up error.
//! - [`shutdown`]: SIGINT/SIGTERM as a cancellation token.
//! - [`micro`]: the NATS micro service scaffold: typed JSON endpoints, error replies with
//!   `Nats-Service-Error(-Code)` headers, per-request spans, drain under a grace period, the
//!   reply-inbox rule and the per-agent request budget.
//! - [`budget`]: per-agent token buckets (`rate_limited` past them).
//! - [`headers`]: header values from text a caller wrote, without CR/LF.
//! - [`publish`]: JetStream publish with trace context, `Nats-Msg-Id` and retries.
//! - [`request`]: JSON requests to services with trace context and typed error replies.
//! - [`resources`]: JetStream streams and KV buckets, declared once and applied idempotently.
//! - [`room`]: room in a full goal inbox: the oldest message goes, its sender is told.
//! - [`receipts`]: receipt records (`agent_receipts`) and the `kind: receipt` messages.
//! - [`store`]: the error type of a service's JetStream-backed state.
//! - [`places`]: a bounded number of places per agent, each freed when its guard drops.
//! - [`lease`]: a lease on one KV key (one writer among replicas), renewed or lost.
//! - [`kv`]: KV reads the services need beyond async-nats (a consistent snapshot of a bucket).
//! - [`registry_view`]: the registry (agent records, live goals) kept in memory by KV watches,
//!   for the fan-out's peer resolution and the directory's list_peers and offline sweep.

pub mod budget;
pub mod config;
pub mod http;
pub mod lease;
pub mod micro;
pub mod nats;
pub mod places;
pub mod publish;
pub mod resources;
pub mod service;
pub mod shutdown;
pub mod store;
pub mod telemetry;

pub use config::RuntimeConfig;
pub use switchboard_request::{headers, kv, request};
pub use tokio_util::sync::CancellationToken;
