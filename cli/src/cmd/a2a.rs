//! `switchboard a2a`: the A2A gateway's operator commands. `token <name>` mints a bearer token
//! for an A2A client and prints the `[a2a_gateway]` lines that let it in (only the token's
//! SHA-256 goes into the config; the token is shown once). `add <card-url>`, `list` and
//! `remove <agent_id>` manage the remote A2A agents the gateway carries onto the fabric.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use ring::rand::{SecureRandom, SystemRandom};

use super::args::Connection;

/// The A2A gateway's operator commands: mint a client's bearer token.
#[derive(Debug, Args)]
#[command(
    after_help = "Example:\n  switchboard a2a token planner   # prints the token and the [a2a_gateway] lines",
    mut_args(super::args::global_nats_url),
    mut_args(super::args::nats_url_help("NATS URL (add, list, remove)"))
)]
pub struct A2aArgs {
    #[command(subcommand)]
    command: A2aCommand,
    #[command(flatten)]
    conn: Connection,
}

#[derive(Debug, Subcommand)]
enum A2aCommand {
    /// Mint a bearer token for an A2A client: prints the token (give it to the client) and
    /// the config lines (add them to switchboard.toml); the client acts as agent `a2a-<name>`.
    #[command(
        after_help = "Example:\n  switchboard a2a token planner\n  # then the client sends Authorization: Bearer <token> to http://127.0.0.1:9999/agents/<agent_id>"
    )]
    Token {
        /// The client's name: 1-60 characters of a-z, 0-9, - and _.
        name: String,
    },
    /// Carry a remote A2A agent onto the fabric: fetches and checks its card, then the
    /// gateway registers it and delivers its sends, calls and tasks over A2A.
    #[command(
        after_help = "Example:\n  switchboard a2a add http://10.0.0.7:8000/.well-known/agent-card.json --as translator\n  # then: switchboard call --as me translator 'bonjour?'"
    )]
    Add {
        /// Where the agent's card is (http or https; the JSON-RPC interface must be on the same
        /// origin).
        card_url: String,
        /// Its agent id on the fabric (default: made from the card's name).
        #[arg(long = "as", value_name = "AGENT_ID")]
        as_id: Option<String>,
        /// A PEM file of extra CA certificates to trust for an https card (the gateway's
        /// `ca_file`); the system's roots are always trusted.
        #[arg(long, value_name = "PEM")]
        ca_file: Option<std::path::PathBuf>,
        /// Route `to: "skill:<name>"` work to it for the skills its card lists now (pinned: a
        /// later card cannot add any). Without it, agents see its skills but only work sent to
        /// it by name reaches it — text sent by skill never leaves for a remote unasked.
        #[arg(long)]
        route_skills: bool,
    },
    /// The remote agents carried, with their card URLs and status.
    List,
    /// Stop carrying a remote agent: its goal is closed (its queued messages are dropped);
    /// nothing else of its id is touched.
    Remove {
        /// The remote agent's id.
        agent_id: String,
    },
}

/// Runs `switchboard a2a`; `json` prints machine-readable output.
pub async fn run(args: A2aArgs, json: bool) -> ExitCode {
    let result = match args.command {
        A2aCommand::Token { name } => return token(&name),
        A2aCommand::Add {
            card_url,
            as_id,
            ca_file,
            route_skills,
        } => {
            let remote = RemoteToAdd {
                card_url: &card_url,
                as_id: as_id.as_deref(),
                ca_file: ca_file.as_deref(),
                route_skills,
            };
            add(&args.conn.nats_url, &remote, json).await
        }
        A2aCommand::List => list(&args.conn.nats_url, json).await,
        A2aCommand::Remove { agent_id } => remove(&args.conn.nats_url, &agent_id, json).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("switchboard: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// What `a2a add` was asked to add.
struct RemoteToAdd<'a> {
    card_url: &'a str,
    as_id: Option<&'a str>,
    ca_file: Option<&'a std::path::Path>,
    route_skills: bool,
}

async fn add(nats_url: &str, remote: &RemoteToAdd<'_>, json: bool) -> anyhow::Result<()> {
    let RemoteToAdd {
        card_url,
        as_id,
        ca_file,
        route_skills,
    } = *remote;
    let roots = match ca_file {
        Some(path) => a2a_gateway::remote::outbound::read_roots(path)
            .map_err(|err| anyhow::anyhow!("{}: {err}", path.display()))?,
        None => Vec::new(),
    };
    let client = crate::nats::connect(nats_url).await?;
    let js = async_nats::jetstream::new(client);
    let http = a2a_gateway::remote::http_client(&roots)?;
    let added = a2a_gateway::remote::add_with(&js, &http, card_url, as_id, route_skills).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&added)?);
    } else {
        // The name, URL and skills come from the remote's card: no control characters
        // (terminal escapes) reach the operator's terminal.
        let printable =
            |text: &str| -> String { text.chars().filter(|c| !c.is_control()).collect() };
        let skills: Vec<String> = added.skills.iter().map(|skill| printable(skill)).collect();
        println!(
            "added `{}` ({}): JSON-RPC {}, {}; skills: {}",
            added.remote.agent_id,
            printable(&added.name),
            printable(&added.jsonrpc_url),
            if added.streaming {
                "streaming"
            } else {
                "not streaming"
            },
            if skills.is_empty() {
                "none".to_owned()
            } else {
                skills.join(", ")
            }
        );
        if !route_skills {
            println!(
                "its skills are listed, not routed: `skill:` work goes to it only after \
                 `a2a add --route-skills`"
            );
        }
        println!("a gateway replica registers it within a few seconds");
    }
    Ok(())
}

async fn list(nats_url: &str, json: bool) -> anyhow::Result<()> {
    let client = crate::nats::connect(nats_url).await?;
    let js = async_nats::jetstream::new(client.clone());
    let remotes = a2a_gateway::remote::bucket(&js).await?;
    let known = a2a_gateway::remote::list(&remotes).await?;
    let agents = switchboard_client::list_agents(&client)
        .await
        .unwrap_or_default();
    let rows: Vec<serde_json::Value> = known
        .iter()
        .map(|remote| {
            let status = agents
                .iter()
                .find(|agent| agent.agent_id == remote.agent_id.as_str())
                .map_or_else(
                    || "not registered yet".to_owned(),
                    |agent| format!("{:?}", agent.status).to_lowercase(),
                );
            serde_json::json!({
                "agent_id": remote.agent_id,
                "card_url": remote.card_url,
                "status": status,
                "goal_id": remote.goal_id,
            })
        })
        .collect();
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else if rows.is_empty() {
        println!("no remote A2A agents (add one with `switchboard a2a add <card-url>`)");
    } else {
        for row in rows {
            println!(
                "{}  {}  {}",
                row["agent_id"].as_str().unwrap_or_default(),
                row["status"].as_str().unwrap_or_default(),
                row["card_url"].as_str().unwrap_or_default()
            );
        }
    }
    Ok(())
}

async fn remove(nats_url: &str, agent_id: &str, json: bool) -> anyhow::Result<()> {
    let id = switchboard_proto::AgentId::parse(agent_id)?;
    let client = crate::nats::connect(nats_url).await?;
    let js = async_nats::jetstream::new(client.clone());
    let remotes = a2a_gateway::remote::bucket(&js).await?;
    let record = a2a_gateway::remote::list(&remotes)
        .await?
        .into_iter()
        .find(|remote| remote.agent_id == id);
    if !a2a_gateway::remote::remove(&remotes, &id).await? {
        anyhow::bail!("`{id}` is not a remote A2A agent (see `switchboard a2a list`)");
    }
    // The replica carrying it lets go within a tick. Only the remote's own goal is closed
    // (dropping what is queued there): the id is never deregistered, since it may be a
    // Switchboard agent's by now and a deregister would close that agent's goals.
    let released = match &record {
        Some(remote) => a2a_gateway::remote::release(&client, remote)
            .await
            .map_err(anyhow::Error::from),
        None => Err(anyhow::anyhow!("its record could not be read")),
    };
    if json {
        println!(
            "{}",
            serde_json::json!({"removed": id, "goal_closed": released.is_ok()})
        );
    } else {
        println!("removed `{id}`; it goes offline when its heartbeats stop");
        if let Err(err) = released {
            println!("(its goal was not closed: {err:#}; the carrying replica closes it)");
        }
    }
    Ok(())
}

fn token(name: &str) -> ExitCode {
    let config = a2a_gateway::GatewayConfig {
        clients: vec![a2a_gateway::config::ClientToken {
            name: name.to_owned(),
            sha256: "0".repeat(64),
        }],
        ..Default::default()
    };
    if let Err(err) = switchboard_runtime::config::Section::validate(&config) {
        eprintln!("switchboard: {err}");
        return ExitCode::from(64);
    }
    let mut bytes = [0u8; 32];
    if SystemRandom::new().fill(&mut bytes).is_err() {
        eprintln!("switchboard: the system's random source failed");
        return ExitCode::FAILURE;
    }
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let hash = a2a_gateway::serve::auth::sha256_hex(token.as_bytes());
    println!("token (give it to the client; it is not stored anywhere): {token}");
    println!();
    println!("# switchboard.toml — the client calls as agent `a2a-{name}`");
    println!("[[a2a_gateway.clients]]");
    println!("name = \"{name}\"");
    println!("sha256 = \"{hash}\"");
    ExitCode::SUCCESS
}
