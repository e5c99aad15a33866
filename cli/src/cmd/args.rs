//! The flags many commands share, each declared once and `#[command(flatten)]`-ed into the
//! commands that take it: where NATS is ([`Connection`]) and which agent acts ([`Acting`]).
//!
//! A command whose flag reads differently from the declaration here (its own help text, a
//! default, global so it may follow a subcommand) adjusts it with `#[command(mut_args(…))]`
//! and the helpers below instead of declaring the flag again. They change the flag in place,
//! so it keeps its place in the help and the usage line.

use switchboard_client::proto::{AgentId, IdError};

/// Default NATS URL of the commands (also where `up`'s embedded server listens by default).
const DEFAULT_NATS_URL: &str = "nats://127.0.0.1:4222";

/// The id clap knows [`Connection::nats_url`] by.
const NATS_URL: &str = "nats_url";
/// The id clap knows [`Acting::as_agent`] by.
const AS_AGENT: &str = "as_agent";

/// Where NATS is: `--nats-url` (or `NATS_URL`).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Connection {
    /// NATS URL; a comma-separated list is a cluster's servers, failed over between.
    #[arg(long, env = "NATS_URL", default_value = DEFAULT_NATS_URL)]
    pub(crate) nats_url: String,
}

/// The agent a command acts as: `--as AGENT`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct Acting {
    /// The agent.
    #[arg(long = "as", value_name = "AGENT")]
    pub(crate) as_agent: String,
}

impl Acting {
    /// The agent's id, checked.
    pub(crate) fn id(&self) -> Result<AgentId, IdError> {
        AgentId::parse(&self.as_agent)
    }
}

/// `--as` with this command's own help text (written as clap shows a doc comment: without
/// its final period).
pub(crate) fn agent_help(help: &'static str) -> impl FnMut(clap::Arg) -> clap::Arg {
    move |arg| {
        if arg.get_id() == AS_AGENT {
            arg.help(help)
        } else {
            arg
        }
    }
}

/// `--as` with this command's own help text, optional: without it the command acts as
/// `default`.
pub(crate) fn agent_default(
    help: &'static str,
    default: &'static str,
) -> impl FnMut(clap::Arg) -> clap::Arg {
    move |arg| {
        if arg.get_id() == AS_AGENT {
            arg.help(help).default_value(default).required(false)
        } else {
            arg
        }
    }
}

/// `--nats-url` with this command's own help text (without its final period).
pub(crate) fn nats_url_help(help: &'static str) -> impl FnMut(clap::Arg) -> clap::Arg {
    move |arg| {
        if arg.get_id() == NATS_URL {
            arg.help(help)
        } else {
            arg
        }
    }
}

/// `--nats-url` of a command with subcommands: global, so it may be given before or after the
/// subcommand (`switchboard task --nats-url URL list`, `switchboard task list --nats-url URL`).
pub(crate) fn global_nats_url(arg: clap::Arg) -> clap::Arg {
    if arg.get_id() == NATS_URL {
        arg.global(true)
    } else {
        arg
    }
}

/// Sends a registry request as `acting` without registering it.
pub(crate) async fn registry_request<T: serde::Serialize>(
    conn: &Connection,
    op: switchboard_client::proto::subject::RegistryOp,
    acting: &Acting,
    body: &T,
) -> anyhow::Result<serde_json::Value> {
    let agent = acting.id()?;
    crate::nats::request_json(&conn.nats_url, &op.subject(&agent), body).await
}
