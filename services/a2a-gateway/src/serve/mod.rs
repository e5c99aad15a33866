//! The A2A server: what clients of the fabric's agents call. The routes are in
//! `endpoints.rs`; here are the handlers of both bindings (`jsonrpc`, `rest`), the checks
//! every request passes (`checks`, `auth`), agent cards (`cards`), the methods (`tasks`,
//! `messages` carried as calls, `history`, with `params` reading their requests), streams
//! (`stream`, `events`, `sse`) and push notifications (`push`, with the background consumer
//! that delivers them, and `webhook_target`).
//!
//! It shares only `gateway.rs`, `store.rs`, `mapping.rs`, `error.rs`, `config.rs` and the leaf
//! `http.rs` with `remote/`, and imports nothing from it.

pub mod auth;
pub mod cards;
pub(crate) mod checks;
pub mod events;
pub mod files;
pub(crate) mod history;
pub(crate) mod jsonrpc;
pub mod messages;
pub(crate) mod params;
pub mod push;
pub(crate) mod rest;
pub(crate) mod sse;
pub mod stream;
pub mod tasks;
pub mod webhook_target;
