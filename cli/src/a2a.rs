//! `switchboard a2a`: the A2A gateway's operator commands. `token <name>` mints a bearer token
//! for an A2A client and prints the `[a2a_gateway]` lines that let it in (only the token's
//! SHA-256 goes into the config; the token is shown once).

use std::process::ExitCode;

use clap::{Args, Subcommand};
use ring::rand::{SecureRandom, SystemRandom};

/// Arguments of `switchboard a2a`.
#[derive(Debug, Args)]
pub struct A2aArgs {
    #[command(subcommand)]
    command: A2aCommand,
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
}

/// Runs `switchboard a2a`.
pub fn run(args: A2aArgs) -> ExitCode {
    match args.command {
        A2aCommand::Token { name } => token(&name),
    }
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
    let hash = a2a_gateway::auth::sha256_hex(token.as_bytes());
    println!("token (give it to the client; it is not stored anywhere): {token}");
    println!();
    println!("# switchboard.toml — the client calls as agent `a2a-{name}`");
    println!("[[a2a_gateway.clients]]");
    println!("name = \"{name}\"");
    println!("sha256 = \"{hash}\"");
    ExitCode::SUCCESS
}
