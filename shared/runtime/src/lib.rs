//! What every Switchboard service shares, so each service is only its rules.
//!
//! Plumbing only: no rule of the fabric's domain lives here (delivering into goal inboxes is
//! `switchboard-delivery`, which builds on this crate).
//!
//! Layout:
//! - [`config`]: figment layering (defaults < `switchboard.toml` < `SWITCHBOARD_*` env, nested
//!   keys via `__`), the shared `RuntimeConfig` and per-service sections.
//! - [`nats`]: a named NATS connection with auth/TLS, reconnect logging and a 5 s ping; NKey
//!   seed files.
//! - [`telemetry`]: `tracing` + OpenTelemetry OTLP export and metrics (the W3C trace context on
//!   NATS headers is `switchboard_request::trace`, re-exported here).
//! - [`service`]: a service binary's whole `main` (config, telemetry, connect, run, drain) and
//!   the shared start-up error.
//! - [`shutdown`]: SIGINT/SIGTERM as a cancellation token.
//! - [`micro`]: the NATS micro service scaffold: typed JSON endpoints, error replies with
//!   `Nats-Service-Error(-Code)` headers, per-request spans, drain under a grace period, the
//!   reply-inbox rule and the per-agent request budget.
//! - [`http`]: serving an HTTP router (the gateway's, every service's `/metrics`).
//! - [`budget`]: per-agent token buckets (`rate_limited` past them).
//! - [`publish`]: JetStream publish with trace context, `Nats-Msg-Id` and retries.
//! - [`resources`]: JetStream streams and KV buckets, declared once and applied idempotently.
//! - [`store`]: the error type of a service's JetStream-backed state.
//! - [`places`]: a bounded number of places per agent, each freed when its guard drops.
//! - [`lease`]: a lease on one KV key (one writer among replicas), renewed or lost.
//!
//! JSON requests, safe header values and KV snapshots are `switchboard-request`, which the
//! services and the Rust client use directly.

pub mod budget;
pub mod config;
pub mod http;
pub mod lease;
pub mod micro;
pub mod nats;
pub mod people_book;
pub mod places;
pub mod publish;
pub mod resources;
pub mod service;
pub mod shutdown;
pub mod store;
pub mod telemetry;

pub use config::RuntimeConfig;
pub use tokio_util::sync::CancellationToken;

/// The allocator of every binary that links this crate (the services, `switchboard up`, the
/// tests): mimalloc. A service allocates and frees many short buffers per message (JSON,
/// headers, spans); glibc's malloc spent 15-20 % of the audit's and the limits service's CPU
/// on them, and mimalloc made those services 11-14 % faster (docs/performance.md, "The
/// allocator"). The client crate agents embed does not link this crate, so it leaves their
/// allocator alone.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
