//! `switchboard goal open|close`: an agent's goals (live runs, each with its own durable
//! inbox), opened and closed through the directory.

use clap::Subcommand;
use serde_json::Value;
use switchboard_client::proto::GoalId;
use switchboard_client::proto::inbox::Overflow;
use switchboard_client::proto::registry::{GoalCloseRequest, GoalKind, GoalOpenRequest};
use switchboard_client::proto::subject::RegistryOp;

use super::args::{Acting, Connection, registry_request};

/// Open or close a goal (a live run with its own durable inbox).
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  switchboard goal open --as researcher\n  switchboard goal open --as researcher --kind background\n  switchboard goal close --as researcher <goal_id>"
)]
pub(crate) struct GoalArgs {
    #[command(subcommand)]
    command: GoalCommand,
}

/// `switchboard goal …`.
#[derive(Debug, Subcommand)]
enum GoalCommand {
    /// Open a goal; prints its inbox subject (read it with `switchboard inbox`).
    #[command(
        after_help = "Examples:\n  switchboard goal open --as researcher\n  switchboard goal open --as researcher --kind daemon --json | jq -r .goal_id\n  switchboard goal open --as auditor --overflow refuse\n  switchboard goal open --as worker --name main"
    )]
    Open {
        #[command(flatten)]
        acting: Acting,
        /// interactive, background or daemon.
        #[arg(long, default_value = "interactive", value_parser = crate::card::parse_goal_kind)]
        kind: GoalKind,
        /// What a message that finds the goal's inbox full does: evict_oldest (the oldest
        /// message not yet handed out goes, its sender is told) or refuse (the sender gets
        /// `inbox_full` and nothing is stored).
        #[arg(long, value_parser = crate::card::parse_overflow)]
        overflow: Option<Overflow>,
        /// Re-open this goal (after a restart) instead of a new one.
        #[arg(long, value_name = "GOAL_ID", conflicts_with = "name")]
        goal: Option<String>,
        /// Open the agent's goal of this name: the same goal every time (an agent that
        /// restarts finds what was sent while it was down), opened again if it is live.
        /// 1–64 characters of `a-z`, `0-9`, `_`, `.` and `-`.
        #[arg(long, value_name = "NAME")]
        name: Option<String>,
        #[command(flatten)]
        conn: Connection,
    },
    /// Close a goal: its cursor is deleted and unread messages are purged.
    #[command(after_help = "Example:\n  switchboard goal close --as researcher <goal_id>")]
    Close {
        #[command(flatten)]
        acting: Acting,
        /// The goal.
        goal_id: String,
        #[command(flatten)]
        conn: Connection,
    },
}

/// `switchboard goal open`: a new goal, or `--goal` re-opened; `goal close`.
pub(crate) async fn run(args: GoalArgs) -> anyhow::Result<Value> {
    match args.command {
        GoalCommand::Open {
            acting,
            kind,
            overflow,
            goal,
            name,
            conn,
        } => {
            let request = GoalOpenRequest {
                goal_id: goal.as_deref().map(GoalId::parse).transpose()?,
                name,
                kind: Some(kind),
                overflow,
            };
            registry_request(&conn, RegistryOp::GoalOpen, &acting, &request).await
        }
        GoalCommand::Close {
            acting,
            goal_id,
            conn,
        } => {
            let request = GoalCloseRequest {
                goal_id: GoalId::parse(&goal_id)?,
            };
            registry_request(&conn, RegistryOp::GoalClose, &acting, &request).await
        }
    }
}
