//! The `[reply_correlator]` config section.

use serde::{Deserialize, Serialize};
use switchboard_proto::{
    CALL_DEPTH_LIMIT, CALL_TIMEOUT_DEFAULT_MS, CALL_TIMEOUT_MAX_MS, MAX_OPEN_CALLS_PER_AGENT,
};

/// Correlator settings (`[reply_correlator]`, `SWITCHBOARD_REPLY_CORRELATOR__*`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CorrelatorConfig {
    /// Timeout of a call that names none, in milliseconds.
    pub default_timeout_ms: u64,
    /// Longest timeout a call may ask for, in milliseconds (longer ones are clamped).
    pub max_timeout_ms: u64,
    /// Deepest call chain (agents before the callee) allowed.
    pub depth_limit: usize,
    /// Open outgoing calls allowed per agent: parked ones across replicas (in the open-call
    /// index), waiting ones per replica (counted in memory by the replica holding them).
    pub max_open_calls: usize,
    /// How often each replica looks for calls past their deadline, in milliseconds.
    pub sweep_interval_ms: u64,
}

impl Default for CorrelatorConfig {
    fn default() -> Self {
        Self {
            default_timeout_ms: CALL_TIMEOUT_DEFAULT_MS,
            max_timeout_ms: CALL_TIMEOUT_MAX_MS,
            depth_limit: CALL_DEPTH_LIMIT,
            max_open_calls: MAX_OPEN_CALLS_PER_AGENT,
            sweep_interval_ms: 1_000,
        }
    }
}

impl switchboard_runtime::config::Section for CorrelatorConfig {
    fn validate(&self) -> Result<(), String> {
        if self.max_timeout_ms == 0 || self.default_timeout_ms == 0 {
            return Err("default_timeout_ms and max_timeout_ms must be above 0".to_owned());
        }
        // The generated NATS exports let a waiting call's answer take this long and no longer
        // (`response_threshold`, switchboard_proto::endpoint::agent_endpoints).
        if self.max_timeout_ms > switchboard_proto::CALL_TIMEOUT_MAX_MS {
            return Err(format!(
                "max_timeout_ms is {}; the most is {} (the NATS exports hold a call's answer that long)",
                self.max_timeout_ms,
                switchboard_proto::CALL_TIMEOUT_MAX_MS
            ));
        }
        if self.default_timeout_ms > self.max_timeout_ms {
            return Err(format!(
                "default_timeout_ms {} is above max_timeout_ms {}",
                self.default_timeout_ms, self.max_timeout_ms
            ));
        }
        if self.depth_limit < 2 {
            return Err("depth_limit must be at least 2 (1 would refuse every call)".to_owned());
        }
        if self.max_open_calls == 0 || self.sweep_interval_ms == 0 {
            return Err("max_open_calls and sweep_interval_ms must be above 0".to_owned());
        }
        Ok(())
    }

    fn validate_with(&self, runtime: &switchboard_runtime::RuntimeConfig) -> Result<(), String> {
        // Records must outlive every deadline, or an open call could age out unanswered.
        let keep_ms = runtime.jetstream.calls_max_age_secs.saturating_mul(1_000);
        if keep_ms <= self.max_timeout_ms {
            return Err(format!(
                "jetstream.calls_max_age_secs ({} s) must be longer than max_timeout_ms ({} ms)",
                runtime.jetstream.calls_max_age_secs, self.max_timeout_ms
            ));
        }
        Ok(())
    }
}

/// Config section name.
pub const SECTION: &str = "reply_correlator";

#[cfg(test)]
mod tests {
    use super::*;
    use switchboard_runtime::RuntimeConfig;
    use switchboard_runtime::config::Section;

    #[test]
    fn defaults_are_the_issue_figures() {
        let config = CorrelatorConfig::default();
        assert_eq!(config.default_timeout_ms, 30_000);
        assert_eq!(config.max_timeout_ms, 300_000);
        assert_eq!(config.depth_limit, 5);
        assert_eq!(config.max_open_calls, 64);
        assert!(config.validate().is_ok());
        assert!(config.validate_with(&RuntimeConfig::default()).is_ok());
    }

    #[test]
    fn contradictions_are_refused() {
        let base = CorrelatorConfig::default();
        for bad in [
            CorrelatorConfig {
                max_timeout_ms: 0,
                ..base.clone()
            },
            CorrelatorConfig {
                default_timeout_ms: 400_000,
                ..base.clone()
            },
            CorrelatorConfig {
                depth_limit: 1,
                ..base.clone()
            },
            CorrelatorConfig {
                max_open_calls: 0,
                ..base.clone()
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
        let mut runtime = RuntimeConfig::default();
        runtime.jetstream.calls_max_age_secs = 300;
        assert!(
            base.validate_with(&runtime).is_err(),
            "records must outlive deadlines"
        );
    }
}
