//! `switchboard inbox`: a goal's inbox, read as its agent reads it — through
//! `agent.inbox.fetch.<agent_id>` (docs/protocol.md §7), never through JetStream. By default it
//! only looks (a peek: nothing is taken, nothing counts as handed out); `--take` takes the
//! unread messages and moves the goal's cursor past them; `--follow` keeps looking.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use switchboard_client::proto::inbox::{
    AckReply, AckRequest, FETCH_MAX, FetchReply, FetchRequest, FetchedMessage,
};
use switchboard_client::proto::subject;
use switchboard_client::proto::{AgentId, GoalId, InboxMessage};
use switchboard_request::request::request_json;

use super::args::{Acting, Connection};

/// How often `--follow` looks again when nothing new arrived.
const FOLLOW_EVERY: Duration = Duration::from_millis(250);
/// How long one request may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Print a goal's inbox as <peer-message> elements (JSON lines with --json) without
/// consuming it (--follow keeps tailing), or take it as the agent does (--take).
#[derive(Debug, Args)]
#[command(
    after_help = "Example:\n  switchboard inbox --as researcher --goal 0193a1b2-0000-7000-8000-000000000001 --follow",
    mut_args(super::args::agent_help("The agent that owns the goal"))
)]
pub struct InboxArgs {
    #[command(flatten)]
    acting: Acting,
    /// The goal whose inbox to print.
    #[arg(long)]
    goal: String,
    /// Keep printing new messages until Ctrl-C (without taking them).
    #[arg(long, conflicts_with = "take")]
    follow: bool,
    /// Take the unread messages as the agent does (check_inbox): the goal's cursor moves past
    /// them, so they are not handed out again.
    #[arg(long)]
    take: bool,
    #[command(flatten)]
    conn: Connection,
}

/// Prints the inbox (`<peer-message>` blocks, or JSON lines with `--json`); exit 1 on errors.
pub async fn run(args: InboxArgs, json: bool) -> ExitCode {
    match read(args, json).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("switchboard: {err:#}");
            ExitCode::FAILURE
        }
    }
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

/// The goal's inbox as one agent's reader.
struct Inbox {
    nats: async_nats::Client,
    agent: AgentId,
    goal: GoalId,
}

impl Inbox {
    async fn fetch(&self, peek: bool, ack_through: Option<u64>) -> anyhow::Result<FetchReply> {
        let request = FetchRequest {
            goal_id: self.goal,
            max: Some(FETCH_MAX),
            wait_ms: None,
            ack_through,
            peek,
            after: None,
        };
        request_json(
            &self.nats,
            &subject::inbox_fetch(&self.agent),
            &request,
            TIMEOUT,
        )
        .await
        .map_err(crate::nats::cli_failure)
    }

    async fn ack(&self, through: u64) -> anyhow::Result<AckReply> {
        let request = AckRequest {
            goal_id: self.goal,
            through: Some(through),
            ..Default::default()
        };
        request_json(
            &self.nats,
            &subject::inbox_ack(&self.agent),
            &request,
            TIMEOUT,
        )
        .await
        .map_err(crate::nats::cli_failure)
    }
}

async fn read(args: InboxArgs, json: bool) -> anyhow::Result<()> {
    let agent = args.acting.id()?;
    let inbox = Inbox {
        nats: crate::nats::connect_as(&args.conn.nats_url, Some(&agent)).await?,
        agent,
        goal: GoalId::parse(&args.goal)?,
    };
    if args.take {
        return take(&inbox, json).await;
    }
    // Look: print what is unread, and with --follow whatever arrives later.
    let mut shown = 0u64;
    loop {
        let reply = inbox.fetch(true, None).await?;
        let fresh: Vec<&FetchedMessage> = reply.messages.iter().filter(|m| m.seq > shown).collect();
        for fetched in &fresh {
            show(&fetched.message, json)?;
            shown = fetched.seq;
        }
        if !args.follow {
            return Ok(());
        }
        tokio::select! {
            () = tokio::time::sleep(FOLLOW_EVERY) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}

/// `--take`: every unread message, page by page, each page acknowledged once printed.
async fn take(inbox: &Inbox, json: bool) -> anyhow::Result<()> {
    let mut taken = 0;
    let mut last = None;
    loop {
        let reply = inbox.fetch(false, last).await?;
        let more = reply.unread > reply.messages.len() as u64;
        for fetched in &reply.messages {
            show(&fetched.message, json)?;
            taken += 1;
        }
        match reply.messages.last() {
            Some(page_last) => last = Some(page_last.seq),
            None => break,
        }
        if !more {
            break;
        }
    }
    if let Some(last) = last {
        inbox.ack(last).await?;
    }
    if !json {
        eprintln!("switchboard: took {taken} message(s)");
    }
    Ok(())
}
