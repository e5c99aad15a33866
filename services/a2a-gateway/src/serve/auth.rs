//! Who is asking: a bearer token, hashed and compared with the configured clients, names the
//! client; the client is the agent `a2a-<name>` in the fabric. No token is refused (401)
//! unless anonymous callers are allowed, who are all `a2a-anonymous`.

use switchboard_proto::AgentId;

use crate::config::GatewayConfig;

/// The agent id every anonymous caller shares.
pub const ANONYMOUS: &str = "a2a-anonymous";

/// Why a request is not let in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No `Authorization: Bearer …` and anonymous callers are off.
    Missing,
    /// A token that matches no client.
    Unknown,
}

/// The caller of a request with this `Authorization` header value (if any).
pub fn caller(config: &GatewayConfig, authorization: Option<&str>) -> Result<AgentId, Refusal> {
    let Some(value) = authorization else {
        return anonymous(config);
    };
    let token = value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))
        .map(str::trim)
        .filter(|token| !token.is_empty())
        .ok_or(Refusal::Unknown)?;
    let presented = sha256_hex(token.as_bytes());
    // Every configured hash is compared, each in constant time, so the time taken says
    // nothing about which client (or how much of a hash) matched.
    let mut found = None;
    for client in &config.clients {
        if constant_time_eq(presented.as_bytes(), client.sha256.as_bytes()) {
            found = Some(client.name.as_str());
        }
    }
    let name = found.ok_or(Refusal::Unknown)?;
    AgentId::parse(&format!("a2a-{name}")).map_err(|_| Refusal::Unknown)
}

fn anonymous(config: &GatewayConfig) -> Result<AgentId, Refusal> {
    if config.allow_anonymous {
        AgentId::parse(ANONYMOUS).map_err(|_| Refusal::Missing)
    } else {
        Err(Refusal::Missing)
    }
}

/// SHA-256 of `bytes`, lowercase hex (what `[a2a_gateway] clients` holds).
pub fn sha256_hex(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ClientToken;

    fn config(anonymous: bool) -> GatewayConfig {
        GatewayConfig {
            clients: vec![ClientToken {
                name: "planner".into(),
                sha256: sha256_hex(b"s3cret"),
            }],
            allow_anonymous: anonymous,
            ..Default::default()
        }
    }

    #[test]
    fn a_known_token_names_its_client_and_nothing_else_gets_in() {
        let config = config(false);
        assert_eq!(
            caller(&config, Some("Bearer s3cret")).map(|id| id.to_string()),
            Ok("a2a-planner".to_owned())
        );
        assert_eq!(caller(&config, Some("Bearer wrong")), Err(Refusal::Unknown));
        assert_eq!(caller(&config, Some("Basic s3cret")), Err(Refusal::Unknown));
        assert_eq!(caller(&config, Some("Bearer ")), Err(Refusal::Unknown));
        assert_eq!(caller(&config, None), Err(Refusal::Missing));
        assert_eq!(
            caller(&self::config(true), None).map(|id| id.to_string()),
            Ok(ANONYMOUS.to_owned())
        );
    }
}
