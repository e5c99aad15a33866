//! The `[inbox_fanout]` config section.

use serde::{Deserialize, Serialize};
use switchboard_proto::BROADCAST_CAP_DEFAULT;

/// Fan-out settings (`[inbox_fanout]` in `switchboard.toml`, `SWITCHBOARD_INBOX_FANOUT__*`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FanoutConfig {
    /// Most peers one broadcast may reach; a broadcast over it is refused, nothing sent.
    pub broadcast_cap: usize,
    /// How often, at most, one goal's unread backlog is checked after a delivery, in
    /// milliseconds (a warning is logged when it is at the 64-message cap).
    pub backlog_check_interval_ms: u64,
}

impl Default for FanoutConfig {
    fn default() -> Self {
        Self {
            broadcast_cap: BROADCAST_CAP_DEFAULT,
            backlog_check_interval_ms: 1_000,
        }
    }
}

impl switchboard_runtime::config::Section for FanoutConfig {
    fn validate(&self) -> Result<(), String> {
        if self.broadcast_cap == 0 {
            return Err("broadcast_cap must be at least 1".to_owned());
        }
        Ok(())
    }
}

/// Config section name.
pub const SECTION: &str = "inbox_fanout";

#[cfg(test)]
mod tests {
    use super::*;
    use switchboard_runtime::config::Section;

    #[test]
    fn broadcast_cap_defaults_to_64_peers_and_must_be_positive() {
        let config = FanoutConfig::default();
        assert_eq!(config.broadcast_cap, 64);
        assert!(config.validate().is_ok());
        let zero = FanoutConfig {
            broadcast_cap: 0,
            ..config
        };
        assert!(zero.validate().is_err());
    }
}
