//! `switchboard inbox`: a goal's inbox as JSON lines, read with an ordered consumer so the
//! goal's own durable consumer (and its acks) are untouched.

use std::process::ExitCode;
use std::time::Duration;

use async_nats::jetstream::{self, consumer::DeliverPolicy, consumer::pull::OrderedConfig};
use clap::Args;
use futures::StreamExt;
use switchboard_client::proto::registry::{LookupReply, LookupRequest};
use switchboard_client::proto::subject::{self, RegistryOp};
use switchboard_client::proto::{AgentId, GoalId, INBOX_STREAM, InboxMessage};

/// Arguments of `switchboard inbox`.
#[derive(Debug, Args)]
pub struct InboxArgs {
    /// The agent that owns the goal.
    #[arg(long = "as", value_name = "AGENT")]
    as_agent: String,
    /// The goal whose inbox to print.
    #[arg(long)]
    goal: String,
    /// Keep printing new messages until Ctrl-C.
    #[arg(long)]
    follow: bool,
    /// NATS URL.
    #[arg(long, env = "NATS_URL", default_value = crate::DEFAULT_NATS_URL)]
    nats_url: String,
}

/// Prints the inbox; exit 1 on errors.
pub async fn run(args: InboxArgs) -> ExitCode {
    match tail(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("switchboard: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn tail(args: InboxArgs) -> anyhow::Result<()> {
    let agent = AgentId::parse(&args.as_agent)?;
    let goal = GoalId::parse(&args.goal)?;
    let client = crate::connect(&args.nats_url).await?;
    // The goal must be one of the agent's live goals.
    let looked = crate::request_json(
        &args.nats_url,
        &RegistryOp::Lookup.subject(&agent),
        &LookupRequest {
            agent_id: agent.to_string(),
        },
    )
    .await?;
    let looked: LookupReply = serde_json::from_value(looked)?;
    if !looked.live_goals.contains(&goal) {
        anyhow::bail!("agent `{agent}` has no live goal `{goal}`");
    }
    let js = jetstream::new(client);
    let stream = js.get_stream(INBOX_STREAM).await?;
    let consumer = stream
        .create_consumer(OrderedConfig {
            filter_subject: subject::inbox(&goal),
            deliver_policy: DeliverPolicy::All,
            ..Default::default()
        })
        .await?;
    let mut remaining = consumer.cached_info().num_pending;
    if remaining == 0 && !args.follow {
        return Ok(());
    }
    let mut messages = consumer.messages().await?;
    loop {
        let next = if args.follow {
            tokio::select! {
                next = messages.next() => next,
                _ = tokio::signal::ctrl_c() => return Ok(()),
            }
        } else {
            tokio::time::timeout(Duration::from_secs(10), messages.next())
                .await
                .map_err(|_| anyhow::anyhow!("timed out reading the inbox"))?
        };
        let Some(message) = next else { return Ok(()) };
        let message = message?;
        match serde_json::from_slice::<InboxMessage>(&message.payload) {
            Ok(inbox) => println!("{}", serde_json::to_string(&inbox)?),
            Err(err) => eprintln!("switchboard: skipping an undecodable message: {err}"),
        }
        remaining = remaining.saturating_sub(1);
        if remaining == 0 && !args.follow {
            return Ok(());
        }
    }
}
