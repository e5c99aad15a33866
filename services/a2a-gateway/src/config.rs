//! The `[a2a_gateway]` config section: where the gateway listens, the URL clients reach it at,
//! who may call it, and how long a blocking `SendMessage` waits.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// Config section name.
pub const SECTION: &str = "a2a_gateway";

/// One A2A client allowed in: a name (its agent id in the fabric is `a2a-<name>`) and the
/// SHA-256 of its bearer token, lowercase hex, so the config never holds the token itself
/// (`switchboard a2a token <name>` prints a fresh token and these lines).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientToken {
    /// The client's name: 1–60 characters of `[a-z0-9_-]`, so `a2a-<name>` is an agent id
    /// (`anonymous` is taken: it is every caller without a token, when those are allowed).
    pub name: String,
    /// SHA-256 of the bearer token, 64 lowercase hex characters.
    pub sha256: String,
}

/// Gateway settings (`[a2a_gateway]` in `switchboard.toml`, `SWITCHBOARD_A2A_GATEWAY__*` env).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GatewayConfig {
    /// The address the HTTP server binds (loopback by default: put a TLS proxy in front to
    /// expose it).
    pub listen: SocketAddr,
    /// The base URL clients reach the gateway at, used in agent cards (`<public_url>/agents/<id>`);
    /// empty: `http://<listen>`.
    pub public_url: String,
    /// The clients allowed in, by bearer token.
    pub clients: Vec<ClientToken>,
    /// Whether a request without a token is served, as the agent `a2a-anonymous` (off: 401).
    pub allow_anonymous: bool,
    /// The agent `GET /.well-known/agent-card.json` describes; empty: that path is 404.
    pub default_agent: String,
    /// How long a blocking `SendMessage` waits for the task to finish or ask for input before
    /// it answers with the task as it is, in milliseconds.
    pub blocking_timeout_ms: u64,
    /// Largest request body, in bytes (a message is at most 64 KiB of text plus its parts).
    pub max_body_bytes: usize,
    /// The most streams (`SendStreamingMessage`, `SubscribeToTask`) open at once per client.
    pub max_streams_per_client: usize,
    /// Whether push-notification webhooks may point at loopback, private or link-local
    /// addresses (off: such a URL is refused; on for a laptop or a test).
    pub push_allow_private: bool,
    /// A PEM file of extra CA certificates trusted for remote agents and webhooks over https
    /// (a private CA); the platform's roots are always trusted.
    pub ca_file: Option<std::path::PathBuf>,
    /// How often the card of each remote agent (`switchboard a2a add`) is fetched again, in
    /// milliseconds; a card that cannot be fetched takes the agent offline until it can.
    pub remote_refresh_ms: u64,
    /// How often a carried remote agent heartbeats, in milliseconds (below the directory's
    /// `heartbeat_timeout_ms`, 30 s by default).
    pub remote_heartbeat_ms: u64,
    /// How long one exchange with a remote agent (a call's answer, a task's run) may take, in
    /// milliseconds.
    pub remote_timeout_ms: u64,
    /// How many messages of one remote agent's inbox are carried at once.
    pub remote_concurrency: u32,
    /// A message's `raw` file part larger than this many bytes is uploaded to the files
    /// service as the client and carried as an attachment (docs/protocol.md §17); smaller
    /// ones stay inline, as a `data:` URI in the message.
    pub inline_file_bytes: usize,
    /// How long a file link the gateway hands out (`GET /files/<token>`) is good for, in
    /// seconds.
    pub file_link_ttl_secs: u64,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 9999)),
            public_url: String::new(),
            clients: Vec::new(),
            allow_anonymous: false,
            default_agent: String::new(),
            blocking_timeout_ms: 60_000,
            max_body_bytes: 1024 * 1024,
            max_streams_per_client: 32,
            push_allow_private: false,
            ca_file: None,
            remote_refresh_ms: 60_000,
            remote_heartbeat_ms: 10_000,
            remote_timeout_ms: 300_000,
            remote_concurrency: 8,
            inline_file_bytes: 16 * 1024,
            file_link_ttl_secs: 900,
        }
    }
}

/// Longest client name: `a2a-` plus it must fit an agent id (64 characters).
pub const CLIENT_NAME_MAX: usize = 60;

impl GatewayConfig {
    /// The base URL cards advertise.
    pub fn base_url(&self) -> String {
        if self.public_url.is_empty() {
            format!("http://{}", self.listen)
        } else {
            self.public_url.trim_end_matches('/').to_owned()
        }
    }
}

impl switchboard_runtime::config::Section for GatewayConfig {
    fn validate(&self) -> Result<(), String> {
        if self.blocking_timeout_ms == 0 || self.blocking_timeout_ms > 300_000 {
            return Err("blocking_timeout_ms must be 1 to 300000".to_owned());
        }
        if !(1024..=16 * 1024 * 1024).contains(&self.max_body_bytes) {
            return Err("max_body_bytes must be 1024 to 16777216".to_owned());
        }
        if !(1_000..=86_400_000).contains(&self.remote_refresh_ms) {
            return Err("remote_refresh_ms must be 1000 to 86400000".to_owned());
        }
        if !(100..=600_000).contains(&self.remote_heartbeat_ms) {
            return Err("remote_heartbeat_ms must be 100 to 600000".to_owned());
        }
        if !(1_000..=3_600_000).contains(&self.remote_timeout_ms) {
            return Err("remote_timeout_ms must be 1000 to 3600000".to_owned());
        }
        if !(1..=64).contains(&self.remote_concurrency) {
            return Err("remote_concurrency must be 1 to 64".to_owned());
        }
        if self.inline_file_bytes > 64 * 1024 {
            return Err("inline_file_bytes must be 0 to 65536".to_owned());
        }
        if !(10..=86_400).contains(&self.file_link_ttl_secs) {
            return Err("file_link_ttl_secs must be 10 to 86400".to_owned());
        }
        if self.max_streams_per_client == 0 {
            return Err("max_streams_per_client must be above 0".to_owned());
        }
        let scheme_ok =
            self.public_url.starts_with("http://") || self.public_url.starts_with("https://");
        if !self.public_url.is_empty() && !scheme_ok {
            return Err("public_url must start with http:// or https://".to_owned());
        }
        let mut names = std::collections::HashSet::new();
        let mut hashes = std::collections::HashSet::new();
        for client in &self.clients {
            if !names.insert(client.name.as_str()) || !hashes.insert(client.sha256.as_str()) {
                return Err(format!(
                    "client `{}`: every client needs its own name and its own token",
                    client.name
                ));
            }
            let name_ok = !client.name.is_empty()
                && client.name.len() <= CLIENT_NAME_MAX
                && client.name.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_'
                });
            if client.name == "anonymous" {
                return Err(
                    "client name `anonymous` is taken by callers without a token".to_owned(),
                );
            }
            if !name_ok {
                return Err(format!(
                    "client name `{}` must be 1-{CLIENT_NAME_MAX} characters of a-z, 0-9, - and _",
                    client.name
                ));
            }
            let hash_ok = client.sha256.len() == 64
                && client
                    .sha256
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
            if !hash_ok {
                return Err(format!(
                    "client `{}`: sha256 must be 64 lowercase hex characters",
                    client.name
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchboard_runtime::config::Section;

    #[test]
    fn defaults_listen_on_loopback_and_refuse_strangers() {
        let config = GatewayConfig::default();
        assert_eq!(config.listen.to_string(), "127.0.0.1:9999");
        assert_eq!(config.base_url(), "http://127.0.0.1:9999");
        assert!(!config.allow_anonymous);
        assert!(config.validate().is_ok());
    }

    /// Compose and Helm set the clients through one variable (`docker-compose.yml`).
    #[test]
    #[allow(clippy::result_large_err)]
    fn clients_come_from_one_environment_variable() {
        figment::Jail::expect_with(|jail| {
            let hash = "a".repeat(64);
            jail.set_env(
                "SWITCHBOARD_A2A_GATEWAY__CLIENTS",
                format!("[{{name=\"planner\",sha256=\"{hash}\"}}]"),
            );
            let figment = switchboard_runtime::config::figment();
            let config: GatewayConfig = switchboard_runtime::config::section(&figment, SECTION)
                .map_err(|err| err.to_string())?;
            assert_eq!(config.clients.len(), 1);
            assert_eq!(config.clients[0].name, "planner");
            assert_eq!(config.clients[0].sha256, hash);
            Ok(())
        });
    }

    #[test]
    fn bad_clients_and_bounds_are_refused() {
        let bad_name = GatewayConfig {
            clients: vec![ClientToken {
                name: "Bad Name".into(),
                sha256: "0".repeat(64),
            }],
            ..Default::default()
        };
        assert!(bad_name.validate().is_err());
        let bad_hash = GatewayConfig {
            clients: vec![ClientToken {
                name: "ok".into(),
                sha256: "XYZ".into(),
            }],
            ..Default::default()
        };
        assert!(bad_hash.validate().is_err());
        let zero = GatewayConfig {
            blocking_timeout_ms: 0,
            ..Default::default()
        };
        assert!(zero.validate().is_err());
    }
}
