//! `switchboard nats-config`: writes the NATS accounts and NKeys that isolate agents
//! ([`crate::permissions`]), and says which files it wrote, created and no longer uses.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::permissions;

/// Write the NATS accounts that isolate agents (docs/security.md): `DIR/auth.conf`, the
/// services' NKey seed `DIR/services.nk`, the console's `DIR/console.nk` and one seed per agent
/// `DIR/agents/<id>.nk`.
/// Existing seed files are kept, so regenerating after adding an agent changes no one
/// else's key; then `nats-server --signal reload` picks it up without a restart.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Example (agents.toml):\n  [[agents]]\n  id = \"researcher\"\n  audit = true      # may query agent.audit.*\n  [[agents]]\n  id = \"writer\"\n\n  switchboard nats-config --agents agents.toml --out nats/auth\n  # in the nats-server config:  include auth/auth.conf\n  # services:  SWITCHBOARD_NATS__NKEY_SEED=$(cat nats/auth/services.nk)\n  # console:   SWITCHBOARD_NATS__NKEY_FILE=nats/auth/console.nk SWITCHBOARD_NATS__INBOX_PREFIX=_INBOX.console\n  # an agent:  switchboard mcp --agent writer --nkey nats/auth/agents/writer.nk\n  nats-server --signal reload   # after adding an agent"
)]
pub(crate) struct NatsConfigArgs {
    /// The agents file (TOML): `[[agents]]` with `id` and optional `audit = true`.
    #[arg(long, value_name = "FILE")]
    agents: PathBuf,
    /// The folder to write `auth.conf`, `services.nk`, `console.nk` and `agents/<id>.nk` into.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// The people file (people.toml): its persons with `operator` access may talk to agents
    /// from the console (its user may then publish as `people-<id>`). Without it, nobody
    /// talks to agents from the console; regenerate after adding an operator.
    #[arg(long, value_name = "FILE")]
    people: Option<PathBuf>,
}

/// Writes the files; exit 1 (the reason on stderr) when the agents file is wrong or a file
/// cannot be written.
pub(crate) fn run(args: &NatsConfigArgs) -> ExitCode {
    let talkers = match &args.people {
        None => Vec::new(),
        Some(path) => match people::book::Books::load(path) {
            Ok(books) => books
                .now()
                .persons()
                .filter(|person| person.access.contains(&people::book::Access::Operator))
                .map(|person| person.id.clone())
                .collect(),
            Err(err) => {
                eprintln!("switchboard: {}: {err}", path.display());
                return ExitCode::FAILURE;
            }
        },
    };
    let made = permissions::read_agents(&args.agents)
        .and_then(|file| permissions::generate_with(&file, &talkers, &args.out));
    match made {
        Ok(done) => {
            crate::output::line(&format!("wrote {}", done.auth_file.display()));
            for path in &done.created {
                crate::output::line(&format!("new key {}", path.display()));
            }
            for path in &done.unused {
                crate::output::line(&format!(
                    "unused key {} (its agent is no longer listed; it cannot connect)",
                    path.display()
                ));
            }
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("switchboard: {err}");
            ExitCode::FAILURE
        }
    }
}
