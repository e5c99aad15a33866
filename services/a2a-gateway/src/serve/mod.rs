//! The A2A server: what clients of the fabric's agents call. The routes are in
//! `endpoints.rs`; here are the handlers of both bindings (`jsonrpc`, `rest`), the checks
//! every request passes (`checks`, `auth`), agent cards (`cards`), the methods (`tasks`,
//! `messages` carried as calls, `history`), streams (`stream`, `events`, `sse`) and push
//! notifications (`push`, `webhook_target`).
//!
//! It shares only the gateway handle, the store and the mapping with `remote/`.

pub mod auth;
pub mod cards;
pub(crate) mod checks;
pub mod events;
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
