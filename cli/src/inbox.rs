//! `switchboard inbox`: a goal's inbox, read with an ordered consumer so the goal's own durable
//! consumer (and its acks) are untouched — or, with `--take`, taken through that consumer
//! and acknowledged, as an agent reads it.

use std::process::ExitCode;
use std::time::Duration;

use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::{self, consumer::DeliverPolicy, consumer::pull::OrderedConfig};
use clap::Args;
use futures::StreamExt;
use switchboard_client::proto::registry::{
    GoalOpenReply, GoalOpenRequest, LookupReply, LookupRequest,
};
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
    #[arg(long, conflicts_with = "take")]
    follow: bool,
    /// Take the waiting messages as the agent does (check_inbox): read them from the goal's
    /// durable consumer and acknowledge them, so they are not delivered again.
    #[arg(long)]
    take: bool,
    /// NATS URL.
    #[arg(long, env = "NATS_URL", default_value = crate::DEFAULT_NATS_URL)]
    nats_url: String,
}

/// Prints the inbox (`<peer-message>` blocks, or JSON lines with `--json`); exit 1 on errors.
pub async fn run(args: InboxArgs, json: bool) -> ExitCode {
    let outcome = if args.take {
        take(args, json).await
    } else {
        tail(args, json).await
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("switchboard: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// The goal must be one of the agent's live goals.
async fn ensure_live(nats_url: &str, agent: &AgentId, goal: GoalId) -> anyhow::Result<()> {
    let looked = crate::request_json(
        nats_url,
        &RegistryOp::Lookup.subject(agent),
        &LookupRequest {
            agent_id: agent.to_string(),
        },
    )
    .await?;
    let looked: LookupReply = serde_json::from_value(looked)?;
    if !looked.live_goals.contains(&goal) {
        anyhow::bail!("agent `{agent}` has no live goal `{goal}`");
    }
    Ok(())
}

/// Prints one message.
fn show(message: &InboxMessage, json: bool) -> anyhow::Result<()> {
    if json {
        crate::output::line(&serde_json::to_string(message)?);
    } else if let Some(block) =
        switchboard_client::render_peer_messages_block(std::slice::from_ref(message))
    {
        // The block's heading once per message would repeat; print the element only.
        crate::output::line(block.trim_start_matches("# PEER MESSAGES\n").trim_end());
    }
    Ok(())
}

/// `--take`: the waiting messages through the goal's own durable consumer, acknowledged.
async fn take(args: InboxArgs, json: bool) -> anyhow::Result<()> {
    let agent = AgentId::parse(&args.as_agent)?;
    let goal = GoalId::parse(&args.goal)?;
    ensure_live(&args.nats_url, &agent, goal).await?;
    // Re-opening the live goal by id returns its consumer.
    let reopened = crate::request_json(
        &args.nats_url,
        &RegistryOp::GoalOpen.subject(&agent),
        &GoalOpenRequest {
            goal_id: Some(goal),
            kind: None,
        },
    )
    .await?;
    let reopened: GoalOpenReply = serde_json::from_value(reopened)?;
    let js = jetstream::new(crate::connect(&args.nats_url).await?);
    let mut consumer: PullConsumer = js
        .get_consumer_from_stream(&reopened.consumer, &reopened.stream)
        .await?;
    let mut taken = 0;
    loop {
        let waiting = consumer.info().await?.num_pending;
        if waiting == 0 {
            break;
        }
        let mut batch = consumer
            .batch()
            .max_messages(usize::try_from(waiting.min(64)).unwrap_or(64))
            .expires(Duration::from_secs(2))
            .messages()
            .await?;
        let mut got = 0;
        while let Some(raw) = batch.next().await {
            let raw = raw.map_err(|err| anyhow::anyhow!("pull: {err}"))?;
            got += 1;
            match serde_json::from_slice::<InboxMessage>(&raw.payload) {
                Ok(message) => {
                    show(&message, json)?;
                    taken += 1;
                }
                Err(err) => eprintln!("switchboard: dropping an undecodable message: {err}"),
            }
            raw.double_ack()
                .await
                .map_err(|err| anyhow::anyhow!("ack: {err}"))?;
        }
        if got == 0 {
            break;
        }
    }
    if !json {
        eprintln!("switchboard: took {taken} message(s)");
    }
    Ok(())
}

async fn tail(args: InboxArgs, json: bool) -> anyhow::Result<()> {
    let agent = AgentId::parse(&args.as_agent)?;
    let goal = GoalId::parse(&args.goal)?;
    let client = crate::connect(&args.nats_url).await?;
    ensure_live(&args.nats_url, &agent, goal).await?;
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
            Ok(inbox) => show(&inbox, json)?,
            Err(err) => eprintln!("switchboard: skipping an undecodable message: {err}"),
        }
        remaining = remaining.saturating_sub(1);
        if remaining == 0 && !args.follow {
            return Ok(());
        }
    }
}
