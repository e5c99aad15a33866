//! The `[people]` config section.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use switchboard_proto::people::{ASK_TIMEOUT_DEFAULT_MS, PEOPLE_WAIT_MAX_MS};

/// People settings (`[people]`, `SWITCHBOARD_PEOPLE__*`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PeopleConfig {
    /// The people file (`people.toml`): persons, their roles and console access, and who may
    /// reach them. Without one, no person exists and every `to` is `unreachable`.
    pub file: Option<PathBuf>,
    /// How often the file is checked for changes, in milliseconds (a change applies without a
    /// restart; a bad file keeps the last good one).
    pub reload_interval_ms: u64,
    /// How often each replica looks for items to escalate or expire, in milliseconds.
    pub sweep_interval_ms: u64,
    /// Time an ask waits when it names none, in milliseconds.
    pub ask_timeout_default_ms: u64,
    /// Longest an ask or approval may wait, in milliseconds.
    pub max_wait_ms: u64,
    /// Asks and approvals one agent may have waiting for one person or role: past it the
    /// agent is refused `inbox_full`, so a flooding agent cannot bury the others' items.
    pub max_open_per_sender: usize,
    /// Unread notes one agent may have with one person or role.
    pub max_unread_notes_per_sender: usize,
    /// Asks and approvals one agent may have waiting in all (`too_many_calls` past it).
    pub max_open_per_agent: usize,
}

impl Default for PeopleConfig {
    fn default() -> Self {
        Self {
            file: None,
            reload_interval_ms: 2_000,
            sweep_interval_ms: 1_000,
            ask_timeout_default_ms: ASK_TIMEOUT_DEFAULT_MS,
            max_wait_ms: PEOPLE_WAIT_MAX_MS,
            max_open_per_sender: 32,
            max_unread_notes_per_sender: 64,
            max_open_per_agent: 64,
        }
    }
}

impl switchboard_runtime::config::Section for PeopleConfig {
    fn validate(&self) -> Result<(), String> {
        if self.reload_interval_ms == 0 || self.sweep_interval_ms == 0 {
            return Err("reload_interval_ms and sweep_interval_ms must be above 0".to_owned());
        }
        if self.max_wait_ms == 0 || self.max_wait_ms > PEOPLE_WAIT_MAX_MS {
            return Err(format!(
                "max_wait_ms must be 1..={PEOPLE_WAIT_MAX_MS} (seven days)"
            ));
        }
        if self.ask_timeout_default_ms == 0 || self.ask_timeout_default_ms > self.max_wait_ms {
            return Err(
                "ask_timeout_default_ms must be above 0 and at most max_wait_ms".to_owned(),
            );
        }
        if self.max_open_per_sender == 0
            || self.max_unread_notes_per_sender == 0
            || self.max_open_per_agent == 0
        {
            return Err("the per-sender and per-agent caps must be above 0".to_owned());
        }
        Ok(())
    }

    fn validate_with(&self, runtime: &switchboard_runtime::RuntimeConfig) -> Result<(), String> {
        // Records must outlive every deadline, or a waiting item could age out unanswered.
        let keep_ms = runtime.jetstream.people_max_age_secs.saturating_mul(1_000);
        if keep_ms <= self.max_wait_ms {
            return Err(format!(
                "jetstream.people_max_age_secs ({} s) must be longer than max_wait_ms ({} ms)",
                runtime.jetstream.people_max_age_secs, self.max_wait_ms
            ));
        }
        Ok(())
    }
}

/// Config section name.
pub const SECTION: &str = "people";

#[cfg(test)]
mod tests {
    use super::*;
    use switchboard_runtime::RuntimeConfig;
    use switchboard_runtime::config::Section;

    #[test]
    fn defaults_hold_and_contradictions_are_refused() {
        let config = PeopleConfig::default();
        assert!(config.validate().is_ok());
        assert!(config.validate_with(&RuntimeConfig::default()).is_ok());
        let long = PeopleConfig {
            max_wait_ms: PEOPLE_WAIT_MAX_MS + 1,
            ..config.clone()
        };
        assert!(long.validate().is_err());
        let no_cap = PeopleConfig {
            max_open_per_sender: 0,
            ..config.clone()
        };
        assert!(no_cap.validate().is_err());
        let mut runtime = RuntimeConfig::default();
        runtime.jetstream.people_max_age_secs = 3_600;
        assert!(config.validate_with(&runtime).is_err());
    }
}
