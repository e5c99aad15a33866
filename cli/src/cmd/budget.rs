//! `switchboard budget …`: cost budgets (docs/protocol.md §16) as an agent sees them (`--as`):
//! a budget it works under or gave, and a spend report against work it owns. The cost tree as
//! the audit recorded it is `switchboard audit cost`.

use clap::{Args, Subcommand};
use serde_json::{Value, json};
use switchboard_client::proto::budget::BudgetOp;
use uuid::Uuid;

use super::args::{Acting, Connection};
use crate::nats::request_json;

/// Cost budgets: what a piece of work was granted, spent and has left.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  switchboard budget show --root <root> --work <work> --as researcher\n  switchboard budget spend --root <root> --work <work> --as researcher --tokens 1200 --cost 3000\n  switchboard audit cost --root <root>",
    mut_args(super::args::global_nats_url)
)]
pub struct BudgetArgs {
    #[command(subcommand)]
    command: BudgetCommand,
    #[command(flatten)]
    conn: Connection,
}

/// One piece of work in a budget tree, and the agent asking about it.
#[derive(Debug, Args)]
struct Node {
    /// The tree (`metadata.budget.root` of the work's message).
    #[arg(long)]
    root: Uuid,
    /// The work (`metadata.budget.work`).
    #[arg(long)]
    work: Uuid,
    #[command(flatten)]
    acting: Acting,
}

#[derive(Debug, Subcommand)]
enum BudgetCommand {
    /// A budget the agent works under or gave: granted, spent, held by children, left.
    Show {
        #[command(flatten)]
        node: Node,
    },
    /// Report what the agent spent on work it owns (charged up to what is left).
    Spend {
        #[command(flatten)]
        node: Node,
        /// Tokens spent.
        #[arg(long, default_value_t = 0)]
        tokens: u64,
        /// Cost spent, in micro-units of the currency (1000000 is $1.00 in USD).
        #[arg(long, default_value_t = 0)]
        cost: u64,
    },
}

/// Runs the command.
pub async fn run(args: BudgetArgs) -> anyhow::Result<Value> {
    let url = &args.conn.nats_url;
    match args.command {
        BudgetCommand::Show { node } => {
            let subject = BudgetOp::Get.subject(&node.acting.id()?);
            request_json(
                url,
                &subject,
                &json!({"root": node.root, "work": node.work}),
            )
            .await
        }
        BudgetCommand::Spend { node, tokens, cost } => {
            let subject = BudgetOp::Spend.subject(&node.acting.id()?);
            let body =
                json!({"root": node.root, "work": node.work, "tokens": tokens, "cost": cost});
            request_json(url, &subject, &body).await
        }
    }
}
