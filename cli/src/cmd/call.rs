//! `switchboard call|reply|pending`: correlated calls — asking and waiting for the answer (or
//! parking it), answering one, and the calls an agent has open.

use std::time::Duration;

use futures::StreamExt as _;
use serde_json::Value;
use switchboard_client::CallEvent;
use switchboard_client::proto::GoalId;
use switchboard_client::proto::call::{CallRequest, ReplyRequest};
use switchboard_client::proto::subject;
use uuid::Uuid;

use super::args::{Acting, Connection};
use crate::nats::request_json;

/// A correlated call: waits for the answer (or --park: the answer lands in the inbox).
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  switchboard call --as researcher --to writer \"title for section 2?\" --timeout-ms 20000\n  switchboard call --as researcher --to writer \"review this\" --park",
    mut_args(super::args::agent_help("The calling agent"))
)]
pub(crate) struct CallArgs {
    #[command(flatten)]
    acting: Acting,
    /// The callee.
    #[arg(long, value_name = "PEER")]
    to: String,
    /// The question.
    message: String,
    /// Deadline in milliseconds (default 30 s, at most 300 s).
    #[arg(long)]
    timeout_ms: Option<u64>,
    /// Do not wait: return the correlation id at once.
    #[arg(long)]
    park: bool,
    /// The caller goal where a parked answer lands.
    #[arg(long)]
    goal: Option<String>,
    #[command(flatten)]
    conn: Connection,
}

/// reply_to_peer: answer the call with this correlation id.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Example:\n  switchboard reply --as writer 0193a1b2-0000-7000-8000-0000000000cc \"How about: Beyond the Inbox\"",
    mut_args(super::args::agent_help("The answering agent (must be the callee)"))
)]
pub(crate) struct ReplyArgs {
    #[command(flatten)]
    acting: Acting,
    /// The call being answered.
    correlation_id: Uuid,
    /// The answer.
    message: String,
    #[command(flatten)]
    conn: Connection,
}

/// Open calls an agent made (outgoing) and must answer (incoming).
#[derive(Debug, clap::Args)]
#[command(after_help = "Example:\n  switchboard pending --as writer")]
pub(crate) struct PendingArgs {
    #[command(flatten)]
    acting: Acting,
    #[command(flatten)]
    conn: Connection,
}

/// `switchboard call`: a correlated call that waits for the answer, or (`--park`) returns the
/// correlation id at once and lets the answer land in `--goal`'s inbox.
pub(crate) async fn call(args: CallArgs) -> anyhow::Result<Value> {
    let agent = args.acting.id()?;
    let from_goal_id = args.goal.as_deref().map(GoalId::parse).transpose()?;
    let request = CallRequest {
        to: Some(args.to),
        message: Some(args.message),
        from_goal_id,
        timeout_ms: args.timeout_ms,
        wait: Some(!args.park),
        ..CallRequest::default()
    };
    let nats_url = &args.conn.nats_url;
    if args.park {
        return request_json(nats_url, &subject::call(&agent), &request).await;
    }
    // Waiting: the answer streams; each part is printed to stderr as it comes (`[part N]`),
    // and the whole answer is the command's output.
    let client = crate::nats::connect_as(nats_url, Some(&agent)).await?;
    let mut events = Box::pin(
        switchboard_client::call_streamed_on(&client, &agent, request, Duration::from_secs(10))
            .await?,
    );
    while let Some(event) = events.next().await {
        match event? {
            CallEvent::Part(part) => eprintln!("[part {}] {}", part.part, part.body),
            CallEvent::Answer(answer) => return Ok(serde_json::to_value(answer)?),
        }
    }
    anyhow::bail!("the call ended without an answer")
}

/// `switchboard reply`: reply_to_peer, answering the call `correlation_id`.
pub(crate) async fn reply(args: ReplyArgs) -> anyhow::Result<Value> {
    let request = ReplyRequest {
        correlation_id: Some(args.correlation_id),
        message: Some(args.message),
        ..ReplyRequest::default()
    };
    let agent = args.acting.id()?;
    request_json(&args.conn.nats_url, &subject::reply(&agent), &request).await
}

/// `switchboard pending`: the open calls the agent made and must answer.
pub(crate) async fn pending(args: PendingArgs) -> anyhow::Result<Value> {
    let agent = args.acting.id()?;
    request_json(
        &args.conn.nats_url,
        &subject::calls_pending(&agent),
        &serde_json::json!({}),
    )
    .await
}
