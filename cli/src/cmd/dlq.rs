//! `switchboard dlq list|replay`: the dead letters (messages the fabric gave up on).

use clap::{Args, Subcommand};

use super::args::Connection;
use crate::output::View;

/// The dead letters: messages given up on after the delivery limit or rejected by their
/// reader, with why and where from; replay puts one back.
#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  switchboard dlq list\n  switchboard dlq replay 42",
    mut_args(super::args::global_nats_url)
)]
pub struct DlqArgs {
    #[command(subcommand)]
    command: DlqCommand,
    #[command(flatten)]
    conn: Connection,
}

#[derive(Debug, Subcommand)]
enum DlqCommand {
    /// The oldest dead letters: why each was given up on, where it came from, the message.
    #[command(
        after_help = "Examples:\n  switchboard dlq list\n  switchboard dlq list --limit 5 --json"
    )]
    List {
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Put a dead letter back where it came from (e.g. the goal's inbox) and delete it.
    #[command(after_help = "Example:\n  switchboard dlq replay 42")]
    Replay {
        /// The letter's sequence (from `dlq list`).
        seq: u64,
    },
}

impl DlqArgs {
    /// How the reply reads for a person.
    pub fn view(&self) -> View {
        match self.command {
            DlqCommand::List { .. } => View::DeadLetters,
            DlqCommand::Replay { .. } => View::Replayed,
        }
    }
}

/// Runs the command.
pub async fn run(args: DlqArgs) -> anyhow::Result<serde_json::Value> {
    let client = crate::nats::connect(&args.conn.nats_url).await?;
    Ok(match args.command {
        DlqCommand::List { limit } => {
            serde_json::to_value(switchboard_client::dlq_list(&client, limit).await?)?
        }
        DlqCommand::Replay { seq } => {
            serde_json::to_value(switchboard_client::dlq_replay(&client, seq).await?)?
        }
    })
}
