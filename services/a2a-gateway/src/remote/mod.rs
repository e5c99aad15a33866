//! Remote A2A agents on the fabric (docs/a2a.md, "Outbound"): a remote agent added with
//! `switchboard a2a add <card-url>` gets a fabric identity, and the gateway carries its inbox
//! to it. `add` adds one (the directory refuses an id that is a Switchboard agent's) and
//! releases a removed one; `card` fetches and checks its card; `bridge` holds a lease per
//! agent and runs a `carrier` for each, counting offers in `attempts`; `outbound` is the A2A
//! client, `answer` decodes what a remote answers.
//!
//! It shares only `gateway.rs`, `store.rs`, `mapping.rs`, `error.rs`, `config.rs` and the leaf
//! `http.rs` with `serve/`, and imports nothing from it.

pub mod add;
pub mod answer;
pub(crate) mod attempts;
pub mod bridge;
pub mod card;
pub mod carrier;
pub mod outbound;

pub use add::{Added, add, add_with, bucket, list, put, release, remove};
pub use card::{RemoteAgent, RemoteError, http_client};
