//! `switchboard`: run the fabric in one process, be an agent from the command line or as an
//! MCP server, and look at the fabric.
//!
//! Every command prints readable text by default and the service's JSON reply with `--json`;
//! errors go to stderr with their kind and exit non-zero.
//!
//! - `switchboard up [--nats-url URL]`: every service, against the given NATS or an embedded
//!   nats-server with JetStream under `.data/nats` (the default).
//! - `switchboard mcp --agent <id>`: one agent as an MCP server over stdio (tools for an LLM).
//! - `switchboard demo`: a scripted conversation among three agents, then its audit thread.
//! - `switchboard register|heartbeat|deregister --as <agent>`, `switchboard goal open|close`:
//!   an agent's card and goals.
//! - `switchboard peers --as <agent>`, `agents`, `lookup <agent>`: the directory.
//! - `switchboard send --as <agent> --to <peer|*> "text"`: send_to_peer or a broadcast.
//! - `switchboard inbox --as <agent> --goal <id> [--follow | --take]`: a goal's inbox, peeked
//!   or taken.
//! - `switchboard call`, `reply`, `pending`: correlated calls.
//! - `switchboard task create|get|list|cancel|accept|reject|start|progress|ask|complete|fail`.
//! - `switchboard thread <id>`, `history …`, `audit export|verify|pending`: the audit trail.
//! - `switchboard dlq list|replay`: the dead letters.
//! - `switchboard nats-config --agents agents.toml --out DIR`: the NATS accounts and NKeys.
//!
//! Layout: this file is the command table (clap) and the dispatch; `commands.rs` holds the
//! commands that are one request, a module each the larger ones (`up`, `mcp`, `demo`, `inbox`,
//! `task`, `audit`, `dlq`), `card.rs` the card flags, `nats.rs` the connection and request
//! helpers, and `output.rs` how replies are printed.

mod a2a;
mod audit;
mod card;
mod commands;
mod demo;
mod dlq;
mod health;
mod inbox;
mod mcp;
mod nats;
mod output;
mod task;
mod traces;
mod up;

use std::process::ExitCode;

use clap::{CommandFactory as _, FromArgMatches as _, Parser, Subcommand};
use switchboard_client::proto::subject::RegistryOp;
use tracing::Instrument as _;

use crate::output::View;

/// Default NATS URL for the inspection commands (also what `up` serves by default).
pub(crate) const DEFAULT_NATS_URL: &str = "nats://127.0.0.1:4222";

#[derive(Debug, Parser)]
#[command(
    name = "switchboard",
    version,
    about = "Switchboard: a NATS-native messaging fabric for LLM agents",
    after_help = "Examples:\n  switchboard up                       # embedded nats-server + all services\n  switchboard up --nats-url nats://nats:4222\n  switchboard agents\n  switchboard peers --as researcher\n  switchboard lookup writer\n  switchboard send --as writer --to researcher \"draft ready\"\n  switchboard inbox --as researcher --goal <goal_id> --follow\n  switchboard call --as researcher --to writer \"title?\"\n  switchboard pending --as writer\n  switchboard task create --as coordinator --to researcher \"find sources\"\n  switchboard task list --as researcher --state submitted\n  switchboard thread <message_id|correlation_id|task_id>\n  switchboard history --agent researcher\n  switchboard audit export --since 2026-11-22T00:00:00Z > manifest.jsonl\n  switchboard audit verify"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Print the service's JSON reply instead of readable text.
    #[arg(long, global = true)]
    json: bool,
    /// Sign in with this NKey seed file (`switchboard nats-config` writes one per agent, and
    /// `services.nk`); the services read the same variable. Without it,
    /// `SWITCHBOARD_NATS__NKEY_SEED` holds the seed itself, if set.
    #[arg(
        long,
        global = true,
        env = "SWITCHBOARD_NATS__NKEY_FILE",
        value_name = "FILE"
    )]
    nkey: Option<std::path::PathBuf>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run every service in this process (and a local nats-server unless --nats-url is given).
    #[command(
        after_help = "Examples:\n  switchboard up\n  switchboard up --port 4333 --data-dir /tmp/sb\n  switchboard up --nats-url nats://10.0.0.5:4222"
    )]
    Up(up::UpArgs),
    /// Register (or update) an agent's card; also counts as a heartbeat.
    #[command(
        after_help = "Examples:\n  switchboard register --as researcher --description \"finds sources\" --capability search\n  switchboard register --as writer --card writer.toml --allow-from 'team-*'"
    )]
    Register {
        /// The agent.
        #[arg(long = "as", value_name = "AGENT")]
        as_agent: String,
        /// Its card.
        #[command(flatten)]
        card: card::CardArgs,
        /// NATS URL; a comma-separated list is a cluster's servers, failed over between.
        #[arg(long, env = "NATS_URL", default_value = DEFAULT_NATS_URL)]
        nats_url: String,
    },
    /// One heartbeat for an agent (agents send one every 10 s; 30 s of silence is offline).
    #[command(after_help = "Example:\n  switchboard heartbeat --as researcher")]
    Heartbeat {
        /// The agent.
        #[arg(long = "as", value_name = "AGENT")]
        as_agent: String,
        /// NATS URL; a comma-separated list is a cluster's servers, failed over between.
        #[arg(long, env = "NATS_URL", default_value = DEFAULT_NATS_URL)]
        nats_url: String,
    },
    /// Remove an agent from the directory (its goals are closed, their inboxes purged).
    #[command(after_help = "Example:\n  switchboard deregister --as researcher")]
    Deregister {
        /// The agent.
        #[arg(long = "as", value_name = "AGENT")]
        as_agent: String,
        /// NATS URL; a comma-separated list is a cluster's servers, failed over between.
        #[arg(long, env = "NATS_URL", default_value = DEFAULT_NATS_URL)]
        nats_url: String,
    },
    /// Open or close a goal (a live run with its own durable inbox).
    #[command(
        after_help = "Examples:\n  switchboard goal open --as researcher\n  switchboard goal open --as researcher --kind background\n  switchboard goal close --as researcher <goal_id>"
    )]
    Goal {
        #[command(subcommand)]
        command: GoalCommand,
    },
    /// list_peers as an agent: other agents (one page, in id order) and whether each is
    /// reachable.
    #[command(
        after_help = "Examples:\n  switchboard peers --as researcher\n  switchboard peers --as researcher --limit 500 --after writer"
    )]
    Peers {
        /// The agent to ask as (list_peers excludes it).
        #[arg(long = "as", value_name = "AGENT")]
        as_agent: String,
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
        /// NATS URL; a comma-separated list is a cluster's servers, failed over between.
        #[arg(long, env = "NATS_URL", default_value = DEFAULT_NATS_URL)]
        nats_url: String,
    },
    /// Every registered agent with status and number of live goals.
    #[command(
        after_help = "Example:\n  switchboard agents\n  switchboard agents --json | jq '.[] | select(.status != \"offline\")'"
    )]
    Agents {
        /// NATS URL; a comma-separated list is a cluster's servers, failed over between.
        #[arg(long, env = "NATS_URL", default_value = DEFAULT_NATS_URL)]
        nats_url: String,
    },
    /// One agent's card, status and live goals.
    #[command(after_help = "Example:\n  switchboard lookup writer")]
    Lookup {
        /// The agent to look up.
        agent: String,
        /// The agent to ask as.
        #[arg(long = "as", value_name = "AGENT", default_value = "cli")]
        as_agent: String,
        /// NATS URL; a comma-separated list is a cluster's servers, failed over between.
        #[arg(long, env = "NATS_URL", default_value = DEFAULT_NATS_URL)]
        nats_url: String,
    },
    /// send_to_peer as an agent (it must be registered); prints the delivery report.
    #[command(
        after_help = "Examples:\n  switchboard send --as writer --to researcher \"draft ready\"\n  switchboard send --as herald --to '*' \"standup in 5\"   # broadcast\n  switchboard send --as writer --to researcher \"draft ready\" --goal 0193a1b2-0000-7000-8000-000000000001 --receipt read\n  switchboard status --as writer <message_id>   # stored, delivered, read or expired_unread"
    )]
    Send {
        /// The sending agent.
        #[arg(long = "as", value_name = "AGENT")]
        as_agent: String,
        /// The peer, or `*` to broadcast.
        #[arg(long, value_name = "PEER")]
        to: String,
        /// The message text.
        message: String,
        /// A correlation id to carry (UUID).
        #[arg(long)]
        correlation_id: Option<uuid::Uuid>,
        /// The sending goal (one of the agent's live goals): answers and receipts land there.
        #[arg(long)]
        goal: Option<String>,
        /// Receipts back in --goal: `delivered`, or `read` (delivered, then read).
        #[arg(long, value_parser = commands::receipt_level)]
        receipt: Option<switchboard_client::proto::receipt::ReceiptLevel>,
        /// NATS URL; a comma-separated list is a cluster's servers, failed over between.
        #[arg(long, env = "NATS_URL", default_value = DEFAULT_NATS_URL)]
        nats_url: String,
    },
    /// A correlated call: waits for the answer (or --park: the answer lands in the inbox).
    #[command(
        after_help = "Examples:\n  switchboard call --as researcher --to writer \"title for section 2?\" --timeout-ms 20000\n  switchboard call --as researcher --to writer \"review this\" --park"
    )]
    Call {
        /// The calling agent.
        #[arg(long = "as", value_name = "AGENT")]
        as_agent: String,
        /// The callee.
        #[arg(long, value_name = "PEER")]
        to: String,
        /// The question.
        message: String,
        /// Deadline in milliseconds (default 30 s, at most 300 s).
        #[arg(long)]
        timeout_ms: Option<u64>,
        /// Do not wait: return the correlation id at once.
        #[arg(long)]
        park: bool,
        /// The caller goal where a parked answer lands.
        #[arg(long)]
        goal: Option<String>,
        /// NATS URL; a comma-separated list is a cluster's servers, failed over between.
        #[arg(long, env = "NATS_URL", default_value = DEFAULT_NATS_URL)]
        nats_url: String,
    },
    /// reply_to_peer: answer the call with this correlation id.
    #[command(
        after_help = "Example:\n  switchboard reply --as writer 0193a1b2-0000-7000-8000-0000000000cc \"How about: Beyond the Inbox\""
    )]
    Reply {
        /// The answering agent (must be the callee).
        #[arg(long = "as", value_name = "AGENT")]
        as_agent: String,
        /// The call being answered.
        correlation_id: uuid::Uuid,
        /// The answer.
        message: String,
        /// NATS URL; a comma-separated list is a cluster's servers, failed over between.
        #[arg(long, env = "NATS_URL", default_value = DEFAULT_NATS_URL)]
        nats_url: String,
    },
    /// Where a message sent with --receipt is, per receiving goal: stored, delivered, read or
    /// expired_unread.
    #[command(
        after_help = "Example:\n  switchboard status --as writer 0193a1b2-0000-7000-8000-0000000000aa"
    )]
    Status {
        /// The agent that sent it (only the sender may ask).
        #[arg(long = "as", value_name = "AGENT")]
        as_agent: String,
        /// The message id the delivery report named.
        message_id: uuid::Uuid,
        /// NATS URL; a comma-separated list is a cluster's servers, failed over between.
        #[arg(long, env = "NATS_URL", default_value = DEFAULT_NATS_URL)]
        nats_url: String,
    },
    /// Open calls an agent made (outgoing) and must answer (incoming).
    #[command(after_help = "Example:\n  switchboard pending --as writer")]
    Pending {
        /// The agent.
        #[arg(long = "as", value_name = "AGENT")]
        as_agent: String,
        /// NATS URL; a comma-separated list is a cluster's servers, failed over between.
        #[arg(long, env = "NATS_URL", default_value = DEFAULT_NATS_URL)]
        nats_url: String,
    },
    /// Print a goal's inbox as <peer-message> elements (JSON lines with --json) without
    /// consuming it (--follow keeps tailing), or take it as the agent does (--take).
    #[command(
        after_help = "Example:\n  switchboard inbox --as researcher --goal 0193a1b2-0000-7000-8000-000000000001 --follow"
    )]
    Inbox(inbox::InboxArgs),
    /// Tasks: create (or spawn a subtask), get, list, cancel, and the assignee's steps
    /// (accept, reject, start, progress, ask, complete, fail).
    #[command(
        after_help = "Examples:\n  switchboard task create --as coordinator --to researcher \"find 3 sources\" --deadline-ms 600000\n  switchboard task get --as coordinator <task_id>\n  switchboard task list --as researcher --role assignee --state submitted\n  switchboard task cancel --as coordinator <task_id> --reason \"plans changed\""
    )]
    Task(task::TaskArgs),
    /// The conversation around a message, call or task id, from the audit trail.
    #[command(after_help = "Example:\n  switchboard thread 0193a1b2-0000-7000-8000-0000000000cc")]
    Thread {
        /// A message id, correlation id or task id.
        id: uuid::Uuid,
        /// NATS URL; a comma-separated list is a cluster's servers, failed over between.
        #[arg(long, env = "NATS_URL", default_value = DEFAULT_NATS_URL)]
        nats_url: String,
    },
    /// Audit records by agent, goal, task, time and kind, one page.
    #[command(
        after_help = "Examples:\n  switchboard history --agent researcher\n  switchboard history --agent researcher --kind 'call.*' --limit 20\n  switchboard history --task <task_id> --since 2026-11-22T00:00:00Z"
    )]
    History(audit::HistoryArgs),
    /// Write the NATS accounts that isolate agents (docs/security.md): `DIR/auth.conf`, the
    /// services' NKey seed `DIR/services.nk` and one seed per agent `DIR/agents/<id>.nk`.
    /// Existing seed files are kept, so regenerating after adding an agent changes no one
    /// else's key; then `nats-server --signal reload` picks it up without a restart.
    #[command(
        after_help = "Example (agents.toml):\n  [[agents]]\n  id = \"researcher\"\n  audit = true      # may query agent.audit.*\n  [[agents]]\n  id = \"writer\"\n\n  switchboard nats-config --agents agents.toml --out nats/auth\n  # in the nats-server config:  include auth/auth.conf\n  # services:  SWITCHBOARD_NATS__NKEY_SEED=$(cat nats/auth/services.nk)\n  # an agent:  switchboard mcp --agent writer --nkey nats/auth/agents/writer.nk\n  nats-server --signal reload   # after adding an agent"
    )]
    NatsConfig {
        /// The agents file (TOML): `[[agents]]` with `id` and optional `audit = true`.
        #[arg(long, value_name = "FILE")]
        agents: std::path::PathBuf,
        /// The folder to write `auth.conf`, `services.nk` and `agents/<id>.nk` into.
        #[arg(long, value_name = "DIR")]
        out: std::path::PathBuf,
    },
    /// Be one agent as an MCP server over stdio, for an LLM agent host: registers the agent,
    /// opens a goal, and offers list_peers, send_to_peer, talk_to_agent, reply_to_peer,
    /// check_inbox and the task tools.
    #[command(
        after_help = "Examples:\n  switchboard mcp --agent researcher --description \"finds and summarises sources\"\n  switchboard mcp --agent writer --card writer.toml --goal-kind background\n\nIn an MCP host's config (e.g. mcpServers in a JSON settings file):\n  \"switchboard\": {\"command\": \"switchboard\", \"args\": [\"mcp\", \"--agent\", \"researcher\"],\n                  \"env\": {\"NATS_URL\": \"nats://127.0.0.1:4222\"}}"
    )]
    Mcp(mcp::McpArgs),
    /// The audit trail: export (JSON lines), verify the hash chain, pending requests.
    #[command(
        after_help = "Examples:\n  switchboard audit export --since 2026-11-22T00:00:00Z > manifest.jsonl\n  switchboard audit verify\n  switchboard audit pending"
    )]
    Audit(audit::AuditArgs),
    /// The A2A gateway's operator commands: mint a client's bearer token.
    #[command(
        after_help = "Example:\n  switchboard a2a token planner   # prints the token and the [a2a_gateway] lines"
    )]
    A2a(a2a::A2aArgs),
    /// The dead letters: messages given up on after the delivery limit or rejected by their
    /// reader, with why and where from; replay puts one back.
    #[command(after_help = "Examples:\n  switchboard dlq list\n  switchboard dlq replay 42")]
    Dlq(dlq::DlqArgs),
    /// A scripted conversation among three agents against the running system: a task
    /// delegated, a call answered, a broadcast, a refused self-send, then the audit thread.
    #[command(
        after_help = "Example:\n  switchboard up &   # in another terminal\n  switchboard demo"
    )]
    Demo(demo::DemoArgs),
    /// Whether every service answers, and whether each exports its telemetry (exit 1 if not).
    #[command(after_help = "Example:\n  switchboard health")]
    Health {
        /// NATS URL; a comma-separated list is a cluster's servers, failed over between.
        #[arg(long, env = "NATS_URL", default_value = DEFAULT_NATS_URL)]
        nats_url: String,
    },
}

/// `switchboard goal …`.
#[derive(Debug, Subcommand)]
enum GoalCommand {
    /// Open a goal; prints its inbox subject (read it with `switchboard inbox`).
    #[command(
        after_help = "Examples:\n  switchboard goal open --as researcher\n  switchboard goal open --as researcher --kind daemon --json | jq -r .goal_id\n  switchboard goal open --as auditor --overflow refuse"
    )]
    Open {
        /// The agent.
        #[arg(long = "as", value_name = "AGENT")]
        as_agent: String,
        /// interactive, background or daemon.
        #[arg(long, default_value = "interactive", value_parser = card::parse_goal_kind)]
        kind: switchboard_client::proto::registry::GoalKind,
        /// What a message that finds the goal's inbox full does: evict_oldest (the oldest
        /// message not yet handed out goes, its sender is told) or refuse (the sender gets
        /// `inbox_full` and nothing is stored).
        #[arg(long, value_parser = card::parse_overflow)]
        overflow: Option<switchboard_client::proto::inbox::Overflow>,
        /// Re-open this goal (after a restart) instead of a new one.
        #[arg(long, value_name = "GOAL_ID")]
        goal: Option<String>,
        /// NATS URL; a comma-separated list is a cluster's servers, failed over between.
        #[arg(long, env = "NATS_URL", default_value = DEFAULT_NATS_URL)]
        nats_url: String,
    },
    /// Close a goal: its cursor is deleted and unread messages are purged.
    #[command(after_help = "Example:\n  switchboard goal close --as researcher <goal_id>")]
    Close {
        /// The agent.
        #[arg(long = "as", value_name = "AGENT")]
        as_agent: String,
        /// The goal.
        goal_id: String,
        /// NATS URL; a comma-separated list is a cluster's servers, failed over between.
        #[arg(long, env = "NATS_URL", default_value = DEFAULT_NATS_URL)]
        nats_url: String,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let matches = Cli::command().get_matches();
    // The command's name for its span: `task create`, `goal open`, `peers`.
    let mut names = Vec::new();
    let mut level = &matches;
    while let Some((name, below)) = level.subcommand() {
        names.push(name.to_owned());
        level = below;
    }
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|err| err.exit());
    let json = cli.json;
    if let Err(err) = nats::load_credentials(cli.nkey.as_deref()) {
        eprintln!("switchboard: {err:#}");
        return ExitCode::FAILURE;
    }
    let view = view_of(&cli.command);
    let command = match cli.command {
        Command::Up(args) => return up::run(args).await,
        Command::Mcp(args) => return mcp::run(args).await,
        command => command,
    };
    // Every other command is one trace rooted at its own span (`service.name`
    // `switchboard-cli`; the demo's agents export under their own names).
    let name = names.join(" ");
    let hosting: &[&str] = match command {
        Command::Demo(_) => &demo::AGENTS,
        _ => &[],
    };
    let telemetry = traces::cli_telemetry(traces::CLI_SERVICE, hosting);
    let span = tracing::info_span!(
        "cli",
        otel.name = %format!("switchboard {name}"),
        otel.kind = "client",
        otel.status_code = tracing::field::Empty,
        switchboard.service = traces::CLI_SERVICE,
    );
    let code = dispatch(command, json, view).instrument(span.clone()).await;
    if code != ExitCode::SUCCESS {
        span.record("otel.status_code", "ERROR");
    }
    drop(span);
    if let Some(telemetry) = telemetry {
        telemetry.shutdown();
    }
    code
}

/// Runs one command (all but `up` and `mcp`) and prints its reply.
async fn dispatch(command: Command, json: bool, view: View) -> ExitCode {
    let result = match command {
        Command::Up(args) => return up::run(args).await,
        Command::Mcp(args) => return mcp::run(args).await,
        Command::Demo(args) => demo::run(args, json).await,
        Command::Health { nats_url } => return health::run(&nats_url, json).await,
        Command::Dlq(args) => dlq::run(args).await,
        Command::Register {
            as_agent,
            card,
            nats_url,
        } => commands::register(&nats_url, &as_agent, &card).await,
        Command::Heartbeat { as_agent, nats_url } => {
            let body = serde_json::json!({});
            commands::registry_request(&nats_url, RegistryOp::Heartbeat, &as_agent, &body).await
        }
        Command::Deregister { as_agent, nats_url } => {
            let body = serde_json::json!({});
            commands::registry_request(&nats_url, RegistryOp::Deregister, &as_agent, &body).await
        }
        Command::Goal {
            command:
                GoalCommand::Open {
                    as_agent,
                    kind,
                    overflow,
                    goal,
                    nats_url,
                },
        } => commands::goal_open(&nats_url, &as_agent, kind, overflow, goal.as_deref()).await,
        Command::Goal {
            command:
                GoalCommand::Close {
                    as_agent,
                    goal_id,
                    nats_url,
                },
        } => commands::goal_close(&nats_url, &as_agent, &goal_id).await,
        Command::Peers {
            as_agent,
            after,
            limit,
            skill,
            nats_url,
        } => commands::peers(&nats_url, &as_agent, after, limit, skill).await,
        Command::Agents { nats_url } => commands::agents(&nats_url).await,
        Command::Send {
            as_agent,
            to,
            message,
            correlation_id,
            goal,
            receipt,
            nats_url,
        } => {
            commands::send(
                &nats_url,
                &as_agent,
                to,
                message,
                correlation_id,
                goal.as_deref(),
                receipt,
            )
            .await
        }
        Command::Status {
            as_agent,
            message_id,
            nats_url,
        } => commands::send_status(&nats_url, &as_agent, message_id).await,
        Command::Inbox(args) => return inbox::run(args, json).await,
        Command::Task(args) => task::run(args).await,
        Command::Thread { id, nats_url } => audit::thread(&nats_url, id).await,
        Command::NatsConfig { agents, out } => return commands::nats_config(&agents, &out),
        Command::A2a(args) => return a2a::run(args, json).await,
        Command::History(args) => audit::history(args).await,
        Command::Audit(args) => match audit::run(args).await {
            Ok(Some(value)) => Ok(value),
            Ok(None) => return ExitCode::SUCCESS,
            Err(err) => Err(err),
        },
        Command::Call {
            as_agent,
            to,
            message,
            timeout_ms,
            park,
            goal,
            nats_url,
        } => {
            let goal = goal.as_deref();
            commands::call(&nats_url, &as_agent, to, message, timeout_ms, park, goal).await
        }
        Command::Reply {
            as_agent,
            correlation_id,
            message,
            nats_url,
        } => commands::reply(&nats_url, &as_agent, correlation_id, message).await,
        Command::Pending { as_agent, nats_url } => commands::pending(&nats_url, &as_agent).await,
        Command::Lookup {
            agent,
            as_agent,
            nats_url,
        } => commands::lookup(&nats_url, &as_agent, agent).await,
    };
    match result {
        Ok(value) => {
            output::show(view, &value, json);
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("switchboard: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// How a command's reply reads for a person (see [`output::View`]).
fn view_of(command: &Command) -> View {
    match command {
        Command::Register { .. } | Command::Heartbeat { .. } | Command::Deregister { .. } => {
            View::Registry
        }
        Command::Goal { .. } => View::Goal,
        Command::Peers { .. } => View::Peers,
        Command::Agents { .. } => View::Agents,
        Command::Lookup { .. } => View::Lookup,
        Command::Send { .. } => View::Delivery,
        Command::Call { .. } => View::Call,
        Command::Reply { .. } => View::ReplyAck,
        Command::Pending { .. } => View::Pending,
        Command::Status { .. } => View::SendStatus,
        Command::Task(args) => args.view(),
        Command::Thread { .. } | Command::History(_) => View::Records,
        Command::Audit(args) => args.view(),
        Command::Demo(_) => View::Records,
        Command::Dlq(args) => args.view(),
        Command::Up(_)
        | Command::Mcp(_)
        | Command::Inbox(_)
        | Command::NatsConfig { .. }
        | Command::Health { .. }
        | Command::A2a(_) => View::Json,
    }
}
