//! The command line: the command table (clap derive) and running one command.
//!
//! One module per command or group of commands, each holding its arguments — the about text,
//! the examples and the flags — and what it does: `up`; `registry` (register, heartbeat,
//! deregister, peers, agents, lookup); `goal`; `send` (send, status); `call` (call, reply,
//! pending); `inbox`; `task`; `audit` (thread, history, audit); `nats_config`; `a2a`; `dlq`; `people`; `limits`; `budget`;
//! `demo`; `health`. `args` declares the flags many of them share (the NATS URL, `--as`)
//! once. `switchboard mcp` is [`crate::mcp`].

mod a2a;
pub(crate) mod args;
mod audit;
mod budget;
mod call;
mod demo;
mod dlq;
mod files;
mod goal;
mod health;
mod inbox;
mod limits;
mod nats_config;
mod people;
mod registry;
mod send;
mod task;
mod up;

use std::process::ExitCode;

use clap::{CommandFactory as _, FromArgMatches as _, Parser, Subcommand};
use tracing::Instrument as _;

use crate::output::View;

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

// The commands, in the order `switchboard --help` lists them; each one's about text and
// examples are on its arguments (a doc comment here would be the about text of `switchboard`).
#[derive(Debug, Subcommand)]
enum Command {
    Up(up::UpArgs),
    Register(registry::RegisterArgs),
    Heartbeat(registry::HeartbeatArgs),
    Deregister(registry::DeregisterArgs),
    Goal(goal::GoalArgs),
    Peers(registry::PeersArgs),
    Agents(registry::AgentsArgs),
    Lookup(registry::LookupArgs),
    Send(send::SendArgs),
    Call(call::CallArgs),
    Reply(call::ReplyArgs),
    Status(send::StatusArgs),
    Pending(call::PendingArgs),
    Inbox(inbox::InboxArgs),
    Task(task::TaskArgs),
    Thread(audit::ThreadArgs),
    History(audit::HistoryArgs),
    NatsConfig(nats_config::NatsConfigArgs),
    /// Be one agent as an MCP server over stdio, for an LLM agent host: registers the agent,
    /// opens a goal, and offers list_peers, send_to_peer, talk_to_agent, reply_to_peer,
    /// check_inbox, the task tools, read_attachment and the people tools (list_people,
    /// ask_person, request_approval, use_approval); with --files-dir also upload_file and
    /// save_attachment.
    #[command(
        after_help = "Examples:\n  switchboard mcp --agent researcher --description \"finds and summarises sources\"\n  switchboard mcp --agent writer --card writer.toml --goal-kind background\n\nIn an MCP host's config (e.g. mcpServers in a JSON settings file):\n  \"switchboard\": {\"command\": \"switchboard\", \"args\": [\"mcp\", \"--agent\", \"researcher\"],\n                  \"env\": {\"NATS_URL\": \"nats://127.0.0.1:4222\"}}"
    )]
    Mcp(crate::mcp::McpArgs),
    Audit(audit::AuditArgs),
    A2a(a2a::A2aArgs),
    Dlq(dlq::DlqArgs),
    People(people::PeopleArgs),
    Limits(limits::LimitsArgs),
    #[command(alias = "attachments")]
    Files(files::FilesArgs),
    Budget(budget::BudgetArgs),
    Demo(demo::DemoArgs),
    Health(health::HealthArgs),
}

/// Parses the command line, runs the command and returns the process's exit code.
pub async fn run() -> ExitCode {
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
    if let Err(err) = crate::nats::load_credentials(cli.nkey.as_deref()) {
        eprintln!("switchboard: {err:#}");
        return ExitCode::FAILURE;
    }
    let view = view_of(&cli.command);
    let command = match cli.command {
        Command::Up(args) => return up::run(args).await,
        Command::Mcp(args) => return crate::mcp::run(args).await,
        command => command,
    };
    // Every other command is one trace rooted at its own span (`service.name`
    // `switchboard-cli`; the demo's agents export under their own names).
    let name = names.join(" ");
    let hosting: &[&str] = match command {
        Command::Demo(_) => &demo::AGENTS,
        _ => &[],
    };
    let telemetry = crate::traces::cli_telemetry(crate::traces::CLI_SERVICE, hosting);
    let span = tracing::info_span!(
        "cli",
        otel.name = %format!("switchboard {name}"),
        otel.kind = "client",
        otel.status_code = tracing::field::Empty,
        switchboard.service = crate::traces::CLI_SERVICE,
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
        Command::Mcp(args) => return crate::mcp::run(args).await,
        Command::Demo(args) => demo::run(args, json).await,
        Command::Health(args) => return health::run(&args, json).await,
        Command::Dlq(args) => dlq::run(args).await,
        Command::People(args) => people::run(args).await,
        Command::Limits(args) => limits::run(args).await,
        Command::Files(args) => files::run(args).await,
        Command::Budget(args) => budget::run(args).await,
        Command::Register(args) => registry::register(args).await,
        Command::Heartbeat(args) => registry::heartbeat(args).await,
        Command::Deregister(args) => registry::deregister(args).await,
        Command::Goal(args) => goal::run(args).await,
        Command::Peers(args) => registry::peers(args).await,
        Command::Agents(args) => registry::agents(args).await,
        Command::Lookup(args) => registry::lookup(args).await,
        Command::Send(args) => send::send(args).await,
        Command::Status(args) => send::status(args).await,
        Command::Call(args) => call::call(args).await,
        Command::Reply(args) => call::reply(args).await,
        Command::Pending(args) => call::pending(args).await,
        Command::Inbox(args) => return inbox::run(args, json).await,
        Command::Task(args) => task::run(args).await,
        Command::Thread(args) => audit::thread(args).await,
        Command::History(args) => audit::history(args).await,
        Command::NatsConfig(args) => return nats_config::run(&args),
        Command::A2a(args) => return a2a::run(args, json).await,
        Command::Audit(args) => match audit::run(args).await {
            Ok(Some(value)) => Ok(value),
            Ok(None) => return ExitCode::SUCCESS,
            Err(err) => Err(err),
        },
    };
    match result {
        Ok(value) => {
            crate::output::show(view, &value, json);
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("switchboard: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// How a command's reply reads for a person (see [`View`]).
fn view_of(command: &Command) -> View {
    match command {
        Command::Register(_) | Command::Heartbeat(_) | Command::Deregister(_) => View::Registry,
        Command::Goal(_) => View::Goal,
        Command::Peers(_) => View::Peers,
        Command::Agents(_) => View::Agents,
        Command::Lookup(_) => View::Lookup,
        Command::Send(_) => View::Delivery,
        Command::Call(_) => View::Call,
        Command::Reply(_) => View::ReplyAck,
        Command::Pending(_) => View::Pending,
        Command::Status(_) => View::SendStatus,
        Command::Task(args) => args.view(),
        Command::Thread(_) | Command::History(_) => View::Records,
        Command::Audit(args) => args.view(),
        Command::Demo(_) => View::Records,
        Command::Dlq(args) => args.view(),
        Command::People(args) => args.view(),
        Command::Up(_)
        | Command::Mcp(_)
        | Command::Inbox(_)
        | Command::NatsConfig(_)
        | Command::Health(_)
        | Command::Limits(_)
        | Command::Files(_)
        | Command::Budget(_)
        | Command::A2a(_) => View::Json,
    }
}

/// The NATS services `up` runs (the services of a running system), by the names they answer
/// `$SRV` requests and export telemetry under. The console is an HTTP server, not one of them.
pub(crate) const SERVICES: [&str; 9] = [
    ::directory::SPEC.name,
    inbox_fanout::SPEC.name,
    reply_correlator::SPEC.name,
    task_lifecycle::SPEC.name,
    ::audit::SPEC.name,
    a2a_gateway::SPEC.name,
    ::people::SPEC.name,
    ::limits::SPEC.name,
    ::files::SPEC.name,
];
