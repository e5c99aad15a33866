//! The `[directory]` config section.

use serde::{Deserialize, Serialize};
use switchboard_runtime::config::RuntimeConfig;

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
    /// Route `skill:` work by what cards claim even though the services sign in (an NKey from
    /// the generated accounts, or a creds file, user or token) and no `skill_grants_file` is
    /// set. Off by default: a signed-in directory without its grants file refuses to start,
    /// because a self-declared translator would otherwise get every `skill:translate` message.
    /// Without the file the directory also cannot tell which ids are keyed agents, so `a2a
    /// add` may shadow one that has not signed in yet (until it does).
    pub open_skill_routing: bool,
}

impl Default for DirectoryConfig {
    fn default() -> Self {
        Self {
            heartbeat_timeout_ms: 30_000,
            sweep_interval_ms: 5_000,
            max_goals_per_agent: 16,
            skill_grants_file: None,
            open_skill_routing: false,
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

    fn validate_with(&self, runtime: &RuntimeConfig) -> Result<(), String> {
        self.check_skill_routing(runtime)
    }
}

impl DirectoryConfig {
    /// Refuses the insecure default (issue 37): services signed in with an NKey (the
    /// generated accounts) and no skill grants would take every card's claimed skills at
    /// their word. Either name the grants file or say `open_skill_routing = true`.
    pub fn check_skill_routing(&self, runtime: &RuntimeConfig) -> Result<(), String> {
        // Any sign-in at all: the generated accounts (an NKey), or credentials of an
        // operator's own (a .creds file, a user, a token) — identities are managed.
        let nats = &runtime.nats;
        let keyed = nats.nkey_seed.is_some()
            || nats.nkey_file.is_some()
            || nats.creds_file.is_some()
            || nats.user.is_some()
            || nats.token.is_some();
        if keyed && self.skill_grants_file.is_none() && !self.open_skill_routing {
            return Err("the services sign in (NKey, creds, user or token) but \
                 skill_grants_file is not set: set it to the skill-grants.json \
                 `switchboard nats-config` wrote, or set open_skill_routing = true to route \
                 skill work by what cards claim"
                .to_owned());
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

    #[test]
    fn keyed_services_without_grants_refuse_unless_routing_is_open() {
        let mut keyed = RuntimeConfig::default();
        keyed.nats.nkey_file = Some("services.nk".into());
        let open_laptop = RuntimeConfig::default();
        let config = DirectoryConfig::default();
        assert!(config.validate_with(&open_laptop).is_ok());
        let refused = config.validate_with(&keyed).unwrap_err();
        assert!(refused.contains("skill_grants_file"), "{refused}");
        let granted = DirectoryConfig {
            skill_grants_file: Some("skill-grants.json".into()),
            ..DirectoryConfig::default()
        };
        assert!(granted.validate_with(&keyed).is_ok());
        let open = DirectoryConfig {
            open_skill_routing: true,
            ..DirectoryConfig::default()
        };
        assert!(open.validate_with(&keyed).is_ok());
    }
}
