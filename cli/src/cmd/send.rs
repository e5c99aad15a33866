//! `switchboard send|status`: send_to_peer as an agent (a peer or a broadcast), and where a
//! message sent with receipts is.

use serde_json::Value;
use switchboard_client::proto::GoalId;
use switchboard_client::proto::receipt::{ReceiptLevel, SendStatusRequest};
use switchboard_client::proto::send::SendRequest;
use switchboard_client::proto::subject;
use uuid::Uuid;

use super::args::{Acting, Connection};
use crate::nats::{request_json, request_with_retry};

/// send_to_peer as an agent (it must be registered); prints the delivery report.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  switchboard send --as writer --to researcher \"draft ready\"\n  switchboard send --as herald --to '*' \"standup in 5\"   # broadcast\n  switchboard send --as writer --to researcher \"draft ready\" --goal 0193a1b2-0000-7000-8000-000000000001 --receipt read\n  switchboard send --as writer --to reviewer \"the report\" --attach report.pdf   # by reference\n  switchboard status --as writer <message_id>   # stored, delivered, read or expired_unread",
    mut_args(super::args::agent_help("The sending agent"))
)]
pub(crate) struct SendArgs {
    #[command(flatten)]
    acting: Acting,
    /// The peer, or `*` to broadcast.
    #[arg(long, value_name = "PEER")]
    to: String,
    /// The message text.
    message: String,
    /// A correlation id to carry (UUID).
    #[arg(long)]
    correlation_id: Option<Uuid>,
    /// The sending goal (one of the agent's live goals): answers and receipts land there.
    #[arg(long)]
    goal: Option<String>,
    /// Receipts back in --goal: `delivered`, or `read` (delivered, then read).
    #[arg(long, value_parser = receipt_level)]
    receipt: Option<ReceiptLevel>,
    /// A file to carry by reference (repeat for more, at most 16): uploaded first, then
    /// attached; the receiver reads it with `switchboard files get` (docs/protocol.md §17).
    #[arg(long, value_name = "FILE")]
    attach: Vec<std::path::PathBuf>,
    #[command(flatten)]
    conn: Connection,
}

/// Where a message sent with --receipt is, per receiving goal: stored, delivered, read or
/// expired_unread.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Example:\n  switchboard status --as writer 0193a1b2-0000-7000-8000-0000000000aa",
    mut_args(super::args::agent_help("The agent that sent it (only the sender may ask)"))
)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    acting: Acting,
    /// The message id the delivery report named.
    message_id: Uuid,
    #[command(flatten)]
    conn: Connection,
}

/// `switchboard send`: send_to_peer with a minted message id, retried while no fan-out answers
/// (same id, so stored once per goal) — the Rust client's policy, from the same helper.
pub(crate) async fn send(args: SendArgs) -> anyhow::Result<Value> {
    let agent = args.acting.id()?;
    let mut attachments = Vec::new();
    if !args.attach.is_empty() {
        let nats = crate::nats::connect_as(&args.conn.nats_url, Some(&agent)).await?;
        let files = switchboard_client::Files::new(nats, agent.clone());
        for path in &args.attach {
            attachments.push(
                files
                    .upload_file(path, super::files::media_type(path))
                    .await?,
            );
        }
    }
    let request = SendRequest {
        to: Some(args.to),
        message: Some(args.message),
        id: Some(switchboard_client::proto::new_id()),
        correlation_id: args.correlation_id,
        from_goal_id: args.goal.as_deref().map(GoalId::parse).transpose()?,
        receipt: args.receipt,
        attachments,
        ..SendRequest::default()
    };
    request_with_retry(&args.conn.nats_url, &subject::send(&agent), &request).await
}

/// `--receipt`: `delivered` or `read`.
fn receipt_level(text: &str) -> Result<ReceiptLevel, String> {
    match text {
        "delivered" => Ok(ReceiptLevel::Delivered),
        "read" => Ok(ReceiptLevel::Read),
        other => Err(format!("`{other}`: give `delivered` or `read`")),
    }
}

/// `switchboard status`: where a message the agent sent with `--receipt` is.
pub(crate) async fn status(args: StatusArgs) -> anyhow::Result<Value> {
    let agent = args.acting.id()?;
    request_json(
        &args.conn.nats_url,
        &subject::send_status(&agent),
        &SendStatusRequest {
            message_id: args.message_id,
        },
    )
    .await
}
