//! How a Switchboard party talks to the services over NATS, and nothing more: JSON requests
//! answered with the wire types or an `ErrorReply` (docs/protocol.md §2), retried when safe;
//! the W3C trace context every message carries; header values made safe from agents' text;
//! consistent KV snapshots through direct get.
//!
//! The services use it directly (the runtime re-exports only the `trace` functions, from its
//! `telemetry`); an
//! agent built on `switchboard-client` gets it without the runtime's config loader and
//! OpenTelemetry exporter.

pub mod budget;
pub mod headers;
pub mod kv;
pub mod request;
pub mod trace;
