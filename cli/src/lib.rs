//! `switchboard`: run the fabric in one process, be an agent from the command line or as an
//! MCP server, and look at the fabric. The binary (`main.rs`) only calls [`run`].
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
//! - `switchboard status --as <agent> <message-id>`: a sent message's receipts.
//! - `switchboard inbox --as <agent> --goal <id> [--follow | --take]`: a goal's inbox, peeked
//!   or taken.
//! - `switchboard call`, `reply`, `pending`: correlated calls.
//! - `switchboard task create|get|list|cancel|accept|reject|start|progress|ask|complete|fail`.
//! - `switchboard thread <id>`, `history …`, `audit export|verify|pending`: the audit trail.
//! - `switchboard dlq list|replay`: the dead letters.
//! - `switchboard nats-config --agents agents.toml --out DIR`: the NATS accounts and NKeys.
//! - `switchboard a2a token|add|list|remove`: A2A client tokens and remote A2A agents.
//! - `switchboard health`: whether every service answers.
//!
//! Layout: `cmd/` is the command table and one module per command (its flags and what it
//! does); `mcp/` the MCP server; `card.rs` the card flags `register` and `mcp` share;
//! `nats.rs` the connection and request helpers; `output.rs` how replies are printed;
//! `traces.rs` the CLI's own telemetry; `embedded.rs` the nats-server `up` starts;
//! [`permissions`] the NATS accounts `nats-config` writes (public: the isolation tests
//! generate accounts with it).

mod card;
mod cmd;
mod embedded;
mod mcp;
mod nats;
mod output;
mod people_text;
pub mod permissions;
mod traces;

pub use cmd::run;
pub use mcp::tool_definitions;
