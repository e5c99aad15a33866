//! The Switchboard agent SDK.
//!
//! An [`Agent`] is one named participant: [`Agent::connect`] registers its card, keeps it online
//! with a heartbeat loop, and opens [`Goal`]s — live runs whose messages arrive in a durable
//! JetStream inbox. A goal's inbox keeps what was sent before anyone reads it, and a message is
//! acknowledged only after the caller has taken it ([`Delivery::ack`], or [`Goal::drain`]).
//!
//! ```no_run
//! # async fn demo() -> Result<(), switchboard_client::ClientError> {
//! use switchboard_client::{Agent, render_peer_messages_block};
//! let agent = Agent::connect("nats://127.0.0.1:4222", "researcher").await?;
//! let goal = agent.open_goal().await?;
//! let peers = agent.peers().await?;
//! let messages = goal.drain().await?;
//! if let Some(block) = render_peer_messages_block(&messages) {
//!     println!("{block}");
//! }
//! # Ok(()) }
//! ```
//!
//! Layout: `agent.rs` (identity, registry calls, heartbeat), `goal.rs` (inbox reading),
//! `serve.rs` (the crash-safe handler loop), `replies.rs` (answering calls),
//! `stream.rs` (streamed calls), `tasks.rs` (task ops and the worker loop), `render.rs` (the
//! `<peer-message>` block),
//! `limits.rs` (provider limits: leases), `files.rs` (files by reference: upload, download),
//! `admin.rs` (operator views), `audit.rs` (trail queries), `dlq.rs` (dead letters), `error.rs`.

mod admin;
mod agent;
mod audit;
mod budget;
mod dlq;
mod error;
mod files;
mod goal;
mod limits;
mod people;
mod render;
mod replies;
mod serve;
mod serving;
mod stream;
mod tasks;

pub use admin::{AgentListing, list_agents};
pub use agent::{Agent, AgentOptions, agent_connect_options, server_list};
pub use audit::{audit_export, audit_history, audit_pending, audit_thread, audit_verify};
pub use budget::{audit_cost, budget_of, draw_from};
pub use dlq::{DeadLetter, Replayed, dlq_discard, dlq_list, dlq_replay};
pub use error::ClientError;
pub use files::Files;
pub use goal::{ACK_LINGER, Delivery, Goal};
pub use limits::{LimitLease, limits_delete, limits_list, limits_set};
pub use people::PersonAnswer;
pub use render::render_peer_messages_block;
pub use serve::{HANDLER_ERROR, ServeOptions, Served};
pub use serving::{current as serving_call, serving};
pub use stream::{CallEvent, call_streamed_on};
pub use switchboard_proto as proto;
pub use tasks::TaskOutcome;

/// Sends a JSON request with trace context and decodes the reply or the error reply.
pub(crate) async fn request<Req, Resp>(
    nats: &async_nats::Client,
    subject: String,
    body: &Req,
    timeout: std::time::Duration,
) -> Result<Resp, error::ClientError>
where
    Req: serde::Serialize + ?Sized,
    Resp: serde::de::DeserializeOwned,
{
    switchboard_request::request::request_json(nats, &subject, body, timeout)
        .await
        .map_err(error::ClientError::from)
}
