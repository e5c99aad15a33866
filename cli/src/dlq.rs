//! `switchboard dlq list|replay`: the dead letters (messages the fabric gave up on).

use clap::{Args, Subcommand};

use crate::DEFAULT_NATS_URL;
use crate::output::View;

/// `switchboard dlq …`.
#[derive(Debug, Args)]
pub struct DlqArgs {
    #[command(subcommand)]
    command: DlqCommand,
    /// NATS URL; a comma-separated list is a cluster's servers, failed over between.
    #[arg(long, env = "NATS_URL", default_value = DEFAULT_NATS_URL, global = true)]
    nats_url: String,
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
    let client = crate::nats::connect(&args.nats_url).await?;
    Ok(match args.command {
        DlqCommand::List { limit } => {
            serde_json::to_value(switchboard_client::dlq_list(&client, limit).await?)?
        }
        DlqCommand::Replay { seq } => {
            serde_json::to_value(switchboard_client::dlq_replay(&client, seq).await?)?
        }
    })
}
