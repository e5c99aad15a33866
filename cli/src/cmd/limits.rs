//! `switchboard limits …`: provider limits the fleet shares (docs/protocol.md §15). Operator
//! side: declare, change, list and delete limits over `_SB.ops.limits.*` (Switchboard's own
//! credentials: `--nkey services.nk` under the generated accounts; nothing on an open server).
//! Agent side (`--as`): read a limit, take a lease, give it back.

use clap::{Args, Subcommand};
use serde_json::{Value, json};
use switchboard_client::proto::limits::{LimitsOp, LimitsOpsOp};
use uuid::Uuid;

use super::args::{Acting, Connection};
use crate::nats::{request_json, request_json_within};

/// Provider limits: how many requests and tokens the fleet may send each LLM provider key.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  switchboard limits set openai:gpt-4.1 --concurrent 10 --requests-per-minute 600 --tokens-per-minute 200000\n  switchboard limits list\n  switchboard limits show openai:gpt-4.1 --as researcher\n  switchboard limits acquire openai:gpt-4.1 --as researcher --tokens 1200 --wait-ms 30000\n  switchboard limits release openai:gpt-4.1 <lease_id> --as researcher --tokens-used 900\n  switchboard limits delete openai:gpt-4.1",
    mut_args(super::args::global_nats_url)
)]
pub struct LimitsArgs {
    #[command(subcommand)]
    command: LimitsCommand,
    #[command(flatten)]
    conn: Connection,
}

#[derive(Debug, Subcommand)]
enum LimitsCommand {
    /// Declare or change a limit (applies to the next acquire; no restart).
    Set {
        /// The key, e.g. `openai:gpt-4.1`.
        key: String,
        /// Most leases out at once (1-1000).
        #[arg(long)]
        concurrent: Option<u32>,
        /// Requests per minute, enforced per second.
        #[arg(long)]
        requests_per_minute: Option<u64>,
        /// Tokens per minute, enforced per second.
        #[arg(long)]
        tokens_per_minute: Option<u64>,
        /// Most leases one agent holds at once (default: half of --concurrent).
        #[arg(long)]
        per_agent: Option<u32>,
        /// Longest a lease is held before it returns by itself, in ms (default 120000).
        #[arg(long)]
        max_hold_ms: Option<u64>,
        /// How much of each rate may go at once, in ms of the rate (default 1000).
        #[arg(long)]
        burst_ms: Option<u64>,
    },
    /// Every limit, with what is in use and every lease.
    List,
    /// Remove a limit and its leases.
    Delete {
        /// The key.
        key: String,
    },
    /// One limit as an agent sees it (its own leases).
    Show {
        /// The key.
        key: String,
        #[command(flatten)]
        acting: Acting,
    },
    /// Take a lease as an agent.
    Acquire {
        /// The key.
        key: String,
        #[command(flatten)]
        acting: Acting,
        /// Tokens the call is expected to use.
        #[arg(long, default_value_t = 0)]
        tokens: u64,
        /// How long to wait for a lease, in ms (at most 60000).
        #[arg(long, default_value_t = 0)]
        wait_ms: u64,
    },
    /// Give a lease back as an agent.
    Release {
        /// The key.
        key: String,
        /// The lease.
        lease_id: Uuid,
        #[command(flatten)]
        acting: Acting,
        /// Tokens the call used (default: the estimate).
        #[arg(long)]
        tokens_used: Option<u64>,
    },
}

/// Runs the command.
pub async fn run(args: LimitsArgs) -> anyhow::Result<Value> {
    let url = &args.conn.nats_url;
    match args.command {
        LimitsCommand::Set {
            key,
            concurrent,
            requests_per_minute,
            tokens_per_minute,
            per_agent,
            max_hold_ms,
            burst_ms,
        } => {
            let body = json!({"key": key, "concurrent": concurrent,
                "requests_per_minute": requests_per_minute,
                "tokens_per_minute": tokens_per_minute, "per_agent": per_agent,
                "max_hold_ms": max_hold_ms, "burst_ms": burst_ms});
            request_json(url, &LimitsOpsOp::Set.subject(), &without_nulls(body)).await
        }
        LimitsCommand::List => request_json(url, &LimitsOpsOp::List.subject(), &json!({})).await,
        LimitsCommand::Delete { key } => {
            request_json(url, &LimitsOpsOp::Delete.subject(), &json!({"key": key})).await
        }
        LimitsCommand::Show { key, acting } => {
            let subject = LimitsOp::Get.subject(&acting.id()?);
            request_json(url, &subject, &json!({"key": key})).await
        }
        LimitsCommand::Acquire {
            key,
            acting,
            tokens,
            wait_ms,
        } => {
            let subject = LimitsOp::Acquire.subject(&acting.id()?);
            let body = json!({"key": key, "tokens": tokens, "wait_ms": wait_ms});
            let within = std::time::Duration::from_millis(wait_ms.saturating_add(10_000));
            request_json_within(url, &subject, &body, within).await
        }
        LimitsCommand::Release {
            key,
            lease_id,
            acting,
            tokens_used,
        } => {
            let subject = LimitsOp::Release.subject(&acting.id()?);
            let body = json!({"key": key, "lease_id": lease_id, "tokens_used": tokens_used});
            request_json(url, &subject, &without_nulls(body)).await
        }
    }
}

/// Drops `null` fields (the service refuses none, but the JSON reads cleaner).
fn without_nulls(mut value: Value) -> Value {
    if let Value::Object(map) = &mut value {
        map.retain(|_, v| !v.is_null());
    }
    value
}
