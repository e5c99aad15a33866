//! The `[limits]` config section.

use serde::{Deserialize, Serialize};

/// Limits settings (`[limits]`, `SWITCHBOARD_LIMITS__*`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// Acquires one agent may have held (waiting) at one replica, all keys together: past it
    /// an acquire is answered at once, as if it had `wait_ms: 0`.
    pub max_waiting_per_agent: usize,
    /// How often, in ms, each replica removes the budget trees whose work all ended by its
    /// deadline alone (a tree whose last work ends by a close or a spend is removed by that
    /// change). 100..=86,400,000.
    pub budget_sweep_ms: u64,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            max_waiting_per_agent: 64,
            budget_sweep_ms: 60_000,
        }
    }
}

impl switchboard_runtime::config::Section for LimitsConfig {
    fn validate(&self) -> Result<(), String> {
        if self.max_waiting_per_agent == 0 {
            return Err("max_waiting_per_agent must be above 0".to_owned());
        }
        if !(100..=86_400_000).contains(&self.budget_sweep_ms) {
            return Err(format!(
                "budget_sweep_ms is {}; it must be 100..=86400000",
                self.budget_sweep_ms
            ));
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
            ..LimitsConfig::default()
        };
        assert!(zero.validate().is_err());
        for sweep in [0, 99, 86_400_001] {
            let bad = LimitsConfig {
                budget_sweep_ms: sweep,
                ..LimitsConfig::default()
            };
            assert!(bad.validate().is_err(), "{sweep}");
        }
    }
}
