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
    /// Open outgoing calls allowed per agent.
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

/// Config section name.
pub const SECTION: &str = "reply_correlator";
