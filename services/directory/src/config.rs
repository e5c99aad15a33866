//! The `[directory]` config section.

use serde::{Deserialize, Serialize};

/// Directory settings (`[directory]` in `switchboard.toml`, `SWITCHBOARD_DIRECTORY__*` env).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DirectoryConfig {
    /// An agent without a heartbeat for this long is marked `offline`, in milliseconds
    /// (default 3 × the client's 10 s heartbeat).
    pub heartbeat_timeout_ms: u64,
    /// How often each replica looks for agents whose heartbeats stopped, in milliseconds.
    pub sweep_interval_ms: u64,
    /// The most live goals one agent may hold at once (each is a cursor and an inbox subject);
    /// `goal.open` past it answers `too_many_goals`.
    pub max_goals_per_agent: u32,
    /// The skill grants `switchboard nats-config` writes (`skill-grants.json`): when set, an
    /// agent listed there is routed `skill:` work only for the skills granted to it. Unset (an
    /// open laptop setup): a card's skills are taken at its word.
    pub skill_grants_file: Option<std::path::PathBuf>,
}

impl Default for DirectoryConfig {
    fn default() -> Self {
        Self {
            heartbeat_timeout_ms: 30_000,
            sweep_interval_ms: 5_000,
            max_goals_per_agent: 16,
            skill_grants_file: None,
        }
    }
}

impl switchboard_runtime::config::Section for DirectoryConfig {
    fn validate(&self) -> Result<(), String> {
        if self.heartbeat_timeout_ms == 0
            || self.sweep_interval_ms == 0
            || self.max_goals_per_agent == 0
        {
            return Err(
                "heartbeat_timeout_ms, sweep_interval_ms and max_goals_per_agent must be above 0"
                    .to_owned(),
            );
        }
        Ok(())
    }
}

/// Config section name.
pub const SECTION: &str = "directory";

#[cfg(test)]
mod tests {
    use super::*;
    use switchboard_runtime::config::Section;

    #[test]
    fn defaults_are_the_issue_figures() {
        let config = DirectoryConfig::default();
        // Offline after 3 × the client's 10 s heartbeat.
        assert_eq!(config.heartbeat_timeout_ms, 30_000);
        assert!(config.validate().is_ok());
        let zero = DirectoryConfig {
            heartbeat_timeout_ms: 0,
            ..config
        };
        assert!(zero.validate().is_err());
    }
}
