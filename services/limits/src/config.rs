//! The `[limits]` config section.

use serde::{Deserialize, Serialize};

/// Limits settings (`[limits]`, `SWITCHBOARD_LIMITS__*`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Acquires one agent may have held (waiting) at one replica, all keys together: past it
    /// an acquire is answered at once, as if it had `wait_ms: 0`.
    pub max_waiting_per_agent: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            max_waiting_per_agent: 64,
        }
    }
}

impl switchboard_runtime::config::Section for LimitsConfig {
    fn validate(&self) -> Result<(), String> {
        if self.max_waiting_per_agent == 0 {
            return Err("max_waiting_per_agent must be above 0".to_owned());
        }
        Ok(())
    }
}

/// Config section name.
pub const SECTION: &str = "limits";

#[cfg(test)]
mod tests {
    use super::*;
    use switchboard_runtime::config::Section;

    #[test]
    fn defaults_hold_and_zero_is_refused() {
        assert!(LimitsConfig::default().validate().is_ok());
        let zero = LimitsConfig {
            max_waiting_per_agent: 0,
        };
        assert!(zero.validate().is_err());
    }
}
