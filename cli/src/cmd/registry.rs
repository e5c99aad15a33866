//! `switchboard register|heartbeat|deregister|peers|agents|lookup`: the directory, one request
//! each — an agent's card and liveness sent as the agent, the listings asked as an agent or
//! (`agents`) as an operator.

use serde_json::Value;
use switchboard_client::proto::registry::{LookupRequest, PeersRequest};
use switchboard_client::proto::subject::RegistryOp;

use super::args::{Acting, Connection, registry_request};
use crate::card::CardArgs;
use crate::nats::request_json;

/// Register (or update) an agent's card; also counts as a heartbeat.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  switchboard register --as researcher --description \"finds sources\" --capability search\n  switchboard register --as writer --card writer.toml --allow-from 'team-*'"
)]
pub(crate) struct RegisterArgs {
    #[command(flatten)]
    acting: Acting,
    /// Its card.
    #[command(flatten)]
    card: CardArgs,
    #[command(flatten)]
    conn: Connection,
}

/// One heartbeat for an agent (agents send one every 10 s; 30 s of silence is offline).
#[derive(Debug, clap::Args)]
#[command(after_help = "Example:\n  switchboard heartbeat --as researcher")]
pub(crate) struct HeartbeatArgs {
    #[command(flatten)]
    acting: Acting,
    #[command(flatten)]
    conn: Connection,
}

/// Remove an agent from the directory (its goals are closed, their inboxes purged).
#[derive(Debug, clap::Args)]
#[command(after_help = "Example:\n  switchboard deregister --as researcher")]
pub(crate) struct DeregisterArgs {
    #[command(flatten)]
    acting: Acting,
    #[command(flatten)]
    conn: Connection,
}

/// list_peers as an agent: other agents (one page, in id order) and whether each is
/// reachable.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  switchboard peers --as researcher\n  switchboard peers --as researcher --limit 500 --after writer",
    mut_args(super::args::agent_help("The agent to ask as (list_peers excludes it)"))
)]
pub(crate) struct PeersArgs {
    #[command(flatten)]
    acting: Acting,
    /// Start after this agent id (the previous page's `next`).
    #[arg(long)]
    after: Option<String>,
    /// Most peers in the page (default 100, at most 1000).
    #[arg(long)]
    limit: Option<u32>,
    /// Only agents whose card lists this skill (send, call or task to `skill:<name>` to
    /// let the fabric pick one).
    #[arg(long)]
    skill: Option<String>,
    #[command(flatten)]
    conn: Connection,
}

/// Every registered agent with status and number of live goals.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Example:\n  switchboard agents\n  switchboard agents --json | jq '.[] | select(.status != \"offline\")'"
)]
pub(crate) struct AgentsArgs {
    #[command(flatten)]
    conn: Connection,
}

/// One agent's card, status and live goals.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Example:\n  switchboard lookup writer",
    mut_args(super::args::agent_default("The agent to ask as", "cli"))
)]
pub(crate) struct LookupArgs {
    /// The agent to look up.
    agent: String,
    #[command(flatten)]
    acting: Acting,
    #[command(flatten)]
    conn: Connection,
}

/// `switchboard register`: the agent's card, sent as the agent (also a heartbeat).
pub(crate) async fn register(args: RegisterArgs) -> anyhow::Result<Value> {
    let agent = args.acting.id()?;
    let card = args.card.card(&agent)?;
    request_json(
        &args.conn.nats_url,
        &RegistryOp::Register.subject(&agent),
        &card,
    )
    .await
}

/// `switchboard heartbeat`.
pub(crate) async fn heartbeat(args: HeartbeatArgs) -> anyhow::Result<Value> {
    let body = serde_json::json!({});
    registry_request(&args.conn, RegistryOp::Heartbeat, &args.acting, &body).await
}

/// `switchboard deregister`.
pub(crate) async fn deregister(args: DeregisterArgs) -> anyhow::Result<Value> {
    let body = serde_json::json!({});
    registry_request(&args.conn, RegistryOp::Deregister, &args.acting, &body).await
}

/// `switchboard peers`: one page of list_peers as the agent.
pub(crate) async fn peers(args: PeersArgs) -> anyhow::Result<Value> {
    let request = PeersRequest {
        after: args.after,
        limit: args.limit,
        skill: args.skill,
    };
    registry_request(&args.conn, RegistryOp::Peers, &args.acting, &request).await
}

/// `switchboard lookup`: one agent's card, status and live goals.
pub(crate) async fn lookup(args: LookupArgs) -> anyhow::Result<Value> {
    let request = LookupRequest {
        agent_id: args.agent,
    };
    registry_request(&args.conn, RegistryOp::Lookup, &args.acting, &request).await
}

/// `switchboard agents`: every registered agent, as an operator.
pub(crate) async fn agents(args: AgentsArgs) -> anyhow::Result<Value> {
    let client = crate::nats::connect(&args.conn.nats_url).await?;
    let listing = switchboard_client::list_agents(&client).await?;
    Ok(serde_json::to_value(listing)?)
}
