//! `switchboard thread|history|audit …`: reading the audit trail.

use std::io::Write;

use clap::{Args, Subcommand};
use switchboard_client::proto::GoalId;
use switchboard_client::proto::audit::{HistoryRequest, ThreadRequest};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::args::Connection;

/// A filter over the trail (history and export).
#[derive(Debug, Args)]
pub struct Filter {
    /// Records from or to this agent.
    #[arg(long, value_name = "AGENT")]
    agent: Option<String>,
    /// Records from or to this goal.
    #[arg(long, value_name = "GOAL_ID")]
    goal: Option<String>,
    /// Records of this task.
    #[arg(long, value_name = "TASK_ID")]
    task: Option<uuid::Uuid>,
    /// Stored at or after (RFC 3339, e.g. 2026-11-22T00:00:00Z).
    #[arg(long, value_name = "TIME")]
    since: Option<String>,
    /// Stored before (RFC 3339).
    #[arg(long, value_name = "TIME")]
    until: Option<String>,
    /// Only this kind (`message`, `request`, `task.complete`, …; `call.*` for a family).
    #[arg(long)]
    kind: Option<String>,
}

fn time_arg(flag: &str, raw: Option<String>) -> anyhow::Result<Option<OffsetDateTime>> {
    raw.map(|raw| {
        OffsetDateTime::parse(&raw, &Rfc3339)
            .map_err(|err| anyhow::anyhow!("--{flag} `{raw}` is not RFC 3339: {err}"))
    })
    .transpose()
}

impl Filter {
    fn request(self) -> anyhow::Result<HistoryRequest> {
        Ok(HistoryRequest {
            agent_id: self.agent,
            goal_id: self.goal.as_deref().map(GoalId::parse).transpose()?,
            task_id: self.task,
            since: time_arg("since", self.since)?,
            until: time_arg("until", self.until)?,
            kind: self.kind,
            limit: None,
            cursor: None,
        })
    }
}

/// The conversation around a message, call or task id, from the audit trail.
#[derive(Debug, Args)]
#[command(after_help = "Example:\n  switchboard thread 0193a1b2-0000-7000-8000-0000000000cc")]
pub struct ThreadArgs {
    /// A message id, correlation id or task id.
    id: uuid::Uuid,
    #[command(flatten)]
    conn: Connection,
}

/// Audit records by agent, goal, task, time and kind, one page.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  switchboard history --agent researcher\n  switchboard history --agent researcher --kind 'call.*' --limit 20\n  switchboard history --task <task_id> --since 2026-11-22T00:00:00Z"
)]
pub struct HistoryArgs {
    #[command(flatten)]
    filter: Filter,
    /// Page size (1–1000, default 100).
    #[arg(long)]
    limit: Option<usize>,
    /// `next_cursor` of the previous page.
    #[arg(long)]
    cursor: Option<u64>,
    #[command(flatten)]
    conn: Connection,
}

/// The audit trail: export (JSON lines), verify the hash chain, pending requests, cost.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  switchboard audit export --since 2026-11-22T00:00:00Z > manifest.jsonl\n  switchboard audit verify\n  switchboard audit pending\n  switchboard audit cost --root <root task or call id>",
    mut_args(super::args::global_nats_url)
)]
pub struct AuditArgs {
    #[command(subcommand)]
    command: AuditCommand,
    #[command(flatten)]
    conn: Connection,
}

#[derive(Debug, Subcommand)]
enum AuditCommand {
    /// Every record of a filter as JSON lines on stdout (the manifest); a summary on stderr.
    #[command(
        after_help = "Examples:\n  switchboard audit export --since 2026-11-22T00:00:00Z > manifest.jsonl\n  switchboard audit export --agent researcher --kind 'task.*' > researcher-tasks.jsonl"
    )]
    Export {
        #[command(flatten)]
        filter: Filter,
    },
    /// Walk the hash chain; exits non-zero when a record was changed, removed or inserted.
    #[command(after_help = "Example:\n  switchboard audit verify")]
    Verify,
    /// Requests that expect a reply and have none yet.
    #[command(after_help = "Example:\n  switchboard audit pending")]
    Pending,
    /// What each agent spent in a budget tree (docs/protocol.md §16), or one agent's spend
    /// per tree.
    #[command(
        after_help = "Examples:\n  switchboard audit cost --root <root task or call id>\n  switchboard audit cost --agent researcher"
    )]
    Cost {
        /// The tree: its root call's or task's id.
        #[arg(long, conflicts_with = "agent", required_unless_present = "agent")]
        root: Option<uuid::Uuid>,
        /// Instead: this agent's spend in each of its newest 100 trees.
        #[arg(long)]
        agent: Option<String>,
    },
}

/// `switchboard thread <id>`: the conversation around a message, call or task id.
pub async fn thread(args: ThreadArgs) -> anyhow::Result<serde_json::Value> {
    let client = crate::nats::connect(&args.conn.nats_url).await?;
    let query = ThreadRequest {
        message_id: Some(args.id),
        correlation_id: Some(args.id),
        task_id: Some(args.id),
        cursor: None,
    };
    let records = switchboard_client::audit_thread(&client, &query).await?;
    Ok(serde_json::to_value(records)?)
}

/// `switchboard history …`: one page of records.
pub async fn history(args: HistoryArgs) -> anyhow::Result<serde_json::Value> {
    let client = crate::nats::connect(&args.conn.nats_url).await?;
    let mut query = args.filter.request()?;
    query.limit = args.limit;
    query.cursor = args.cursor;
    let page = switchboard_client::audit_history(&client, &query).await?;
    Ok(serde_json::to_value(page)?)
}

impl AuditArgs {
    /// How the reply reads for a person.
    pub fn view(&self) -> crate::output::View {
        match self.command {
            AuditCommand::Verify => crate::output::View::Verify,
            AuditCommand::Pending | AuditCommand::Export { .. } => crate::output::View::Records,
            AuditCommand::Cost { .. } => crate::output::View::Json,
        }
    }
}

/// `switchboard audit …`. Export writes its lines itself and returns `None`.
pub async fn run(args: AuditArgs) -> anyhow::Result<Option<serde_json::Value>> {
    let client = crate::nats::connect(&args.conn.nats_url).await?;
    match args.command {
        AuditCommand::Export { filter } => {
            let query = filter.request()?;
            let mut stdout = std::io::stdout().lock();
            let mut failed = None;
            let done = switchboard_client::audit_export(&client, &query, |chunk| {
                if failed.is_none()
                    && let Err(err) = stdout.write_all(chunk)
                {
                    failed = Some(err);
                }
            })
            .await?;
            if let Some(err) = failed {
                anyhow::bail!("writing the export: {err}");
            }
            stdout.flush()?;
            eprintln!(
                "switchboard: exported {} records in {} chunks",
                done.records, done.chunks
            );
            Ok(None)
        }
        AuditCommand::Verify => {
            let reply = switchboard_client::audit_verify(&client).await?;
            if !reply.ok {
                anyhow::bail!(
                    "the audit chain is broken: {}",
                    serde_json::to_string(&reply)?
                );
            }
            Ok(Some(serde_json::to_value(reply)?))
        }
        AuditCommand::Pending => Ok(Some(serde_json::to_value(
            switchboard_client::audit_pending(&client).await?,
        )?)),
        AuditCommand::Cost { root, agent } => {
            let query = switchboard_client::proto::budget::CostQuery {
                root,
                agent_id: agent,
            };
            Ok(Some(serde_json::to_value(
                switchboard_client::audit_cost(&client, &query).await?,
            )?))
        }
    }
}
